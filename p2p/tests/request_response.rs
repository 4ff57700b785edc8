//! Request-response over real connections: large payloads, the size limit, error paths.

mod common;

use std::time::Duration;

use common::{config, init_tracing, spawn_node, wait_for, TestNode};
use p2p::{Config, Event, RequestError};

/// Answers every request on `node` with the blake3 hash of its payload, until the event
/// channel closes.
fn serve_hashes(mut node: TestNode) -> tokio::task::JoinHandle<TestNode> {
    tokio::spawn(async move {
        while let Some(event) = node.events.recv().await {
            if let Event::Request { id, data, .. } = event {
                let hash = blake3::hash(&data).as_bytes().to_vec();
                node.client.respond(id, hash).await.expect("respond");
            }
        }
        node
    })
}

async fn connected_pair(server_config: Config) -> (TestNode, TestNode) {
    let server = spawn_node(server_config).await;
    let client = spawn_node(Config {
        bootstrap: vec![server.addr.clone()],
        ..config()
    })
    .await;
    let server_id = server.peer_id();
    wait_for("connection", Duration::from_secs(10), || async {
        let peers = client
            .client
            .connected_peers()
            .await
            .expect("connected_peers");
        if peers.contains(&server_id) {
            Ok(())
        } else {
            Err(format!("connected to {peers:?}"))
        }
    })
    .await;
    (server, client)
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_of_a_few_mib_round_trips() {
    init_tracing();
    let (server, client) = connected_pair(config()).await;
    let server_id = server.peer_id();
    let server_metrics = server.metrics.clone();
    let _server = serve_hashes(server);

    for len in [0, 1, 3 << 20] {
        let data = payload(len);
        let response = client
            .client
            .request(server_id, data.clone())
            .await
            .unwrap();
        assert_eq!(
            response,
            blake3::hash(&data).as_bytes().to_vec(),
            "len {len}"
        );
    }
    let (sent, received) = client.metrics.rr_bytes();
    assert_eq!(sent, (3 << 20) + 1 + 3 * 8);
    assert_eq!(received, 3 * (32 + 8));
    assert_eq!(server_metrics.rr_bytes(), (received, sent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_over_the_peers_limit_fails_and_both_nodes_stay_up() {
    init_tracing();
    let (server, client) = connected_pair(Config {
        max_frame_bytes: 1 << 20,
        ..config()
    })
    .await;
    let server_id = server.peer_id();
    let served = serve_hashes(server);

    let started = std::time::Instant::now();
    let err = client
        .client
        .request(server_id, payload(2 << 20))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RequestError::Io(_) | RequestError::ConnectionClosed | RequestError::Timeout
        ),
        "{err:?}"
    );
    eprintln!(
        "oversized request failed after {:?}: {err}",
        started.elapsed()
    );

    // Both nodes still work: a request within the limit succeeds.
    let data = payload(512 << 10);
    let response = client
        .client
        .request(server_id, data.clone())
        .await
        .unwrap();
    assert_eq!(response, blake3::hash(&data).as_bytes().to_vec());
    assert!(!served.is_finished());

    // Our own limit is checked before sending.
    let err = client
        .client
        .request(server_id, vec![0; p2p::DEFAULT_MAX_FRAME_BYTES + 1])
        .await
        .unwrap_err();
    assert!(matches!(err, RequestError::TooLarge { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_request_times_out_and_late_respond_is_refused() {
    init_tracing();
    let (mut server, client) = connected_pair(Config {
        request_timeout: Duration::from_secs(1),
        ..config()
    })
    .await;
    let server_id = server.peer_id();
    let requester = client.client.clone();
    let pending = tokio::spawn(async move { requester.request(server_id, vec![1, 2, 3]).await });
    let id = server
        .next_event(Duration::from_secs(10), |e| match e {
            Event::Request { id, data, .. } if data == [1, 2, 3] => Some(id),
            _ => None,
        })
        .await
        .expect("request not delivered");
    // The requester's own timeout (10 s in `config()`) is longer than the server's (1 s): the
    // server gives up first and closes the stream.
    let err = pending.await.unwrap().unwrap_err();
    assert!(
        matches!(err, RequestError::Io(_) | RequestError::Timeout),
        "{err:?}"
    );
    assert!(matches!(
        server.client.respond(id, vec![0]).await,
        Err(p2p::ClientError::UnknownRequest)
    ));
}
