//! A Hugging Face hub on 127.0.0.1, in the hub's URL layout, for tests: the listing at
//! `/api/models/{repo}/revision/main` (with sizes and LFS SHA-256s), files at
//! `/{repo}/resolve/main/{path}` with the hub's headers (`x-repo-commit`, `etag`,
//! `x-linked-etag`, `x-linked-size`), LFS files redirected to `/cdn/{sha256}` as the hub
//! redirects to its CDN, and byte ranges. It counts what it is asked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};
use tiny_http::{Header, Request, Response, Server};

/// A file of a served repository.
#[derive(Clone)]
pub struct HubFile {
    pub path: String,
    pub bytes: Vec<u8>,
    /// Kept in LFS: listed with a SHA-256 and redirected to the CDN.
    pub lfs: bool,
    /// The SHA-256 the hub claims, when it is not the bytes' (a corrupt upload or CDN).
    pub claimed_sha256: Option<String>,
}

impl HubFile {
    pub fn new(path: &str, bytes: Vec<u8>) -> Self {
        let lfs = path.ends_with(".gguf") || path.ends_with(".safetensors");
        Self {
            path: path.to_string(),
            bytes,
            lfs,
            claimed_sha256: None,
        }
    }

    pub fn sha256(&self) -> String {
        self.claimed_sha256
            .clone()
            .unwrap_or_else(|| hex(&Sha256::digest(&self.bytes)))
    }
}

/// One request as the hub saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub url: String,
    pub range: Option<String>,
}

#[derive(Default)]
struct State {
    /// Repository → (commit, files).
    repos: HashMap<String, (String, Vec<HubFile>)>,
    seen: Vec<Seen>,
}

pub struct FakeHub {
    pub url: String,
    state: Arc<Mutex<State>>,
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
}

impl FakeHub {
    pub fn start() -> Self {
        let server = Arc::new(Server::http("127.0.0.1:0").expect("bind 127.0.0.1"));
        let port = server.server_addr().to_ip().expect("an IP address").port();
        let url = format!("http://127.0.0.1:{port}");
        let state = Arc::new(Mutex::new(State::default()));
        let thread = {
            let (server, state, url) = (Arc::clone(&server), Arc::clone(&state), url.clone());
            std::thread::spawn(move || {
                // Ends when `Drop` unblocks the server.
                while let Ok(request) = server.recv() {
                    serve(&state, &url, request);
                }
            })
        };
        Self {
            url,
            state,
            server,
            thread: Some(thread),
        }
    }

    /// Serves `files` as `repo` at `commit` (replacing what was served there).
    pub fn put(&self, repo: &str, commit: &str, files: Vec<HubFile>) {
        let mut state = self.state.lock().unwrap();
        state
            .repos
            .insert(repo.to_string(), (commit.to_string(), files));
    }

    /// The requests so far, forgetting them.
    pub fn take_seen(&self) -> Vec<Seen> {
        std::mem::take(&mut self.state.lock().unwrap().seen)
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("a valid header")
}

fn serve(state: &Mutex<State>, base: &str, request: Request) {
    let url = request.url().to_string();
    let range = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Range"))
        .map(|h| h.value.to_string());
    let mut state = state.lock().unwrap();
    state.seen.push(Seen {
        url: url.clone(),
        range: range.clone(),
    });
    let path = url.split('?').next().unwrap_or_default();
    let not_found =
        || Response::from_string(r#"{"error":"Repository not found"}"#).with_status_code(404);

    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some(repo) = rest.strip_suffix("/revision/main") else {
            let _ = request.respond(not_found());
            return;
        };
        let Some((commit, files)) = state.repos.get(repo) else {
            let _ = request.respond(not_found());
            return;
        };
        let siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|f| {
                let mut s = serde_json::json!({
                    "rfilename": f.path, "size": f.bytes.len(), "blobId": "0123abcd",
                });
                if f.lfs {
                    s["lfs"] = serde_json::json!({
                        "sha256": f.sha256(), "size": f.bytes.len(), "pointerSize": 134,
                    });
                }
                s
            })
            .collect();
        let body = serde_json::json!({"id": repo, "sha": commit, "siblings": siblings});
        let _ = request.respond(
            Response::from_string(body.to_string())
                .with_header(header("Content-Type", "application/json")),
        );
        return;
    }

    if let Some(sha) = path.strip_prefix("/cdn/") {
        let file = state
            .repos
            .values()
            .flat_map(|(_, files)| files)
            .find(|f| f.sha256() == sha)
            .cloned();
        let response = match file {
            Some(file) => ranged(&file.bytes, range.as_deref()),
            None => not_found(),
        };
        let _ = request.respond(response);
        return;
    }

    // /{org}/{repo}/resolve/main/{path}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let found =
        match parts.as_slice() {
            [org, name, "resolve", "main", file] => state
                .repos
                .get(&format!("{org}/{name}"))
                .and_then(|(commit, files)| {
                    let file = files.iter().find(|f| f.path == *file)?;
                    Some((commit.clone(), file.clone()))
                }),
            _ => None,
        };
    let Some((commit, file)) = found else {
        let _ = request.respond(not_found());
        return;
    };
    let response = if file.lfs {
        let sha = file.sha256();
        Response::from_data(Vec::new())
            .with_status_code(302)
            .with_header(header("Location", &format!("{base}/cdn/{sha}")))
            .with_header(header("x-linked-etag", &format!("\"{sha}\"")))
            .with_header(header("x-linked-size", &file.bytes.len().to_string()))
    } else {
        let git_sha = hex(&Sha256::digest(&file.bytes)[..20]);
        ranged(&file.bytes, range.as_deref()).with_header(header("etag", &format!("\"{git_sha}\"")))
    };
    let _ = request.respond(response.with_header(header("x-repo-commit", &commit)));
}

/// The bytes, or the part `Range: bytes=START-[END]` asks for with a 206.
fn ranged(bytes: &[u8], range: Option<&str>) -> Response<std::io::Cursor<Vec<u8>>> {
    let Some(spec) = range.and_then(|r| r.strip_prefix("bytes=")) else {
        return Response::from_data(bytes.to_vec());
    };
    let (start, end) = spec.split_once('-').expect("START-[END]");
    let start: usize = start.parse().expect("a start");
    let end = if end.is_empty() {
        bytes.len().saturating_sub(1)
    } else {
        end.parse::<usize>().expect("an end").min(bytes.len() - 1)
    };
    Response::from_data(bytes[start..=end].to_vec())
        .with_status_code(206)
        .with_header(header(
            "Content-Range",
            &format!("bytes {start}-{end}/{}", bytes.len()),
        ))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
