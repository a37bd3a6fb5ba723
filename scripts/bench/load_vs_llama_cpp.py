#!/usr/bin/env python3
"""Load time and peak RSS of llm-decode against llama.cpp on the same GGUF, threads and -c:

- ours cold: a fresh weight cache, so the load converts the weights and writes the cache;
- ours warm: the cache the cold run wrote, read straight into the NPU's memories;
- llama.cpp (`llama-completion`) with its file mapped (its default: pages come in as the first
  token touches them, so its "load time" leaves the reading to the first token) and with
  `-lm none` (the file read at load, the like-for-like figure for a load that converts);
- time to the first token of the same prompt (load + prefill), which counts llama.cpp's lazy
  mapping where it is paid.

Each program runs ROUNDS times, alternating; every figure is a median. Our KV cache is f16 as
llama.cpp's, and both get the same -c. Peak RSS: ours as llm-decode reports it (VmHWM), llama.cpp's its maximum resident set.

Usage: python3 scripts/bench/load_vs_llama_cpp.py MODEL.gguf [--llama-model Q8_0.gguf]
       [--threads 2] [--rounds 3] [--ctx 512] [--json OUT.json]
(--llama-model defaults to MODEL: pass the Q8_0 conversion of a quantised model to compare at
about the same bytes per weight, as scripts/bench/convert_q8_0.py makes it.)
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "The capital of France is"


def run(cmd):
    """Runs cmd; returns (stdout, stderr)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout, p.stderr


def rss_of(cmd):
    """Runs cmd in a fresh Python child and returns its peak RSS in MiB (RUSAGE_CHILDREN is a
    maximum over every child so far, so each measurement needs its own parent)."""
    code = ("import resource,subprocess,sys;"
            "subprocess.run(sys.argv[1:],check=True,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL);"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    kib = subprocess.run([sys.executable, "-c", code] + cmd, check=True,
                         capture_output=True, text=True).stdout
    return int(kib) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--llama-model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--json")
    a = ap.parse_args()
    llama_model = a.llama_model or a.model
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "rknn-llm", "--bin", "llm-decode"],
                   cwd=ROOT, check=True)
    ours = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                        "release", "llm-decode")
    bindir = subprocess.run([os.path.join(ROOT, "scripts", "llama-cpp.sh")], check=True,
                            capture_output=True, text=True).stdout.strip().splitlines()[-1]
    llama = os.path.join(bindir, "llama-completion")
    t = str(a.threads)
    base = ["-p", PROMPT, "-n", "1", "--temp", "0", "-t", t, "-c", str(a.ctx)]
    rows = {k: {"load_s": [], "ttft_s": [], "rss_mib": []}
            for k in ("ours cold", "ours warm", "llama.cpp mmap", "llama.cpp -lm none")}
    for r in range(a.rounds):
        cache = tempfile.mkdtemp(prefix="rknn-wcache-bench-")
        try:
            ours_cmd = [ours, "-m", a.model] + base + ["--cache-type", "f16", "--json",
                                                     "--weight-cache", cache]
            for name in ("ours cold", "ours warm"):
                if name == "ours cold":
                    shutil.rmtree(cache, ignore_errors=True)
                out, _ = run(ours_cmd)
                s = json.loads(out.strip().splitlines()[-1])["stats"]
                rows[name]["load_s"].append(s["load_s"])
                rows[name]["ttft_s"].append(s["load_s"] + s["prefill_s"])
                rows[name]["rss_mib"].append(s["memory"]["peak_rss_bytes"] / 2**20)
            for name, extra in (("llama.cpp mmap", []), ("llama.cpp -lm none", ["-lm", "none"])):
                cmd = [llama, "-m", llama_model] + base + ["-no-cnv"] + extra
                _, err = run(cmd)
                load = float(re.search(r"load time =\s*([\d.]+) ms", err).group(1)) / 1e3
                pp = float(re.search(r"prompt eval time =\s*([\d.]+) ms", err).group(1)) / 1e3
                rows[name]["load_s"].append(load)
                rows[name]["ttft_s"].append(load + pp)
                rows[name]["rss_mib"].append(rss_of(cmd))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} CPUs; {a.model} (llama.cpp: {llama_model}); "
          f"-t {a.threads} -c {a.ctx}; medians of {a.rounds} rounds")
    print("| | load (s) | load + prefill (s) | peak RSS (MiB) |")
    print("|---|---:|---:|---:|")
    med = {k: {m: statistics.median(v) for m, v in row.items()} for k, row in rows.items()}
    for k, m in med.items():
        print(f"| {k} | {m['load_s']:.2f} | {m['ttft_s']:.2f} | {m['rss_mib']:.0f} |")
    ref = med["llama.cpp -lm none"]
    for k in ("ours cold", "ours warm"):
        print(f"{k}: load {med[k]['load_s'] / ref['load_s']:.2f}× llama.cpp -lm none's, "
              f"{med[k]['load_s'] / med['llama.cpp mmap']['load_s']:.2f}× its mapped load; "
              f"load + prefill {med[k]['ttft_s'] / med['llama.cpp mmap']['ttft_s']:.2f}× mapped's; "
              f"peak RSS {med[k]['rss_mib'] / med['llama.cpp mmap']['rss_mib']:.2f}×")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"raw": rows, "median": med, "machine": cpu}, f, indent=1)


if __name__ == "__main__":
    main()
