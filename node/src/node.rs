//! One running node: the network client, heartbeats, the live-peer view and the HTTP face.
//!
//! Owns nothing that blocks: tensor work lives on compute threads, the swarm in the p2p event
//! loop. This task reacts to network events and timers, and stops on SIGINT or SIGTERM.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use p2p::{identity::Keypair, Event, Heartbeat, LiveView, Multiaddr, Role};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::cli::NodeArgs;
use crate::status::{NodeView, StatusSource};

/// How long a peer stays live without a fresh heartbeat.
const LIVENESS_EXPIRY: Duration = Duration::from_secs(5);

/// The gossip topic that carries heartbeats of a run.
pub(crate) fn heartbeat_topic(run: &str) -> String {
    format!("iota/{run}/heartbeat/1")
}

/// Runs a node until a shutdown signal. Returns once everything it started has stopped.
pub(crate) async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let keypair = match &args.data_dir {
        Some(dir) => crate::identity::load_or_create(dir)?,
        None => Keypair::generate_ed25519(),
    };
    let local_peer_id = keypair.public().to_peer_id();
    let role = if args.validator {
        Role::Validator
    } else {
        Role::Miner
    };
    let run_name = "iota-local".to_string();
    let topic = heartbeat_topic(&run_name);

    let mut registry = Registry::default();
    let p2p_metrics = p2p::Metrics::new(&mut registry);
    let config = p2p::Config {
        listen: args.listen.clone(),
        bootstrap: args.bootstrap.clone(),
        topics: vec![topic.clone()],
        ..p2p::Config::default()
    };
    let (client, mut events, event_loop) =
        p2p::spawn(keypair, config, p2p_metrics).context("starting the network")?;
    tracing::info!(peer = %local_peer_id, ?role, "node started");

    let view = Arc::new(Mutex::new(NodeView::default()));
    let status = StatusSource {
        client: client.clone(),
        role: role_name(role),
        view: view.clone(),
    };
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http = match args.metrics {
        Some(addr) => {
            let (bound, task) = crate::http::serve(addr, Arc::new(registry), status, async {
                let _ = http_stopped.await;
            })
            .await?;
            tracing::info!(%bound, "serving /metrics and /status");
            println!("METRICS http://{bound}");
            let _ = std::io::stdout().flush();
            Some(task)
        }
        None => None,
    };

    let mut live = LiveView::new(LIVENESS_EXPIRY);
    let mut heartbeat = tokio::time::interval(Duration::from_secs_f64(args.heartbeat_secs));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counter = 0u64;
    let mut shutdown = std::pin::pin!(shutdown_signal());

    loop {
        tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                break;
            }
            _ = heartbeat.tick() => {
                counter += 1;
                let beat = Heartbeat {
                    peer_id: local_peer_id.to_string(),
                    role,
                    counter,
                    run_hash: String::new(),
                    epoch: None,
                    stage: None,
                };
                if let Err(error) = client.publish(&topic, beat.to_bytes()).await {
                    tracing::debug!(%error, "heartbeat not published");
                }
                let now = Instant::now().into_std();
                update_view(&view, |v| {
                    v.heartbeats_sent = counter;
                    v.live_peers = sorted_live(&live, now);
                });
            }
            event = events.recv() => {
                let Some(event) = event else {
                    tracing::warn!("network event loop stopped");
                    break;
                };
                match event {
                    Event::NewListenAddr(addr) => {
                        let full = with_peer_id(addr, local_peer_id);
                        println!("LISTEN {full}");
                        let _ = std::io::stdout().flush();
                        update_view(&view, |v| v.listen_addrs.push(full.to_string()));
                    }
                    Event::Gossip { author, topic: t, data } if t == topic => {
                        match Heartbeat::from_bytes(&data) {
                            Ok(beat) if beat.peer_id == author.to_string() => {
                                live.observe(author, beat, Instant::now().into_std());
                            }
                            Ok(_) => tracing::debug!(peer = %author, "heartbeat names another peer"),
                            Err(error) => tracing::debug!(peer = %author, %error, "malformed heartbeat"),
                        }
                    }
                    Event::Request { peer, id, .. } => {
                        tracing::debug!(%peer, "request for a protocol this node does not serve yet");
                        let _ = client.respond(id, Vec::new()).await;
                    }
                    _ => {}
                }
            }
        }
    }

    client.shutdown().await;
    if let Err(error) = event_loop.await {
        tracing::warn!(%error, "network event loop ended badly");
    }
    let _ = stop_http.send(());
    if let Some(task) = http {
        let _ = task.await;
    }
    Ok(())
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Miner => "miner",
        Role::Validator => "validator",
    }
}

fn sorted_live(live: &LiveView, now: std::time::Instant) -> Vec<String> {
    let mut peers: Vec<String> = live
        .live(now)
        .iter()
        .map(|(peer, _)| peer.to_string())
        .collect();
    peers.sort();
    peers
}

fn update_view(view: &Mutex<NodeView>, f: impl FnOnce(&mut NodeView)) {
    match view.lock() {
        Ok(mut guard) => f(&mut guard),
        Err(poisoned) => f(&mut poisoned.into_inner()),
    }
}

/// `addr` with `/p2p/<peer>` appended unless it already names a peer.
fn with_peer_id(addr: Multiaddr, peer: p2p::PeerId) -> Multiaddr {
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
