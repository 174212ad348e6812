#!/usr/bin/env python3
"""Writes tiny random-weight models of the newer families, as a Hugging Face directory
(transformers' own `save_pretrained`) and as a GGUF file (llama.cpp's own
`convert_hf_to_gguf.py`), with transformers' reference outputs.

For each family, `testdata/hf/tiny-<family>/` holds the directory, `reference.json` and
`tiny-<family>.gguf`:

* `tiny-qwen3`: `Qwen3ForCausalLM`, float32, 2 layers, GQA 4/2, head_dim 32 apart from
  hidden / heads (16), per-head Q/K RMS norms, no Q/K/V biases, untied `lm_head`, and
  YaRN RoPE scaling (factor 4 over an original context of 16, so it matters within the
  prompts), as Qwen3's long-context configurations have it.
* `tiny-phi3`: `Phi3ForCausalLM` (Phi-3.5/Phi-4-mini), float32, 2 layers, GQA 4/2, fused
  `qkv_proj` and `gate_up_proj`, RoPE on half of each head (`partial_rotary_factor` 0.5),
  LongRoPE with distinct short and long factors over an original context of 8 (every
  prompt is longer, so transformers uses the long ones, as llama.cpp does with a context
  beyond the original), tied embeddings; the tokenizer marked `GPT2Tokenizer`, as
  Phi-4-mini's is, which the converter needs.
* `tiny-qwen3moe`: `Qwen3MoeForCausalLM`, float32, 2 layers, Qwen3's attention (head_dim
  32, Q/K norms), and in every layer 8 routed experts of 48 with 3 per token and their
  weights renormalised (`norm_topk_prob`), as Qwen3-30B-A3B has them. The script checks
  that the routing differs by position (every prompt's tokens use more than 3 experts
  between them in each layer).
* `tiny-smollm3`: `SmolLM3ForCausalLM`, float32, 4 layers (the fourth without RoPE, as
  `no_rope_layers` says), GQA 4/2, tied embeddings; Llama's layout, so the converter
  permutes Q/K rows for interleaved RoPE.

Norm weights are drawn around 1 (not left at 1), so a norm read wrongly moves the logits.
The tokenizer is `tiny-qwen2`'s (a small byte-level BPE), copied. `reference.json` holds
`tiny-qwen2`'s three prompts with transformers' float32 logits at every position (eager
attention, rounded to 6 decimals) and 12 greedy tokens after each.

llama.cpp's converter recognises a BPE tokenizer by the hash of how it splits a fixed
text; a tokenizer trained for a fixture has no known hash, so the converter is told it
splits as Qwen2's does (which is how the fixture's tokenizer was built). Nothing else of
the converter is changed.

Usage (needs torch, transformers 5 and llama.cpp's `gguf-py`; `convert_hf_to_gguf.py`
from the llama-cpp-python sdist `scripts/peers/bench-peers.sh` unpacks), from the
repository root:

    python testdata/hf/families.py testdata/hf ~/.cache/pyramid/peers/llama.cpp-0.3.36/src [tiny-NAME ...]

Naming fixtures writes only those.
"""

import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

GREEDY = 12

# What every fixture shares: the shape (but layers and head size), the tokenizer's ids.
SHAPE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=384,
    eos_token_id=386,
    pad_token_id=384,
)


def save(model: torch.nn.Module, seed: int, out: Path) -> None:
    randomise(model, seed)
    model.save_pretrained(out)


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Weights from a fixed generator: norms around 1, the rest around 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            else:
                p.copy_(0.2 * noise)


def qwen3(out: Path) -> None:
    config = Qwen3Config(
        **SHAPE,
        num_hidden_layers=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1_000_000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        tie_word_embeddings=False,
    )
    save(Qwen3ForCausalLM(config), 3, out)


def qwen3moe(out: Path) -> None:
    config = Qwen3MoeConfig(
        **SHAPE,
        num_hidden_layers=2,
        head_dim=32,
        moe_intermediate_size=48,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
    )
    save(Qwen3MoeForCausalLM(config), 11, out)


def check_routing(model: torch.nn.Module, prompts: list[dict]) -> None:
    """Every layer's router sends each prompt's tokens to more experts than one token
    uses: the fixture tests routing that changes with position."""
    routers = [layer.mlp.gate for layer in model.model.layers]
    chosen: list[torch.Tensor] = []
    hooks = [r.register_forward_hook(lambda m, i, out: chosen.append(out[2])) for r in routers]
    with torch.no_grad():
        for prompt in prompts:
            chosen.clear()
            model(torch.tensor([prompt["ids"]]))
            for layer, indices in enumerate(chosen):
                used = len(set(indices.flatten().tolist()))
                assert used > indices.shape[-1], (prompt["text"], layer, used)
    for hook in hooks:
        hook.remove()


def phi3(out: Path) -> None:
    config = Phi3Config(
        **SHAPE,
        num_hidden_layers=2,
        original_max_position_embeddings=8,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10_000.0,
            "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.3, 2.1, 3.4],
            "long_factor": [1.1, 2.5, 6.0, 12.0],
            "original_max_position_embeddings": 8,
        },
        tie_word_embeddings=True,
    )
    save(Phi3ForCausalLM(config), 7, out)


def smollm3(out: Path) -> None:
    config = SmolLM3Config(
        **SHAPE,
        num_hidden_layers=4,
        rms_norm_eps=1e-6,
        rope_theta=2_000_000.0,
    )
    save(SmolLM3ForCausalLM(config), 5, out)


def reference(out: Path, prompts: list[dict]) -> dict:
    model = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    if hasattr(model.config, "num_experts_per_tok"):
        check_routing(model, prompts)
    entries = []
    with torch.no_grad():
        for prompt in prompts:
            ids = prompt["ids"]
            logits = model(torch.tensor([ids])).logits[0]
            greedy = model.generate(
                torch.tensor([ids]),
                max_new_tokens=GREEDY,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0][len(ids):]
            entries.append({
                "text": prompt["text"],
                "ids": ids,
                "logits": [[round(float(x), 6) for x in row] for row in logits],
                "greedy": [int(t) for t in greedy],
            })
    return {
        "generator": "testdata/hf/families.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "prompts": entries,
    }


def convert(out: Path, converter: Path) -> None:
    sys.path.insert(0, str(converter))
    import convert_hf_to_gguf as conv
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(out), "--outtype", "f32",
                "--outfile", str(out / f"{out.name}.gguf")]
    try:
        conv.main()
    finally:
        sys.argv = argv


def main(root: Path, converter: Path) -> None:
    torch.manual_seed(0)
    source = root / "tiny-qwen2"
    prompts = [
        {"text": p["text"], "ids": p["ids"]}
        for p in json.loads((source / "reference.json").read_text())["prompts"]
    ]
    families = [
        ("tiny-qwen3", qwen3),
        ("tiny-smollm3", smollm3),
        ("tiny-phi3", phi3),
        ("tiny-qwen3moe", qwen3moe),
    ]
    only = set(sys.argv[3:])
    for name, make in families:
        if only and name not in only:
            continue
        out = root / name
        if out.exists():
            shutil.rmtree(out)
        make(out)
        for file in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(source / file, out / file)
        if name == "tiny-phi3":
            config = json.loads((out / "tokenizer_config.json").read_text())
            config["tokenizer_class"] = "GPT2Tokenizer"
            (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        body = reference(out, prompts)
        (out / "reference.json").write_text(json.dumps(body) + "\n")
        convert(out, converter)
        print(f"{out}: {len(prompts)} prompts")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
