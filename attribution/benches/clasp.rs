//! CLASP against the plain per-miner mean on seeded simulated epochs (a benchmark-style
//! binary, `harness = false`, outside the default test run):
//!
//! ```sh
//! cargo bench -p attribution --bench clasp            # 1 000 trials per scenario
//! cargo bench -p attribution --bench clasp -- 100     # fewer trials
//! ```
//!
//! **Scenarios.** 5×5, 3×2 and 8×8 (stages × miners per stage), each with uniform and with
//! skewed routing; 200 samples per miner per epoch (`200 × miners per stage` samples, every
//! sample crossing every stage). The adversaries are miner 0 of stages 0, 3, 6, … (2, 1 and 3
//! adversaries). Per sample `i` at epoch position `u = i / n ∈ [0, 1)`:
//!
//! ```text
//! base_i = 4.3 + 0.4·exp(−2u) + 0.2·z_i,   z_i ~ N(0, 1)      (falls 4.7 → 4.35, mean ≈ 4.47)
//! loss_i = base_i · 1.1^(adversaries on the pathway)          (+10 % mean and spread each)
//! ```
//!
//! The exponential trend is deliberately not the estimator's quadratic, and the adversaries'
//! harm is multiplicative, not additive, so the model is mildly misspecified, as it will be
//! in practice.
//!
//! **Routing.** *Uniform*: each stage's miner is drawn uniformly and independently.
//! *Skewed (4:1 by throughput)*: the first `⌈K/2⌉` miners of every stage are fast
//! (throughput 4), the rest slow (1). The head is drawn in proportion to throughput; at each
//! later stage the sample stays on its lane (the miner with the same index as at the previous
//! stage — its usual downstream partner) with probability ½, otherwise it is drawn in
//! proportion to throughput. Fast miners therefore serve ~4× the samples of slow ones, and
//! the adversaries' lane partners share many of their pathways.
//!
//! **Metrics**, for CLASP (`effect`, `flagged`) and the plain mean (`plain_mean`,
//! `plain_flagged`) with the same flag rule (3 standard errors and 2 % of the mean loss):
//!
//! * *recall*: flagged adversaries / adversaries, over all trials;
//! * *fpr*: flagged honest miners / honest miners, over all trials;
//! * *honest bias*: the credit an honest miner loses because adversaries are present. Every
//!   trial is estimated twice on the same draws (routing and `z`): as simulated, and with
//!   every adversary behaving honestly (multiplier 1). An honest miner's *credit lost* is
//!   `max(0, estimate_with − estimate_without)` in nats (a raised effect or plain mean is
//!   lost credit: it brings the miner toward the flag and, ranked, below its peers). This is
//!   the precise form of "the credit lost by honest miners that share a stage or pathways
//!   with an adversary, relative to honest miners that do not": the reference is the same
//!   miner, on the same samples, in the world where nobody it meets is an adversary, which
//!   also cancels each method's own centring (CLASP centres per stage, the plain mean over
//!   the epoch). `honest_bias` = mean over trials of the *largest* credit lost by any honest
//!   miner in the epoch; `mean_honest_bias` = mean over trials and honest miners.
//!
//! The final `RESULT` line pools recall and fpr over every scenario and averages the two
//! bias figures over scenarios. Goals: recall ≥ 0.95, fpr ≤ 0.02, CLASP's `honest_bias` at
//! most a fifth of the plain mean's, per scenario.

use std::time::Instant;

use attribution::clasp::{estimate, Config, Estimate, Record, Uid};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SAMPLES_PER_MINER: usize = 200;
const DEFAULT_TRIALS: usize = 1000;
const ADVERSARY_EVERY: usize = 3;
const FAST: f64 = 4.0;
const SLOW: f64 = 1.0;
const LANE_STAY: f64 = 0.5;

#[derive(Clone, Copy, PartialEq)]
enum Routing {
    Uniform,
    Skewed,
}

struct Scenario {
    stages: usize,
    per_stage: usize,
    routing: Routing,
}

#[derive(Default)]
struct Tally {
    adversaries: usize,
    honest: usize,
    recall_hits: usize,
    false_positives: usize,
    max_lost: f64,
    mean_lost: f64,
}

impl Tally {
    fn recall(&self) -> f64 {
        self.recall_hits as f64 / self.adversaries.max(1) as f64
    }
    fn fpr(&self) -> f64 {
        self.false_positives as f64 / self.honest.max(1) as f64
    }
}

fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u: f64 = rng.gen();
    let v: f64 = rng.gen();
    (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

fn uid(stage: usize, k: usize, per_stage: usize) -> Uid {
    (stage * per_stage + k) as Uid
}

fn is_adversary(stage: usize, k: usize) -> bool {
    k == 0 && stage % ADVERSARY_EVERY == 0
}

fn draw_weighted(rng: &mut ChaCha8Rng, w: &[f64]) -> usize {
    let total: f64 = w.iter().sum();
    let mut x = rng.gen::<f64>() * total;
    for (k, wk) in w.iter().enumerate() {
        if x < *wk {
            return k;
        }
        x -= wk;
    }
    w.len() - 1
}

/// One epoch: (records as simulated, records with the adversaries honest).
fn simulate(sc: &Scenario, seed: u64) -> (Vec<Record>, Vec<Record>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let k = sc.per_stage;
    let throughput: Vec<f64> = (0..k)
        .map(|j| if j < k.div_ceil(2) { FAST } else { SLOW })
        .collect();
    let n = SAMPLES_PER_MINER * k;
    let mut with = Vec::with_capacity(n);
    let mut without = Vec::with_capacity(n);
    for i in 0..n {
        let mut lanes = Vec::with_capacity(sc.stages);
        for _ in 0..sc.stages {
            let j = match sc.routing {
                Routing::Uniform => rng.gen_range(0..k),
                Routing::Skewed => match lanes.last() {
                    Some(&prev) if rng.gen_bool(LANE_STAY) => prev,
                    _ => draw_weighted(&mut rng, &throughput),
                },
            };
            lanes.push(j);
        }
        let u = i as f64 / n as f64;
        let base = 4.3 + 0.4 * (-2.0 * u).exp() + 0.2 * normal(&mut rng);
        let bad = lanes
            .iter()
            .enumerate()
            .filter(|&(s, &j)| is_adversary(s, j))
            .count();
        let pathway: Vec<Uid> = lanes
            .iter()
            .enumerate()
            .map(|(s, &j)| uid(s, j, k))
            .collect();
        with.push(Record {
            order: i as u64,
            pathway: pathway.clone(),
            loss: base * 1.1_f64.powi(bad as i32),
        });
        without.push(Record {
            order: i as u64,
            pathway,
            loss: base,
        });
    }
    (with, without)
}

fn tally(
    sc: &Scenario,
    with: &Estimate,
    without: &Estimate,
    plain: bool,
    t: &mut Tally,
    trials: f64,
) {
    let mut worst = 0.0_f64;
    let mut sum = 0.0;
    let mut honest = 0;
    for m in &with.miners {
        let k = m.miner as usize % sc.per_stage;
        let flagged = if plain { m.plain_flagged } else { m.flagged };
        if is_adversary(m.stage, k) {
            t.adversaries += 1;
            t.recall_hits += usize::from(flagged);
            continue;
        }
        t.honest += 1;
        t.false_positives += usize::from(flagged);
        let (a, b) = match without.miner(m.stage, m.miner) {
            Some(o) if plain => (m.plain_mean, o.plain_mean),
            Some(o) => (m.effect, o.effect),
            None => continue,
        };
        let lost = (a - b).max(0.0);
        worst = worst.max(lost);
        sum += lost;
        honest += 1;
    }
    t.max_lost += worst / trials;
    t.mean_lost += sum / honest.max(1) as f64 / trials;
}

fn main() {
    let trials = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(DEFAULT_TRIALS);
    let scenarios: Vec<Scenario> = [(5, 5), (3, 2), (8, 8)]
        .into_iter()
        .flat_map(|(stages, per_stage)| {
            [Routing::Uniform, Routing::Skewed].map(|routing| Scenario {
                stages,
                per_stage,
                routing,
            })
        })
        .collect();
    let config = Config::default();
    let start = Instant::now();
    println!("CLASP vs plain mean, {trials} trials per scenario, {SAMPLES_PER_MINER} samples per miner per epoch");
    println!();
    println!("| scenario | adversaries | method | recall | fpr | honest_bias (nats) | mean_honest_bias (nats) | bias ratio | time (s) |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut totals = [Tally::default(), Tally::default()];
    let mut sums = [(0.0, 0.0), (0.0, 0.0)];
    let mut failures = 0;
    let mut goals_met = true;
    for (index, sc) in scenarios.iter().enumerate() {
        let t0 = Instant::now();
        let mut t = [Tally::default(), Tally::default()];
        for trial in 0..trials {
            let seed = (index as u64) << 32 | trial as u64;
            let (with, without) = simulate(sc, seed);
            match (estimate(&with, &config), estimate(&without, &config)) {
                (Ok(a), Ok(b)) => {
                    tally(sc, &a, &b, false, &mut t[0], trials as f64);
                    tally(sc, &a, &b, true, &mut t[1], trials as f64);
                }
                _ => failures += 1,
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let name = format!(
            "{}×{} {}",
            sc.stages,
            sc.per_stage,
            if sc.routing == Routing::Uniform {
                "uniform"
            } else {
                "skewed 4:1"
            }
        );
        let adversaries = sc.stages.div_ceil(ADVERSARY_EVERY);
        let ratio = t[0].max_lost / t[1].max_lost.max(f64::MIN_POSITIVE);
        for (m, label) in [(0, "CLASP"), (1, "plain mean")] {
            println!(
                "| {name} | {adversaries} | {label} | {:.4} | {:.4} | {:.4} | {:.4} | {} | {} |",
                t[m].recall(),
                t[m].fpr(),
                t[m].max_lost,
                t[m].mean_lost,
                if m == 0 {
                    format!("{ratio:.3}")
                } else {
                    String::new()
                },
                if m == 0 {
                    format!("{secs:.1}")
                } else {
                    String::new()
                },
            );
        }
        goals_met &= t[0].recall() >= 0.95 && t[0].fpr() <= 0.02 && ratio <= 0.2;
        for m in 0..2 {
            totals[m].adversaries += t[m].adversaries;
            totals[m].honest += t[m].honest;
            totals[m].recall_hits += t[m].recall_hits;
            totals[m].false_positives += t[m].false_positives;
            sums[m].0 += t[m].max_lost / scenarios.len() as f64;
            sums[m].1 += t[m].mean_lost / scenarios.len() as f64;
        }
    }
    println!();
    println!(
        "estimation failures: {failures}; every per-scenario goal met: {goals_met}; total {:.1} s",
        start.elapsed().as_secs_f64()
    );
    println!(
        "RESULT clasp recall={:.4} fpr={:.4} honest_bias={:.4} mean_honest_bias={:.4} plain_recall={:.4} plain_fpr={:.4} plain_honest_bias={:.4} plain_mean_honest_bias={:.4} trials={trials}",
        totals[0].recall(),
        totals[0].fpr(),
        sums[0].0,
        sums[0].1,
        totals[1].recall(),
        totals[1].fpr(),
        sums[1].0,
        sums[1].1,
    );
}
