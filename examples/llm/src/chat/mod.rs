//! Chat prompts: the model's chat template (`tokenizer.chat_template`, a Jinja template)
//! rendered by [minijinja](https://docs.rs/minijinja) the way Hugging Face's
//! `apply_chat_template` renders it with Python's jinja2.
//!
//! The environment is transformers' `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` with `jinja2.ext.loopcontrols` (`{% break %}`, `{% continue %}`):
//!
//! * variables `messages` (a list of `{role, content}` maps, with `tool_calls`, `tool_call_id`, `tools`
//!   and `name` where a [`Message`] has them), `add_generation_prompt`, `tools`
//!   ([`ChatOptions::tools`]: OpenAI's list, as given) and `documents` (none), `bos_token` and `eos_token` (the texts of the vocabulary's
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
//! Templates come from model files, so they are untrusted: each rendering runs on one of a few
//! long-lived render workers with a large stack, under a fuel budget
//! ([`ChatTemplate::set_fuel`]: every instruction, byte and visited item costs fuel),
//! minijinja's recursion limit and a deadline ([`ChatTemplate::set_timeout`]); a worker that
//! overruns a deadline is retired and replaced, so it never holds up the renderings after it. A
//! template that loops too long, builds too much or recurses too deeply is a typed
//! [`ChatError`], never a hang, a panic or a stack overflow.
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
//!
//! Tool calling: [`Tools`] given to the template; the [`ToolCallFormat`] a model writes its
//! calls in, chosen from its template; [`parse_tool_calls`] and [`ToolCallStream`] reading them
//! back from its output; the generic form ([`generic_messages`]) for templates that do not
//! render tools; and what to constrain a reply with for a [`ToolChoice`]
//! ([`tool_constraint`]).
//!
//! Where things are: the template, its environment and its errors in `template.rs`; Python's
//! printing and string methods in `python.rs`; `tojson` (Python's `json.dumps`) in
//! `tojson.rs`; the calendar of `strftime_now` (C's `strftime`) in `datetime.rs`; the render
//! workers, and why they are so, in `worker.rs`; messages and their calls in `message.rs`; tools, call formats and parsers in `tools.rs`, the readers of the formats whose arguments are not written as JSON (Qwen XML, LFM2) in `markup_calls.rs`, the streaming reader of calls in `tool_stream.rs`,
//! on the small JSON reader of `json.rs`.

mod datetime;
mod json;
mod markup_calls;
mod message;
mod python;
mod template;
mod tojson;
mod tool_stream;
mod tools;
mod worker;

pub use datetime::DateTime;
pub use message::{Message, ToolCall};
pub use template::{ChatError, ChatOptions, ChatTemplate, GGUF_KEY, Kwarg, encode_prompt};
pub use tool_stream::{ToolCallStream, ToolStreamEvent};
pub use tools::{
    Function, PHI4MINI_SYSTEM, ParsedOutput, ToolCallFormat, ToolChoice, ToolConstraint, Tools,
    ToolsError, generic_messages, generic_reply_schema, parse_tool_calls, parse_tool_calls_for,
    phi4mini_messages, tool_constraint,
};
