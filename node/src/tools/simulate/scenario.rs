//! A scenario file: who takes part (miners by GPU class and link, validators), the run's
//! configuration, the model's shape, churn, stragglers and planted bad miners, parsed from
//! TOML and checked field by field before anything runs.

use std::path::Path;

use anyhow::{bail, Context};
use bootstrap::RunConfig;
use serde::Deserialize;

/// Largest population a scenario may ask for (miners and validators, spares for churn
/// included): a metagraph holds at most 65 536 uids, and the simulator's tables are sized for
/// thousands, not millions.
pub(crate) const MAX_NODES: usize = 16_384;

/// A scenario as read from its file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Scenario {
    /// Short name (the report's file names).
    pub(crate) name: String,
    /// What the scenario stands for, one paragraph.
    #[serde(default)]
    pub(crate) description: String,
    /// Seed of every draw (latencies, churn, routing is seeded by the plans).
    #[serde(default = "default_seed")]
    pub(crate) seed: u64,
    /// Virtual seconds to run.
    pub(crate) duration_secs: f64,
    /// How the orchestrator assigns miners to stages: `count` (today's rule) or
    /// `throughput` (balance each stage's measured capacity).
    #[serde(default)]
    pub(crate) placement: Placement,
    /// Also run the other placement rule on the same population and report both.
    #[serde(default)]
    pub(crate) compare_placement: bool,
    /// Also run the same GPUs with datacenter links (100 Gbit/s, 0.05 ms) and report the
    /// ratio.
    #[serde(default)]
    pub(crate) compare_datacenter: bool,
    /// Run configuration fields over the default (`RunConfig`'s TOML names).
    #[serde(default)]
    pub(crate) run: toml::Table,
    /// The model's shape for compute and bytes; the run's preset when absent.
    #[serde(default)]
    pub(crate) model: Option<ModelSize>,
    /// Groups of miners.
    pub(crate) miners: Vec<Group>,
    /// The validators (the first ranks highest).
    pub(crate) validators: Group,
    /// Every node computes on one machine's shared cores (the local swarm): samples per
    /// second then come from this, not from each node's own GPU.
    #[serde(default)]
    pub(crate) host: Option<Host>,
    /// Miners leaving and joining, and a validator failing.
    #[serde(default)]
    pub(crate) churn: Churn,
    /// Miners that raise the loss of every sample they touch.
    #[serde(default)]
    pub(crate) bad_miners: BadMiners,
    /// The gossip layer's shape.
    #[serde(default)]
    pub(crate) gossip: Gossip,
    /// Samples each head keeps in flight (the node's `--head-window`).
    #[serde(default = "default_head_window")]
    pub(crate) head_window: usize,
}

fn default_seed() -> u64 {
    1
}

fn default_head_window() -> usize {
    2
}

pub(crate) use crate::services::consensus::api::Placement;

/// A model shape given directly (sizes past what a run configuration may name, such as
/// Orion's 100 B parameters, are allowed here: only compute and bytes are derived from it).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelSize {
    /// Transformer blocks.
    pub(crate) layers: u32,
    /// Hidden width `d`.
    pub(crate) hidden: u32,
    /// Feed-forward width.
    pub(crate) ffn: u32,
    /// Width of the keys and values (grouped-query attention); `hidden` when absent.
    #[serde(default)]
    pub(crate) kv_dim: Option<u32>,
    /// Vocabulary.
    pub(crate) vocab: u32,
}

/// A group of nodes sharing a GPU class and a link.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Group {
    /// How many.
    pub(crate) count: usize,
    /// GPU class (see `compute::GpuClass::named`); a validator's times its spot checks'
    /// recomputation.
    #[serde(default = "default_gpu")]
    pub(crate) gpu: String,
    /// Upload, Mbit/s.
    #[serde(default = "default_mbit")]
    pub(crate) up_mbit: f64,
    /// Download, Mbit/s.
    #[serde(default = "default_mbit")]
    pub(crate) down_mbit: f64,
    /// One-way latency to the network's core, ms: a fixed value or `[low, high]` drawn
    /// uniformly per node (a path between two nodes costs both of theirs).
    #[serde(default = "default_latency")]
    pub(crate) latency_ms: Latency,
    /// Compute this many times slower than the class (a straggler).
    #[serde(default = "one")]
    pub(crate) slowdown: f64,
}

fn default_gpu() -> String {
    "a100".to_owned()
}

fn default_mbit() -> f64 {
    1000.0
}

fn default_latency() -> Latency {
    Latency::Fixed(1.0)
}

fn one() -> f64 {
    1.0
}

/// A latency or a range of them.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub(crate) enum Latency {
    /// Every node the same.
    Fixed(f64),
    /// Drawn per node.
    Range([f64; 2]),
}

/// Every node computes on one machine's cores.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Host {
    /// Cores shared by every node.
    pub(crate) cores: usize,
    /// Tokens a second one core trains the whole model at, measured on the machine with
    /// `train-local --threads 1` on the same model, stages, bottleneck and wire (see the
    /// scenario file): the simulator turns it into FLOP/s a core.
    pub(crate) tokens_per_core_s: f64,
    /// Core-seconds a trained sample costs the machine outside the stages' compute (the
    /// nodes' framing, receipts, loss records and the validator's bookkeeping), fitted on one
    /// live run and checked against others (see the calibration scenario's file).
    #[serde(default)]
    pub(crate) overhead_core_s_per_sample: f64,
}

/// Churn.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Churn {
    /// Share of the live miners that leave per hour (each one's leaving is a Poisson event).
    #[serde(default)]
    pub(crate) leave_per_hour: f64,
    /// New miners per hour, as a share of the starting miner count (drawn from spares of
    /// the first group's kind, registered in the metagraph from the start).
    #[serde(default)]
    pub(crate) join_per_hour: f64,
    /// The orchestrating validator fails at this virtual second.
    #[serde(default)]
    pub(crate) validator_fails_at_secs: Option<f64>,
}

/// Planted bad miners.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BadMiners {
    /// How many (the miners with the highest indices of the first group, so they are not
    /// the stragglers of another group).
    #[serde(default)]
    pub(crate) count: usize,
    /// Loss (nats) they add to every sample they serve.
    #[serde(default = "default_loss_increase")]
    pub(crate) loss_increase: f64,
}

fn default_loss_increase() -> f64 {
    0.05
}

/// The gossip layer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Gossip {
    /// gossipsub's mesh degree D (each node forwards a new message to D peers, so it
    /// receives about D copies).
    #[serde(default = "default_mesh")]
    pub(crate) mesh: usize,
    /// Share of request-response hops lost (the sender then waits out its timeout).
    #[serde(default)]
    pub(crate) hop_loss: f64,
}

fn default_mesh() -> usize {
    6
}

impl Default for Gossip {
    fn default() -> Self {
        Gossip {
            mesh: default_mesh(),
            hop_loss: 0.0,
        }
    }
}

impl Scenario {
    /// Reads and checks `path`.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Scenario> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let scenario: Scenario =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        scenario
            .check()
            .with_context(|| format!("scenario {}", path.display()))?;
        Ok(scenario)
    }

    /// The run configuration: the default with the scenario's `[run]` fields over it.
    pub(crate) fn run_config(&self) -> anyhow::Result<RunConfig> {
        let mut run = RunConfig {
            run_name: format!("sim-{}", self.name),
            ..RunConfig::default()
        };
        if !self.run.is_empty() {
            let text = toml::to_string(&self.run).context("re-encoding [run]")?;
            run = run.with_toml_str(&text).context("the [run] table")?;
        }
        Ok(run)
    }

    /// Miners at the start.
    pub(crate) fn miner_count(&self) -> usize {
        self.miners.iter().map(|g| g.count).sum()
    }

    /// Spares registered for joins over the whole run.
    pub(crate) fn spare_count(&self) -> usize {
        let hours = self.duration_secs / 3600.0;
        let expected = self.churn.join_per_hour * hours * self.miner_count() as f64;
        // Poisson draws rarely pass twice their mean plus a margin.
        (expected * 2.0 + 8.0).ceil() as usize * usize::from(self.churn.join_per_hour > 0.0)
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bail!("name {:?}: letters, digits, '-' and '_' only", self.name);
        }
        if !(self.duration_secs.is_finite() && self.duration_secs > 0.0) {
            bail!("duration_secs must be a positive number");
        }
        if self.duration_secs > 7.0 * 86_400.0 {
            bail!("duration_secs: at most a week of virtual time");
        }
        if self.miners.is_empty() || self.miner_count() == 0 {
            bail!("[[miners]]: at least one miner");
        }
        if self.validators.count == 0 {
            bail!("[validators]: at least one validator (one orchestrates)");
        }
        let total = self.miner_count() + self.validators.count + self.spare_count();
        if total > MAX_NODES {
            bail!("{total} nodes (spares for joins included); at most {MAX_NODES}");
        }
        for (i, group) in self.miners.iter().chain([&self.validators]).enumerate() {
            group
                .check()
                .with_context(|| format!("group {i} (miners first, then validators)"))?;
        }
        if let Some(host) = &self.host {
            if host.cores == 0
                || !(host.tokens_per_core_s.is_finite() && host.tokens_per_core_s > 0.0)
            {
                bail!("[host]: cores and tokens_per_core_s must be positive");
            }
            if !(host.overhead_core_s_per_sample.is_finite()
                && host.overhead_core_s_per_sample >= 0.0)
            {
                bail!("[host]: overhead_core_s_per_sample must be 0 or more");
            }
        }
        if let Some(model) = &self.model {
            if model.layers == 0 || model.hidden == 0 || model.ffn == 0 || model.vocab == 0 {
                bail!("[model]: every size must be positive");
            }
        }
        let churn = &self.churn;
        for (name, v) in [
            ("leave_per_hour", churn.leave_per_hour),
            ("join_per_hour", churn.join_per_hour),
        ] {
            if !(v.is_finite() && (0.0..=10.0).contains(&v)) {
                bail!("[churn] {name} must be between 0 and 10");
            }
        }
        if self.bad_miners.count > self.miners[0].count {
            bail!("[bad_miners] count is larger than the first group of miners");
        }
        if !(self.bad_miners.loss_increase.is_finite() && self.bad_miners.loss_increase >= 0.0) {
            bail!("[bad_miners] loss_increase must be 0 or more");
        }
        if !(1..=64).contains(&self.gossip.mesh) {
            bail!("[gossip] mesh must be between 1 and 64");
        }
        if !(0.0..1.0).contains(&self.gossip.hop_loss) {
            bail!("[gossip] hop_loss must be at least 0 and below 1");
        }
        if !(1..=8).contains(&self.head_window) {
            bail!("head_window must be between 1 and 8 (the node's --head-window)");
        }
        self.run_config()?;
        Ok(())
    }
}

impl Group {
    fn check(&self) -> anyhow::Result<()> {
        crate::tools::simulate::compute::GpuClass::named(&self.gpu)?;
        for (name, v) in [("up_mbit", self.up_mbit), ("down_mbit", self.down_mbit)] {
            if !(v.is_finite() && v > 0.0) {
                bail!("{name} must be a positive number");
            }
        }
        let (lo, hi) = self.latency_ms.bounds();
        if !(lo.is_finite() && hi.is_finite() && 0.0 <= lo && lo <= hi && hi <= 10_000.0) {
            bail!("latency_ms must be between 0 and 10 000, low before high");
        }
        if !(self.slowdown.is_finite() && self.slowdown >= 1.0) {
            bail!("slowdown must be at least 1");
        }
        Ok(())
    }
}

impl Latency {
    /// Lowest and highest.
    pub(crate) fn bounds(self) -> (f64, f64) {
        match self {
            Latency::Fixed(v) => (v, v),
            Latency::Range([lo, hi]) => (lo, hi),
        }
    }
}
