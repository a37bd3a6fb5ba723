//! The tool-call parsers on arbitrary model output, in every format: parsing never panics;
//! whatever has no call is given back whole as content (the generic form's `{"response":
//! text}`: its text); every call has a name and arguments
//! that are a JSON object (checked by reading them again); streaming the same output cut at
//! arbitrary points gives the same calls, and, without calls, the same text in all; and arbitrary
//! tool lists are refused with a typed error or give schemas and grammars that read as JSON.
//!
//! Input: one byte choosing where the stream is cut (a step of 1 to 16 bytes), then the output
//! as text (lossy UTF-8). A second part after a NUL byte is read as a tool list.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rknn_llm::chat::{
    ToolCallFormat, ToolCallStream, ToolChoice, ToolConstraint, ToolStreamEvent, Tools,
    parse_tool_calls, tool_constraint,
};

const FORMATS: [ToolCallFormat; 7] = [
    ToolCallFormat::Hermes,
    ToolCallFormat::QwenXml,
    ToolCallFormat::Lfm2,
    ToolCallFormat::Llama3,
    ToolCallFormat::Mistral,
    ToolCallFormat::Phi4Mini,
    ToolCallFormat::Generic,
];

fuzz_target!(|data: &[u8]| {
    let [step, rest @ ..] = data else {
        return;
    };
    let step = usize::from(step % 16) + 1;
    let text = String::from_utf8_lossy(rest);
    let (output, tools) = text.split_once('\0').unwrap_or((&text, ""));
    for format in FORMATS {
        let whole = parse_tool_calls(format, output);
        if whole.calls.is_empty() {
            // The whole output, but for the generic form's `{"response": text}` (its text).
            let response = format == ToolCallFormat::Generic
                && output
                    .trim_start_matches([' ', '\t', '\n', '\r'])
                    .starts_with('{');
            if !response {
                assert_eq!(whole.content, output);
            }
        }
        for c in &whole.calls {
            assert!(!c.name.is_empty());
            assert!(c.arguments.starts_with('{') && c.arguments.ends_with('}'));
            // The arguments read again as the object they are.
            let again = parse_tool_calls(
                ToolCallFormat::Generic,
                &format!(
                    "{{\"tool_call\": {{\"name\": \"f\", \"arguments\": {}}}}}",
                    c.arguments
                ),
            );
            assert_eq!(again.calls.len(), 1, "{}", c.arguments);
            assert_eq!(again.calls[0].arguments, c.arguments);
        }
        let mut stream = ToolCallStream::new(format);
        let mut passed = String::new();
        // Each call's streamed name and argument pieces.
        let mut streamed: Vec<(String, String)> = Vec::new();
        let mut i = 0;
        while i < output.len() {
            let mut j = (i + step).min(output.len());
            while !output.is_char_boundary(j) {
                j += 1;
            }
            for e in stream.feed(&output[i..j]) {
                match e {
                    ToolStreamEvent::Text(t) => passed.push_str(&t),
                    ToolStreamEvent::CallStart { index, name } => {
                        assert_eq!(index, streamed.len());
                        streamed.push((name, String::new()));
                    }
                    ToolStreamEvent::CallArguments { index, fragment } => {
                        streamed[index].1.push_str(&fragment);
                    }
                }
            }
            i = j;
        }
        let end = stream.finish();
        assert_eq!(end.calls, whole.calls);
        // Well-formed calls stream as they parse; not always with a key written twice in a
        // call (the stream goes by the first, the parse by the last, as Python's json does):
        // compared when each call has one `"name"` and one arguments key (none escaped).
        if !whole.calls.is_empty() {
            assert!(streamed.len() <= whole.calls.len());
            let n = whole.calls.len();
            let keys =
                output.matches("\"arguments\"").count() + output.matches("\"parameters\"").count();
            if output.matches("\"name\"").count() == n && keys == n && !output.contains("\\u") {
                let parsed: Vec<(String, String)> = whole
                    .calls
                    .iter()
                    .map(|c| (c.name.clone(), c.arguments.clone()))
                    .collect();
                assert_eq!(streamed, parsed);
            }
        }
        if whole.calls.is_empty() {
            assert_eq!(passed + &end.content, whole.content);
        }
    }
    if let Ok(tools) = Tools::from_json(tools) {
        let first = tools.functions().first().map(|f| f.name.clone());
        for format in FORMATS {
            for choice in [
                ToolChoice::Auto,
                ToolChoice::Required,
                ToolChoice::Function(first.clone().unwrap_or_default()),
            ] {
                for parallel in [false, true] {
                    match tool_constraint(format, &tools, &choice, parallel) {
                        Some(ToolConstraint::JsonSchema(s)) => {
                            assert!(parse_tool_calls(ToolCallFormat::Generic, &s).content == s);
                        }
                        Some(ToolConstraint::Lark(g)) => assert!(g.starts_with("start: ")),
                        None => {}
                    }
                }
            }
        }
    }
});
