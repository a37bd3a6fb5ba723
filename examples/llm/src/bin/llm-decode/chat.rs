//! `--chat`: an interactive chat on stdin.

use std::io::{BufRead, Write};

use super::{Args, Error, Prepared, chat_options};

/// Interactive chat: every line of stdin is a user message; each turn renders the whole
/// conversation with the template and the session's KV cache keeps what the previous turns
/// evaluated, so each turn evaluates only its own tokens. Without a template each line is
/// plain text continuing the session.
pub(crate) fn run(args: &Args, p: Prepared) -> Result<(), Error> {
    let Prepared {
        mut session,
        template,
        params,
        prompt,
        ..
    } = p;
    let (template, options) = (template.as_ref(), chat_options(args));
    let (system, params) = (args.system.as_deref(), &params);
    match template {
        Some(t) => eprintln!(
            "chat (template {}): one message per line, end with Ctrl-D",
            t.name()
        ),
        None => eprintln!("chat (no template: plain text): one message per line, end with Ctrl-D"),
    }
    let n_ctx = session.sequence().n_ctx();
    let mut lines = std::io::stdin().lock().lines();
    let mut pending = prompt;
    let mut stdout = std::io::stdout();
    loop {
        let user = match pending.take() {
            Some(u) => u,
            None => {
                eprint!("> ");
                std::io::stderr().flush()?;
                match lines.next() {
                    Some(line) => line?,
                    None => break,
                }
            }
        };
        if user.trim().is_empty() {
            continue;
        }
        let mut turn = match template {
            Some(t) => session.chat(t, system, &user, &options, params)?,
            None => session.generate(&user, params)?,
        };
        for piece in &mut turn {
            stdout.write_all(piece?.text.as_bytes())?;
            stdout.flush()?;
        }
        let out = turn.summary().clone();
        drop(turn);
        println!();
        eprintln!(
            "[{} tokens, {:.1} tok/s, context {}/{n_ctx}]",
            out.generated.len(),
            out.decode_tok_s(),
            session.history().len(),
        );
        if out.stop == Some(rknn_llm::session::Stop::Context) {
            return Err("context overflow: the conversation filled the context".into());
        }
    }
    Ok(())
}
