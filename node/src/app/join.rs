//! The join phase of a node started with `--bootstrap` and without `--run` (or, off the chain,
//! without `--metagraph`): before any service starts, it asks the peers it meets what run
//! they are in, listens to that run's heartbeats, fetches the run configuration and the stake
//! snapshot by hash from the validators that advertise them, and adopts them by the rule of
//! [`crate::join`]. It prints both hashes.
//!
//! It runs on the node's network and owns its events meanwhile: it prints the listen
//! addresses (as the node's loop does), answers every request with `Busy` (the node serves
//! nothing yet) and reports a verdict for every gossip message (`Ignore`: a joining node
//! relays nothing it cannot judge yet). It waits as long as it takes, saying every
//! [`PROGRESS_EVERY`] what it has heard and what it still lacks, and stops on a signal.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use anyhow::bail;
use bootstrap::{Metagraph, RunConfig};
use p2p::{Event, Heartbeat, Multiaddr, PeerId, Verdict};
use tokio::sync::mpsc;

use crate::join::{decide, Backing, Decision, Electorate, Vouches};
use crate::schedule::unix_ms;
use crate::services::chain::api::{read_stake_once, StakeSource};
use crate::services::consensus::api::{ChainBook, ChainStake};
use crate::wire::messages::{self, JoinReply, JoinRequest, Service};
use crate::wire::rpc;
use crate::wire::topics::Topics;

/// How often the join phase looks at what it has and asks for what it lacks.
const STEP: Duration = Duration::from_millis(250);

/// How often it says what it is waiting for.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// How long after it first subscribed to a run's heartbeats a node that has heard no
/// validator advertise a snapshot takes the run to have none (a run without stake, which
/// elects no orchestrator: only discovery works in it).
const NO_SNAPSHOT_GRACE: Duration = Duration::from_secs(3);

/// Most peers asked what run they are in.
const MAX_ASKED: usize = 16;

/// Most (file, peer) pairs a joining node asks about: past it, it asks only those it asked
/// before, and says how many every [`PROGRESS_EVERY`].
const MAX_FETCHES: usize = 256;

/// How long before a peer is asked again for a file (or a summary) it did not give.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(10);

/// Most distinct run names whose heartbeats are followed (peers may name different runs).
const MAX_RUN_NAMES: usize = 4;

/// What a node must learn before it starts, and what it already knows.
#[derive(Clone, Debug, Default)]
pub(crate) struct JoinSpec {
    /// `--run`, when given: then only the snapshot is fetched, and the run's validators must
    /// follow this configuration.
    pub(crate) run: Option<RunConfig>,
    /// `--metagraph`, when given: then only the run configuration is fetched.
    pub(crate) metagraph: Option<Metagraph>,
    /// `--run-hash`, hex.
    pub(crate) pinned_run: Option<String>,
    /// `--metagraph-hash`, hex.
    pub(crate) pinned_metagraph: Option<String>,
    /// `--subtensor`: the stake comes from the chain, and only the run configuration is
    /// fetched.
    pub(crate) chain: Option<StakeSource>,
}

/// How long a joining node waits before it reads the chain again after a failed read.
const CHAIN_RETRY: Duration = Duration::from_secs(5);

/// The chain's side of a join: the subnet's neurons, and the bindings of the validators
/// heard.
struct ChainJoin {
    book: ChainBook,
    neurons: Option<Vec<bootstrap::chain::ChainNeuron>>,
}

/// What the join phase adopted.
pub(crate) struct Joined {
    /// The run configuration.
    pub(crate) run: RunConfig,
    /// The stake snapshot (none: the run has none).
    pub(crate) metagraph: Option<Metagraph>,
    /// The addresses the node listened on meanwhile (already printed).
    pub(crate) listen_addrs: Vec<Multiaddr>,
}

/// What a peer said the run is.
#[derive(Clone, Debug)]
struct Summary {
    run_name: String,
    run_hash: String,
    metagraph_hash: Option<String>,
}

/// The answer of one request the join phase sent.
enum Fetched {
    Summary(PeerId, Result<Summary, String>),
    Run(PeerId, String, Result<Box<RunConfig>, String>),
    Snapshot(PeerId, String, Result<Metagraph, String>),
    Stake(Result<Box<ChainStake>, String>),
}

/// The join phase's state.
struct Joiner {
    client: p2p::Client,
    me: PeerId,
    spec: JoinSpec,
    vouches: Vouches,
    summaries: BTreeMap<PeerId, Summary>,
    /// When each peer was last asked for its summary.
    asked: BTreeMap<PeerId, Instant>,
    heartbeat_topics: BTreeSet<String>,
    subscribed_at: Option<Instant>,
    runs: BTreeMap<String, RunConfig>,
    snapshots: BTreeMap<String, Metagraph>,
    /// When each peer was last asked for each file: a peer is asked again only after
    /// [`ASK_AGAIN_AFTER`], so a request that failed once (a peer not yet reachable, a
    /// timeout) is retried, and none is asked in a loop.
    tried: BTreeMap<(String, PeerId), Instant>,
    in_flight: BTreeSet<String>,
    listen: Vec<Multiaddr>,
    tx: mpsc::Sender<Fetched>,
    best: Option<Backing>,
    /// The snapshot and run hash chosen, once chosen (the run configuration may still be on
    /// its way).
    chosen: Option<(Option<Metagraph>, String)>,
    chain: Option<ChainJoin>,
    /// The hashes of `--run` and `--metagraph`, when given, computed once.
    given_run_hash: Option<String>,
    given_metagraph_hash: Option<String>,
}

/// Runs the join phase until the run configuration and the snapshot are adopted.
pub(crate) async fn join(
    client: &p2p::Client,
    events: &mut mpsc::Receiver<Event>,
    spec: JoinSpec,
) -> anyhow::Result<Joined> {
    let (tx, mut rx) = mpsc::channel(64);
    let mut joiner = Joiner {
        client: client.clone(),
        me: client.local_peer_id(),
        vouches: Vouches::default(),
        summaries: BTreeMap::new(),
        asked: BTreeMap::new(),
        heartbeat_topics: BTreeSet::new(),
        subscribed_at: None,
        runs: BTreeMap::new(),
        snapshots: BTreeMap::new(),
        tried: BTreeMap::new(),
        in_flight: BTreeSet::new(),
        listen: Vec::new(),
        tx,
        best: None,
        chosen: None,
        chain: None,
        given_run_hash: spec.run.as_ref().map(|r| r.hash().to_hex()),
        given_metagraph_hash: spec.metagraph.as_ref().map(|m| hex::encode(m.hash())),
        spec,
    };
    if let Some(source) = joiner.spec.chain.clone() {
        joiner.chain = Some(ChainJoin {
            book: ChainBook::new(source.netuid),
            neurons: None,
        });
        tokio::spawn(read_chain(source, joiner.tx.clone()));
    }
    tracing::info!(
        fetch_run = joiner.spec.run.is_none(),
        fetch_metagraph = joiner.spec.metagraph.is_none(),
        "joining: asking the run's peers for its configuration"
    );
    let mut step = tokio::time::interval(STEP);
    step.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    progress.tick().await;
    let mut shutdown = std::pin::pin!(super::shutdown_signal());
    loop {
        tokio::select! {
            _ = &mut shutdown => bail!("stopped before the node joined a run"),
            event = events.recv() => {
                let Some(event) = event else {
                    bail!("the network stopped before the node joined a run");
                };
                joiner.on_event(event).await;
            }
            Some(fetched) = rx.recv() => joiner.on_fetched(fetched).await,
            _ = progress.tick() => {
                joiner.log_progress();
                joiner.ask_again().await;
            }
            _ = step.tick() => {
                if joiner.summaries.is_empty() {
                    joiner.ask_again().await;
                }
                if let Some(joined) = joiner.step()? {
                    return Ok(joined);
                }
            }
        }
    }
}

impl Joiner {
    async fn on_event(&mut self, event: Event) {
        match event {
            Event::NewListenAddr(addr) => {
                let full = addr.with_p2p(self.me).unwrap_or_else(|a| a);
                println!("LISTEN {full}");
                let _ = std::io::stdout().flush();
                self.listen.push(full);
            }
            Event::PeerConnected(peer) => self.ask_summary(peer),
            Event::PeerDisconnected(_) => {}
            Event::Request { id, .. } => {
                let _ = self
                    .client
                    .respond(id, rpc::error_response(rpc::ErrorCode::Busy))
                    .await;
            }
            Event::Gossip {
                author,
                topic,
                data,
                id,
            } => {
                if self.heartbeat_topics.contains(&topic) {
                    self.hear(author, &data);
                }
                let _ = self.client.report(id, Verdict::Ignore).await;
            }
        }
    }

    /// A heartbeat on a followed topic: a validator's vote, when it is one.
    fn hear(&mut self, author: PeerId, data: &[u8]) {
        let (Some(author), Ok(beat)) = (
            crate::wire::peer::try_of(&author),
            Heartbeat::from_bytes(data),
        ) else {
            return;
        };
        let now_ms = unix_ms(SystemTime::now());
        let heard = self.vouches.observe(&author, &beat, now_ms);
        if let (Some(chain), Some(binding), crate::join::Heard::Kept) =
            (&mut self.chain, &beat.binding, heard)
        {
            if let Ok(peer) = author.as_str().parse::<PeerId>() {
                if let Err(rejected) = chain.book.on_binding(&peer, binding, now_ms / 1000) {
                    tracing::debug!(%peer, reason = crate::rules::Reason::label(&rejected), "joining: a validator's binding refused");
                }
            }
        }
        tracing::trace!(peer = %author, ?heard, run_hash = %beat.run_hash, "joining: heartbeat");
    }

    fn ask_summary(&mut self, peer: PeerId) {
        if self.summaries.contains_key(&peer) {
            return;
        }
        let now = Instant::now();
        match self.asked.get(&peer) {
            Some(at) if now.duration_since(*at) < ASK_AGAIN_AFTER => return,
            None if self.asked.len() >= MAX_ASKED => return,
            _ => {}
        }
        self.asked.insert(peer, now);
        let (client, tx) = (self.client.clone(), self.tx.clone());
        tokio::spawn(async move {
            let summary = match ask(&client, peer, &JoinRequest::Summary).await {
                Ok((
                    JoinReply::Summary {
                        run_name,
                        run_hash,
                        metagraph_hash,
                    },
                    _,
                )) => Ok(Summary {
                    run_name,
                    run_hash,
                    metagraph_hash,
                }),
                Ok((other, _)) => Err(format!("answered {other:?} to a summary")),
                Err(error) => Err(error),
            };
            let _ = tx.send(Fetched::Summary(peer, summary)).await;
        });
    }

    async fn on_fetched(&mut self, fetched: Fetched) {
        match fetched {
            Fetched::Summary(peer, Ok(summary)) => {
                tracing::info!(%peer, run = %summary.run_name, run_hash = %summary.run_hash, metagraph_hash = ?summary.metagraph_hash, "joining: a peer's run");
                if bootstrap::RunConfig::valid_run_name(&summary.run_name)
                    && self.heartbeat_topics.len() < MAX_RUN_NAMES
                {
                    let topic = Topics::of(&summary.run_name).heartbeat;
                    if !self.heartbeat_topics.contains(&topic) {
                        match self.client.subscribe(&topic).await {
                            Ok(()) => {
                                self.heartbeat_topics.insert(topic);
                                self.subscribed_at.get_or_insert_with(Instant::now);
                            }
                            Err(error) => {
                                tracing::warn!(%error, "joining: cannot follow the run's heartbeats")
                            }
                        }
                    }
                }
                self.summaries.insert(peer, summary);
            }
            Fetched::Summary(peer, Err(error)) => {
                tracing::debug!(%peer, %error, "joining: no summary");
            }
            Fetched::Run(peer, hash, result) => {
                self.in_flight.remove(&format!("run {hash}"));
                match result {
                    Ok(run) => {
                        self.runs.insert(hash, *run);
                    }
                    Err(error) => {
                        tracing::warn!(%peer, %hash, %error, "joining: a run configuration refused")
                    }
                }
            }
            Fetched::Stake(Ok(stake)) => {
                if let Some(chain) = &mut self.chain {
                    tracing::info!(
                        block = stake.block,
                        neurons = stake.neurons.len(),
                        "joining: the subnet's stake read from the chain"
                    );
                    chain.neurons = Some(stake.neurons.clone());
                    chain
                        .book
                        .on_stake(*stake, unix_ms(SystemTime::now()) / 1000);
                }
            }
            Fetched::Stake(Err(error)) => {
                tracing::warn!(%error, retry_in = ?CHAIN_RETRY, "joining: the chain's stake not read");
            }
            Fetched::Snapshot(peer, hash, result) => {
                self.in_flight.remove(&format!("metagraph {hash}"));
                match result {
                    Ok(snapshot) => {
                        self.snapshots.insert(hash, snapshot);
                    }
                    Err(error) => {
                        tracing::warn!(%peer, %hash, %error, "joining: a stake snapshot refused")
                    }
                }
            }
        }
    }

    /// Looks at what it has: adopts when it can, else asks for what is missing.
    fn step(&mut self) -> anyhow::Result<Option<Joined>> {
        if self.chosen.is_none() {
            self.chosen = self.choose()?;
        }
        let Some((metagraph, run_hash)) = self.chosen.clone() else {
            return Ok(None);
        };
        let run = match &self.spec.run {
            Some(given) => given.clone(),
            None => match self.runs.get(&run_hash) {
                Some(run) => run.clone(),
                None => {
                    self.fetch_run(&run_hash);
                    return Ok(None);
                }
            },
        };
        let metagraph_hash = metagraph.as_ref().map(|m| hex::encode(m.hash()));
        tracing::info!(
            run = %run.run_name,
            run_hash = %run_hash,
            metagraph_hash = metagraph_hash.as_deref().unwrap_or("none"),
            "joined the run"
        );
        println!("RUN {run_hash}");
        println!("METAGRAPH {}", metagraph_hash.as_deref().unwrap_or("none"));
        let _ = std::io::stdout().flush();
        Ok(Some(Joined {
            run,
            metagraph,
            listen_addrs: std::mem::take(&mut self.listen),
        }))
    }

    /// The snapshot and the run configuration's hash to adopt, once known.
    #[allow(clippy::type_complexity)]
    fn choose(&mut self) -> anyhow::Result<Option<(Option<Metagraph>, String)>> {
        if let Some(chain) = &self.chain {
            let (Some(neurons), Some(bound)) = (&chain.neurons, chain.book.metagraph()) else {
                return Ok(None);
            };
            let electorate = Electorate::of_chain(&bound, neurons);
            return match decide(&self.vouches, &electorate, None) {
                Decision::Adopt(backing) => {
                    tracing::info!(
                        run_hash = %backing.run,
                        validators = backing.validators,
                        stake_percent = format!("{:.1}", backing.percent()),
                        "joining: validators with more than half of the chain's validator stake follow this run"
                    );
                    self.check_pin(&backing.run)?;
                    Ok(Some((None, backing.run)))
                }
                Decision::Wait(best) => {
                    self.best = best;
                    Ok(None)
                }
                Decision::NoStake => Ok(None),
            };
        }
        // The snapshots to weigh the votes under: the given one, the pinned one, or every
        // one the validators advertise (fetched first).
        let hashes: Vec<String> = match (&self.given_metagraph_hash, &self.spec.pinned_metagraph) {
            (Some(given), _) => vec![given.clone()],
            (None, Some(pin)) => vec![pin.clone()],
            (None, None) => self.vouches.snapshots(),
        };
        if self.spec.metagraph.is_none() {
            for hash in &hashes {
                // Snapshots are large (up to 16 MiB): at most MAX_SNAPSHOTS are held.
                if !self.snapshots.contains_key(hash)
                    && self.snapshots.len() < crate::join::MAX_SNAPSHOTS
                {
                    self.fetch_snapshot(hash);
                }
            }
        }
        let mut adopted = None;
        for hash in &hashes {
            let Some(snapshot) = self.snapshot_of(hash) else {
                continue;
            };
            match decide(
                &self.vouches,
                &Electorate::of_snapshot(snapshot),
                Some(hash),
            ) {
                Decision::Adopt(backing) => {
                    adopted = Some((hash.clone(), backing));
                    break;
                }
                Decision::Wait(best) => self.best = best,
                Decision::NoStake => {
                    tracing::debug!(metagraph_hash = %hash, "joining: a snapshot without validator stake");
                }
            }
        }
        let Some((hash, backing)) = adopted else {
            return self.no_snapshot();
        };
        tracing::info!(
            run_hash = %backing.run,
            metagraph_hash = %hash,
            validators = backing.validators,
            stake_percent = format!("{:.1}", backing.percent()),
            "joining: validators with more than half of the stake follow this run"
        );
        self.check_pin(&backing.run)?;
        if self.spec.metagraph.is_none() && self.spec.pinned_metagraph.is_none() {
            tracing::warn!(
                metagraph_hash = %hash,
                "trusting the stake snapshot on first use: its own validators vouch for it, but nothing outside the network the bootstrap address leads to confirms it; pin it with --metagraph-hash {hash} if you know it"
            );
        }
        Ok(Some((self.snapshot_of(&hash).cloned(), backing.run)))
    }

    /// The snapshot of `hash`: the given one, or one fetched.
    fn snapshot_of(&self, hash: &str) -> Option<&Metagraph> {
        match (&self.spec.metagraph, &self.given_metagraph_hash) {
            (Some(given), Some(given_hash)) if given_hash == hash => Some(given),
            _ => self.snapshots.get(hash),
        }
    }

    /// Refuses a majority run that is not `--run-hash`'s.
    fn check_pin(&self, run_hash: &str) -> anyhow::Result<()> {
        match &self.spec.pinned_run {
            Some(pin) if pin != run_hash => bail!(
                "the run's validators follow run configuration {run_hash}, not --run-hash {pin}"
            ),
            _ => Ok(()),
        }
    }

    /// A run that advertises no snapshot: after [`NO_SNAPSHOT_GRACE`] with no validator
    /// advertising one, the run the peers name, when they agree.
    #[allow(clippy::type_complexity)]
    fn no_snapshot(&self) -> anyhow::Result<Option<(Option<Metagraph>, String)>> {
        let quiet = self
            .subscribed_at
            .is_some_and(|t| t.elapsed() >= NO_SNAPSHOT_GRACE);
        if self.spec.metagraph.is_some()
            || self.spec.chain.is_some()
            || self.spec.pinned_metagraph.is_some()
            || !quiet
            || !self.vouches.snapshots().is_empty()
            || self.summaries.values().any(|s| s.metagraph_hash.is_some())
        {
            return Ok(None);
        }
        let named: BTreeSet<&str> = self
            .summaries
            .values()
            .map(|s| s.run_hash.as_str())
            .collect();
        let run_hash = match (&self.spec.pinned_run, &self.given_run_hash) {
            (Some(pin), _) => pin.clone(),
            (None, Some(given)) => given.clone(),
            (None, None) if named.len() == 1 => named
                .iter()
                .next()
                .map(|s| s.to_string())
                .unwrap_or_default(),
            (None, None) => return Ok(None),
        };
        tracing::warn!(
            %run_hash,
            "the run advertises no stake snapshot, so no orchestrator can be elected in it; taking its run configuration from the peers on first use"
        );
        Ok(Some((None, run_hash)))
    }

    fn fetch_run(&mut self, hash: &str) {
        let mut from = peer_ids(&self.vouches.advertising_run(hash));
        from.extend(
            self.summaries
                .iter()
                .filter(|(_, s)| s.run_hash == hash)
                .map(|(p, _)| *p),
        );
        if self.spec.pinned_run.is_some() {
            from.extend(self.summaries.keys().copied());
        }
        self.fetch(
            format!("run {hash}"),
            from,
            |client, peer, tx, hash| async move {
                let result = fetch_run(&client, peer, &hash).await.map(Box::new);
                let _ = tx.send(Fetched::Run(peer, hash, result)).await;
            },
            hash,
        );
    }

    fn fetch_snapshot(&mut self, hash: &str) {
        let mut from = peer_ids(&self.vouches.advertising_snapshot(hash));
        from.extend(
            self.summaries
                .iter()
                .filter(|(_, s)| {
                    s.metagraph_hash.as_deref() == Some(hash)
                        || self.spec.pinned_metagraph.is_some()
                })
                .map(|(p, _)| *p),
        );
        self.fetch(
            format!("metagraph {hash}"),
            from,
            |client, peer, tx, hash| async move {
                let result = fetch_snapshot(&client, peer, &hash).await;
                let _ = tx.send(Fetched::Snapshot(peer, hash, result)).await;
            },
            hash,
        );
    }

    /// Asks the first peer of `from` not yet asked for `what`, unless a request for it is
    /// out.
    fn fetch<F, Fut>(&mut self, what: String, from: Vec<PeerId>, task: F, hash: &str)
    where
        F: FnOnce(p2p::Client, PeerId, mpsc::Sender<Fetched>, String) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        if self.in_flight.contains(&what) {
            return;
        }
        let now = Instant::now();
        let Some(peer) = from
            .into_iter()
            .find(|p| match self.tried.get(&(what.clone(), *p)) {
                Some(at) => now.duration_since(*at) >= ASK_AGAIN_AFTER,
                None => self.tried.len() < MAX_FETCHES,
            })
        else {
            return;
        };
        self.tried.insert((what.clone(), peer), now);
        self.in_flight.insert(what);
        tokio::spawn(task(
            self.client.clone(),
            peer,
            self.tx.clone(),
            hash.to_string(),
        ));
    }

    /// Asks the connected peers that gave no summary yet (a request that failed, a peer that
    /// connected before it served) again.
    async fn ask_again(&mut self) {
        if let Ok(peers) = self.client.connected_peers().await {
            for peer in peers {
                self.ask_summary(peer);
            }
        }
    }

    fn log_progress(&self) {
        tracing::info!(
            peers_asked = self.asked.len(),
            peers_answered = self.summaries.len(),
            validators_heard = self.vouches.heard(),
            snapshots_advertised = self.vouches.snapshots().len(),
            snapshots_fetched = self.snapshots.len(),
            best_run = self.best.as_ref().map(|b| b.run.as_str()).unwrap_or("none"),
            best_stake_percent = format!("{:.1}", self.best.as_ref().map(Backing::percent).unwrap_or(0.0)),
            files_asked = self.tried.len(),
            "still joining: no run configuration has validators with more than half of the stake behind it yet"
        );
    }
}

/// The libp2p peer ids of `peers`.
fn peer_ids(peers: &[bootstrap::PeerIdStr]) -> Vec<PeerId> {
    peers
        .iter()
        .filter_map(|p| p.as_str().parse().ok())
        .collect()
}

/// Reads the chain's stake until a read succeeds (or the join phase is over), every
/// [`CHAIN_RETRY`].
async fn read_chain(source: StakeSource, tx: mpsc::Sender<Fetched>) {
    loop {
        let read = read_stake_once(&source).await.map(Box::new);
        let done = read.is_ok();
        if tx.send(Fetched::Stake(read)).await.is_err() || done {
            return;
        }
        tokio::time::sleep(CHAIN_RETRY).await;
    }
}

/// Sends one join request and decodes the answer.
async fn ask(
    client: &p2p::Client,
    peer: PeerId,
    request: &JoinRequest,
) -> Result<(JoinReply, Vec<u8>), String> {
    let body = messages::encode(Service::Join, request, &[]).map_err(|e| e.to_string())?;
    let reply = client
        .request(peer, body)
        .await
        .map_err(|e| e.to_string())?;
    let (header, payload) =
        messages::decode::<JoinReply>(Service::Join, &reply).map_err(|e| e.to_string())?;
    Ok((header, payload.to_vec()))
}

/// The file of `hash` from `peer`, at most `max` bytes.
async fn ask_file(
    client: &p2p::Client,
    peer: PeerId,
    request: &JoinRequest,
    max: usize,
) -> Result<Vec<u8>, String> {
    match ask(client, peer, request).await? {
        (JoinReply::Bytes, bytes) if bytes.len() <= max => Ok(bytes),
        (JoinReply::Bytes, bytes) => Err(format!(
            "{} bytes, more than the {max} allowed",
            bytes.len()
        )),
        (other, _) => Err(format!("answered {other:?}")),
    }
}

/// The run configuration of `hash` from `peer`, checked against its hash.
async fn fetch_run(client: &p2p::Client, peer: PeerId, hash: &str) -> Result<RunConfig, String> {
    let request = JoinRequest::Run {
        hash: hash.to_string(),
    };
    let bytes = ask_file(client, peer, &request, bootstrap::MAX_RUN_CONFIG_BYTES).await?;
    let text = std::str::from_utf8(&bytes).map_err(|e| e.to_string())?;
    let run = RunConfig::from_toml_str(text).map_err(|e| e.to_string())?;
    let got = run.hash().to_hex();
    if got != hash {
        return Err(format!("it hashes to {got}"));
    }
    crate::run_spec::check_trainable(&run).map_err(|e| e.to_string())?;
    Ok(run)
}

/// The stake snapshot of `hash` from `peer`, checked against its hash.
async fn fetch_snapshot(
    client: &p2p::Client,
    peer: PeerId,
    hash: &str,
) -> Result<Metagraph, String> {
    let request = JoinRequest::Metagraph {
        hash: hash.to_string(),
    };
    let bytes = ask_file(
        client,
        peer,
        &request,
        bootstrap::metagraph::MAX_METAGRAPH_BYTES,
    )
    .await?;
    let snapshot = Metagraph::from_json_slice(&bytes).map_err(|e| e.to_string())?;
    let got = hex::encode(snapshot.hash());
    if got != hash {
        return Err(format!("it hashes to {got}"));
    }
    Ok(snapshot)
}

/// What the join phase of `spec` does, for the context of its error.
pub(crate) fn context(spec: &JoinSpec) -> &'static str {
    match (spec.run.is_none(), spec.metagraph.is_none()) {
        (true, true) => "joining a run with --bootstrap alone",
        (true, false) => "fetching the run configuration (no --run)",
        _ => "fetching the stake snapshot (no --metagraph)",
    }
}
