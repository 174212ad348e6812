#!/usr/bin/env python3
"""Writes dequantisation fixtures for pyramid-gguf from an independent implementation.

For each GGML type the Rust crate decodes, builds a few blocks of bytes and the floats
that the PyPI `gguf` package's `gguf.quants.dequantize` makes of them:

- types the package can quantise: random floats (plus a constant block and an all-zero
  block, which exercise the zero-scale path) quantised with `gguf.quants.quantize`; the
  source floats are saved too so the Rust quantiser can be compared byte for byte;
- k-quants, which the package can only decode: random block bytes with the f16 scale
  fields (`d`, and `dmin` where present) overwritten by small finite values.

All floats are stored as little-endian f32 hex, which round-trips exactly.

With --models DIR it also writes real_models.json: spot checks of the two real model
files the test suite opens (architecture, counts, and for the smallest tensor of each
type its first 64 values and the sum of all of them).

Usage: python3 scripts/gguf-fixtures/make_fixtures.py [--models DIR] [OUT_DIR]
(default OUT_DIR: crates/gguf/tests/fixtures under this repository's root;
DIR is usually ~/.cache/pyramid/models).
"""

import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
import gguf.quants

SEED = 20240611
QUANTISED = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
DECODE_ONLY = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
# Byte offsets of f16 scale fields within one block, per k-quant layout.
SCALE_FIELDS = {
    T.Q2_K: [80, 82],  # d, dmin after scales[16] and qs[64]
    T.Q3_K: [108],  # d after hmask[32], qs[64], scales[12]
    T.Q4_K: [0, 2],  # d, dmin first
    T.Q5_K: [0, 2],
    T.Q6_K: [208],  # d after ql[128], qh[64], scales[16]
}


def version() -> str:
    from importlib.metadata import version as v

    return v("gguf")


def source_floats(rng: np.random.Generator, qtype: T) -> np.ndarray:
    block, _ = GGML_QUANT_SIZES[qtype]
    if block == 1:
        # Plain float types: normal values, plus edge cases for the 16-bit conversions
        # (ties, subnormals, overflow to infinity, signed zero).
        specials = np.array(
            [0.0, -0.0, 1.0, -2.5, 65504.0, 70000.0, -1e-7, 6e-8, 1e-40, 3.0e38,
             np.float32(1.0 + 2.0**-8), np.float32(1.0 + 3 * 2.0**-8),
             np.float32(1.0 + 2.0**-11), np.inf, -np.inf, 1234.5678],
            dtype=np.float32,
        )
        return np.concatenate([specials, rng.standard_normal(48).astype(np.float32) * 3])
    blocks = [
        rng.standard_normal(block).astype(np.float32),
        (rng.standard_normal(block) * 0.02 + 0.01).astype(np.float32),
        rng.uniform(-7, 3, block).astype(np.float32),
        np.full(block, 0.75, dtype=np.float32),
        np.zeros(block, dtype=np.float32),
    ]
    return np.concatenate(blocks)


def random_kquant_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    _, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for b in range(n_blocks):
        for off in SCALE_FIELDS[qtype]:
            # Mostly positive small scales, one negative, as real files can hold.
            value = rng.uniform(1e-4, 0.05) * (-1 if (b == 1 and off == SCALE_FIELDS[qtype][0]) else 1)
            raw[b, off:off + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return raw.reshape(-1)


def f32_hex(a: np.ndarray) -> str:
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


MODELS = {
    "smollm2-135m-instruct-q4_1.gguf": "llama",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "qwen2",
}


def model_spot_checks(models_dir: Path, src_tag: str) -> dict:
    from gguf import GGUFReader

    out = {"source": f"{src_tag}: gguf.GGUFReader and gguf.quants.dequantize", "models": {}}
    for file_name in MODELS:
        reader = GGUFReader(models_dir / file_name)
        arch_field = reader.fields["general.architecture"]
        checks = []
        by_type: dict = {}
        for t in reader.tensors:
            best = by_type.get(t.tensor_type)
            if best is None or t.n_elements < best.n_elements:
                by_type[t.tensor_type] = t
        for qtype, t in sorted(by_type.items(), key=lambda kv: kv[0].value):
            values = np.asarray(gguf.quants.dequantize(t.data, qtype), dtype=np.float32).reshape(-1)
            checks.append({
                "tensor": t.name,
                "type": qtype.name,
                "n_elements": int(values.size),
                "first_f32le_hex": f32_hex(values[:64]),
                "sum": float(values.astype(np.float64).sum()),
                "sum_abs": float(np.abs(values.astype(np.float64)).sum()),
            })
        out["models"][file_name] = {
            "architecture": str(arch_field.contents()),
            # GGUFReader lists three header pseudo-fields (GGUF.version, ...) among its fields.
            "n_kv": len([k for k in reader.fields if not k.startswith("GGUF.")]),
            "n_tensors": len(reader.tensors),
            "tensors": checks,
        }
        print(f"{file_name}: {len(reader.tensors)} tensors, {len(checks)} spot checks")
    return out


def main() -> None:
    root = Path(__file__).resolve().parents[2]
    args = sys.argv[1:]
    models_dir = None
    if len(args) >= 2 and args[0] == "--models":
        models_dir = Path(args[1]).expanduser()
        args = args[2:]
    out_dir = Path(args[0]) if args else root / "crates/gguf/tests/fixtures"
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    src_tag = f"gguf=={version()} numpy=={np.__version__}"

    for qtype in QUANTISED + DECODE_ONLY:
        fixture = {"type": qtype.name}
        if qtype in QUANTISED:
            src = source_floats(rng, qtype)
            # Values beyond f16's range are meant to overflow to infinity here.
            with np.errstate(over="ignore"):
                data = np.asarray(gguf.quants.quantize(src, qtype)).view(np.uint8).reshape(-1)
            fixture["input_f32le_hex"] = f32_hex(src)
            fixture["source"] = f"{src_tag}: gguf.quants.quantize of input, then gguf.quants.dequantize"
        else:
            data = random_kquant_blocks(rng, qtype, 3)
            fixture["source"] = f"{src_tag}: random blocks with finite f16 scales, gguf.quants.dequantize"
        expected = np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32).reshape(-1)
        fixture["n_elements"] = int(expected.size)
        fixture["bytes_hex"] = data.tobytes().hex()
        fixture["expected_f32le_hex"] = f32_hex(expected)
        path = out_dir / f"{qtype.name.lower()}.json"
        path.write_text(json.dumps(fixture, indent=1) + "\n")
        print(f"{path.name}: {expected.size} elements, {data.size} bytes")

    if models_dir is not None:
        checks = model_spot_checks(models_dir, src_tag)
        (out_dir / "real_models.json").write_text(json.dumps(checks, indent=1) + "\n")


if __name__ == "__main__":
    main()
