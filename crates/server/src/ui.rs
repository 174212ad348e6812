//! The web page at `/`: a chat with the model and a live view of the engine, plain HTML,
//! CSS and JavaScript (no build step, no framework) embedded in the binary, so it works
//! offline.
//!
//! The page and its assets are static and public: a browser cannot send
//! `Authorization: Bearer` when it navigates, and they hold no data. Everything the page
//! shows comes from the API, which keeps asking for `--api-key` (the page has a key
//! field). Every answer carries a Content-Security-Policy that allows scripts, styles and
//! connections from this server only, and no inline script or style, so text a model
//! writes cannot run even if it reached the DOM as markup.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// Scripts, styles and connections from this origin only; no inline code, no plugins,
/// no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self' data:; object-src 'none'; \
    base-uri 'none'; frame-ancestors 'none'";

/// Whether `pyramid serve` serves the page (`--no-ui` turns it off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WebPage {
    #[default]
    Served,
    Off,
}

/// The embedded files: path, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../assets/index.html"),
    ),
    (
        "/assets/app.css",
        "text/css; charset=utf-8",
        include_str!("../assets/app.css"),
    ),
    (
        "/assets/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    ),
    (
        "/assets/api.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/api.js"),
    ),
    (
        "/assets/chat.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/chat.js"),
    ),
    (
        "/assets/engine.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/engine.js"),
    ),
    (
        "/assets/markdown.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/markdown.js"),
    ),
];

/// The page's routes, without state and outside the API's authentication (see the
/// module's note).
pub fn router() -> Router {
    ASSETS
        .iter()
        .fold(Router::new(), |router, &(path, content_type, body)| {
            router.route(path, get(move || async move { asset(content_type, body) }))
        })
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Embedded in the binary: a new build may change them, so the browser revalidates.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn get(path: &str) -> (StatusCode, axum::http::HeaderMap, String) {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let response = router().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_page_is_served_with_a_strict_csp_and_no_inline_code() {
        let (status, headers, html) = get("/").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], "text/html; charset=utf-8");
        let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert_eq!(csp, CONTENT_SECURITY_POLICY);
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let lower = html.to_ascii_lowercase();
        // Every <script> loads a file and has an empty body.
        let mut scripts = 0;
        for (at, _) in lower.match_indices("<script") {
            let tag_end = at + lower[at..].find('>').unwrap();
            assert!(
                lower[at..tag_end].contains(" src=\"/assets/"),
                "{}",
                &html[at..]
            );
            assert!(
                lower[tag_end + 1..].starts_with("</script>"),
                "inline script"
            );
            scripts += 1;
        }
        assert_eq!(scripts, 1);
        assert!(!lower.contains("<style"), "inline stylesheet");
        for tag in lower.split('<').skip(1) {
            let tag = tag.split('>').next().unwrap_or("");
            for attribute in tag.split_whitespace().skip(1) {
                assert!(
                    !attribute.starts_with("style="),
                    "style attribute in <{tag}>"
                );
                assert!(
                    !(attribute.starts_with("on") && attribute.contains('=')),
                    "event handler attribute in <{tag}>"
                );
            }
        }
        assert!(!lower.contains("javascript:"));
        // The elements a browser test drives are there under stable names.
        for id in [
            "data-testid=\"message-input\"",
            "data-testid=\"send-button\"",
            "data-testid=\"messages\"",
            "data-testid=\"engine-sessions\"",
            "data-testid=\"engine-timeline\"",
        ] {
            assert!(html.contains(id), "{id}");
        }
    }

    #[tokio::test]
    async fn every_asset_is_served_with_its_content_type() {
        for &(path, content_type, body) in ASSETS {
            let (status, headers, text) = get(path).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
            assert!(
                headers.contains_key(header::CONTENT_SECURITY_POLICY),
                "{path}"
            );
            assert_eq!(text, body, "{path}");
        }
        let (status, _, _) = get("/assets/missing.js").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    /// Every file the page names is served, and the scripts neither parse markup from
    /// strings nor evaluate code: replies reach the DOM as text nodes only.
    #[test]
    fn the_scripts_build_text_nodes_and_every_referenced_file_is_served() {
        let served: Vec<&str> = ASSETS.iter().map(|a| a.0).collect();
        for &(path, _, body) in ASSETS {
            for reference in body
                .split(['"', '\''])
                .filter(|s| s.starts_with("/assets/") || s.starts_with("./"))
            {
                let path = reference.replacen("./", "/assets/", 1);
                assert!(served.contains(&path.as_str()), "{path} is not served");
            }
            if path.ends_with(".js") {
                for banned in [
                    "innerHTML",
                    "outerHTML",
                    "insertAdjacentHTML",
                    "document.write",
                    "eval(",
                    "new Function",
                    "setAttribute(\"style",
                    "setTimeout(\"",
                ] {
                    assert!(!body.contains(banned), "{path} uses {banned}");
                }
            }
        }
    }
}
