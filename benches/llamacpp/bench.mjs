// llama.cpp (prebuilt, through node-llama-cpp) on the same GGUF and thread
// count as `agentd bench`: prompt processing of N tokens and decode of M
// tokens, median of R after a warm-up. Prints one JSON line like agentd's.
// Usage: node bench.mjs MODEL THREADS [PROMPT_TOKENS] [GEN_TOKENS] [REPS]
import {getLlama} from "node-llama-cpp";
import fs from "node:fs";

const [model, threadsArg, ppArg = "512", tgArg = "128", repsArg = "3"] = process.argv.slice(2);
const threads = Number(threadsArg), pp = Number(ppArg), tg = Number(tgArg), reps = Number(repsArg);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const m = await llama.loadModel({modelPath: model, gpuLayers: 0});
const vocab = m.tokens.vocabularyType ? 49152 : 49152;
let x = 0x2545F4914F6CDD1Dn;
const ids = [];
while (ids.length < Math.max(pp, tg) + 1) {
  x ^= (x << 13n) & 0xFFFFFFFFFFFFFFFFn; x ^= x >> 7n; x ^= (x << 17n) & 0xFFFFFFFFFFFFFFFFn;
  ids.push(Number(x % 40000n) + 100);
}
const median = (v) => v.sort((a, b) => a - b)[Math.floor(v.length / 2)];
const pps = [], tgs = [];
for (let rep = 0; rep <= reps; rep++) {
  {
    const ctx = await m.createContext({contextSize: pp + tg + 64, batchSize: pp, threads, flashAttention: true});
    const seq = ctx.getSequence();
    const t = process.hrtime.bigint();
    await seq.evaluateWithoutGeneratingNewTokens(ids.slice(0, pp));
    const s = Number(process.hrtime.bigint() - t) / 1e9;
    if (rep > 0) pps.push(pp / s);
    await ctx.dispose();
  }
  {
    // Decode as generation does it: one token per step, logits computed and
    // the next token sampled (greedy), like llama-bench's tg test.
    const ctx = await m.createContext({contextSize: pp + tg + 64, batchSize: 512, threads, flashAttention: true});
    const seq = ctx.getSequence();
    const t = process.hrtime.bigint();
    let n = 0;
    for await (const _tok of seq.evaluate([ids[0]], {temperature: 0, yieldEogToken: true})) {
      if (++n >= tg) break;
    }
    const s = Number(process.hrtime.bigint() - t) / 1e9;
    if (rep > 0) tgs.push(n / s);
    await ctx.dispose();
  }
}
const status = fs.readFileSync("/proc/self/status", "utf8");
const hwm = Number(/VmHWM:\s+(\d+)/.exec(status)[1]) / 1024;
console.log(JSON.stringify({model, threads, pp_tok_s: median(pps), tg_tok_s: median(tgs), peak_rss_mb: hwm, engine: "llama.cpp via node-llama-cpp 3.21.1"}));
