//! CLASP — Contribution Loss Assessment via Sampling of Pathways.
//!
//! Every sample of an epoch travels one *pathway*: one miner per pipeline stage. The tail
//! reports the sample's loss, so a validator sees, per sample, `(order, pathway, loss)` and
//! never a single miner's contribution in isolation. CLASP separates them with the additive
//! model
//!
//! ```text
//! loss_i = β₀ + β₁·t_i + β₂·t_i² + Σ_stage effect[stage, miner of i at that stage] + noise_i
//! Σ_miner effect[stage, miner] = 0 for every stage
//! ```
//!
//! where `t_i ∈ [-1, 1]` is the sample's order in the epoch mapped linearly from the smallest
//! to the largest order seen. The quadratic trend (degree [`Config::trend_degree`], at most 2)
//! absorbs the loss falling as the model trains during the epoch, so a miner that happens to
//! serve early (high-loss) samples is not blamed for them. The sum-to-zero constraint makes an
//! effect read "how much this miner raises the loss compared with the average miner of its
//! stage".
//!
//! **Fit.** Huber M-estimation by iteratively reweighted least squares: weights
//! `w = min(1, c·σ / |r|)` with [`HUBER_C`] = 1.345 (95 % efficiency under normal noise) and
//! the scale `σ` re-estimated every iteration as the median absolute residual times
//! [`MAD_TO_SIGMA`] (the MAD is consistent for the normal standard deviation). A handful of
//! wild losses (a corrupted batch, a NaN-adjacent spike) therefore moves an effect by at most
//! `c·σ` each, instead of by their full size as in a plain mean. Internally the design uses
//! reference coding (the first miner of each stage, by uid, has no column), which spans the
//! same model space; the sum-to-zero effects and their covariance follow by centring each
//! stage, so the fitted values are exactly those of the constrained model. The normal
//! equations (a few dozen unknowns) are solved by a hand-written Cholesky factorisation
//! (`linalg`).
//!
//! **Standard errors.** `Cov = s² (XᵀWX)⁻¹` with `s² = Σ wᵢ rᵢ² / (n − p)`, the final IRLS
//! weights `W`, `n` records and `p` unknowns.
//!
//! **Flagging.** A miner is flagged when its effect exceeds *both* [`Config::k_se`] standard
//! errors (default [`DEFAULT_K_SE`] = 3) *and* [`Config::relative_floor`] of the epoch's mean
//! loss (default [`DEFAULT_RELATIVE_FLOOR`] = 2 %): the first guards against noise, the second
//! against flagging a real but economically irrelevant difference that a long epoch makes
//! statistically significant.
//!
//! **Plain mean, for comparison.** Each miner's mean loss minus the epoch's mean loss, with
//! the same flag rule (standard error `sd / √n`). It charges a miner for every other miner on
//! its pathways, so an honest miner routed mostly through a bad one looks bad; CLASP removes
//! that by fitting all stages jointly.
//!
//! **Degenerate input.** Records with a non-finite loss are excluded and counted. No usable
//! record, an empty or inconsistent pathway, fewer records than unknowns, or two effects the
//! pathways cannot tell apart (e.g. two miners always paired) are errors. A stage with a
//! single miner has nothing to compare against: its miner gets effect 0, is marked not
//! [`comparable`](MinerEffect::comparable) and is never flagged. A miner with no record does
//! not appear. Nothing here panics on any input.

mod design;
mod linalg;

use design::{build, normal_equations, residuals};
use linalg::Cholesky;

/// A miner's uid (the chain's `u16`).
pub type Uid = u16;

/// Huber's tuning constant, in units of the robust scale (95 % efficiency at the normal).
pub const HUBER_C: f64 = 1.345;
/// Converts a median absolute deviation into a normal standard deviation (`1 / Φ⁻¹(0.75)`).
pub const MAD_TO_SIGMA: f64 = 1.482_602_218_505_602;
/// Default number of standard errors an effect must exceed to be flagged.
pub const DEFAULT_K_SE: f64 = 3.0;
/// Default fraction of the epoch's mean loss an effect must exceed to be flagged.
pub const DEFAULT_RELATIVE_FLOOR: f64 = 0.02;
/// Default cap on IRLS iterations.
pub const DEFAULT_MAX_ITERATIONS: usize = 50;
/// Default convergence tolerance: stop when no coefficient moves by more than this times
/// `1 + max |coefficient|`.
pub const DEFAULT_TOLERANCE: f64 = 1e-9;

/// One sample of the epoch, as the validator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Position of the sample in the epoch (any monotone counter: index, timestamp).
    pub order: u64,
    /// The miner that served the sample at each stage, head first.
    pub pathway: Vec<Uid>,
    /// The sample's loss at the tail.
    pub loss: f64,
}

/// The estimator's settings; [`Config::default`] holds the documented constants.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Degree of the polynomial trend in the order (0, 1 or 2).
    pub trend_degree: usize,
    /// Huber's constant `c`.
    pub huber_c: f64,
    /// Standard errors an effect must exceed to be flagged.
    pub k_se: f64,
    /// Fraction of the mean loss an effect must exceed to be flagged.
    pub relative_floor: f64,
    /// Cap on IRLS iterations.
    pub max_iterations: usize,
    /// Relative convergence tolerance on the coefficients.
    pub tolerance: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            trend_degree: 2,
            huber_c: HUBER_C,
            k_se: DEFAULT_K_SE,
            relative_floor: DEFAULT_RELATIVE_FLOOR,
            max_iterations: DEFAULT_MAX_ITERATIONS,
            tolerance: DEFAULT_TOLERANCE,
        }
    }
}

/// One miner's attribution at one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct MinerEffect {
    /// The stage (0 is the head).
    pub stage: usize,
    /// The miner.
    pub miner: Uid,
    /// Records (with a finite loss) it served.
    pub samples: usize,
    /// CLASP effect: how much it raises the loss compared with its stage's average miner.
    pub effect: f64,
    /// Standard error of `effect`.
    pub standard_error: f64,
    /// `effect` exceeds both thresholds of the flag rule.
    pub flagged: bool,
    /// Plain comparison: its mean loss minus the epoch's mean loss.
    pub plain_mean: f64,
    /// Standard error of `plain_mean` (`sd / √n`; 0 with fewer than two samples).
    pub plain_standard_error: f64,
    /// `plain_mean` exceeds both thresholds (never with fewer than two samples).
    pub plain_flagged: bool,
    /// False when the miner is alone in its stage (effect 0 by the constraint, never flagged).
    pub comparable: bool,
}

/// The result of [`estimate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Every miner that served a usable record, ordered by `(stage, miner)`.
    pub miners: Vec<MinerEffect>,
    /// Mean loss of the usable records.
    pub mean_loss: f64,
    /// Final robust residual scale (MAD-based σ).
    pub scale: f64,
    /// Trend coefficients `β₀, β₁, …` in `t ∈ [-1, 1]` (fewer than asked when the orders
    /// cannot support the degree).
    pub trend: Vec<f64>,
    /// IRLS iterations run.
    pub iterations: usize,
    /// Whether the coefficients settled within the tolerance.
    pub converged: bool,
    /// Records used in the fit.
    pub records_used: usize,
    /// Records left out for a non-finite loss.
    pub excluded_non_finite: usize,
}

impl Estimate {
    /// The attribution of `miner` at `stage`, if it served any usable record there.
    pub fn miner(&self, stage: usize, miner: Uid) -> Option<&MinerEffect> {
        self.miners
            .iter()
            .find(|m| m.stage == stage && m.miner == miner)
    }
}

/// An unknown of the model, named in [`EstimateError::Confounded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// The trend coefficient of this power of `t`.
    Trend(usize),
    /// A miner's effect.
    Effect {
        /// The stage.
        stage: usize,
        /// The miner.
        miner: Uid,
    },
}

/// Why [`estimate`] could not attribute the epoch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EstimateError {
    /// No record, or none with a finite loss.
    #[error("no record with a finite loss")]
    NoRecords,
    /// A record's pathway names no miner.
    #[error("record {record} has an empty pathway")]
    EmptyPathway {
        /// Index of the record in the input.
        record: usize,
    },
    /// Pathways of different lengths in one epoch.
    #[error("record {record} has a pathway of {found} stages, earlier records have {expected}")]
    PathwayLength {
        /// Index of the record in the input.
        record: usize,
        /// The length of the first usable record's pathway.
        expected: usize,
        /// This record's length.
        found: usize,
    },
    /// A setting is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// Too few usable records for the number of unknowns (a residual scale needs `n > p`).
    #[error("{records} usable records cannot fit {unknowns} unknowns")]
    NotEnoughRecords {
        /// Usable records.
        records: usize,
        /// Unknowns of the model.
        unknowns: usize,
    },
    /// The pathways cannot separate this unknown from the others (e.g. two miners of
    /// different stages always paired, or a miner that served only while the trend changed).
    #[error("the pathways cannot separate {what:?} from the other unknowns")]
    Confounded {
        /// The unknown whose column depends on the earlier ones.
        what: Unknown,
    },
}

fn validate(config: &Config) -> Result<(), EstimateError> {
    if config.trend_degree > 2 {
        return Err(EstimateError::InvalidConfig(
            "trend_degree must be 0, 1 or 2",
        ));
    }
    if !(config.huber_c.is_finite() && config.huber_c > 0.0) {
        return Err(EstimateError::InvalidConfig(
            "huber_c must be finite and positive",
        ));
    }
    if !(config.k_se.is_finite() && config.k_se >= 0.0) {
        return Err(EstimateError::InvalidConfig(
            "k_se must be finite and non-negative",
        ));
    }
    if !(config.relative_floor.is_finite() && config.relative_floor >= 0.0) {
        return Err(EstimateError::InvalidConfig(
            "relative_floor must be finite and non-negative",
        ));
    }
    if config.max_iterations == 0 {
        return Err(EstimateError::InvalidConfig(
            "max_iterations must be at least 1",
        ));
    }
    if !(config.tolerance.is_finite() && config.tolerance > 0.0) {
        return Err(EstimateError::InvalidConfig(
            "tolerance must be finite and positive",
        ));
    }
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_unstable_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2 - 1] + values[n / 2])
    }
}

/// The robust scale: MAD of the residuals about zero (the intercept centres them), falling
/// back to their root mean square when more than half are exactly zero.
fn robust_scale(r: &[f64]) -> f64 {
    let mut abs: Vec<f64> = r.iter().map(|v| v.abs()).collect();
    let mad = MAD_TO_SIGMA * median(&mut abs);
    if mad > 0.0 {
        return mad;
    }
    let n = r.len().max(1) as f64;
    (r.iter().map(|v| v * v).sum::<f64>() / n).sqrt()
}

/// Attributes an epoch's losses to its miners (see the module documentation for the model,
/// the fit, the flag rule and how degenerate input is handled).
pub fn estimate(records: &[Record], config: &Config) -> Result<Estimate, EstimateError> {
    validate(config)?;
    let (design, excluded_non_finite) = build(records, config.trend_degree)?;
    let n = design.rows();
    let p = design.unknowns;
    if n <= p {
        return Err(EstimateError::NotEnoughRecords {
            records: n,
            unknowns: p,
        });
    }

    let mut w = vec![1.0; n];
    let mut beta = vec![0.0; p];
    let mut scale = 0.0;
    let mut iterations = 0;
    let mut converged = false;
    let mut fit = None;
    for iteration in 1..=config.max_iterations {
        iterations = iteration;
        let (a, b) = normal_equations(&design, &w);
        let chol = Cholesky::new(&a, p).map_err(|e| EstimateError::Confounded {
            what: design.unknown(e.column),
        })?;
        let next = chol.solve(&b);
        let size = next.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
        let delta = next
            .iter()
            .zip(&beta)
            .fold(0.0_f64, |m, (a, b)| m.max((a - b).abs()));
        beta = next;
        let r = residuals(&design, &beta);
        scale = robust_scale(&r);
        let used_weights = std::mem::take(&mut w);
        w = r
            .iter()
            .map(|ri| {
                let z = ri.abs();
                if z <= config.huber_c * scale {
                    1.0
                } else {
                    config.huber_c * scale / z
                }
            })
            .collect();
        fit = Some((chol, used_weights, r));
        if scale == 0.0 || (iteration > 1 && delta <= config.tolerance * (1.0 + size)) {
            converged = true;
            break;
        }
    }
    let Some((chol, used_weights, r)) = fit else {
        return Err(EstimateError::InvalidConfig(
            "max_iterations must be at least 1",
        ));
    };

    let s2 = used_weights
        .iter()
        .zip(&r)
        .map(|(w, r)| w * r * r)
        .sum::<f64>()
        / (n - p) as f64;
    let inv = chol.inverse();
    let cov = |j: usize, k: usize| s2 * inv[j * p + k];

    // Plain per-miner means.
    let mean_loss = design.y.iter().sum::<f64>() / n as f64;
    let s = design.stages.len();
    let mut plain: Vec<Vec<(usize, f64, f64)>> = design
        .stages
        .iter()
        .map(|m| vec![(0, 0.0, 0.0); m.len()])
        .collect();
    let index: Vec<Vec<Uid>> = design
        .stages
        .iter()
        .map(|m| m.keys().copied().collect())
        .collect();
    for (i, rec) in records.iter().filter(|r| r.loss.is_finite()).enumerate() {
        for (stage, m) in rec.pathway.iter().enumerate() {
            if let Some(&(k, _)) = design.stages[stage].get(m) {
                let e = &mut plain[stage][k];
                e.0 += 1;
                e.1 += design.y[i];
                e.2 += design.y[i] * design.y[i];
            }
        }
    }

    let floor = config.relative_floor * mean_loss.abs();
    let mut trend = beta[..design.trend_columns].to_vec();
    let mut miners = Vec::new();
    for stage in 0..s {
        let slots = &design.stages[stage];
        let cols: Vec<Option<usize>> = slots.values().map(|&(_, c)| c).collect();
        let kk = cols.len() as f64;
        let raw = |c: Option<usize>| c.map_or(0.0, |c| beta[c]);
        let centre = cols.iter().map(|&c| raw(c)).sum::<f64>() / kk;
        let present: Vec<usize> = cols.iter().flatten().copied().collect();
        let var_centre = present
            .iter()
            .flat_map(|&j| present.iter().map(move |&k| (j, k)))
            .map(|(j, k)| cov(j, k))
            .sum::<f64>()
            / (kk * kk);
        let comparable = cols.len() > 1;
        // Centring moves the stage's average effect into the intercept.
        if let Some(intercept) = trend.first_mut() {
            *intercept += centre;
        }
        for (k, &c) in cols.iter().enumerate() {
            let effect = if comparable { raw(c) - centre } else { 0.0 };
            let variance = if comparable {
                let (var_own, cov_centre) = c.map_or((0.0, 0.0), |c| {
                    (
                        cov(c, c),
                        present.iter().map(|&j| cov(c, j)).sum::<f64>() / kk,
                    )
                });
                (var_own - 2.0 * cov_centre + var_centre).max(0.0)
            } else {
                0.0
            };
            let standard_error = variance.sqrt();
            let (count, sum, sum_sq) = plain[stage][k];
            let m = sum / count.max(1) as f64;
            let plain_mean = m - mean_loss;
            let plain_standard_error = if count >= 2 {
                ((sum_sq - count as f64 * m * m).max(0.0) / (count - 1) as f64 / count as f64)
                    .sqrt()
            } else {
                0.0
            };
            miners.push(MinerEffect {
                stage,
                miner: index[stage][k],
                samples: count,
                effect,
                standard_error,
                flagged: comparable && effect > config.k_se * standard_error && effect > floor,
                plain_mean,
                plain_standard_error,
                plain_flagged: count >= 2
                    && plain_mean > config.k_se * plain_standard_error
                    && plain_mean > floor,
                comparable,
            });
        }
    }

    Ok(Estimate {
        miners,
        mean_loss,
        scale,
        trend,
        iterations,
        converged,
        records_used: n,
        excluded_non_finite,
    })
}

#[cfg(test)]
mod tests;
