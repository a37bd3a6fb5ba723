//! Reading tool calls from output as it streams ([`ToolCallStream`]): text that cannot be part
//! of a call is passed on at once; from where a call may begin, a small resumable JSON reader
//! follows the format's structure and reports each call once its function's name is known
//! and its arguments object has begun, then the arguments' text piece by piece, as OpenAI
//! streams calls. The pieces of a call's arguments put together are exactly the `arguments`
//! [`parse_tool_calls`] gives for the same output (the model's JSON text of the object
//! without the whitespace outside strings).

use super::json::{self, Json};
use super::markup_calls::{Reader, Schemas, Step, skip_at, starts};
use super::tools::{
    FUNCTOOLS, HERMES_CLOSE, HERMES_OPEN, MISTRAL_OPEN, PHI4_CLOSE, PHI4_OPEN, PYTHON_TAG,
    ParsedOutput, ToolCallFormat, Tools, parse_calls, schema_of, skip_ws,
};

/// What a [`ToolCallStream`] reports of the output as it arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolStreamEvent {
    /// Text to pass on as content.
    Text(String),
    /// A call begins: its place among the reply's calls (0, 1, ...) and the function's name.
    CallStart {
        /// The call's place.
        index: usize,
        /// The function's name.
        name: String,
    },
    /// The next piece of a call's arguments (JSON text, to be appended to the pieces before).
    CallArguments {
        /// The call's place.
        index: usize,
        /// The piece.
        fragment: String,
    },
}

/// Reads calls from output as it streams.
///
/// Text that cannot be part of a call is passed on at once
/// ([`ToolStreamEvent::Text`]); from the point where a call may begin (the format's marker,
/// or a part of it at the end of the text so far; for Llama 3.x and the generic form, a
/// reply that begins with `{` or `<|python_tag|>`; for Phi-4-mini also a reply that begins
/// with `[` or `functools`), the text is held back, and read at the end
/// ([`finish`](Self::finish)) as [`parse_tool_calls`](super::parse_tool_calls) reads it.
///
/// Meanwhile the held text is followed as it grows: a call is started
/// ([`ToolStreamEvent::CallStart`]) once its `name` is read and its arguments object has
/// begun, and its arguments are then sent as they come ([`ToolStreamEvent::CallArguments`]).
/// A call whose arguments come before its name, or are written as a JSON string, is reported
/// whole when its object closes. A call is only started when its name is one of the
/// functions offered ([`offering`](Self::offering)); from a call of another function, or from
/// text that breaks the format, nothing more is reported. What was reported cannot be taken
/// back: when the output turns out not to be well-formed calls after a call was started,
/// [`finish`](Self::finish)'s parse has no calls while [`calls_started`](Self::calls_started)
/// is not zero, and the caller decides (the server ends the reply with the calls it sent).
///
/// The text passed on plus the content of `finish` is the whole output when it holds no call
/// (the generic form: the text of its `{"response": "..."}`, which is held to the end: a reply
/// cut short is not a response, and its whole text is the content, as unstreamed).
#[derive(Clone, Debug)]
pub struct ToolCallStream {
    format: ToolCallFormat,
    /// Text not passed on yet.
    held: String,
    /// From `held`'s start on, everything is held until the end.
    holding: bool,
    /// Llama 3.x / generic / Phi-4-mini: whether the reply began as a call is decided (for
    /// Llama 3.x and the generic form, it did not: nothing is held any more).
    plain: bool,
    /// The functions a call may be of (`None`: any).
    names: Option<Vec<String>>,
    /// The request's tools, for the formats that type arguments by their schemas.
    tools: Option<Tools>,
    /// The reader of the held text (JSON formats).
    scan: Scanner,
    /// The reader of the held text (Qwen XML), once it holds text.
    markup: Option<Reader>,
}

impl ToolCallStream {
    /// A stream of output in `format`.
    pub fn new(format: ToolCallFormat) -> ToolCallStream {
        ToolCallStream {
            format,
            held: String::new(),
            holding: false,
            plain: false,
            names: None,
            tools: None,
            scan: Scanner::default(),
            markup: None,
        }
    }

    /// The request's tools: Qwen XML's parameters are typed by their schemas, as
    /// [`parse_tool_calls_for`](super::parse_tool_calls_for) types them.
    pub fn with_tools(mut self, tools: Tools) -> ToolCallStream {
        self.tools = Some(tools);
        self
    }

    /// Only calls of these functions are started as they stream.
    pub fn offering(mut self, names: Vec<String>) -> ToolCallStream {
        self.names = Some(names);
        self
    }

    /// Takes the next piece of output; returns the text that can be passed on now (call events
    /// are dropped: see [`feed`](Self::feed)).
    pub fn push(&mut self, text: &str) -> String {
        self.feed(text)
            .into_iter()
            .filter_map(|e| match e {
                ToolStreamEvent::Text(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    /// Takes the next piece of output; returns what can be reported now: text to pass on,
    /// and the calls' starts and argument pieces.
    pub fn feed(&mut self, text: &str) -> Vec<ToolStreamEvent> {
        let mut events = Vec::new();
        let passed = self.pass(text);
        if !passed.is_empty() {
            events.push(ToolStreamEvent::Text(passed));
        }
        if self.holding {
            match self.format {
                ToolCallFormat::QwenXml | ToolCallFormat::Lfm2 => {
                    let reader = self.markup.get_or_insert_with(|| match self.format {
                        ToolCallFormat::Lfm2 => Reader::py(0),
                        _ => Reader::xml(0),
                    });
                    let tools = self.tools.as_ref();
                    let lookup = |name: &str| tools.and_then(|t| schema_of(t, name));
                    self.scan.advance_markup(
                        reader,
                        &self.held,
                        self.names.as_deref(),
                        Some(&lookup),
                        &mut events,
                    );
                }
                _ => {
                    self.scan
                        .advance(self.format, &self.held, self.names.as_deref(), &mut events);
                }
            }
        }
        events
    }

    /// How many calls were started.
    pub fn calls_started(&self) -> usize {
        self.scan.started
    }

    /// Takes `text`; returns what of the held text can be passed on as plain text.
    fn pass(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.holding {
            return String::new();
        }
        if self.plain && !matches!(self.format, ToolCallFormat::Phi4Mini | ToolCallFormat::Lfm2) {
            return std::mem::take(&mut self.held);
        }
        let reply_start: &[&str] = match self.format {
            ToolCallFormat::Llama3 | ToolCallFormat::Generic => &["{", PYTHON_TAG],
            ToolCallFormat::Phi4Mini => &["[", FUNCTOOLS],
            ToolCallFormat::Lfm2 => &["["],
            _ => &[],
        };
        if !reply_start.is_empty() && !self.plain {
            let start = skip_ws(&self.held);
            if start.is_empty() {
                return String::new();
            }
            if reply_start.iter().any(|s| start.starts_with(s)) {
                self.holding = true;
                return String::new();
            }
            if reply_start.iter().any(|s| s.starts_with(start)) {
                return String::new();
            }
            self.plain = true;
        }
        let Some(marker) = self.format.marker() else {
            return std::mem::take(&mut self.held);
        };
        if let Some(at) = self.held.find(marker) {
            self.holding = true;
            let rest = self.held.split_off(at);
            return std::mem::replace(&mut self.held, rest);
        }
        // Hold back the longest end of the text that begins the marker.
        let keep = (1..marker.len().min(self.held.len() + 1))
            .rev()
            .find(|&n| {
                self.held.is_char_boundary(self.held.len() - n)
                    && marker.starts_with(&self.held[self.held.len() - n..])
            })
            .unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        std::mem::replace(&mut self.held, rest)
    }

    /// The text held back so far (what [`finish`](Self::finish) reads).
    pub fn held(&self) -> &str {
        &self.held
    }

    /// The end of the output: the calls, and the text still held (all of it, when it holds no
    /// well-formed call).
    pub fn finish(self) -> ParsedOutput {
        if self.holding {
            parse_calls(self.format, &self.held, self.tools.as_ref())
        } else {
            ParsedOutput {
                content: self.held,
                calls: Vec::new(),
            }
        }
    }
}

/// Where the reader is in the format's structure, outside the JSON values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Outer {
    /// Before the format's opening (marker, tag).
    #[default]
    Prefix,
    /// Before a JSON value.
    BeforeValue,
    /// In a JSON value.
    InValue,
    /// After a whole JSON value.
    AfterValue,
    /// Hermes, Phi-4-mini: after a block of calls, before another or the text after them.
    Between,
    /// Past the calls: nothing more is read.
    Done,
}

/// What a JSON container expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// A key or `}` (just after `{`).
    KeyOrEnd,
    /// A key (after `,`).
    Key,
    /// `:`.
    Colon,
    /// A value (after `:` or `,` in a list).
    Value,
    /// A value or `]` (just after `[`).
    ValueOrEnd,
    /// `,` or the container's end.
    CommaOrEnd,
}

/// An open JSON container.
#[derive(Clone, Debug)]
struct Frame {
    /// An object (else a list).
    obj: bool,
    /// An object's current member's key.
    key: Option<String>,
    expect: Expect,
    /// A call object: its place in `Scanner::calls`.
    call: Option<usize>,
}

/// A call object being read.
#[derive(Clone, Debug, Default)]
struct Call {
    name: Option<String>,
    /// Its place among the started calls, once started.
    index: Option<usize>,
    /// The arguments object's text so far (without whitespace), while not started.
    args: Option<String>,
    /// Arguments given as a JSON string.
    args_str: Option<String>,
}

/// The kind of a JSON value that begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Obj,
    Arr,
    Str,
    Scalar,
}

/// The resumable reader of the held text.
#[derive(Clone, Debug, Default)]
struct Scanner {
    /// Bytes of the held text read.
    pos: usize,
    outer: Outer,
    stack: Vec<Frame>,
    /// Where the string or scalar being read began.
    token: Option<usize>,
    in_str: bool,
    esc: bool,
    calls: Vec<Call>,
    /// The call whose arguments object is being read, and that object's depth.
    args: Option<(usize, usize)>,
    /// Argument text read in this step, of the started call `args` names.
    fragment: String,
    /// Calls started.
    started: usize,
    /// Nothing more is reported (the text broke the format, or a call is of a function not
    /// offered).
    stopped: bool,
}

impl Scanner {
    /// Reads `held` on with `reader` (a format of [`Reader`]s), reporting into `events`: each
    /// call once its function is read, each piece of its arguments once read whole.
    fn advance_markup(
        &mut self,
        reader: &mut Reader,
        held: &str,
        names: Option<&[String]>,
        tools: Schemas<'_>,
        events: &mut Vec<ToolStreamEvent>,
    ) {
        while !self.stopped {
            match reader.step(held, tools) {
                Step::Call(name) => {
                    if names.is_some_and(|n| !n.contains(&name)) {
                        self.stopped = true;
                        return;
                    }
                    events.push(ToolStreamEvent::CallStart {
                        index: self.started,
                        name,
                    });
                    self.started += 1;
                }
                Step::Args(fragment) => match self.started.checked_sub(1) {
                    Some(index) => events.push(ToolStreamEvent::CallArguments { index, fragment }),
                    None => self.stopped = true,
                },
                Step::More => return,
                Step::End | Step::Bad => self.stopped = true,
            }
        }
    }

    /// Reads `held` on from where it stopped, reporting into `events`.
    fn advance(
        &mut self,
        format: ToolCallFormat,
        held: &str,
        names: Option<&[String]>,
        events: &mut Vec<ToolStreamEvent>,
    ) {
        while !self.stopped && self.pos < held.len() {
            let before = (self.pos, self.outer);
            match self.outer {
                Outer::InValue => self.value_step(format, held, names, events),
                Outer::Done => break,
                _ => {
                    if !self.outer_step(format, held) {
                        break;
                    }
                }
            }
            if (self.pos, self.outer) == before && self.outer != Outer::InValue {
                break;
            }
        }
        self.flush(events);
    }

    /// One step outside the JSON values; `false` when more text is needed.
    fn outer_step(&mut self, format: ToolCallFormat, held: &str) -> bool {
        use ToolCallFormat as F;
        let at = skip_at(held, self.pos);
        let rest = &held[at..];
        match self.outer {
            Outer::Prefix => {
                let (marker, optional): (&[&str], bool) = match format {
                    F::Hermes => (&[HERMES_OPEN], false),
                    F::Mistral => (&[MISTRAL_OPEN], false),
                    F::Llama3 => (&[PYTHON_TAG], true),
                    F::Phi4Mini => (&[PHI4_OPEN, FUNCTOOLS], true),
                    _ => (&[], true),
                };
                if rest.is_empty() && !marker.is_empty() {
                    return false;
                }
                for m in marker {
                    match starts(rest, m) {
                        Some(true) => {
                            self.pos = at + m.len();
                            self.outer = Outer::BeforeValue;
                            return true;
                        }
                        None => return false,
                        Some(false) => {}
                    }
                }
                if !optional {
                    self.stopped = true;
                    return false;
                }
                self.pos = at;
                self.outer = Outer::BeforeValue;
                true
            }
            Outer::BeforeValue => {
                let Some(c) = rest.bytes().next() else {
                    self.pos = at;
                    return false;
                };
                let ok = match format {
                    F::Hermes | F::Llama3 | F::Generic | F::QwenXml | F::Lfm2 => c == b'{',
                    F::Mistral => c == b'[',
                    F::Phi4Mini => c == b'[' || c == b'{',
                };
                self.pos = at;
                if ok {
                    self.outer = Outer::InValue;
                } else {
                    self.stopped = true;
                }
                ok
            }
            Outer::AfterValue => {
                if rest.is_empty() {
                    self.pos = at;
                    return false;
                }
                match format {
                    F::Hermes | F::Phi4Mini => {
                        let close = if format == F::Hermes {
                            HERMES_CLOSE
                        } else {
                            PHI4_CLOSE
                        };
                        self.pos = at;
                        match starts(rest, close) {
                            None => false,
                            Some(true) => {
                                self.pos = at + close.len();
                                self.outer = Outer::Between;
                                true
                            }
                            // Phi-4-mini's closing tag may be left out; Hermes' may not.
                            Some(false) if format == F::Phi4Mini => {
                                self.outer = Outer::Between;
                                true
                            }
                            Some(false) => {
                                self.stopped = true;
                                false
                            }
                        }
                    }
                    F::Llama3 if rest.starts_with(';') => {
                        self.pos = at + 1;
                        self.outer = Outer::BeforeValue;
                        true
                    }
                    _ => {
                        self.stopped = true;
                        false
                    }
                }
            }
            Outer::Between => {
                self.pos = at;
                let open = if format == F::Hermes {
                    HERMES_OPEN
                } else {
                    PHI4_OPEN
                };
                if rest.is_empty() {
                    return false;
                }
                match starts(rest, open) {
                    None => false,
                    Some(true) => {
                        self.pos = at + open.len();
                        self.outer = Outer::BeforeValue;
                        true
                    }
                    // Text after the calls: content, not read.
                    Some(false) => {
                        self.outer = Outer::Done;
                        false
                    }
                }
            }
            Outer::InValue | Outer::Done => false,
        }
    }

    /// Whether an object that begins now is a call, in `format`.
    fn call_position(&self, format: ToolCallFormat) -> bool {
        use ToolCallFormat as F;
        let s = &self.stack;
        match format {
            F::Hermes | F::Llama3 | F::QwenXml | F::Lfm2 => s.is_empty(),
            F::Mistral => s.len() == 1 && !s[0].obj,
            F::Phi4Mini => s.is_empty() || (s.len() == 1 && !s[0].obj),
            F::Generic => {
                (s.len() == 1 && s[0].obj && s[0].key.as_deref() == Some("tool_call"))
                    || (s.len() == 2
                        && s[0].obj
                        && s[0].key.as_deref() == Some("tool_calls")
                        && !s[1].obj)
            }
        }
    }

    /// Whether `key` names a call's arguments in `format`.
    fn args_key(format: ToolCallFormat, key: &str) -> bool {
        key == "arguments" || (format == ToolCallFormat::Llama3 && key == "parameters")
    }

    /// Reads one character of a JSON value.
    fn value_step(
        &mut self,
        format: ToolCallFormat,
        held: &str,
        names: Option<&[String]>,
        events: &mut Vec<ToolStreamEvent>,
    ) {
        let Some(c) = held[self.pos..].chars().next() else {
            return;
        };
        let at = self.pos;
        self.pos += c.len_utf8();
        if self.in_str {
            self.string_char(c);
            if !self.in_str {
                // The closing quote.
                let start = self.token.take().unwrap_or(at);
                self.arg_char(c);
                self.string_done(format, &held[start..self.pos]);
            } else {
                self.arg_char(c);
            }
            return;
        }
        let ws = c.is_ascii() && json::is_ws(c as u8);
        let delimiter = ws || matches!(c, ',' | '}' | ']' | ':' | '{' | '[' | '"');
        if delimiter {
            if let Some(start) = self.token.take() {
                self.scalar_done(&held[start..at]);
                if self.stopped {
                    return;
                }
            }
        }
        if ws {
            return;
        }
        match c {
            '{' | '[' => {
                let kind = if c == '{' { Kind::Obj } else { Kind::Arr };
                if !self.value_start(format, kind) {
                    return;
                }
                let call = (kind == Kind::Obj && self.call_position(format)).then(|| {
                    self.calls.push(Call::default());
                    self.calls.len() - 1
                });
                // The arguments object of a call begins.
                let args_of = self.stack.last().and_then(|f| {
                    let key = f.key.as_deref()?;
                    (kind == Kind::Obj && Self::args_key(format, key)).then_some(f.call?)
                });
                self.stack.push(Frame {
                    obj: kind == Kind::Obj,
                    key: None,
                    expect: if kind == Kind::Obj {
                        Expect::KeyOrEnd
                    } else {
                        Expect::ValueOrEnd
                    },
                    call,
                });
                if let Some(ci) = args_of.filter(|_| self.args.is_none()) {
                    self.args = Some((ci, self.stack.len()));
                    let call = &self.calls[ci];
                    match call.name.clone() {
                        Some(name) if call.index.is_none() => {
                            if !self.start_call(ci, name, names, events) {
                                return;
                            }
                        }
                        _ => self.calls[ci].args = Some(String::new()),
                    }
                }
                self.arg_char(c);
            }
            '}' | ']' => {
                let obj = c == '}';
                let ok = self.stack.last().is_some_and(|f| {
                    f.obj == obj
                        && matches!(
                            f.expect,
                            Expect::CommaOrEnd | Expect::KeyOrEnd | Expect::ValueOrEnd
                        )
                        && (obj || f.expect != Expect::KeyOrEnd)
                        && (!obj || f.expect != Expect::ValueOrEnd)
                });
                if !ok {
                    self.stopped = true;
                    return;
                }
                self.arg_char(c);
                if self
                    .args
                    .is_some_and(|(_, depth)| depth == self.stack.len())
                {
                    self.flush(events);
                    self.args = None;
                }
                let frame = self.stack.pop().expect("checked above");
                if let Some(ci) = frame.call {
                    self.call_done(ci, names, events);
                    if self.stopped {
                        return;
                    }
                }
                self.value_done();
            }
            ':' => match self.stack.last_mut() {
                Some(f) if f.expect == Expect::Colon => {
                    f.expect = Expect::Value;
                    self.arg_char(c);
                }
                _ => self.stopped = true,
            },
            ',' => match self.stack.last_mut() {
                Some(f) if f.expect == Expect::CommaOrEnd => {
                    f.expect = if f.obj { Expect::Key } else { Expect::Value };
                    self.arg_char(c);
                }
                _ => self.stopped = true,
            },
            '"' => {
                let key = self
                    .stack
                    .last()
                    .is_some_and(|f| matches!(f.expect, Expect::Key | Expect::KeyOrEnd));
                if !key && !self.value_start(format, Kind::Str) {
                    return;
                }
                self.in_str = true;
                self.token = Some(at);
                self.arg_char(c);
            }
            _ => {
                if self.token.is_none() {
                    if !self.value_start(format, Kind::Scalar) {
                        return;
                    }
                    self.token = Some(at);
                }
                self.arg_char(c);
            }
        }
    }

    /// A character inside a string: its escapes followed, to tell its closing quote.
    fn string_char(&mut self, c: char) {
        if self.esc {
            self.esc = false;
        } else if c == '\\' {
            self.esc = true;
        } else if c == '"' {
            self.in_str = false;
        }
    }

    /// A character of an arguments object, when one is being read: sent (a started call) or
    /// kept (a call whose name is not known yet).
    fn arg_char(&mut self, c: char) {
        let Some((ci, _)) = self.args else { return };
        if !self.in_str && c != '"' && c.is_ascii() && json::is_ws(c as u8) {
            return;
        }
        let call = &mut self.calls[ci];
        match (&mut call.args, call.index) {
            (Some(buf), _) => buf.push(c),
            (None, Some(_)) => self.fragment.push(c),
            (None, None) => {}
        }
    }

    /// Sends the argument text read for the started call being read.
    fn flush(&mut self, events: &mut Vec<ToolStreamEvent>) {
        let index = self.args.and_then(|(ci, _)| self.calls[ci].index);
        if let (Some(index), false) = (index, self.fragment.is_empty()) {
            events.push(ToolStreamEvent::CallArguments {
                index,
                fragment: std::mem::take(&mut self.fragment),
            });
        }
    }

    /// A value of `kind` begins where the innermost container expects one; `false` (and the
    /// reader stops) when it may not.
    fn value_start(&mut self, format: ToolCallFormat, kind: Kind) -> bool {
        let ok = match self.stack.last() {
            None => true,
            Some(f) => matches!(f.expect, Expect::Value | Expect::ValueOrEnd),
        };
        // Calls are objects (Phi-4-mini's outermost value may also be their list); a call's
        // name is a string, its arguments an object or a string.
        let call_slot = self.call_position(format)
            && kind != Kind::Obj
            && !(self.stack.is_empty() && kind == Kind::Arr);
        let bad_member = self.stack.last().is_some_and(|f| {
            f.call.is_some()
                && match f.key.as_deref() {
                    Some("name") => kind != Kind::Str,
                    Some(k) if Self::args_key(format, k) => !matches!(kind, Kind::Obj | Kind::Str),
                    _ => false,
                }
        });
        if !ok || call_slot || bad_member {
            self.stopped = true;
            return false;
        }
        if let Some(f) = self.stack.last_mut() {
            if f.expect == Expect::ValueOrEnd {
                f.expect = Expect::Value;
            }
        }
        true
    }

    /// A whole value was read: its container expects `,` or its end; the outermost one ends the
    /// JSON value.
    fn value_done(&mut self) {
        match self.stack.last_mut() {
            Some(f) => f.expect = Expect::CommaOrEnd,
            None => self.outer = Outer::AfterValue,
        }
    }

    /// A whole string `raw` (quotes included): a key, or a value.
    fn string_done(&mut self, format: ToolCallFormat, raw: &str) {
        let Ok(Json::Str(s)) = json::parse(raw) else {
            self.stopped = true;
            return;
        };
        if let Some(f) = self.stack.last_mut() {
            if matches!(f.expect, Expect::Key | Expect::KeyOrEnd) {
                f.key = Some(s);
                f.expect = Expect::Colon;
                return;
            }
            if let (Some(ci), Some(key)) = (f.call, f.key.as_deref()) {
                let call = &mut self.calls[ci];
                if key == "name" && call.name.is_none() {
                    call.name = Some(s);
                } else if Self::args_key(format, key) && call.args.is_none() {
                    call.args_str = Some(s);
                }
            }
        }
        self.value_done();
    }

    /// A whole scalar `raw` (a number, `true`, `false`, `null`).
    fn scalar_done(&mut self, raw: &str) {
        if !matches!(
            json::parse(raw),
            Ok(Json::Int(_) | Json::Float(_) | Json::Bool(_) | Json::Null)
        ) {
            self.stopped = true;
            return;
        }
        self.value_done();
    }

    /// Starts call `ci` of `name` if `name` is offered; else the reader stops.
    fn start_call(
        &mut self,
        ci: usize,
        name: String,
        names: Option<&[String]>,
        events: &mut Vec<ToolStreamEvent>,
    ) -> bool {
        if name.is_empty() || names.is_some_and(|n| !n.contains(&name)) {
            self.stopped = true;
            return false;
        }
        let index = self.started;
        self.started += 1;
        self.calls[ci].index = Some(index);
        events.push(ToolStreamEvent::CallStart { index, name });
        true
    }

    /// Call object `ci` closed: a call not started yet is reported whole.
    fn call_done(
        &mut self,
        ci: usize,
        names: Option<&[String]>,
        events: &mut Vec<ToolStreamEvent>,
    ) {
        let call = &mut self.calls[ci];
        if call.index.is_some() {
            return;
        }
        let Some(name) = call.name.clone() else {
            self.stopped = true;
            return;
        };
        let args = match (call.args.take(), call.args_str.take()) {
            (Some(a), _) => a,
            (None, Some(s)) => match json::parse(&s) {
                Ok(Json::Obj(_)) => json::strip_ws(&s),
                _ => {
                    self.stopped = true;
                    return;
                }
            },
            (None, None) => "{}".to_string(),
        };
        if self.start_call(ci, name, names, events) {
            let index = self.started - 1;
            events.push(ToolStreamEvent::CallArguments {
                index,
                fragment: args,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolCall;
    use crate::chat::parse_tool_calls;

    /// Every way of cutting the output into pieces streams the same: the text passed on plus
    /// the final content and calls equal the whole output's parse, and nothing of a call is
    /// passed on.
    #[test]
    fn streaming_holds_back_what_may_be_a_call() {
        let cases = [
            (
                ToolCallFormat::Hermes,
                "Let me look. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>",
            ),
            (ToolCallFormat::Hermes, "No call here, only <tool text."),
            (
                ToolCallFormat::Hermes,
                "Bad <tool_call>{\"name\": 1}</tool_call>",
            ),
            (
                ToolCallFormat::Llama3,
                "{\"name\": \"add\", \"parameters\": {\"a\": 1}}",
            ),
            (
                ToolCallFormat::Llama3,
                "<|python_tag|>{\"name\": \"add\", \"parameters\": {}}",
            ),
            (ToolCallFormat::Llama3, "Plain { text"),
            // Not JSON whitespace before the object: no call, whole or streamed.
            (
                ToolCallFormat::Llama3,
                "\u{a0}{\"name\": \"add\", \"parameters\": {}}",
            ),
            (
                ToolCallFormat::Mistral,
                "Ok [TOOL_CALLS][{\"name\": \"add\", \"arguments\": {}}]",
            ),
            (ToolCallFormat::Generic, "{\"response\": \"hi\"}"),
            (ToolCallFormat::Generic, "  hello"),
            (
                ToolCallFormat::Phi4Mini,
                "Sure. <|tool_call|>[{\"name\": \"add\", \"arguments\": {}}]<|/tool_call|>",
            ),
            (ToolCallFormat::Phi4Mini, "[1] is a note <|tool"),
            (ToolCallFormat::Phi4Mini, "func tools"),
            (
                ToolCallFormat::QwenXml,
                "Sure.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
            ),
            (ToolCallFormat::QwenXml, "a <tool_ call"),
            (
                ToolCallFormat::Lfm2,
                "Sure. <|tool_call_start|>[add(a=1)]<|tool_call_end|>",
            ),
            (ToolCallFormat::Lfm2, "[1] is a note <|tool_call"),
            (ToolCallFormat::Lfm2, " [add(a=1)] then"),
            (ToolCallFormat::Lfm2, "<|tool_call_start|>[add(a=1), 2]"),
            (
                ToolCallFormat::QwenXml,
                "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\nstray",
            ),
        ];
        for (format, text) in cases {
            let whole = parse_tool_calls(format, text);
            for step in 1..=text.len() {
                let mut s = ToolCallStream::new(format);
                let mut passed = String::new();
                let mut i = 0;
                while i < text.len() {
                    let mut j = (i + step).min(text.len());
                    while !text.is_char_boundary(j) {
                        j += 1;
                    }
                    passed.push_str(&s.push(&text[i..j]));
                    i = j;
                }
                let end = s.finish();
                assert_eq!(end.calls, whole.calls, "{text} by {step}");
                if whole.calls.is_empty() {
                    assert_eq!(passed + &end.content, whole.content, "{text} by {step}");
                } else {
                    assert!(!passed.contains('{'), "{text} by {step}: {passed}");
                    assert_eq!(
                        format!("{}{}", passed, end.content).trim(),
                        whole.content,
                        "{text} by {step}"
                    );
                }
            }
        }
    }

    /// A small seeded generator (SplitMix64) for the random cuts.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    /// What a stream reported: the text passed on, each call's name and the pieces of its
    /// arguments, in order.
    #[derive(Debug, Default)]
    struct Seen {
        text: String,
        calls: Vec<(String, Vec<String>)>,
    }

    /// Streams `text` cut at `cuts` (byte offsets, moved to character boundaries).
    fn stream(
        format: ToolCallFormat,
        names: Option<&[&str]>,
        text: &str,
        cuts: &[usize],
    ) -> (Seen, usize, ParsedOutput) {
        let mut s = ToolCallStream::new(format);
        if let Some(n) = names {
            s = s.offering(n.iter().map(|n| n.to_string()).collect());
        }
        let mut seen = Seen::default();
        let mut from = 0;
        for &cut in cuts.iter().chain([&text.len()]) {
            let mut to = cut.clamp(from, text.len());
            while !text.is_char_boundary(to) {
                to += 1;
            }
            for e in s.feed(&text[from..to]) {
                match e {
                    ToolStreamEvent::Text(t) => {
                        assert!(!t.is_empty());
                        seen.text.push_str(&t);
                    }
                    ToolStreamEvent::CallStart { index, name } => {
                        assert_eq!(index, seen.calls.len(), "{text}: starts in order");
                        seen.calls.push((name, Vec::new()));
                    }
                    ToolStreamEvent::CallArguments { index, fragment } => {
                        assert!(!fragment.is_empty());
                        seen.calls[index].1.push(fragment);
                    }
                }
            }
            from = to;
        }
        let started = s.calls_started();
        (seen, started, s.finish())
    }

    /// Well-formed calls in every format, with the arguments written out by hand as the
    /// model's text without the whitespace outside strings.
    fn call_cases() -> Vec<(ToolCallFormat, &'static str, Vec<ToolCall>, &'static str)> {
        let c = ToolCall::new;
        vec![
            (
                ToolCallFormat::Hermes,
                "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris, \\\"FR\\\"\", \"days\": [1, 2.50]}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1e3, \"b\": {}}}\n</tool_call>",
                vec![
                    c("get_weather", r#"{"city":"Paris, \"FR\"","days":[1,2.50]}"#),
                    c("add", r#"{"a":1e3,"b":{}}"#),
                ],
                "Let me look.",
            ),
            (
                ToolCallFormat::Llama3,
                "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": -1, \"t\": \"x y\"}}; {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ré\\u00e9\"}}",
                vec![
                    c("add", r#"{"a":-1,"t":"x y"}"#),
                    c("get_weather", r#"{"city":"Ré\u00e9"}"#),
                ],
                "",
            ),
            (
                ToolCallFormat::Llama3,
                " {\"name\": \"add\", \"parameters\": {\"a\": true, \"b\": null}} ",
                vec![c("add", r#"{"a":true,"b":null}"#)],
                "",
            ),
            (
                ToolCallFormat::Mistral,
                "Sure.[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}, \"id\": \"abcDEF123\"}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"[x]\"}, \"id\": \"zzzZZZ999\"}]",
                vec![
                    ToolCall {
                        id: Some("abcDEF123".into()),
                        ..c("add", r#"{"a":1}"#)
                    },
                    ToolCall {
                        id: Some("zzzZZZ999".into()),
                        ..c("get_weather", r#"{"city":"[x]"}"#)
                    },
                ],
                "Sure.",
            ),
            (
                ToolCallFormat::Generic,
                "{\"tool_calls\": [{\"name\": \"add\", \"arguments\": {\"a\": 1,\n \"b\": 2}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]}",
                vec![
                    c("add", r#"{"a":1,"b":2}"#),
                    c("get_weather", r#"{"city":"Rome"}"#),
                ],
                "",
            ),
            (
                ToolCallFormat::Generic,
                "{\"tool_call\": {\"name\": \"add\", \"arguments\": {\"a\": {\"b\": [\"}\"]}}}}",
                vec![c("add", r#"{"a":{"b":["}"]}}"#)],
                "",
            ),
            (
                ToolCallFormat::Phi4Mini,
                "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"add\", \"arguments\": {\"a\": 1}}]<|/tool_call|>",
                vec![
                    c("get_weather", r#"{"city":"Paris"}"#),
                    c("add", r#"{"a":1}"#),
                ],
                "",
            ),
            (
                ToolCallFormat::Phi4Mini,
                "[{\"name\": \"add\", \"arguments\": {\"a\": 2}}]",
                vec![c("add", r#"{"a":2}"#)],
                "",
            ),
            (
                ToolCallFormat::Phi4Mini,
                "functools[{\"name\": \"add\", \"arguments\": {\"a\": 3}}] ",
                vec![c("add", r#"{"a":3}"#)],
                "",
            ),
            (
                ToolCallFormat::Phi4Mini,
                "Ok.<|tool_call|>{\"name\": \"add\", \"arguments\": {\"a\": 4}}<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {}}]\nDone.",
                vec![c("add", r#"{"a":4}"#), c("get_weather", "{}")],
                "Ok.\nDone.",
            ),
            (
                ToolCallFormat::QwenXml,
                "Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, \"FR\"\nline 2\n</parameter>\n<parameter=days>\n[1, 2.50]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n<parameter=a>\n1e3\n</parameter>\n<parameter=b>\n{}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
                vec![
                    c(
                        "get_weather",
                        r#"{"city":"Paris, \"FR\"\nline 2","days":[1,2.50]}"#,
                    ),
                    c("add", r#"{"a":1e3,"b":{}}"#),
                    c("now", "{}"),
                ],
                "Let me look.",
            ),
            (
                ToolCallFormat::Lfm2,
                "Let me look.<|tool_call_start|>[get_weather(city='Paris, \"FR\"\nline 2', days=[1, 2.50], when=None), add(a=1e3, b={\"k\": [True, 'x']}), now()]<|tool_call_end|>",
                vec![
                    c(
                        "get_weather",
                        r#"{"city":"Paris, \"FR\"\nline 2","days":[1,2.50],"when":null}"#,
                    ),
                    c("add", r#"{"a":1e3,"b":{"k":[true,"x"]}}"#),
                    c("now", "{}"),
                ],
                "Let me look.",
            ),
            (
                ToolCallFormat::Lfm2,
                "[add(a=2)]",
                vec![c("add", r#"{"a":2}"#)],
                "",
            ),
        ]
    }

    /// Each format fed a character at a time and cut at random: the calls are started in
    /// order with the parse's names, their pieces put together are the parse's arguments
    /// (and the hand-written ones), the text passed on is the text before the calls, and the
    /// arguments of a call written name first arrive in more than one piece when cut finely.
    #[test]
    fn streamed_calls_put_together_are_the_parsed_calls() {
        let mut rng = Rng(0x5EED);
        for (format, text, want, content) in call_cases() {
            let whole = parse_tool_calls(format, text);
            let plain: Vec<ToolCall> = want
                .iter()
                .map(|c| ToolCall::new(c.name.clone(), c.arguments.clone()))
                .collect();
            assert_eq!(whole.calls, want, "{text}");
            assert_eq!(whole.content, content, "{text}");
            let mut cutting: Vec<Vec<usize>> = vec![(1..text.len()).collect(), vec![]];
            for _ in 0..50 {
                let n = (rng.next() % 12) as usize;
                let mut cuts: Vec<usize> = (0..n)
                    .map(|_| (rng.next() % text.len() as u64) as usize)
                    .collect();
                cuts.sort_unstable();
                cutting.push(cuts);
            }
            for (k, cuts) in cutting.iter().enumerate() {
                let (seen, started, end) = stream(format, None, text, cuts);
                let got: Vec<ToolCall> = seen
                    .calls
                    .iter()
                    .map(|(name, pieces)| ToolCall::new(name.clone(), pieces.concat()))
                    .collect();
                assert_eq!(got, plain, "{text} cut at {cuts:?}");
                assert_eq!(started, want.len());
                assert_eq!(end.calls, whole.calls, "{text} cut at {cuts:?}");
                let passed = format!("{}\n{}", seen.text.trim(), end.content);
                assert_eq!(passed.trim(), content, "{text} cut at {cuts:?}");
                if k == 0 {
                    for (name, pieces) in &seen.calls {
                        // (Qwen XML and LFM2 send a call without arguments as `{}` at once.)
                        assert!(
                            pieces.len() > 1
                                || (matches!(
                                    format,
                                    ToolCallFormat::QwenXml | ToolCallFormat::Lfm2
                                ) && pieces == &["{}"]),
                            "{text}: {name} in {pieces:?}"
                        );
                    }
                }
            }
        }
    }

    /// Qwen XML's parameters streamed with the request's tools are typed as the whole
    /// reply's parse types them.
    #[test]
    fn qwen_xml_streams_typed_by_the_tools() {
        let tools = crate::chat::Tools::from_json(
            r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                "properties": {"s": {"type": "string"}, "n": {"type": "number"}}}}}]"#,
        )
        .unwrap();
        let text = "<tool_call>\n<function=f>\n<parameter=s>\n12\n</parameter>\n<parameter=n>\n12\n</parameter>\n</function>\n</tool_call>";
        let mut s = ToolCallStream::new(ToolCallFormat::QwenXml).with_tools(tools.clone());
        let mut args = String::new();
        for c in text.chars() {
            for e in s.feed(&c.to_string()) {
                if let ToolStreamEvent::CallArguments { fragment, .. } = e {
                    args.push_str(&fragment);
                }
            }
        }
        assert_eq!(args, r#"{"s":"12","n":12}"#);
        let whole = crate::chat::parse_tool_calls_for(ToolCallFormat::QwenXml, text, &tools);
        assert_eq!(s.finish().calls, whole.calls);
        assert_eq!(whole.calls[0].arguments, args);
    }

    /// Arguments before the name, or written as a JSON string: the call is reported whole
    /// when its object closes.
    #[test]
    fn calls_without_a_name_first_come_whole() {
        for (format, text, args) in [
            (
                ToolCallFormat::Hermes,
                "<tool_call>\n{\"arguments\": {\"a\": 1}, \"name\": \"add\"}\n</tool_call>",
                r#"{"a":1}"#,
            ),
            (
                ToolCallFormat::Hermes,
                "<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>",
                r#"{"a":1}"#,
            ),
            (
                ToolCallFormat::Mistral,
                "[TOOL_CALLS][{\"id\": \"x\", \"name\": \"add\"}]",
                "{}",
            ),
        ] {
            assert_eq!(parse_tool_calls(format, text).calls[0].arguments, args);
            let (seen, started, _) =
                stream(format, None, text, &(1..text.len()).collect::<Vec<_>>());
            assert_eq!(started, 1);
            assert_eq!(
                seen.calls,
                [("add".to_string(), vec![args.to_string()])],
                "{text}"
            );
        }
    }

    /// A call of a function not offered is not started, nor anything after it; a call that
    /// turns out malformed after it was started leaves the parse without calls.
    #[test]
    fn what_is_started_and_what_is_not() {
        let two = "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call><tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call><tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>";
        let (seen, started, end) = stream(ToolCallFormat::Hermes, Some(&["add"]), two, &[]);
        assert_eq!((started, seen.calls.len()), (1, 1));
        assert_eq!(end.calls.len(), 3, "the parse is the server's to judge");
        let (_, started, _) = stream(ToolCallFormat::Hermes, Some(&["rm"]), two, &[]);
        assert_eq!(started, 0);
        let broken = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}} trailing";
        let (seen, started, end) = stream(ToolCallFormat::Hermes, None, broken, &[30]);
        assert_eq!(started, 1);
        assert_eq!(seen.calls[0].1.concat(), r#"{"a":1}"#);
        assert!(end.calls.is_empty());
        assert_eq!(end.content, broken);
        // Qwen XML: the same; a parameter broken after the call started stops the reading,
        // and the parse has no calls.
        let xml = "<tool_call>\n<function=add>\n</function>\n</tool_call>\n<tool_call>\n<function=rm>\n</function>\n</tool_call>";
        let (seen, started, end) = stream(ToolCallFormat::QwenXml, Some(&["add"]), xml, &[]);
        assert_eq!((started, seen.calls.len(), end.calls.len()), (1, 1, 2));
        let broken = "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<oops>";
        let (seen, started, end) = stream(ToolCallFormat::QwenXml, None, broken, &[40]);
        assert_eq!(
            (started, seen.calls[0].1.concat().as_str()),
            (1, r#"{"a":1"#)
        );
        assert_eq!((end.calls.len(), end.content.as_str()), (0, broken));
        // A list item that is no object stops the reading before any call.
        let (_, started, _) = stream(
            ToolCallFormat::Mistral,
            None,
            "[TOOL_CALLS][1, {\"name\": \"add\", \"arguments\": {}}]",
            &[],
        );
        assert_eq!(started, 0);
    }
}
