#!/usr/bin/env python3
"""What `n` choices cost with the prompt evaluated once (the batcher copies the first choice's
cache into the others' slots) against each choice evaluating it (`cache_prompt: false`), on a
running llm-server: the rows its passes evaluated (from /metrics) and the wall time of one
request of `n` choices of MAX_TOKENS tokens each, two fresh prompts each way.

Usage: start the server with at least N slots, e.g.
  cargo run --release -p rknn-llm --bin llm-server -- \
      -m models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8099 --parallel 4
then: python3 scripts/bench/n_choices.py [--url http://localhost:8099] [--n 4]
"""
import argparse
import json
import time
import urllib.request


def metrics(url):
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://localhost:8099")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    notes = " ".join(
        f"Note {i}: the tomatoes in bed {i} need water and the beans need sticks." for i in range(20)
    )
    for cache in (False, True):
        for run in range(2):
            # A prompt no slot holds any of (its first words differ).
            text = f"Request {run} {cache}. Summarise these notes about the garden. {notes}"
            body = {
                "messages": [{"role": "user", "content": text}],
                "n": args.n,
                "max_tokens": args.max_tokens,
                "temperature": 0.8,
                "cache_prompt": cache,
            }
            before = metrics(args.url)
            t = time.time()
            req = urllib.request.Request(
                f"{args.url}/v1/chat/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            reply = json.load(urllib.request.urlopen(req))
            wall = time.time() - t
            rows = metrics(args.url)["llm_pass_rows_total"] - before["llm_pass_rows_total"]
            print(
                f"cache_prompt={str(cache).lower():5}  prompt {reply['usage']['prompt_tokens']} tokens, "
                f"n={args.n} x {args.max_tokens} tokens: {rows:.0f} rows evaluated, {wall:.2f} s"
            )


if __name__ == "__main__":
    main()
