//! One running node: its settings, the services it starts ([`services`]), and the loop that
//! drives them until SIGINT or SIGTERM.
//!
//! Owns nothing that blocks: tensor work lives on compute threads, the swarm in the p2p event
//! loop, the heartbeat in a task of its own ([`heartbeat`]). The loop feeds the router the
//! network's events, hands it each new plan consensus agreed, and ticks the services
//! ([`tick`]); it stops on a signal, when the network stops, or when a service has gone.

pub(crate) mod heartbeat;
pub(crate) mod identity;
pub(crate) mod join;
pub(crate) mod open_files;
pub(crate) mod services;
pub(crate) mod settings;
pub(crate) mod tick;

use std::io::Write;

use p2p::{Event, Multiaddr, PeerId};

use crate::cli::NodeArgs;
use crate::router::Next;
use crate::services::inbox::ServiceGone;
use services::Node;
use settings::NodeSettings;

/// Runs a node until a shutdown signal. Returns once everything it started has stopped.
pub(crate) async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let settings = NodeSettings::from_args(&args)?;
    let identity = identity::of_node(settings.data_dir.as_deref())?;
    let mut node = services::start(settings, identity).await?;
    let outcome = drive(&mut node).await;
    node.stop(outcome).await
}

/// The node's loop: until a signal, the network's end, or a service gone.
async fn drive(node: &mut Node) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(tick::TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let mut consensus_changes = node.consensus.view.clone();
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                return Ok(());
            }
            ended = &mut node.heartbeat => {
                return Err(match ended {
                    Ok(Err(gone)) => gone.into(),
                    Ok(Ok(())) | Err(_) => anyhow::anyhow!("the heartbeat task stopped"),
                });
            }
            _ = tick.tick() => on_tick(node).await?,
            changed = consensus_changes.changed() => {
                if changed.is_err() {
                    return Err(ServiceGone("consensus").into());
                }
                node.router.adopt_current().await?;
            }
            event = node.events.recv() => {
                let Some(event) = event else {
                    tracing::warn!("network event loop stopped");
                    return Ok(());
                };
                if let Event::NewListenAddr(addr) = &event {
                    announce_listen_addr(node, addr);
                }
                if let Next::Stop(error) = node.router.on_event(event).await {
                    return Err(error);
                }
            }
        }
    }
}

/// One tick: stop when the miner's compute thread has died, else tick the services.
async fn on_tick(node: &mut Node) -> anyhow::Result<()> {
    if let Some(miner) = &node.miner {
        if !miner.alive() {
            anyhow::bail!(
                "the stage's compute thread stopped (see the log above); restart the node to rebuild the stage from its checkpoint"
            );
        }
    }
    tick::on_tick(
        &mut node.router,
        &node.consensus,
        node.miner.as_ref(),
        &node.me,
        &node.metrics,
        &node.view,
    )
    .await?;
    Ok(())
}

/// Prints `LISTEN <address>/p2p/<peer>` (what tests and operators read) and shows it in
/// `/status`.
fn announce_listen_addr(node: &Node, addr: &Multiaddr) {
    let full = with_peer_id(addr.clone(), node.peer_id);
    println!("LISTEN {full}");
    let _ = std::io::stdout().flush();
    node.view
        .send_modify(|v| v.listen_addrs.push(full.to_string()));
}

/// `addr` with `/p2p/<peer>` appended unless it already names a peer.
fn with_peer_id(addr: Multiaddr, peer: PeerId) -> Multiaddr {
    match addr.iter().last() {
        Some(p2p::multiaddr::Protocol::P2p(_)) => addr,
        _ => addr.with(p2p::multiaddr::Protocol::P2p(peer)),
    }
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "no SIGTERM handler; only SIGINT stops the node");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
