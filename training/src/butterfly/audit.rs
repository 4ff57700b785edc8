//! A validator's audit of a merge: recompute a random sample of partitions from the
//! members' committed inputs and name every holder whose claim does not reproduce.
//!
//! This is what catches two holders who collude on the same wrong result (members see the
//! claims agree and have no reason to recompute). Guarantees: the sample is drawn from the
//! audit seed, the epoch and the stage (each partition independently with probability
//! `rate`), so whoever knows the seed can check which partitions were audited; only inputs
//! matching their commitments are used; a holder is named only when the average of the
//! committed inputs of its own included set has a different hash than it claimed.

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::Instrument;

use super::fetch::{specs_for, Fetcher, Traffic};
use super::ledger::{Check, Ledger, Observed};
use super::{
    Evidence, Gossip, MemberId, Misbehaviour, MisbehaviourKind, Plan, Received, Timing, Transport,
    VerifyError,
};

const AUDIT_CONTEXT: &str = "iota-p2p butterfly audit v1";

/// An audit of one merge.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// Epoch of the merge.
    pub epoch: u64,
    /// Stage whose replicas merge.
    pub stage: u32,
    /// The validator's id (reporter of its findings; need not be a member).
    pub auditor: MemberId,
    /// The merge's plan.
    pub plan: Arc<Plan>,
    /// The merge's deadlines: claims are gathered until `claims_by`, inputs fetched until
    /// `done_by`.
    pub timing: Timing,
    /// Probability that a partition is audited, in `[0, 1]`.
    pub rate: f64,
    /// Seed of the sample (e.g. the validator's per-epoch audit seed).
    pub seed: u64,
    /// Most requests in flight at once (at least 1).
    pub max_concurrent_fetches: usize,
    /// The merge's cap on each member's sample count (see `MergeConfig::max_samples`).
    pub max_samples: u64,
}

/// What an audit found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Partitions sampled and fully recomputed.
    pub audited: Vec<u32>,
    /// Partitions sampled but not checkable (an input or commitment was missing).
    pub unverifiable: Vec<u32>,
    /// Sampled partitions without any claim.
    pub unclaimed: Vec<u32>,
    /// Reports published (one per wrong claim, one per member whose committed input holds
    /// a NaN or an infinity).
    pub misbehaviour: Vec<Misbehaviour>,
    /// Members whose commitment claimed more samples than the merge's cap.
    pub weights_capped: Vec<MemberId>,
    /// Encoded bytes sent (requests and reports).
    pub bytes_sent: u64,
    /// Encoded bytes received (gossip and responses).
    pub bytes_received: u64,
}

/// Why an audit cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The plan is not the one its own seed, members, partition count and length give.
    #[error("invalid plan: {0}")]
    Plan(#[from] VerifyError),
}

/// For each of `partitions` partitions, whether it is in the audit sample of
/// `(seed, epoch, stage)` at `rate`.
pub fn sampled(seed: u64, epoch: u64, stage: u32, partitions: usize, rate: f64) -> Vec<bool> {
    let mut hasher = blake3::Hasher::new_derive_key(AUDIT_CONTEXT);
    hasher.update(&seed.to_le_bytes());
    hasher.update(&epoch.to_le_bytes());
    hasher.update(&stage.to_le_bytes());
    let mut rng = ChaCha20Rng::from_seed(*hasher.finalize().as_bytes());
    (0..partitions)
        .map(|_| ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < rate)
        .collect()
}

/// Listens to the merge's gossip until the claims deadline, then recomputes the sampled
/// partitions and publishes a report for every claim that does not reproduce. Ends by
/// `timing.done_by` plus one fetch timeout per sampled partition at the latest.
pub async fn audit<T: Transport>(
    transport: Arc<T>,
    config: AuditConfig,
) -> Result<AuditReport, AuditError> {
    super::verify(&config.plan)?;
    let span = tracing::info_span!(
        "butterfly_audit",
        auditor = %config.auditor,
        epoch = config.epoch,
        stage = config.stage
    );
    Ok(run(transport, config).instrument(span).await)
}

async fn run<T: Transport>(transport: Arc<T>, config: AuditConfig) -> AuditReport {
    let mut report = AuditReport::default();
    let mut traffic = Traffic::default();
    let plan = Arc::clone(&config.plan);
    let mut ledger = Ledger::new(
        config.epoch,
        config.stage,
        Arc::clone(&plan),
        config.auditor.clone(),
    )
    .with_max_samples(config.max_samples);
    let reported = gather(&*transport, &config, &mut ledger, &mut traffic).await;
    report.weights_capped = ledger.capped();

    let fetcher = Fetcher {
        transport: Arc::clone(&transport),
        permits: Arc::new(Semaphore::new(config.max_concurrent_fetches.max(1))),
        epoch: config.epoch,
        stage: config.stage,
        timeout: config.timing.fetch_timeout,
        deadline: config.timing.done_by,
    };
    let sample = sampled(
        config.seed,
        config.epoch,
        config.stage,
        plan.partitions(),
        config.rate,
    );
    let mut accused: BTreeSet<(MemberId, u32)> = BTreeSet::new();
    let mut poisoned: BTreeSet<usize> = BTreeSet::new();
    for p in (0..plan.partitions()).filter(|&p| sample[p] || reported.contains(&p)) {
        let claims: Vec<_> = ledger
            .claims(p)
            .filter(|c| ledger.consistent(c))
            .cloned()
            .collect();
        if claims.is_empty() {
            report.unclaimed.push(p as u32);
            continue;
        }
        let specs = claims
            .iter()
            .map(|c| specs_for(&ledger, &plan, c))
            .collect();
        let (checked, effects) = fetcher
            .check_claims(Arc::clone(&plan), p, &claims, specs, Default::default())
            .await;
        traffic.add(effects.traffic);
        // Members the holders left out: the audit fetches their committed input too, to
        // confirm why (the holders report it, but their word is not proof).
        let included: BTreeSet<&str> = claims
            .iter()
            .flat_map(|c| c.included.iter().map(String::as_str))
            .collect();
        let mut non_finite = effects.non_finite;
        let mut inputs = effects.inputs;
        for member in 0..plan.members().len() {
            let (Some(commitment), false) = (
                ledger.commitment(member),
                included.contains(plan.member(member)),
            ) else {
                continue;
            };
            let Some(&hash) = commitment.partition_hashes.get(p) else {
                continue;
            };
            let spec = crate::butterfly::fetch::InputSpec {
                index: member,
                member: plan.member(member).to_string(),
                samples: commitment.samples,
                hash,
            };
            let (fetched, spent) = fetcher.input(&plan, &spec, p).await;
            traffic.add(spent);
            match fetched {
                crate::butterfly::fetch::Fetched::NonFinite => non_finite.push((member, hash)),
                crate::butterfly::fetch::Fetched::Values(values) => {
                    inputs.insert(member, values.into());
                }
                _ => {}
            }
        }
        // A committed input that holds a NaN or an infinity is proof on its own, and so is
        // one far from the others (`robust::outliers`): anyone can fetch the partition's
        // committed inputs, check them against the commitments and see it.
        let partition = p as u32;
        let outliers = ledger.outliers(p, inputs.iter().map(|(&m, v)| (m, &v[..])));
        let poisons = non_finite
            .into_iter()
            .map(|(member, committed)| {
                let evidence = Evidence::NonFiniteInput {
                    partition,
                    committed,
                };
                (member, MisbehaviourKind::NonFinite, evidence)
            })
            .chain(outliers.into_iter().map(|(member, committed)| {
                let evidence = Evidence::OutlierInput {
                    partition,
                    committed,
                };
                (member, MisbehaviourKind::Outlier, evidence)
            }));
        for (member, kind, evidence) in poisons {
            if !poisoned.insert(member) {
                continue;
            }
            let message = ledger.report(member, kind, evidence);
            tracing::warn!(accused = %message.accused, partition = p, ?kind, "audit found a poisoned input");
            publish_report(&*transport, &mut report, &mut traffic, message).await;
        }
        if checked.iter().any(|c| c.check == Check::Unknown) {
            report.unverifiable.push(p as u32);
        } else {
            report.audited.push(p as u32);
        }
        for (claim, checked) in claims.iter().zip(&checked) {
            let Check::Refuted(recomputed) = checked.check else {
                continue;
            };
            let Some(holder) = plan.index_of(&claim.holder) else {
                continue;
            };
            if !accused.insert((claim.holder.clone(), claim.partition)) {
                continue;
            }
            let evidence = Evidence::WrongAverage {
                partition: claim.partition,
                round: claim.round,
                claimed: claim.result,
                recomputed,
            };
            let message = ledger.report(holder, MisbehaviourKind::WrongAverage, evidence);
            tracing::warn!(accused = %message.accused, partition = p, "audit refuted a claim");
            publish_report(&*transport, &mut report, &mut traffic, message).await;
        }
    }
    report.bytes_sent = traffic.sent;
    report.bytes_received = traffic.received;
    tracing::info!(
        audited = report.audited.len(),
        reports = report.misbehaviour.len(),
        "audit done"
    );
    report
}

/// Keeps `message` in the audit's report and gossips it.
async fn publish_report<T: Transport>(
    transport: &T,
    report: &mut AuditReport,
    traffic: &mut Traffic,
    message: Misbehaviour,
) {
    report.misbehaviour.push(message.clone());
    let gossip = Gossip::Misbehaviour(message);
    traffic.sent += gossip.encoded_len() as u64;
    if let Err(error) = transport.publish(gossip).await {
        tracing::warn!(%error, "publishing audit report failed");
    }
}

/// Records the merge's gossip until `claims_by`, or earlier once every member committed and
/// every partition is settled; returns the partitions members reported a non-finite input
/// in (the audit checks those besides its sample).
async fn gather<T: Transport>(
    transport: &T,
    config: &AuditConfig,
    ledger: &mut Ledger,
    traffic: &mut Traffic,
) -> BTreeSet<usize> {
    let deadline = config.timing.claims_by;
    let mut reported = BTreeSet::new();
    loop {
        if ledger.all_committed() && ledger.all_settled() {
            return reported;
        }
        tokio::select! {
            received = transport.next_gossip() => {
                let Some(Received { from, message }) = received else { return reported };
                traffic.received += message.encoded_len() as u64;
                let on_time = Instant::now() <= config.timing.commit_by;
                match ledger.observe(&from, message, on_time) {
                    Observed::Conflict(report) => {
                        if let Some(index) = config.plan.index_of(&report.accused) {
                            ledger.exclude(index);
                        }
                    }
                    // A member's word that an input is poisoned is checked, not taken.
                    Observed::Report(Misbehaviour {
                        evidence:
                            Evidence::NonFiniteInput { partition, .. }
                            | Evidence::OutlierInput { partition, .. },
                        ..
                    }) if (partition as usize) < config.plan.partitions() => {
                        reported.insert(partition as usize);
                    }
                    _ => {}
                }
            }
            _ = tokio::time::sleep_until(deadline) => return reported,
        }
    }
}
