//! Choosing the next token from logits: greedy, or sampled with
//! temperature, top-k, top-p and min-p, after the repetition rules, from a
//! seeded generator (same seed, same text). Banned tokens are never chosen.
//!
//! The repetition rules, all off by default (so greedy output equals
//! llama.cpp's):
//!
//! - `repeat_penalty`, `frequency_penalty`, `presence_penalty`: as
//!   llama.cpp's penalties sampler, over the last `repeat_last_n` tokens of
//!   the session — prompt and output alike, as llama-server feeds its
//!   sampler the prompt: each token seen there `count` times has its logit
//!   divided by `repeat_penalty` (multiplied when not positive), then
//!   lowered by `count × frequency_penalty + presence_penalty`.
//! - `no_repeat_ngram` (n, 0: off): Hugging Face's `no_repeat_ngram_size`
//!   over the *generated* tokens only — the prompt is never looked at, so
//!   an answer may still quote its passage: a token that would complete an
//!   n-gram already present in them is banned. The engine passes the output
//!   since the last grammar-governed span, and nothing while a grammar
//!   governs (JSON and tool calls repeat their keys by design). A ban that
//!   would leave no token to choose is not applied.

/// Sampling settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1.0: all).
    pub top_p: f32,
    /// Drop tokens below `min_p ×` the top probability (0: none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens by this (1.0: off).
    pub repeat_penalty: f32,
    /// How many recent tokens (prompt included) the penalties look at (0: none).
    pub repeat_last_n: usize,
    /// Lower a recent token's logit by this times its count there (0: off).
    pub frequency_penalty: f32,
    /// Lower the logit of every token present there by this (0: off).
    pub presence_penalty: f32,
    /// Ban the token that would repeat an n-gram of this many generated
    /// tokens (0: off).
    pub no_repeat_ngram: usize,
    /// Seed of the generator.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            no_repeat_ngram: 0,
            seed: 0,
        }
    }
}

/// A seeded generator (splitmix64): portable and reproducible.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks the next token. `recent` are the latest tokens of the session
/// (for the penalties); `generated` the output the n-gram rule looks at;
/// `banned[id]` tokens are never picked. The logits are left as the rules
/// made them (before temperature).
pub(crate) fn sample(
    logits: &mut [f32],
    s: &Sampling,
    recent: &[u32],
    generated: &[u32],
    banned: &[bool],
    rng: &mut Rng,
) -> u32 {
    for (i, l) in logits.iter_mut().enumerate() {
        if banned.get(i).copied().unwrap_or(false) {
            *l = f32::NEG_INFINITY;
        }
    }
    if s.no_repeat_ngram > 0 {
        let bans = ngram_bans(generated, s.no_repeat_ngram);
        let left = logits
            .iter()
            .enumerate()
            .any(|(i, l)| l.is_finite() && bans.binary_search(&(i as u32)).is_err());
        if left {
            for &t in &bans {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
    let repeat = s.repeat_penalty != 1.0 && s.repeat_penalty > 0.0;
    if repeat || s.frequency_penalty != 0.0 || s.presence_penalty != 0.0 {
        let from = recent.len().saturating_sub(s.repeat_last_n);
        let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        for &t in &recent[from..] {
            *counts.entry(t).or_insert(0) += 1;
        }
        for (&t, &n) in &counts {
            if let Some(l) = logits.get_mut(t as usize) {
                if repeat {
                    *l = if *l > 0.0 { *l / s.repeat_penalty } else { *l * s.repeat_penalty };
                }
                if s.frequency_penalty != 0.0 || s.presence_penalty != 0.0 {
                    *l -= n as f32 * s.frequency_penalty + s.presence_penalty;
                }
            }
        }
    }
    if s.temperature <= 0.0 {
        return argmax(logits);
    }
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l / s.temperature))
        .collect();
    if cand.is_empty() {
        return argmax(logits);
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if s.top_k > 0 && cand.len() > s.top_k {
        cand.truncate(s.top_k);
    }
    let max = cand[0].1;
    let mut probs: Vec<f64> = cand.iter().map(|(_, l)| ((l - max) as f64).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    let mut keep = probs.len();
    if s.min_p > 0.0 {
        let floor = probs[0] * s.min_p as f64;
        keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
    }
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, p) in probs[..keep].iter().enumerate() {
            acc += p;
            if acc >= s.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    let total: f64 = probs[..keep].iter().sum();
    let mut r = rng.unit() * total;
    for (i, p) in probs[..keep].iter().enumerate() {
        if r < *p {
            return cand[i].0;
        }
        r -= p;
    }
    cand[keep - 1].0
}

/// Index of the largest logit (the first on ties, as llama.cpp).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > bv {
            bv = l;
            best = i;
        }
    }
    best as u32
}

/// The tokens that would complete an n-gram of `generated` already in it:
/// each token that followed an earlier occurrence of its last `n − 1`
/// tokens (for `n = 1`, every token in it). Sorted, without repeats.
pub(crate) fn ngram_bans(generated: &[u32], n: usize) -> Vec<u32> {
    if n == 0 || generated.len() < n {
        return Vec::new();
    }
    let prefix = &generated[generated.len() + 1 - n..];
    let mut bans: Vec<u32> =
        generated.windows(n).filter(|w| w[..n - 1] == *prefix).map(|w| w[n - 1]).collect();
    bans.sort_unstable();
    bans.dedup();
    bans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_max_and_respects_bans() {
        let mut l = vec![0.1, 3.0, 2.0];
        assert_eq!(
            sample(&mut l.clone(), &Sampling::default(), &[], &[], &[], &mut Rng::new(1)),
            1
        );
        assert_eq!(
            sample(&mut l, &Sampling::default(), &[], &[], &[false, true], &mut Rng::new(1)),
            2
        );
    }

    #[test]
    fn same_seed_same_choice() {
        let s =
            Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Sampling::default() };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let pick = |seed| {
            let mut rng = Rng::new(seed);
            (0..20)
                .map(|_| sample(&mut logits.clone(), &s, &[], &[], &[], &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(pick(7), pick(7));
        assert_ne!(pick(7), pick(8));
    }

    /// Greedy settings with nothing else on, then `f` applied.
    fn greedy(f: impl FnOnce(&mut Sampling)) -> Sampling {
        let mut s = Sampling::default();
        f(&mut s);
        s
    }

    /// The logits as the repetition rules leave them, and the greedy pick.
    fn after(s: &Sampling, logits: &[f32], recent: &[u32], generated: &[u32]) -> (Vec<f32>, u32) {
        let mut l = logits.to_vec();
        let id = sample(&mut l, s, recent, generated, &[], &mut Rng::new(0));
        (l, id)
    }

    #[test]
    fn defaults_leave_the_logits_alone() {
        let logits = [2.0, -1.0, 0.5, 3.0];
        let (l, id) = after(&Sampling::default(), &logits, &[3, 3, 0, 1], &[3, 0, 3, 0, 3]);
        assert_eq!(l, logits);
        assert_eq!(id, 3);
    }

    #[test]
    fn repeat_penalty_divides_positive_and_multiplies_negative_logits_once_per_token() {
        let s = greedy(|s| s.repeat_penalty = 2.0);
        let (l, id) = after(&s, &[4.0, -1.0, 3.0], &[0, 0, 0, 1], &[]);
        assert_eq!(l, [2.0, -2.0, 3.0]);
        assert_eq!(id, 2);
    }

    #[test]
    fn frequency_penalty_lowers_by_the_count() {
        let s = greedy(|s| s.frequency_penalty = 0.5);
        let (l, id) = after(&s, &[1.0, 1.0, 0.9], &[0, 0, 1], &[]);
        assert_eq!(l, [0.0, 0.5, 0.9]);
        assert_eq!(id, 2);
        // Negative values favour what was seen.
        let s = greedy(|s| s.frequency_penalty = -0.5);
        let (l, _) = after(&s, &[1.0, 1.0, 0.9], &[0, 0, 1], &[]);
        assert_eq!(l, [2.0, 1.5, 0.9]);
    }

    #[test]
    fn presence_penalty_lowers_once_whatever_the_count() {
        let s = greedy(|s| s.presence_penalty = 0.5);
        let (l, id) = after(&s, &[1.0, 1.25, 0.8], &[0, 0, 0, 1], &[]);
        assert_eq!(l, [0.5, 0.75, 0.8]);
        assert_eq!(id, 2);
    }

    #[test]
    fn penalties_combine_as_llama_cpp_orders_them() {
        // Divided by the repeat penalty first, then lowered.
        let s = greedy(|s| {
            s.repeat_penalty = 2.0;
            s.frequency_penalty = 0.25;
            s.presence_penalty = 1.0;
        });
        let (l, _) = after(&s, &[4.0, -2.0, 1.0], &[0, 0, 1], &[]);
        assert_eq!(l, [4.0 / 2.0 - 0.5 - 1.0, -2.0 * 2.0 - 0.25 - 1.0, 1.0]);
    }

    #[test]
    fn penalties_look_only_at_the_last_repeat_last_n_tokens() {
        let s = greedy(|s| {
            s.presence_penalty = 1.0;
            s.repeat_last_n = 2;
        });
        let (l, _) = after(&s, &[1.0, 1.0, 1.0, 1.0], &[0, 1, 2, 2], &[]);
        assert_eq!(l, [1.0, 1.0, 0.0, 1.0]);
        let s = greedy(|s| {
            s.presence_penalty = 1.0;
            s.repeat_last_n = 0;
        });
        let (l, _) = after(&s, &[1.0, 1.0], &[0, 1], &[]);
        assert_eq!(l, [1.0, 1.0]);
    }

    #[test]
    fn ngram_bans_are_the_tokens_that_followed_the_last_n_minus_1() {
        // 5 6 7 … 5 6: a 3-gram "5 6 7" exists, so 7 may not follow "5 6".
        assert_eq!(ngram_bans(&[5, 6, 7, 5, 6], 3), vec![7]);
        // Both continuations seen, sorted.
        assert_eq!(ngram_bans(&[5, 6, 9, 1, 5, 6, 7, 5, 6], 3), vec![7, 9]);
        // No earlier "7 5 6".
        assert!(ngram_bans(&[5, 6, 7, 5, 6], 4).is_empty());
        // Too short for any n-gram, and off.
        assert!(ngram_bans(&[5, 6], 3).is_empty());
        assert!(ngram_bans(&[5, 5, 5], 0).is_empty());
        // n = 1: every generated token.
        assert_eq!(ngram_bans(&[4, 2, 4], 1), vec![2, 4]);
        // A bigram: after 3 came 4 and 3.
        assert_eq!(ngram_bans(&[3, 4, 3, 3], 2), vec![3, 4]);
    }

    #[test]
    fn no_repeat_ngram_bans_the_completing_token_of_the_output_only() {
        let logits = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 5.0, 4.0];
        let s = greedy(|s| s.no_repeat_ngram = 3);
        // Greedy would pick 7 and repeat "5 6 7".
        assert_eq!(after(&Sampling::default(), &logits, &[], &[5, 6, 7, 5, 6]).1, 7);
        let (l, id) = after(&s, &logits, &[], &[5, 6, 7, 5, 6]);
        assert_eq!(id, 8);
        assert_eq!(l[7], f32::NEG_INFINITY);
        // The same tokens in `recent` (the prompt) do not count.
        let (l, id) = after(&s, &logits, &[5, 6, 7, 5, 6], &[5, 6]);
        assert_eq!((l, id), (logits.to_vec(), 7));
    }

    #[test]
    fn a_ban_that_would_leave_nothing_is_not_applied() {
        let s = greedy(|s| s.no_repeat_ngram = 2);
        // Only 1 and 2 are allowed (the others banned), and after "… 0" both
        // followed a 0 before.
        let banned = [true, false, false, true];
        let mut l = vec![9.0, 1.0, 2.0, 9.0];
        let id = sample(&mut l, &s, &[], &[0, 1, 0, 2, 0], &banned, &mut Rng::new(0));
        assert_eq!(id, 2);
        assert_eq!(l, [f32::NEG_INFINITY, 1.0, 2.0, f32::NEG_INFINITY]);
        // One allowed token left: it is the only choice.
        let mut l = vec![9.0, 1.0, 2.0, 9.0];
        let id = sample(&mut l, &s, &[], &[0, 2, 0], &banned, &mut Rng::new(0));
        assert_eq!(id, 1);
    }

    #[test]
    fn sampled_tokens_never_complete_a_banned_ngram() {
        let s = Sampling {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            no_repeat_ngram: 2,
            ..Sampling::default()
        };
        let logits = [1.0, 1.2, 0.8, 1.1];
        let mut rng = Rng::new(3);
        let mut picked = [0usize; 4];
        for _ in 0..200 {
            let id = sample(&mut logits.to_vec(), &s, &[], &[1, 3, 1], &[], &mut rng);
            assert_ne!(id, 3, "3 followed 1 before");
            picked[id as usize] += 1;
        }
        assert!(picked[0] > 0 && picked[1] > 0 && picked[2] > 0, "{picked:?}");
    }
}
