#!/usr/bin/env python3
"""rknn-llm's llm-server against llama.cpp's llama-server under concurrent streaming load.

Each server runs alone (never both at once) on the same model with the same slots, context and
threads: ours, `llm-server --parallel 4 -c 4096 -t 2` on the GGUF itself (W8A8 on the in-process
emulator, `--backend auto` on a machine without an NPU), theirs, `llama-server -np 4 -c 4096 -t 2
-tb 2` on the Q8_0 conversion of the same model (scripts/bench/convert_q8_0.py, cached under
~/.cache/rknpu-rs/models/), with its default continuous batching. One asyncio client process (the
standard library only: raw HTTP/1.1 over asyncio.open_connection, the SSE lines parsed by hand)
waits for GET /health to answer 200, sends one warm-up request, then drives 1, 2, 4 and 8
concurrent streams: POST /v1/completions with a raw prompt (no chat template on either side),
`stream: true`, `temperature: 0`, `max_tokens` N, `cache_prompt: false` and `ignore_eos: true`
(honoured by llama-server; a server that ignores it may end a stream early, which the tables
report). Every request of a server's lifetime has its own prompt ("Write a story about <topic>
...", 20-40 tokens), so no prompt prefix is reused.

Definitions, per server and concurrency C (C streams sent at the same instant):
- a token's arrival time is when the client has read the SSE `data:` event carrying it (one
  event with non-empty `text` = one token; the usage counts, when sent, are checked against it);
- aggregate decode tok/s = sum over the C streams of (tokens - 1), i.e. the tokens after each
  stream's first one, divided by (last token arrival of any stream - first first-token arrival
  of any stream). With C = 1 it is the plain decode rate; with C > slots the window includes the
  queued streams' waits and prefills;
- TTFT = first token arrival - request sent, averaged over the C streams;
- ITL = gaps between consecutive token arrivals within one stream, p50 and p95 over the gaps of
  all C streams;
- "x 1 stream" = aggregate at C over aggregate at 1 stream (same server); ours/theirs = our
  aggregate over llama-server's at the same C;
- client CPU = this process's CPU time (time.process_time) during the run, as a share of its
  wall time; server CPU = the server process's user+system time over the run (/proc/PID/stat);
  others CPU = the machine's busy time over the run (/proc/stat) less those two: anything else
  running. Before each server and each run the script waits for an idle machine (--wait-quiet),
  and a run during which others took more than --max-others of the machine's CPU is measured
  again (--retries; the count of attempts is in the JSON, a run still disturbed is flagged).
From our server's GET /metrics, read before and after each run (deltas over the run only):
- modelled tok/s = delta llm_completion_tokens_total / delta llm_modelled_npu_seconds_total, the
  emulator's cost model of an RK3588 NPU (the busiest core) over all passes, prefill included;
  "x 1 stream" is that over the 1-stream run's;
- rows/pass = delta llm_pass_rows_total / delta llm_passes_total (decode rows/pass likewise with
  llm_decode_rows_total).
Goals (PASS/MISS): ours 4 streams >= 2.5x ours 1 stream; ours >= llama-server at 4 streams;
ours p95 ITL at 4 streams <= 2x ours at 1 stream; modelled 4 streams >= 3.5x modelled 1 stream.

Usage: python3 scripts/bench/server_vs_llama_server.py [--model demo|gemma3-270m] [--tokens 64]
       [--threads 2] [--slots 4] [--ctx 4096] [--concurrency 1,2,4,8] [--rounds 1]
       [--only ours|theirs] [--server-bin target/release/llm-server]
       [--llama-server PATH] [--wait-quiet 600] [--max-others 0.05] [--retries 4]
       [--json OUT.json]
Needs target/release/llm-server (cargo build --release -p rknn-llm --bin llm-server) and
llama-server (scripts/llama-cpp.sh --server); converts the model to Q8_0 once.
"""
import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CACHE = os.environ.get("RKNPU_CACHE", os.path.expanduser("~/.cache/rknpu-rs"))
HOST = "127.0.0.1"

TOPICS = [
    "a lighthouse keeper who finds a message in a bottle",
    "a young baker who opens a shop in a mountain village",
    "two friends sailing a small boat across a wide lake",
    "an old clockmaker and the apprentice who breaks a clock",
    "a girl who trains a stray dog to herd sheep",
    "a train that stops for a night in a snowed-in town",
    "a farmer who grows a pumpkin as big as a house",
    "a boy who learns to play the violin from his grandmother",
    "a fox and a crow who share a winter in the forest",
    "a librarian who discovers a map hidden inside a book",
    "a fisherman who helps a whale caught in a net",
    "a painter who moves to a city by the sea",
    "a robot that learns to tend a garden",
    "a family that builds a tree house together",
    "a postman who delivers letters across the desert",
    "a queen who gives up her crown to become a teacher",
    "a mouse who lives under the stage of a theatre",
    "a pilot who lands a plane on a frozen river",
    "a scientist who studies the songs of birds",
    "a cook on a ship that sails around the world",
]


SETTINGS = ["", " in winter", " a long time ago", " in a far country", " on a small island"]


def prompt_for(i):
    """The i-th prompt of a server's lifetime: distinct for i < 100."""
    topic = TOPICS[i % len(TOPICS)] + SETTINGS[(i // len(TOPICS)) % len(SETTINGS)]
    return (f"Write a long story about {topic}. Describe the places, the people and "
            f"everything that happens to them, in many paragraphs.\n\n")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 over asyncio streams: a request, its status and headers, then the body as it arrives
# (chunked, Content-Length or closed-delimited).


async def open_request(port, method, path, body=None):
    reader, writer = await asyncio.open_connection(HOST, port)
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "Connection: close"]
    if body is not None:
        head += ["Content-Type: application/json", "Accept: text/event-stream",
                 f"Content-Length: {len(data)}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed before the status line")
    status = int(status_line.split()[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return reader, writer, status, headers


async def body_parts(reader, headers):
    """Yields the body's bytes as they are read."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                return
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            part = await reader.readexactly(size)
            await reader.readline()  # the CRLF after the chunk
            yield part
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            part = await reader.read(min(left, 65536))
            if not part:
                return
            left -= len(part)
            yield part
    else:
        while True:
            part = await reader.read(65536)
            if not part:
                return
            yield part


async def http_get(port, path, timeout=10):
    async def go():
        reader, writer, status, headers = await open_request(port, "GET", path)
        body = b"".join([p async for p in body_parts(reader, headers)])
        writer.close()
        return status, body.decode("utf-8", "replace")
    return await asyncio.wait_for(go(), timeout)


async def stream_completion(port, body, timeout):
    """One streaming completion: returns the send time, each token's arrival time, the text,
    the finish reason, the server's usage counts if sent, and an error if any."""
    out = dict(sent=time.perf_counter(), times=[], text="", finish=None, usage=None, error=None)

    async def go():
        reader, writer, status, headers = await open_request(port, "POST", "/v1/completions", body)
        buf = b""
        try:
            if status != 200:
                rest = b"".join([p async for p in body_parts(reader, headers)])
                out["error"] = f"HTTP {status}: {rest[:300].decode('utf-8', 'replace')}"
                return
            async for part in body_parts(reader, headers):
                now = time.perf_counter()
                buf += part
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.rstrip(b"\r")
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments, event: lines
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        return
                    ev = json.loads(payload)
                    if "error" in ev:
                        out["error"] = json.dumps(ev["error"])[:300]
                        return
                    if ev.get("usage"):
                        out["usage"] = ev["usage"]
                    for ch in ev.get("choices") or []:
                        text = ch.get("text") or ""
                        if text:
                            out["times"].append(now)
                            out["text"] += text
                        if ch.get("finish_reason"):
                            out["finish"] = ch["finish_reason"]
        finally:
            writer.close()

    try:
        await asyncio.wait_for(go(), timeout)
    except Exception as e:  # noqa: BLE001 (reported in the results)
        out["error"] = f"{type(e).__name__}: {e}"
    return out


# ---------------------------------------------------------------------------------------------
# The servers.


def parse_metrics(text):
    """Prometheus text: each metric name summed over its label sets."""
    m = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            continue
        name = parts[0].split("{", 1)[0]
        try:
            m[name] = m.get(name, 0.0) + float(parts[1])
        except ValueError:
            pass
    return m


def machine_busy_seconds():
    """CPU seconds spent by everything on the machine so far (/proc/stat, all cores)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal: all but idle and iowait
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def wait_quiet(limit_s, share=0.15):
    """Waits (up to limit_s) until the machine is idle: under `share` of its cores busy over a
    3-second sample. Returns the last sample's busy share."""
    t0 = last = time.monotonic()
    while True:
        b0, w0 = machine_busy_seconds(), time.monotonic()
        await asyncio.sleep(3)
        b1, w1 = machine_busy_seconds(), time.monotonic()
        if b0 is None or b1 is None:
            return None
        busy = (b1 - b0) / (w1 - w0) / (os.cpu_count() or 1)
        if busy < share or time.monotonic() - t0 > limit_s:
            return busy
        if w1 - last >= 60:
            last = w1
            print(f"waiting for a quiet machine ({100 * busy:.0f} % busy)", file=sys.stderr)


def proc_cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


class Server:
    def __init__(self, name, cmd, port, logdir):
        self.name, self.cmd, self.port = name, cmd, port
        self.log_path = os.path.join(logdir, f"{name}.log")
        self.proc = None

    def start(self):
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()

    async def wait_healthy(self, timeout=900):
        t0 = time.monotonic()
        seen_503 = False
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                status, _ = await http_get(self.port, "/health", timeout=5)
                if status == 200:
                    return time.monotonic() - t0, seen_503
                seen_503 |= status == 503
            except (OSError, asyncio.TimeoutError, ValueError, IndexError):
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name}: /health not 200 after {timeout} s; see {self.log_path}")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------------------------------
# One concurrency level, and the numbers of it.


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(streams, tokens):
    firsts = [s["times"][0] for s in streams if s["times"]]
    lasts = [s["times"][-1] for s in streams if s["times"]]
    after_first = sum(max(len(s["times"]) - 1, 0) for s in streams)
    window = (max(lasts) - min(firsts)) if firsts else 0.0
    itl = [b - a for s in streams for a, b in zip(s["times"], s["times"][1:])]
    ttft = [s["times"][0] - s["sent"] for s in streams if s["times"]]
    usage_mismatch = [(len(s["times"]), s["usage"].get("completion_tokens")) for s in streams
                      if s["usage"] and s["usage"].get("completion_tokens") not in (None, len(s["times"]))]
    return dict(
        streams=len(streams),
        tokens=sum(len(s["times"]) for s in streams),
        tokens_after_first=after_first,
        window_s=window,
        aggregate_tok_s=after_first / window if window > 0 else float("nan"),
        ttft_mean_s=statistics.mean(ttft) if ttft else float("nan"),
        itl_p50_s=pct(itl, 0.5),
        itl_p95_s=pct(itl, 0.95),
        itl=itl,
        early=[dict(tokens=len(s["times"]), finish=s["finish"]) for s in streams
               if len(s["times"]) < tokens and not s["error"]],
        errors=[s["error"] for s in streams if s["error"]],
        usage_mismatch=usage_mismatch,
        finish=[s["finish"] for s in streams],
    )


async def run_level(server, conc, first_prompt, a, ours):
    bodies = []
    for i in range(conc):
        b = dict(model="bench", prompt=prompt_for(first_prompt + i), max_tokens=a.tokens,
                 temperature=0, stream=True, cache_prompt=False, ignore_eos=True,
                 stream_options=dict(include_usage=True))
        bodies.append(b)
    before = parse_metrics((await http_get(server.port, "/metrics"))[1]) if ours else None
    scpu0, m0 = proc_cpu_seconds(server.proc.pid), machine_busy_seconds()
    c0, w0 = time.process_time(), time.perf_counter()
    streams = await asyncio.gather(*(stream_completion(server.port, b, a.timeout) for b in bodies))
    c1, w1 = time.process_time(), time.perf_counter()
    scpu1, m1 = proc_cpu_seconds(server.proc.pid), machine_busy_seconds()
    r = summarize(streams, a.tokens)
    server_cpu = (scpu1 - scpu0) if scpu0 is not None and scpu1 is not None else None
    r.update(wall_s=w1 - w0, client_cpu_s=c1 - c0, client_cpu_share=(c1 - c0) / (w1 - w0),
             server_cpu_s=server_cpu,
             # Everything else on the machine meanwhile (other processes: a noisy neighbour).
             others_cpu_s=(m1 - m0 - server_cpu - (c1 - c0))
             if server_cpu is not None and m0 is not None and m1 is not None else None)
    if ours:
        after = parse_metrics((await http_get(server.port, "/metrics"))[1])
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (
            "llm_completion_tokens_total", "llm_passes_total", "llm_pass_rows_total",
            "llm_decode_rows_total", "llm_busy_seconds_total", "llm_modelled_npu_seconds_total")}
        npu = d["llm_modelled_npu_seconds_total"]
        r["metrics_delta"] = d
        r["modelled_tok_s"] = d["llm_completion_tokens_total"] / npu if npu > 0 else None
        r["rows_per_pass"] = d["llm_pass_rows_total"] / d["llm_passes_total"] if d["llm_passes_total"] else None
        r["decode_rows_per_pass"] = (d["llm_decode_rows_total"] / d["llm_passes_total"]
                                     if d["llm_passes_total"] else None)
    r["raw"] = [dict(sent=s["sent"] - w0, times=[t - w0 for t in s["times"]], finish=s["finish"],
                     usage=s["usage"], error=s["error"], prompt=b["prompt"])
                for s, b in zip(streams, bodies)]
    return r


async def bench_server(server, a, ours):
    if a.wait_quiet:
        busy = await wait_quiet(a.wait_quiet)
        if busy is not None:
            print(f"machine {100 * busy:.0f} % busy before starting {server.name}", file=sys.stderr)
    server.start()
    try:
        load_s, seen_503 = await server.wait_healthy()
        print(f"{server.name}: healthy after {load_s:.1f} s"
              + (" (503 while loading)" if seen_503 else ""), file=sys.stderr)
        warm = await stream_completion(server.port, dict(
            model="bench", prompt="Write a short poem about the morning sun.\n\n", max_tokens=a.tokens,
            temperature=0, stream=True, cache_prompt=False, ignore_eos=True), a.timeout)
        if warm["error"]:
            raise RuntimeError(f"{server.name}: warm-up failed: {warm['error']}")
        levels, k = {}, 0
        cores = os.cpu_count() or 1
        for conc in a.concurrency:
            # A run during which other processes took more than --max-others of the machine is
            # measured again (after waiting for quiet), up to --retries times.
            for attempt in range(a.retries + 1):
                if a.wait_quiet:
                    await wait_quiet(a.wait_quiet)
                r = await run_level(server, conc, k, a, ours)
                k += conc
                o = r["others_cpu_s"]
                r["others_share"] = o / (r["wall_s"] * cores) if o is not None else None
                r["attempts"] = attempt + 1
                r["disturbed"] = r["others_share"] is not None and r["others_share"] > a.max_others
                if not r["disturbed"]:
                    break
                print(f"{server.name} x{conc}: other processes took {100 * r['others_share']:.0f} % "
                      f"of the machine during the run" + ("; again" if attempt < a.retries else ""),
                      file=sys.stderr)
            levels[conc] = r
            msg = (f"{server.name} x{conc}: {r['aggregate_tok_s']:.1f} tok/s, TTFT "
                   f"{1e3 * r['ttft_mean_s']:.0f} ms, ITL p50 {1e3 * r['itl_p50_s']:.1f} ms "
                   f"p95 {1e3 * r['itl_p95_s']:.1f} ms, {r['tokens']} tokens")
            if ours and r.get("modelled_tok_s"):
                msg += f", modelled {r['modelled_tok_s']:.0f} tok/s, {r['rows_per_pass']:.2f} rows/pass"
            print(msg, file=sys.stderr)
            for e in r["errors"]:
                print(f"  error: {e}", file=sys.stderr)
        return dict(load_s=load_s, health_503_while_loading=seen_503, levels=levels)
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------


def machine():
    model, cores = "unknown", os.cpu_count()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() in ("model name", "Hardware", "Model") and v.strip():
                    model = v.strip()
                    break
    except OSError:
        pass
    return model, cores


def q8_0_of(model):
    """The Q8_0 conversion of the model, made once into the cache as llm_vs_llama_cpp.py does."""
    stem = os.path.basename(model).split(".")[0].replace("-q4_k_m", "")
    q8 = os.path.join(CACHE, f"models/{stem}.Q8_0.gguf")
    if not os.path.exists(q8):
        sys.path.insert(0, HERE)
        from llm_vs_llama_cpp import ensure_python_deps  # re-runs us in the venv with gguf
        ensure_python_deps()
        os.makedirs(os.path.dirname(q8), exist_ok=True)
        print(f"converting {model} to Q8_0 into {q8}", file=sys.stderr)
        sh([sys.executable, os.path.join(HERE, "convert_q8_0.py"), model, q8])
    return q8


def ratio(a, b):
    return a / b if a and b and b == b and a == a else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo", choices=["demo", "gemma3-270m"])
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens of each stream")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=4096, help="total context of all slots")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=1,
                    help="start each server this many times, alternating which goes first")
    ap.add_argument("--only", choices=["ours", "theirs"])
    ap.add_argument("--server-bin", default=os.path.join(ROOT, "target/release/llm-server"))
    ap.add_argument("--backend", default="auto", help="our server's --backend")
    ap.add_argument("--llama-server", help="llama-server binary (default: scripts/llama-cpp.sh --server)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per request")
    ap.add_argument("--wait-quiet", type=float, default=600, metavar="SECONDS",
                    help="before starting each server and each run, wait up to this long for the "
                         "machine to be idle (under 15 %% of its cores busy over 3 s); 0: don't")
    ap.add_argument("--max-others", type=float, default=0.05, metavar="SHARE",
                    help="a run during which other processes used more than this share of the "
                         "machine's CPU is measured again")
    ap.add_argument("--retries", type=int, default=4, help="how many times, at most")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.concurrency = [int(x) for x in a.concurrency.split(",")]

    fetch = [os.path.join(ROOT, "scripts/fetch-model.sh")] + ([] if a.model == "demo" else [a.model])
    model = sh(fetch).strip()
    t = str(a.threads)
    cmds = {}
    if a.only != "theirs":
        if not os.access(a.server_bin, os.X_OK):
            sys.exit(f"{a.server_bin} missing: cargo build --release -p rknn-llm --bin llm-server")
        cmds["ours"] = lambda port: [a.server_bin, "-m", model, "--host", HOST, "--port", str(port),
                                     "--parallel", str(a.slots), "-c", str(a.ctx), "-t", t,
                                     "--backend", a.backend]
    if a.only != "ours":
        q8 = q8_0_of(model)
        lsrv = a.llama_server or os.path.join(
            sh([os.path.join(ROOT, "scripts/llama-cpp.sh"), "--server"]).strip(), "llama-server")
        lhelp = subprocess.run([lsrv, "--help"], capture_output=True, text=True).stdout
        # Same slots, context and threads (batch threads too); no web UI, no prompt cache kept
        # in host RAM across requests (every prompt is distinct anyway), default continuous
        # batching, no speculative decoding (its default).
        extra = [f for f in ("--no-webui",) if f in lhelp]
        if "--cache-ram" in lhelp:
            extra += ["--cache-ram", "0"]
        cmds["theirs"] = lambda port: [lsrv, "-m", q8, "--host", HOST, "--port", str(port),
                                       "-np", str(a.slots), "-c", str(a.ctx), "-t", t, "-tb", t] + extra

    cpu, cores = machine()
    print(f"machine: {cpu}, {cores} cores; model {os.path.basename(model)}; {a.slots} slots, "
          f"-c {a.ctx}, -t {a.threads}, {a.tokens} tokens per stream", file=sys.stderr)
    logdir = tempfile.mkdtemp(prefix="server-bench-")
    runs = {k: [] for k in cmds}
    order = list(cmds)
    for rnd in range(a.rounds):
        for name in (order if rnd % 2 == 0 else order[::-1]):
            port = free_port()
            srv = Server(name, cmds[name](port), port, logdir)
            print(f"starting {name}: {' '.join(srv.cmd)}", file=sys.stderr)
            runs[name].append(asyncio.run(bench_server(srv, a, name == "ours")))

    # Medians over the rounds; ITL percentiles over the gaps of every round.
    med = statistics.median
    res = {}
    for name, rs in runs.items():
        res[name] = {}
        for c in a.concurrency:
            lv = [r["levels"][c] for r in rs]
            itl = [g for x in lv for g in x["itl"]]
            row = dict(aggregate_tok_s=med(x["aggregate_tok_s"] for x in lv),
                       ttft_mean_s=med(x["ttft_mean_s"] for x in lv),
                       itl_p50_s=pct(itl, 0.5), itl_p95_s=pct(itl, 0.95),
                       tokens=sum(x["tokens"] for x in lv),
                       early=sum(len(x["early"]) for x in lv),
                       errors=sum(len(x["errors"]) for x in lv),
                       client_cpu_share=med(x["client_cpu_share"] for x in lv),
                       server_cpu_s=med(x["server_cpu_s"] for x in lv) if lv[0]["server_cpu_s"] is not None else None,
                       others_cpu_s=med(x["others_cpu_s"] for x in lv) if lv[0]["others_cpu_s"] is not None else None,
                       wall_s=med(x["wall_s"] for x in lv),
                       usage_mismatch=sum(len(x["usage_mismatch"]) for x in lv),
                       attempts=sum(x["attempts"] for x in lv),
                       disturbed=sum(x["disturbed"] for x in lv))
            if name == "ours" and lv[0].get("modelled_tok_s") is not None:
                row["modelled_tok_s"] = med(x["modelled_tok_s"] for x in lv)
                row["rows_per_pass"] = med(x["rows_per_pass"] for x in lv)
                row["decode_rows_per_pass"] = med(x["decode_rows_per_pass"] for x in lv)
            res[name][c] = row
        c1 = a.concurrency[0]
        for c in a.concurrency:
            res[name][c]["x1"] = ratio(res[name][c]["aggregate_tok_s"], res[name][c1]["aggregate_tok_s"])
            if "modelled_tok_s" in res[name][c]:
                res[name][c]["modelled_x1"] = ratio(res[name][c]["modelled_tok_s"], res[name][c1]["modelled_tok_s"])

    load = os.getloadavg()
    print(f"\nmachine: {cpu}, {cores} cores (load average after: {load[0]:.2f}); "
          f"model {os.path.basename(model)}; {a.slots} slots, -c {a.ctx}, -t {a.threads}; "
          f"{a.tokens} tokens per stream; {a.rounds} round(s)")
    print("(streaming-read GB/s: not measured; llm_vs_llama_cpp.py takes it from the Rust decode "
          "bench, no Python helper to import)")
    label = {"ours": f"llm-server ({os.path.basename(model)}, --backend {a.backend})",
             "theirs": "llama-server (Q8_0)"}
    print("\n| server | streams | aggregate tok/s | x 1 stream | mean TTFT ms | ITL p50 ms "
          "| ITL p95 ms | tokens | early ends | wall s | client CPU | server CPU s | others CPU s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in res:
        for c, r in res[name].items():
            scpu = f"{r['server_cpu_s']:.1f}" if r["server_cpu_s"] is not None else "-"
            ocpu = f"{r['others_cpu_s']:.1f}" if r["others_cpu_s"] is not None else "-"
            print(f"| {label[name]} | {c} | {r['aggregate_tok_s']:.1f} | {r['x1']:.2f} | "
                  f"{1e3 * r['ttft_mean_s']:.0f} | {1e3 * r['itl_p50_s']:.1f} | {1e3 * r['itl_p95_s']:.1f} | "
                  f"{r['tokens']} | {r['early']} | {r['wall_s']:.1f} | {100 * r['client_cpu_share']:.1f} % | {scpu} | {ocpu} |")
    if "ours" in res and "theirs" in res:
        print("\n| streams | ours/theirs aggregate | ours/theirs mean TTFT | ours/theirs ITL p95 |")
        print("|---:|---:|---:|---:|")
        for c in a.concurrency:
            o, t_ = res["ours"][c], res["theirs"][c]
            print(f"| {c} | {ratio(o['aggregate_tok_s'], t_['aggregate_tok_s']):.2f} | "
                  f"{ratio(o['ttft_mean_s'], t_['ttft_mean_s']):.2f} | {ratio(o['itl_p95_s'], t_['itl_p95_s']):.2f} |")
    if "ours" in res and "modelled_tok_s" in res["ours"][a.concurrency[0]]:
        print("\nRK3588 cost model (our server's /metrics, deltas over each run):\n")
        print("| streams | modelled tok/s | x 1 stream | rows/pass | decode rows/pass |")
        print("|---:|---:|---:|---:|---:|")
        for c, r in res["ours"].items():
            print(f"| {c} | {r['modelled_tok_s']:.0f} | {r['modelled_x1']:.2f} | "
                  f"{r['rows_per_pass']:.2f} | {r['decode_rows_per_pass']:.2f} |")

    goals = []
    if "ours" in res and 4 in res["ours"] and 1 in res["ours"]:
        o1, o4 = res["ours"][1], res["ours"][4]
        goals.append(("ours 4 streams >= 2.5x ours 1 stream", o4["x1"], o4["x1"] >= 2.5))
        if "theirs" in res and 4 in res["theirs"]:
            q = ratio(o4["aggregate_tok_s"], res["theirs"][4]["aggregate_tok_s"])
            goals.append(("ours >= llama-server aggregate at 4 streams", q, q >= 1.0))
        q = ratio(o4["itl_p95_s"], o1["itl_p95_s"])
        goals.append(("ours p95 ITL at 4 streams <= 2x ours at 1 stream", q, q <= 2.0))
        if "modelled_x1" in o4:
            goals.append(("modelled 4 streams >= 3.5x modelled 1 stream", o4["modelled_x1"], o4["modelled_x1"] >= 3.5))
    if goals:
        print()
    for g, v, ok in goals:
        print(f"{'PASS' if ok else 'MISS'}: {g} ({v:.2f})")
    early = {n: sum(res[n][c]["early"] for c in res[n]) for n in res}
    for n, e in early.items():
        if e:
            print(f"note: {e} {n} stream(s) ended before {a.tokens} tokens")
    for n in res:
        dist = [c for c in res[n] if res[n][c]["disturbed"]]
        if dist:
            print(f"note: {n} runs at {dist} stream(s) were still disturbed by other processes "
                  f"after {a.retries} retries (others CPU column)")
        mism = sum(res[n][c]["usage_mismatch"] for c in res[n])
        if mism:
            print(f"note: {mism} {n} stream(s) sent a usage.completion_tokens other than the "
                  f"count of text events (several tokens in one event?)")
        errs = sum(res[n][c]["errors"] for c in res[n])
        if errs:
            print(f"note: {errs} {n} request(s) failed (see --json and {logdir})")

    if a.json:
        for name in runs:
            for r in runs[name]:
                for lv in r["levels"].values():
                    lv.pop("itl", None)
        with open(a.json, "w") as f:
            json.dump(dict(machine=dict(cpu=cpu, cores=cores, loadavg_after=load),
                           model=model, args=vars(a), commands={n: cmds[n](0) for n in cmds},
                           summary={n: {str(c): v for c, v in res[n].items()} for n in res},
                           goals=[dict(goal=g, value=v, passed=ok) for g, v, ok in goals],
                           runs=runs), f, indent=1)


if __name__ == "__main__":
    main()
