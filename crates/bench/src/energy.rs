//! Energy from the Linux powercap interface (RAPL): `/sys/class/powercap/*rapl*/`.
//!
//! Each domain directory holds `name` (`package-0`, `core`, `uncore`, `dram`, `psys`),
//! `energy_uj` (a counter in microjoules that wraps at `max_energy_range_uj`). A
//! measurement reads every counter before and after, handles one wrap per domain, and
//! subtracts an idle baseline measured in the same run, so a cell's joules are what the
//! work added. Where RAPL is absent or unreadable (VMs; counters are root-only on recent
//! kernels) the result says why; it is never zero. The root is a parameter so tests run
//! on fabricated trees with scripted counters.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where powercap lives unless `--powercap-root` or this variable says otherwise.
pub const DEFAULT_ROOT: &str = "/sys/class/powercap";
pub const ROOT_ENV: &str = "PYRAMID_POWERCAP_ROOT";

/// The root to read: `given`, else `PYRAMID_POWERCAP_ROOT`, else the system's.
pub fn root(given: Option<&Path>) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(ROOT_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT))
}

#[derive(Debug, Clone)]
struct Domain {
    /// `package-0`, `core`, … as the kernel names it.
    name: String,
    energy: PathBuf,
    max_range_uj: u64,
}

/// The RAPL domains of one machine.
#[derive(Debug, Clone)]
pub struct Powercap {
    domains: Vec<Domain>,
}

/// One reading of every domain's counter, in microjoules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters(Vec<u64>);

fn read_u64(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => format!(
            "{} is not readable (RAPL counters are root-only on Linux 5.10 and later)",
            path.display()
        ),
        _ => format!("{} is not readable: {e}", path.display()),
    })?;
    text.trim()
        .parse()
        .map_err(|_| format!("{} holds '{}', not a counter", path.display(), text.trim()))
}

impl Powercap {
    /// Finds every RAPL domain under `root` and checks its counter reads. The error is
    /// the reason energy is unavailable.
    pub fn open(root: &Path) -> Result<Self, String> {
        let entries = std::fs::read_dir(root)
            .map_err(|e| format!("no powercap interface at {}: {e}", root.display()))?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.contains("rapl"))
                    && p.join("energy_uj").exists()
            })
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(format!("no RAPL domains under {}", root.display()));
        }
        let domains = dirs
            .into_iter()
            .map(|dir| {
                let name = std::fs::read_to_string(dir.join("name"))
                    .map(|n| n.trim().to_string())
                    .unwrap_or_else(|_| {
                        dir.file_name()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .into_owned()
                    });
                let max_range_uj = read_u64(&dir.join("max_energy_range_uj"))?;
                let energy = dir.join("energy_uj");
                read_u64(&energy)?;
                Ok(Domain {
                    name,
                    energy,
                    max_range_uj,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { domains })
    }

    pub fn domain_names(&self) -> Vec<&str> {
        self.domains.iter().map(|d| d.name.as_str()).collect()
    }

    pub fn read(&self) -> Result<Counters, String> {
        self.domains
            .iter()
            .map(|d| read_u64(&d.energy))
            .collect::<Result<_, _>>()
            .map(Counters)
    }

    /// Microjoules per domain from `before` to `after`, allowing one wrap of each counter.
    fn deltas(&self, before: &Counters, after: &Counters) -> Vec<u64> {
        self.domains
            .iter()
            .zip(before.0.iter().zip(&after.0))
            .map(|(d, (&b, &a))| {
                if a >= b {
                    a - b
                } else {
                    // The counter passed max_energy_range_uj and restarted from zero.
                    d.max_range_uj.saturating_sub(b) + a
                }
            })
            .collect()
    }

    /// Idle power per domain from two readings `seconds` apart with nothing running.
    pub fn baseline(&self, before: &Counters, after: &Counters, seconds: f64) -> Baseline {
        let watts = self
            .deltas(before, after)
            .into_iter()
            .map(|uj| uj as f64 * 1e-6 / seconds.max(1e-9))
            .collect();
        Baseline { watts }
    }

    /// The energy between two readings `seconds` apart, net of `baseline`.
    pub fn energy(
        &self,
        before: &Counters,
        after: &Counters,
        seconds: f64,
        baseline: &Baseline,
    ) -> Energy {
        let domains: Vec<DomainEnergy> = self
            .domains
            .iter()
            .zip(self.deltas(before, after))
            .zip(&baseline.watts)
            .map(|((d, uj), &idle_w)| {
                let joules = uj as f64 * 1e-6;
                DomainEnergy {
                    name: d.name.clone(),
                    joules,
                    idle_joules: idle_w * seconds,
                    net_joules: joules - idle_w * seconds,
                }
            })
            .collect();
        let sum = |prefix: &str| -> Option<f64> {
            let mut found = false;
            let total = domains
                .iter()
                .filter(|d| d.name.starts_with(prefix))
                .inspect(|_| found = true)
                .map(|d| d.net_joules)
                .sum();
            found.then_some(total)
        };
        let npu_residual_joules = match (sum("npu"), sum("package"), sum("core")) {
            (None, Some(package), Some(core)) => {
                Some(package - core - sum("uncore").unwrap_or(0.0) - sum("dram").unwrap_or(0.0))
            }
            _ => None,
        };
        Energy {
            seconds,
            package_joules: sum("package"),
            npu_residual_joules,
            domains,
        }
    }
}

/// Idle watts per domain.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    watts: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainEnergy {
    pub name: String,
    /// What the counter advanced.
    pub joules: f64,
    /// What the idle baseline would have used in the same time.
    pub idle_joules: f64,
    /// `joules - idle_joules`: what the work added.
    pub net_joules: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Energy {
    pub seconds: f64,
    /// Net joules of every `package-*` domain together: the cell's headline energy.
    pub package_joules: Option<f64>,
    /// package − core − uncore − dram (net), on platforms without an NPU domain: where an
    /// NPU's energy shows up.
    pub npu_residual_joules: Option<f64>,
    pub domains: Vec<DomainEnergy>,
}

/// A cell's energy, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnergyReport {
    Measured(Energy),
    Unavailable(String),
}

impl EnergyReport {
    /// Net package joules per token, when measured.
    pub fn joules_per_token(&self, tokens: usize) -> Option<f64> {
        match self {
            EnergyReport::Measured(e) if tokens > 0 => e.package_joules.map(|j| j / tokens as f64),
            _ => None,
        }
    }
}
