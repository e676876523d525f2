//! The dashboard: the built `web/dist`, read into memory at start-up and served at `/` for
//! every path the API does not own. Hashed files under `/assets/` are cached for good;
//! `index.html` (also the answer for the single-page app's own paths) is never cached, so a
//! new build is picked up on the next load. Every answer carries a strict
//! Content-Security-Policy: scripts from this origin only (no inline script; WebAssembly
//! for the replay player's terminal emulator), connections
//! to this origin and its WebSocket twin only, no framing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Uri, header};

/// Paths the API owns: an unknown one of them is the API's 404, never the dashboard.
const API_PREFIXES: &[&str] = &[
    "/v1/",
    "/openai/",
    "/anthropic/",
    "/store/",
    "/mcp",
    "/healthz",
    "/readyz",
    "/metrics",
    "/internal/",
    // Discovery documents (OAuth metadata among them): SandBase publishes none, and a
    // client must see a 404, not the dashboard's page.
    "/.well-known/",
];

/// The dashboard's files, by URL path.
#[derive(Debug, Default)]
pub struct WebAssets {
    files: HashMap<String, Arc<[u8]>>,
}

impl WebAssets {
    /// Reads every file under `root` (the built dashboard); `index.html` must be there.
    pub fn load(root: &Path) -> anyhow::Result<WebAssets> {
        let mut files = HashMap::new();
        let mut pending = vec![root.to_path_buf()];
        while let Some(directory) = pending.pop() {
            let entries = std::fs::read_dir(&directory)
                .with_context(|| format!("reading the dashboard at {}", directory.display()))?;
            for entry in entries {
                let path = entry?.path();
                if path.is_dir() {
                    pending.push(path);
                } else {
                    let relative = relative_url(root, &path)?;
                    let bytes = std::fs::read(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    files.insert(relative, Arc::from(bytes));
                }
            }
        }
        if !files.contains_key("/index.html") {
            anyhow::bail!(
                "server.web_dir {} has no index.html (build the dashboard: npm run build in web/)",
                root.display()
            );
        }
        Ok(WebAssets { files })
    }

    /// Whether `path` is the dashboard's to answer.
    pub fn owns(method: &Method, path: &str) -> bool {
        (method == Method::GET || method == Method::HEAD)
            && !API_PREFIXES
                .iter()
                .any(|prefix| path.starts_with(prefix) || path == prefix.trim_end_matches('/'))
    }

    /// The answer for `uri`: the file, or `index.html` for the app's own paths; a missing
    /// asset (a file name with an extension) is a 404, not the app.
    pub fn answer(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Response<Body> {
        let path = uri.path();
        let (name, bytes) = match self.files.get(path) {
            Some(bytes) => (path, bytes),
            None if looks_like_file(path) => return not_found(headers),
            None => ("/index.html", &self.files["/index.html"]),
        };
        let cache = if name.starts_with("/assets/") {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        let body = if method == Method::HEAD {
            Body::empty()
        } else {
            Body::from(bytes::Bytes::from_owner(Arc::clone(bytes)))
        };
        let mut response = Response::new(body);
        let answer = response.headers_mut();
        answer.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(name)),
        );
        answer.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        answer.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
        secure(answer, headers);
        response
    }
}

fn not_found(headers: &HeaderMap) -> Response<Body> {
    let mut response = Response::new(Body::from("not found"));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    secure(response.headers_mut(), headers);
    response
}

/// The security headers of every dashboard answer. The WebSocket origin is the request's
/// own host (checked to be a host name, so nothing can be smuggled into the policy).
fn secure(answer: &mut HeaderMap, request: &HeaderMap) {
    let host = request
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .filter(|host| is_host(host));
    let sockets = host.map_or_else(String::new, |host| format!(" ws://{host} wss://{host}"));
    let policy = format!(
        "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data:; font-src 'self'; connect-src 'self'{sockets}; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'"
    );
    if let Ok(value) = HeaderValue::from_str(&policy) {
        answer.insert(header::CONTENT_SECURITY_POLICY, value);
    }
    answer.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    answer.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    answer.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

fn is_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b".-:[]".contains(&byte))
}

fn looks_like_file(path: &str) -> bool {
    path.starts_with("/assets/")
        || path
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains('.'))
}

fn relative_url(root: &Path, path: &Path) -> anyhow::Result<String> {
    let relative: PathBuf = path.strip_prefix(root)?.to_path_buf();
    let parts: Vec<String> = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    Ok(format!("/{}", parts.join("/")))
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next().unwrap_or_default() {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_keeps_its_paths() {
        assert!(WebAssets::owns(&Method::GET, "/"));
        assert!(WebAssets::owns(&Method::GET, "/sandboxes/abc"));
        assert!(WebAssets::owns(&Method::HEAD, "/assets/index-1.js"));
        assert!(!WebAssets::owns(&Method::POST, "/keys"));
        assert!(!WebAssets::owns(&Method::GET, "/v1/nothing"));
        assert!(!WebAssets::owns(&Method::GET, "/mcp"));
        assert!(!WebAssets::owns(&Method::GET, "/openai/v1/models"));
        assert!(!WebAssets::owns(&Method::GET, "/healthz"));
    }

    #[test]
    fn only_host_names_reach_the_policy() {
        assert!(is_host("127.0.0.1:8080"));
        assert!(is_host("[::1]:80"));
        assert!(!is_host("evil; script-src *"));
        assert!(!is_host(""));
    }
}
