//! `pyramid inspect`: what a GGUF file or a Hugging Face directory holds, without loading
//! its weights.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use pyramid_gguf::{GgufFile, Value};
use pyramid_model::{HfCheckpoint, ModelConfig};

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A GGUF file, a Hugging Face model directory, or a known model name.
    pub path: String,
    /// Also list every metadata key and every tensor.
    #[arg(long)]
    pub all: bool,
}

fn short(value: &Value) -> String {
    match value {
        Value::String(s) if s.len() > 60 => {
            format!("{:?}… ({} chars)", &s[..s.floor_char_boundary(60)], s.len())
        }
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!("[{} items]", items.len()),
        other => format!("{other:?}"),
    }
}

pub fn run(args: InspectArgs) -> Result<()> {
    let path = if PathBuf::from(&args.path).exists() {
        PathBuf::from(&args.path)
    } else {
        crate::loader::resolve_model_path(&args.path)?
    };
    if path.is_dir() {
        return inspect_directory(&path, args.all);
    }
    let file = GgufFile::open(&path)?;
    let md = file.metadata();
    println!("file:          {}", path.display());
    println!("gguf version:  {}", file.version());
    println!(
        "architecture:  {}",
        md.get_str("general.architecture").unwrap_or("(missing)")
    );
    match ModelConfig::from_gguf(&file) {
        Ok(c) => print_config(&c),
        Err(err) => println!("not runnable by pyramid: {err}"),
    }
    for key in ["tokenizer.ggml.model", "tokenizer.ggml.pre"] {
        if let Some(v) = md.get(key) {
            println!("{key}: {}", short(v));
        }
    }
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let entry = by_type.entry(t.ggml_type.name()).or_default();
        entry.0 += 1;
        entry.1 += t.n_bytes;
    }
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    println!(
        "tensors: {} ({:.1} M parameters)",
        file.tensors().len(),
        n_params as f64 / 1e6
    );
    for (ty, (count, bytes)) in by_type {
        println!(
            "  {ty:<6} {count:>5} tensors {:>10.1} MB",
            bytes as f64 / 1e6
        );
    }
    if args.all {
        println!("metadata:");
        for (k, v) in md.iter() {
            println!("  {k} = {}", short(v));
        }
        println!("tensors:");
        for t in file.tensors() {
            println!("  {:<32} {:<6} {:?}", t.name, t.ggml_type.name(), t.dims);
        }
    }
    Ok(())
}

fn print_config(c: &ModelConfig) {
    println!("name:          {}", c.name);
    println!(
        "layers {}, embd {}, heads {} (kv {}), head_dim {}, ffn {}, vocab {}",
        c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab
    );
    println!(
        "context {}, rope base {}, rms eps {:e}",
        c.n_ctx_train, c.rope_base, c.rms_eps
    );
    if c.n_rot != c.head_dim {
        println!("rope rotates {} of {} dims per head", c.n_rot, c.head_dim);
    }
    if let Some(factors) = &c.rope_factors {
        let (low, high) = factors
            .iter()
            .fold((f32::INFINITY, 0f32), |(l, h), &f| (l.min(f), h.max(f)));
        println!(
            "rope scaled: {} frequencies divided by {low}..{high}, cos and sin times {}",
            factors.len(),
            c.rope_scale
        );
    }
    if !c.no_rope_layers.is_empty() {
        println!("layers without rope: {:?}", c.no_rope_layers);
    }
    if let Some(x) = &c.experts {
        let weights = if x.normalize {
            "renormalised"
        } else {
            "as scored"
        };
        println!(
            "routed experts: {} of ffn {}, {} per token, weights {weights}",
            x.n_expert, x.n_ff, x.n_used
        );
        if !x.dense_layers.is_empty() {
            println!("dense layers:  {:?}", x.dense_layers);
        }
    }
    if let Some(pooling) = c.pooling {
        println!("embedding pooling: {}", pooling.name());
    }
}

/// A Hugging Face directory: its configuration as pyramid reads it, and its files.
fn inspect_directory(path: &std::path::Path, all: bool) -> Result<()> {
    println!("directory:     {}", path.display());
    let checkpoint = match HfCheckpoint::open(path) {
        Ok(c) => c,
        Err(err) => {
            println!("not runnable by pyramid: {err}");
            return Ok(());
        }
    };
    println!("architecture:  {}", checkpoint.config().arch.name());
    print_config(checkpoint.config());
    let files = checkpoint.files();
    println!("files: {}", files.len());
    if all {
        for file in files {
            println!("  {}", file.display());
        }
    }
    Ok(())
}
