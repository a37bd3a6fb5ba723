//! `llm-server` under a minute of mixed traffic on the tiny model: six clients send random
//! good requests (chats and completions, streamed or not, some byte by byte), hang up at random
//! mid-stream (half of those under a JSON Schema with log-probabilities), and mix in malformed
//! JSON, oversized bodies, bad parameters (bad schemas, grammars, unknown fields among them)
//! and unknown paths.
//! The server must stay up, answer every completed good request with the solo greedy text of
//! its prompt, refuse every bad one with its 4xx (503 only with Retry-After), end idle, and not
//! grow: its RSS after the run within 10 % of its RSS after a warm-up of the same mix (rounds
//! of 5 s until the RSS settles; glibc's arenas capped at two; the bar's reasoning is at the
//! check). Not under
//! `RKNPU_TEST_RUNNER`: qemu-user's own memory grows by every guest thread that ever ran (about
//! 400 KiB each with `-cpu max`).
//!
//! `RKNPU_SOAK_SECS` sets the length of the measured run (default 40 s, after a warm-up of about
//! 20 s: a minute in all; 15 s under `RKNPU_TEST_RUNNER`; longer as a bench),
//! `RKNPU_SOAK_SEED` the seed (printed).

mod common;
#[path = "common/server.rs"]
mod server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use server::{Gen, Server, budget};

const PROMPTS: [&str; 6] = [
    "hello world",
    "The capital of France is",
    "Once upon a time there was",
    "the sea and the art of the world",
    "abc def ghi",
    "In the beginning the world was dark",
];
/// `None`: until the slot's context is full.
const MAX_TOKENS: [Option<u64>; 4] = [Some(1), Some(8), Some(24), None];
const PATHS: [&str; 2] = ["/v1/completions", "/v1/chat/completions"];
const BODY_LIMIT: usize = 16384;

/// A good request: which prompt, length and endpoint.
type Key = (usize, usize, usize);

fn body(&(p, m, e): &Key) -> Json {
    let mut b = json!({"temperature": 0, "seed": 3});
    if let Some(n) = MAX_TOKENS[m] {
        b["max_tokens"] = json!(n);
    }
    if e == 0 {
        b["prompt"] = json!(PROMPTS[p]);
    } else {
        b["messages"] = json!([{"role": "user", "content": PROMPTS[p]}]);
    }
    b
}

#[derive(Debug, Default)]
struct Tally {
    good: u64,
    streamed: u64,
    slow: u64,
    hung_up: u64,
    malformed: u64,
    oversized: u64,
    bad_params: u64,
    not_found: u64,
    busy: u64,
}

impl Tally {
    /// Requests sent (streamed and slow ones are among the good ones).
    fn requests(&self) -> u64 {
        self.good
            + self.busy
            + self.hung_up
            + self.malformed
            + self.oversized
            + self.bad_params
            + self.not_found
    }

    fn add(&mut self, o: &Tally) {
        self.good += o.good;
        self.streamed += o.streamed;
        self.slow += o.slow;
        self.hung_up += o.hung_up;
        self.malformed += o.malformed;
        self.oversized += o.oversized;
        self.bad_params += o.bad_params;
        self.not_found += o.not_found;
        self.busy += o.busy;
    }
}

/// Checks a good request's answer against its reference; a 503 must carry Retry-After.
fn good_answer(
    status: u16,
    retry_after: Option<&str>,
    got: impl FnOnce() -> Result<Gen, String>,
    reference: &Gen,
    key: &Key,
    t: &mut Tally,
) -> Result<(), String> {
    match status {
        200 => {
            let g = got()?;
            if g.key() != reference.key() {
                return Err(format!(
                    "{key:?}: {:?} instead of {:?}",
                    g.key(),
                    reference.key()
                ));
            }
            t.good += 1;
            Ok(())
        }
        503 if retry_after.is_some() => {
            t.busy += 1;
            Ok(())
        }
        s => Err(format!("{key:?}: status {s} (Retry-After {retry_after:?})")),
    }
}

/// [`good_answer`] of a whole (not streamed) answer.
fn whole_answer(
    r: &server::Response,
    reference: &Gen,
    key: &Key,
    t: &mut Tally,
) -> Result<(), String> {
    let parse = || {
        serde_json::from_slice::<Json>(&r.body)
            .map(|a| Gen::from_answer(&a))
            .map_err(|e| format!("{e}: {}", r.text()))
    };
    good_answer(r.status, r.header("retry-after"), parse, reference, key, t)
}

fn expect_status(
    r: std::io::Result<server::Response>,
    status: u16,
    what: &str,
) -> Result<(), String> {
    let r = r.map_err(|e| format!("{what}: {e}"))?;
    if r.status != status {
        return Err(format!(
            "{what}: {} instead of {status}: {}",
            r.status,
            r.text()
        ));
    }
    let doc: Json =
        serde_json::from_slice(&r.body).map_err(|e| format!("{what}: {e}: {}", r.text()))?;
    if !doc["error"]["message"].is_string() {
        return Err(format!("{what}: no error object: {doc}"));
    }
    Ok(())
}

/// One client until `until` (or another's failure): random requests of the mix.
fn client(
    s: &Server,
    refs: &HashMap<Key, Gen>,
    seed: u64,
    until: Instant,
    failed: &AtomicBool,
) -> Result<Tally, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut t = Tally::default();
    let mut slow_left = 2;
    while Instant::now() < until && !failed.load(Ordering::Relaxed) {
        let key = (
            rng.usize(..PROMPTS.len()),
            rng.usize(..MAX_TOKENS.len()),
            rng.usize(..PATHS.len()),
        );
        let path = PATHS[key.2];
        let reference = &refs[&key];
        let good = body(&key);
        match rng.u32(..100) {
            0..=34 => {
                let r = s
                    .try_request("POST", path, &[], good.to_string().as_bytes())
                    .map_err(|e| format!("{key:?}: {e}"))?;
                whole_answer(&r, reference, &key, &mut t)?;
            }
            35..=49 => {
                let mut b = good.clone();
                b["stream"] = json!(true);
                b["stream_options"] = json!({"include_usage": true});
                let mut st = s
                    .open_stream(path, &b)
                    .map_err(|e| format!("{key:?}: {e}"))?;
                let status = st.status;
                let retry = st.header("retry-after").map(str::to_string);
                let got = || st.collect(Instant::now()).map_err(|e| e.to_string());
                good_answer(status, retry.as_deref(), got, reference, &key, &mut t)?;
                t.streamed += u64::from(status == 200);
            }
            50..=61 => {
                // Hang up after a few events (or right after the head); half of them under a
                // grammar with log-probabilities (their per-slot state dropped mid-way).
                let mut b = good.clone();
                b["stream"] = json!(true);
                if rng.bool() {
                    b["json_schema"] =
                        json!({"type": "object", "properties": {"a": {"type": "string"}}});
                    b["n_probs"] = json!(3);
                }
                let mut st = s
                    .open_stream(path, &b)
                    .map_err(|e| format!("{key:?}: {e}"))?;
                if st.status == 200 {
                    for _ in 0..rng.usize(..4) {
                        if st.next_data().map_err(|e| e.to_string())?.is_none() {
                            break;
                        }
                    }
                } else if !(st.status == 503 && st.header("retry-after").is_some()) {
                    return Err(format!("{key:?} streamed: status {}", st.status));
                }
                st.close();
                t.hung_up += 1;
            }
            62..=71 => {
                let text = good.to_string();
                let bytes: Vec<u8> = if rng.bool() {
                    text.as_bytes()[..rng.usize(1..text.len() - 1)].to_vec()
                } else {
                    (0..rng.usize(1..64)).map(|_| rng.u8(..)).collect()
                };
                expect_status(
                    s.try_request("POST", path, &[], &bytes),
                    400,
                    &format!("malformed {:?}", String::from_utf8_lossy(&bytes)),
                )?;
                t.malformed += 1;
            }
            72..=77 => {
                let pad = rng.usize(BODY_LIMIT..4 * BODY_LIMIT);
                let mut b = body(&(key.0, key.1, 0));
                b["prompt"] = json!("y".repeat(pad));
                let bytes = b.to_string();
                expect_status(
                    s.try_request("POST", "/v1/completions", &[], bytes.as_bytes()),
                    413,
                    &format!("a body of {} bytes", bytes.len()),
                )?;
                t.oversized += 1;
            }
            78..=89 => {
                let mut b = good.clone();
                // The fields of structured output, logprobs and the table of fields too.
                let (k, v) = match rng.u32(..10) {
                    0 => ("temperature", json!(5)),
                    1 => ("n", json!(9)),
                    2 => ("max_tokens", json!("x")),
                    3 => ("top_p", json!(-1)),
                    4 => ("json_schema", json!({"type": "array", "uniqueItems": true})),
                    5 => ("grammar", json!("root ::= (")),
                    6 => ("mirostat", json!(2)),
                    7 => ("logit_bias", json!({"99999999": 1})),
                    8 => ("n_probs", json!(21)),
                    _ => (if key.2 == 0 { "prompt" } else { "messages" }, json!([])),
                };
                b[k] = v.clone();
                expect_status(
                    s.try_request("POST", path, &[], b.to_string().as_bytes()),
                    400,
                    &format!("{k} = {v}"),
                )?;
                t.bad_params += 1;
            }
            90..=93 if slow_left > 0 => {
                slow_left -= 1;
                let r = s
                    .post_slowly(path, good.to_string().as_bytes(), Duration::from_millis(2))
                    .map_err(|e| format!("{key:?} byte by byte: {e}"))?;
                whole_answer(&r, reference, &key, &mut t)?;
                t.slow += 1;
            }
            _ => {
                expect_status(
                    s.try_request("GET", "/v1/no-such-thing", &[], b""),
                    404,
                    "an unknown path",
                )?;
                t.not_found += 1;
            }
        }
    }
    Ok(t)
}

/// Six clients for `length`; the tally of them all, failing on the first wrong answer.
fn phase(s: &Server, refs: &HashMap<Key, Gen>, seed: u64, length: Duration) -> Tally {
    let until = Instant::now() + length;
    let failed = AtomicBool::new(false);
    let results: Vec<Result<Tally, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6u64)
            .map(|i| {
                let failed = &failed;
                scope.spawn(move || {
                    let r = client(s, refs, seed.wrapping_add(i), until, failed);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut total = Tally::default();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(t) => total.add(&t),
            Err(e) => panic!(
                "client {i} (seed {}): {e} (server alive: {})",
                seed.wrapping_add(i as u64),
                s.alive()
            ),
        }
    }
    assert!(s.alive(), "the server died");
    total
}

fn idle(s: &Server) -> server::Metrics {
    s.wait_metrics("the server goes idle", budget(10), |m| {
        m.get("llm_slots_active") == 0.0 && m.get("llm_queue_depth") == 0.0
    })
}

#[test]
fn mixed_traffic_for_a_minute() {
    let secs: u64 = std::env::var("RKNPU_SOAK_SECS")
        .ok()
        .map(|v| v.parse().expect("RKNPU_SOAK_SECS is a number of seconds"))
        .unwrap_or(if server::runner().is_some() { 15 } else { 40 });
    let seed: u64 = std::env::var("RKNPU_SOAK_SEED")
        .ok()
        .map(|v| v.parse().expect("RKNPU_SOAK_SEED is a number"))
        .unwrap_or(20_240_611);
    println!("soak: {secs} s, seed {seed} (RKNPU_SOAK_SECS, RKNPU_SOAK_SEED)");
    let template = server::plain_template();
    let limit = BODY_LIMIT.to_string();
    // glibc gives each thread that allocates an arena of its own, up to 8 per core, and an arena
    // keeps the pages it touched: as tokio's and the server's threads come and go, the RSS climbs
    // by a few MiB at a time until that cap, a step that says nothing about the server (seen:
    // +6.8 to +8.7 % in 3 of 9 runs). Two arenas keep that noise small beside a leak.
    let s = Server::start_with(
        &server::tiny_llama(),
        &[
            "--backend",
            "f32",
            "-t",
            "2",
            "-c",
            "512",
            "--parallel",
            "4",
            "--queue",
            "8",
            "--body-limit",
            &limit,
            "--chat-template-file",
            template.to_str().unwrap(),
        ],
        &[("MALLOC_ARENA_MAX", "2")],
    );
    // The references: every good request alone.
    let mut refs = HashMap::new();
    for p in 0..PROMPTS.len() {
        for (m, max_tokens) in MAX_TOKENS.iter().enumerate() {
            for (e, path) in PATHS.iter().enumerate() {
                let key = (p, m, e);
                let g = s.generate(path, &body(&key));
                if let Some(n) = *max_tokens {
                    assert!(g.completion_tokens <= n, "{key:?}: {g:?}");
                } else if g.finish == "length" {
                    // Until the slot (512 / 4 positions) is full.
                    assert!(
                        g.prompt_tokens + g.completion_tokens >= 120,
                        "{key:?}: {g:?}"
                    );
                }
                refs.insert(key, g);
            }
        }
    }

    // Warm-up: rounds of 5 s of the same mix until the idle RSS settles (within 1 % of the
    // round before; the allocator's arenas and the slots' caches take a few rounds to fill),
    // at most 8 rounds. Under a runner the RSS is qemu-user's, which grows by each guest thread
    // that ever ran: one round, no bound.
    let native = server::runner().is_none();
    let mut rss_warm = s.rss_kib();
    let mut series = vec![rss_warm];
    for round in 0..if native { 8u64 } else { 1 } {
        let warm = phase(
            &s,
            &refs,
            seed.wrapping_add(1000 * (round + 1)),
            Duration::from_secs(5),
        );
        idle(&s);
        let rss = s.rss_kib();
        series.push(rss);
        println!("warm-up round {round}: {warm:?}, RSS {rss} KiB");
        let settled = rss.abs_diff(rss_warm) * 100 <= rss_warm;
        rss_warm = rss;
        if settled && round > 0 {
            break;
        }
    }
    println!("RSS during the warm-up (KiB): {series:?}");
    let t = Instant::now();
    let run = phase(&s, &refs, seed ^ 0x9e37_79b9, Duration::from_secs(secs));
    println!("run ({:?}): {run:?}", t.elapsed());
    let m = idle(&s);
    let rss_end = s.rss_kib();
    let grown = rss_end.saturating_sub(rss_warm) * 1024;
    println!(
        "RSS {rss_warm} KiB after the warm-up, {rss_end} KiB after the run ({:+.2} %, {:.1} bytes \
         per request){}",
        (rss_end as f64 / rss_warm as f64 - 1.0) * 100.0,
        grown as f64 / run.requests() as f64,
        if native {
            ""
        } else {
            ", not checked under a runner"
        }
    );
    assert!(run.good >= 20 && run.malformed > 0 && run.oversized > 0 && run.bad_params > 0);
    assert!(run.hung_up > 0 && run.streamed > 0);
    // Within 10 %: what the heap's slow fragmentation left in 5 runs of 40 s was +1.6 to
    // +4.4 % (a run of 240 s: +6.0 %, 3.4 bytes per request: it grows far slower than the
    // requests, as no leak does), while a leak of 48 bytes per request (one small allocation:
    // glibc's smallest chunk is 32 bytes) over the ~30 000 requests of 40 s is over 10 %.
    assert!(
        !native || rss_end as f64 <= rss_warm as f64 * 1.10,
        "RSS grew from {rss_warm} KiB to {rss_end} KiB"
    );
    assert!(m.get("llm_requests_total") > 0.0);
    // Still serving.
    let key = (0, 2, 1);
    assert_eq!(s.generate(PATHS[1], &body(&key)).key(), refs[&key].key());
}
