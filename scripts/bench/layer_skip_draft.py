#!/usr/bin/env python3
"""Writes a draft model for speculative decoding from a GGUF model by keeping some of its
blocks (layer skipping): the same vocabulary, embedding, final norm and output head, the same
quantized tensors (copied byte for byte), `{arch}.block_count` set to the blocks kept and the
kept blocks renumbered from 0. With `--first N` the first N blocks are kept (an early exit);
with `--every S` blocks 0, S, 2S, ... A family with per-layer arrays (head counts per layer)
or a fixed layer pattern is refused.

Usage: python3 scripts/bench/layer_skip_draft.py IN.gguf OUT.gguf (--first N | --every S)
       (runs in the fixture venv: ~/.cache/rknpu-rs/py/bin/python)
"""
import argparse
import os
import re

from gguf import GGUFReader, GGUFValueType as V, GGUFWriter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--first", type=int)
    g.add_argument("--every", type=int)
    a = ap.parse_args()
    r = GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    n_layer = int(r.fields[f"{arch}.block_count"].contents())
    if a.first is not None:
        if not 1 <= a.first <= n_layer:
            raise SystemExit(f"--first {a.first}: the model has {n_layer} blocks")
        kept = list(range(a.first))
    else:
        if not 1 <= a.every <= n_layer:
            raise SystemExit(f"--every {a.every}: the model has {n_layer} blocks")
        kept = list(range(0, n_layer, a.every))
    renumber = {old: new for new, old in enumerate(kept)}
    tmp = a.dst + ".part"
    w = GGUFWriter(tmp, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        if key == f"{arch}.block_count":
            w.add_uint32(key, len(kept))
            continue
        vtype = field.types[0]
        if vtype == V.ARRAY:
            if len(field.types) == 2 and field.types[1] != V.STRING and len(field.data) == n_layer:
                raise SystemExit(f"{key}: a per-layer array; this script does not cut those")
            w.add_key_value(key, field.contents(), V.ARRAY, sub_type=field.types[1])
        else:
            w.add_key_value(key, field.contents(), vtype)
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.(.*)", t.name)
        name = t.name
        if m:
            old = int(m.group(1))
            if old not in renumber:
                continue
            name = f"blk.{renumber[old]}.{m.group(2)}"
        # The raw (quantized) bytes as the reader holds them (rows of bytes for a quantized
        # type), the type unchanged.
        w.add_tensor(name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, a.dst)
    print(f"{a.dst}: blocks {kept} of {n_layer}")


if __name__ == "__main__":
    main()
