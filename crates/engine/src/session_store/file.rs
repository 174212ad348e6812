//! One session file: its layout (see the parent module), written atomically and read
//! with every length and checksum checked.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use pyramid_model::{KvCache, KvType, ModelConfig, ModelError};

const MAGIC: &[u8; 8] = b"PYRSESS\0";
/// The layout this build reads and writes.
pub const SESSION_VERSION: u32 = 1;
/// Extension of session files in a [`SessionStore`] directory.
pub const SESSION_EXT: &str = "pyrsession";
/// Magic, version, model id, KV type, shape, window, token count, precision length,
/// note length.
const FIXED_HEADER_BYTES: u64 = 8 + 4 + 8 + 1 + 3 * 4 + 4 + 4 + 2 + 4;
/// Large enough that a cache's runs go to and from the file in few system calls.
const IO_BUFFER_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a session file", path.display())]
    NotASessionFile { path: PathBuf },
    #[error("{}: session format version {found}, this build reads {expected}", path.display())]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{}: written for another setup ({what})", path.display())]
    OtherModel { path: PathBuf, what: String },
    #[error("{}: corrupt session file: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// The conversation or cache handed in does not fit: the caller's mistake, not the
    /// file's.
    #[error("{}: {reason}", path.display())]
    BadCache { path: PathBuf, reason: String },
    /// Another process keeps its conversations in this directory.
    #[error("{}: the session directory is in use by another process", path.display())]
    Locked { path: PathBuf },
}

/// Tokens a session file may hold: far beyond any model's context, and a bound on what
/// indexing a crafted (sparse) file can make it read.
pub const MAX_SESSION_TOKENS: u32 = 1 << 22;
/// Bytes of a session file's note (`pyramid chat` keeps its messages there).
pub const MAX_NOTE_BYTES: u32 = 64 << 20;

pub(super) fn io_error(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a file must match to be resumed: the model file, the weights' precision, the KV
/// type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionIdentity {
    pub model_id: u64,
    pub precision: String,
    pub kv_type: KvType,
    pub n_layer: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

impl SessionIdentity {
    pub fn new(model_id: u64, precision: &str, kv_type: KvType, cfg: &ModelConfig) -> Self {
        Self {
            model_id,
            precision: precision.to_string(),
            kv_type,
            n_layer: cfg.n_layer,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
        }
    }

    /// Layers, KV heads and head size, as `KvCache::shape` gives them.
    pub(super) fn shape(&self) -> (usize, usize, usize) {
        (self.n_layer, self.n_head_kv, self.head_dim)
    }

    /// Bytes `KvCache::write_live` writes for `n_pos` positions (its `written_bytes`),
    /// or `None` past u64.
    pub(super) fn kv_bytes(&self, n_pos: u64) -> Option<u64> {
        let hd = self.head_dim as u64;
        let row = match self.kv_type {
            KvType::F32 => hd.checked_mul(4)?,
            KvType::F16 => hd.checked_mul(2)?,
            KvType::Int8 => hd.checked_add(4)?,
        };
        2u64.checked_mul(self.n_layer as u64)?
            .checked_mul(self.n_head_kv as u64)?
            .checked_mul(n_pos)?
            .checked_mul(row)
    }

    /// The size of a file of `n_tokens` tokens.
    pub(super) fn file_bytes(&self, n_tokens: u64) -> Option<u64> {
        self.file_bytes_with(self.precision.len() as u64, 0, n_tokens)
    }

    /// As [`Self::file_bytes`] with a precision name of `precision_len` bytes and a note
    /// of `note_len`.
    pub(super) fn file_bytes_with(
        &self,
        precision_len: u64,
        note_len: u64,
        n_tokens: u64,
    ) -> Option<u64> {
        (FIXED_HEADER_BYTES + precision_len)
            .checked_add(note_len)?
            .checked_add(n_tokens.checked_mul(4)?)?
            .checked_add(4)?
            .checked_add(self.kv_bytes(n_tokens)?)?
            .checked_add(4)
    }

    /// Why a file of `file` cannot be resumed by this setup, or `None` if it can.
    pub(super) fn mismatch(&self, file: &SessionIdentity) -> Option<String> {
        if file.model_id != self.model_id {
            return Some(format!(
                "model id {:016x}, this server runs {:016x}",
                file.model_id, self.model_id
            ));
        }
        if file.precision != self.precision {
            return Some(format!(
                "precision {}, this server runs {}",
                file.precision, self.precision
            ));
        }
        if file.kv_type != self.kv_type {
            return Some(format!(
                "KV type {}, this server runs {}",
                file.kv_type, self.kv_type
            ));
        }
        let shape = |i: &SessionIdentity| (i.n_layer, i.n_head_kv, i.head_dim);
        if shape(file) != shape(self) {
            let (l, h, d) = shape(file);
            let (sl, sh, sd) = shape(self);
            return Some(format!(
                "KV shape {l}×{h}×{d} (layers × KV heads × head dim), this server runs {sl}×{sh}×{sd}"
            ));
        }
        None
    }
}

pub(super) fn kv_type_code(kind: KvType) -> u8 {
    match kind {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Int8 => 2,
    }
}

fn kv_type_from_code(code: u8) -> Option<KvType> {
    KvType::ALL.into_iter().find(|&k| kv_type_code(k) == code)
}

/// A session file's header: enough to index it and to allocate the cache it loads into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionHeader {
    pub identity: SessionIdentity,
    /// The window the conversation ran on: allocate the cache for this (checked against
    /// the header checksum; still clamp it to your own ladder).
    pub window: usize,
    pub tokens: Vec<u32>,
    /// What the writer kept beside the conversation (`pyramid chat`: its messages).
    pub note: Vec<u8>,
    /// The whole file's size.
    pub file_bytes: u64,
}

/// A conversation as stored: its tokens, the window it ran on, and its cache.
pub struct StoredSession {
    pub tokens: Vec<u32>,
    pub window: usize,
    pub kv: KvCache,
    pub note: Vec<u8>,
}

/// A reader that checksums what passes through it.
struct CrcReader<R> {
    inner: R,
    crc: crc32fast::Hasher,
}

impl<R: Read> Read for CrcReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
}

impl<R> CrcReader<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            crc: crc32fast::Hasher::new(),
        }
    }

    fn crc(&self) -> u32 {
        self.crc.clone().finalize()
    }
}

/// A writer that checksums and counts what passes through it.
struct CrcWriter<W> {
    inner: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W> CrcWriter<W> {
    fn crc(&self) -> u32 {
        self.crc.clone().finalize()
    }
}

fn get<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// An I/O error while reading `path`: running out of bytes means a short file.
fn read_error(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |e| match e.kind() {
        io::ErrorKind::UnexpectedEof => StoreError::Corrupt {
            path: path.to_path_buf(),
            reason: "truncated".to_string(),
        },
        _ => StoreError::Io {
            path: path.to_path_buf(),
            source: e,
        },
    }
}

/// Reads and checks everything before the KV from a file of `file_bytes` bytes.
fn parse_header<R: Read>(
    r: &mut CrcReader<R>,
    path: &Path,
    file_bytes: u64,
) -> Result<SessionHeader, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let eof = read_error(path);
    let not_session = || StoreError::NotASessionFile {
        path: path.to_path_buf(),
    };
    if file_bytes < MAGIC.len() as u64 || &get::<8>(r).map_err(&eof)? != MAGIC {
        return Err(not_session());
    }
    let version = u32::from_le_bytes(get(r).map_err(&eof)?);
    if version != SESSION_VERSION {
        return Err(StoreError::Version {
            path: path.to_path_buf(),
            found: version,
            expected: SESSION_VERSION,
        });
    }
    let model_id = u64::from_le_bytes(get(r).map_err(&eof)?);
    let [kv_code] = get(r).map_err(&eof)?;
    let mut u32s = [0u32; 5];
    for x in &mut u32s {
        *x = u32::from_le_bytes(get(r).map_err(&eof)?);
    }
    let [n_layer, n_head_kv, head_dim, window, n_tokens] = u32s;
    let precision_len = u16::from_le_bytes(get(r).map_err(&eof)?);
    let note_len = u32::from_le_bytes(get(r).map_err(&eof)?);
    let kv_type =
        kv_type_from_code(kv_code).ok_or_else(|| corrupt(format!("unknown KV type {kv_code}")))?;
    if window < n_tokens {
        return Err(corrupt(format!(
            "{n_tokens} tokens on a window of {window}"
        )));
    }
    if n_tokens > MAX_SESSION_TOKENS || note_len > MAX_NOTE_BYTES {
        return Err(corrupt(format!(
            "{n_tokens} tokens and a note of {note_len} bytes, beyond the bounds of \
             {MAX_SESSION_TOKENS} and {MAX_NOTE_BYTES}"
        )));
    }
    let mut identity = SessionIdentity {
        model_id,
        precision: String::new(), // read below, once its length is known to fit
        kv_type,
        n_layer: n_layer as usize,
        n_head_kv: n_head_kv as usize,
        head_dim: head_dim as usize,
    };
    // Every length is bounded by the file's size before anything is allocated from it.
    let expected = identity.file_bytes_with(precision_len as u64, note_len as u64, n_tokens as u64);
    if expected != Some(file_bytes) {
        return Err(corrupt(match expected {
            Some(b) => format!("the header describes {b} bytes, the file has {file_bytes}"),
            None => "the header's lengths overflow".to_string(),
        }));
    }
    let mut precision = vec![0; precision_len as usize];
    r.read_exact(&mut precision).map_err(&eof)?;
    identity.precision =
        String::from_utf8(precision).map_err(|_| corrupt("precision is not UTF-8".into()))?;
    let mut note = vec![0; note_len as usize];
    r.read_exact(&mut note).map_err(&eof)?;
    let mut token_bytes = vec![0; n_tokens as usize * 4];
    r.read_exact(&mut token_bytes).map_err(&eof)?;
    let tokens = token_bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let computed = r.crc();
    let stored = u32::from_le_bytes(get(r).map_err(&eof)?);
    if stored != computed {
        return Err(corrupt(format!(
            "header checksum {stored:08x}, computed {computed:08x}"
        )));
    }
    Ok(SessionHeader {
        identity,
        window: window as usize,
        tokens,
        note,
        file_bytes,
    })
}

/// Opens `path` with its size.
/// Opens a session file for reading: without blocking (a FIFO named like a session file
/// must not hang the caller), and only if it is a regular file.
fn open_sized(path: &Path) -> Result<(File, u64), StoreError> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(io_error(path))?;
    let metadata = file.metadata().map_err(io_error(path))?;
    if !metadata.is_file() {
        return Err(StoreError::NotASessionFile {
            path: path.to_path_buf(),
        });
    }
    Ok((file, metadata.len()))
}

/// Reads a session file's header (identity, window, tokens, size) without its KV: what
/// indexing a directory and allocating the cache to load into need.
pub fn read_header(path: &Path) -> Result<SessionHeader, StoreError> {
    let (file, file_bytes) = open_sized(path)?;
    parse_header(
        &mut CrcReader::new(BufReader::with_capacity(64 * 1024, file)),
        path,
        file_bytes,
    )
}

/// Reads a whole session file into `kv`: an empty cache of this identity's model and KV
/// type, allocated (compact or reserved, as the caller runs it) for at least the header's
/// window. Checks the identity, every length against the file's size, and the checksums;
/// a mismatch is an error naming the file and the problem.
pub fn load_session(
    path: &Path,
    identity: &SessionIdentity,
    mut kv: KvCache,
) -> Result<StoredSession, StoreError> {
    let (file, file_bytes) = open_sized(path)?;
    let mut r = CrcReader::new(BufReader::with_capacity(IO_BUFFER_BYTES, file));
    let header = parse_header(&mut r, path, file_bytes)?;
    if let Some(what) = identity.mismatch(&header.identity) {
        return Err(StoreError::OtherModel {
            path: path.to_path_buf(),
            what,
        });
    }
    let n = header.tokens.len();
    let fits = kv.is_empty()
        && kv.kind() == identity.kv_type
        && kv.capacity() >= n
        && kv.shape() == identity.shape();
    if !fits {
        return Err(StoreError::BadCache {
            path: path.to_path_buf(),
            reason: format!(
                "{n} positions of {} KV need an empty cache of this model holding them; \
                 got a {} cache of {} positions with {} live",
                identity.kv_type,
                kv.kind(),
                kv.capacity(),
                kv.len()
            ),
        });
    }
    kv.read_live(n, &mut r).map_err(|e| match e {
        ModelError::KvIo(e) => read_error(path)(e),
        other => StoreError::BadCache {
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    })?;
    let computed = r.crc();
    let stored = u32::from_le_bytes(get(&mut r).map_err(read_error(path))?);
    if stored != computed {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("checksum {stored:08x}, computed {computed:08x}"),
        });
    }
    Ok(StoredSession {
        tokens: header.tokens,
        window: header.window,
        kv,
        note: header.note,
    })
}

/// A temporary name beside `path`, unique within this process (`*.tmp-<pid>-<n>`).
fn temp_path(path: &Path) -> Result<PathBuf, StoreError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| StoreError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "not a file name"),
    })?;
    let mut name = name.to_os_string();
    name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    Ok(path.with_file_name(name))
}

/// Writes the whole file to `tmp` and syncs it; returns its size.
fn write_file(
    tmp: &Path,
    identity: &SessionIdentity,
    tokens: &[u32],
    window: u32,
    kv: &KvCache,
    note: &[u8],
) -> io::Result<u64> {
    let mut head = Vec::with_capacity(FIXED_HEADER_BYTES as usize + tokens.len() * 4 + 64);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&SESSION_VERSION.to_le_bytes());
    head.extend_from_slice(&identity.model_id.to_le_bytes());
    head.push(kv_type_code(identity.kv_type));
    // Each fits in u32: checked by the caller.
    for x in [
        identity.n_layer,
        identity.n_head_kv,
        identity.head_dim,
        window as usize,
        tokens.len(),
    ] {
        head.extend_from_slice(&(x as u32).to_le_bytes());
    }
    head.extend_from_slice(&(identity.precision.len() as u16).to_le_bytes());
    head.extend_from_slice(&(note.len() as u32).to_le_bytes());
    head.extend_from_slice(identity.precision.as_bytes());
    head.extend_from_slice(note);
    for t in tokens {
        head.extend_from_slice(&t.to_le_bytes());
    }
    // A new file, never one already there (nor where a link there points).
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)?;
    let mut w = CrcWriter {
        inner: BufWriter::with_capacity(IO_BUFFER_BYTES, file),
        crc: crc32fast::Hasher::new(),
        bytes: 0,
    };
    w.write_all(&head)?;
    let header_crc = w.crc();
    w.write_all(&header_crc.to_le_bytes())?;
    kv.write_live(&mut w)?;
    let crc = w.crc();
    w.write_all(&crc.to_le_bytes())?;
    let bytes = w.bytes;
    let file = w.inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(bytes)
}

/// Writes a conversation to `path` atomically: a temporary file beside it, synced, then
/// renamed over it (the directory synced too, best effort). `kv` holds exactly the
/// tokens' positions; `note` is kept beside them for the writer (empty for the
/// server's store). Returns the bytes written.
pub fn save_session(
    path: &Path,
    identity: &SessionIdentity,
    tokens: &[u32],
    window: usize,
    kv: &KvCache,
    note: &[u8],
) -> Result<u64, StoreError> {
    let bad = |reason: String| StoreError::BadCache {
        path: path.to_path_buf(),
        reason,
    };
    let n = tokens.len();
    if kv.len() != n || window < n || kv.kind() != identity.kv_type {
        return Err(bad(format!(
            "{n} tokens on a window of {window} with a {} cache of {} positions ({} expected)",
            kv.kind(),
            kv.len(),
            identity.kv_type
        )));
    }
    // Every live row is written, those a sliding-window layer gave back as zeros.
    if kv.shape() != identity.shape()
        || identity.kv_bytes(n as u64) != Some(kv.written_bytes() as u64)
    {
        return Err(bad("the cache is not of this identity's shape".to_string()));
    }
    let fits_u32 = |x: usize| u32::try_from(x).is_ok();
    let shape = [identity.n_layer, identity.n_head_kv, identity.head_dim];
    if !fits_u32(window) || !shape.into_iter().all(fits_u32) {
        return Err(bad(format!(
            "window {window} or shape {shape:?} does not fit the format"
        )));
    }
    if identity.precision.len() > u16::MAX as usize || u32::try_from(note.len()).is_err() {
        return Err(bad("the precision name or the note is too long".to_string()));
    }
    let tmp = temp_path(path)?;
    let written = write_file(&tmp, identity, tokens, window as u32, kv, note)
        .and_then(|bytes| fs::rename(&tmp, path).map(|()| bytes));
    match written {
        Ok(bytes) => {
            sync_dir(path);
            Ok(bytes)
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(StoreError::Io {
                path: path.to_path_buf(),
                source: e,
            })
        }
    }
}

/// Makes a rename in `path`'s directory durable, where the platform allows; a failure
/// costs durability across a power cut only, never the file's consistency.
fn sync_dir(path: &Path) {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// A file name for a conversation: FNV-1a of the setup and the token bytes, so setups
/// sharing a directory never overwrite each other's files. A collision only means the
/// later conversation replaces the earlier one.
pub(super) fn file_name(identity: &SessionIdentity, tokens: &[u32]) -> String {
    let setup = [
        &identity.model_id.to_le_bytes()[..],
        identity.precision.as_bytes(),
        &[kv_type_code(identity.kv_type)],
    ];
    let token_bytes = tokens.iter().flat_map(|t| t.to_le_bytes());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in setup.into_iter().flatten().copied().chain(token_bytes) {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}.{SESSION_EXT}")
}

/// A temporary file an interrupted [`save_session`] left behind.
pub(super) fn is_temp_name(name: &str) -> bool {
    name.contains(&format!(".{SESSION_EXT}.tmp-"))
}
