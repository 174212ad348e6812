//! `pyramid qualify`: is a route's output right? A route is qualified for a model and
//! window when its greedy tokens equal the native f32 path's on the reference prompts;
//! with lossy weights (INT8, INT4, BF16, a file's blocks), when they equal it on at least
//! as many prompts as the native path at the same precision does. Accelerators can
//! compile a graph that runs and returns plausible but wrong tokens (numerics,
//! miscompiles, silent fallbacks); benchmarks only count qualified cells.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use pyramid_bench::results::Agreement;
use pyramid_engine::{Engine, EngineConfig, Request, RouteAudit, SpeculativeConfig};
use pyramid_model::Precision;
use pyramid_runtime::{CpuBackend, WindowLadder};
use pyramid_tokenizer::ChatMessage;
use serde::{Deserialize, Serialize};

use crate::loader::{Loaded, ModelArgs};
use crate::route::{single_user, Route, RouteArgs, DEFAULT_PREFILL_CHUNK};

/// The public reference prompts (testdata/refs/prompts-public.json), built in.
const PUBLIC_PROMPTS: &str = include_str!("../../../../testdata/refs/prompts-public.json");

#[derive(Args, Debug)]
pub struct QualifyArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub route: RouteArgs,
    /// Windows to qualify, comma-separated.
    #[arg(long, default_value = "1024,2048,4096")]
    pub windows: String,
    /// More prompts: each file is one prompt's text (no chat template).
    #[arg(long)]
    pub prompt_file: Vec<PathBuf>,
    /// Greedy tokens compared per prompt.
    #[arg(long, short = 'n', default_value_t = 32)]
    pub max_tokens: usize,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Deserialize)]
struct PromptSet {
    prompts: Vec<PublicPrompt>,
}

#[derive(Deserialize)]
struct PublicPrompt {
    id: String,
    text: Option<String>,
    messages: Option<Vec<Message>>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

struct Prompt {
    id: String,
    tokens: Vec<u32>,
}

fn prompts(extra: &[PathBuf], loaded: &Loaded) -> Result<Vec<Prompt>> {
    let set: PromptSet = serde_json::from_str(PUBLIC_PROMPTS).context("built-in prompt set")?;
    let tok = &loaded.tokenizer;
    let mut out = Vec::new();
    for p in set.prompts {
        let tokens = match (p.messages, p.text) {
            // A model without a chat template (gemma3-270m) qualifies on the text prompts.
            (Some(_), _) if tok.chat_template_source().is_none() => continue,
            (Some(messages), _) => {
                let messages: Vec<ChatMessage> = messages
                    .into_iter()
                    .map(|m| ChatMessage::new(&m.role, m.content))
                    .collect();
                let rendered = tok.chat_template()?.render(&messages, true)?;
                tok.encode(&rendered, true)?
            }
            (None, Some(text)) => tok.encode_prompt(&text)?,
            (None, None) => continue,
        };
        out.push(Prompt { id: p.id, tokens });
    }
    for path in extra {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading prompt file {}", path.display()))?;
        let tokens = tok.encode_prompt(&text)?;
        if tokens.is_empty() {
            bail!("prompt file {} is empty", path.display());
        }
        out.push(Prompt {
            id: path.display().to_string(),
            tokens,
        });
    }
    Ok(out)
}

#[derive(Serialize)]
struct PromptResult {
    id: String,
    /// `null` when the prompt and its tokens do not fit the window.
    matched: Option<bool>,
    /// First generated position where the route's token differs.
    first_difference: Option<usize>,
}

#[derive(Serialize)]
pub struct WindowResult {
    window: usize,
    /// At least one prompt fits, and every one matched, or (lossy weights) as many as
    /// the native path at the same precision matched, which must be at least one.
    pub valid: bool,
    /// Of the prompts that fit, how many the native path at the route's precision
    /// matches (`null` for f32 weights, where every prompt must match).
    native_matched: Option<usize>,
    route: RouteAudit,
    prompts: Vec<PromptResult>,
    error: Option<String>,
}

impl WindowResult {
    pub fn agreement(&self, tokens_per_prompt: usize) -> Agreement {
        let checked: Vec<&PromptResult> = self
            .prompts
            .iter()
            .filter(|p| p.matched.is_some())
            .collect();
        Agreement {
            prompts_matched: checked.iter().filter(|p| p.matched == Some(true)).count(),
            prompts_checked: checked.len(),
            tokens_per_prompt,
            first_difference: checked.iter().filter_map(|p| p.first_difference).min(),
        }
    }
}

#[derive(Serialize)]
struct Report {
    model: String,
    route: String,
    precision: String,
    max_tokens: usize,
    windows: Vec<WindowResult>,
}

/// The reference prompts and the native f32 path's greedy tokens for each.
pub struct Qualifier {
    prompts: Vec<Prompt>,
    /// `None` for a prompt that, with its tokens, fits no window to be checked.
    reference: Vec<Option<Vec<u32>>>,
    /// With lossy weights, whether the native path at their precision matches each
    /// prompt's reference: the bar a route at that precision is held to.
    native: Option<Vec<Option<bool>>>,
    max_tokens: usize,
}

impl Qualifier {
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Runs the reference for the public prompts (the first `limit`, if given) and
    /// `extra`, comparing `max_tokens` tokens, for windows up to `largest`.
    pub fn new(
        loaded: &Loaded,
        extra: &[PathBuf],
        limit: Option<usize>,
        max_tokens: usize,
        largest: usize,
    ) -> Result<Self> {
        let reference_model = loaded
            .f32_model
            .clone()
            .context("qualification needs the f32 model")?;
        let mut prompts = prompts(extra, loaded)?;
        if let Some(limit) = limit {
            prompts.truncate(limit);
        }
        let generate_all =
            |model: Arc<pyramid_model::Model>, kv| -> Result<Vec<Option<Vec<u32>>>> {
                let ladder = WindowLadder::default_for(model.config.n_ctx_train);
                let chunk = pyramid_model::MAX_PASS_TOKENS.min(ladder.largest());
                let backend = Arc::new(CpuBackend::new(model, loaded.pool.n_threads()));
                let mut engine = Engine::new(
                    backend,
                    crate::loader::file_model_id(&loaded.path)?,
                    kv,
                    single_user(ladder, chunk, 1, SpeculativeConfig::off()),
                )?;
                prompts
                    .iter()
                    .enumerate()
                    .map(|(id, p)| {
                        if p.tokens.len() + max_tokens > largest {
                            return Ok(None);
                        }
                        let request = Request::greedy(id as u64, p.tokens.clone(), max_tokens);
                        let done = engine.generate(&loaded.pool, request, &mut |_| true)?;
                        Ok(Some(done.tokens))
                    })
                    .collect()
            };
        let reference = generate_all(reference_model, pyramid_model::KvType::F32)?;
        let native = if loaded.model.precision == Precision::F32 {
            None
        } else {
            let tokens = generate_all(Arc::clone(&loaded.model), loaded.kv_type)?;
            Some(
                tokens
                    .iter()
                    .zip(&reference)
                    .map(|(got, want)| Some(got.as_ref()? == want.as_ref()?))
                    .collect(),
            )
        };
        Ok(Self {
            prompts,
            reference,
            native,
            max_tokens,
        })
    }

    /// Runs every prompt that fits `window` through `route` on artifacts of that window.
    pub fn check(&self, route: &Route, loaded: &Loaded, window: usize) -> Result<WindowResult> {
        let ladder = WindowLadder::new(vec![window], loaded.model.config.n_ctx_train)?;
        let chunk = DEFAULT_PREFILL_CHUNK.min(window);
        // The window's own static artifacts, whatever the backend: they are what is
        // qualified.
        let mut engine = route.engine(
            loaded,
            EngineConfig {
                static_shapes: true,
                ..single_user(ladder, chunk, 1, SpeculativeConfig::off())
            },
        )?;
        let mut prompt_results = Vec::new();
        let mut error = None;
        for (p, want) in self.prompts.iter().zip(&self.reference) {
            let fits = p.tokens.len() + self.max_tokens <= window;
            let Some(want) = Option::as_ref(want).filter(|_| fits) else {
                prompt_results.push(PromptResult {
                    id: p.id.clone(),
                    matched: None,
                    first_difference: None,
                });
                continue;
            };
            let request = Request::greedy(
                prompt_results.len() as u64,
                p.tokens.clone(),
                self.max_tokens,
            );
            match engine.generate(&loaded.pool, request, &mut |_| true) {
                Ok(got) => {
                    let first_difference = got.tokens.iter().zip(want).position(|(a, b)| a != b);
                    prompt_results.push(PromptResult {
                        id: p.id.clone(),
                        matched: Some(first_difference.is_none() && got.tokens.len() == want.len()),
                        first_difference,
                    });
                }
                Err(e) => {
                    error = Some(format!("{}: {e}", p.id));
                    break;
                }
            }
        }
        let fitted: Vec<bool> = prompt_results.iter().filter_map(|r| r.matched).collect();
        let matched = fitted.iter().filter(|&&m| m).count();
        // The native path's matches among the prompts that fit this window.
        let native_matched = self.native.as_ref().map(|native| {
            native
                .iter()
                .zip(&prompt_results)
                .filter(|(n, r)| r.matched.is_some() && **n == Some(true))
                .count()
        });
        Ok(WindowResult {
            window,
            valid: error.is_none() && qualifies(matched, fitted.len(), native_matched),
            native_matched,
            route: route.audit_of(&engine),
            prompts: prompt_results,
            error,
        })
    }
}

/// Whether `matched` of the `fitted` prompts qualify a route: all of them (f32 weights),
/// or as many as the native path at the route's precision matched (`native`). A precision
/// whose native path matches no prompt sets no bar: nothing qualifies at it.
fn qualifies(matched: usize, fitted: usize, native: Option<usize>) -> bool {
    let bar = native.unwrap_or(fitted);
    fitted > 0 && bar > 0 && matched >= bar
}

pub fn run(mut args: QualifyArgs) -> Result<()> {
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    args.route
        .place(&args.model.model, || args.model.precision(), None)?;
    let loaded = args.model.load_keeping_f32(true)?;
    let windows = WindowLadder::parse(&args.windows, loaded.model.config.n_ctx_train)?;
    let route = args
        .route
        .build(&args.model.model, &loaded, loaded.f32_model.as_ref())?;
    let qualifier = Qualifier::new(
        &loaded,
        &args.prompt_file,
        None,
        args.max_tokens,
        windows.largest(),
    )?;
    let results = windows
        .windows()
        .iter()
        .map(|&w| qualifier.check(&route, &loaded, w))
        .collect::<Result<Vec<_>>>()?;
    let report = Report {
        model: loaded.name.clone(),
        route: route.name(),
        precision: loaded.model.precision.to_string(),
        max_tokens: args.max_tokens,
        windows: results,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(r: &Report) {
    println!(
        "{} on {} ({} weights), {} greedy tokens per prompt against the native f32 path",
        r.model, r.route, r.precision, r.max_tokens
    );
    println!(
        "| window | verdict | prompts matched | native {} matched | executed |",
        r.precision
    );
    println!("|---|---|---|---|---|");
    for w in &r.windows {
        let fitted = w.prompts.iter().filter(|p| p.matched.is_some()).count();
        let matched = w.prompts.iter().filter(|p| p.matched == Some(true)).count();
        let verdict = match (&w.error, w.valid, fitted) {
            (Some(_), _, _) => "error",
            (None, _, 0) => "no prompt fits",
            (None, true, _) => "valid",
            (None, false, _) if w.native_matched == Some(0) => "native matches none",
            (None, false, _) => "wrong tokens",
        };
        let native = w
            .native_matched
            .map_or("— (all must match)".to_string(), |n| {
                format!("{n}/{fitted}")
            });
        println!(
            "| {} | {verdict} | {matched}/{fitted} | {native} | {} |",
            w.window,
            w.route.describe()
        );
        for p in w.prompts.iter().filter(|p| p.matched == Some(false)) {
            println!(
                "    {}: differs from generated token {}",
                p.id,
                p.first_difference
                    .map_or("(length)".to_string(), |i| i.to_string())
            );
        }
        if let Some(e) = &w.error {
            println!("    {e}");
        }
    }
    let valid: Vec<String> = r
        .windows
        .iter()
        .filter(|w| w.valid)
        .map(|w| w.window.to_string())
        .collect();
    let invalid: Vec<String> = r
        .windows
        .iter()
        .filter(|w| !w.valid)
        .map(|w| w.window.to_string())
        .collect();
    println!(
        "{}: valid at [{}]; not valid at [{}]",
        r.route,
        valid.join(", "),
        invalid.join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::qualifies;

    #[test]
    fn lossy_routes_are_held_to_their_native_precision_and_f32_to_every_prompt() {
        assert!(qualifies(6, 6, None));
        assert!(
            !qualifies(5, 6, None),
            "f32 weights must match every prompt"
        );
        assert!(
            qualifies(5, 6, Some(5)),
            "as faithful as native at its precision"
        );
        assert!(qualifies(6, 6, Some(5)));
        assert!(!qualifies(4, 6, Some(5)));
        assert!(
            !qualifies(0, 6, Some(0)),
            "a native path matching nothing sets no bar"
        );
        assert!(!qualifies(0, 0, None), "no prompt fits");
    }
}
