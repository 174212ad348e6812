#!/usr/bin/env python3
"""Regenerates tests/data/whitespace_digits.json: Hugging Face `tokenizers` ids for whitespace,
digit and punctuation mixes, for the two test models.

The tokenizer is built from the GGUF's own vocabulary and merges, with the normalizer and
pre-tokenizer of the model's `tokenizer.json` on the Hugging Face hub (written out below, as the
hub is not reachable from the test machines):

- SmolLM2-135M-Instruct: Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)].
  Digits runs first, so a whitespace run in front of a digit is a word of its own ("\\n\\n" before
  "1" stays one token). transformers' GGUF loader (5.24) drops that Digits step for
  `tokenizer.ggml.pre = smollm` and splits such runs differently; it is not the reference here.
- Qwen2.5-Coder-0.5B-Instruct: NFC, then Sequence[Split(Qwen2 regex, isolated),
  ByteLevel(use_regex=false)].

Usage, from the repository root (needs `tokenizers` and `gguf` from PyPI):

    ~/.cache/pyramid/test-venv/bin/pip install tokenizers gguf
    ~/.cache/pyramid/test-venv/bin/python crates/tokenizer/tests/whitespace_digits.py \
        > crates/tokenizer/tests/data/whitespace_digits.json

Models are read from $PYRAMID_HOME/models (default ~/.cache/pyramid/models).
"""

import hashlib
import json
import os
import sys

import gguf
import tokenizers
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import BPE

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

MODELS = {
    "smollm2-135m-instruct-q4_1.gguf": (
        None,
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        ),
    ),
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": (
        normalizers.NFC(),
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
    ),
}

TEXTS = [
    # issue 19 and its neighbours: whitespace runs before a digit
    "list:\n\n1.",
    "a  1",
    "\n\n\n2",
    " \t3",
    "x\n 4",
    "foo\r\n\r\n5",
    "\t\t1",
    "a\t 2",
    "  \n  5",
    "3 \n4",
    "1.\n\n2.",
    "- 1\n- 2\n",
    "steps:\n\n\n 10",
    # digits alone and in groups
    "12345",
    "1 2  3",
    "1,000.50",
    "v2.0-rc1",
    "x=10;y=-2",
    "(1)(2)",
    "2024-12-01 21:48",
    # whitespace with no digit after it
    "a  b",
    "a\n\nb",
    "x  ",
    "x\n\n",
    "end.  \n",
    " ",
    "\n",
    "\t",
    "   ",
    "hi  \n\n",
    "x \n\n",
    "\r\n\r\n",
    "  leading",
    "trailing\t\t",
    # punctuation next to whitespace and digits
    "!!  ?",
    "a:  \n\n::",
    "#1 ## 2",
    "\"42\"  '7'",
    "it's 3'o clock",
    "$ 5 $",
    "...\n\n...",
    # Unicode digits and spaces
    "٣ ٤",
    "x²  ½",
    "Ⅻ 12",
    "１２ 3",
    "x\u00a0\u00a07",
    "x\u3000 8",
    "1\u2009000",
    "a\u0085 9",
    "a\x0b\x0c 1",
    "\u2028 2",
]


def model_path(file):
    home = os.environ.get("PYRAMID_HOME") or os.path.expanduser("~/.cache/pyramid")
    return os.path.join(home, "models", file)


def reference_tokenizer(path, normalizer, pre_tokenizer):
    reader = gguf.GGUFReader(path)
    pieces = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    vocab = {piece: index for index, piece in enumerate(pieces)}
    tokenizer = Tokenizer(BPE(vocab, [tuple(m.split(" ", 1)) for m in merges]))
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    return tokenizer


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main():
    models = {}
    for file, (normalizer, pre_tokenizer) in MODELS.items():
        path = model_path(file)
        tokenizer = reference_tokenizer(path, normalizer, pre_tokenizer)
        ids = [tokenizer.encode(text, add_special_tokens=False).ids for text in TEXTS]
        models[file] = {"sha256": sha256_of(path), "ids": ids}

    # One case per line, so a diff shows which one changed.
    out = sys.stdout
    out.write("{\n")
    out.write('  "generated_by": "crates/tokenizer/tests/whitespace_digits.py",\n')
    out.write(f'  "tokenizers": {json.dumps(tokenizers.__version__)},\n')
    out.write('  "models": {\n')
    blocks = []
    for file, model in models.items():
        rows = ",\n".join(
            f'        {{"text": {json.dumps(text)}, "ids": {json.dumps(ids)}}}'
            for text, ids in zip(TEXTS, model["ids"])
        )
        blocks.append(
            f"    {json.dumps(file)}: {{\n"
            f'      "sha256": {json.dumps(model["sha256"])},\n'
            f'      "cases": [\n{rows}\n      ]\n'
            "    }"
        )
    out.write(",\n".join(blocks))
    out.write("\n  }\n}\n")


if __name__ == "__main__":
    main()
