//! Text to token ids and back, as a GGUF model file or a Hugging Face directory describes
//! its vocabulary.
//!
//! - [`Tokenizer`]: built from GGUF metadata (`tokenizer.ggml.*`), or from a Hugging Face
//!   directory's `tokenizer.json` (run by the `tokenizers` crate itself, see `hf`). Byte-level BPE
//!   (`tokenizer.ggml.model = gpt2`) on the `tokenizers` crate, with the pre-tokenizer regexes
//!   of the `tokenizer.ggml.pre` type ([`PreType`]), or SentencePiece
//!   (`tokenizer.ggml.model = llama`: merges by score, byte fallback). Control and
//!   user-defined tokens are *added tokens*: found in the text before the model runs and
//!   rendered verbatim when decoding.
//! - [`StreamDecoder`]: incremental decoding that only ever emits whole UTF-8.
//! - [`ChatTemplate`]: the model's Jinja chat template, rendered like `transformers` does.
//!
//! Invariants: every id a [`Tokenizer`] returns is `< n_vocab()`; every id it accepts is
//! checked, so an out-of-range id is a [`TokenizerError`], never a panic. Decoding is
//! byte-exact: the bytes of all tokens, concatenated, then invalid UTF-8 replaced by U+FFFD.

mod bpe;
mod chat;
mod chunks;
mod error;
mod hf;
mod pretokenize;
mod pyjson;
mod special;
mod spm;
mod stream;
mod strftime;
mod vocab;

use pyramid_gguf::Metadata;

pub use chat::{ChatMessage, ChatTemplate, ToolCall};
pub use error::{Result, TokenizerError};
pub use pretokenize::PreType;
pub use pyjson::python_json;
pub use stream::StreamDecoder;
pub use vocab::TokenType;

use bpe::ByteLevelBpe;
use special::{AddedMatcher, Segment};
use spm::SentencePiece;
use vocab::{
    opt_str, PieceBytes, Vocab, KEY_ADD_BOS, KEY_ADD_EOS, KEY_ADD_SPACE_PREFIX, KEY_BOS,
    KEY_CHAT_TEMPLATE, KEY_EOM, KEY_EOS, KEY_EOT, KEY_MERGES, KEY_MODEL, KEY_PAD, KEY_PRE, KEY_UNK,
};

/// Texts that end a turn in common chat formats; any of them present as an added token stops
/// generation even when the metadata names a different EOS (models emit both).
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    // Phi-3.5 and Phi-4-mini end a turn with it; their GGUF files name `<|endoftext|>` as
    // EOS (llama.cpp ends on it by the same rule).
    "<|end|>",
];

/// Added tokens that mark images, video or audio in the families pyramid runs. Files often
/// type them as ordinary added tokens (Gemma 3's GGUF: user-defined, like its whitespace
/// runs and HTML tags), so they are known by their text, as end-of-turn tokens are.
const MEDIA_MARKER_TEXTS: &[&str] = &[
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
    "<start_of_audio>",
    "<end_of_audio>",
    "<audio_soft_token>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|image|>",
];

/// How many times longer than its NFC composition a text can be, in bytes: a Hangul
/// syllable written as three jamo (9 bytes) composes to one (3 bytes).
pub(crate) const MAX_NFC_SHRINK: usize = 4;

/// The ids that end a reply: `named` ones (EOS and the like) and every added token whose
/// text ends a turn in a common chat format, sorted and deduplicated.
fn end_of_generation_ids(vocab: &Vocab, named: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut ids: Vec<u32> = named
        .chain(
            END_OF_GENERATION_TEXTS
                .iter()
                .filter_map(|text| vocab.find_added(text)),
        )
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// How plain text (added tokens already split off) becomes pieces.
#[derive(Debug, Clone)]
enum PieceModel {
    ByteLevel(Box<ByteLevelBpe>),
    SentencePiece {
        model: Box<SentencePiece>,
        /// `tokenizer.ggml.add_space_prefix`: a text that starts the input, or follows an
        /// added token, is tokenized as if it began with a space (llama.cpp's rule).
        add_space_prefix: bool,
    },
    /// A Hugging Face `tokenizer.json`, whole: it splits off its own added tokens.
    HuggingFace(Box<hf::HfPipeline>),
}

/// A model's tokenizer. Cheap to share behind an `Arc`: every method takes `&self`.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    vocab: Vocab,
    model: PieceModel,
    added: AddedMatcher,
    pre_type: PreType,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eot_id: Option<u32>,
    eom_id: Option<u32>,
    pad_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// Sorted, deduplicated ids for [`Tokenizer::is_end_of_generation`].
    eog_ids: Vec<u32>,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Reads the vocabulary and its settings from GGUF metadata.
    ///
    /// `add_bos_token`/`add_eos_token` default as llama.cpp's do when absent: BOS for
    /// SentencePiece, neither for byte-level BPE. An unknown `tokenizer.ggml.pre` falls
    /// back to GPT-2's regex.
    pub fn from_gguf(md: &Metadata) -> Result<Tokenizer> {
        let kind = md.get_str(KEY_MODEL)?;
        let pre_type = PreType::from_gguf_name(opt_str(md, KEY_PRE)?);
        let (vocab, model) = match kind {
            "gpt2" => {
                let vocab = Vocab::from_gguf(md, PieceBytes::ByteLevel)?;
                vocab.scores(md)?;
                let merges = md.get_str_array(KEY_MERGES)?;
                let bpe = ByteLevelBpe::new(&vocab.pieces, &merges, pre_type)?;
                (vocab, PieceModel::ByteLevel(Box::new(bpe)))
            }
            "llama" => {
                let vocab = Vocab::from_gguf(md, PieceBytes::SentencePiece)?;
                let scores = vocab.scores(md)?.ok_or(TokenizerError::MissingScores)?;
                let unk_id = vocab.special_id(md, KEY_UNK)?;
                let model = Box::new(SentencePiece::new(&vocab, scores, unk_id));
                let add_space_prefix = md
                    .opt(KEY_ADD_SPACE_PREFIX, Metadata::get_bool)?
                    .unwrap_or(true);
                let model = PieceModel::SentencePiece {
                    model,
                    add_space_prefix,
                };
                (vocab, model)
            }
            other => return Err(TokenizerError::Unsupported(other.to_owned())),
        };
        let added = AddedMatcher::new(&vocab);

        let bos_id = vocab.special_id(md, KEY_BOS)?;
        let eos_id = vocab.special_id(md, KEY_EOS)?;
        let eot_id = vocab.special_id(md, KEY_EOT)?;
        let eom_id = vocab.special_id(md, KEY_EOM)?;
        let pad_id = vocab.special_id(md, KEY_PAD)?;
        // Byte-level BPE covers every byte and never emits an unknown token; its id is
        // still checked, since one out of range means the header is corrupt.
        vocab.special_id(md, KEY_UNK)?;
        let sentence_piece = matches!(model, PieceModel::SentencePiece { .. });
        let add_bos = md
            .opt(KEY_ADD_BOS, Metadata::get_bool)?
            .unwrap_or(sentence_piece);
        let add_eos = md.opt(KEY_ADD_EOS, Metadata::get_bool)?.unwrap_or(false);
        let chat_template = opt_str(md, KEY_CHAT_TEMPLATE)?.map(str::to_owned);

        let eog_ids = end_of_generation_ids(&vocab, [eos_id, eot_id, eom_id].into_iter().flatten());

        Ok(Tokenizer {
            vocab,
            model,
            added,
            pre_type,
            bos_id,
            eos_id,
            eot_id,
            eom_id,
            pad_id,
            add_bos,
            add_eos,
            eog_ids,
            chat_template,
        })
    }

    /// Reads a Hugging Face model directory's `tokenizer.json`, `tokenizer_config.json`
    /// (special tokens, chat template), `chat_template.jinja` and `generation_config.json`
    /// (end tokens). BOS/EOS are added to prompts exactly when `tokenizer.json`'s
    /// post-processor adds them.
    pub fn from_hf_dir(dir: &std::path::Path) -> Result<Tokenizer> {
        let parts = hf::load(dir)?;
        let added = AddedMatcher::new(&parts.vocab);
        let vocab = parts.vocab;
        let eog_ids =
            end_of_generation_ids(&vocab, parts.eos_id.into_iter().chain(parts.generation_eos));
        Ok(Tokenizer {
            vocab,
            model: PieceModel::HuggingFace(Box::new(parts.pipeline)),
            added,
            pre_type: PreType::Default,
            bos_id: parts.bos_id,
            eos_id: parts.eos_id,
            eot_id: None,
            eom_id: None,
            pad_id: parts.pad_id,
            add_bos: parts.add_bos,
            add_eos: parts.add_eos,
            eog_ids,
            chat_template: parts.chat_template,
        })
    }

    /// Tokenizes `text` without adding BOS/EOS. With `parse_special`, control tokens written
    /// in the text (`<|im_start|>`) become their single id; without, they are tokenized as
    /// ordinary text. User-defined tokens are always matched.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_within(text, parse_special, usize::MAX)
    }

    /// As [`Tokenizer::encode`], but stops with [`TokenizerError::TooManyTokens`] as soon
    /// as the text is known to give more than `limit` tokens: a prompt far beyond a
    /// model's context costs a few chunks of work, not its whole length.
    pub fn encode_within(&self, text: &str, parse_special: bool, limit: usize) -> Result<Vec<u32>> {
        self.encode_in_pieces(text, parse_special, limit, chunks::CHUNK_BYTES)
    }

    /// [`Tokenizer::encode_within`] with pieces of `piece_bytes` instead of
    /// [`chunks::CHUNK_BYTES`]: for tests and fuzzing, which check that any piece size
    /// gives the same ids.
    #[doc(hidden)]
    pub fn encode_in_pieces(
        &self,
        text: &str,
        parse_special: bool,
        limit: usize,
        piece_bytes: usize,
    ) -> Result<Vec<u32>> {
        if let PieceModel::HuggingFace(pipeline) = &self.model {
            return pipeline.encode(&self.vocab, text, parse_special, limit);
        }
        let too_many = || TokenizerError::TooManyTokens { limit };
        let mut ids = Vec::new();
        let mut follows_added = true;
        for segment in self.added.split(text, parse_special) {
            match segment {
                Segment::Added(id) => {
                    ids.push(id);
                    follows_added = true;
                }
                Segment::Text(plain) => {
                    // No token covers more bytes than the longest piece: beyond this, the
                    // limit is exceeded whatever the text says. Only bytes that have a
                    // token count (BPE drops the others), with room for NFC's shrinking.
                    let room = limit.saturating_sub(ids.len());
                    let max_bytes = room
                        .saturating_mul(self.vocab.longest_token_bytes())
                        .saturating_mul(if self.pre_type.normalizes_to_nfc() {
                            MAX_NFC_SHRINK
                        } else {
                            1
                        });
                    if plain.len() > max_bytes && self.vocab.kept_bytes(plain) > max_bytes {
                        return Err(too_many());
                    }
                    match &self.model {
                        PieceModel::ByteLevel(bpe) => {
                            for piece in chunks::pieces(plain, piece_bytes) {
                                bpe.encode_into(piece, &mut ids)?;
                                if ids.len() > limit {
                                    return Err(too_many());
                                }
                            }
                        }
                        // Merges may cross any boundary: the text goes whole.
                        PieceModel::SentencePiece {
                            model,
                            add_space_prefix,
                        } => model.encode_into(plain, *add_space_prefix && follows_added, &mut ids),
                        PieceModel::HuggingFace(_) => unreachable!("encoded whole above"),
                    }
                    follows_added = false;
                }
            }
            if ids.len() > limit {
                return Err(too_many());
            }
        }
        Ok(ids)
    }

    /// Tokenizes a prompt as the model expects it: special tokens parsed, then BOS/EOS added
    /// exactly as `tokenizer.ggml.add_bos_token`/`add_eos_token` ask.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_prompt_within(text, usize::MAX)
    }

    /// As [`Tokenizer::encode_prompt`], stopping early past `limit` tokens (see
    /// [`Tokenizer::encode_within`]).
    pub fn encode_prompt_within(&self, text: &str, limit: usize) -> Result<Vec<u32>> {
        let bos = self.bos_id.filter(|_| self.add_bos);
        let eos = self.eos_id.filter(|_| self.add_eos);
        let added = usize::from(bos.is_some()) + usize::from(eos.is_some());
        let inner_limit = limit
            .checked_sub(added)
            .ok_or(TokenizerError::TooManyTokens { limit })?;
        let mut ids: Vec<u32> = bos.into_iter().collect();
        ids.extend(self.encode_within(text, true, inner_limit)?);
        ids.extend(eos);
        Ok(ids)
    }

    /// The text of `ids`, special tokens included as their text. Bytes that are not valid
    /// UTF-8 (a character cut off at the end) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes_checked(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes token `id` stands for (may be part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.vocab.token_bytes(id)
    }

    pub(crate) fn token_bytes_checked(&self, id: u32) -> Result<&[u8]> {
        self.vocab
            .token_bytes(id)
            .ok_or(TokenizerError::TokenOutOfRange {
                id,
                n_vocab: self.n_vocab(),
            })
    }

    /// The token as stored in the vocabulary, e.g. `Ġthe` for " the".
    pub fn token_piece(&self, id: u32) -> Option<&str> {
        self.vocab
            .pieces
            .get(usize::try_from(id).ok()?)
            .map(String::as_str)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.types.get(usize::try_from(id).ok()?).copied()
    }

    /// The id of an added (control or user-defined) token by its text, e.g. `<|im_end|>`.
    pub fn added_token_id(&self, text: &str) -> Option<u32> {
        self.vocab.find_added(text)
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.n_vocab()
    }

    pub fn pre_type(&self) -> PreType {
        self.pre_type
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    pub fn eot_id(&self) -> Option<u32> {
        self.eot_id
    }

    pub fn eom_id(&self) -> Option<u32> {
        self.eom_id
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether generating `id` ends the reply: EOS, EOT, EOM, or an end-of-turn token such as
    /// `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|end_of_text|>` present in the vocabulary.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.eog_ids.binary_search(&id).is_ok()
    }

    /// All ids for which [`Tokenizer::is_end_of_generation`] holds, ascending.
    pub fn end_of_generation_ids(&self) -> &[u32] {
        &self.eog_ids
    }

    /// Tokens a text-only reply never samples, ascending: the markers of images, video and
    /// audio (Gemma 3's `<start_of_image>`, Qwen's `<|vision_start|>`), and control,
    /// unknown and unused tokens that neither end a reply nor appear in the chat template
    /// (`<pad>`, `<unused12>`, fill-in-the-middle markers, ids the vocabulary leaves
    /// empty). A model sampling one would go on as if after an image it cannot see. Base Gemma 3 270M ranks `<start_of_image>` within 0.25 nats of its top
    /// token after "The old lighthouse at the top of the hill" (transformers on the same
    /// weights agrees), so sampling text must rule such tokens out, not merely hope.
    pub fn suppressed_ids(&self) -> Vec<u32> {
        let template = self.chat_template.as_deref().unwrap_or("");
        let mut ids: Vec<u32> = (0..self.n_vocab() as u32)
            .filter(|&id| {
                matches!(
                    self.token_type(id),
                    Some(TokenType::Control | TokenType::Unknown | TokenType::Unused)
                ) && !self.is_end_of_generation(id)
                    && self
                        .token_piece(id)
                        .is_none_or(|piece| piece.is_empty() || !template.contains(piece))
            })
            .chain(
                MEDIA_MARKER_TEXTS
                    .iter()
                    .filter_map(|text| self.vocab.find_added(text)),
            )
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Uses `source` as the chat template instead of the model's own (a model may have
    /// none); a template that does not parse is refused and the old one kept.
    pub fn set_chat_template(&mut self, source: String) -> Result<()> {
        let text = |id: Option<u32>| id.and_then(|id| self.token_piece(id)).unwrap_or("");
        ChatTemplate::new(&source, text(self.bos_id), text(self.eos_id))?;
        self.chat_template = Some(source);
        Ok(())
    }

    /// The Jinja source of `tokenizer.chat_template`, if the model has one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The model's chat template, with this vocabulary's BOS/EOS texts.
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        let source = self
            .chat_template
            .as_deref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        let text = |id: Option<u32>| id.and_then(|id| self.token_piece(id)).unwrap_or("");
        ChatTemplate::new(source, text(self.bos_id), text(self.eos_id))
    }

    /// Byte-level BPE's own decoding in the `tokenizers` crate (`None` for SentencePiece).
    #[cfg(test)]
    fn decode_reference(&self, ids: &[u32]) -> Option<String> {
        match &self.model {
            PieceModel::ByteLevel(bpe) => Some(bpe.decode_reference(ids)),
            PieceModel::SentencePiece { .. } | PieceModel::HuggingFace(_) => None,
        }
    }
}

#[cfg(test)]
mod tests;
