//! Long-source section analysis (docs/budgets.md "Section analysis spends
//! research, never the reserve"; docs/research.md "Long sources"):
//! a whole source is split into sections — at its headings where it has
//! them, else by size — and *section workers* read them: model requests of
//! phase `section`, each given the question, the focus and one section,
//! asked to return only what bears on them. The model asks for it with
//! `analyze_source`; the loop also uses workers to condense the longest
//! tool results when the reserved final turn's view would not fit, instead
//! of cutting them (`condense`).
//!
//! Workers are bounded by the research runtime's policies
//! (`research/section-requests`, `…/section-size`,
//! `…/section-output-tokens`, `…/section-workers`); each is admitted
//! against the run's budget and written to its ledger before it is sent,
//! spends the research allowance (never the finalization reserve), and
//! runs with up to `section-workers` others in one provider batch (the
//! local engine steps them together). When the limit stops an analysis,
//! its result says `coverage: partial` with the sections left unanalyzed,
//! and research ends for the tools-free answer (`Stop::SectionLimit`).

use super::ledger::Attempts;
use super::{view, Ctx};
use crate::events::{Ev, Phase, RunError};
use crate::provider::{Provider, ProviderError, TurnFinish, TurnRequest};
use crate::state::policy::{self, Policies};
use crate::tools::{self, Analysis, Coverage, Finding, ToolOutput};
use prompts::{texts, Message, ToolDef};
use serde_json::{json, Value};

/// The section limits of a run (from its snapshot's policies).
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Characters in a section, at most.
    pub(super) size: usize,
    /// Output tokens of one worker.
    pub(super) tokens: usize,
    /// Workers sent together.
    pub(super) workers: usize,
}

impl Limits {
    pub(super) fn from_policies(p: &Policies) -> Limits {
        Limits {
            size: p.get(policy::SECTION_SIZE) as usize,
            tokens: p.get(policy::SECTION_TOKENS) as usize,
            workers: (p.get(policy::SECTION_WORKERS) as usize).max(1),
        }
    }
}

/// A markdown heading line (`#` to `######` and a space).
fn is_heading(line: &str) -> bool {
    let hashes = line.bytes().take_while(|&b| b == b'#').count();
    (1..=6).contains(&hashes) && line[hashes..].starts_with([' ', '\t'])
}

/// Splits `text` into sections of at most `size` characters: at headings
/// (outside code fences) where it has at least two, small neighbours
/// merged; else, and inside an oversized heading section, by size at
/// paragraph and line breaks. Nothing is lost: the sections concatenate to
/// the text.
pub(super) fn split(text: &str, size: usize) -> Vec<String> {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut fence = false;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with("```") {
            fence = !fence;
        }
        if !fence && is_heading(t) && !cur.trim().is_empty() {
            parts.push(std::mem::take(&mut cur));
        }
        cur.push_str(line);
    }
    if !cur.is_empty() {
        parts.push(cur);
    }
    if parts.len() < 2 {
        return tools::corpus::split_segments(text, size);
    }
    let mut out: Vec<String> = Vec::new();
    for part in parts {
        let n = part.chars().count();
        match out.last_mut() {
            Some(last) if last.chars().count() + n <= size => last.push_str(&part),
            _ if n <= size => out.push(part),
            _ => out.extend(tools::corpus::split_segments(&part, size)),
        }
    }
    out
}

/// One worker's request: the question, the focus, one section of `source`.
fn worker_view(
    question: &str,
    focus: &str,
    source: &str,
    section: usize,
    sections: usize,
    text: &str,
) -> Vec<Message> {
    let focus = if focus.trim().is_empty() { "(none: the question itself)" } else { focus.trim() };
    let user = texts::SECTION_USER
        .trim()
        .replace("{question}", question.trim())
        .replace("{focus}", focus)
        .replace("{source}", source)
        .replace("{section}", &section.to_string())
        .replace("{sections}", &sections.to_string())
        .replace("{text}", text.trim());
    vec![Message::new("system", texts::SECTION_SYSTEM.trim()), Message::new("user", user)]
}

/// A worker's reply that found nothing.
fn is_nothing(text: &str) -> bool {
    let t = text.trim().trim_end_matches('.');
    t.is_empty() || t.eq_ignore_ascii_case("none")
}

/// What a group of workers returned: each section's text (`None`: not
/// analyzed) and whether the section limit stopped them.
struct Worked {
    texts: Vec<Option<String>>,
    cut: bool,
}

/// Runs a worker for each view, `workers` at once, while the section
/// limit and the research allowance allow; each request is admitted and
/// written to the ledger before it is sent.
fn run_workers(cx: &mut Ctx<'_>, provider: &mut dyn Provider, views: &[Vec<Message>]) -> Worked {
    let limits = cx.budget.section_limits;
    let mut texts: Vec<Option<String>> = vec![None; views.len()];
    let mut cut = false;
    let mut i = 0;
    while i < views.len() {
        if cx.cancelled() {
            break;
        }
        let left = cx.budget.sections_left();
        if left == 0 {
            cut = true;
            break;
        }
        let n = left.min(limits.workers).min(views.len() - i);
        let reqs: Vec<TurnRequest<'_>> = views[i..i + n]
            .iter()
            .map(|v| TurnRequest {
                messages: v,
                tools: &[],
                phase: Phase::Section,
                max_tokens: limits.tokens,
                choices: &[],
            })
            .collect();
        let mut attempts: Vec<Attempts> = (0..n).map(|_| Attempts::default()).collect();
        let Ctx { budget, ledger, emit, cancel, decode, .. } = &mut *cx;
        let ledger = *ledger;
        let results = provider.turns(&reqs, cancel, &mut |j, _k| {
            if let Err(refused) = budget.admit(Phase::Section) {
                ledger.refused(budget.requests() + 1, Phase::Section, &budget.refusal());
                return Err(refused);
            }
            let num = budget.requests();
            ledger.sent(&mut attempts[j], num, Phase::Section);
            emit(&Ev::Request { n: num, phase: Phase::Section });
            Ok(())
        });
        for (j, (r, a)) in results.iter().zip(attempts).enumerate() {
            ledger.settle(a, r);
            if let Ok(reply) = r {
                *decode += reply.decode;
            }
            texts[i + j] = match r {
                Ok(reply) if reply.finish != TurnFinish::Cancelled => {
                    Some(reply.content.trim().to_owned())
                }
                Err(ProviderError::Budget { .. }) => {
                    cut = true;
                    None
                }
                _ => None,
            };
        }
        ledger.elapsed(budget.elapsed());
        i += n;
    }
    Worked { texts, cut }
}

/// The findings of workers' texts, and the sections left unanalyzed.
fn findings(texts: &[Option<String>]) -> (Vec<Finding>, Vec<usize>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for (k, t) in texts.iter().enumerate() {
        match t {
            Some(t) if !is_nothing(t) => found.push(Finding { section: k + 1, text: t.clone() }),
            Some(_) => {}
            None => missing.push(k + 1),
        }
    }
    (found, missing)
}

/// Why coverage is partial, for the model.
fn partial_note(cx: &Ctx<'_>, cut: bool, missing: &[usize]) -> Option<String> {
    if missing.is_empty() {
        return None;
    }
    let list = missing.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
    Some(if cut {
        format!(
            "the section-request limit ({} = {} per run, within the research allowance) stopped the analysis; sections {list} were not analyzed",
            policy::SECTION_REQUESTS,
            cx.budget.sections
        )
    } else {
        format!("sections {list} could not be analyzed")
    })
}

/// Runs `analyze_source` (arguments as the model wrote them): the whole
/// source of the handle, section by section.
pub(super) fn analyze(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    question: &str,
    arguments: &str,
) -> ToolOutput {
    let args: Value = match serde_json::from_str(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return ToolOutput::error(
                "INVALID_ARGUMENTS",
                format!("arguments must be a JSON object, got {arguments:?}"),
            )
        }
    };
    let src = match cx.host.whole_source(&args) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let focus = args.get("focus").and_then(Value::as_str).unwrap_or_default();
    let parts = split(&src.text, cx.budget.section_limits.size);
    let total = parts.len();
    cx.emit(Ev::Notice {
        kind: "section_analysis",
        text: format!(
            "Analyzing {} ({total} sections) with section workers; {} section requests left",
            src.handle,
            cx.budget.sections_left()
        ),
    });
    let label = format!("{} ({})", src.handle, src.title);
    let views: Vec<Vec<Message>> = parts
        .iter()
        .enumerate()
        .map(|(k, t)| worker_view(question, focus, &label, k + 1, total, t))
        .collect();
    let worked = run_workers(cx, provider, &views);
    let (found, missing) = findings(&worked.texts);
    let analyzed = total - missing.len();
    if analyzed > 0 {
        cx.host.mark_analyzed(&src.handle);
    }
    if worked.cut && !missing.is_empty() {
        cx.budget.sections_cut = true;
    }
    let note = partial_note(cx, worked.cut, &missing);
    ToolOutput::Analysis(Box::new(Analysis {
        handle: src.handle,
        title: src.title,
        sections: total,
        analyzed,
        coverage: if missing.is_empty() { Coverage::Complete } else { Coverage::Partial },
        findings: found,
        unanalyzed: missing,
        note,
    }))
}

/// Results shorter than this are not worth a worker.
const CONDENSE_MIN: usize = 400;

/// The reserved final turn's view made to fit by condensing, not cutting:
/// while it is over the context, the longest tool result not yet condensed
/// is read by section workers and replaced by their findings (within the
/// same section limits). What still does not fit is left to fitting.
pub(super) fn condense(
    cx: &mut Ctx<'_>,
    provider: &mut dyn Provider,
    question: &str,
    mut view: Vec<Message>,
) -> Vec<Message> {
    let Some(ctx) = provider.context() else { return view };
    let limit = view::limit(ctx, cx.budget.turn_tokens);
    let over = |provider: &mut dyn Provider, v: &[Message]| {
        provider.count(v, &[] as &[ToolDef]).is_some_and(|n| n > limit)
    };
    if !over(provider, &view) {
        return view;
    }
    let mut order: Vec<usize> = (0..view.len()).filter(|&i| view[i].role == "tool").collect();
    order.sort_by_key(|&i| std::cmp::Reverse(view[i].content.chars().count()));
    let mut noticed = false;
    for i in order {
        if !over(provider, &view) || cx.cancelled() || cx.budget.sections_left() == 0 {
            break;
        }
        let text = view[i].content.clone();
        if text.chars().count() < CONDENSE_MIN {
            break;
        }
        if !noticed {
            noticed = true;
            cx.emit(Ev::Notice {
                kind: "section_analysis",
                text: "Condensing the longest tool results with section workers so the answer's context fits".into(),
            });
        }
        let name = view[i].name.clone().unwrap_or_else(|| "a tool".into());
        let parts = split(&text, cx.budget.section_limits.size);
        let total = parts.len();
        let label = format!("the result of {name}");
        let views: Vec<Vec<Message>> = parts
            .iter()
            .enumerate()
            .map(|(k, t)| worker_view(question, "", &label, k + 1, total, t))
            .collect();
        let worked = run_workers(cx, provider, &views);
        let (found, missing) = findings(&worked.texts);
        if missing.len() == total {
            // No worker ran: keep the result for fitting.
            continue;
        }
        let findings: Vec<Value> =
            found.iter().map(|f| json!({"section": f.section, "text": f.text})).collect();
        let mut condensed = json!({"condensed": true, "tool": name, "sections": total,
            "analyzed": total - missing.len(),
            "coverage": if missing.is_empty() { "complete" } else { "partial" },
            "findings": findings});
        if !missing.is_empty() {
            condensed["unanalyzed"] = json!(missing);
        }
        view[i].content = condensed.to_string();
    }
    view
}

/// The composition check a run makes at its start, with its provider: one
/// section (at worst a token per 3 characters), the question and a
/// worker's reply must fit the model's context, else the configuration is
/// refused naming the limits.
pub(super) fn check_fit(
    cx: &Ctx<'_>,
    provider: &mut dyn Provider,
    question: &str,
) -> Result<(), RunError> {
    let Some(ctx) = provider.context() else { return Ok(()) };
    let limits = cx.budget.section_limits;
    let base = provider.count(&worker_view(question, "", "S1", 1, 1, ""), &[]).unwrap_or(0);
    let need = base + limits.size / 3 + limits.tokens;
    if need <= ctx {
        return Ok(());
    }
    Err(RunError::new(
        "SECTION_SIZE_TOO_LARGE",
        "configuration",
        format!(
            "{} = {} characters (about {} tokens) with the question and instructions ({base} tokens) and {} = {} need {need} tokens, but the model's context holds {ctx}; lower {} in policies.toml",
            policy::SECTION_SIZE,
            limits.size,
            limits.size / 3,
            policy::SECTION_TOKENS,
            limits.tokens,
            policy::SECTION_SIZE
        ),
    ))
}

/// The tools the next research request offers: `analyze_source` only while
/// a section request is left.
pub(super) fn offer(cx: &Ctx<'_>, tools: Vec<ToolDef>) -> Vec<ToolDef> {
    if cx.budget.sections_left() > 0 {
        return tools;
    }
    tools.into_iter().filter(|t| t.name != tools::ANALYZE).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_follow_headings_and_keep_all_text() {
        let text = "intro\n\n# One\n\nalpha\n\n## Two\n\nbeta\n\n```\n# not a heading\n```\n\n# Three\n\ngamma\n";
        let s = split(text, 200);
        assert_eq!(s.concat(), text);
        assert_eq!(s.len(), 1, "small neighbours merge up to the size");
        let s = split(text, 24);
        assert_eq!(s.concat(), text);
        assert!(s[0].starts_with("intro") && s[0].contains("# One"), "{s:?}");
        assert!(
            s.iter().any(|p| p.contains("# not a heading") && p.starts_with("## Two")),
            "{s:?}"
        );
        assert!(s.iter().any(|p| p.starts_with("# Three")), "{s:?}");
    }

    #[test]
    fn text_without_headings_is_split_by_size() {
        let text = "plain words here. ".repeat(100);
        let s = split(&text, 300);
        assert!(s.len() >= 6, "{}", s.len());
        assert!(s.iter().all(|p| p.chars().count() <= 300));
        assert_eq!(s.concat(), text);
        let big = format!("# A\n\n{}\n# B\n\nb\n", "x ".repeat(400));
        let s = split(&big, 300);
        assert_eq!(s.concat(), big);
        assert!(s.iter().all(|p| p.chars().count() <= 300));
    }

    #[test]
    fn nothing_found_is_not_a_finding() {
        let (found, missing) =
            findings(&[Some("NONE".into()), Some("two [S1]".into()), None, Some(" none. ".into())]);
        assert_eq!(found, vec![Finding { section: 2, text: "two [S1]".into() }]);
        assert_eq!(missing, vec![3]);
    }
}
