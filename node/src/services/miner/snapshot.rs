//! The stage's merged snapshot: what a replica keeps of its last merge, serves in chunks to a
//! miner that joins or restarts, and what such a miner loads, checked against the merge hash
//! the stage's members gossiped.
//!
//! A replica keeps the weights its last merge produced (or that it started the epoch from),
//! not its live weights, which an optimizer step changes every sample: only the snapshot
//! hashes to the gossiped merge hash. Chunks of at most [`CHUNK_VALUES`] values keep every
//! reply far below the request-response frame limit whatever the stage's size.
//!
//! When the run takes an outer step ([`training::outer`]), the snapshot is also the basis of
//! the next one and carries the outer momentum: a replica serves the weights followed by the
//! momentum as one vector of twice the stage's length. The weights are checked against the
//! merge hash; the momentum by the basis vote of the next merge, which falls back to the
//! plain average when any member's differs.

use std::sync::Arc;
use std::time::Duration;

use bootstrap::EpochPlan;

use super::context::Ctx;
use super::{lock, HOP_TIMEOUT};
use crate::services::validator::api::{decide, Decision};
use crate::wire::messages::{
    self, ConfirmationReply, ConfirmationRequest, Service, WeightsReply, WeightsRequest,
};

/// Values per chunk: 16 MiB of f32, a quarter of the 64 MiB frame limit.
pub(crate) const CHUNK_VALUES: u64 = 1 << 22;

/// How often a joining miner looks for the merge hash it waits for.
const POLL: Duration = Duration::from_millis(100);

/// How long a joining miner waits for the validators' audits of a merge to end.
const CONFIRM_PATIENCE: Duration = Duration::from_secs(30);

/// How long one validator has to answer about a merge.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a joining miner asks again while an audit is running.
const CONFIRM_POLL: Duration = Duration::from_millis(500);

/// A stage's weights as of a merge.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// The stage.
    pub(crate) stage: u32,
    /// The merge they come from (`None`: the run seed's weights).
    pub(crate) epoch: Option<u64>,
    /// blake3 of the values' little-endian bytes, hex.
    pub(crate) hash: String,
    /// The values.
    pub(crate) values: Arc<Vec<f32>>,
    /// The outer momentum as of that merge (`None` when the run takes no outer step).
    pub(crate) momentum: Option<Arc<Vec<f32>>>,
}

/// The weights on which this replica evaluates `stage` for the held-out loss reported at the
/// start of `plan`'s epoch: its snapshot of the merge that closed the epoch before (the run
/// seed's weights in epoch 0). Not its live weights, which have taken optimizer steps since:
/// a reported loss is the loss of the model the run agreed on.
pub(crate) fn eval_weights(
    ctx: &Ctx,
    plan: &EpochPlan,
    stage: u32,
) -> Result<training::stage::GivenWeights, String> {
    let want = plan.epoch.checked_sub(1);
    match lock(&ctx.snapshot).as_ref() {
        Some(s) if s.stage == stage && s.epoch == want => Ok(training::stage::GivenWeights {
            key: s.hash.clone(),
            values: s.values.clone(),
        }),
        Some(s) if s.stage == stage => Err(format!(
            "this replica's snapshot of stage {stage} is of merge {}, not {}",
            merge_name(s.epoch),
            merge_name(want)
        )),
        _ => Err(format!("this replica holds no snapshot of stage {stage}")),
    }
}

fn merge_name(epoch: Option<u64>) -> String {
    match epoch {
        Some(e) => format!("epoch {e}"),
        None => "none (the run seed)".into(),
    }
}

impl Snapshot {
    /// Values `start..end` of what is served: the weights, then the momentum.
    fn served(&self, start: usize, end: usize) -> Vec<f32> {
        let n = self.values.len();
        let mut out = Vec::with_capacity(end.saturating_sub(start));
        out.extend_from_slice(&self.values[start.min(n)..end.min(n)]);
        if let Some(momentum) = &self.momentum {
            let m = momentum.len();
            out.extend_from_slice(
                &momentum[start.saturating_sub(n).min(m)..end.saturating_sub(n).min(m)],
            );
        }
        out
    }

    /// Values served in all.
    fn served_len(&self) -> usize {
        self.values.len() + self.momentum.as_ref().map_or(0, |m| m.len())
    }
}

/// What a joiner loads from a replica.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fetched {
    /// The merge the weights come from.
    pub(crate) epoch: Option<u64>,
    /// The weights (hash-checked).
    pub(crate) values: Vec<f32>,
    /// The outer momentum, when the run keeps one.
    pub(crate) momentum: Option<Vec<f32>>,
}

/// Answers a chunk request from a replica that joins.
pub(crate) fn serve(ctx: &Ctx, body: &[u8]) -> Vec<u8> {
    let not_held =
        || messages::encode(Service::Weights, &WeightsReply::NotHeld, &[]).unwrap_or_default();
    let Ok((request, _)) = messages::decode::<WeightsRequest>(Service::Weights, body) else {
        return not_held();
    };
    let Some(snapshot) = lock(&ctx.snapshot).clone() else {
        return not_held();
    };
    if snapshot.stage != request.stage {
        return not_held();
    }
    let total = snapshot.served_len() as u64;
    let offset = request.offset.min(total);
    let end = offset
        .saturating_add(request.count.min(CHUNK_VALUES))
        .min(total);
    let chunk = snapshot.served(offset as usize, end as usize);
    let payload = messages::f32_bytes(&chunk);
    messages::encode(
        Service::Weights,
        &WeightsReply::Weights {
            stage: snapshot.stage,
            epoch: snapshot.epoch,
            hash: snapshot.hash,
            total,
            offset,
        },
        &payload,
    )
    .unwrap_or_default()
}

/// Why no merge hash came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoHash {
    /// None within the patience given (or the members disagree).
    NotHeard,
    /// A newer plan moved this miner to another stage meanwhile: the stage waited for is
    /// no longer the one to build.
    Superseded,
}

/// What [`merged_hash`] looks at: the hashes heard and the newest plan, at one moment.
pub(crate) struct HashView<'a> {
    /// Latest merge hash gossiped per stage: (epoch, hash).
    pub(crate) merge_hashes: &'a std::collections::BTreeMap<u32, (u64, String)>,
    /// (epoch, stage) merges whose members disagree.
    pub(crate) merge_conflicts: &'a std::collections::BTreeSet<(u64, u32)>,
    /// The newest plan's epoch and the stage it gives this miner.
    pub(crate) newest: (u64, Option<u32>),
}

/// One look at what is known: `Some(Ok(hash))` of the newest merge of `stage` at or after
/// `epoch`, `Some(Err(..))` when waiting on is pointless, `None` to keep waiting.
///
/// A hash already heard wins over a newer plan: in short epochs the hash of one merge
/// arrives with the next plan, and a joiner that gave up on every newer plan would chase
/// the run forever. A newer plan stops the wait only when it moves this miner off `stage`.
pub(crate) fn look(view: &HashView<'_>, stage: u32, epoch: u64) -> Option<Result<String, NoHash>> {
    if let Some((e, hash)) = view.merge_hashes.get(&stage) {
        if *e >= epoch {
            // Members that disagree: trust none of them.
            if view.merge_conflicts.contains(&(*e, stage)) {
                return Some(Err(NoHash::NotHeard));
            }
            return Some(Ok(hash.clone()));
        }
    }
    let (newest, newest_stage) = view.newest;
    if newest > epoch.saturating_add(1) && newest_stage != Some(stage) {
        return Some(Err(NoHash::Superseded));
    }
    None
}

/// The merge hash of `stage` for the merge that closed `epoch` (or a later one), waiting up
/// to `patience` for the members' gossip (a miner that joins as the merge runs hears it
/// when it ends).
pub(crate) async fn merged_hash(
    ctx: &Ctx,
    stage: u32,
    epoch: u64,
    patience: Duration,
) -> Result<String, NoHash> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let seen = {
            let news = ctx.views.news.borrow();
            look(
                &HashView {
                    merge_hashes: &news.merge_hashes,
                    merge_conflicts: &news.merge_conflicts,
                    newest: news.newest,
                },
                stage,
                epoch,
            )
        };
        if let Some(outcome) = seen {
            return outcome;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(NoHash::NotHeard);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Asks the run's validators (every one at once) about the merge of `stage` that closed
/// `epoch`, whose members gossiped `expected`, until one confirms it, all have answered for
/// good, or [`CONFIRM_PATIENCE`] passes (then: unconfirmed).
pub(crate) async fn confirm(ctx: &Arc<Ctx>, stage: u32, epoch: u64, expected: &str) -> Decision {
    let deadline = tokio::time::Instant::now() + CONFIRM_PATIENCE;
    loop {
        let validators: Vec<p2p::PeerId> = ctx
            .consensus
            .borrow()
            .validators
            .iter()
            .filter(|v| v.as_str() != ctx.me.as_str())
            .filter_map(crate::wire::peer::to_libp2p)
            .collect();
        let mut asking = tokio::task::JoinSet::new();
        for validator in validators {
            let client = ctx.client.clone();
            asking.spawn(async move {
                let request = ConfirmationRequest { epoch, stage };
                let body = messages::encode(Service::Confirmation, &request, &[]).ok()?;
                let reply = tokio::time::timeout(CONFIRM_TIMEOUT, client.request(validator, body))
                    .await
                    .ok()?
                    .ok()?;
                let (answer, _) =
                    messages::decode::<ConfirmationReply>(Service::Confirmation, &reply).ok()?;
                Some((validator.to_string(), answer))
            });
        }
        let mut answers = Vec::new();
        while let Some(done) = asking.join_next().await {
            if let Ok(Some(answer)) = done {
                answers.push(answer);
            }
        }
        match decide(&answers, expected) {
            Decision::Wait if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(CONFIRM_POLL).await;
            }
            Decision::Wait => return Decision::Unconfirmed,
            decided => return decided,
        }
    }
}

/// The hash of the merge closing `epoch` (or a later one) of `stage`, asked of its replicas
/// in `plan` when the members' gossip was not heard: trusted only when every replica that
/// answers names the same one.
pub(crate) async fn ask_hash(
    ctx: &Arc<Ctx>,
    plan: &EpochPlan,
    stage: u32,
    epoch: u64,
) -> Option<String> {
    let mut answers = Vec::new();
    for peer_id in other_replicas(ctx, plan, stage) {
        // A request for no values: the reply's header names the snapshot.
        let request = WeightsRequest {
            stage,
            offset: 0,
            count: 0,
        };
        let Ok(body) = messages::encode(Service::Weights, &request, &[]) else {
            continue;
        };
        let Ok(Ok(reply)) =
            tokio::time::timeout(HOP_TIMEOUT, ctx.client.request(peer_id, body)).await
        else {
            continue;
        };
        if let Ok((
            WeightsReply::Weights {
                stage: served,
                epoch,
                hash,
                ..
            },
            _,
        )) = messages::decode::<WeightsReply>(Service::Weights, &reply)
        {
            if served == stage {
                answers.push((epoch, hash));
            }
        }
    }
    let agreed = agreed_hash(&answers, epoch);
    match &agreed {
        Some(hash) => {
            tracing::info!(stage, epoch, %hash, replicas = answers.len(), "merge hash asked of the replicas")
        }
        None => tracing::warn!(
            stage,
            epoch,
            ?answers,
            "the replicas named no merge hash they agree on"
        ),
    }
    agreed
}

/// The hash every answer names, when all of them hold a merge at or after `epoch`.
fn agreed_hash(answers: &[(Option<u64>, String)], epoch: u64) -> Option<String> {
    let first = answers.first()?;
    (first.0.is_some_and(|e| e >= epoch) && answers.iter().all(|a| a == first))
        .then(|| first.1.clone())
}

/// The peer ids of `stage`'s replicas in `plan` other than this miner.
fn other_replicas<'a>(
    ctx: &'a Ctx,
    plan: &'a EpochPlan,
    stage: u32,
) -> impl Iterator<Item = p2p::PeerId> + 'a {
    plan.miners_of(stage)
        .filter(|peer| **peer != ctx.me)
        .filter_map(crate::wire::peer::to_libp2p)
}

/// Loads the snapshot hashing to `expected` from a replica of `stage` in `plan`, chunk by
/// chunk (with the outer momentum when the run keeps one); `None` when no replica serves
/// it whole.
pub(crate) async fn fetch(
    ctx: &Arc<Ctx>,
    plan: &EpochPlan,
    stage: u32,
    expected: &str,
    len: usize,
) -> Option<Fetched> {
    for peer in other_replicas(ctx, plan, stage) {
        match fetch_from(ctx, peer, stage, expected, len).await {
            Ok(found) => return Some(found),
            Err(why) => tracing::warn!(%peer, why, "no snapshot from this replica"),
        }
    }
    None
}

/// The snapshot from one replica, or why not.
async fn fetch_from(
    ctx: &Ctx,
    peer: p2p::PeerId,
    stage: u32,
    expected: &str,
    len: usize,
) -> Result<Fetched, &'static str> {
    let outer = !ctx.cfg.run.outer_is_plain();
    let weights_len = len;
    // Weights, then the momentum when the run keeps one.
    let len = if outer { 2 * len } else { len };
    let mut values: Vec<f32> = Vec::new();
    let mut merged_epoch = None;
    while values.len() < len {
        let request = WeightsRequest {
            stage,
            offset: values.len() as u64,
            count: CHUNK_VALUES,
        };
        let body =
            messages::encode(Service::Weights, &request, &[]).map_err(|_| "request not encoded")?;
        let reply = match tokio::time::timeout(HOP_TIMEOUT, ctx.client.request(peer, body)).await {
            Ok(Ok(reply)) => reply,
            _ => return Err("no answer"),
        };
        let (header, payload) = messages::decode::<WeightsReply>(Service::Weights, &reply)
            .map_err(|_| "malformed reply")?;
        let WeightsReply::Weights {
            epoch,
            hash,
            total,
            offset,
            stage: served,
        } = header
        else {
            return Err("does not hold the stage");
        };
        // Checked before anything is kept: the run's size, this chunk, the hash wanted.
        if served != stage || total != len as u64 || offset != values.len() as u64 {
            return Err("chunk out of place");
        }
        if hash != expected {
            return Err("holds another snapshot");
        }
        messages::append_f32_chunk(&mut values, payload, len)?;
        merged_epoch = epoch;
    }
    let momentum = outer.then(|| values.split_off(weights_len));
    if super::hex(&training::stage::hash_f32(&values)) != expected {
        return Err("snapshot does not match the merge hash");
    }
    Ok(Fetched {
        epoch: merged_epoch,
        values,
        momentum,
    })
}

/// Keeps `values` (and the outer momentum `momentum`) as the stage's snapshot.
pub(crate) fn keep(
    ctx: &Ctx,
    stage: u32,
    epoch: Option<u64>,
    hash: String,
    values: Vec<f32>,
    momentum: Option<Vec<f32>>,
) {
    *lock(&ctx.snapshot) = Some(Snapshot {
        stage,
        epoch,
        hash,
        values: Arc::new(values),
        momentum: momentum.map(Arc::new),
    });
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::{agreed_hash, look, HashView, NoHash};

    fn view<'a>(
        hashes: &'a BTreeMap<u32, (u64, String)>,
        conflicts: &'a BTreeSet<(u64, u32)>,
        newest: (u64, Option<u32>),
    ) -> HashView<'a> {
        HashView {
            merge_hashes: hashes,
            merge_conflicts: conflicts,
            newest,
        }
    }

    #[test]
    fn a_hash_heard_wins_over_a_newer_plan_on_the_same_stage() {
        // The joiner built for plan 7 waits for the merge closing 6; plan 8 arrived with
        // the hash of 6 (short epochs): it loads that hash instead of starting again.
        let hashes = BTreeMap::from([(1, (6, "h6".to_string()))]);
        let none = BTreeSet::new();
        assert_eq!(
            look(&view(&hashes, &none, (8, Some(1))), 1, 6),
            Some(Ok("h6".into()))
        );
        // A later merge's hash is the newer state: taken too.
        let later = BTreeMap::from([(1, (9, "h9".to_string()))]);
        assert_eq!(
            look(&view(&later, &none, (10, Some(1))), 1, 6),
            Some(Ok("h9".into()))
        );
    }

    #[test]
    fn newer_plans_on_the_same_stage_keep_the_wait_going() {
        let empty = BTreeMap::new();
        let none = BTreeSet::new();
        assert_eq!(look(&view(&empty, &none, (7, Some(1))), 1, 6), None);
        assert_eq!(look(&view(&empty, &none, (30, Some(1))), 1, 6), None);
        let old = BTreeMap::from([(1, (5, "h5".to_string()))]);
        assert_eq!(look(&view(&old, &none, (9, Some(1))), 1, 6), None);
    }

    #[test]
    fn a_plan_that_moves_the_miner_ends_the_wait() {
        let empty = BTreeMap::new();
        let none = BTreeSet::new();
        assert_eq!(
            look(&view(&empty, &none, (8, Some(2))), 1, 6),
            Some(Err(NoHash::Superseded))
        );
        assert_eq!(
            look(&view(&empty, &none, (8, None)), 1, 6),
            Some(Err(NoHash::Superseded))
        );
        // The plan right after the awaited merge is the one being built for: no news.
        assert_eq!(look(&view(&empty, &none, (7, Some(2))), 1, 6), None);
    }

    #[test]
    fn a_hash_asked_of_the_replicas_counts_only_when_all_answers_agree_and_are_fresh() {
        let h = |e: Option<u64>, s: &str| (e, s.to_string());
        assert_eq!(
            agreed_hash(&[h(Some(6), "a"), h(Some(6), "a")], 6),
            Some("a".into())
        );
        assert_eq!(agreed_hash(&[h(Some(7), "b")], 6), Some("b".into()));
        // Two replicas that disagree, on the hash or on the merge: neither.
        assert_eq!(agreed_hash(&[h(Some(6), "a"), h(Some(6), "b")], 6), None);
        assert_eq!(agreed_hash(&[h(Some(6), "a"), h(Some(7), "a")], 6), None);
        // Older than the merge wanted, the seed's weights, or no answer at all.
        assert_eq!(agreed_hash(&[h(Some(5), "a")], 6), None);
        assert_eq!(agreed_hash(&[h(None, "a")], 0), None);
        assert_eq!(agreed_hash(&[], 6), None);
    }

    #[test]
    fn members_that_disagree_are_not_trusted() {
        let hashes = BTreeMap::from([(1, (6, "h6".to_string()))]);
        let conflict = BTreeSet::from([(6, 1)]);
        assert_eq!(
            look(&view(&hashes, &conflict, (7, Some(1))), 1, 6),
            Some(Err(NoHash::NotHeard))
        );
    }
}
