//! What the model sees: the research view (the research strategy, the
//! chat's earlier questions and answers, the question, every tool
//! exchange), the final view (the same without the strategy, asking for an
//! evidence-based answer), and fitting either into the provider's context
//! (older tool results are shortened first; an input that cannot fit names
//! both sizes).

use crate::provider::Provider;
use crate::state::store::Store;
use prompts::{texts, Message, ToolDef};

/// The earlier questions and answers of a chat (before `before_run`, when
/// given: the first message of that run).
pub(super) fn chat_history(store: &Store, chat_id: &str, before_run: Option<&str>) -> Vec<Message> {
    let msgs = store.messages(chat_id).unwrap_or_default();
    let cut = before_run
        .and_then(|r| msgs.iter().position(|m| m.run_id.as_deref() == Some(r)))
        .unwrap_or(msgs.len());
    msgs[..cut]
        .iter()
        .filter(|m| {
            (m.role == "user" || (m.role == "assistant" && m.tool_calls.is_none()))
                && !m.content.trim().is_empty()
        })
        .map(|m| Message::new(&m.role, m.content.clone()))
        .collect()
}

fn with_system(
    system: &str,
    history: &[Message],
    question: &str,
    exchanges: &[Message],
) -> Vec<Message> {
    let mut view = vec![Message::new("system", system.trim())];
    view.extend_from_slice(history);
    view.push(Message::new("user", question.to_owned()));
    view.extend(exchanges.iter().cloned());
    view
}

/// A research request's view.
pub(super) fn research(history: &[Message], question: &str, exchanges: &[Message]) -> Vec<Message> {
    with_system(texts::RESEARCH_SYSTEM, history, question, exchanges)
}

/// The reserved final turn's view: no research strategy, the question and
/// every tool exchange kept, an evidence-based answer asked for.
pub(super) fn final_turn(
    history: &[Message],
    question: &str,
    exchanges: &[Message],
) -> Vec<Message> {
    let mut view = with_system(texts::FINAL_SYSTEM, history, question, exchanges);
    view.push(Message::new("user", texts::FINAL_USER.trim()));
    view
}

/// A research view answered without calls, seen as a final answer (for its
/// citation check): the final system text in place of the strategy.
pub(super) fn as_final(view: &[Message]) -> Vec<Message> {
    let mut view = view.to_vec();
    view[0] = Message::new("system", texts::FINAL_SYSTEM.trim());
    view
}

/// A view that cannot fit, with the sizes involved.
#[derive(Debug)]
pub(super) struct Overflowed {
    need: usize,
    limit: usize,
    context: usize,
}

impl std::fmt::Display for Overflowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request needs {} tokens but the context holds {} ({} after keeping {} for the reply)",
            self.need,
            self.context,
            self.limit,
            self.context - self.limit
        )
    }
}

/// Tokens a request may take in a context of `ctx`, keeping `max_tokens`
/// (at most half the context) for the reply.
pub(super) fn limit(ctx: usize, max_tokens: usize) -> usize {
    ctx.saturating_sub(max_tokens.min(ctx / 2)).max(1)
}

/// Fits a view into the provider's context (when it has one), keeping
/// `max_tokens` (at most half the context) for the reply.
pub(super) fn fit(
    provider: &mut dyn Provider,
    view: &[Message],
    tools: &[ToolDef],
    max_tokens: usize,
) -> Result<Vec<Message>, Overflowed> {
    fit_within(provider, view, tools, usize::MAX, max_tokens)
}

/// [`fit`] into at most `cap` tokens as well, shortening the oldest tool
/// results first.
pub(super) fn fit_within(
    provider: &mut dyn Provider,
    view: &[Message],
    tools: &[ToolDef],
    cap: usize,
    max_tokens: usize,
) -> Result<Vec<Message>, Overflowed> {
    let ctx = provider.context();
    let limit = match ctx {
        Some(ctx) => cap.min(limit(ctx, max_tokens)),
        None if cap == usize::MAX => return Ok(view.to_vec()),
        None => cap,
    };
    let mut count = |m: &[Message]| provider.count(m, tools).unwrap_or(0);
    prompts::fit::fit(view, limit, &mut count).map(|(v, _)| v).map_err(|o| Overflowed {
        need: o.need,
        limit,
        context: ctx.unwrap_or(limit),
    })
}
