//! Request-response throughput against plain TCP, side by side, for 16 MiB payloads on
//! loopback, over the node's two transports.
//!
//! Two nodes in one process: one requests with a 16 MiB payload, the other answers with an
//! 8-byte acknowledgement, over TCP + Noise + Yamux and then over QUIC; then the same exchange
//! over a plain tokio TCP socket (u64 length prefix, payload, 8-byte ack). Both sides hand the
//! receiver an owned `Vec` of the payload, so allocation is counted on both. Each transport
//! also gets `HANDSHAKES` fresh connections timed from dial to established, and the process's
//! CPU time (user + system, both nodes together) per MB moved. Prints MB/s of each and, last,
//! `RESULT transport rr_mb_s=<x> tcp_mb_s=<y> ratio=<x/y>` (TCP + Noise + Yamux, as before)
//! and `RESULT transport-quic quic_mb_s=<q> ratio_to_tcp_rr=<q/x> handshake_ms_tcp=…
//! handshake_ms_quic=… cpu_s_per_gb_tcp=… cpu_s_per_gb_quic=…`.
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

/// Fresh connections timed per transport.
const HANDSHAKES: usize = 20;
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

/// CPU time this process has used so far (user + system, every thread).
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we own; RUSAGE_SELF is always valid.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// What one transport did: MB/s, CPU seconds per GB moved, median handshake.
struct Measured {
    mb_s: f64,
    cpu_s_per_gb: f64,
    handshake: Duration,
}

/// Median time from dialling `server_addr` to an established connection, over `n` fresh
/// client nodes.
async fn handshakes(server_addr: &p2p::Multiaddr, config: &Config, n: usize) -> Duration {
    let server_id = match server_addr.iter().last() {
        Some(Protocol::P2p(peer)) => peer,
        _ => panic!("the server address names its peer"),
    };
    let mut times = Vec::new();
    for _ in 0..n {
        // The client listens on the server's transport too, on loopback: QUIC dials from its
        // listening socket.
        let (client, mut events, _task) = p2p::spawn(
            Keypair::generate_ed25519(),
            config.clone(),
            Metrics::unregistered(),
        )
        .expect("spawn client");
        let started = Instant::now();
        client.dial(server_addr.clone()).await.expect("dial");
        let connected = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match events.recv().await {
                    Some(Event::PeerConnected(peer)) if peer == server_id => return,
                    Some(_) => continue,
                    None => panic!("client stopped"),
                }
            }
        })
        .await;
        assert!(connected.is_ok(), "no connection within 10 s");
        times.push(started.elapsed());
        client.shutdown().await;
    }
    times.sort();
    times[times.len() / 2]
}

async fn request_response(listen: &str, payload: &[u8], warmup: usize, rounds: usize) -> Measured {
    let config = Config {
        listen: vec![listen.parse().expect("a valid listen address")],
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

    let handshake = handshakes(&server_addr, &config, HANDSHAKES).await;
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
    let cpu_before = cpu_time();
    let elapsed = run(rounds).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    client.shutdown().await;
    server.shutdown().await;
    serve.abort();
    Measured {
        mb_s: mb_per_s(rounds, elapsed),
        cpu_s_per_gb: cpu.as_secs_f64() / ((rounds * PAYLOAD_BYTES) as f64 / 1e9),
        handshake,
    }
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

    let on_tcp = request_response("/ip4/127.0.0.1/tcp/0", &payload, warmup, rounds).await;
    let rr = on_tcp.mb_s;
    println!(
        "request-response (TCP+Noise+Yamux): {rr:.0} MB/s, {:.2} CPU s/GB, handshake {:.2} ms",
        on_tcp.cpu_s_per_gb,
        on_tcp.handshake.as_secs_f64() * 1e3
    );
    let on_quic = request_response("/ip4/127.0.0.1/udp/0/quic-v1", &payload, warmup, rounds).await;
    println!(
        "request-response (QUIC):            {:.0} MB/s, {:.2} CPU s/GB, handshake {:.2} ms",
        on_quic.mb_s,
        on_quic.cpu_s_per_gb,
        on_quic.handshake.as_secs_f64() * 1e3
    );
    let tcp = plain_tcp(&payload, warmup, rounds).await;
    println!("plain TCP:                          {tcp:.0} MB/s");
    println!(
        "RESULT transport rr_mb_s={rr:.1} tcp_mb_s={tcp:.1} ratio={:.3}",
        rr / tcp
    );
    println!(
        "RESULT transport-quic quic_mb_s={:.1} ratio_to_tcp_rr={:.3} handshake_ms_tcp={:.2} \
         handshake_ms_quic={:.2} cpu_s_per_gb_tcp={:.2} cpu_s_per_gb_quic={:.2}",
        on_quic.mb_s,
        on_quic.mb_s / rr,
        on_tcp.handshake.as_secs_f64() * 1e3,
        on_quic.handshake.as_secs_f64() * 1e3,
        on_tcp.cpu_s_per_gb,
        on_quic.cpu_s_per_gb
    );
}
