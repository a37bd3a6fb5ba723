//! Chat prompts for instruct models without a Jinja engine: the three formats in common use
//! are recognised from `tokenizer.chat_template` (or, without one, from the vocabulary's
//! special tokens) and rendered by hand; any other template is refused by name.

/// A recognised chat format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatFormat {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (SmolLM2, Qwen2, ...).
    ChatMl {
        /// The system message the template inserts when the conversation has none (SmolLM2:
        /// "You are a helpful AI assistant named SmolLM, ...").
        default_system: Option<String>,
    },
    /// `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>` (Llama 3).
    Llama3,
    /// `[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST]` (Llama 2).
    Llama2,
}

/// Why no chat format could be chosen.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChatError {
    /// The template is none of the recognised formats.
    #[error(
        "unsupported chat template (recognised: ChatML, Llama-3, Llama-2); it begins {start:?}"
    )]
    UnsupportedTemplate {
        /// The template's first characters.
        start: String,
    },
    /// No template and no special tokens of a recognised format.
    #[error("the model has no chat template and no ChatML or Llama-3 special tokens")]
    NoTemplate,
    /// The format's special tokens are missing from the vocabulary.
    #[error("chat format {format} needs the token {token:?}, which the vocabulary lacks")]
    MissingToken {
        /// The format.
        format: &'static str,
        /// The token.
        token: &'static str,
    },
}

impl ChatFormat {
    /// Chooses the format from the file's `tokenizer.chat_template`, or from the vocabulary
    /// when there is none; `has_token` says whether a token text is in the vocabulary.
    pub fn detect(
        template: Option<&str>,
        has_token: impl Fn(&str) -> bool,
    ) -> Result<Self, ChatError> {
        let format = match template {
            Some(t) if t.contains("<|im_start|>") => ChatFormat::ChatMl {
                default_system: default_chatml_system(t),
            },
            Some(t) if t.contains("<|start_header_id|>") => ChatFormat::Llama3,
            Some(t) if t.contains("[INST]") && t.contains("<<SYS>>") => ChatFormat::Llama2,
            Some(t) => {
                return Err(ChatError::UnsupportedTemplate {
                    start: t.chars().take(60).collect(),
                });
            }
            None if has_token("<|im_start|>") => ChatFormat::ChatMl {
                default_system: None,
            },
            None if has_token("<|start_header_id|>") => ChatFormat::Llama3,
            None => return Err(ChatError::NoTemplate),
        };
        for token in format.required_tokens() {
            if !has_token(token) {
                return Err(ChatError::MissingToken {
                    format: format.name(),
                    token,
                });
            }
        }
        Ok(format)
    }

    /// The format's name.
    pub fn name(&self) -> &'static str {
        match self {
            ChatFormat::ChatMl { .. } => "ChatML",
            ChatFormat::Llama3 => "Llama-3",
            ChatFormat::Llama2 => "Llama-2",
        }
    }

    fn required_tokens(&self) -> &'static [&'static str] {
        match self {
            ChatFormat::ChatMl { .. } => &["<|im_start|>", "<|im_end|>"],
            ChatFormat::Llama3 => &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
            ChatFormat::Llama2 => &[],
        }
    }

    /// The text of one user turn followed by the opening of the assistant's reply.
    ///
    /// `first` marks the conversation's first turn, which carries the system message (`system`,
    /// else the template's default); later turns begin by closing the previous assistant
    /// reply, whose end-of-turn token generation stopped at without feeding it to the model.
    /// BOS is not written: encode the first turn with `add_special` so the vocabulary adds it
    /// if it should.
    pub fn user_turn(&self, system: Option<&str>, user: &str, first: bool) -> String {
        match self {
            ChatFormat::ChatMl { default_system } => {
                let mut s = String::new();
                if !first {
                    s.push_str("<|im_end|>\n");
                }
                let system = system.or(if first {
                    default_system.as_deref()
                } else {
                    None
                });
                if let (true, Some(sys)) = (first, system) {
                    s.push_str(&format!("<|im_start|>system\n{sys}<|im_end|>\n"));
                }
                s.push_str(&format!(
                    "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
                ));
                s
            }
            ChatFormat::Llama3 => {
                let mut s = String::new();
                if !first {
                    s.push_str("<|eot_id|>");
                }
                if let (true, Some(sys)) = (first, system) {
                    s.push_str(&format!(
                        "<|start_header_id|>system<|end_header_id|>\n\n{sys}<|eot_id|>"
                    ));
                }
                s.push_str(&format!(
                    "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
                ));
                s
            }
            ChatFormat::Llama2 => {
                let body = match (first, system) {
                    (true, Some(sys)) => format!("<<SYS>>\n{sys}\n<</SYS>>\n\n{user}"),
                    _ => user.to_string(),
                };
                if first {
                    format!("[INST] {body} [/INST]")
                } else {
                    format!(" </s><s>[INST] {body} [/INST]")
                }
            }
        }
    }
}

/// The literal system message a ChatML template inserts when the conversation has none:
/// the text between `<|im_start|>system\n` and `<|im_end|>` in a string literal of the
/// template (`\n` written as an escape or as a real newline).
fn default_chatml_system(template: &str) -> Option<String> {
    let t = template.replace("\\n", "\n");
    let start = t.find("<|im_start|>system\n")? + "<|im_start|>system\n".len();
    let len = t[start..].find("<|im_end|>")?;
    let text = &t[start..start + len];
    // A message built from variables is not a literal default.
    if text.is_empty() || text.contains("{{") || text.contains('\'') || text.contains('+') {
        return None;
    }
    Some(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn all(_: &str) -> bool {
        true
    }

    #[test]
    fn smollm2_template_is_chatml_with_its_default_system() {
        let f = ChatFormat::detect(Some(SMOLLM2), all).unwrap();
        assert_eq!(
            f,
            ChatFormat::ChatMl {
                default_system: Some(
                    "You are a helpful AI assistant named SmolLM, trained by Hugging Face".into()
                )
            }
        );
        assert_eq!(
            f.user_turn(None, "Hi", true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            f.user_turn(Some("Be brief."), "Hi", true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            f.user_turn(Some("Be brief."), "And?", false),
            "<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn qwen2_template_with_an_escaped_default_system() {
        let t = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
        let f = ChatFormat::detect(Some(t), all).unwrap();
        assert_eq!(
            f,
            ChatFormat::ChatMl {
                default_system: Some("You are a helpful assistant.".into())
            }
        );
        // A template that builds the system message from variables has no literal default.
        let t = "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'}}";
        assert_eq!(
            ChatFormat::detect(Some(t), all).unwrap(),
            ChatFormat::ChatMl {
                default_system: None
            }
        );
    }

    #[test]
    fn llama3_and_llama2() {
        let l3 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}";
        let f = ChatFormat::detect(Some(l3), all).unwrap();
        assert_eq!(f, ChatFormat::Llama3);
        assert_eq!(
            f.user_turn(Some("S"), "U", true),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        let l2 =
            "{% if messages[0]['role'] == 'system' %}{{ '<<SYS>>\\n' }}{% endif %}{{ '[INST] ' }}";
        let f = ChatFormat::detect(Some(l2), all).unwrap();
        assert_eq!(f, ChatFormat::Llama2);
        assert_eq!(
            f.user_turn(Some("S"), "U", true),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]"
        );
        assert_eq!(f.user_turn(None, "V", false), " </s><s>[INST] V [/INST]");
    }

    #[test]
    fn other_templates_and_missing_pieces_are_refused() {
        let gemma = "{{ '<start_of_turn>' + role + '\n' }}";
        let e = ChatFormat::detect(Some(gemma), all).unwrap_err();
        assert!(
            e.to_string().starts_with("unsupported chat template"),
            "{e}"
        );
        let mistral = "{{ '[INST] ' + message['content'] + ' [/INST]' }}";
        assert!(ChatFormat::detect(Some(mistral), all).is_err());
        assert_eq!(
            ChatFormat::detect(None, |_| false),
            Err(ChatError::NoTemplate)
        );
        assert_eq!(
            ChatFormat::detect(None, |t| t == "<|im_start|>" || t == "<|im_end|>"),
            Ok(ChatFormat::ChatMl {
                default_system: None
            })
        );
        assert_eq!(
            ChatFormat::detect(Some(SMOLLM2), |t| t == "<|im_start|>"),
            Err(ChatError::MissingToken {
                format: "ChatML",
                token: "<|im_end|>"
            })
        );
    }
}
