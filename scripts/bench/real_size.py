#!/usr/bin/env python3
"""Runs llm-decode on random-weight GGUFs of real models' shapes (scripts/bench/gen_random_gguf.py)
and prints one markdown row per model: file size, load time, peak RSS, prefill and decode tok/s,
and whether the output is sane (issue 32).

For each preset: generates ~/.cache/rknpu-rs/models/random/NAME-q8_0.gguf if missing (through
gen_random_gguf.py, which runs in the cache's venv), then runs

  llm-decode -m FILE -p PROMPT -n 16 --json --temp 0 -c 512 -t 2 --backend emulator

under GNU time (`/usr/bin/time -v`: "Maximum resident set size") when it is installed, else
alone (the peak RSS is then wait4's ru_maxrss); either way /proc/PID/status of llm-decode is
polled for the peaks of RssAnon and RssFile (memory of its own vs. pages of the mapped file).
A second, short run (-n 4 --dump-logits) checks that every logit is finite, that each row's
argmax is the token greedy decoding took, and that the tokens agree with the timed run.

With an llm-decode that has the converted-weight cache (--weight-cache, from 70e9566 on), each
model runs in three modes, one row each: `convert` (--no-weight-cache: the weights converted
at load), `write` (the first load into an empty cache directory, OUT/weight-cache/NAME/: convert
and write the file) and `hit` (a load from it); the write and hit runs must give the convert
run's tokens. The cache files are removed afterwards unless --keep-weight-cache. An older
llm-decode runs the convert mode only, without the flag.

Usage: python3 scripts/bench/real_size.py [NAME ...] [--bin PATH | --no-build] [--threads 2]
         [--ctx 512] [-n 16] [--backend emulator] [--prompt TEXT] [--repeat N]
         [--modes convert,write,hit] [--keep-weight-cache] [--no-logit-check] [--json OUT]
  NAME: gen_random_gguf.py's presets (default: tiny tinyllama-1.1b qwen2-0.5b qwen2.5-1.5b).
  Builds llm-decode first (cargo build --release -p rknn-llm --bin llm-decode -j 1, into
  $CARGO_TARGET_DIR or target/) unless --bin or --no-build. Stdlib only.
"""
import argparse
import array
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("RKNPU_CACHE", os.path.expanduser("~/.cache/rknpu-rs"))
GEN = os.path.join(ROOT, "scripts", "bench", "gen_random_gguf.py")
DEFAULT_PRESETS = ["tiny", "tinyllama-1.1b", "qwen2-0.5b", "qwen2.5-1.5b"]


def machine():
    model, cores = "unknown CPU", os.cpu_count()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1))
            mem = f", {kb / 1048576:.0f} GiB RAM"
    except (OSError, AttributeError):
        pass
    return f"{model}, {cores} logical CPUs{mem}"


def gnu_time():
    if not os.path.exists("/usr/bin/time"):
        return None
    r = subprocess.run(["/usr/bin/time", "--version"], capture_output=True, text=True)
    return "/usr/bin/time" if "GNU" in (r.stdout + r.stderr) else None


def build():
    cmd = ["cargo", "build", "--release", "-p", "rknn-llm", "--bin", "llm-decode", "-j", "1"]
    print("$", " ".join(cmd), file=sys.stderr)
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        sys.exit("real_size.py: the build failed (--bin PATH runs another llm-decode)")
    tgt = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(tgt, "release", "llm-decode")


def model_path(name, out_dir):
    return os.path.join(out_dir, f"{name}-q8_0.gguf")


def ensure_model(name, out_dir):
    path = model_path(name, out_dir)
    if not os.path.exists(path):
        cmd = [sys.executable, GEN, name, "--out", out_dir]
        print("$", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
    return path


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def read_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "RssAnon", "RssFile", "VmRSS"):
                    out[k] = int(v.split()[0])  # kB
    except OSError:
        pass
    return out


class Poller(threading.Thread):
    """Polls /proc/PID/status of the llm-decode process (PID, or PID's child when PID is GNU
    time) and keeps the peaks, in kB."""

    def __init__(self, pid, through_time):
        super().__init__(daemon=True)
        self.pid, self.through_time = pid, through_time
        self.peak = {}
        self.done = threading.Event()

    def run(self):
        target = None
        while not self.done.is_set():
            if target is None:
                kids = children(self.pid) if self.through_time else [self.pid]
                target = kids[0] if kids else None
            if target is not None:
                for k, v in read_status(target).items():
                    self.peak[k] = max(self.peak.get(k, 0), v)
            time.sleep(0.02)


def run_decode(binary, path, args, extra, timer):
    cmd = [binary, "-m", path, "-p", args.prompt, "-n", str(args.n), "--json", "--temp", "0",
           "-c", str(args.ctx), "-t", str(args.threads), "--backend", args.backend] + extra
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        full = [timer, "-v", "-o", tf.name] + cmd if timer else cmd
        t0 = time.monotonic()
        p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        poller = Poller(p.pid, timer is not None)
        poller.start()
        out, err = [], []
        ts = [threading.Thread(target=lambda s, b: b.append(s.read()), args=(s, b), daemon=True)
              for s, b in ((p.stdout, out), (p.stderr, err))]
        for t in ts:
            t.start()
        load1 = os.getloadavg()[0]
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        for t in ts:
            t.join()
        poller.done.set()
        poller.join()
        wall = time.monotonic() - t0
        max_rss_kb = ru.ru_maxrss
        if timer:
            m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", tf.read())
            max_rss_kb = int(m.group(1)) if m else None
    # wait4's usage of the child includes the children it waited for (llm-decode under time).
    res = dict(cmd=cmd, rc=p.returncode, wall_s=wall, cpu_s=ru.ru_utime + ru.ru_stime,
               sys_s=ru.ru_stime, loadavg_1m=load1, stderr=err[0], max_rss_kb=max_rss_kb,
               poll_kb=poller.peak, json=None)
    if p.returncode == 0:
        try:
            res["json"] = json.loads(out[0].strip().splitlines()[-1])
        except (ValueError, IndexError) as e:
            res["error"] = f"no JSON on stdout: {e}"
    else:
        res["error"] = (err[0].strip().splitlines() or ["(no stderr)"])[-1]
    return res


def logit_check(binary, path, args, timer, timed_ids, extra=()):
    """A short run with --dump-logits: (ok, note)."""
    with tempfile.TemporaryDirectory() as d:
        dump = os.path.join(d, "logits.f32")
        short = argparse.Namespace(**{**vars(args), "n": min(args.n, 4)})
        r = run_decode(binary, path, short, list(extra) + ["--dump-logits", dump], timer)
        if r["json"] is None:
            return False, f"dump run failed: {r.get('error')}"
        j = r["json"]
        n_vocab = None
        vals = array.array("f")
        with open(dump, "rb") as f:
            vals.frombytes(f.read())
        rows = j["stats"]["prompt_tokens"] + j["stats"]["decode_forwards"]
        if rows == 0 or len(vals) % rows:
            return False, f"dump of {len(vals)} floats is not {rows} rows"
        n_vocab = len(vals) // rows
        bad = sum(1 for v in vals if not math.isfinite(v))
        notes = []
        if bad:
            notes.append(f"{bad} non-finite logits")
        gen, plen = j["generated_ids"], j["stats"]["prompt_tokens"]
        mism = 0
        for i, tok in enumerate(gen):
            r0 = (plen - 1 + i) * n_vocab
            if r0 + n_vocab > len(vals):
                break
            row = vals[r0:r0 + n_vocab]
            if max(range(n_vocab), key=row.__getitem__) != tok:
                mism += 1
        if mism:
            notes.append(f"{mism} argmax != greedy token")
        if timed_ids[:len(gen)] != gen:
            notes.append(f"tokens differ from the timed run: {gen} vs {timed_ids[:len(gen)]}")
        last = vals[(rows - 1) * n_vocab:]
        mean = sum(last) / n_vocab
        std = math.sqrt(sum((v - mean) ** 2 for v in last) / n_vocab)
        notes.append(f"{rows} rows of {n_vocab} logits, last row std {std:.2f}, max {max(last):.2f}")
        return not (bad or mism), "; ".join(notes)


def mb(kb):
    return f"{kb / 1024:.0f}" if kb else "?"


def cache_outcome(stderr):
    """The weight cache's line on llm-decode's stderr ("hit", "written", ...), if any."""
    for line in stderr.splitlines():
        low = line.lower()
        if line.startswith("llm-decode: ") and "weight" in low and "cache" in low:
            return line[len("llm-decode: "):].strip()
    return None


def supports_weight_cache(binary):
    r = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return "--weight-cache" in r.stdout


def measure(name, mode, binary, path, size, a, timer, extra, ref_ids):
    """Runs one mode `repeat` times (once for "write"): (markdown row, details)."""
    n_runs = 1 if mode == "write" else max(1, a.repeat)
    runs = []
    for _ in range(n_runs):
        runs.append(run_decode(binary, path, a, extra, timer))
        if mode == "write":
            break
    good = [x for x in runs if x["json"] is not None]
    d = dict(name=name, mode=mode, path=path, size=size,
             runs=[{k: v for k, v in x.items() if k != "stderr"} for x in runs])
    for x, rd in zip(runs, d["runs"]):
        rd["weight_cache"] = cache_outcome(x["stderr"])
    if not good:
        r = runs[0]
        d["stderr"] = r["stderr"]
        print(f"{name} [{mode}]: FAILED (exit {r['rc']}): {r['stderr'].strip()[-2000:]}",
              file=sys.stderr)
        return f"| {name} | {mode} | {size / 1e9:.3f} | FAILED: {r.get('error')} | | | | | | | | | |", d, None
    r = min(good, key=lambda x: x["json"]["stats"]["load_s"])
    j, s = r["json"], r["json"]["stats"]
    ids = j["generated_ids"]
    med = lambda key: statistics.median(x["json"][key] for x in good)
    sane = f"{len(ids)} tokens, {len(set(ids))} distinct"
    ok = bool(ids) and len(good) == len(runs)
    if any(x["json"]["generated_ids"] != ids for x in good):
        sane += "; the repeated runs' tokens differ"
        ok = False
    if ref_ids is not None:
        same = ids == ref_ids
        ok = ok and same
        sane += "; tokens = convert's" if same else f"; tokens DIFFER from convert's: {ids} vs {ref_ids}"
    elif not a.no_logit_check:
        lc_ok, note = logit_check(binary, path, a, timer, ids, extra)
        ok = ok and lc_ok
        sane += "; logits finite, argmax = greedy" if lc_ok else f"; {note}"
        d["logit_check"] = note
    outcome = cache_outcome(r["stderr"])
    if mode != "convert" and outcome:
        short = ("hit" if "read from" in outcome else "written" if "cached in" in outcome
                 else outcome[:80])
        sane += f"; cache {short}"
    peak = r["poll_kb"]
    m = s.get("modelled_rk3588")
    modelled = f"{m['prefill_tok_s']:.1f} / {m['decode_tok_s']:.1f}" if m else "-"
    row = (f"| {name} | {mode} | {size / 1e9:.3f} | {s['load_s']:.2f} | {size / 1e6 / s['load_s']:.0f} | "
           f"{r['cpu_s']:.1f} / {r['wall_s']:.1f} | "
           f"{mb(r['max_rss_kb'])} | {r['max_rss_kb'] * 1024 / size:.2f} | "
           f"{mb(peak.get('RssAnon'))} / {mb(peak.get('RssFile'))} | "
           f"{med('prefill_tok_s'):.1f} | {med('decode_tok_s'):.2f} | {modelled} | "
           f"{'ok' if ok else 'BAD'}: {sane} |")
    d["text"] = j["text"]
    loads = ", ".join(f"{x['json']['stats']['load_s']:.2f}" for x in good)
    avgs = ", ".join(f"{x['loadavg_1m']:.1f}" for x in runs)
    print(f"{name} [{mode}]: load {loads} s (1-min load average at start: {avgs}), "
          f"peak RSS {mb(r['max_rss_kb'])} MB, text {j['text']!r}"
          + (f", {outcome}" if outcome else ""), file=sys.stderr, flush=True)
    return row, d, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME")
    ap.add_argument("--bin", help="llm-decode to run (default: build it)")
    ap.add_argument("--no-build", action="store_true", help="run $CARGO_TARGET_DIR's llm-decode as it is")
    ap.add_argument("--out", default=os.path.join(CACHE, "models", "random"))
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="emulator")
    ap.add_argument("--repeat", type=int, default=1,
                    help="timed runs per model and mode: the row shows the fastest load and the median speeds")
    ap.add_argument("--modes", default="convert,write,hit",
                    help="with a weight-cache llm-decode: convert (--no-weight-cache), write (first "
                         "load into an empty cache), hit (a load from it); default %(default)s")
    ap.add_argument("--keep-weight-cache", action="store_true",
                    help="keep the cache files (OUT/weight-cache/NAME/) after the runs")
    ap.add_argument("--no-logit-check", action="store_true")
    ap.add_argument("--json", help="write every run's details to this file")
    a = ap.parse_args()
    names = a.names or DEFAULT_PRESETS
    if a.bin:
        binary = a.bin
    elif a.no_build:
        binary = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                              "release", "llm-decode")
    else:
        binary = build()
    timer = gnu_time()
    has_cache = supports_weight_cache(binary)
    modes = [m for m in a.modes.split(",") if m] if has_cache else ["convert"]
    for m in modes:
        if m not in ("convert", "write", "hit"):
            ap.error(f"unknown mode {m!r}")
    print(f"machine: {machine()}", flush=True)
    print(f"binary: {binary} ({'weight cache: modes ' + ', '.join(modes) if has_cache else 'no weight cache'}); "
          f"backend {a.backend}, -t {a.threads}, -c {a.ctx}, -n {a.n}, greedy; "
          f"peak RSS from {'GNU time -v' if timer else 'wait4 ru_maxrss'}", flush=True)
    rows, details = [], []
    for name in names:
        path = ensure_model(name, a.out)
        size = os.path.getsize(path)
        cache_dir = os.path.join(a.out, "weight-cache", name)
        ref_ids = None
        for mode in modes:
            if mode == "convert":
                extra = ["--no-weight-cache"] if has_cache else []
            else:
                if mode == "write":
                    shutil.rmtree(cache_dir, ignore_errors=True)
                os.makedirs(cache_dir, exist_ok=True)
                extra = ["--weight-cache", cache_dir]
            row, d, ids = measure(name, mode, binary, path, size, a, timer, extra,
                                  None if mode == "convert" else ref_ids)
            if mode == "convert":
                ref_ids = ids
            rows.append(row)
            details.append(d)
        if not a.keep_weight_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)
    if not a.keep_weight_cache:
        try:
            os.rmdir(os.path.join(a.out, "weight-cache"))
        except OSError:
            pass
    sys.stderr.flush()
    print(flush=True)
    print("| model | mode | file GB | load s | load MB/s | run CPU / wall s | peak RSS MB | RSS / file "
          "| peak anon / file-backed MB | prefill tok/s | decode tok/s "
          "| modelled RK3588 prefill / decode tok/s | output |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(machine=machine(), binary=binary, details=details), f, indent=1)


if __name__ == "__main__":
    main()
