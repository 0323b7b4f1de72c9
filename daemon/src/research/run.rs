//! The research loop (docs/budgets.md "The reserved final turn"): model
//! turns that call tools, bounded in rounds,
//! always followed by an answer. A turn without calls is the answer. At the
//! round bound, after three identical read-only batches, when the budget's
//! research allowance or its share of the deadline is spent, or when the
//! context cannot hold another research request after tools have run, one
//! reserved final turn runs with no tools offered; if it cannot produce
//! answer text, the reply completes with a fallback. Cancellation stops all
//! further work at once. When the loop ends the run is settled: its message
//! saved, its row given the outcome, the `done` event emitted.

use super::admission::RunOptions;
use super::budget::Budget;
use super::citations::check_citations;
use super::execution::{projection, run_round, Proposed, Repeats};
use super::fallback::fallback;
use super::junk::Monitor;
use super::ledger::Ledger;
use super::reply::Reply;
use super::{grounding, sections, view, Ctx};
use crate::events::{By, Done, Ev, Outcome, Phase, RunError, Stop};
use crate::provider::{Provider, ProviderError, Research, TurnFinish};
use crate::state::store::{MessageStatus, RunStatus, Settled, Store};
use crate::tools::Host;
use prompts::fallback::Evidence;
use prompts::Message;
use std::cell::RefCell;
use std::sync::atomic::AtomicBool;

/// The state of a run in progress: what a crash must not lose (recovery
/// rebuilds it from the chat).
#[derive(Debug, Default)]
pub(super) struct Progress {
    pub(super) exchanges: Vec<Message>,
    pub(super) rounds: usize,
    pub(super) repeats: Repeats,
    pub(super) evidence: Vec<Evidence>,
}

/// A run ready to research: newly admitted, or recovered.
#[derive(Debug)]
pub(super) struct Admitted {
    pub(super) run_id: String,
    pub(super) chat_id: String,
    /// The chat's earlier questions and answers.
    pub(super) history: Vec<Message>,
    pub(super) budget: Budget,
    pub(super) progress: Progress,
}

/// Runs (or continues) research to its end and settles the run.
pub(super) fn drive(
    provider: &mut dyn Provider,
    host: &mut Host,
    store: &Store,
    run: Admitted,
    opts: &RunOptions,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Done {
    let Admitted { run_id, chat_id, history, budget, progress } = run;
    let span = tracing::info_span!("run", run_id = %run_id, chat_id = %chat_id);
    let _span = span.enter();
    // A voice request also hears each sentence as it completes.
    let mut speaker = super::voice::Speaker::default();
    let voice = opts.voice;
    let mut relay = |e: &Ev| if voice { speaker.relay(e, emit) } else { emit(e) };
    let emit: &mut dyn FnMut(&Ev) = &mut relay;
    let fault = RefCell::new(None);
    let ledger = Ledger::new(store, &run_id, &fault);
    let reply = Reply::new(store, ledger, budget.clock(), &chat_id, &run_id);
    let mut cx = Ctx {
        host,
        store,
        cancel,
        emit,
        run_id: &run_id,
        chat_id: &chat_id,
        budget,
        ledger,
        reply,
        junk: None,
        decode: Default::default(),
    };
    cx.emit(Ev::Run {
        run_id: run_id.clone(),
        chat_id: chat_id.clone(),
        max_tool_iters: cx.budget.rounds,
    });
    // A bug that panics inside the run ends the run, never the process or
    // a thread that leaves it `running`: the run settles as an error.
    let researched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut done = research(&mut cx, provider, opts, &history, progress);
        grounding::ground(&mut cx, &mut done);
        done
    }));
    let mut done = researched.unwrap_or_else(|payload| {
        let why = panic_message(payload.as_ref());
        tracing::error!("the run failed inside agentd: {why}");
        let e = RunError::new(
            "INTERNAL_ERROR",
            "internal",
            format!("the run failed inside agentd ({why}); the daemon goes on — please report this with the run id"),
        );
        done(&cx, Outcome::Error, Stop::Error, 0, Some(e))
    });
    done.run_id.clone_from(&run_id);
    done.chat_id.clone_from(&chat_id);
    // An upstream that went away mid-reply (unreachable, or a stream cut
    // after part of the text) leaves the streamed text interrupted, as a
    // daemon killed mid-reply does; the error keeps its classification.
    let upstream_gone = done
        .error
        .as_ref()
        .is_some_and(|e| matches!(e.classification.as_str(), "provider_unavailable" | "transient"));
    let (message, status) = match done.outcome {
        Outcome::Cancelled => (MessageStatus::Cancelled, RunStatus::Cancelled),
        _ if upstream_gone => (MessageStatus::Interrupted, RunStatus::Finished),
        Outcome::Error => (MessageStatus::Error, RunStatus::Finished),
        _ => (MessageStatus::Complete, RunStatus::Finished),
    };
    cx.reply.save(message, true);
    let error = done.error.as_ref().map(|e| e.to_json().to_string());
    let settled = store.settle_run(
        &run_id,
        &Settled { status, outcome: done.outcome, stop: done.stop, error: error.as_deref() },
    );
    ledger.check("the run's outcome", settled);
    if let (Some(fault), None) = (ledger.fault(), &done.error) {
        // The run's record is incomplete: say so, never silently.
        let e = ProviderError::Ledger(fault);
        let (code, class) = e.code();
        done.error = Some(RunError::new(code, class, e.to_string()));
    }
    tracing::info!(
        outcome = done.outcome.as_str(),
        stop = done.stop.as_str(),
        rounds = done.rounds,
        model_requests = done.model_requests,
        error = done.error.as_ref().map(|e| e.code.as_str()),
        "run finished"
    );
    cx.emit(Ev::Done(done.clone()));
    done
}

/// What a panic said, as text.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The `done` of the run as it stands.
pub(super) fn done(
    cx: &Ctx<'_>,
    outcome: Outcome,
    stop: Stop,
    rounds: usize,
    error: Option<RunError>,
) -> Done {
    Done {
        run_id: cx.run_id.to_owned(),
        chat_id: cx.chat_id.to_owned(),
        outcome,
        stop,
        rounds,
        model_requests: cx.budget.requests(),
        answer: if outcome == Outcome::Cancelled || outcome == Outcome::Error {
            cx.reply.visible().to_owned()
        } else {
            cx.reply.answer()
        },
        error,
        invalid_citations: Vec::new(),
        grounded: false,
        decode: cx.decode,
    }
}

fn cancelled(cx: &Ctx<'_>, p: &Progress) -> Done {
    done(cx, Outcome::Cancelled, Stop::Cancelled, p.rounds, None)
}

pub(super) fn failed(cx: &Ctx<'_>, p: &Progress, error: RunError) -> Done {
    done(cx, Outcome::Error, Stop::Error, p.rounds, Some(error))
}

/// The research rounds, then the final turn when research was cut short.
fn research(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &RunOptions,
    history: &[Message],
    mut p: Progress,
) -> Done {
    let all_tools = cx.host.tools();
    let mode = opts
        .config
        .engine
        .research
        .as_deref()
        .and_then(Research::from_name)
        .unwrap_or_else(|| provider.research());
    tracing::info!(research = mode.as_str(), "who drives research");
    if mode == Research::Host && cx.host.has_corpus() {
        // The host leads: its entry research (unless a recovered run did
        // it already), then an answer composed from what was read.
        if p.rounds == 0 {
            super::entry::entry(cx, provider, opts, &mut p);
        }
        if cx.cancelled() {
            return cancelled(cx, &p);
        }
        return composed(cx, provider, opts, history, &p);
    }
    // The section size is checked against the model's context once the
    // input itself is known to fit (an input too large is its own error).
    let mut section_fit_checked = false;
    let stop = loop {
        if cx.cancelled() {
            return cancelled(cx, &p);
        }
        if p.rounds >= cx.budget.rounds {
            break Stop::RoundLimit;
        }
        if let Err(stop) = cx.budget.research_open() {
            break stop;
        }
        let tools = sections::offer(cx, projection(cx.host, &all_tools));
        let view = view::research(history, &opts.question, &p.exchanges);
        let view = match view::fit(provider, &view, &tools, cx.budget.turn_tokens) {
            Ok(v) => v,
            Err(_) if p.rounds > 0 => break Stop::ContextLimit,
            Err(o) => {
                return failed(cx, &p, RunError::new("INPUT_TOO_LARGE", "input", o.to_string()))
            }
        };
        if !section_fit_checked {
            section_fit_checked = true;
            if let Err(e) = sections::check_fit(cx, provider, &opts.question) {
                return failed(cx, &p, e);
            }
        }
        let watch = Some(watch(opts, &p));
        let reply = match cx.request_with(provider, Phase::Research, &view, &tools, &[], watch) {
            Ok(r) => r,
            Err(ProviderError::Budget { .. }) => break Stop::Budget,
            Err(ProviderError::Context { .. }) if p.rounds > 0 => break Stop::ContextLimit,
            Err(e) => {
                let (code, class) = e.code();
                return failed(cx, &p, RunError::new(code, class, e.to_string()));
            }
        };
        if reply.finish == TurnFinish::Cancelled || cx.cancelled() {
            return cancelled(cx, &p);
        }
        if let Some(junk) = cx.junk {
            return fallback(cx, opts, &p, Stop::Answer, junk.why());
        }
        if reply.calls.is_empty() {
            if reply.content.trim().is_empty() {
                // No calls and no text: nothing to show but the evidence.
                return fallback(cx, opts, &p, Stop::Answer, "the model wrote no answer");
            }
            let answer = cx.reply.answer();
            return check_citations(cx, provider, &view::as_final(&view), answer, Stop::Answer, &p);
        }
        p.rounds += 1;
        let proposed = Proposed { calls: &reply.calls, content: &reply.content, by: By::Model };
        let (batch, _) = run_round(cx, provider, opts, proposed, &tools, &mut p);
        if cx.cancelled() {
            return cancelled(cx, &p);
        }
        if cx.budget.sections_cut {
            break Stop::SectionLimit;
        }
        if p.repeats.record(batch) {
            break Stop::RepeatedBatches;
        }
    };
    final_turn(cx, provider, opts, history, &p, stop)
}

/// The reserved final turn: no tools offered, the research strategy
/// dropped, the question and every tool exchange kept.
fn final_turn(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &RunOptions,
    history: &[Message],
    p: &Progress,
    stop: Stop,
) -> Done {
    cx.emit(Ev::Notice { kind: "finishing", text: "Finishing the answer".into() });
    let view = view::final_turn(history, &opts.question, &p.exchanges);
    // Condensed by section workers rather than cut, where they can.
    let view = sections::condense(cx, provider, &opts.question, view);
    let view = match view::fit(provider, &view, &[], cx.budget.turn_tokens) {
        Ok(v) => v,
        Err(o) => return fallback(cx, opts, p, stop, &o.to_string()),
    };
    let result = cx.request_with(provider, Phase::Final, &view, &[], &[], Some(watch(opts, p)));
    settle_final(cx, provider, opts, p, stop, &view, result)
}

/// A watch over a turn's text: loops always, drift from what the run
/// retrieved once it retrieved something.
fn watch(opts: &RunOptions, p: &Progress) -> Monitor {
    let texts: Vec<&str> = p.evidence.iter().map(|e| e.text.as_str()).collect();
    Monitor::new(&opts.question, &texts)
}

/// The answer of a host-led run: composed of the most relevant sentences
/// read, best first (`entry::choices`), the model held to them; with nothing
/// relevant read, the model answers freely under the same watch.
fn composed(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &RunOptions,
    history: &[Message],
    p: &Progress,
) -> Done {
    let passages = super::entry::passages(cx, p);
    let units = super::entry::candidates(&opts.question, &passages, opts.voice);
    if units.is_empty() {
        return final_turn(cx, provider, opts, history, p, Stop::Answer);
    }
    let choices = super::entry::choices(&units);
    let view = view::final_turn(history, &opts.question, &p.exchanges);
    // The model only writes the chosen sentences: a short view will do.
    let limit = cx.budget.composed_view;
    let fitted = view::fit_within(provider, &view, &[], limit, cx.budget.turn_tokens)
        .or_else(|_| view::fit(provider, &view, &[], cx.budget.turn_tokens));
    let view = match fitted {
        Ok(v) => v,
        Err(o) => return fallback(cx, opts, p, Stop::Answer, &o.to_string()),
    };
    let result =
        cx.request_with(provider, Phase::Final, &view, &[], &choices, Some(watch(opts, p)));
    settle_final(cx, provider, opts, p, Stop::Answer, &view, result)
}

/// Settles the reply after a final turn: its answer (citations checked),
/// or the fallback when it wrote none, was junk or failed.
fn settle_final(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    opts: &RunOptions,
    p: &Progress,
    stop: Stop,
    view: &[Message],
    result: Result<crate::provider::TurnReply, ProviderError>,
) -> Done {
    match result {
        Ok(r) if r.finish == TurnFinish::Cancelled || cx.cancelled() => cancelled(cx, p),
        Ok(_) if cx.junk.is_some() => {
            let why = cx.junk.map(|j| j.why()).unwrap_or_default();
            fallback(cx, opts, p, stop, why)
        }
        Ok(r) if !r.content.trim().is_empty() && cx.reply.turn_has_content() => {
            let answer = cx.reply.answer();
            check_citations(cx, provider, view, answer, stop, p)
        }
        Ok(_) => fallback(cx, opts, p, stop, "the final turn wrote no answer text"),
        Err(e @ ProviderError::Ledger(_)) => {
            let (code, class) = e.code();
            failed(cx, p, RunError::new(code, class, e.to_string()))
        }
        Err(ProviderError::Budget { .. }) => {
            let e = cx.budget.exhausted();
            let mut d =
                fallback(cx, opts, p, Stop::Budget, "no request allowance is left for the answer");
            d.error = Some(e);
            d
        }
        Err(e) => fallback(cx, opts, p, stop, &e.to_string()),
    }
}
