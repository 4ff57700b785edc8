//! Phase 2, the holder side: fetch every on-time member's input of each held partition,
//! check it against the commitment, average, publish the claim, and narrow the included
//! set until it agrees with the co-holder's (see [`narrow`]).
//!
//! Members that are not holders of anything run this phase too: they just record claims
//! until every partition is settled or the claims deadline passes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::task::JoinSet;

use super::Runner;
use crate::butterfly::fetch::{Fetched, InputSpec, Traffic};
use crate::butterfly::ledger::narrow;
use crate::butterfly::{
    weighted_average, Contribution, Evidence, Gossip, Hash, MisbehaviourKind, SliceHash, Transport,
    KEPT_ROUNDS,
};

/// Highest round a holder publishes, so every round it published stays servable.
const MAX_ROUND: u32 = KEPT_ROUNDS as u32 - 1;

type InputResult = (usize, InputSpec, Fetched, Traffic);

impl<T: Transport> Runner<T> {
    /// Runs phase 2 until all partitions are settled or `claims_by`.
    pub(super) async fn hold(&mut self) {
        let deadline = self.cfg.timing.claims_by;
        let mut tasks: JoinSet<InputResult> = JoinSet::new();
        let mut task_partition = BTreeMap::new();
        self.start_fetches(&mut tasks, &mut task_partition);
        let held: Vec<usize> = self.held.keys().copied().collect();
        for &p in &held {
            self.reconcile(p).await;
        }
        loop {
            if tasks.is_empty() && self.ledger.all_settled() {
                break;
            }
            tokio::select! {
                Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    match joined {
                        Ok((_, result)) => self.on_input(result).await,
                        Err(error) => {
                            tracing::error!(%error, "input fetch task failed");
                            if let Some(p) = task_partition.get(&error.id()) {
                                self.input_done(*p).await;
                            }
                        }
                    }
                }
                received = self.transport.next_gossip(), if self.gossip_open => {
                    self.on_gossip(received).await;
                    for &p in &held {
                        self.reconcile(p).await;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        tracing::debug!(
            settled = (0..self.plan().partitions())
                .filter(|&p| self.ledger.settled(p))
                .count(),
            "claims phase over"
        );
    }

    /// Spawns one fetch per (held partition, on-time member other than this one).
    fn start_fetches(
        &mut self,
        tasks: &mut JoinSet<InputResult>,
        task_partition: &mut BTreeMap<tokio::task::Id, usize>,
    ) {
        let on_time = self.ledger.on_time();
        let fetcher = self.fetcher(self.cfg.timing.claims_by);
        let plan = Arc::clone(&self.cfg.plan);
        let me = self.me;
        for (&p, held) in self.held.iter_mut() {
            let own = &self.values[plan.range(p)];
            // A member whose own values went non-finite leaves itself out, as the others do.
            if own.iter().all(|v| v.is_finite()) {
                held.inputs.insert(me, own.into());
            }
            for &member in on_time.iter().filter(|&&m| m != me) {
                let Some(commitment) = self.ledger.commitment(member) else {
                    continue;
                };
                let spec = InputSpec {
                    index: member,
                    member: plan.member(member).to_string(),
                    samples: commitment.samples,
                    hash: commitment.partition_hashes[p],
                };
                let fetcher = fetcher.clone();
                let plan = Arc::clone(&plan);
                let handle = tasks.spawn(async move {
                    let (fetched, traffic) = fetcher.input(&plan, &spec, p).await;
                    (p, spec, fetched, traffic)
                });
                task_partition.insert(handle.id(), p);
                held.pending += 1;
            }
        }
    }

    async fn on_input(&mut self, (p, spec, fetched, traffic): InputResult) {
        self.traffic.add(traffic);
        match fetched {
            Fetched::Values(values) => {
                if let Some(held) = self.held.get_mut(&p) {
                    held.inputs.insert(spec.index, values.into());
                }
            }
            Fetched::Mismatch(served) => {
                self.mismatches += 1;
                self.ledger.exclude(spec.index);
                let report = self.ledger.report(
                    spec.index,
                    MisbehaviourKind::Equivocation,
                    Evidence::ServedMismatch {
                        partition: p as u32,
                        committed: spec.hash,
                        served,
                    },
                );
                self.report(report).await;
            }
            Fetched::NonFinite => {
                // Both holders fetch the same committed bytes, so both leave the member
                // out and still agree.
                self.ledger.exclude(spec.index);
                let report = self.ledger.report(
                    spec.index,
                    MisbehaviourKind::NonFinite,
                    Evidence::NonFiniteInput {
                        partition: p as u32,
                        committed: spec.hash,
                    },
                );
                self.report(report).await;
            }
            Fetched::Failed => {
                self.unreachable.insert(spec.index);
            }
        }
        self.input_done(p).await;
    }

    async fn input_done(&mut self, p: usize) {
        if let Some(held) = self.held.get_mut(&p) {
            held.pending = held.pending.saturating_sub(1);
        }
        self.reconcile(p).await;
    }

    /// Publishes a (new) claim for held partition `p` while its included set should change.
    async fn reconcile(&mut self, p: usize) {
        self.find_outliers(p).await;
        while let Some((included, round)) = self.next_claim(p) {
            self.publish_claim(p, included, round).await;
        }
    }

    /// Once every input of held partition `p` is in, names the members whose input is an
    /// outlier among them: they are left out of every claim of `p` and reported. Both
    /// holders fetch the same committed bytes, so both leave the same members out.
    async fn find_outliers(&mut self, p: usize) {
        let Some(held) = self.held.get(&p) else {
            return;
        };
        if held.pending > 0 || held.outliers.is_some() {
            return;
        }
        let allowed = self.ledger.on_time();
        let found = self.ledger.outliers(
            p,
            held.inputs
                .iter()
                .filter(|(m, _)| allowed.contains(*m))
                .map(|(&m, values)| (m, &values[..])),
        );
        if let Some(held) = self.held.get_mut(&p) {
            held.outliers = Some(found.iter().map(|&(m, _)| m).collect());
        }
        for (m, committed) in found {
            if m == self.me {
                tracing::warn!(partition = p, "this replica's own input is an outlier");
                continue;
            }
            let report = self.ledger.report(
                m,
                MisbehaviourKind::Outlier,
                Evidence::OutlierInput {
                    partition: p as u32,
                    committed,
                },
            );
            tracing::warn!(accused = %report.accused, partition = p, "left an outlier out of the merge");
            self.report(report).await;
        }
    }

    /// The included set and round of the claim to publish next for `p`, if any: the first
    /// claim once all inputs are in, then a narrower one when members turned out to be
    /// equivocators or the co-holder's claim leaves some out (within [`narrow`]'s limit).
    fn next_claim(&self, p: usize) -> Option<(BTreeSet<usize>, u32)> {
        let held = self.held.get(&p)?;
        if held.pending > 0 {
            return None;
        }
        let allowed = self.ledger.on_time();
        let outliers = held.outliers.clone().unwrap_or_default();
        let fetched: BTreeSet<usize> = held
            .inputs
            .keys()
            .copied()
            .filter(|m| allowed.contains(m) && !outliers.contains(m))
            .collect();
        let Some((current, round)) = &held.current else {
            return Some((fetched, 0));
        };
        let base: BTreeSet<usize> = current.intersection(&allowed).copied().collect();
        let holders = self.plan().holders(p);
        let co_holder = if holders[0] == self.me {
            holders[1]
        } else {
            holders[0]
        };
        let co_claim = self
            .ledger
            .claims(p)
            .find(|s| self.plan().index_of(&s.holder) == Some(co_holder));
        let next = match co_claim {
            Some(claim) => {
                let theirs: BTreeSet<usize> = claim
                    .included
                    .iter()
                    .filter_map(|m| self.plan().index_of(m))
                    .collect();
                narrow(&fetched, &base, &theirs).unwrap_or(base)
            }
            None => base,
        };
        if next == *current || next.is_empty() {
            return None;
        }
        if *round >= MAX_ROUND {
            tracing::warn!(
                partition = p,
                "included set still changing after the last round"
            );
            return None;
        }
        Some((next, round + 1))
    }

    /// Averages `included`'s inputs of `p`, makes the result servable, and publishes it.
    async fn publish_claim(&mut self, p: usize, included: BTreeSet<usize>, round: u32) {
        let Some(held) = self.held.get_mut(&p) else {
            return;
        };
        held.current = Some((included.clone(), round));
        let plan = Arc::clone(&self.cfg.plan);
        let mut contributions = Vec::with_capacity(included.len());
        let mut input_hashes = Vec::with_capacity(included.len());
        for &m in &included {
            let (Some(commitment), Some(values)) = (self.ledger.commitment(m), held.inputs.get(&m))
            else {
                tracing::error!(
                    partition = p,
                    member = m,
                    "included member without verified input"
                );
                return;
            };
            input_hashes.push(commitment.partition_hashes[p]);
            contributions.push(Contribution {
                member: plan.member(m),
                samples: commitment.samples,
                values,
            });
        }
        let average = match weighted_average(&contributions) {
            Ok(average) => average,
            Err(error) => {
                tracing::error!(partition = p, %error, "cannot average");
                return;
            }
        };
        let result = Hash::of_values(&average);
        self.server.store_averaged(p, result, average.into());
        let claim = SliceHash {
            epoch: self.cfg.epoch,
            stage: self.cfg.stage,
            partition: p as u32,
            round,
            holder: self.cfg.me.clone(),
            included: included
                .iter()
                .map(|&m| plan.member(m).to_string())
                .collect(),
            input_hashes,
            result,
        };
        tracing::debug!(partition = p, round, included = included.len(), %result, "claim");
        let message = Gossip::SliceHash(claim);
        self.ledger
            .observe(&self.cfg.me.clone(), message.clone(), false);
        self.publish(message).await;
    }
}
