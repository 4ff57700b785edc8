//! The validator service: what a `--validator` node does beyond consensus. Today it audits
//! the butterfly merges that close each epoch (recomputing a sample of every stage's
//! partitions through the merge service); scoring the miners' work and setting weights build
//! on this service.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::handles::{MergeHandle, ValidatorHandle, ValidatorMsg, INBOX};

/// Starts the service; it runs until every handle is dropped or the merge service stops.
pub(crate) fn spawn(merge: MergeHandle) -> (ValidatorHandle, JoinHandle<()>) {
    let (tx, mut inbox) = mpsc::channel(INBOX);
    let task = tokio::spawn(async move {
        while let Some(message) = inbox.recv().await {
            match message {
                ValidatorMsg::EpochClosed { closed, next } => {
                    if closed.epoch >= next.epoch {
                        continue;
                    }
                    if let Err(error) = merge.audit(*closed, *next).await {
                        tracing::warn!(%error, "merges not audited");
                        return;
                    }
                }
            }
        }
    });
    (ValidatorHandle { tx }, task)
}
