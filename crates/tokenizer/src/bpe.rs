//! Byte-level BPE on the `tokenizers` crate: vocabulary + merge ranks, regex pre-tokenizer.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab as BpeVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use crate::pretokenize::PreType;
use crate::{Result, TokenizerError};

/// A BPE tokenizer for text that holds no added tokens (those are split off beforehand).
#[derive(Clone)]
pub(crate) struct ByteLevelBpe {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for ByteLevelBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteLevelBpe").finish_non_exhaustive()
    }
}

impl ByteLevelBpe {
    /// `pieces[i]` is token `i`; `merges` are GGUF merge rules (`"Ġ t"`), highest priority first.
    pub fn new(pieces: &[String], merges: &[&str], pre: PreType) -> Result<ByteLevelBpe> {
        // Later duplicates win, as in llama.cpp's and Hugging Face's token-to-id maps.
        let vocab: BpeVocab = pieces
            .iter()
            .zip(0u32..)
            .map(|(piece, id)| (piece.clone(), id))
            .collect();
        let merges: Merges = merges
            .iter()
            .enumerate()
            .map(|(index, merge)| {
                merge
                    .split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| TokenizerError::BadMerge {
                        index,
                        merge: (*merge).to_owned(),
                    })
            })
            .collect::<Result<_>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre.ignore_merges())
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;

        let mut steps = Vec::with_capacity(pre.regexes().len() + 1);
        for pattern in pre.regexes() {
            let split = Split::new(
                SplitPattern::Regex((*pattern).to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::Build(format!("regex {pattern:?}: {e}")))?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        // The regexes above did the word splitting; ByteLevel only maps bytes to characters.
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(steps)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        if pre.normalizes_to_nfc() {
            inner.with_normalizer(Some(tokenizers::normalizers::unicode::NFC));
        }
        Ok(ByteLevelBpe { inner })
    }

    /// Appends the ids of `text` (which must hold no added tokens) to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode {
                text: text.to_owned(),
                message: e.to_string(),
            })?;
        out.extend_from_slice(encoding.get_ids());
        Ok(())
    }

    /// The `tokenizers` crate's own decoding, kept as an oracle for the table-driven decoder.
    #[cfg(test)]
    pub fn decode_reference(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_default()
    }

    /// The words the pre-tokenizer cuts `text` into, as plain text.
    #[cfg(test)]
    pub fn words(&self, text: &str) -> Vec<String> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let mut pre = PreTokenizedString::from(text);
        let pre_tokenizer = self.inner.get_pre_tokenizer().expect("set in new()");
        pre_tokenizer.pre_tokenize(&mut pre).unwrap();
        pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(word, _, _)| {
                let bytes = crate::vocab::byte_level_decode(word).unwrap();
                String::from_utf8(bytes).unwrap()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::byte_level_encode;

    /// A toy vocabulary: every byte, plus "Ġt", "he", "Ġthe" via two merges.
    fn toy() -> (Vec<String>, ByteLevelBpe) {
        let mut pieces: Vec<String> = (0..=255u8).map(|b| byte_level_encode(&[b])).collect();
        pieces.extend(["Ġt", "he", "Ġthe"].map(String::from));
        let bpe = ByteLevelBpe::new(&pieces, &["Ġ t", "h e", "Ġt he"], PreType::Gpt2).unwrap();
        (pieces, bpe)
    }

    #[test]
    fn merges_apply_by_rank_within_words() {
        let (pieces, bpe) = toy();
        let mut ids = Vec::new();
        bpe.encode_into("the the", &mut ids).unwrap();
        let got: Vec<&str> = ids.iter().map(|&i| pieces[i as usize].as_str()).collect();
        assert_eq!(got, ["t", "he", "Ġthe"]);
        assert_eq!(bpe.decode_reference(&ids), "the the");
    }

    /// How each pre-type cuts text into words, as llama.cpp's regexes for it do.
    #[test]
    fn pre_types_split_words_like_llama_cpp() {
        let pieces: Vec<String> = (0..=255u8).map(|b| byte_level_encode(&[b])).collect();
        let words = |pre: PreType, text: &str| -> Vec<String> {
            ByteLevelBpe::new(&pieces, &[], pre).unwrap().words(text)
        };
        let text = "Hello  world 12345 it's\n\n  x";
        assert_eq!(
            words(PreType::Gpt2, text),
            ["Hello", " ", " world", " 12345", " it", "'s", "\n\n ", " x"]
        );
        assert_eq!(
            words(PreType::Smollm, text),
            ["Hello", " ", " world", " ", "1", "2", "3", "4", "5", " it", "'s", "\n\n ", " x"]
        );
        assert_eq!(
            words(PreType::Qwen2, text),
            [
                "Hello", " ", " world", " ", "1", "2", "3", "4", "5", " it", "'s", "\n\n", " ",
                " x"
            ]
        );
        assert_eq!(
            words(PreType::Llama3, text),
            ["Hello", " ", " world", " ", "123", "45", " it", "'s", "\n\n", " ", " x"]
        );
        assert_eq!(words(PreType::Qwen2, "IT'S"), ["IT", "'S"]);
        assert_eq!(words(PreType::Gpt2, "IT'S"), ["IT", "'", "S"]);
        assert_eq!(words(PreType::Default, "1234+x"), ["123", "4", "+", "x"]);
    }

    #[test]
    fn malformed_merge_is_an_error() {
        let pieces: Vec<String> = (0..=255u8).map(|b| byte_level_encode(&[b])).collect();
        let err = ByteLevelBpe::new(&pieces, &["nospace"], PreType::Gpt2).unwrap_err();
        assert!(
            matches!(err, TokenizerError::BadMerge { index: 0, .. }),
            "{err}"
        );
    }
}
