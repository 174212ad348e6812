//! A Hugging Face directory's tokenizer: `tokenizer.json` runs in the `tokenizers` crate,
//! which is the reference implementation itself, so ids are Hugging Face's by
//! construction; `tokenizer_config.json` names the special tokens and carries the chat
//! template (or `chat_template.jinja` does); `generation_config.json` may add end tokens.
//!
//! Decoding stays byte-exact concatenation of token bytes (what streaming needs), with each
//! token's bytes read off its piece as the `tokenizer.json` decoder spells them: GPT-2's
//! byte alphabet, or SentencePiece's `▁` and `<0xXX>` byte-fallback tokens.

use std::path::Path;

use serde_json::Value;

use crate::spm::parse_byte_piece;
use crate::vocab::{PieceBytes, Vocab};
use crate::{Result, TokenType, TokenizerError, MAX_NFC_SHRINK};

const TOKENIZER_FILE: &str = "tokenizer.json";
const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
const SPECIAL_TOKENS_MAP_FILE: &str = "special_tokens_map.json";
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
const GENERATION_CONFIG_FILE: &str = "generation_config.json";
const MODEL_CONFIG_FILE: &str = "config.json";

/// `tokenizer.json` twice: once parsing special tokens written in text, once reading them
/// as plain text (`tokenizers` sets this per tokenizer, not per call).
#[derive(Clone)]
pub(crate) struct HfPipeline {
    parsing: tokenizers::Tokenizer,
    literal: tokenizers::Tokenizer,
    /// How many times fewer bytes the normalizer can leave of a text, when bounded: a
    /// text longer than the limit allows, even so, is refused before it is tokenized.
    max_shrink: Option<usize>,
}

impl std::fmt::Debug for HfPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfPipeline").finish_non_exhaustive()
    }
}

impl HfPipeline {
    /// The ids of `text` (no BOS/EOS), or [`TokenizerError::TooManyTokens`] past `limit`.
    pub fn encode(
        &self,
        vocab: &Vocab,
        text: &str,
        parse_special: bool,
        limit: usize,
    ) -> Result<Vec<u32>> {
        let too_many = || TokenizerError::TooManyTokens { limit };
        if let Some(shrink) = self.max_shrink {
            let max_bytes = limit
                .saturating_mul(vocab.longest_token_bytes())
                .saturating_mul(shrink);
            if text.len() > max_bytes && vocab.kept_bytes(text) > max_bytes {
                return Err(too_many());
            }
        }
        let pipeline = if parse_special {
            &self.parsing
        } else {
            &self.literal
        };
        let encoding = pipeline
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode {
                text: text.chars().take(80).collect(),
                message: e.to_string(),
            })?;
        let ids = encoding.get_ids();
        if ids.len() > limit {
            return Err(too_many());
        }
        Ok(ids.to_vec())
    }
}

/// What [`crate::Tokenizer::from_hf_dir`] assembles.
pub(crate) struct HfParts {
    pub vocab: Vocab,
    pub pipeline: HfPipeline,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// End-of-generation ids `generation_config.json` names.
    pub generation_eos: Vec<u32>,
    pub chat_template: Option<String>,
}

fn problem(path: &Path, reason: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::HfFile {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// A file's bytes, `None` if it does not exist.
fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(problem(path, e)),
    }
}

fn parse_json(path: &Path, bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| problem(path, format!("not valid JSON: {e}")))
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    read_optional(path)?
        .map(|bytes| parse_json(path, &bytes))
        .transpose()
}

pub(crate) fn load(dir: &Path) -> Result<HfParts> {
    let path = dir.join(TOKENIZER_FILE);
    let bytes = read_optional(&path)?.ok_or_else(|| {
        problem(
            dir,
            "has no tokenizer.json (pyramid reads Hugging Face's fast-tokenizer file)",
        )
    })?;
    let json = parse_json(&path, &bytes)?;
    let mut parsing = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
        problem(
            &path,
            format!("not a tokenizer the tokenizers crate reads: {e}"),
        )
    })?;
    // A saved truncation or padding setting would cut or pad prompts behind our back.
    parsing
        .with_truncation(None)
        .map_err(|e| problem(&path, e))?;
    parsing.with_padding(None);
    let mut literal = parsing.clone();
    literal.set_encode_special_tokens(true);

    let spelling = piece_spelling(&json).map_err(|reason| problem(&path, reason))?;
    let byte_fallback = json
        .pointer("/model/byte_fallback")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let model_vocab_size = read_json(&dir.join(MODEL_CONFIG_FILE))?
        .and_then(|c| c.get("vocab_size").and_then(Value::as_u64))
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    let vocab = vocabulary(&parsing, spelling, byte_fallback, model_vocab_size)?;

    let config_path = dir.join(TOKENIZER_CONFIG_FILE);
    let config = read_json(&config_path)?.unwrap_or(Value::Null);
    // Older directories name their special tokens only in special_tokens_map.json.
    let map_path = dir.join(SPECIAL_TOKENS_MAP_FILE);
    let map = read_json(&map_path)?.unwrap_or(Value::Null);
    let special = |key: &str| -> Result<Option<u32>> {
        let (path, text) = match special_token_text(config.get(key)) {
            Some(text) => (&config_path, text),
            None => match special_token_text(map.get(key)) {
                Some(text) => (&map_path, text),
                None => return Ok(None),
            },
        };
        parsing.token_to_id(text).map(Some).ok_or_else(|| {
            problem(
                path,
                format!("'{key}' is {text:?}, which is not a token of tokenizer.json"),
            )
        })
    };
    let mut bos_id = special("bos_token")?;
    let eos_id = special("eos_token")?;
    // Only ever used to pad, which pyramid does not do: an unknown one is no reason to fail.
    let pad_id = special("pad_token").ok().flatten();

    // What the post-processor adds around a text is what `add_special_tokens` means here;
    // a lone leading token no file names is the BOS.
    let around = parsing
        .encode("", true)
        .map_err(|e| problem(&path, e))?
        .get_ids()
        .to_vec();
    let (mut add_bos, mut add_eos) = match around.as_slice() {
        [] => (false, false),
        [a] if Some(*a) == bos_id => (true, false),
        [a] if Some(*a) == eos_id => (false, true),
        [a] if bos_id.is_none() => {
            bos_id = Some(*a);
            (true, false)
        }
        [a, b] if Some(*a) == bos_id && Some(*b) == eos_id => (true, true),
        other => {
            return Err(problem(
                &path,
                format!(
                    "its post-processor adds tokens {other:?} around a text, which are not \
                     the BOS/EOS tokenizer_config.json names"
                ),
            ))
        }
    };
    // transformers 4's Llama and Gemma fast tokenizers rebuild the post-processor from
    // these flags, the only ones that write them; where present they decide.
    if let Some(flag) = config.get("add_bos_token").and_then(Value::as_bool) {
        add_bos = flag && bos_id.is_some();
    }
    if let Some(flag) = config.get("add_eos_token").and_then(Value::as_bool) {
        add_eos = flag && eos_id.is_some();
    }

    let generation_eos = read_json(&dir.join(GENERATION_CONFIG_FILE))?
        .and_then(|g| g.get("eos_token_id").cloned())
        .map(|v| match v {
            Value::Array(ids) => ids.iter().filter_map(Value::as_u64).collect(),
            v => v.as_u64().into_iter().collect::<Vec<_>>(),
        })
        .unwrap_or_default()
        .into_iter()
        .filter_map(|id| u32::try_from(id).ok())
        .filter(|&id| vocab.contains(id))
        .collect();

    Ok(HfParts {
        vocab,
        pipeline: HfPipeline {
            parsing,
            literal,
            max_shrink: keeps_every_byte(&json)
                .then(|| normalizer_shrink(json.get("normalizer").unwrap_or(&Value::Null)))
                .flatten(),
        },
        bos_id,
        eos_id,
        pad_id,
        add_bos,
        add_eos,
        generation_eos,
        chat_template: chat_template(dir, &config, &config_path)?,
    })
}

/// A special token in `tokenizer_config.json`: its text, or an added-token object's
/// `content`.
fn special_token_text(value: Option<&Value>) -> Option<&str> {
    match value? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// `chat_template.jinja` if present, else `tokenizer_config.json`'s `chat_template` (a
/// string, or named templates of which `default` is the one transformers uses).
fn chat_template(dir: &Path, config: &Value, config_path: &Path) -> Result<Option<String>> {
    let file = dir.join(CHAT_TEMPLATE_FILE);
    match std::fs::read_to_string(&file) {
        Ok(source) => return Ok(Some(source)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(problem(&file, e)),
    }
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(named)) => Ok(named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(str::to_owned)),
        Some(other) => Err(problem(
            config_path,
            format!("'chat_template' is {other}, not a template"),
        )),
    }
}

/// How the decoder spells bytes in pieces; decoders this crate cannot reproduce token by
/// token are refused.
fn piece_spelling(json: &Value) -> std::result::Result<PieceBytes, String> {
    let decoder = json.get("decoder").unwrap_or(&Value::Null);
    let steps: Vec<&Value> = match decoder.get("type").and_then(Value::as_str) {
        Some("Sequence") => decoder
            .get("decoders")
            .and_then(Value::as_array)
            .map(|d| d.iter().collect())
            .unwrap_or_default(),
        Some(_) => vec![decoder],
        None => Vec::new(),
    };
    fn kind(step: &Value) -> &str {
        step.get("type").and_then(Value::as_str).unwrap_or("")
    }
    let strips_first_space = steps.iter().any(|s| match kind(s) {
        "Strip" => s.get("start").and_then(Value::as_u64).unwrap_or(0) > 0,
        "Metaspace" => s.get("prepend_scheme").and_then(Value::as_str) != Some("never"),
        _ => false,
    });
    if strips_first_space {
        return Err(
            "its decoder drops the space that starts a text (Llama 2 / Mistral style), \
             which decoding token by token cannot reproduce yet"
                .to_string(),
        );
    }
    if steps.iter().any(|s| kind(s) == "ByteLevel") {
        return Ok(PieceBytes::ByteLevel);
    }
    let spm = steps.iter().any(|s| {
        kind(s) == "ByteFallback"
            || kind(s) == "Metaspace"
            || (kind(s) == "Replace"
                && s.pointer("/pattern/String").and_then(Value::as_str) == Some("\u{2581}"))
    });
    if spm {
        return Ok(PieceBytes::SentencePiece);
    }
    Err(format!(
        "its decoder {decoder} is neither byte-level nor SentencePiece-style, the two \
         pyramid decodes"
    ))
}

/// Every id the tokenizer knows, with added tokens typed as control (`special`) or
/// user-defined, byte-fallback pieces as bytes; ids up to the model's vocabulary size
/// that no token has are unused (and decode to nothing, as in Hugging Face).
fn vocabulary(
    tokenizer: &tokenizers::Tokenizer,
    spelling: PieceBytes,
    byte_fallback: bool,
    model_vocab_size: usize,
) -> Result<Vocab> {
    let by_piece = tokenizer.get_vocab(true);
    let n_vocab = by_piece
        .values()
        .map(|&id| id as usize + 1)
        .max()
        .unwrap_or(0)
        .max(model_vocab_size);
    // Ids (or a model vocabulary) far past the tokens there are would size the table from
    // a corrupt number.
    let plausible = by_piece.len().saturating_mul(2).saturating_add(1 << 16);
    if n_vocab > plausible {
        return Err(TokenizerError::BadVocabSize(n_vocab));
    }
    let mut pieces = vec![String::new(); n_vocab];
    let mut types = vec![TokenType::Unused; n_vocab];
    for (piece, id) in by_piece {
        let i = id as usize;
        types[i] = if byte_fallback && parse_byte_piece(&piece).is_some() {
            TokenType::Byte
        } else {
            TokenType::Normal
        };
        pieces[i] = piece;
    }
    for (id, token) in tokenizer.get_added_tokens_decoder() {
        let i = id as usize;
        if i < n_vocab {
            types[i] = if token.special {
                TokenType::Control
            } else {
                TokenType::UserDefined
            };
            pieces[i] = token.content;
        }
    }
    Vocab::from_parts(pieces, types, spelling)
}

/// Whether every byte of text that has a token of its own reaches the model: no
/// pre-tokenizer that removes text (whitespace splitters, `Removed` splits) and no model
/// that fuses unknown characters into one token. Only then does a text's length bound its
/// token count from below.
fn keeps_every_byte(json: &Value) -> bool {
    fn drops(step: &Value) -> bool {
        match step.get("type").and_then(Value::as_str) {
            None | Some("ByteLevel" | "Digits" | "Metaspace" | "UnicodeScripts") => false,
            Some("Sequence") => step
                .get("pretokenizers")
                .and_then(Value::as_array)
                .is_none_or(|steps| steps.iter().any(drops)),
            Some("Split" | "Punctuation") => {
                step.get("behavior").and_then(Value::as_str) == Some("Removed")
            }
            Some(_) => true,
        }
    }
    let model = json.get("model").unwrap_or(&Value::Null);
    let bpe = model.get("type").and_then(Value::as_str) == Some("BPE");
    let flag = |key: &str| model.get(key).and_then(Value::as_bool).unwrap_or(false);
    let fuses_unknowns = flag("fuse_unk") && !flag("byte_fallback");
    bpe && !fuses_unknowns && !drops(json.get("pre_tokenizer").unwrap_or(&Value::Null))
}

/// How many times shorter (in bytes) the normalizer can make a text, or `None` when it
/// can shorten it without bound (a replacement by nothing, stripping) or is unknown.
fn normalizer_shrink(normalizer: &Value) -> Option<usize> {
    match normalizer.get("type").and_then(Value::as_str) {
        None => Some(1),
        Some("Sequence") => normalizer
            .get("normalizers")?
            .as_array()?
            .iter()
            .try_fold(1usize, |acc, n| acc.checked_mul(normalizer_shrink(n)?)),
        Some("NFC" | "NFKC" | "NFD" | "NFKD" | "Lowercase") => Some(MAX_NFC_SHRINK),
        Some("Prepend") => Some(1),
        Some("Replace") => {
            let pattern = normalizer.pointer("/pattern/String")?.as_str()?;
            let content = normalizer.get("content")?.as_str()?;
            (!content.is_empty()).then(|| pattern.len().div_ceil(content.len()).max(1))
        }
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn normalizer_bounds_are_conservative() {
        assert_eq!(normalizer_shrink(&Value::Null), Some(1));
        let gemma = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
        assert_eq!(normalizer_shrink(&gemma), Some(1));
        let squeeze = json!({"type": "Replace", "pattern": {"String": "    "}, "content": "\t"});
        assert_eq!(normalizer_shrink(&squeeze), Some(4));
        let erase = json!({"type": "Replace", "pattern": {"String": "x"}, "content": ""});
        assert_eq!(normalizer_shrink(&erase), None);
        let seq = json!({"type": "Sequence", "normalizers": [{"type": "NFC"}, squeeze]});
        assert_eq!(normalizer_shrink(&seq), Some(4 * MAX_NFC_SHRINK));
        assert_eq!(normalizer_shrink(&json!({"type": "Strip"})), None);
    }

    #[test]
    fn only_pipelines_that_keep_every_byte_bound_the_length() {
        let bpe = json!({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "ByteLevel"}});
        assert!(keeps_every_byte(&bpe));
        let qwen = json!({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Sequence",
            "pretokenizers": [{"type": "Split", "behavior": "Isolated"}, {"type": "ByteLevel"}]}});
        assert!(keeps_every_byte(&qwen));
        let removed = json!({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Sequence",
            "pretokenizers": [{"type": "Split", "behavior": "Removed"}]}});
        assert!(!keeps_every_byte(&removed));
        let words = json!({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Whitespace"}});
        assert!(!keeps_every_byte(&words));
        let fused = json!({"model": {"type": "BPE", "fuse_unk": true}});
        assert!(!keeps_every_byte(&fused));
        let gemma = json!({"model": {"type": "BPE", "fuse_unk": true, "byte_fallback": true}});
        assert!(keeps_every_byte(&gemma));
        assert!(!keeps_every_byte(&json!({"model": {"type": "Unigram"}})));
    }

    #[test]
    fn decoders_choose_the_byte_spelling_or_are_refused() {
        let byte_level = json!({"decoder": {"type": "ByteLevel"}});
        assert_eq!(piece_spelling(&byte_level), Ok(PieceBytes::ByteLevel));
        let gemma = json!({"decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]}});
        assert_eq!(piece_spelling(&gemma), Ok(PieceBytes::SentencePiece));
        let llama2 = json!({"decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}});
        assert!(piece_spelling(&llama2).unwrap_err().contains("Llama 2"));
        assert!(piece_spelling(&json!({"decoder": {"type": "WordPiece"}})).is_err());
    }
}
