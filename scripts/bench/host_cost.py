#!/usr/bin/env python3
"""Measures the engine's own host cost per phase on real shapes and carries it to the board's
Cortex-A76 by a measured scale (issue 42, item 1; docs/npu-matmul-performance.md, "The engine's
host cost, measured").

1. The scale. llama.cpp's CPU path (llama-bench, the build of scripts/llama-cpp.sh) runs the
   campaign's 9B shape here (gen_random_gguf.py preset campaign-9b: random Q8_0, 10.2 GB):
   pp512 and tg128 with -t THREADS. The campaign measured the same shapes on four A76 cores
   (its CPU-only build, -t 4, unpinned: pp512 13.65 tok/s, tg128 2.78). The ratio of the
   per-thread rates, here / A76, is how much faster one host thread here is than one A76
   thread: for GEMM-like work from pp512, for streaming work from tg128.
2. The engine. llm-decode (--backend emulator, W8A8, the engine's defaults) runs the random
   real-size GGUF of each preset on a prompt of about PROMPT tokens, once with -n 0 (the
   prefill alone) and once with -n DECODE; the difference is the decode. From --json:
   the engine's glue (quantise, pack, collect: thread time summed over the lanes), the
   activation elements it prepared and collected (`Stats::input_elements`/`output_elements`,
   the elements the cost model's host term counts), and the model's host ops between the
   linears (attention; norms, RoPE, activations, sampling as "other").
3. Carried to the board: thread time here × (here / A76 per-thread ratio) = A76 thread time;
   the glue then spreads over the board's three lanes as it spreads over this machine's lanes
   (prompt chunks are prepared, packed and collected on every lane), so the wall time per
   element on RK3588 is that over 3.

Prints markdown: the machine, the llama.cpp rates and ratios, and per preset the prefill's glue
ns per element (thread time here, and carried to the A76 as wall time over three lanes), the
prefill's host ops per token, and decode's glue and host ops per token.

Usage: python3 scripts/bench/host_cost.py [NAME ...] [--bin PATH | --no-build] [--threads 2]
         [--prompt 128] [--decode 32] [--bench-bin DIR] [--json OUT]
  NAME: gen_random_gguf.py presets (default: qwen2-0.5b tinyllama-1.1b qwen2.5-1.5b). Needs a quiet
  machine: timings under other load are not the engine's. Stdlib only.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_size  # noqa: E402  (machine(), build(), ensure_model())

ROOT = real_size.ROOT
CACHE = real_size.CACHE
# The campaign's CPU-only build on RK3588, four A76 threads, unpinned
# (../shared/seed/rknpu2-campaign-seed.txt, "NPU vs CPU-only build").
A76_PP512, A76_TG128, A76_THREADS = 13.65, 2.78, 4
BOARD_LANES = 3
WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing about "
         "rivers mountains and distant cities under a pale morning sky").split()


def llama_rates(bench_bin, model, threads):
    exe = os.path.join(bench_bin, "llama-bench")
    cmd = [exe, "-m", model, "-p", "512", "-n", "128", "-t", str(threads), "-r", "1", "-o", "json"]
    print("$", " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] == 512 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] == 128 and r["n_prompt"] == 0)
    return pp, tg


def decode_json(binary, model, prompt, n, threads):
    cmd = [binary, "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-c", "1024",
           "-t", str(threads), "--backend", "emulator", "--no-weight-cache", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def prompt_of(binary, model, tokens, threads):
    """A prompt of about `tokens` tokens: words cycled, their count adjusted once to the
    tokenizer's measured rate."""
    words = tokens
    for _ in range(3):
        text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
        got = decode_json(binary, model, text, 0, threads)["stats"]["prompt_tokens"]
        if abs(got - tokens) <= 2:
            return text, got
        words = max(1, round(words * tokens / got))
    return text, got


def phases(d):
    e = d["stats"]["engine"]
    s = d["stats"]
    return {
        "quantize": e["quantize"]["s"], "pack": e["pack"]["s"], "collect": e["collect"]["s"],
        "elements": e["input_elements"] + e["output_elements"],
        "attention": s["attention_s"], "other": s["other_s"], "matmul": s["matmul_s"],
        "lanes": e["cores"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=["qwen2-0.5b", "tinyllama-1.1b", "qwen2.5-1.5b"])
    ap.add_argument("--bin")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--bench-bin", default=os.path.join(CACHE, "llama.cpp", "bin"))
    ap.add_argument("--json")
    args = ap.parse_args()
    binary = args.bin or (os.path.join(ROOT, "target", "release", "llm-decode")
                          if args.no_build else real_size.build())
    out_dir = os.path.join(CACHE, "models", "random")
    result = {"machine": real_size.machine(), "threads": args.threads}
    print(f"machine: {result['machine']}; {args.threads} threads\n")

    nine = real_size.ensure_model("campaign-9b", out_dir)
    pp, tg = llama_rates(args.bench_bin, nine, args.threads)
    r_pp = (pp / args.threads) / (A76_PP512 / A76_THREADS)
    r_tg = (tg / args.threads) / (A76_TG128 / A76_THREADS)
    result["llama"] = {"pp512": pp, "tg128": tg, "thread_ratio_pp": r_pp, "thread_ratio_tg": r_tg}
    print("| llama.cpp CPU, campaign 9B (Q8_0) | here | RK3588, 4 A76 (campaign) | one thread here / one A76 thread |")
    print("|---|---:|---:|---:|")
    print(f"| pp512 tok/s | {pp:.2f} ({args.threads} threads) | {A76_PP512} | {r_pp:.2f} |")
    print(f"| tg128 tok/s | {tg:.2f} ({args.threads} threads) | {A76_TG128} | {r_tg:.2f} |")
    print()

    print("| model | prompt tokens | prefill glue ns/element here (quantize / pack / collect) "
          "| prefill glue ns/element on RK3588, 3 lanes (GEMM scale; streaming scale) "
          "| prefill host ops ms per token here (attention / other) "
          "| decode glue µs per token here | decode host ops µs per token here (attention / other) |")
    print("|---|---:|---|---|---|---:|---|")
    result["models"] = {}
    for name in args.names:
        path = real_size.ensure_model(name, out_dir)
        text, n_prompt = prompt_of(binary, path, args.prompt, args.threads)
        pre = phases(decode_json(binary, path, text, 0, args.threads))
        full = decode_json(binary, path, text, args.decode, args.threads)
        both = phases(full)
        steps = full["stats"]["decode_forwards"] or 1
        dec = {k: both[k] - pre[k] for k in ("quantize", "pack", "collect", "elements",
                                              "attention", "other")}
        glue = pre["quantize"] + pre["pack"] + pre["collect"]
        ns = 1e9 * glue / pre["elements"]
        split = [1e9 * pre[k] / pre["elements"] for k in ("quantize", "pack", "collect")]
        board = [ns * r / BOARD_LANES for r in (r_pp, r_tg)]
        host_ops = [1e3 * pre[k] / n_prompt for k in ("attention", "other")]
        dglue = 1e6 * (dec["quantize"] + dec["pack"] + dec["collect"]) / steps
        dops = [1e6 * dec[k] / steps for k in ("attention", "other")]
        result["models"][name] = {
            "prompt_tokens": n_prompt, "prefill": pre, "decode": dec, "decode_steps": steps,
            "prefill_glue_ns_per_element": ns, "rk3588_ns_per_element": board,
        }
        print(f"| {name} | {n_prompt} | {ns:.2f} ({split[0]:.2f} / {split[1]:.2f} / {split[2]:.2f}) "
              f"| {board[0]:.2f}; {board[1]:.2f} | {host_ops[0]:.3f} / {host_ops[1]:.3f} "
              f"| {dglue:.0f} | {dops[0]:.0f} / {dops[1]:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
