//! The built-in chat page (`GET /`, docs/http.md "The chat page"): one self-contained
//! HTML document whose style and script are embedded in the binary
//! (`page/`), served with a Content-Security-Policy that allows nothing but
//! this origin and the hashes of its own inline style and script; and the
//! favicon Chromium asks for.
//!
//! Sign-in works the way Jupyter's does. On a listener with a token, `serve`
//! prints `http://HOST:PORT/?token=…`; opening it answers `303 See Other` to
//! `/` with an HttpOnly, SameSite=Strict cookie, so the token leaves the
//! address bar and the history. The cookie holds a digest of the token,
//! never the token itself; its name carries the port, so two daemons on one
//! host do not overwrite each other's cookie. The page's API calls send it;
//! a request that carries it from another origin (an `Origin` header that
//! is not this host) is refused. Without it `/` is a short page that says
//! how to get the link, and the API stays 401. On the Unix socket (no token)
//! the page is served as is.

use super::shared::constant_eq;
use axum::extract::Query;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

const HTML: &str = include_str!("page/index.html");
const CSS: &str = include_str!("page/page.css");
const JS: &str = include_str!("page/page.js");
const SIGN_IN: &str = include_str!("page/signin.html");
const FAVICON: &str = include_str!("page/favicon.svg");

/// How long the sign-in cookie lasts (seconds): 30 days.
const COOKIE_AGE: u64 = 30 * 24 * 3600;

/// The page with its style and script inlined, and the policy that allows
/// exactly those two.
struct Page {
    html: String,
    csp: String,
}

static PAGE: LazyLock<Page> = LazyLock::new(|| {
    let html = HTML.replacen("/*AGENTD_CSS*/", CSS, 1).replacen("/*AGENTD_JS*/", JS, 1);
    Page { html, csp: policy(Some(CSS), Some(JS)) }
});

/// `default-src 'none'` with the hash of each inline part: nothing the
/// model writes can load, run or send anything, whatever gets past the
/// renderer.
fn policy(css: Option<&str>, js: Option<&str>) -> String {
    let hash = |s: &str| format!("'sha256-{}'", base64(&Sha256::digest(s.as_bytes())));
    let style = css.map(hash).unwrap_or_else(|| "'none'".into());
    let script = js.map(hash).unwrap_or_else(|| "'none'".into());
    format!(
        "default-src 'none'; style-src {style}; script-src {script}; connect-src 'self'; \
         img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
}

/// Standard base64 with padding (RFC 4648), for the CSP hashes.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(char::from(A[(n >> shift) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The page's routes; `token`: the listener's token (`None` on the socket).
pub(super) fn routes<S: Clone + Send + Sync + 'static>(token: Option<Arc<String>>) -> Router<S> {
    Router::new()
        .route(
            "/",
            get(move |q: Query<HashMap<String, String>>, headers: HeaderMap| {
                let token = token.clone();
                async move { index(token.as_deref().map(String::as_str), &q, &headers) }
            }),
        )
        .route("/favicon.ico", get(favicon))
        .route("/favicon.svg", get(favicon))
}

/// Paths that answer without a credential (they decide themselves what to
/// show).
pub(super) fn public(path: &str) -> bool {
    matches!(path, "/" | "/favicon.ico" | "/favicon.svg")
}

/// What a request's sign-in cookie says.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Cookie {
    /// The cookie of this daemon's token, from this origin.
    Valid,
    /// The right cookie, sent by a page of another origin.
    CrossOrigin,
    /// None, or one of another token.
    Missing,
}

/// Checks the sign-in cookie of a request to a listener with `token`.
pub(super) fn cookie(headers: &HeaderMap, token: &str) -> Cookie {
    let name = cookie_name(headers);
    let want = cookie_value(token);
    let found = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == name && constant_eq(v.as_bytes(), want.as_bytes()));
    if !found {
        return Cookie::Missing;
    }
    if same_origin(headers) {
        Cookie::Valid
    } else {
        Cookie::CrossOrigin
    }
}

/// An `Origin` header, when there is one, names this host.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else { return true };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    origin.to_str().ok().and_then(|o| o.strip_prefix("http://")).is_some_and(|o| o == host)
}

/// `agentd-PORT`, the port from the `Host` header (browsers keep cookies
/// per host, not per port).
fn cookie_name(headers: &HeaderMap) -> String {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    match host.rsplit_once(':') {
        Some((_, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("agentd-{port}")
        }
        _ => "agentd".into(),
    }
}

/// The cookie holds a digest of the token: a cookie store that leaks does
/// not hand out the bearer token of the API.
fn cookie_value(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"agentd chat page cookie\0");
    h.update(token.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The link `serve` prints: `http://ADDR/?token=…` (an unspecified address
/// is shown as the loopback one a browser on this machine can open).
pub(super) fn link(addr: std::net::SocketAddr, token: &str) -> String {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let mut q = String::new();
    for b in token.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            q.push(char::from(b));
        } else {
            q.push_str(&format!("%{b:02X}"));
        }
    }
    format!("http://{addr}/?token={q}")
}

fn index(token: Option<&str>, q: &HashMap<String, String>, headers: &HeaderMap) -> Response {
    let Some(token) = token else { return page() };
    if let Some(given) = q.get("token") {
        if !constant_eq(given.trim().as_bytes(), token.as_bytes()) {
            return sign_in(
                "The token in this link is not the one this agentd uses. Open the link that \
                 the running <code>agentd serve</code> printed when it started (or wrote to \
                 <code>page-link</code> in agentd's home).",
            );
        }
        let set = format!(
            "{}={}; Path=/; Max-Age={COOKIE_AGE}; HttpOnly; SameSite=Strict",
            cookie_name(headers),
            cookie_value(token)
        );
        let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
        if let Ok(v) = HeaderValue::from_str(&set) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        no_store(&mut r);
        return r;
    }
    match cookie(headers, token) {
        Cookie::Valid => page(),
        _ => sign_in(
            "This browser is not signed in to this agentd. Open the link that <code>agentd \
             serve</code> printed when it started, or wrote to <code>page-link</code> in \
             agentd's home (<code>http://HOST:PORT/?token=…</code>); \
             it signs this browser in and brings you back here.",
        ),
    }
}

fn page() -> Response {
    html(StatusCode::OK, PAGE.html.clone(), &PAGE.csp)
}

/// 401 with a page that says how to sign in (`why` is fixed text of ours).
fn sign_in(why: &str) -> Response {
    static CSP: LazyLock<String> = LazyLock::new(|| policy(None, None));
    html(StatusCode::UNAUTHORIZED, SIGN_IN.replacen("<!--WHY-->", why, 1), &CSP)
}

fn html(status: StatusCode, body: String, csp: &str) -> Response {
    let mut r =
        (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response();
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    no_store(&mut r);
    r
}

fn no_store(r: &mut Response) {
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

async fn favicon() -> Response {
    (
        [(header::CONTENT_TYPE, "image/svg+xml"), (header::CACHE_CONTROL, "public, max-age=86400")],
        FAVICON,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn base64_matches_rfc_4648() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn the_page_inlines_its_parts_and_the_policy_names_their_hashes() {
        let p = &*PAGE;
        assert!(!p.html.contains("/*AGENTD_"), "a placeholder is left");
        assert!(p.html.contains(CSS) && p.html.contains(JS));
        assert!(p.csp.starts_with("default-src 'none'"));
        assert_eq!(p.csp.matches("'sha256-").count(), 2);
        // The script never turns text into markup.
        for sink in [".innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
            assert!(!JS.contains(sink), "page.js uses {sink}");
        }
        assert!(!JS.contains("new Function"), "page.js compiles code at run time");
        // Nothing the page loads comes from elsewhere.
        for bad in ["http://", "https://", "//cdn", "@import", "url("] {
            let outside = p.html.replace("http://HOST:PORT", "").replace("http://www.w3.org", "");
            assert!(!outside.contains(bad), "the page refers to {bad:?}");
        }
    }

    #[test]
    fn the_cookie_is_named_by_port_checked_by_value_and_origin() {
        let token = "secret-token-0123456789";
        let v = cookie_value(token);
        assert!(!v.contains(token));
        let ok = format!("other=1; agentd-8080={v}");
        let h = headers(&[("host", "127.0.0.1:8080"), ("cookie", &ok)]);
        assert_eq!(cookie(&h, token), Cookie::Valid);
        assert_eq!(cookie(&h, "another-token-0123456789"), Cookie::Missing);
        let h = headers(&[("host", "127.0.0.1:9090"), ("cookie", &ok)]);
        assert_eq!(cookie(&h, token), Cookie::Missing, "another port's cookie");
        let h = headers(&[
            ("host", "127.0.0.1:8080"),
            ("cookie", &ok),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        assert_eq!(cookie(&h, token), Cookie::Valid);
        let h =
            headers(&[("host", "127.0.0.1:8080"), ("cookie", &ok), ("origin", "http://evil.test")]);
        assert_eq!(cookie(&h, token), Cookie::CrossOrigin);
        let h = headers(&[("host", "127.0.0.1:8080")]);
        assert_eq!(cookie(&h, token), Cookie::Missing);
    }

    #[test]
    fn the_link_escapes_the_token_and_names_a_reachable_host() {
        let a: std::net::SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(link(a, "ab c&d/é"), "http://127.0.0.1:8080/?token=ab%20c%26d%2F%C3%A9");
        let a: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(link(a, "tok-1_2.3~"), "http://127.0.0.1:1/?token=tok-1_2.3~");
    }

    #[test]
    fn the_token_link_sets_the_cookie_and_redirects_home() {
        let token = "secret-token-0123456789";
        let h = headers(&[("host", "127.0.0.1:8080")]);
        let q = HashMap::from([("token".to_owned(), token.to_owned())]);
        let r = index(Some(token), &q, &h);
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()[header::LOCATION], "/");
        let c = r.headers()[header::SET_COOKIE].to_str().unwrap();
        assert!(c.starts_with(&format!("agentd-8080={}", cookie_value(token))), "{c}");
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Path=/"));
        let q = HashMap::from([("token".to_owned(), "wrong".to_owned())]);
        assert_eq!(index(Some(token), &q, &h).status(), StatusCode::UNAUTHORIZED);
        assert_eq!(index(Some(token), &HashMap::new(), &h).status(), StatusCode::UNAUTHORIZED);
        assert_eq!(index(None, &HashMap::new(), &h).status(), StatusCode::OK);
    }
}
