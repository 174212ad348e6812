#!/usr/bin/env python3
"""Writes tiny random-weight Hugging Face model directories and reference outputs for the
loader of HF directories (config.json + *.safetensors + tokenizer.json + tokenizer_config.json
or chat_template.jinja + generation_config.json).

Every directory is written by transformers' own `save_pretrained`, so the files have exactly
the shape transformers 5 gives them; only `tiny-qwen2` is edited afterwards, to cover the older
forms still common on the Hub: its chat template is moved from `chat_template.jinja` into
`tokenizer_config.json`, and its tokenizer.json merges are rewritten from `["a", "b"]` pairs to
`"a b"` strings. The three fixtures differ on purpose in every axis a loader must get
right:

* `tiny-llama`: `LlamaForCausalLM`, float32, untied `lm_head`, Llama 3 RoPE scaling that
  matters within the prompts (`original_max_position_embeddings` 64), byte-level BPE whose
  special tokens are added tokens after the model vocabulary, a BOS-prepending
  `TemplateProcessing`, a Llama-3-style chat template, and `generation_config.json` with a
  list of two EOS ids.
* `tiny-qwen2`: `Qwen2ForCausalLM`, bfloat16, tied embeddings (no `lm_head.weight` stored),
  Q/K/V biases, sharded into several `model-0000X-of-0000Y.safetensors` with an index, a model
  vocabulary padded beyond the tokenizer's (as Qwen2 does), Qwen2's tokenizer pipeline (NFC,
  regex `Split`, `ByteLevel`) without BOS, ChatML kept under `"chat_template"` in
  `tokenizer_config.json`.
* `tiny-gemma3`: `Gemma3ForCausalLM` (`gemma3_text`), float16, tied, 5 sliding (window 8)
  then 1 full layer, local/global RoPE bases, `query_pre_attn_scalar` 24 (not head_dim 16),
  norms stored as Gemma's `w` in `x * (1 + w)`, embeddings scaled by sqrt(hidden) at run
  time, a SentencePiece-style BPE with byte fallback (`<0x00>`...`<0xFF>`) laid out like Gemma
  3's tokenizer.json, and a Gemma turn template in `chat_template.jinja`.

The tokenizers are trained with `tokenizers`' BpeTrainer on the fixed text below (original,
written for this project), so they are deterministic and small (~400 tokens).

`reference.json` in each directory holds, from transformers (the directory loaded back in
float32, eager attention): token ids and float32 logits at every position for 3 prompts;
~25 tokenizer cases (ids with and without special-token parsing and with BOS, pieces,
decoded text); a rendered chat; and a few config facts.

Usage (needs torch, transformers 5, tokenizers, safetensors from PyPI), from the repository
root:

    python testdata/hf/make.py testdata/hf

Running it twice gives byte-identical files.
"""

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import safetensors
import tokenizers
import torch
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

HIDDEN = 64
HEADS = 4
FF = 96

# Training text for the tokenizers: English prose and a little code, so merges cover common
# words, indentation and punctuation, while CJK, emoji and the like stay unmerged bytes.
CORPUS = """\
The lighthouse keeper climbed the stairs every evening to light the lamp before the sun went down.
He wrote the time, the weather and the state of the sea in a small book that he kept on the table.
On calm nights the light could be seen from far away, and the ships that passed would turn
their course to follow the line of the coast. When the wind was strong and the rain was heavy,
he stayed awake until the morning, watching the water and listening to the bell on the rocks.
A compiler reads the source of a program, turns it into tokens, builds a tree of the
expressions and statements, checks that the types agree, and then writes out instructions for
the machine. Each of these passes takes the output of the one before it and makes it a little
closer to the code that the processor will run. The last pass chooses registers and orders the
instructions so that the program is both correct and fast.
def count_words(text):
    counts = {}
    for word in text.split():
        word = word.lower().strip(".,;:!?")
        counts[word] = counts.get(word, 0) + 1
    return counts

class Counter:
    def __init__(self, start=0):
        self.value = start

    def add(self, n=1):
        self.value += n
        return self.value

for i in range(10):
    if i % 2 == 0:
        print(f"{i} is even")
    else:
        print(f"{i} is odd")

fn main() {
    let numbers = vec![1, 2, 3, 4, 5];
    let total: i32 = numbers.iter().sum();
    println!("total = {}", total);
}
The numbers 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 10, 100, 1000 appear in the text, as do 3.14 and 2.71.
"Hello, world!" said the program. It's the first thing that most people write, and it's short.
"""

LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
]
# Qwen2's pre-tokenizer regex (single digits, letters with one leading non-letter, ...).
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]

LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] | trim }}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
# Gemma's turn format: a system message becomes a prefix of the first user turn, "assistant"
# is called "model", and roles must alternate.
GEMMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set turns = messages[1:] %}"
    "{%- else %}"
    "{%- set prefix = '' %}"
    "{%- set turns = messages %}"
    "{%- endif %}"
    "{%- for message in turns %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{%- endif %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') }}"
    "{{- message['content'] | trim }}"
    "{{- '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<start_of_turn>model\\n' }}"
    "{%- endif %}"
)

CHAT = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 + 3? Reply in one word, 你好 👋"},
]

PROMPT_SHORT = "The lighthouse keeper"
PROMPT_MIXED = (
    "To count words, write def count(text):\n"
    "    return len(text.split())\n"
    "then count(\"the sea is calm\") gives 4."
)


def tokenizer_cases(specials: list[str]) -> list[str]:
    """Texts for the tokenizer comparison; `specials` are the fixture's own special tokens."""
    others = ["<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<bos>", "<s>", "</s>"]
    return [
        "Hello, world!",
        "def add(a, b):\n    return a + b\n",
        "    indented\n\tand\ttabbed\n\n\nthree newlines",
        "a  b   c    d     e",
        "12345 3.14159 1234567890123",
        "Wave 👋🏽 hello",
        "你好，世界",
        "مرحبا بالعالم",
        "Café naïve façade résumé Ærø",
        "e\u0301 (combining acute) vs \u00e9",
        "private \ue000 use",
        "",
        " ",
        "   \n  ",
        " leading space",
        "trailing space ",
        "\r\nwindows\r\nline endings\r\n",
        "don't won't I'm they'll we've",
        "snake_case_names = [x**2 for x in range(10)]",
        '{"key": [1, 2, 3], "nested": {"a": null}}',
        "family 👨\u200d👩\u200d👧 zwj",
        "".join(specials),
        f"text{specials[-1]}more {specials[0]} spaced {specials[-1]}\n",
        " ".join(others) + " look special but are plain text here",
        "The lighthouse keeper wrote the time and the weather.",
    ]


def train_byte_level(vocab_size: int, qwen2: bool = False) -> Tokenizer:
    """A byte-level BPE (all 256 byte symbols plus merges), trained on CORPUS.

    Plain: one `ByteLevel` pre-tokenizer with its built-in GPT-2 regex. `qwen2`: the pipeline of
    Qwen2's tokenizer.json, NFC then `Split(regex)` then `ByteLevel(use_regex=False)`.
    transformers 5 rebuilds exactly that pipeline for `model_type` "qwen2" whatever the file
    says (`Qwen2Tokenizer`), so the file has to match it for the references to describe it."""
    tk = Tokenizer(models.BPE())
    if qwen2:
        tk.normalizer = normalizers.NFC()
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tk.train_from_iterator([CORPUS], trainer)
    return tk


def add_specials(tk: Tokenizer, specials: list[str]) -> None:
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])


def llama_tokenizer() -> PreTrainedTokenizerFast:
    tk = train_byte_level(400)
    add_specials(tk, LLAMA_SPECIALS)
    bos = "<|begin_of_text|>"
    tk.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0",
        pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
        special_tokens=[(bos, tk.token_to_id(bos))],
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, eos_token="<|eot_id|>")
    tok.chat_template = LLAMA_TEMPLATE
    return tok


def qwen2_tokenizer() -> PreTrainedTokenizerFast:
    tk = train_byte_level(384, qwen2=True)
    add_specials(tk, QWEN_SPECIALS)
    # As in Qwen2's tokenizer.json: a ByteLevel post-processor (offsets only), no BOS.
    tk.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def gemma_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-style BPE laid out like Gemma 3's tokenizer.json: special tokens first,
    then the 256 `<0xXX>` byte-fallback tokens, then the learned pieces ("▁" for space)."""
    trainer_tk = Tokenizer(models.BPE())
    trainer_tk.normalizer = normalizers.Replace(" ", "▁")
    # Words for training only (SentencePiece learns pieces within "▁word" units).
    trainer_tk.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=[], show_progress=False)
    trainer_tk.train_from_iterator([CORPUS], trainer)
    learned = json.loads(trainer_tk.to_str())["model"]
    pieces = sorted(learned["vocab"], key=learned["vocab"].get)

    vocab = {}
    for tok in GEMMA_SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + pieces:
        vocab.setdefault(tok, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    tk = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    tk.normalizer = normalizers.Replace(" ", "▁")
    # Gemma 3's tokenizer.json has this split on " "; after the normalizer it is a no-op.
    tk.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    add_specials(tk, GEMMA_SPECIALS)
    tk.post_processor = processors.TemplateProcessing(
        single="<bos>:0 $A:0",
        pair="<bos>:0 $A:0 <bos>:1 $B:1",
        special_tokens=[("<bos>", vocab["<bos>"])],
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<bos>",
        eos_token="<end_of_turn>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    tok.chat_template = GEMMA_TEMPLATE
    return tok


def randomize(model: torch.nn.Module, std: float, norm: str) -> None:
    """Deterministic, large-enough weights: N(0, std) for matrices and biases; norm weights
    1 + N(0, 0.2) for Llama-style norms (`x * w`) or N(0, 0.3) for Gemma's (`x * (1 + w)`)."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise if norm == "llama" else 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.5 * std * noise)
            else:
                p.copy_(std * noise)


def save_model(model, tok, out: Path, dtype: torch.dtype, **kwargs) -> None:
    if out.exists():
        shutil.rmtree(out)
    model.to(dtype).save_pretrained(out, **kwargs)
    tok.save_pretrained(out)
    for f in out.iterdir():
        f.chmod(0o644)  # save_pretrained writes safetensors files 0600


def load_model(out: Path, **overrides):
    """The saved directory in float32, eager attention; `overrides` change config fields."""
    return AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", **overrides
    ).eval()


def logit_change(out: Path, ids: list[int], **overrides) -> float:
    """Max |logit difference| if the model is loaded with some config fields changed: how far
    a loader that got that field wrong would be off."""
    with torch.no_grad():
        x = torch.tensor([ids])
        diff = load_model(out)(x).logits - load_model(out, **overrides)(x).logits
        return float(diff.abs().max())


def check_tokenizer_file(out: Path, tok, texts: list[str]) -> None:
    """AutoTokenizer may rebuild the pipeline for the model type instead of reading
    tokenizer.json (transformers 5 does for qwen2); insist it agrees with the file itself."""
    plain = PreTrainedTokenizerFast.from_pretrained(out)
    file = json.loads((out / "tokenizer.json").read_text())
    live = json.loads(plain.backend_tokenizer.to_str())
    assert all(file[k] == live[k] for k in ("normalizer", "pre_tokenizer", "post_processor")), out
    for text in texts:
        for kw in (
            {"add_special_tokens": False},
            {"add_special_tokens": True},
            {"add_special_tokens": False, "split_special_tokens": True},
        ):
            a, b = tok(text, **kw).input_ids, plain(text, **kw).input_ids
            assert a == b, (out.name, text, kw, a, b)


def reference(out: Path, prompts: list[str], specials: list[str]) -> dict:
    tok = AutoTokenizer.from_pretrained(out)
    check_tokenizer_file(out, tok, prompts + tokenizer_cases(specials))
    model = load_model(out)
    ref_prompts = []
    max_abs = 0.0
    for text in prompts:
        ids = tok(text, add_special_tokens=True).input_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        assert torch.isfinite(logits).all(), f"{out.name}: non-finite logits"
        max_abs = max(max_abs, float(logits.abs().max()))
        ref_prompts.append(
            {
                "text": text,
                "ids": ids,
                "logits": [[round(float(x), 6) for x in row] for row in logits],
            }
        )
    cases = []
    for text in tokenizer_cases(specials):
        ids = tok(text, add_special_tokens=False).input_ids
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_split_special": tok(
                    text, add_special_tokens=False, split_special_tokens=True
                ).input_ids,
                "ids_with_special": tok(text, add_special_tokens=True).input_ids,
                "tokens": tok.convert_ids_to_tokens(ids),
                "decoded": tok.decode(
                    ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
                ),
            }
        )
    messages = CHAT  # Gemma's template folds the system message into the first user turn
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    chat = {
        "messages": messages,
        "rendered": rendered,
        "rendered_no_generation_prompt": tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False
        ),
        "ids": tok(rendered, add_special_tokens=False).input_ids,
    }
    return {
        "generator": "testdata/hf/make.py",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
        "auto_tokenizer_class": type(tok).__name__,
        "max_abs_logit": round(max_abs, 4),
        "prompts": ref_prompts,
        "tokenizer_cases": cases,
        "chat": chat,
    }


def stored_tensors(out: Path, dtype: str) -> dict[str, list[str]]:
    """Tensor names per safetensors file; checks they are all stored as `dtype` ("F32", ...)."""
    files = {}
    for f in sorted(out.glob("*.safetensors")):
        with safetensors.safe_open(f, "pt") as s:
            files[f.name] = sorted(s.keys())
            assert {s.get_slice(k).get_dtype() for k in s.keys()} == {dtype}, f
    return files


def write_reference(out: Path, ref: dict, config: dict) -> None:
    merges = json.loads((out / "tokenizer.json").read_text())["model"]["merges"]
    config["tokenizer_merges_form"] = "strings" if isinstance(merges[0], str) else "pairs"
    ref["config"] = config
    with open(out / "reference.json", "w") as f:
        json.dump(ref, f, indent=None)
        f.write("\n")


def make_llama(root: Path) -> None:
    out = root / "tiny-llama"
    tok = llama_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in LLAMA_SPECIALS}
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=FF,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10_000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=False,
        bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=ids["<|eot_id|>"],
    )
    model = LlamaForCausalLM(config).eval()
    randomize(model, 0.15, "llama")
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=[ids["<|end_of_text|>"], ids["<|eot_id|>"]],
    )
    save_model(model, tok, out, torch.float32)
    prompts = [PROMPT_SHORT, PROMPT_MIXED, "Say 你好<|eot_id|> then 👋🏽 and café, done."]
    ref = reference(out, prompts, LLAMA_SPECIALS)
    longest = max((p["ids"] for p in ref["prompts"]), key=len)
    unscaled = logit_change(
        out, longest, rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}
    )
    assert unscaled > 0.05, unscaled
    write_reference(
        out,
        ref,
        {
            "dtype": "float32",
            "tie_word_embeddings": False,
            "vocab_size": config.vocab_size,
            "tokenizer_len": len(tok),
            "bos_token_id": ids["<|begin_of_text|>"],
            "eos_token_id": ids["<|eot_id|>"],
            "generation_eos_token_ids": [ids["<|end_of_text|>"], ids["<|eot_id|>"]],
            "special_token_ids": ids,
            "max_logit_change_without_rope_scaling": round(unscaled, 4),
            "chat_template_in": "chat_template.jinja",
            "safetensors": stored_tensors(out, "F32"),
        },
    )


def make_qwen2(root: Path) -> None:
    out = root / "tiny-qwen2"
    tok = qwen2_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    # Qwen2 pads the model vocabulary beyond the tokenizer; so does this fixture.
    vocab_size = (len(tok) + 63) // 64 * 64 + 64
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=FF,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    model = Qwen2ForCausalLM(config).eval()
    randomize(model, 0.15, "llama")
    save_model(model, tok, out, torch.bfloat16, max_shard_size="80KB")
    # Move the chat template into tokenizer_config.json (the older, still common form).
    jinja = out / "chat_template.jinja"
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    if jinja.exists():
        tc["chat_template"] = jinja.read_text()
        jinja.unlink()
    assert tc.get("chat_template") == CHATML_TEMPLATE
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
    # Merges in the older "a b" string form (as in the Qwen2 and Llama 3 files on the Hub);
    # tokenizers 0.20+ writes ["a", "b"] pairs, which the other fixtures keep. Byte-level
    # symbols never contain a space, so the string form is unambiguous here.
    tj_path = out / "tokenizer.json"
    tj = json.loads(tj_path.read_text())
    tj["model"]["merges"] = [" ".join(m) for m in tj["model"]["merges"]]
    tj_path.write_text(json.dumps(tj, indent=2, ensure_ascii=False) + "\n")
    prompts = [PROMPT_SHORT, PROMPT_MIXED, "Say 你好<|im_end|> then 👋🏽 and café, done."]
    ref = reference(out, prompts, QWEN_SPECIALS)
    files = stored_tensors(out, "BF16")
    assert len(files) >= 2, files
    assert not any("lm_head.weight" in names for names in files.values()), files
    write_reference(
        out,
        ref,
        {
            "dtype": "bfloat16",
            "tie_word_embeddings": True,
            "vocab_size": vocab_size,
            "tokenizer_len": len(tok),
            "bos_token_id": None,
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "generation_eos_token_ids": [ids["<|im_end|>"]],
            "special_token_ids": ids,
            "chat_template_in": "tokenizer_config.json",
            "safetensors": files,
        },
    )


def make_gemma3(root: Path) -> None:
    out = root / "tiny-gemma3"
    tok = gemma_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in GEMMA_SPECIALS}
    layers = 6
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=FF,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        head_dim=16,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        query_pre_attn_scalar=24,
        sliding_window=8,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<bos>"],
        eos_token_id=ids["<eos>"],
    )
    model = Gemma3ForCausalLM(config).eval()
    randomize(model, 0.1, "gemma")
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(3.0)  # std 0.3: logits of a few units
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<bos>"],
        eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]],
        pad_token_id=ids["<pad>"],
    )
    save_model(model, tok, out, torch.float16)
    prompts = [PROMPT_SHORT, PROMPT_MIXED, "Say 你好<end_of_turn> then 👋🏽 and café, done."]
    ref = reference(out, prompts, GEMMA_SPECIALS)
    longest = max((p["ids"] for p in ref["prompts"]), key=len)
    assert len(longest) > 3 * config.sliding_window
    changes = {
        "sliding_window_256": logit_change(out, longest, sliding_window=256),
        "query_pre_attn_scalar_16": logit_change(out, longest, query_pre_attn_scalar=16),
        "all_layers_full": logit_change(out, longest, layer_types=["full_attention"] * layers),
    }
    assert min(changes.values()) > 0.05, changes
    files = stored_tensors(out, "F16")
    assert not any("lm_head.weight" in names for names in files.values()), files
    write_reference(
        out,
        ref,
        {
            "dtype": "float16",
            "tie_word_embeddings": True,
            "vocab_size": config.vocab_size,
            "tokenizer_len": len(tok),
            "bos_token_id": ids["<bos>"],
            "eos_token_id": ids["<end_of_turn>"],
            "config_eos_token_id": ids["<eos>"],
            "generation_eos_token_ids": [ids["<eos>"], ids["<end_of_turn>"]],
            "special_token_ids": ids,
            "layer_types": config.layer_types,
            "sliding_window": config.sliding_window,
            "query_pre_attn_scalar": config.query_pre_attn_scalar,
            "embed_scale": HIDDEN**0.5,
            "max_logit_change_if": {k: round(v, 4) for k, v in changes.items()},
            "chat_template_in": "chat_template.jinja",
            "safetensors": files,
        },
    )


def main() -> None:
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    make_llama(root)
    make_qwen2(root)
    make_gemma3(root)


if __name__ == "__main__":
    main()
