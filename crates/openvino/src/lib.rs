//! The OpenVINO backend: how pyramid runs on Intel NPUs and iGPUs (and, with the same
//! static graphs, on OpenVINO's CPU plugin).
//!
//! - [`library`]: OpenVINO is loaded at run time from the `openvino` wheel's libraries
//!   (`scripts/setup-openvino.sh`) or `PYRAMID_OPENVINO_LIB`; nothing links it at build
//!   time, and the native backend never touches it.
//! - [`ir`] and [`graph`]: pyramid writes the transformer as OpenVINO IR itself, one
//!   static graph per artifact shape, with the KV cache as explicit host inputs and
//!   outputs (no OpenVINO state).
//! - [`OvBackend`]: compiles those graphs for `ov:CPU`, `ov:GPU`, `ov:NPU` and reports
//!   the device that really executes each artifact.
//! - [`store`]: compiled artifacts kept across starts, weightless where the device
//!   allows.
//!
//! Invariant: an artifact's results depend only on its inputs; a session's cache lives in
//! its `KvCache`, so migrating between windows or handing a cache from one device's
//! artifact to another's is the host copy it is on the native backend.

mod backend;
mod error;
pub mod graph;
pub mod ir;
pub mod library;
mod ov;
mod probe;
pub mod store;

pub use backend::{DecodeLayout, OvBackend, OvOptions, DECODE_LAYOUT_KEY, DUMP_ENV};
pub use error::{OvError, Result};
pub use graph::{OutlierChannels, WeightFormat};
pub use probe::{OvProbe, ProbeGraph};
pub use store::{StoreKey, DEFAULT_BUDGET_BYTES};

/// One OpenVINO device and what it says about itself.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// As pyramid names it: `ov:CPU`, `ov:GPU.0`, …
    pub name: String,
    pub properties: Vec<(String, String)>,
}

/// Properties `pyramid devices` shows when a device has them.
const SHOWN_PROPERTIES: [&str; 4] = [
    "FULL_DEVICE_NAME",
    "DEVICE_ARCHITECTURE",
    "OPTIMIZATION_CAPABILITIES",
    "DEVICE_TYPE",
];

/// The OpenVINO version and every device it finds here.
pub fn devices() -> Result<(String, Vec<DeviceInfo>)> {
    let lib = library::load()?;
    let core = ov::Core::new()?;
    let devices = core
        .available_devices()?
        .into_iter()
        .map(|d| DeviceInfo {
            properties: SHOWN_PROPERTIES
                .iter()
                .filter_map(|&k| Some((k.to_string(), core.device_property(&d, k).ok()?)))
                .collect(),
            name: format!("ov:{d}"),
        })
        .collect();
    Ok((lib.version.clone(), devices))
}
