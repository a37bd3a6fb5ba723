//! Chat templates on arbitrary template source and messages: compiling and rendering never
//! panics, never overflows the stack and never hangs; whatever fails is a typed `ChatError`
//! naming the template.
//!
//! Input: one byte of flags (add_generation_prompt, enable_thinking unset / false / true, the
//! roles' rotation), then text split at NUL bytes: the template source, then the messages'
//! contents (the roles cycle through system, user, assistant, tool).
//!
//! The fuel is small so that each input is quick, and the deadline is a second: a rendering
//! still running then is work the fuel does not see (minijinja prints and compares values
//! without charging for parts they share, so a value shared 2^40 times is cheap to build and
//! forever to print with `~`), which this target reports as a finding.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rknn_llm::chat::{ChatError, ChatOptions, ChatTemplate, DateTime, Message};

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

fuzz_target!(|data: &[u8]| {
    let [flags, rest @ ..] = data else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or_default();
    let rotation = usize::from(flags >> 4);
    let messages: Vec<Message> = parts
        .take(16)
        .enumerate()
        .map(|(i, c)| Message::new(ROLES[(i + rotation) % ROLES.len()], c))
        .collect();
    let mut template = match ChatTemplate::new("fuzz", source) {
        Ok(t) => t.with_special_tokens(Some("<s>"), Some("</s>")),
        Err(e) => {
            assert!(matches!(e, ChatError::Compile { .. }), "{e:?}");
            assert_eq!(e.template_name(), "fuzz");
            return;
        }
    };
    template.set_fuel(20_000);
    template.set_timeout(Duration::from_secs(1));
    let options = ChatOptions {
        enable_thinking: match (flags >> 1) & 3 {
            0 => None,
            1 => Some(false),
            _ => Some(true),
        },
        now: DateTime::new(2024, 7, 26, 12, 0, 0),
        ..ChatOptions::default()
    };
    match template.render(&messages, flags & 1 != 0, &options) {
        Ok(_) => {}
        Err(ChatError::Timeout { .. }) => panic!("the rendering outlived its deadline"),
        Err(e) => {
            assert_eq!(e.template_name(), "fuzz");
            assert!(!e.to_string().is_empty());
        }
    }
});
