//! Chat templates rendered by minijinja against Python's jinja2 as Hugging Face's
//! `apply_chat_template` sets it up: every case of `tests/fixtures/chat/templates.json`
//! (written by `scripts/fixtures/gen_chat_template_fixtures.py`) must render byte for byte, or
//! fail with the same `raise_exception` message. The templates come from llama.cpp's
//! `models/templates` (extracted by `scripts/llama-cpp.sh --vocab-only`; not committed), the
//! demo model's GGUF, the tiny test model and the fixture itself.
//!
//! Also: typed errors (syntax, fuel, recursion), a session's multi-turn chat reusing the KV
//! cache of the turns before, and `llm-decode`'s `--chat-template-file`, `--reasoning` and the
//! plain-text fallback.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rknn_llm::chat::{
    ChatError, ChatOptions, ChatTemplate, DateTime, Message, ParsedOutput, ToolCall,
    ToolCallFormat, ToolChoice, ToolConstraint, ToolStreamEvent, Tools, encode_prompt,
    parse_tool_calls, parse_tool_calls_for, phi4mini_messages, tool_constraint,
};
use rknn_llm::constraint::{GrammarCompiler, GrammarSpec};
use rknn_llm::gguf::GgufFile;
use rknn_llm::sample::SamplerConfig;
use rknn_llm::session::{GenerateParams, Session};
use rknn_llm::tokenizer::Tokenizer;
use serde_json::Value as Json;

fn fixture() -> Json {
    let path = common::fixtures().join("chat/templates.json");
    serde_json::from_slice(&std::fs::read(&path).expect("read the chat fixture")).unwrap()
}

fn cache_dir() -> PathBuf {
    std::env::var_os("RKNPU_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rknpu-rs"),
        PathBuf::from,
    )
}

/// Where `scripts/llama-cpp.sh --vocab-only` puts llama.cpp's templates (or, after a full
/// build, the source tree's copy).
fn llama_cpp_templates() -> PathBuf {
    let extracted = cache_dir().join("llama.cpp/templates");
    let source = cache_dir().join("llama.cpp/src/models/templates");
    if !extracted.exists() && source.exists() {
        source
    } else {
        extracted
    }
}

fn fnv1a64(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn gguf_template(path: &Path) -> String {
    let file = GgufFile::open(path).unwrap();
    file.metadata()
        .get_str("tokenizer.chat_template")
        .expect("the model has a template")
        .to_string()
}

/// The template's source as the fixture names it, `None` (skipped) when its data is missing.
fn source(name: &str, t: &Json) -> Option<String> {
    let from = t["from"].as_str().unwrap();
    let src = if from == "inline" {
        t["source"].as_str().unwrap().to_string()
    } else if let Some(rel) = from.strip_prefix("gguf:") {
        let fetch = if rel.starts_with("models/") {
            "scripts/fetch-model.sh"
        } else {
            "scripts/fixtures/gen_tiny_models.py"
        };
        gguf_template(&common::require(common::workspace_root().join(rel), fetch)?)
    } else {
        let file = from.strip_prefix("llama.cpp:").unwrap();
        let path = common::require(
            llama_cpp_templates().join(file),
            "scripts/llama-cpp.sh --vocab-only",
        )?;
        std::fs::read_to_string(path).unwrap()
    };
    assert_eq!(
        fnv1a64(&src),
        t["fnv1a64"].as_str().unwrap(),
        "{name}: the template differs from the one the fixture was generated from"
    );
    Some(src)
}

fn pinned_now(doc: &Json) -> DateTime {
    let iso = doc["strftime_now"].as_str().unwrap();
    let n: Vec<i32> = iso
        .split(['-', 'T', ':'])
        .map(|p| p.parse().unwrap())
        .collect();
    DateTime::new(
        n[0], n[1] as u8, n[2] as u8, n[3] as u8, n[4] as u8, n[5] as u8,
    )
    .unwrap()
}

/// A call of the fixture (`{"id", "type", "function": {"name", "arguments": {...}}}`), its
/// arguments as OpenAI's JSON text.
fn tool_call(c: &Json) -> ToolCall {
    ToolCall {
        id: c["id"].as_str().map(str::to_string),
        name: c["function"]["name"].as_str().unwrap().to_string(),
        arguments: c["function"]["arguments"].to_string(),
    }
}

/// The case's messages; in Phi-4-mini's form (`phi4mini_messages`, with the case's tools) when
/// the fixture rendered them so.
fn messages(case: &Json) -> Vec<Message> {
    let msgs = plain_messages(case);
    if case["form"] == "phi4mini" {
        let tools = Tools::from_json(&case["tools"].to_string()).unwrap();
        return phi4mini_messages(&msgs, &tools, &ToolChoice::Auto);
    }
    msgs
}

fn plain_messages(case: &Json) -> Vec<Message> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut msg = Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap());
            if let Some(calls) = m.get("tool_calls") {
                msg.tool_calls = calls.as_array().unwrap().iter().map(tool_call).collect();
            }
            msg.tool_call_id = m
                .get("tool_call_id")
                .map(|v| v.as_str().unwrap().to_string());
            msg.name = m.get("name").map(|v| v.as_str().unwrap().to_string());
            msg
        })
        .collect()
}

fn options(case: &Json, now: DateTime) -> ChatOptions {
    ChatOptions {
        enable_thinking: case["kwargs"]
            .get("enable_thinking")
            .map(|v| v.as_bool().unwrap()),
        now: Some(now),
        // Phi-4-mini's form carries the tools in its system message.
        tools: case
            .get("tools")
            .filter(|_| case["form"] != "phi4mini")
            .map(|t| Tools::from_json(&t.to_string()).unwrap()),
        ..ChatOptions::default()
    }
}

fn compile(name: &str, t: &Json, src: String) -> ChatTemplate {
    let tok = |k: &str| t[k].as_str();
    ChatTemplate::new(name, src)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_special_tokens(tok("bos_token"), tok("eos_token"))
}

/// Every fixture case renders as jinja2 rendered it, or raises what it raised.
#[test]
fn every_case_matches_python_jinja2() {
    let doc = fixture();
    let now = pinned_now(&doc);
    let cases = doc["cases"].as_array().unwrap();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, t) in doc["templates"].as_object().unwrap() {
        let Some(src) = source(name, t) else {
            continue;
        };
        let template = compile(name, t, src);
        for case in cases.iter().filter(|c| c["template"] == name.as_str()) {
            let got = template.render(
                &messages(case),
                case["add_generation_prompt"].as_bool().unwrap(),
                &options(case, now),
            );
            let what = format!(
                "{name} / {} / add_generation_prompt={} / {}",
                case["conversation"], case["add_generation_prompt"], case["kwargs"]
            );
            match (&got, case.get("expected"), case.get("error")) {
                (Ok(text), Some(want), None) if text == want.as_str().unwrap() => {}
                (Err(ChatError::Raised { name: n, message }), None, Some(want))
                    if n == name && message == want.as_str().unwrap() => {}
                _ => failures.push(format!(
                    "{what}:\n  got  {got:?}\n  want {:?}",
                    case.get("expected").or(case.get("error")).unwrap()
                )),
            }
            checked += 1;
        }
    }
    eprintln!("{checked} chat template cases checked");
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert!(checked > 0);
}

/// The fixture covers what the task is about: the templates, the conversations, both
/// generation-prompt settings, Qwen3's enable_thinking both ways, and Gemma 2's refusal of a
/// system message.
#[test]
fn the_fixture_covers_the_templates_and_conversations() {
    let doc = fixture();
    let cases = doc["cases"].as_array().unwrap();
    for name in [
        "SmolLM2-135M-Instruct",
        "Qwen-Qwen2.5-7B-Instruct",
        "Qwen-Qwen3-0.6B",
        "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct",
        "microsoft-Phi-3.5-mini-instruct",
        "google-gemma-2-2b-it",
        "HuggingFaceTB-SmolLM3-3B",
        "ibm-granite-granite-3.3-2B-Instruct",
    ] {
        let of: Vec<&Json> = cases.iter().filter(|c| c["template"] == name).collect();
        for conv in ["single", "single_system", "multi", "multi_system", "tricky"] {
            for agp in [true, false] {
                assert!(
                    of.iter()
                        .any(|c| c["conversation"] == conv && c["add_generation_prompt"] == agp),
                    "{name} lacks {conv} with add_generation_prompt={agp}"
                );
            }
        }
    }
    for thinking in [true, false] {
        assert!(cases.iter().any(|c| c["template"] == "Qwen-Qwen3-0.6B"
            && c["kwargs"]["enable_thinking"] == thinking
            && c.get("expected").is_some()));
    }
    assert!(cases.iter().any(|c| c["template"] == "google-gemma-2-2b-it"
        && c["conversation"] == "single_system"
        && c["error"] == "System role not supported"));
}

/// The tool-calling templates render tools, tool calls and tool results as jinja2 does (in
/// `every_case_matches_python_jinja2`); here, the fixture has them.
#[test]
fn the_fixture_covers_tool_calling() {
    let doc = fixture();
    let cases = doc["cases"].as_array().unwrap();
    for name in [
        "Qwen-Qwen2.5-7B-Instruct",
        "Qwen-Qwen3-0.6B",
        "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct",
        "HuggingFaceTB-SmolLM3-3B",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        "mistralai-Mistral-Nemo-Instruct-2407",
        "Qwen3.5-4B",
        "Qwen3-Coder",
        "LFM2.5-Instruct",
        "LFM2-8B-A1B",
        "LFM2.5-8B-A1B",
    ] {
        for conv in [
            "tools_request",
            "tools_result",
            "tools_answered",
            "tools_parallel",
        ] {
            assert!(
                cases.iter().any(|c| c["template"] == name
                    && c["conversation"] == conv
                    && c["tools"].is_array()),
                "{name} lacks {conv}"
            );
        }
    }
    // Phi-4-mini's, in its form (the tools in the system message).
    for conv in [
        "tools_request",
        "tools_request_system",
        "tools_result",
        "tools_answered",
        "tools_parallel",
    ] {
        assert!(
            cases
                .iter()
                .any(|c| c["template"] == "microsoft-Phi-4-mini-instruct"
                    && c["conversation"] == conv
                    && c["form"] == "phi4mini"
                    && c["expected"]
                        .as_str()
                        .is_some_and(|e| e.contains("<|tool|>[{"))),
            "Phi-4-mini lacks {conv}"
        );
    }
    // Llama 3.x refuses two calls in one message, in its own words.
    assert!(
        cases
            .iter()
            .any(|c| c["template"] == "meta-llama-Llama-3.1-8B-Instruct"
                && c["conversation"] == "tools_parallel"
                && c["error"] == "This model only supports single tool-calls at once!")
    );
}

/// The format chosen for each template, and the parsers on what the template itself renders
/// for an assistant message with calls (jinja2's rendering, in the fixture): the calls come
/// back, names, arguments (as JSON values) and Mistral's ids.
#[test]
fn calls_rendered_by_each_template_parse_back() {
    let doc = fixture();
    let want_format = |name: &str| match name {
        "Qwen-Qwen2.5-7B-Instruct"
        | "Qwen-Qwen3-0.6B"
        | "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"
        | "NousResearch-Hermes-3-Llama-3.1-8B-tool_use" => ToolCallFormat::Hermes,
        "meta-llama-Llama-3.1-8B-Instruct" | "meta-llama-Llama-3.2-3B-Instruct" => {
            ToolCallFormat::Llama3
        }
        "mistralai-Mistral-Nemo-Instruct-2407" => ToolCallFormat::Mistral,
        "microsoft-Phi-4-mini-instruct" => ToolCallFormat::Phi4Mini,
        "Qwen3.5-4B" | "Qwen3-Coder" => ToolCallFormat::QwenXml,
        "LFM2.5-Instruct" | "LFM2-8B-A1B" | "LFM2.5-8B-A1B" => ToolCallFormat::Lfm2,
        _ => ToolCallFormat::Generic,
    };
    let mut checked = 0;
    let mut per_format = std::collections::BTreeMap::<String, usize>::new();
    let mut templates = 0;
    for (name, t) in doc["templates"].as_object().unwrap() {
        let Some(src) = source(name, t) else {
            continue;
        };
        let template = compile(name, t, src);
        // As the server chooses (its tools::plan).
        let format = if template.renders_tools() {
            ToolCallFormat::detect(template.source())
        } else if ToolCallFormat::detect(template.source()) == ToolCallFormat::Phi4Mini
            && template.renders_system_tools()
        {
            ToolCallFormat::Phi4Mini
        } else {
            ToolCallFormat::Generic
        };
        assert_eq!(format, want_format(name), "{name}");
        templates += 1;
        for r in doc["tool_call_renderings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["template"] == name.as_str())
        {
            let Some(text) = r["text"].as_str() else {
                continue; // a template that refuses these calls (Llama 3.x: two at once)
            };
            if format == ToolCallFormat::Generic {
                assert_eq!(
                    text, "",
                    "{name}: a template without tools renders no calls"
                );
                continue;
            }
            // Typed by the tools the template was given (Qwen XML's parameters).
            let parsed = match r.get("tools") {
                Some(tools) => parse_tool_calls_for(
                    format,
                    text,
                    &Tools::from_json(&tools.to_string()).unwrap(),
                ),
                None => parse_tool_calls(format, text),
            };
            let expected = r["expected"].as_array().unwrap();
            assert_eq!(
                parsed.calls.len(),
                expected.len(),
                "{name}: {text:?} -> {parsed:?}"
            );
            for (got, want) in parsed.calls.iter().zip(expected) {
                assert_eq!(got.name, want["name"].as_str().unwrap(), "{name}");
                let args: Json = serde_json::from_str(&got.arguments).unwrap();
                assert_eq!(args, want["arguments"], "{name}");
                if format == ToolCallFormat::Mistral {
                    assert_eq!(got.id.as_deref(), want["id"].as_str(), "{name}");
                }
            }
            // Qwen 3 writes an empty reasoning block before the calls (Qwen3.5 its end, after
            // the `<think>` of the generation prompt): it stays as content.
            assert!(
                ["", "<think>\n\n</think>", "</think>"].contains(&parsed.content.trim()),
                "{name}: {:?}",
                parsed.content
            );
            // Streamed a character at a time, the calls are the same.
            let mut stream = rknn_llm::chat::ToolCallStream::new(format);
            if let Some(tools) = r.get("tools") {
                stream = stream.with_tools(Tools::from_json(&tools.to_string()).unwrap());
            }
            let mut streamed: Vec<(String, String)> = Vec::new();
            for c in text.chars() {
                for e in stream.feed(c.encode_utf8(&mut [0; 4])) {
                    match e {
                        ToolStreamEvent::CallStart { name, .. } => {
                            streamed.push((name, String::new()))
                        }
                        ToolStreamEvent::CallArguments { index, fragment } => {
                            streamed[index].1.push_str(&fragment)
                        }
                        ToolStreamEvent::Text(_) => {}
                    }
                }
            }
            let end = stream.finish();
            assert_eq!(end.calls, parsed.calls, "{name}");
            assert!(
                streamed
                    .iter()
                    .map(|(n, a)| (n.as_str(), a.as_str()))
                    .eq(parsed
                        .calls
                        .iter()
                        .map(|c| (c.name.as_str(), c.arguments.as_str()))),
                "{name}: streamed {streamed:?}"
            );
            checked += 1;
            *per_format.entry(format!("{format:?}")).or_default() += 1;
        }
    }
    eprintln!("{checked} tool-call renderings parsed back, {templates} templates: {per_format:?}");
    assert!(templates == 0 || checked >= 10, "{checked}");
    if templates > 0 {
        assert!(
            per_format.get("QwenXml").is_some_and(|&n| n >= 8),
            "{per_format:?}"
        );
        assert!(
            per_format.get("Lfm2").is_some_and(|&n| n >= 4),
            "{per_format:?}"
        );
    }
}

/// The grammar of `tool_choice: required` (parallel calls) in Qwen XML accepts what Qwen3.5's
/// and Qwen3-Coder's templates write for calls (the fixture's renderings with their tools),
/// once their Python `True` / `False` / `None` are JSON's, as llama.cpp's grammar writes them;
/// in LFM2's form, what LFM2.5-8B-A1B's template writes without its markers (special tokens)
/// and with its Python literals written as JSON (`'x'` as `"x"`, `True` as `true`, ...), as
/// the grammar writes them; a named function's grammar refuses another function's call, and a
/// cut call is refused.
#[test]
fn the_call_grammars_take_what_the_templates_write() {
    let doc = fixture();
    let tok = Arc::new(Tokenizer::from_gguf(&GgufFile::open(tiny_qwen2()).unwrap()).unwrap());
    let compiler = GrammarCompiler::new(&tok).unwrap();
    let mut checked = 0;
    for r in doc["tool_call_renderings"].as_array().unwrap() {
        let format = match r["template"].as_str() {
            Some("Qwen3.5-4B" | "Qwen3-Coder") => ToolCallFormat::QwenXml,
            Some("LFM2.5-8B-A1B") => ToolCallFormat::Lfm2,
            _ => continue,
        };
        let tools = Tools::from_json(&r["tools"].to_string()).unwrap();
        let text = r["text"].as_str().unwrap();
        let calls = if format == ToolCallFormat::QwenXml {
            text[text.find("<tool_call>").unwrap()..]
                .replace("\nTrue\n", "\ntrue\n")
                .replace("\nFalse\n", "\nfalse\n")
                .replace("\nNone\n", "\nnull\n")
        } else {
            // The list alone, each argument as the JSON it stands for (the parse's).
            let parsed = parse_tool_calls(format, text);
            let list: Vec<String> = parsed
                .calls
                .iter()
                .map(|c| {
                    let args: serde_json::Map<String, Json> =
                        serde_json::from_str(&c.arguments).unwrap();
                    let args: Vec<String> = args
                        .iter()
                        .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap()))
                        .collect();
                    format!("{}({})", c.name, args.join(", "))
                })
                .collect();
            format!("[{}]", list.join(", "))
        };
        let grammar = |choice: ToolChoice, parallel: bool| {
            let Some(ToolConstraint::Lark(g)) = tool_constraint(format, &tools, &choice, parallel)
            else {
                panic!("no grammar")
            };
            compiler
                .compile(&GrammarSpec::Lark(g.clone()))
                .unwrap_or_else(|e| panic!("{e}\n{g}"))
        };
        let required = grammar(ToolChoice::Required, true);
        assert!(required.accepts(&tok, &calls).unwrap(), "{calls}");
        assert!(!required.accepts(&tok, &calls[..calls.len() - 3]).unwrap());
        let first = r["expected"][0]["name"].as_str().unwrap();
        let single = grammar(ToolChoice::Function(first.into()), false);
        let one_call = r["expected"].as_array().unwrap().len() == 1;
        assert_eq!(single.accepts(&tok, &calls).unwrap(), one_call, "{calls}");
        let other = if first == "add" { "get_weather" } else { "add" };
        let wrong = grammar(ToolChoice::Function(other.into()), true);
        assert!(!wrong.accepts(&tok, &calls).unwrap(), "{calls}");
        checked += 1;
    }
    eprintln!("{checked} renderings taken by the grammars");
    assert!(checked == 0 || checked >= 12, "{checked}");
}

/// What our parser gives for a case where it knowingly differs from llama.cpp.
#[derive(Debug)]
enum Ours {
    /// No call: the whole output is the content.
    Text,
    /// Calls of these functions (llama.cpp finds none, or throws).
    Calls(&'static [&'static str]),
    /// llama.cpp's calls, and this content.
    Content(&'static str),
}

/// The cases (format, case) where our parser and llama.cpp's knowingly disagree, what we give
/// instead and why. Each must still disagree (a stale entry fails the test).
const KNOWN_DIFFERENCES: &[(&str, &str, Ours, &str)] = &[
    (
        "hermes",
        "cut_json",
        Ours::Text,
        "llama.cpp's lenient final parse returns a call whose arguments are the cut, invalid \
         JSON text; a cut call is not a call (no client can run it), it stays text",
    ),
    (
        "llama3",
        "cut_json",
        Ours::Text,
        "as for hermes: llama.cpp returns the cut arguments, not JSON",
    ),
    (
        "mistral",
        "cut_json",
        Ours::Text,
        "as for hermes: llama.cpp returns the cut arguments, not JSON",
    ),
    (
        "hermes",
        "compact_no_newlines",
        Ours::Calls(&["add"]),
        "llama.cpp's parser wants the newlines the template writes around the JSON \
         (`<tool_call>\\n{...}\\n</tool_call>`) and reads `<tool_call>{...}</tool_call>` as \
         text; the markers and a well-formed call are there, we take it (JSON's whitespace \
         is skipped)",
    ),
    (
        "hermes",
        "unknown_function",
        Ours::Calls(&["send_email"]),
        "the parser does not know the request's tools; llm-server's `answer` turns a call of \
         a function the request does not offer into text, where llama.cpp's parser (built \
         from the tools) throws and llama-server fails the request",
    ),
    (
        "llama3",
        "unknown_function",
        Ours::Calls(&["send_email"]),
        "as for hermes: llm-server drops it to text, llama.cpp throws",
    ),
    (
        "mistral",
        "unknown_function",
        Ours::Calls(&["send_email"]),
        "as for hermes: llm-server drops it to text, llama.cpp throws",
    ),
    (
        "llama3",
        "python_tag",
        Ours::Content(""),
        "llama.cpp leaves the `<|python_tag|>` marker in the content; it is the call's \
         marker, not text for the user",
    ),
    (
        "llama3",
        "python_tag_nested",
        Ours::Content(""),
        "as python_tag: llama.cpp leaves the marker in the content",
    ),
    (
        "llama3",
        "text_before_call",
        Ours::Text,
        "Llama 3.x's template asks for the JSON alone as the reply; a call after prose is \
         not taken (JSON at the end of a text answer may be an example), and the stream \
         reader holds back only a reply that begins as a call, so parsing more here would \
         make the streamed and whole readings differ; llama.cpp takes the prose as content",
    ),
    (
        "llama3",
        "arguments_key",
        Ours::Calls(&["get_weather"]),
        "`arguments` for `parameters`, as small Llama 3.2 models write it, is a well-formed \
         call; llama.cpp accepts only `parameters` and throws",
    ),
    (
        "qwen_xml",
        "python_true",
        Ours::Calls(&["create_event"]),
        "a boolean parameter written `True`, as Qwen3.5's and Qwen3-Coder's templates write \
         `true` (Python's `str`), is taken for `true`; llama.cpp wants JSON there and drops the \
         reply",
    ),
    (
        "qwen_xml",
        "cut_call",
        Ours::Text,
        "as for hermes: llama.cpp returns the cut arguments, not JSON",
    ),
    (
        "qwen_xml",
        "no_closing_tag",
        Ours::Calls(&["get_weather"]),
        "a call whole up to `</function>` with only `</tool_call>` missing is a call, as for \
         Hermes; llama.cpp returns its arguments without the closing `}`, not JSON",
    ),
    (
        "qwen_xml",
        "missing_required",
        Ours::Calls(&["get_weather"]),
        "the readers do not check a call against its schema (no format's does; `required` \
         and a named function are constrained by the schema); llama.cpp's parser is built from \
         the schemas and drops the reply",
    ),
    (
        "qwen_xml",
        "unknown_function",
        Ours::Calls(&["send_email"]),
        "as for hermes: llm-server drops it to text, llama.cpp drops the reply",
    ),
    (
        "qwen_xml",
        "bad_number",
        Ours::Text,
        "a number parameter that is not JSON makes the call malformed in both; llama.cpp \
         returns an empty message, here the text is the content",
    ),
    (
        "lfm2",
        "empty_arguments",
        Ours::Calls(&["get_weather"]),
        "`name()` is a well-formed call; llama.cpp's grammar wants an argument when the \
         function has parameters, and throws",
    ),
    (
        "lfm2",
        "cut_call",
        Ours::Text,
        "as for hermes: llama.cpp returns the cut arguments, not JSON",
    ),
    (
        "lfm2",
        "list_alone",
        Ours::Calls(&["get_weather"]),
        "the markers are special tokens that a constrained reply cannot write (as for \
         Phi-4-mini), so a reply that begins with the list is read as calls",
    ),
    (
        "lfm2",
        "unknown_function",
        Ours::Calls(&["send_email"]),
        "as for hermes: llm-server drops it to text, llama.cpp throws",
    ),
    (
        "lfm2",
        "two_calls_template_without_calls",
        Ours::Calls(&["get_weather", "add"]),
        "LFM2-8B-A1B's template renders no calls, which llama.cpp takes for a model without \
         parallel calls; the reader takes what the model wrote",
    ),
    (
        "mistral",
        "no_id",
        Ours::Calls(&["get_weather"]),
        "a call without Mistral's 9-character `id` is still a call (llm-server gives it an \
         id); llama.cpp's parser requires the id and throws",
    ),
];

/// Where our reading of a case differs from llama.cpp's, why; `None` when they agree.
///
/// Agreement: llama.cpp's parse threw (llama-server fails such a request) or found no call,
/// and we find no call either; or the same number of calls, with the same names, arguments
/// equal as JSON values and the same ids (llama.cpp's `""` is our `None`), and the same
/// content after trimming whitespace. Our parsers have no reasoning channel: a `<think>`
/// block stays in the content, where llama.cpp (reasoning format `deepseek`, llama-server's
/// default) moves it to `reasoning_content`; so when llama.cpp has reasoning, or our content
/// begins with `<think>`, our content must be that block around llama.cpp's reasoning, then
/// llama.cpp's content, each part compared after trimming.
fn disagreement(ours: &ParsedOutput, theirs: &Json) -> Option<String> {
    let Some(calls) = theirs.get("tool_calls") else {
        return (!ours.calls.is_empty()).then(|| "llama.cpp threw, we found calls".to_string());
    };
    let calls = calls.as_array().unwrap();
    if calls.len() != ours.calls.len() {
        return Some(format!(
            "{} calls, llama.cpp {}",
            ours.calls.len(),
            calls.len()
        ));
    }
    for (i, (got, want)) in ours.calls.iter().zip(calls).enumerate() {
        if got.name != want["name"].as_str().unwrap() {
            return Some(format!(
                "call {i}: name {:?}, llama.cpp {}",
                got.name, want["name"]
            ));
        }
        let args: Result<Json, _> = serde_json::from_str(&got.arguments);
        let their_args: Result<Json, _> = serde_json::from_str(want["arguments"].as_str().unwrap());
        match (args, their_args) {
            (Ok(a), Ok(b)) if a == b => {}
            _ => {
                return Some(format!(
                    "call {i}: arguments {:?}, llama.cpp {}",
                    got.arguments, want["arguments"]
                ));
            }
        }
        let their_id = want["id"].as_str().unwrap();
        if got.id.as_deref().unwrap_or("") != their_id {
            return Some(format!("call {i}: id {:?}, llama.cpp {their_id:?}", got.id));
        }
    }
    let content = theirs["content"].as_str().unwrap().trim();
    let reasoning = theirs["reasoning_content"].as_str().unwrap().trim();
    let ok = if !reasoning.is_empty() || ours.content.starts_with("<think>") {
        // The `<think>` may be the prompt's (Qwen3.5's generation prompt opens the block), and
        // the calls may end the reasoning without `</think>`.
        let body = ours
            .content
            .strip_prefix("<think>")
            .unwrap_or(&ours.content);
        match body.split_once("</think>") {
            Some((think, rest)) => think.trim() == reasoning && rest.trim() == content,
            None => body.trim() == reasoning && content.is_empty(),
        }
    } else {
        ours.content.trim() == content
    };
    (!ok).then(|| {
        format!(
            "content {:?}, llama.cpp content {content:?} reasoning {reasoning:?}",
            ours.content
        )
    })
}

/// Our parsers against llama.cpp's own (`common_chat_parse` after `common_chat_templates_apply`
/// with tools, as llama-server reads a reply) on the same model outputs, per template of the
/// formats we read: `tests/fixtures/chat/tool_parse_llama_cpp.json`, written by
/// `scripts/fixtures/gen_tool_parse_fixtures.py` (`scripts/fixtures/chat_parse_ref.cpp`).
/// Every case must agree (see [`disagreement`]) except the ones in [`KNOWN_DIFFERENCES`],
/// which must give what the list says. The fixture names our format for each template, so
/// the comparison needs no template; where llama.cpp's templates are in the cache, the
/// template's hash and the format [`ToolCallFormat::detect`] picks are checked too.
#[test]
fn tool_calls_are_parsed_as_llama_cpp_parses_them() {
    let path = common::fixtures().join("chat/tool_parse_llama_cpp.json");
    let doc: Json = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let format_of = |name: &str| match doc["templates"][name]["format"].as_str().unwrap() {
        "hermes" => ToolCallFormat::Hermes,
        "llama3" => ToolCallFormat::Llama3,
        "mistral" => ToolCallFormat::Mistral,
        "qwen_xml" => ToolCallFormat::QwenXml,
        "lfm2" => ToolCallFormat::Lfm2,
        f => panic!("{name}: unknown format {f}"),
    };
    let tools = Tools::from_json(&doc["tools"].to_string()).unwrap();
    for (name, t) in doc["templates"].as_object().unwrap() {
        if let Some(src) = source(name, t) {
            assert_eq!(ToolCallFormat::detect(&src), format_of(name), "{name}");
        }
    }
    let mut failures = Vec::new();
    let mut per_format = std::collections::BTreeMap::<&str, usize>::new();
    let mut known_seen = std::collections::HashSet::new();
    for case in doc["cases"].as_array().unwrap() {
        let template = case["template"].as_str().unwrap();
        let name = case["case"].as_str().unwrap();
        let fmt = doc["templates"][template]["format"].as_str().unwrap();
        *per_format.entry(fmt).or_default() += 1;
        let output = case["output"].as_str().unwrap();
        let ours = parse_tool_calls_for(format_of(template), output, &tools);
        let differs = disagreement(&ours, &case["llama_cpp"]);
        let what = format!(
            "{template} / {name}: {output:?}\n  ours {ours:?}\n  llama.cpp {}",
            case["llama_cpp"]
        );
        match KNOWN_DIFFERENCES
            .iter()
            .position(|k| k.0 == fmt && k.1 == name)
        {
            None => {
                if let Some(d) = differs {
                    failures.push(format!("{what}\n  {d}"));
                }
            }
            Some(k) => {
                known_seen.insert(k);
                let expected = match &KNOWN_DIFFERENCES[k].2 {
                    Ours::Text => ours.calls.is_empty() && ours.content == output,
                    Ours::Calls(names) => {
                        ours.calls
                            .iter()
                            .map(|c| c.name.as_str())
                            .eq(names.iter().copied())
                            && ours
                                .calls
                                .iter()
                                .all(|c| serde_json::from_str::<Json>(&c.arguments).is_ok())
                    }
                    Ours::Content(content) => {
                        // The calls agree, the content is ours.
                        let theirs = ParsedOutput {
                            content: case["llama_cpp"]["content"].as_str().unwrap().to_string(),
                            calls: ours.calls.clone(),
                        };
                        ours.content == *content
                            && disagreement(&theirs, &case["llama_cpp"]).is_none()
                    }
                };
                if differs.is_none() {
                    failures.push(format!(
                        "{what}\n  agrees now: drop it from KNOWN_DIFFERENCES"
                    ));
                } else if !expected {
                    failures.push(format!(
                        "{what}\n  expected {:?} (a known difference)",
                        KNOWN_DIFFERENCES[k].2
                    ));
                }
            }
        }
    }
    for (k, (fmt, name, _, _)) in KNOWN_DIFFERENCES.iter().enumerate() {
        assert!(
            known_seen.contains(&k),
            "KNOWN_DIFFERENCES: no case {fmt} / {name}"
        );
    }
    eprintln!("tool-call outputs compared with llama.cpp: {per_format:?}");
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
    assert!(per_format.values().all(|&n| n >= 8), "{per_format:?}");
}

#[test]
fn a_malformed_template_is_a_compile_error_naming_it() {
    let e = ChatTemplate::new(
        "broken.jinja",
        "Hello\n{% for m in messages %}\n{{ m.content ",
    )
    .unwrap_err();
    match &e {
        ChatError::Compile { name, message } => {
            assert_eq!(name, "broken.jinja");
            assert!(message.contains("syntax error"), "{message}");
            assert!(message.contains("broken.jinja:3"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("broken.jinja"), "{e}");
    assert_eq!(e.to_string().lines().count(), 1);
    // An error at render time names it too, with the line.
    let t = ChatTemplate::new(
        "undefined.jinja",
        "a\n{{ messages[0].content.nope.deeper }}",
    )
    .unwrap();
    match t.render(&[Message::user("x")], false, &ChatOptions::default()) {
        Err(ChatError::Render { name, message }) => {
            assert_eq!(name, "undefined.jinja");
            assert!(message.contains("undefined.jinja:2"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// Loops that would run for hours, and recursion that would overflow the stack, stop quickly
/// with typed errors.
#[test]
fn runaway_templates_are_stopped_quickly() {
    let user = [Message::user("hi")];
    let opts = ChatOptions::default();
    let huge_loop =
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}";
    let quiet_loop = "{% for m in messages %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endfor %}";
    let growing = "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}";
    let recursion = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let nested = "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}";
    let shared = "{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}{{ ns.x | tojson }}";
    for (name, src) in [
        ("huge-loop", huge_loop),
        ("quiet-loop", quiet_loop),
        ("growing", growing),
        ("recursion", recursion),
        ("nested", nested),
        ("shared", shared),
    ] {
        let t = ChatTemplate::new(name, src).unwrap();
        let t0 = Instant::now();
        let e = t.render(&user, true, &opts).unwrap_err();
        let took = t0.elapsed();
        match (&e, name) {
            (ChatError::TooDeep { name: n, .. }, "recursion") => assert_eq!(n, name),
            (ChatError::OutOfFuel { name: n, fuel }, _) if name != "recursion" => {
                assert_eq!(n, name);
                assert_eq!(*fuel, ChatTemplate::DEFAULT_FUEL);
            }
            // Printing a value nested deeper than the printer follows.
            (ChatError::Render { message, .. }, "nested") => {
                assert!(message.contains("nested too deeply"), "{message}")
            }
            _ => panic!("{name}: {e:?}"),
        }
        assert!(took < Duration::from_secs(3), "{name} took {took:?}");
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
    }
    // A smaller budget stops the same loop sooner.
    let mut t = ChatTemplate::new("huge-loop", huge_loop).unwrap();
    t.set_fuel(10_000);
    assert!(matches!(
        t.render(&user, true, &opts),
        Err(ChatError::OutOfFuel { fuel: 10_000, .. })
    ));
}

fn tiny_qwen2() -> PathBuf {
    common::fixtures().join("llm/tiny-qwen2.gguf")
}

fn tiny_session(path: &Path) -> (Session, ChatTemplate) {
    let run = common::load_f32(path, 1);
    let file = GgufFile::open(path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
    let template = ChatTemplate::from_gguf(&file, &tok).unwrap().unwrap();
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    (Session::new(run.model, tok, greedy).unwrap(), template)
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// What a fresh session generates after `ids` (the reference for a turn that reused a cache).
fn fresh_generation(path: &Path, ids: &[u32], params: &GenerateParams) -> Vec<u32> {
    let (mut s, _) = tiny_session(path);
    s.generate_tokens(ids, params)
        .unwrap()
        .finish()
        .unwrap()
        .generated
}

/// Turn 2 renders the whole conversation (turn 1's reply included as generated), keeps the
/// cache of what turn 1 evaluated and evaluates only the rest; it generates what a fresh
/// session generates after the same prompt.
#[test]
fn a_second_turn_reuses_the_first_turns_cache() {
    let path = tiny_qwen2();
    let (mut session, template) = tiny_session(&path);
    let params = GenerateParams {
        max_tokens: Some(6),
        ..GenerateParams::default()
    };
    let opts = ChatOptions::default();
    let system = "You are a helpful assistant.";
    let tok = session.tokenizer().clone();

    let first = session
        .chat(&template, Some(system), "Hello there", &opts, &params)
        .unwrap()
        .finish()
        .unwrap();
    let turn1 = vec![Message::system(system), Message::user("Hello there")];
    let ids1 = encode_prompt(&tok, &template.render(&turn1, true, &opts).unwrap()).unwrap();
    assert_eq!(
        first.prompt_tokens,
        ids1.len(),
        "the first turn evaluates its prompt"
    );
    assert_eq!(&session.history()[..ids1.len()], &ids1[..]);
    let mut expect = turn1.clone();
    expect.push(Message::assistant(first.text.clone()));
    assert_eq!(session.messages(), &expect[..]);
    let history1 = session.history().to_vec();
    let cached1 = session.sequence().len();

    let second = session
        .chat(&template, Some(system), "And then?", &opts, &params)
        .unwrap()
        .finish()
        .unwrap();
    let mut turn2 = expect.clone();
    turn2.push(Message::user("And then?"));
    let ids2 = encode_prompt(&tok, &template.render(&turn2, true, &opts).unwrap()).unwrap();
    let common = common_prefix(&history1, &ids2);
    assert!(
        common >= ids1.len(),
        "the first turn's prompt is a prefix of the second's: {common} < {}",
        ids1.len()
    );
    // Evaluated: the tokens past the common prefix, and turn 1's last token if it was left
    // unfed.
    assert_eq!(
        second.prompt_tokens,
        ids2.len() - common.min(cached1),
        "cached {cached1}, common {common}, prompt {}",
        ids2.len()
    );
    assert!(second.prompt_tokens < ids2.len() - ids1.len() + 2);
    assert_eq!(&session.history()[..ids2.len()], &ids2[..]);
    assert_eq!(second.generated, fresh_generation(&path, &ids2, &params));
    turn2.push(Message::assistant(second.text.clone()));
    assert_eq!(session.messages(), &turn2[..]);
}

/// A template that renders earlier turns differently once the conversation goes on (as Qwen3
/// drops past reasoning) re-evaluates from where the renderings part.
#[test]
fn a_rewritten_history_is_evaluated_again_from_where_it_differs() {
    let path = tiny_qwen2();
    let (mut session, _) = tiny_session(&path);
    let template = ChatTemplate::new(
        "rewriting",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n\
         {% if m.role == 'assistant' and not loop.last %}(earlier reply){% else %}{{ m.content }}{% endif %}\
         <|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let params = GenerateParams {
        max_tokens: Some(5),
        ..GenerateParams::default()
    };
    let opts = ChatOptions::default();
    let tok = session.tokenizer().clone();
    session
        .chat(&template, None, "One", &opts, &params)
        .unwrap()
        .finish()
        .unwrap();
    let history1 = session.history().to_vec();
    let second = session
        .chat(&template, None, "Two", &opts, &params)
        .unwrap()
        .finish()
        .unwrap();
    let ids2 = encode_prompt(
        &tok,
        &template
            .render(&session.messages()[..3], true, &opts)
            .unwrap(),
    )
    .unwrap();
    let common = common_prefix(&history1, &ids2);
    assert!(common < history1.len() - 1, "the reply was rewritten");
    assert_eq!(second.prompt_tokens, ids2.len() - common);
    assert_eq!(second.generated, fresh_generation(&path, &ids2, &params));
}

/// A turn whose iterator is dropped early still records the reply generated so far.
#[test]
fn a_cancelled_turn_keeps_its_partial_reply() {
    let (mut session, template) = tiny_session(&tiny_qwen2());
    let params = GenerateParams {
        max_tokens: Some(20),
        ..GenerateParams::default()
    };
    let mut text = String::new();
    {
        let mut turn = session
            .chat(&template, None, "Hi", &ChatOptions::default(), &params)
            .unwrap();
        for _ in 0..3 {
            match turn.next() {
                Some(p) => text.push_str(&p.unwrap().text),
                None => break,
            }
        }
    }
    let m = session.messages();
    assert_eq!(m.len(), 2);
    assert_eq!(m[1].role, "assistant");
    assert!(
        m[1].content.starts_with(&text),
        "{:?} vs {text:?}",
        m[1].content
    );
    // A failing template leaves the conversation as it was.
    let bad = ChatTemplate::new("bad", "{{ raise_exception('no') }}").unwrap();
    let before = session.messages().to_vec();
    let e = session
        .chat(&bad, None, "Again", &ChatOptions::default(), &params)
        .unwrap_err();
    assert!(e.to_string().contains("no"), "{e}");
    assert_eq!(session.messages(), &before[..]);
}

#[cfg(feature = "cli")]
mod cli {
    use super::*;
    use std::process::Output;

    fn run(args: &[&str]) -> Output {
        common::llm_decode()
            .args(args)
            .output()
            .expect("llm-decode runs")
    }

    fn prompt_ids(o: &Output) -> Vec<u32> {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let doc: Json = serde_json::from_slice(&o.stdout).unwrap();
        doc["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    }

    fn tokenizer(path: &Path) -> Tokenizer {
        Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap()
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rknn-llm-chat-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The fixture's case of `template` for `conversation` with the generation prompt.
    fn case<'a>(doc: &'a Json, template: &str, conversation: &str) -> &'a Json {
        doc["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| {
                c["template"] == template
                    && c["conversation"] == conversation
                    && c["add_generation_prompt"] == true
                    && c["kwargs"].as_object().unwrap().is_empty()
            })
            .unwrap()
    }

    /// `--system` and `-p` through the model's template give the prompt Python renders.
    #[test]
    fn the_model_template_and_an_override_render_as_python_does() {
        let doc = fixture();
        let model = tiny_qwen2();
        let tok = tokenizer(&model);
        let c = case(&doc, "tiny-qwen2", "single_system");
        let m = messages(c);
        let base = [
            "-m",
            model.to_str().unwrap(),
            "--system",
            &m[0].content,
            "-p",
            &m[1].content,
            "-n",
            "0",
            "--json",
        ];
        let want = encode_prompt(&tok, c["expected"].as_str().unwrap()).unwrap();
        assert_eq!(prompt_ids(&run(&base)), want);

        let c = case(&doc, "custom-override", "single_system");
        let dir = temp_dir("override");
        let file = dir.join("override.jinja");
        let t = &doc["templates"]["custom-override"];
        std::fs::write(&file, t["source"].as_str().unwrap()).unwrap();
        let mut args = base.to_vec();
        args.extend(["--chat-template-file", file.to_str().unwrap()]);
        let want = encode_prompt(&tok, c["expected"].as_str().unwrap()).unwrap();
        let got = prompt_ids(&run(&args));
        assert_eq!(got, want);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `--reasoning off` sets enable_thinking=false, `on` true, and either templates `-p`.
    #[test]
    fn reasoning_sets_enable_thinking() {
        let model = tiny_qwen2();
        let tok = tokenizer(&model);
        let dir = temp_dir("reasoning");
        let file = dir.join("think.jinja");
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                   <|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}";
        std::fs::write(&file, src).unwrap();
        let template = ChatTemplate::new("think", src)
            .unwrap()
            .with_tokens_of(&tok);
        for (flag, thinking) in [("off", false), ("on", true)] {
            let o = run(&[
                "-m",
                model.to_str().unwrap(),
                "--chat-template-file",
                file.to_str().unwrap(),
                "--reasoning",
                flag,
                "-p",
                "Why?",
                "-n",
                "0",
                "--json",
            ]);
            let opts = ChatOptions {
                enable_thinking: Some(thinking),
                ..ChatOptions::default()
            };
            let text = template
                .render(&[Message::user("Why?")], true, &opts)
                .unwrap();
            assert_eq!(
                prompt_ids(&o),
                encode_prompt(&tok, &text).unwrap(),
                "{flag}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn one_line_error(o: &Output, needles: &[&str]) {
        assert_eq!(o.status.code(), Some(1));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        for n in needles {
            assert!(err.contains(n), "{err} lacks {n}");
        }
        assert!(!err.contains("panicked"), "{err}");
    }

    /// A template that does not compile, or raises, is a one-line error naming it.
    #[test]
    fn a_bad_template_is_a_one_line_error() {
        let model = tiny_qwen2();
        let dir = temp_dir("bad");
        let broken = dir.join("broken.jinja");
        std::fs::write(&broken, "{% for m in messages %}\n{{ m.content }\n").unwrap();
        let raising = dir.join("raising.jinja");
        std::fs::write(
            &raising,
            "{{ raise_exception('Only user messages, please') }}",
        )
        .unwrap();
        let runaway = dir.join("runaway.jinja");
        std::fs::write(
            &runaway,
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        )
        .unwrap();
        let m = model.to_str().unwrap();
        for (file, needles) in [
            (
                &broken,
                &["broken.jinja", "does not compile", "syntax error"][..],
            ),
            (
                &raising,
                &["raising.jinja", "Only user messages, please"][..],
            ),
            (&runaway, &["runaway.jinja", "recurses too deeply"][..]),
        ] {
            let f = file.to_str().unwrap();
            one_line_error(
                &run(&["-m", m, "--chat-template-file", f, "-p", "x"]),
                needles,
            );
            one_line_error(
                &run(&[
                    "-m",
                    m,
                    "--chat-template-file",
                    f,
                    "--system",
                    "s",
                    "-p",
                    "x",
                    "--json",
                ]),
                needles,
            );
        }
        one_line_error(
            &run(&[
                "-m",
                m,
                "--chat-template-file",
                "/nonexistent/t.jinja",
                "-p",
                "x",
            ]),
            &["cannot read chat template /nonexistent/t.jinja"],
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A model without a template: the prompt is plain text, with one warning line.
    #[test]
    fn a_model_without_a_template_falls_back_to_plain_text() {
        let model = tiny_qwen2();
        let mut bytes = std::fs::read(&model).unwrap();
        let key = b"tokenizer.chat_template";
        let at = bytes
            .windows(key.len())
            .position(|w| w == key)
            .expect("the key is in the file");
        // Same length, another name: the file keeps its layout and loses its template.
        bytes[at + key.len() - 1] = b'X';
        let dir = temp_dir("plain");
        let file = dir.join("no-template.gguf");
        std::fs::write(&file, &bytes).unwrap();
        assert!(
            GgufFile::open(&file)
                .unwrap()
                .metadata()
                .get_str("tokenizer.chat_template")
                .is_none()
        );
        let o = run(&[
            "-m",
            file.to_str().unwrap(),
            "--system",
            "Be brief.",
            "-p",
            "Hello there",
            "-n",
            "0",
            "--json",
        ]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let tok = tokenizer(&file);
        assert_eq!(
            prompt_ids(&o),
            tok.encode("Hello there", true, true).unwrap()
        );
        let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
        assert_eq!(warnings.len(), 1, "{err}");
        assert!(warnings[0].contains("no chat template"), "{err}");
        // Without the template flags nothing is said.
        let o = run(&[
            "-m",
            file.to_str().unwrap(),
            "-p",
            "Hello",
            "-n",
            "0",
            "--json",
        ]);
        assert!(!String::from_utf8_lossy(&o.stderr).contains("warning"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `--chat`: two lines are two turns; the second evaluates only its own tokens, so the
    /// context grows by less than a fresh rendering of the whole conversation.
    #[test]
    fn chat_mode_runs_turns_over_one_cache() {
        use std::io::Write;
        let model = tiny_qwen2();
        let mut child = common::llm_decode()
            .args([
                "-m",
                model.to_str().unwrap(),
                "--chat",
                "-n",
                "4",
                "--temp",
                "0",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"Hello there\nAnd then?\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains("chat (template tokenizer.chat_template)"),
            "{err}"
        );
        let contexts: Vec<usize> = err
            .split("context ")
            .skip(1)
            .map(|s| s.split('/').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(contexts.len(), 2, "{err}");
        assert!(contexts[1] > contexts[0], "{contexts:?}");
    }
}
