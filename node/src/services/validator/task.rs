//! The validator service's task: it owns the validator's state ([`Scoring`], the
//! [`MergeBook`], the spot-check [`Schedule`]) and runs one `select!` over its inbox, the
//! findings of the merge audits it asked for, the spot check in flight and its own timers
//! (the next spot check, the delayed scoring of a closed epoch). Nothing else can send it
//! those: they are the task's own, not messages of the api.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bootstrap::EpochPlan;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::api::{EpochWeights, ValidatorHandle, ValidatorMsg, ValidatorParts};
use super::dodges::Claims;
use super::merges::MergeBook;
use super::scoring::{Proof, Scoring};
use super::spot::{Checker, Claim, Outcome, Schedule, Target};
use super::timers::Deadlines;
use crate::services::consensus::api::ConsensusHandle;
use crate::services::inbox::{ServiceGone, INBOX};
use crate::services::merge::api::{AuditEvent, AuditFinding, MergeHandle};
use crate::wire::messages::PipelineGossip;

/// How long after an epoch closes its records are scored: the tails flush their loss
/// records every quarter second, and gossip takes well under a second to spread.
const SCORE_DELAY: Duration = Duration::from_secs(3);

/// Starts the service; it runs until every handle is dropped or the merge service stops.
pub(crate) fn spawn(parts: ValidatorParts) -> anyhow::Result<(ValidatorHandle, JoinHandle<()>)> {
    let (tx, inbox) = mpsc::channel(INBOX);
    let (findings_tx, findings) = mpsc::channel(INBOX);
    let checker = Arc::new(Checker::new(
        parts.client.clone(),
        parts.run.clone(),
        parts.compute,
        parts.data.clone(),
    )?);
    let (weights_tx, weights) = watch::channel(None);
    let validator = Validator {
        merge: parts.merge,
        outbox: Outbox {
            data_dir: parts.data_dir,
            consensus: parts.consensus,
            client: parts.client,
            topic: parts.topic,
            peer: parts.me,
            weights: weights_tx,
            skew_weights: parts.skew_weights,
        },
        scoring: Scoring::default(),
        merges: MergeBook::default(),
        spot: SpotChecks {
            schedule: Schedule::new(parts.secret),
            checker,
            running: JoinSet::new(),
            claims: Claims::default(),
            claims_wake: None,
        },
        running: None,
        timers: Deadlines::default(),
        findings: findings_tx,
    };
    let task = tokio::spawn(validator.run(inbox, findings));
    Ok((ValidatorHandle::new(tx, weights), task))
}

/// What the task's timers fire.
enum Timer {
    /// Time for the next spot check.
    SpotTick,
    /// Score this epoch now: its last loss records have had time to arrive.
    Score(Box<EpochPlan>),
    /// A `Superseded` claim's grace period ends.
    Claims,
}

/// A finished spot check.
struct SpotCheckDone {
    /// What was checked.
    target: Target,
    /// How it ended.
    outcome: Outcome,
    /// The miner's `Superseded` claim, when it answered so: the outcome waits for it to be
    /// checked against the merges heard.
    claim: Option<Claim>,
    /// Its weights had not stepped, but it had served too few samples to be judged lazy:
    /// it is checked again soon.
    undecided: bool,
}

/// The spot checks: when and whom, what computes them, the one in flight, and the
/// `Superseded` claims waiting for the merge they name to be announced.
struct SpotChecks {
    schedule: Schedule,
    checker: Arc<Checker>,
    /// The check in flight (one at a time).
    running: JoinSet<SpotCheckDone>,
    claims: Claims,
    /// When the task wakes up next for the claims (one timer at a time).
    claims_wake: Option<Instant>,
}

/// Where an epoch's weights go: `/status`, `weights/<epoch>.json`, the pipeline topic and
/// this node's consensus.
struct Outbox {
    /// Where `weights/<epoch>.json` goes.
    data_dir: Option<PathBuf>,
    /// Consensus: it combines the validators' weights, and holds the miners' uids.
    consensus: ConsensusHandle,
    client: p2p::Client,
    /// The pipeline topic.
    topic: String,
    /// This node's peer id.
    peer: bootstrap::PeerIdStr,
    /// The latest weights, for `/status`.
    weights: watch::Sender<Option<EpochWeights>>,
    /// Misbehaviour on purpose: publish skewed weights (the hidden `skew-weights` fault).
    skew_weights: bool,
}

/// The task's state.
struct Validator {
    merge: MergeHandle,
    outbox: Outbox,
    scoring: Scoring,
    merges: MergeBook,
    spot: SpotChecks,
    /// The epoch running now (the newest plan's).
    running: Option<u64>,
    timers: Deadlines<Timer>,
    /// Where the merge audits send what they find (the receiving end is the task's).
    findings: mpsc::Sender<AuditEvent>,
}

impl Validator {
    /// The task: until every handle is dropped, or the merge or consensus service stops.
    async fn run(
        mut self,
        mut inbox: mpsc::Receiver<ValidatorMsg>,
        mut findings: mpsc::Receiver<AuditEvent>,
    ) {
        self.timers.push(
            Instant::now() + self.spot.schedule.next_delay(),
            Timer::SpotTick,
        );
        loop {
            let next = self.timers.next();
            let flow = tokio::select! {
                message = inbox.recv() => match message {
                    Some(message) => self.on_message(message).await,
                    None => ControlFlow::Break(()),
                },
                Some(event) = findings.recv() => {
                    self.on_audit_event(event);
                    ControlFlow::Continue(())
                }
                Some(done) = self.spot.running.join_next(), if !self.spot.running.is_empty() => {
                    match done {
                        Ok(done) => self.checked(done),
                        Err(error) => tracing::warn!(%error, "spot check ended without a verdict"),
                    }
                    ControlFlow::Continue(())
                }
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    self.on_timers(Instant::now()).await
                }
            };
            if flow.is_break() {
                return;
            }
        }
    }

    /// Handles one message of the api.
    async fn on_message(&mut self, message: ValidatorMsg) -> ControlFlow<()> {
        match message {
            ValidatorMsg::EpochClosed { closed, next } => {
                return self.on_epoch_closed(closed, next).await;
            }
            ValidatorMsg::Losses { epoch, records } => {
                self.running = self.running.max(Some(epoch));
                self.scoring.losses(epoch, records);
            }
            ValidatorMsg::ForgedLosses { epoch, peer, why } => {
                tracing::warn!(epoch, %peer, why, "loss records with forged receipts");
                self.scoring.caught(epoch, peer, Proof::ForgedCredit(why));
            }
            ValidatorMsg::Merged { epoch, stage, hash } => {
                self.merges.merged(epoch, stage, hash);
                self.judge_claims(Instant::now());
            }
            ValidatorMsg::Confirmation { request, reply } => {
                let _ = reply.send(self.merges.answer(&request, self.running));
            }
        }
        ControlFlow::Continue(())
    }

    /// An epoch closed: score it a little later, and audit the merges that close it.
    async fn on_epoch_closed(
        &mut self,
        closed: Box<EpochPlan>,
        next: Box<EpochPlan>,
    ) -> ControlFlow<()> {
        if closed.epoch >= next.epoch {
            return ControlFlow::Continue(());
        }
        self.running = Some(next.epoch);
        self.timers
            .push(Instant::now() + SCORE_DELAY, Timer::Score(closed.clone()));
        // The audit's findings come back to this task.
        if let Err(error) = self
            .merge
            .audit(*closed, *next, self.findings.clone())
            .await
        {
            tracing::warn!(%error, "merges not audited");
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// Notes what a merge audit found, or how it ended.
    fn on_audit_event(&mut self, event: AuditEvent) {
        match event {
            AuditEvent::Finding(AuditFinding {
                epoch,
                accused,
                kind,
            }) => {
                tracing::warn!(epoch, accused = %accused, kind = %kind, "a merge audit caught a miner");
                self.scoring.caught(epoch, accused, Proof::MergeAudit(kind));
            }
            AuditEvent::Done {
                epoch,
                stage,
                verdict,
            } => {
                tracing::info!(epoch, stage, ?verdict, "merge audit ended");
                self.merges.audited(epoch, stage, verdict);
            }
        }
    }

    /// Fires every timer due at `now`.
    async fn on_timers(&mut self, now: Instant) -> ControlFlow<()> {
        while let Some(timer) = self.timers.pop_due(now) {
            match timer {
                Timer::SpotTick => {
                    self.timers.push(
                        Instant::now() + self.spot.schedule.next_delay(),
                        Timer::SpotTick,
                    );
                    self.spot_check();
                }
                Timer::Score(plan) => {
                    if self.score(&plan).await.is_err() {
                        return ControlFlow::Break(());
                    }
                }
                Timer::Claims => {
                    self.spot.claims_wake = None;
                    self.judge_claims(now);
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// Starts the next spot check, unless one is running or there is nothing to check.
    fn spot_check(&mut self) {
        if !self.spot.running.is_empty() {
            return;
        }
        let Some(epoch) = self.running else { return };
        let Some(target) = self
            .scoring
            .records(epoch)
            .and_then(|records| self.spot.schedule.pick(epoch, records))
        else {
            return;
        };
        let starts = self.merges.starts(epoch, target.stage);
        let checker = self.spot.checker.clone();
        self.spot.running.spawn(async move {
            let began = tokio::time::Instant::now();
            let (outcome, measured) = checker.check(&target, &starts).await;
            tracing::info!(
                epoch = target.epoch,
                peer = %target.peer,
                stage = target.stage,
                sample = target.sample,
                ?outcome,
                cosine = measured.cosine,
                norm_ratio = measured.norm_ratio,
                loss_ratio = measured.loss_ratio,
                start_loss_ratio = measured.start_loss_ratio,
                unchanged_weights = measured.unchanged_weights,
                moved = measured.moved,
                grad_cosine = measured.grad_cosine,
                grad_norm_ratio = measured.grad_norm_ratio,
                served = measured.served,
                later = target.later,
                answered_ms = measured.answered_ms,
                took_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
                "spot check"
            );
            let undecided = checker.laziness_undecided(&measured);
            SpotCheckDone {
                target,
                outcome,
                claim: measured.claim,
                undecided,
            }
        });
    }

    /// A spot check finished: its outcome is recorded, or its `Superseded` claim waits to
    /// be checked.
    fn checked(&mut self, done: SpotCheckDone) {
        let SpotCheckDone {
            target,
            outcome,
            claim,
            undecided,
        } = done;
        match claim {
            Some(claim) => {
                let now = Instant::now();
                self.spot.claims.add(now, target, claim);
                self.judge_claims(now);
            }
            None => {
                if undecided && outcome == Outcome::Pass {
                    self.spot.schedule.recheck(&target.peer);
                }
                self.record(target, outcome);
            }
        }
    }

    /// Judges the `Superseded` claims that can be judged now, and wakes up for the next.
    fn judge_claims(&mut self, now: Instant) {
        let merges = &self.merges;
        let judged = self
            .spot
            .claims
            .resolve(now, |epoch, stage| merges.heard(epoch, stage));
        for (target, outcome) in judged {
            tracing::info!(epoch = target.epoch, peer = %target.peer, stage = target.stage, sample = target.sample, ?outcome, "superseded claim checked");
            self.record(target, outcome);
        }
        if let Some(at) = self.spot.claims.next_deadline() {
            if self.spot.claims_wake.is_none_or(|wake| wake > at) {
                self.timers.push(at, Timer::Claims);
                self.spot.claims_wake = Some(at);
            }
        }
    }

    /// Records a spot check's outcome; a miner that dodged it (and is not caught by it) is
    /// checked again soon.
    fn record(&mut self, target: Target, outcome: Outcome) {
        let caught = self
            .scoring
            .spot_checked(target.epoch, &target.peer, outcome);
        match caught {
            Some(why) => {
                tracing::warn!(epoch = target.epoch, peer = %target.peer, stage = target.stage, sample = target.sample, reason = why.label(), "a spot check caught a miner");
            }
            None if matches!(outcome, Outcome::Inconclusive(why) if why.against_miner()) => {
                self.spot.schedule.recheck(&target.peer);
            }
            None => {}
        }
    }

    /// Scores `plan`'s epoch and publishes the weights.
    async fn score(&mut self, plan: &EpochPlan) -> Result<(), ServiceGone> {
        // The miners' uids in the metagraph in force now (it follows the chain and the
        // bindings when the stake comes from subtensor).
        let uids = self.outbox.consensus.view.borrow().uids.clone();
        let weights = self.scoring.score(plan, &uids);
        let flagged: Vec<&str> = weights
            .miners
            .iter()
            .filter(|m| m.flagged)
            .map(|m| m.peer_id.as_str())
            .collect();
        tracing::info!(
            epoch = plan.epoch,
            records = weights.records,
            miners = weights.miners.len(),
            ?flagged,
            fit_error = weights.fit_error.as_deref().unwrap_or(""),
            "miners scored"
        );
        self.outbox.publish(weights).await
    }
}

impl Outbox {
    /// Writes `weights` to the data dir, shows them on `/status`, gossips the chain
    /// vector and hands it to this node's consensus.
    async fn publish(&self, weights: EpochWeights) -> Result<(), ServiceGone> {
        let epoch = weights.epoch;
        if let Some(dir) = &self.data_dir {
            if let Err(error) = write_weights(&dir.join("weights"), &weights) {
                tracing::warn!(%error, "weights not written");
            }
        }
        let mut vector: Vec<(u16, u16)> =
            weights.miners.iter().map(|m| (m.uid, m.weight)).collect();
        if self.skew_weights {
            // Everything to the lowest uid, nothing to the others.
            for (i, (_, weight)) in vector.iter_mut().enumerate() {
                *weight = if i == 0 { u16::MAX } else { 0 };
            }
        }
        self.weights.send_replace(Some(weights));
        if vector.is_empty() {
            return Ok(());
        }
        let message = PipelineGossip::Weights {
            epoch,
            weights: vector.clone(),
        };
        if let Some(bytes) = message.to_bytes() {
            if let Err(error) = self.client.publish(&self.topic, bytes).await {
                tracing::warn!(%error, "weights not published");
            }
        }
        self.consensus
            .weights(self.peer.clone(), epoch, vector)
            .await
    }
}

/// Writes `<dir>/<epoch>.json` atomically.
fn write_weights(dir: &std::path::Path, weights: &EpochWeights) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.json", weights.epoch));
    crate::fsio::write_atomically(&path, &serde_json::to_vec_pretty(weights)?, false)?;
    Ok(())
}
