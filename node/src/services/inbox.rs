//! The plumbing every service's handle uses: a bounded inbox ([`INBOX`] messages; a sender
//! waits when it is full, so a slow service slows the router instead of growing a queue), and
//! [`ServiceGone`], which a handle answers once its service has stopped (the node stops on it).

use tokio::sync::{mpsc, oneshot};

/// Messages each service's inbox holds before its senders wait.
pub(crate) const INBOX: usize = 256;

/// The service behind a handle has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the {0} service has stopped")]
pub(crate) struct ServiceGone(pub(crate) &'static str);

/// Sends `message` to a service's inbox, waiting while the inbox is full.
pub(crate) async fn send<M>(
    tx: &mpsc::Sender<M>,
    name: &'static str,
    message: M,
) -> Result<(), ServiceGone> {
    tx.send(message).await.map_err(|_| ServiceGone(name))
}

/// Sends a message carrying a reply channel and waits for the reply.
pub(crate) async fn ask<M, R>(
    tx: &mpsc::Sender<M>,
    name: &'static str,
    message: impl FnOnce(oneshot::Sender<R>) -> M,
) -> Result<R, ServiceGone> {
    let (reply, answer) = oneshot::channel();
    send(tx, name, message(reply)).await?;
    answer.await.map_err(|_| ServiceGone(name))
}
