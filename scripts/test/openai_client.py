#!/usr/bin/env python3
"""Drives llm-server with the official OpenAI Python client (run by
examples/llm/tests/server_openai.rs, which installs the client in a private venv).

    openai_client.py --base-url http://127.0.0.1:PORT/v1 --model ALIAS \
        [--auth-base-url http://127.0.0.1:PORT2/v1 --auth-key KEY --auth-model ALIAS2]

Checks, all greedy (temperature 0, a seed): a chat and a completion give the same text and
finish reason streamed and not; the streamed usage chunk (stream_options include_usage) equals
the non-streamed usage, and total = prompt + completion; a completion's prompt_tokens equals the
count of /tokenize; models.list() has the alias; max_tokens=5 ends with finish_reason "length"
after 5 tokens, a prefix of the longer answer; a stop string ends the text just before it; n=2
and temperature=5 raise openai.BadRequestError (400); embeddings (the server runs with --pooling)
are unit vectors of one width, the same in the client's default base64 and as floats, a batch's
equal to each input's alone, and dimensions=8 a 400; on the --auth-base-url server a wrong key
raises openai.AuthenticationError (401) and the right one is served.

Prints one line per check; exits 1 naming every failed check, 2 on a usage error.
"""

import argparse
import json
import sys
import traceback
import urllib.request

import openai

FAILURES = []


def check(ok, what, detail=""):
    print(("ok    " if ok else "FAIL  ") + what + (f": {detail}" if detail and not ok else ""))
    if not ok:
        FAILURES.append(what + (f": {detail}" if detail else ""))
    return ok


def usage_tuple(u):
    return None if u is None else (u.prompt_tokens, u.completion_tokens, u.total_tokens)


def stream_chat(client, **kw):
    """The text, finish reason and usage of a streamed chat."""
    parts, finish, usage = [], None, None
    for chunk in client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    return "".join(parts), finish, usage


def stream_completion(client, **kw):
    parts, finish, usage = [], None, None
    for chunk in client.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.text or "")
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    return "".join(parts), finish, usage


def tokenize(root, text):
    req = urllib.request.Request(
        root + "/tokenize",
        data=json.dumps({"content": text}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["tokens"]


def expect_error(kind, status, what, call):
    try:
        call()
    except kind as e:
        check(e.status_code == status, what, f"status {e.status_code}")
    except openai.APIError as e:
        check(False, what, f"{type(e).__name__} {getattr(e, 'status_code', '')}: {e}")
    else:
        check(False, what, f"no {kind.__name__} raised")


def stop_string(text):
    """A short piece from the middle of `text` and the text before its first occurrence."""
    mid = len(text) // 2
    for start in range(mid, len(text) - 3):
        piece = text[start:start + 3]
        if piece.strip() and text.find(piece) > 0:
            return piece, text[: text.find(piece)]
    return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True, help="the server's alias (-a)")
    ap.add_argument("--auth-base-url")
    ap.add_argument("--auth-key")
    ap.add_argument("--auth-model")
    args = ap.parse_args()
    root = args.base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    print(f"openai {openai.__version__} against {args.base_url}")
    client = openai.OpenAI(base_url=args.base_url, api_key="sk-unused", max_retries=0, timeout=300)
    model = args.model

    ids = [m.id for m in client.models.list()]
    check(model in ids, "models.list() has the alias", f"{ids}")

    # Chat: streamed and not.
    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three colours of the rainbow."},
    ]
    kw = dict(model=model, messages=messages, temperature=0, seed=11, max_tokens=40)
    r = client.chat.completions.create(**kw)
    text, finish, usage = r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    print(f"      chat: {text!r} ({finish}, {usage_tuple(usage)})")
    check(r.object == "chat.completion", "chat object", r.object)
    check(r.choices[0].message.role == "assistant", "chat role", r.choices[0].message.role)
    check(bool(text) and finish in ("stop", "length"), "chat answers", f"{text!r} {finish}")
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
          "chat usage: total = prompt + completion", usage_tuple(usage))
    s_text, s_finish, s_usage = stream_chat(client, **kw)
    check(s_text == text, "chat streamed = not streamed", f"{s_text!r} vs {text!r}")
    check(s_finish == finish, "chat finish_reason streamed", f"{s_finish} vs {finish}")
    check(usage_tuple(s_usage) == usage_tuple(usage), "chat usage streamed",
          f"{usage_tuple(s_usage)} vs {usage_tuple(usage)}")

    # Completions: streamed and not; prompt tokens as /tokenize counts them.
    prompt = "The three primary colours are"
    ckw = dict(model=model, prompt=prompt, temperature=0, seed=11, max_tokens=32)
    c = client.completions.create(**ckw)
    ctext, cfinish, cusage = c.choices[0].text, c.choices[0].finish_reason, c.usage
    print(f"      completion: {ctext!r} ({cfinish}, {usage_tuple(cusage)})")
    check(c.object == "text_completion", "completion object", c.object)
    s_text, s_finish, s_usage = stream_completion(client, **ckw)
    check(s_text == ctext, "completion streamed = not streamed", f"{s_text!r} vs {ctext!r}")
    check(s_finish == cfinish, "completion finish_reason streamed", f"{s_finish} vs {cfinish}")
    check(usage_tuple(s_usage) == usage_tuple(cusage), "completion usage streamed",
          f"{usage_tuple(s_usage)} vs {usage_tuple(cusage)}")
    check(cusage.total_tokens == cusage.prompt_tokens + cusage.completion_tokens,
          "completion usage: total = prompt + completion", usage_tuple(cusage))
    n_tok = len(tokenize(root, prompt))
    check(cusage.prompt_tokens == n_tok, "completion prompt_tokens = /tokenize count",
          f"{cusage.prompt_tokens} vs {n_tok}")

    # max_tokens=5: "length" after 5 tokens, a prefix of the longer answer.
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    long = client.chat.completions.create(model=model, messages=story, temperature=0, max_tokens=30)
    five = client.chat.completions.create(model=model, messages=story, temperature=0, max_tokens=5)
    check(five.choices[0].finish_reason == "length", "max_tokens=5: finish_reason length",
          five.choices[0].finish_reason)
    check(five.usage.completion_tokens == 5, "max_tokens=5: 5 completion tokens",
          five.usage.completion_tokens)
    check(long.choices[0].message.content.startswith(five.choices[0].message.content),
          "max_tokens=5: a prefix of the longer answer",
          f"{five.choices[0].message.content!r} vs {long.choices[0].message.content!r}")

    # A stop string ends the text just before it (completions and chat).
    piece, before = stop_string(ctext)
    if check(piece is not None, "a stop string taken from the completion", repr(ctext)):
        st = client.completions.create(stop=[piece], **ckw)
        check((st.choices[0].text, st.choices[0].finish_reason) == (before, "stop"),
              f"completion stop={piece!r}", f"{st.choices[0].text!r} {st.choices[0].finish_reason}")
    piece, before = stop_string(text)
    if check(piece is not None, "a stop string taken from the chat", repr(text)):
        st = client.chat.completions.create(stop=piece, **kw)
        check((st.choices[0].message.content, st.choices[0].finish_reason) == (before, "stop"),
              f"chat stop={piece!r}",
              f"{st.choices[0].message.content!r} {st.choices[0].finish_reason}")

    # Embeddings (the server runs with --pooling): the client's default base64 and float give
    # the same unit vectors; a batch's vectors equal each input's alone; dimensions it cannot
    # honour are a 400.
    texts = ["The three primary colours are red, yellow and blue.", "hello", "A dragon."]
    e = client.embeddings.create(model=model, input=texts)
    vecs = [d.embedding for d in e.data]
    check(e.object == "list" and [d.index for d in e.data] == [0, 1, 2], "embeddings: a list",
          f"{e.object} {[d.index for d in e.data]}")
    check(len({len(v) for v in vecs}) == 1 and len(vecs[0]) > 0, "embeddings: one width",
          f"{[len(v) for v in vecs]}")
    norms = [sum(x * x for x in v) for v in vecs]
    check(all(abs(n - 1) < 1e-4 for n in norms), "embeddings: L2-normalised", f"{norms}")
    check(e.usage.prompt_tokens == e.usage.total_tokens > 0, "embeddings: usage",
          f"{e.usage}")
    f = client.embeddings.create(model=model, input=texts, encoding_format="float")
    check([d.embedding for d in f.data] == vecs, "embeddings: float = base64")
    alone = [client.embeddings.create(model=model, input=t).data[0].embedding for t in texts]
    check(alone == vecs, "embeddings: each input alone = in the batch")
    expect_error(openai.BadRequestError, 400, "embeddings: dimensions=8 raises BadRequestError",
                 lambda: client.embeddings.create(model=model, input="x", dimensions=8))

    # Refusals.
    expect_error(openai.BadRequestError, 400, "n=2 raises BadRequestError 400",
                 lambda: client.chat.completions.create(n=2, **kw))
    expect_error(openai.BadRequestError, 400, "temperature=5 raises BadRequestError 400",
                 lambda: client.chat.completions.create(**{**kw, "temperature": 5}))
    expect_error(openai.BadRequestError, 400, "empty messages raise BadRequestError 400",
                 lambda: client.chat.completions.create(**{**kw, "messages": []}))

    if args.auth_base_url:
        amodel = args.auth_model or model
        wrong = openai.OpenAI(base_url=args.auth_base_url, api_key="wrong-key", max_retries=0,
                              timeout=120)
        expect_error(openai.AuthenticationError, 401, "a wrong key raises AuthenticationError 401",
                     lambda: wrong.completions.create(model=amodel, prompt="hello", max_tokens=2))
        right = openai.OpenAI(base_url=args.auth_base_url, api_key=args.auth_key, max_retries=0,
                              timeout=120)
        a = right.completions.create(model=amodel, prompt="hello", max_tokens=2, temperature=0)
        check(a.usage.completion_tokens == 2, "the right key is served", usage_tuple(a.usage))

    if FAILURES:
        print(f"\n{len(FAILURES)} check(s) failed:", file=sys.stderr)
        for f in FAILURES:
            print(f"  {f}", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # an unexpected exception is a failure with its traceback
        traceback.print_exc()
        print(f"\nunexpected exception; {len(FAILURES)} check(s) had failed before", file=sys.stderr)
        sys.exit(1)
