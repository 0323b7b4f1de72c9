//! What every request shares: the server `State` (the engine worker, the
//! metrics, the model served, the replies in flight with their cancel flags)
//! and access to the store from a handler, off the async threads
//! (`blocking`); the constant-time comparison of secrets.

use super::json::error;
use super::metrics::Metrics;
use super::models::{Lease, ModelError, Models};
use super::worker::Worker;
use crate::state::policy::SamplingLimits;
use crate::state::store::Store;
use axum::http::StatusCode;
use axum::response::Response;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub(crate) use crate::provider::engine::Card;

/// Shared by every request.
#[derive(Debug, Clone)]
pub(crate) struct State {
    pub(crate) worker: Worker,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) model: String,
    pub(crate) card: Arc<Card>,
    pub(crate) context: usize,
    /// How big a request's body may be, and how long it may take to arrive.
    pub(crate) body: super::json::BodyRules,
    /// What a request's sampling knobs may ask for (the `sampling/…`
    /// policies in force).
    pub(crate) limits: SamplingLimits,
    /// Cancel flags of replies in flight (by run id, or a request id).
    pub(crate) inflight: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
    pub(crate) started: Instant,
    /// In front of an upstream engine: it, and the models it listed at
    /// start-up.
    pub(crate) upstream: Option<Upstream>,
    /// The local models served (none in front of an upstream). `worker`,
    /// `model`, `card` and `context` above are then the default model's as
    /// it loaded at start; a request uses [`State::for_model`].
    pub(crate) models: Option<Arc<Models>>,
}

/// The upstream engine generation runs on (`serve --provider openai`).
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    pub(crate) provider: crate::provider::openai::OpenAi,
    pub(crate) models: Vec<String>,
}

impl State {
    pub(crate) fn new(
        worker: Worker,
        metrics: Arc<Metrics>,
        model: String,
        card: Card,
        context: usize,
        body: super::json::BodyRules,
        limits: SamplingLimits,
    ) -> State {
        State {
            worker,
            metrics,
            model,
            card: Arc::new(card),
            context,
            body,
            limits,
            inflight: Arc::default(),
            started: Instant::now(),
            upstream: None,
            models: None,
        }
    }

    /// Requests waiting, over every loaded model.
    pub(crate) fn queue_depth(&self) -> usize {
        match &self.models {
            Some(m) => m.loaded().iter().map(|s| s.worker.depth.load(Ordering::Relaxed)).sum(),
            None => self.worker.depth.load(Ordering::Relaxed),
        }
    }

    /// The state for a request `body` (its `model`, or Ollama's older
    /// `name`; its `keep_alive`), as [`State::for_model`] gives it; an
    /// error response (404 for an unknown model, naming where models are
    /// looked for) otherwise.
    pub(crate) async fn for_body(
        &self,
        body: &serde_json::Value,
    ) -> Result<(State, Option<Lease>), Response> {
        use serde_json::Value;
        let requested = match body.get("model").filter(|m| !m.is_null()).or(body.get("name")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(_) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "`model` must be a string",
                ))
            }
        };
        let keep = super::models::keep_alive(body.get("keep_alive"))
            .map_err(|m| error(StatusCode::BAD_REQUEST, "invalid_request", m))?;
        match self.for_model(requested).await {
            Ok((st, mut lease)) => {
                if let Some(l) = lease.as_mut() {
                    l.keep_alive(keep);
                }
                Ok((st, lease))
            }
            Err(e) => Err(model_error(e)),
        }
    }

    /// A request's JSON body (within the body limit) and the state and
    /// lease of the model it names ([`State::for_body`]).
    pub(crate) async fn read(
        &self,
        req: axum::extract::Request,
    ) -> Result<(serde_json::Value, State, Option<Lease>), Response> {
        let body = super::json::json_body(self.body, req).await?;
        let (st, lease) = self.for_body(&body).await?;
        Ok((body, st, lease))
    }

    /// The name, card and context of the model a body's `model` names,
    /// without loading it (`/api/show`, listings).
    pub(crate) async fn describe(
        &self,
        body: &serde_json::Value,
    ) -> Result<(String, Arc<Card>, usize), Response> {
        let requested = match body.get("model").filter(|m| !m.is_null()).or(body.get("name")) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        let Some(models) = &self.models else {
            let (st, _) = self.for_model(requested.as_deref()).await.map_err(model_error)?;
            return Ok((st.model, st.card, st.context));
        };
        let models = Arc::clone(models);
        tokio::task::spawn_blocking(move || models.describe(requested.as_deref()))
            .await
            .map_err(|e| model_error(ModelError::Load { name: "?".into(), why: e.to_string() }))?
            .map_err(model_error)
    }

    /// The state a request naming `requested` (none: the default model)
    /// is served with: that model's worker, name, card and context, loaded
    /// now if it is not, and a lease that keeps it loaded while held. In
    /// front of an upstream there is one model, under its names.
    pub(crate) async fn for_model(
        &self,
        requested: Option<&str>,
    ) -> Result<(State, Option<Lease>), ModelError> {
        let Some(models) = &self.models else {
            return match super::models::wanted(requested) {
                Some(m) if m != self.model && !self.model.ends_with(m) => {
                    Err(ModelError::Unknown { name: m.to_owned(), looked_in: Vec::new() })
                }
                _ => Ok((self.clone(), None)),
            };
        };
        let models = Arc::clone(models);
        let requested = requested.map(str::to_owned);
        let lease = tokio::task::spawn_blocking(move || models.get(requested.as_deref()))
            .await
            .map_err(|e| ModelError::Load { name: "?".into(), why: e.to_string() })??;
        let s = lease.served();
        let mut st = self.clone();
        st.worker = s.worker.clone();
        st.model = s.name.clone();
        st.card = Arc::clone(&s.card);
        st.context = s.context;
        Ok((st, Some(lease)))
    }

    /// A cancel flag registered until the guard drops.
    pub(crate) fn track(&self, key: String) -> (Arc<AtomicBool>, Tracked) {
        let flag = Arc::new(AtomicBool::new(false));
        if let Ok(mut m) = self.inflight.lock() {
            m.insert(key.clone(), Arc::clone(&flag));
        }
        (Arc::clone(&flag), Tracked { key, inflight: Arc::clone(&self.inflight), flag })
    }
}

/// The answer to a request for a model that cannot be served.
fn model_error(e: ModelError) -> Response {
    match e {
        e @ ModelError::Unknown { .. } => {
            error(StatusCode::NOT_FOUND, "model_not_found", e.to_string())
        }
        e @ ModelError::TooBig { .. } => {
            error(StatusCode::INSUFFICIENT_STORAGE, "model_too_big", e.to_string())
        }
        e => error(StatusCode::INTERNAL_SERVER_ERROR, "model_load_failed", e.to_string()),
    }
}

/// Unregisters a reply in flight and cancels it when dropped (a client that
/// goes away cancels its generation).
#[derive(Debug)]
pub(crate) struct Tracked {
    key: String,
    inflight: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
    flag: Arc<AtomicBool>,
}

impl Tracked {
    /// Keeps the reply running after the guard drops (it finished).
    pub(crate) fn done(self) {
        if let Ok(mut m) = self.inflight.lock() {
            m.remove(&self.key);
        }
        std::mem::forget(self);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::Relaxed);
        if let Ok(mut m) = self.inflight.lock() {
            m.remove(&self.key);
        }
    }
}

/// Runs `f` on the store on a blocking thread; a failure is a 500 JSON error.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce(&Store) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, Response> {
    let r = tokio::task::spawn_blocking(move || {
        let store = Store::open()?;
        f(&store)
    })
    .await;
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            Err(error(StatusCode::INTERNAL_SERVER_ERROR, "store_error", format!("{e:#}")))
        }
        Err(_) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the request failed")),
    }
}

/// Compares two secrets in time that depends only on their lengths.
pub(super) fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
