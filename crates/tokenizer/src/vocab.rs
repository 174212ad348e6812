//! The token table read from GGUF metadata: pieces, token types, and each token's bytes.

use pyramid_gguf::Metadata;

use crate::spm::{parse_byte_piece, SPACE_MARK};
use crate::{Result, TokenizerError};

pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
pub(crate) const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub(crate) const KEY_SCORES: &str = "tokenizer.ggml.scores";
pub(crate) const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub(crate) const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
pub(crate) const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
pub(crate) const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
pub(crate) const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
pub(crate) const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
pub(crate) const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub(crate) const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
pub(crate) const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
pub(crate) const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// What a token is, as `tokenizer.ggml.token_type` says (llama.cpp's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 0, or any number this crate does not know; treated like `Normal`.
    Undefined,
    /// 1: an ordinary BPE piece.
    Normal,
    /// 2: the unknown-token placeholder.
    Unknown,
    /// 3: a control token such as `<|im_start|>`, matched in text only when asked to.
    Control,
    /// 4: a user-defined added token, always matched in text as one token.
    UserDefined,
    /// 5: a padding slot that no text produces.
    Unused,
    /// 6: a raw byte token (SentencePiece vocabularies).
    Byte,
}

impl TokenType {
    pub fn from_gguf(value: i64) -> TokenType {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Added tokens bypass BPE: their text is matched whole and rendered verbatim.
    pub fn is_added(self) -> bool {
        matches!(self, TokenType::Control | TokenType::UserDefined)
    }
}

/// GPT-2's byte-to-character map as code points: printable Latin-1 bytes map to themselves,
/// the other 68 bytes to U+0100.. in byte order, so every byte has a visible character.
const BYTE_TO_CHAR: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut n_shifted = 0u16;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        table[b] = if printable {
            b as u16
        } else {
            n_shifted += 1;
            255 + n_shifted
        };
        b += 1;
    }
    table
};

/// One past the largest code point in `BYTE_TO_CHAR` (U+0100 + 68).
const N_BYTE_CHARS: usize = 0x144;

/// The inverse of `BYTE_TO_CHAR`; -1 marks a character that stands for no byte.
const CHAR_TO_BYTE: [i16; N_BYTE_CHARS] = {
    let mut table = [-1i16; N_BYTE_CHARS];
    let mut b = 0usize;
    while b < 256 {
        table[BYTE_TO_CHAR[b] as usize] = b as i16;
        b += 1;
    }
    table
};

/// The byte a byte-level character stands for.
fn byte_of_char(c: char) -> Option<u8> {
    let b = *CHAR_TO_BYTE.get(c as usize)?;
    u8::try_from(b).ok()
}

/// The bytes of a byte-level piece such as `Ġthe`, or `None` if some character is not in
/// GPT-2's alphabet (Hugging Face's decoder then emits such a piece verbatim).
pub(crate) fn byte_level_decode(piece: &str) -> Option<Vec<u8>> {
    piece.chars().map(byte_of_char).collect()
}

/// The byte-level piece for raw bytes (the inverse of [`byte_level_decode`]).
#[cfg(test)]
pub(crate) fn byte_level_encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| char::from_u32(u32::from(BYTE_TO_CHAR[usize::from(b)])).unwrap_or('\u{FFFD}'))
        .collect()
}

/// The token table. Invariant: `pieces`, `types` and the byte spans have one entry per token,
/// and their count fits in `u32`.
#[derive(Debug, Clone)]
pub(crate) struct Vocab {
    pub pieces: Vec<String>,
    pub types: Vec<TokenType>,
    /// All tokens' bytes back to back; token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    /// Bytes of the longest token (at least 1): no token covers more input than this.
    longest: usize,
    /// Which bytes have a token of their own: byte-level BPE drops the others from text,
    /// as Hugging Face's tokenizer does (SmolLM2 lacks eight); SentencePiece vocabularies
    /// have all 256 as `<0xXX>` tokens.
    byte_has_token: [bool; 256],
}

/// How a vocabulary's pieces spell their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PieceBytes {
    /// GPT-2's byte-to-character alphabet (`tokenizer.ggml.model = gpt2`).
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xXX>` byte tokens (`tokenizer.ggml.model = llama`).
    SentencePiece,
}

impl Vocab {
    pub fn from_gguf(md: &Metadata, spelling: PieceBytes) -> Result<Vocab> {
        let pieces: Vec<String> = md
            .get_str_array(KEY_TOKENS)?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let n_vocab = pieces.len();
        if n_vocab == 0 || u32::try_from(n_vocab).is_err() {
            return Err(TokenizerError::BadVocabSize(n_vocab));
        }
        let types = match md.opt(KEY_TOKEN_TYPE, Metadata::get_i64_array)? {
            Some(raw) => {
                check_len(KEY_TOKEN_TYPE, raw.len(), n_vocab)?;
                raw.into_iter().map(TokenType::from_gguf).collect()
            }
            None => vec![TokenType::Normal; n_vocab],
        };
        Self::from_parts(pieces, types, spelling)
    }

    /// A vocabulary of `pieces` with their `types`, one each, spelled as `spelling` says.
    pub fn from_parts(
        pieces: Vec<String>,
        types: Vec<TokenType>,
        spelling: PieceBytes,
    ) -> Result<Vocab> {
        let n_vocab = pieces.len();
        if n_vocab == 0 || u32::try_from(n_vocab).is_err() {
            return Err(TokenizerError::BadVocabSize(n_vocab));
        }
        check_len(KEY_TOKEN_TYPE, types.len(), n_vocab)?;
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n_vocab + 1);
        offsets.push(0);
        for (piece, ty) in pieces.iter().zip(&types) {
            // Added tokens are stored as the text they stand for.
            if ty.is_added() {
                bytes.extend_from_slice(piece.as_bytes());
            } else {
                match spelling {
                    PieceBytes::ByteLevel => match byte_level_decode(piece) {
                        Some(decoded) => bytes.extend_from_slice(&decoded),
                        None => bytes.extend_from_slice(piece.as_bytes()),
                    },
                    PieceBytes::SentencePiece => match parse_byte_piece(piece) {
                        Some(byte) if *ty == TokenType::Byte => bytes.push(byte),
                        _ => {
                            let text = piece.replace(SPACE_MARK, " ");
                            bytes.extend_from_slice(text.as_bytes());
                        }
                    },
                }
            }
            offsets.push(bytes.len());
        }
        let longest = offsets
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
            .max(1);
        let mut single = [false; 256];
        for w in offsets.windows(2).filter(|w| w[1] - w[0] == 1) {
            single[usize::from(bytes[w[0]])] = true;
        }
        Ok(Vocab {
            pieces,
            types,
            bytes,
            offsets,
            longest,
            byte_has_token: single,
        })
    }

    /// `tokenizer.ggml.scores`, one per token; absent is an error only where they matter.
    pub fn scores(&self, md: &Metadata) -> Result<Option<Vec<f32>>> {
        let Some(scores) = md.opt(KEY_SCORES, Metadata::get_f32_array)? else {
            return Ok(None);
        };
        check_len(KEY_SCORES, scores.len(), self.n_vocab())?;
        Ok(Some(scores))
    }

    pub fn n_vocab(&self) -> usize {
        self.pieces.len()
    }

    pub fn longest_token_bytes(&self) -> usize {
        self.longest
    }

    /// The bytes of `text` that reach some token (all of them, for most vocabularies).
    pub fn kept_bytes(&self, text: &str) -> usize {
        text.bytes()
            .filter(|&b| self.byte_has_token[usize::from(b)])
            .count()
    }

    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let idx = usize::try_from(id).ok()?;
        let start = *self.offsets.get(idx)?;
        let end = *self.offsets.get(idx + 1)?;
        self.bytes.get(start..end)
    }

    pub fn contains(&self, id: u32) -> bool {
        usize::try_from(id).is_ok_and(|idx| idx < self.n_vocab())
    }

    /// The first token whose piece is `text` and whose type is an added one.
    pub fn find_added(&self, text: &str) -> Option<u32> {
        let idx = self
            .pieces
            .iter()
            .zip(&self.types)
            .position(|(piece, ty)| ty.is_added() && piece == text)?;
        u32::try_from(idx).ok()
    }

    /// A special-token id from metadata: absent or negative (some converters write -1) is
    /// `None`; one past the vocabulary is an error.
    pub fn special_id(&self, md: &Metadata, key: &'static str) -> Result<Option<u32>> {
        let Some(value) = md.get(key) else {
            return Ok(None);
        };
        let id = value.as_integer().ok_or_else(|| {
            TokenizerError::Metadata(pyramid_gguf::GgufError::WrongType {
                key: key.to_string(),
                expected: "integer",
                found: value.type_name(),
            })
        })?;
        if id < 0 {
            return Ok(None);
        }
        match u32::try_from(id) {
            Ok(id) if self.contains(id) => Ok(Some(id)),
            _ => Err(TokenizerError::SpecialIdOutOfRange {
                key,
                id,
                n_vocab: self.n_vocab(),
            }),
        }
    }
}

/// An optional string key (`Metadata::opt` cannot return borrowed values).
pub(crate) fn opt_str<'m>(md: &'m Metadata, key: &str) -> Result<Option<&'m str>> {
    if md.get(key).is_none() {
        return Ok(None);
    }
    Ok(Some(md.get_str(key)?))
}

fn check_len(key: &'static str, len: usize, n_vocab: usize) -> Result<()> {
    if len == n_vocab {
        Ok(())
    } else {
        Err(TokenizerError::LengthMismatch { key, len, n_vocab })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let piece = byte_level_encode(&all);
        assert_eq!(piece.chars().count(), 256);
        assert_eq!(byte_level_decode(&piece), Some(all));
        assert_eq!(byte_level_encode(b" "), "\u{120}"); // 'Ġ'
        assert_eq!(byte_level_encode(b"\n"), "\u{10A}"); // 'Ċ'
        assert_eq!(byte_level_decode("hello"), Some(b"hello".to_vec()));
        assert_eq!(byte_level_decode("a b"), None); // a literal space is not in the alphabet
    }
}
