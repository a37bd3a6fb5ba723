//! `llm-server` as the integration tests drive it: the child process (killed when the handle
//! drops), a small blocking HTTP/1.1 client over `TcpStream` (requests with Content-Length and
//! `Connection: close`; chunked, length-delimited or close-delimited bodies; SSE events; a
//! request sent byte by byte; a stream closed mid-way), and the Prometheus text of /metrics.
//!
//! Every wait is bounded ([`budget`]): a hung server fails the test instead of hanging it.
//! Declared by the tests that use it with `#[path = "common/server.rs"] mod server;` beside
//! `mod common;`.
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

/// The emulator the tests run under (cargo's runner, e.g. qemu-user), as
/// [`crate::common::llm_decode`] reads it.
pub fn runner() -> Option<String> {
    std::env::var("RKNPU_TEST_RUNNER")
        .ok()
        .filter(|r| !r.trim().is_empty())
}

/// `secs` seconds, ten times that under a runner (qemu-user is that much slower).
pub fn budget(secs: u64) -> Duration {
    Duration::from_secs(if runner().is_some() { secs * 10 } else { secs })
}

/// The tests of one binary that start servers take turns: the NPU is single-tenant on a board,
/// two cores are shared here, and timings (time to first token) need a quiet machine.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `Command` running `exe`, through the runner if there is one.
pub fn command(exe: &str) -> Command {
    let runner = runner().unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut cmd = match words.next() {
        None => Command::new(exe),
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(exe);
            cmd
        }
    };
    cmd.env("XDG_CACHE_HOME", crate::common::test_cache_home());
    cmd
}

/// The committed tiny llama model (no chat template; f32 is instant on it).
pub fn tiny_llama() -> std::path::PathBuf {
    crate::common::fixtures().join("llm/tiny-llama.gguf")
}

/// A chat template for models without one, written to a temporary file: `<role>content` per
/// message, then `<assistant>`, on one line, so a chat of it is the completion of that text.
pub fn plain_template() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("llm-server-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plain.jinja");
    std::fs::write(
        &path,
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
         {% if add_generation_prompt %}<assistant>{% endif %}",
    )
    .unwrap();
    path
}

/// What [`plain_template`] renders for `messages` (with the generation prompt).
pub fn render_plain(messages: &[(&str, &str)]) -> String {
    let mut s: String = messages
        .iter()
        .map(|(role, content)| format!("<{role}>{content}"))
        .collect();
    s.push_str("<assistant>");
    s
}

/// A running `llm-server`, killed on drop (its stderr printed if the test is failing).
pub struct Server {
    child: Mutex<Child>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The process id (the runner's under a runner: its RSS is the guest's).
    pub pid: u32,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `llm-server -m MODEL --host 127.0.0.1 --port 0 ARGS...`, reads the port from its
    /// "listening on" line and waits for `GET /health` to answer 200.
    pub fn start(model: &Path, args: &[&str]) -> Server {
        Self::start_with(model, args, &[])
    }

    /// [`Server::start`] with `envs` set in the server's environment.
    pub fn start_with(model: &Path, args: &[&str], envs: &[(&str, &str)]) -> Server {
        let exe = env!("CARGO_BIN_EXE_llm-server");
        let mut cmd = command(exe);
        cmd.envs(envs.iter().copied());
        cmd.arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("llm-server starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(port) = listening_port(&line) {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(port);
                        }
                    }
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    log.push_str(&line);
                    log.push('\n');
                    if log.len() > 1 << 18 {
                        let cut = log.len() - (1 << 17);
                        let cut = (cut..log.len())
                            .find(|&i| log.is_char_boundary(i))
                            .unwrap_or(0);
                        log.drain(..cut);
                    }
                }
            });
        }
        let pid = child.id();
        let port = rx.recv_timeout(budget(120));
        let mut server = Server {
            child: Mutex::new(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            pid,
            log,
        };
        match port {
            Ok(port) => server.addr.set_port(port),
            Err(_) => panic!(
                "llm-server {args:?} printed no \"listening on\" line: {}",
                server.exit_and_log()
            ),
        }
        let deadline = Instant::now() + budget(120);
        loop {
            if let Ok(r) = server.try_request("GET", "/health", &[], b"") {
                match r.status {
                    200 => {
                        assert_eq!(r.json()["status"], "ok", "{}", r.text());
                        break;
                    }
                    503 => {}
                    s => panic!("GET /health answered {s}: {}", r.text()),
                }
            }
            assert!(
                server.alive(),
                "llm-server {args:?} died while loading: {}",
                server.exit_and_log()
            );
            assert!(
                Instant::now() < deadline,
                "llm-server {args:?} not healthy after {:?}: {}",
                budget(120),
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Whether the process still runs.
    pub fn alive(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        matches!(child.try_wait(), Ok(None))
    }

    /// Its stderr so far (the last 128 KiB or more).
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Kills it (if running) and returns its exit status and stderr, for a failure message.
    fn exit_and_log(&self) -> String {
        let status = {
            let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
            let _ = child.kill();
            child.wait()
        };
        // The reader thread may still be copying the last lines.
        std::thread::sleep(Duration::from_millis(100));
        format!("{status:?}\n{}", self.log())
    }

    /// Its resident memory in KiB (VmRSS of /proc/PID/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// One request (`Content-Type: application/json` unless `headers` name another), the
    /// answer read whole within [`budget`]`(120)`.
    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        let bytes = format_request(self.addr, method, path, headers, body);
        send(self.addr, &bytes, None, budget(120))
    }

    /// [`Server::try_request`], failing the test on an I/O error.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|e| {
                panic!(
                    "{method} {path}: {e} (server alive: {})\n{}",
                    self.alive(),
                    self.log()
                )
            })
    }

    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &Json) -> Response {
        self.request("POST", path, &[], body.to_string().as_bytes())
    }

    /// The request sent one byte at a time, `gap` apart.
    pub fn post_slowly(&self, path: &str, body: &[u8], gap: Duration) -> io::Result<Response> {
        let bytes = format_request(self.addr, "POST", path, &[], body);
        send(self.addr, &bytes, Some(gap), budget(120))
    }

    /// Sends a request and reads the head of the answer; its body is then read event by event.
    pub fn open_stream(&self, path: &str, body: &Json) -> io::Result<Stream> {
        let bytes = format_request(self.addr, "POST", path, &[], body.to_string().as_bytes());
        Stream::open(self.addr, &bytes, budget(120))
    }

    /// A non-streamed generation that must succeed (200).
    pub fn generate(&self, path: &str, body: &Json) -> Gen {
        let t = Instant::now();
        let r = self.post(path, body);
        assert_eq!(r.status, 200, "{path} {body}: {}", r.text());
        let mut g = Gen::from_answer(&r.json());
        g.elapsed = t.elapsed();
        g
    }

    /// A streamed generation that must succeed, with the usage chunk asked for.
    pub fn generate_stream(&self, path: &str, body: &Json) -> Gen {
        let mut body = body.clone();
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let t = Instant::now();
        let mut s = self
            .open_stream(path, &body)
            .unwrap_or_else(|e| panic!("{path}: {e}\n{}", self.log()));
        if s.status != 200 {
            let status = s.status;
            panic!("{path} {body}: status {status}: {:?}", s.read_rest());
        }
        let mut g = s
            .collect(t)
            .unwrap_or_else(|e| panic!("{path} {body}: {e}\n{}", self.log()));
        g.elapsed = t.elapsed();
        g
    }

    /// The samples of /metrics.
    pub fn metrics(&self) -> Metrics {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "{}", r.text());
        Metrics::parse(&r.text())
    }

    /// Polls /metrics until `done` holds of it, at most `limit`; the last sample, or a failure
    /// naming `what`.
    pub fn wait_metrics(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&Metrics) -> bool,
    ) -> Metrics {
        let deadline = Instant::now() + limit;
        loop {
            let m = self.metrics();
            if done(&m) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}; /metrics:\n{}",
                m.text
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- llm-server stderr (the last lines) ---\n{}",
                tail(&self.log(), 60)
            );
        }
    }
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The port of a "llm-server: listening on http://HOST:PORT" line.
fn listening_port(line: &str) -> Option<u16> {
    let rest = line.split("listening on http://").nth(1)?;
    let hostport = rest.split(|c: char| c.is_whitespace() || c == '/').next()?;
    hostport.rsplit(':').next()?.parse().ok()
}

/// An HTTP/1.1 request with `Connection: close` and a Content-Length.
pub fn format_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method != "GET" || !body.is_empty() {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// An answer read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, failing the test with the body if it is not.
    pub fn json(&self) -> Json {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {}, not JSON ({e}): {:?}", self.status, self.text()))
    }
}

/// Connects, writes `bytes` (one at a time, `gap` apart, if given), reads the answer whole.
/// A write refused by the peer (it answered early, e.g. 413, and closed) does not stop the
/// reading of its answer.
pub fn send(
    addr: SocketAddr,
    bytes: &[u8],
    gap: Option<Duration>,
    limit: Duration,
) -> io::Result<Response> {
    let deadline = Instant::now() + limit;
    let sock = connect(addr, limit)?;
    let written = match gap {
        None => (&sock).write_all(bytes),
        Some(gap) => bytes.iter().try_for_each(|b| {
            (&sock).write_all(std::slice::from_ref(b))?;
            std::thread::sleep(gap);
            Ok(())
        }),
    };
    let mut r = BufReader::new(sock.try_clone()?);
    let (status, headers) = match read_head(&mut r, deadline) {
        Ok(h) => h,
        Err(e) => {
            return Err(match written {
                Err(w) => io::Error::new(e.kind(), format!("{e} (after a failed write: {w})")),
                Ok(()) => e,
            });
        }
    };
    let mut body = Vec::new();
    Body::new(r, &headers, deadline).read_to_end(&mut body)?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn connect(addr: SocketAddr, limit: Duration) -> io::Result<TcpStream> {
    let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(limit))?;
    sock.set_write_timeout(Some(limit))?;
    Ok(sock)
}

/// A line without its CRLF (or LF); an error at end of input or past the deadline.
fn read_line(r: &mut impl BufRead, deadline: Instant) -> io::Result<String> {
    if Instant::now() > deadline {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    let mut line = Vec::new();
    r.take(1 << 16).read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "connection ended inside a line: {:?}",
                String::from_utf8_lossy(&line)
            ),
        ));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The status code and headers (names lower-cased).
fn read_head(r: &mut impl BufRead, deadline: Instant) -> io::Result<(u16, Vec<(String, String)>)> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
    let line = read_line(r, deadline)?;
    let mut words = line.splitn(3, ' ');
    let version = words.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(bad(format!("not an HTTP/1 status line: {line:?}")));
    }
    let status = words
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("no status code: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(r, deadline)?;
        if line.is_empty() {
            return Ok((status, headers));
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("bad header line {line:?}")))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
}

/// A body as its headers frame it.
struct Body {
    r: BufReader<TcpStream>,
    framing: Framing,
    deadline: Instant,
}

enum Framing {
    /// Bytes left of the current chunk (0: a size line comes next); done after the last.
    Chunked {
        left: u64,
        done: bool,
    },
    Length(u64),
    /// Until the peer closes.
    Close,
}

impl Body {
    fn new(r: BufReader<TcpStream>, headers: &[(String, String)], deadline: Instant) -> Body {
        let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let framing = if get("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
        {
            Framing::Chunked {
                left: 0,
                done: false,
            }
        } else if let Some(n) = get("content-length").and_then(|v| v.parse().ok()) {
            Framing::Length(n)
        } else {
            Framing::Close
        };
        Body {
            r,
            framing,
            deadline,
        }
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Body {
            r,
            framing,
            deadline,
        } = self;
        if Instant::now() > *deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        let eof = || io::Error::new(io::ErrorKind::UnexpectedEof, "the body ended early");
        match framing {
            Framing::Close => r.read(buf),
            Framing::Length(0) => Ok(0),
            Framing::Length(left) => {
                let n = r.by_ref().take(*left).read(buf)?;
                if n == 0 {
                    return Err(eof());
                }
                *left -= n as u64;
                Ok(n)
            }
            Framing::Chunked { done: true, .. } => Ok(0),
            Framing::Chunked { left, done } => {
                if *left == 0 {
                    let line = read_line(r, *deadline)?;
                    let size = line.split(';').next().unwrap_or_default().trim();
                    let size = u64::from_str_radix(size, 16).map_err(|_| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("bad chunk size {line:?}"),
                        )
                    })?;
                    if size == 0 {
                        // Trailers, then the empty line.
                        while !read_line(r, *deadline)?.is_empty() {}
                        *done = true;
                        return Ok(0);
                    }
                    *left = size;
                }
                let n = r.by_ref().take(*left).read(buf)?;
                if n == 0 {
                    return Err(eof());
                }
                *left -= n as u64;
                if *left == 0 && !read_line(r, *deadline)?.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "no CRLF after a chunk",
                    ));
                }
                Ok(n)
            }
        }
    }
}

/// An answer whose body is read as server-sent events.
pub struct Stream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    lines: BufReader<Body>,
    sock: TcpStream,
    deadline: Instant,
}

impl Stream {
    fn open(addr: SocketAddr, bytes: &[u8], limit: Duration) -> io::Result<Stream> {
        let deadline = Instant::now() + limit;
        let sock = connect(addr, limit)?;
        (&sock).write_all(bytes)?;
        let mut r = BufReader::new(sock.try_clone()?);
        let (status, headers) = read_head(&mut r, deadline)?;
        let body = Body::new(r, &headers, deadline);
        Ok(Stream {
            status,
            headers,
            lines: BufReader::new(body),
            sock,
            deadline,
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The data of the next event (its `data:` lines joined by newlines), `None` at the end of
    /// the body. Comments, `event:` and `id:` lines are skipped.
    pub fn next_data(&mut self) -> io::Result<Option<String>> {
        let mut data: Option<String> = None;
        loop {
            let line = match read_line(&mut self.lines, self.deadline) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && data.is_none() => {
                    // The end of the body between events.
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            if line.is_empty() {
                if data.is_some() {
                    return Ok(data);
                }
                continue;
            }
            if let Some(d) = line.strip_prefix("data:") {
                let d = d.strip_prefix(' ').unwrap_or(d);
                match &mut data {
                    Some(s) => {
                        s.push('\n');
                        s.push_str(d);
                    }
                    None => data = Some(d.to_string()),
                }
            }
        }
    }

    /// The rest of the body as text (for a failure message).
    pub fn read_rest(&mut self) -> String {
        let mut s = Vec::new();
        let _ = self.lines.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    }

    /// Reads every event up to `[DONE]` (which must be the last thing in the body) into a
    /// [`Gen`]: the text of the deltas, the finish reason of the last choice, the usage chunk's
    /// numbers, and when the first text arrived (from `start`).
    pub fn collect(&mut self, start: Instant) -> io::Result<Gen> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        let mut g = Gen::default();
        let mut usage_seen = false;
        loop {
            let Some(data) = self.next_data()? else {
                return Err(bad("the stream ended without data: [DONE]".into()));
            };
            if data == "[DONE]" {
                break;
            }
            let chunk: Json = serde_json::from_str(&data)
                .map_err(|e| bad(format!("a chunk that is not JSON ({e}): {data:?}")))?;
            g.chunks.push(chunk.clone());
            if let Some(err) = chunk.get("error") {
                return Err(bad(format!("an error in the stream: {err}")));
            }
            let choices = chunk["choices"]
                .as_array()
                .ok_or_else(|| bad(format!("a chunk without choices: {data}")))?;
            if usage_seen {
                return Err(bad(format!("a chunk after the usage chunk: {data}")));
            }
            if choices.is_empty() {
                let u = &chunk["usage"];
                if u.is_null() {
                    return Err(bad(format!("a chunk with no choice and no usage: {data}")));
                }
                g.set_usage(u);
                usage_seen = true;
                continue;
            }
            let c = &choices[0];
            let piece = c["delta"]["content"]
                .as_str()
                .or_else(|| c["text"].as_str())
                .unwrap_or_default();
            if !piece.is_empty() && g.first_text.is_none() {
                g.first_text = Some(start.elapsed());
            }
            g.text.push_str(piece);
            if let Some(f) = c["finish_reason"].as_str() {
                if !g.finish.is_empty() {
                    return Err(bad(format!("a second finish_reason: {data}")));
                }
                g.finish = f.to_string();
            }
        }
        if g.finish.is_empty() {
            return Err(bad("no chunk had a finish_reason".into()));
        }
        if !usage_seen {
            g.prompt_tokens = u64::MAX;
        }
        let rest = self.read_rest();
        if !rest.trim().is_empty() {
            return Err(bad(format!("data after [DONE]: {rest:?}")));
        }
        Ok(g)
    }

    /// Closes the connection (the server sees the client gone).
    pub fn close(self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

/// A generation as the tests compare it.
#[derive(Clone, Debug, Default)]
pub struct Gen {
    pub text: String,
    pub finish: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub cached_tokens: u64,
    /// Streamed: when the first non-empty text arrived.
    pub first_text: Option<Duration>,
    /// From sending the request to the end of the answer.
    pub elapsed: Duration,
    /// Streamed: every chunk (but `[DONE]`).
    pub chunks: Vec<Json>,
}

impl Gen {
    /// What an answer of `/v1/chat/completions` or `/v1/completions` holds.
    pub fn from_answer(a: &Json) -> Gen {
        let c = &a["choices"][0];
        let text = c["message"]["content"]
            .as_str()
            .or_else(|| c["text"].as_str())
            .unwrap_or_else(|| panic!("no message.content nor text: {a}"));
        let mut g = Gen {
            text: text.to_string(),
            finish: c["finish_reason"]
                .as_str()
                .unwrap_or_else(|| panic!("no finish_reason: {a}"))
                .to_string(),
            ..Gen::default()
        };
        g.set_usage(&a["usage"]);
        g
    }

    fn set_usage(&mut self, u: &Json) {
        let n = |v: &Json| {
            v.as_u64()
                .unwrap_or_else(|| panic!("usage without it: {u}"))
        };
        self.prompt_tokens = n(&u["prompt_tokens"]);
        self.completion_tokens = n(&u["completion_tokens"]);
        self.total_tokens = n(&u["total_tokens"]);
        self.cached_tokens = n(&u["prompt_tokens_details"]["cached_tokens"]);
    }

    /// Text, finish reason and token counts (what must not depend on what else runs).
    pub fn key(&self) -> (String, String, u64, u64) {
        (
            self.text.clone(),
            self.finish.clone(),
            self.prompt_tokens,
            self.completion_tokens,
        )
    }
}

/// The samples of a Prometheus text exposition.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// (name, labels as written without braces, value).
    pub samples: Vec<(String, String, f64)>,
    pub text: String,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut samples = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = match line.find('}') {
                Some(close) => (&line[..=close], line[close + 1..].trim()),
                None => line.split_once(' ').unwrap_or((line, "")),
            };
            let value = value.split_whitespace().next().unwrap_or_default();
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad sample line in /metrics: {line:?}")),
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            samples.push((name.trim().to_string(), labels.to_string(), value));
        }
        Metrics {
            samples,
            text: text.to_string(),
        }
    }

    /// The sum of every series of `name` (failing if there is none).
    pub fn get(&self, name: &str) -> f64 {
        let mut found = false;
        let sum = self
            .samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, _, v)| {
                found = true;
                *v
            })
            .sum();
        assert!(found, "/metrics has no {name}:\n{}", self.text);
        sum
    }

    /// The sum of the series of `name` whose labels contain every `key="value"` of `labels`
    /// (0 if none does).
    pub fn get_with(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .map(|(_, _, v)| v)
            .sum()
    }
}

/// Asserts an OpenAI error answer: `status`, a JSON body `{"error": {"message", "type",
/// "param", "code"}}` with a non-empty message.
pub fn assert_error(r: &Response, status: u16, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    let ct = r.header("content-type").unwrap_or_default();
    assert!(
        ct.starts_with("application/json"),
        "{what}: content-type {ct:?}"
    );
    let doc = r.json();
    let e = &doc["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: error.message: {doc}"
    );
    assert!(e["type"].is_string(), "{what}: error.type: {doc}");
    for key in ["param", "code"] {
        assert!(e.get(key).is_some(), "{what}: error.{key} missing: {doc}");
    }
}

/// Command-line words, written as one line (`"--backend auto -t 2"`).
pub fn args(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot server: reads a request (head and Content-Length body), answers `answer`
    /// in pieces of `piece` bytes, closes; returns what it read.
    fn canned(answer: Vec<u8>, piece: usize) -> (SocketAddr, std::thread::JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let (sock, _) = l.accept().unwrap();
            let mut r = BufReader::new(sock.try_clone().unwrap());
            let mut req = Vec::new();
            let mut len = 0;
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                req.extend_from_slice(line.as_bytes());
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            req.extend_from_slice(&body);
            for p in answer.chunks(piece) {
                (&sock).write_all(p).unwrap();
                (&sock).flush().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            req
        });
        (addr, h)
    }

    fn chunked(body: &str, size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for c in body.as_bytes().chunks(size) {
            out.extend_from_slice(format!("{:x};ext=1\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\nX-Trailer: 1\r\n\r\n");
        out
    }

    #[test]
    fn a_chunked_event_stream_is_collected() {
        let events = concat!(
            ": a comment\n\n",
            "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n",
            "event: x\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo \\u00e9\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,",
            "\"total_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        answer.extend(chunked(events, 7));
        let (addr, h) = canned(answer, 5);
        let bytes = format_request(addr, "POST", "/v1/chat/completions", &[], b"{\"a\":1}");
        let mut st = Stream::open(addr, &bytes, Duration::from_secs(10)).unwrap();
        assert_eq!(st.status, 200);
        assert_eq!(st.header("Content-Type"), Some("text/event-stream"));
        let g = st.collect(Instant::now()).unwrap();
        assert_eq!(g.text, "Hello \u{e9}");
        assert_eq!(g.finish, "stop");
        assert_eq!(
            (
                g.prompt_tokens,
                g.completion_tokens,
                g.total_tokens,
                g.cached_tokens
            ),
            (3, 2, 5, 1)
        );
        assert_eq!(g.chunks.len(), 4);
        let req = String::from_utf8(h.join().unwrap()).unwrap();
        assert!(
            req.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
            "{req}"
        );
        assert!(
            req.contains("Content-Length: 7\r\n") && req.ends_with("\r\n\r\n{\"a\":1}"),
            "{req}"
        );
    }

    #[test]
    fn bodies_by_length_chunks_or_close() {
        let body = "{\"error\":{\"message\":\"no\",\"type\":\"t\",\"param\":null,\"code\":400}}";
        let answers = [
            format!("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes(),
            [b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(), chunked(body, 4)].concat(),
            format!("HTTP/1.1 400 Bad Request\nContent-Type: application/json\n\n{body}").into_bytes(),
        ];
        for (i, answer) in answers.into_iter().enumerate() {
            let (addr, h) = canned(answer, 3);
            let req = format_request(addr, "POST", "/x", &[("Authorization", "Bearer k")], b"[]");
            // Byte by byte for one of them.
            let gap = (i == 1).then_some(Duration::from_millis(1));
            let r = send(addr, &req, gap, Duration::from_secs(10)).unwrap();
            assert_error(&r, 400, &format!("answer {i}"));
            assert_eq!(r.text(), body);
            assert_eq!(h.join().unwrap(), req);
        }
    }

    #[test]
    fn a_truncated_body_is_an_error() {
        let (addr, _h) = canned(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_vec(),
            100,
        );
        let req = format_request(addr, "GET", "/", &[], b"");
        assert!(send(addr, &req, None, Duration::from_secs(10)).is_err());
    }

    #[test]
    fn listening_lines() {
        assert_eq!(
            listening_port("llm-server: listening on http://127.0.0.1:40123"),
            Some(40123)
        );
        assert_eq!(
            listening_port("llm-server: listening on http://[::1]:8080/ (4 slots)"),
            Some(8080)
        );
        assert_eq!(listening_port("llm-server: loading"), None);
    }

    #[test]
    fn metrics_text() {
        let m = Metrics::parse(
            "# HELP x y\n# TYPE llm_slots_active gauge\nllm_slots_active 2\n\
             llm_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 3\n\
             llm_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1 1700000000\n",
        );
        assert_eq!(m.get("llm_slots_active"), 2.0);
        assert_eq!(m.get("llm_requests_total"), 4.0);
        assert_eq!(m.get_with("llm_requests_total", &[("status", "400")]), 1.0);
    }
}
