//! The miner service: one task in front of a [`Miner`], taking plans, accepted gossip,
//! authorised requests and clock ticks from its bounded inbox, and publishing the miner's
//! status as a watch value.
//!
//! Requests are answered from tasks of their own (a forward pass must not hold up the next
//! plan). When the stage's compute thread dies, the service stops: its handle then reports
//! the miner gone and the node exits, rather than heartbeating as a miner that fails every
//! sample.

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::Miner;
use crate::services::inbox::INBOX;
use crate::services::miner::api::{MinerHandle, MinerMsg, MinerStatus};

/// Starts the service; `loss_topic` is where the miner's loss records go. It runs until
/// it is told to shut down, every handle is dropped, or the compute thread dies.
pub(crate) fn spawn(miner: Miner, loss_topic: String) -> (MinerHandle, JoinHandle<()>) {
    let (tx, inbox) = mpsc::channel(INBOX);
    let (status_tx, status) = watch::channel(MinerStatus::default());
    let task = tokio::spawn(run(miner, loss_topic, inbox, status_tx));
    (MinerHandle { tx, status }, task)
}

async fn run(
    miner: Miner,
    loss_topic: String,
    mut inbox: mpsc::Receiver<MinerMsg>,
    status: watch::Sender<MinerStatus>,
) {
    while let Some(message) = inbox.recv().await {
        match message {
            MinerMsg::Plan(plan) => {
                miner.on_plan(*plan).await;
                status.send_replace(miner.status());
            }
            MinerMsg::Gossip(message) => miner.on_gossip(&message),
            MinerMsg::Request {
                service,
                body,
                reply,
            } => {
                let miner = miner.clone();
                tokio::spawn(async move {
                    let _ = reply.send(miner.on_request(service, body).await);
                });
            }
            MinerMsg::Tick { live } => {
                if !miner.compute_alive() {
                    tracing::error!("the stage's compute thread stopped; the miner stops");
                    break;
                }
                miner.tick();
                miner.set_live(live);
                let flushing = miner.clone();
                let topic = loss_topic.clone();
                tokio::spawn(async move { flushing.flush_losses(&topic).await });
                status.send_replace(miner.status());
            }
            MinerMsg::Shutdown { grace, done } => {
                miner.shutdown(grace).await;
                let _ = done.send(());
                return;
            }
        }
    }
    // Stopped for a dead compute thread, or every handle dropped: free the stage.
    miner.shutdown(std::time::Duration::from_secs(5)).await;
}
