//! `--perplexity FILE`: the text's perplexity under the model.

use std::io::Write;
use std::time::Instant;

use serde_json::json;

use rknn_llm::perplexity::{PerplexityParams, Scoring, perplexity};
use rknn_llm::session::rate;

use super::report::engine_line;
use super::{Args, Error, PplScoring, Prepared};

/// `-c`'s default with `--perplexity`: llama-perplexity's, so the two score the same chunks.
const PERPLEXITY_CTX_SIZE: usize = 512;

/// `--perplexity`: the text's perplexity as `--perplexity-scoring` says
/// ([`rknn_llm::perplexity`]), each scored position's logits written to `--dump-logits`; the
/// summary as llama-perplexity prints it.
pub(crate) fn run(args: &Args, p: Prepared) -> Result<(), Error> {
    let Prepared {
        loaded,
        session,
        prompt,
        dump,
        ..
    } = p;
    let text = prompt.unwrap_or_default();
    let model = &loaded.model;
    let params = PerplexityParams {
        scoring: match args.perplexity_scoring {
            PplScoring::SecondHalf => Scoring::SecondHalf,
            PplScoring::EveryToken => Scoring::EveryToken,
        },
        batch: args.batch_size,
        max_chunks: args.chunks,
    };
    let mut seq = model.sequence(session.sequence().cache().cache_type());
    if args.ctx_size.is_none() {
        seq.limit_context(PERPLEXITY_CTX_SIZE);
    }
    let t = Instant::now();
    let mut dump = dump;
    let p = perplexity(
        model,
        &mut seq,
        session.tokenizer(),
        &text,
        &params,
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
        "perplexity: {} chunks of {} ({} scoring), {} of the text's {} tokens scored, {:.1} tok/s",
        p.chunks,
        p.n_ctx,
        p.scoring,
        p.scored,
        p.tokens,
        rate(p.evaluated, t.elapsed())
    );
    let running: Vec<String> = p
        .running
        .iter()
        .enumerate()
        .map(|(i, v)| format!("[{}]{v:.4}", i + 1))
        .collect();
    eprintln!("{}", running.join(","));
    match p.ppl_error {
        Some(e) => eprintln!("Final estimate: PPL = {:.4} +/- {e:.5}", p.ppl),
        None => eprintln!(
            "Final estimate: PPL = {:.4} (one token scored: no error estimate)",
            p.ppl
        ),
    }
    if let Some(e) = model.engine() {
        eprintln!("{}", engine_line(e));
    }
    if args.json {
        println!(
            "{}",
            json!({
                "ppl": p.ppl,
                "ppl_error": p.ppl_error,
                "nll": p.nll,
                "chunks": p.chunks,
                "n_ctx": p.n_ctx,
                "n_tokens": p.tokens,
                "n_scored": p.scored,
                "scoring": p.scoring.name(),
                "running": p.running,
                "backend": loaded.backend.name(),
                "wtype": model.weight_format(),
            })
        );
    } else {
        println!("{:.4}", p.ppl);
    }
    Ok(())
}
