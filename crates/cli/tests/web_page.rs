//! The web page `pyramid serve` ships at `/`: served from the binary with its CSP, public
//! while the API it calls keeps asking for `--api-key`, printed at start, and gone with
//! `--no-ui`.
//!
//! And in a real browser: headless Chromium driven over WebDriver (Debian's `chromium`
//! and `chromium-driver`, which `scripts/setup-browser.sh` installs). The chat sends a
//! message (by the Enter key) and shows the streamed reply complete with its stats, and
//! fits a 360 px screen; a stored reply holding an HTML injection renders as text and
//! runs nothing; the engine view shows four clients streaming at different priorities,
//! one of them paused. Screenshots of both views go to `target/web-page/` (two of them
//! are committed under `docs/`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

/// A running server, killed on drop.
struct Server {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Server {
    /// On SmolLM2, with a window of 256 unless `extra` names the windows.
    fn start(name: &str, extra: &[&str]) -> Self {
        let windows: &[&str] = if extra.contains(&"--windows") {
            &[]
        } else {
            &["--windows", "256"]
        };
        let model = pyramid_testdata::model_path("smollm2-135m-instruct-q4_1.gguf");
        let log = std::env::temp_dir().join(format!(
            "pyramid-web-page-{name}-{}.log",
            std::process::id()
        ));
        let mut child = Command::new(env!("CARGO_BIN_EXE_pyramid"))
            .args(["serve", "-m"])
            .arg(&model)
            .args(["--port", "0"])
            .args(windows)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("pyramid serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http://"))
            .unwrap_or_else(|| panic!("no address in the server's first line: {line:?}"))
            .to_string();
        Self { child, addr, log }
    }

    /// One GET: (status, headers in lower case, body).
    fn get(&self, path: &str, key: Option<&str>) -> (u16, String, String) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
        (status, head.to_ascii_lowercase(), body.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

#[test]
fn the_page_is_public_with_its_csp_while_the_api_needs_the_key() {
    let server = Server::start("keyed", &["--api-key", "sesame"]);
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(
        log.contains(&format!("web page: http://{}/", server.addr)),
        "{log}"
    );
    // The page and its assets need no key: a browser cannot send one when it navigates.
    let (status, head, html) = server.get("/", None);
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains(
            "content-security-policy: default-src 'self'; script-src 'self'; style-src 'self'"
        ),
        "{head}"
    );
    assert!(html.contains("data-testid=\"message-input\""));
    for (path, content_type) in [
        ("/assets/app.js", "text/javascript"),
        ("/assets/app.css", "text/css"),
    ] {
        let (status, head, _) = server.get(path, None);
        assert_eq!(status, 200, "{path}: {head}");
        assert!(
            head.contains(&format!("content-type: {content_type}")),
            "{head}"
        );
    }
    // What the page calls keeps asking for the key.
    let (status, _, body) = server.get("/v1/models", None);
    assert_eq!(status, 401, "{body}");
    let (status, _, body) = server.get("/v1/models", Some("sesame"));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn no_ui_serves_no_page() {
    let server = Server::start("no-ui", &["--no-ui"]);
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("web page:"), "{log}");
    let (status, _, body) = server.get("/", None);
    assert_eq!(status, 404, "{body}");
    let (status, _, _) = server.get("/assets/app.js", None);
    assert_eq!(status, 404);
    let (status, _, _) = server.get("/v1/models", None);
    assert_eq!(status, 200);
}

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body). The body is read by its
/// length or its chunks, since a WebDriver server may keep the connection open.
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        &stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (mut length, mut chunked) = (None, false);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end().to_ascii_lowercase();
        if line.is_empty() {
            break;
        }
        if let Some(n) = line.strip_prefix("content-length:") {
            length = n.trim().parse::<usize>().ok();
        }
        chunked |= line.starts_with("transfer-encoding:") && line.contains("chunked");
    }
    let mut out = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).unwrap();
            out.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = length {
        out.resize(n, 0);
        reader.read_exact(&mut out).unwrap();
    } else {
        reader.read_to_end(&mut out).unwrap();
    }
    (status, String::from_utf8_lossy(&out).into_owned())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A WebDriver session on headless Chromium.
struct Browser {
    driver: String,
    session: String,
    _process: Killed,
}

impl Browser {
    fn start() -> Self {
        let chromedriver =
            std::env::var("PYRAMID_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".to_string());
        let port = free_port();
        // Killed on drop from here on, even if the session below cannot start.
        let process = Killed(
            Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("{chromedriver} does not start ({e}): run scripts/setup-browser.sh")
                }),
        );
        let driver = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&driver).is_err() {
            assert!(Instant::now() < deadline, "chromedriver never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Debian's `/usr/bin/chromium` is a wrapper script; the driver wants the binary.
        let binary = std::env::var("PYRAMID_CHROMIUM")
            .unwrap_or_else(|_| "/usr/lib/chromium/chromium".to_string());
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1200,900"]
            }
        }}});
        let (status, body) = http(&driver, "POST", "/session", Some(&capabilities));
        assert_eq!(status, 200, "no browser session: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let session = v["value"]["sessionId"].as_str().unwrap().to_string();
        Self {
            driver,
            session,
            _process: process,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let (status, text) = http(&self.driver, method, &path, body.as_ref());
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_eq!(status, 200, "{method} {path}: {text}");
        v["value"].clone()
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` in the page (WebDriver's own channel, not the page's CSP).
    fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    fn element(&self, testid: &str) -> String {
        let found = self.call(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": format!("[data-testid={testid}]")})),
        );
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap()
            .to_string()
    }

    fn type_into(&self, testid: &str, text: &str) {
        let id = self.element(testid);
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn click(&self, testid: &str) {
        let id = self.element(testid);
        self.call("POST", &format!("/element/{id}/click"), Some(json!({})));
    }

    /// Waits until `script` returns true.
    fn wait_for(&self, what: &str, script: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.eval(script) != json!(true) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let data = self.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap())
            .unwrap();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/web-page");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        let _ = http(&self.driver, "DELETE", &path, None);
    }
}

const ASSISTANTS: &str = "[data-testid=message][data-role=assistant]";

#[test]
fn the_page_chats_renders_injections_as_text_and_shows_the_engine() {
    let server = Server::start("browser", &["--windows", "256,512", "--max-batch", "3"]);
    let addr = server.addr.clone();
    let browser = Browser::start();
    let page = format!("http://{addr}/");
    browser.open(&page);

    // A message, its streamed reply, complete with its stats.
    browser.wait_for(
        "the model picker",
        "return document.querySelectorAll('select[name=model] option').length > 0",
        Duration::from_secs(20),
    );
    // For the record (headless Chromium does not always report paint timing, so this
    // figure is printed, not asserted).
    let first_paint = browser.eval(
        "const p = performance.getEntriesByName('first-contentful-paint')[0]; \
         return p ? p.startTime : null",
    );
    eprintln!("first contentful paint: {first_paint} ms");
    // Enter sends (the keyboard alone drives the chat).
    browser.type_into("message-input", "Name three colours.\u{E007}");
    let done = format!(
        "const m = [...document.querySelectorAll('{ASSISTANTS}')].pop(); \
         return !!m && !!m.querySelector('[data-testid=message-stats]') \
         && m.querySelector('[data-testid=message-text]').textContent.trim().length > 0"
    );
    browser.wait_for("the streamed reply", &done, Duration::from_secs(120));
    browser.screenshot("chat.png");
    // A phone's width: nothing wider than the screen.
    browser.call(
        "POST",
        "/window/rect",
        Some(json!({"width": 360, "height": 760})),
    );
    let overflow = browser
        .eval("return document.documentElement.scrollWidth - document.documentElement.clientWidth");
    browser.screenshot("chat-360.png");
    assert!(
        overflow.as_i64().unwrap() <= 0,
        "{overflow} px wider than 360"
    );
    browser.call(
        "POST",
        "/window/rect",
        Some(json!({"width": 1200, "height": 900})),
    );

    // A stored reply with an injection: shown as text, nothing run.
    let injection = "Look: <script>window.__pwned = 1</script> \
                     <img src=x onerror=\"window.__pwned = 2\"> **bold**";
    let stored = json!([{ "id": "injected", "title": "injection", "system": "", "updated": 1,
        "messages": [{ "role": "user", "content": "hi" },
                     { "role": "assistant", "content": injection, "reasoning": "", "toolCalls": [] }] }]);
    browser.eval(&format!(
        "localStorage.setItem('pyramid.conversations', {}); return true",
        serde_json::to_string(&stored.to_string()).unwrap()
    ));
    browser.open(&page);
    browser.wait_for(
        "the stored conversation",
        &format!("return document.querySelectorAll('{ASSISTANTS}').length === 1"),
        Duration::from_secs(10),
    );
    std::thread::sleep(Duration::from_millis(500));
    let shown = browser.eval(&format!(
        "const m = document.querySelector('{ASSISTANTS}'); return {{ \
           text: m.textContent, pwned: window.__pwned || 0, \
           scripts: m.querySelectorAll('script').length, \
           images: m.querySelectorAll('img').length, \
           bold: m.querySelectorAll('strong').length }}"
    ));
    assert_eq!(shown["pwned"], 0, "{shown}");
    assert_eq!(
        (shown["scripts"].as_u64(), shown["images"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(shown["text"]
        .as_str()
        .unwrap()
        .contains("<script>window.__pwned = 1</script>"));
    assert_eq!(shown["bold"], 1, "the Markdown around it still renders");

    // Four clients at different priorities, the least urgent first: with room for three,
    // it is paused for the others.
    let (_, models) = http(&addr, "GET", "/v1/models", None);
    let models: Value = serde_json::from_str(&models).unwrap();
    let model = models["data"][0]["id"].as_str().unwrap().to_string();
    let clients: Vec<_> = [9, 2, 1, 0]
        .into_iter()
        .map(|priority| {
            let (addr, model) = (addr.clone(), model.clone());
            let client = std::thread::spawn(move || {
                let body = json!({"model": model, "stream": true, "max_tokens": 400,
                    "ignore_eos": true, "priority": priority,
                    "messages": [{"role": "user", "content": format!("Count to a hundred, client {priority}.")}]});
                http(&addr, "POST", "/v1/chat/completions", Some(&body))
            });
            std::thread::sleep(Duration::from_millis(300));
            client
        })
        .collect();
    browser.click("tab-engine");
    browser.wait_for(
        "four sessions, one paused",
        "const rows = [...document.querySelectorAll('[data-testid=engine-session-row]')]; \
         const live = rows.filter(r => ['running', 'paused', 'queued'].includes(r.dataset.state)); \
         return live.length === 4 && live.some(r => r.dataset.state === 'paused')",
        Duration::from_secs(60),
    );
    browser.screenshot("engine.png");
    for client in clients {
        let (status, _) = client.join().unwrap();
        assert_eq!(status, 200);
    }
}
