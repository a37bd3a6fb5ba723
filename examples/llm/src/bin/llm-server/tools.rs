//! Tool calling on the server: how a request's tools reach the template (its own `tools`, the
//! system message's `tools` for Phi-4-mini's, or the generic form for a template that renders
//! neither), the hook where `tool_choice`
//! `required` or a named function is to be constrained, and the calls read back from the
//! output into OpenAI's `tool_calls`.

use serde_json::{Value, json};

use rknn_llm::chat::{
    ChatOptions, ChatTemplate, Message, ParsedOutput, ToolCallFormat, ToolChoice, ToolConstraint,
    Tools, generic_messages, parse_tool_calls_for, phi4mini_messages, tool_constraint,
};

use crate::api::random_seed;
use crate::error::ApiError;
use crate::params::ToolRequest;

/// How to read a reply for calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// The form the model writes calls in.
    pub format: ToolCallFormat,
    /// The functions it may call: a call of another is not a call (its text is content).
    pub names: Vec<String>,
    /// The request's tools (Qwen XML's parameters are typed by their schemas).
    pub tools: Tools,
}

/// What to render and how to read the reply.
#[derive(Debug)]
pub struct ToolPlan {
    /// The conversation to render (in the generic form when the template takes no tools).
    pub messages: Vec<Message>,
    /// The template's options (`tools` among them).
    pub options: ChatOptions,
    /// How to read the reply for calls; `None`: the reply is text.
    pub output: Option<ToolOutput>,
    /// What the reply is constrained by ([`constraint_for`]).
    pub constraint: Option<ToolConstraint>,
}

/// What the reply must be constrained by for the request's `tool_choice`, in `format` (see
/// [`tool_constraint`]): a JSON Schema for the generic form (a call or a text reply under
/// `auto`, calls only under `required`, that function under a named one), a Lark grammar of
/// the model's own call format under `required` or a named function; `None` under `auto` with
/// a template that renders tools (the model chooses, its output is parsed, text that is not a
/// well-formed call is content) and under `none`.
pub fn constraint_for(
    format: ToolCallFormat,
    req: &ToolRequest,
) -> Result<Option<ToolConstraint>, ApiError> {
    Ok(tool_constraint(
        format,
        &req.tools,
        &req.choice,
        req.parallel,
    ))
}

/// Whether the conversation has calls or tool results in it.
fn has_tool_turns(messages: &[Message]) -> bool {
    messages
        .iter()
        .any(|m| !m.tool_calls.is_empty() || m.role == "tool")
}

/// The rendering of a chat request with its tools (rendering `template` once or twice, to tell
/// whether it renders tools, or a system message's, when there are tools or tool turns).
pub fn plan(
    template: &ChatTemplate,
    messages: Vec<Message>,
    req: Option<ToolRequest>,
) -> Result<ToolPlan, ApiError> {
    let mut options = ChatOptions::default();
    let active = req.filter(|r| r.choice != ToolChoice::None);
    if active.is_none() && !has_tool_turns(&messages) {
        return Ok(ToolPlan {
            messages,
            options,
            output: None,
            constraint: None,
        });
    }
    // A template that renders `tools` but whose call format we cannot tell (no known marker:
    // Granite's `<|tool_call|>` list) takes the generic form, so that the reply's
    // constraint and the instructions the model reads are the same.
    let native = template.renders_tools()
        && ToolCallFormat::detect(template.source()) != ToolCallFormat::Generic;
    // Phi-4-mini's template renders no `tools`, but a system message's.
    let phi4 = !native
        && ToolCallFormat::detect(template.source()) == ToolCallFormat::Phi4Mini
        && template.renders_system_tools();
    let Some(req) = active else {
        // Tool turns without tools to call (or under `none`): only the history is rendered.
        let messages = if native {
            messages
        } else if phi4 {
            let none = Tools::from_json("[]").map_err(|e| ApiError::internal(e.to_string()))?;
            phi4mini_messages(&messages, &none, &ToolChoice::None)
        } else {
            let none = Tools::from_json("[]").map_err(|e| ApiError::internal(e.to_string()))?;
            generic_messages(&messages, &none, &ToolChoice::None, true)
        };
        return Ok(ToolPlan {
            messages,
            options,
            output: None,
            constraint: None,
        });
    };
    let format = if native {
        ToolCallFormat::detect(template.source())
    } else if phi4 {
        ToolCallFormat::Phi4Mini
    } else {
        ToolCallFormat::Generic
    };
    let constraint = constraint_for(format, &req)?;
    let names = match &req.choice {
        ToolChoice::Function(name) => vec![name.clone()],
        _ => req
            .tools
            .functions()
            .iter()
            .map(|f| f.name.clone())
            .collect(),
    };
    let messages = if native {
        options.tools = Some(req.tools.clone());
        messages
    } else if phi4 {
        phi4mini_messages(&messages, &req.tools, &req.choice)
    } else {
        generic_messages(&messages, &req.tools, &req.choice, req.parallel)
    };
    Ok(ToolPlan {
        messages,
        options,
        output: Some(ToolOutput {
            format,
            names,
            tools: req.tools.clone(),
        }),
        constraint,
    })
}

/// A reply's content and calls, as OpenAI gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The text; `None` when the reply is only calls.
    pub content: Option<String>,
    /// The calls: `{"id", "type": "function", "function": {"name", "arguments"}}`.
    pub calls: Vec<Value>,
}

/// The answer of a parsed reply; `raw` is the text it was parsed from, the content when a call
/// names a function the request does not offer.
pub fn answer(output: &ToolOutput, parsed: ParsedOutput, raw: &str) -> Answer {
    if parsed.calls.is_empty() || parsed.calls.iter().any(|c| !output.names.contains(&c.name)) {
        let content = if parsed.calls.is_empty() {
            parsed.content
        } else {
            raw.to_string()
        };
        return Answer {
            content: Some(content),
            calls: Vec::new(),
        };
    }
    let calls = parsed
        .calls
        .into_iter()
        .map(|c| {
            json!({
                "id": call_id(output.format),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })
        })
        .collect();
    Answer {
        content: (!parsed.content.is_empty()).then_some(parsed.content),
        calls,
    }
}

/// The answer of a whole reply.
pub fn answer_text(output: &ToolOutput, text: &str) -> Answer {
    answer(
        output,
        parse_tool_calls_for(output.format, text, &output.tools),
        text,
    )
}

/// A fresh call id: `call_` and 24 letters or digits; 9 letters or digits for Mistral's format,
/// whose template takes no other.
pub fn call_id(format: ToolCallFormat) -> String {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let n = if format == ToolCallFormat::Mistral {
        9
    } else {
        24
    };
    let mut out = String::with_capacity(n + 5);
    if format != ToolCallFormat::Mistral {
        out.push_str("call_");
    }
    let mut bits = random_seed();
    for i in 0..n {
        if i % 10 == 9 {
            bits = random_seed();
        }
        out.push(char::from(ALNUM[(bits % 62) as usize]));
        bits /= 62;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rknn_llm::chat::ToolCall;

    fn req(choice: ToolChoice) -> ToolRequest {
        ToolRequest {
            tools: Tools::from_json(
                r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]"#,
            )
            .unwrap(),
            choice,
            parallel: true,
        }
    }

    #[test]
    fn required_and_named_choices_are_constrained() {
        for choice in [
            ToolChoice::Required,
            ToolChoice::Function("get_weather".into()),
        ] {
            assert!(matches!(
                constraint_for(ToolCallFormat::Hermes, &req(choice.clone())),
                Ok(Some(ToolConstraint::Lark(_)))
            ));
            assert!(matches!(
                constraint_for(ToolCallFormat::Generic, &req(choice)),
                Ok(Some(ToolConstraint::JsonSchema(_)))
            ));
        }
        assert_eq!(
            constraint_for(ToolCallFormat::Hermes, &req(ToolChoice::Auto)),
            Ok(None)
        );
        assert!(matches!(
            constraint_for(ToolCallFormat::Generic, &req(ToolChoice::Auto)),
            Ok(Some(ToolConstraint::JsonSchema(_)))
        ));
    }

    #[test]
    fn plans_for_native_and_generic_templates() {
        let native = ChatTemplate::new(
            "native",
            "{% if tools %}{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}{{ '<tool_call>' if false }}",
        )
        .unwrap();
        let plain = ChatTemplate::new(
            "plain",
            "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}",
        )
        .unwrap();
        let msgs = vec![Message::user("weather?")];
        let p = plan(&native, msgs.clone(), Some(req(ToolChoice::Auto))).unwrap();
        assert_eq!(p.messages, msgs);
        assert!(p.options.tools.is_some());
        assert_eq!(
            p.output,
            Some(ToolOutput {
                format: ToolCallFormat::Hermes,
                names: vec!["get_weather".into()],
                tools: req(ToolChoice::Auto).tools,
            })
        );
        assert_eq!(p.constraint, None, "auto on the model's own format");
        // Tools rendered, but in a form we cannot read (Granite's `<|tool_call|>` list): the
        // generic form, whose instructions match its constraint.
        let unknown = ChatTemplate::new(
            "unknown",
            "{% if tools %}{% for t in tools %}{{ t.function.name }};{% endfor %}Answer with <|tool_call|> and a list.{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}",
        )
        .unwrap();
        assert!(unknown.renders_tools());
        let p = plan(&unknown, msgs.clone(), Some(req(ToolChoice::Auto))).unwrap();
        assert!(p.options.tools.is_none());
        assert_eq!(p.messages[0].role, "system");
        assert_eq!(p.output.unwrap().format, ToolCallFormat::Generic);
        let p = plan(&plain, msgs.clone(), Some(req(ToolChoice::Auto))).unwrap();
        assert_eq!(p.messages.len(), 2);
        assert_eq!(p.messages[0].role, "system");
        assert!(p.options.tools.is_none());
        assert!(matches!(p.constraint, Some(ToolConstraint::JsonSchema(_))));
        assert_eq!(p.output.unwrap().format, ToolCallFormat::Generic);
        // `none`: no tools, no parsing; no tools and no tool turns: as before.
        let p = plan(&plain, msgs.clone(), Some(req(ToolChoice::None))).unwrap();
        assert_eq!((p.messages, p.output), (msgs.clone(), None));
        let p = plan(&plain, msgs.clone(), None).unwrap();
        assert_eq!((p.messages, p.output), (msgs, None));
        // Tool turns without tools, on a template that takes none: the generic history.
        let turns = vec![
            Message::user("weather?"),
            Message::assistant_calls("", vec![ToolCall::new("get_weather", "{}")]),
            Message::tool("call_1", "sunny"),
        ];
        let p = plan(&plain, turns, None).unwrap();
        assert_eq!(
            p.messages[1].content,
            r#"{"tool_calls":[{"name":"get_weather","arguments":{}}]}"#
        );
        assert_eq!(p.messages[2].role, "user");
    }

    /// Phi-4-mini's template renders a system message's tools: the plan puts them there, reads
    /// the reply in its format and constrains `required` with its grammar.
    #[test]
    fn a_plan_for_phi4_minis_template() {
        let phi4 = ChatTemplate::new(
            "phi4",
            "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}",
        )
        .unwrap();
        assert!(!phi4.renders_tools() && phi4.renders_system_tools());
        let msgs = vec![Message::user("weather?")];
        let p = plan(&phi4, msgs.clone(), Some(req(ToolChoice::Required))).unwrap();
        assert_eq!(
            p.output,
            Some(ToolOutput {
                format: ToolCallFormat::Phi4Mini,
                names: vec!["get_weather".into()],
                tools: req(ToolChoice::Auto).tools,
            })
        );
        assert!(p.options.tools.is_none());
        assert_eq!(p.messages.len(), 2);
        assert!(
            p.messages[0]
                .tools
                .as_deref()
                .is_some_and(|t| t.starts_with(r#"[{"name": "get_weather""#)),
            "{:?}",
            p.messages[0]
        );
        assert!(matches!(p.constraint, Some(ToolConstraint::Lark(_))));
        let text = phi4
            .render(&p.messages, true, &ChatOptions::default())
            .unwrap();
        assert!(text.starts_with("<|system|>"), "{text}");
        assert!(
            text.contains(r#"<|tool|>[{"name": "get_weather""#),
            "{text}"
        );
        let a = answer_text(
            p.output.as_ref().unwrap(),
            "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
        );
        assert_eq!(a.calls.len(), 1);
        // `none`: nothing added to the conversation.
        let p = plan(&phi4, msgs.clone(), Some(req(ToolChoice::None))).unwrap();
        assert_eq!((p.messages, p.output), (msgs, None));
    }

    /// Qwen XML's parameters are typed by the request's schemas: a string parameter stays a
    /// string even when its text is a number.
    #[test]
    fn qwen_xml_answers_are_typed_by_the_tools() {
        let out = ToolOutput {
            format: ToolCallFormat::QwenXml,
            names: vec!["get_weather".into()],
            tools: req(ToolChoice::Auto).tools,
        };
        let a = answer_text(
            &out,
            "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>",
        );
        assert_eq!(a.content.as_deref(), Some("Checking."));
        assert_eq!(
            a.calls[0]["function"],
            json!({"name": "get_weather", "arguments": "{\"city\":\"42\"}"})
        );
    }

    /// An LFM2.5-style template (its tools after `List of tools: [`): the tools go to the
    /// template, the reply is read as LFM2's calls, `required` has its grammar.
    #[test]
    fn a_plan_for_an_lfm2_template() {
        let lfm2 = ChatTemplate::new(
            "lfm2",
            "{% if tools %}List of tools: [{% for t in tools %}{{ t | tojson }}{% endfor %}]{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}",
        )
        .unwrap();
        let msgs = vec![Message::user("weather?")];
        let p = plan(&lfm2, msgs, Some(req(ToolChoice::Required))).unwrap();
        assert!(p.options.tools.is_some());
        let out = p.output.unwrap();
        assert_eq!(out.format, ToolCallFormat::Lfm2);
        assert!(matches!(p.constraint, Some(ToolConstraint::Lark(_))));
        let a = answer_text(&out, "[get_weather(city='Paris')]");
        assert_eq!(
            a.calls[0]["function"],
            json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
        );
    }

    #[test]
    fn answers_in_openais_shape() {
        let out = ToolOutput {
            format: ToolCallFormat::Hermes,
            names: vec!["get_weather".into()],
            tools: req(ToolChoice::Auto).tools,
        };
        let a = answer_text(
            &out,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        );
        assert_eq!(a.content, None);
        assert_eq!(a.calls.len(), 1);
        assert!(a.calls[0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(
            a.calls[0]["function"],
            json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
        );
        // A call of a function not offered, and a malformed call: the text is the content.
        for text in [
            "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\n</tool_call>",
        ] {
            assert_eq!(
                answer_text(&out, text),
                Answer {
                    content: Some(text.into()),
                    calls: vec![]
                }
            );
        }
        let id = call_id(ToolCallFormat::Mistral);
        assert!(
            id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()),
            "{id}"
        );
        assert_eq!(call_id(ToolCallFormat::Generic).len(), 29);
    }
}
