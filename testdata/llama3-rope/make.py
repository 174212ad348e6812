#!/usr/bin/env python3
"""Writes the Llama 3 RoPE-scaling fixture: a tiny random-weight Llama made by Hugging Face
transformers with `rope_scaling = {"rope_type": "llama3", ...}`, its logits from transformers,
and the same weights as a GGUF file the way llama.cpp's converter writes a Llama 3 model
(Q/K rows permuted for interleaved RoPE pairs, the scaling as a `rope_freqs.weight` tensor of
per-frequency divisors).

The scaling is made to matter at short range: `original_max_position_embeddings` is 64 and
`rope_theta` 10,000, so most of a 16-dimension head's frequencies are divided by the factor or
smoothed, and a model that ignored `rope_freqs` would give different logits within 48 tokens.

Usage (needs torch, transformers, gguf, numpy from PyPI), from the repository root:

    python testdata/llama3-rope/make.py testdata/llama3-rope

Outputs `tiny-llama3.gguf` and `reference.json` (token ids and transformers' float32 logits
at every position).
"""

import json
import math
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 96
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2
FF = 96
THETA = 10_000.0
SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
N_TOKENS = 48


def rope_factors() -> list[float]:
    """Per-frequency divisors of Llama 3 scaling, as the GGUF converter stores them."""
    old_len = SCALING["original_max_position_embeddings"]
    factor, low, high = SCALING["factor"], SCALING["low_freq_factor"], SCALING["high_freq_factor"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    out = []
    for i in range(0, HEAD_DIM, 2):
        freq = 1.0 / (THETA ** (i / HEAD_DIM))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def interleave(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half Q/K rows to GGUF's interleaved-pairs order (llama.cpp's permute)."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def main() -> None:
    out_dir = Path(sys.argv[1])
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FF,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=THETA,
        rope_scaling=SCALING,
        tie_word_embeddings=False,
        # Large enough that attention is far from uniform, so positions matter.
        initializer_range=0.15,
    )
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    tokens = [(i * 37 + 11) % VOCAB for i in range(N_TOKENS)]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].numpy()
        # The same weights without the scaling: how far a loader ignoring it would be off.
        unscaled_rope = {"rope_type": "default", "rope_theta": THETA}
        plain = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "rope_parameters": unscaled_rope}))
        plain.load_state_dict(model.state_dict())
        unscaled = plain.float().eval()(torch.tensor([tokens])).logits[0].numpy()
    change = float(np.abs(logits - unscaled).max())
    assert change > 0.05, f"the scaling changes the logits by only {change}"

    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(out_dir / "tiny-llama3.gguf"), "llama")
    w.add_name("tiny-llama3-rope")
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("rope_freqs.weight", np.array(rope_factors(), dtype=np.float32))
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", interleave(sd[p + "self_attn.q_proj.weight"], HEADS))
        w.add_tensor(f"blk.{i}.attn_k.weight", interleave(sd[p + "self_attn.k_proj.weight"], KV_HEADS))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    json.dump(
        {
            "generator": "testdata/llama3-rope/make.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "rope_scaling": SCALING,
            "rope_factors": rope_factors(),
            "max_logit_change_from_scaling": round(change, 4),
            "tokens": tokens,
            "logits": [[round(float(x), 6) for x in row] for row in logits],
        },
        open(out_dir / "reference.json", "w"),
        indent=None,
    )


if __name__ == "__main__":
    main()
