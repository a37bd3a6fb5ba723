#!/usr/bin/env python3
"""The NPU path (emulator) against llama.cpp on the same model and thread count, in one run:

- streaming-read bandwidth (measured by the decode bench, same threads);
- decode (tg64) and prefill (pp128) tok/s: `cargo bench -p rknn-llm --bench decode --
  --backend emulator` against `llama-bench` on the Q8_0 conversion of the demo model;
- decode as a share of the bandwidth limit (weight bytes per token x tok/s / read bandwidth),
  from the medians of the rounds, and as the median of the decode bench's runs each divided by
  reads taken right before and after it (this machine's bandwidth moves within minutes);
- peak RSS of `llm-decode` and of `llama-completion` on the same 128-token prompt, 64 tokens.

The two programs alternate, ROUNDS times, in ABBA order (which one runs first alternates from
round to round). Needs the model (scripts/fetch-model.sh) and llama.cpp (scripts/llama-cpp.sh);
converts the model to Q8_0 into the cache once.

Usage: python3 scripts/bench/llm_vs_llama_cpp.py [--threads 2] [--rounds 2] [--json OUT.json]
       [--model demo|gemma3-270m]   (the demo SmolLM2 by default; scripts/fetch-model.sh's names)
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("RKNPU_CACHE", os.path.expanduser("~/.cache/rknpu-rs"))


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def ensure_python_deps():
    """Re-runs this script under the cache's private venv (the one scripts/llama-cpp.sh makes)
    with gguf and numpy installed there, unless this Python already has them: a fresh machine
    has neither, and the system Python stays untouched."""
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.path.join(CACHE, "py")
    py = os.path.join(venv, "bin", "python3")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        sys.exit("gguf/numpy still missing from " + venv)
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "gguf==0.19.0", "numpy"], check=True)
    os.execv(py, [py] + sys.argv)


def peak_rss_mb(cmd):
    """Runs cmd and returns the peak RSS of that child in MB (RUSAGE_CHILDREN is a maximum
    over every child so far, so each measurement runs in a fresh Python process)."""
    code = ("import resource,subprocess,sys;"
            "subprocess.run(sys.argv[1:],check=True,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL);"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    return int(sh([sys.executable, "-c", code] + cmd)) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--model", default="demo", choices=["demo", "gemma3-270m"])
    a = ap.parse_args()
    ensure_python_deps()
    t = str(a.threads)
    fetch = [os.path.join(ROOT, "scripts/fetch-model.sh")] + ([] if a.model == "demo" else [a.model])
    model = sh(fetch).strip()
    sh([os.path.join(ROOT, "scripts/llama-cpp.sh")])  # builds llama.cpp once, into the cache
    lbin = sh([os.path.join(ROOT, "scripts/llama-cpp.sh"), "--print-bin"]).strip()
    stem = os.path.basename(model).split(".")[0].replace("-q4_k_m", "")
    q8 = os.path.join(CACHE, f"models/{stem}.Q8_0.gguf")
    if not os.path.exists(q8):
        os.makedirs(os.path.dirname(q8), exist_ok=True)
        sh([sys.executable, os.path.join(ROOT, "scripts/bench/convert_q8_0.py"), model, q8])
    sh(["cargo", "build", "--release", "-q", "-p", "rknn-llm", "--bin", "llm-decode"], cwd=ROOT)
    sh(["cargo", "bench", "--no-run", "-q", "-p", "rknn-llm", "--bench", "decode"], cwd=ROOT)
    decode_bin = os.path.join(ROOT, "target/release/llm-decode")

    # Weight bytes streamed per decode token: every matrix once in int8 (the tied head too).
    import gguf  # noqa: E402 (PyPI gguf, see ensure_python_deps)
    r = gguf.GGUFReader(model)
    names = {x.name for x in r.tensors}
    wbytes = sum(int(x.n_elements) for x in r.tensors if len(x.shape) == 2 and x.name != "token_embd.weight")
    if "output.weight" not in names:
        wbytes += int(next(x.n_elements for x in r.tensors if x.name == "token_embd.weight"))

    # A prompt of exactly 128 tokens.
    words = ("the quick brown fox jumps over the lazy dog while a small river runs past an old "
             "mill near the quiet town").split()
    n = 100
    while True:
        text = " ".join(words[i % len(words)] for i in range(n))
        ids = json.loads(sh([decode_bin, "-m", model, "-p", text, "--tokenize", "--json"]))
        if len(ids) >= 128:
            break
        n += 1
    prompt_file = os.path.join(CACHE, "prompt128.txt")
    with open(prompt_file, "w") as f:
        f.write(text)

    ours, theirs, rss_ours, rss_theirs, bw = [], [], [], [], []

    def run_ours():
        out = sh(["cargo", "bench", "-q", "-p", "rknn-llm", "--bench", "decode", "--", model,
                  "--backend", "emulator", "-t", t, "-p", "128", "-n", "64", "-r", "3", "--json"], cwd=ROOT)
        d = json.loads(out.strip().splitlines()[-1])
        ours.append(d)
        bw.append(d["stream_read_gb_s"])

    def run_theirs():
        lb = json.loads(sh([os.path.join(lbin, "llama-bench"), "-m", q8, "-t", t, "-p", "128",
                            "-n", "64", "-r", "3", "-o", "json"]))
        theirs.append({("pp128" if x["n_prompt"] else "tg64"): x["avg_ts"] for x in lb})

    for i in range(a.rounds):
        # ABBA: which program runs first alternates from round to round.
        for run in ((run_ours, run_theirs) if i % 2 == 0 else (run_theirs, run_ours)):
            run()
        rss_ours.append(peak_rss_mb([decode_bin, "-m", model, "-f", prompt_file, "-n", "64",
                                     "--temp", "0", "-t", t, "--backend", "emulator"]))
        rss_theirs.append(peak_rss_mb([os.path.join(lbin, "llama-completion"), "-m", q8, "-f",
                                       prompt_file, "-n", "64", "--temp", "0", "-t", t,
                                       "-no-cnv", "--no-display-prompt"]))
    load = os.getloadavg()
    med = statistics.median
    tg_o, pp_o = med(x["tg64"]["mean"] for x in ours), med(x["pp128"]["mean"] for x in ours)
    # Each decode run against reads taken right before and after it (the decode bench).
    paired = med(x["decode_share_paired"] for x in ours)
    # The engine's fork-join cost in decode (the calling thread waiting for a busy worker).
    waits = [x["decode_wait_ms_per_token"] for x in ours if "decode_wait_ms_per_token" in x]
    wait = med(waits) if waits else None
    tg_l, pp_l = med(x["tg64"] for x in theirs), med(x["pp128"] for x in theirs)
    bw_m = med(bw)
    share = tg_o * wbytes / 1e9 / bw_m
    res = dict(threads=a.threads, rounds=a.rounds, weight_bytes_per_token=wbytes,
               stream_read_gb_s=bw_m, decode_tok_s=tg_o, prefill_tok_s=pp_o,
               llama_cpp_q8_0_decode_tok_s=tg_l, llama_cpp_q8_0_prefill_tok_s=pp_l,
               decode_share_of_limit=share, decode_share_paired=paired, decode_vs_llama=tg_o / tg_l, prefill_vs_llama=pp_o / pp_l,
               decode_wait_ms_per_token=wait,
               peak_rss_mb=med(rss_ours), llama_cpp_peak_rss_mb=med(rss_theirs),
               rss_ratio=med(rss_ours) / med(rss_theirs), loadavg=load)
    print(f"threads {a.threads}, {a.rounds} rounds, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"streaming read: {bw_m:.1f} GB/s; weights {wbytes / 1e6:.1f} MB per token "
          f"(limit {bw_m * 1e9 / wbytes:.0f} tok/s)")
    print("| | rknn-llm (emulator, W8A8) | llama.cpp Q8_0 | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| decode tg64 (tok/s) | {tg_o:.1f} | {tg_l:.1f} | {tg_o / tg_l:.2f} |")
    print(f"| prefill pp128 (tok/s) | {pp_o:.1f} | {pp_l:.1f} | {pp_o / pp_l:.2f} |")
    print(f"| peak RSS (MB) | {med(rss_ours):.0f} | {med(rss_theirs):.0f} | {med(rss_ours) / med(rss_theirs):.2f} |")
    print(f"decode at {100 * share:.0f} % of the bandwidth limit "
          f"({100 * paired:.0f} % as the median of runs each paired with reads beside it)")
    if wait is not None:
        print(f"the calling thread waited for the engine's worker {wait:.2} ms per decoded token "
              f"({100 * wait / (1e3 / tg_o):.0f} % of a token)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
