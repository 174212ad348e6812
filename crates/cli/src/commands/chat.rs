//! `pyramid chat`: a multi-turn conversation in the terminal.
//!
//! Each turn re-renders the whole conversation with the model's template and sends it to
//! the engine as one request; the engine's prefix cache finds the conversation's session:
//! only the new user message (and the template's glue) is prefilled. Any route works
//! (`--device`, `--prefill-device`, `--decode-device`), and the conversation moves up the
//! window ladder as it grows.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use pyramid_engine::{Engine, FinishReason, Speculation};
use pyramid_runtime::WindowLadder;
use pyramid_tokenizer::{ChatMessage, StreamDecoder};
use serde::{Deserialize, Serialize};

use super::chat_remote::next_user_turn;
use super::run::{ReplyGrammar, SamplingArgs};
use crate::loader::ModelArgs;
use crate::route::{prefill_chunk_for, single_user, RouteArgs, DEFAULT_PREFILL_CHUNK};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message to start the conversation with.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub route: RouteArgs,
    /// Print prefill/decode statistics after each reply (on stderr).
    #[arg(long)]
    pub stats: bool,
    /// Chat with a running `pyramid serve` (or any OpenAI-compatible server) at this URL
    /// instead of loading a model here; `--model`, `--precision` and `--kv` are then unused.
    #[arg(long)]
    pub server: Option<String>,
    /// The server's API key, if it requires one.
    #[arg(long, requires = "server")]
    pub api_key: Option<String>,
    /// Resume the conversation kept in this file (its messages and KV cache: nothing is
    /// prefilled again) and keep it there when the chat ends. A file of another model,
    /// precision, route or KV type is refused with its reason.
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    pub session: Option<PathBuf>,
}

/// The messages kept in a session file beside the conversation's tokens and KV.
#[derive(Serialize, Deserialize)]
struct SavedMessage {
    role: String,
    content: String,
}

/// Loads `path`'s conversation into `engine`'s cache and returns its messages.
fn resume(engine: &mut Engine, path: &Path) -> Result<Vec<ChatMessage>> {
    let (tokens, note) = engine
        .import_session_file(path)
        .with_context(|| format!("cannot resume --session {}", path.display()))?;
    let saved: Vec<SavedMessage> = serde_json::from_slice(&note).with_context(|| {
        format!(
            "--session {}: the file holds no chat messages (was it written by pyramid chat?)",
            path.display()
        )
    })?;
    eprintln!(
        "Resumed {} messages ({} tokens) from {}.",
        saved.len(),
        tokens.len(),
        path.display()
    );
    Ok(saved
        .into_iter()
        .map(|m| ChatMessage::new(&m.role, m.content))
        .collect())
}

/// Writes the conversation (`prompt`: its last rendering) to `path`.
fn keep(engine: &Engine, path: &Path, prompt: &[u32], messages: &[ChatMessage]) -> Result<()> {
    let saved: Vec<SavedMessage> = messages
        .iter()
        .map(|m| SavedMessage {
            role: m.role.clone(),
            content: m.content.clone(),
        })
        .collect();
    let note = serde_json::to_vec(&saved)?;
    match engine
        .export_session_file(prompt, path, &note)
        .with_context(|| format!("cannot keep the conversation in {}", path.display()))?
    {
        Some(n) => eprintln!("Kept the conversation ({n} tokens) in {}.", path.display()),
        None => eprintln!("Nothing to keep in {}.", path.display()),
    }
    Ok(())
}

pub fn run(mut args: ChatArgs) -> Result<()> {
    if let Some(server) = &args.server {
        return super::chat_remote::run(
            server,
            args.api_key.as_deref(),
            args.system.as_deref(),
            &args.sampling,
            args.stats,
        );
    }
    args.route
        .place(&args.model.model, || args.model.precision(), None)?;
    let native = args.route.is_native()?;
    let loaded = args.model.load_keeping_f32(!native)?;
    let template = crate::loader::chat_template(&loaded.tokenizer)?;
    // Checked now, so a bad flag is reported before the first turn.
    args.sampling
        .request(0, vec![0], &loaded.tokenizer)?
        .sampler
        .check_vocab(loaded.tokenizer.n_vocab())?;
    let grammar = ReplyGrammar::from_args(&args.sampling, &loaded.tokenizer)?;
    let route = args
        .route
        .build(&args.model.model, &loaded, loaded.f32_model.as_ref())?;
    let ladder = WindowLadder::default_for(loaded.model.config.n_ctx_train);
    let chunk = prefill_chunk_for(&route, &ladder, DEFAULT_PREFILL_CHUNK);
    let speculative = args
        .sampling
        .speculation
        .config_on(&route, Speculation::Ngram)?;
    let mut engine = route.engine(&loaded, single_user(ladder, chunk, 1, speculative))?;
    let tokenizer = &loaded.tokenizer;
    let mut messages: Vec<ChatMessage> = match &args.session {
        Some(path) if path.exists() => resume(&mut engine, path)?,
        _ => Vec::new(),
    };
    if messages.is_empty() {
        messages.extend(
            args.system
                .iter()
                .map(|s| ChatMessage::new("system", s.clone())),
        );
    }
    // The conversation's last rendering: what the session file keeps.
    let mut conversation: Vec<u32> = Vec::new();

    eprintln!(
        "Chatting with {} — an empty line or Ctrl-D ends the chat.",
        loaded.name
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut stdout = std::io::stdout();
    for turn in 0.. {
        let Some(line) = next_user_turn(&mut lines)? else {
            break;
        };
        messages.push(ChatMessage::new("user", line));
        // The template carries its own BOS if it wants one; nothing is added on top.
        let prompt = tokenizer.encode(&template.render(&messages, true)?, true)?;
        conversation.clone_from(&prompt);

        let mut stream = StreamDecoder::new();
        let mut reply_tokens = Vec::new();
        let mut request = args.sampling.request(turn, prompt, tokenizer)?;
        request.constraint = grammar.as_ref().map(ReplyGrammar::constraint).transpose()?;
        let result = engine.generate(&loaded.pool, request, &mut |token| {
            if tokenizer.is_end_of_generation(token) {
                return true;
            }
            reply_tokens.push(token);
            match stream.push(tokenizer, token) {
                Ok(piece) => stdout
                    .write_all(piece.as_bytes())
                    .and_then(|()| stdout.flush())
                    .is_ok(),
                Err(_) => false,
            }
        });
        let generation = match result {
            Ok(g) => g,
            Err(err) => {
                // The conversation outgrew the model or similar: say so, keep the chat usable.
                messages.pop();
                eprintln!("\nerror: {err}");
                continue;
            }
        };
        writeln!(stdout, "{}", stream.finish())?;
        if generation.finish_reason == FinishReason::Length {
            if generation.tokens.len() >= args.sampling.max_tokens {
                eprintln!("[reply cut at {} tokens]", args.sampling.max_tokens);
            } else {
                eprintln!("[reply cut: the conversation fills the model's context]");
            }
        }
        if args.stats {
            let t = generation.timings;
            eprintln!(
                "[reused {} cached tokens, prefilled {} at {:.1} tok/s, generated {} at {:.1} tok/s]",
                generation.usage.cached_tokens,
                t.n_prefill,
                t.prefill_tok_s(),
                generation.tokens.len(),
                t.decode_tok_s()
            );
        }
        conversation.extend_from_slice(&generation.tokens);
        messages.push(ChatMessage::new(
            "assistant",
            tokenizer.decode(&reply_tokens)?,
        ));
    }
    if let Some(path) = &args.session {
        if !conversation.is_empty() {
            keep(&engine, path, &conversation, &messages)?;
        }
    }
    Ok(())
}
