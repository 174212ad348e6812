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
//! every artifact of a model reads the one `weights.bin` on import, instead of each
//! blob embedding its own copy (635 MB per Qwen2.5-0.5B artifact).

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
}

/// One model's directory in the store, for one weight format.
pub(crate) struct ModelStore {
    dir: PathBuf,
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
        let store = Self { dir };
        store.write_weights(weights).map_err(|e| OvError::Store {
            path: store.weights_path().display().to_string(),
            message: e.to_string(),
        })?;
        Ok(store)
    }

    pub fn weights_path(&self) -> PathBuf {
        self.dir.join("weights.bin")
    }

    /// Writes the constants once; the rename is the commit point, so a reader never sees
    /// a half-written file and two processes writing at once both leave a whole one.
    fn write_weights(&self, weights: &[u8]) -> std::io::Result<()> {
        let path = self.weights_path();
        if fs::metadata(&path).is_ok_and(|m| m.len() == weights.len() as u64) {
            return Ok(());
        }
        fs::create_dir_all(&self.dir)?;
        let partial = self
            .dir
            .join(format!("weights.bin.{}.partial", std::process::id()));
        let mut file = fs::File::create(&partial)?;
        file.write_all(weights)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&partial, &path)
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
