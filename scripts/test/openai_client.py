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
gives two choices (index 0 and 1, equal under greedy), streamed too, and temperature=5 raises
openai.BadRequestError (400); chat logprobs=True with top_logprobs=3
have one entry per completion token, 3 alternatives each, the chosen token first (greedy), the
same streamed, and top_logprobs=21 is a 400; response_format json_object gives a JSON object and
json_schema (strict) a valid document, both with finish_reason "stop", the same streamed, and
beta.chat.completions.parse with a pydantic model parses; a schema keyword the server cannot
enforce (uniqueItems) is a 400; a completion's logprobs=2 has its four lists of one
entry per token, each dict holding the chosen token; embeddings (the server runs with --pooling)
are unit vectors of one width, the same in the client's default base64 and as floats, a batch's
equal to each input's alone, and dimensions=8 a 400; on the --auth-base-url server a wrong key
raises openai.AuthenticationError (401) and the right one is served.

Tools (the demo model's template takes none: the generic form, constrained to a call or a reply),
a round trip request -> tool_calls -> tool result -> final answer, streamed and not: every
answer has OpenAI's shape (tool_calls with an id, type "function", a listed name and arguments
that are a JSON object; content null or text; finish_reason "tool_calls" exactly when there
are calls), streamed = not streamed (content and calls); the call (the model's, or a
made-up one when it answered in text) and its result sent back are rendered into the prompt
(a longer result, more prompt tokens); tool_choice "none" describes no tools (fewer prompt
tokens). With --tool-choice-required (the server constrains decoding): "required" and a
named function always give a call of a listed function whose arguments validate; streamed,
each call's arguments arrive in more than one chunk, and the client's own stream accumulation
(ChatCompletionStreamState) puts them together into the non-streamed arguments.

Prints one line per check; exits 1 naming every failed check, 2 on a usage error.
"""

import argparse
import json
import sys
import traceback
import urllib.request

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

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


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
            "required": ["city"],
        },
    },
}


def calls_of(tool_calls):
    """(name, arguments as an object) of each call, checking their shape."""
    out = []
    for c in tool_calls or []:
        ok = (isinstance(c.id, str) and c.id and c.type == "function"
              and c.function.name == "get_weather")
        try:
            args = json.loads(c.function.arguments)
        except (TypeError, ValueError):
            args = None
        check(ok and isinstance(args, dict), "a tool call has OpenAI's shape", repr(c))
        out.append((c.function.name, args))
    return out


def stream_tools(client, **kw):
    """The content, calls (accumulated from delta.tool_calls as OpenAI streams them) and
    finish reason of a streamed chat. Each call's entry also has "pieces" (how many chunks
    carried a piece of its arguments) and "client" (its arguments as the client's own stream
    accumulation, ChatCompletionStreamState, puts them together)."""
    parts, calls, finish = [], {}, None
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **kw):
        state.handle_chunk(chunk)
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            for d in choice.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                c["id"] = d.id or c["id"]
                if d.function is not None:
                    c["name"] += d.function.name or ""
                    c["arguments"] += d.function.arguments or ""
                    c["pieces"] = c.get("pieces", 0) + bool(d.function.arguments)
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    # The snapshot (get_final_completion refuses a reply cut by max_tokens).
    final = state.current_completion_snapshot.choices[0].message.tool_calls or []
    for i, c in calls.items():
        c["client"] = final[i].function.arguments if i < len(final) else None
    listed = [calls[i] for i in sorted(calls)]
    return "".join(parts), [(c["name"], json.loads(c["arguments"])) for c in listed], listed, finish


def tool_checks(client, model, required):
    user = {"role": "user", "content": "What is the weather in Paris?"}
    kw = dict(model=model, messages=[user], tools=[WEATHER], temperature=0, seed=5, max_tokens=48)
    r = client.chat.completions.create(**kw)
    m, finish = r.choices[0].message, r.choices[0].finish_reason
    calls = calls_of(m.tool_calls)
    print(f"      tools: {m.content!r} {calls} ({finish})")
    check(finish == "tool_calls" if calls else finish in ("stop", "length"),
          "tools: finish_reason tool_calls exactly with calls", finish)
    check(calls or isinstance(m.content, str), "tools: text without calls is content", repr(m))
    s_text, s_calls, _, s_finish = stream_tools(client, **kw)
    check((s_text or None, s_calls, s_finish) == (m.content or None, calls, finish),
          "tools: streamed = not streamed", f"{(s_text, s_calls, s_finish)} vs {(m.content, calls, finish)}")

    # The round trip: the model's call, or one made up, then its result.
    if m.tool_calls:
        assistant = m.model_dump(exclude_none=True)
        call_id = m.tool_calls[0].id
    else:
        call_id = "call_0123456789abcdefghijklm"
        assistant = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]}
    usage = []
    for result in ("sunny", "sunny, 22 degrees, a light wind from the west, no rain until tonight"):
        tool = {"role": "tool", "tool_call_id": call_id, "content": result}
        rk = dict(kw, messages=[user, assistant, tool])
        f = client.chat.completions.create(**rk)
        fm, ff = f.choices[0].message, f.choices[0].finish_reason
        calls_of(fm.tool_calls)
        print(f"      after the result {result[:12]!r}: {fm.content!r} ({ff})")
        check(ff in ("stop", "length", "tool_calls"), "tools: the final answer finishes", ff)
        fs_text, fs_calls, _, fs_finish = stream_tools(client, **rk)
        check((fs_text or None, fs_finish) == (fm.content or None, ff),
              "tools: the final answer streamed = not streamed", f"{fs_text!r} vs {fm.content!r}")
        usage.append(f.usage.prompt_tokens)
    check(usage[1] > usage[0], "tools: the tool result is rendered into the prompt", usage)
    none = client.chat.completions.create(**dict(kw, tool_choice="none"))
    check(none.choices[0].message.tool_calls is None, "tool_choice none: no calls", repr(none))
    check(none.usage.prompt_tokens < r.usage.prompt_tokens,
          "tool_choice none: no tools described", (none.usage.prompt_tokens, r.usage.prompt_tokens))

    named = {"type": "function", "function": {"name": "get_weather"}}
    if not required:
        # Refused until the server constrains decoding (the lead's item 1); then run below.
        for choice in ("required", named):
            expect_error(openai.BadRequestError, 400, f"tool_choice {choice!r} is refused (400) unconstrained",
                         lambda: client.chat.completions.create(**dict(kw, tool_choice=choice)))
        return
    for choice in ("required", named):
        for par in (True, False):
            q = client.chat.completions.create(**dict(kw, tool_choice=choice, parallel_tool_calls=par))
            qm = q.choices[0].message
            qcalls = calls_of(qm.tool_calls)
            check(q.choices[0].finish_reason == "tool_calls" and qcalls
                  and all(isinstance(a.get("city"), str) for _, a in qcalls)
                  and (par or len(qcalls) == 1),
                  f"tool_choice {choice!r} parallel={par}: a valid call", repr(qm))
            _, q_calls, q_listed, q_finish = stream_tools(
                client, **dict(kw, tool_choice=choice, parallel_tool_calls=par))
            check((q_calls, q_finish) == (qcalls, "tool_calls"),
                  f"tool_choice {choice!r} parallel={par}: streamed = not streamed", f"{q_calls}")
            # The arguments arrive in pieces, as OpenAI streams them, which the client's own
            # accumulation puts together into the non-streamed arguments, byte for byte.
            whole = [c.function.arguments for c in qm.tool_calls or []]
            check(q_listed and all(c.get("pieces", 0) > 1 for c in q_listed)
                  and [c["client"] for c in q_listed] == whole
                  and [c["arguments"] for c in q_listed] == whole,
                  f"tool_choice {choice!r} parallel={par}: arguments streamed in pieces",
                  f"{q_listed} vs {whole}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True, help="the server's alias (-a)")
    ap.add_argument("--auth-base-url")
    ap.add_argument("--auth-key")
    ap.add_argument("--auth-model")
    ap.add_argument("--tool-choice-required", action="store_true",
                    help="check that tool_choice required / named always calls (needs the "
                         "server's constrained decoding)")
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

    # Log-probabilities (greedy: the chosen token is the most likely one).
    lp = client.chat.completions.create(logprobs=True, top_logprobs=3, **{**kw, "max_tokens": 8})
    content = lp.choices[0].logprobs.content if lp.choices[0].logprobs else None
    if check(content is not None and len(content) == lp.usage.completion_tokens,
             "chat logprobs: one entry per token", f"{lp.choices[0].logprobs}"):
        check(all(len(e.top_logprobs) == 3 for e in content), "chat top_logprobs: 3 each",
              [len(e.top_logprobs) for e in content])
        check(all(e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob
                  for e in content), "chat logprobs: greedy chose the top one")
        check(all(e.logprob <= 0 and bytes(e.bytes).decode("utf-8", "replace") == e.token
                  for e in content), "chat logprobs: logprob <= 0, bytes spell the token")
    slp = client.chat.completions.create(logprobs=True, top_logprobs=3, stream=True,
                                         **{**kw, "max_tokens": 8})
    streamed = [e for chunk in slp for c in chunk.choices if c.logprobs and c.logprobs.content
                for e in c.logprobs.content]
    check(content is not None and [(e.token, e.logprob) for e in streamed]
          == [(e.token, e.logprob) for e in content], "chat logprobs streamed = not streamed")
    clp = client.completions.create(logprobs=2, **{**ckw, "max_tokens": 8})
    l = clp.choices[0].logprobs
    if check(l is not None and len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs)
             == len(l.text_offset) == clp.usage.completion_tokens,
             "completion logprobs: one entry per token", f"{l}"):
        check(all(t in d and d[t] == v and len(d) <= 3
                  for t, v, d in zip(l.tokens, l.token_logprobs, l.top_logprobs)),
              "completion top_logprobs: the chosen token among at most 3", f"{l.top_logprobs}")
    expect_error(openai.BadRequestError, 400, "top_logprobs=21 raises BadRequestError 400",
                 lambda: client.chat.completions.create(logprobs=True, top_logprobs=21, **kw))

    # Structured output: json_object, a strict json_schema, and the client's own parse() with a
    # pydantic model (its strict schema), streamed and not.
    city = {"role": "user", "content": "Return a JSON object with the keys city and country for Paris."}
    jkw = {**kw, "messages": [city], "max_tokens": 64}
    j = client.chat.completions.create(response_format={"type": "json_object"}, **jkw)
    try:
        doc = json.loads(j.choices[0].message.content)
    except ValueError:
        doc = None
    check(isinstance(doc, dict) and j.choices[0].finish_reason == "stop",
          "response_format json_object: a JSON object, finish_reason stop",
          f"{j.choices[0].finish_reason}: {j.choices[0].message.content!r}")
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "country"],
              "properties": {"city": {"type": "string", "maxLength": 20},
                             "country": {"enum": ["France", "Germany", "Italy"]}}}
    rf = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}
    j = client.chat.completions.create(response_format=rf, **jkw)
    text = j.choices[0].message.content
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    check(isinstance(doc, dict) and set(doc) == {"city", "country"}
          and doc["country"] in ("France", "Germany", "Italy") and len(doc["city"]) <= 20
          and j.choices[0].finish_reason == "stop", "response_format json_schema: valid, stop",
          repr(text))
    streamed, finish, _ = stream_chat(client, response_format=rf, **jkw)
    check((streamed, finish) == (text, "stop"), "json_schema streamed = not streamed",
          f"{streamed!r} {finish}")
    try:
        import pydantic

        class Place(pydantic.BaseModel):
            city: str
            country: str

        parsed = client.beta.chat.completions.parse(response_format=Place, **jkw)
        p = parsed.choices[0].message.parsed
        check(isinstance(p, Place), "beta.chat.completions.parse(response_format=Place) parses",
              f"{parsed.choices[0].message.content!r}")
    except ImportError:
        check(False, "pydantic (the openai client's dependency) is importable")
    expect_error(openai.BadRequestError, 400, "a schema with uniqueItems raises BadRequestError 400",
                 lambda: client.chat.completions.create(response_format={
                     "type": "json_schema", "json_schema": {"name": "x", "schema": {
                         "type": "array", "uniqueItems": True}}}, **jkw))
    tool_checks(client, model, args.tool_choice_required)
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
    two = client.chat.completions.create(n=2, **kw)
    check([c.index for c in two.choices] == [0, 1], "n=2: two choices, index 0 and 1",
          f"{[(c.index, c.message.content) for c in two.choices]}")
    check(two.choices[0].message.content == two.choices[1].message.content,
          "n=2 greedy: the choices are equal")
    st2 = {}
    for chunk in client.chat.completions.create(n=2, stream=True, **kw):
        for c in chunk.choices:
            st2.setdefault(c.index, []).append(c.delta.content or "")
    check({i: "".join(p) for i, p in st2.items()}
          == {c.index: c.message.content for c in two.choices},
          "n=2 streamed: each choice's chunks make its text", f"{st2.keys()}")
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
