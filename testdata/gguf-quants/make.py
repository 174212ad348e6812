#!/usr/bin/env python3
"""Helper of make.sh: the F32 source model, and the read-back of the quantised files.

    make.py source OUT_DIR LLAMA_CPP_SRC   writes a random-weight Qwen2 (save_pretrained,
                                           float32) to OUT_DIR/hf and converts it with
                                           llama.cpp's convert_hf_to_gguf.py to
                                           OUT_DIR/tiny-qwen2-f32.gguf
    make.py types DIR                      reads every DIR/*.gguf back with gguf-py's
                                           GGUFReader, writes DIR/types.json and
                                           DIR/dequant.json and prints the README's table

The shape is chosen for the dequantisation test and for size (13 files, ~3-4 MB in all),
not for sense: one layer, and every 2-D weight row a multiple of 256 (k-quant super-blocks)
except ffn_down's, whose rows are the intermediate size, 96 (three 32-blocks), so
llama-quantize must fall back to a 32-block type for it. The tokenizer is tiny-qwen2's cut
to its first MERGES merges (the embedding and output rows are most of the weights). Rows are drawn with scales spread over a decade and a few outliers, so block scales
(and k-quant sub-block scales and minimums) vary; one row of attn_q in layer 0 is all
zeros (blocks with a zero scale).
"""

import json
import shutil
import sys
from collections import OrderedDict
from pathlib import Path

SEED = 53
TOKENIZER = Path(__file__).resolve().parent.parent / "hf" / "tiny-qwen2"

MERGES = 32
N_VOCAB = 256 + MERGES + 3  # byte alphabet, merges, <|endoftext|> <|im_start|> <|im_end|>

# Qwen2 shape: 1 layer, GQA 4/2 of head size 64, untied output.
SHAPE = dict(
    vocab_size=N_VOCAB,
    hidden_size=256,
    intermediate_size=96,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    tie_word_embeddings=False,
    bos_token_id=N_VOCAB - 3,
    eos_token_id=N_VOCAB - 1,
    pad_token_id=N_VOCAB - 3,
)


def cut_tokenizer(src: Path, dst: Path) -> None:
    """tiny-qwen2's tokenizer.json with only its first MERGES merges; special ids follow."""
    body = json.loads(src.read_text())
    model = body["model"]
    keep = 256 + MERGES
    inverse = {i: t for t, i in model["vocab"].items()}
    assert all(len(inverse[i]) == 1 for i in range(256)), "the first 256 ids are the bytes"
    merges = model["merges"][:MERGES]
    for i, merge in enumerate(merges):
        pair = merge.split(" ") if isinstance(merge, str) else merge
        assert inverse[256 + i] == "".join(pair), "merge i makes token 256 + i"
    model["vocab"] = {inverse[i]: i for i in range(keep)}
    model["merges"] = merges
    for i, token in enumerate(body["added_tokens"]):
        token["id"] = keep + i
    assert len(body["added_tokens"]) == 3
    dst.write_text(json.dumps(body, ensure_ascii=False, indent=1) + "\n")


def randomise(model, seed: int) -> None:
    """Norms around 1, biases around 0, weight rows of varied scale with rare outliers."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.05 * noise)
            else:
                # one scale per row, log-uniform in [0.01, 0.1]
                rows = p.shape[0]
                scale = 10.0 ** (-2.0 + torch.rand((rows, 1), generator=g))
                w = noise * scale
                # about one weight in 500 is 8 times larger
                spikes = torch.rand(p.shape, generator=g) < 0.002
                w = torch.where(spikes, 8.0 * w, w)
                p.copy_(w)
        model.model.layers[0].self_attn.q_proj.weight[3].zero_()


def source(out: Path, converter: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    hf = out / "tiny-qwen2"  # general.name comes from the directory's name
    if hf.exists():
        shutil.rmtree(hf)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    randomise(model, SEED)
    model.save_pretrained(hf)
    cut_tokenizer(TOKENIZER / "tokenizer.json", hf / "tokenizer.json")
    shutil.copy(TOKENIZER / "tokenizer_config.json", hf / "tokenizer_config.json")

    # The converter knows a BPE tokenizer by a hash of how it splits a fixed text; the
    # fixture's tokenizer was trained for this project and has no known hash, but it
    # splits as Qwen2's does, so the converter is told so. Nothing else is changed.
    sys.path.insert(0, str(converter))
    import convert_hf_to_gguf
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outtype", "f32",
                "--outfile", str(out / "tiny-qwen2-f32.gguf")]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


KINDS = ["token_embd", "attn_q", "attn_k", "attn_v", "attn_output",
         "ffn_gate", "ffn_up", "ffn_down", "output"]


def kind(name: str) -> str:
    parts = name.split(".")
    return parts[2] if parts[0] == "blk" else parts[0]


def types(folder: Path) -> None:
    import hashlib

    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    files = OrderedDict()
    digests = OrderedDict()
    for path in sorted(folder.glob("*.gguf")):
        reader = GGUFReader(path)
        files[path.name] = OrderedDict(
            (t.name, t.tensor_type.name) for t in reader.tensors)
        digests[path.name] = OrderedDict()
        for t in reader.tensors:
            values = dequantize(t.data, t.tensor_type).astype("<f4", copy=False)
            digests[path.name][t.name] = {
                "ne": [int(n) for n in t.shape],
                "sum": float(np.sum(values, dtype=np.float64)),
                "f32_sha256": hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest(),
            }
    (folder / "types.json").write_text(json.dumps(files, indent=1) + "\n")
    lines = []
    for name, tensors in digests.items():
        rows = [f"  {json.dumps(t)}: {json.dumps(d)}" for t, d in tensors.items()]
        lines.append(f" {json.dumps(name)}: {{\n" + ",\n".join(rows) + "\n }")
    (folder / "dequant.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")

    print("| file | size | " + " | ".join(KINDS) + " |")
    print("| --- | ---: |" + " --- |" * len(KINDS))
    for name, tensors in files.items():
        cells = []
        for k in KINDS:
            # per layer, in layer order, when the layers differ
            seen = [t for n, t in tensors.items() if kind(n) == k and n.endswith(".weight")]
            cells.append(" / ".join(seen) if len(set(seen)) > 1 else seen[0])
        size = (folder / name).stat().st_size
        print(f"| `{name}` | {size:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "source":
        source(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "types":
        types(Path(sys.argv[2]))
    else:
        sys.exit(__doc__)
