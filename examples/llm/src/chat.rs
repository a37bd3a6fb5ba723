//! Chat prompts: the model's chat template (`tokenizer.chat_template`, a Jinja template)
//! rendered by [minijinja](https://docs.rs/minijinja) the way Hugging Face's
//! `apply_chat_template` renders it with Python's jinja2.
//!
//! The environment is transformers' `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` with `jinja2.ext.loopcontrols` (`{% break %}`, `{% continue %}`):
//!
//! * variables `messages` (a list of `{role, content}` maps), `add_generation_prompt`,
//!   `tools` and `documents` (none), `bos_token` and `eos_token` (the texts of the vocabulary's
//!   BOS and EOS tokens; undefined when it has none), and extra keyword arguments such as
//!   Qwen3's `enable_thinking` ([`ChatOptions`]);
//! * `raise_exception(msg)`, which fails the rendering with `msg` ([`ChatError::Raised`]);
//! * `strftime_now(fmt)`: the current local time through C's `strftime` conversions (a fixed
//!   instant with [`ChatOptions::now`]);
//! * a `tojson` filter that is Python's `json.dumps(x, ensure_ascii=False, indent=...,
//!   separators=..., sort_keys=...)`: no HTML escaping, unlike jinja2's and minijinja's own;
//! * Python's string, list and dict methods (`.strip()`, `.split()`, `.startswith()`,
//!   `.items()`, ...: minijinja-contrib's `pycompat`), and values printed as Python prints them
//!   (`None`, `True`, `1.0`, `['a', 1]`).
//!
//! Templates come from model files, so they are untrusted: each rendering runs on its own
//! thread with a large stack, under a fuel budget ([`ChatTemplate::set_fuel`]: every
//! instruction, byte and visited item costs fuel), minijinja's recursion limit and a deadline
//! ([`ChatTemplate::set_timeout`]). A template that loops too long, builds too much or recurses
//! too deeply is a typed [`ChatError`], never a hang, a panic or a stack overflow.
//!
//! ```
//! use rknn_llm::chat::{ChatOptions, ChatTemplate, Message};
//!
//! let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
//!               {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
//! let template = ChatTemplate::new("chatml", source)?;
//! let text = template.render(
//!     &[Message::system("Be brief."), Message::user("Hi!")],
//!     true,
//!     &ChatOptions::default(),
//! )?;
//! assert_eq!(
//!     text,
//!     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
//! );
//! # Ok::<(), rknn_llm::chat::ChatError>(())
//! ```

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use minijinja::value::{Kwargs, Rest, Value, ValueKind, ValueOrKwargs, from_args};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

use crate::gguf::GgufFile;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// The GGUF metadata key of the chat template.
pub const GGUF_KEY: &str = "tokenizer.chat_template";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, or whatever else the template knows.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message of `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

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
}

/// A civil date and time, as `strftime_now` formats it (local time, no time zone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    year: i32,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
}

impl DateTime {
    /// The date and time, or `None` if it does not exist (month 1-12, a day of that month,
    /// hour < 24, minute < 60, second < 61).
    pub fn new(
        year: i32,
        month: u8,
        day: u8,
        hour: u8,
        minute: u8,
        second: u8,
    ) -> Option<DateTime> {
        let ok = (1..=12).contains(&month)
            && day >= 1
            && day <= days_in_month(year, month)
            && hour < 24
            && minute < 60
            && second < 61;
        ok.then_some(DateTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
        })
    }

    /// The current local time (UTC where the system cannot say).
    pub fn now_local() -> DateTime {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        local_time(secs).unwrap_or_else(|| DateTime::from_unix_utc(secs))
    }

    /// The UTC date and time of `secs` seconds after 1970-01-01T00:00:00Z.
    pub fn from_unix_utc(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        DateTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u8,
            minute: (rem / 60 % 60) as u8,
            second: (rem % 60) as u8,
        }
    }

    /// Formats as C's `strftime` does in the C locale (what Python's `datetime.strftime` asks
    /// glibc for), including glibc's `-` (no padding), `_` (spaces), `0` and `^` (upper case)
    /// flags. `%z` and `%Z` are empty (a naive time, as Python's `datetime.now()`); an unknown
    /// conversion is copied as it is.
    pub fn strftime(&self, fmt: &str) -> String {
        let mut out = String::with_capacity(fmt.len() + 16);
        let mut chars = fmt.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut flag = None;
            if let Some(&f @ ('-' | '_' | '0' | '^' | '#')) = chars.peek() {
                flag = Some(f);
                chars.next();
            }
            let Some(conv) = chars.next() else {
                out.push('%');
                if let Some(f) = flag {
                    out.push(f);
                }
                break;
            };
            let piece = self.conversion(conv, flag);
            match piece {
                Some(p) => out.push_str(&p),
                None => {
                    out.push('%');
                    if let Some(f) = flag {
                        out.push(f);
                    }
                    out.push(conv);
                }
            }
        }
        out
    }

    fn weekday(&self) -> u32 {
        // 1970-01-01 was a Thursday (day 4 counting from Sunday).
        (days_from_civil(self.year, self.month, self.day) + 4).rem_euclid(7) as u32
    }

    fn yday(&self) -> u32 {
        (days_from_civil(self.year, self.month, self.day) - days_from_civil(self.year, 1, 1) + 1)
            as u32
    }

    /// One conversion: `None` for an unknown one.
    fn conversion(&self, conv: char, flag: Option<char>) -> Option<String> {
        const DAYS: [&str; 7] = [
            "Sunday",
            "Monday",
            "Tuesday",
            "Wednesday",
            "Thursday",
            "Friday",
            "Saturday",
        ];
        const MONTHS: [&str; 12] = [
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ];
        let wday = self.weekday();
        let hour12 = match self.hour % 12 {
            0 => 12,
            h => h,
        };
        // A number with its default padding, which the flag may change.
        let num = |v: i64, width: usize, pad: char| -> String {
            let pad = match flag {
                Some('-') => return v.to_string(),
                Some('_') => ' ',
                Some('0') => '0',
                _ => pad,
            };
            let digits = v.unsigned_abs().to_string();
            let mut s = String::new();
            if v < 0 {
                s.push('-');
            }
            for _ in digits.len() + s.len()..width {
                s.push(pad);
            }
            s.push_str(&digits);
            s
        };
        let text = |s: &str| -> String {
            if flag == Some('^') {
                s.to_uppercase()
            } else {
                s.to_string()
            }
        };
        let month_name = MONTHS[usize::from(self.month - 1)];
        let s = match conv {
            'a' => text(&DAYS[wday as usize][..3]),
            'A' => text(DAYS[wday as usize]),
            'b' | 'h' => text(&month_name[..3]),
            'B' => text(month_name),
            'c' => text(&self.strftime("%a %b %e %H:%M:%S %Y")),
            'C' => num(i64::from(self.year).div_euclid(100), 2, '0'),
            'd' => num(i64::from(self.day), 2, '0'),
            'D' | 'x' => self.strftime("%m/%d/%y"),
            'e' => num(i64::from(self.day), 2, ' '),
            'F' => self.strftime("%Y-%m-%d"),
            'H' => num(i64::from(self.hour), 2, '0'),
            'I' => num(i64::from(hour12), 2, '0'),
            'j' => num(i64::from(self.yday()), 3, '0'),
            'k' => num(i64::from(self.hour), 2, ' '),
            'l' => num(i64::from(hour12), 2, ' '),
            'm' => num(i64::from(self.month), 2, '0'),
            'M' => num(i64::from(self.minute), 2, '0'),
            'n' => "\n".into(),
            'p' => (if self.hour < 12 { "AM" } else { "PM" }).into(),
            'P' => (if self.hour < 12 { "am" } else { "pm" }).into(),
            'r' => self.strftime("%I:%M:%S %p"),
            'R' => self.strftime("%H:%M"),
            'S' => num(i64::from(self.second), 2, '0'),
            't' => "\t".into(),
            'T' | 'X' => self.strftime("%H:%M:%S"),
            'u' => num(i64::from(if wday == 0 { 7 } else { wday }), 1, '0'),
            'U' => num(i64::from((self.yday() + 6 - wday) / 7), 2, '0'),
            'w' => num(i64::from(wday), 1, '0'),
            'W' => num(i64::from((self.yday() + 6 - (wday + 6) % 7) / 7), 2, '0'),
            'y' => num(i64::from(self.year).rem_euclid(100), 2, '0'),
            'Y' => num(i64::from(self.year), 1, '0'),
            'z' | 'Z' => String::new(),
            '%' => "%".into(),
            _ => return None,
        };
        Some(s)
    }
}

fn is_leap(year: i32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i32, month: u8) -> u8 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i32, m: u8, d: u8) -> i64 {
    let y = i64::from(y) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day number of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i32, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
        m,
        d,
    )
}

/// The local time of `secs` through the C library's time zone rules.
#[cfg(unix)]
fn local_time(secs: i64) -> Option<DateTime> {
    let t = libc::time_t::try_from(secs).ok()?;
    // SAFETY: `tm` is plain old data, for which all zeroes is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is the reentrant variant,
    // writing only to `tm`, and returns null on failure.
    let r = unsafe { libc::localtime_r(&t, &mut tm) };
    if r.is_null() {
        return None;
    }
    DateTime::new(
        tm.tm_year.checked_add(1900)?,
        u8::try_from(tm.tm_mon + 1).ok()?,
        u8::try_from(tm.tm_mday).ok()?,
        u8::try_from(tm.tm_hour).ok()?,
        u8::try_from(tm.tm_min).ok()?,
        u8::try_from(tm.tm_sec).ok()?,
    )
}

#[cfg(not(unix))]
fn local_time(_secs: i64) -> Option<DateTime> {
    None
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

/// The stack of the rendering thread: room for minijinja's recursion limit, and for values
/// nested as deeply as the fuel lets a template build them (dropping and printing them
/// recurses).
const RENDER_STACK: usize = 64 << 20;

/// How deeply this module's serializers (`tojson`, printing) follow nested values.
const MAX_NESTING: usize = 256;

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
        env.add_template_owned(name.clone(), source.to_string())
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
    /// charge (printing or comparing a value that shares its parts exponentially often), whose
    /// thread is then left behind.
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
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("chat-template".into())
            .stack_size(RENDER_STACK)
            .spawn(move || {
                let r = env.get_template(&name).and_then(|t| t.render(ctx));
                let _ = tx.send(r);
            });
        let handle = spawned.map_err(|e| ChatError::Render {
            name: self.name.clone(),
            message: format!("cannot start the rendering thread: {e}"),
        })?;
        match rx.recv_timeout(self.timeout) {
            Ok(r) => {
                let _ = handle.join();
                r.map_err(|e| self.classify(&e))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(ChatError::Timeout {
                name: self.name.clone(),
                timeout: self.timeout,
            }),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let why = match handle.join() {
                    Err(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default(),
                    Ok(()) => String::new(),
                };
                Err(ChatError::Render {
                    name: self.name.clone(),
                    message: format!("the renderer failed: {why}"),
                })
            }
        }
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
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        vars.push(("messages".into(), Value::from(messages)));
        vars.push(("tools".into(), Value::from(())));
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
    // Its output grows with the square of the nesting, uncharged: no chat template uses it.
    env.remove_filter("pprint");
    env
}

/// Python's whitespace (`str.isspace`): Unicode's, and the four ASCII separators.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// Python's `str.strip(chars)` (`lstrip` / `rstrip` with one side).
fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip = |c: char| match chars {
        Some(set) => set.contains(c),
        None => py_space(c),
    };
    let s = if left { s.trim_start_matches(strip) } else { s };
    if right { s.trim_end_matches(strip) } else { s }
}

/// Python's string methods: `strip` and its sides with Python's whitespace here, the rest from
/// minijinja-contrib.
fn py_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), "strip" | "lstrip" | "rstrip") = (value.as_str(), method) {
        let (chars,): (Option<&str>,) = from_args(args)?;
        let (left, right) = (method != "rstrip", method != "lstrip");
        return Ok(Value::from(py_strip(s, chars, left, right)));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `repr` of a float (what `str`, `print` and `json.dumps` write).
fn py_float(v: f64, json: bool) -> String {
    if v.is_nan() {
        return (if json { "NaN" } else { "nan" }).into();
    }
    if v.is_infinite() {
        let s = match (json, v > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        };
        return s.into();
    }
    if v == 0.0 {
        return (if v.is_sign_negative() { "-0.0" } else { "0.0" }).into();
    }
    // The shortest digits that round-trip, and the exponent of the first.
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if v < 0.0 {
        out.push('-');
    }
    let point = exp + 1;
    if -4 < point && point <= 16 {
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(&digits);
        } else if point as usize >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// Whether Python's `repr` writes `c` as an escape (control, format, private-use and
/// separator characters other than the space; unassigned code points are not known here).
fn py_unprintable(c: char) -> bool {
    let u = c as u32;
    matches!(u,
        0..=0x1f | 0x7f..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x1680
        | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xe000..=0xf8ff | 0xfeff | 0xfff9..=0xfffb | 0xf0000..)
}

/// Python's `repr` of a string.
fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_unprintable(c) => {
                let u = c as u32;
                let _ = match u {
                    0..=0xff => write!(out, "\\x{u:02x}"),
                    0x100..=0xffff => write!(out, "\\u{u:04x}"),
                    _ => write!(out, "\\U{u:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn too_deep() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        "value nested too deeply to print or serialize",
    )
}

/// Python's `str(value)`: a string as it is, the rest as [`py_repr`] writes it (undefined is
/// empty, as jinja2 prints it). Charges a fuel per value visited.
fn py_str(state: &State, value: &Value, out: &mut String, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String => {
            out.push_str(value.as_str().unwrap_or_default());
            Ok(())
        }
        ValueKind::Undefined => Ok(()),
        _ => py_repr(state, value, out, depth),
    }
}

/// Python's `repr(value)`: `None`, `True`, `1.0`, `'text'`, `[1, 'a']`, `{'k': 'v'}`,
/// `(1, 2)`.
fn py_repr(state: &State, value: &Value, out: &mut String, depth: usize) -> Result<(), Error> {
    if depth > MAX_NESTING {
        return Err(too_deep());
    }
    state.consume_fuel(1)?;
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => out.push_str(&py_float(
            f64::try_from(value.clone()).unwrap_or(f64::NAN),
            false,
        )),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            state.consume_fuel(s.len() as u64 / 64)?;
            py_repr_str(s, out);
        }
        ValueKind::Bytes => {
            let bytes = value.as_bytes().unwrap_or_default();
            out.push_str("b'");
            for &b in bytes {
                match b {
                    b'\\' | b'\'' => {
                        out.push('\\');
                        out.push(char::from(b));
                    }
                    b'\n' => out.push_str("\\n"),
                    b'\r' => out.push_str("\\r"),
                    b'\t' => out.push_str("\\t"),
                    0x20..=0x7e => out.push(char::from(b)),
                    _ => {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
            }
            out.push('\'');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let tuple = value
                .downcast_object_ref::<minijinja::value::Tuple>()
                .is_some();
            out.push(if tuple { '(' } else { '[' });
            let mut n = 0;
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(state, &item, out, depth + 1)?;
                n += 1;
            }
            if tuple && n == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(state, &key, out, depth + 1)?;
                out.push_str(": ");
                py_repr(state, &value.get_item(&key)?, out, depth + 1)?;
            }
            out.push('}');
        }
        ValueKind::Plain | ValueKind::Invalid => {
            let _ = write!(out, "{value}");
        }
        // A kind minijinja adds later: its own spelling.
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// jinja2's `join(value, d='', attribute=None)`: the items as Python's `str` writes them.
fn join(state: &State, value: &Value, args: Rest<ValueOrKwargs>) -> Result<String, Error> {
    let args: Vec<Value> = args.0.into_iter().map(Value::from).collect();
    let (pos, kwargs): (&[Value], Kwargs) = from_args(&args)?;
    let sep: Option<Value> = match pos.first() {
        Some(v) => Some(v.clone()),
        None => kwargs.get("d")?,
    };
    let attribute: Option<Value> = match pos.get(1) {
        Some(v) => Some(v.clone()),
        None => kwargs.get("attribute")?,
    };
    kwargs.assert_all_used()?;
    if pos.len() > 2 {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "join takes at most 2 arguments",
        ));
    }
    let mut sep_text = String::new();
    if let Some(s) = &sep {
        py_str(state, s, &mut sep_text, 0)?;
    }
    let mut out = String::new();
    let items: Box<dyn Iterator<Item = Value>> = match value.kind() {
        ValueKind::String => Box::new(
            value
                .as_str()
                .unwrap_or_default()
                .chars()
                .map(|c| Value::from(c.to_string()))
                .collect::<Vec<_>>()
                .into_iter(),
        ),
        _ => Box::new(value.try_iter()?),
    };
    for (i, item) in items.enumerate() {
        state.consume_fuel(1 + sep_text.len() as u64 / 64)?;
        if i > 0 {
            out.push_str(&sep_text);
        }
        let item = match &attribute {
            Some(a) => attr_path(&item, a)?,
            None => item,
        };
        py_str(state, &item, &mut out, 0)?;
    }
    Ok(out)
}

/// jinja2's attribute getter: `a.b.0` walks attributes and indexes.
fn attr_path(item: &Value, attribute: &Value) -> Result<Value, Error> {
    let Some(path) = attribute.as_str() else {
        return item.get_item(attribute);
    };
    let mut v = item.clone();
    for part in path.split('.') {
        v = match part.parse::<i64>() {
            Ok(i) => v.get_item(&Value::from(i))?,
            Err(_) => v.get_attr(part)?,
        };
    }
    Ok(v)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, positionally or by keyword.
fn tojson(state: &State, value: &Value, args: Rest<ValueOrKwargs>) -> Result<String, Error> {
    let args: Vec<Value> = args.0.into_iter().map(Value::from).collect();
    let (pos, kwargs): (&[Value], Kwargs) = from_args(&args)?;
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if pos.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut opts: [Option<Value>; 4] = Default::default();
    for (i, name) in NAMES.iter().enumerate() {
        opts[i] = match pos.get(i) {
            Some(v) => Some(v.clone()),
            None => kwargs.get::<Option<Value>>(name)?,
        };
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = opts;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) if v.kind() == ValueKind::Bool => Some(" ".repeat(usize::from(v.is_true()))),
        Some(v) => {
            let n = v.as_i64().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "indent must be an int or a string",
                )
            })?;
            let n = usize::try_from(n.max(0)).unwrap_or(0);
            state.consume_fuel(n as u64 / 64)?;
            if n > 1 << 16 {
                return Err(Error::new(ErrorKind::InvalidOperation, "indent too large"));
            }
            Some(" ".repeat(n))
        }
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<Value> = s.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "separators must be a pair of strings",
                    ));
                }
            }
        }
        _ if indent.is_some() => (",".into(), ": ".into()),
        _ => (", ".into(), ": ".into()),
    };
    let mut w = Json {
        state,
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        out: String::new(),
    };
    w.value(value, 0)?;
    Ok(w.out)
}

/// Python's `json.dumps` writer.
struct Json<'a, 't, 'e> {
    state: &'a State<'t, 'e>,
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    out: String,
}

impl Json<'_, '_, '_> {
    fn newline(&mut self, depth: usize) -> Result<(), Error> {
        if let Some(ind) = &self.indent {
            self.out.push('\n');
            self.state.consume_fuel((ind.len() * depth) as u64 / 64)?;
            for _ in 0..depth {
                self.out.push_str(ind);
            }
        }
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\x08' => self.out.push_str("\\b"),
                '\x0c' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }

    /// A key as `json.dumps` converts it: strings as they are, numbers, booleans and None
    /// spelled out.
    fn key(&self, key: &Value) -> Result<String, Error> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
            ValueKind::None => "null".into(),
            ValueKind::Number if key.is_integer() => key.to_string(),
            ValueKind::Number => py_float(f64::try_from(key.clone()).unwrap_or(f64::NAN), true),
            k => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("keys must be str, int, float, bool or None, not {k}"),
                ));
            }
        })
    }

    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        if depth > MAX_NESTING {
            return Err(too_deep());
        }
        self.state.consume_fuel(1)?;
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => {
                let _ = write!(self.out, "{value}");
            }
            ValueKind::Number => self.out.push_str(&py_float(
                f64::try_from(value.clone()).unwrap_or(f64::NAN),
                true,
            )),
            ValueKind::String => {
                let s = value.as_str().unwrap_or_default();
                self.state.consume_fuel(s.len() as u64 / 16)?;
                self.string(s);
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    self.out.push_str("[]");
                    return Ok(());
                }
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        let sep = std::mem::take(&mut self.item_sep);
                        self.out.push_str(&sep);
                        self.item_sep = sep;
                    }
                    self.newline(depth + 1)?;
                    self.value(item, depth + 1)?;
                }
                self.newline(depth)?;
                self.out.push(']');
            }
            ValueKind::Map => {
                let mut pairs = Vec::new();
                for key in value.try_iter()? {
                    let v = value.get_item(&key)?;
                    pairs.push((self.key(&key)?, v));
                }
                if self.sort_keys {
                    self.state.consume_fuel(pairs.len() as u64)?;
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if pairs.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                self.out.push('{');
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        let sep = std::mem::take(&mut self.item_sep);
                        self.out.push_str(&sep);
                        self.item_sep = sep;
                    }
                    self.newline(depth + 1)?;
                    self.string(k);
                    let sep = std::mem::take(&mut self.key_sep);
                    self.out.push_str(&sep);
                    self.key_sep = sep;
                    self.value(v, depth + 1)?;
                }
                self.newline(depth)?;
                self.out.push('}');
            }
            k => {
                let what = match k {
                    ValueKind::Undefined => "Undefined".to_string(),
                    k => k.to_string(),
                };
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {what} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn civil_dates_round_trip() {
        for d in (-800_000..800_000).step_by(97) {
            let (y, m, day) = civil_from_days(d);
            assert!(DateTime::new(y, m, day, 0, 0, 0).is_some(), "{d}");
            assert_eq!(days_from_civil(y, m, day), d);
        }
        let epoch = DateTime::from_unix_utc(0);
        assert_eq!(epoch, DateTime::new(1970, 1, 1, 0, 0, 0).unwrap());
        assert_eq!(epoch.weekday(), 4, "a Thursday");
        let t = DateTime::from_unix_utc(951_825_599); // 2000-02-29T11:59:59Z
        assert_eq!(t, DateTime::new(2000, 2, 29, 11, 59, 59).unwrap());
        assert_eq!(t.yday(), 60);
        assert!(DateTime::new(1900, 2, 29, 0, 0, 0).is_none());
        assert!(DateTime::new(2024, 13, 1, 0, 0, 0).is_none());
        assert!(DateTime::new(2024, 4, 31, 0, 0, 0).is_none());
        assert!(DateTime::new(2024, 1, 1, 24, 0, 0).is_none());
        let now = DateTime::now_local();
        assert!(now.year >= 2024, "{now:?}");
    }

    #[test]
    fn strftime_follows_glibc() {
        let t = DateTime::new(2024, 7, 5, 9, 3, 7).unwrap();
        assert_eq!(
            t.strftime("%-d|%e|%_m|%-H|%^a|%k|%l%P"),
            "5| 5| 7|9|FRI| 9| 9am"
        );
        assert_eq!(
            t.strftime("%F %T %D %R %u %w %C %y"),
            "2024-07-05 09:03:07 07/05/24 09:03 5 5 20 24"
        );
        // ISO weeks and the time zone are not known here: copied, or empty as for Python's
        // naive datetime.
        assert_eq!(t.strftime("%V%z%Z|%Q|%"), "%V|%Q|%");
        // Weeks of the year, Sunday- and Monday-based.
        let jan1 = DateTime::new(2023, 1, 1, 0, 0, 0).unwrap(); // a Sunday
        assert_eq!(jan1.strftime("%U %W %j"), "01 00 001");
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (v, want) in [
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (-0.0, "-0.0"),
            (1.5e300, "1.5e+300"),
            (123.456, "123.456"),
        ] {
            assert_eq!(py_float(v, false), want, "{v}");
        }
        assert_eq!(py_float(f64::INFINITY, true), "Infinity");
        assert_eq!(py_float(f64::NAN, false), "nan");
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
