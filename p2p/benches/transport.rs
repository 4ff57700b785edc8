//! Request-response throughput against plain TCP, side by side, for 16 MiB payloads on
//! loopback.
//!
//! Two nodes in one process: one requests with a 16 MiB payload, the other answers with an
//! 8-byte acknowledgement; then the same exchange over a plain tokio TCP socket (u64 length
//! prefix, payload, 8-byte ack). Both sides hand the receiver an owned `Vec` of the payload,
//! so allocation is counted on both. Prints MB/s of each and, last,
//! `RESULT transport rr_mb_s=<x> tcp_mb_s=<y> ratio=<x/y>`.
//!
//! Run: `cargo bench -p p2p --bench transport`. `ROUNDS` and `WARMUP` can be overridden
//! through the `TRANSPORT_ROUNDS` / `TRANSPORT_WARMUP` environment variables.

use std::time::{Duration, Instant};

use p2p::{identity::Keypair, multiaddr::Protocol, Config, Event, Metrics};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const PAYLOAD_BYTES: usize = 16 << 20;
const ACK_BYTES: usize = 8;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mb_per_s(rounds: usize, elapsed: Duration) -> f64 {
    (rounds * PAYLOAD_BYTES) as f64 / elapsed.as_secs_f64() / 1e6
}

async fn request_response(payload: &[u8], warmup: usize, rounds: usize) -> f64 {
    let config = Config {
        request_timeout: Duration::from_secs(60),
        ..Config::default()
    };
    let (server, mut server_events, _server_task) = p2p::spawn(
        Keypair::generate_ed25519(),
        config.clone(),
        Metrics::unregistered(),
    )
    .expect("spawn server");
    let server_addr = loop {
        match server_events.recv().await.expect("server running") {
            Event::NewListenAddr(addr) => break addr.with(Protocol::P2p(server.local_peer_id())),
            _ => continue,
        }
    };
    let responder = server.clone();
    let serve = tokio::spawn(async move {
        while let Some(event) = server_events.recv().await {
            if let Event::Request { id, data, .. } = event {
                let ack = (data.len() as u64).to_be_bytes().to_vec();
                responder.respond(id, ack).await.expect("respond");
            }
        }
    });

    let (client, mut client_events, _client_task) = p2p::spawn(
        Keypair::generate_ed25519(),
        Config {
            bootstrap: vec![server_addr],
            ..config
        },
        Metrics::unregistered(),
    )
    .expect("spawn client");
    tokio::spawn(async move { while client_events.recv().await.is_some() {} });

    let server_id = server.local_peer_id();
    let run = |n: usize| {
        let client = client.clone();
        async move {
            let started = Instant::now();
            for _ in 0..n {
                let ack = client
                    .request(server_id, payload.to_vec())
                    .await
                    .expect("request");
                assert_eq!(ack, (PAYLOAD_BYTES as u64).to_be_bytes());
            }
            started.elapsed()
        }
    };
    run(warmup).await;
    let elapsed = run(rounds).await;
    client.shutdown().await;
    server.shutdown().await;
    serve.abort();
    mb_per_s(rounds, elapsed)
}

async fn plain_tcp(payload: &[u8], warmup: usize, rounds: usize) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let serve = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        socket.set_nodelay(true).expect("nodelay");
        loop {
            let mut prefix = [0u8; 8];
            if socket.read_exact(&mut prefix).await.is_err() {
                return;
            }
            let len = u64::from_be_bytes(prefix) as usize;
            assert!(len <= PAYLOAD_BYTES, "frame too large");
            let mut data = vec![0u8; len];
            socket.read_exact(&mut data).await.expect("payload");
            let ack = (data.len() as u64).to_be_bytes();
            socket.write_all(&ack).await.expect("ack");
        }
    });
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    socket.set_nodelay(true).expect("nodelay");
    let mut run = async |n: usize| {
        let started = Instant::now();
        for _ in 0..n {
            let data = payload.to_vec();
            socket
                .write_all(&(data.len() as u64).to_be_bytes())
                .await
                .expect("prefix");
            socket.write_all(&data).await.expect("payload");
            let mut ack = [0u8; ACK_BYTES];
            socket.read_exact(&mut ack).await.expect("ack");
            assert_eq!(ack, (PAYLOAD_BYTES as u64).to_be_bytes());
        }
        started.elapsed()
    };
    run(warmup).await;
    let elapsed = run(rounds).await;
    drop(socket);
    serve.await.expect("tcp server");
    mb_per_s(rounds, elapsed)
}

#[tokio::main]
async fn main() {
    // Logs only when asked for, e.g. `RUST_LOG=yamux=debug` to watch window auto-tuning.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let warmup = env_or("TRANSPORT_WARMUP", 4);
    let rounds = env_or("TRANSPORT_ROUNDS", 32);
    let payload: Vec<u8> = (0..PAYLOAD_BYTES).map(|i| (i * 131 % 251) as u8).collect();
    println!(
        "transport: {rounds} rounds of {} MiB after {warmup} warm-up rounds, {} worker threads",
        PAYLOAD_BYTES >> 20,
        tokio::runtime::Handle::current().metrics().num_workers()
    );

    let rr = request_response(&payload, warmup, rounds).await;
    println!("request-response (TCP+Noise+Yamux): {rr:.0} MB/s");
    let tcp = plain_tcp(&payload, warmup, rounds).await;
    println!("plain TCP:                          {tcp:.0} MB/s");
    println!(
        "RESULT transport rr_mb_s={rr:.1} tcp_mb_s={tcp:.1} ratio={:.3}",
        rr / tcp
    );
}
