//! The butterfly all-reduce over libp2p: the thin shell that runs
//! [`training::butterfly`] (re-exported as [`butterfly`]) on a real node.
//!
//! The protocol, its fault rules and its guarantees live in the pure crate; this module
//! only carries its messages and counts them:
//! - [`crate::wire::rpc`]: service tags on the node's single request-response protocol (the tag table
//!   other services add their rows to);
//! - [`Router`]: called by the node's event loop for every gossip message
//!   ([`Router::on_gossip`]) and request ([`Router::on_request`]); routes butterfly gossip
//!   to the running merge or audit and answers requests from the servers of recent merges;
//! - [`P2pTransport`]: the [`butterfly::Transport`] of one merge over a [`p2p::Client`];
//! - [`Metrics`], the node's counters: `iota_butterfly_bytes_{sent,received}_total`,
//!   `iota_butterfly_mismatches_total`, `iota_misbehaviour_reports_total{direction,kind}`;
//! - [`merge`] and [`audit`]: one call each for the miner and validator loops.
//!
//! # Wiring
//!
//! 1. One [`Router::new`]`(run, Metrics::new(&mut registry))` per node; in the event loop,
//!    `Event::Gossip` goes to `router.on_gossip(&author, &topic, &data)` first (`true`:
//!    consumed), and `Event::Request` to `router.on_request(&peer, &data)`, answering
//!    `Some(bytes)` with `client.respond(id, bytes)`, and `None` (another service's tag)
//!    with the other services or [`crate::wire::rpc::fallback_response`]. Large answers are copies of
//!    partitions: answer from a spawned task.
//! 2. Subscribe to [`topic`]`(run, stage)` as soon as the node holds a stage (add it to
//!    `p2p::Config::topics`, or `client.subscribe`): gossip sent before a node subscribes
//!    never reaches it, and a member whose commitment is not seen is left out. [`merge`]
//!    subscribes too, but that may be late for the fastest members' commitments.
//! 3. When an epoch ends, every miner of the stage builds the same plan with [`plan_for`]
//!    (epoch seed, stage, the stage's miners, vector length) and the same [`butterfly::Timing`]
//!    (e.g. [`timing_at`] from the epoch's wall-clock end), and calls [`merge`] with its flat
//!    parameters and sample count. It returns by `timing.done_by` with the merged vector,
//!    identical on every honest member. Validators call [`audit`] with the same plan.

pub(crate) mod api;
mod metrics;
mod router;
mod task;
mod transport;
mod validate;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bootstrap::PeerIdStr;
use p2p::{Client, PeerId};
use tokio::time::Instant;
pub use training::butterfly;
use training::butterfly::{
    AuditConfig, AuditError, AuditReport, MemberId, MergeConfig, MergeError, MergeOutcome, Plan,
    PlanError, Timing, Transport, MAX_PARTITIONS,
};

pub use metrics::{Direction, Metrics};
pub use router::{
    Feed, FeedError, RouteRefusal, Routed, Router, FEED_CAPACITY, KEPT_SERVERS, PENDING_BYTES,
    PENDING_MERGES, PENDING_PER_MERGE,
};
pub use transport::{OpenError, P2pTransport, PUBLISH_PATIENCE};

/// Largest partition [`plan_for`] cuts, in bytes: a quarter of the p2p layer's 64 MiB
/// frame, so that a partition's response fits with room to spare and the memory of a
/// fetch stays modest.
pub const DEFAULT_MAX_PARTITION_BYTES: usize = 16 << 20;

/// Default number of requests one member keeps in flight.
pub const DEFAULT_MAX_CONCURRENT_FETCHES: usize = 8;

/// The gossip topic of the butterfly merges of `stage` in `run`.
pub fn topic(run: &str, stage: u32) -> String {
    crate::wire::topics::butterfly(run, stage)
}

/// How many partitions to cut a vector of `len` values shared by `members` members into:
/// the smallest multiple of `N/2` (of `N` when `N` is odd) whose partitions are at most
/// `max_partition_bytes`, so that the plan is balanced (`2P` a multiple of `N`: every
/// member holds the same number of partitions) and each response fits a frame. Clamped to
/// `1..=min(len, MAX_PARTITIONS)`, where balance or the size bound may be lost: a vector
/// shorter than `N/2`, or longer than `MAX_PARTITIONS × max_partition_bytes`.
pub fn partitions_for(members: usize, len: usize, max_partition_bytes: usize) -> usize {
    let unit = match members {
        0 | 1 => 1,
        n if n % 2 == 0 => n / 2,
        n => n,
    };
    let max_values = (max_partition_bytes / 4).max(1);
    let needed = len.div_ceil(max_values).max(1);
    let balanced = needed.div_ceil(unit).saturating_mul(unit);
    balanced.min(len.clamp(1, MAX_PARTITIONS))
}

/// A bijection of `u64` (splitmix64's finaliser): distinct stages get distinct mixes.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The merge plan of `stage` for an epoch: holders drawn from `epoch_seed` mixed with the
/// stage (so stages pair their miners differently), members in any order (sorted inside),
/// `P` from [`partitions_for`] with [`DEFAULT_MAX_PARTITION_BYTES`]. Every node that calls
/// it with the same arguments gets the same plan.
pub fn plan_for(
    epoch_seed: u64,
    stage: u32,
    members: &[PeerId],
    len: usize,
) -> Result<Plan, PlanError> {
    let members: Vec<PeerIdStr> = members.iter().map(crate::wire::peer::of).collect();
    plan_of(epoch_seed, stage, &members, len)
}

/// [`plan_for`] with the members in the node's form.
pub(crate) fn plan_of(
    epoch_seed: u64,
    stage: u32,
    members: &[PeerIdStr],
    len: usize,
) -> Result<Plan, PlanError> {
    let ids: Vec<MemberId> = members.iter().map(|m| m.as_str().to_owned()).collect();
    let partitions = partitions_for(ids.len(), len, DEFAULT_MAX_PARTITION_BYTES);
    butterfly::plan(epoch_seed ^ mix(u64::from(stage)), &ids, partitions, len)
}

/// The [`Timing`] of a merge whose first phase starts at wall-clock `start`, given the
/// same moment `now` read on both clocks (so every node derives its deadlines from the
/// shared schedule, whatever its monotonic clock).
pub fn timing_at(
    start: SystemTime,
    phase: Duration,
    fetch_timeout: Duration,
    now: (SystemTime, Instant),
) -> Timing {
    let (wall, mono) = now;
    let start = match start.duration_since(wall) {
        Ok(ahead) => mono + ahead,
        Err(behind) => mono.checked_sub(behind.duration()).unwrap_or(mono),
    };
    Timing::from_start(start, phase, fetch_timeout)
}

/// One member's part in a merge.
#[derive(Debug, Clone)]
pub struct MergeParams {
    /// The stage whose replicas merge.
    pub stage: u32,
    /// The epoch that just ended.
    pub epoch: u64,
    /// The plan, the same on every member ([`plan_for`]).
    pub plan: Arc<Plan>,
    /// The deadlines, the same on every member.
    pub timing: Timing,
    /// Samples this member processed in the epoch (its weight).
    pub samples: u64,
    /// Most requests in flight at once ([`DEFAULT_MAX_CONCURRENT_FETCHES`]).
    pub max_concurrent_fetches: usize,
    /// Cap on every member's sample count, the same on every member (`u64::MAX`: none).
    pub max_samples: u64,
}

/// A validator's audit of a merge.
#[derive(Debug, Clone)]
pub struct AuditParams {
    /// The stage whose replicas merge.
    pub stage: u32,
    /// The epoch of the merge.
    pub epoch: u64,
    /// The merge's plan.
    pub plan: Arc<Plan>,
    /// The merge's deadlines.
    pub timing: Timing,
    /// Probability that a partition is recomputed, in `[0, 1]`.
    pub rate: f64,
    /// Seed of the sample of partitions.
    pub seed: u64,
    /// Most requests in flight at once.
    pub max_concurrent_fetches: usize,
    /// The merge's cap on every member's sample count.
    pub max_samples: u64,
}

/// Why [`merge`] could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MergeRunError {
    /// The network side could not be set up.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The merge's configuration was refused (not a member, wrong length, bad plan…).
    #[error(transparent)]
    Merge(#[from] MergeError),
}

/// Why [`audit`] could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditRunError {
    /// The network side could not be set up.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The audit's configuration was refused (bad plan).
    #[error(transparent)]
    Audit(#[from] AuditError),
}

/// Runs this node's part of a merge: subscribes, opens the router's feed, registers the
/// member's server (kept after the merge, see [`KEPT_SERVERS`]), runs the protocol and
/// counts its findings in the router's metrics. Returns by `params.timing.done_by`.
pub async fn merge(
    client: &Client,
    router: &Router,
    params: MergeParams,
    values: Vec<f32>,
) -> Result<MergeOutcome, MergeRunError> {
    let transport = P2pTransport::open(client.clone(), router, params.stage, params.epoch).await?;
    let me = client.local_peer_id().to_string();
    Ok(merge_over(router, me, params, values, Arc::new(transport)).await?)
}

/// [`merge`] over any transport (e.g. a [`P2pTransport`] wrapped to count or to inject
/// faults); `me` is this member's id in the plan.
pub async fn merge_over<T: Transport>(
    router: &Router,
    me: MemberId,
    params: MergeParams,
    values: Vec<f32>,
    transport: Arc<T>,
) -> Result<MergeOutcome, MergeError> {
    let config = MergeConfig {
        epoch: params.epoch,
        stage: params.stage,
        me,
        plan: params.plan,
        timing: params.timing,
        samples: params.samples,
        max_concurrent_fetches: params.max_concurrent_fetches,
        max_samples: params.max_samples,
    };
    let merge = butterfly::Merge::new(config, values)?;
    router.register_server(params.stage, params.epoch, merge.server());
    let outcome = merge.run(transport).await;
    router.metrics().record_merge(&outcome.report);
    let report = &outcome.report;
    tracing::info!(
        epoch = params.epoch,
        stage = params.stage,
        bytes_sent = report.bytes_sent,
        bytes_received = report.bytes_received,
        mismatches = report.mismatches,
        reports = report.misbehaviour.len(),
        kept_local = report.partitions_kept_local.len(),
        result = %report.result_hash,
        "merge done"
    );
    Ok(outcome)
}

/// Runs a validator's audit of a merge over this node: listens to the merge's gossip,
/// recomputes the sampled partitions and publishes a report for every claim that does not
/// reproduce; the reports are counted in the router's metrics.
pub async fn audit(
    client: &Client,
    router: &Router,
    params: AuditParams,
) -> Result<AuditReport, AuditRunError> {
    let transport = P2pTransport::open(client.clone(), router, params.stage, params.epoch).await?;
    let config = AuditConfig {
        epoch: params.epoch,
        stage: params.stage,
        auditor: client.local_peer_id().to_string(),
        plan: params.plan,
        timing: params.timing,
        rate: params.rate,
        seed: params.seed,
        max_concurrent_fetches: params.max_concurrent_fetches,
        max_samples: params.max_samples,
    };
    let report = butterfly::audit(Arc::new(transport), config).await?;
    router.metrics().record_audit(&report);
    Ok(report)
}
