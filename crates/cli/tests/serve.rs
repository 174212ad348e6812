//! `pyramid serve` end to end: the real server on a loopback port, driven by the official
//! `openai` Python client (installed into a venv by scripts/test.sh) and by raw HTTP.
//! Each Python script under tests/openai/ states what it proves.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The real default model, fetched by scripts/test.sh.
const MODEL: &str = "smollm2-135m";
/// A small ladder, so a short conversation crosses windows.
const WINDOWS: &str = "256,512,1024,2048";

fn models_home() -> PathBuf {
    let model = pyramid_testdata::model_path("smollm2-135m-instruct-q4_1.gguf");
    model
        .parent()
        .and_then(|models| models.parent())
        .unwrap()
        .to_path_buf()
}

fn python() -> PathBuf {
    let python = std::env::var_os("PYRAMID_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| models_home().join("test-venv/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: run scripts/test.sh (it installs the openai client into a venv)",
        python.display()
    );
    python
}

/// A running server, killed on drop.
struct Server {
    child: Child,
    url: String,
    model: String,
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        Self::start_model(MODEL, extra)
    }

    fn start_model(model: &str, extra: &[&str]) -> Self {
        Self::spawn(model, extra, Stdio::inherit())
    }

    /// A server whose stderr goes to `log`.
    fn start_logged(extra: &[&str], log: &Path) -> Self {
        let file = std::fs::File::create(log).expect("a log file");
        Self::spawn(MODEL, extra, Stdio::from(file))
    }

    fn spawn(model: &str, extra: &[&str], stderr: Stdio) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pyramid"))
            .args(["serve", "-m", model, "--port", "0", "--windows", WINDOWS])
            .args(extra)
            .env("PYRAMID_HOME", models_home())
            .env_remove("PYRAMID_ISA")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("pyramid serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in the server's first line: {line:?}"))
            .to_string();
        Self {
            child,
            url,
            model: model.to_string(),
        }
    }

    fn run_script(&self, script: &str, env: &[(&str, &str)]) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/openai")
            .join(script);
        let status = Command::new(python())
            .arg(&path)
            .env("PYRAMID_BASE_URL", &self.url)
            .env("PYRAMID_MODEL_ID", &self.model)
            .envs(env.iter().copied())
            .status()
            .expect("python runs");
        assert!(status.success(), "{script} failed against {}", self.url);
    }

    /// A POST of a JSON body: (status, parsed body).
    fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let body = body.to_string();
        let (status, text) = self.raw(&format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path} answered {status} with non-JSON ({e}): {text:?}"));
        (status, value)
    }

    /// SIGTERM, and the server's exit once its work is done.
    fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        self.child.wait().unwrap()
    }

    /// One raw HTTP/1.1 exchange: (status, body).
    fn raw(&self, request: &str) -> (u16, String) {
        let addr = self.url.trim_start_matches("http://");
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
        let body = response.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn openai_client_api_errors_and_fuzz() {
    let server = Server::start(&[]);
    server.run_script("test_api.py", &[]);
    server.run_script("test_errors.py", &[]);
    // Anthropic's Messages API on the same server, with the anthropic client.
    server.run_script("test_anthropic.py", &[]);
    server.run_script("test_responses.py", &[]);
    server.run_script("test_embeddings.py", &[]);
}

#[test]
fn tool_calls_and_json_schemas_on_smollm2() {
    // SmolLM2's template has no tools: the fallback prompt carries them.
    let server = Server::start(&[]);
    server.run_script("test_tools.py", &[]);
}

#[test]
fn tool_loop_calls_and_json_schemas_on_qwen() {
    // Qwen2.5's template renders the tools itself.
    let server = Server::start_model("qwen2.5-coder-0.5b", &[]);
    server.run_script("test_tools.py", &[("PYRAMID_TOOL_LOOP", "1")]);
    server.run_script("test_langchain.py", &[]);
}

#[test]
fn agents_on_one_system_prompt_fork_it_instead_of_evicting_each_other() {
    let server = Server::start(&[]);
    server.run_script("test_agents.py", &[]);
}

#[test]
fn urgent_requests_pause_background_ones_which_resume_with_the_same_text() {
    let server = Server::start(&["--max-batch", "1", "--kv-budget", "30MiB"]);
    server.run_script("test_priority.py", &[]);
}

#[test]
fn speculative_requests_give_the_plain_text_and_count_their_drafts() {
    let server = Server::start(&[]);
    server.run_script("test_speculative.py", &[]);
    let server = Server::start(&["--speculative", "off"]);
    server.run_script("test_speculative.py", &[("PYRAMID_SPECULATIVE_OFF", "1")]);
}

/// The session files in `dir`.
fn session_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pyrsession"))
        .collect()
}

#[test]
fn conversations_survive_a_restart_and_corrupt_files_are_skipped() {
    survive_restarts("native", &[]);
}

#[test]
fn conversations_survive_a_restart_on_ov_cpu() {
    survive_restarts("ov-cpu", &OV_CPU);
}

/// `test_persist.py`'s three phases on servers started with `route` flags: SIGTERM keeps
/// the conversation, a restart resumes it (and replies as an uninterrupted server), and a
/// corrupt file is skipped with a warning.
fn survive_restarts(name: &str, route: &[&str]) {
    let home = std::env::temp_dir().join(format!("pyramid-sessions-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let dir = home.join("sessions");
    let dir_arg = dir.to_str().unwrap();
    let state = home.join("state.json");
    let log = home.join("server.log");
    let phase = |server: &Server, phase: &str, fresh: Option<&Server>| {
        let mut env = vec![
            ("PYRAMID_PERSIST_STATE", state.to_str().unwrap()),
            ("PYRAMID_PERSIST_PHASE", phase),
        ];
        if let Some(fresh) = fresh {
            env.push(("PYRAMID_FRESH_BASE_URL", &fresh.url));
        }
        server.run_script("test_persist.py", &env);
    };

    let with_dir = [route, &["--session-dir", dir_arg]].concat();
    let server = Server::start_logged(&with_dir, &log);
    phase(&server, "first", None);
    assert!(server.terminate().success(), "the server exits cleanly");
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(stderr.contains("kept 1 conversations"), "{stderr}");
    assert_eq!(session_files(&dir).len(), 1);

    let server = Server::start(&with_dir);
    let fresh = Server::start(route);
    phase(&server, "resume", Some(&fresh));
    drop(fresh);
    assert!(server.terminate().success());
    // The grown conversation replaced its earlier file.
    let files = session_files(&dir);
    assert_eq!(files.len(), 1);

    // A flipped byte in the KV: the header still reads, the checksum does not.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x10;
    std::fs::write(&files[0], bytes).unwrap();
    let server = Server::start_logged(&with_dir, &log);
    phase(&server, "corrupt", None);
    let status = server.terminate();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("warning: skipping") && stderr.contains("corrupt session file"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

/// `test_responses.py`'s restart halves: a conversation kept by the Responses API on one
/// server is continued by `previous_response_id` on another started on the same
/// `--session-dir`, from the session store, with an uninterrupted server's reply.
#[test]
fn responses_continue_across_a_restart() {
    let home = std::env::temp_dir().join(format!("pyramid-responses-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let dir = home.join("sessions");
    let state = home.join("state.json");
    let with_dir = ["--session-dir", dir.to_str().unwrap()];
    let phase = |server: &Server, phase: &str, fresh: Option<&Server>| {
        let mut env = vec![
            ("PYRAMID_PERSIST_STATE", state.to_str().unwrap()),
            ("PYRAMID_RESPONSES_PHASE", phase),
        ];
        if let Some(fresh) = fresh {
            env.push(("PYRAMID_FRESH_BASE_URL", &fresh.url));
        }
        server.run_script("test_responses.py", &env);
    };
    let server = Server::start(&with_dir);
    phase(&server, "first", None);
    assert!(server.terminate().success());
    assert_eq!(std::fs::read_dir(dir.join("responses")).unwrap().count(), 1);
    let (server, fresh) = (Server::start(&with_dir), Server::start(&[]));
    phase(&server, "resume", Some(&fresh));
    drop(fresh);
    assert!(server.terminate().success());
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn concurrent_streams_equal_solo_ones_and_cancellation_frees_them() {
    let server = Server::start(&[]);
    server.run_script("test_concurrency.py", &[]);
}

#[test]
fn agent_conversation_reuses_its_cache_across_windows() {
    let (server, fresh) = (Server::start(&[]), Server::start(&[]));
    server.run_script("test_agent.py", &[("PYRAMID_FRESH_BASE_URL", &fresh.url)]);
}

/// The route every ov:CPU test serves: OpenVINO's CPU plugin at f32, whose greedy tokens
/// equal the native f32 path's (OpenVINO comes from scripts/setup-openvino.sh, which
/// scripts/test.sh runs).
const OV_CPU: [&str; 6] = ["--device", "ov:CPU", "--precision", "f32", "--kv", "f32"];

#[test]
fn openai_client_api_on_ov_cpu() {
    let server = Server::start(&OV_CPU);
    server.run_script("test_api.py", &[("PYRAMID_EXPECT_DEVICE", "ov:CPU")]);
    server.run_script("test_anthropic.py", &[]);
    server.run_script("test_responses.py", &[]);
    server.run_script("test_embeddings.py", &[("PYRAMID_EXPECT_DEVICE", "ov:CPU")]);
}

/// The public reference prompts answered greedily through ov:CPU equal the native f32
/// path's answers (which equal Hugging Face's: the golden tests), text and finish reason.
#[test]
fn ov_cpu_replies_equal_the_native_f32_replies_on_the_reference_prompts() {
    let ov = Server::start(&OV_CPU);
    let native = Server::start(&["--precision", "f32", "--kv", "f32"]);
    let set: serde_json::Value =
        serde_json::from_str(include_str!("../../../testdata/refs/prompts-public.json")).unwrap();
    let prompts = set["prompts"].as_array().unwrap();
    assert!(prompts.len() >= 6);
    for p in prompts {
        let id = p["id"].as_str().unwrap();
        let (path, mut body) = match (&p["text"], &p["messages"]) {
            (serde_json::Value::String(text), _) => {
                ("/v1/completions", serde_json::json!({"prompt": text}))
            }
            (_, messages) => (
                "/v1/chat/completions",
                serde_json::json!({"messages": messages}),
            ),
        };
        body["model"] = MODEL.into();
        body["max_tokens"] = p["n_new"].clone();
        body["temperature"] = 0.into();
        let reply = |server: &Server| {
            let (status, v) = server.post(path, &body);
            assert_eq!(status, 200, "{id}: {v}");
            let choice = &v["choices"][0];
            let text = choice["text"]
                .as_str()
                .or(choice["message"]["content"].as_str())
                .unwrap()
                .to_string();
            (text, choice["finish_reason"].clone())
        };
        let (want, got) = (reply(&native), reply(&ov));
        assert!(
            !want.0.is_empty(),
            "{id}: an empty native reply proves nothing"
        );
        assert_eq!(got, want, "{id}: ov:CPU against native f32");
    }
}

#[test]
fn agent_conversation_on_ov_cpu_crosses_windows_without_stalls_when_predicted() {
    let (server, fresh) = (Server::start(&OV_CPU), Server::start(&OV_CPU));
    server.run_script(
        "test_agent.py",
        &[
            ("PYRAMID_FRESH_BASE_URL", &fresh.url),
            ("PYRAMID_EXPECT_STALLS", "none"),
            // A 2-core machine compiles a window's two artifacts in seconds; agents
            // leave that much time between turns while their tools run.
            ("PYRAMID_AGENT_PAUSE_S", "5"),
        ],
    );
}

#[test]
fn agent_conversation_on_ov_cpu_stalls_when_compiles_are_on_demand() {
    let mut args = OV_CPU.to_vec();
    args.extend(["--window-policy", "on-demand"]);
    let (server, fresh) = (Server::start(&args), Server::start(&OV_CPU));
    server.run_script(
        "test_agent.py",
        &[
            ("PYRAMID_FRESH_BASE_URL", &fresh.url),
            ("PYRAMID_EXPECT_STALLS", "some"),
        ],
    );
}

#[test]
fn api_key_is_required_when_set() {
    let server = Server::start(&["--api-key", "sesame", "--api-key-priority", "agents=7"]);
    let (status, body) =
        server.raw("GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"invalid_api_key\""), "{body}");
    let (status, body) = server.raw(
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{body}");
    server.run_script("test_errors.py", &[("PYRAMID_API_KEY", "sesame")]);
    // Anthropic's clients send the key as x-api-key.
    server.run_script("test_anthropic.py", &[("PYRAMID_API_KEY", "sesame")]);
    // The second key is accepted too, and its requests take its priority.
    let body = format!(r#"{{"model": "{MODEL}", "prompt": "Hello", "max_tokens": 2}}"#);
    let (status, reply) = server.raw(&format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer agents\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    assert_eq!(status, 200, "{reply}");
    let (_, metrics) = server.raw(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer agents\r\nConnection: close\r\n\r\n",
    );
    assert!(
        metrics.contains("pyramid_ttft_seconds_count{priority=\"7\"} 1"),
        "{metrics}"
    );
}

#[test]
fn sigterm_lets_a_stream_in_flight_finish() {
    let mut server = Server::start(&[]);
    let addr = server.url.trim_start_matches("http://").to_string();
    let body = format!(
        r#"{{"model": "{MODEL}", "prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "stream": true}}"#
    );
    let mut stream = TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Wait for the stream to start, then ask the server to stop.
    let mut first = [0u8; 64];
    let _ = stream.read(&mut first).unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = String::new();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.read_to_string(&mut rest).unwrap();
    assert!(
        rest.contains("data: [DONE]"),
        "the stream was cut: {rest:?}"
    );
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "the server exits cleanly: {exit:?}");
}

/// A client that stops reading holds neither the shutdown nor its conversation: after
/// the grace its request ends with a shutting-down event, the server exits 0 within the
/// grace and a few seconds, and every conversation, the finished reply's included, is
/// on disk.
#[test]
fn sigterm_with_a_stalled_reader_ends_within_the_grace_and_saves_every_conversation() {
    let home = std::env::temp_dir().join(format!("pyramid-shutdown-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let dir = home.join("sessions");
    let log = home.join("server.log");
    std::fs::create_dir_all(&home).unwrap();
    let args = [
        "--session-dir",
        dir.to_str().unwrap(),
        "--shutdown-grace",
        "2",
        "--speculative",
        "off",
    ];
    let server = Server::start_logged(&args, &log);
    // A reply that finished just before the signal.
    let (status, _) = server.post(
        "/v1/completions",
        &serde_json::json!({"model": MODEL, "prompt": "The old lighthouse keeper", "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(status, 200);
    // A long stream whose client never reads past its first bytes.
    let addr = server.url.trim_start_matches("http://").to_string();
    let body = format!(
        r#"{{"model": "{MODEL}", "prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0, "stream": true}}"#
    );
    let mut stalled = TcpStream::connect(&addr).unwrap();
    write!(
        stalled,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 16];
    let _ = stalled.read(&mut first).unwrap();
    let signalled = std::time::Instant::now();
    let status = server.terminate();
    let took = signalled.elapsed();
    assert!(status.success(), "the server exits cleanly: {status:?}");
    assert!(
        took < Duration::from_secs(2 + 5),
        "exit {took:?} after the signal, beyond the grace and 5 s"
    );
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(stderr.contains("kept 2 conversations"), "{stderr}");
    assert_eq!(session_files(&dir).len(), 2, "{stderr}");
    drop(stalled);
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn chat_client_streams_replies_and_the_server_reuses_the_conversation() {
    let server = Server::start(&[]);
    let mut chat = Command::new(env!("CARGO_BIN_EXE_pyramid"))
        .args([
            "chat",
            "--server",
            &server.url,
            "-n",
            "12",
            "--temperature",
            "0",
            "--stats",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    chat.stdin
        .take()
        .unwrap()
        .write_all(b"What is 2+2?\nAnd 3+3?\n\n")
        .unwrap();
    let out = chat.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");

    let body = format!(
        r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "What is 2+2?"}}], "max_tokens": 12, "temperature": 0}}"#
    );
    let (status, response) = server.raw(&format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    assert_eq!(status, 200, "{response}");
    let reply: serde_json::Value = serde_json::from_str(&response).unwrap();
    let first = reply["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        stdout.starts_with(first),
        "the chat's first reply {stdout:?} is not the server's {first:?}"
    );
    // The second turn extends the first: the server reuses its cache.
    let reused: Vec<u64> = stderr
        .lines()
        .filter_map(|l| l.split(" reused").next()?.rsplit(' ').next()?.parse().ok())
        .collect();
    assert_eq!(reused.len(), 2, "{stderr}");
    assert!(reused[1] > 0, "the second turn reused nothing: {stderr}");
}

/// `(VmRSS, VmHWM)` of a process in KiB, from `/proc`.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn slow_and_idle_clients_are_closed_while_others_are_served() {
    let server = Server::start(&[
        "--header-timeout",
        "2",
        "--body-timeout",
        "2",
        "--max-connections",
        "64",
    ]);
    let addr = server.url.trim_start_matches("http://").to_string();
    // 50 slowloris clients, each sending a header one byte at a time, and one that sends
    // only blank lines.
    let started = std::time::Instant::now();
    let slow: Vec<std::thread::JoinHandle<bool>> = (0..50)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(&addr).unwrap();
                let header = if i == 0 {
                    "\r\n".repeat(100)
                } else {
                    "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".to_string()
                };
                for byte in header.bytes() {
                    if stream.write_all(&[byte]).is_err() {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                // Still open after sending everything (25 s): never closed.
                false
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let t = std::time::Instant::now();
    let (status, body) = server.raw("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 200, "{body}");
    println!("a normal request beside 50 slow clients: {:?}", t.elapsed());
    for handle in slow {
        assert!(handle.join().unwrap(), "a slow client was never closed");
    }
    println!("all slow clients closed after {:?}", started.elapsed());
    // A body that stops arriving gets 408 once the body timeout passes.
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"mod",
        )
        .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
}

#[test]
fn connections_beyond_the_limit_get_503_and_the_others_are_unaffected() {
    let server = Server::start(&["--max-connections", "3"]);
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = server.raw("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("too many open connections"), "{body}");
    // A held connection is served normally.
    let stream = &mut held[0];
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

#[test]
fn huge_prompts_are_refused_without_tokenising_them_whole() {
    let server = Server::start(&[]);
    let pid = server.child.id();
    // Warm up (first request allocations), then read the baseline.
    let (status, _) = server.post(
        "/v1/completions",
        &serde_json::json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(status, 200);
    let (rss_before, peak_before) = memory_kib(pid);
    // 15 MiB of words, and of numbered words (the number before each space once left
    // the text without a place to cut it, so it was tokenised whole).
    let words = "word ".repeat(3 << 20);
    let numbered = "w123456 ".repeat(15 << 17);
    let handles: Vec<_> = [&words, &numbered, &words]
        .into_iter()
        .map(|prompt| {
            let url = server.url.clone();
            let prompt = prompt.clone();
            std::thread::spawn(move || {
                let body = serde_json::json!({"model": MODEL, "prompt": prompt}).to_string();
                let addr = url.trim_start_matches("http://");
                let mut stream = TcpStream::connect(addr).unwrap();
                stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                write!(
                    stream,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .unwrap();
                stream.write_all(body.as_bytes()).unwrap();
                let mut response = String::new();
                stream.read_to_string(&mut response).unwrap();
                response
            })
        })
        .collect();
    for handle in handles {
        let response = handle.join().unwrap();
        assert!(
            response.starts_with("HTTP/1.1 400"),
            "{}",
            &response[..response.len().min(300)]
        );
        assert!(response.contains("context_length_exceeded"), "{response}");
    }
    let (rss_after, peak_after) = memory_kib(pid);
    println!(
        "RSS {rss_before} -> {rss_after} KiB, peak {peak_before} -> {peak_after} KiB over 3 x 15 MiB prompts (one of numbered words)"
    );
    assert!(
        peak_after - peak_before < 200 << 10,
        "peak RSS grew by {} KiB",
        peak_after - peak_before
    );
}
