//! What a model is, by content: the SHA-256 of every byte of its files.
//!
//! Session files, compiled artifacts and calibrations are keyed by it, so two fine-tunes
//! of one base (the same shapes and metadata, other weights) never share one. Reading a
//! multi-GB file through takes seconds, so each file's digest is remembered under the
//! cache (`<cache>/identity/`), keyed by its path and trusted only while the file keeps
//! its size and modification time; a file rewritten in place is read again.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use crate::error::io_err;
use crate::fetch::hex;
use crate::{ModelCache, Result};

/// A file's size and modification time (ns since the epoch): what its memo must match.
type Stamp = (u64, u128);

impl ModelCache {
    /// The identity of a model made of `files` (a GGUF file, or a directory's config,
    /// weights and tokenizer, in a fixed order): the first 8 bytes of the SHA-256 of their
    /// digests in that order.
    pub fn model_identity(&self, files: &[PathBuf]) -> Result<u64> {
        let mut all = Sha256::new();
        for file in files {
            all.update(self.content_digest(file)?);
        }
        let digest = all.finalize();
        let mut head = [0u8; 8];
        head.copy_from_slice(&digest[..8]);
        Ok(u64::from_le_bytes(head))
    }

    /// The SHA-256 of `path`'s bytes, from its memo when the file is unchanged. A memo
    /// that cannot be written only costs the next start a read of the file.
    pub fn content_digest(&self, path: &Path) -> Result<[u8; 32]> {
        let stamp = stamp(path).map_err(io_err("read", path))?;
        let memo = self.memo_path(path);
        if let Some(digest) = read_memo(&memo, stamp) {
            return Ok(digest);
        }
        let digest = digest_of(path).map_err(io_err("read", path))?;
        let _ = write_memo(&memo, stamp, &digest, path);
        Ok(digest)
    }

    fn memo_path(&self, path: &Path) -> PathBuf {
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let key = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
        self.root().join("identity").join(hex(&key[..12]))
    }
}

fn stamp(path: &Path) -> io::Result<Stamp> {
    let meta = std::fs::metadata(path)?;
    let modified = meta
        .modified()?
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok((meta.len(), modified))
}

fn digest_of(path: &Path) -> io::Result<[u8; 32]> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

/// A memo is one line, `size mtime_ns sha256`, then the file's path (for people).
fn read_memo(memo: &Path, (size, modified): Stamp) -> Option<[u8; 32]> {
    let text = std::fs::read_to_string(memo).ok()?;
    let mut fields = text.lines().next()?.split(' ');
    let matches = fields.next()? == size.to_string() && fields.next()? == modified.to_string();
    let hex_digest = fields.next()?;
    if !matches || hex_digest.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex_digest.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(digest)
}

fn write_memo(memo: &Path, (size, modified): Stamp, digest: &[u8], path: &Path) -> io::Result<()> {
    let dir = memo
        .parent()
        .expect("a memo lives in the identity directory");
    std::fs::create_dir_all(dir)?;
    let tmp = memo.with_extension(format!("tmp{}", std::process::id()));
    let text = format!("{size} {modified} {}\n{}\n", hex(digest), path.display());
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, memo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_differing_only_in_the_middle_differ_and_a_rewrite_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModelCache::new(dir.path().join("cache"));
        let base = dir.path().join("base.gguf");
        let tuned = dir.path().join("tuned.gguf");
        // Three MiB alike but for one byte in the middle: a head-and-tail id saw none.
        let mut bytes = vec![7u8; 3 << 20];
        std::fs::write(&base, &bytes).unwrap();
        bytes[3 << 19] = 8;
        std::fs::write(&tuned, &bytes).unwrap();
        let id = |p: &Path| cache.model_identity(&[p.to_path_buf()]).unwrap();
        assert_ne!(id(&base), id(&tuned));
        assert_eq!(
            cache.content_digest(&base).unwrap(),
            <[u8; 32]>::from(Sha256::digest(vec![7u8; 3 << 20]))
        );
        // The memo answers while the file is unchanged...
        let memo = cache.memo_path(&base);
        assert!(memo.is_file());
        let before = id(&base);
        assert_eq!(id(&base), before);
        // ...and a file rewritten (another size) is read again.
        std::fs::write(&base, b"other weights").unwrap();
        assert_ne!(id(&base), before);
        assert_eq!(
            cache.content_digest(&base).unwrap(),
            <[u8; 32]>::from(Sha256::digest(b"other weights"))
        );
    }

    #[test]
    fn a_damaged_memo_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModelCache::new(dir.path().join("cache"));
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"weights").unwrap();
        let right = cache.content_digest(&file).unwrap();
        let memo = cache.memo_path(&file);
        let text = std::fs::read_to_string(&memo).unwrap();
        std::fs::write(&memo, text.replace(&hex(&right)[..4], "zz")).unwrap();
        assert_eq!(cache.content_digest(&file).unwrap(), right);
    }
}
