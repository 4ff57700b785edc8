//! The validator service: what a `--validator` node does beyond consensus.
//!
//! * It audits the butterfly merges that close each epoch (recomputing a sample of every
//!   stage's partitions through the merge service).
//! * It keeps the epoch's ledger — the loss records the router accepted, which come only
//!   from the plan's tails, for samples their heads drew, each once — and, a few seconds
//!   after the epoch closes (so the tails' last batches are in), scores the miners from it:
//!   CLASP ([`attribution::clasp`]) gives each miner its effect on the loss and flags the
//!   harmful ones; a miner's epoch score is the samples it served times its quality (0 when
//!   flagged), smoothed over epochs ([`attribution::score`]), and turned into chain weights
//!   ([`attribution::weights`]). The result is published for `/status`, written to
//!   `weights/<epoch>.json` in the data dir, and gossiped as a signed
//!   [`PipelineGossip::Weights`] vector (and handed to this node's own consensus, which
//!   combines every validator's vector by Yuma consensus).
//!
//! Not yet here: spot checks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use attribution::{clasp, EpochWork, Scores, Uid};
use bootstrap::{EpochPlan, Metagraph};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::handles::{
    ConsensusHandle, EpochWeights, MergeHandle, MinerWeight, ValidatorHandle, ValidatorMsg, INBOX,
};
use crate::messages::{LossRecord, PipelineGossip};

/// How long after an epoch closes its records are scored: the tails flush their loss
/// records every quarter second, and gossip takes well under a second to spread.
const SCORE_DELAY: Duration = Duration::from_secs(3);

/// Epochs whose records are kept (the one scored next, the one running, one to spare).
const KEEP_EPOCHS: usize = 3;

/// Records kept per epoch: far above what any plan feeds (the router takes each drawn
/// sample once), a bound should that ever change.
const MAX_RECORDS: usize = 1 << 20;

/// What the service needs besides its inbox.
pub(crate) struct ValidatorParts {
    /// The merge service (audits).
    pub(crate) merge: MergeHandle,
    /// The metagraph, for the miners' uids.
    pub(crate) metagraph: Option<Metagraph>,
    /// Where `weights/<epoch>.json` goes.
    pub(crate) data_dir: Option<PathBuf>,
    /// Consensus, which combines the validators' weights (this one's too).
    pub(crate) consensus: ConsensusHandle,
    /// The network, for publishing the weights.
    pub(crate) client: p2p::Client,
    /// The pipeline topic the weights go on.
    pub(crate) topic: String,
    /// This node's peer id.
    pub(crate) me: String,
}

/// Starts the service; it runs until every handle is dropped or the merge service stops.
pub(crate) fn spawn(parts: ValidatorParts) -> (ValidatorHandle, JoinHandle<()>) {
    let (tx, inbox) = mpsc::channel(INBOX);
    let (weights_tx, weights) = watch::channel(None);
    let uids: BTreeMap<String, Uid> = parts
        .metagraph
        .as_ref()
        .map(|m| {
            m.neurons()
                .iter()
                .map(|n| (n.peer_id.to_string(), n.uid))
                .collect()
        })
        .unwrap_or_default();
    let service = Service {
        merge: parts.merge,
        data_dir: parts.data_dir,
        consensus: parts.consensus,
        client: parts.client,
        topic: parts.topic,
        peer: parts.me,
        uids,
        ledger: Ledger::default(),
        scores: Scores::default(),
        weights: weights_tx,
        me: tx.downgrade(),
    };
    let task = tokio::spawn(service.run(inbox));
    (ValidatorHandle { tx, weights }, task)
}

struct Service {
    merge: MergeHandle,
    data_dir: Option<PathBuf>,
    consensus: ConsensusHandle,
    client: p2p::Client,
    topic: String,
    peer: String,
    uids: BTreeMap<String, Uid>,
    ledger: Ledger,
    scores: Scores,
    weights: watch::Sender<Option<EpochWeights>>,
    /// Its own inbox, for the delayed scoring (weak: the service stops with its handles).
    me: mpsc::WeakSender<ValidatorMsg>,
}

impl Service {
    async fn run(mut self, mut inbox: mpsc::Receiver<ValidatorMsg>) {
        while let Some(message) = inbox.recv().await {
            match message {
                ValidatorMsg::EpochClosed { closed, next } => {
                    if closed.epoch >= next.epoch {
                        continue;
                    }
                    let me = self.me.clone();
                    let plan = closed.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(SCORE_DELAY).await;
                        if let Some(me) = me.upgrade() {
                            let _ = me.send(ValidatorMsg::Score(plan)).await;
                        }
                    });
                    if let Err(error) = self.merge.audit(*closed, *next).await {
                        tracing::warn!(%error, "merges not audited");
                        return;
                    }
                }
                ValidatorMsg::Losses { epoch, records } => self.ledger.add(epoch, records),
                ValidatorMsg::Score(plan) => {
                    if self.score(&plan).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    async fn score(&mut self, plan: &EpochPlan) -> Result<(), crate::handles::ServiceGone> {
        let records = self.ledger.take(plan.epoch);
        let weights = weigh(plan, &records, &self.uids, &mut self.scores);
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
        if let Some(dir) = &self.data_dir {
            if let Err(error) = write_weights(&dir.join("weights"), &weights) {
                tracing::warn!(%error, "weights not written");
            }
        }
        let vector: Vec<(u16, u16)> = weights.miners.iter().map(|m| (m.uid, m.weight)).collect();
        self.weights.send_replace(Some(weights));
        if vector.is_empty() {
            return Ok(());
        }
        let message = PipelineGossip::Weights {
            epoch: plan.epoch,
            weights: vector.clone(),
        };
        if let Some(bytes) = message.to_bytes() {
            if let Err(error) = self.client.publish(&self.topic, bytes).await {
                tracing::warn!(%error, "weights not published");
            }
        }
        self.consensus
            .weights(self.peer.clone(), plan.epoch, vector)
            .await
    }
}

/// Writes `<dir>/<epoch>.json` atomically.
fn write_weights(dir: &std::path::Path, weights: &EpochWeights) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.json", weights.epoch));
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(weights)?)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// The loss records of the last few epochs, in the order they were accepted.
#[derive(Default)]
struct Ledger {
    epochs: BTreeMap<u64, Vec<LossRecord>>,
}

impl Ledger {
    fn add(&mut self, epoch: u64, records: Vec<LossRecord>) {
        let kept = self.epochs.entry(epoch).or_default();
        let room = MAX_RECORDS.saturating_sub(kept.len());
        kept.extend(records.into_iter().take(room));
        while self.epochs.len() > KEEP_EPOCHS {
            self.epochs.pop_first();
        }
    }

    fn take(&mut self, epoch: u64) -> Vec<LossRecord> {
        self.epochs.remove(&epoch).unwrap_or_default()
    }
}

/// Scores the miners of `plan`'s epoch from its authenticated loss records and folds the
/// epoch into `scores`; returns the weights. Records naming a peer without a uid in the
/// metagraph (an open-registration miner) are left out: such a miner cannot be weighted
/// on chain. When the CLASP fit cannot run (too few records, a stage whose miners always
/// travel together) no one is flagged and the work alone is scored; the reason is kept.
pub(crate) fn weigh(
    plan: &EpochPlan,
    records: &[LossRecord],
    uids: &BTreeMap<String, Uid>,
    scores: &mut Scores,
) -> EpochWeights {
    let mut usable = Vec::with_capacity(records.len());
    for (order, record) in records.iter().enumerate() {
        let pathway: Option<Vec<Uid>> = record
            .pathway
            .iter()
            .map(|peer| uids.get(peer).copied())
            .collect();
        if let Some(pathway) = pathway {
            usable.push((order as u64, pathway, record));
        }
    }
    // Samples served to completion, per miner and stage.
    let mut served: BTreeMap<Uid, (u32, u64)> = BTreeMap::new();
    for (_, pathway, _) in &usable {
        for (stage, uid) in pathway.iter().enumerate() {
            let entry = served.entry(*uid).or_insert((stage as u32, 0));
            entry.1 += 1;
        }
    }
    let fit: Vec<clasp::Record> = usable
        .iter()
        .map(|(order, pathway, record)| clasp::Record {
            order: *order,
            pathway: pathway.clone(),
            loss: f64::from(record.loss),
        })
        .collect();
    let (effects, fit_error) = match clasp::estimate(&fit, &clasp::Config::default()) {
        Ok(estimate) => (
            estimate
                .miners
                .into_iter()
                .map(|m| (m.miner, m))
                .collect::<BTreeMap<_, _>>(),
            None,
        ),
        Err(error) => (BTreeMap::new(), Some(error.to_string())),
    };
    let work: Vec<EpochWork> = served
        .iter()
        .map(|(uid, (_, samples))| EpochWork {
            uid: *uid,
            samples_completed: *samples,
            flagged: effects.get(uid).is_some_and(|e| e.flagged),
            spot_check_failed: false,
            merge_audit_failed: false,
        })
        .collect();
    if let Err(error) = scores.update(&work) {
        tracing::warn!(%error, "scores not updated");
    }
    let chain: BTreeMap<Uid, u16> = attribution::to_chain(&scores.all())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let peers: BTreeMap<Uid, &String> = uids.iter().map(|(peer, uid)| (*uid, peer)).collect();
    let miners = served
        .iter()
        .map(|(uid, (stage, samples))| {
            let effect = effects.get(uid);
            MinerWeight {
                uid: *uid,
                peer_id: peers.get(uid).map(|p| p.to_string()).unwrap_or_default(),
                stage: *stage,
                samples: *samples,
                effect: effect.map(|e| e.effect),
                standard_error: effect.map(|e| e.standard_error),
                flagged: effect.is_some_and(|e| e.flagged),
                weight: chain.get(uid).copied().unwrap_or(0),
            }
        })
        .collect();
    EpochWeights {
        epoch: plan.epoch,
        records: usable.len() as u64,
        fit_error,
        miners,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(i: u8) -> String {
        bootstrap::PeerIdStr::parse(
            &p2p::identity::Keypair::ed25519_from_bytes([i; 32])
                .unwrap()
                .public()
                .to_peer_id()
                .to_string(),
        )
        .unwrap()
        .to_string()
    }

    fn plan(epoch: u64) -> EpochPlan {
        let run = bootstrap::RunConfig::default();
        let me = bootstrap::PeerIdStr::parse(&peer(100)).unwrap();
        let miners = (0..6)
            .map(|i| bootstrap::PeerIdStr::parse(&peer(i)).unwrap())
            .collect();
        let mut plan = bootstrap::next_plan(&run, &me, None, None, &miners).unwrap();
        plan.epoch = epoch;
        plan
    }

    /// Records over 3 stages × 2 miners (peers 0–5, stage s holding peers 2s and 2s + 1),
    /// pathways cycling through every combination; `harm` adds to the loss of samples that
    /// pass through peer `bad`.
    fn records(n: u64, bad: Option<(String, f32)>) -> Vec<LossRecord> {
        (0..n)
            .map(|i| {
                let pathway: Vec<String> = (0..3u8)
                    .map(|s| peer(2 * s + ((i >> s) & 1) as u8))
                    .collect();
                // A falling trend and a deterministic wobble standing in for noise.
                let mut loss = 3.0 - 0.001 * i as f32 + 0.05 * ((i * 7919 % 13) as f32 / 13.0);
                if let Some((bad, harm)) = &bad {
                    if pathway.contains(bad) {
                        loss += harm;
                    }
                }
                LossRecord {
                    sample: i,
                    pathway,
                    loss,
                }
            })
            .collect()
    }

    fn uids() -> BTreeMap<String, Uid> {
        (0..6u8).map(|i| (peer(i), u16::from(i) + 10)).collect()
    }

    #[test]
    fn a_harmful_miner_is_flagged_and_weighs_nothing_while_the_others_share_the_rest() {
        let bad = peer(3);
        let mut scores = Scores::default();
        let weights = weigh(
            &plan(4),
            &records(400, Some((bad.clone(), 0.5))),
            &uids(),
            &mut scores,
        );
        assert_eq!(weights.epoch, 4);
        assert_eq!(weights.records, 400);
        assert_eq!(weights.fit_error, None);
        assert_eq!(weights.miners.len(), 6);
        for m in &weights.miners {
            assert_eq!(m.samples, 200, "{m:?}");
            if m.peer_id == bad {
                assert!(m.flagged, "{m:?}");
                assert_eq!(m.weight, 0);
                assert!(m.effect.unwrap() > 0.2);
            } else {
                assert!(!m.flagged, "{m:?}");
                assert_eq!(m.weight, u16::MAX, "{m:?}");
            }
        }
    }

    #[test]
    fn honest_work_is_weighed_by_samples_and_unknown_peers_are_left_out() {
        let mut records = records(400, None);
        // A record naming a peer the metagraph does not hold.
        records[0].pathway[1] = peer(50);
        let mut scores = Scores::default();
        let weights = weigh(&plan(1), &records, &uids(), &mut scores);
        assert_eq!(weights.records, 399);
        assert!(weights.miners.iter().all(|m| !m.flagged));
        assert!(weights.miners.iter().all(|m| m.peer_id != peer(50)));
        // Stage 1's peer 2 lost the first record: it served one sample fewer and weighs
        // less than the largest.
        let of = |p: u8| {
            weights
                .miners
                .iter()
                .find(|m| m.peer_id == peer(p))
                .unwrap()
        };
        assert_eq!(of(2).samples, 199);
        assert!(of(2).weight < u16::MAX);
        assert_eq!(of(3).weight, u16::MAX);
    }

    #[test]
    fn too_few_records_still_count_the_work_and_say_why_nothing_was_flagged() {
        let mut scores = Scores::default();
        let weights = weigh(&plan(0), &records(5, None), &uids(), &mut scores);
        assert!(weights.fit_error.is_some());
        assert!(weights
            .miners
            .iter()
            .all(|m| !m.flagged && m.effect.is_none()));
        assert!(weights.miners.iter().any(|m| m.weight == u16::MAX));
    }

    #[test]
    fn the_ledger_keeps_a_few_epochs_and_gives_each_once() {
        let mut ledger = Ledger::default();
        for epoch in 0..5 {
            ledger.add(epoch, records(3, None));
        }
        assert!(ledger.take(0).is_empty(), "the oldest epochs are forgotten");
        assert_eq!(ledger.take(4).len(), 3);
        assert!(ledger.take(4).is_empty(), "an epoch is scored once");
    }
}
