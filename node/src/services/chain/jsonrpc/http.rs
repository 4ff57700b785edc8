//! The HTTP transport: one HTTP/1.1 POST per call on a fresh connection, the body refused
//! past the response limit (its `Content-Length` before reading, then a running count).

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::client::ChainRpc;
use super::error::RpcError;

/// Aborts a spawned task when dropped (the HTTP connection driver of a call that gave up).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ChainRpc {
    /// One HTTP/1.1 POST of `body` on a fresh connection; the body read with a running bound.
    pub(super) async fn http_exchange(
        &self,
        method: &str,
        body: String,
    ) -> Result<String, RpcError> {
        let _serial = self.http.lock().await;
        let limit = self.limits.max_response_bytes;
        let transport = |what: &str, e: hyper::Error| RpcError::Transport {
            method: method.to_string(),
            reason: format!("{what}: {e}"),
        };
        let stream = self.open_stream().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| transport("HTTP handshake", e))?;
        let _driver = AbortOnDrop(tokio::spawn(async move {
            let _ = connection.await;
        }));
        let request = hyper::Request::post(self.endpoint.path.as_str())
            .header(hyper::header::HOST, self.endpoint.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| RpcError::BadRequest(format!("cannot build the HTTP request: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| transport("HTTP request", e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(RpcError::HttpStatus {
                method: method.to_string(),
                status: status.as_u16(),
            });
        }
        let too_large = || RpcError::TooLarge {
            method: method.to_string(),
            limit,
        };
        let declared = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        // Reserve what the length promises (already bounded), then grow only under the bound.
        let mut buf: Vec<u8> = Vec::with_capacity(declared.map_or(0, |n| n as usize).min(limit));
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| transport("HTTP body", e))?;
            if let Some(data) = frame.data_ref() {
                if buf.len().saturating_add(data.len()) > limit {
                    return Err(too_large());
                }
                buf.extend_from_slice(data);
            }
        }
        String::from_utf8(buf).map_err(|_| RpcError::Malformed {
            method: method.to_string(),
            reason: "HTTP body is not UTF-8".into(),
        })
    }
}
