//! `pyramid run`: one prompt in, streamed text out (or one JSON object with `--json`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use std::sync::Arc;

use pyramid_engine::{DraftStats, FinishReason, Request, RequestId, RouteAudit, Speculation};
use pyramid_grammar::{Constraint, Grammar, GrammarVocab};
use pyramid_runtime::{SamplerConfig, WindowLadder};
use pyramid_tokenizer::{ChatMessage, StreamDecoder, Tokenizer};
use serde::Serialize;

use crate::loader::{Loaded, ModelArgs};
use crate::route::{
    prefill_chunk_for, single_user, RouteArgs, SpeculativeArgs, DEFAULT_PREFILL_CHUNK,
};

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_file", "prompt_tokens"])))]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(long, short = 'p')]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// The prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long)]
    pub prompt_tokens: Option<String>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub route: RouteArgs,
    /// Print one JSON object with ids, text and timings instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Text the reply is expected to contain (a file being edited, say): speculative
    /// decoding drafts from it as well, which changes no token.
    #[arg(long, value_name = "FILE")]
    pub prediction: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Maximum number of tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 is greedy decoding.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise tokens among the last 64 (1 = off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed; the same seed, prompt and settings give the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `ID=BIAS` added to token ID's logit before sampling (repeatable; -100 bans it).
    #[arg(long, value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Let the reply sample media markers and control tokens outside the chat format
    /// (never sampled by default), as transformers' `generate` does: to compare tokens
    /// with it on models that predict them, such as random-weight ones.
    #[arg(long)]
    pub sample_control_tokens: bool,
    /// Constrain the reply to JSON valid against the JSON schema in this file.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the reply to a Lark grammar in this file (llguidance's dialect:
    /// `start: ...`, regexes in `/.../`, JSON schemas inline with `%json {...}`).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    #[command(flatten)]
    pub speculation: SpeculativeArgs,
}

/// `--json-schema` or `--grammar`, read and compiled against the model's vocabulary once;
/// each reply gets a fresh constraint from it.
pub struct ReplyGrammar {
    vocab: GrammarVocab,
    grammar: Grammar,
}

impl ReplyGrammar {
    /// The grammar the flags name, checked by compiling it once; `None` without one.
    pub fn from_args(args: &SamplingArgs, tokenizer: &Tokenizer) -> Result<Option<Self>> {
        let Some((grammar, flag, path)) = args.read_grammar()? else {
            return Ok(None);
        };
        let vocab = GrammarVocab::new(Arc::new(tokenizer.clone()))?;
        vocab
            .compile(&grammar)
            .with_context(|| format!("{flag} {}", path.display()))?;
        Ok(Some(Self { vocab, grammar }))
    }

    pub fn constraint(&self) -> Result<Constraint> {
        Ok(self.vocab.compile(&self.grammar)?)
    }
}

impl SamplingArgs {
    /// The grammar `--json-schema` or `--grammar` names, read from its file, with the flag
    /// and the path (for errors); `None` without either.
    pub fn read_grammar(&self) -> Result<Option<(Grammar, &'static str, &PathBuf)>> {
        let (path, flag) = match (&self.json_schema, &self.grammar) {
            (Some(p), _) => (p, "--json-schema"),
            (None, Some(p)) => (p, "--grammar"),
            (None, None) => return Ok(None),
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{flag}: cannot read {}", path.display()))?;
        let grammar = if self.json_schema.is_some() {
            Grammar::JsonSchema(
                serde_json::from_str(&text)
                    .with_context(|| format!("{flag}: {} is not valid JSON", path.display()))?,
            )
        } else {
            Grammar::Lark(text)
        };
        Ok(Some((grammar, flag, path)))
    }

    /// A request for `prompt` with these settings, ending at the tokenizer's end tokens
    /// unless `--ignore-eos`, never sampling its suppressed ones.
    pub fn request(
        &self,
        id: RequestId,
        prompt: Vec<u32>,
        tokenizer: &Tokenizer,
    ) -> Result<Request> {
        if self.max_tokens == 0 {
            bail!("--max-tokens must be at least 1");
        }
        let sampler = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: 64,
            seed: self.seed,
            logit_bias: self.logit_bias.clone(),
        };
        sampler.validate()?;
        Ok(Request {
            id,
            prompt,
            max_tokens: self.max_tokens,
            sampler,
            stop_tokens: if self.ignore_eos {
                Vec::new()
            } else {
                tokenizer.end_of_generation_ids().to_vec()
            },
            suppressed_tokens: if self.sample_control_tokens {
                Arc::from([])
            } else {
                tokenizer.suppressed_ids().into()
            },
            min_tokens: 0,
            logprobs: None,
            constraint: None,
            // One request at a time: nothing to be more urgent than.
            priority: 0,
            // Drafts only where the engine makes them (see `SpeculativeArgs::config_on`).
            speculation: self.speculation.mode_or(Speculation::Ngram),
            prediction: Vec::new(),
            pooling: None,
        })
    }
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    model: &'a str,
    prompt_tokens: &'a [u32],
    tokens: &'a [u32],
    text: String,
    finish_reason: &'static str,
    timings: JsonTimings,
    /// Drafts verified and accepted, passes that sampled, and their ratios.
    speculative: JsonSpeculative,
    /// Devices asked for and devices that really ran each stage.
    route: RouteAudit,
    /// How the route's artifacts were made: compiled, or loaded from the store kept
    /// across starts.
    artifacts: JsonArtifacts,
}

#[derive(Serialize)]
struct JsonArtifacts {
    compiled: usize,
    compile_ms: f64,
    loaded_from_store: usize,
    store_load_ms: f64,
}

#[derive(Serialize)]
struct JsonSpeculative {
    #[serde(flatten)]
    counts: DraftStats,
    acceptance_rate: f64,
    tokens_per_pass: f64,
}

impl From<DraftStats> for JsonSpeculative {
    fn from(counts: DraftStats) -> Self {
        Self {
            counts,
            acceptance_rate: counts.acceptance_rate(),
            tokens_per_pass: counts.tokens_per_pass(),
        }
    }
}

#[derive(Serialize)]
struct JsonTimings {
    load_ms: f64,
    prefill_ms: f64,
    decode_ms: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    /// Spent on `--json-schema`/`--grammar` masks (0 without one).
    mask_ms: f64,
}

fn parse_token_list(list: &str) -> Result<Vec<u32>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>().with_context(|| {
                format!("--prompt-tokens: '{s}' is not a token id (expected e.g. 1,2,3)")
            })
        })
        .collect()
}

fn prompt_ids(args: &RunArgs, loaded: &Loaded) -> Result<Vec<u32>> {
    if let Some(list) = &args.prompt_tokens {
        if args.chat {
            bail!("--chat needs a text prompt, not --prompt-tokens");
        }
        return parse_token_list(list);
    }
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading prompt file {}", f.display()))?,
        (None, None) => unreachable!("clap requires one prompt source"),
    };
    if text.is_empty() {
        bail!("the prompt is empty");
    }
    let text = if args.chat {
        let template = crate::loader::chat_template(&loaded.tokenizer)?;
        // A rendered template carries its own BOS if it wants one (as Hugging Face's
        // `apply_chat_template` assumes), so nothing is added on top.
        let rendered = template.render(&[ChatMessage::new("user", text)], true)?;
        return Ok(loaded.tokenizer.encode(&rendered, true)?);
    } else {
        text
    };
    Ok(loaded.tokenizer.encode_prompt(&text)?)
}

pub fn run(mut args: RunArgs) -> Result<()> {
    // The prompt's length is known only once the tokenizer is loaded: the profile's own.
    args.route
        .place(&args.model.model, || args.model.precision(), None)?;
    let native = args.route.is_native()?;
    let loaded = args.model.load_keeping_f32(!native)?;
    let route = args
        .route
        .build(&args.model.model, &loaded, loaded.f32_model.as_ref())?;
    let prompt = prompt_ids(&args, &loaded)?;
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let n_ctx = loaded.model.config.n_ctx_train;
    if prompt.len() > n_ctx {
        bail!(
            "the prompt has {} tokens but the model's context is {n_ctx}",
            prompt.len()
        );
    }
    let mut request = args
        .sampling
        .request(0, prompt.clone(), &loaded.tokenizer)?;
    request.sampler.check_vocab(loaded.tokenizer.n_vocab())?;
    if let Some(grammar) = ReplyGrammar::from_args(&args.sampling, &loaded.tokenizer)? {
        request.constraint = Some(grammar.constraint()?);
    }
    if let Some(path) = &args.prediction {
        if request.speculation == Speculation::Off {
            bail!("--prediction is read by speculative decoding: drop --speculative off");
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--prediction: cannot read {}", path.display()))?;
        request.prediction = loaded.tokenizer.encode(&text, false)?;
    }
    // Every route runs the engine core: natively one growing pass per step, on other
    // devices static artifacts on the window pyramid.
    let ladder = WindowLadder::default_for(n_ctx);
    let chunk = prefill_chunk_for(&route, &ladder, DEFAULT_PREFILL_CHUNK);
    let speculative = args
        .sampling
        .speculation
        .config_on(&route, Speculation::Ngram)?;
    let mut engine = route.engine(&loaded, single_user(ladder, chunk, 1, speculative))?;

    let tokenizer = &loaded.tokenizer;
    let mut stream = StreamDecoder::new();
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let generation = engine.generate(&loaded.pool, request, &mut |token| {
        if args.json || (tokenizer.is_end_of_generation(token) && !args.sampling.ignore_eos) {
            return true;
        }
        let piece = match stream.push(tokenizer, token) {
            Ok(piece) => piece,
            Err(err) => {
                write_error = Some(anyhow::Error::from(err));
                return false;
            }
        };
        // A closed pipe (e.g. `| head`) ends generation quietly.
        if let Err(err) = stdout
            .write_all(piece.as_bytes())
            .and_then(|()| stdout.flush())
        {
            write_error = Some(err.into());
            return false;
        }
        true
    })?;
    if let Some(err) = write_error {
        if err.downcast_ref::<std::io::Error>().map(|e| e.kind())
            == Some(std::io::ErrorKind::BrokenPipe)
        {
            return Ok(());
        }
        return Err(err);
    }

    if args.json {
        // A stop token ends the list and has no text (a completed grammar ends on text).
        let mut text_tokens = generation.tokens.as_slice();
        if let Some((&last, rest)) = text_tokens.split_last() {
            if generation.finish_reason == FinishReason::Stop
                && tokenizer.is_end_of_generation(last)
            {
                text_tokens = rest;
            }
        }
        let t = generation.timings;
        let out = JsonOutput {
            model: &loaded.name,
            prompt_tokens: &prompt,
            tokens: &generation.tokens,
            text: tokenizer.decode(text_tokens)?,
            finish_reason: generation.finish_reason.as_str(),
            timings: JsonTimings {
                load_ms: loaded.load_ms,
                prefill_ms: t.prefill_ms,
                decode_ms: t.decode_ms,
                prefill_tok_s: t.prefill_tok_s(),
                decode_tok_s: t.decode_tok_s(),
                mask_ms: t.mask_ms,
            },
            speculative: generation.usage.speculative.into(),
            route: route.audit_of(&engine),
            artifacts: {
                let p = engine.stats().pyramid;
                JsonArtifacts {
                    compiled: p.n_compiles,
                    compile_ms: p.compile_ms,
                    loaded_from_store: p.n_store_loads,
                    store_load_ms: p.store_load_ms,
                }
            },
        };
        serde_json::to_writer(&mut stdout, &out)?;
        writeln!(stdout)?;
    } else {
        write!(stdout, "{}", stream.finish())?;
        writeln!(stdout)?;
    }
    Ok(())
}

/// `ID=BIAS`, the bias a finite number.
fn parse_logit_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let bad = || format!("'{s}' is not ID=BIAS (a token id and a number)");
    let (id, bias) = s.split_once('=').ok_or_else(bad)?;
    let id = id.trim().parse().map_err(|_| bad())?;
    let bias: f32 = bias.trim().parse().map_err(|_| bad())?;
    if !bias.is_finite() {
        return Err(bad());
    }
    Ok((id, bias))
}
