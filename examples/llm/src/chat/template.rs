//! The chat template: compiling the model's Jinja source in the environment of transformers'
//! `apply_chat_template`, its variables and functions, rendering, and the typed errors.

use std::sync::Arc;
use std::time::Duration;

use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

use super::datetime::DateTime;
use super::message::Message;
use super::python::{join, py_methods, py_str, py_strip};
use super::tojson::tojson;
use super::tools::Tools;
use super::worker::{RENDERERS, RunError};
use crate::gguf::GgufFile;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// The GGUF metadata key of the chat template.
pub const GGUF_KEY: &str = "tokenizer.chat_template";

/// The value of an extra template variable ([`ChatOptions::kwargs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kwarg {
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(String),
}

impl From<&Kwarg> for Value {
    fn from(k: &Kwarg) -> Value {
        match k {
            Kwarg::Bool(b) => Value::from(*b),
            Kwarg::Int(i) => Value::from(*i),
            Kwarg::Str(s) => Value::from(s.as_str()),
        }
    }
}

/// How to render besides the messages: the extra variables, and the clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatOptions {
    /// `enable_thinking` (Qwen3, SmolLM3: whether the model reasons before it answers);
    /// `None` leaves it undefined, so the template's default applies.
    pub enable_thinking: Option<bool>,
    /// Further variables, as `apply_chat_template`'s keyword arguments (a later one wins; the
    /// conversation's own variables win over all of them).
    pub kwargs: Vec<(String, Kwarg)>,
    /// The instant `strftime_now` formats; `None`: the current local time.
    pub now: Option<DateTime>,
    /// OpenAI's tool list, given to the template as `tools` (`None`: `tools` is None). A
    /// template that does not render tools ([`ChatTemplate::renders_tools`]) takes them in the
    /// generic form instead ([`generic_messages`](super::generic_messages)).
    pub tools: Option<Tools>,
}

/// Why a template could not be used or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    /// The template does not compile (a syntax error).
    #[error("chat template {name} does not compile: {message}")]
    Compile {
        /// The template's name.
        name: String,
        /// minijinja's message, with the line (`... (in NAME:LINE)`).
        message: String,
    },
    /// The template called `raise_exception(message)`.
    #[error("chat template {name}: {message}")]
    Raised {
        /// The template's name.
        name: String,
        /// The message, verbatim.
        message: String,
    },
    /// Rendering failed otherwise (an undefined value used, a bad operation, ...).
    #[error("chat template {name} failed: {message}")]
    Render {
        /// The template's name.
        name: String,
        /// minijinja's message, with the line.
        message: String,
    },
    /// The template used up its fuel: it loops too long or builds too much.
    #[error("chat template {name} ran out of fuel ({fuel}): it loops too long or builds too much")]
    OutOfFuel {
        /// The template's name.
        name: String,
        /// The budget it had ([`ChatTemplate::set_fuel`]).
        fuel: u64,
    },
    /// The template recursed deeper than minijinja's recursion limit.
    #[error("chat template {name} recurses too deeply: {message}")]
    TooDeep {
        /// The template's name.
        name: String,
        /// minijinja's message, with the line.
        message: String,
    },
    /// Rendering did not finish within the deadline ([`ChatTemplate::set_timeout`]).
    #[error("chat template {name} did not finish within {timeout:?}")]
    Timeout {
        /// The template's name.
        name: String,
        /// The deadline.
        timeout: Duration,
    },
}

impl ChatError {
    /// The name of the template the error is about.
    pub fn template_name(&self) -> &str {
        match self {
            ChatError::Compile { name, .. }
            | ChatError::Raised { name, .. }
            | ChatError::Render { name, .. }
            | ChatError::OutOfFuel { name, .. }
            | ChatError::TooDeep { name, .. }
            | ChatError::Timeout { name, .. } => name,
        }
    }
}

/// The message of `raise_exception`, carried as the source of minijinja's error so that it is
/// told apart from the engine's own errors.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// A compiled chat template, with the BOS and EOS texts it is rendered with. Cheap to clone
/// (the compiled template is shared); `Send + Sync`.
#[derive(Clone)]
pub struct ChatTemplate {
    name: String,
    source: Arc<str>,
    env: Arc<Environment<'static>>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    fuel: u64,
    timeout: Duration,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("fuel", &self.fuel)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The default fuel of one rendering: about 50 ms of work and 64 MB of data at most; a long
    /// conversation with the largest templates in use needs a few percent of it.
    pub const DEFAULT_FUEL: u64 = 1_000_000;

    /// The default deadline of one rendering.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// Compiles `source` as the template `name` (the name appears in errors). No BOS or EOS
    /// text yet: see [`with_special_tokens`](Self::with_special_tokens).
    pub fn new(name: impl Into<String>, source: impl Into<String>) -> Result<Self, ChatError> {
        let name = name.into();
        let source: Arc<str> = source.into().into();
        let mut env = environment();
        env.set_fuel(Some(Self::DEFAULT_FUEL));
        env.add_template_owned(name.clone(), generation_blocks(&source))
            .map_err(|e| ChatError::Compile {
                name: name.clone(),
                message: e.to_string(),
            })?;
        Ok(ChatTemplate {
            name,
            source,
            env: Arc::new(env),
            bos_token: None,
            eos_token: None,
            fuel: Self::DEFAULT_FUEL,
            timeout: Self::DEFAULT_TIMEOUT,
        })
    }

    /// The GGUF file's template ([`GGUF_KEY`], named so) with `tokenizer`'s BOS and EOS texts;
    /// `None` when the file has no template.
    pub fn from_gguf(file: &GgufFile, tokenizer: &Tokenizer) -> Result<Option<Self>, ChatError> {
        match file.metadata().get_str(GGUF_KEY) {
            None => Ok(None),
            Some(source) => Ok(Some(
                ChatTemplate::new(GGUF_KEY, source)?.with_tokens_of(tokenizer),
            )),
        }
    }

    /// Renders with `bos_token` and `eos_token` set to these texts (undefined when `None`).
    pub fn with_special_tokens(mut self, bos: Option<&str>, eos: Option<&str>) -> Self {
        self.bos_token = bos.map(str::to_string);
        self.eos_token = eos.map(str::to_string);
        self
    }

    /// Renders with the texts of `tokenizer`'s BOS and EOS tokens.
    pub fn with_tokens_of(self, tokenizer: &Tokenizer) -> Self {
        let text = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id));
        let (bos, eos) = (text(tokenizer.bos()), text(tokenizer.eos()));
        self.with_special_tokens(bos, eos)
    }

    /// The template's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS text the template is rendered with.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The EOS text the template is rendered with.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The fuel of one rendering ([`DEFAULT_FUEL`](Self::DEFAULT_FUEL) unless set).
    pub fn fuel(&self) -> u64 {
        self.fuel
    }

    /// Gives each rendering `fuel` (at least 1): minijinja charges one per instruction and
    /// per 64 bytes of data created, and this module's filters charge alike.
    pub fn set_fuel(&mut self, fuel: u64) {
        self.fuel = fuel.max(1);
        Arc::make_mut(&mut self.env).set_fuel(Some(self.fuel));
    }

    /// Fails a rendering that has not finished after `timeout` with [`ChatError::Timeout`]. The
    /// fuel bounds nearly all work; the deadline is the last resort for what minijinja does not
    /// charge (printing or comparing a value that shares its parts exponentially often). The
    /// render worker that overran it is retired, to finish that rendering and exit; later
    /// renderings go to a fresh one.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Renders the conversation `messages`, with the assistant's opening when
    /// `add_generation_prompt`, as `apply_chat_template(messages, add_generation_prompt,
    /// **kwargs)` does.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String, ChatError> {
        let ctx = self.context(messages, add_generation_prompt, options);
        let env = self.env.clone();
        let name = self.name.clone();
        let rendered = RENDERERS.run(self.timeout, move || {
            env.get_template(&name).and_then(|t| t.render(ctx))
        });
        match rendered {
            Ok(r) => r.map_err(|e| self.classify(&e)),
            Err(RunError::Timeout) => Err(ChatError::Timeout {
                name: self.name.clone(),
                timeout: self.timeout,
            }),
            Err(RunError::Panicked(why)) => Err(ChatError::Render {
                name: self.name.clone(),
                message: format!("the renderer failed: {why}"),
            }),
            Err(RunError::Spawn(e)) => Err(ChatError::Render {
                name: self.name.clone(),
                message: format!("cannot start the rendering thread: {e}"),
            }),
        }
    }

    /// Whether the template renders the `tools` it is given, as llama.cpp tells it: a
    /// conversation of one user message rendered with one tool shows the tool's name. A
    /// template that does not takes tools in the generic form
    /// ([`generic_messages`](super::generic_messages)).
    pub fn renders_tools(&self) -> bool {
        const PROBE: &str = "rknn_probe_tool_name";
        let tools = Tools::from_json(&format!(
            r#"[{{"type": "function", "function": {{"name": "{PROBE}", "description": "A probe.", "parameters": {{"type": "object", "properties": {{"arg": {{"type": "string", "description": "An argument."}}}}, "required": ["arg"]}}}}}}]"#
        ));
        let options = ChatOptions {
            tools: tools.ok(),
            ..ChatOptions::default()
        };
        self.render(&[Message::user("Hi.")], true, &options)
            .is_ok_and(|text| text.contains(PROBE))
    }

    /// Whether the template renders a system message's `tools` (Phi-4-mini's: the tools as
    /// JSON text in the system message, [`Message::tools`]), tested by rendering a probe.
    pub fn renders_system_tools(&self) -> bool {
        const PROBE: &str = "rknn_probe_system_tools";
        let system = Message {
            tools: Some(format!(r#"[{{"name": "{PROBE}"}}]"#)),
            ..Message::system("")
        };
        self.render(
            &[system, Message::user("Hi.")],
            true,
            &ChatOptions::default(),
        )
        .is_ok_and(|text| text.contains(PROBE))
    }

    /// The template's variables, in the order `apply_chat_template` lays them (a later one
    /// wins): `strftime_now`, the special tokens, the options, then the conversation.
    fn context(&self, messages: &[Message], agp: bool, options: &ChatOptions) -> Value {
        let now = options.now;
        let strftime_now = Value::from_function(move |state: &State, fmt: &str| {
            let t = now.unwrap_or_else(DateTime::now_local);
            let s = t.strftime(fmt);
            state.consume_fuel(1 + s.len() as u64 / 16)?;
            Ok::<_, Error>(s)
        });
        let mut vars: Vec<(String, Value)> = vec![("strftime_now".into(), strftime_now)];
        if let Some(b) = &self.bos_token {
            vars.push(("bos_token".into(), Value::from(b.as_str())));
        }
        if let Some(e) = &self.eos_token {
            vars.push(("eos_token".into(), Value::from(e.as_str())));
        }
        for (k, v) in &options.kwargs {
            vars.push((k.clone(), Value::from(v)));
        }
        if let Some(t) = options.enable_thinking {
            vars.push(("enable_thinking".into(), Value::from(t)));
        }
        let messages: Vec<Value> = messages.iter().map(Message::to_value).collect();
        vars.push(("messages".into(), Value::from(messages)));
        let tools = options
            .tools
            .as_ref()
            .map_or(Value::from(()), Tools::to_value);
        vars.push(("tools".into(), tools));
        vars.push(("documents".into(), Value::from(())));
        vars.push(("add_generation_prompt".into(), Value::from(agp)));
        Value::from_pairs(vars)
    }

    /// The typed error of a failed rendering.
    fn classify(&self, e: &Error) -> ChatError {
        let name = self.name.clone();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(s) = source {
            if let Some(r) = s.downcast_ref::<Raised>() {
                return ChatError::Raised {
                    name,
                    message: r.0.clone(),
                };
            }
            if let Some(m) = s.downcast_ref::<Error>() {
                if m.kind() == ErrorKind::OutOfFuel {
                    return ChatError::OutOfFuel {
                        name,
                        fuel: self.fuel,
                    };
                }
                if m.kind() == ErrorKind::InvalidOperation
                    && m.detail() == Some("recursion limit exceeded")
                {
                    return ChatError::TooDeep {
                        name,
                        message: e.to_string(),
                    };
                }
            }
            source = s.source();
        }
        ChatError::Render {
            name,
            message: e.to_string(),
        }
    }
}

/// Tokenizes a rendered chat prompt as llama.cpp does: the special tokens it names are parsed,
/// and the vocabulary's BOS is added (when it adds one) unless the text already begins with
/// the BOS text (a template that writes `bos_token` itself gets one BOS, not two).
pub fn encode_prompt(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, TokenizerError> {
    let has_bos = tokenizer
        .bos()
        .and_then(|id| tokenizer.token_text(id))
        .is_some_and(|b| !b.is_empty() && text.starts_with(b));
    tokenizer.encode(text, !has_bos, true)
}

/// `source` with transformers' `{% generation %}` ... `{% endgeneration %}` tags (its
/// `AssistantTracker` extension, which renders the block's body as it is and only marks where
/// the assistant's text is; LFM2.5-8B-A1B's template has them), which minijinja does not know,
/// written as `{% if true %}` ... `{% endif %}` with the same whitespace control.
fn generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        // The closing `%}` after the opening `{%` (in `{%}` they share the `%`).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            rest = tag;
            break;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &inner[inner.len() - 1..]),
            None => (body, ""),
        };
        let word = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match word {
            Some(w) => {
                out.push_str("{%");
                out.push_str(open);
                out.push(' ');
                out.push_str(w);
                out.push(' ');
                out.push_str(close);
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The environment of transformers' `apply_chat_template`.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    // Only reached with the default (ASCII-safe) delimiters: the builder cannot fail then.
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    // A template named `*.html` must not get HTML escaping.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_formatter(|out, state, value| {
        let mut s = String::new();
        py_str(&*state, value, &mut s, 0)?;
        out.write_str(&s).map_err(Error::from)
    });
    env.set_unknown_method_callback(py_methods);
    env.add_function("raise_exception", |state: &State, msg: &Value| {
        let mut s = String::new();
        py_str(state, msg, &mut s, 0)?;
        Err::<Value, _>(Error::new(ErrorKind::InvalidOperation, s.clone()).with_source(Raised(s)))
    });
    env.add_filter("tojson", tojson);
    env.add_filter(
        "trim",
        |state: &State, value: &Value, chars: Option<&str>| {
            let mut s = String::new();
            py_str(state, value, &mut s, 0)?;
            Ok::<_, Error>(py_strip(&s, chars, true, true).to_string())
        },
    );
    env.add_filter("string", |state: &State, value: &Value| {
        let mut s = String::new();
        py_str(state, value, &mut s, 0)?;
        Ok::<_, Error>(s)
    });
    env.add_filter("join", join);
    // jinja2's `iterable` is whether Python's `iter(x)` works: not for `None`, which
    // minijinja's own test takes as an empty sequence (Qwen3-Coder's template asks
    // `tools is iterable and tools | length > 0` of `tools=None`).
    env.add_test("iterable", |value: &Value| {
        !value.is_none() && value.try_iter().is_ok()
    });
    // Its output grows with the square of the nesting, uncharged: no chat template uses it.
    env.remove_filter("pprint");
    env
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::chat::worker::RENDER_WORKERS;

    /// transformers' `{% generation %}` blocks render their body, with their whitespace
    /// control (as jinja2 renders LFM2.5-8B-A1B's, in the fixture).
    #[test]
    fn generation_blocks_render_their_body() {
        let src = "{%- for m in messages %}<{{ m.role }}>\n  {%- generation -%}\n  {{ m.content }}\n  {% endgeneration %}|{%+ generation %} x{%endgeneration-%}  {% endfor %}";
        assert_eq!(
            generation_blocks(src),
            "{%- for m in messages %}<{{ m.role }}>\n  {%- if true -%}\n  {{ m.content }}\n  {% endif %}|{%+ if true %} x{% endif -%}  {% endfor %}"
        );
        let t = ChatTemplate::new("g", src).unwrap();
        let out = t
            .render(&[Message::user("hi")], false, &ChatOptions::default())
            .unwrap();
        // What jinja2 renders with transformers' extension.
        assert_eq!(out, "<user>hi\n| x");
        assert!(t.source().contains("generation"));
        // A `{%}` whose `%` is both the opening's and a closing's, and text that is not
        // ASCII after it (found by the chat_template fuzz target): no panic, nothing changed
        // but the tags.
        for src in [
            "t~{%}\t,-\u{da}{{\u{ac}{",
            "{%}",
            "a{%",
            "{%-%}é{% generation %}é",
        ] {
            let out = generation_blocks(src);
            assert_eq!(out.replace("if true", "generation"), src);
        }
    }

    /// Fuel for seconds of looping, far past the deadlines below.
    const SLOW_FUEL: u64 = 20_000_000;

    fn render(src: &str, messages: &[Message]) -> Result<String, ChatError> {
        ChatTemplate::new("t", src)?.render(messages, true, &ChatOptions::default())
    }

    #[test]
    fn templates_are_shared_across_threads() {
        fn shared<T: Send + Sync + Clone + 'static>() {}
        shared::<ChatTemplate>();
        shared::<ChatError>();
    }

    #[test]
    fn raise_exception_is_told_apart_from_other_errors() {
        let src = "{% macro check(m) %}{% if m.role == 'system' %}{{ raise_exception('No system: ' ~ m.content) }}{% endif %}{% endmacro %}\
                   {% for m in messages %}{{ check(m) }}{{ m.content }}{% endfor %}";
        assert_eq!(render(src, &[Message::user("hi")]).unwrap(), "hi");
        assert_eq!(
            render(src, &[Message::system("x\ny")]),
            Err(ChatError::Raised {
                name: "t".into(),
                message: "No system: x\ny".into()
            })
        );
        // An invalid operation of the engine is not a raise.
        assert!(matches!(
            render("{{ messages[0].content + 1 }}", &[Message::user("a")]),
            Err(ChatError::Render { .. })
        ));
    }

    #[test]
    fn no_html_escaping_whatever_the_name() {
        let t = ChatTemplate::new(
            "page.html",
            "{{ messages[0].content }}{{ messages | tojson }}",
        )
        .unwrap();
        let out = t
            .render(&[Message::user("<b>&'")], false, &ChatOptions::default())
            .unwrap();
        assert!(out.starts_with("<b>&'"), "{out}");
        assert!(out.ends_with("\"content\": \"<b>&'\"}]"), "{out}");
    }

    #[test]
    fn variables_and_options() {
        let src = "{{ bos_token }}|{{ eos_token }}|{{ enable_thinking }}|{{ tools }}|{{ documents }}|{{ extra }}|{{ n + 1 }}|{{ strftime_now('%Y-%m-%d') }}|{{ add_generation_prompt }}";
        let t = ChatTemplate::new("vars", src).unwrap();
        let opts = ChatOptions {
            enable_thinking: Some(false),
            kwargs: vec![
                ("extra".into(), Kwarg::Str("e".into())),
                ("n".into(), Kwarg::Int(41)),
                // The conversation's own variables win.
                ("add_generation_prompt".into(), Kwarg::Bool(true)),
            ],
            now: DateTime::new(2024, 7, 26, 12, 0, 0),
            tools: None,
        };
        assert_eq!(
            t.render(&[], false, &opts).unwrap(),
            "||False|None|None|e|42|2024-07-26|False"
        );
        let t = t.with_special_tokens(Some("<s>"), Some("</s>"));
        assert_eq!(t.bos_token(), Some("<s>"));
        assert!(
            t.render(&[], false, &opts)
                .unwrap()
                .starts_with("<s>|</s>|")
        );
    }

    /// A rendering whose work the fuel does not see (comparing values that share their parts
    /// 2^20 times: about half a second) ends at the deadline.
    #[test]
    fn the_deadline_ends_what_the_fuel_does_not_see() {
        let src = "{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(20) %}{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.y }}";
        let mut t = ChatTemplate::new("shared", src).unwrap();
        t.set_timeout(Duration::from_millis(20));
        let t0 = std::time::Instant::now();
        assert_eq!(
            t.render(&[], false, &ChatOptions::default()),
            Err(ChatError::Timeout {
                name: "shared".into(),
                timeout: Duration::from_millis(20)
            })
        );
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    /// Renderings from many threads at once each get their own conversation's text, rendered
    /// on the render workers, a few threads in all.
    #[test]
    fn many_threads_render_at_once_each_its_own() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{{ worker() }}";
        let mut t = ChatTemplate::new("chatml", src).unwrap();
        // Where each rendering ran: the thread's name and id.
        Arc::make_mut(&mut t.env).add_function("worker", || {
            let me = std::thread::current();
            format!("{} {:?}", me.name().unwrap_or_default(), me.id())
        });
        let (spawned0, retired0) = RENDERERS.counts();
        let workers: HashSet<String> = std::thread::scope(|s| {
            let callers: Vec<_> = (0..8)
                .map(|i| {
                    let t = &t;
                    s.spawn(move || {
                        let mut workers = HashSet::new();
                        for j in 0..25 {
                            let messages = [
                                Message::system(format!("s{i}")),
                                Message::user(format!("thread {i}, turn {j}")),
                            ];
                            let got = t.render(&messages, false, &ChatOptions::default());
                            let got = got.unwrap();
                            let want = format!(
                                "<|im_start|>system\ns{i}<|im_end|>\n<|im_start|>user\nthread {i}, turn {j}<|im_end|>\n"
                            );
                            let worker = got.strip_prefix(&want).unwrap_or_else(|| panic!("{got}"));
                            assert!(worker.starts_with("chat-template ThreadId("), "{worker}");
                            workers.insert(worker.to_string());
                        }
                        workers
                    })
                })
                .collect();
            callers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect()
        });
        // A worker starts only while fewer than RENDER_WORKERS are counted, and leaves the
        // count only by retiring (after a timeout: other tests'), whatever else runs meanwhile.
        let (spawned, retired) = RENDERERS.counts();
        let bound = RENDER_WORKERS + (retired - retired0) as usize;
        assert!(spawned - spawned0 <= bound as u64);
        assert!(
            workers.len() <= bound,
            "200 renderings on {} threads",
            workers.len()
        );
    }

    /// A rendering that the fuel lets run long (a huge loop) ends at its deadline, and the
    /// renderings after it are not held up behind it.
    #[test]
    fn a_slow_rendering_times_out_and_the_next_is_not_held_up() {
        let src = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}";
        let mut slow = ChatTemplate::new("slow", src).unwrap();
        slow.set_fuel(SLOW_FUEL);
        slow.set_timeout(Duration::from_millis(50));
        assert_eq!(
            slow.render(&[], false, &ChatOptions::default()),
            Err(ChatError::Timeout {
                name: "slow".into(),
                timeout: Duration::from_millis(50)
            })
        );
        let mut next = ChatTemplate::new("next", "{{ messages[0].content }}!").unwrap();
        next.set_timeout(Duration::from_secs(1));
        for _ in 0..3 {
            assert_eq!(
                next.render(&[Message::user("hi")], false, &ChatOptions::default()),
                Ok("hi!".to_string())
            );
        }
    }

    /// A panic inside minijinja (here in a function of the environment) is a typed error, and
    /// the renderings after it work.
    #[test]
    fn a_panic_while_rendering_is_an_error_and_the_next_rendering_works() {
        let mut t = ChatTemplate::new("boom", "{{ boom() }}").unwrap();
        Arc::make_mut(&mut t.env).add_function("boom", || -> Result<String, Error> {
            panic!("a bug in the renderer")
        });
        assert_eq!(
            t.render(&[], false, &ChatOptions::default()),
            Err(ChatError::Render {
                name: "boom".into(),
                message: "the renderer failed: a bug in the renderer".into()
            })
        );
        let t = ChatTemplate::new("fine", "{{ 6 * 7 }}").unwrap();
        assert_eq!(
            t.render(&[], false, &ChatOptions::default()),
            Ok("42".to_string())
        );
    }

    #[test]
    fn a_prompt_that_begins_with_bos_gets_no_second_one() {
        let mut tokens: Vec<String> = vec!["<s>".into(), "</s>".into()];
        tokens.extend(["a", "b", " "].map(String::from));
        let tok = Tokenizer::from_spec(crate::tokenizer::VocabSpec {
            model: "gpt2".into(),
            pre: Some("default".into()),
            token_types: Some(vec![3, 3, 1, 1, 1]),
            merges: Some(Vec::new()),
            special: crate::tokenizer::SpecialIds {
                bos: Some(0),
                eos: Some(1),
                ..Default::default()
            },
            add_bos: Some(true),
            tokens,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(encode_prompt(&tok, "ab").unwrap(), [0, 2, 3]);
        assert_eq!(encode_prompt(&tok, "<s>ab").unwrap(), [0, 2, 3]);
        assert_eq!(encode_prompt(&tok, "a<s>b").unwrap(), [0, 2, 0, 3]);
        let t = ChatTemplate::new("bos", "{{ bos_token }}{{ messages[0].content }}")
            .unwrap()
            .with_tokens_of(&tok);
        let text = t
            .render(&[Message::user("ab")], false, &ChatOptions::default())
            .unwrap();
        assert_eq!(encode_prompt(&tok, &text).unwrap(), [0, 2, 3]);
    }
}
