//! The event loop on virtual time: the protocol's own code driven by modelled links and
//! compute.
//!
//! What runs as the node runs it:
//! * every validator's [`Orchestration`] (heartbeats in through `on_heartbeat`, plans through
//!   `on_plan`, `tick` every 250 ms with the epoch's progress): the election, failover,
//!   stage assignment, plan making and epoch pacing, and the Yuma consensus of the
//!   validators' weights (`on_weights`);
//! * each hop's choice of replica ([`choose_replica`] over each miner's own [`Routing`],
//!   which learns hop times and failures as the node's does);
//! * each miner's epoch [`Lifecycle`] (planned, merging with the node's deadline, training,
//!   draining; `tick` every 250 ms reports merges past their deadline): a request reaching
//!   a miner still planned or merging for the sample's epoch waits at its gate;
//! * each stage merge's butterfly plan ([`plan_of`]), its deadlines
//!   ([`schedule::phase_for`]), and its decisions by the protocol's own [`Ledger`] (which
//!   members' commitments count, when partitions settle, where each member fetches an
//!   average or keeps local values), fed commitments and claims as they arrive;
//! * each validator's spot-check schedule ([`SpotSchedule`]'s intervals);
//! * CLASP ([`attribution::estimate`]) over the epoch's loss records, and the chain weights
//!   ([`attribution::to_chain`]) each validator publishes from it.
//!
//! What is modelled instead: bytes on links ([`super::net`], yamux's stream windows and
//! bulk transfers sharing a link included), compute time ([`super::compute`]), a merge
//! member's own work (a core-time a byte, fitted on live runs; on a shared host it and the
//! transfers' CPU take the host's cores in turn), spot checks (the evidence
//! fetched from the checked miner, then recomputed on the validator's compute thread), the
//! loss of a sample (a decaying curve plus seeded noise, plus what a bad miner on its
//! pathway adds), and gossip (delivered after [`super::net::spread`]'s delay, counted by
//! copies). Nothing reads a clock or draws unseeded randomness: a seed gives the same
//! figures.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bootstrap::{EpochPlan, LocalNeuron, Metagraph, PeerIdStr, RunConfig, RAO_PER_TAO};
use p2p::{Heartbeat, Role};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::compute::{GpuClass, ModelCost};
use super::net::{spread, Link, Links};
use super::scenario::{Group, Placement, Scenario};
use crate::schedule::{merge_budget, phase_for, MERGE_DELAY};
use crate::services::consensus::api::{EpochProgress, Orchestration};
use crate::services::merge::api::plan_of;
use crate::services::miner::api::{
    choose_replica, Lifecycle, LifecycleError, Overrun, Phase, Routing, ATTEMPTS, HOP_TIMEOUT,
    LOSS_BATCH, MAX_IN_FLIGHT, VAL_BATCHES,
};
use crate::services::validator::api::SpotSchedule;
use training::butterfly::{Commitment, Decision, Gossip, Hash, Ledger, Plan, SliceHash};

/// The node's clock tick (consensus and pacing).
const TICK: f64 = 0.25;
/// Seconds between a node's heartbeats (the node's default `--heartbeat-secs`).
const HEARTBEAT: f64 = 1.0;
/// Bytes a gossip envelope adds to its payload: signature (64), public key (36), author
/// (38), topic and framing (about 60). An estimate, not a measurement.
const ENVELOPE: f64 = 200.0;
/// Bytes of one loss record with its hop receipts: about 200 and 150 a hop (an estimate).
const LOSS_RECORD: f64 = 200.0;
/// …and per hop.
const LOSS_RECORD_HOP: f64 = 150.0;
/// Bytes a merge value takes on the wire (f32).
const MERGE_VALUE_BYTES: f64 = 4.0;
/// A merge member's own work a byte of its stage's vector (snapshot, hashing partitions,
/// framing, verifying and averaging inputs, the checkpoint after it), core-seconds on one of
/// its host's cores (its transfers' CPU is [`TRANSPORT_CORE_S_PER_BYTE`]). Fitted on the
/// limited-link benchmark at 1 Gbit/s, default setting, where the link costs least (the
/// longest merge of an epoch 0.104 and 0.116 s in two runs, six members on two cores); the
/// other settings are predicted with it (`scripts/calibrate.sh`, docs/BENCHMARKS.md).
const MERGE_CORE_S_PER_BYTE: f64 = 0.028e-6;
/// CPU a byte sent or received over TCP + Noise + Yamux takes, core-seconds: half of the
/// 3.12 CPU-seconds a gigabyte moved (sender and receiver together) measured by the transport
/// benchmark on this machine (`cargo bench -p p2p --bench transport --profile dev`,
/// docs/BENCHMARKS.md). It matters where links are fast and cores shared: on 127.0.0.1 a
/// merge's transfers are bounded by the CPU, not the link.
const TRANSPORT_CORE_S_PER_BYTE: f64 = 1.56e-9;
/// The wall clock of virtual second 0.
const WALL_ORIGIN_SECS: u64 = 1_800_000_000;
/// Most unknowns (miners summed over stages) CLASP is run with here: its fit is dense and
/// cubic in them (see the report's limits).
const CLASP_MAX_UNKNOWNS: usize = 1100;
/// How often a request held at a receiver's epoch gate looks again.
const GATE_POLL: f64 = 0.5;
/// Points of the tokens/s series.
const SERIES_POINTS: f64 = 120.0;

/// One run's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Outcome {
    pub(crate) placement: &'static str,
    pub(crate) datacenter: bool,
    pub(crate) virtual_secs: f64,
    pub(crate) miners_start: usize,
    pub(crate) miners_end: usize,
    pub(crate) tokens: u64,
    pub(crate) samples_done: u64,
    pub(crate) samples_dropped: u64,
    /// Tokens trained over the virtual time after the first plan.
    pub(crate) tokens_per_s: f64,
    /// Every GPU busy all the time on model FLOPs, nothing else.
    pub(crate) perfect_tokens_per_s: f64,
    pub(crate) epochs: Vec<EpochFigures>,
    pub(crate) mean_epoch_secs: f64,
    /// The longest merge of an epoch, averaged over the epochs that opened with a merge.
    pub(crate) mean_merge_secs: f64,
    /// An epoch's length less its merge, averaged over every epoch.
    pub(crate) mean_train_secs: f64,
    pub(crate) gossip: GossipFigures,
    pub(crate) plan_bytes_max: usize,
    pub(crate) plan_miners_max: usize,
    pub(crate) failover_secs: Option<f64>,
    pub(crate) clasp: Option<ClaspFigures>,
    /// Share of the Yuma consensus weight that went to planted bad miners.
    pub(crate) bad_weight_share: Option<f64>,
    /// Spot-check evidence a validator fetched, bytes a second.
    pub(crate) spot_check_bytes_per_s: f64,
    /// Events the miners' lifecycles took (planned, merging, training, draining).
    pub(crate) lifecycle_events: u64,
    /// Events the miners' lifecycles refused as out of order (an older epoch's transition
    /// ending late, which the node logs and ignores).
    pub(crate) lifecycle_refused: u64,
    /// Merges a miner's lifecycle reported past their deadline.
    pub(crate) merge_overruns: u64,
    /// Merge members left out for a commitment after the deadline (the merges' ledgers).
    pub(crate) merge_excluded: u64,
    /// (member, partition) pairs that kept local values: no agreed claim in time.
    pub(crate) merge_kept_local: u64,
    pub(crate) limits: Vec<String>,
    pub(crate) series: Vec<(f64, f64)>,
    pub(crate) events: Vec<(f64, String)>,
}

/// One epoch.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct EpochFigures {
    pub(crate) epoch: u64,
    pub(crate) start: f64,
    pub(crate) secs: f64,
    /// Longest stage merge opening the epoch.
    pub(crate) merge_secs: f64,
    pub(crate) samples: u64,
    pub(crate) miners: usize,
    /// Miners the plan moved to another stage.
    pub(crate) moved: usize,
    pub(crate) plan_bytes: usize,
}

/// Gossip per node per epoch, every copy received counted.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct GossipFigures {
    pub(crate) heartbeat_bytes: f64,
    pub(crate) heartbeat_messages: f64,
    pub(crate) loss_bytes: f64,
    pub(crate) plan_bytes: f64,
    pub(crate) merge_bytes: f64,
    pub(crate) total_bytes: f64,
    pub(crate) total_messages: f64,
}

/// CLASP over the planted bad miners.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct ClaspFigures {
    pub(crate) epochs_fitted: usize,
    /// Bad miners flagged in an epoch they served in, over those epochs.
    pub(crate) recall: f64,
    /// Honest miners flagged, over honest miner-epochs.
    pub(crate) false_positive_rate: f64,
    pub(crate) unknowns_max: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pass {
    Forward,
    /// The tail's forward and backward in one job.
    Tail,
    Backward,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Heartbeats,
    Tick,
    Window,
    Plan {
        node: usize,
        epoch: u64,
    },
    MergeDone {
        epoch: u64,
        stage: u32,
    },
    Ready {
        node: usize,
        epoch: u64,
    },
    Compute {
        node: usize,
        sample: u64,
        pass: Pass,
    },
    Hop {
        to: usize,
        sample: u64,
    },
    HopFailed {
        sample: u64,
        peer: usize,
        penalise: bool,
    },
    Grad {
        stage: u32,
        sample: u64,
    },
    SpotCheck {
        node: usize,
    },
    Leave,
    Join,
    ValidatorFails,
}

struct Entry {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A spare, registered but not started.
    Spare,
    Alive,
    Gone,
}

struct Node {
    id: PeerIdStr,
    validator: bool,
    state: State,
    flops: f64,
    bad: bool,
    counter: u64,
    plan: Option<Arc<EpochPlan>>,
    stage: Option<u32>,
    ready: Option<u64>,
    /// The miner's epoch lifecycle, driven as the miner's task drives it.
    lifecycle: Lifecycle,
    routing: Routing,
    busy_until: f64,
    in_flight: usize,
    head: Option<Head>,
    /// As a head: when its epoch's training began, and samples completed since.
    ready_at: f64,
    completed: u64,
    /// As a head: samples a second completed over its last finished epoch.
    rate: Option<f64>,
}

struct Head {
    epoch: u64,
    quota: u64,
    drawn: u64,
    in_flight: usize,
    evals_left: usize,
}

struct Sample {
    epoch: u64,
    plan: Arc<EpochPlan>,
    head: usize,
    path: Vec<usize>,
    sent_at: Vec<f64>,
    attempt: usize,
    tried: BTreeSet<PeerIdStr>,
    eval: bool,
}

/// A stage merge's transfers, decided: when they begin and end, what each member moves,
/// and the members' own work after them.
struct MergeTransfers {
    done: f64,
    began: f64,
    /// Bytes each member sent and received; empty when nothing was merged.
    moved: Vec<f64>,
    /// Core-seconds of each member's own work.
    work: f64,
}

struct Merge {
    done_at: Option<f64>,
    /// Miners waiting for it, and whether each must fetch the stage's weights after it.
    waiting: Vec<(usize, bool)>,
}

/// Wall-clock costs of one run's protocol code, kept apart from the figures (which a seed
/// fixes; these depend on the machine).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct WallCosts {
    /// The longest CLASP fit of one epoch, seconds, and its unknowns.
    pub(crate) clasp_fit_secs_max: f64,
    pub(crate) clasp_fit_unknowns: usize,
    /// The whole run, seconds.
    pub(crate) run_secs: f64,
}

/// Runs `scenario` with `placement`, its links replaced by datacenter ones when
/// `datacenter`; returns the figures and what the run cost in wall time.
pub(crate) fn simulate_timed(
    scenario: &Scenario,
    placement: Placement,
    datacenter: bool,
) -> anyhow::Result<(Outcome, WallCosts)> {
    let started = Instant::now();
    let mut sim = Sim::new(scenario, placement, datacenter)?;
    sim.run();
    let mut costs = WallCosts::default();
    let outcome = sim.outcome(&mut costs);
    costs.run_secs = started.elapsed().as_secs_f64();
    Ok((outcome, costs))
}

struct Sim<'a> {
    sc: &'a Scenario,
    placement: Placement,
    datacenter: bool,
    run: RunConfig,
    cost: ModelCost,
    now: f64,
    end: f64,
    seq: u64,
    queue: BinaryHeap<Reverse<Entry>>,
    rng: ChaCha8Rng,
    origin: Instant,
    nodes: Vec<Node>,
    index: HashMap<PeerIdStr, usize>,
    uid: HashMap<PeerIdStr, u16>,
    validators: Vec<usize>,
    orch: BTreeMap<usize, Orchestration>,
    /// Each validator's spot-check schedule (the node's, seeded per validator).
    spot: BTreeMap<usize, SpotSchedule>,
    links: Links,
    cores: Option<Vec<f64>>,
    live: Arc<BTreeSet<PeerIdStr>>,
    plans: BTreeMap<u64, Arc<EpochPlan>>,
    plan_bytes: BTreeMap<u64, Arc<Vec<u8>>>,
    plan_published: BTreeMap<u64, f64>,
    merges: BTreeMap<(u64, u32), Merge>,
    /// Bytes of spot-check evidence the validators fetched.
    spot_bytes: f64,
    /// Lifecycle events the miners' lifecycles took and refused, and merges they reported
    /// overdue.
    lifecycle_events: u64,
    lifecycle_refused: u64,
    merge_overruns: u64,
    /// Merge members left out for a late commitment, and (member, partition) pairs that
    /// kept local values, as the merges' ledgers decided.
    merge_excluded: u64,
    merge_kept_local: u64,
    merge_secs: BTreeMap<u64, f64>,
    samples: HashMap<u64, Sample>,
    next_sample: u64,
    records: BTreeMap<u64, Vec<attribution::Record>>,
    epoch_samples: BTreeMap<u64, u64>,
    tokens: u64,
    done: u64,
    dropped: u64,
    window_tokens: u64,
    window: f64,
    series: Vec<(f64, f64)>,
    events: Vec<(f64, String)>,
    gossip: GossipFigures,
    /// Each kind of limit hit: when first, how often, and what the first said.
    limits: BTreeMap<&'static str, (f64, u64, String)>,
    spares: Vec<usize>,
    failed_at: Option<(f64, PeerIdStr)>,
    failover_secs: Option<f64>,
    first_plan: Option<f64>,
    clasp: Vec<(usize, usize, usize, usize, usize)>,
    unknowns_max: usize,
    bad_weight: Vec<f64>,
}

fn draw_latency(rng: &mut ChaCha8Rng, group: &Group) -> f64 {
    let (lo, hi) = group.latency_ms.bounds();
    let ms = if hi > lo { rng.gen_range(lo..hi) } else { lo };
    ms / 1000.0
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, placement: Placement, datacenter: bool) -> anyhow::Result<Self> {
        let run = sc.run_config()?;
        let cost = ModelCost::of(&run, sc.model.as_ref())?;
        let mut rng = ChaCha8Rng::seed_from_u64(sc.seed);
        // Validators first, then each group of miners, then the spares joins draw from.
        let mut kinds: Vec<(&Group, bool, bool)> = Vec::new();
        for _ in 0..sc.validators.count {
            kinds.push((&sc.validators, true, false));
        }
        let first_bad = sc.miners[0].count - sc.bad_miners.count;
        for (g, group) in sc.miners.iter().enumerate() {
            for i in 0..group.count {
                kinds.push((group, false, g == 0 && i >= first_bad));
            }
        }
        let spare_start = kinds.len();
        for _ in 0..sc.spare_count() {
            kinds.push((&sc.miners[0], false, false));
        }
        let mut nodes = Vec::with_capacity(kinds.len());
        let mut links = Vec::with_capacity(kinds.len());
        let mut neurons = Vec::with_capacity(kinds.len());
        for (i, (group, validator, bad)) in kinds.iter().enumerate() {
            let mut secret =
                *blake3::hash(&[&sc.seed.to_le_bytes()[..], &(i as u64).to_le_bytes()].concat())
                    .as_bytes();
            let key = p2p::identity::Keypair::ed25519_from_bytes(&mut secret)
                .map_err(|e| anyhow::anyhow!("node key: {e}"))?;
            let id = crate::wire::peer::of(&key.public().to_peer_id());
            let class = GpuClass::named(&group.gpu)?;
            let flops = match &sc.host {
                Some(host) => {
                    host.tokens_per_core_s * cost.sample_flops() / cost.tokens_per_sample as f64
                }
                None => class.flops(),
            } / group.slowdown;
            let (up, down, latency) = if datacenter {
                (100e9 / 8.0, 100e9 / 8.0, 0.000_05)
            } else {
                (
                    group.up_mbit * 1e6 / 8.0,
                    group.down_mbit * 1e6 / 8.0,
                    draw_latency(&mut rng, group),
                )
            };
            links.push(Link { up, down, latency });
            neurons.push(LocalNeuron {
                peer_id: id.clone(),
                stake: if *validator {
                    100 * RAO_PER_TAO / (i as u64 + 1)
                } else {
                    0
                },
                validator_permit: *validator,
            });
            nodes.push(Node {
                id,
                validator: *validator,
                state: if i >= spare_start {
                    State::Spare
                } else {
                    State::Alive
                },
                flops,
                bad: *bad,
                counter: 0,
                plan: None,
                stage: None,
                ready: None,
                lifecycle: Lifecycle::default(),
                routing: Routing::default(),
                busy_until: 0.0,
                in_flight: 0,
                head: None,
                ready_at: 0.0,
                completed: 0,
                rate: None,
            });
        }
        let metagraph = Metagraph::for_local_run(neurons)?;
        let index: HashMap<PeerIdStr, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.clone(), i))
            .collect();
        let uid: HashMap<PeerIdStr, u16> = metagraph
            .neurons()
            .iter()
            .map(|n| (n.peer_id.clone(), n.uid))
            .collect();
        let validators: Vec<usize> = (0..sc.validators.count).collect();
        let mut orch = BTreeMap::new();
        for &v in &validators {
            let mut o = Orchestration::new(
                nodes[v].id.clone(),
                Role::Validator,
                run.clone(),
                Some(metagraph.clone()),
                None,
            );
            o.set_placement(placement);
            orch.insert(v, o);
        }
        let spot = validators
            .iter()
            .map(|&v| {
                let secret = *blake3::hash(
                    &[
                        &sc.seed.to_le_bytes()[..],
                        b"spot",
                        &(v as u64).to_le_bytes(),
                    ]
                    .concat(),
                )
                .as_bytes();
                (v, SpotSchedule::new(secret))
            })
            .collect();
        let spares = (spare_start..nodes.len()).rev().collect();
        let live = Arc::new(
            nodes
                .iter()
                .filter(|n| n.state == State::Alive)
                .map(|n| n.id.clone())
                .collect(),
        );
        let cores = sc.host.as_ref().map(|h| vec![0.0; h.cores]);
        let end = sc.duration_secs;
        Ok(Sim {
            sc,
            placement,
            datacenter,
            run,
            cost,
            now: 0.0,
            end,
            seq: 0,
            queue: BinaryHeap::new(),
            rng,
            origin: Instant::now(),
            nodes,
            index,
            uid,
            validators,
            orch,
            spot,
            links: Links::new(links),
            cores,
            live,
            plans: BTreeMap::new(),
            spot_bytes: 0.0,
            lifecycle_events: 0,
            lifecycle_refused: 0,
            merge_overruns: 0,
            merge_excluded: 0,
            merge_kept_local: 0,
            plan_bytes: BTreeMap::new(),
            plan_published: BTreeMap::new(),
            merges: BTreeMap::new(),
            merge_secs: BTreeMap::new(),
            samples: HashMap::new(),
            next_sample: 0,
            records: BTreeMap::new(),
            epoch_samples: BTreeMap::new(),
            tokens: 0,
            done: 0,
            dropped: 0,
            window_tokens: 0,
            window: (end / SERIES_POINTS).max(1.0),
            series: Vec::new(),
            events: Vec::new(),
            gossip: GossipFigures::default(),
            limits: BTreeMap::new(),
            spares,
            failed_at: None,
            failover_secs: None,
            first_plan: None,
            clasp: Vec::new(),
            unknowns_max: 0,
            bad_weight: Vec::new(),
        })
    }

    /// Records that a limit of `kind` was hit now; the first message of a kind is kept.
    fn limit(&mut self, kind: &'static str, message: String) {
        let now = self.now;
        self.limits
            .entry(kind)
            .and_modify(|l| l.1 += 1)
            .or_insert((now, 1, message));
    }

    fn at(&mut self, at: f64, ev: Ev) {
        self.seq += 1;
        let at = (at.max(self.now) * 1e9) as u64;
        self.queue.push(Reverse(Entry {
            at,
            seq: self.seq,
            ev,
        }));
    }

    fn since_start(&self) -> Duration {
        Duration::from_secs_f64(self.now)
    }

    /// Applies one event to miner `i`'s lifecycle at now, as the miner's task does: an
    /// event it refuses is counted and changes nothing.
    fn life(
        &mut self,
        i: usize,
        event: impl FnOnce(&mut Lifecycle, Duration) -> Result<Phase, LifecycleError>,
    ) {
        let now = self.since_start();
        match event(&mut self.nodes[i].lifecycle, now) {
            Ok(_) => self.lifecycle_events += 1,
            Err(_) => self.lifecycle_refused += 1,
        }
    }

    fn wall(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(WALL_ORIGIN_SECS) + self.since_start()
    }

    fn instant(&self) -> Instant {
        self.origin + self.since_start()
    }

    fn alive(&self, i: usize) -> bool {
        self.nodes[i].state == State::Alive
    }

    fn run(&mut self) {
        self.at(0.0, Ev::Heartbeats);
        self.at(TICK, Ev::Tick);
        self.at(self.window, Ev::Window);
        let churn = &self.sc.churn;
        if churn.leave_per_hour > 0.0 {
            let next = self.poisson(churn.leave_per_hour * self.sc.miner_count() as f64);
            self.at(next, Ev::Leave);
        }
        if churn.join_per_hour > 0.0 {
            let next = self.poisson(churn.join_per_hour * self.sc.miner_count() as f64);
            self.at(next, Ev::Join);
        }
        if let Some(at) = churn.validator_fails_at_secs {
            self.at(at, Ev::ValidatorFails);
        }
        for v in self.validators.clone() {
            let next = self.spot_delay(v);
            self.at(next, Ev::SpotCheck { node: v });
        }
        while let Some(Reverse(entry)) = self.queue.pop() {
            let t = entry.at as f64 / 1e9;
            if t > self.end {
                break;
            }
            self.now = t;
            self.handle(entry.ev);
        }
        self.now = self.end;
    }

    /// Seconds to the next event of a Poisson process of `per_hour` events an hour.
    fn poisson(&mut self, per_hour: f64) -> f64 {
        self.now + self.exp(3600.0 / per_hour.max(1e-9))
    }

    fn exp(&mut self, mean: f64) -> f64 {
        let u: f64 = self.rng.gen_range(f64::EPSILON..1.0);
        -u.ln() * mean
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Heartbeats => self.on_heartbeats(),
            Ev::Tick => self.on_tick(),
            Ev::Window => {
                self.series
                    .push((self.now, self.window_tokens as f64 / self.window));
                self.window_tokens = 0;
                self.at(self.now + self.window, Ev::Window);
            }
            Ev::Plan { node, epoch } => self.on_plan(node, epoch),
            Ev::MergeDone { epoch, stage } => self.on_merge_done(epoch, stage),
            Ev::Ready { node, epoch } => self.on_ready(node, epoch),
            Ev::Compute { node, sample, pass } => self.on_compute(node, sample, pass),
            Ev::Hop { to, sample } => self.on_hop(to, sample),
            Ev::HopFailed {
                sample,
                peer,
                penalise,
            } => self.on_hop_failed(sample, peer, penalise),
            Ev::Grad { stage, sample } => self.on_grad(stage, sample),
            Ev::SpotCheck { node } => self.on_spot_check(node),
            Ev::Leave => self.on_leave(),
            Ev::Join => self.on_join(),
            Ev::ValidatorFails => self.on_validator_fails(),
        }
    }

    // ---- liveness, election and plans ------------------------------------------------

    fn on_heartbeats(&mut self) {
        let run_hash = self.run.hash().to_hex();
        let wall_ms = crate::schedule::unix_ms(self.wall());
        let now = self.since_start();
        let mut beats = Vec::new();
        for node in self.nodes.iter_mut().filter(|n| n.state == State::Alive) {
            node.counter += 1;
            beats.push(Heartbeat {
                peer_id: node.id.to_string(),
                role: if node.validator {
                    Role::Validator
                } else {
                    Role::Miner
                },
                counter: node.counter,
                sent_at_ms: wall_ms,
                run_hash: run_hash.clone(),
                metagraph_hash: None,
                epoch: node.plan.as_ref().map(|p| p.epoch),
                stage: node.stage,
                dashboard: None,
                binding: None,
                dataset: None,
                capacity: None,
                pathway_rate: node
                    .rate
                    .map(|r| (r * 1000.0).round().clamp(0.0, f64::from(u32::MAX)) as u32),
            });
        }
        for beat in &mut beats {
            let i = self.index[beat.peer_id.as_str()];
            beat.capacity = self
                .capacity_of(i)
                .map(|c| (c * 1000.0).round().clamp(0.0, f64::from(u32::MAX)) as u32);
        }
        let size = beats.first().map_or(0.0, |b| b.to_bytes().len() as f64) + ENVELOPE;
        let n = beats.len();
        let copies = self.sc.gossip.mesh.min(n.saturating_sub(1)) as f64;
        self.gossip.heartbeat_messages += n as f64 * copies;
        self.gossip.heartbeat_bytes += n as f64 * copies * size;
        // Every node receives every heartbeat, about D times: past a tenth of a node's
        // download, liveness alone crowds out the pipeline's traffic.
        let per_sec = n as f64 * copies * size / HEARTBEAT;
        let slowest_down = self.links.slowest_down();
        if per_sec > 0.1 * slowest_down {
            self.limit(
                "heartbeats",
                format!(
                    "gossip: {n} nodes' heartbeats reach every node about {copies:.0} times, \
                     {:.1} Mbit/s a node, {:.0} % of the slowest download",
                    per_sec * 8.0 / 1e6,
                    100.0 * per_sec / slowest_down
                ),
            );
        }
        for (&v, orch) in self.orch.iter_mut() {
            if self.nodes[v].state != State::Alive {
                continue;
            }
            for beat in &beats {
                let author = &self.nodes[self.index[beat.peer_id.as_str()]].id;
                let _ = orch.on_heartbeat(author, beat, now, wall_ms);
            }
        }
        // Every miner routes among the peers live now.
        for node in self.nodes.iter_mut().filter(|n| !n.validator) {
            node.routing.live = self.live.clone();
        }
        self.at(self.now + HEARTBEAT, Ev::Heartbeats);
    }

    /// The samples a second miner `i` announces: its compute rate over one sample's work at
    /// its stage (what a node measures from its own backward passes).
    fn capacity_of(&self, i: usize) -> Option<f64> {
        let node = &self.nodes[i];
        if node.validator {
            return None;
        }
        let stage = node.stage.unwrap_or(0) as usize;
        let cost = self.cost.stages.get(stage)?;
        Some(node.flops / (cost.forward_flops + cost.backward_flops))
    }

    fn progress(&self, epoch: Option<u64>) -> EpochProgress {
        let Some(epoch) = epoch else {
            return EpochProgress {
                heads_done: false,
                merged: true,
            };
        };
        let merged = self
            .merges
            .range((epoch, 0)..(epoch, u32::MAX))
            .all(|(_, m)| m.done_at.is_some());
        let heads_done = self.plans.get(&epoch).is_some_and(|plan| {
            plan.miners_of(0).all(|h| {
                let i = self.index[h];
                !self.alive(i)
                    || self.nodes[i].head.as_ref().is_some_and(|head| {
                        head.epoch == epoch
                            && head.drawn >= head.quota
                            && head.in_flight == 0
                            && head.evals_left == 0
                    })
            })
        });
        EpochProgress { heads_done, merged }
    }

    fn on_tick(&mut self) {
        let now = self.since_start();
        let wall = self.wall();
        let mut published = Vec::new();
        for &v in &self.validators {
            if !self.alive(v) {
                continue;
            }
            let epoch = self.orch[&v].current().map(|p| p.epoch);
            let progress = self.progress(epoch);
            if let Some(orch) = self.orch.get_mut(&v) {
                if let Some(bytes) = orch.tick(now, wall, progress) {
                    published.push((v, bytes));
                }
            }
        }
        for (v, bytes) in published {
            self.publish(v, bytes);
        }
        let since = self.since_start();
        let mut overdue = Vec::new();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if node.state == State::Alive && !node.validator {
                if let Some(Overrun::Merge { epoch, late }) = node.lifecycle.tick(since) {
                    overdue.push((i, epoch, late));
                }
            }
        }
        for (i, epoch, late) in overdue {
            self.merge_overruns += 1;
            self.limit(
                "merge-overrun",
                format!(
                    "merges: miner {i}'s merge before epoch {epoch} passed its deadline by \
                     {:.1} s (its lifecycle's report)",
                    late.as_secs_f64()
                ),
            );
        }
        self.at(self.now + TICK, Ev::Tick);
    }

    fn subscribers(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.state == State::Alive)
            .count()
    }

    /// The link gossip spread is timed by: the first miner's (the first group is the largest
    /// in every scenario we ship), not a median over nodes.
    fn gossip_link(&self) -> Link {
        self.links
            .link(self.sc.validators.count.min(self.nodes.len() - 1))
    }

    fn publish(&mut self, author: usize, bytes: Vec<u8>) {
        let plan = match EpochPlan::from_wire(&bytes) {
            Ok(plan) => Arc::new(plan),
            Err(error) => {
                self.limit("plan-decode", format!("a plan did not decode: {error}"));
                return;
            }
        };
        let epoch = plan.epoch;
        if self.plans.contains_key(&epoch) {
            return;
        }
        if let Some((at, failed)) = &self.failed_at {
            if self.failover_secs.is_none() && plan.orchestrator != *failed {
                self.failover_secs = Some(self.now - at);
                self.events
                    .push((self.now, format!("plan {epoch} by the next validator")));
            }
        }
        self.first_plan.get_or_insert(self.now);
        if plan.assignment.len() >= bootstrap::MAX_PLAN_MINERS {
            self.limit(
                "plan-size",
                format!(
                "plans: {} live miners, a plan assigns at most {} (MAX_PLAN_MINERS); the rest wait",
                self.live.len() - self.validators.len(),
                bootstrap::MAX_PLAN_MINERS
            ),
            );
        }
        let n = self.subscribers();
        let (delay, copies) = spread(
            bytes.len() as f64 + ENVELOPE,
            n,
            self.sc.gossip.mesh,
            &self.gossip_link(),
        );
        self.gossip.plan_bytes += (bytes.len() as f64 + ENVELOPE) * copies as f64;
        self.gossip.total_messages += copies as f64;
        let previous = self
            .plans
            .range(..epoch)
            .next_back()
            .map(|(_, p)| p.clone());
        self.plans.insert(epoch, plan.clone());
        self.plan_bytes.insert(epoch, Arc::new(bytes));
        self.plan_published.insert(epoch, self.now);
        self.epoch_samples.insert(epoch, 0);
        // The merges closing the epoch before: each member starts as the plan reaches it.
        if let Some(previous) = previous {
            let transfers: Vec<MergeTransfers> = (0..previous.stages)
                .map(|stage| self.merge_transfers(&previous, stage, delay))
                .collect();
            let ends = self.merge_work(&transfers);
            for (stage, end) in ends.into_iter().enumerate() {
                self.start_merge(epoch, stage as u32, end);
            }
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].state != State::Alive {
                continue;
            }
            let at = if i == author { 0.0 } else { delay };
            self.at(self.now + at, Ev::Plan { node: i, epoch });
        }
    }

    fn on_plan(&mut self, i: usize, epoch: u64) {
        if !self.alive(i) {
            return;
        }
        let Some(plan) = self.plans.get(&epoch).cloned() else {
            return;
        };
        if self.nodes[i].validator {
            let author = plan.orchestrator.clone();
            let bytes = self.plan_bytes[&epoch].clone();
            let (now, wall) = (self.since_start(), self.wall());
            if let Some(orch) = self.orch.get_mut(&i) {
                if orch.current().map(|p| p.epoch) != Some(epoch) {
                    let _ = orch.on_plan(&author, &bytes, now, wall);
                }
            }
            return;
        }
        let node = &mut self.nodes[i];
        if node.plan.as_ref().is_some_and(|p| p.epoch >= epoch) {
            return;
        }
        let before = node.stage;
        node.plan = Some(plan.clone());
        node.stage = plan.stage_of(&node.id);
        node.ready = None;
        if let Some(head) = &mut node.head {
            // The old epoch's draws stop; what is in flight finishes.
            head.quota = head.drawn;
            head.evals_left = 0;
        }
        self.life(i, |l, now| l.planned(now, epoch));
        let Some(stage) = self.nodes[i].stage else {
            self.life(i, |l, now| l.draining(now, epoch));
            return;
        };
        let fetch = before != Some(stage);
        if !fetch {
            // The miner merges the stage it kept, due by the plan's merge start plus the
            // merge's phases (the node's deadline).
            let len = self.cost.stages[stage as usize].params;
            let made = self.plan_published.get(&epoch).copied().unwrap_or(self.now);
            let due = made + MERGE_DELAY.as_secs_f64() + merge_budget(len).as_secs_f64();
            let deadline = Duration::from_secs_f64(due.max(self.now));
            self.life(i, |l, now| l.merging(now, epoch, deadline));
        }
        match self.merges.get_mut(&(epoch, stage)) {
            Some(merge) if merge.done_at.is_none() => merge.waiting.push((i, fetch)),
            Some(_) | None => {
                let at = self.now
                    + if fetch {
                        self.fetch_secs(i, stage)
                    } else {
                        0.0
                    };
                self.at(at, Ev::Ready { node: i, epoch });
            }
        }
    }

    /// Time for miner `i` to fetch `stage`'s weights from a replica.
    fn fetch_secs(&self, i: usize, stage: u32) -> f64 {
        let bytes = self.cost.stages[stage as usize].params as f64 * MERGE_VALUE_BYTES;
        let link = self.links.link(i);
        bytes / link.down + 4.0 * link.latency
    }

    /// The transfers and decisions of the merge of `closed`'s `stage` when the next plan
    /// has spread (`delay` after now). Its deadlines count from the plan's merge
    /// start, [`MERGE_DELAY`] after the plan was made, but a member begins at once (as the
    /// node's merge service does), from a snapshot its compute thread takes once the pass it
    /// is on is done.
    fn merge_transfers(&mut self, closed: &EpochPlan, stage: u32, delay: f64) -> MergeTransfers {
        let ids: Vec<PeerIdStr> = closed
            .miners_of(stage)
            .filter(|m| self.alive(self.index[*m]))
            .cloned()
            .collect();
        let len = self.cost.stages[stage as usize].params;
        let nothing = MergeTransfers {
            done: self.now + delay,
            began: self.now + delay,
            moved: Vec::new(),
            work: 0.0,
        };
        if ids.len() < 2 {
            return nothing;
        }
        match plan_of(closed.seed, stage, &ids, len) {
            Ok(plan) => {
                let (done, began, moved) = self.run_merge(plan, closed.epoch, stage, delay);
                MergeTransfers {
                    done,
                    began,
                    moved,
                    work: MERGE_CORE_S_PER_BYTE * len as f64 * MERGE_VALUE_BYTES,
                }
            }
            Err(error) => {
                self.limit(
                    "merge-members",
                    format!(
                        "merges: stage of {} replicas refused ({error}); its replicas drift apart",
                        ids.len()
                    ),
                );
                nothing
            }
        }
    }

    /// When each stage's merge ends: its members' own work (snapshot, hashes, framing,
    /// verifying, averaging, the checkpoint), after its transfers. On a shared host the
    /// transfers take the host's cores too (Noise and Yamux: [`TRANSPORT_CORE_S_PER_BYTE`]),
    /// from when they begin, and a member's work waits for both its transfers and their CPU;
    /// every job takes one of the host's cores in the order it becomes ready, so merges
    /// whose transfers end at different times overlap less, as they do live. Elsewhere each
    /// member has its own machine.
    fn merge_work(&mut self, transfers: &[MergeTransfers]) -> Vec<f64> {
        let mut ends: Vec<f64> = transfers.iter().map(|t| t.done).collect();
        if self.cores.is_none() {
            for (end, t) in ends.iter_mut().zip(transfers) {
                if !t.moved.is_empty() {
                    *end += t.work;
                }
            }
            return ends;
        }
        // (ready, stage, member) of each transfer's CPU, then of each member's own work.
        let mut moving: Vec<(f64, usize, usize)> = transfers
            .iter()
            .enumerate()
            .flat_map(|(s, t)| (0..t.moved.len()).map(move |m| (t.began, s, m)))
            .collect();
        moving.sort_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        let mut working = Vec::with_capacity(moving.len());
        for (ready, s, m) in moving {
            let moved =
                self.host_job_from(ready, transfers[s].moved[m] * TRANSPORT_CORE_S_PER_BYTE);
            working.push((moved.max(transfers[s].done), s));
        }
        working.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (ready, s) in working {
            let end = self.host_job_from(ready, transfers[s].work);
            ends[s] = ends[s].max(end);
        }
        ends
    }

    /// Records the merge of `stage` that opens `epoch`, ending at `end`.
    fn start_merge(&mut self, epoch: u64, stage: u32, end: f64) {
        let entry = self.merge_secs.entry(epoch).or_insert(0.0);
        *entry = entry.max(end - self.now);
        self.merges.insert(
            (epoch, stage),
            Merge {
                done_at: None,
                waiting: Vec::new(),
            },
        );
        self.at(end, Ev::MergeDone { epoch, stage });
    }

    /// One stage merge on the node's deadlines (commit by the merge start plus a phase,
    /// claims by three phases, done by five), its decisions taken by the butterfly
    /// protocol's own [`Ledger`] fed the members' commitments and the holders' claims at
    /// the times they arrive: a commitment after the deadline leaves its member out, a
    /// partition without a claim by the claims deadline keeps local values, a member
    /// fetches each average it does not hold from the source the ledger names. Returns
    /// when the last member's transfers are done, when the transfers began, and the bytes
    /// each member (in the plan's order) sent and received.
    fn run_merge(
        &mut self,
        plan: Plan,
        epoch: u64,
        stage: u32,
        delay: f64,
    ) -> (f64, f64, Vec<f64>) {
        let n = plan.members().len();
        let partitions = plan.partitions();
        let len = plan.len();
        let node_of: Vec<usize> = (0..n).map(|m| self.index[plan.member(m)]).collect();
        let phase = phase_for(len).as_secs_f64();
        let merge_start = self.now + MERGE_DELAY.as_secs_f64();
        let (commit_by, claims_by, done_by) = (
            merge_start + phase,
            merge_start + 3.0 * phase,
            merge_start + 5.0 * phase,
        );
        let link = self.gossip_link();
        let commit_bytes = 100.0 + 32.0 * partitions as f64;
        let (commit_spread, copies) =
            spread(commit_bytes + ENVELOPE, n, self.sc.gossip.mesh, &link);
        let claims_bytes = 150.0 * partitions as f64 * 2.0 / n as f64;
        let (claim_spread, _) = spread(claims_bytes + ENVELOPE, n, self.sc.gossip.mesh, &link);
        self.gossip.merge_bytes +=
            (commit_bytes + claims_bytes + 2.0 * ENVELOPE) * copies as f64 * n as f64;
        let hash = |tag: &[u8], a: u64, b: u64| {
            Hash::of_bytes(
                &[
                    tag,
                    &epoch.to_le_bytes(),
                    &a.to_le_bytes(),
                    &b.to_le_bytes(),
                ]
                .concat(),
            )
        };
        let plan = Arc::new(plan);
        let mut ledger = Ledger::new(epoch, stage, Arc::clone(&plan), plan.member(0).to_string());
        // Commit: each member from its snapshot, heard by all a spread later.
        let begin: Vec<f64> = node_of
            .iter()
            .map(|&i| (self.now + delay).max(self.nodes[i].busy_until))
            .collect();
        let mut arrivals: Vec<(f64, usize)> =
            (0..n).map(|m| (begin[m] + commit_spread, m)).collect();
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
        for &(at, m) in &arrivals {
            let commitment = Commitment {
                epoch,
                stage,
                member: plan.member(m).to_string(),
                samples: 1,
                partition_hashes: (0..partitions)
                    .map(|p| hash(b"input", m as u64, p as u64))
                    .collect(),
            };
            ledger.observe(
                plan.member(m),
                Gossip::Commitment(commitment),
                at <= commit_by,
            );
        }
        let on_time = ledger.on_time();
        let excluded = n - on_time.len();
        let last_commit = arrivals.last().map_or(self.now, |a| a.0);
        let committed = if excluded == 0 {
            last_commit
        } else {
            commit_by
        };
        // Hold: each on-time holder fetches every other on-time member's input of what it
        // holds, then publishes its claim.
        // A claim names its included members sorted by id, their inputs' hashes in that order.
        let mut indices: Vec<usize> = on_time.iter().copied().collect();
        indices.sort_by(|a, b| plan.member(*a).cmp(plan.member(*b)));
        let included: Vec<String> = indices
            .iter()
            .map(|&m| plan.member(m).to_string())
            .collect();
        let mut up = vec![0.0f64; n];
        let mut down = vec![0.0f64; n];
        for p in 0..partitions {
            let bytes = plan.range(p).len() as f64 * MERGE_VALUE_BYTES;
            for h in plan.holders(p).into_iter().filter(|h| on_time.contains(h)) {
                for &m in on_time.iter().filter(|&&m| m != h) {
                    up[m] += bytes;
                    down[h] += bytes;
                }
            }
        }
        let served_from = on_time.iter().map(|&m| begin[m]).fold(committed, f64::max);
        let slowest_upload = on_time
            .iter()
            .map(|&m| up[m] / self.links.link(node_of[m]).up)
            .fold(0.0, f64::max);
        let mut claims: Vec<(f64, SliceHash)> = Vec::new();
        for p in 0..partitions {
            for h in plan.holders(p).into_iter().filter(|h| on_time.contains(h)) {
                let l = self.links.link(node_of[h]);
                let held = served_from + (down[h] / l.down).max(slowest_upload) + 4.0 * l.latency;
                claims.push((
                    held + claim_spread,
                    SliceHash {
                        epoch,
                        stage,
                        partition: p as u32,
                        round: 0,
                        holder: plan.member(h).to_string(),
                        included: included.clone(),
                        input_hashes: indices
                            .iter()
                            .map(|&m| hash(b"input", m as u64, p as u64))
                            .collect(),
                        result: hash(b"average", p as u64, on_time.len() as u64),
                    },
                ));
            }
        }
        claims.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut last_claim = served_from;
        for (at, claim) in claims {
            if at > claims_by {
                continue;
            }
            last_claim = last_claim.max(at);
            let holder = claim.holder.clone();
            ledger.observe(&holder, Gossip::SliceHash(claim), true);
        }
        let settled = if ledger.all_settled() {
            last_claim
        } else {
            claims_by
        };
        // Collect: every member takes each partition as the ledger decides.
        let mut out_up = vec![0.0f64; n];
        let mut out_down = vec![0.0f64; n];
        let mut kept = 0usize;
        for p in 0..partitions {
            let bytes = plan.range(p).len() as f64 * MERGE_VALUE_BYTES;
            let holders = plan.holders(p);
            for (m, fetched) in out_down.iter_mut().enumerate() {
                match ledger.decide(p, Some(m)) {
                    Decision::Accept { sources, .. } => {
                        if let Some(&source) = sources.first() {
                            if source != m && !holders.contains(&m) {
                                out_up[source] += bytes;
                                *fetched += bytes;
                            }
                        }
                    }
                    Decision::KeepLocal | Decision::Dispute { .. } => kept += 1,
                }
            }
        }
        let collected = (0..n)
            .map(|m| {
                let l = self.links.link(node_of[m]);
                (out_up[m] / l.up).max(out_down[m] / l.down) + 4.0 * l.latency
            })
            .fold(0.0, f64::max);
        let done = (settled + collected).min(done_by);
        if excluded > 0 || kept > 0 {
            self.limit(
                "merge-budget",
                format!(
                    "merges: a stage of {n} replicas and {len} values misses its deadlines \
                     (phase {phase:.1} s): {excluded} commitment(s) late, {kept} \
                     member-partitions kept local values"
                ),
            );
        }
        self.merge_excluded += excluded as u64;
        self.merge_kept_local += kept as u64;
        let moved = (0..n)
            .map(|m| up[m] + down[m] + out_up[m] + out_down[m])
            .collect();
        (done, served_from, moved)
    }

    fn on_merge_done(&mut self, epoch: u64, stage: u32) {
        let waiting = match self.merges.get_mut(&(epoch, stage)) {
            Some(merge) => {
                merge.done_at = Some(self.now);
                std::mem::take(&mut merge.waiting)
            }
            None => return,
        };
        for (i, fetch) in waiting {
            let at = self.now
                + if fetch {
                    self.fetch_secs(i, stage)
                } else {
                    0.0
                };
            self.at(at, Ev::Ready { node: i, epoch });
        }
    }

    fn on_ready(&mut self, i: usize, epoch: u64) {
        if !self.alive(i) {
            return;
        }
        let node = &mut self.nodes[i];
        let Some(plan) = node.plan.clone().filter(|p| p.epoch == epoch) else {
            return;
        };
        node.ready = Some(epoch);
        node.ready_at = self.now;
        let now = Duration::from_secs_f64(self.now);
        match node.lifecycle.training(now, epoch) {
            Ok(_) => self.lifecycle_events += 1,
            Err(_) => self.lifecycle_refused += 1,
        }
        let node = &mut self.nodes[i];
        node.completed = 0;
        if node.stage == Some(0) {
            let index = plan.miners_of(0).position(|h| *h == node.id).unwrap_or(0);
            node.head = Some(Head {
                epoch,

                quota: plan.samples_of(&node.id),
                drawn: 0,
                in_flight: node.head.as_ref().map_or(0, |h| h.in_flight),
                evals_left: if index == 0 { VAL_BATCHES } else { 0 },
            });
            self.draw(i);
        }
    }

    // ---- samples -----------------------------------------------------------------------

    fn draw(&mut self, i: usize) {
        loop {
            let window = self.sc.head_window;
            let node = &mut self.nodes[i];
            let Some(plan) = node.plan.clone() else {
                return;
            };
            let Some(head) = &mut node.head else {
                return;
            };
            if head.epoch != plan.epoch || node.ready != Some(plan.epoch) {
                return;
            }
            let eval = head.evals_left > 0;
            // Held-out batches go one at a time before the samples (the first head's).
            let room = if eval {
                head.in_flight == 0
            } else {
                head.in_flight < window && head.drawn < head.quota
            };
            if !room {
                return;
            }
            let mut drained = false;
            if eval {
                head.evals_left -= 1;
            } else {
                head.drawn += 1;
                drained = head.drawn == head.quota;
            }
            head.in_flight += 1;
            let id = self.next_sample;
            self.next_sample += 1;
            self.samples.insert(
                id,
                Sample {
                    epoch: plan.epoch,
                    plan: plan.clone(),
                    head: i,
                    path: vec![i],
                    sent_at: Vec::new(),
                    attempt: 0,
                    tried: BTreeSet::new(),
                    eval,
                },
            );
            let pass = if plan.stages == 1 {
                Pass::Tail
            } else {
                Pass::Forward
            };
            if drained {
                let epoch = plan.epoch;
                self.life(i, |l, now| l.draining(now, epoch));
            }
            self.compute(i, id, pass);
        }
    }

    fn compute(&mut self, i: usize, sample: u64, pass: Pass) {
        let eval = self.samples.get(&sample).is_some_and(|s| s.eval);
        let stage = self.samples.get(&sample).map_or(0, |s| s.path.len() - 1);
        let cost = &self.cost.stages[stage];
        let flops = match (pass, eval) {
            (Pass::Forward, _) | (Pass::Tail, true) => cost.forward_flops,
            (Pass::Tail, false) => cost.forward_flops + cost.backward_flops,
            (Pass::Backward, _) => cost.backward_flops,
        };
        let secs = flops / self.nodes[i].flops;
        let done = self.run_job(i, secs);
        self.at(
            done,
            Ev::Compute {
                node: i,
                sample,
                pass,
            },
        );
    }

    /// Runs `secs` of compute on node `i` (one compute thread a node, as in the node);
    /// returns when it ends.
    fn run_job(&mut self, i: usize, secs: f64) -> f64 {
        self.run_job_from(i, self.now, secs)
    }

    /// [`Self::run_job`], the job being ready at `from` (not before now).
    fn run_job_from(&mut self, i: usize, from: f64, secs: f64) -> f64 {
        let ready = from.max(self.now).max(self.nodes[i].busy_until);
        let done =
            match &mut self.cores {
                None => ready + secs,
                Some(cores) => {
                    let (core, free) = cores.iter().copied().enumerate().fold(
                        (0, f64::INFINITY),
                        |best, (c, f)| if f < best.1 { (c, f) } else { best },
                    );
                    let start = ready.max(free);
                    cores[core] = start + secs;
                    start + secs
                }
            };
        self.nodes[i].busy_until = done;
        done
    }

    /// Takes `secs` of the shared cores outside any node's compute thread.
    fn host_job(&mut self, secs: f64) {
        self.host_job_from(self.now, secs);
    }

    /// [`Self::host_job`], the job being ready at `ready`: it takes the core that frees
    /// first, and returns when it ends (`ready + secs` without shared cores). A job with
    /// nothing to do takes no core (it would hold one idle until it is ready).
    fn host_job_from(&mut self, ready: f64, secs: f64) -> f64 {
        if secs <= 0.0 {
            return ready;
        }
        match self
            .cores
            .as_mut()
            .and_then(|cores| cores.iter_mut().min_by(|a, b| a.total_cmp(b)))
        {
            Some(free) => {
                *free = free.max(ready) + secs;
                *free
            }
            None => ready + secs,
        }
    }

    fn on_compute(&mut self, i: usize, id: u64, pass: Pass) {
        let Some(sample) = self.samples.get(&id) else {
            return;
        };
        let stage = sample.path.len() - 1;
        if !self.alive(i) {
            if stage == 0 {
                self.drop_sample(id);
            } else {
                let sender = sample.path[stage - 1];
                let at = self.now + self.links.round_trip(sender, i);
                if let Some(s) = self.samples.get_mut(&id) {
                    s.path.pop();
                }
                self.at(
                    at,
                    Ev::HopFailed {
                        sample: id,
                        peer: i,
                        penalise: true,
                    },
                );
            }
            return;
        }
        match pass {
            Pass::Forward => self.send_forward(id),
            Pass::Tail => {
                let eval = sample.eval;
                if !eval {
                    self.record_loss(id);
                    if let Some(host) = &self.sc.host {
                        self.host_job(host.overhead_core_s_per_sample);
                    }
                }
                self.nodes[i].in_flight = self.nodes[i].in_flight.saturating_sub(1);
                if stage == 0 {
                    self.complete(id);
                } else {
                    let bytes = if eval {
                        64.0
                    } else {
                        self.cost.activation_bytes
                    };
                    let to = self.samples[&id].path[stage - 1];
                    let at = self.links.send(i, to, bytes, self.now);
                    self.at(
                        at,
                        Ev::Grad {
                            stage: stage as u32 - 1,
                            sample: id,
                        },
                    );
                }
            }
            Pass::Backward => {
                if stage == 0 {
                    self.complete(id);
                } else {
                    self.nodes[i].in_flight = self.nodes[i].in_flight.saturating_sub(1);
                    let to = self.samples[&id].path[stage - 1];
                    let at = self.links.send(i, to, self.cost.activation_bytes, self.now);
                    self.at(
                        at,
                        Ev::Grad {
                            stage: stage as u32 - 1,
                            sample: id,
                        },
                    );
                }
            }
        }
    }

    /// Sends sample `id` from the last miner on its path to a replica of the next stage.
    fn send_forward(&mut self, id: u64) {
        let instant = self.instant();
        let Some(sample) = self.samples.get(&id) else {
            return;
        };
        let from = *sample.path.last().unwrap_or(&sample.head);
        let next = sample.path.len() as u32;
        let choice = choose_replica(
            &self.nodes[from].routing,
            &sample.plan,
            next,
            id,
            sample.attempt,
            &sample.tried,
            instant,
        );
        let Some(to) = choice.map(|peer| self.index[&peer]) else {
            self.drop_sample(id);
            return;
        };
        // An evaluation's activation is a sample's: the same batch shape, forward only.
        let bytes = self.cost.activation_bytes;
        let lost = self.sc.gossip.hop_loss > 0.0 && self.rng.gen_bool(self.sc.gossip.hop_loss);
        let at = self.links.send(from, to, bytes, self.now);
        let to_id = self.nodes[to].id.clone();
        if let Some(sample) = self.samples.get_mut(&id) {
            sample.tried.insert(to_id);
            sample.sent_at.truncate(next as usize - 1);
            sample.sent_at.push(self.now);
        }
        if lost {
            self.at(
                self.now + HOP_TIMEOUT.as_secs_f64(),
                Ev::HopFailed {
                    sample: id,
                    peer: to,
                    penalise: true,
                },
            );
        } else {
            self.at(at, Ev::Hop { to, sample: id });
        }
    }

    fn on_hop(&mut self, to: usize, id: u64) {
        let Some(sample) = self.samples.get(&id) else {
            return;
        };
        let stage = sample.path.len() as u32;
        let node = &self.nodes[to];
        let holds = node.plan.as_ref().is_some_and(|p| p.epoch >= sample.epoch)
            && node.ready.is_some()
            && sample.plan.stage_of(&node.id) == Some(stage)
            && node.stage == Some(stage);
        let sender = *sample.path.last().unwrap_or(&sample.head);
        // A receiver that holds the sample's plan and stage but is still merging or
        // fetching its weights holds the request until its stage is in place (the node's
        // epoch gate), up to the hop's timeout.
        let sent = sample.sent_at.last().copied().unwrap_or(self.now);
        let preparing = match node.lifecycle.phase() {
            Phase::Planned { epoch } | Phase::Merging { epoch, .. } => epoch == sample.epoch,
            _ => false,
        };
        let waits = self.alive(to)
            && preparing
            && sample.plan.stage_of(&node.id) == Some(stage)
            && self.now - sent < HOP_TIMEOUT.as_secs_f64();
        if waits {
            self.at(self.now + GATE_POLL, Ev::Hop { to, sample: id });
            return;
        }
        if !self.alive(to) || !holds || node.in_flight >= MAX_IN_FLIGHT {
            // Refused (busy, not ready) or gone: the sender hears it a round trip later. A
            // refusal is not a failure of the peer; a peer that is gone is penalised.
            let penalise = !self.alive(to);
            let at = self.now + self.links.round_trip(sender, to);
            self.at(
                at,
                Ev::HopFailed {
                    sample: id,
                    peer: to,
                    penalise,
                },
            );
            return;
        }
        self.nodes[to].in_flight += 1;
        let last = stage + 1 == sample.plan.stages;
        if let Some(sample) = self.samples.get_mut(&id) {
            sample.path.push(to);
        }
        self.compute(to, id, if last { Pass::Tail } else { Pass::Forward });
    }

    fn on_hop_failed(&mut self, id: u64, peer: usize, penalise: bool) {
        let instant = self.instant();
        let Some(sample) = self.samples.get_mut(&id) else {
            return;
        };
        let sender = *sample.path.last().unwrap_or(&sample.head);
        sample.attempt += 1;
        let give_up = sample.attempt >= ATTEMPTS;
        if penalise {
            let peer_id = self.nodes[peer].id.clone();
            self.nodes[sender].routing.penalise(peer_id, instant);
        }
        if give_up || !self.alive(sender) {
            self.drop_sample(id);
        } else {
            self.send_forward(id);
        }
    }

    fn on_grad(&mut self, stage: u32, id: u64) {
        let Some(sample) = self.samples.get_mut(&id) else {
            return;
        };
        let me = sample.path[stage as usize];
        let peer = sample.path[stage as usize + 1];
        let took = self.now
            - sample
                .sent_at
                .get(stage as usize)
                .copied()
                .unwrap_or(self.now);
        sample.path.truncate(stage as usize + 1);
        sample.attempt = 0;
        sample.tried.clear();
        let eval = sample.eval;
        if !self.alive(me) {
            self.drop_sample(id);
            return;
        }
        let peer_id = self.nodes[peer].id.clone();
        self.nodes[me]
            .routing
            .observe(peer_id, Duration::from_secs_f64(took.max(0.0)));
        if eval {
            // An evaluation's reply goes straight back: no backward pass.
            if stage == 0 {
                self.complete(id);
            } else {
                self.nodes[me].in_flight = self.nodes[me].in_flight.saturating_sub(1);
                let to = self.samples[&id].path[stage as usize - 1];
                let at = self.links.send(me, to, 64.0, self.now);
                self.at(
                    at,
                    Ev::Grad {
                        stage: stage - 1,
                        sample: id,
                    },
                );
            }
            return;
        }
        self.compute(me, id, Pass::Backward);
    }

    fn record_loss(&mut self, id: u64) {
        let sample = &self.samples[&id];
        let bad: f64 = sample.path.iter().filter(|&&m| self.nodes[m].bad).count() as f64
            * self.sc.bad_miners.loss_increase;
        let pathway: Vec<u16> = sample
            .path
            .iter()
            .map(|&m| self.uid[&self.nodes[m].id])
            .collect();
        let hops = pathway.len() as f64;
        let epoch = sample.epoch;
        let noise: f64 = (0..4).map(|_| self.rng.gen_range(-0.1..0.1)).sum();
        let loss = 2.0 + 1.5 * (-self.now / 1800.0).exp() + noise + bad;
        let records = self.records.entry(epoch).or_default();
        let order = records.len() as u64;
        records.push(attribution::Record {
            order,
            pathway,
            loss,
        });
        if records.len() % LOSS_BATCH == 0 {
            let size = LOSS_BATCH as f64 * (LOSS_RECORD + LOSS_RECORD_HOP * hops) + ENVELOPE;
            let copies = self
                .sc
                .gossip
                .mesh
                .min(self.subscribers().saturating_sub(1)) as f64;
            self.gossip.loss_bytes += size * copies;
            self.gossip.total_messages += copies;
        }
    }

    fn complete(&mut self, id: u64) {
        let Some(sample) = self.samples.remove(&id) else {
            return;
        };
        let now = self.now;
        let head = &mut self.nodes[sample.head];
        if !sample.eval {
            head.completed += 1;
        }
        if let Some(h) = &mut head.head {
            h.in_flight = h.in_flight.saturating_sub(1);
            let finished = h.epoch == sample.epoch
                && h.drawn >= h.quota
                && h.in_flight == 0
                && h.evals_left == 0;
            if finished && head.completed > 0 && now > head.ready_at {
                head.rate = Some(head.completed as f64 / (now - head.ready_at));
            }
        }
        if !sample.eval {
            self.tokens += self.cost.tokens_per_sample;
            self.window_tokens += self.cost.tokens_per_sample;
            self.done += 1;
            *self.epoch_samples.entry(sample.epoch).or_default() += 1;
        }
        self.draw(sample.head);
    }

    fn drop_sample(&mut self, id: u64) {
        let Some(sample) = self.samples.remove(&id) else {
            return;
        };
        for &m in sample.path.iter().skip(1) {
            self.nodes[m].in_flight = self.nodes[m].in_flight.saturating_sub(1);
        }
        if !sample.eval {
            self.dropped += 1;
        }
        if let Some(h) = &mut self.nodes[sample.head].head {
            h.in_flight = h.in_flight.saturating_sub(1);
        }
        if self.alive(sample.head) {
            self.draw(sample.head);
        }
    }

    /// Seconds to validator `v`'s next spot-check tick (its schedule's ½–1½ s).
    fn spot_delay(&mut self, v: usize) -> f64 {
        self.spot
            .get_mut(&v)
            .map_or(1.0, |s| s.next_delay().as_secs_f64())
    }

    /// A spot-check tick of validator `v`, as the node's checker runs them: one check at a
    /// time, the next a tick of its schedule after the last one ended. A check fetches a
    /// random miner's evidence (that stage's f32 weights and the sample's frames: the output
    /// at the head, input and gradient sent back at the tail, both frames and both
    /// gradients in the middle) as a bulk transfer sharing that miner's upload, then
    /// recomputes the stage's passes on the validator's compute thread.
    fn on_spot_check(&mut self, v: usize) {
        if !self.alive(v) {
            return;
        }
        let plan = self.plans.values().next_back().cloned();
        let checked = plan.and_then(|plan| {
            let stage = self.rng.gen_range(0..plan.stages);
            let miners: Vec<usize> = plan
                .miners_of(stage)
                .map(|m| self.index[m])
                .filter(|&i| self.alive(i))
                .collect();
            let pick = self.rng.gen_range(0..miners.len().max(1));
            miners.get(pick).map(|&m| (m, stage as usize))
        });
        let Some((miner, stage)) = checked else {
            let next = self.now + self.spot_delay(v);
            self.at(next, Ev::SpotCheck { node: v });
            return;
        };
        let last = self.cost.stages.len() - 1;
        let frames = match stage {
            0 => 1.0,
            s if s == last => 2.0,
            _ => 4.0,
        };
        let cost = &self.cost.stages[stage];
        let (params, flops) = (cost.params, cost.forward_flops + cost.backward_flops);
        let bytes = params as f64 * 4.0 + frames * self.cost.activation_bytes;
        self.spot_bytes += bytes;
        let landed = self.links.send_bulk(miner, v, bytes, self.now);
        let secs = flops / self.nodes[v].flops;
        let done = self.run_job_from(v, landed, secs);
        let next = done + self.spot_delay(v);
        self.at(next, Ev::SpotCheck { node: v });
    }

    // ---- churn ---------------------------------------------------------------------------

    fn refresh_live(&mut self) {
        self.live = Arc::new(
            self.nodes
                .iter()
                .filter(|n| n.state == State::Alive)
                .map(|n| n.id.clone())
                .collect(),
        );
    }

    fn on_leave(&mut self) {
        let alive: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| !self.nodes[i].validator && self.alive(i))
            .collect();
        if alive.len() > 1 {
            let i = alive[self.rng.gen_range(0..alive.len())];
            self.nodes[i].state = State::Gone;
            self.events.push((self.now, "leave".to_owned()));
            self.refresh_live();
        }
        let rate = self.sc.churn.leave_per_hour * alive.len() as f64;
        let next = self.poisson(rate);
        self.at(next, Ev::Leave);
    }

    fn on_join(&mut self) {
        if let Some(i) = self.spares.pop() {
            self.nodes[i].state = State::Alive;
            self.events.push((self.now, "join".to_owned()));
            self.refresh_live();
        } else {
            self.limit(
                "spares",
                "scenario: ran out of spare miners for joins".to_owned(),
            );
        }
        let next = self.poisson(self.sc.churn.join_per_hour * self.sc.miner_count() as f64);
        self.at(next, Ev::Join);
    }

    fn on_validator_fails(&mut self) {
        let duty = self
            .validators
            .iter()
            .find(|&&v| self.alive(v) && self.orch[&v].is_orchestrator())
            .copied();
        if let Some(v) = duty {
            self.nodes[v].state = State::Gone;
            self.failed_at = Some((self.now, self.nodes[v].id.clone()));
            self.events
                .push((self.now, "orchestrator fails".to_owned()));
            self.refresh_live();
        }
    }

    // ---- figures -------------------------------------------------------------------------

    fn fit_clasp(&mut self, costs: &mut WallCosts) {
        let bad: BTreeSet<u16> = self
            .nodes
            .iter()
            .filter(|n| n.bad)
            .map(|n| self.uid[&n.id])
            .collect();
        let epochs: Vec<u64> = self.records.keys().copied().collect();
        for epoch in epochs {
            let records = &self.records[&epoch];
            let Some(plan) = self.plans.get(&epoch) else {
                continue;
            };
            let unknowns = plan.assignment.len();
            self.unknowns_max = self.unknowns_max.max(unknowns);
            if unknowns > CLASP_MAX_UNKNOWNS {
                self.limit(
                    "clasp-size",
                    format!(
                    "CLASP: {unknowns} unknowns a fit; its dense least squares is cubic in them \
                     (not run past {CLASP_MAX_UNKNOWNS} here)"
                ),
                );
                continue;
            }
            if records.len() < 2 * unknowns {
                continue;
            }
            let fit = Instant::now();
            let estimate = attribution::estimate(records, &attribution::Config::default());
            let secs = fit.elapsed().as_secs_f64();
            if secs > costs.clasp_fit_secs_max {
                costs.clasp_fit_secs_max = secs;
                costs.clasp_fit_unknowns = unknowns;
            }
            let Ok(estimate) = estimate else {
                continue;
            };
            let (mut tp, mut bad_n, mut fp, mut honest_n) = (0, 0, 0, 0);
            let mut scores = Vec::new();
            for effect in &estimate.miners {
                if !effect.comparable {
                    continue;
                }
                if bad.contains(&effect.miner) {
                    bad_n += 1;
                    tp += usize::from(effect.flagged);
                } else {
                    honest_n += 1;
                    fp += usize::from(effect.flagged);
                }
                let score = if effect.flagged {
                    0.0
                } else {
                    effect.samples as f64
                };
                scores.push((effect.miner, score));
            }
            self.clasp.push((1, tp, bad_n, fp, honest_n));
            // Every validator hears the same records: each publishes the same weights, and
            // the consensus runs over them as the node's does.
            if let Ok(weights) = attribution::to_chain(&scores) {
                let validators: Vec<usize> = self.validators.clone();
                for &v in &validators {
                    let author = self.nodes[v].id.clone();
                    for orch in self.orch.values_mut() {
                        orch.on_weights(author.clone(), epoch, weights.clone());
                    }
                }
                if let Some(consensus) = self
                    .orch
                    .values()
                    .next()
                    .and_then(|o| o.consensus_weights())
                {
                    let total: f64 = consensus.miners.iter().map(|m| m.incentive).sum();
                    let to_bad: f64 = consensus
                        .miners
                        .iter()
                        .filter(|m| bad.contains(&m.uid))
                        .map(|m| m.incentive)
                        .sum();
                    if total > 0.0 {
                        self.bad_weight.push(to_bad / total);
                    }
                }
            }
        }
    }

    fn outcome(mut self, costs: &mut WallCosts) -> Outcome {
        if self.sc.bad_miners.count > 0 {
            self.fit_clasp(costs);
        }
        let start = self.first_plan.unwrap_or(0.0);
        let span = (self.end - start).max(1e-9);
        let mut epochs = Vec::new();
        let published: Vec<(u64, f64)> =
            self.plan_published.iter().map(|(e, t)| (*e, *t)).collect();
        for (k, &(epoch, at)) in published.iter().enumerate() {
            let Some(&(_, next)) = published.get(k + 1) else {
                break;
            };
            epochs.push(EpochFigures {
                epoch,
                start: at,
                secs: next - at,
                merge_secs: self.merge_secs.get(&epoch).copied().unwrap_or(0.0),
                samples: self.epoch_samples.get(&epoch).copied().unwrap_or(0),
                miners: self.plans[&epoch].assignment.len(),
                moved: self
                    .plans
                    .range(..epoch)
                    .next_back()
                    .map_or(0, |(_, before)| {
                        self.plans[&epoch]
                            .assignment
                            .iter()
                            .filter(|(m, s)| before.stage_of(m).is_some_and(|b| b != **s))
                            .count()
                    }),
                plan_bytes: self.plan_bytes[&epoch].len(),
            });
        }
        let n_epochs = epochs.len().max(1) as f64;
        let mean = |f: &dyn Fn(&EpochFigures) -> f64| epochs.iter().map(f).sum::<f64>() / n_epochs;
        let mean_epoch_secs = mean(&|e| e.secs);
        // A merge's length is averaged over the epochs that began with one (the first plan
        // has nothing to merge), as the live runs' "longest merge of an epoch" is; the time
        // left to training counts every epoch.
        let merged: Vec<f64> = epochs
            .iter()
            .filter(|e| self.merge_secs.contains_key(&e.epoch))
            .map(|e| e.merge_secs)
            .collect();
        let mean_merge_secs = merged.iter().sum::<f64>() / merged.len().max(1) as f64;
        let merge_share_secs = mean(&|e| e.merge_secs);
        let miners_start = self.sc.miner_count();
        let miners_end = self
            .nodes
            .iter()
            .filter(|n| !n.validator && n.state == State::Alive)
            .count();
        let compute: f64 = match &self.sc.host {
            Some(host) => {
                host.cores as f64 * host.tokens_per_core_s * self.cost.sample_flops()
                    / self.cost.tokens_per_sample as f64
            }
            None => self
                .nodes
                .iter()
                .filter(|n| !n.validator && n.state != State::Spare)
                .map(|n| n.flops)
                .sum(),
        };
        let perfect = compute / (self.cost.sample_flops() / self.cost.tokens_per_sample as f64);
        let total_epochs = self.plan_published.len().max(1) as f64;
        let mut gossip = self.gossip.clone();
        for v in [
            &mut gossip.heartbeat_bytes,
            &mut gossip.heartbeat_messages,
            &mut gossip.loss_bytes,
            &mut gossip.plan_bytes,
            &mut gossip.merge_bytes,
            &mut gossip.total_messages,
        ] {
            *v /= total_epochs;
        }
        gossip.total_messages += gossip.heartbeat_messages;
        gossip.total_bytes =
            gossip.heartbeat_bytes + gossip.loss_bytes + gossip.plan_bytes + gossip.merge_bytes;
        let clasp = (!self.clasp.is_empty()).then(|| {
            let sum = |f: fn(&(usize, usize, usize, usize, usize)) -> usize| {
                self.clasp.iter().map(f).sum::<usize>() as f64
            };
            ClaspFigures {
                epochs_fitted: self.clasp.len(),
                recall: sum(|c| c.1) / sum(|c| c.2).max(1.0),
                false_positive_rate: sum(|c| c.3) / sum(|c| c.4).max(1.0),
                unknowns_max: self.unknowns_max,
            }
        });
        let bad_weight_share = (!self.bad_weight.is_empty())
            .then(|| self.bad_weight.iter().sum::<f64>() / self.bad_weight.len() as f64);
        Outcome {
            placement: self.placement.name(),
            datacenter: self.datacenter,
            virtual_secs: self.end,
            miners_start,
            miners_end,
            tokens: self.tokens,
            samples_done: self.done,
            samples_dropped: self.dropped,
            tokens_per_s: self.tokens as f64 / span,
            perfect_tokens_per_s: perfect,
            lifecycle_events: self.lifecycle_events,
            lifecycle_refused: self.lifecycle_refused,
            merge_overruns: self.merge_overruns,
            merge_excluded: self.merge_excluded,
            merge_kept_local: self.merge_kept_local,
            spot_check_bytes_per_s: self.spot_bytes
                / self.validators.len().max(1) as f64
                / self.end.max(1e-9),
            mean_train_secs: mean_epoch_secs - merge_share_secs,
            mean_epoch_secs,
            mean_merge_secs,
            plan_bytes_max: epochs.iter().map(|e| e.plan_bytes).max().unwrap_or(0),
            plan_miners_max: epochs.iter().map(|e| e.miners).max().unwrap_or(0),
            epochs,
            gossip,
            failover_secs: self.failover_secs,
            clasp,
            bad_weight_share,
            limits: {
                let mut limits: Vec<(f64, u64, String)> = self.limits.into_values().collect();
                limits.sort_by(|a, b| a.0.total_cmp(&b.0));
                limits
                    .into_iter()
                    .map(|(at, times, what)| format!("at {at:.0} s ({times}x): {what}"))
                    .collect()
            },
            series: self.series,
            events: self.events,
        }
    }
}
