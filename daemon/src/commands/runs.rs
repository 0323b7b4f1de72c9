//! `agentd runs`: list, audit (`show`: snapshot and ledger), cancel and
//! resume runs. A resumed run continues under its own admission snapshot —
//! provider, model, corpus, limits — and its ledger: a newer, larger
//! default never enlarges it and used requests stay used.

use crate::commands::engine::EngineArgs;
use crate::events::Ev;
use crate::research::{self, Budget, Progress, RunOptions};
use crate::state::policy::{self, Policies};
use crate::state::store::Store;
use crate::tools::{HandleRec, Host};
use anyhow::{bail, Context, Result};
use prompts::{Message, ToolCallMsg};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The engine options of a run, as stored in its snapshot.
pub(crate) fn engine_json(e: &EngineArgs) -> Value {
    json!({"model": e.model, "device": e.device, "threads": e.threads, "provider": e.provider,
           "base_url": e.base_url, "api_key_env": e.api_key_env, "tool_format": e.tool_format, "script": e.script})
}

fn engine_from(v: &Value) -> EngineArgs {
    let s = |k: &str| v[k].as_str().map(str::to_owned);
    EngineArgs {
        model: s("model"),
        device: s("device").unwrap_or_else(|| "auto".into()),
        threads: v["threads"].as_u64().map(|n| n as usize),
        provider: s("provider").unwrap_or_else(|| "local".into()),
        base_url: s("base_url"),
        api_key_env: s("api_key_env"),
        tool_format: s("tool_format"),
        script: s("script").map(PathBuf::from),
    }
}

/// The tool limits a set of policies allows.
pub(crate) fn tool_limits(p: &Policies) -> crate::tools::Limits {
    crate::tools::Limits {
        results_per_search: p.get(policy::RESULTS) as usize,
        searches: p.get(policy::SEARCHES) as usize,
        reads: p.get(policy::READS) as usize,
        handle_capacity: p.get(policy::HANDLE_CAPACITY) as usize,
        handle_lifetime: p.get(policy::HANDLE_LIFETIME) as u64,
    }
}

/// Provider retry settings from policies.
pub(crate) fn retry(p: &Policies) -> crate::provider::openai::Retry {
    crate::provider::openai::Retry {
        retries: p.get(policy::RETRIES) as u32,
        backoff: Duration::from_millis(p.get(policy::BACKOFF) as u64),
        timeout: Duration::from_secs(p.get(policy::TIMEOUT) as u64),
    }
}

pub(crate) fn list(store: &Store) -> Result<()> {
    store.mark_interrupted(false)?;
    let mut st = store.conn.prepare(
        "SELECT id, chat_id, status, outcome, stop, question, created, updated FROM runs ORDER BY created DESC, rowid DESC",
    )?;
    let rows = st.query_map([], |r| {
        Ok(json!({"run_id": r.get::<_, String>(0)?, "chat_id": r.get::<_, String>(1)?, "status": r.get::<_, String>(2)?,
                  "outcome": r.get::<_, Option<String>>(3)?, "stop": r.get::<_, Option<String>>(4)?,
                  "question": r.get::<_, String>(5)?.chars().take(80).collect::<String>(),
                  "created": r.get::<_, String>(6)?, "updated": r.get::<_, String>(7)?}))
    })?;
    for r in rows {
        println!("{}", r?);
    }
    Ok(())
}

/// The run record with snapshot, ledger and handles.
pub(crate) fn record(store: &Store, id: &str) -> Result<Value> {
    let row = store
        .conn
        .query_row(
            "SELECT chat_id, status, outcome, stop, error, snapshot, elapsed_ms, created, updated, question FROM runs WHERE id = ?1",
            [id],
            |r| {
                Ok(json!({"run_id": id, "chat_id": r.get::<_, String>(0)?, "status": r.get::<_, String>(1)?,
                          "outcome": r.get::<_, Option<String>>(2)?, "stop": r.get::<_, Option<String>>(3)?,
                          "error": r.get::<_, Option<String>>(4)?.and_then(|e| serde_json::from_str::<Value>(&e).ok()),
                          "snapshot": serde_json::from_str::<Value>(&r.get::<_, String>(5)?).unwrap_or(Value::Null),
                          "elapsed_ms": r.get::<_, i64>(6)?, "created": r.get::<_, String>(7)?, "updated": r.get::<_, String>(8)?,
                          "question": r.get::<_, String>(9)?}))
            },
        )
        .with_context(|| format!("no run {id:?} (see `agentd runs list`)"))?;
    let mut st = store.conn.prepare("SELECT n, phase, outcome, classification, detail, created FROM ledger WHERE run_id = ?1 ORDER BY id")?;
    let ledger: Vec<Value> = st
        .query_map([id], |r| {
            Ok(json!({"n": r.get::<_, i64>(0)?, "phase": r.get::<_, String>(1)?, "outcome": r.get::<_, String>(2)?,
                      "classification": r.get::<_, Option<String>>(3)?, "detail": r.get::<_, Option<String>>(4)?,
                      "at": r.get::<_, String>(5)?}))
        })?
        .collect::<Result<_, _>>()?;
    let mut out = row;
    out["ledger"] = json!(ledger);
    out["handles"] = json!(handles(store, id)?
        .into_iter()
        .map(
            |h| json!({"handle": h.handle, "path": h.path, "segment": h.segment, "read": h.read_ok})
        )
        .collect::<Vec<_>>());
    Ok(out)
}

pub(crate) fn show(store: &Store, id: &str) -> Result<()> {
    store.mark_interrupted(false)?;
    println!("{}", serde_json::to_string_pretty(&record(store, id)?)?);
    Ok(())
}

/// Cancels a run; `in_daemon`: called by the daemon, whose own runs are
/// live (see `Store::mark_interrupted`).
pub(crate) fn cancel(store: &Store, id: &str, in_daemon: bool) -> Result<&'static str> {
    store.mark_interrupted(in_daemon)?;
    let status: String = store
        .conn
        .query_row("SELECT status FROM runs WHERE id = ?1", [id], |r| r.get(0))
        .with_context(|| format!("no run {id:?}"))?;
    let t = crate::state::store::now();
    Ok(match status.as_str() {
        "running" => {
            store.conn.execute(
                "UPDATE runs SET cancel_requested = 1, updated = ?2 WHERE id = ?1",
                rusqlite::params![id, t],
            )?;
            "cancel requested"
        }
        "interrupted" => {
            store.conn.execute("UPDATE runs SET status = 'cancelled', outcome = 'cancelled', stop = 'cancelled', updated = ?2 WHERE id = ?1", rusqlite::params![id, t])?;
            "cancelled"
        }
        _ => "already finished",
    })
}

fn handles(store: &Store, id: &str) -> Result<Vec<HandleRec>> {
    let mut st = store.conn.prepare(
        "SELECT handle, path, segment, title, issued, read_ok FROM run_handles WHERE run_id = ?1",
    )?;
    let v = st
        .query_map([id], |r| {
            Ok(HandleRec {
                handle: r.get(0)?,
                path: r.get(1)?,
                segment: r.get::<_, i64>(2)? as usize,
                title: r.get(3)?,
                issued: r.get::<_, i64>(4)? as u64,
                read_ok: r.get(5)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(v)
}

/// Continues an interrupted run under its snapshot and ledger, with the
/// provider its snapshot names.
pub(crate) fn resume(
    store: &Store,
    id: &str,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Result<crate::events::Done> {
    resume_inner(store, id, None, cancel, emit, false)
}

/// Continues an interrupted run on a provider already loaded (the
/// daemon's model).
pub(crate) fn resume_with(
    store: &Store,
    id: &str,
    provider: &mut dyn crate::provider::Provider,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
) -> Result<crate::events::Done> {
    // Inside the daemon: runs under its own process id are live.
    resume_inner(store, id, Some(provider), cancel, emit, true)
}

fn resume_inner(
    store: &Store,
    id: &str,
    given: Option<&mut dyn crate::provider::Provider>,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(&Ev),
    in_daemon: bool,
) -> Result<crate::events::Done> {
    store.mark_interrupted(in_daemon)?;
    let rec = record(store, id)?;
    let status = rec["status"].as_str().unwrap_or_default();
    if status != "interrupted" {
        bail!("run {id} is {status}; only an interrupted run can be resumed");
    }
    let snap = &rec["snapshot"];
    let policies = Policies::from_snapshot(&snap["policies"]).context("the run's snapshot")?;
    let config = &snap["config"];
    let engine = engine_from(&config["engine"]);
    let corpus: Vec<PathBuf> = config["corpus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(PathBuf::from)
        .collect();
    let notes = config["notes"].as_str().map(PathBuf::from);
    let corpus = if corpus.is_empty() {
        None
    } else {
        Some(crate::tools::corpus::Corpus::open(&corpus, policies.get(policy::SEGMENT) as usize)?)
    };
    let mut host = Host::new(corpus, notes, tool_limits(&policies));
    host.handles.restore(handles(store, id)?);
    // What the run did before: its exchanges, rounds, quotas and evidence.
    let chat_id = rec["chat_id"].as_str().unwrap_or_default().to_owned();
    let mut p = Progress::default();
    let mut batch: Vec<(String, String, String)> = Vec::new();
    let mut batch_write = false;
    let flush = |p: &mut Progress, batch: &mut Vec<(String, String, String)>, write: &mut bool| {
        if batch.is_empty() {
            return;
        }
        if *write {
            p.same = 0;
            p.last_batch = None;
        } else {
            p.same = if p.last_batch.as_ref() == Some(batch) { p.same + 1 } else { 1 };
            p.last_batch = Some(std::mem::take(batch));
        }
        batch.clear();
        *write = false;
    };
    for m in store.messages(&chat_id)?.into_iter().filter(|m| m.run_id.as_deref() == Some(id)) {
        match (m.role.as_str(), &m.tool_calls) {
            ("assistant", Some(calls)) => {
                flush(&mut p, &mut batch, &mut batch_write);
                p.rounds += 1;
                let calls: Vec<Value> = serde_json::from_str(calls).unwrap_or_default();
                let mut a = Message::new("assistant", m.content.clone());
                a.tool_calls = calls
                    .iter()
                    .map(|c| {
                        ToolCallMsg::new(
                            c["id"].as_str().unwrap_or_default(),
                            c["name"].as_str().unwrap_or_default(),
                            &c["arguments"].to_string(),
                        )
                    })
                    .collect();
                p.exchanges.push(a);
            }
            ("tool", _) => {
                let name = m.name.clone().unwrap_or_default();
                match name.as_str() {
                    "search_sources" => host.searches += 1,
                    "read_source" => host.reads += 1,
                    _ => batch_write = true,
                }
                if m.status == "ok" {
                    research::collect_evidence(&mut p.evidence, &name, &m.content);
                }
                let args = p
                    .exchanges
                    .last()
                    .and_then(|a| {
                        a.tool_calls.iter().find(|c| Some(&c.id) == m.tool_call_id.as_ref())
                    })
                    .map(|c| c.function.arguments.to_string())
                    .unwrap_or_default();
                batch.push((
                    name.clone(),
                    research::canonical(&args),
                    research::digest(&m.content),
                ));
                let mut t = Message::new("tool", m.content.clone());
                t.tool_call_id = m.tool_call_id.clone();
                t.name = Some(name);
                p.exchanges.push(t);
            }
            _ => {}
        }
    }
    flush(&mut p, &mut batch, &mut batch_write);
    let mut budget = Budget::from_policies(&policies);
    for l in rec["ledger"].as_array().into_iter().flatten() {
        if l["outcome"] == "refused" {
            continue;
        }
        match l["phase"].as_str() {
            Some("research") => budget.research_used += 1,
            _ => budget.reserve_used += 1,
        }
    }
    budget.elapsed_before = Duration::from_millis(rec["elapsed_ms"].as_u64().unwrap_or(0));
    let history: Vec<Message> = store
        .messages(&chat_id)?
        .into_iter()
        .take_while(|m| m.run_id.as_deref() != Some(id))
        .filter(|m| {
            (m.role == "user" || (m.role == "assistant" && m.tool_calls.is_none()))
                && !m.content.trim().is_empty()
        })
        .map(|m| Message::new(&m.role, m.content))
        .collect();
    let mut built;
    let provider: &mut dyn crate::provider::Provider = match given {
        Some(p) => p,
        None => {
            built = crate::provider::build::build(
                &engine,
                retry(&policies),
                Some(policies.get(policy::CONTEXT) as usize),
            )?;
            built.as_mut()
        }
    };
    store.conn.execute(
        "UPDATE runs SET status = 'running', pid = ?2, updated = ?3 WHERE id = ?1",
        rusqlite::params![id, std::process::id() as i64, crate::state::store::now()],
    )?;
    let opts = RunOptions {
        question: rec["question"].as_str().unwrap_or_default().to_owned(),
        chat_id: Some(chat_id.clone()),
        voice: snap["voice"].as_bool().unwrap_or(false),
        provider: provider.describe(),
        config: config.clone(),
    };
    Ok(research::drive(
        provider, &mut host, store, budget, p, id, &chat_id, &history, &opts, cancel, emit,
    ))
}
