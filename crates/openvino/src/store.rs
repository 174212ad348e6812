//! Compiled artifacts kept across starts.
//!
//! An NPU compiles a graph for tens of seconds to minutes; without a store, every fresh
//! start of the window pyramid stalls on it. OpenVINO has the mechanism (a cache
//! directory of compiled blobs, looked up by a hash of the graph, its properties, the
//! device and the OpenVINO build); pyramid decides where the blobs live and keeps the
//! weights out of them.
//!
//! Layout: `<root>/openvino-<version>/<model id>-<format>-<weights digest>/` holds the
//! graphs' constants once, as `weights.bin`, and one directory of blobs per device.
//! The weights digest (CRC-32 and length of the constants as the graphs hold them) keeps
//! a change in how pyramid lays out a format from ever meeting blobs of the old one. On
//! devices that take `WEIGHTS_PATH` the blobs are weightless (`CACHE_MODE=OPTIMIZE_SIZE`):
//! every artifact of a model reads the one `weights.bin` on import instead of embedding
//! its own copy, for the constants the plugin keeps as given (the CPU plugin: f32, f16
//! and bf16 weights). Constants a plugin repacks (the CPU plugin's grouped INT8 and
//! INT4) are written into each blob, so the store keeps a budget of blob bytes and
//! removes the oldest beyond it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::graph::WeightFormat;
use crate::ov::Core;
use crate::{OvError, Result};

/// Where compiled artifacts are kept, and for which model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreKey {
    /// The store's root, e.g. `$PYRAMID_HOME/compiled`.
    pub root: PathBuf,
    /// Identifies the model's source by content (`ModelCache::model_identity`).
    pub model_id: u64,
    /// Bytes of blobs the whole store may hold: after a compile adds one, the oldest go
    /// first. (A blob of grouped INT8 weights holds the plugin's repacked copy of them.)
    pub budget_bytes: u64,
}

/// The blobs' budget when none is given: 20 GiB.
pub const DEFAULT_BUDGET_BYTES: u64 = 20 << 30;

/// One model's directory in the store, for one weight format.
pub(crate) struct ModelStore {
    dir: PathBuf,
    root: PathBuf,
    budget_bytes: u64,
}

impl ModelStore {
    /// The directory for `key`'s model with `weights` (the graphs' constants) stored as
    /// `format`, under OpenVINO `version`; writes `weights.bin` unless it is there.
    pub fn open(
        key: &StoreKey,
        version: &str,
        format: WeightFormat,
        weights: &[u8],
    ) -> Result<Self> {
        let digest = crc32fast::hash(weights);
        // The version names the build too ("2026.4.1-22982-…-releases/2026/4").
        let version = version.replace(['/', '\\', ' '], "-");
        let dir = key.root.join(format!("openvino-{version}")).join(format!(
            "{:016x}-{}-{digest:08x}-{}",
            key.model_id,
            format.name(),
            weights.len()
        ));
        let store = Self {
            dir,
            root: key.root.clone(),
            budget_bytes: key.budget_bytes,
        };
        write_once(&store.weights_path(), weights).map_err(|e| OvError::Store {
            path: store.weights_path().display().to_string(),
            message: e.to_string(),
        })?;
        Ok(store)
    }

    pub fn weights_path(&self) -> PathBuf {
        self.dir.join("weights.bin")
    }

    /// The compile properties that keep `device`'s blobs here: weightless where the
    /// device reads constants from `WEIGHTS_PATH`, whole otherwise.
    pub fn properties(&self, core: &Core, device: &str) -> Vec<(String, String)> {
        let blobs = self.dir.join(device);
        let mut properties = vec![("CACHE_DIR".to_string(), path_text(&blobs))];
        if supports(core, device, "WEIGHTS_PATH") {
            properties.push(("CACHE_MODE".into(), "OPTIMIZE_SIZE".into()));
            properties.push(("WEIGHTS_PATH".into(), path_text(&self.weights_path())));
        } else {
            properties.push(("CACHE_MODE".into(), "OPTIMIZE_SPEED".into()));
        }
        properties
    }
}

impl ModelStore {
    /// Removes the oldest blobs of the whole store until it is within its budget; called
    /// after a compile wrote one. Blobs another process is reading stay readable (Linux
    /// keeps an open file), and a blob gone is a compile next time, never an error.
    pub fn trim(&self) {
        let mut blobs = Vec::new();
        // <root>/openvino-<build>/<model>/<device>/<hash>.blob
        for build in entries(&self.root) {
            for model in entries(&build) {
                for device in entries(&model) {
                    for blob in entries(&device) {
                        if blob.extension().is_some_and(|e| e == "blob") {
                            if let Ok(meta) = fs::metadata(&blob) {
                                let when = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                                blobs.push((when, meta.len(), blob));
                            }
                        }
                    }
                }
            }
        }
        let mut total: u64 = blobs.iter().map(|b| b.1).sum();
        blobs.sort();
        // The newest blob is the one just written: it stays whatever it weighs.
        blobs.pop();
        for (_, bytes, path) in blobs {
            if total <= self.budget_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= bytes;
            }
        }
    }
}

/// Writes `bytes` to `path` unless a file of their length is there. The rename is the
/// commit point, so a reader never sees a half-written file and two processes writing at
/// once both leave a whole one.
pub(crate) fn write_once(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if fs::metadata(path).is_ok_and(|m| m.len() == bytes.len() as u64) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let partial = dir.join(format!("{name}.{}.partial", std::process::id()));
    let mut file = fs::File::create(&partial)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&partial, path)
}

/// The entries of `dir` (none when it cannot be read).
fn entries(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Whether `device` lists `property` among its supported properties.
fn supports(core: &Core, device: &str, property: &str) -> bool {
    core.device_property(device, "SUPPORTED_PROPERTIES")
        .is_ok_and(|list| {
            list.split([' ', ',', '\n'])
                .any(|p| p.split(':').next() == Some(property))
        })
}
