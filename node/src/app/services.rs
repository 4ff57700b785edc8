//! Starting a node's services and stopping them again: the network, consensus, the merge
//! service, the miner or the validator, the chain tasks, the HTTP face, the heartbeat and the
//! router, each started from the node's settings in the order the next needs the last
//! (the router takes every handle; the heartbeat announces the HTTP address).
//!
//! Every task started here is kept in [`Tasks`] under its service's name. Stopping the node
//! stops the network first, gives the miner its grace to end its compute thread, drops the
//! handles (so each service's inbox closes), and then ends every task: a task that had
//! panicked is logged by name, and its panic becomes the node's exit error.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bootstrap::PeerIdStr;
use p2p::{Event, PeerId, Role};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::heartbeat::{self, Heartbeats};
use super::identity::NodeIdentity;
use super::open_files::{self, Budgets};
use super::settings::NodeSettings;
use crate::metrics::{ChainMetrics, NodeMetrics, PipelineMetrics};
use crate::router::{Router, RouterParts};
use crate::schedule::unix_ms;
use crate::services::consensus::api::{ConsensusHandle, ConsensusParts, Orchestration, PlanStore};
use crate::services::data::api::DataHandle;
use crate::services::inbox::ServiceGone;
use crate::services::merge::api::MergeHandle;
use crate::services::miner::api::{Miner, MinerConfig, MinerHandle};
use crate::services::observe::api::{HttpLimits, NodeView, StatusSource};
use crate::services::validator::api::{ValidatorHandle, ValidatorParts};
use crate::wire::topics::Topics;

/// How long a stopping node waits for its compute thread.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A node's running parts: what its loop drives, and what its stop ends.
pub(crate) struct Node {
    /// This node's peer id.
    pub(crate) peer_id: PeerId,
    /// The same, in the form plans and the metagraph use.
    pub(crate) me: PeerIdStr,
    /// The p2p layer's events, for the router.
    pub(crate) events: mpsc::Receiver<Event>,
    /// The only consumer of those events.
    pub(crate) router: Router,
    /// Consensus: the loop ticks it and follows its view.
    pub(crate) consensus: ConsensusHandle,
    /// The miner, on a miner node: the loop ticks it.
    pub(crate) miner: Option<MinerHandle>,
    /// What `/status` reports of the node itself.
    pub(crate) view: watch::Sender<NodeView>,
    /// The node's own metrics.
    pub(crate) metrics: NodeMetrics,
    /// The heartbeat task: it ends only when consensus has gone.
    pub(crate) heartbeat: JoinHandle<Result<(), ServiceGone>>,
    stop: Stop,
}

/// What only stopping needs.
struct Stop {
    client: p2p::Client,
    event_loop: JoinHandle<()>,
    merge: MergeHandle,
    tasks: Tasks,
    http: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

/// The tasks a node started, by the name of their service.
#[derive(Default)]
struct Tasks(Vec<(&'static str, JoinHandle<()>)>);

impl Tasks {
    fn add(&mut self, name: &'static str, task: JoinHandle<()>) {
        self.0.push((name, task));
    }

    /// Ends every task; names those that had panicked (logged as they are found).
    async fn end(self) -> Vec<&'static str> {
        let mut panicked = Vec::new();
        for (name, task) in self.0 {
            task.abort();
            if let Err(error) = task.await {
                if error.is_panic() {
                    tracing::error!(service = name, %error, "a service panicked");
                    panicked.push(name);
                }
            }
        }
        panicked
    }
}

/// The metrics registry and the structs registered in it.
struct Metrics {
    registry: Registry,
    p2p: p2p::Metrics,
    node: NodeMetrics,
    pipeline: PipelineMetrics,
    chain: Option<ChainMetrics>,
}

impl Metrics {
    fn new(chain: bool) -> Metrics {
        let mut registry = Registry::default();
        Metrics {
            p2p: p2p::Metrics::new(&mut registry),
            node: NodeMetrics::new(&mut registry),
            pipeline: PipelineMetrics::new(&mut registry),
            chain: chain.then(|| ChainMetrics::new(&mut registry)),
            registry,
        }
    }
}

/// Starts everything a node runs, from its settings and identity.
pub(crate) async fn start(
    mut settings: NodeSettings,
    identity: NodeIdentity,
) -> anyhow::Result<Node> {
    let binding = settings.first_binding(&identity.keypair)?;
    let mut metrics = Metrics::new(settings.chain.is_some());
    let budgets = open_files::raise_and_derive();
    let join = settings.join.take();
    // A node that must still learn its run starts the network without its topics.
    let known_topics = match &join {
        Some(_) => Vec::new(),
        None => Topics::of(&settings.run.run_name).all(),
    };
    let network = network_config(&settings, known_topics, &budgets);
    log_budgets(&budgets, &network);
    let (client, mut events, event_loop) = start_network(network, &identity, &metrics)?;
    let mut listened_while_joining = Vec::new();
    let joined_by_vote = join.is_some();
    if let Some(spec) = join {
        let context = super::join::context(&spec);
        let joined = match super::join::join(&client, &mut events, spec).await {
            Ok(joined) => joined,
            Err(error) => {
                client.shutdown().await;
                let _ = event_loop.await;
                return Err(error.context(context));
            }
        };
        settings.run = joined.run;
        if joined.metagraph.is_some() {
            settings.metagraph = joined.metagraph;
        }
        listened_while_joining = joined.listen_addrs;
        for topic in Topics::of(&settings.run.run_name).all() {
            client
                .subscribe(&topic)
                .await
                .with_context(|| format!("subscribing to {topic}"))?;
        }
    }
    if let Some(warning) = settings.permit_warning(&identity.me) {
        tracing::warn!("{warning}");
    }
    let topics = Topics::of(&settings.run.run_name);
    let served_run = if settings.faults.lie_join {
        bootstrap::RunConfig {
            seed: settings.run.seed.wrapping_add(1),
            ..settings.run.clone()
        }
    } else {
        settings.run.clone()
    };
    let join_files = crate::join::JoinFiles::new(&served_run, settings.metagraph.as_ref())
        .context("the run's files for joining nodes")?;
    let settings_run_hash = settings.run.hash().to_hex();
    let reachability = p2p::addresses::Reach::of(
        &settings.network.listen,
        &settings.network.external,
        &settings.network.bootstrap,
    )
    .as_str();
    let external_addrs: Vec<String> = settings
        .network
        .external
        .iter()
        .map(ToString::to_string)
        .collect();
    let settings_metagraph_hash = join_files.metagraph_hash().map(str::to_string);
    let mut tasks = Tasks::default();
    let own_binding = binding.as_ref().map(|(b, _)| b);
    let consensus = start_consensus(
        &settings,
        &identity,
        own_binding,
        &client,
        &topics,
        settings_metagraph_hash.as_deref(),
        &mut tasks,
    );
    let merge = start_merge(&settings, &client, &mut metrics, &mut tasks);
    let data = start_data(&settings, &identity, &client, &consensus)?;
    let started = Started {
        client: &client,
        consensus: &consensus,
        merge: &merge,
        topics: &topics,
    };
    let miner = start_miner(&settings, &identity, &started, &metrics, &data, &mut tasks)?;
    let validator = start_validator(&settings, &identity, &started, &data, &mut tasks)?;
    start_chain(
        &settings,
        &consensus,
        validator.as_ref(),
        &metrics,
        &mut tasks,
    );
    let (view, status) = node_view(
        &settings,
        &client,
        miner.as_ref(),
        validator.as_ref(),
        &data,
    );
    // What /status says of the node from its first answer on.
    view.send_modify(|v| {
        v.listen_addrs
            .extend(listened_while_joining.iter().map(ToString::to_string));
        v.run_hash = settings_run_hash;
        v.metagraph_hash = settings_metagraph_hash;
        v.reachability = reachability;
        v.external_addrs = external_addrs;
    });
    let http_limits = HttpLimits {
        max_connections: budgets.http_connections,
        ..HttpLimits::default()
    };
    let (http, dashboard) =
        start_http(settings.metrics, metrics.registry, status, http_limits).await?;
    let router = Router::new(RouterParts {
        me: identity.peer_id,
        client: client.clone(),
        run: settings.run.clone(),
        consensus: consensus.clone(),
        miner: miner.clone(),
        merge: merge.clone(),
        validator,
        data: data.clone(),
        p2p_metrics: metrics.p2p,
        node_metrics: metrics.node.clone(),
        pipeline_metrics: metrics.pipeline,
        bootstrap_peers: settings.network.bootstrap_peers.clone(),
        join_files: join_files.clone(),
        joined: joined_by_vote,
    })?;
    let heartbeat = heartbeat::spawn(Heartbeats {
        client: client.clone(),
        topics,
        consensus: consensus.clone(),
        view: view.clone(),
        chain_metrics: metrics.chain,
        me: identity.me.clone(),
        keypair: identity.keypair,
        binding,
        dashboard,
        settings,
        dataset: data.serves(),
        advertised: join_files,
        miner: miner.as_ref().map(|m| m.status.clone()),
    });
    Ok(Node {
        peer_id: identity.peer_id,
        me: identity.me,
        events,
        router,
        consensus,
        miner,
        view,
        metrics: metrics.node,
        heartbeat,
        stop: Stop {
            client,
            event_loop,
            merge,
            tasks,
            http,
        },
    })
}

/// The network's configuration: the node's addresses and topics, and connection limits that
/// fit its open-file limit.
fn network_config(settings: &NodeSettings, topics: Vec<String>, budgets: &Budgets) -> p2p::Config {
    p2p::Config {
        listen: settings.network.listen.clone(),
        bootstrap: settings.network.bootstrap.clone(),
        external: settings.network.external.clone(),
        relay_server: settings.network.relay_server.clone(),
        hole_punch: settings.network.hole_punch,
        topics,
        max_connections_total: budgets.p2p_connections,
        max_pending_incoming: budgets.pending_incoming,
        ..p2p::Config::default()
    }
}

/// Says what the node may hold: connections, streams, request bytes.
fn log_budgets(budgets: &Budgets, network: &p2p::Config) {
    tracing::info!(
        open_files = budgets.open_files,
        p2p_connections = network.max_connections_total,
        pending_handshakes = network.max_pending_incoming,
        streams_per_connection = network.max_streams_per_connection,
        request_bytes_per_peer = network.max_request_bytes_per_peer,
        request_bytes_total = network.max_request_bytes_total,
        http_connections = budgets.http_connections,
        "budgets"
    );
}

/// The network: listening, dialling the bootstrap peers, the run's topics subscribed.
fn start_network(
    config: p2p::Config,
    identity: &NodeIdentity,
    metrics: &Metrics,
) -> anyhow::Result<(p2p::Client, mpsc::Receiver<Event>, JoinHandle<()>)> {
    p2p::spawn(identity.keypair.clone(), config, metrics.p2p.clone())
        .context("starting the network")
}

/// The services every later one is started with.
struct Started<'a> {
    client: &'a p2p::Client,
    consensus: &'a ConsensusHandle,
    merge: &'a MergeHandle,
    topics: &'a Topics,
}

/// Consensus: the stake election and the plans, from the stored plan of a restart.
fn start_consensus(
    settings: &NodeSettings,
    identity: &NodeIdentity,
    binding: Option<&p2p::HotkeyBinding>,
    client: &p2p::Client,
    topics: &Topics,
    metagraph_hash: Option<&str>,
    tasks: &mut Tasks,
) -> ConsensusHandle {
    let plan_store = settings.data_dir.as_deref().map(PlanStore::new);
    let mut orchestration = Orchestration::new(
        identity.me.clone(),
        settings.role,
        settings.run.clone(),
        settings.metagraph.clone(),
        plan_store.as_ref().and_then(PlanStore::load_or_warn),
    );
    orchestration.set_placement(settings.placement);
    if let Some(source) = &settings.chain {
        orchestration = orchestration.stake_from_chain(source.netuid);
        if let Some(binding) = binding {
            orchestration.on_own_binding(binding, unix_ms(std::time::SystemTime::now()));
        }
    }
    tracing::info!(peer = %identity.peer_id, role = ?settings.role, run = %settings.run.run_name, run_hash = %orchestration.run_hash(), metagraph_hash = metagraph_hash.unwrap_or("none"), "node started");
    let (consensus, task) = crate::services::consensus::api::spawn(ConsensusParts {
        orchestration,
        store: plan_store,
        client: client.clone(),
        plan_topic: topics.plan.clone(),
    });
    tasks.add("consensus", task);
    consensus
}

/// The run's data: the embedded corpus, `--data`, or a dataset fetched from peers (cached
/// under `--data-dir`, else under the system's temporary directory, per peer).
fn start_data(
    settings: &NodeSettings,
    identity: &NodeIdentity,
    client: &p2p::Client,
    consensus: &ConsensusHandle,
) -> anyhow::Result<DataHandle> {
    let mut data = settings.data.clone();
    if data.cache.is_none() {
        data.cache = Some(std::env::temp_dir().join(format!("iota-p2p-data-{}", identity.me)));
    }
    let handle = DataHandle::start(
        &settings.run,
        &data,
        Some(client.clone()),
        Some(consensus.view.clone()),
    )?;
    if let Some(dataset) = handle.serves() {
        tracing::info!(%dataset, "serving the run's dataset");
    }
    Ok(handle)
}

/// The miner, on a miner node.
fn start_miner(
    settings: &NodeSettings,
    identity: &NodeIdentity,
    started: &Started<'_>,
    metrics: &Metrics,
    data: &DataHandle,
    tasks: &mut Tasks,
) -> anyhow::Result<Option<MinerHandle>> {
    if settings.role != Role::Miner {
        return Ok(None);
    }
    let miner = Miner::new(
        identity.me.clone(),
        started.client.clone(),
        MinerConfig {
            run: settings.run.clone(),
            data_dir: settings.data_dir.clone(),
            compute: settings.compute.stage,
            head_window: settings.compute.head_window,
            checkpoint_activations: settings.compute.checkpoint_activations,
            faults: settings.faults.miner,
            key: identity.keypair.clone(),
        },
        metrics.pipeline.clone(),
        started.merge.clone(),
        started.consensus.view.clone(),
        data.clone(),
    )?;
    let (handle, task) = crate::services::miner::api::spawn(miner, started.topics.pipeline.clone());
    tasks.add("miner", task);
    Ok(Some(handle))
}

/// The validator, on a validator node.
fn start_validator(
    settings: &NodeSettings,
    identity: &NodeIdentity,
    started: &Started<'_>,
    data: &DataHandle,
    tasks: &mut Tasks,
) -> anyhow::Result<Option<ValidatorHandle>> {
    if settings.role != Role::Validator {
        return Ok(None);
    }
    let (handle, task) = crate::services::validator::api::spawn(ValidatorParts {
        data: data.clone(),
        merge: started.merge.clone(),
        data_dir: settings.data_dir.clone(),
        consensus: started.consensus.clone(),
        client: started.client.clone(),
        topic: started.topics.pipeline.clone(),
        me: identity.me.clone(),
        run: settings.run.clone(),
        compute: settings.compute.stage,
        secret: identity.spot_check_secret,
        skew_weights: settings.faults.skew_weights,
    })?;
    tasks.add("validator", task);
    Ok(Some(handle))
}

/// With `--subtensor`: the stake reader, and a validator's weight submitter.
fn start_chain(
    settings: &NodeSettings,
    consensus: &ConsensusHandle,
    validator: Option<&ValidatorHandle>,
    metrics: &Metrics,
    tasks: &mut Tasks,
) {
    let (Some(source), Some(chain_metrics)) = (&settings.chain, &metrics.chain) else {
        return;
    };
    tasks.add(
        "chain stake",
        tokio::spawn(crate::services::chain::api::read_stake(
            source.clone(),
            consensus.clone(),
            chain_metrics.clone(),
        )),
    );
    match (validator, settings.submitter()) {
        (Some(validator), Some(submitter)) => tasks.add(
            "chain weights",
            tokio::spawn(crate::services::chain::api::submit_weights(
                submitter,
                validator.weights.clone(),
                chain_metrics.clone(),
            )),
        ),
        (Some(_), None) => {
            tracing::warn!("this validator has no --hotkey: its weights will not go to the chain")
        }
        _ => {}
    }
}

/// The merge service: the miner's merges and the validator's audits.
fn start_merge(
    settings: &NodeSettings,
    client: &p2p::Client,
    metrics: &mut Metrics,
    tasks: &mut Tasks,
) -> MergeHandle {
    let (merge, task) =
        crate::services::merge::api::spawn(client.clone(), &settings.run, &mut metrics.registry);
    tasks.add("merge", task);
    merge
}

/// The node's own `/status` view (kept by the loop and the heartbeat), and what `/status`
/// reads: that view and the services' published values.
fn node_view(
    settings: &NodeSettings,
    client: &p2p::Client,
    miner: Option<&MinerHandle>,
    validator: Option<&ValidatorHandle>,
    data: &DataHandle,
) -> (watch::Sender<NodeView>, StatusSource) {
    let (view, view_rx) = watch::channel(NodeView::default());
    let status = StatusSource {
        client: client.clone(),
        role: role_name(settings.role),
        view: view_rx,
        miner: miner.map(|m| m.status.clone()),
        validator: validator.map(|v| v.weights.clone()),
        data: data.clone(),
    };
    (view, status)
}

/// The HTTP face with `--metrics`: its stop signal and task, and the URL to announce.
type Http = Option<(oneshot::Sender<()>, JoinHandle<()>)>;

/// Serves `/metrics`, `/status` and the dashboard on `addr`, if given, within `limits`.
async fn start_http(
    addr: Option<std::net::SocketAddr>,
    registry: Registry,
    status: StatusSource,
    limits: HttpLimits,
) -> anyhow::Result<(Http, Option<String>)> {
    let Some(addr) = addr else {
        return Ok((None, None));
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let (bound, task) =
        crate::services::observe::api::serve(addr, Arc::new(registry), status, limits, async {
            let _ = stopped.await;
        })
        .await?;
    tracing::info!(%bound, "serving /metrics and /status");
    println!("METRICS http://{bound}");
    let _ = std::io::stdout().flush();
    Ok((Some((stop, task)), Some(format!("http://{bound}"))))
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Miner => "miner",
        Role::Validator => "validator",
    }
}

impl Node {
    /// Stops everything the node started and returns `outcome`, or the error of a service
    /// that panicked when the loop itself ended well.
    pub(crate) async fn stop(self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        let Node {
            router,
            consensus,
            miner,
            heartbeat,
            stop,
            ..
        } = self;
        stop.client.shutdown().await;
        if let Err(error) = stop.event_loop.await {
            tracing::warn!(%error, "network event loop ended badly");
        }
        if let Some(miner) = &miner {
            miner.shutdown(SHUTDOWN_GRACE).await;
        }
        heartbeat.abort();
        let _ = heartbeat.await;
        // The remaining services stop once the router's handles are gone.
        drop(router);
        drop(miner);
        drop(consensus);
        drop(stop.merge);
        let panicked = stop.tasks.end().await;
        if let Some((stop_http, task)) = stop.http {
            let _ = stop_http.send(());
            let _ = task.await;
        }
        match (outcome, panicked.first()) {
            (Ok(()), Some(name)) => Err(anyhow::anyhow!(
                "the {name} service panicked (see the log above)"
            )),
            (outcome, _) => outcome,
        }
    }
}
