//! Prompt-lookup speculative decoding: drafts from the sequence's own tokens, verified
//! in one pass.
//!
//! Agents re-emit their context (a file with one line changed, JSON they were given, a
//! tool's arguments), so the tokens after the last few generated ones have often been
//! seen before. [`draft`] finds the most recent earlier occurrence of the longest suffix
//! (between [`SpeculativeConfig::min_ngram`] and `max_ngram` tokens) and proposes the
//! tokens that followed it; a request's `prediction` (text the client expects in the
//! reply, OpenAI's predicted outputs) is searched as well, and drafted from directly while
//! the reply follows it. The sequence then feeds its next token and the draft as one
//! segment of a mixed pass, which returns logits after every one of them; `update`
//! samples each position in turn and keeps the draft up to its first disagreement, plus
//! the token sampled there. The rejected positions leave the cache.
//!
//! **Acceptance.** The standard rule (Leviathan et al.; Chen et al.) accepts a draft token
//! `x` drawn from `q` with probability `min(1, p(x)/q(x))` and on rejection samples the
//! normalised `max(0, p - q)`. A lookup draft is deterministic (`q` is a point mass), so
//! this is: accept `x` with probability `p(x)`, else sample `p` without `x`. Sampling `p`
//! and comparing with `x` does exactly that with one draw per position, which is also the
//! draw plain decoding makes there: with equal logits (every row of a pass is computed on
//! its own) and the same seed, speculative output is the plain output token for token,
//! greedy or sampled.
//!
//! **Adaptive.** A draft nobody accepts costs a wider pass for one token. After a draft
//! is wholly rejected the sequence stops drafting for 1, 2, 4 … (at most
//! [`MAX_COOL_DOWN`]) decode steps; one accepted token resets it. Prose without
//! repetition then pays for a few lookups and rare short drafts.
//!
//! Only passes that return logits for several rows of a segment can verify, i.e. the
//! native backend's mixed pass; static artifacts (OpenVINO) return one row per segment,
//! so sequences there decode plainly. A sequence under a grammar constraint does too: its
//! mask depends on the accepted prefix, which is known only position by position.

use serde::Serialize;

/// Drafting for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Speculation {
    /// Plain decoding, one token per pass.
    #[default]
    Off,
    /// Drafts looked up in the sequence's own prompt and output.
    Ngram,
}

impl Speculation {
    /// The name `--speculative` and the server's `speculative` field take.
    pub fn as_str(self) -> &'static str {
        match self {
            Speculation::Off => "off",
            Speculation::Ngram => "ngram",
        }
    }
}

impl std::str::FromStr for Speculation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" | "none" => Ok(Speculation::Off),
            "ngram" => Ok(Speculation::Ngram),
            other => Err(format!("'{other}' is not a speculation mode (ngram, off)")),
        }
    }
}

/// How drafts are made, for every request of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// Draft tokens per verification at most; 0 turns speculation off for the engine.
    pub max_draft: usize,
    /// Suffix lengths matched, longest first.
    pub min_ngram: usize,
    pub max_ngram: usize,
    /// Rows a pass may reach with drafts (prompt tokens, next tokens and draft tokens
    /// together); drafts beyond it are cut. A pass of few rows costs about what reading
    /// the weights costs, so a draft rides almost free; a pass of many is bound by the
    /// products, where every draft token costs a row whether accepted or not, and
    /// drafting for a large batch slows it down.
    pub pass_rows: usize,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            max_draft: 8,
            min_ngram: 2,
            max_ngram: 4,
            pass_rows: DEFAULT_PASS_ROWS,
        }
    }
}

impl SpeculativeConfig {
    /// No drafts at all.
    pub fn off() -> Self {
        Self {
            max_draft: 0,
            ..Self::default()
        }
    }
}

/// [`SpeculativeConfig::pass_rows`] by default. On a two-core AVX2 host a SmolLM2 pass
/// costs about 5 ms plus 1.6 ms a row, so in a batch of `b` a draft token pays for itself
/// only if it is accepted with odds above 1.6 / (5 / b + 1.6): a quarter alone, three in
/// four at eight. Eight rows let a lone sequence draft seven tokens and a busy batch none
/// (docs/BENCHMARKS.md, "Drafts in a busy batch").
pub const DEFAULT_PASS_ROWS: usize = 8;

/// Decode steps a sequence skips drafting at most after wholly rejected drafts.
pub const MAX_COOL_DOWN: u32 = 16;

/// One sequence's drafting state and counts.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Drafter {
    /// Decode steps left without a draft.
    cool_down: u32,
    /// Consecutive drafts with no token accepted.
    misses: u32,
    pub stats: DraftStats,
}

/// What speculation did for a request or an engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DraftStats {
    /// Draft tokens proposed and verified.
    pub drafted_tokens: usize,
    /// Draft tokens the model agreed with (each saved a pass).
    pub accepted_tokens: usize,
    /// Passes that sampled tokens (with or without a draft; a prompt's last included),
    /// so tokens generated = `decode_passes + accepted_tokens`.
    pub decode_passes: usize,
    /// Of them, passes that verified a draft.
    pub verify_passes: usize,
}

impl DraftStats {
    pub fn add(&mut self, other: &DraftStats) {
        self.drafted_tokens += other.drafted_tokens;
        self.accepted_tokens += other.accepted_tokens;
        self.decode_passes += other.decode_passes;
        self.verify_passes += other.verify_passes;
    }

    /// What happened since `earlier`, a snapshot of these counts.
    pub fn since(&self, earlier: &DraftStats) -> DraftStats {
        DraftStats {
            drafted_tokens: self.drafted_tokens - earlier.drafted_tokens,
            accepted_tokens: self.accepted_tokens - earlier.accepted_tokens,
            decode_passes: self.decode_passes - earlier.decode_passes,
            verify_passes: self.verify_passes - earlier.verify_passes,
        }
    }

    /// Accepted ÷ drafted (0 without drafts).
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.accepted_tokens, self.drafted_tokens)
    }

    /// Tokens decoded per pass: 1 without speculation.
    pub fn tokens_per_pass(&self) -> f64 {
        ratio(
            self.decode_passes + self.accepted_tokens,
            self.decode_passes,
        )
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl Drafter {
    /// Its drafts' acceptance so far, as a rank for the rows a pass has room for: the
    /// accepted share with one accepted and one rejected token assumed, so a sequence
    /// that has not drafted yet ranks in the middle.
    pub fn rank(&self) -> f64 {
        (self.stats.accepted_tokens as f64 + 1.0) / (self.stats.drafted_tokens as f64 + 2.0)
    }

    /// A draft to verify after `tokens` (the sequence's tokens and the input it feeds
    /// next, whose last `reply_len` are its reply so far), from them or from
    /// `prediction` (text the client expects in the reply), at most `room` tokens; empty
    /// while cooling down or without a match.
    pub fn propose(
        &mut self,
        config: &SpeculativeConfig,
        tokens: &Tokens<'_>,
        prediction: &[u32],
        room: usize,
    ) -> Vec<u32> {
        if self.cool_down > 0 {
            self.cool_down -= 1;
            return Vec::new();
        }
        draft(config, tokens, prediction, room.min(config.max_draft))
    }

    /// Records a decode pass that verified `drafted` tokens and kept `accepted`.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.stats.decode_passes += 1;
        if drafted == 0 {
            return;
        }
        self.stats.verify_passes += 1;
        self.stats.drafted_tokens += drafted;
        self.stats.accepted_tokens += accepted;
        if accepted == 0 {
            self.misses += 1;
            self.cool_down = 1u32
                .checked_shl(self.misses - 1)
                .unwrap_or(MAX_COOL_DOWN)
                .min(MAX_COOL_DOWN);
        } else {
            self.misses = 0;
        }
    }
}

/// A sequence's tokens and the one it feeds next, read as one list without copying it;
/// the last `reply_len` of them are its reply so far.
pub struct Tokens<'a> {
    pub history: &'a [u32],
    pub next: u32,
    pub reply_len: usize,
}

impl Tokens<'_> {
    fn len(&self) -> usize {
        self.history.len() + 1
    }

    fn at(&self, i: usize) -> u32 {
        self.history.get(i).copied().unwrap_or(self.next)
    }
}

/// A draft of at most `limit` tokens:
/// - while the reply so far is a prefix of `prediction`, the prediction's next tokens;
/// - otherwise what followed the most recent earlier occurrence of the tokens' longest
///   suffix (`min_ngram..=max_ngram` tokens) in the tokens themselves or in the
///   prediction, the longer match winning (the prediction on a tie).
pub fn draft(
    config: &SpeculativeConfig,
    tokens: &Tokens<'_>,
    prediction: &[u32],
    limit: usize,
) -> Vec<u32> {
    let len = tokens.len();
    if limit == 0 {
        return Vec::new();
    }
    let reply = len - tokens.reply_len.min(len);
    if tokens.reply_len < prediction.len()
        && (reply..len).all(|i| tokens.at(i) == prediction[i - reply])
    {
        let start = tokens.reply_len;
        return prediction[start..(start + limit).min(prediction.len())].to_vec();
    }
    let own = longest_match(config, tokens, len, |i| tokens.at(i));
    let predicted = longest_match(config, tokens, prediction.len(), |i| prediction[i]);
    let from_prediction = match (own, predicted) {
        (Some((n, _)), Some((m, end))) if m >= n => Some(end),
        (None, Some((_, end))) => Some(end),
        _ => None,
    };
    match (from_prediction, own) {
        (Some(end), _) => continuation(prediction.len(), end, limit, |i| prediction[i]),
        (None, Some((_, end))) => continuation(len, end, limit, |i| tokens.at(i)),
        (None, None) => Vec::new(),
    }
}

/// The most recent match in `source[..source_len]` of the longest suffix of `tokens`
/// (`min_ngram..=max_ngram` tokens) that leaves at least one token after it:
/// `(suffix length, end of the match)`.
fn longest_match(
    config: &SpeculativeConfig,
    tokens: &Tokens<'_>,
    source_len: usize,
    source: impl Fn(usize) -> u32,
) -> Option<(usize, usize)> {
    let len = tokens.len();
    let max_n = config.max_ngram.min(len - 1);
    if config.min_ngram == 0 || max_n < config.min_ngram {
        return None;
    }
    let last = tokens.next;
    let mut best: Option<(usize, usize)> = None;
    // `end` is where a match ends (exclusive), i.e. where its continuation starts.
    for end in (1..source_len).rev() {
        if source(end - 1) != last {
            continue;
        }
        let matched = (1..=max_n.min(end))
            .take_while(|&i| source(end - i) == tokens.at(len - i))
            .count();
        if matched >= config.min_ngram && best.is_none_or(|(n, _)| matched > n) {
            best = Some((matched, end));
            if matched == max_n {
                break;
            }
        }
    }
    best
}

/// At most `limit` tokens of `source[..source_len]` from `end`.
fn continuation(
    source_len: usize,
    end: usize,
    limit: usize,
    source: impl Fn(usize) -> u32,
) -> Vec<u32> {
    (end..(end + limit).min(source_len)).map(source).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(config: &SpeculativeConfig, h: &[u32], limit: usize) -> Vec<u32> {
        match h.split_last() {
            Some((&next, history)) => {
                let tokens = Tokens {
                    history,
                    next,
                    reply_len: 0,
                };
                super::draft(config, &tokens, &[], limit)
            }
            None => Vec::new(),
        }
    }

    fn cfg(min: usize, max: usize) -> SpeculativeConfig {
        SpeculativeConfig {
            max_draft: 8,
            min_ngram: min,
            max_ngram: max,
            pass_rows: usize::MAX,
        }
    }

    #[test]
    fn drafts_what_followed_the_longest_most_recent_match() {
        // "1 2 3" occurs twice before; the later one continues with 9.
        let h = [1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 8, 7, 2, 3];
        assert_eq!(draft(&cfg(2, 4), &h, 3), [9, 8, 7]);
        // A longer match wins over a more recent shorter one.
        let h = [7, 2, 3, 5, 6, 1, 2, 3, 4, 4, 0, 2, 3, 1, 7, 2, 3];
        assert_eq!(draft(&cfg(2, 3), &h, 2), [5, 6]);
        // The continuation never runs past what is known.
        let h = [5, 6, 5, 6];
        assert_eq!(draft(&cfg(2, 4), &h, 8), [5, 6]);
        // A match ending right before the next input continues with that input.
        assert_eq!(draft(&cfg(1, 2), &[4, 9, 9], 3), [9]);
    }

    #[test]
    fn no_draft_without_a_match_of_the_minimum_length() {
        assert!(draft(&cfg(2, 4), &[1, 2, 3, 4, 5, 3], 4).is_empty());
        assert_eq!(draft(&cfg(1, 4), &[1, 2, 3, 4, 5, 3], 4), [4, 5, 3]);
        assert!(draft(&cfg(2, 4), &[], 4).is_empty());
        assert!(draft(&cfg(2, 4), &[1], 4).is_empty());
        assert!(draft(&cfg(2, 4), &[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn a_prediction_drafts_while_the_reply_follows_it_and_by_lookup_after() {
        let c = cfg(2, 3);
        let prediction = [7, 8, 9, 10, 5, 7, 3, 4, 6];
        let tokens = |history: &'static [u32], next, reply_len| Tokens {
            history,
            next,
            reply_len,
        };
        // The reply so far (7 8) is the prediction's start: its next tokens.
        assert_eq!(
            super::draft(&c, &tokens(&[1, 2, 7], 8, 2), &prediction, 3),
            [9, 10, 5]
        );
        // Diverged (7 3): the prediction's "7 3" continues with 4 6.
        assert_eq!(
            super::draft(&c, &tokens(&[1, 2, 7], 3, 2), &prediction, 8),
            [4, 6]
        );
        // A match in the sequence's own tokens as long as the prediction's: the prediction.
        assert_eq!(
            super::draft(&c, &tokens(&[7, 3, 1, 1, 7], 3, 2), &prediction, 2),
            [4, 6]
        );
        // A longer own match wins.
        let own = tokens(&[2, 5, 7, 3, 9, 2, 5, 7], 3, 2);
        assert_eq!(super::draft(&cfg(2, 4), &own, &prediction, 2), [9, 2]);
        // Nothing predicted: lookups only.
        assert!(super::draft(&c, &tokens(&[1, 2, 7], 3, 2), &[], 8).is_empty());
    }

    #[test]
    fn rejected_drafts_cool_down_and_acceptance_resets() {
        let c = cfg(1, 2);
        let h = Tokens {
            history: &[1, 2],
            next: 1,
            reply_len: 0,
        };
        let mut d = Drafter::default();
        assert_eq!(d.propose(&c, &h, &[], 8), [2, 1]);
        d.record(2, 0);
        assert!(d.propose(&c, &h, &[], 8).is_empty());
        assert_eq!(d.propose(&c, &h, &[], 8), [2, 1]);
        d.record(2, 0);
        assert!(d.propose(&c, &h, &[], 8).is_empty());
        assert!(d.propose(&c, &h, &[], 8).is_empty());
        assert_eq!(d.propose(&c, &h, &[], 8), [2, 1]);
        d.record(2, 1);
        assert_eq!(d.propose(&c, &h, &[], 1), [2]);
        for _ in 0..40 {
            d.record(1, 0);
        }
        assert_eq!(d.cool_down, MAX_COOL_DOWN);
        let s = d.stats;
        assert_eq!(
            (s.verify_passes, s.drafted_tokens, s.accepted_tokens),
            (43, 46, 1)
        );
    }
}
