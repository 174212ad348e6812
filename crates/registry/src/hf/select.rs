//! Which files of a repository make the model a [`HfSelector`] asks for, from the list of
//! its paths (the hub's listing, or what a snapshot in the cache holds).
//!
//! A repository with `config.json` and `*.safetensors` is a transformers checkpoint,
//! loaded as a directory. Otherwise it holds GGUF models: one file each, or the parts of a
//! split model (`-00001-of-0000N.gguf`), which count as one. Vision projectors
//! (`mmproj*.gguf`) are never the model.

use std::collections::BTreeMap;

use pyramid_gguf::split::parse_split_file_name;

use super::id::HfSelector;

/// The quantisation chosen when a repository of several GGUF models is named alone, as
/// llama.cpp's `-hf` does.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// The weight index of a sharded transformers checkpoint.
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";

/// The files of a transformers checkpoint the loader reads, besides its weights.
const CHECKPOINT_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    INDEX_FILE,
    "modules.json",
    "1_Pooling/config.json",
];

/// What to fetch, and what the model's path is once fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// A transformers checkpoint: the model is the snapshot directory. With an index,
    /// `files` lacks the shards it names, which are known once it is read.
    Checkpoint {
        files: Vec<String>,
        index: Option<String>,
    },
    /// One GGUF model, all its parts in order; the model's path is the first.
    Gguf { parts: Vec<String> },
}

impl Plan {
    /// The path (relative to the snapshot) that names the model.
    pub(crate) fn target(&self) -> &str {
        match self {
            Plan::Checkpoint { .. } => "",
            Plan::Gguf { parts } => &parts[0],
        }
    }
}

/// One GGUF model among a repository's files: its name (the file, or a split's prefix)
/// and its parts in order, `None` for a part the list lacks.
struct GgufModel {
    name: String,
    parts: Vec<Option<String>>,
}

/// Chooses the files for `selector` among `files`, or says why none fit.
pub(crate) fn plan(files: &[String], selector: &HfSelector) -> Result<Plan, String> {
    match selector {
        HfSelector::File(file) => plan_file(files, file),
        HfSelector::Quant(quant) => plan_quant(files, quant),
        HfSelector::Auto => {
            let top_level = |f: &&String| !f.contains('/');
            let has = |name: &str| files.iter().any(|f| f == name);
            let has_weights = files
                .iter()
                .filter(top_level)
                .any(|f| f.ends_with(".safetensors"));
            if has("config.json") && has_weights {
                return Ok(checkpoint_plan(files));
            }
            let models = gguf_models(files);
            match models.as_slice() {
                [] => Err("has neither GGUF files nor a transformers checkpoint \
                           (config.json and *.safetensors)"
                    .to_string()),
                [model] => complete(model),
                _ => plan_quant(files, DEFAULT_QUANT).map_err(|_| {
                    format!(
                        "has {} GGUF models and none is {DEFAULT_QUANT}: name one with \
                         :QUANT or /FILE ({})",
                        models.len(),
                        names(&models)
                    )
                }),
            }
        }
    }
}

fn plan_file(files: &[String], file: &str) -> Result<Plan, String> {
    if !files.iter().any(|f| f == file) {
        return Err(format!("has no file {file}"));
    }
    let models = gguf_models(files);
    let split_of = |model: &&GgufModel| model.parts.iter().flatten().any(|p| p == file);
    match models.iter().find(split_of) {
        Some(model) => complete(model),
        None => Ok(Plan::Gguf {
            parts: vec![file.to_string()],
        }),
    }
}

fn plan_quant(files: &[String], quant: &str) -> Result<Plan, String> {
    let models = gguf_models(files);
    let matching: Vec<&GgufModel> = models
        .iter()
        .filter(|m| names_quant(&m.name, quant))
        .collect();
    match matching.as_slice() {
        [model] => complete(model),
        [] if models.is_empty() => Err("has no GGUF files".to_string()),
        [] => Err(format!(
            "has no {quant} GGUF file (it has {})",
            names(&models)
        )),
        several => Err(format!(
            "has {} GGUF models for {quant}: name one with /FILE ({})",
            several.len(),
            several
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The small files that are present and every top-level weight file, or with an index,
/// the index instead of the weights.
fn checkpoint_plan(files: &[String]) -> Plan {
    let mut chosen: Vec<String> = CHECKPOINT_FILES
        .iter()
        .filter(|name| files.iter().any(|f| f == *name))
        .map(|name| name.to_string())
        .collect();
    let index = chosen.iter().find(|f| *f == INDEX_FILE).cloned();
    if index.is_none() {
        chosen.extend(
            files
                .iter()
                .filter(|f| !f.contains('/') && f.ends_with(".safetensors"))
                .cloned(),
        );
    }
    Plan::Checkpoint {
        files: chosen,
        index,
    }
}

/// The shards a weight index names, each once, in order.
pub(crate) fn index_shards(index_json: &[u8]) -> Result<Vec<String>, String> {
    let index: serde_json::Value =
        serde_json::from_slice(index_json).map_err(|e| format!("is not JSON: {e}"))?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("has no weight_map")?;
    let mut shards: Vec<String> = Vec::new();
    for shard in map.values() {
        let shard = shard.as_str().ok_or("maps a tensor to a non-string")?;
        if !super::id::is_repo_path(shard) {
            return Err(format!("names a shard outside the repository: {shard}"));
        }
        if !shards.iter().any(|s| s == shard) {
            shards.push(shard.to_string());
        }
    }
    shards.sort();
    Ok(shards)
}

/// The repository's GGUF models, split parts gathered under their prefix.
fn gguf_models(files: &[String]) -> Vec<GgufModel> {
    let mut models: BTreeMap<String, GgufModel> = BTreeMap::new();
    for file in files {
        let base = file.rsplit('/').next().unwrap_or(file);
        if !base.to_ascii_lowercase().ends_with(".gguf")
            || base.to_ascii_lowercase().starts_with("mmproj")
        {
            continue;
        }
        let (name, idx, n_split) = match parse_split_file_name(base) {
            Some((prefix, idx, n_split)) => {
                let dir = &file[..file.len() - base.len()];
                (format!("{dir}{prefix}"), idx, n_split)
            }
            None => (file.clone(), 0, 1),
        };
        let model = models.entry(name.clone()).or_insert_with(|| GgufModel {
            name,
            parts: vec![None; n_split],
        });
        // Parts claiming another count than their first-seen sibling are left out and so
        // make the model incomplete, never a mix.
        if model.parts.len() == n_split {
            model.parts[idx] = Some(file.clone());
        }
    }
    models.into_values().collect()
}

fn complete(model: &GgufModel) -> Result<Plan, String> {
    let n_split = model.parts.len();
    let parts: Vec<String> = model.parts.iter().flatten().cloned().collect();
    if parts.len() != n_split {
        return Err(format!(
            "has {} of the {n_split} parts of {}",
            parts.len(),
            model.name
        ));
    }
    Ok(Plan::Gguf { parts })
}

fn names(models: &[GgufModel]) -> String {
    models
        .iter()
        .map(|m| m.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `name` carries `quant` as a whole word, in any case: `Q4_K` is not in
/// `Q4_K_M`, nor `Q4_XS` in `IQ4_XS`.
fn names_quant(name: &str, quant: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let quant = quant.to_ascii_lowercase();
    name.match_indices(&quant).any(|(at, _)| {
        let before = name[..at].chars().next_back();
        let after = name[at + quant.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric())
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn gguf(parts: &[&str]) -> Result<Plan, String> {
        Ok(Plan::Gguf {
            parts: files(parts),
        })
    }

    const GGUF_REPO: &[&str] = &[
        "README.md",
        "Qwen3-8B-Q4_K_M.gguf",
        "Qwen3-8B-Q4_K_S.gguf",
        "Qwen3-8B-IQ4_XS.gguf",
        "Qwen3-8B-Q8_0.gguf",
        "mmproj-F16.gguf",
        "BF16/Qwen3-8B-BF16-00002-of-00002.gguf",
        "BF16/Qwen3-8B-BF16-00001-of-00002.gguf",
    ];

    #[test]
    fn quantisations_are_matched_as_whole_words_in_any_case() {
        let repo = files(GGUF_REPO);
        let pick = |quant: &str| plan(&repo, &HfSelector::Quant(quant.into()));
        assert_eq!(pick("q4_k_m"), gguf(&["Qwen3-8B-Q4_K_M.gguf"]));
        assert_eq!(pick("Q4_XS"), Err("has no Q4_XS GGUF file (it has BF16/Qwen3-8B-BF16, Qwen3-8B-IQ4_XS.gguf, Qwen3-8B-Q4_K_M.gguf, Qwen3-8B-Q4_K_S.gguf, Qwen3-8B-Q8_0.gguf)".into()));
        assert_eq!(
            pick("bf16"),
            gguf(&[
                "BF16/Qwen3-8B-BF16-00001-of-00002.gguf",
                "BF16/Qwen3-8B-BF16-00002-of-00002.gguf"
            ])
        );
        assert!(pick("Q4_K").unwrap_err().contains("no Q4_K GGUF"));
        // Alone, the repository gives llama.cpp's default.
        assert_eq!(
            plan(&repo, &HfSelector::Auto),
            gguf(&["Qwen3-8B-Q4_K_M.gguf"])
        );
    }

    #[test]
    fn a_named_file_brings_its_split_siblings() {
        let repo = files(GGUF_REPO);
        let by_file = |file: &str| plan(&repo, &HfSelector::File(file.into()));
        assert_eq!(
            by_file("BF16/Qwen3-8B-BF16-00002-of-00002.gguf"),
            gguf(&[
                "BF16/Qwen3-8B-BF16-00001-of-00002.gguf",
                "BF16/Qwen3-8B-BF16-00002-of-00002.gguf"
            ])
        );
        assert_eq!(by_file("Qwen3-8B-Q8_0.gguf"), gguf(&["Qwen3-8B-Q8_0.gguf"]));
        assert_eq!(by_file("nope.gguf"), Err("has no file nope.gguf".into()));
        let missing = files(&["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"]);
        assert_eq!(
            plan(&missing, &HfSelector::Auto),
            Err("has 2 of the 3 parts of m".into())
        );
    }

    #[test]
    fn without_a_default_quant_the_choices_are_listed() {
        let repo = files(&["a-Q8_0.gguf", "a-F16.gguf", "mmproj-a.gguf"]);
        let err = plan(&repo, &HfSelector::Auto).unwrap_err();
        assert!(
            err.contains("a-F16.gguf, a-Q8_0.gguf") && !err.contains("mmproj"),
            "{err}"
        );
        let one = files(&["a-Q8_0.gguf", "mmproj-a.gguf"]);
        assert_eq!(plan(&one, &HfSelector::Auto), gguf(&["a-Q8_0.gguf"]));
    }

    #[test]
    fn a_transformers_repository_is_a_checkpoint_directory() {
        let repo = files(&[
            "config.json",
            "tokenizer.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            INDEX_FILE,
            "README.md",
            "original/consolidated.safetensors",
            "model-Q8_0.gguf",
        ]);
        let plan = plan(&repo, &HfSelector::Auto).unwrap();
        assert_eq!(
            plan,
            Plan::Checkpoint {
                files: files(&["config.json", "tokenizer.json", INDEX_FILE]),
                index: Some(INDEX_FILE.into())
            }
        );
        assert_eq!(plan.target(), "");
        let index = br#"{"metadata": {}, "weight_map": {"a": "model-00002-of-00002.safetensors",
            "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}}"#;
        assert_eq!(
            index_shards(index),
            Ok(files(&[
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]))
        );
        assert!(index_shards(br#"{"weight_map": {"a": "../x.safetensors"}}"#).is_err());
    }
}
