//! `pyramid`: the command-line front end. Argument parsing and error reporting live here;
//! everything else is in the library crates.

mod commands;
mod loader;
mod route;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "pyramid",
    version,
    about = "On-device LLM inference from GGUF models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streamed to stdout.
    Run(commands::run::RunArgs),
    /// Chat with a model in the terminal; the conversation's KV cache is kept between turns.
    Chat(commands::chat::ChatArgs),
    /// Show the token ids and pieces of a text.
    Tokenize(commands::tokenize::TokenizeArgs),
    /// Describe a GGUF file: architecture, hyper-parameters, tensor types.
    Inspect(commands::inspect::InspectArgs),
    /// Measure prefill (pp) and decode (tg) throughput, llama-bench style.
    Bench(commands::bench::BenchArgs),
    /// Replay agent sessions (a JSONL trace or a synthetic one) under four window
    /// strategies: largest window, re-prefill on overflow, pyramid on demand, predictive.
    Replay(commands::replay::ReplayArgs),
    /// Serve the OpenAI HTTP API (chat and text completions, streaming) with continuous
    /// batching and conversation reuse.
    Serve(commands::serve::ServeArgs),
    /// Check a route's greedy tokens against the native f32 path on the reference
    /// prompts, window by window.
    Qualify(commands::qualify::QualifyArgs),
    /// Measure how fast each device runs the model: an operator inside its block and
    /// alone, the block, each stage and the whole model, each checked against native f32.
    Affinity(commands::affinity::AffinityArgs),
    /// List the devices routes can use: the native CPU and OpenVINO's devices.
    Devices(commands::devices::DevicesArgs),
    /// List the models known by name and whether they are cached.
    Models,
    /// Download a known model, or one by Hugging Face id (hf:ORG/REPO[:QUANT|/FILE]), into its cache.
    Fetch(commands::models::FetchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = pyramid_kernels::isa::init_from_env()
        .map_err(anyhow::Error::from)
        .and_then(|_| match cli.command {
            Command::Run(args) => commands::run::run(args),
            Command::Chat(args) => commands::chat::run(args),
            Command::Tokenize(args) => commands::tokenize::run(args),
            Command::Inspect(args) => commands::inspect::run(args),
            Command::Bench(args) => commands::bench::run(args),
            Command::Replay(args) => commands::replay::run(args),
            Command::Serve(args) => commands::serve::run(args),
            Command::Qualify(args) => commands::qualify::run(args),
            Command::Devices(args) => commands::devices::run(args),
            Command::Affinity(args) => commands::affinity::run(args),
            Command::Models => commands::models::list(),
            Command::Fetch(args) => commands::models::fetch(args),
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
