//! One model request of a run: every attempt the provider makes (first try
//! and each retry) is admitted against the budget and written to the ledger
//! before it is sent, or refused and written as refused; the turn's text,
//! reasoning and discarded calls stream out as they arrive.

use super::junk::Monitor;
use super::ledger::Attempts;
use super::Ctx;
use crate::events::Ev;
use crate::events::Phase;
use crate::provider::{
    Provider, ProviderError, Refused, TurnEvent, TurnFinish, TurnReply, TurnRequest,
};
use prompts::{Message, ToolDef};
use serde_json::Value;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

impl Ctx<'_> {
    /// Sends one request of `phase`; a refusal by the run's own allowance is
    /// [`ProviderError::Budget`].
    pub(super) fn request(
        &mut self,
        provider: &mut dyn Provider,
        phase: Phase,
        messages: &[Message],
        tools: &[ToolDef],
    ) -> Result<TurnReply, ProviderError> {
        self.request_with(provider, phase, messages, tools, &[], None)
    }

    /// [`Ctx::request`] whose reply should be one of `choices` (when not
    /// empty), its text watched by `watch` (when given): once the watch
    /// finds the text is junk the turn is stopped, nothing more of it
    /// streams, and `self.junk` says why (the reply then ends as
    /// [`TurnFinish::Stop`]).
    pub(super) fn request_with(
        &mut self,
        provider: &mut dyn Provider,
        phase: Phase,
        messages: &[Message],
        tools: &[ToolDef],
        choices: &[String],
        mut watch: Option<Monitor>,
    ) -> Result<TurnReply, ProviderError> {
        self.junk = None;
        // The ledger fails closed: after a failed write nothing goes out.
        if let Some(fault) = self.ledger.fault() {
            return Err(ProviderError::Ledger(fault));
        }
        self.reply.begin_turn();
        let req =
            TurnRequest { messages, tools, phase, max_tokens: self.budget.turn_tokens, choices };
        let Ctx { budget, ledger, reply, emit, cancel, .. } = self;
        let run_cancel: &AtomicBool = cancel;
        // The turn stops when the run is cancelled or its text is junk.
        let stop_turn = AtomicBool::new(run_cancel.load(Ordering::Relaxed));
        let ledger = *ledger;
        let span =
            tracing::info_span!("request", n = budget.requests() + 1, phase = phase.as_str());
        // Both the admission and the stream emit events, in order.
        let emit = RefCell::new(&mut **emit);
        let mut attempts = Attempts::default();
        let mut attempt = |_k: u32| {
            if ledger.fault().is_some() {
                // A write failed since the turn began: no retry goes out.
                return Err(Refused);
            }
            if let Err(refused) = budget.admit(phase) {
                ledger.refused(budget.requests() + 1, phase, &budget.refusal());
                return Err(refused);
            }
            let n = budget.requests();
            if !ledger.sent(&mut attempts, n, phase) {
                // Not recorded, so not sent (the fault ends the run).
                return Err(Refused);
            }
            (*emit.borrow_mut())(&Ev::Request { n, phase });
            Ok(())
        };
        let mut on = |e: TurnEvent| {
            let mut emit = emit.borrow_mut();
            match e {
                TurnEvent::Content(s) => {
                    if let Some(w) = watch.as_mut() {
                        if w.verdict().is_some() {
                            return;
                        }
                        if w.push(&s).is_some() {
                            stop_turn.store(true, Ordering::Relaxed);
                        }
                    }
                    reply.content(&s, &mut **emit)
                }
                TurnEvent::Reasoning(s) => (*emit)(&Ev::Reasoning(s)),
                TurnEvent::Discarded(c) => (*emit)(&Ev::Discarded {
                    name: c.name,
                    arguments: arguments_value(&c.arguments),
                }),
            }
        };
        let turning = AtomicBool::new(true);
        let result = std::thread::scope(|scope| {
            // The run's cancellation reaches the turn within a few ms.
            scope.spawn(|| {
                while turning.load(Ordering::Relaxed) {
                    if run_cancel.load(Ordering::Relaxed) {
                        stop_turn.store(true, Ordering::Relaxed);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            });
            // Lowered however the turn ends — a panic too, or the scope
            // would wait on the watcher for ever.
            let _turned = Lower(&turning);
            span.in_scope(|| provider.turn(&req, &stop_turn, &mut attempt, &mut on))
        });
        let junk = watch.as_ref().and_then(Monitor::verdict);
        let result = match result {
            Ok(mut r) if junk.is_some() && !run_cancel.load(Ordering::Relaxed) => {
                // Stopped for junk, not cancelled.
                r.finish = TurnFinish::Stop;
                Ok(r)
            }
            r => r,
        };
        span.in_scope(|| match &result {
            Ok(r) => tracing::info!(
                finish = ?r.finish,
                calls = r.calls.len(),
                content_bytes = r.content.len(),
                "model request"
            ),
            Err(e) => tracing::info!(error = e.code().1, "model request failed: {e}"),
        });
        ledger.settle(attempts, &result);
        ledger.elapsed(budget.elapsed());
        self.junk = junk;
        if let Ok(r) = &result {
            self.decode += r.decode;
        }
        match ledger.fault() {
            // A failed write ends the run, whatever the turn did.
            Some(fault) => Err(ProviderError::Ledger(fault)),
            None => result,
        }
    }
}

/// A call's arguments as a JSON value for events (`{}` when they are not
/// JSON).
pub(super) fn arguments_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| serde_json::json!({}))
}

/// Lowers its flag when dropped.
struct Lower<'a>(&'a AtomicBool);

impl Drop for Lower<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}
