//! A peer that floods a node with request frames whose bodies never finish: each stream sends
//! a length prefix claiming `claim` bytes and then `send` bytes of the body, then trickles a
//! byte every 100 ms (never the last one) until the node resets the stream or the attacker's
//! own timeout ends it. Used by the
//! budget tests (`tests/budget.rs`) and the memory measurement (`examples/request_flood.rs`).
//!
//! The attacker speaks only `/iota/rr/1.0.0` and writes its bodies from one shared buffer of
//! zeros, so its own memory stays small whatever it claims; a stream the node refuses is seen
//! as an outbound failure and counted in [`Flooder::closed`].
#![allow(dead_code, unreachable_pub)]

use std::{
    io,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, StreamExt};
use libp2p::{
    identity::Keypair, noise, request_response, swarm::SwarmEvent, tcp, yamux, Multiaddr, PeerId,
    StreamProtocol, SwarmBuilder,
};

/// The node's request-response protocol.
const PROTOCOL: StreamProtocol = StreamProtocol::new("/iota/rr/1.0.0");

/// Pause between two trickled bytes.
const TRICKLE: Duration = Duration::from_millis(100);

/// The body bytes written per write call.
const CHUNK: usize = 256 << 10;

static ZEROS: [u8; CHUNK] = [0; CHUNK];

/// One flooding stream: the body length claimed and the body bytes actually sent.
#[derive(Clone, Copy, Debug)]
pub struct Flood {
    /// The length prefix.
    pub claim: u64,
    /// Body bytes written before the stream is held open (at most `claim`).
    pub send: usize,
}

#[derive(Clone, Default)]
struct FloodCodec;

impl request_response::Codec for FloodCodec {
    type Protocol = StreamProtocol;
    type Request = Flood;
    type Response = ();

    async fn read_request<T>(&mut self, _: &StreamProtocol, _: &mut T) -> io::Result<Flood>
    where
        T: AsyncRead + Unpin + Send,
    {
        Err(io::Error::other("the attacker serves nothing"))
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<()>
    where
        T: AsyncRead + Unpin + Send,
    {
        // Only reached if the node answered a frame it should never have finished reading.
        let mut byte = [0u8; 1];
        let _ = io.read(&mut byte).await;
        Err(io::Error::other("the node answered an unfinished frame"))
    }

    async fn write_request<T>(&mut self, _: &StreamProtocol, io: &mut T, f: Flood) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        io.write_all(&f.claim.to_be_bytes()).await?;
        let mut sent = 0usize;
        while sent < f.send {
            let n = (f.send - sent).min(CHUNK);
            io.write_all(&ZEROS[..n]).await?;
            sent += n;
        }
        io.flush().await?;
        // Trickle the rest, one byte at a time, and never the last one: the node either keeps
        // waiting for it (until the attacker's timeout ends the stream) or has reset the
        // stream, which fails the next write.
        let last = usize::try_from(f.claim)
            .unwrap_or(usize::MAX)
            .saturating_sub(1);
        while sent < last {
            tokio::time::sleep(TRICKLE).await;
            io.write_all(&ZEROS[..1]).await?;
            io.flush().await?;
            sent += 1;
        }
        std::future::pending().await
    }

    async fn write_response<T>(&mut self, _: &StreamProtocol, _: &mut T, _: ()) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        Err(io::Error::other("the attacker serves nothing"))
    }
}

/// A running attacker: its task and what it has seen.
pub struct Flooder {
    /// The attacker's peer id.
    pub peer_id: PeerId,
    /// Streams the node closed (or that failed otherwise) before the attacker's timeout.
    pub closed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Flooder {
    /// Streams closed so far.
    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }
}

impl Drop for Flooder {
    fn drop(&mut self) {
        // Dropping the swarm closes the connection.
        self.task.abort();
    }
}

/// Connects to `target` (an address ending in `/p2p/<id>`) and opens `streams` flooding
/// streams, each as `flood` says, held for at most `hold`.
pub fn start(
    target: Multiaddr,
    target_id: PeerId,
    streams: usize,
    flood: Flood,
    hold: Duration,
) -> Flooder {
    start_as(
        Keypair::generate_ed25519(),
        target,
        target_id,
        streams,
        flood,
        hold,
    )
}

/// [`start`] with the attacker's key given.
pub fn start_as(
    keypair: Keypair,
    target: Multiaddr,
    target_id: PeerId,
    streams: usize,
    flood: Flood,
    hold: Duration,
) -> Flooder {
    let peer_id = keypair.public().to_peer_id();
    let mut swarm = SwarmBuilder::with_existing_identity(keypair)
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )
        .expect("a TCP transport")
        .with_behaviour(|_| {
            request_response::Behaviour::with_codec(
                FloodCodec,
                [(PROTOCOL, request_response::ProtocolSupport::Outbound)],
                request_response::Config::default()
                    .with_request_timeout(hold)
                    .with_max_concurrent_streams(streams + 8),
            )
        })
        .expect("a behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(hold))
        .build();
    swarm.add_peer_address(target_id, target);
    for _ in 0..streams {
        swarm.behaviour_mut().send_request(&target_id, flood);
    }
    let closed = Arc::new(AtomicUsize::new(0));
    let counted = closed.clone();
    let task = tokio::spawn(async move {
        loop {
            if let SwarmEvent::Behaviour(request_response::Event::OutboundFailure {
                error, ..
            }) = swarm.select_next_some().await
            {
                if !matches!(error, request_response::OutboundFailure::Timeout) {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    Flooder {
        peer_id,
        closed,
        task,
    }
}
