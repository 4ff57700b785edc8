//! What the run did, epoch by epoch, as every node hears it over the pipeline gossip consensus
//! accepted: loss records, held-out losses, heads that finished, merged hashes. Consensus
//! judges from it where the epoch in force stands ([`RunStats::progress`]), so that the
//! orchestrator closes epochs; `/status` shows it and `local-swarm` reads it from there.
//!
//! Each sample's record counts once (the first one heard): a `Losses` message accepted for
//! its new samples may repeat a sample or carry ones already counted, and those add nothing.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use bootstrap::EpochPlan;

use crate::services::consensus::api::{EpochProgress, PlanBook};
use crate::wire::messages::PipelineGossip;

/// One epoch as heard so far (also read back by `local-swarm` from `/status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct EpochStats {
    /// The epoch.
    pub(crate) epoch: u64,
    /// Loss records received.
    pub(crate) samples: u64,
    /// Tokens those samples held.
    pub(crate) tokens: u64,
    /// Mean training loss of the records.
    pub(crate) train_loss: Option<f64>,
    /// Held-out loss of the weights the epoch started from, in nats per token.
    pub(crate) val_loss: Option<f32>,
    /// The same loss in bits per byte of held-out text, which compares runs whose
    /// tokenizers differ. Gossip carries nats per token only: `/status` fills this from
    /// the node's data (`None` while the node lacks the dataset's manifest).
    pub(crate) val_bits_per_byte: Option<f64>,
    /// Heads that finished their samples.
    pub(crate) heads_done: Vec<String>,
    /// Samples the heads dropped.
    pub(crate) dropped: u64,
    /// Seconds (since the node started) of the first and the last loss record.
    pub(crate) first_record_s: Option<f64>,
    pub(crate) last_record_s: Option<f64>,
    /// Merged weights hash per stage, per reporting miner.
    pub(crate) merged: BTreeMap<u32, BTreeMap<String, String>>,
    /// Wire bytes the miners reported at their merge.
    pub(crate) wire_bytes: BTreeMap<String, u64>,
    /// Sum of losses (for the mean).
    #[serde(skip)]
    loss_sum: f64,
    /// Pathway peers seen, for per-miner sample counts.
    pub(crate) samples_by_miner: BTreeMap<String, u64>,
}

/// All epochs heard.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunStats {
    epochs: BTreeMap<u64, EpochStats>,
    /// The samples counted, for the newest [`KEEP_COUNTED`] epochs with records.
    counted: BTreeMap<u64, HashSet<u64>>,
}

/// Epochs kept in memory.
const KEEP: usize = 64;

/// Epochs whose counted samples are kept: loss records are taken for the epoch in force and
/// the one before it only, so older ones get no more records.
const KEEP_COUNTED: usize = 2;

impl RunStats {
    /// Takes a pipeline gossip message from `author`, heard at `now` since the node started.
    pub(crate) fn observe(&mut self, author: &str, message: &PipelineGossip, now: Duration) {
        let epoch = match message {
            PipelineGossip::Losses { epoch, .. }
            | PipelineGossip::ValLoss { epoch, .. }
            | PipelineGossip::HeadDone { epoch, .. }
            | PipelineGossip::Merged { epoch, .. } => *epoch,
            // Weights are consensus's business, not the run's statistics.
            PipelineGossip::Weights { .. } => return,
        };
        let e = self.epochs.entry(epoch).or_insert_with(|| EpochStats {
            epoch,
            ..EpochStats::default()
        });
        match message {
            PipelineGossip::Losses {
                tokens_per_sample,
                records,
                ..
            } => {
                let counted = self.counted.entry(epoch).or_default();
                for r in records {
                    if !r.loss.is_finite() || !counted.insert(r.sample) {
                        continue;
                    }
                    // Counters saturate: the router admits only checked records, and a
                    // counter that wraps would still be the worse failure.
                    e.samples = e.samples.saturating_add(1);
                    e.tokens = e.tokens.saturating_add(*tokens_per_sample);
                    e.loss_sum += f64::from(r.loss);
                    for peer in &r.pathway {
                        let n = e.samples_by_miner.entry(peer.clone()).or_default();
                        *n = n.saturating_add(1);
                    }
                }
                e.train_loss = (e.samples > 0).then(|| e.loss_sum / e.samples as f64);
                let t = now.as_secs_f64();
                e.first_record_s.get_or_insert(t);
                e.last_record_s = Some(t);
            }
            PipelineGossip::ValLoss { loss, .. } => e.val_loss = Some(*loss),
            PipelineGossip::HeadDone { dropped, .. } => {
                if !e.heads_done.iter().any(|h| h == author) {
                    e.heads_done.push(author.to_string());
                    e.dropped = e.dropped.saturating_add(*dropped);
                }
            }
            PipelineGossip::Merged {
                stage,
                hash,
                wire_bytes,
                ..
            } => {
                e.merged
                    .entry(*stage)
                    .or_default()
                    .insert(author.to_string(), hash.clone());
                e.wire_bytes.insert(author.to_string(), *wire_bytes);
            }
            PipelineGossip::Weights { .. } => {}
        }
        while self.epochs.len() > KEEP {
            self.epochs.pop_first();
        }
        while self.counted.len() > KEEP_COUNTED {
            self.counted.pop_first();
        }
    }

    /// Whether every head of `heads` that is still live finished `epoch`.
    pub(crate) fn epoch_done(&self, epoch: u64, heads: &[String], live: &BTreeSet<String>) -> bool {
        let Some(e) = self.epochs.get(&epoch) else {
            return false;
        };
        let waiting = heads
            .iter()
            .filter(|h| live.contains(*h) && !e.heads_done.contains(h))
            .count();
        !e.heads_done.is_empty() && waiting == 0
    }

    /// Whether the merges closing `plan`'s epoch are done: every stage that has a live
    /// member in `plan` has had its merge hash gossiped by at least one member. The next
    /// epoch is not opened before (a stage whose merge outlasts the next epoch falls behind
    /// by one more merge each epoch, and its miners never train: their merges overlap).
    pub(crate) fn merges_done(&self, plan: &bootstrap::EpochPlan, live: &BTreeSet<String>) -> bool {
        let merged = self.epochs.get(&plan.epoch).map(|e| &e.merged);
        (0..plan.stages).all(|stage| {
            let has_live_member = plan.miners_of(stage).any(|m| live.contains(m.as_str()));
            !has_live_member
                || merged
                    .and_then(|m| m.get(&stage))
                    .is_some_and(|by_miner| !by_miner.is_empty())
        })
    }

    /// Where the epoch of `current` stands, as heard: whether every live head of its plan
    /// reported its samples done, and whether the merges that opened it (closing the epoch
    /// before, whose plan `book` may hold) are done. `live` holds the live peers and this
    /// node.
    pub(crate) fn progress(
        &self,
        current: Option<&EpochPlan>,
        book: &PlanBook,
        live: &BTreeSet<String>,
    ) -> EpochProgress {
        let Some(plan) = current else {
            return EpochProgress {
                heads_done: false,
                merged: true,
            };
        };
        let heads: Vec<String> = plan.miners_of(0).map(|p| p.to_string()).collect();
        EpochProgress {
            heads_done: self.epoch_done(plan.epoch, &heads, live),
            merged: plan
                .epoch
                .checked_sub(1)
                .and_then(|before| book.get(before))
                .is_none_or(|before| self.merges_done(before, live)),
        }
    }

    /// The epochs, oldest first.
    pub(crate) fn epochs(&self) -> Vec<EpochStats> {
        self.epochs.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::messages::LossRecord;

    #[test]
    fn epoch_closes_when_every_live_head_is_done() {
        let mut stats = RunStats::default();
        let heads = vec!["h1".to_string(), "h2".to_string()];
        let live: BTreeSet<String> = heads.iter().cloned().collect();
        let now = Duration::from_secs(1);
        stats.observe(
            "t",
            &PipelineGossip::Losses {
                epoch: 0,
                tokens_per_sample: 10,
                records: vec![LossRecord {
                    sample: 1,
                    pathway: vec!["h1".into(), "b".into(), "t".into()],
                    loss: 2.0,
                    receipts: Vec::new(),
                }],
            },
            now,
        );
        assert!(!stats.epoch_done(0, &heads, &live));
        let done = PipelineGossip::HeadDone {
            epoch: 0,
            samples: 1,
            dropped: 0,
        };
        stats.observe("h1", &done, now);
        assert!(!stats.epoch_done(0, &heads, &live));
        // A dead head is not waited for.
        let only_h1: BTreeSet<String> = ["h1".to_string()].into_iter().collect();
        assert!(stats.epoch_done(0, &heads, &only_h1));
        stats.observe("h2", &done, now);
        assert!(stats.epoch_done(0, &heads, &live));
        let e = &stats.epochs()[0];
        assert_eq!((e.samples, e.tokens), (1, 10));
        assert_eq!(e.train_loss, Some(2.0));
        assert_eq!(e.samples_by_miner["b"], 1);
    }

    #[test]
    fn each_record_counts_once() {
        let mut stats = RunStats::default();
        let now = Duration::from_secs(1);
        let record = |sample: u64, loss: f32| LossRecord {
            sample,
            pathway: vec!["h".into(), "t".into()],
            loss,
            receipts: Vec::new(),
        };
        let losses = |records: Vec<LossRecord>| PipelineGossip::Losses {
            epoch: 0,
            tokens_per_sample: 10,
            records,
        };
        // A message repeating a sample, then one with a sample already counted and a new one.
        stats.observe("t", &losses(vec![record(1, 2.0), record(1, 2.0)]), now);
        stats.observe("t", &losses(vec![record(1, 9.0), record(2, 4.0)]), now);
        let e = &stats.epochs()[0];
        assert_eq!((e.samples, e.tokens), (2, 20));
        assert_eq!(
            e.train_loss,
            Some(3.0),
            "the first loss of each sample counts"
        );
        assert_eq!(e.samples_by_miner["h"], 2);
        // The same sample in another epoch is another record.
        stats.observe(
            "t",
            &PipelineGossip::Losses {
                epoch: 1,
                tokens_per_sample: 10,
                records: vec![record(1, 1.0)],
            },
            now,
        );
        assert_eq!(stats.epochs()[1].samples, 1);
    }

    #[test]
    fn the_next_epoch_waits_for_every_live_stage_to_merge() {
        let run = bootstrap::RunConfig::default();
        let peer = |i: u8| bootstrap::PeerIdStr::from_ed25519_public_key(&[i; 32]);
        let miners: BTreeSet<bootstrap::PeerIdStr> = (10..16).map(peer).collect();
        let plan = bootstrap::next_plan(&run, &peer(1), None, None, &miners).unwrap();
        let members =
            |stage| -> Vec<String> { plan.miners_of(stage).map(|p| p.to_string()).collect() };
        let live: BTreeSet<String> = miners.iter().map(|m| m.to_string()).collect();
        let merged = |stage| PipelineGossip::Merged {
            epoch: plan.epoch,
            stage,
            hash: format!("h{stage}"),
            wire_bytes: 0,
        };
        let mut stats = RunStats::default();
        let now = Duration::from_secs(1);
        assert!(!stats.merges_done(&plan, &live));
        stats.observe(&members(0)[0], &merged(0), now);
        stats.observe(&members(2)[1], &merged(2), now);
        // Stage 1 is still merging.
        assert!(!stats.merges_done(&plan, &live));
        // A stage whose members are all gone has no merge to wait for.
        let without_1: BTreeSet<String> = live
            .iter()
            .filter(|m| !members(1).contains(m))
            .cloned()
            .collect();
        assert!(stats.merges_done(&plan, &without_1));
        // One member's hash is enough: the merge round is over.
        stats.observe(&members(1)[0], &merged(1), now);
        assert!(stats.merges_done(&plan, &live));
    }
}
