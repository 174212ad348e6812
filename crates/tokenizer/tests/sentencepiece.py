#!/usr/bin/env python3
"""Regenerates tests/data/sentencepiece.json: Hugging Face ids for varied texts on the
SentencePiece vocabulary of Gemma 3 270M (`tokenizer.ggml.model = llama`).

The reference is transformers' own tokenizer rebuilt from the GGUF (`gguf_file=`), the one
`hf_reference.py` uses for the golden files: a `tokenizers` BPE with byte fallback whose
merges come from the GGUF's scores, and the GGUF's user-defined tokens (whitespace runs,
HTML tags) as added tokens. Each text is encoded twice: as plain text (no special-token
parsing) and with special tokens parsed, both without BOS/EOS.

Usage, from the repository root (needs torch, transformers, gguf, sentencepiece from PyPI):

    python crates/tokenizer/tests/sentencepiece.py > crates/tokenizer/tests/data/sentencepiece.json

The model is read from $PYRAMID_HOME/models (default ~/.cache/pyramid/models).
"""

import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tokenizers  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

FILE = "gemma-3-270m-q4_k_m.gguf"

TEXTS = [
    "Hello world",
    "The capital of France is",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "two  spaces\tand a tab\t\tand two",
    "line one\nline two\n\nline four\n\n\n\nend",
    "\r\n windows \r\n line endings",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { sum += a[i] * b[i]; }",
    "x**2 + y**2 == z**2 # Pythagoras",
    "12345 + 67890 = 80235, and 3.14159 or 1e-9 or 0x1F",
    "2026-12-02T12:00:00Z",
    "Ünïcödé ✓ 12345 — 東京 🚀 test",
    "😀😃😄 emoji 👩‍👩‍👧‍👦 family 🇫🇷 flag",
    "中文文本，包含标点。日本語のテキスト。한국어 텍스트.",
    "Ελληνικά, русский, العربية, עברית, हिन्दी",
    "<table><tr><td>cell</td></tr></table>",
    "<h1>Title</h1> <b>bold</b> and <code>code</code>",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>not at the start <eos> <pad> <unk>",
    "private use \ue000 and \U0010fffd and a lone combining \u0301",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "    indented\n\tTabbed\n \t mixed",
    "JSON: {\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "!!!???...,,,;;;:::---___===+++",
    "a",
    " ",
    "\n",
    "",
]


def main() -> None:
    home = os.environ.get("PYRAMID_HOME") or os.path.expanduser("~/.cache/pyramid")
    path = os.path.join(home, "models", FILE)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=FILE)
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    cases = []
    for text in TEXTS:
        plain = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        special = tok(text, add_special_tokens=False)["input_ids"]
        cases.append(
            {
                "text": text,
                "ids": plain,
                "ids_parse_special": special,
                "decoded": tok.decode(special),
            }
        )
    json.dump(
        {
            "generator": "crates/tokenizer/tests/sentencepiece.py",
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "model": FILE,
            "sha256": sha,
            "cases": cases,
        },
        sys.stdout,
        ensure_ascii=False,
        indent=1,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
