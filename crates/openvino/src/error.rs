use pyramid_runtime::ArtifactShape;

#[derive(Debug, Clone, thiserror::Error)]
pub enum OvError {
    #[error(
        "OpenVINO is not installed: {reason}. Run scripts/setup-openvino.sh (it unpacks the \
         `openvino` wheel from PyPI into the pyramid cache) or point PYRAMID_OPENVINO_LIB at \
         libopenvino_c.so"
    )]
    NotInstalled { reason: String },
    #[error("{path} is not an OpenVINO C library pyramid can use: {detail} (pyramid needs OpenVINO 2026.0 or newer; scripts/setup-openvino.sh installs one)")]
    WrongVersion { path: String, detail: String },
    #[error("OpenVINO {call} failed: {message}")]
    Call { call: &'static str, message: String },
    #[error(
        "OpenVINO device '{device}' is not present on this machine (available: {})",
        .available.join(", ")
    )]
    DeviceNotPresent {
        device: String,
        available: Vec<String>,
    },
    #[error("compiling {shape} for OpenVINO {device} failed: {message}")]
    Compile {
        shape: ArtifactShape,
        device: String,
        message: String,
    },
    #[error("the OpenVINO backend cannot run this model: {0}")]
    Unsupported(String),
    #[error("cannot keep compiled artifacts in {path}: {message}")]
    Store { path: String, message: String },
    #[error("writing graphs to {dir} (PYRAMID_OV_DUMP) failed: {message}")]
    Dump { dir: String, message: String },
    #[error("bad OpenVINO compile option '{0}': expected KEY=VALUE")]
    BadOption(String),
}

pub type Result<T, E = OvError> = std::result::Result<T, E>;
