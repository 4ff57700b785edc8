//! The node's URL, parsed and checked before anything is sent: `http://` or `ws://` (this
//! build has no TLS), a host (IPv6 in brackets), a port, a path; nothing else.

use super::error::RpcError;
use super::frames::cut;
use super::limits::MAX_URL_LEN;

/// How to talk to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scheme {
    /// `http://`: one HTTP/1.1 POST per call.
    Http,
    /// `ws://`: one WebSocket, kept open between calls.
    Ws,
}

/// A parsed node URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Endpoint {
    pub(super) scheme: Scheme,
    /// Host as it goes to the TCP connect (no brackets around IPv6).
    pub(super) host: String,
    pub(super) port: u16,
    /// `host:port` as the `Host` header (brackets kept).
    pub(super) authority: String,
    /// Path and query, starting with `/`.
    pub(super) path: String,
    /// The whole URL, as given.
    pub(super) url: String,
}

/// Checks that `url` is one [`super::ChainRpc::connect`] can use (scheme, host, port), without
/// connecting: for command-line checks.
pub fn check_url(url: &str) -> Result<(), RpcError> {
    Endpoint::parse(url).map(|_| ())
}

impl Endpoint {
    /// Parses and checks `url`: `http://` or `ws://`, a host, an optional port, a path.
    pub(super) fn parse(url: &str) -> Result<Self, RpcError> {
        let bad = |reason: &str| RpcError::BadUrl {
            url: cut(url, 200),
            reason: reason.to_string(),
        };
        if url.len() > MAX_URL_LEN {
            return Err(bad("longer than 2048 bytes"));
        }
        if !url.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("only printable ASCII without spaces is accepted"));
        }
        let (scheme, default_port, rest) = if let Some(rest) = url.strip_prefix("http://") {
            (Scheme::Http, 80, rest)
        } else if let Some(rest) = url.strip_prefix("ws://") {
            (Scheme::Ws, 80, rest)
        } else if url.starts_with("https://") || url.starts_with("wss://") {
            return Err(RpcError::TlsUnsupported { url: cut(url, 200) });
        } else {
            return Err(bad("the scheme must be http:// or ws://"));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        if path.contains('#') {
            return Err(bad("a fragment (#) has no meaning here"));
        }
        if authority.contains('@') {
            return Err(bad("user info (user@host) is not supported"));
        }
        let (host, port) = if let Some(after) = authority.strip_prefix('[') {
            let end = after
                .find(']')
                .ok_or_else(|| bad("unclosed [ in the host"))?;
            let host = &after[..end];
            let tail = &after[end + 1..];
            let port = match tail.strip_prefix(':') {
                Some(p) => Some(p),
                None if tail.is_empty() => None,
                None => return Err(bad("junk after the ]")),
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if host.contains(':') && !authority.starts_with('[') {
            return Err(bad("an IPv6 host must be in brackets"));
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?,
            None => default_port,
        };
        Ok(Self {
            scheme,
            host: host.to_string(),
            port,
            authority: authority.to_string(),
            path,
            url: url.to_string(),
        })
    }
}
