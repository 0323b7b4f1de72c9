//! One model request of a run: every attempt the provider makes (first try
//! and each retry) is admitted against the budget and written to the ledger
//! before it is sent, or refused and written as refused; the turn's text,
//! reasoning and discarded calls stream out as they arrive.

use super::ledger::Attempts;
use super::Ctx;
use crate::events::Ev;
use crate::events::Phase;
use crate::provider::{Provider, ProviderError, Refused, TurnEvent, TurnReply, TurnRequest};
use prompts::{Message, ToolDef};
use serde_json::Value;
use std::cell::RefCell;

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
        // The ledger fails closed: after a failed write nothing goes out.
        if let Some(fault) = self.ledger.fault() {
            return Err(ProviderError::Ledger(fault));
        }
        self.reply.begin_turn();
        let req = TurnRequest { messages, tools, phase, max_tokens: self.budget.turn_tokens };
        let Ctx { budget, ledger, reply, emit, cancel, .. } = self;
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
                TurnEvent::Content(s) => reply.content(&s, &mut **emit),
                TurnEvent::Reasoning(s) => (*emit)(&Ev::Reasoning(s)),
                TurnEvent::Discarded(c) => (*emit)(&Ev::Discarded {
                    name: c.name,
                    arguments: arguments_value(&c.arguments),
                }),
            }
        };
        let result = span.in_scope(|| provider.turn(&req, cancel, &mut attempt, &mut on));
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
