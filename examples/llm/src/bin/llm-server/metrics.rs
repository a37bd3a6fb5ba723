//! `/metrics`: the batcher's [`Metrics`] and the responses by endpoint and status, in
//! Prometheus' text format 0.0.4.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use rknn_llm::serve::{Metrics, ROWS_BUCKETS};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The paths counted under their own name; any other is `other`.
pub const ENDPOINTS: [&str; 11] = [
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/v1/embeddings",
    "/embeddings",
    "/v1/models",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
];

/// The label of the request path `path`.
pub fn endpoint(path: &str) -> &'static str {
    ENDPOINTS
        .iter()
        .find(|&&e| e == path)
        .copied()
        .unwrap_or("other")
}

/// Responses by endpoint and status.
#[derive(Debug, Default)]
pub struct Requests(Mutex<BTreeMap<(&'static str, u16), u64>>);

impl Requests {
    /// Counts one response.
    pub fn count(&self, endpoint: &'static str, status: u16) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((endpoint, status)).or_insert(0) += 1;
    }

    /// The counts so far.
    pub fn snapshot(&self) -> BTreeMap<(&'static str, u16), u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One metric's `# HELP` and `# TYPE` lines.
fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A metric of one unlabelled sample.
fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    head(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// The whole exposition.
pub fn render(m: &Metrics, requests: &BTreeMap<(&'static str, u16), u64>) -> String {
    let mut out = String::new();
    head(
        &mut out,
        "llm_requests_total",
        "counter",
        "HTTP responses by endpoint and status.",
    );
    for ((endpoint, status), n) in requests {
        let _ = writeln!(
            out,
            "llm_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
        );
    }
    let counters: [(&str, &str, u64); 13] = [
        (
            "llm_prompt_tokens_total",
            "Prompt tokens of accepted requests.",
            m.prompt_tokens,
        ),
        (
            "llm_prompt_tokens_cached_total",
            "Prompt tokens reused from a slot's cache (not evaluated again).",
            m.cached_tokens,
        ),
        (
            "llm_completion_tokens_total",
            "Tokens generated.",
            m.completion_tokens,
        ),
        (
            "llm_requests_accepted_total",
            "Requests the batcher accepted.",
            m.accepted,
        ),
        (
            "llm_requests_finished_total",
            "Requests that ended normally.",
            m.finished,
        ),
        (
            "llm_requests_cancelled_total",
            "Requests cancelled (client gone, deadline, shutdown).",
            m.cancelled,
        ),
        (
            "llm_requests_failed_total",
            "Requests that failed otherwise.",
            m.failed,
        ),
        (
            "llm_requests_refused_total",
            "Requests the batcher refused at submission (busy, too long, shutting down).",
            m.refused,
        ),
        ("llm_passes_total", "Forward passes run.", m.passes),
        (
            "llm_pass_rows_total",
            "Rows in those passes (prompt tokens and decode rows).",
            m.pass_rows,
        ),
        (
            "llm_decode_rows_total",
            "Decode rows in those passes (one per decoding request per pass).",
            m.decode_rows,
        ),
        (
            "llm_draft_tokens_total",
            "Tokens the draft model (--model-draft) proposed, over ended requests.",
            m.draft_tokens,
        ),
        (
            "llm_draft_tokens_accepted_total",
            "Of those, tokens the model accepted.",
            m.draft_accepted,
        ),
    ];
    for (name, help, value) in counters {
        single(&mut out, name, "counter", help, value);
    }
    single(&mut out, "llm_slots", "gauge", "Slots.", m.slots);
    single(
        &mut out,
        "llm_slots_active",
        "gauge",
        "Slots serving a request now.",
        m.active,
    );
    single(
        &mut out,
        "llm_queue_depth",
        "gauge",
        "Requests waiting for a slot.",
        m.queued,
    );
    head(
        &mut out,
        "llm_pass_rows",
        "histogram",
        "Forward passes by their rows.",
    );
    let mut cumulative = 0;
    for (bound, n) in ROWS_BUCKETS.iter().zip(&m.rows_histogram) {
        cumulative += n;
        let _ = writeln!(out, "llm_pass_rows_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "llm_pass_rows_bucket{{le=\"+Inf\"}} {}", m.passes);
    let _ = writeln!(out, "llm_pass_rows_sum {}", m.pass_rows);
    let _ = writeln!(out, "llm_pass_rows_count {}", m.passes);
    single(
        &mut out,
        "llm_decode_tokens_per_second",
        "gauge",
        "Tokens generated per second over the last 10 seconds.",
        m.decode_tok_s,
    );
    single(
        &mut out,
        "llm_busy_seconds_total",
        "counter",
        "Seconds spent in forward passes.",
        m.busy_seconds,
    );
    if let Some(s) = m.modelled_npu_seconds {
        single(
            &mut out,
            "llm_modelled_npu_seconds_total",
            "counter",
            "Modelled RK3588 NPU time of the passes (busiest core; the emulator's cost model).",
            s,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_labelled() {
        assert_eq!(endpoint("/v1/completions"), "/v1/completions");
        assert_eq!(endpoint("/v1/completions/x"), "other");
    }

    #[test]
    fn the_histogram_is_cumulative() {
        let mut m = Metrics::default();
        m.passes = 3;
        m.pass_rows = 10;
        m.rows_histogram[0] = 1;
        m.rows_histogram[3] = 2;
        m.modelled_npu_seconds = Some(0.5);
        let mut r = BTreeMap::new();
        r.insert(("/health", 200), 2);
        let text = render(&m, &r);
        assert!(text.contains("llm_requests_total{endpoint=\"/health\",status=\"200\"} 2\n"));
        assert!(text.contains("llm_pass_rows_bucket{le=\"1\"} 1\n"));
        assert!(text.contains("llm_pass_rows_bucket{le=\"4\"} 1\n"));
        assert!(text.contains("llm_pass_rows_bucket{le=\"8\"} 3\n"));
        assert!(text.contains("llm_pass_rows_bucket{le=\"128\"} 3\n"));
        assert!(text.contains("llm_pass_rows_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("llm_pass_rows_sum 10\n"));
        assert!(text.contains("llm_pass_rows_count 3\n"));
        assert!(text.contains("# TYPE llm_pass_rows histogram\n"));
        assert!(text.contains("llm_modelled_npu_seconds_total 0.5\n"));
        // Every sample line's metric has its TYPE line.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let base = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(
                text.contains(&format!("# TYPE {name} "))
                    || text.contains(&format!("# TYPE {base} ")),
                "{line}"
            );
        }
    }
}
