//! The web page `pyramid serve` ships at `/`: served from the binary with its CSP, public
//! while the API it calls keeps asking for `--api-key`, printed at start, and gone with
//! `--no-ui`. (The page's own behaviour needs a browser: a separate suite.)

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running server, killed on drop.
struct Server {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Server {
    fn start(name: &str, extra: &[&str]) -> Self {
        let model = pyramid_testdata::model_path("smollm2-135m-instruct-q4_1.gguf");
        let log = std::env::temp_dir().join(format!(
            "pyramid-web-page-{name}-{}.log",
            std::process::id()
        ));
        let mut child = Command::new(env!("CARGO_BIN_EXE_pyramid"))
            .args(["serve", "-m"])
            .arg(&model)
            .args(["--port", "0", "--windows", "256"])
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
