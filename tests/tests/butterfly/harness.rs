//! The harness of the butterfly tests: in-process nodes, their pump tasks, readiness, and
//! the faults injected around the honest protocol.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iota_p2p::merge::butterfly::{
    Gossip, Hash, Received, Request, Response, Transport, TransportError,
};
use iota_p2p::merge::{self, P2pTransport, Router};
use iota_p2p::rpc;
use iota_tests::wait_for;
use p2p::{
    identity::Keypair, multiaddr::Protocol, Client, Config, Event, Multiaddr, PeerId, Verdict,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub(crate) const RUN: &str = "butterfly-test";
pub(crate) const STAGE: u32 = 1;
pub(crate) const EPOCH: u64 = 3;
/// Values per member: not a multiple of the partition count, so partitions differ in size.
pub(crate) const LEN: usize = 4099;
pub(crate) const PHASE: Duration = Duration::from_millis(1500);
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_secs(1);
pub(crate) const POLL: Duration = Duration::from_millis(100);
/// Readiness probes share the merge topic; they never decode as butterfly gossip (whose
/// first byte is the wire version, 1).
pub(crate) const PROBE: &[u8] = b"probe ";

/// Averages a forging node serves, by (partition, forged result hash).
pub(crate) type Forgeries = Arc<Mutex<BTreeMap<(u32, Hash), Vec<f32>>>>;

/// How a node answers requests.
#[derive(Clone)]
pub(crate) enum Serving {
    Honest,
    /// Serves its inputs with noise added (its commitment promised the true bytes).
    Equivocate,
    /// Serves the forged averages its [`Forging`] transport claimed.
    Forge(Forgeries),
    /// Shuts its node down when the first butterfly request arrives, answering nothing.
    DieOnFirstRequest,
}

pub(crate) struct Node {
    pub(crate) client: Client,
    pub(crate) router: Router,
    pub(crate) event_loop: JoinHandle<()>,
    pub(crate) probes: Arc<Mutex<BTreeSet<PeerId>>>,
    pub(crate) addr: Multiaddr,
}

impl Node {
    pub(crate) fn peer(&self) -> PeerId {
        self.client.local_peer_id()
    }

    pub(crate) fn id(&self) -> String {
        self.peer().to_string()
    }

    pub(crate) fn metrics(&self) -> &merge::Metrics {
        self.router.metrics()
    }
}

pub(crate) async fn spawn_node(bootstrap: Option<&Multiaddr>, serving: Serving) -> Node {
    let config = Config {
        topics: vec![merge::topic(RUN, STAGE)],
        bootstrap: bootstrap.into_iter().cloned().collect(),
        discovery_interval: Duration::from_millis(300),
        request_timeout: Duration::from_secs(10),
        ..Config::default()
    };
    let (client, mut events, event_loop) = p2p::spawn(
        Keypair::generate_ed25519(),
        config,
        p2p::Metrics::unregistered(),
    )
    .expect("node starts");
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
    .expect("a listen address within 10 s");
    let router = Router::new(RUN, merge::Metrics::unregistered());
    let probes = Arc::new(Mutex::new(BTreeSet::new()));
    tokio::spawn(pump(
        client.clone(),
        router.clone(),
        events,
        serving,
        Arc::clone(&probes),
    ));
    Node {
        addr: listen.with(Protocol::P2p(client.local_peer_id())),
        client,
        router,
        event_loop,
        probes,
    }
}

/// The node's event loop as far as merges go: gossip to the router (and accepted, so it
/// propagates as it did before verdicts existed), requests answered from spawned tasks.
/// Ends when the node does.
pub(crate) async fn pump(
    client: Client,
    router: Router,
    mut events: mpsc::Receiver<Event>,
    serving: Serving,
    probes: Arc<Mutex<BTreeSet<PeerId>>>,
) {
    while let Some(event) = events.recv().await {
        match event {
            Event::Gossip {
                author,
                topic,
                data,
                id,
            } => {
                if data.starts_with(PROBE) {
                    probes.lock().expect("lock not poisoned").insert(author);
                } else {
                    router.on_gossip(&author, &topic, &data);
                }
                // Fails only for an expired message or a stopped node: nothing to do then.
                let _ = client.report(id, Verdict::Accept).await;
            }
            Event::Request { peer, id, data } => {
                if matches!(serving, Serving::DieOnFirstRequest)
                    && matches!(rpc::split(&data), Ok((rpc::BUTTERFLY, _)))
                {
                    client.shutdown().await;
                    continue;
                }
                let (client, router, serving) = (client.clone(), router.clone(), serving.clone());
                tokio::spawn(async move {
                    let answer = answer(&router, &serving, &peer, &data);
                    let _ = client.respond(id, answer).await;
                });
            }
            _ => {}
        }
    }
}

pub(crate) fn butterfly_request(data: &[u8]) -> Option<Request> {
    match rpc::split(data) {
        Ok((rpc::BUTTERFLY, payload)) => Request::decode(payload).ok(),
        _ => None,
    }
}

pub(crate) fn answer(router: &Router, serving: &Serving, peer: &PeerId, data: &[u8]) -> Vec<u8> {
    let request = butterfly_request(data);
    if let (
        Serving::Forge(forgeries),
        Some(Request::Averaged {
            partition, result, ..
        }),
    ) = (serving, &request)
    {
        if let Some(values) = forgeries
            .lock()
            .expect("lock not poisoned")
            .get(&(*partition, *result))
        {
            return rpc::frame(rpc::BUTTERFLY, &Response::Values(values.clone()).encode());
        }
    }
    let honest = router
        .on_request(peer, data)
        .unwrap_or_else(|| rpc::fallback_response(data));
    if let (Serving::Equivocate, Some(Request::Input { partition, .. })) = (serving, &request) {
        if let Ok(Response::Values(values)) = rpc::open_response(&honest, rpc::BUTTERFLY)
            .map(|p| Response::decode(p).expect("own response decodes"))
        {
            let noisy = Response::Values(noise(*partition, &values));
            return rpc::frame(rpc::BUTTERFLY, &noisy.encode());
        }
    }
    honest
}

/// Deterministic noise: two forgers of one partition produce the same bytes (collusion).
pub(crate) fn noise(partition: u32, values: &[f32]) -> Vec<f32> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| v + 0.25 * (1 + (i + partition as usize) % 5) as f32)
        .collect()
}

/// A holder that claims (and, through its pump, serves) noisy averages of `partitions`
/// (all when `None`).
pub(crate) struct Forging {
    pub(crate) inner: P2pTransport,
    pub(crate) router: Router,
    pub(crate) partitions: Option<BTreeSet<u32>>,
    pub(crate) forgeries: Forgeries,
}

impl Transport for Forging {
    async fn publish(&self, message: Gossip) -> Result<(), TransportError> {
        let message = match message {
            Gossip::SliceHash(mut claim)
                if self
                    .partitions
                    .as_ref()
                    .is_none_or(|ps| ps.contains(&claim.partition)) =>
            {
                let server = self.router.server(STAGE, EPOCH).expect("registered");
                let honest = server
                    .averaged(claim.partition, &claim.result)
                    .expect("a claim is stored before it is published");
                let noisy = noise(claim.partition, &honest);
                claim.result = Hash::of_values(&noisy);
                self.forgeries
                    .lock()
                    .expect("lock not poisoned")
                    .insert((claim.partition, claim.result), noisy);
                Gossip::SliceHash(claim)
            }
            other => other,
        };
        self.inner.publish(message).await
    }

    async fn request(
        &self,
        peer: &str,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        self.inner.request(peer, request, timeout).await
    }

    async fn next_gossip(&self) -> Option<Received> {
        self.inner.next_gossip().await
    }
}

/// A member that publishes its commitment and nothing else (its node dies on the first
/// request, so it never claims either).
pub(crate) struct Mute(pub(crate) P2pTransport);

impl Transport for Mute {
    async fn publish(&self, message: Gossip) -> Result<(), TransportError> {
        match message {
            Gossip::Commitment(_) => self.0.publish(message).await,
            _ => Ok(()),
        }
    }

    async fn request(
        &self,
        peer: &str,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        self.0.request(peer, request, timeout).await
    }

    async fn next_gossip(&self) -> Option<Received> {
        self.0.next_gossip().await
    }
}

/// Nodes with the given servings, bootstrapped from the first, each connected to every
/// other and hearing every other's gossip on the merge topic.
pub(crate) async fn network(servings: Vec<Serving>) -> Vec<Node> {
    let mut servings = servings.into_iter();
    let first = spawn_node(None, servings.next().expect("at least one node")).await;
    let mut nodes = vec![first];
    for serving in servings {
        let node = spawn_node(Some(&nodes[0].addr), serving).await;
        nodes.push(node);
    }
    let ids: BTreeSet<PeerId> = nodes.iter().map(Node::peer).collect();
    let topic = merge::topic(RUN, STAGE);
    let mut round = 0u32;
    wait_for(
        "every node hears every other on the merge topic",
        Duration::from_secs(30),
        POLL,
        || {
            round += 1;
            let (nodes, ids, topic) = (&nodes, &ids, &topic);
            async move {
                let mut lacking = Vec::new();
                for node in nodes {
                    // Requests to a peer not yet connected and not yet in the routing table fail
                    // at once; in a run, a stage's miners are connected long before they merge.
                    let connected = node.client.connected_peers().await?;
                    let missing = ids
                        .iter()
                        .filter(|p| **p != node.peer() && !connected.contains(p))
                        .count();
                    if missing > 0 {
                        lacking.push(format!("{} not connected to {missing}", node.peer()));
                    }
                    let mut probe = PROBE.to_vec();
                    probe.extend_from_slice(&round.to_le_bytes());
                    // NoPeers while the mesh forms is expected; the check below is what counts.
                    let _ = node.client.publish(topic, probe).await;
                    let heard = node.probes.lock().expect("lock not poisoned").len();
                    if heard < ids.len() - 1 {
                        lacking.push(format!("{} heard {heard}", node.peer()));
                    }
                }
                Ok((lacking.is_empty(), lacking.join(", ")))
            }
        },
    )
    .await
    .expect("network ready");
    nodes
}
