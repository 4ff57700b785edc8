//! The clock-driven part of a node's loop, every [`TICK`]: the miner's deadlines and live
//! peers, the plans waiting for the election, the election and the orchestrator's plans, and
//! the node's metrics and `/status` view refreshed from what consensus agreed.

use std::collections::BTreeSet;
use std::time::Duration;

use bootstrap::PeerIdStr;
use tokio::sync::watch;

use crate::metrics::NodeMetrics;
use crate::router::Router;
use crate::services::consensus::api::{ConsensusHandle, ConsensusView};
use crate::services::inbox::ServiceGone;
use crate::services::miner::api::MinerHandle;
use crate::services::observe::api::NodeView;

/// How often the election is ticked.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// The clock-driven part of the loop: the miner's deadlines, the plans waiting for the
/// election, the election and the orchestrator's plans, and the status view refreshed.
pub(crate) async fn on_tick(
    router: &mut Router,
    consensus: &ConsensusHandle,
    miner: Option<&MinerHandle>,
    me: &PeerIdStr,
    metrics: &NodeMetrics,
    view: &watch::Sender<NodeView>,
) -> Result<(), ServiceGone> {
    let agreed = consensus.view();
    if let Some(miner) = miner {
        let live_now: BTreeSet<PeerIdStr> = agreed
            .live
            .peers
            .iter()
            .cloned()
            .chain(std::iter::once(me.clone()))
            .collect();
        miner.tick(std::sync::Arc::new(live_now)).await?;
    }
    router.retry_pending_plans().await?;
    consensus.tick().await?;
    publish(&agreed, metrics, view);
    Ok(())
}

/// The node's metrics and `/status` view, from what consensus agreed.
fn publish(agreed: &ConsensusView, metrics: &NodeMetrics, view: &watch::Sender<NodeView>) {
    let stage_sizes = agreed
        .current
        .as_ref()
        .map(|p| bootstrap::stage_sizes(&p.assignment, p.stages))
        .unwrap_or_default();
    let stage_map: Vec<Vec<String>> = agreed
        .current
        .as_ref()
        .map(|p| {
            (0..p.stages)
                .map(|s| p.miners_of(s).map(|m| m.to_string()).collect())
                .collect()
        })
        .unwrap_or_default();
    let epoch_samples = agreed.current.as_ref().map(|p| p.epoch_samples);
    let epoch = agreed.epoch();
    metrics
        .epoch
        .set(epoch.map_or(-1, |e| i64::try_from(e).unwrap_or(i64::MAX)));
    metrics
        .is_orchestrator
        .set(i64::from(agreed.is_orchestrator));
    let epochs = agreed.epochs.to_vec();
    if let Some(weights) = &agreed.weights {
        metrics.set_weights(
            weights.miners.iter().map(|m| (m.peer_id.clone(), m.weight)),
            weights
                .validators
                .iter()
                .map(|v| (v.peer_id.clone(), v.trust)),
        );
    }
    view.send_modify(|v| {
        v.consensus_epoch = agreed.weights.as_ref().map(|w| w.epoch);
        v.weights = agreed.weights.clone();
        v.epochs = epochs;
        v.orchestrator = agreed.orchestrator.clone();
        v.is_orchestrator = agreed.is_orchestrator;
        v.epoch = epoch;
        v.stage = agreed.stage;
        v.stage_sizes = stage_sizes;
        v.stage_map = stage_map;
        v.epoch_samples = epoch_samples;
        if agreed.metagraph_generation != v.metagraph_generation {
            v.metagraph_generation = agreed.metagraph_generation;
            v.bindings = agreed.bindings.clone();
            v.uids = agreed.uids.clone();
        }
    });
}
