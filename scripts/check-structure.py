#!/usr/bin/env python3
"""Checks two properties of the tree that reviews keep losing (run by .ci/run):

1. No import cycles between the source files of a crate. A file depends on another when its
   code (not its comments, not its `#[cfg(test)]` modules) names an item of it through a
   `crate::`, `super::` or `self::` path: in a `use`, a type or a call. A `mod x;` declaration is
   not a dependency, a `pub use x::Y` re-export is. A path resolves to the deepest module that
   is a file, so naming a re-export of `lib.rs` (`crate::Error`) depends on `lib.rs`: code below
   the root imports from the module that defines the item. Strongly connected components of
   more than one file are reported.

2. The layers of rknn-matmul hold: `dtype.rs`/`error.rs`, then `result.rs`, then `safe/`, then
   `engine/`; a file uses only its own layer and those below.

3. Every file a document names exists: Markdown links `[text](path)` and code spans that look
   like repository paths (`dir/file.rs`, `file.rs:function`), relative to the document, the
   repository root or any crate directory. Build outputs, fetched data and absolute paths are
   not files of the tree and are skipped. A `file.rs:function` span must name a function the file
   defines.

    python3 scripts/check-structure.py            # both checks, exit 1 on a finding
    python3 scripts/check-structure.py --graph C  # the file dependency graph of crate dir C
"""

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# --- 1. import cycles -------------------------------------------------------------------------


def strip_code(text):
    """The source with comments, strings and char literals blanked (same length, newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]):
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code)


def inline_modules(code):
    """(start, end, name, is_test) of every inline `mod name { ... }`."""
    mods = []
    for m in re.finditer(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{", code):
        start = m.start()
        end = matching_brace(code, m.end() - 1)
        attrs = code[max(0, start - 200):start]
        last = attrs.rsplit(";", 1)[-1].rsplit("}", 1)[-1]
        is_test = re.search(r"#\[cfg\([^\]]*\btest\b", last) is not None
        mods.append((start, end, m.group(1), is_test))
    return mods


def module_files(src):
    """{module path tuple: file} for a crate's src directory."""
    files = {}
    for p in sorted(src.rglob("*.rs")):
        rel = p.relative_to(src)
        parts = list(rel.with_suffix("").parts)
        if parts[0] == "bin":
            continue  # binaries are their own crates
        if parts[-1] in ("lib", "main") and len(parts) == 1:
            parts = []
        elif parts[-1] == "mod":
            parts = parts[:-1]
        files[tuple(parts)] = p
    return files


def expand_use(tree):
    """The paths of a use tree (`a::{b, c::{d, e as f}, self}`), each a list of segments."""
    tree = re.sub(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(s, prefix):
        if "{" in s:
            head, rest = s.split("{", 1)
            inner = rest[: rest.rfind("}")]
            head_segs = [x for x in head.split("::") if x]
            for part in split_top(inner):
                yield from walk(part, prefix + head_segs)
        else:
            segs = [x for x in s.split("::") if x]
            yield prefix + segs

    yield from walk(tree, [])


def resolve(segs, here, files):
    """The file module an absolute or relative path names, or None (extern crates, std)."""
    if not segs:
        return None
    if segs[0] == "crate":
        path = list(segs[1:])
        base = []
    elif segs[0] in ("super", "self"):
        base = list(here)
        path = list(segs)
        while path and path[0] in ("super", "self"):
            if path[0] == "super":
                base = base[:-1]
            path = path[1:]
    elif tuple(here) + (segs[0],) in files:
        # A child module named by its bare name (`x86::f()` in its parent).
        base, path = list(here), list(segs)
    else:
        return None
    full = base + [s for s in path if s not in ("*",)]
    for cut in range(len(full), -1, -1):
        key = tuple(full[:cut])
        if key in files:
            return key
    return ()


def crate_graph(src):
    files = module_files(src)
    edges = {m: set() for m in files}
    for mod, path in files.items():
        code = strip_code(path.read_text())
        inl = inline_modules(code)

        def context(pos):
            names, test = [], False
            for start, end, name, is_test in inl:
                if start <= pos <= end:
                    names.append((start, name))
                    test = test or is_test
            names.sort()
            return list(mod) + [n for _, n in names], test

        uses = []
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            for segs in expand_use(m.group(1)):
                uses.append((m.start(), segs))
        # Paths outside `use` statements: types, calls, attributes.
        no_use = re.sub(r"\buse\s+[^;]+;", lambda m: " " * len(m.group(0)), code)
        for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:[A-Za-z_][A-Za-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", no_use):
            uses.append((m.start(), m.group(1).split("::")))
        for pos, segs in uses:
            ctx, test = context(pos)
            if test:
                continue
            target = resolve(segs, ctx, files)
            if target is not None and target != mod:
                edges[mod].add(target)
    return files, edges


def cycles(edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            strong(v)
    return out


def crate_dirs():
    for cargo in sorted(ROOT.glob("**/Cargo.toml")):
        rel = cargo.relative_to(ROOT)
        if rel.parts[0] in ("target", "fuzz") or "target" in rel.parts:
            continue
        if (cargo.parent / "src").is_dir():
            yield cargo.parent


def check_cycles():
    bad = 0
    for d in crate_dirs():
        files, edges = crate_graph(d / "src")
        for comp in cycles(edges):
            bad += 1
            names = sorted(str(files[m].relative_to(ROOT)) for m in comp)
            print(f"import cycle in {d.relative_to(ROOT) or '.'}: " + " <-> ".join(names))
            for m in sorted(comp):
                for t in sorted(edges[m] & set(comp)):
                    print(f"    {files[m].relative_to(ROOT)} uses {files[t].relative_to(ROOT)}")
    return bad


# --- 2. files named by the docs ---------------------------------------------------------------

SKIP_PREFIXES = ("target/", "models/", "/", "~", "$", "http:", "https:", "mailto:", "#", "<", "../shared", "../.library")
PATH_EXT = r"(?:rs|md|py|sh|c|h|toml|json|txt|jinja|svg|yml|yaml)"
CODE_PATH = re.compile(r"`([A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*\.(?:" + PATH_EXT[3:-1] + r"))(?::[A-Za-z_][A-Za-z0-9_:]*)?`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def doc_files():
    for p in sorted(ROOT.rglob("*.md")):
        rel = p.relative_to(ROOT)
        if rel.parts[0] in ("target", "models") or "target" in rel.parts or rel.parts[0].startswith("."):
            continue
        yield p


def resolve_doc_path(name, doc):
    bases = [doc.parent, ROOT] + list(crate_dirs()) + [ROOT / "examples"]
    for b in bases:
        if (b / name).exists():
            return b / name
    return None


def exists(name, doc):
    name = name.split("#")[0]
    if not name:
        return True
    return resolve_doc_path(name, doc) is not None


def check_docs():
    bad = 0
    for doc in doc_files():
        text = doc.read_text()
        names = set(m.group(1) for m in LINK.finditer(text))
        names |= set(m.group(1) for m in CODE_PATH.finditer(text) if "/" in m.group(1) or m.group(0).count(":"))
        for name in sorted(names):
            if name.startswith(SKIP_PREFIXES) or "*" in name or "{" in name:
                continue
            if not exists(name, doc):
                bad += 1
                print(f"{doc.relative_to(ROOT)}: names {name}, which does not exist")
        # `file.rs:function`: the function is defined in that file.
        for m in re.finditer(r"`([A-Za-z0-9_.\-/]+\.rs):([A-Za-z_][A-Za-z0-9_:]*)`", text):
            path = resolve_doc_path(m.group(1), doc)
            func = m.group(2).split("::")[-1]
            if path is not None and not re.search(r"\bfn\s+" + re.escape(func) + r"\b", path.read_text()):
                bad += 1
                print(f"{doc.relative_to(ROOT)}: names {m.group(0)}, but {m.group(1)} defines no fn {func}")
    return bad


# --- 3. layers ----------------------------------------------------------------------------------

# Per crate, its layers bottom up (path prefixes below src/); a file may use files of its own
# layer and of the layers below, never above.
LAYERS = {
    "rknn-matmul": [("dtype.rs", "error.rs"), ("result.rs",), ("safe/",), ("engine/",), ("lib.rs",)],
}


def check_layers():
    bad = 0
    for crate, layers in LAYERS.items():
        src = ROOT / crate / "src"
        files, edges = crate_graph(src)

        def layer(mod):
            rel = str(files[mod].relative_to(src))
            for i, prefixes in enumerate(layers):
                if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes):
                    return i
            return None

        for m, targets in edges.items():
            for t in targets:
                lm, lt = layer(m), layer(t)
                if lm is not None and lt is not None and lt > lm:
                    bad += 1
                    print(f"layer violation in {crate}: {files[m].relative_to(ROOT)} uses {files[t].relative_to(ROOT)}, a layer above it")
    return bad


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--graph":
        files, edges = crate_graph(ROOT / sys.argv[2] / "src")
        for m in sorted(edges):
            for t in sorted(edges[m]):
                print(f"{files[m].relative_to(ROOT)} -> {files[t].relative_to(ROOT)}")
        return 0
    bad = check_cycles() + check_layers() + check_docs()
    if bad:
        print(f"check-structure: {bad} finding(s)")
        return 1
    print("check-structure: no import cycles, no layer violations, every file the docs name exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
