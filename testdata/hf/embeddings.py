#!/usr/bin/env python3
"""Writes `embeddings.json` beside each tiny Hugging Face fixture: transformers' pooled,
L2-normalised final hidden states for the prompts of its `reference.json`.

For each fixture directory (loaded in float32 with eager attention, as `make.py` does)
and each prompt's ids, the base model's `last_hidden_state` (after the final norm) is
pooled three ways, as sentence-transformers pools: `mean` over every token, `cls` (the
first token) and `last` (the last token, as Qwen3-Embedding does), then divided by its
L2 norm. Values are float32, rounded to 7 decimals.

Usage (needs torch and transformers from PyPI), from the repository root:

    python testdata/hf/embeddings.py testdata/hf
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

FIXTURES = ["tiny-llama", "tiny-qwen2", "tiny-gemma3"]


def pooled(hidden: torch.Tensor) -> dict:
    """`hidden` is `[tokens, width]`: each pooling, normalised."""
    out = {
        "mean": hidden.mean(dim=0),
        "cls": hidden[0],
        "last": hidden[-1],
    }
    return {
        name: [round(float(x), 7) for x in torch.nn.functional.normalize(v, dim=0)]
        for name, v in out.items()
    }


def main(root: Path) -> None:
    torch.manual_seed(0)
    for name in FIXTURES:
        directory = root / name
        reference = json.loads((directory / "reference.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, attn_implementation="eager"
        )
        model.eval()
        prompts = []
        with torch.no_grad():
            for prompt in reference["prompts"]:
                ids = torch.tensor([prompt["ids"]])
                hidden = model.model(input_ids=ids).last_hidden_state[0]
                prompts.append({"ids": prompt["ids"], **pooled(hidden)})
        body = {
            "generator": "testdata/hf/embeddings.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0],
            "prompts": prompts,
        }
        (directory / "embeddings.json").write_text(json.dumps(body, indent=1) + "\n")
        print(f"{directory / 'embeddings.json'}: {len(prompts)} prompts")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "testdata/hf"))
