//! Pre-tokenizer rules: how text is cut into words before BPE merges run inside each word.
//!
//! The rules are keyed by `tokenizer.ggml.pre`, the name llama.cpp's converter writes for the
//! pre-tokenizer it recognised in the original `tokenizer.json`. Each rule is a list of regexes
//! applied in order; every regex splits each current piece into matches and the gaps between
//! them, all kept (Hugging Face's `Split` with the `Isolated` behaviour). The patterns are the
//! ones llama.cpp's `llama-vocab.cpp` uses for these pre-types.

/// GPT-2's word regex (without the trailing `|\s+`, which only changes how a lone
/// whitespace character is grouped, and isolated splitting keeps gaps anyway).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Qwen2's regex: contractions in either case, a letter run with one leading non-letter,
/// single digits, punctuation runs with their newlines, then whitespace.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's regex: as Qwen2's, but numbers in groups of up to three digits.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A named set of pre-tokenizer regexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreType {
    /// llama.cpp's fallback for `default` or a missing `tokenizer.ggml.pre`.
    Default,
    /// GPT-2 and the many vocabularies that reuse its regex.
    Gpt2,
    /// Llama 3 (`llama-bpe`); also turns on `ignore_merges`.
    Llama3,
    /// Qwen2 / Qwen2.5.
    Qwen2,
    /// SmolLM and StarCoder-style vocabularies: every digit alone, then GPT-2's regex.
    ///
    /// The digit split comes first, as in these models' `tokenizer.json`
    /// (`Sequence[Digits(individual_digits), ByteLevel]`) and in llama.cpp, so a whitespace
    /// run in front of a digit ends its piece and stays one word: `"list:\n\n1."` gives
    /// `"\n\n"` as one token. transformers' GGUF loader has no digit split for `smollm` and
    /// cuts that run in two; it is not the reference (issue 19).
    Smollm,
}

impl PreType {
    /// The rule for a `tokenizer.ggml.pre` value, or `None` for a name this crate does not know.
    pub fn from_name(name: &str) -> Option<PreType> {
        Some(match name {
            "default" | "" => PreType::Default,
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" => PreType::Gpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" => {
                PreType::Llama3
            }
            "qwen2" | "stablelm2" | "deepseek-r1-qwen" => PreType::Qwen2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" => {
                PreType::Smollm
            }
            _ => return None,
        })
    }

    /// The rule for `tokenizer.ggml.pre`: missing means `Default`, and an unknown name falls
    /// back to GPT-2's regex, which is right for most byte-level vocabularies in the
    /// leading-space-word style (llama.cpp refuses such files instead).
    pub fn from_gguf_name(name: Option<&str>) -> PreType {
        match name {
            None => PreType::Default,
            Some(name) => PreType::from_name(name).unwrap_or(PreType::Gpt2),
        }
    }

    /// The regexes applied in order, each splitting the pieces the previous one left.
    pub fn regexes(self) -> &'static [&'static str] {
        match self {
            PreType::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            PreType::Gpt2 => &[GPT2],
            PreType::Llama3 => &[LLAMA3],
            PreType::Qwen2 => &[QWEN2],
            PreType::Smollm => &[r"\p{N}", GPT2],
        }
    }

    /// Llama 3 looks a whole word up in the vocabulary before merging, so words the merge
    /// table cannot reach still map to their single token.
    pub fn ignore_merges(self) -> bool {
        self == PreType::Llama3
    }

    /// Qwen2's Hugging Face tokenizer composes text to Unicode NFC before splitting (llama.cpp
    /// does not); we follow the reference so decomposed input gets the reference's ids.
    pub fn normalizes_to_nfc(self) -> bool {
        self == PreType::Qwen2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_and_unknown_falls_back_to_gpt2() {
        assert_eq!(PreType::from_name("smollm"), Some(PreType::Smollm));
        assert_eq!(PreType::from_name("qwen2"), Some(PreType::Qwen2));
        assert_eq!(PreType::from_name("llama-bpe"), Some(PreType::Llama3));
        assert_eq!(PreType::from_name("gpt2"), Some(PreType::Gpt2));
        assert_eq!(PreType::from_name("no-such-pre"), None);
        assert_eq!(PreType::from_gguf_name(Some("no-such-pre")), PreType::Gpt2);
        assert_eq!(PreType::from_gguf_name(None), PreType::Default);
    }
}
