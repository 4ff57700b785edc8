//! One member's run of a merge over a [`Transport`]: commit, hold, collect.
//!
//! [`Merge::new`] checks the configuration and creates the member's [`Server`]; the node
//! registers that server with its network (so peers' requests get answers) and then awaits
//! [`Merge::run`], which always finishes by `timing.done_by` with a vector and a
//! [`MergeReport`]. The phases and fault rules are described in the [module
//! documentation](super); the holder side is in `hold`, the collecting side in `collect`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::Instrument;

use super::fetch::{Fetcher, Traffic};
use super::ledger::{Ledger, Observed};
use super::{
    Commitment, Gossip, Hash, MemberId, Misbehaviour, MisbehaviourKind, Plan, Received, Server,
    Transport, VerifyError,
};

mod collect;
mod hold;

/// The deadlines of one merge, the same on every member (derive them from the epoch's
/// schedule). `commit_by < claims_by < done_by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Commitments arriving later do not count: their authors are left out.
    pub commit_by: Instant,
    /// Holders must have published their claims, and agreed, by then; members then decide.
    pub claims_by: Instant,
    /// Members stop fetching; partitions not yet obtained keep local values.
    pub done_by: Instant,
    /// Longest wait for any single request.
    pub fetch_timeout: Duration,
}

impl Timing {
    /// Phases of equal length `phase` from `start`: commit by `start + phase`, claims by
    /// `start + 3·phase` (fetching inputs takes the longest), done by `start + 5·phase`.
    pub fn from_start(start: Instant, phase: Duration, fetch_timeout: Duration) -> Timing {
        Timing {
            commit_by: start + phase,
            claims_by: start + 3 * phase,
            done_by: start + 5 * phase,
            fetch_timeout,
        }
    }
}

/// Everything one member needs to run a merge.
#[derive(Debug, Clone)]
pub struct MergeConfig {
    /// Epoch of the merge.
    pub epoch: u64,
    /// Stage whose replicas merge.
    pub stage: u32,
    /// This member's id (its libp2p peer id).
    pub me: MemberId,
    /// The plan, the same on every member (check a received one with `verify`).
    pub plan: Arc<Plan>,
    /// Deadlines.
    pub timing: Timing,
    /// Samples this member processed this epoch (its weight).
    pub samples: u64,
    /// Most requests in flight at once from this member (at least 1).
    pub max_concurrent_fetches: usize,
    /// The largest sample count a member's weight may rest on: every commitment's count is
    /// capped to it, the same on every member, so no member can claim more than others
    /// can check (`u64::MAX`: no cap).
    pub max_samples: u64,
}

/// Why a merge cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// `me` is not in the plan.
    #[error("{0} is not a member of this merge's plan")]
    NotAMember(MemberId),
    /// The vector's length is not the plan's.
    #[error("vector has {got} values, the plan covers {expected}")]
    LengthMismatch {
        /// The plan's length.
        expected: usize,
        /// The vector's.
        got: usize,
    },
    /// `max_concurrent_fetches` is zero.
    #[error("max_concurrent_fetches must be at least 1")]
    NoFetchSlots,
    /// The deadlines are not in order.
    #[error("deadlines must satisfy commit_by < claims_by < done_by")]
    Deadlines,
    /// The plan is not the one its own seed, members, partition count and length give.
    #[error("invalid plan: {0}")]
    Plan(#[from] VerifyError),
}

/// Counters and findings of one merge, for logs and the node's metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MergeReport {
    /// Encoded bytes this member sent: its gossip (counted once, not per recipient), its
    /// requests, and its server's responses up to the end of the run.
    /// (`iota_butterfly_bytes_sent_total`)
    pub bytes_sent: u64,
    /// Encoded bytes it received: gossip, responses, and requests to its server up to the
    /// end of the run. (`iota_butterfly_bytes_received_total`)
    pub bytes_received: u64,
    /// Hash checks that failed: inputs not matching a commitment, averages not matching
    /// their claim, and partitions whose two holders claimed different results.
    /// (`iota_butterfly_mismatches_total`)
    pub mismatches: u64,
    /// Reports this member published (at most one per accused member and kind).
    /// (`iota_misbehaviour_reports_total`)
    pub misbehaviour: Vec<Misbehaviour>,
    /// Partitions where this member kept its own values (no holder alive, no claim it could
    /// verify, or no holder answered in time).
    pub partitions_kept_local: Vec<u32>,
    /// Per partition, the members whose inputs are in the values taken (sorted; empty
    /// where the partition was kept local).
    pub included: Vec<Vec<MemberId>>,
    /// Members this member failed to fetch from at least once.
    pub unreachable: Vec<MemberId>,
    /// Gossip messages for this merge that did not fit it (wrong signer, not in the plan,
    /// malformed lists).
    pub invalid_messages: u64,
    /// Members whose commitment claimed more samples than the merge's cap
    /// (`MergeConfig::max_samples`): they weigh the cap, not their claim.
    /// (`iota_butterfly_weights_capped_total`)
    pub weights_capped: Vec<MemberId>,
    /// blake3 of the merged vector's little-endian bytes.
    pub result_hash: Hash,
}

/// The merged vector and what happened.
#[derive(Debug, Clone)]
pub struct MergeOutcome {
    /// The merged values (bit-identical on every honest member that took the same claims).
    pub values: Vec<f32>,
    /// Counters and findings.
    pub report: MergeReport,
}

/// One member's merge, ready to run.
#[derive(Debug)]
pub struct Merge {
    config: MergeConfig,
    me: usize,
    values: Arc<[f32]>,
    server: Server,
}

impl Merge {
    /// Checks `config` (the plan with [`verify`](super::verify)) against `values` and
    /// prepares the member's server.
    pub fn new(config: MergeConfig, values: Vec<f32>) -> Result<Merge, MergeError> {
        super::verify(&config.plan)?;
        let me = config
            .plan
            .index_of(&config.me)
            .ok_or_else(|| MergeError::NotAMember(config.me.clone()))?;
        if values.len() != config.plan.len() {
            return Err(MergeError::LengthMismatch {
                expected: config.plan.len(),
                got: values.len(),
            });
        }
        if config.max_concurrent_fetches == 0 {
            return Err(MergeError::NoFetchSlots);
        }
        let t = config.timing;
        if !(t.commit_by < t.claims_by && t.claims_by < t.done_by) {
            return Err(MergeError::Deadlines);
        }
        let values: Arc<[f32]> = values.into();
        let server = Server::new(
            config.epoch,
            config.stage,
            Arc::clone(&config.plan),
            me,
            Arc::clone(&values),
        );
        Ok(Merge {
            config,
            me,
            values,
            server,
        })
    }

    /// The server answering peers' requests for this member; register it with the network
    /// before calling [`Merge::run`] and keep it registered until the next merge.
    pub fn server(&self) -> Server {
        self.server.clone()
    }

    /// Runs the merge to completion (by `timing.done_by` at the latest).
    pub async fn run<T: Transport>(self, transport: Arc<T>) -> MergeOutcome {
        let span = tracing::info_span!(
            "butterfly",
            member = %self.config.me,
            epoch = self.config.epoch,
            stage = self.config.stage
        );
        async move {
            if self.config.plan.is_trivial() {
                return self.trivial();
            }
            let mut runner = Runner::new(self, transport);
            runner.commit().await;
            runner.hold().await;
            runner.collect().await
        }
        .instrument(span)
        .await
    }

    /// A single member: its values are the average.
    fn trivial(self) -> MergeOutcome {
        let plan = &self.config.plan;
        let values = self.values.to_vec();
        let report = MergeReport {
            included: vec![vec![self.config.me.clone()]; plan.partitions()],
            result_hash: Hash::of_values(&values),
            ..MergeReport::default()
        };
        MergeOutcome { values, report }
    }
}

/// What a holder knows about one partition it holds.
#[derive(Debug, Default)]
struct Held {
    /// Inputs fetched and verified (this member's own included).
    inputs: BTreeMap<usize, Arc<[f32]>>,
    /// Input fetches still running.
    pending: usize,
    /// The latest claim published: included set, round.
    current: Option<(BTreeSet<usize>, u32)>,
    /// Members whose input is an outlier among the fetched ones ([`crate::butterfly::robust`]),
    /// once every input is in.
    outliers: Option<BTreeSet<usize>>,
}

/// The state of one run.
struct Runner<T> {
    cfg: MergeConfig,
    me: usize,
    values: Arc<[f32]>,
    server: Server,
    transport: Arc<T>,
    permits: Arc<Semaphore>,
    ledger: Ledger,
    held: BTreeMap<usize, Held>,
    gossip_open: bool,
    traffic: Traffic,
    mismatches: u64,
    misbehaviour: Vec<Misbehaviour>,
    reported: BTreeSet<(String, MisbehaviourKind)>,
    unreachable: BTreeSet<usize>,
    invalid_messages: u64,
}

impl<T: Transport> Runner<T> {
    fn new(merge: Merge, transport: Arc<T>) -> Self {
        let Merge {
            config,
            me,
            values,
            server,
        } = merge;
        let ledger = Ledger::new(
            config.epoch,
            config.stage,
            Arc::clone(&config.plan),
            config.me.clone(),
        )
        .with_max_samples(config.max_samples);
        let held = config
            .plan
            .held_by(me)
            .into_iter()
            .map(|p| (p, Held::default()))
            .collect();
        Runner {
            permits: Arc::new(Semaphore::new(config.max_concurrent_fetches)),
            cfg: config,
            me,
            values,
            server,
            transport,
            ledger,
            held,
            gossip_open: true,
            traffic: Traffic::default(),
            mismatches: 0,
            misbehaviour: Vec::new(),
            reported: BTreeSet::new(),
            unreachable: BTreeSet::new(),
            invalid_messages: 0,
        }
    }

    fn plan(&self) -> &Plan {
        &self.cfg.plan
    }

    fn fetcher(&self, deadline: Instant) -> Fetcher<T> {
        Fetcher {
            transport: Arc::clone(&self.transport),
            permits: Arc::clone(&self.permits),
            epoch: self.cfg.epoch,
            stage: self.cfg.stage,
            timeout: self.cfg.timing.fetch_timeout,
            deadline,
        }
    }

    /// Phase 1: publish the commitment, then gather the others' until all are in or the
    /// commit deadline passes.
    async fn commit(&mut self) {
        let plan = Arc::clone(&self.cfg.plan);
        let commitment = Commitment {
            epoch: self.cfg.epoch,
            stage: self.cfg.stage,
            member: self.cfg.me.clone(),
            samples: self.cfg.samples,
            partition_hashes: (0..plan.partitions())
                .map(|p| Hash::of_values(&self.values[plan.range(p)]))
                .collect(),
        };
        let message = Gossip::Commitment(commitment);
        self.ledger.observe(&self.cfg.me, message.clone(), true);
        self.publish(message).await;
        let deadline = self.cfg.timing.commit_by;
        while !self.ledger.all_committed() && self.gossip_open {
            tokio::select! {
                received = self.transport.next_gossip() => {
                    self.on_gossip(received).await;
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        tracing::debug!(committed = self.ledger.on_time().len(), "commit phase over");
    }

    async fn publish(&mut self, message: Gossip) {
        self.traffic.sent += message.encoded_len() as u64;
        if let Err(error) = self.transport.publish(message).await {
            tracing::warn!(%error, "publish failed");
        }
    }

    /// Records one gossip message (or the end of the topic). Returns the partition whose
    /// claims changed, if any.
    async fn on_gossip(&mut self, received: Option<Received>) -> Option<usize> {
        let Some(Received { from, message }) = received else {
            self.gossip_open = false;
            return None;
        };
        self.traffic.received += message.encoded_len() as u64;
        let on_time = Instant::now() <= self.cfg.timing.commit_by;
        match self.ledger.observe(&from, message, on_time) {
            Observed::Slice(p) => Some(p),
            Observed::Conflict(report) => {
                if let Some(index) = self.plan().index_of(&report.accused) {
                    self.ledger.exclude(index);
                }
                self.report(report).await;
                None
            }
            Observed::Invalid(reason) => {
                tracing::debug!(peer = %from, reason, "invalid merge gossip");
                self.invalid_messages += 1;
                None
            }
            Observed::Report(report) => {
                tracing::info!(reporter = %report.reporter, accused = %report.accused, kind = ?report.kind, "misbehaviour reported");
                None
            }
            Observed::Commitment(_) | Observed::Nothing => None,
        }
    }

    /// Publishes `report` unless one for the same member and kind went out already.
    async fn report(&mut self, report: Misbehaviour) {
        if !self.reported.insert((report.accused.clone(), report.kind)) {
            return;
        }
        tracing::warn!(accused = %report.accused, kind = ?report.kind, "reporting misbehaviour");
        self.misbehaviour.push(report.clone());
        self.publish(Gossip::Misbehaviour(report)).await;
    }
}
