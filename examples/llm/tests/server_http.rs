//! `llm-server` over HTTP: concurrent requests give what each gives alone and what `llm-decode`
//! gives (the batch-invariance claim, on the NPU path of the demo model and on the f32 path of
//! the tiny model), with passes that really batched; a client that goes away frees its slot; a
//! chat's next turn reuses the slot's cache (same output, a fraction of the time to the first
//! token); clients that vanish while queued free their places at once; a client slow to send
//! its request's head is disconnected; every refusal is the documented status with an OpenAI
//! error object, and the server answers the next good request as before.

mod common;
#[path = "common/server.rs"]
mod server;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use server::{Gen, Server, assert_error, budget};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

/// What a request asks, with the `llm-decode` arguments that give the same prompt.
#[derive(Clone, Debug)]
enum Case {
    Completion(String),
    /// A system message and a user message (`llm-decode --system S -p U`).
    Chat(String, String),
}

impl Case {
    fn path(&self) -> &'static str {
        match self {
            Case::Completion(_) => COMPLETIONS,
            Case::Chat(..) => CHAT,
        }
    }

    fn body(&self, max_tokens: usize) -> Json {
        let mut b = json!({"max_tokens": max_tokens, "temperature": 0, "seed": 7});
        match self {
            Case::Completion(p) => b["prompt"] = json!(p),
            Case::Chat(s, u) => {
                b["messages"] = json!([
                    {"role": "system", "content": s},
                    {"role": "user", "content": u},
                ]);
            }
        }
        b
    }

    /// `llm-decode --json` on the same prompt, greedy.
    fn reference(&self, model: &std::path::Path, backend: &str, n: usize) -> Json {
        let mut cmd = common::llm_decode();
        cmd.arg("-m").arg(model);
        cmd.args(["-n", &n.to_string(), "--temp", "0", "--json", "-t", "2"]);
        cmd.args(["--backend", backend]);
        match self {
            Case::Completion(p) => cmd.args(["-p", p]),
            Case::Chat(s, u) => cmd.args(["--system", s, "-p", u]),
        };
        common::run_json(cmd, &[])
    }
}

/// Asserts that `g` is what `llm-decode` generated (`doc`).
fn assert_matches_llm_decode(g: &Gen, doc: &Json, what: &str) {
    let generated = doc["generated_ids"].as_array().unwrap().len() as u64;
    let prompt = doc["prompt_ids"].as_array().unwrap().len() as u64;
    let finish = match doc["stats"]["stop"].as_str().unwrap() {
        "eog" => "stop",
        "n_predict" => "length",
        other => panic!("{what}: llm-decode stopped by {other}"),
    };
    assert_eq!(
        (
            g.text.as_str(),
            g.finish.as_str(),
            g.prompt_tokens,
            g.completion_tokens
        ),
        (doc["text"].as_str().unwrap(), finish, prompt, generated),
        "{what}: the server differs from llm-decode"
    );
}

/// Every case alone on a fresh server, then all at once from as many threads (every other one
/// streamed): each concurrent answer must equal its solo one and `llm-decode`'s, and the token
/// counters of /metrics must come to the sums of the answers' usage. Returns the /metrics of
/// before and after the concurrent phase.
fn concurrency(
    s: &Server,
    model: &std::path::Path,
    backend: &str,
    cases: &[Case],
    n: usize,
) -> (server::Metrics, server::Metrics) {
    let solo: Vec<Gen> = cases
        .iter()
        .map(|c| s.generate(c.path(), &c.body(n)))
        .collect();
    for (c, g) in cases.iter().zip(&solo) {
        println!("solo {c:?}: {:?} ({}, {:?})", g.text, g.finish, g.elapsed);
        assert_eq!(
            g.total_tokens,
            g.prompt_tokens + g.completion_tokens,
            "{c:?}"
        );
        assert!(g.completion_tokens <= n as u64);
    }
    let before = counted(s, &solo);
    let barrier = Barrier::new(cases.len());
    let t = Instant::now();
    let together: Vec<Gen> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    if i % 2 == 1 {
                        s.generate_stream(c.path(), &c.body(n))
                    } else {
                        s.generate(c.path(), &c.body(n))
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    println!("{} requests at once: {:?}", cases.len(), t.elapsed());
    let after = counted(s, &[&solo[..], &together[..]].concat());
    assert_eq!(after.get("llm_slots_active"), 0.0);
    for (i, ((c, alone), with)) in cases.iter().zip(&solo).zip(&together).enumerate() {
        let how = if i % 2 == 1 {
            "streamed"
        } else {
            "non-streamed"
        };
        assert_eq!(
            with.key(),
            alone.key(),
            "{c:?} {how} among {} differs from its solo run",
            cases.len()
        );
    }
    for (c, g) in cases.iter().zip(&solo) {
        assert_matches_llm_decode(g, &c.reference(model, backend, n), &format!("{c:?}"));
    }
    let requests = after.get("llm_requests_total") - before.get("llm_requests_total");
    assert!(requests >= cases.len() as f64, "{requests}");
    assert_eq!(after.get("llm_queue_depth"), 0.0);
    (before, after)
}

/// Polls /metrics until its token counters come to the usage of `answers` (every request the
/// server has served), failing if they do not within moments. (The counters may lag an answer
/// by a pass: they are updated after the request's last event is sent.)
fn counted(s: &Server, answers: &[Gen]) -> server::Metrics {
    let prompt: u64 = answers.iter().map(|g| g.prompt_tokens).sum();
    let completion: u64 = answers.iter().map(|g| g.completion_tokens).sum();
    let cached: u64 = answers.iter().map(|g| g.cached_tokens).sum();
    let what = format!(
        "{prompt} prompt tokens ({cached} cached) and {completion} completion tokens counted"
    );
    s.wait_metrics(&what, budget(10), |m| {
        m.get("llm_prompt_tokens_total") == prompt as f64
            && m.get("llm_prompt_tokens_cached_total") == cached as f64
            && m.get("llm_completion_tokens_total") == completion as f64
            // A slot is freed just after its client heard the end (and its tokens counted).
            && m.get("llm_slots_active") == 0.0
    })
}

/// The demo model on the NPU code path (`--backend auto`: the in-process emulator here):
/// 8 clients, 4 slots, mixed chats and completions.
#[test]
fn concurrent_requests_are_batch_invariant_on_the_demo_model() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend auto -t 2 --parallel 4 -c 4096"),
    );
    let topics = [
        "the capital of France",
        "why the sky is blue",
        "how bees make honey",
        "the tallest mountain",
    ];
    let mut cases = Vec::new();
    for (i, t) in topics.iter().enumerate() {
        cases.push(Case::Chat(
            "You are a concise assistant.".into(),
            format!("Tell me about {t}."),
        ));
        cases.push(Case::Completion(format!("Fact number {}: {t} is", i + 1)));
    }
    let (before, after) = concurrency(&s, &model, "auto", &cases, 24);
    // Decode rows are one per decoding request per pass: more than one per pass on average
    // means requests shared passes.
    let rows = after.get("llm_decode_rows_total") - before.get("llm_decode_rows_total");
    let passes = after.get("llm_passes_total") - before.get("llm_passes_total");
    println!("{rows} decode rows in {passes} passes");
    assert!(rows / passes > 1.5, "{rows} decode rows in {passes} passes");
}

/// Prompts of 60 to 100 tokens for the tiny model.
fn tiny_prompts() -> Vec<Case> {
    let animals = ["fox", "owl", "cat", "bee", "elk", "yak", "ant", "eel"];
    let places = [
        "river", "forest", "harbour", "desert", "garden", "valley", "island", "market",
    ];
    (0..8)
        .map(|i| {
            Case::Completion(format!(
                "Story {i}: the {} walked along the {} at dawn and met a stranger who told it about the world.",
                animals[i],
                places[(i * 3) % 8]
            ))
        })
        .collect()
}

/// The tiny model on the host f32 path: 8 clients, 4 slots. One prompt token per pass at most
/// (`--prefill-chunk 1`) keeps each request in flight long enough for the others to join: a
/// pass of more rows than one then holds rows of different requests.
#[test]
fn concurrent_requests_are_batch_invariant_on_the_tiny_model() {
    let model = server::tiny_llama();
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend f32 -t 2 --parallel 4 -c 512 --prefill-chunk 1"),
    );
    let cases = tiny_prompts();
    for c in &cases {
        let Case::Completion(p) = c else {
            unreachable!()
        };
        let n = tokenize(&s, p).len();
        assert!((40..=104).contains(&n), "{n} tokens in {p:?}");
    }
    let (before, after) = concurrency(&s, &model, "f32", &cases, 24);
    let rows = after.get("llm_pass_rows_total") - before.get("llm_pass_rows_total");
    let passes = after.get("llm_passes_total") - before.get("llm_passes_total");
    let decode = after.get("llm_decode_rows_total") - before.get("llm_decode_rows_total");
    println!("{rows} rows ({decode} decode rows) in {passes} passes");
    assert!(
        rows - passes >= 8.0,
        "{rows} rows in {passes} passes: hardly any request shared a pass"
    );
}

fn tokenize(s: &Server, text: &str) -> Vec<u64> {
    let r = s.post("/tokenize", &json!({"content": text}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// A completion the demo model keeps going on (it counts).
fn counting(max_tokens: usize) -> Json {
    json!({"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": max_tokens, "temperature": 0})
}

/// A client that closes its connection, mid-stream or while waiting for a non-streamed answer,
/// cancels its request: the slot is free within moments (not after the 2000 tokens asked
/// for), the cancellation is counted, and the slot's cache still serves a later request right.
#[test]
fn a_client_that_goes_away_cancels_its_request() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend auto -t 2 --parallel 2 -c 4096"),
    );
    let reference = s.generate(COMPLETIONS, &counting(8));
    let before = s.metrics();
    let cancelled0 = before.get("llm_requests_cancelled_total");

    // Mid-stream.
    let mut body = counting(2000);
    body["stream"] = json!(true);
    let mut st = s.open_stream(COMPLETIONS, &body).unwrap();
    assert_eq!(st.status, 200);
    assert!(
        st.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{:?}",
        st.headers
    );
    let mut pieces = 0;
    while pieces < 3 {
        let data = st.next_data().unwrap().expect("the stream goes on");
        let chunk: Json = serde_json::from_str(&data).unwrap();
        if chunk["choices"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
        {
            pieces += 1;
        }
    }
    assert_eq!(s.metrics().get("llm_slots_active"), 1.0);
    let closed = Instant::now();
    st.close();
    let m = s.wait_metrics("a closed stream frees its slot", budget(10), |m| {
        m.get("llm_slots_active") == 0.0
    });
    println!("stream: slot free {:?} after the close", closed.elapsed());
    assert!(
        m.get("llm_requests_cancelled_total") >= cancelled0 + 1.0,
        "{}",
        m.text
    );
    let generated =
        m.get("llm_completion_tokens_total") - before.get("llm_completion_tokens_total");
    assert!(
        generated < 1000.0,
        "{generated} tokens generated for a closed stream"
    );

    // Before the answer.
    let bytes = server::format_request(
        s.addr,
        "POST",
        COMPLETIONS,
        &[],
        counting(2000).to_string().as_bytes(),
    );
    let sock = std::net::TcpStream::connect(s.addr).unwrap();
    std::io::Write::write_all(&mut &sock, &bytes).unwrap();
    let so_far = m.get("llm_completion_tokens_total");
    s.wait_metrics("the non-streamed request generates", budget(30), |m| {
        m.get("llm_slots_active") == 1.0 && m.get("llm_completion_tokens_total") > so_far
    });
    let closed = Instant::now();
    sock.shutdown(std::net::Shutdown::Both).unwrap();
    drop(sock);
    let m = s.wait_metrics("a closed connection frees its slot", budget(10), |m| {
        m.get("llm_slots_active") == 0.0
    });
    println!(
        "non-streamed: slot free {:?} after the close",
        closed.elapsed()
    );
    assert!(
        m.get("llm_requests_cancelled_total") >= cancelled0 + 2.0,
        "{}",
        m.text
    );
    let generated =
        m.get("llm_completion_tokens_total") - before.get("llm_completion_tokens_total");
    assert!(
        generated < 2000.0,
        "{generated} tokens generated for closed connections"
    );

    // The slot's cache (the count the cancelled requests left) serves the same prompt again.
    let again = s.generate(COMPLETIONS, &counting(8));
    assert_eq!(again.key(), reference.key());
    assert!(again.cached_tokens > 0, "{again:?}");
}

/// Fifty streaming clients send distinct prompts of about 800 tokens to two slots, so 48 wait
/// in the queue, and all drop their connections before a first token: the queue depth and the
/// active slots of /metrics fall to 0 within moments (not after the 48 prefills the requests
/// would otherwise run to notice at their first token), all 50 are counted cancelled, and the
/// server answers the next request as before.
#[test]
fn clients_that_vanish_while_queued_free_their_places_at_once() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend auto -t 2 --parallel 2 -c 4096"),
    );
    let reference = s.generate(COMPLETIONS, &counting(8));
    let before = s.metrics();
    let prompts: Vec<String> = (0..50)
        .map(|i| format!("Client {i}. {}", long_system(800)))
        .collect();
    let lengths: Vec<usize> = prompts.iter().map(|p| tokenize(&s, p).len()).collect();
    let (shortest, longest) = (lengths.iter().min().unwrap(), lengths.iter().max().unwrap());
    assert!((700..=900).contains(shortest), "{lengths:?}");
    let clients: Vec<std::net::TcpStream> = prompts
        .iter()
        .map(|prompt| {
            let body = json!({
                "prompt": prompt, "max_tokens": 1000, "temperature": 0, "stream": true,
            });
            let bytes = server::format_request(
                s.addr,
                "POST",
                COMPLETIONS,
                &[],
                body.to_string().as_bytes(),
            );
            let sock = std::net::TcpStream::connect(s.addr).unwrap();
            std::io::Write::write_all(&mut &sock, &bytes).unwrap();
            sock
        })
        .collect();
    let m = s.wait_metrics("48 requests wait", budget(60), |m| {
        m.get("llm_queue_depth") == 48.0
    });
    // Two requests took a slot (their prompts, a BOS each), the others wait.
    let prompt = m.get("llm_prompt_tokens_total") - before.get("llm_prompt_tokens_total");
    assert!(
        prompt >= 2.0 * *shortest as f64 && prompt <= 2.0 * (*longest + 1) as f64,
        "{prompt} prompt tokens taken in by the two running requests"
    );
    let closed = Instant::now();
    for sock in clients {
        sock.shutdown(std::net::Shutdown::Both).unwrap();
    }
    let m = s.wait_metrics("the vanished clients' places are free", budget(30), |m| {
        m.get("llm_queue_depth") == 0.0 && m.get("llm_slots_active") == 0.0
    });
    println!(
        "queue empty and slots free {:?} after the clients left",
        closed.elapsed()
    );
    let cancelled =
        m.get("llm_requests_cancelled_total") - before.get("llm_requests_cancelled_total");
    assert_eq!(cancelled, 50.0, "{}", m.text);
    let passes = m.get("llm_passes_total") - before.get("llm_passes_total");
    println!("{passes} passes in all");
    assert_eq!(s.generate(COMPLETIONS, &counting(8)).key(), reference.key());
}

/// A long system message (numbered facts), about `tokens` tokens of the demo model.
fn long_system(tokens: usize) -> String {
    let colours = [
        "red", "blue", "green", "yellow", "white", "black", "purple", "orange",
    ];
    let things = [
        "house", "boat", "car", "kite", "door", "lamp", "chair", "bridge",
    ];
    let mut s = String::from("You answer questions about the following facts.\n");
    // About 14 tokens a line.
    for i in 0..tokens / 14 {
        s.push_str(&format!(
            "Fact {}: the {} {} is number {}.\n",
            i + 1,
            colours[i % 8],
            things[(i / 8) % 8],
            (i * 37) % 101
        ));
    }
    s
}

/// A chat's second turn after its first: the slot still holds the first turn, so the answer
/// reports the reused tokens, equals the cold answer (`cache_prompt: false`), and its first
/// token comes in at most a quarter of the cold time (~1000 prompt tokens against a few dozen).
#[test]
fn the_next_turn_of_a_chat_reuses_the_prompt_cache() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend auto -t 2 --parallel 2 -c 4096"),
    );
    let system = long_system(1000);
    let q1 = "What is the number of the blue house?";
    let turn1 = json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": q1}],
        "max_tokens": 16, "temperature": 0,
    });
    let a1 = s.generate(CHAT, &turn1);
    println!(
        "turn 1: {} prompt tokens, {:?}: {:?}",
        a1.prompt_tokens, a1.elapsed, a1.text
    );
    let turn2 = |cache: bool| {
        json!({
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": q1},
                {"role": "assistant", "content": a1.text},
                {"role": "user", "content": "And the number of the red house?"},
            ],
            "max_tokens": 16, "temperature": 0, "cache_prompt": cache,
        })
    };
    let warm = s.generate_stream(CHAT, &turn2(true));
    let cold = s.generate_stream(CHAT, &turn2(false));
    let (tw, tc) = (warm.first_text.unwrap(), cold.first_text.unwrap());
    println!(
        "turn 2: {} prompt tokens, {} cached; first token {tw:?} cached, {tc:?} cold",
        warm.prompt_tokens, warm.cached_tokens
    );
    assert!(
        warm.prompt_tokens >= 1000,
        "{} prompt tokens",
        warm.prompt_tokens
    );
    assert_eq!(
        warm.key(),
        cold.key(),
        "the cached turn differs from the cold one"
    );
    assert_eq!(cold.cached_tokens, 0);
    assert!(
        warm.cached_tokens * 10 >= a1.prompt_tokens * 9 && warm.cached_tokens < warm.prompt_tokens,
        "{} of {} tokens cached after a first turn of {}",
        warm.cached_tokens,
        warm.prompt_tokens,
        a1.prompt_tokens
    );
    assert!(tw * 4 <= tc, "first token {tw:?} cached vs {tc:?} cold");
    let m = s.metrics();
    assert!(m.get("llm_prompt_tokens_cached_total") >= warm.cached_tokens as f64);
}

/// Sends `body` to `path` and asserts the refusal; then the good request must answer as before.
struct Limits<'a> {
    s: &'a Server,
    good: (&'static str, Json),
    expected: Gen,
}

impl Limits<'_> {
    fn check(&self, what: &str, path: &str, body: &[u8], status: u16) {
        let r = self.s.request("POST", path, &[], body);
        assert_error(&r, status, what);
        println!("{what}: {status} {}", r.json()["error"]["message"]);
        self.still_good(what);
    }

    fn still_good(&self, what: &str) {
        assert!(self.s.alive(), "the server died after {what}");
        let g = self.s.generate(self.good.0, &self.good.1);
        assert_eq!(
            g.key(),
            self.expected.key(),
            "the good request after {what}"
        );
    }
}

/// With `--header-timeout 2`, a client sending its request's head a byte a second is
/// disconnected, unanswered, about 2 s after it connected, while other clients are served
/// meanwhile as before.
#[test]
fn a_client_slow_to_send_its_head_is_disconnected() {
    let model = server::tiny_llama();
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend f32 -c 512 --parallel 2 --header-timeout 2"),
    );
    let good = json!({"prompt": "hello world", "max_tokens": 8, "temperature": 0});
    let expected = s.generate(COMPLETIONS, &good);
    let head = server::format_request(
        s.addr,
        "POST",
        COMPLETIONS,
        &[],
        good.to_string().as_bytes(),
    );
    let sock = std::net::TcpStream::connect(s.addr).unwrap();
    sock.set_read_timeout(Some(budget(60))).unwrap();
    let connected = Instant::now();
    // The server's side: what it sends until it closes, and when it closed.
    let reader = {
        let mut sock = sock.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let end = match std::io::Read::read_to_end(&mut sock, &mut got) {
                // Closed while a byte of ours was in flight: a reset, closed all the same.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(0),
                end => end,
            };
            (connected.elapsed(), end.map(|_| got))
        })
    };
    let mut sent = 0;
    let mut served = 0;
    while !reader.is_finished() {
        if sent < head.len() && connected.elapsed() >= Duration::from_secs(sent as u64) {
            if std::io::Write::write_all(&mut &sock, &head[sent..=sent]).is_err() {
                break;
            }
            sent += 1;
        }
        // Meanwhile, another client is served as before.
        assert_eq!(s.generate(COMPLETIONS, &good).key(), expected.key());
        served += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let (closed, got) = reader.join().unwrap();
    println!(
        "closed after {closed:?}, {sent} bytes of the head sent, {served} requests served meanwhile"
    );
    let got = got.unwrap_or_else(|e| panic!("the slow connection was not closed: {e}"));
    assert!(
        got.is_empty(),
        "an answer to a head never sent whole: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(sent < head.len(), "the whole head was sent");
    assert!(
        closed >= Duration::from_millis(1900) && closed < Duration::from_secs(2) + budget(3),
        "closed {closed:?} after connecting, with --header-timeout 2"
    );
    assert!(served > 0);
    assert!(s.alive());
    assert_eq!(s.generate(COMPLETIONS, &good).key(), expected.key());
}

/// 400 for what is not a valid request, 413 past `--body-limit`, 404 off the API; each with
/// an OpenAI error object, each followed by a good request answered as before.
#[test]
fn bad_requests_get_their_errors() {
    let model = server::tiny_llama();
    let template = server::plain_template();
    let _serial = server::serial();
    let s = f32_server(
        &model,
        Some(&template),
        "-c 256 --parallel 2 --body-limit 8192",
    );
    let good = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0});
    let expected = s.generate(CHAT, &good);
    let l = Limits {
        s: &s,
        good: (CHAT, good.clone()),
        expected,
    };
    let with = |key: &str, value: Json| {
        let mut b = good.clone();
        b[key] = value;
        b.to_string().into_bytes()
    };
    l.check(
        "malformed JSON",
        CHAT,
        br#"{"messages": [{"role": "user", "#,
        400,
    );
    l.check("not an object", CHAT, b"[1, 2, 3]", 400);
    l.check("an empty body", CHAT, b"", 400);
    l.check(
        "max_tokens a string",
        CHAT,
        &with("max_tokens", json!("x")),
        400,
    );
    l.check(
        "messages a string",
        CHAT,
        &with("messages", json!("hello")),
        400,
    );
    l.check("empty messages", CHAT, &with("messages", json!([])), 400);
    l.check("missing messages", CHAT, br#"{"max_tokens": 4}"#, 400);
    l.check("temperature 5", CHAT, &with("temperature", json!(5)), 400);
    l.check(
        "temperature a string",
        CHAT,
        &with("temperature", json!("hot")),
        400,
    );
    l.check("top_p 1.5", CHAT, &with("top_p", json!(1.5)), 400);
    l.check(
        "presence_penalty 3",
        CHAT,
        &with("presence_penalty", json!(3)),
        400,
    );
    l.check("n 9", CHAT, &with("n", json!(9)), 400);
    l.check("stop a number", CHAT, &with("stop", json!(5)), 400);
    l.check("missing prompt", COMPLETIONS, br#"{"max_tokens": 4}"#, 400);
    l.check("prompt a number", COMPLETIONS, br#"{"prompt": 12}"#, 400);
    // Longer than a slot's context of 256 / 2 = 128 tokens.
    let long = "the cat sat on the mat and looked at the world. ".repeat(6);
    assert!(tokenize(&s, &long).len() > 128);
    l.check(
        "a prompt longer than a slot",
        COMPLETIONS,
        json!({"prompt": long, "max_tokens": 4})
            .to_string()
            .as_bytes(),
        400,
    );
    l.check(
        "a chat longer than a slot",
        CHAT,
        &with("messages", json!([{"role": "user", "content": long}])),
        400,
    );
    // Past the body limit (a valid request otherwise).
    let big = json!({"prompt": "x".repeat(9000), "max_tokens": 1}).to_string();
    l.check("a body over --body-limit", COMPLETIONS, big.as_bytes(), 413);
    // Tools: past the cap of 128, past the body limit (10 000 tools, a 1 MB schema), a bad
    // name, a choice of a function not listed, `required` beside a `response_format` (both
    // would constrain the reply), calls that are not a list.
    let tool = |name: String, params: Json| json!({"type": "function", "function": {"name": name, "parameters": params}});
    let tools_of = |n: usize| -> Json {
        (0..n)
            .map(|i| tool(format!("f{i}"), json!({})))
            .collect::<Vec<_>>()
            .into()
    };
    l.check("129 tools", CHAT, &with("tools", tools_of(129)), 400);
    l.check("10 000 tools", CHAT, &with("tools", tools_of(10_000)), 413);
    let huge = json!({"type": "object", "description": "x".repeat(1 << 20)});
    l.check(
        "a 1 MB schema",
        CHAT,
        &with("tools", json!([tool("f".into(), huge)])),
        413,
    );
    l.check(
        "a tool named badly",
        CHAT,
        &with("tools", json!([tool("a b".into(), json!({}))])),
        400,
    );
    let mut b = good.clone();
    b["tools"] = tools_of(2);
    b["tool_choice"] = json!({"type": "function", "function": {"name": "nope"}});
    l.check(
        "tool_choice of an unlisted function",
        CHAT,
        b.to_string().as_bytes(),
        400,
    );
    b["tool_choice"] = json!("required");
    b["response_format"] = json!({"type": "json_object"});
    l.check(
        "tool_choice required with a response_format",
        CHAT,
        b.to_string().as_bytes(),
        400,
    );
    l.check(
        "tool_calls not a list",
        CHAT,
        &with(
            "messages",
            json!([{"role": "assistant", "content": "x", "tool_calls": "f()"}]),
        ),
        400,
    );
    for (method, path) in [
        ("GET", "/v1/nothing"),
        ("POST", "/nothing"),
        ("GET", "/v2/models"),
    ] {
        let r = s.request(method, path, &[], b"");
        assert_error(&r, 404, &format!("{method} {path}"));
    }
    l.still_good("the 404s");
    let m = s.metrics();
    assert!(
        m.get_with("llm_requests_total", &[("status", "400")]) >= 17.0,
        "{}",
        m.text
    );
    assert_eq!(m.get("llm_slots_active"), 0.0);
}

/// Tools under `tool_choice: auto` on a template that does not render them (the generic form,
/// on the demo model): the prompt is the conversation of `generic_messages` (the chat answers
/// as the completion of that rendering), the model's text is the content, streamed
/// as not; a conversation with a call and its result renders them back, and a result of
/// another length changes the prompt by that much.
#[test]
fn tools_in_the_generic_form() {
    use rknn_llm::chat::{
        Message, ToolCall, ToolChoice, Tools, generic_messages, generic_reply_schema,
    };
    // The demo model (the generic form's text takes more than the tiny model's 512 tokens),
    // with the plain template, so that the prompt is known.
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let template = server::plain_template();
    let _serial = server::serial();
    let s = f32_server(&model, Some(&template), "-c 2048 --parallel 1");
    let tools = json!([{"type": "function", "function": {"name": "w",
        "parameters": {"type": "object", "properties": {"c": {"type": "string"}}}}}]);
    let lib_tools = Tools::from_json(&tools.to_string()).unwrap();
    let as_pairs = |msgs: &[Message]| -> String {
        let pairs: Vec<(&str, &str)> = msgs
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        server::render_plain(&pairs)
    };
    let call = ToolCall {
        id: Some("call_1".into()),
        ..ToolCall::new("w", r#"{"c":"Paris"}"#)
    };
    for result in ["sunny", "sunny, 22 degrees, light wind from the west"] {
        for (what, msgs, body_msgs) in [
            (
                "a request",
                vec![Message::user("weather in Paris?")],
                json!([{"role": "user", "content": "weather in Paris?"}]),
            ),
            (
                "a call and its result",
                vec![
                    Message::user("weather in Paris?"),
                    Message::assistant_calls("", vec![call.clone()]),
                    Message::tool("call_1", result),
                ],
                json!([
                    {"role": "user", "content": "weather in Paris?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"c\":\"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": result},
                ]),
            ),
        ] {
            let body =
                json!({"messages": body_msgs, "tools": tools, "max_tokens": 12, "temperature": 0});
            let r = s.post(CHAT, &body);
            assert_eq!(r.status, 200, "{what}: {}", r.text());
            let a = r.json();
            let message = &a["choices"][0]["message"];
            assert!(message.get("tool_calls").is_none(), "{what}: {a}");
            assert_ne!(
                a["choices"][0]["finish_reason"], "tool_calls",
                "{what}: {a}"
            );
            let chat = Gen::from_answer(&a);
            let rendered = as_pairs(&generic_messages(
                &msgs,
                &lib_tools,
                &ToolChoice::Auto,
                true,
            ));
            assert!(rendered.contains(result) || what == "a request");
            // Under `auto` the generic form's reply is constrained to a call or a text reply:
            // the completion under the same schema.
            let schema: Json = serde_json::from_str(
                &generic_reply_schema(&lib_tools, &ToolChoice::Auto, true).unwrap(),
            )
            .unwrap();
            let c = s.generate(
                COMPLETIONS,
                &json!({"prompt": rendered, "max_tokens": 12, "temperature": 0, "json_schema": schema}),
            );
            assert_eq!(
                chat.key(),
                c.key(),
                "{what}: the chat is the constrained completion of its generic form"
            );
            let streamed = s.generate_stream(CHAT, &body);
            assert_eq!(streamed.text, chat.text, "{what}");
            assert_eq!(streamed.finish, chat.finish, "{what}");
        }
    }
    // `none`: the tools are not described.
    let plain =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0});
    let mut none = plain.clone();
    none["tools"] = tools.clone();
    none["tool_choice"] = json!("none");
    assert_eq!(
        s.generate(CHAT, &none).key(),
        s.generate(CHAT, &plain).key()
    );
}

/// A call streamed as OpenAI streams one (`tool_choice: required` and `parallel_tool_calls:
/// false` on the demo model, so the generic form's reply is one call): per choice a first `delta.tool_calls` chunk with the call's
/// `index`, `id`, `type` and name and empty arguments, then chunks of argument pieces alone,
/// which put together are the non-streamed reply's arguments; no content; `finish_reason:
/// "tool_calls"`. Two choices (`n: 2`, sampled) are streamed each under its own `index`, each
/// equal to the non-streamed choice of the same seed.
#[test]
fn a_streamed_call_arrives_in_pieces() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let _serial = server::serial();
    let s = f32_server(&model, None, "-c 2048 --parallel 2");
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"], "additionalProperties": false}}}]);
    let body = json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools, "tool_choice": "required", "max_tokens": 80, "temperature": 0.8,
        "seed": 7, "n": 2, "parallel_tool_calls": false});
    let whole = s.post(CHAT, &body);
    assert_eq!(whole.status, 200, "{}", whole.text());
    let whole = whole.json();
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let mut st = s.open_stream(CHAT, &stream_body).expect("stream");
    assert_eq!(st.status, 200);
    let mut events: Vec<Json> = Vec::new();
    while let Some(d) = st.next_data().expect("event") {
        if d == "[DONE]" {
            break;
        }
        events.push(serde_json::from_str(&d).expect("json"));
    }
    for choice in 0..2 {
        let want = &whole["choices"][choice];
        assert_eq!(want["finish_reason"], "tool_calls", "{whole}");
        let want_calls = want["message"]["tool_calls"].as_array().expect("calls");
        let chunks: Vec<&Json> = events
            .iter()
            .map(|e| &e["choices"][0])
            .filter(|c| c["index"] == json!(choice))
            .collect();
        let calls: Vec<&Json> = chunks
            .iter()
            .filter_map(|c| c["delta"].get("tool_calls"))
            .collect();
        let mut ids = Vec::new();
        for (k, want_call) in want_calls.iter().enumerate() {
            let of_k: Vec<&Json> = calls
                .iter()
                .map(|c| {
                    assert_eq!(c.as_array().map(Vec::len), Some(1), "{c}");
                    &c[0]
                })
                .filter(|c| c["index"] == json!(k))
                .collect();
            assert!(of_k.len() > 2, "call {k} in pieces: {of_k:?}");
            let first = of_k[0];
            assert_eq!(first["type"], "function");
            assert_eq!(first["function"]["name"], want_call["function"]["name"]);
            assert_eq!(first["function"]["arguments"], "");
            let id = first["id"].as_str().expect("an id");
            assert!(
                id.len() == 29
                    && id.starts_with("call_")
                    && id[5..].bytes().all(|b| b.is_ascii_alphanumeric()),
                "{id}"
            );
            ids.push(id.to_string());
            let mut args = String::new();
            for c in &of_k[1..] {
                assert!(
                    c.get("id").is_none() && c["function"].get("name").is_none(),
                    "{c}"
                );
                args.push_str(c["function"]["arguments"].as_str().expect("a piece"));
            }
            assert_eq!(args, want_call["function"]["arguments"].as_str().unwrap());
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), want_calls.len());
        assert!(
            calls
                .iter()
                .all(|c| c[0]["index"].as_u64() < Some(want_calls.len() as u64))
        );
        let text: String = chunks
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "", "no content beside the call");
        let finishes: Vec<&Json> = chunks
            .iter()
            .map(|c| &c["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finishes, [&json!("tool_calls")]);
        assert!(chunks.last().unwrap()["finish_reason"] == "tool_calls");
    }
}

/// Phi-4-mini's template (the fixture's copy) on the demo model: the tools reach it in the
/// system message (the prompt is the library's rendering of `phi4mini_messages`, token for
/// token), and `tool_choice: required` gives a call in its format, read back as `tool_calls`,
/// streamed in pieces that put together are the non-streamed arguments.
#[test]
fn phi4_minis_template_takes_tools_in_its_system_message() {
    use rknn_llm::chat::{ChatOptions, ChatTemplate, Message, ToolCall, ToolChoice, Tools};
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let fixture: Json = serde_json::from_str(
        &std::fs::read_to_string(
            common::workspace_root().join("examples/llm/tests/fixtures/chat/templates.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let source = fixture["templates"]["microsoft-Phi-4-mini-instruct"]["source"]
        .as_str()
        .unwrap();
    let path = std::env::temp_dir().join(format!("llm-server-phi4-{}.jinja", std::process::id()));
    std::fs::write(&path, source).unwrap();
    let _serial = server::serial();
    let s = f32_server(&model, Some(&path), "-c 2048 --parallel 1");
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"], "additionalProperties": false}}}]);
    let body = json!({
        "messages": [
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "And in Paris?"},
        ],
        "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
        "max_tokens": 60, "temperature": 0,
    });
    let lib_tools = Tools::from_json(&tools.to_string()).unwrap();
    let messages = rknn_llm::chat::phi4mini_messages(
        &[
            Message::user("Weather in Rome?"),
            Message::assistant_calls(
                "",
                vec![ToolCall {
                    id: Some("call_1".into()),
                    ..ToolCall::new("get_weather", r#"{"city": "Rome"}"#)
                }],
            ),
            Message::tool("call_1", "sunny"),
            Message::user("And in Paris?"),
        ],
        &lib_tools,
        &ToolChoice::Required,
    );
    let rendered = ChatTemplate::new("phi4", source)
        .unwrap()
        .render(&messages, true, &ChatOptions::default())
        .unwrap();
    assert!(
        rendered.starts_with(
            "<|system|>You are a helpful assistant with some tools.<|tool|>[{\"name\": \"get_weather\""
        ) && rendered.contains(
            "<|assistant|><|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]<|/tool_call|><|end|><|tool|>sunny<|end|>"
        ),
        "{rendered}"
    );
    let r = s.post(CHAT, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    assert_eq!(
        a["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        tokenize(&s, &rendered).len(),
        "the prompt is the library's rendering"
    );
    let choice = &a["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{a}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{a}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args = calls[0]["function"]["arguments"].as_str().unwrap();
    let parsed: Json = serde_json::from_str(args).unwrap();
    assert!(parsed["city"].is_string(), "{args}");
    let (pieces, finish) = streamed_call(&s, &body);
    assert!(pieces.len() > 2, "{pieces:?}");
    assert_eq!(pieces[0], "");
    assert_eq!(pieces.concat(), args);
    assert_eq!(finish, "tool_calls");
    let _ = std::fs::remove_file(&path);
}

/// `body` sent streamed: the pieces of the first call's arguments, in order, and the finish
/// reason.
fn streamed_call(s: &Server, body: &Json) -> (Vec<String>, Json) {
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let mut st = s.open_stream(CHAT, &stream_body).expect("stream");
    let mut pieces = Vec::new();
    let mut finish = Json::Null;
    while let Some(d) = st.next_data().expect("event") {
        if d == "[DONE]" {
            break;
        }
        let e: Json = serde_json::from_str(&d).unwrap();
        let c = &e["choices"][0];
        if let Some(tc) = c["delta"].get("tool_calls") {
            pieces.push(tc[0]["function"]["arguments"].as_str().unwrap().to_string());
        }
        if !c["finish_reason"].is_null() {
            finish = c["finish_reason"].clone();
        }
    }
    (pieces, finish)
}

/// Qwen XML's and LFM2's forms on the demo model, each through a small template that renders
/// `tools` and holds the format's markers (so the server picks the format): `tool_choice:
/// required` gives a call in the format, constrained by its grammar, read back as `tool_calls`
/// with an integer argument within its schema's bounds, and streamed in pieces that put
/// together are the non-streamed arguments.
#[test]
fn qwen_xml_and_lfm2_calls_under_required() {
    use rknn_llm::chat::{ChatOptions, ChatTemplate, Message, Tools};
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let templates = [
        (
            "qwen-xml",
            "{% if tools %}Tools: {% for t in tools %}{{ t.function.name }} {% endfor %}\
             Call as <tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>\n</function>\n</tool_call>\n\
             {% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
             <|im_start|>assistant\n",
        ),
        (
            "lfm2",
            "{% if tools %}List of tools: [{% for t in tools %}{{ t | tojson }}{% endfor %}]\n{% endif %}\
             {% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
             <|im_start|>assistant\n",
        ),
    ];
    let tools = json!([{"type": "function", "function": {"name": "get_forecast",
        "description": "The forecast for the next days.",
        "parameters": {"type": "object", "properties": {
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["days"], "additionalProperties": false}}}]);
    let body = json!({
        "messages": [{"role": "user", "content": "Forecast for 3 days?"}],
        "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
        "max_tokens": 40, "temperature": 0,
    });
    let _serial = server::serial();
    for (name, source) in templates {
        let path =
            std::env::temp_dir().join(format!("llm-server-{name}-{}.jinja", std::process::id()));
        std::fs::write(&path, source).unwrap();
        let s = f32_server(&model, Some(&path), "-c 1024 --parallel 1");
        let r = s.post(CHAT, &body);
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        let a = r.json();
        // The template got the tools itself (not the generic form's system message).
        let rendered = ChatTemplate::new(name, source)
            .unwrap()
            .render(
                &[Message::user("Forecast for 3 days?")],
                true,
                &ChatOptions {
                    tools: Some(Tools::from_json(&tools.to_string()).unwrap()),
                    ..ChatOptions::default()
                },
            )
            .unwrap();
        assert!(rendered.contains("get_forecast"), "{rendered}");
        assert_eq!(
            a["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
            tokenize(&s, &rendered).len(),
            "{name}: the prompt is the template's rendering with the tools"
        );
        let choice = &a["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{name}: {a}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{name}: {a}");
        assert_eq!(calls[0]["function"]["name"], "get_forecast");
        let args = calls[0]["function"]["arguments"].as_str().unwrap();
        let parsed: Json = serde_json::from_str(args).unwrap();
        let days = parsed["days"]
            .as_i64()
            .unwrap_or_else(|| panic!("{name}: {args}"));
        assert!((1..=7).contains(&days), "{name}: {args}");
        let (pieces, finish) = streamed_call(&s, &body);
        assert!(pieces.len() > 2, "{name}: {pieces:?}");
        assert_eq!(pieces[0], "", "{name}");
        assert_eq!(pieces.concat(), args, "{name}");
        assert_eq!(finish, "tool_calls", "{name}");
        drop(s);
        let _ = std::fs::remove_file(&path);
    }
}

/// Tools reach a template that renders them as its `tools`, and calls and results as the
/// messages' `tool_calls` (arguments as objects) and `tool` messages: the chat answers as the
/// completion of the library's rendering with those tools; the tiny model writes no
/// `<tool_call>`, so its text is the content, streamed as not.
#[test]
fn tools_reach_a_template_that_renders_them() {
    use rknn_llm::chat::{ChatOptions, ChatTemplate, Message, ToolCall, Tools};
    let model = server::tiny_llama();
    let _serial = server::serial();
    let source = "{% if tools %}[{% for t in tools %}{{ t.function.name }}{% endfor %}]{% endif %}\
        {% for m in messages %}<{{ m.role }}>{{ m.content }}{% for c in m.tool_calls or [] %}\
        <tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endfor %}<assistant>";
    let path = std::env::temp_dir().join(format!("llm-server-tools-{}.jinja", std::process::id()));
    std::fs::write(&path, source).unwrap();
    let s = f32_server(&model, Some(&path), "-c 512 --parallel 1");
    let tools =
        json!([{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]);
    let body = json!({
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"c\": 1}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ],
        "tools": tools, "max_tokens": 8, "temperature": 0,
    });
    let template = ChatTemplate::new("t", source).unwrap();
    let options = ChatOptions {
        tools: Some(Tools::from_json(&tools.to_string()).unwrap()),
        ..ChatOptions::default()
    };
    let call = ToolCall {
        id: Some("call_1".into()),
        ..ToolCall::new("w", r#"{"c": 1}"#)
    };
    let messages = [
        Message::user("hi"),
        Message::assistant_calls("", vec![call]),
        Message::tool("call_1", "ok"),
    ];
    let rendered = template.render(&messages, true, &options).unwrap();
    assert_eq!(
        rendered,
        r#"[w]<user>hi<assistant><tool_call>{"name": "w", "arguments": {"c": 1}}</tool_call><tool>ok<assistant>"#
    );
    let a = s.post(CHAT, &body).json();
    assert!(
        a["choices"][0]["message"].get("tool_calls").is_none(),
        "{a}"
    );
    let chat = Gen::from_answer(&a);
    let c = s.generate(
        COMPLETIONS,
        &json!({"prompt": rendered, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(chat.key(), c.key());
    let streamed = s.generate_stream(CHAT, &body);
    assert_eq!((streamed.text, streamed.finish), (chat.text, chat.finish));
    let _ = std::fs::remove_file(&path);
}

/// With `--api-key`, the API needs `Authorization: Bearer KEY` (401 otherwise); /health does not.
#[test]
fn an_api_key_guards_the_api() {
    let model = server::tiny_llama();
    let _serial = server::serial();
    let s = f32_server(&model, None, "-c 512 --api-key sekrit-42");
    let body = json!({"prompt": "hello world", "max_tokens": 4, "temperature": 0}).to_string();
    let post = |headers: &[(&str, &str)]| s.request("POST", COMPLETIONS, headers, body.as_bytes());
    assert_error(&post(&[]), 401, "no key");
    assert_error(
        &post(&[("Authorization", "Bearer wrong")]),
        401,
        "a wrong key",
    );
    assert_error(
        &post(&[("Authorization", "sekrit-42")]),
        401,
        "the key without Bearer",
    );
    assert_error(
        &s.request(
            "POST",
            CHAT,
            &[],
            json!({"messages": [{"role": "user", "content": "hi"}]})
                .to_string()
                .as_bytes(),
        ),
        401,
        "chat without a key",
    );
    let r = post(&[("Authorization", "Bearer sekrit-42")]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(Gen::from_answer(&r.json()).completion_tokens, 4);
    let h = s.get("/health");
    assert_eq!(h.status, 200, "{}", h.text());
}

/// One slot and no queue: a second request while a stream runs is refused with 503 and
/// Retry-After; a request past `--timeout` gets 504; a short one after both is served.
#[test]
fn a_full_server_says_503_and_a_late_request_504() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend auto -t 2 --parallel 1 --queue 0 -c 4096 --timeout 4"),
    );
    let short = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    let expected = s.generate(COMPLETIONS, &short);
    let mut body = counting(2000);
    body["stream"] = json!(true);
    let mut st = s.open_stream(COMPLETIONS, &body).unwrap();
    assert_eq!(st.status, 200);
    st.next_data().unwrap().expect("a first chunk");
    let r = s.post(COMPLETIONS, &short);
    assert_error(&r, 503, "a request while the only slot is busy");
    let retry = r
        .header("retry-after")
        .expect("a Retry-After header on 503");
    assert!(retry.parse::<u64>().is_ok(), "Retry-After: {retry:?}");
    st.close();
    s.wait_metrics("the closed stream frees the slot", budget(10), |m| {
        m.get("llm_slots_active") == 0.0
    });
    assert_eq!(s.generate(COMPLETIONS, &short).key(), expected.key());

    let t = Instant::now();
    let r = s.post(COMPLETIONS, &counting(2000));
    let took = t.elapsed();
    assert_error(&r, 504, "a request past --timeout");
    println!("504 after {took:?}");
    assert!(
        took >= Duration::from_millis(3900) && took < Duration::from_secs(4) + budget(10),
        "504 after {took:?} with --timeout 4"
    );
    s.wait_metrics("the late request frees the slot", budget(10), |m| {
        m.get("llm_slots_active") == 0.0
    });
    assert_eq!(s.generate(COMPLETIONS, &short).key(), expected.key());
}

/// The shapes of OpenAI's answers on the tiny model with a plain template: ids and objects,
/// the alias in /v1/models and in answers, a stream's chunks (one id, a finish reason, the usage
/// chunk last, `[DONE]`) equal to the non-streamed answer, a chat equal to the completion of
/// its rendered template, /tokenize equal to `llm-decode --tokenize`, max_tokens and stop.
#[test]
fn answers_have_openai_shapes() {
    let model = server::tiny_llama();
    let template = server::plain_template();
    let _serial = server::serial();
    let s = f32_server(&model, Some(&template), "-c 512 -a tiny-test");
    let models = s.get("/v1/models");
    assert_eq!(models.status, 200);
    let models = models.json();
    assert_eq!(models["object"], "list", "{models}");
    assert_eq!(models["data"][0]["id"], "tiny-test", "{models}");
    assert_eq!(models["data"][0]["object"], "model", "{models}");

    // /tokenize and /detokenize against llm-decode's tokenizer.
    let text = "hello world, the sea";
    let ids = tokenize(&s, text);
    let mut cmd = common::llm_decode();
    cmd.arg("-m")
        .arg(&model)
        .args(["-p", text, "--tokenize", "--json"]);
    let reference: Vec<u64> = serde_json::from_value(common::run_json(cmd, &[])).unwrap();
    assert_eq!(ids, reference);
    let r = s.post("/detokenize", &json!({"tokens": ids}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"], text);

    // A chat is the completion of its rendered template.
    let messages = [("system", "be brief"), ("user", "the sea")];
    let chat = json!({
        "messages": messages.iter().map(|(r, c)| json!({"role": r, "content": c})).collect::<Vec<_>>(),
        "max_tokens": 20, "temperature": 0,
    });
    let r = s.post(CHAT, &chat);
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    assert_eq!(a["object"], "chat.completion", "{a}");
    assert_eq!(a["model"], "tiny-test", "{a}");
    assert!(a["id"].as_str().is_some_and(|i| !i.is_empty()), "{a}");
    assert_eq!(a["choices"][0]["message"]["role"], "assistant", "{a}");
    assert_eq!(a["choices"][0]["index"], 0, "{a}");
    let chat_gen = Gen::from_answer(&a);
    let rendered = server::render_plain(&messages);
    let completion = json!({"prompt": rendered, "max_tokens": 20, "temperature": 0});
    let r = s.post(COMPLETIONS, &completion);
    assert_eq!(r.status, 200, "{}", r.text());
    let c = r.json();
    assert_eq!(c["object"], "text_completion", "{c}");
    assert_eq!(Gen::from_answer(&c).key(), chat_gen.key());
    assert_eq!(
        chat_gen.prompt_tokens as usize,
        tokenize(&s, &rendered).len()
    );
    assert_eq!(
        chat_gen.total_tokens,
        chat_gen.prompt_tokens + chat_gen.completion_tokens
    );

    // Streams equal the answers.
    for (path, body, answer) in [
        (CHAT, &chat, &chat_gen),
        (COMPLETIONS, &completion, &chat_gen),
    ] {
        let g = s.generate_stream(path, body);
        assert_eq!(g.key(), answer.key(), "{path} streamed");
        assert_eq!(g.total_tokens, answer.total_tokens);
        let object = if path == CHAT {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let id = &g.chunks[0]["id"];
        assert!(
            id.as_str().is_some_and(|i| !i.is_empty()),
            "{:?}",
            g.chunks[0]
        );
        for chunk in &g.chunks {
            assert_eq!(&chunk["id"], id, "one id for the stream: {chunk}");
            assert_eq!(chunk["object"], object, "{chunk}");
        }
        assert_eq!(g.chunks.last().unwrap()["choices"], json!([]), "usage last");
    }
    // Without include_usage there is no usage chunk.
    let mut body = completion.clone();
    body["stream"] = json!(true);
    let mut st = s.open_stream(COMPLETIONS, &body).unwrap();
    let g = st.collect(Instant::now()).unwrap();
    assert_eq!(g.text, chat_gen.text);
    assert!(g.chunks.iter().all(|c| c["choices"] != json!([])));

    // max_tokens, and a stop string that ends the text before it.
    let plain = |extra: Json| {
        let mut b = json!({"prompt": "hello world", "max_tokens": 24, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        s.generate(COMPLETIONS, &b)
    };
    let full = plain(json!({}));
    assert_eq!(
        (full.finish.as_str(), full.completion_tokens),
        ("length", 24),
        "{full:?}"
    );
    let five = plain(json!({"max_tokens": 5}));
    assert_eq!(
        (five.finish.as_str(), five.completion_tokens),
        ("length", 5)
    );
    assert!(full.text.starts_with(&five.text), "{five:?} vs {full:?}");
    let chars: Vec<char> = full.text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = &full.text[..full.text.find(&stop).unwrap()];
    for stop_value in [json!(stop), json!(["\u{1}never", stop])] {
        let g = plain(json!({"stop": stop_value}));
        assert_eq!(
            (g.text.as_str(), g.finish.as_str()),
            (cut, "stop"),
            "stop {stop_value}"
        );
        let mut b = json!({"prompt": "hello world", "max_tokens": 24, "temperature": 0});
        b["stop"] = stop_value.clone();
        let st = s.generate_stream(COMPLETIONS, &b);
        assert_eq!(
            (st.text.as_str(), st.finish.as_str()),
            (cut, "stop"),
            "streamed stop {stop_value}"
        );
    }
}

/// The chat's `logprobs.content` entries of an answer, or of every chunk of a stream in order.
fn chat_logprobs(choices: &[&Json]) -> Vec<Json> {
    choices
        .iter()
        .filter_map(|c| c["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect()
}

/// A completion's four `logprobs` lists of an answer, or of every chunk of a stream joined.
fn completion_logprobs(choices: &[&Json]) -> [Vec<Json>; 4] {
    let mut out: [Vec<Json>; 4] = Default::default();
    for c in choices.iter().filter(|c| !c["logprobs"].is_null()) {
        for (list, key) in
            out.iter_mut()
                .zip(["tokens", "token_logprobs", "top_logprobs", "text_offset"])
        {
            list.extend(c["logprobs"][key].as_array().unwrap().iter().cloned());
        }
    }
    out
}

/// The bytes of `entry` (`bytes`: a list of numbers).
fn bytes_of(entry: &Json) -> Vec<u8> {
    entry
        .as_array()
        .unwrap()
        .iter()
        .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
        .collect()
}

/// Log-probabilities in OpenAI's shapes: a chat's `logprobs.content` (token, logprob, bytes,
/// `top_logprobs`), one entry per completion token whose bytes spell the text, the greedy
/// choice the first alternative, the same entries streamed (each chunk its own tokens), and
/// the same values as the library's `Piece::logprobs`; a completion's four lists, `text_offset`
/// from the prompt's length; `n_probs`; the refusals.
#[test]
fn logprobs_have_openai_shapes() {
    let _serial = server::serial();
    let s = tiny_plain_server(256, 4);
    let chat = json!({
        "messages": [{"role": "user", "content": "the sea"}],
        "max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 3,
    });
    let r = s.post(CHAT, &chat);
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    let content = chat_logprobs(&[&a["choices"][0]]);
    let g = Gen::from_answer(&a);
    assert_eq!(content.len() as u64, g.completion_tokens, "{a}");
    assert_eq!(a["choices"][0]["logprobs"]["refusal"], Json::Null, "{a}");
    let mut spelled = Vec::new();
    for e in &content {
        let bytes = bytes_of(&e["bytes"]);
        assert_eq!(e["token"], json!(String::from_utf8_lossy(&bytes)), "{e}");
        spelled.extend_from_slice(&bytes);
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{e}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(
            (&top[0]["token"], &top[0]["logprob"]),
            (&e["token"], &e["logprob"])
        );
        for pair in top.windows(2) {
            assert!(
                pair[0]["logprob"].as_f64() >= pair[1]["logprob"].as_f64(),
                "{e}"
            );
        }
        for t in top {
            let b = bytes_of(&t["bytes"]);
            assert_eq!(t["token"], json!(String::from_utf8_lossy(&b)), "{t}");
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&spelled),
        g.text,
        "the tokens spell the text"
    );
    // The library's logprobs for the same prompt, through the same batcher code path.
    let lib = {
        let loaded = rknn_llm::Model::builder(server::tiny_llama())
            .backend(rknn_llm::Backend::F32)
            .load()
            .unwrap();
        let greedy = rknn_llm::sample::SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        };
        let tok = loaded.tokenizer.clone();
        let mut session = rknn_llm::session::Session::new(loaded.model, tok, greedy).unwrap();
        let rendered = server::render_plain(&[("user", "the sea")]);
        let ids = rknn_llm::chat::encode_prompt(&loaded.tokenizer, &rendered).unwrap();
        let params = rknn_llm::session::GenerateParams {
            max_tokens: Some(12),
            logprobs: Some(3),
            ..Default::default()
        };
        let g = session.generate_tokens(&ids, &params).unwrap();
        g.filter_map(|p| p.unwrap().logprobs).collect::<Vec<_>>()
    };
    assert_eq!(lib.len(), content.len());
    // The f32 values, through JSON's decimal digits.
    let f32_of = |v: &Json| v.as_f64().unwrap() as f32;
    for (l, e) in lib.iter().zip(&content) {
        assert_eq!(l.logprob, f32_of(&e["logprob"]), "{e}");
        let top: Vec<f32> = l.top.iter().map(|t| t.1).collect();
        let got: Vec<f32> = e["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| f32_of(&t["logprob"]))
            .collect();
        assert_eq!(top, got, "{e}");
    }
    // Streamed: the same entries, spread over the chunks with text.
    let st = s.generate_stream(CHAT, &chat);
    let choices: Vec<&Json> = st
        .chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .collect();
    assert_eq!(chat_logprobs(&choices), content);
    for c in &choices {
        let lp = chat_logprobs(&[c]);
        let text = c["delta"]["content"].as_str().unwrap_or_default();
        if !lp.is_empty() {
            let b: Vec<u8> = lp.iter().flat_map(|e| bytes_of(&e["bytes"])).collect();
            assert!(String::from_utf8_lossy(&b).ends_with(text), "{c}");
        }
    }
    // llama-server's n_probs asks the same.
    let mut by_n_probs = json!({"messages": chat["messages"], "max_tokens": 12, "temperature": 0});
    by_n_probs["n_probs"] = json!(3);
    let b = s.post(CHAT, &by_n_probs).json();
    assert_eq!(chat_logprobs(&[&b["choices"][0]]), content);
    // Not asked: null.
    let mut plain = chat.clone();
    plain["logprobs"] = json!(false);
    plain["top_logprobs"] = Json::Null;
    let p = s.post(CHAT, &plain).json();
    assert_eq!(p["choices"][0]["logprobs"], Json::Null, "{p}");

    // Completions: four lists, text_offset from the prompt's characters.
    let prompt = "héllo world";
    let body = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "logprobs": 2});
    let c = s.post(COMPLETIONS, &body).json();
    let [tokens, logprobs, tops, offsets] = completion_logprobs(&[&c["choices"][0]]);
    let g = Gen::from_answer(&c);
    assert_eq!(tokens.len() as u64, g.completion_tokens, "{c}");
    assert_eq!(tokens.concat_strings(), g.text);
    let mut at = prompt.chars().count() as u64;
    for i in 0..tokens.len() {
        let top = tops[i].as_object().unwrap();
        // The chosen token and the 2 alternatives (the chosen the first of them, greedy),
        // fewer where texts coincide (byte tokens are all "\u{fffd}").
        assert!((1..=3).contains(&top.len()), "{c}");
        assert_eq!(top[tokens[i].as_str().unwrap()], logprobs[i], "{c}");
        assert_eq!(offsets[i], json!(at), "{c}");
        at += tokens[i].as_str().unwrap().chars().count() as u64;
    }
    let st = s.generate_stream(COMPLETIONS, &body);
    let choices: Vec<&Json> = st
        .chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .collect();
    assert_eq!(
        completion_logprobs(&choices),
        [tokens, logprobs, tops, offsets]
    );

    // A stop string: every generated token has its entry (those of the stop string too, the
    // text leaves it out), streamed as not.
    let text: Vec<char> = g.text.chars().collect();
    let stop: String = text[text.len() / 2..text.len() / 2 + 2].iter().collect();
    let mut stopped = body.clone();
    stopped["stop"] = json!(stop);
    let c = s.post(COMPLETIONS, &stopped).json();
    let whole = completion_logprobs(&[&c["choices"][0]]);
    let g = Gen::from_answer(&c);
    assert_eq!(g.finish, "stop", "{c}");
    assert_eq!(whole[0].len() as u64, g.completion_tokens, "{c}");
    let st = s.generate_stream(COMPLETIONS, &stopped);
    let choices: Vec<&Json> = st
        .chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .collect();
    assert_eq!(completion_logprobs(&choices), whole);

    // The refusals.
    for (path, extra, param) in [
        (CHAT, json!({"top_logprobs": 2}), "top_logprobs"),
        (
            CHAT,
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (COMPLETIONS, json!({"logprobs": 6}), "logprobs"),
        (COMPLETIONS, json!({"n_probs": 21}), "n_probs"),
    ] {
        let mut b = if path == CHAT {
            json!({"messages": chat["messages"]})
        } else {
            json!({"prompt": prompt})
        };
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = s.post(path, &b);
        assert_error(&r, 400, &format!("{path} {extra}"));
        assert_eq!(r.json()["error"]["param"], param, "{extra}");
    }
}

/// Joins a list of JSON strings.
trait ConcatStrings {
    fn concat_strings(&self) -> String;
}

impl ConcatStrings for Vec<Json> {
    fn concat_strings(&self) -> String {
        self.iter().map(|t| t.as_str().unwrap()).collect()
    }
}

/// `response_format` (json_object, json_schema), llama-server's `json_schema` and `grammar`:
/// every answer, streamed or not, chat or completion, follows its constraint and ends with
/// `stop`, the same streamed and not; `max_tokens` cuts one with `length`; what cannot be
/// enforced, or does not compile, is a 400 naming the field and the reason, and the server
/// goes on. On the tiny random model, whose logits favour no JSON: the constraint alone makes
/// the answers valid (finite languages, so that every answer ends).
#[test]
fn structured_output_follows_its_constraint() {
    let _serial = server::serial();
    let s = tiny_plain_server(512, 2);
    let schema = json!({
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
            "ok": {"type": "boolean"}
        },
        "required": ["colour", "count", "ok"],
        "additionalProperties": false
    });
    let v = jsonschema::options().build(&schema).unwrap();
    let fields = [
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": true}}),
        ),
        ("json_schema", schema.clone()),
    ];
    for (field, value) in fields {
        for (path, prompt_field, prompt) in [
            (
                CHAT,
                "messages",
                json!([{"role": "user", "content": "colour?"}]),
            ),
            (COMPLETIONS, "prompt", json!("colour:")),
        ] {
            for temperature in [0.0, 1.0] {
                let mut body = json!({"max_tokens": 64, "temperature": temperature, "seed": 3});
                body[prompt_field] = prompt.clone();
                body[field] = value.clone();
                let g = s.generate(path, &body);
                let what = format!("{field} {path} t={temperature}: {:?}", g.text);
                assert_eq!(g.finish, "stop", "{what}");
                let doc: Json = serde_json::from_str(&g.text).expect(&what);
                assert!(v.is_valid(&doc), "{what}");
                let streamed = s.generate_stream(path, &body);
                assert_eq!(streamed.key(), g.key(), "{what}: streamed");
            }
        }
    }
    // json_object and a GBNF grammar.
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 400,
                      "temperature": 0, "response_format": {"type": "json_object"}});
    let g = s.generate(CHAT, &body);
    if g.finish == "stop" {
        assert!(
            serde_json::from_str::<Json>(&g.text).unwrap().is_object(),
            "{}",
            g.text
        );
    } else {
        assert_eq!(g.finish, "length");
        assert!(g.text.starts_with('{'), "{}", g.text);
    }
    let gbnf = "root ::= (\"yes\" | \"no\") \", \" [0-9] [0-9]?\n";
    let body = json!({"prompt": "answer:", "max_tokens": 16, "temperature": 1, "seed": 5, "grammar": gbnf});
    let g = s.generate(COMPLETIONS, &body);
    assert_eq!(g.finish, "stop");
    let re = fancy_regex::Regex::new(r"^(yes|no), [0-9][0-9]?$").unwrap();
    assert!(re.is_match(&g.text).unwrap(), "{}", g.text);
    // max_tokens cuts it: `length`, an unfinished object.
    let body = json!({"prompt": "x", "max_tokens": 3, "temperature": 0, "json_schema": schema});
    let g = s.generate(COMPLETIONS, &body);
    assert_eq!(g.finish, "length");
    assert!(serde_json::from_str::<Json>(&g.text).is_err());
    // Refusals name the field and the reason.
    let bad = [
        (
            json!({"json_schema": {"type": "array", "uniqueItems": true}}),
            "json_schema",
            "uniqueItems",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}}),
            "response_format",
            "not",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
            "xml",
        ),
        (
            json!({"response_format": {"type": "json_object", "extra": 1}}),
            "response_format",
            "extra",
        ),
        (
            json!({"response_format": "json"}),
            "response_format",
            "must be an object",
        ),
        (
            json!({"grammar": "root ::= nothing\n"}),
            "grammar",
            "`nothing`, which is not defined",
        ),
        (
            json!({"grammar": "%llguidance {}\nstart: (\n"}),
            "grammar",
            "lark",
        ),
        (
            json!({"grammar": "root ::= \"a\"", "json_schema": {}}),
            "grammar",
            "give one of",
        ),
        (
            json!({"json_schema": "object"}),
            "json_schema",
            "JSON Schema object",
        ),
    ];
    for (extra, param, needle) in bad {
        let mut body = json!({"prompt": "x", "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = s.request("POST", COMPLETIONS, &[], body.to_string().as_bytes());
        assert_error(&r, 400, &format!("{extra}"));
        let e = r.json();
        assert_eq!(e["error"]["param"], json!(param), "{e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{extra}: {msg}");
    }
    assert!(s.alive());
}

const EMBEDDINGS: &str = "/v1/embeddings";

/// The vectors of an embeddings answer, checked for OpenAI's shape (float or base64).
fn vectors(r: &server::Response, n: usize, base64: bool) -> Vec<Vec<f32>> {
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = r.json();
    assert_eq!(doc["object"], "list", "{doc}");
    assert!(doc["model"].is_string(), "{doc}");
    let data = doc["data"].as_array().unwrap();
    assert_eq!(data.len(), n);
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            if base64 {
                decode_base64_f32(d["embedding"].as_str().unwrap())
            } else {
                d["embedding"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect()
            }
        })
        .collect()
}

/// Standard base64 (with padding) of little-endian f32s, decoded here independently of the
/// server's encoder.
fn decode_base64_f32(s: &str) -> Vec<f32> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    assert_eq!(s.len() % 4, 0);
    let mut bytes = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let pad = quad.iter().filter(|&&c| c == b'=').count();
        let n = quad
            .iter()
            .take(4 - pad)
            .fold(0u32, |acc, &c| (acc << 6) | value(c))
            << (6 * pad);
        let three = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        bytes.extend_from_slice(&three[..3 - pad]);
    }
    assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|x| x.iter().map(|f| f.to_bits()).collect())
        .collect()
}

/// `POST /v1/embeddings` on the tiny model (f32, `--pooling mean`): OpenAI's shapes and usage;
/// the vectors bit-identical to `Model::embed` in this process (which tests/embeddings.rs holds
/// to llama.cpp); base64 the same floats; a batch of five equal to each input alone, also while
/// a stream decodes; every bad input a 400 naming its rule, the server answering as before
/// after each; and a server without `--pooling` on a model naming none refusing with a 400
/// that says so.
#[test]
fn embeddings_have_openai_shapes_and_equal_each_input_alone() {
    let model = server::tiny_llama();
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend f32 -c 256 --parallel 2 --pooling mean -a tiny"),
    );
    let texts = [
        "hello",
        "The station was built on the far side of the fields.",
        "a",
        "Once upon a time, in a river town, the boats came down every morning.",
        "café",
    ];
    let tokens: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| {
            let r = s.post("/tokenize", &json!({"content": t, "add_special": true}));
            r.json()["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    // The library's vectors of the same tokens.
    let lib = common::load_f32(&model, 2).model;
    let inputs: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
    let want = lib.embed(&inputs, rknn_llm::model::Pooling::Mean).unwrap();

    let r = s.post(
        EMBEDDINGS,
        &json!({"input": texts, "model": "anything", "user": "u"}),
    );
    let got = vectors(&r, 5, false);
    assert_eq!(
        bits(&got),
        bits(&want),
        "the server's floats are the library's"
    );
    let doc = r.json();
    let n: usize = tokens.iter().map(Vec::len).sum();
    assert_eq!(doc["model"], "tiny");
    assert_eq!(doc["usage"], json!({"prompt_tokens": n, "total_tokens": n}));
    // base64: the same floats; token arrays and the path without /v1: the same answer.
    let r = s.post(
        "/embeddings",
        &json!({"input": tokens, "encoding_format": "base64", "dimensions": lib.config().n_embd}),
    );
    assert_eq!(bits(&vectors(&r, 5, true)), bits(&want));
    // One string, and one token array: each alone.
    for (i, t) in texts.iter().enumerate() {
        let alone = vectors(&s.post(EMBEDDINGS, &json!({"input": t})), 1, false);
        assert_eq!(bits(&alone), bits(&want[i..=i]), "input {i} alone");
        let alone = vectors(&s.post(EMBEDDINGS, &json!({"input": tokens[i]})), 1, false);
        assert_eq!(bits(&alone), bits(&want[i..=i]), "input {i}'s tokens alone");
    }
    // While a stream decodes in the other slot, the batch again.
    let mut stream = s
        .open_stream(
            COMPLETIONS,
            &json!({"prompt": "hello world", "max_tokens": 100, "temperature": 0, "stream": true}),
        )
        .unwrap();
    assert_eq!(stream.status, 200);
    assert!(stream.next_data().unwrap().is_some(), "the stream began");
    let during = vectors(&s.post(EMBEDDINGS, &json!({"input": texts})), 5, false);
    assert_eq!(bits(&during), bits(&want), "during a stream");
    let _ = stream.collect(Instant::now());

    // Bad inputs, each a 400 naming its rule.
    let good = json!({"prompt": "hello world", "max_tokens": 8, "temperature": 0});
    let expected = s.generate(COMPLETIONS, &good);
    let l = Limits {
        s: &s,
        good: (COMPLETIONS, good),
        expected,
    };
    let long = vec![1u32; 129];
    let many: Vec<&str> = vec!["x"; 257];
    for (what, body, words) in [
        ("no input", json!({}), "`input` is missing"),
        ("an empty string", json!({"input": ""}), "empty string"),
        ("an empty list", json!({"input": []}), "empty list"),
        (
            "an empty string in a list",
            json!({"input": ["a", ""]}),
            "`input[1]` is an empty",
        ),
        (
            "an empty token list",
            json!({"input": [[1], []]}),
            "`input[1]` is an empty",
        ),
        (
            "a mixed list",
            json!({"input": ["a", [1]]}),
            "`input[1]` must be a string",
        ),
        (
            "a negative id",
            json!({"input": [1, -2]}),
            "`input[1]` must be a token id",
        ),
        (
            "an id past the vocabulary",
            json!({"input": [[1], [1, 99999]]}),
            "`input[1]`: token id 99999",
        ),
        (
            "an input longer than a slot",
            json!({"input": [[1], long]}),
            "`input[1]` has 129 tokens, more than a slot's context of 128",
        ),
        (
            "too many inputs",
            json!({"input": many}),
            "257 inputs, more than the 256",
        ),
        (
            "dimensions",
            json!({"input": "a", "dimensions": 8}),
            "cannot be shortened",
        ),
        (
            "encoding_format",
            json!({"input": "a", "encoding_format": "hex"}),
            "\"hex\"",
        ),
        (
            "an unknown field",
            json!({"input": "a", "normalize": false}),
            "unknown field `normalize`",
        ),
        ("input a number", json!({"input": 5}), "not a number"),
    ] {
        let r = s.post(EMBEDDINGS, &body);
        assert_error(&r, 400, what);
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains(words), "{what}: {message}");
        l.still_good(what);
    }
    let m = s.metrics();
    assert_eq!(m.get("llm_slots_active"), 0.0);
    drop(s);

    // Without --pooling, on a model that names none.
    let s = Server::start(&model, &server::args("--backend f32 -c 256 --parallel 1"));
    let r = s.post(EMBEDDINGS, &json!({"input": "hello"}));
    assert_error(&r, 400, "no pooling");
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("llama.pooling_type") && message.contains("--pooling"),
        "{message}"
    );
}

/// Every field of docs/serving.md's table of request fields: each honoured one is answered
/// (200), each refused one (or a refused value) is a 400 naming it, and a field not in the
/// table is a 400 naming it; `n` gives that many choices, streamed as numbered chunks.
#[test]
fn every_field_of_the_table_is_honoured_or_refused_by_name() {
    let _serial = server::serial();
    let s = tiny_plain_server(512, 4);
    let chat = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0});
    let completion = json!({"prompt": "hello", "max_tokens": 4, "temperature": 0});
    let tool = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]);
    let honoured: Vec<(&str, Json, bool)> = vec![
        ("model", json!("anything"), true),
        ("max_tokens", json!(3), true),
        ("max_completion_tokens", json!(3), false),
        ("temperature", json!(0.5), true),
        ("top_p", json!(0.9), true),
        ("seed", json!(11), true),
        ("stop", json!(["\n\n"]), true),
        ("presence_penalty", json!(0.5), true),
        ("frequency_penalty", json!(0.5), true),
        ("logit_bias", json!({"5": -100, "7": 2.5}), true),
        ("n", json!(2), true),
        ("stream", json!(false), true),
        ("stream_options", json!({"include_usage": true}), true),
        ("logprobs", json!(true), false),
        ("top_logprobs", json!(0), false),
        ("response_format", json!({"type": "text"}), true),
        ("tools", tool.clone(), false),
        ("tool_choice", json!("none"), false),
        ("parallel_tool_calls", json!(true), false),
        ("user", json!("u-1"), true),
        ("safety_identifier", json!("s-1"), true),
        ("prompt_cache_key", json!("k"), true),
        ("metadata", json!({"a": "b"}), true),
        ("store", json!(false), true),
        ("service_tier", json!("auto"), true),
        ("modalities", json!(["text"]), false),
        ("top_k", json!(10), true),
        ("repeat_penalty", json!(1.1), true),
        ("repeat_last_n", json!(32), true),
        ("n_predict", json!(3), true),
        ("cache_prompt", json!(false), true),
        ("n_probs", json!(2), true),
        (
            "json_schema",
            json!({"type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"], "additionalProperties": false}),
            true,
        ),
        ("grammar", json!("root ::= \"yes\" | \"no\"\n"), true),
    ];
    for (field, value, both) in &honoured {
        let bodies: Vec<(&str, Json)> = if *both {
            vec![(CHAT, chat.clone()), (COMPLETIONS, completion.clone())]
        } else {
            vec![(CHAT, chat.clone())]
        };
        for (path, mut body) in bodies {
            body[*field] = value.clone();
            if *field == "top_logprobs" {
                body["logprobs"] = json!(true);
            }
            // (The tiny model's slots are too short for the tools' description: the tools
            // rows run with `tool_choice: none`; tool calling has its own tests.)
            if *field == "tools" || *field == "parallel_tool_calls" {
                body["tools"] = tool.clone();
                body["tool_choice"] = json!("none");
            }
            if *field == "tool_choice" {
                body["tools"] = tool.clone();
            }
            let r = s.request("POST", path, &[], body.to_string().as_bytes());
            assert_eq!(r.status, 200, "{field} on {path}: {}", r.text());
        }
    }
    let mut body = completion.clone();
    body["logprobs"] = json!(2);
    body["echo"] = json!(false);
    body["best_of"] = json!(1);
    body["suffix"] = json!("");
    let r = s.request("POST", COMPLETIONS, &[], body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let refused: Vec<(&str, Json, &str)> = vec![
        ("audio", json!({"voice": "alloy", "format": "wav"}), CHAT),
        (
            "prediction",
            json!({"type": "content", "content": "x"}),
            CHAT,
        ),
        ("reasoning_effort", json!("low"), CHAT),
        ("verbosity", json!("low"), CHAT),
        ("web_search_options", json!({}), CHAT),
        ("functions", json!([{"name": "f"}]), CHAT),
        ("function_call", json!("auto"), CHAT),
        ("store", json!(true), CHAT),
        ("service_tier", json!("flex"), CHAT),
        ("modalities", json!(["text", "audio"]), CHAT),
        ("echo", json!(true), COMPLETIONS),
        ("best_of", json!(3), COMPLETIONS),
        ("suffix", json!("end"), COMPLETIONS),
        ("n", json!(9), CHAT),
        ("logit_bias", json!({"999999": 1}), CHAT),
        ("min_p", json!(0.1), CHAT),
        ("mirostat", json!(2), COMPLETIONS),
        ("messages", json!([]), COMPLETIONS),
        ("prompt", json!("x"), CHAT),
        ("top_logprobs", json!(2), COMPLETIONS),
        ("tools", tool.clone(), COMPLETIONS),
    ];
    for (field, value, path) in refused {
        let mut body = if path == CHAT {
            chat.clone()
        } else {
            completion.clone()
        };
        body[field] = value.clone();
        let r = s.request("POST", path, &[], body.to_string().as_bytes());
        assert_error(&r, 400, &format!("{field}: {value}"));
        assert_eq!(
            r.json()["error"]["param"],
            json!(field),
            "{field}: {}",
            r.text()
        );
    }
    // `n`: that many choices, numbered, their tokens summed; streamed as numbered chunks.
    let file = rknn_llm::gguf::GgufFile::open(server::tiny_llama()).unwrap();
    let eog = rknn_llm::tokenizer::Tokenizer::from_gguf(&file)
        .unwrap()
        .eog_ids()
        .to_vec();
    for path in [CHAT, COMPLETIONS] {
        let mut body = if path == CHAT {
            chat.clone()
        } else {
            completion.clone()
        };
        body["n"] = json!(3);
        body["temperature"] = json!(1.0);
        body["max_tokens"] = json!(6);
        // Every choice runs to `max_tokens`: no end of generation.
        body["logit_bias"] =
            Json::Object(eog.iter().map(|id| (id.to_string(), json!(-100))).collect());
        // A prompt no slot holds: one choice evaluates it, the other two copy its cache.
        let fresh = format!(
            "Three answers to a question nobody asked before, at {path}: what the cat, the dog \
             and the old fox said to the moon on the longest night of the coldest winter"
        );
        if path == CHAT {
            body["messages"] = json!([{"role": "user", "content": fresh}]);
        } else {
            body["prompt"] = json!(fresh);
        }
        let before = s.metrics().get("llm_prompt_tokens_cached_total");
        let a = s.post(path, &body).json();
        let choices = a["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3, "{a}");
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], json!(i), "{a}");
        }
        assert_eq!(a["usage"]["completion_tokens"], json!(18), "{a}");
        let copied = 2.0 * (a["usage"]["prompt_tokens"].as_f64().unwrap() - 1.0);
        s.wait_metrics("two choices' prompts copied", budget(10), |m| {
            m.get("llm_prompt_tokens_cached_total") - before >= copied
        });
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let mut st = s.open_stream(path, &body).unwrap();
        assert_eq!(st.status, 200);
        let mut seen = std::collections::BTreeSet::new();
        let (mut finishes, mut usage) = (0, None);
        while let Some(data) = st.next_data().unwrap() {
            if data == "[DONE]" {
                break;
            }
            let c: Json = serde_json::from_str(&data).unwrap();
            if !c["usage"].is_null() {
                usage = Some(c["usage"]["completion_tokens"].clone());
            }
            for ch in c["choices"].as_array().unwrap() {
                seen.insert(ch["index"].as_u64().unwrap());
                finishes += usize::from(!ch["finish_reason"].is_null());
            }
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(finishes, 3);
        assert_eq!(usage, Some(json!(18)));
    }
    assert!(s.alive());
}

/// The tiny model on the f32 path with the plain chat template, `-c ctx`, `--parallel slots`.
fn tiny_plain_server(ctx: usize, slots: usize) -> Server {
    let template = server::plain_template();
    f32_server(
        &server::tiny_llama(),
        Some(&template),
        &format!("-c {ctx} --parallel {slots}"),
    )
}

/// `model` on the f32 path with the chat template file `template` (if given) and `flags`
/// (whitespace-separated).
fn f32_server(model: &std::path::Path, template: Option<&std::path::Path>, flags: &str) -> Server {
    let mut args = vec!["--backend", "f32"];
    if let Some(t) = template {
        args.extend(["--chat-template-file", t.to_str().unwrap()]);
    }
    args.extend(server::args(flags));
    Server::start(model, &args)
}

/// `-md` (llama-server's spelling): every slot drafts with a draft model of the same
/// vocabulary (another family's random weights, so that most drafts are rejected), and every
/// answer, alone or among eight at once on four slots, is still `llm-decode`'s without a draft.
#[test]
fn a_draft_model_leaves_every_answer_unchanged() {
    let model = common::fixtures().join("llm/tiny-qwen3.gguf");
    let draft = common::fixtures().join("llm/tiny-qwen2.gguf");
    let _serial = server::serial();
    let flags = format!(
        "-t 2 --parallel 4 -c 1024 --prefill-chunk 8 -md {} --draft-max 4",
        draft.display()
    );
    let s = f32_server(&model, None, &flags);
    let (_, after) = concurrency(&s, &model, "f32", &tiny_prompts(), 24);
    let drafted = after.get("llm_draft_tokens_total");
    let accepted = after.get("llm_draft_tokens_accepted_total");
    println!("{accepted} of {drafted} drafted tokens accepted");
    assert!(
        drafted > 0.0 && accepted < drafted,
        "{accepted} of {drafted}"
    );
}
