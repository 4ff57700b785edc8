//! A bounded JSON-RPC 2.0 client for subtensor, over HTTP and WebSocket.
//!
//! [`ChainRpc`] talks to one subtensor node: `http://` (one HTTP/1.1 POST per call, through
//! hyper) or `ws://` (one WebSocket, through tokio-tungstenite, opened by [`ChainRpc::connect`]
//! and opened again at the next call after it drops). Everything the node sends back is
//! hostile:
//!
//! * every call has a deadline ([`RpcLimits::call_timeout`]), connecting included;
//! * a response larger than [`RpcLimits::max_response_bytes`] is refused before it is buffered
//!   whole: the WebSocket's frame and message limits, an HTTP `Content-Length` checked before
//!   the body is read, and a running count over the body's chunks;
//! * a response must be a JSON-RPC 2.0 object carrying the id of its request; an `error` object
//!   becomes [`RpcError::Remote`];
//! * the wrappers check the shape of what they return (hex, hashes, numbers) and say which
//!   method answered wrongly.
//!
//! Calls on one client are serialised (one request in flight per WebSocket); a call that times
//! out or fails mid-way closes its WebSocket, so a late answer can never be taken for the answer
//! to a later request.
//!
//! The parts, by concern: `limits` (the bounds a client works within), `error` (why a call
//! failed), `endpoint` (the node's URL, parsed and checked), `frames` (the JSON-RPC 2.0
//! envelope and the shapes of results, pure), `ws` and `http` (the two transports), and
//! `client` ([`ChainRpc`]: the calls subtensor answers).

mod client;
mod endpoint;
mod error;
mod frames;
mod http;
mod limits;
mod ws;

pub use client::ChainRpc;
pub use endpoint::check_url;
pub use error::RpcError;
pub use limits::RpcLimits;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};

    use super::endpoint::{Endpoint, Scheme};
    use super::frames::{cut, hash_result, hex_result, is_notification, parse_response};
    use super::*;

    #[test]
    fn urls_parse_or_fail_clearly() {
        let e = Endpoint::parse("ws://127.0.0.1:9944").expect("valid");
        assert_eq!(
            (e.scheme, e.host.as_str(), e.port, e.path.as_str()),
            (Scheme::Ws, "127.0.0.1", 9944, "/")
        );
        let e = Endpoint::parse("http://[::1]:8080/rpc?x=1").expect("valid");
        assert_eq!(
            (
                e.host.as_str(),
                e.port,
                e.authority.as_str(),
                e.path.as_str()
            ),
            ("::1", 8080, "[::1]:8080", "/rpc?x=1")
        );
        assert_eq!(Endpoint::parse("http://node").expect("valid").port, 80);
        assert!(matches!(
            Endpoint::parse("wss://127.0.0.1:9944"),
            Err(RpcError::TlsUnsupported { .. })
        ));
        for bad in [
            "ftp://x",
            "ws://",
            "ws://:9944",
            "ws://h:0",
            "ws://h:99999",
            "ws://u@h:1",
            "ws://::1:9944",
            "ws://h :1",
            "http://h/#frag",
        ] {
            assert!(
                matches!(Endpoint::parse(bad), Err(RpcError::BadUrl { .. })),
                "{bad}"
            );
        }
        let long = format!("ws://{}", "a".repeat(3000));
        assert!(matches!(
            Endpoint::parse(&long),
            Err(RpcError::BadUrl { .. })
        ));
    }

    #[test]
    fn responses_are_checked() {
        let ok = parse_response("m", r#"{"jsonrpc":"2.0","id":7,"result":"0x01"}"#, 7);
        assert_eq!(ok.expect("ok"), json!("0x01"));
        let null = parse_response("m", r#"{"jsonrpc":"2.0","id":7,"result":null}"#, 7);
        assert_eq!(null.expect("ok"), Value::Null);
        assert!(matches!(
            parse_response("m", r#"{"jsonrpc":"2.0","id":8,"result":1}"#, 7),
            Err(RpcError::IdMismatch { expected: 7, .. })
        ));
        assert!(matches!(
            parse_response("m", r#"{"jsonrpc":"2.0","id":"7","result":1}"#, 7),
            Err(RpcError::IdMismatch { .. })
        ));
        let remote = parse_response(
            "m",
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1010,"message":"Invalid Transaction","data":"bad signature"}}"#,
            7,
        );
        match remote {
            Err(RpcError::Remote { code, message }) => {
                assert_eq!(code, 1010);
                assert_eq!(message, "Invalid Transaction: bad signature");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_response(
                "m",
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#,
                7
            ),
            Err(RpcError::Remote { code: -32700, .. })
        ));
        for bad in [
            "",
            "[]",
            "1",
            r#"{"id":7,"result":1}"#,
            r#"{"jsonrpc":"1.0","id":7,"result":1}"#,
            r#"{"jsonrpc":"2.0","id":7}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":"x","message":"m"}}"#,
        ] {
            assert!(
                matches!(parse_response("m", bad, 7), Err(RpcError::Malformed { .. })),
                "{bad}"
            );
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(matches!(
            parse_response("m", &deep, 7),
            Err(RpcError::Malformed { .. })
        ));
    }

    #[test]
    fn results_are_shaped() {
        let h = format!("0x{}", "ab".repeat(32));
        assert_eq!(hash_result("m", &json!(h)).expect("hash"), h);
        assert!(matches!(
            hash_result("m", &json!("0x12")),
            Err(RpcError::BadResult { .. })
        ));
        assert!(matches!(
            hash_result("m", &Value::Null),
            Err(RpcError::Missing { .. })
        ));
        assert_eq!(hex_result("m", &json!("0x0102")).expect("hex"), vec![1, 2]);
        assert_eq!(
            hex_result("m", &json!("0x")).expect("hex"),
            Vec::<u8>::new()
        );
        for bad in [json!("0x123"), json!("0xzz"), json!("0102"), json!(5)] {
            assert!(matches!(
                hex_result("m", &bad),
                Err(RpcError::BadResult { .. })
            ));
        }
        assert!(is_notification(
            r#"{"jsonrpc":"2.0","method":"chain_newHead","params":{}}"#
        ));
        assert!(!is_notification(r#"{"jsonrpc":"2.0","id":1,"result":1}"#));
        assert_eq!(cut("abcdef", 3), "abc…");
    }

    /// The node spawns calls on its multi-threaded runtime: the client and its futures are
    /// `Send` and `Sync`.
    #[test]
    fn client_and_calls_are_send() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>(_: &T) {}
        send_sync::<ChainRpc>();
        send_sync::<RpcError>();
        let connect = ChainRpc::connect("http://127.0.0.1:1", RpcLimits::default());
        send(&connect);
        drop(connect);
        let call = async {
            let rpc = ChainRpc::connect("http://127.0.0.1:1", RpcLimits::default()).await?;
            rpc.state_call("X_y", "0x", None).await?;
            rpc.call("system_chain", json!([])).await
        };
        send(&call);
    }

    /// A one-shot HTTP server on 127.0.0.1 answering every request with `reply` (raw HTTP).
    async fn raw_http_server(reply: &'static [u8]) -> (String, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            for _ in 0..4 {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = vec![0u8; 64 * 1024];
                let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
                let _ = s.write_all(reply).await;
                let _ = s.shutdown().await;
            }
        });
        (format!("http://{addr}/"), task)
    }

    #[tokio::test]
    async fn http_body_limits_hold() {
        let limits = RpcLimits {
            call_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            max_response_bytes: 64,
        };
        // A declared length over the limit is refused before the body is read.
        let (url, task) = raw_http_server(
            b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\nconnection: close\r\n\r\n{",
        )
        .await;
        let rpc = ChainRpc::connect(&url, limits).await.expect("http client");
        assert!(matches!(
            rpc.call("system_chain", json!([])).await,
            Err(RpcError::TooLarge { limit: 64, .. })
        ));
        task.abort();
        // A chunked body growing past the limit is cut off as it comes.
        let (url, task) = raw_http_server(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
              28\r\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"aaaaaa\r\n\
              28\r\naaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n0\r\n\r\n",
        )
        .await;
        let rpc = ChainRpc::connect(&url, limits).await.expect("http client");
        assert!(matches!(
            rpc.call("system_chain", json!([])).await,
            Err(RpcError::TooLarge { .. })
        ));
        task.abort();
        // A non-2xx status is its own error.
        let (url, task) = raw_http_server(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await;
        let rpc = ChainRpc::connect(&url, limits).await.expect("http client");
        assert!(matches!(
            rpc.call("system_chain", json!([])).await,
            Err(RpcError::HttpStatus { status: 503, .. })
        ));
        task.abort();
    }

    #[tokio::test]
    async fn connecting_to_nothing_fails_clearly() {
        // Bind then drop: the port is (almost surely) closed now.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let limits = RpcLimits {
            call_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            ..RpcLimits::default()
        };
        assert!(matches!(
            ChainRpc::connect(&format!("ws://{addr}"), limits).await,
            Err(RpcError::Connect { .. })
        ));
        let rpc = ChainRpc::connect(&format!("http://{addr}"), limits)
            .await
            .expect("http connects lazily");
        assert!(matches!(
            rpc.call("system_chain", json!([])).await,
            Err(RpcError::Connect { .. })
        ));
        assert!(matches!(
            rpc.call("bad method", json!([])).await,
            Err(RpcError::BadRequest(_))
        ));
        assert!(matches!(
            rpc.state_call("X_y", "0x123", None).await,
            Err(RpcError::BadRequest(_))
        ));
        assert!(matches!(
            rpc.chain_get_header("0x12").await,
            Err(RpcError::BadRequest(_))
        ));
    }
}
