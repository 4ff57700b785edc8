//! One running node: the network client, heartbeats, the live-peer view, orchestration and
//! the HTTP face.
//!
//! Owns nothing that blocks: tensor work lives on compute threads, the swarm in the p2p event
//! loop. This task reacts to network events and timers, and stops on SIGINT or SIGTERM.

pub(crate) mod identity;
pub(crate) mod settings;

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bootstrap::{Metagraph, PeerIdStr, RunConfig};
use p2p::{Event, Heartbeat, LiveView, Multiaddr, PeerId, Role};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cli::NodeArgs;
use crate::metrics::NodeMetrics;
use crate::router::{Next, Router, RouterParts};
use crate::schedule::unix_ms;
use crate::services::consensus::api::Orchestration;
use crate::services::consensus::api::{ConsensusHandle, EpochProgress};
use crate::services::inbox::ServiceGone;
use crate::services::miner::api::MinerHandle;
use crate::services::miner::api::{Miner, MinerConfig};
use crate::services::observe::api::{NodeView, StatusSource};
use identity::NodeIdentity;
use settings::{own_binding, NodeSettings, BINDING_LIFETIME};

/// How long a stopping node waits for its compute thread.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How often the election is ticked.
const TICK: Duration = Duration::from_millis(250);

/// Runs a node until a shutdown signal. Returns once everything it started has stopped.
pub(crate) async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let settings = NodeSettings::from_args(&args)?;
    let NodeIdentity {
        keypair,
        peer_id: local_peer_id,
        me,
        spot_check_secret: secret,
    } = identity::of_node(settings.data_dir.as_deref())?;
    let mut binding = settings.first_binding(&keypair)?;
    if let Some(warning) = settings.permit_warning(&me) {
        tracing::warn!("{warning}");
    }
    let submitter = settings.submitter();
    let NodeSettings {
        run: run_config,
        metagraph,
        hotkey,
        chain: chain_source,
        role,
        network,
        faults,
        heartbeat: heartbeat_interval,
        data_dir,
        compute,
        metrics: metrics_addr,
        weights: _,
    } = settings;
    let topics = crate::wire::topics::Topics::of(&run_config.run_name);

    let mut registry = Registry::default();
    let p2p_metrics = p2p::Metrics::new(&mut registry);
    let node_metrics = NodeMetrics::new(&mut registry);
    let pipeline_metrics = crate::metrics::PipelineMetrics::new(&mut registry);
    let chain_metrics = chain_source
        .as_ref()
        .map(|_| crate::metrics::ChainMetrics::new(&mut registry));
    let binding_keypair = keypair.clone();
    let config = p2p::Config {
        listen: network.listen.clone(),
        bootstrap: network.bootstrap.clone(),
        topics: topics.all(),
        ..p2p::Config::default()
    };
    let (client, mut events, event_loop) =
        p2p::spawn(keypair, config, p2p_metrics.clone()).context("starting the network")?;
    let metagraph_for_hints = metagraph.clone();
    let mut orchestration = Orchestration::new(
        me.clone(),
        role,
        run_config.clone(),
        metagraph,
        data_dir.as_deref(),
    );
    if let Some(source) = &chain_source {
        orchestration = orchestration.stake_from_chain(source.netuid);
        if let Some((binding, _)) = &binding {
            orchestration.on_own_binding(binding, unix_ms(std::time::SystemTime::now()));
        }
    }
    tracing::info!(peer = %local_peer_id, ?role, run = %run_config.run_name, run_hash = %orchestration.run_hash(), "node started");

    // The services, each a task behind a bounded inbox; they reach each other only through
    // the handles handed out here.
    let (consensus, consensus_task) =
        crate::services::consensus::api::spawn(orchestration, client.clone(), topics.plan.clone());
    let (merge, merge_task) =
        crate::services::merge::api::spawn(client.clone(), &run_config, &mut registry);
    let miner: Option<(MinerHandle, tokio::task::JoinHandle<()>)> = match role {
        Role::Miner => {
            let miner = Miner::new(
                crate::wire::peer::of(&local_peer_id),
                client.clone(),
                MinerConfig {
                    run: run_config.clone(),
                    data_dir: data_dir.clone(),
                    device: compute.device,
                    head_window: compute.head_window,
                    faults: faults.miner,
                },
                pipeline_metrics.clone(),
                merge.clone(),
                consensus.view.clone(),
            )?;
            Some(crate::services::miner::api::spawn(
                miner,
                topics.pipeline.clone(),
            ))
        }
        Role::Validator => None,
    };
    let (miner, miner_task) = match miner {
        Some((handle, task)) => (Some(handle), Some(task)),
        None => (None, None),
    };
    let (validator, validator_task) = match role {
        Role::Validator => {
            let (handle, task) = crate::services::validator::api::spawn(
                crate::services::validator::api::ValidatorParts {
                    merge: merge.clone(),
                    data_dir: data_dir.clone(),
                    consensus: consensus.clone(),
                    client: client.clone(),
                    topic: topics.pipeline.clone(),
                    me: local_peer_id.to_string(),
                    run: run_config.clone(),
                    device: compute.device,
                    secret,
                    skew_weights: faults.skew_weights,
                },
            )?;
            (Some(handle), Some(task))
        }
        Role::Miner => (None, None),
    };

    // The chain: the stake reader, and a validator's weight submitter.
    let mut chain_tasks = Vec::new();
    if let (Some(source), Some(metrics)) = (&chain_source, &chain_metrics) {
        chain_tasks.push(tokio::spawn(crate::services::chain::api::read_stake(
            source.clone(),
            consensus.clone(),
            metrics.clone(),
        )));
        match (&validator, submitter) {
            (Some(validator), Some(submitter)) => {
                chain_tasks.push(tokio::spawn(crate::services::chain::api::submit_weights(
                    submitter,
                    validator.weights.clone(),
                    metrics.clone(),
                )));
            }
            (Some(_), None) => tracing::warn!(
                "this validator has no --hotkey: its weights will not go to the chain"
            ),
            _ => {}
        }
    }

    let (view, view_rx) = watch::channel(NodeView::default());
    let status = StatusSource {
        client: client.clone(),
        role: role_name(role),
        view: view_rx,
        miner: miner.as_ref().map(|m| m.status.clone()),
        validator: validator.as_ref().map(|v| v.weights.clone()),
    };
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http = match metrics_addr {
        Some(addr) => {
            let (bound, task) =
                crate::services::observe::api::serve(addr, Arc::new(registry), status, async {
                    let _ = http_stopped.await;
                })
                .await?;
            tracing::info!(%bound, "serving /metrics and /status");
            println!("METRICS http://{bound}");
            let _ = std::io::stdout().flush();
            Some((task, format!("http://{bound}")))
        }
        None => None,
    };
    let (http, dashboard) = match http {
        Some((task, url)) => (Some(task), Some(url)),
        None => (None, None),
    };

    let mut router = Router::new(RouterParts {
        me: local_peer_id,
        client: client.clone(),
        run: run_config.clone(),
        consensus: consensus.clone(),
        miner: miner.clone(),
        merge: merge.clone(),
        validator,
        p2p_metrics,
        node_metrics: node_metrics.clone(),
        pipeline_metrics,
        bootstrap_peers: network.bootstrap_peers,
    })?;
    let mut heartbeat = tokio::time::interval(heartbeat_interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counter = 0u64;
    let started = Instant::now();
    let mut last_hint: Option<Instant> = None;
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let mut consensus_changes = consensus.view.clone();

    let outcome: anyhow::Result<()> = loop {
        tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                break Ok(());
            }
            _ = heartbeat.tick() => {
                counter += 1;
                let agreed = consensus.view();
                if let Some(metrics) = &chain_metrics {
                    metrics.bound_hotkeys.set(agreed.bound_hotkeys as i64);
                }
                // Renew this node's binding at half its life.
                if let (Some((_, expires)), Some(hotkey), Some(source)) = (&binding, &hotkey, &chain_source) {
                    let left = expires.duration_since(std::time::SystemTime::now()).unwrap_or_default();
                    if left < BINDING_LIFETIME / 2 {
                        match own_binding(hotkey, &binding_keypair, source.netuid) {
                            Ok(renewed) => {
                                if consensus.own_binding(renewed.0.clone(), unix_ms(std::time::SystemTime::now())).await.is_err() {
                                    break Err(ServiceGone("consensus").into());
                                }
                                tracing::info!("hotkey binding renewed");
                                binding = Some(renewed);
                            }
                            Err(error) => tracing::warn!(%error, "hotkey binding not renewed"),
                        }
                    }
                }
                let beat = Heartbeat {
                    peer_id: local_peer_id.to_string(),
                    role,
                    counter,
                    sent_at_ms: unix_ms(std::time::SystemTime::now()),
                    run_hash: agreed.run_hash.clone(),
                    epoch: agreed.epoch(),
                    stage: agreed.stage,
                    dashboard: dashboard.clone(),
                    binding: binding.as_ref().map(|(b, _)| b.clone()),
                };
                if let Err(error) = client.publish(&topics.heartbeat, beat.to_bytes()).await {
                    tracing::debug!(%error, "heartbeat not published");
                }
                if faults.forge_plans {
                    forge_plan(&client, &topics.plan, &run_config, &me, counter).await;
                }
                let now = Instant::now().into_std();
                router.live().prune(now);
                let live_peers = sorted_live(router.live(), now);
                let peer_dashboards = dashboards(router.live(), now);
                // Say why nothing happens, now and then, while nobody is elected.
                let waiting = agreed.orchestrator.is_none()
                    && started.elapsed() >= NO_ORCHESTRATOR_HINT
                    && last_hint.is_none_or(|t| t.elapsed() >= NO_ORCHESTRATOR_HINT);
                if waiting {
                    last_hint = Some(Instant::now());
                    let live: BTreeSet<String> = live_peers.iter().cloned().chain([me.to_string()]).collect();
                    tracing::warn!("{}", no_orchestrator_reason(metagraph_for_hints.as_ref(), &live));
                }
                view.send_modify(|v| {
                    v.heartbeats_sent = counter;
                    v.live_peers = live_peers;
                    v.peer_dashboards = peer_dashboards;
                });
            }
            _ = tick.tick() => {
                if let Some(miner) = &miner {
                    if !miner.alive() {
                        break Err(anyhow::anyhow!(
                            "the stage's compute thread stopped (see the log above); restart the node to rebuild the stage from its checkpoint"
                        ));
                    }
                }
                if let Err(gone) = on_tick(&mut router, &consensus, miner.as_ref(), &node_metrics, &view).await {
                    break Err(gone.into());
                }
            }
            changed = consensus_changes.changed() => {
                if changed.is_err() {
                    break Err(ServiceGone("consensus").into());
                }
                if let Err(gone) = router.adopt_current().await {
                    break Err(gone.into());
                }
            }
            event = events.recv() => {
                let Some(event) = event else {
                    tracing::warn!("network event loop stopped");
                    break Ok(());
                };
                if let Event::NewListenAddr(addr) = &event {
                    let full = with_peer_id(addr.clone(), local_peer_id);
                    println!("LISTEN {full}");
                    let _ = std::io::stdout().flush();
                    view.send_modify(|v| v.listen_addrs.push(full.to_string()));
                }
                if let Next::Stop(error) = router.on_event(event).await {
                    break Err(error);
                }
            }
        }
    };

    client.shutdown().await;
    if let Err(error) = event_loop.await {
        tracing::warn!(%error, "network event loop ended badly");
    }
    if let Some(miner) = &miner {
        miner.shutdown(SHUTDOWN_GRACE).await;
    }
    // The remaining services stop once the router's handles are gone.
    drop(router);
    drop(miner);
    drop(consensus);
    drop(merge);
    for task in chain_tasks {
        task.abort();
        let _ = task.await;
    }
    for task in [
        Some(consensus_task),
        Some(merge_task),
        miner_task,
        validator_task,
    ]
    .into_iter()
    .flatten()
    {
        task.abort();
        let _ = task.await;
    }
    let _ = stop_http.send(());
    if let Some(task) = http {
        let _ = task.await;
    }
    outcome
}

/// The clock-driven part of the loop: election, the orchestrator's plans, the miner's
/// deadlines and loss records, and the status view refreshed.
async fn on_tick(
    router: &mut Router,
    consensus: &ConsensusHandle,
    miner: Option<&MinerHandle>,
    metrics: &NodeMetrics,
    view: &watch::Sender<NodeView>,
) -> Result<(), ServiceGone> {
    let now = Instant::now().into_std();
    let me = router.me().to_string();
    let live_now: BTreeSet<String> = router
        .live()
        .live(now)
        .iter()
        .map(|(peer, _)| peer.to_string())
        .chain(std::iter::once(me))
        .collect();
    let agreed = consensus.view();
    let progress = match agreed.current.as_ref() {
        Some(plan) => {
            let heads: Vec<String> = plan.miners_of(0).map(|p| p.to_string()).collect();
            let stats = router.stats();
            EpochProgress {
                heads_done: stats.epoch_done(plan.epoch, &heads, &live_now),
                // The merges that opened this epoch (closing the one before).
                merged: plan
                    .epoch
                    .checked_sub(1)
                    .and_then(|before| router.plan(before))
                    .is_none_or(|before| stats.merges_done(before, &live_now)),
            }
        }
        None => EpochProgress {
            heads_done: false,
            merged: true,
        },
    };
    if let Some(miner) = miner {
        miner
            .tick(
                live_now
                    .iter()
                    .filter_map(|p| PeerIdStr::parse(p).ok())
                    .collect(),
            )
            .await?;
    }
    router.retry_pending_plans().await?;
    consensus.tick(progress).await?;
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
    let epochs = router.stats().epochs();
    if let Some(weights) = &agreed.weights {
        metrics.set_weights(weights);
    }
    view.send_modify(|v| {
        v.consensus_epoch = agreed.weights.as_ref().map(|w| w.epoch);
        v.weights = agreed.weights.clone();
        v.epochs = epochs;
        v.orchestrator = agreed.orchestrator;
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
    Ok(())
}

/// How long a node waits for an orchestrator before it says why there is none, and how often
/// it says it again.
const NO_ORCHESTRATOR_HINT: Duration = Duration::from_secs(15);

/// Why no orchestrator is elected, for a node that waits on one (pure): `live` are the peers
/// heard (and this node).
fn no_orchestrator_reason(metagraph: Option<&Metagraph>, live: &BTreeSet<String>) -> String {
    let Some(metagraph) = metagraph else {
        return "no orchestrator: this node has no --metagraph, so nobody can be elected; start \
                every node of the run with the same --metagraph <file> (and --run <file>)"
            .into();
    };
    let candidates: Vec<String> = metagraph
        .neurons()
        .iter()
        .filter(|n| n.validator_permit && n.stake > 0)
        .map(|n| n.peer_id.to_string())
        .collect();
    if candidates.is_empty() {
        return "no orchestrator: the metagraph has no validator with a permit and stake".into();
    }
    let heard: Vec<&String> = candidates.iter().filter(|c| live.contains(*c)).collect();
    if heard.is_empty() {
        format!(
            "no orchestrator: no validator with stake is live; start one of {} with --validator \
             and the same --metagraph and --run",
            candidates.join(", ")
        )
    } else {
        format!(
            "no orchestrator yet: validator(s) {} are live, waiting for the election to settle \
             (a node of another --run is refused: check that every node uses the same file)",
            heard
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// Fault injection for tests: a node that is not the orchestrator publishes a plan naming
/// itself, which every honest node must drop.
async fn forge_plan(
    client: &p2p::Client,
    topic: &str,
    run: &RunConfig,
    me: &PeerIdStr,
    counter: u64,
) {
    let miners = BTreeSet::from([me.clone()]);
    let plan = bootstrap::next_plan(run, me, None, Some(counter + 1_000_000), &miners);
    match plan.map(|p| p.to_json()) {
        Ok(Ok(bytes)) => {
            if let Err(error) = client.publish(topic, bytes).await {
                tracing::debug!(%error, "forged plan not published");
            }
        }
        _ => tracing::debug!("forged plan not built"),
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Miner => "miner",
        Role::Validator => "validator",
    }
}

/// The HTTP servers live peers announce, keyed by peer: only `http://<ip>:<port>` (what a
/// node announces), anything else a peer says is dropped.
fn dashboards(
    live: &LiveView,
    now: std::time::Instant,
) -> std::collections::BTreeMap<String, String> {
    live.live(now)
        .iter()
        .filter_map(|(peer, beat)| {
            let url = beat.dashboard.as_deref()?;
            let addr: std::net::SocketAddr = url.strip_prefix("http://")?.parse().ok()?;
            Some((peer.to_string(), format!("http://{addr}")))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_addresses_peers_announce_reach_the_dashboard() {
        let mut live = LiveView::new(Duration::from_secs(30));
        let now = std::time::Instant::now();
        let announced = [
            Some("http://127.0.0.1:9100"),
            Some("javascript:alert(1)"),
            Some("http://evil.example:80"),
            Some("http://127.0.0.1:9100/../admin"),
            None,
        ];
        let mut kept = None;
        for (i, url) in announced.into_iter().enumerate() {
            let peer = p2p::identity::Keypair::generate_ed25519()
                .public()
                .to_peer_id();
            if i == 0 {
                kept = Some(peer.to_string());
            }
            let beat = Heartbeat {
                peer_id: peer.to_string(),
                role: Role::Miner,
                counter: 1,
                sent_at_ms: unix_ms(std::time::SystemTime::now()),
                run_hash: "run".into(),
                epoch: None,
                stage: None,
                dashboard: url.map(str::to_string),
                binding: None,
            };
            live.observe(peer, beat, now);
        }
        let seen = dashboards(&live, now);
        assert_eq!(
            seen,
            std::collections::BTreeMap::from([(
                kept.unwrap(),
                "http://127.0.0.1:9100".to_string()
            )])
        );
    }

    #[test]
    fn a_waiting_node_says_why_nobody_is_elected() {
        let none = no_orchestrator_reason(None, &BTreeSet::new());
        assert!(none.contains("no --metagraph"), "{none}");
        let v = "12D3KooWLu6EsLa3gHbJx33AMA3ssTscrCEWeLH56hWM5xnLaeQB";
        let m = "12D3KooWNcQ3TSvfDjiVTgRfVkGXLiAYAz82Soata9Mm59LKg7Wo";
        let local = |stake: u64| {
            Metagraph::for_local_run(vec![
                bootstrap::metagraph::LocalNeuron {
                    peer_id: PeerIdStr::parse(v).unwrap(),
                    stake,
                    validator_permit: true,
                },
                bootstrap::metagraph::LocalNeuron {
                    peer_id: PeerIdStr::parse(m).unwrap(),
                    stake: 0,
                    validator_permit: false,
                },
            ])
            .unwrap()
        };
        let staked = local(100);
        let gone = no_orchestrator_reason(Some(&staked), &BTreeSet::from([m.to_string()]));
        assert!(
            gone.contains("no validator with stake is live") && gone.contains(v),
            "{gone}"
        );
        let heard = no_orchestrator_reason(Some(&staked), &BTreeSet::from([v.to_string()]));
        assert!(heard.contains("are live"), "{heard}");
        let unstaked = local(0);
        let empty = no_orchestrator_reason(Some(&unstaked), &BTreeSet::new());
        assert!(
            empty.contains("no validator with a permit and stake"),
            "{empty}"
        );
    }
}
