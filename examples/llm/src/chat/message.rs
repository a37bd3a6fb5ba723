//! A conversation's messages and their tool calls, and how a template gets them.

use minijinja::value::Value;

use super::json::{self, Json};

/// One message of a conversation.
///
/// The template gets it as Hugging Face's `apply_chat_template` gets an OpenAI message: a map
/// of `role` and `content`, with `tool_calls` (a list of `{"id", "type": "function",
/// "function": {"name", "arguments"}}`) only when the message has calls, and `tool_call_id`
/// and `name` only when set, and `tools` (text) only when set. `content` is always text (an OpenAI client's `null` is empty
/// text: Qwen 3's template requires a string beside calls); each call's arguments are given
/// as the object they parse to (as HF's templates expect), or as the text when they are not a
/// JSON object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, or whatever else the template knows.
    pub role: String,
    /// The text.
    pub content: String,
    /// The calls of an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    /// The name of the tool a `tool` message comes from (or of the participant).
    pub name: Option<String>,
    /// A system message's tools, as JSON text, for a template that takes them there
    /// (Phi-4-mini's writes `message['tools']` between `<|tool|>` and `<|/tool|>`).
    pub tools: Option<String>,
}

/// A function call, in an assistant message or parsed from a model's output
/// ([`parse_tool_calls`](super::parse_tool_calls)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id (`call_...`), when it has one.
    pub id: Option<String>,
    /// The function's name.
    pub name: String,
    /// The arguments: JSON text (an object, as OpenAI gives it).
    pub arguments: String,
}

impl ToolCall {
    /// A call of `name` with `arguments` (JSON text), without id.
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> ToolCall {
        ToolCall {
            id: None,
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// The call as the template gets it (see [`Message`]).
    pub(super) fn to_value(&self) -> Value {
        let arguments = match json::parse(&self.arguments) {
            Ok(j @ Json::Obj(_)) => j.to_value(),
            _ => Value::from(self.arguments.as_str()),
        };
        let function = Value::from_pairs([
            ("name", Value::from(self.name.as_str())),
            ("arguments", arguments),
        ]);
        let mut pairs = Vec::with_capacity(3);
        if let Some(id) = &self.id {
            pairs.push(("id", Value::from(id.as_str())));
        }
        pairs.push(("type", Value::from("function")));
        pairs.push(("function", function));
        Value::from_pairs(pairs)
    }
}

impl Message {
    /// A message of `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            tools: None,
        }
    }

    /// An assistant message with calls (and text, often empty).
    pub fn assistant_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Message {
        Message {
            tool_calls: calls,
            ..Message::assistant(content)
        }
    }

    /// A `tool` message: the result of the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(tool_call_id.into()),
            ..Message::new("tool", content)
        }
    }

    /// The message as the template gets it (see [`Message`]).
    pub(super) fn to_value(&self) -> Value {
        let content = Value::from(self.content.as_str());
        let mut pairs = vec![
            ("role", Value::from(self.role.as_str())),
            ("content", content),
        ];
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self.tool_calls.iter().map(ToolCall::to_value).collect();
            pairs.push(("tool_calls", Value::from(calls)));
        }
        if let Some(id) = &self.tool_call_id {
            pairs.push(("tool_call_id", Value::from(id.as_str())));
        }
        if let Some(name) = &self.name {
            pairs.push(("name", Value::from(name.as_str())));
        }
        if let Some(tools) = &self.tools {
            pairs.push(("tools", Value::from(tools.as_str())));
        }
        Value::from_pairs(pairs)
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
