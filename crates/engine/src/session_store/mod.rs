//! Conversations kept on disk: their tokens and KV cache, so a later request (or a later
//! run of `pyramid chat --session FILE`) that extends one resumes from the file instead
//! of prefilling it again.
//!
//! One file per conversation, all integers little-endian:
//!
//! ```text
//! magic        b"PYRSESS\0"
//! version      u32 = 1            a reader refuses any other before reading further
//! model_id     u64                the caller's id of the model file
//! kv_type      u8                 0 f32, 1 f16, 2 int8
//! n_layer, n_head_kv, head_dim    u32 each
//! window       u32                positions of the cache the conversation ran on
//! n_tokens     u32
//! precision    u16 length         the weights' precision and route ("int8@cpu", ...)
//! note         u32 length
//! precision    UTF-8
//! note         bytes              the writer's own (`pyramid chat`: its messages)
//! tokens       u32 × n_tokens
//! header_crc   u32                CRC32 of every byte before it
//! kv           KvCache::write_live for n_tokens positions
//! crc          u32                CRC32 of every byte before it
//! ```
//!
//! Why this shape: the version comes first so a future layout is refused, not misread;
//! the identity fields make a file from another model, precision or KV type a skip, never
//! a wrong answer; every length is checked against the file's size before anything is
//! allocated from it, so a corrupt field cannot ask for 100 GB. The header has its own
//! checksum so indexing a directory (which reads headers only) trusts the window it
//! hands out; the trailing one covers the whole file and is checked on every load. Both
//! are CRC32 from `crc32fast` (carry-less multiply, several GB/s): the check runs as the
//! bytes stream past, and a resume must cost a small fraction of the prefill it replaces.
//! Files are written to a temporary name beside the target, synced and renamed over
//! it, so a crash leaves the old file or the new one, never half of one.
//!
//! [`SessionStore`] is a directory of such files for the server: indexed at start,
//! searched by longest shared prefix, kept under a disk budget (least recently used goes
//! first). A directory belongs to one process at a time.

mod file;
mod store;
#[cfg(test)]
mod tests;

pub use file::{
    load_session, read_header, save_session, SessionHeader, SessionIdentity, StoreError,
    StoredSession, SESSION_EXT, SESSION_VERSION,
};
pub use store::{SaveReport, SessionStore};
