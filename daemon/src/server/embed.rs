//! The embedding routes: OpenAI's `POST /v1/embeddings` and Ollama's
//! `POST /api/embed` (and its older `/api/embeddings`); and the rerank
//! route `POST /v1/rerank` (also `/rerank`, `/v1/reranking`), shaped as
//! llama-server's and Cohere's, for a reranker's file. The model a body
//! names embeds each input on its engine thread (`Job::Embed`, between the
//! batch's steps), as `inference::Engine::embed` computes it: the pooling
//! the file names, else the mean, normalized to length 1 — llama.cpp's
//! numbers for each input alone.

use super::json::{bad, not_started};
use super::shared::State;
use super::wire::{decode, Started};
use super::worker::Job;
use crate::provider::engine::EmbedInput;
use crate::provider::ProviderError;
use axum::extract::{Request, State as AxState};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use inference::Embedding;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Most inputs one request may carry.
const MAX_INPUTS: usize = 2048;

/// One input: text, or token ids (OpenAI's API takes both).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// `input` as OpenAI and Ollama spell it: one string, strings, one token
/// array or token arrays.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Inputs {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl Inputs {
    fn list(self) -> Vec<Input> {
        match self {
            Inputs::One(s) => vec![Input::Text(s)],
            Inputs::Many(v) => v.into_iter().map(Input::Text).collect(),
            Inputs::Tokens(t) => vec![Input::Tokens(t)],
            Inputs::TokenLists(v) => v.into_iter().map(Input::Tokens).collect(),
        }
    }
}

/// OpenAI's embeddings request.
#[derive(Debug, Deserialize)]
struct OpenAiBody {
    #[allow(dead_code)]
    model: Option<String>,
    input: Inputs,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[allow(dead_code)]
    #[serde(default)]
    user: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
struct OpenAiItem {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Debug, Serialize)]
struct OpenAiUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Debug, Serialize)]
struct OpenAiList {
    object: &'static str,
    data: Vec<OpenAiItem>,
    model: String,
    usage: OpenAiUsage,
}

/// Ollama's `/api/embed` request (and `/api/embeddings`' `prompt`).
#[derive(Debug, Deserialize)]
struct OllamaBody {
    #[allow(dead_code)]
    model: Option<String>,
    input: Option<Inputs>,
    /// `/api/embeddings`: one text.
    prompt: Option<String>,
    /// Cut an input to the context instead of failing (Ollama's default).
    #[serde(default = "yes")]
    truncate: bool,
    #[serde(default)]
    dimensions: Option<usize>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Serialize)]
struct OllamaEmbed {
    model: String,
    embeddings: Vec<Vec<f32>>,
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: usize,
}

#[derive(Debug, Serialize)]
struct OllamaEmbeddings {
    embedding: Vec<f32>,
}

/// `dimensions`: the first `n` values, normalized again as the engine
/// normalizes a vector (the truncation Matryoshka-trained models allow);
/// `n` must be 1..=the model's size.
fn truncate(mut v: Vec<f32>, n: Option<usize>) -> Vec<f32> {
    let Some(n) = n.filter(|&n| n < v.len()) else { return v };
    v.truncate(n);
    inference::normalize(v)
}

fn check(inputs: &[Input], dimensions: Option<usize>, size: usize) -> Result<(), String> {
    if inputs.is_empty() {
        return Err("`input` has no inputs".into());
    }
    if inputs.len() > MAX_INPUTS {
        return Err(format!("`input` has {} inputs; at most {MAX_INPUTS}", inputs.len()));
    }
    if let Some(i) = inputs.iter().position(|i| match i {
        Input::Text(s) => s.is_empty(),
        Input::Tokens(t) => t.is_empty(),
    }) {
        return Err(format!("input {i} is empty: an empty input has no embedding"));
    }
    match dimensions {
        Some(0) => Err("`dimensions` must be at least 1".into()),
        Some(d) if d > size => {
            Err(format!("`dimensions` is {d}, but the model's embeddings have {size}"))
        }
        _ => Ok(()),
    }
}

/// The inputs' embeddings on the model of `st`.
async fn run(st: &State, inputs: Vec<Input>, truncate: bool) -> Result<Vec<Embedding>, Started> {
    let inputs = inputs
        .into_iter()
        .map(|i| match i {
            Input::Text(t) => EmbedInput::Text(t),
            Input::Tokens(t) => EmbedInput::Tokens(t),
        })
        .collect();
    submit(st, inputs, truncate).await
}

/// `inputs` answered on the engine thread of `st`'s model (`Job::Embed`).
async fn submit(
    st: &State,
    inputs: Vec<EmbedInput>,
    truncate: bool,
) -> Result<Vec<Embedding>, Started> {
    let (tx, rx) = std::sync::mpsc::channel();
    if st.worker.submit(Job::Embed { inputs, truncate, tx }).is_err() {
        return Err(Started::Busy);
    }
    match tokio::task::spawn_blocking(move || rx.recv()).await {
        Ok(Ok(r)) => r.map_err(Started::Failed),
        _ => Err(Started::Failed(ProviderError::Failed("the engine stopped".into()))),
    }
}

/// The body of `req` as a `T`, on the model it names (held by the lease
/// while the request runs); a 400 of `what` and why when it is not one.
async fn read<T: serde::de::DeserializeOwned>(
    st: State,
    req: Request,
    what: &str,
) -> Result<(T, State, Option<super::models::Lease>), Response> {
    let (body, st, lease) = st.read(req).await?;
    let b = decode(body).map_err(|m| bad(format!("{what}{m}")))?;
    Ok((b, st, lease))
}

/// `POST /v1/embeddings`.
pub(super) async fn openai(AxState(st): AxState<State>, req: Request) -> Response {
    let (b, st, _lease) =
        match read::<OpenAiBody>(st, req, "the request is not an embeddings request: ").await {
            Ok(x) => x,
            Err(r) => return r,
        };
    let base64 = match b.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return bad(format!(
                "`encoding_format` is {other:?}: it must be \"float\" or \"base64\""
            ))
        }
    };
    let inputs = b.input.list();
    if let Err(m) = check(&inputs, b.dimensions, st.card.embedding) {
        return bad(m);
    }
    let out = match run(&st, inputs, false).await {
        Ok(v) => v,
        Err(s) => return not_started(s),
    };
    let tokens = out.iter().map(|e| e.tokens).sum();
    let data = out
        .into_iter()
        .enumerate()
        .map(|(index, e)| {
            let v = truncate(e.vector, b.dimensions);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                Vector::Float(v)
            };
            OpenAiItem { object: "embedding", index, embedding }
        })
        .collect();
    let list = OpenAiList {
        object: "list",
        data,
        model: st.model.clone(),
        usage: OpenAiUsage { prompt_tokens: tokens, total_tokens: tokens },
    };
    axum::Json(list).into_response()
}

/// `POST /api/embed` (`input`) and `/api/embeddings` (`prompt`, one
/// vector under `embedding`).
pub(super) async fn ollama(AxState(st): AxState<State>, req: Request) -> Response {
    let started = Instant::now();
    let legacy = req.uri().path().trim_end_matches('/') == "/api/embeddings";
    // Errors come out in Ollama's shape (`http.rs`'s `shaped` layer).
    let (b, st, _lease) = match read::<OllamaBody>(st, req, "").await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let inputs = match (b.input, b.prompt) {
        (Some(i), _) => i.list(),
        (None, Some(p)) => vec![Input::Text(p)],
        (None, None) => return bad("the request has no `input` (or `prompt`)"),
    };
    if let Err(m) = check(&inputs, b.dimensions, st.card.embedding) {
        return bad(m);
    }
    let out = match run(&st, inputs, b.truncate).await {
        Ok(v) => v,
        Err(s) => return not_started(s),
    };
    if legacy {
        let embedding = out.into_iter().next().map(|e| e.vector).unwrap_or_default();
        return axum::Json(OllamaEmbeddings { embedding: truncate(embedding, b.dimensions) })
            .into_response();
    }
    let count = out.iter().map(|e| e.tokens).sum();
    let reply = OllamaEmbed {
        model: super::ollama::tag(&st),
        embeddings: out.into_iter().map(|e| truncate(e.vector, b.dimensions)).collect(),
        total_duration: started.elapsed().as_nanos() as u64,
        load_duration: 0,
        prompt_eval_count: count,
    };
    axum::Json(reply).into_response()
}

/// A document to rerank: a string, or Cohere's older `{"text": …}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn text(&self) -> &str {
        match self {
            Document::Text(t) | Document::Object { text: t } => t,
        }
    }
}

/// The rerank request of llama-server, Jina and Cohere.
#[derive(Debug, Deserialize)]
struct RerankBody {
    #[allow(dead_code)]
    model: Option<String>,
    query: String,
    documents: Vec<Document>,
    /// The best `top_n` only (all by default).
    #[serde(default)]
    top_n: Option<usize>,
    /// Each result also carries its document (Cohere's and Jina's flag).
    #[serde(default)]
    return_documents: bool,
}

#[derive(Debug, Serialize)]
struct RerankDocument {
    text: String,
}

#[derive(Debug, Serialize)]
struct RerankResult {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<RerankDocument>,
}

#[derive(Debug, Serialize)]
struct RerankList {
    object: &'static str,
    model: String,
    results: Vec<RerankResult>,
    usage: OpenAiUsage,
}

/// Checks a rerank body: a query and 1..=MAX_INPUTS documents.
fn check_rerank(b: &RerankBody) -> Result<(), String> {
    if b.query.is_empty() {
        return Err("`query` is empty".into());
    }
    if b.documents.is_empty() {
        return Err("`documents` has no documents".into());
    }
    if b.documents.len() > MAX_INPUTS {
        return Err(format!(
            "`documents` has {} documents; at most {MAX_INPUTS}",
            b.documents.len()
        ));
    }
    if b.top_n == Some(0) {
        return Err("`top_n` must be at least 1".into());
    }
    Ok(())
}

/// The results best first (a stable sort: equal scores keep their order),
/// the best `top_n` of them.
fn ranked(scores: &[f32], top_n: Option<usize>) -> Vec<(usize, f32)> {
    let mut r: Vec<(usize, f32)> = scores.iter().copied().enumerate().collect();
    r.sort_by(|a, b| b.1.total_cmp(&a.1));
    r.truncate(top_n.unwrap_or(usize::MAX));
    r
}

/// `POST /v1/rerank`: each document's relevance to the query by a
/// reranker's classification head (llama-server's scores: no sigmoid),
/// best first. A document whose input is longer than the context is cut
/// to it.
pub(super) async fn rerank(AxState(st): AxState<State>, req: Request) -> Response {
    let (b, st, _lease) =
        match read::<RerankBody>(st, req, "the request is not a rerank request: ").await {
            Ok(x) => x,
            Err(r) => return r,
        };
    if let Err(m) = check_rerank(&b) {
        return bad(m);
    }
    if !st.card.reranker {
        return bad(format!(
            "model {:?} is not a reranker (its file has no `rank` pooling and classification head): rerank with a reranker GGUF such as bge-reranker",
            st.model
        ));
    }
    let inputs = b
        .documents
        .iter()
        .map(|d| EmbedInput::Rerank { query: b.query.clone(), document: d.text().to_owned() })
        .collect();
    let out = match submit(&st, inputs, true).await {
        Ok(v) => v,
        Err(s) => return not_started(s),
    };
    let tokens = out.iter().map(|e| e.tokens).sum();
    let scores: Vec<f32> = out.iter().map(|e| e.vector.first().copied().unwrap_or(0.0)).collect();
    let results = ranked(&scores, b.top_n)
        .into_iter()
        .map(|(index, relevance_score)| RerankResult {
            index,
            relevance_score,
            document: b
                .return_documents
                .then(|| RerankDocument { text: b.documents[index].text().to_owned() }),
        })
        .collect();
    axum::Json(RerankList {
        object: "list",
        model: st.model.clone(),
        results,
        usage: OpenAiUsage { prompt_tokens: tokens, total_tokens: tokens },
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_take_every_shape_openai_and_ollama_send() {
        let parse = |s: &str| serde_json::from_str::<Inputs>(s).unwrap().list().len();
        assert_eq!(parse(r#""a""#), 1);
        assert_eq!(parse(r#"["a", "b"]"#), 2);
        assert_eq!(parse("[1, 2, 3]"), 1);
        assert_eq!(parse("[[1], [2, 3]]"), 2);
        assert!(serde_json::from_str::<Inputs>("{}").is_err());
    }

    proptest::proptest! {
        /// Any body either route might get: decoding, the checks and the
        /// cut never panic, and what passes the checks is non-empty and
        /// asks for at most the model's size.
        #[test]
        fn any_embedding_body_is_read_or_refused(
            texts in proptest::collection::vec("\\PC{0,8}", 0..4),
            ids in proptest::collection::vec(proptest::collection::vec(proptest::num::u32::ANY, 0..4), 0..4),
            dims in proptest::option::of(0usize..100),
            size in 1usize..64,
            shape in 0u8..5,
        ) {
            let input = match shape {
                0 => serde_json::json!(texts.first().cloned().unwrap_or_default()),
                1 => serde_json::json!(texts),
                2 => serde_json::json!(ids.first().cloned().unwrap_or_default()),
                3 => serde_json::json!(ids),
                _ => serde_json::json!({"x": texts}),
            };
            let body = serde_json::json!({"model": "m", "input": input, "dimensions": dims});
            for inputs in [
                decode::<OpenAiBody>(body.clone()).ok().map(|b| b.input.list()),
                decode::<OllamaBody>(body).ok().and_then(|b| b.input).map(Inputs::list),
            ]
            .into_iter()
            .flatten()
            {
                if check(&inputs, dims, size).is_ok() {
                    proptest::prop_assert!(!inputs.is_empty());
                    proptest::prop_assert!(dims.is_none_or(|d| d >= 1 && d <= size));
                    let v = truncate(vec![0.5; size], dims);
                    proptest::prop_assert_eq!(v.len(), dims.unwrap_or(size));
                }
            }
        }
    }

    proptest::proptest! {
        /// Any rerank body: decoding, the checks and the ranking never
        /// panic, and what passes is ranked best first, at most `top_n`.
        #[test]
        fn any_rerank_body_is_read_or_refused(
            query in "\\PC{0,8}",
            docs in proptest::collection::vec("\\PC{0,8}", 0..5),
            top_n in proptest::option::of(0usize..8),
            objects in proptest::bool::ANY,
            scores in proptest::collection::vec(-1e3f32..1e3, 0..5),
        ) {
            let documents: Vec<serde_json::Value> = docs
                .iter()
                .map(|d| if objects { serde_json::json!({"text": d}) } else { serde_json::json!(d) })
                .collect();
            let body = serde_json::json!({"query": query, "documents": documents, "top_n": top_n});
            if let Ok(b) = decode::<RerankBody>(body) {
                if check_rerank(&b).is_ok() {
                    proptest::prop_assert!(!b.documents.is_empty() && !b.query.is_empty());
                    let r = ranked(&scores, b.top_n);
                    proptest::prop_assert!(r.len() <= b.top_n.unwrap_or(usize::MAX));
                    proptest::prop_assert!(r.windows(2).all(|w| w[0].1 >= w[1].1));
                }
            }
        }
    }

    #[test]
    fn rerank_results_are_best_first_and_cut_to_top_n() {
        assert_eq!(ranked(&[0.1, 0.9, 0.5], None), vec![(1, 0.9), (2, 0.5), (0, 0.1)]);
        assert_eq!(ranked(&[0.1, 0.9, 0.5], Some(1)), vec![(1, 0.9)]);
        assert_eq!(ranked(&[0.5, 0.5], Some(9)), vec![(0, 0.5), (1, 0.5)]);
        let body = |v: serde_json::Value| decode::<RerankBody>(v).map(|b| check_rerank(&b));
        let ok = serde_json::json!({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1});
        assert!(matches!(body(ok), Ok(Ok(()))));
        for refused in [
            serde_json::json!({"query": "", "documents": ["a"]}),
            serde_json::json!({"query": "q", "documents": []}),
            serde_json::json!({"query": "q", "documents": ["a"], "top_n": 0}),
        ] {
            assert!(matches!(body(refused), Ok(Err(_))));
        }
        assert!(body(serde_json::json!({"query": "q", "documents": [3]})).is_err());
    }

    #[test]
    fn dimensions_cut_and_renormalize_and_are_checked() {
        assert_eq!(truncate(vec![0.6, 0.8, 0.0], Some(1)), vec![1.0]);
        assert_eq!(truncate(vec![0.6, 0.8], None), vec![0.6, 0.8]);
        let one = [Input::Text("a".into())];
        assert!(check(&one, Some(4), 3).is_err() && check(&one, Some(0), 3).is_err());
        assert!(check(&one, Some(3), 3).is_ok());
        assert!(check(&[], None, 3).is_err());
        assert!(check(&[Input::Text(String::new())], None, 3).is_err());
    }
}
