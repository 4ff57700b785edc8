//! The consensus service: one task that owns the node's [`Orchestration`], takes heartbeats,
//! plans and clock ticks from its bounded inbox, answers each with its verdict, publishes the
//! election and the plan in force as a watch value, and publishes this node's own plans when
//! it orchestrates.

use std::time::SystemTime;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Orchestration;
use crate::services::consensus::api::{ConsensusHandle, ConsensusMsg, ConsensusView};
use crate::services::inbox::INBOX;

/// Starts the service; it runs until every handle is dropped.
pub(crate) fn spawn(
    orchestration: Orchestration,
    client: p2p::Client,
    plan_topic: String,
) -> (ConsensusHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(INBOX);
    let (view_tx, view) = watch::channel(view_of(&orchestration));
    let task = tokio::spawn(run(orchestration, client, plan_topic, rx, view_tx));
    (ConsensusHandle { tx, view }, task)
}

async fn run(
    mut orchestration: Orchestration,
    client: p2p::Client,
    plan_topic: String,
    mut inbox: mpsc::Receiver<ConsensusMsg>,
    view: watch::Sender<ConsensusView>,
) {
    let started = Instant::now();
    while let Some(message) = inbox.recv().await {
        match message {
            ConsensusMsg::Heartbeat {
                author,
                beat,
                wall_ms,
                reply,
            } => {
                let verdict =
                    orchestration.on_heartbeat(&author, &beat, started.elapsed(), wall_ms);
                let _ = reply.send(verdict);
            }
            ConsensusMsg::Plan {
                author,
                data,
                reply,
            } => {
                let outcome = orchestration.on_plan(&author, &data, started.elapsed());
                // The view changes before the verdict goes out: whoever hears "accepted"
                // reads the new plan.
                publish(&view, &orchestration);
                let _ = reply.send(outcome);
            }
            ConsensusMsg::Weights {
                validator,
                epoch,
                weights,
            } => {
                orchestration.on_weights(validator, epoch, weights);
                publish(&view, &orchestration);
            }
            ConsensusMsg::OwnBinding { binding, wall_ms } => {
                orchestration.on_own_binding(&binding, wall_ms);
                publish(&view, &orchestration);
            }
            ConsensusMsg::ChainStake(stake) => {
                orchestration.on_chain_stake(*stake);
                publish(&view, &orchestration);
            }
            ConsensusMsg::Tick { progress } => {
                let plan = orchestration.tick(started.elapsed(), SystemTime::now(), progress);
                publish(&view, &orchestration);
                if let Some(bytes) = plan {
                    // Published from a task: the inbox keeps moving while the network
                    // loop is busy.
                    let client = client.clone();
                    let topic = plan_topic.clone();
                    tokio::spawn(async move {
                        if let Err(error) = client.publish(&topic, bytes).await {
                            tracing::warn!(%error, "plan not published");
                        }
                    });
                }
            }
        }
    }
}

/// Updates the watch value when the election or the plan in force changed.
fn publish(view: &watch::Sender<ConsensusView>, orchestration: &Orchestration) {
    view.send_if_modified(|current| {
        let epoch = orchestration.epoch();
        let orchestrator = orchestration.orchestrator().map(|p| p.to_string());
        let weights = orchestration.consensus_weights();
        if current.epoch() == epoch
            && current.orchestrator == orchestrator
            && current.weights.as_ref() == weights
            && current.metagraph_generation == orchestration.metagraph_generation()
        {
            return false;
        }
        *current = view_of(orchestration);
        true
    });
}

fn view_of(orchestration: &Orchestration) -> ConsensusView {
    ConsensusView {
        run_hash: orchestration.run_hash().to_hex(),
        current: orchestration.current().cloned(),
        orchestrator: orchestration.orchestrator().map(|p| p.to_string()),
        is_orchestrator: orchestration.is_orchestrator(),
        validators: orchestration.validators(),
        stage: orchestration.stage(),
        weights: orchestration.consensus_weights().cloned(),
        uids: orchestration.uids(),
        metagraph_generation: orchestration.metagraph_generation(),
        bindings: orchestration.bindings(),
        bound_hotkeys: orchestration.bound_hotkeys(),
    }
}
