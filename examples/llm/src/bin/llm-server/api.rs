//! The HTTP side: the router, its layers (request counting, panics, the API key) and the
//! endpoints.
//!
//! A generating request is parsed and checked here, its prompt rendered and tokenized on a
//! blocking thread, and handed to the [`Batcher`] with a sink that sends each event into an
//! unbounded channel ([`ChannelSink`]). The response owns the channel's receiver (the
//! handler's future until the first event, then the streamed body): a client that goes away
//! drops it, and the batcher cancels the request before its next pass, whether it waits for a
//! slot, evaluates its prompt (the sink answers from the channel whether its receiver is
//! still there) or decodes (the sink refuses the next piece).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tower_http::catch_panic::CatchPanicLayer;

use rknn_llm::chat::{
    ChatTemplate, ToolCallFormat, ToolCallStream, ToolConstraint, ToolStreamEvent, encode_prompt,
};
use rknn_llm::constraint::{GrammarCompiler, GrammarSpec};
use rknn_llm::model::Pooling;
use rknn_llm::sample::TokenLogprobs;
use rknn_llm::serve::{
    Batcher, EmbedSink, Event, EventSink, Finished, Request as GenRequest, ServeError,
};
use rknn_llm::session::Stop;
use rknn_llm::tokenizer::Tokenizer;

use crate::error::{ApiError, json_response};
use crate::metrics::{self, Requests};
use crate::params::{self, EmbedInput, Obj, Options};
use crate::tools::{self, Answer, ToolOutput};

/// How long past a request's deadline the HTTP side waits for the batcher to report it
/// (the batcher checks deadlines between passes) before answering 504 itself.
const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// The HTTP side's settings, from the flags: how requests are named, guarded and bounded
/// (how they are batched is the library's [`ServeConfig`](rknn_llm::serve::ServeConfig)).
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The model id `/v1/models` shows and responses name.
    pub alias: String,
    /// The key clients must send as `Authorization: Bearer KEY`, if any.
    pub api_key: Option<String>,
    /// The largest request body, in bytes.
    pub body_limit: usize,
    /// Each request's deadline, and the bound on reading its body.
    pub timeout: Duration,
}

/// What loading the model produced.
#[derive(Debug)]
pub struct Loaded {
    /// The vocabulary.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template, or why chat requests cannot be served.
    pub template: Result<Arc<ChatTemplate>, String>,
    /// Positions per slot.
    pub slot_ctx: usize,
    /// The model's trained context.
    pub n_ctx_train: usize,
    /// Slots.
    pub slots: usize,
    /// "npu", "emulator" or "f32".
    pub backend: &'static str,
    /// Compiles the requests' grammars (`response_format`, `json_schema`, `grammar`), or why
    /// this vocabulary cannot be constrained.
    pub grammars: Result<Arc<GrammarCompiler>, String>,
    /// The embeddings' pooling (`--pooling`, or the model's), or why embeddings cannot be
    /// served.
    pub pooling: Result<Pooling, String>,
    /// The embeddings' width (the model's `n_embd`).
    pub n_embd: usize,
}

/// The state every handler shares.
#[derive(Debug)]
pub struct AppState {
    /// The configuration.
    pub config: HttpConfig,
    /// Set once the model is loaded.
    pub loaded: OnceLock<Loaded>,
    /// The batcher, from loading until shutdown takes it away.
    pub batcher: Mutex<Option<Arc<Batcher>>>,
    /// Responses by endpoint and status.
    pub requests: Requests,
    /// When the server started (Unix seconds; `/v1/models`' `created`).
    pub started: u64,
}

impl AppState {
    /// A server still loading its model.
    pub fn new(config: HttpConfig) -> AppState {
        AppState {
            config,
            loaded: OnceLock::new(),
            batcher: Mutex::new(None),
            requests: Requests::default(),
            started: unix_now(),
        }
    }

    /// The batcher, if the server serves (a clone: hold it briefly).
    pub fn batcher(&self) -> Option<Arc<Batcher>> {
        self.batcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Takes the batcher away (shutdown); requests from now on are refused.
    pub fn take_batcher(&self) -> Option<Arc<Batcher>> {
        self.batcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// What loading produced, or 503 while the model loads.
    fn loaded(&self) -> Result<&Loaded, ApiError> {
        self.loaded.get().ok_or_else(ApiError::loading)
    }

    /// The loaded model and its batcher, or 503 (loading, or shutting down).
    fn serving(&self) -> Result<(&Loaded, Arc<Batcher>), ApiError> {
        let loaded = self.loaded()?;
        let batcher = self
            .batcher()
            .ok_or_else(|| ApiError::unavailable("the server is shutting down"))?;
        Ok((loaded, batcher))
    }
}

/// Shared state, as the handlers take it.
type St = State<Arc<AppState>>;

/// The whole application: the endpoints, 404 and 405 as error objects, the API key check,
/// panics as 500, and every response counted.
pub fn router(state: Arc<AppState>) -> Router {
    layered(routes(), state)
}

/// `routes` with the layers.
fn layered(routes: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    routes
        .layer(from_fn_with_state(state.clone(), authorize))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// The endpoints, without the layers.
fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

/// Counts each response by endpoint and status (`/metrics`' `llm_requests_total`).
async fn count(State(st): St, req: Request, next: Next) -> Response {
    let endpoint = metrics::endpoint(req.uri().path());
    let response = next.run(req).await;
    st.requests.count(endpoint, response.status().as_u16());
    response
}

/// With `--api-key`, every path but `/health` needs `Authorization: Bearer KEY`.
async fn authorize(State(st): St, req: Request, next: Next) -> Response {
    if let Some(key) = &st.config.api_key {
        if req.uri().path() != "/health" && !has_key(req.headers(), key) {
            let e = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid or missing API key: send `Authorization: Bearer KEY`",
            )
            .with_code("invalid_api_key");
            let mut r = e.into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

/// Whether `headers` carry `key` as a bearer token.
fn has_key(headers: &HeaderMap, key: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| same_bytes(given.trim().as_bytes(), key.as_bytes()))
}

/// Compares without stopping at the first difference (the time does not tell how much of
/// a guessed key was right).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A panic in a handler: 500 with the error object (the server goes on).
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let why = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into());
    ApiError::internal(format!("internal error: {why}")).into_response()
}

/// 404.
async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no endpoint {} {}", req.method(), req.uri().path()),
    )
}

/// 405.
async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {}", req.uri().path(), req.method()),
    )
}

/// `GET /health`.
async fn health(State(st): St) -> Response {
    match st.loaded() {
        Ok(_) => json_response(StatusCode::OK, &json!({"status": "ok"})),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/models`: the one model.
async fn models(State(st): St) -> Result<Response, ApiError> {
    let l = st.loaded()?;
    let body = json!({
        "object": "list",
        "data": [{
            "id": st.config.alias,
            "object": "model",
            "created": st.started,
            "owned_by": "rknn-llm",
            "meta": {
                "n_vocab": l.tokenizer.n_vocab(),
                "n_ctx_train": l.n_ctx_train,
                "n_ctx_slot": l.slot_ctx,
                "slots": l.slots,
                "backend": l.backend,
            },
        }],
    });
    Ok(json_response(StatusCode::OK, &body))
}

/// `GET /metrics`.
async fn metrics_text(State(st): St) -> Result<Response, ApiError> {
    let (_, batcher) = st.serving()?;
    let m = batcher.metrics();
    drop(batcher);
    let text = metrics::render(&m, &st.requests.snapshot());
    let mut r = (StatusCode::OK, text).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    Ok(r)
}

/// `POST /tokenize`: `{"content", "add_special": false, "parse_special": true,
/// "with_pieces": false}` to `{"tokens": [...]}` (ids, or `{"id", "piece"}` objects).
async fn tokenize(State(st): St, req: Request) -> Result<Response, ApiError> {
    let l = st.loaded()?;
    let obj = read_json(&st, req).await?;
    let content = params::get::<String>(&obj, "content")?
        .ok_or_else(|| ApiError::param("content", "`content` is missing"))?;
    let add_special = params::get::<bool>(&obj, "add_special")?.unwrap_or(false);
    let parse_special = params::get::<bool>(&obj, "parse_special")?.unwrap_or(true);
    let with_pieces = params::get::<bool>(&obj, "with_pieces")?.unwrap_or(false);
    let tok = l.tokenizer.clone();
    let tokens = blocking(move || {
        let ids = tok
            .encode(&content, add_special, parse_special)
            .map_err(|e| ApiError::param("content", e.to_string()))?;
        if !with_pieces {
            return Ok(json!(ids));
        }
        let list: Vec<Value> = ids
            .iter()
            .map(|&id| {
                let bytes = tok.token_to_piece(id);
                // llama-server's shape: the piece as text, or its bytes when not UTF-8.
                let piece = match std::str::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(_) => json!(bytes),
                };
                json!({"id": id, "piece": piece})
            })
            .collect();
        Ok(Value::Array(list))
    })
    .await?;
    Ok(json_response(StatusCode::OK, &json!({"tokens": tokens})))
}

/// `POST /detokenize`: `{"tokens": [ids]}` to `{"content": text}`.
async fn detokenize(State(st): St, req: Request) -> Result<Response, ApiError> {
    let l = st.loaded()?;
    let obj = read_json(&st, req).await?;
    let ids = params::get::<Vec<u32>>(&obj, "tokens")?.unwrap_or_default();
    let n_vocab = l.tokenizer.n_vocab();
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= n_vocab) {
        return Err(ApiError::param(
            "tokens",
            format!("token id {bad} is outside the vocabulary of {n_vocab}"),
        ));
    }
    let tok = l.tokenizer.clone();
    let content = blocking(move || {
        tok.detokenize(&ids, false, true)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| ApiError::param("tokens", e.to_string()))
    })
    .await?;
    Ok(json_response(StatusCode::OK, &json!({"content": content})))
}

/// `POST /v1/embeddings`: OpenAI's request ([`params::embed_request`]) and answer, each
/// input's vector pooled as `--pooling` (or the model) says and L2-normalised, computed by the
/// batcher between its decode passes ([`Batcher::embed`]).
async fn embeddings(State(st): St, req: Request) -> Result<Response, ApiError> {
    let deadline = Instant::now() + st.config.timeout;
    let (loaded, _) = st.serving()?;
    let obj = read_json(&st, req).await?;
    let request = params::embed_request(&obj, loaded.n_embd)?;
    let pooling = loaded.pooling.clone().map_err(ApiError::bad_request)?;
    let inputs = match request.input {
        EmbedInput::Tokens(t) => t,
        EmbedInput::Texts(texts) => {
            let tok = loaded.tokenizer.clone();
            blocking(move || {
                texts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        tok.encode(t, true, true)
                            .map_err(|e| ApiError::param("input", format!("`input[{i}]`: {e}")))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?
        }
    };
    let n_vocab = loaded.tokenizer.n_vocab();
    for (i, t) in inputs.iter().enumerate() {
        if t.is_empty() {
            return Err(ApiError::param(
                "input",
                format!("`input[{i}]` has no token"),
            ));
        }
        if t.len() > loaded.slot_ctx {
            return Err(ApiError::param(
                "input",
                format!(
                    "`input[{i}]` has {} tokens, more than a slot's context of {}",
                    t.len(),
                    loaded.slot_ctx
                ),
            )
            .with_code("context_length_exceeded"));
        }
        if let Some(bad) = t.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(ApiError::param(
                "input",
                format!("`input[{i}]`: token id {bad} is outside the vocabulary of {n_vocab}"),
            ));
        }
    }
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    let (_, batcher) = st.serving()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    batcher
        .embed(inputs, pooling, Some(deadline), Box::new(EmbedChannel(tx)))
        .map_err(|e| ApiError::from_serve(e, "input"))?;
    drop(batcher);
    let give_up = tokio::time::Instant::from_std(deadline + DEADLINE_GRACE);
    let vectors = match tokio::time::timeout_at(give_up, rx).await {
        Err(_) => return Err(ApiError::deadline()),
        Ok(Err(_)) => {
            return Err(ApiError::internal(
                "the batcher ended the request without a result",
            ));
        }
        Ok(Ok(answer)) => answer.map_err(|e| ApiError::from_serve(e, "input"))?,
    };
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if request.base64 {
                json!(base64_f32(v))
            } else {
                // serde_json writes an f32 as the shortest decimal that reads back to it.
                serde_json::to_value(v).unwrap_or(Value::Null)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let body = json!({
        "object": "list",
        "data": data,
        "model": st.config.alias,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    });
    Ok(json_response(StatusCode::OK, &body))
}

/// An embeddings request's reply: the answer into the channel whose receiver the handler
/// awaits. Nobody listens once the receiver is dropped (the client went away), which the
/// batcher asks before each of the request's passes.
struct EmbedChannel(tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, ServeError>>);

impl EmbedSink for EmbedChannel {
    fn answer(self: Box<Self>, answer: Result<Vec<Vec<f32>>, ServeError>) {
        let _ = self.0.send(answer);
    }

    fn is_listening(&mut self) -> bool {
        !self.0.is_closed()
    }
}

/// `v`'s little-endian f32 bytes in standard base64 (with padding), as OpenAI's
/// `encoding_format: "base64"` gives them.
fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(char::from(ABC[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Which generating endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

impl Kind {
    /// The request field the prompt came from.
    fn prompt_param(self) -> &'static str {
        match self {
            Kind::Chat => "messages",
            Kind::Completion => "prompt",
        }
    }
}

/// `POST /v1/chat/completions`.
async fn chat(State(st): St, req: Request) -> Result<Response, ApiError> {
    let deadline = Instant::now() + st.config.timeout;
    let (loaded, _) = st.serving()?;
    let obj = read_json(&st, req).await?;
    let messages = params::messages(&obj)?;
    let tool_request = params::tools(&obj)?;
    params::check_fields(&obj, params::Endpoint::Chat)?;
    let mut options = params::options(&obj, random_seed)?;
    options.sampling.logit_bias = params::logit_bias(&obj, loaded.tokenizer.n_vocab())?;
    let logprobs = params::chat_logprobs(&obj)?;
    let template = loaded.template.clone().map_err(ApiError::bad_request)?;
    let tok = loaded.tokenizer.clone();
    let (prompt, tool_output, tool_constraint) = blocking(move || {
        let plan = tools::plan(&template, messages, tool_request)?;
        let text = template
            .render(&plan.messages, true, &plan.options)
            .map_err(|e| match e {
                rknn_llm::chat::ChatError::Timeout { .. } => ApiError::internal(e.to_string()),
                _ => ApiError::param("messages", e.to_string()),
            })?;
        let prompt =
            encode_prompt(&tok, &text).map_err(|e| ApiError::param("messages", e.to_string()))?;
        Ok((prompt, plan.output, plan.constraint))
    })
    .await?;
    // `tool_choice` required or a named function (and the generic form's call-or-reply) is
    // enforced while sampling, so the call always parses and validates.
    if let Some(c) = tool_constraint {
        if let Some((_, other)) = &options.constraint {
            return Err(ApiError::param(
                *other,
                format!(
                    "`{other}` and tools that constrain the reply (`tool_choice`, or a template without tools) cannot both shape it"
                ),
            ));
        }
        let spec = match c {
            ToolConstraint::JsonSchema(text) => GrammarSpec::JsonSchema(
                serde_json::from_str(&text)
                    .map_err(|e| ApiError::internal(format!("the tools' schema: {e}")))?,
            ),
            ToolConstraint::Lark(g) => GrammarSpec::Lark(g),
        };
        options.constraint = Some((spec, "tools"));
    }
    generate(
        &st,
        Kind::Chat,
        prompt,
        options,
        (logprobs, 0),
        deadline,
        tool_output,
    )
    .await
}

/// `POST /v1/completions`.
async fn completions(State(st): St, req: Request) -> Result<Response, ApiError> {
    let deadline = Instant::now() + st.config.timeout;
    let (loaded, _) = st.serving()?;
    let obj = read_json(&st, req).await?;
    let prompt = params::prompt(&obj)?;
    params::check_fields(&obj, params::Endpoint::Completion)?;
    let mut options = params::options(&obj, random_seed)?;
    options.sampling.logit_bias = params::logit_bias(&obj, loaded.tokenizer.n_vocab())?;
    let logprobs = params::completion_logprobs(&obj)?;
    // `text_offset` counts the prompt's characters too, as OpenAI's does.
    let prompt_chars = prompt.chars().count();
    let tok = loaded.tokenizer.clone();
    let prompt = blocking(move || {
        tok.encode(&prompt, true, true)
            .map_err(|e| ApiError::param("prompt", e.to_string()))
    })
    .await?;
    let logprobs = (logprobs, prompt_chars);
    generate(
        &st,
        Kind::Completion,
        prompt,
        options,
        logprobs,
        deadline,
        None,
    )
    .await
}

/// Submits the request and answers: the whole completion, or a stream of its pieces;
/// `(logprobs, prompt_chars)`: the alternatives asked for (`None`: no log-probabilities),
/// and where a completion's `text_offset` begins; a chat with tools has its output read for
/// calls (`tools`).
async fn generate(
    st: &AppState,
    kind: Kind,
    prompt: Vec<u32>,
    options: Options,
    (logprobs, prompt_chars): (Option<usize>, usize),
    deadline: Instant,
    tools: Option<ToolOutput>,
) -> Result<Response, ApiError> {
    let (loaded, batcher) = st.serving()?;
    let constraint = match options.constraint {
        None => None,
        Some((spec, param)) => {
            let grammars = loaded
                .grammars
                .clone()
                .map_err(|e| ApiError::param(param, e))?;
            // Compiling a schema takes milliseconds (more for a large one): off the async
            // workers, bounded by the engine's limits on grammar size and lexer states.
            let grammar = blocking(move || {
                grammars
                    .compile(&spec)
                    .map_err(|e| ApiError::param(param, format!("`{param}`: {e}")))
            })
            .await?;
            Some(grammar)
        }
    };
    // A tool format's markers that are control tokens are kept in the text, for its reader.
    let preserve = tools
        .as_ref()
        .map_or_else(Vec::new, |t| t.format.preserved_tokens(&loaded.tokenizer));
    // `n` choices: a request each, seeds `seed`, `seed + 1`, ... (greedy choices are equal),
    // decoded in the same passes; one evaluates the prompt, the others copy its cache.
    let mut choices = Vec::with_capacity(options.n);
    for i in 0..options.n {
        let (tx, rx) = unbounded_channel();
        let mut sampling = options.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(i as u64);
        let request = GenRequest {
            prompt: prompt.clone(),
            sampling,
            max_tokens: options.max_tokens,
            stop: options.stop.clone(),
            cache_prompt: options.cache_prompt,
            deadline: Some(deadline),
            constraint: constraint.clone(),
            logprobs,
            preserve: preserve.clone(),
        };
        batcher
            .submit(request, Box::new(ChannelSink(tx)))
            .map_err(|e| ApiError::from_serve(e, kind.prompt_param()))?;
        choices.push(ChoiceStream {
            rx,
            tools: tools.clone().map(|t| {
                let stream = ToolCallStream::new(t.format)
                    .offering(t.names.clone())
                    .with_tools(t.tools.clone());
                (stream, t)
            }),
            pending: None,
            logprobs: logprobs.map(|top| LogprobsOut {
                kind,
                top,
                tokenizer: loaded.tokenizer.clone(),
                offset: prompt_chars,
                pending: Vec::new(),
            }),
            finished: None,
        });
    }
    drop(batcher);
    let give_up = tokio::time::Instant::from_std(deadline + DEADLINE_GRACE);
    let reply = Reply {
        kind,
        id: completion_id(kind),
        created: unix_now(),
        model: st.config.alias.clone(),
        include_usage: options.include_usage,
    };
    // The first event of each choice decides the status: a request failing before its first
    // token (its deadline while it waited, a shutdown) is an HTTP error, also when streaming.
    for c in &mut choices {
        c.pending = Some(next_event(&mut c.rx, give_up, kind).await?);
    }
    if options.stream {
        let body = SseBody {
            choices,
            head: (kind == Kind::Chat).then(|| reply.role_chunk()),
            reply,
            next: 0,
            done: false,
            give_up: Box::pin(tokio::time::sleep_until(give_up)),
        };
        let mut r = Response::new(Body::new(body));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(r);
    }
    let mut out = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter_mut().enumerate() {
        let mut event = c.pending.take().expect("the first event");
        loop {
            match event {
                Event::Piece(p) => {
                    if let (Some(lp), Some(t)) = (&mut c.logprobs, p.logprobs) {
                        lp.pending.push(t);
                    }
                }
                Event::Done(f) => {
                    let lp = c.logprobs.as_mut().map_or(Value::Null, LogprobsOut::take);
                    let answer = tools.as_ref().map(|t| tools::answer_text(t, &f.text));
                    let whole = reply.whole(&f, lp, answer.as_ref());
                    out.push((with_index(whole["choices"][0].clone(), i), f));
                    break;
                }
                Event::Failed(e) => return Err(ApiError::from_serve(e, kind.prompt_param())),
            }
            event = next_event(&mut c.rx, give_up, kind).await?;
        }
    }
    let finished: Vec<&Finished> = out.iter().map(|(_, f)| f).collect();
    let usage = usage_of(&finished);
    let choices: Vec<Value> = out.iter().map(|(c, _)| c.clone()).collect();
    Ok(json_response(
        StatusCode::OK,
        &reply.envelope(reply.object(), json!(choices), Some(usage)),
    ))
}

/// `choice` (one element of `choices`) numbered `index`.
fn with_index(mut choice: Value, index: usize) -> Value {
    choice["index"] = json!(index);
    choice
}

/// A chunk (`choices` of one element) of the choice `index`.
fn chunk_of(mut chunk: Value, index: usize) -> Value {
    if let Some(c) = chunk["choices"].get_mut(0) {
        c["index"] = json!(index);
    }
    chunk
}

/// A request's sink: its events into the channel whose receiver the response owns. Nobody
/// listens once the receiver is dropped (the client went away), which the batcher asks before
/// each pass while the request has nothing to send.
struct ChannelSink(UnboundedSender<Event>);

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }

    fn is_listening(&mut self) -> bool {
        !self.0.is_closed()
    }
}

/// The request's next event, or the error that ends it.
async fn next_event(
    rx: &mut UnboundedReceiver<Event>,
    give_up: tokio::time::Instant,
    kind: Kind,
) -> Result<Event, ApiError> {
    match tokio::time::timeout_at(give_up, rx.recv()).await {
        Err(_) => Err(ApiError::deadline()),
        Ok(None) => Err(ApiError::internal(
            "the batcher ended the request without a result",
        )),
        Ok(Some(Event::Failed(e))) => Err(ApiError::from_serve(e, kind.prompt_param())),
        Ok(Some(ev)) => Ok(ev),
    }
}

/// Runs `f` on a blocking thread (rendering, tokenizing: never on the async workers).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a blocking task failed: {e}")))?
}

/// The request body as a JSON object: at most `--body-limit` bytes (413 past it, from the
/// `Content-Length` or while reading), read within `--timeout` (408).
async fn read_json(st: &AppState, req: Request) -> Result<Obj, ApiError> {
    let limit = st.config.body_limit;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the server's limit of {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = req.into_body();
    let read = async {
        let mut buf = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame
                .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > limit {
                    return Err(too_large());
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf)
    };
    let bytes = tokio::time::timeout(st.config.timeout, read)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive within the server's --timeout",
            )
        })??;
    params::parse_object(&bytes)
}

/// What every response object of one request repeats.
#[derive(Debug, Clone)]
struct Reply {
    /// The endpoint.
    kind: Kind,
    /// `chatcmpl-…` or `cmpl-…`.
    id: String,
    /// Unix seconds.
    created: u64,
    /// The model's alias.
    model: String,
    /// Whether a stream ends with a usage chunk.
    include_usage: bool,
}

impl Reply {
    /// The `object` of a whole response.
    fn object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion",
            Kind::Completion => "text_completion",
        }
    }

    /// The `object` of a stream's chunk.
    fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        }
    }

    /// A response object with `choices` (and `usage`, when given).
    fn envelope(&self, object: &str, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let (Some(u), Value::Object(o)) = (usage, &mut v) {
            o.insert("usage".into(), u);
        }
        v
    }

    /// The non-streamed response, with its `logprobs` (null when not asked for); a chat's
    /// content and calls are `answer`'s when it has one.
    fn whole(&self, f: &Finished, logprobs: Value, answer: Option<&Answer>) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": f.text});
                let mut finish = finish_reason(f.stop);
                if let Some(a) = answer {
                    message["content"] = json!(a.content);
                    if !a.calls.is_empty() {
                        message["tool_calls"] = json!(a.calls);
                        finish = "tool_calls";
                    }
                }
                json!({
                    "index": 0,
                    "message": message,
                    "finish_reason": finish,
                    "logprobs": logprobs,
                })
            }
            Kind::Completion => json!({
                "index": 0,
                "text": f.text,
                "finish_reason": finish_reason(f.stop),
                "logprobs": logprobs,
            }),
        };
        self.envelope(self.object(), json!([choice]), Some(usage(f)))
    }

    /// A stream's chunk of one choice: `text` (a delta of `role` and `content` for a chat),
    /// the finish reason and the chunk's tokens' `logprobs` (null when not asked for).
    fn chunk(
        &self,
        text: Option<&str>,
        role: bool,
        finish: Option<&str>,
        logprobs: Value,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs})
            }
            Kind::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "finish_reason": finish,
                "logprobs": logprobs,
            }),
        };
        self.envelope(self.chunk_object(), json!([choice]), None)
    }

    /// The chat stream's first event: the assistant's role and no text yet.
    fn role_chunk(&self) -> Bytes {
        sse(&self.chunk(Some(""), true, None, Value::Null))
    }

    /// The chat stream's chunk of the call `index`: `delta.tool_calls` of one call with its
    /// `index` and what `call` has of it (`id`, `type`, `function.name` and `arguments` in its
    /// first chunk; a piece of `function.arguments` in the next ones).
    fn call_chunk(&self, index: usize, call: &Value) -> Value {
        let mut call = call.clone();
        call["index"] = json!(index);
        let choice = json!({
            "index": 0,
            "delta": {"tool_calls": [call]},
            "finish_reason": null,
            "logprobs": null,
        });
        self.envelope(self.chunk_object(), json!([choice]), None)
    }

    /// The stream's closing events: the text held back and a chunk per call (a chat with
    /// tools: `answer`), the finish reason, the usage if asked, `[DONE]`.
    #[cfg(test)]
    fn closing(&self, f: &Finished, answer: Option<&Answer>) -> Bytes {
        let mut out = self.closing_choice(f, answer, false, 0);
        out.extend_from_slice(&self.tail(&[f]));
        Bytes::from(out)
    }

    /// A choice's closing chunks (numbered `index`): the text held back and a chunk per call
    /// (a chat with tools: `answer`), then its finish reason; `streamed`: calls were sent as
    /// they came, so the reply ends as a call (`tool_calls`, or `length` when the token limit
    /// cut it).
    fn closing_choice(
        &self,
        f: &Finished,
        answer: Option<&Answer>,
        streamed: bool,
        index: usize,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut finish = finish_reason(f.stop);
        if streamed && finish != "length" {
            finish = "tool_calls";
        }
        if let Some(a) = answer {
            if let Some(text) = a.content.as_deref().filter(|t| !t.is_empty()) {
                out.extend_from_slice(&sse(&self.chunk(Some(text), false, None, Value::Null)));
            }
            for (i, call) in a.calls.iter().enumerate() {
                out.extend_from_slice(&sse(&self.call_chunk(i, call)));
                finish = "tool_calls";
            }
        }
        out.extend_from_slice(&sse(&self.chunk(None, false, Some(finish), Value::Null)));
        if index == 0 {
            return out;
        }
        // The chunks above, numbered.
        let text = String::from_utf8_lossy(&out).into_owned();
        let mut numbered = Vec::new();
        for line in text.split("\n\n").filter(|l| !l.is_empty()) {
            let v: Value = serde_json::from_str(&line["data: ".len()..]).unwrap_or(Value::Null);
            numbered.extend_from_slice(&sse(&chunk_of(v, index)));
        }
        numbered
    }

    /// The stream's end once every choice closed: the usage if asked, `[DONE]`.
    fn tail(&self, fs: &[&Finished]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.include_usage {
            let u = self.envelope(self.chunk_object(), json!([]), Some(usage_of(fs)));
            out.extend_from_slice(&sse(&u));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        out
    }
}

/// A request's log-probabilities in OpenAI's shapes, as its tokens arrive.
struct LogprobsOut {
    /// The endpoint: a chat's `content` list, or a completion's four lists.
    kind: Kind,
    /// The alternatives asked for.
    top: usize,
    /// The vocabulary, for the tokens' text and bytes.
    tokenizer: Arc<Tokenizer>,
    /// A completion's `text_offset` of the next token: characters of the prompt and of the
    /// text so far.
    offset: usize,
    /// Tokens not rendered yet.
    pending: Vec<TokenLogprobs>,
}

impl LogprobsOut {
    /// The token's text (lossy for a part of a character, as OpenAI's is) and its bytes as
    /// a list of numbers (the raw bytes, a part of a character included).
    fn text_and_bytes(&self, id: u32) -> (String, Value) {
        let bytes = self.tokenizer.token_to_piece(id);
        (String::from_utf8_lossy(bytes).into_owned(), json!(bytes))
    }

    /// The pending tokens' `logprobs` object (then none is pending): a chat's
    /// `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
    /// "refusal": null}`, or a completion's `{tokens, token_logprobs, top_logprobs: [{token:
    /// logprob}], text_offset}`.
    fn take(&mut self) -> Value {
        let pending = std::mem::take(&mut self.pending);
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = pending
                    .iter()
                    .map(|t| {
                        let (token, bytes) = self.text_and_bytes(t.token);
                        let top: Vec<Value> = t
                            .top
                            .iter()
                            .take(self.top)
                            .map(|&(id, logprob)| {
                                let (token, bytes) = self.text_and_bytes(id);
                                json!({"token": token, "logprob": logprob, "bytes": bytes})
                            })
                            .collect();
                        json!({
                            "token": token,
                            "logprob": t.logprob,
                            "bytes": bytes,
                            "top_logprobs": top,
                        })
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Kind::Completion => {
                let (mut tokens, mut logprobs, mut tops, mut offsets) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for t in &pending {
                    let token = self.text_and_bytes(t.token).0;
                    // The chosen token and the alternatives (up to `logprobs` + 1 entries, as
                    // OpenAI's may have; fewer where two tokens' texts are the same key, the
                    // chosen token's value kept).
                    let mut top = serde_json::Map::new();
                    top.insert(token.clone(), json!(t.logprob));
                    for &(id, lp) in t.top.iter().take(self.top) {
                        top.entry(self.text_and_bytes(id).0).or_insert(json!(lp));
                    }
                    offsets.push(self.offset);
                    // Characters the token adds to the text: the bytes that begin one (a
                    // control token adds none).
                    let text = self.tokenizer.piece(t.token, false).unwrap_or(&[]);
                    self.offset += text.iter().filter(|&&b| b & 0xC0 != 0x80).count();
                    tokens.push(token);
                    logprobs.push(t.logprob);
                    tops.push(Value::Object(top));
                }
                json!({
                    "tokens": tokens,
                    "token_logprobs": logprobs,
                    "top_logprobs": tops,
                    "text_offset": offsets,
                })
            }
        }
    }
}

/// OpenAI's `finish_reason` of `stop`.
fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::Eog | Stop::StopString => "stop",
        Stop::MaxTokens | Stop::Context => "length",
    }
}

/// The `usage` object.
fn usage(f: &Finished) -> Value {
    usage_of(&[f])
}

/// The usage of a request's choices: its prompt once (as OpenAI counts it; the first choice's
/// cached tokens), and every choice's tokens.
fn usage_of(fs: &[&Finished]) -> Value {
    let prompt = fs.first().map_or(0, |f| f.prompt_tokens);
    let cached = fs.first().map_or(0, |f| f.cached_tokens);
    let completion: usize = fs.iter().map(|f| f.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// One server-sent event.
fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// One choice of a request, as its events arrive.
struct ChoiceStream {
    /// Its events.
    rx: UnboundedReceiver<Event>,
    /// A chat with tools: its output read for calls as it streams, and how.
    tools: Option<(ToolCallStream, ToolOutput)>,
    /// The event that arrived before the response began.
    pending: Option<Event>,
    /// The log-probabilities, when asked for: of the tokens not sent yet.
    logprobs: Option<LogprobsOut>,
    /// How it ended, once it has.
    finished: Option<Finished>,
}

/// A streamed response: the chunks of its choices as their events arrive (each choice's in
/// order, numbered by `index`), then the usage and `[DONE]` once all have ended.
struct SseBody {
    /// The choices.
    choices: Vec<ChoiceStream>,
    /// The chat's role chunk, still to send.
    head: Option<Bytes>,
    /// The response objects' common fields.
    reply: Reply,
    /// The choice polled first next time (each gets its turn).
    next: usize,
    /// Nothing more to send.
    done: bool,
    /// When to stop waiting for the batcher (its deadline plus a grace).
    give_up: Pin<Box<tokio::time::Sleep>>,
}

impl SseBody {
    /// The last event of a failed stream: the error object.
    fn fail(&mut self, e: ApiError) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.done = true;
        Poll::Ready(Some(Ok(Frame::data(sse(&e.body())))))
    }

    /// What choice `i`'s `event` sends (nothing for a piece without text yet); `Err` when it
    /// failed.
    fn on_event(&mut self, i: usize, event: Event) -> Result<Option<Bytes>, ApiError> {
        let reply = &self.reply;
        let c = &mut self.choices[i];
        match event {
            Event::Piece(p) => {
                if let (Some(lp), Some(t)) = (&mut c.logprobs, p.logprobs) {
                    lp.pending.push(t);
                }
                let events = match &mut c.tools {
                    // Text that may begin a call is held back; calls are sent as they come.
                    Some((stream, _)) => stream.feed(&p.text),
                    None if p.text.is_empty() => Vec::new(),
                    None => vec![ToolStreamEvent::Text(p.text)],
                };
                // A token without text yet (part of a character, text a stop string or a
                // call may begin): its log-probabilities go with the next chunk.
                if events.is_empty() {
                    return Ok(None);
                }
                let format = c
                    .tools
                    .as_ref()
                    .map_or(ToolCallFormat::Generic, |(_, o)| o.format);
                let mut out = Vec::new();
                for event in events {
                    let chunk = match event {
                        ToolStreamEvent::Text(text) => {
                            let lp = c.logprobs.as_mut().map_or(Value::Null, LogprobsOut::take);
                            reply.chunk(Some(&text), false, None, lp)
                        }
                        ToolStreamEvent::CallStart { index, name } => {
                            let call = json!({
                                "id": tools::call_id(format),
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            });
                            reply.call_chunk(index, &call)
                        }
                        ToolStreamEvent::CallArguments { index, fragment } => {
                            reply.call_chunk(index, &json!({"function": {"arguments": fragment}}))
                        }
                    };
                    out.extend_from_slice(&sse(&chunk_of(chunk, i)));
                }
                Ok(Some(Bytes::from(out)))
            }
            Event::Done(f) => {
                let mut out = Vec::new();
                // Tokens whose text never came (a stop string's): an empty chunk.
                if let Some(lp) = c.logprobs.as_mut().filter(|l| !l.pending.is_empty()) {
                    let chunk = reply.chunk(Some(""), false, None, lp.take());
                    out.extend_from_slice(&sse(&chunk_of(chunk, i)));
                }
                let mut streamed = false;
                let answer = c.tools.take().map(|(stream, output)| {
                    let raw = stream.held().to_string();
                    if stream.calls_started() == 0 {
                        return tools::answer(&output, stream.finish(), &raw);
                    }
                    // Calls were sent: they stand. Text after well-formed calls is content;
                    // what turned out not to be a call cannot be taken back, and is dropped.
                    streamed = true;
                    let parsed = stream.finish();
                    Answer {
                        content: (!parsed.calls.is_empty() && !parsed.content.is_empty())
                            .then_some(parsed.content),
                        calls: Vec::new(),
                    }
                });
                out.extend_from_slice(&reply.closing_choice(&f, answer.as_ref(), streamed, i));
                c.finished = Some(f);
                if self.choices.iter().all(|c| c.finished.is_some()) {
                    let fs: Vec<&Finished> = self
                        .choices
                        .iter()
                        .filter_map(|c| c.finished.as_ref())
                        .collect();
                    out.extend_from_slice(&self.reply.tail(&fs));
                    self.done = true;
                }
                Ok(Some(Bytes::from(out)))
            }
            Event::Failed(e) => Err(ApiError::from_serve(e, reply.kind.prompt_param())),
        }
    }
}

impl HttpBody for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(head) = this.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        let n = this.choices.len();
        loop {
            // The first choice (from `next` round) with an event ready.
            let mut ready = None;
            for k in 0..n {
                let i = (this.next + k) % n;
                let c = &mut this.choices[i];
                if c.finished.is_some() {
                    continue;
                }
                if let Some(e) = c.pending.take() {
                    ready = Some((i, e));
                    break;
                }
                match c.rx.poll_recv(cx) {
                    Poll::Ready(Some(e)) => {
                        ready = Some((i, e));
                        break;
                    }
                    Poll::Ready(None) => {
                        return this.fail(ApiError::internal(
                            "the batcher ended the request without a result",
                        ));
                    }
                    Poll::Pending => {}
                }
            }
            let Some((i, event)) = ready else {
                if this.give_up.as_mut().poll(cx).is_ready() {
                    return this.fail(ApiError::deadline());
                }
                return Poll::Pending;
            };
            this.next = (i + 1) % n;
            match this.on_event(i, event) {
                Ok(None) => continue,
                Ok(Some(bytes)) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Err(e) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh 64-bit random number: the clock and a counter, mixed by SplitMix64 (request ids
/// and the seeds of requests without one; not for secrets).
pub fn random_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut z = nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id());
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A response id: `chatcmpl-` or `cmpl-` and 24 hex digits.
fn completion_id(kind: Kind) -> String {
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    format!(
        "{prefix}-{:016x}{:08x}",
        random_seed(),
        random_seed() as u32
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rknn_llm::serve::ServeError;
    use std::io::{Read, Write};

    /// Serves `app` on a free port of the loopback; its address.
    async fn spawn(app: Router) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    /// One HTTP/1.1 request (on a blocking thread); the status and the body.
    async fn send(addr: std::net::SocketAddr, raw: String) -> (u16, String) {
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.write_all(raw.as_bytes()).expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).expect("read");
            let status = out
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = out
                .split_once("\r\n\r\n")
                .map_or("", |(_, b)| b)
                .to_string();
            (status, body)
        })
        .await
        .expect("the client thread")
    }

    /// A request of `method` to `path` with `headers` (lines) and `body`.
    fn request(method: &str, path: &str, headers: &str, body: &str) -> String {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n{body}",
            body.len()
        )
    }

    fn state(api_key: Option<&str>) -> Arc<AppState> {
        Arc::new(AppState::new(HttpConfig {
            alias: "m".into(),
            api_key: api_key.map(str::to_string),
            body_limit: 64,
            timeout: Duration::from_secs(5),
        }))
    }

    fn error_type(body: &str) -> String {
        let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        v["error"]["type"].as_str().unwrap_or_default().to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn while_loading_every_answer_is_an_error_object() {
        let st = state(None);
        let addr = spawn(router(st.clone())).await;
        let (code, body) = send(addr, request("GET", "/health", "", "")).await;
        assert_eq!(code, 503);
        assert_eq!(body, ApiError::loading().body().to_string());
        for (method, path, want) in [
            ("GET", "/v1/models", 503),
            ("POST", "/v1/chat/completions", 503),
            ("POST", "/completions", 503),
            ("POST", "/tokenize", 503),
            ("GET", "/metrics", 503),
            ("GET", "/nope", 404),
            ("GET", "/v1/completions", 405),
        ] {
            let (code, body) = send(addr, request(method, path, "", "{}")).await;
            assert_eq!(code, want, "{method} {path}");
            let kind = if want == 503 {
                "unavailable_error"
            } else {
                "invalid_request_error"
            };
            assert_eq!(error_type(&body), kind, "{method} {path}: {body}");
        }
        let counted = st.requests.snapshot();
        assert_eq!(counted.get(&("/health", 503)), Some(&1));
        assert_eq!(counted.get(&("other", 404)), Some(&1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_key_guards_all_but_health() {
        let addr = spawn(router(state(Some("k")))).await;
        let (code, body) = send(addr, request("GET", "/v1/models", "", "")).await;
        assert_eq!(
            (code, error_type(&body).as_str()),
            (401, "authentication_error")
        );
        let wrong = "Authorization: Bearer j\r\n";
        assert_eq!(
            send(addr, request("GET", "/metrics", wrong, "")).await.0,
            401
        );
        let right = "Authorization: Bearer k\r\n";
        assert_eq!(
            send(addr, request("GET", "/v1/models", right, "")).await.0,
            503
        );
        assert_eq!(send(addr, request("GET", "/health", "", "")).await.0, 503);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_is_a_500_and_the_server_goes_on() {
        async fn boom() -> &'static str {
            panic!("on purpose")
        }
        let st = state(None);
        let app = layered(routes().route("/boom", get(boom)), st.clone());
        let addr = spawn(app).await;
        let (code, body) = send(addr, request("GET", "/boom", "", "")).await;
        assert_eq!((code, error_type(&body).as_str()), (500, "server_error"));
        assert!(body.contains("on purpose"), "{body}");
        assert_eq!(send(addr, request("GET", "/health", "", "")).await.0, 503);
        assert_eq!(st.requests.snapshot().get(&("other", 500)), Some(&1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_over_the_limit_is_413() {
        let st = state(None);
        let app = layered(
            routes().route(
                "/echo",
                post(|State(st): St, req: Request| async move {
                    read_json(&st, req)
                        .await
                        .map(|o| Value::Object(o).to_string())
                }),
            ),
            st.clone(),
        );
        let addr = spawn(app).await;
        let (code, body) = send(addr, request("POST", "/echo", "", r#"{"a":1}"#)).await;
        assert_eq!((code, body.as_str()), (200, r#"{"a":1}"#));
        let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(100));
        let (code, body) = send(addr, request("POST", "/echo", "", &big)).await;
        assert_eq!(
            (code, error_type(&body).as_str()),
            (413, "invalid_request_error")
        );
        let (code, _) = send(addr, request("POST", "/echo", "", "{")).await;
        assert_eq!(code, 400);
    }

    fn reply(kind: Kind, include_usage: bool) -> Reply {
        Reply {
            kind,
            id: "x".into(),
            created: 1,
            model: "m".into(),
            include_usage,
        }
    }

    fn finished(stop: Stop) -> Finished {
        Finished {
            stop,
            prompt_tokens: 3,
            cached_tokens: 1,
            completion_tokens: 2,
            text: "hi".into(),
            time_to_first_token: Duration::ZERO,
            decode_time: Duration::ZERO,
            slot: 0,
        }
    }

    #[test]
    fn a_chat_completion_has_openais_shape() {
        let v = reply(Kind::Chat, false).whole(&finished(Stop::Eog), Value::Null, None);
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["choices"][0]["logprobs"], Value::Null);
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    }

    #[test]
    fn calls_are_tool_calls_with_their_finish_reason() {
        let a = Answer {
            content: None,
            calls: vec![
                json!({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}),
                json!({"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{\"a\":1}"}}),
            ],
        };
        let v = reply(Kind::Chat, false).whole(&finished(Stop::Eog), Value::Null, Some(&a));
        assert_eq!(v["choices"][0]["message"]["content"], Value::Null);
        assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["id"], "call_1");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        let closing = reply(Kind::Chat, false).closing(&finished(Stop::Eog), Some(&a));
        let text = String::from_utf8_lossy(&closing).into_owned();
        let events: Vec<Value> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: {"))
            .map(|e| serde_json::from_str(&format!("{{{e}")).expect("json"))
            .collect();
        // A chunk per call, as OpenAI streams them, then the finish reason.
        assert_eq!(events.len(), 3);
        for (i, (id, f)) in [
            ("call_1", json!({"name": "f", "arguments": "{}"})),
            ("call_2", json!({"name": "g", "arguments": "{\"a\":1}"})),
        ]
        .into_iter()
        .enumerate()
        {
            let calls = &events[i]["choices"][0]["delta"]["tool_calls"];
            assert_eq!(calls.as_array().map(Vec::len), Some(1));
            let call = &calls[0];
            assert_eq!((&call["index"], &call["id"]), (&json!(i), &json!(id)));
            assert_eq!((&call["type"], &call["function"]), (&json!("function"), &f));
            assert_eq!(events[i]["choices"][0]["finish_reason"], Value::Null);
        }
        assert_eq!(events[2]["choices"][0]["finish_reason"], "tool_calls");
        // Text held back and then found to be no call closes the stream as content.
        let text_only = Answer {
            content: Some("<tool_call> x".into()),
            calls: vec![],
        };
        let closing = reply(Kind::Chat, false).closing(&finished(Stop::Eog), Some(&text_only));
        let text = String::from_utf8_lossy(&closing).into_owned();
        assert!(text.contains(r#""content":"<tool_call> x""#), "{text}");
        assert!(text.contains(r#""finish_reason":"stop""#), "{text}");
    }

    #[test]
    fn a_stream_closes_with_the_reason_the_usage_and_done() {
        let r = reply(Kind::Completion, true);
        let text = String::from_utf8_lossy(&r.closing(&finished(Stop::Context), None)).into_owned();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 3);
        let last: Value = serde_json::from_str(&events[0]["data: ".len()..]).expect("json");
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["object"], "text_completion");
        let usage: Value = serde_json::from_str(&events[1]["data: ".len()..]).expect("json");
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 2);
        assert_eq!(events[2], "data: [DONE]");
        let role = String::from_utf8_lossy(&reply(Kind::Chat, false).role_chunk()).into_owned();
        assert!(role.starts_with("data: {") && role.ends_with("}\n\n"));
        let role: Value = serde_json::from_str(role["data: ".len()..].trim()).expect("json");
        assert_eq!(
            role["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert_eq!(role["object"], "chat.completion.chunk");
    }

    #[test]
    fn a_channel_sink_listens_while_its_receiver_lives() {
        let (tx, mut rx) = unbounded_channel();
        let mut sink = ChannelSink(tx);
        assert!(sink.is_listening());
        assert!(sink.send(Event::Failed(ServeError::DeadlineExceeded)));
        assert!(matches!(
            rx.try_recv(),
            Ok(Event::Failed(ServeError::DeadlineExceeded))
        ));
        drop(rx);
        assert!(!sink.is_listening());
        assert!(!sink.send(Event::Failed(ServeError::ShuttingDown)));
    }

    #[test]
    fn keys_compare_whole() {
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"ab", b"abc"));
    }
}
