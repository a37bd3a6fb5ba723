//! The default mode: one prompt (plain, or a chat turn with `--system`, `--reasoning`,
//! `--chat-template-file`), streamed to stdout, then the summary (or `--json`).

use std::io::Write;

use serde_json::json;

use rknn_llm::chat::{ChatTemplate, Message, encode_prompt};
use rknn_llm::session::{Session, rate};

use super::report::{Memory, Summary, engine_json, engine_line, spec_json};
use super::{Args, Error, Prepared, SpecArg, chat_options};

/// Generates from the prompt, streaming the pieces unless `--json`, then reports.
pub(crate) fn run(args: &Args, p: Prepared) -> Result<(), Error> {
    let Prepared {
        loaded,
        mut session,
        template,
        params,
        prompt,
        seed,
        load_peak,
        dump,
        draft,
    } = p;
    let text = prompt.ok_or("no prompt: give -p TEXT or -f FILE (or --chat)")?;
    let (prompt_ids, echo) = prompt_ids(args, template.as_ref(), &session, &text)?;
    if prompt_ids.is_empty() {
        return Err("the prompt is empty after tokenization".into());
    }
    if let Some(d) = &dump {
        session.set_logits_tap(Some(Box::new(d.clone())));
    }
    let stream = !args.json;
    let mut stdout = std::io::stdout();
    if stream {
        print!("{echo}");
        stdout.flush()?;
    }
    let mut generation = session.generate_tokens(&prompt_ids, &params)?;
    for piece in &mut generation {
        let piece = piece?;
        if stream && !piece.text.is_empty() {
            stdout.write_all(piece.text.as_bytes())?;
            stdout.flush()?;
        }
    }
    let out = generation.summary().clone();
    drop(generation);
    if stream {
        println!();
    }
    if let Some(d) = &dump {
        d.lock().flush()?;
    }
    let model = &loaded.model;
    let engine = model.engine();
    let stats = session.sequence().stats().clone();
    let threads = model.pool().current_num_threads();
    let summary = Summary {
        speculating: args.spec != SpecArg::None || draft.is_some(),
        load_time: loaded.load_time,
        out: &out,
        threads,
        seed,
        backend: loaded.backend.name(),
    };
    summary.print();
    if let Some(e) = engine {
        eprintln!("{}", engine_line(e));
    }
    let modelled = out.modelled.map(|(p, d)| {
        let cores = engine.map_or(0, rknn_matmul::engine::Engine::workers);
        (rate(out.prompt_tokens, p), rate(out.decisions, d), cores)
    });
    let mut memory = Memory::measure(model, session.sequence().cache().cache_type());
    memory.load_peak = load_peak;
    eprintln!("{}", memory.line());
    if let Some(line) = modelled_line(engine, modelled) {
        eprintln!("{line}");
    }
    if args.json {
        let doc = json!({
            "prompt_ids": prompt_ids,
            "generated_ids": out.generated,
            "text": out.text,
            "prefill_tok_s": out.prefill_tok_s(),
            "decode_tok_s": out.decode_tok_s(),
            "backend": loaded.backend.name(),
            "stats": {
                "modelled_rk3588": modelled.map(|(p, d, cores)| json!({
                    "chip": engine.map(|e| e.runtime().platform().name()),
                    "prefill_tok_s": p,
                    "decode_tok_s": d,
                    "cores": cores,
                    "note": "rknn_emu::cost model of the NPU time only (docs/npu-matmul-performance.md)",
                })),
                "wtype": model.weight_format(),
                "engine": engine.map(engine_json),
                "load_s": loaded.load_time.as_secs_f64(),
                "prompt_tokens": prompt_ids.len(),
                "generated_tokens": out.generated.len(),
                "prefill_s": out.prefill_time.as_secs_f64(),
                "decode_s": out.decode_time.as_secs_f64(),
                "decode_forwards": out.decode_forwards,
                "spec": spec_json(args, &out, draft.as_ref()),
                "stop": out.stop.map_or("none", |s| s.name()),
                "threads": threads,
                "kernel": rknn_llm::model::kernels::selected().name(),
                "seed": seed,
                "n_ctx": model.n_ctx(),
                "n_ctx_train": model.config().n_ctx,
                "cache_type": session.sequence().cache().cache_type().name(),
                "memory": memory.json(),
                "weight_cache": loaded.weight_cache.as_ref().map(|c| json!({
                    "outcome": c.name(),
                    "path": c.path().display().to_string(),
                    "line": c.to_string(),
                })),
                "matmul_s": stats.matmul.as_secs_f64(),
                "attention_s": stats.attention.as_secs_f64(),
                "other_s": stats.other.as_secs_f64(),
            },
        });
        println!("{doc}");
    }
    Ok(())
}

/// The prompt's ids, and the text to echo before the generation (none for a chat).
fn prompt_ids(
    args: &Args,
    template: Option<&ChatTemplate>,
    session: &Session,
    text: &str,
) -> Result<(Vec<u32>, String), Error> {
    Ok(match template {
        Some(t) => {
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(Message::system(system.as_str()));
            }
            messages.push(Message::user(text));
            let rendered = t.render(&messages, true, &chat_options(args))?;
            (
                encode_prompt(session.tokenizer(), &rendered)?,
                String::new(),
            )
        }
        None => (
            session.tokenizer().encode(text, true, true)?,
            text.to_string(),
        ),
    })
}

/// The summary's line of modelled NPU speed: the cost model's rates on the emulated chip, or,
/// on an emulator without a cost model of its chip (the single-core chips today), a line saying so; nothing
/// off the emulator.
pub(crate) fn modelled_line(
    engine: Option<&rknn_matmul::engine::Engine>,
    modelled: Option<(f64, f64, usize)>,
) -> Option<String> {
    let rt = engine?.runtime();
    let chip = rt.platform().name().to_uppercase();
    match modelled {
        Some((p, d, cores)) => Some(format!(
            "modelled {chip} (cost model of the NPU time only, {cores} cores): prefill {p:.1} tok/s, decode {d:.1} tok/s"
        )),
        None if rt.is_emulator() => Some(format!(
            "modelled {chip}: none (the emulator has no cost model of this chip, or it is turned off)"
        )),
        None => None,
    }
}
