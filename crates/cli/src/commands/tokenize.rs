//! `pyramid tokenize`: ids and pieces of a text, as the model's tokenizer splits it.

use anyhow::Result;
use clap::Args;

use crate::loader::open_tokenizer;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// A known model name or a path to a GGUF file.
    #[arg(long, short = 'm', default_value = pyramid_registry::DEFAULT_MODEL)]
    pub model: String,
    /// Print only the ids, comma-separated (the format `run --prompt-tokens` takes).
    #[arg(long)]
    pub ids_only: bool,
    /// The text to tokenize; special tokens such as <|im_start|> are recognised.
    pub text: String,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let tokenizer = open_tokenizer(&args.model)?;
    let ids = tokenizer.encode_prompt(&args.text)?;
    if args.ids_only {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", list.join(","));
        return Ok(());
    }
    for id in ids {
        let bytes = tokenizer.token_bytes(id).unwrap_or_default();
        println!("{id:>8} {:?}", String::from_utf8_lossy(bytes));
    }
    Ok(())
}
