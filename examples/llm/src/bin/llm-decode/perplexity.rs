//! `--perplexity FILE`: the text's perplexity under the model.

use std::io::Write;
use std::time::Instant;

use serde_json::json;

use rknn_llm::perplexity::perplexity;
use rknn_llm::session::rate;

use super::report::engine_line;
use super::{Args, Error, Prepared};

/// `--perplexity`: the text's perplexity over windows of the context length
/// ([`rknn_llm::perplexity`]), each scored position's logits written to `--dump-logits`.
pub(crate) fn run(args: &Args, p: Prepared) -> Result<(), Error> {
    let Prepared {
        loaded,
        session,
        prompt,
        dump,
        ..
    } = p;
    let text = prompt.unwrap_or_default();
    let text = text.as_str();
    let loaded = &loaded;
    let session = &session;
    let model = &loaded.model;
    let ids = session.tokenizer().encode(text, true, false)?;
    let mut seq = model.sequence(session.sequence().cache().cache_type());
    let t = Instant::now();
    let mut dump = dump;
    let p = perplexity(
        model,
        &mut seq,
        &ids,
        args.batch_size,
        |row| match &mut dump {
            Some(d) => {
                for v in row {
                    d.write_all(&v.to_le_bytes())?;
                }
                Ok(())
            }
            None => Ok(()),
        },
    )?;
    if let Some(d) = &mut dump {
        d.flush()?;
    }
    eprintln!(
        "perplexity: {:.4} over {} scored tokens ({} tokens, windows of {}), {:.1} tok/s",
        p.ppl,
        p.scored,
        ids.len(),
        model.n_ctx(),
        rate(ids.len(), t.elapsed())
    );
    let engine = model.engine();
    if let Some(e) = engine {
        eprintln!("{}", engine_line(e));
    }
    if args.json {
        println!(
            "{}",
            json!({
                "n_tokens": ids.len(),
                "n_scored": p.scored,
                "ppl": p.ppl,
                "nll": p.nll,
                "backend": loaded.backend.name(),
                "wtype": model.backend_kind(),
            })
        );
    } else {
        println!("{:.4}", p.ppl);
    }
    Ok(())
}
