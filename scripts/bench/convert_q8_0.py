#!/usr/bin/env python3
"""Rewrites a GGUF file with every matrix quantized to Q8_0 (the PyPI `gguf` package's
gguf.quants.quantize, from the dequantized values) and every vector in F32, as llama.cpp's own
Q8_0 conversion lays them out: the llama.cpp side of the speed comparison in docs/llm.md.

Usage: python3 scripts/bench/convert_q8_0.py IN.gguf OUT.gguf
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFValueType as V, GGUFWriter
from gguf.quants import dequantize, quantize

FILE_TYPE_Q8_0 = 7


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    tmp = dst + ".part"
    w = GGUFWriter(tmp, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        if key == "general.file_type":
            w.add_uint32(key, FILE_TYPE_Q8_0)
            continue
        vtype = field.types[0]
        if vtype == V.ARRAY:
            w.add_key_value(key, field.contents(), V.ARRAY, sub_type=field.types[1])
        else:
            w.add_key_value(key, field.contents(), vtype)
    for t in r.tensors:
        values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = tuple(int(d) for d in reversed(t.shape))
        values = values.reshape(shape)
        if values.ndim == 2 and shape[-1] % 32 == 0:
            q = quantize(values, Q.Q8_0)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(t.name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()
