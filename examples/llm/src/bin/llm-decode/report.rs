//! What `llm-decode` reports: the summary line, the engine's line and JSON, the memory
//! line, the host kernels.

use std::time::Duration;

use serde_json::json;

use rknn_llm::session::GenerationSummary;
use rknn_llm::{LoadedModel, Model};
use rknn_matmul::engine::Engine;

use super::{Args, Error, SpecArg};

/// `--kernels`: the LLM's host kernel choice ([`rknn_llm::model::kernels::kernel_choice`]),
/// as `rknn-info --kernels` prints the SDK's components.
pub(crate) fn print_kernels(json: bool) -> Result<(), Error> {
    let c = rknn_llm::model::kernels::kernel_choice();
    if json {
        let doc = json!([{
            "component": c.component,
            "selected": c.selected,
            "available": c.available,
            "compiled": c.compiled,
            "set_by": c.set_by.as_ref().map(|(var, value)| format!("{var}={value}")),
            "ignored": c.ignored,
        }]);
        println!("{doc}");
    } else {
        println!("Host kernels (RKNN_KERNEL for every component, RKNN_KERNEL_LLM for this one):");
        println!("  {c}");
    }
    Ok(())
}

pub(crate) struct Summary<'a> {
    pub(crate) speculating: bool,
    pub(crate) load_time: Duration,
    pub(crate) out: &'a GenerationSummary,
    pub(crate) threads: usize,
    pub(crate) seed: u64,
    pub(crate) backend: &'static str,
}

impl Summary<'_> {
    pub(crate) fn print(&self) {
        let o = self.out;
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s (stop: {}) | load {:.2} s | {} backend, {} threads, seed {}",
            o.prompt_tokens,
            o.prefill_tok_s(),
            o.generated.len(),
            o.decode_tok_s(),
            o.stop.map_or("none", |s| s.name()),
            self.load_time.as_secs_f64(),
            self.backend,
            self.threads,
            self.seed
        );
        if self.speculating {
            let s = o.spec;
            eprintln!(
                "speculation: {} verify passes, {} drafted, {} accepted ({:.1} %), {:.2} tokens per forward pass",
                s.passes,
                s.drafted,
                s.accepted,
                100.0 * s.acceptance(),
                o.tokens_per_pass()
            );
            if s.draft_forwards > 0 {
                eprintln!(
                    "draft model: {} drafted, {} accepted, {} forward passes in {:.2} s",
                    s.model_drafted,
                    s.model_accepted,
                    s.draft_forwards,
                    s.draft_time.as_secs_f64()
                );
            }
        }
    }
}

/// `--json`'s `spec`: the mode (`none`, `lookup`, `draft` or `lookup+draft`), what was drafted
/// and accepted, and the draft model's share.
pub(crate) fn spec_json(
    args: &Args,
    o: &GenerationSummary,
    draft: Option<&LoadedModel>,
) -> serde_json::Value {
    let mode = match (args.spec, draft.is_some()) {
        (SpecArg::None, false) => return json!({"mode": "none"}),
        (SpecArg::None, true) => "draft",
        (SpecArg::Lookup, false) => "lookup",
        (SpecArg::Lookup, true) => "lookup+draft",
    };
    let s = o.spec;
    json!({
        "mode": mode,
        "draft_max": args.draft_max,
        "ngram": (args.spec == SpecArg::Lookup).then_some(args.ngram),
        "passes": s.passes,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance": s.acceptance(),
        "tokens_per_pass": o.tokens_per_pass(),
        "draft_model": draft.map(|d| json!({
            "path": d.path.display().to_string(),
            "p_min": args.draft_p_min,
            "drafted": s.model_drafted,
            "accepted": s.model_accepted,
            "forwards": s.draft_forwards,
            "time_s": s.draft_time.as_secs_f64(),
            "memory": Memory::measure(&d.model, d.kv_cache).json(),
            "engine": d.model.engine().map(engine_json),
        })),
    })
}

/// The engine's per-phase times, one line.
pub(crate) fn engine_line(e: &Engine) -> String {
    let s = e.stats();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "engine: {} on {} ({}), {} cores, contexts of N <= {}, A/C {}, {} forwards | quantize {:.0} ms, pack {:.0} ms, run {:.0} ms, collect {:.0} ms, waiting for workers {:.0} ms in {} rounds",
        e.runtime().backend_name(),
        e.runtime().platform(),
        e.runtime().selection_reason(),
        e.workers(),
        e.max_n_per_context(),
        if e.shares_io_memories() {
            "shared per core"
        } else {
            "per context"
        },
        s.forwards,
        ms(s.quantize.time),
        ms(s.pack.time),
        ms(s.run.time),
        ms(s.collect.time),
        ms(s.wait.time),
        s.wait.count
    )
}

pub(crate) fn engine_json(e: &Engine) -> serde_json::Value {
    let s = e.stats();
    let phase =
        |p: &rknn_matmul::engine::PhaseStats| json!({"count": p.count, "s": p.time.as_secs_f64()});
    json!({
        "runtime": e.runtime().backend_name(),
        "hardware": e.runtime().is_hardware(),
        "platform": e.runtime().platform().name(),
        "selection_reason": e.runtime().selection_reason(),
        "cores": e.workers(),
        "max_n_per_context": e.max_n_per_context(),
        "shares_io_memories": e.shares_io_memories(),
        "iommu_domain_bytes": e.domain_bytes(),
        "handles": {
            "live": e.runtime().handle_budget().live(),
            "budget": e.runtime().handle_budget().budget(),
        },
        "forwards": s.forwards,
        "quantize": phase(&s.quantize),
        "pack": phase(&s.pack),
        "run": phase(&s.run),
        "collect": phase(&s.collect),
        "wait": phase(&s.wait),
        "input_elements": s.input_elements,
        "output_elements": s.output_elements,
        "glue_ns_per_element": s.glue_ns_per_element(),
    })
}

/// The process's resident memory against what the model holds.
pub(crate) struct Memory {
    footprint: rknn_llm::model::Footprint,
    /// (current, peak) resident set, from /proc/self/status (Linux).
    rss: Option<(u64, u64)>,
    /// The peak when the model had loaded.
    pub(crate) load_peak: Option<u64>,
}

impl Memory {
    /// (current, peak) resident set now, from /proc/self/status (Linux).
    pub(crate) fn rss() -> Option<(u64, u64)> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let kib = |key: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            let v = line[key.len()..].trim().trim_end_matches("kB").trim();
            v.parse::<u64>().ok().map(|k| k * 1024)
        };
        kib("VmRSS:").zip(kib("VmHWM:"))
    }

    pub(crate) fn measure(model: &Model, ty: rknn_llm::model::CacheType) -> Memory {
        Memory {
            footprint: model.footprint(ty),
            rss: Memory::rss(),
            load_peak: None,
        }
    }

    pub(crate) fn line(&self) -> String {
        let f = &self.footprint;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let rss = match self.rss {
            Some((now, peak)) => format!(
                "peak RSS {:.0} MiB ({:.2}× the model's; {:.0} MiB by the end of loading), now {:.0} MiB",
                mib(peak),
                peak as f64 / f.total().max(1) as f64,
                mib(self.load_peak.unwrap_or(0)),
                mib(now)
            ),
            None => "RSS unknown".into(),
        };
        format!(
            "memory: {rss} | model: weights {:.0} MiB + host tensors {:.0} MiB + KV cache at -c {:.0} MiB",
            mib(f.weights),
            mib(f.host),
            mib(f.kv)
        )
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        let f = &self.footprint;
        json!({
            "peak_rss_bytes": self.rss.map(|r| r.1),
            "load_peak_rss_bytes": self.load_peak,
            "rss_bytes": self.rss.map(|r| r.0),
            "weight_bytes": f.weights,
            "host_tensor_bytes": f.host,
            "kv_bytes": f.kv,
            "model_bytes": f.total(),
            "peak_rss_over_model": self.rss.map(|r| r.1 as f64 / f.total().max(1) as f64),
        })
    }
}
