//! Test harness: in-process nodes on 127.0.0.1 port 0 and a polling `wait_for`.
#![allow(dead_code, unreachable_pub)]

pub mod flood;

use std::{
    future::Future,
    time::{Duration, Instant},
};

use p2p::{
    identity::Keypair, multiaddr::Protocol, Client, ClientError, Config, Event, GossipId, Metrics,
    Multiaddr, PeerId, Verdict,
};
use tokio::{sync::mpsc, task::JoinHandle};

/// Interval between checks in [`wait_for`]; a poll rate, not a wait for the condition.
const POLL: Duration = Duration::from_millis(50);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `check` until it returns `Ok`, panicking at `timeout` with the last progress report.
pub async fn wait_for<F, Fut, T>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let progress = match check().await {
            Ok(v) => return v,
            Err(progress) => progress,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; got as far as: {progress}");
        }
        tokio::time::sleep(POLL).await;
    }
}

pub struct TestNode {
    pub keypair: Keypair,
    pub client: Client,
    pub events: mpsc::Receiver<Event>,
    pub task: JoinHandle<()>,
    pub metrics: Metrics,
    /// Listen address with the `/p2p/<peer id>` suffix.
    pub addr: Multiaddr,
}

impl TestNode {
    pub fn peer_id(&self) -> PeerId {
        self.client.local_peer_id()
    }

    /// Next event matching `pick` within `timeout`, skipping others. Every gossip message read
    /// (picked or skipped) is reported [`Verdict::Accept`] first, so it keeps propagating;
    /// tests that judge gossip themselves read `events` directly.
    pub async fn next_event<T>(
        &mut self,
        timeout: Duration,
        mut pick: impl FnMut(Event) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(event)) => {
                    if let Event::Gossip { id, .. } = &event {
                        report(&self.client, id.clone(), Verdict::Accept).await;
                    }
                    if let Some(v) = pick(event) {
                        return Some(v);
                    }
                }
                Ok(None) | Err(_) => return None,
            }
        }
    }
}

/// Reports `verdict`; a message that expired before a slow test got to it is fine.
pub async fn report(client: &Client, id: GossipId, verdict: Verdict) {
    match client.report(id, verdict).await {
        Ok(()) | Err(ClientError::UnknownGossip) => {}
        Err(e) => panic!("report failed: {e}"),
    }
}

/// A test configuration: fast discovery, short request timeout.
pub fn config() -> Config {
    Config {
        discovery_interval: Duration::from_millis(500),
        request_timeout: Duration::from_secs(10),
        ..Config::default()
    }
}

/// Spawns a node and waits for its first listen address.
pub async fn spawn_node(config: Config) -> TestNode {
    spawn_node_as(Keypair::generate_ed25519(), config).await
}

/// Spawns a node with the identity `keypair` and waits for its first listen address.
pub async fn spawn_node_as(keypair: Keypair, config: Config) -> TestNode {
    let metrics = Metrics::unregistered();
    let (client, mut events, task) =
        p2p::spawn(keypair.clone(), config, metrics.clone()).expect("spawn");
    let listen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Some(Event::NewListenAddr(addr)) => return addr,
                Some(_) => continue,
                None => panic!("event loop ended before listening"),
            }
        }
    })
    .await
    .expect("no listen address within 10 s");
    let addr = listen.with(Protocol::P2p(client.local_peer_id()));
    TestNode {
        keypair,
        client,
        events,
        task,
        metrics,
        addr,
    }
}
