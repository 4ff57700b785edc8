//! The reporter: one long-lived task that tells the network loop the verdict on each gossip
//! message and answers refused requests, in order, through a bounded channel.
//!
//! gossipsub waits for a verdict on every message it delivered (and relays it only on
//! `Accept`), so every gossip message gets exactly one report. The router does not wait on
//! the network loop itself — that loop may be busy moving tensors while requests queue
//! behind it — but hands the report here; when [`REPORTS`] reports are waiting, the router
//! waits for room (backpressure instead of a task per verdict).

use p2p::{GossipId, RequestId};
use tokio::sync::mpsc;

use crate::wire::rpc;

/// Reports that may wait for the network loop.
const REPORTS: usize = 1024;

/// One thing to tell the network loop.
#[derive(Debug)]
enum Report {
    /// The verdict on a gossip message.
    Verdict { id: GossipId, verdict: p2p::Verdict },
    /// An error answer to a refused request.
    Refusal { id: RequestId, code: rpc::ErrorCode },
}

/// The router's side of the reporter; the task ends once this is dropped and the reports
/// queued before are out.
pub(crate) struct Reporter {
    tx: mpsc::Sender<Report>,
}

impl Reporter {
    /// Starts the reporter task on `client`.
    pub(crate) fn spawn(client: p2p::Client) -> Reporter {
        let (tx, rx) = mpsc::channel(REPORTS);
        tokio::spawn(run(client, rx));
        Reporter { tx }
    }

    /// Reports the verdict on gossip message `id`.
    pub(crate) async fn verdict(&self, id: GossipId, verdict: p2p::Verdict) {
        self.send(Report::Verdict { id, verdict }).await;
    }

    /// Answers request `id` with the error `code`.
    pub(crate) async fn refuse(&self, id: RequestId, code: rpc::ErrorCode) {
        self.send(Report::Refusal { id, code }).await;
    }

    async fn send(&self, report: Report) {
        if self.tx.send(report).await.is_err() {
            // The task only ends when the network loop has stopped, and the node with it.
            tracing::debug!("reporter stopped: report dropped");
        }
    }
}

async fn run(client: p2p::Client, mut reports: mpsc::Receiver<Report>) {
    while let Some(report) = reports.recv().await {
        match report {
            Report::Verdict { id, verdict } => {
                if let Err(error) = client.report(id, verdict).await {
                    tracing::debug!(%error, "gossip verdict not reported");
                }
            }
            Report::Refusal { id, code } => {
                let _ = client.respond(id, rpc::error_response(code)).await;
            }
        }
    }
}
