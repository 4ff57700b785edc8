//! The node's butterfly switchboard: gossip from the stage topics to the merge (or audit)
//! that waits for it, and requests to the [`Server`]s of recent merges.
//!
//! The node's event loop owns nothing of a merge; it hands every gossip message and every
//! request to one [`Router`] ([`Router::on_gossip`], [`Router::on_request`]) and acts on
//! what comes back. Guarantees:
//! - only gossip on this run's butterfly topics is consumed; a message is delivered only if
//!   it decodes, its author is the envelope's signer and its stage is the topic's;
//! - gossip for a merge that has not opened its feed yet is kept (members start their
//!   merges at slightly different times and commitments must not be lost), bounded: at most
//!   [`PENDING_PER_MERGE`] messages for each of at most [`PENDING_MERGES`] merges; when full,
//!   a merge with a lower epoch pushes out the highest one, so a flood of far-future epochs
//!   cannot displace the next real merge; opening a merge drops what is kept for older
//!   epochs of its stage, and gossip for a merge whose feed has closed is dropped; what is
//!   kept is also bounded in bytes ([`PENDING_BYTES`] over all merges);
//! - every feed is a bounded channel of [`FEED_CAPACITY`] messages; the router never waits
//!   on it (a full feed drops the message, counted in the merge's deadlines);
//! - the servers of the last [`KEPT_SERVERS`] merges stay registered after their merges end
//!   (auditors fetch late); a request for an older or unknown merge gets the butterfly's own
//!   `Unavailable(WrongMerge)` answer; a request that does not parse gets a `Malformed`
//!   error response; nothing here panics on network input.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use p2p::PeerId;
use tokio::sync::mpsc::{self, error::TrySendError};
use training::butterfly::{Gossip, Received, Request, Response, Server, Unavailable};

use super::metrics::Metrics;
use crate::wire::rpc;

/// Servers kept registered, most recent epochs first.
pub const KEPT_SERVERS: usize = 4;
/// Capacity of a merge's gossip feed.
pub const FEED_CAPACITY: usize = 4096;
/// Gossip messages kept for a merge that has not opened its feed yet.
pub const PENDING_PER_MERGE: usize = FEED_CAPACITY;
/// Merges for which gossip is kept before they open.
pub const PENDING_MERGES: usize = 4;
/// Bytes of gossip kept, over all merges, before they open: a full stage's commitments and
/// claims take a few hundred KiB, so this leaves room for many while a flood of 63 KiB
/// messages cannot grow the node past it.
pub const PENDING_BYTES: usize = 16 << 20;
/// Closed merges remembered, so that their late gossip is dropped rather than kept.
const REMEMBERED_CLOSED: usize = 16;

/// A merge as the router knows it: (stage, epoch).
type Key = (u32, u64);

/// Why a feed cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FeedError {
    /// A merge or audit of this node already listens to this (stage, epoch).
    #[error("a feed for stage {stage}, epoch {epoch} is already open")]
    AlreadyOpen {
        /// The stage.
        stage: u32,
        /// The epoch.
        epoch: u64,
    },
}

/// Routes butterfly gossip and requests of one run. Clone freely (shared state).
#[derive(Clone)]
pub struct Router {
    shared: Arc<Shared>,
}

struct Shared {
    run: String,
    /// `iota/<run>/butterfly/`: every butterfly topic of the run starts with it.
    prefix: String,
    metrics: Metrics,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    servers: BTreeMap<Key, Server>,
    feeds: BTreeMap<Key, mpsc::Sender<Received>>,
    pending: BTreeMap<Key, Vec<(usize, Received)>>,
    /// Bytes (as received) of everything in `pending`.
    pending_bytes: usize,
    closed: BTreeSet<Key>,
}

impl State {
    /// Drops the merges `drop` selects from `pending`, keeping `pending_bytes` in step.
    fn drop_pending(&mut self, drop: impl Fn(&Key) -> bool) {
        let keys: Vec<Key> = self.pending.keys().filter(|k| drop(k)).copied().collect();
        for key in keys {
            if let Some(kept) = self.pending.remove(&key) {
                let bytes: usize = kept.iter().map(|(len, _)| len).sum();
                self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
            }
        }
    }
}

/// What became of a gossip message handed to [`Router::route_gossip`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// Not on a butterfly topic of this run: another part of the node decides.
    NotButterfly,
    /// Delivered to its merge, or kept for it.
    Delivered,
    /// Refused, with the reason.
    Refused(RouteRefusal),
}

/// Why [`Router::route_gossip`] refused a message on a butterfly topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteRefusal {
    /// It does not decode as butterfly gossip.
    Malformed,
    /// The author it names is not the envelope's signer.
    NotAuthor,
    /// Its stage is not the topic's.
    WrongStage,
}

impl RouteRefusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RouteRefusal::Malformed => "malformed_butterfly",
            RouteRefusal::NotAuthor => "butterfly_not_author",
            RouteRefusal::WrongStage => "butterfly_wrong_stage",
        }
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("Router")
            .field("run", &self.shared.run)
            .field("servers", &state.servers.keys().collect::<Vec<_>>())
            .field("feeds", &state.feeds.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The receiving end of one merge's gossip; closes the merge's feed when dropped.
#[derive(Debug)]
pub struct Feed {
    key: Key,
    receiver: mpsc::Receiver<Received>,
    router: Router,
}

impl Feed {
    /// The next message, `None` once the router is gone. Cancel-safe.
    pub async fn recv(&mut self) -> Option<Received> {
        self.receiver.recv().await
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let mut state = self.router.state();
        state.feeds.remove(&self.key);
        state.closed.insert(self.key);
        while state.closed.len() > REMEMBERED_CLOSED {
            state.closed.pop_first();
        }
    }
}

impl Router {
    /// A router for the butterfly traffic of run `run`, counting in `metrics`.
    pub fn new(run: &str, metrics: Metrics) -> Router {
        Router {
            shared: Arc::new(Shared {
                run: run.to_string(),
                prefix: format!("iota/{run}/butterfly/"),
                metrics,
                state: Mutex::new(State::default()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes kept for merges not yet open: the running total, and the sum over what is kept.
    #[cfg(test)]
    pub(crate) fn pending_bytes(&self) -> (usize, usize) {
        let state = self.state();
        let kept = state.pending.values().flatten().map(|(len, _)| len).sum();
        (state.pending_bytes, kept)
    }

    /// The run this router serves.
    pub fn run(&self) -> &str {
        &self.shared.run
    }

    /// The metrics it counts in.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The stage of a butterfly topic of this run (`iota/<run>/butterfly/<stage>/1`).
    fn stage_of(&self, topic: &str) -> Option<u32> {
        let stage = topic
            .strip_prefix(self.shared.prefix.as_str())?
            .strip_suffix("/1")?;
        // `u32::from_str` accepts a leading '+'; a topic has exactly one spelling.
        if stage.is_empty() || !stage.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        stage.parse().ok()
    }

    /// Makes `server` answer requests for (stage, epoch), dropping the servers of the
    /// oldest merges beyond [`KEPT_SERVERS`].
    pub fn register_server(&self, stage: u32, epoch: u64, server: Server) {
        let mut state = self.state();
        state.servers.insert((stage, epoch), server);
        while state.servers.len() > KEPT_SERVERS {
            let oldest = state
                .servers
                .keys()
                .min_by_key(|(stage, epoch)| (*epoch, *stage))
                .copied();
            if let Some(key) = oldest {
                state.servers.remove(&key);
            }
        }
    }

    /// Stops serving (stage, epoch) and frees the server's vectors (e.g. when leaving a
    /// stage, or once a merge's audits are over). Returns whether one was registered.
    pub fn unregister_server(&self, stage: u32, epoch: u64) -> bool {
        self.state().servers.remove(&(stage, epoch)).is_some()
    }

    /// Whether a server for (stage, epoch) is registered.
    pub fn serves(&self, stage: u32, epoch: u64) -> bool {
        self.state().servers.contains_key(&(stage, epoch))
    }

    /// The server registered for (stage, epoch), if any (e.g. to read its byte counts).
    pub fn server(&self, stage: u32, epoch: u64) -> Option<Server> {
        self.state().servers.get(&(stage, epoch)).cloned()
    }

    /// Opens the gossip feed of the merge (stage, epoch), delivering first what was kept
    /// for it. Only one feed per merge at a time.
    pub fn open_feed(&self, stage: u32, epoch: u64) -> Result<Feed, FeedError> {
        let key = (stage, epoch);
        let mut state = self.state();
        if state.feeds.contains_key(&key) {
            return Err(FeedError::AlreadyOpen { stage, epoch });
        }
        let (sender, receiver) = mpsc::channel(FEED_CAPACITY);
        let kept = state.pending.remove(&key).unwrap_or_default();
        let bytes: usize = kept.iter().map(|(len, _)| len).sum();
        state.pending_bytes = state.pending_bytes.saturating_sub(bytes);
        for (_, message) in kept {
            // PENDING_PER_MERGE equals the capacity, so everything kept fits.
            let _ = sender.try_send(message);
        }
        state.drop_pending(|(s, e)| *s == stage && *e < epoch);
        state.closed.remove(&key);
        state.feeds.insert(key, sender);
        Ok(Feed {
            key,
            receiver,
            router: self.clone(),
        })
    }

    /// Handles one verified gossip message (`author` signed the envelope). Returns whether
    /// it was on a butterfly topic of this run (then it is consumed, delivered or dropped);
    /// `false` leaves it to other parts of the node.
    pub fn on_gossip(&self, author: &PeerId, topic: &str, data: &[u8]) -> bool {
        self.route_gossip(author, topic, data) != Routed::NotButterfly
    }

    /// [`Router::on_gossip`], saying whether the message was delivered or refused, so the
    /// node can report a verdict to gossipsub.
    pub fn route_gossip(&self, author: &PeerId, topic: &str, data: &[u8]) -> Routed {
        let Some(stage) = self.stage_of(topic) else {
            return Routed::NotButterfly;
        };
        let metrics = &self.shared.metrics;
        metrics.received(data.len());
        let message = match Gossip::decode(data) {
            Ok(message) => message,
            Err(error) => {
                tracing::debug!(peer = %author, %error, "undecodable butterfly gossip");
                return Routed::Refused(RouteRefusal::Malformed);
            }
        };
        let from = author.to_string();
        if message.author() != from {
            tracing::debug!(peer = %author, claimed = message.author(), "butterfly gossip not by its signer");
            return Routed::Refused(RouteRefusal::NotAuthor);
        }
        let (epoch, message_stage) = message.merge();
        if message_stage != stage {
            tracing::debug!(peer = %author, stage, message_stage, "butterfly gossip on another stage's topic");
            return Routed::Refused(RouteRefusal::WrongStage);
        }
        if let Gossip::Misbehaviour(report) = &message {
            metrics.report_received(report.kind);
            tracing::warn!(
                reporter = %report.reporter,
                accused = %report.accused,
                kind = ?report.kind,
                epoch,
                stage,
                "misbehaviour reported"
            );
        }
        self.deliver((stage, epoch), data.len(), Received { from, message });
        Routed::Delivered
    }

    fn deliver(&self, key: Key, len: usize, received: Received) {
        let mut state = self.state();
        if let Some(sender) = state.feeds.get(&key) {
            match sender.try_send(received) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    tracing::warn!(
                        stage = key.0,
                        epoch = key.1,
                        "butterfly feed full; gossip dropped"
                    );
                }
                Err(TrySendError::Closed(_)) => {
                    state.feeds.remove(&key);
                }
            }
            return;
        }
        if state.closed.contains(&key) {
            return;
        }
        if !state.pending.contains_key(&key) && state.pending.len() >= PENDING_MERGES {
            let highest = state
                .pending
                .keys()
                .max_by_key(|(stage, epoch)| (*epoch, *stage))
                .copied();
            match highest {
                Some(h) if (h.1, h.0) > (key.1, key.0) => {
                    state.drop_pending(|k| *k == h);
                }
                _ => return,
            }
        }
        if state.pending_bytes.saturating_add(len) > PENDING_BYTES {
            tracing::debug!(
                stage = key.0,
                epoch = key.1,
                "butterfly gossip kept for later is at its byte bound; dropped"
            );
            return;
        }
        let kept = state.pending.entry(key).or_default();
        if kept.len() < PENDING_PER_MERGE {
            kept.push((len, received));
            state.pending_bytes += len;
        }
    }

    /// The answer of this node's server for the request's merge (`Unavailable(WrongMerge)`
    /// if none is registered), without any framing or counting.
    pub(crate) fn answer_locally(&self, request: &Request) -> Response {
        let key = match request {
            Request::Input { epoch, stage, .. } | Request::Averaged { epoch, stage, .. } => {
                (*stage, *epoch)
            }
        };
        let server = self.state().servers.get(&key).cloned();
        match server {
            Some(server) => server.handle(request),
            None => Response::Unavailable(Unavailable::WrongMerge),
        }
    }

    /// Answers a request if it is tagged for the butterfly ([`rpc::BUTTERFLY`]); `None`
    /// leaves it to other services (answer with [`rpc::fallback_response`] if none claims
    /// it). Copies the requested partition: with large partitions call it off the event
    /// loop's task.
    pub fn on_request(&self, peer: &PeerId, data: &[u8]) -> Option<Vec<u8>> {
        let (rpc::BUTTERFLY, payload) = rpc::split(data).ok()? else {
            return None;
        };
        let metrics = &self.shared.metrics;
        metrics.received(data.len());
        let request = match Request::decode(payload) {
            Ok(request) => request,
            Err(error) => {
                tracing::debug!(%peer, %error, "malformed butterfly request");
                let response = rpc::error_response(rpc::ErrorCode::Malformed);
                metrics.sent(response.len());
                return Some(response);
            }
        };
        let response = self.answer_locally(&request);
        let framed = rpc::frame(rpc::BUTTERFLY, &response.encode());
        metrics.sent(framed.len());
        Some(framed)
    }
}
