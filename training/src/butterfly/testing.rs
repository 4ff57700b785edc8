//! A loopback [`Transport`] for tests and benchmarks: many members in one process, with
//! fault injection and per-member byte counts.
//!
//! Every message really goes through the binary codec (encoded by the sender, decoded once
//! per delivery), so the byte counts are wire bytes: a member's `received` counts gossip
//! delivered to it, responses it got and requests it was asked; `sent` counts gossip it
//! published (once, as if gossipsub cost one copy), requests and responses. Gossip queues
//! are bounded; a message for a full queue is dropped and counted, like gossipsub drops for
//! a slow peer. Faults:
//! - [`Network::kill`]: a dead member's gossip goes nowhere, requests to it fail at once;
//!   a member that never gets an endpoint behaves the same;
//! - [`Network::slow`]: requests to the member are answered only after a delay (so a
//!   requester's timeout fires first when the delay is longer);
//! - [`Network::cut`]: requests from one member to another fail (a one-way partition);
//! - [`Network::equivocate`]: the member serves its inputs with noise added, while its
//!   commitment (computed by the honest protocol) promised the true bytes;
//! - [`Network::forge`]: the member, as holder, publishes the hash of a noisy average and
//!   serves the noisy bytes under it. Two members forging the same partition produce the
//!   same noisy bytes (the noise depends only on the partition and position), i.e. they
//!   collude.
//!
//! Faults act on the messages between the honest protocol code and the network, so the
//! member's own [`Merge`](super::Merge) is unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{
    Gossip, Hash, MemberId, Received, Request, Response, Server, Transport, TransportError,
};

/// Default bound of each member's gossip queue.
pub const GOSSIP_QUEUE: usize = 4096;

/// Bytes one member put on and took off the loopback network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bytes {
    /// Encoded bytes sent.
    pub sent: u64,
    /// Encoded bytes received.
    pub received: u64,
}

/// The shared loopback network. Clone freely.
#[derive(Clone, Default)]
pub struct Network {
    inner: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    gossip: BTreeMap<MemberId, mpsc::Sender<Received>>,
    servers: BTreeMap<MemberId, Server>,
    dead: BTreeSet<MemberId>,
    slow: BTreeMap<MemberId, Duration>,
    cut: BTreeSet<(MemberId, MemberId)>,
    equivocating: BTreeSet<MemberId>,
    /// Forging holders and the partitions they forge (`None`: all).
    forging: BTreeMap<MemberId, Option<BTreeSet<u32>>>,
    /// Noisy averages servable by a forging holder, by (holder, partition, forged hash).
    forged: BTreeMap<(MemberId, u32, Hash), Vec<f32>>,
    bytes: BTreeMap<MemberId, Bytes>,
    dropped_gossip: u64,
}

/// One member's attachment to a [`Network`]; implements [`Transport`].
pub struct Endpoint {
    id: MemberId,
    network: Network,
    gossip: tokio::sync::Mutex<mpsc::Receiver<Received>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Network {
    /// An empty network.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches `id` (replacing an earlier endpoint of the same id) with a gossip queue of
    /// [`GOSSIP_QUEUE`] messages.
    pub fn endpoint(&self, id: &str) -> Arc<Endpoint> {
        let (tx, rx) = mpsc::channel(GOSSIP_QUEUE);
        self.state().gossip.insert(id.to_string(), tx);
        Arc::new(Endpoint {
            id: id.to_string(),
            network: self.clone(),
            gossip: tokio::sync::Mutex::new(rx),
        })
    }

    /// Routes requests addressed to `id` to `server`.
    pub fn serve(&self, id: &str, server: Server) {
        self.state().servers.insert(id.to_string(), server);
    }

    /// `id` is dead from now on.
    pub fn kill(&self, id: &str) {
        self.state().dead.insert(id.to_string());
    }

    /// Requests to `id` are answered after `delay`.
    pub fn slow(&self, id: &str, delay: Duration) {
        self.state().slow.insert(id.to_string(), delay);
    }

    /// Requests from `from` to `to` fail.
    pub fn cut(&self, from: &str, to: &str) {
        self.state().cut.insert((from.to_string(), to.to_string()));
    }

    /// `id` serves noisy inputs.
    pub fn equivocate(&self, id: &str) {
        self.state().equivocating.insert(id.to_string());
    }

    /// `id` claims and serves noisy averages for `partitions` (all when `None`).
    pub fn forge(&self, id: &str, partitions: Option<&[u32]>) {
        let set = partitions.map(|ps| ps.iter().copied().collect());
        self.state().forging.insert(id.to_string(), set);
    }

    /// Delivers `message` to everyone but `from` as if `from` had signed it (e.g. a second,
    /// conflicting commitment).
    pub fn inject(&self, from: &str, message: Gossip) {
        self.deliver(from, &message.encode());
    }

    /// Bytes `id` sent and received so far.
    pub fn bytes(&self, id: &str) -> Bytes {
        self.state().bytes.get(id).copied().unwrap_or_default()
    }

    /// Gossip messages dropped because a queue was full.
    pub fn dropped_gossip(&self) -> u64 {
        self.state().dropped_gossip
    }

    fn deliver(&self, from: &str, bytes: &[u8]) {
        let message = match Gossip::decode(bytes) {
            Ok(message) => message,
            Err(error) => {
                tracing::error!(%error, "loopback gossip did not decode");
                return;
            }
        };
        let mut state = self.state();
        let targets: Vec<(MemberId, mpsc::Sender<Received>)> = state
            .gossip
            .iter()
            .filter(|(id, _)| id.as_str() != from && !state.dead.contains(*id))
            .map(|(id, tx)| (id.clone(), tx.clone()))
            .collect();
        for (id, tx) in targets {
            let received = Received {
                from: from.to_string(),
                message: message.clone(),
            };
            if tx.try_send(received).is_ok() {
                state.bytes.entry(id).or_default().received += bytes.len() as u64;
            } else {
                state.dropped_gossip += 1;
            }
        }
    }

    /// Rewrites a forging holder's claim to a noisy average it will serve.
    fn forge_claim(&self, from: &str, message: Gossip) -> Gossip {
        let Gossip::SliceHash(mut claim) = message else {
            return message;
        };
        let (forging, server) = {
            let state = self.state();
            let forging = match state.forging.get(from) {
                Some(None) => true,
                Some(Some(set)) => set.contains(&claim.partition),
                None => false,
            };
            (forging, state.servers.get(from).cloned())
        };
        let honest = server.and_then(|s| s.averaged(claim.partition, &claim.result));
        if let (true, Some(honest)) = (forging, honest) {
            let noisy = noise(claim.partition, &honest);
            claim.result = Hash::of_values(&noisy);
            self.state()
                .forged
                .insert((from.to_string(), claim.partition, claim.result), noisy);
        }
        Gossip::SliceHash(claim)
    }

    fn count(&self, id: &str, sent: usize, received: usize) {
        let mut state = self.state();
        let bytes = state.bytes.entry(id.to_string()).or_default();
        bytes.sent += sent as u64;
        bytes.received += received as u64;
    }

    /// Answers `request` as `peer` would, faults applied.
    fn answer(&self, peer: &str, request: &Request) -> Result<Response, TransportError> {
        let (server, equivocating, forged) = {
            let state = self.state();
            let forged = match request {
                Request::Averaged {
                    partition, result, ..
                } => state
                    .forged
                    .get(&(peer.to_string(), *partition, *result))
                    .cloned(),
                Request::Input { .. } => None,
            };
            (
                state.servers.get(peer).cloned(),
                state.equivocating.contains(peer),
                forged,
            )
        };
        if let Some(values) = forged {
            return Ok(Response::Values(values));
        }
        let server = server.ok_or_else(|| TransportError::Unreachable(peer.to_string()))?;
        let mut response = server.handle(request);
        if let (Request::Input { partition, .. }, Response::Values(values)) =
            (request, &mut response)
        {
            if equivocating {
                *values = noise(*partition, values);
            }
        }
        Ok(response)
    }
}

/// Deterministic noise: the same for every forger of the same partition.
fn noise(partition: u32, values: &[f32]) -> Vec<f32> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| v + 0.25 * (1 + (i + partition as usize) % 5) as f32)
        .collect()
}

impl Transport for Endpoint {
    async fn publish(&self, message: Gossip) -> Result<(), TransportError> {
        if self.network.state().dead.contains(&self.id) {
            return Ok(());
        }
        let message = self.network.forge_claim(&self.id, message);
        let bytes = message.encode();
        self.network.count(&self.id, bytes.len(), 0);
        self.network.deliver(&self.id, &bytes);
        Ok(())
    }

    async fn request(
        &self,
        peer: &str,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let request_bytes = request.encode();
        self.network.count(&self.id, request_bytes.len(), 0);
        let (unreachable, delay) = {
            let state = self.network.state();
            let unreachable = state.dead.contains(peer)
                || state.dead.contains(&self.id)
                || state.cut.contains(&(self.id.clone(), peer.to_string()))
                || !state.servers.contains_key(peer);
            (unreachable, state.slow.get(peer).copied())
        };
        if unreachable {
            return Err(TransportError::Unreachable(peer.to_string()));
        }
        let exchange = async {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let decoded = Request::decode(&request_bytes)?;
            self.network.count(peer, 0, request_bytes.len());
            let response_bytes = self.network.answer(peer, &decoded)?.encode();
            self.network.count(peer, response_bytes.len(), 0);
            self.network.count(&self.id, 0, response_bytes.len());
            Ok(Response::decode(&response_bytes)?)
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| TransportError::Timeout(peer.to_string()))?
    }

    async fn next_gossip(&self) -> Option<Received> {
        self.gossip.lock().await.recv().await
    }
}
