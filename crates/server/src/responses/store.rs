//! Responses kept for `GET /v1/responses/{id}` and `previous_response_id`: the response
//! as returned, and the conversation it ended (every item of every earlier turn, its
//! input and its output), so a continued turn renders the whole conversation again.
//!
//! Its tokens and KV are not copied here: the engine keeps a finished conversation in its
//! prefix cache, and with `--session-dir` in its session store on disk, so the continued
//! turn, whose rendering starts with the earlier one's, prefills only its new input, after
//! a restart too. With `--session-dir` the responses are kept beside the sessions, in
//! `responses/<id>.json`, one file each, written to a temporary name and renamed; without
//! it they live in memory, the most recent [`MEMORY_LIMIT`].

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

/// Responses kept in memory (all of them without a directory, the recent ones with one).
pub const MEMORY_LIMIT: usize = 1024;
/// Response files kept in the directory; the oldest go first beyond it.
pub const DISK_LIMIT: usize = 16_384;

/// A stored response.
#[derive(Debug)]
pub struct Stored {
    /// The response object as the client got it.
    pub response: Value,
    /// Every item of the conversation through this response's output.
    pub conversation: Vec<Value>,
}

#[derive(Default)]
struct Memory {
    by_id: HashMap<String, Arc<Stored>>,
    /// Ids, oldest first.
    order: VecDeque<String>,
}

#[derive(Default)]
pub struct ResponseStore {
    dir: Option<PathBuf>,
    memory: Mutex<Memory>,
}

/// Whether `id` is one this server could have made (and so names no other file).
fn valid_id(id: &str) -> bool {
    id.len() <= 64
        && id.starts_with("resp_")
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl ResponseStore {
    /// A store in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A store that keeps its responses under `session_dir/responses`.
    pub fn in_dir(session_dir: &Path) -> std::io::Result<Self> {
        let dir = session_dir.join("responses");
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            dir: Some(dir),
            memory: Mutex::default(),
        })
    }

    fn path(&self, id: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{id}.json")))
    }

    fn remember(&self, id: &str, stored: Arc<Stored>) {
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        if memory.by_id.insert(id.to_string(), stored).is_none() {
            memory.order.push_back(id.to_string());
        }
        while memory.order.len() > MEMORY_LIMIT {
            if let Some(old) = memory.order.pop_front() {
                memory.by_id.remove(&old);
            }
        }
    }

    /// Keeps `stored` under its response's id; a failure to write the file is returned
    /// (the response is still kept in memory).
    pub fn put(&self, stored: Stored) -> std::io::Result<()> {
        let id = stored.response["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let stored = Arc::new(stored);
        self.remember(&id, Arc::clone(&stored));
        let Some(path) = self.path(&id) else {
            return Ok(());
        };
        let body = json!({"response": stored.response, "conversation": stored.conversation});
        let temporary = path.with_extension("json.tmp");
        std::fs::write(&temporary, body.to_string())?;
        std::fs::rename(&temporary, &path)?;
        self.prune();
        Ok(())
    }

    /// The response `id`, from memory or its file.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        if !valid_id(id) {
            return None;
        }
        if let Some(found) = self
            .memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .get(id)
        {
            return Some(Arc::clone(found));
        }
        let text = std::fs::read(self.path(id)?).ok()?;
        let mut value: Value = serde_json::from_slice(&text).ok()?;
        let stored = Arc::new(Stored {
            response: value.get_mut("response")?.take(),
            conversation: match value.get_mut("conversation")?.take() {
                Value::Array(items) => items,
                _ => return None,
            },
        });
        self.remember(id, Arc::clone(&stored));
        Some(stored)
    }

    /// Forgets the response `id`; whether there was one.
    pub fn delete(&self, id: &str) -> bool {
        if !valid_id(id) {
            return false;
        }
        let in_memory = {
            let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            memory.order.retain(|k| k != id);
            memory.by_id.remove(id).is_some()
        };
        let on_disk = self
            .path(id)
            .is_some_and(|path| std::fs::remove_file(path).is_ok());
        in_memory || on_disk
    }

    /// Keeps the directory to [`DISK_LIMIT`] files, the oldest removed first.
    fn prune(&self) {
        let Some(dir) = &self.dir else { return };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if files.len() <= DISK_LIMIT {
            return;
        }
        files.sort();
        for (_, path) in &files[..files.len() - DISK_LIMIT] {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(id: &str) -> Stored {
        Stored {
            response: json!({"id": id, "object": "response"}),
            conversation: vec![json!({"role": "user", "content": "hi"})],
        }
    }

    #[test]
    fn responses_survive_a_new_store_on_the_same_directory_until_deleted() {
        let dir = std::env::temp_dir().join(format!("pyramid-responses-{}", std::process::id()));
        let store = ResponseStore::in_dir(&dir).unwrap();
        store.put(stored("resp_abc")).unwrap();
        let again = ResponseStore::in_dir(&dir).unwrap();
        let found = again.get("resp_abc").unwrap();
        assert_eq!(found.conversation.len(), 1);
        assert!(again.delete("resp_abc"));
        assert!(
            store.get("resp_abc").is_some(),
            "still in the first store's memory"
        );
        assert!(ResponseStore::in_dir(&dir)
            .unwrap()
            .get("resp_abc")
            .is_none());
        // Ids that could name another file are never looked up.
        assert!(again.get("resp_../../etc/passwd").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memory_keeps_the_most_recent() {
        let store = ResponseStore::in_memory();
        for i in 0..MEMORY_LIMIT + 2 {
            store.put(stored(&format!("resp_{i}"))).unwrap();
        }
        assert!(store.get("resp_0").is_none() && store.get("resp_1").is_none());
        assert!(store.get(&format!("resp_{}", MEMORY_LIMIT + 1)).is_some());
    }
}
