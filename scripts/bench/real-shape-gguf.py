#!/usr/bin/env python3
"""Writes a random-weight GGUF with the shape of a published model, for speed runs.

    real-shape-gguf.py SHAPE OUT.gguf [--source GGUF] [--layers N] [--seed S] [--size]

SHAPE is one of qwen2.5-1.5b, qwen2.5-7b, qwen3-30b-a3b (the hyperparameters below are
the published config.json's). The tokenizer and chat template (every `tokenizer.*` key) are
copied from a real Qwen2.5 GGUF (--source, default the Qwen2.5-Coder-0.5B-Instruct file the
pyramid registry caches); a vocabulary larger than the source's (Qwen2.5-7B's 152,064) is
padded with unused `[PAD<id>]` tokens, as llama.cpp's converter pads it. Qwen3-30B-A3B gets
Qwen2.5's tokenizer too (the same 151,936 ids): fine for speed, not for text.

Weights are Q8_0 blocks as a quantiser would leave them: a positive f16 scale around
0.02/127 (drawn from 0.01/127..0.03/127 per block) and int8 codes uniform in -127..127.
Norm weights are F32 near 1, Q/K/V biases (Qwen2.5) and the MoE router (`ffn_gate_inp`,
which llama.cpp keeps in F32) F32 near 0. The file is written tensor by tensor, each in
chunks of a few tens of MB, so memory stays small whatever the model's size. Tensor names,
shapes and order are those of llama.cpp's converter for the architecture. `--layers N`
keeps only the first N layers (to try a big shape quickly); the file says so in
`general.name`.

The output is deterministic for a given seed. Needs numpy and the `gguf` package (gguf-py).
"""

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, TokenType

Q8_0_BLOCK = 32  # values per block
Q8_0_DTYPE = np.dtype([("d", "<f2"), ("qs", "i1", (Q8_0_BLOCK,))])  # 34 bytes
CHUNK_BLOCKS = 1 << 20  # blocks generated and written at a time (~34 MB)


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF general.architecture
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx: int
    tied: bool  # no output.weight: the output reads token_embd
    head_dim: int | None = None  # None: n_embd / n_head
    qkv_bias: bool = False
    qk_norm: bool = False
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6


# From each model's config.json on the Hugging Face hub (Qwen/Qwen2.5-1.5B-Instruct,
# Qwen/Qwen2.5-7B-Instruct, Qwen/Qwen3-30B-A3B).
SHAPES = {
    "qwen2.5-1.5b": Shape("qwen2", n_embd=1536, n_layer=28, n_head=12, n_head_kv=2, n_ff=8960,
                          n_vocab=151_936, n_ctx=32_768, tied=True, qkv_bias=True),
    "qwen2.5-7b": Shape("qwen2", n_embd=3584, n_layer=28, n_head=28, n_head_kv=4, n_ff=18_944,
                        n_vocab=152_064, n_ctx=32_768, tied=False, qkv_bias=True),
    "qwen3-30b-a3b": Shape("qwen3moe", n_embd=2048, n_layer=48, n_head=32, n_head_kv=4,
                           n_ff=6144, n_vocab=151_936, n_ctx=40_960, tied=False, head_dim=128,
                           qk_norm=True, n_expert=128, n_expert_used=8, n_ff_exp=768),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order: the row length (GGUF ne0) last
    kind: str  # "q8_0", "norm" (F32 near 1) or "small" (F32 near 0)


def tensors(s: Shape, n_layer: int) -> list[Tensor]:
    head_dim = s.head_dim or s.n_embd // s.n_head
    q_dim, kv_dim = s.n_head * head_dim, s.n_head_kv * head_dim
    out = [Tensor("token_embd.weight", (s.n_vocab, s.n_embd), "q8_0")]
    for i in range(n_layer):
        b = f"blk.{i}."
        out.append(Tensor(b + "attn_norm.weight", (s.n_embd,), "norm"))
        for name, rows in [("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)]:
            out.append(Tensor(b + name + ".weight", (rows, s.n_embd), "q8_0"))
            if s.qkv_bias:
                out.append(Tensor(b + name + ".bias", (rows,), "small"))
        out.append(Tensor(b + "attn_output.weight", (s.n_embd, q_dim), "q8_0"))
        if s.qk_norm:
            out.append(Tensor(b + "attn_q_norm.weight", (head_dim,), "norm"))
            out.append(Tensor(b + "attn_k_norm.weight", (head_dim,), "norm"))
        out.append(Tensor(b + "ffn_norm.weight", (s.n_embd,), "norm"))
        if s.n_expert:
            e, f = s.n_expert, s.n_ff_exp
            out.append(Tensor(b + "ffn_gate_inp.weight", (e, s.n_embd), "small"))
            out.append(Tensor(b + "ffn_gate_exps.weight", (e, f, s.n_embd), "q8_0"))
            out.append(Tensor(b + "ffn_down_exps.weight", (e, s.n_embd, f), "q8_0"))
            out.append(Tensor(b + "ffn_up_exps.weight", (e, f, s.n_embd), "q8_0"))
        else:
            out.append(Tensor(b + "ffn_gate.weight", (s.n_ff, s.n_embd), "q8_0"))
            out.append(Tensor(b + "ffn_down.weight", (s.n_embd, s.n_ff), "q8_0"))
            out.append(Tensor(b + "ffn_up.weight", (s.n_ff, s.n_embd), "q8_0"))
    out.append(Tensor("output_norm.weight", (s.n_embd,), "norm"))
    if not s.tied:
        out.append(Tensor("output.weight", (s.n_vocab, s.n_embd), "q8_0"))
    return out


def n_values(t: Tensor) -> int:
    return int(np.prod(t.shape, dtype=np.int64))


def n_bytes(t: Tensor) -> int:
    if t.kind == "q8_0":
        assert t.shape[-1] % Q8_0_BLOCK == 0, t
        return n_values(t) // Q8_0_BLOCK * Q8_0_DTYPE.itemsize
    return n_values(t) * 4


def hparams(w: GGUFWriter, s: Shape, n_layer: int) -> None:
    a = s.arch
    w.add_uint32(f"{a}.block_count", n_layer)
    w.add_uint32(f"{a}.context_length", s.n_ctx)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_float32(f"{a}.rope.freq_base", s.rope_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.rms_eps)
    if s.head_dim is not None:
        w.add_uint32(f"{a}.attention.key_length", s.head_dim)
        w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    if s.n_expert:
        w.add_uint32(f"{a}.expert_count", s.n_expert)
        w.add_uint32(f"{a}.expert_used_count", s.n_expert_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", s.n_ff_exp)


def copy_tokenizer(w: GGUFWriter, source: Path, n_vocab: int) -> int:
    """Every tokenizer.* key of the source, the vocabulary padded to n_vocab. Returns the
    source's vocabulary size."""
    reader = GGUFReader(source)
    n_source = None
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        sub_type = field.types[1] if vtype == GGUFValueType.ARRAY else None
        if key == "tokenizer.ggml.tokens":
            n_source = len(value)
            value = value + [f"[PAD{i}]" for i in range(n_source, n_vocab)]
        elif key == "tokenizer.ggml.token_type":
            value = value + [int(TokenType.UNUSED)] * (n_vocab - len(value))
        elif key == "tokenizer.ggml.scores":
            value = value + [0.0] * (n_vocab - len(value))
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    if n_source is None:
        sys.exit(f"{source}: no tokenizer.ggml.tokens")
    if n_source > n_vocab:
        sys.exit(f"{source}: {n_source} tokens, more than the shape's {n_vocab}")
    return n_source


def write_data(fout, t: Tensor, rng: np.random.Generator) -> None:
    if t.kind == "norm":
        (1.0 + 0.02 * rng.standard_normal(t.shape, dtype=np.float32)).astype("<f4").tofile(fout)
        return
    if t.kind == "small":
        (0.02 * rng.standard_normal(t.shape, dtype=np.float32)).astype("<f4").tofile(fout)
        return
    left = n_values(t) // Q8_0_BLOCK
    chunk = np.empty(min(left, CHUNK_BLOCKS), Q8_0_DTYPE)
    while left > 0:
        n = min(left, CHUNK_BLOCKS)
        part = chunk[:n]
        part["d"] = (rng.uniform(0.01, 0.03, n) / 127).astype(np.float16)
        part["qs"] = rng.integers(-127, 128, (n, Q8_0_BLOCK), dtype=np.int8)
        part.tofile(fout)
        left -= n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("out", type=Path)
    home = Path(os.environ.get("PYRAMID_HOME", Path.home() / ".cache" / "pyramid"))
    p.add_argument("--source", type=Path,
                   default=home / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                   help="a real Qwen2.5 GGUF to copy the tokenizer from [%(default)s]")
    p.add_argument("--layers", type=int, default=None,
                   help="keep only the first N layers [the shape's own count]")
    p.add_argument("--seed", type=int, default=53)
    p.add_argument("--size", action="store_true",
                   help="print the tensor data's size in bytes and write nothing")
    args = p.parse_args()

    s = SHAPES[args.shape]
    n_layer = s.n_layer if args.layers is None else args.layers
    if not 1 <= n_layer <= s.n_layer:
        sys.exit(f"--layers must be 1..{s.n_layer}")
    name = f"{args.shape} shape, random Q8_0 weights"
    if n_layer != s.n_layer:
        name += f", first {n_layer} of {s.n_layer} layers"

    plan = tensors(s, n_layer)
    total = sum(n_bytes(t) for t in plan)
    if args.size:
        print(total)
        return
    print(f"{args.out}: {name}, {len(plan)} tensors, {total / 2**30:.2f} GiB of data",
          file=sys.stderr)

    tmp = args.out.with_name(args.out.name + ".part")
    w = GGUFWriter(None, s.arch)
    w.add_type("model")
    w.add_name(name)
    w.add_description(f"Random weights in the shape of {args.shape} for speed runs, made by "
                      f"pyramid's scripts/bench/real-shape-gguf.py (seed {args.seed}); "
                      f"tokenizer from {args.source.name}")
    hparams(w, s, n_layer)
    w.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(2)
    n_source = copy_tokenizer(w, args.source, s.n_vocab)
    if n_source < s.n_vocab:
        print(f"vocabulary padded from {n_source} to {s.n_vocab}", file=sys.stderr)
    for t in plan:
        raw = GGMLQuantizationType.Q8_0 if t.kind == "q8_0" else GGMLQuantizationType.F32
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), n_bytes(t), raw_dtype=raw)

    w.write_header_to_file(tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None and len(w.fout) == 1
    fout = w.fout[0]
    align = w.data_alignment
    for t in plan:
        fout.write(b"\0" * (-fout.tell() % align))
        start = fout.tell()
        # One generator per tensor name: a tensor's values do not depend on --layers.
        write_data(fout, t, np.random.default_rng([args.seed, hash_name(t.name)]))
        assert fout.tell() - start == n_bytes(t), t
    fout.write(b"\0" * (-fout.tell() % align))
    w.close()
    tmp.rename(args.out)
    print(f"{args.out}: {args.out.stat().st_size / 2**30:.2f} GiB", file=sys.stderr)


def hash_name(name: str) -> int:
    """A stable 32-bit number from a tensor name (Python's hash() is salted per process)."""
    h = 2166136261
    for byte in name.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


if __name__ == "__main__":
    main()
