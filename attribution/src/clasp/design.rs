//! The sparse design matrix of the CLASP model and the products the fit needs.
//!
//! Rows are the usable records (finite loss); columns are the trend coefficients
//! (`1, t, t²`) followed by one column per non-reference miner of each stage (reference
//! coding: the first miner of a stage by uid has no column). Each row holds at most
//! `trend columns + stages` nonzeros, so `XᵀWX` costs `O(n · (3 + S)²)` rather than
//! `O(n · p²)`. Building the design also validates the pathways and drops non-finite losses.

use std::collections::BTreeMap;

use super::{EstimateError, Record, Uid, Unknown};

/// The design matrix in sparse form: every row has the trend entries and a `1` in the column
/// of each non-reference miner on its pathway.
pub(super) struct Design {
    /// Trend columns (`trend_degree + 1`).
    pub(super) trend_columns: usize,
    /// Total unknowns.
    pub(super) unknowns: usize,
    /// Per stage: miner → (index within the stage, column or `None` for the reference).
    pub(super) stages: Vec<BTreeMap<Uid, (usize, Option<usize>)>>,
    /// Per usable record: `t`.
    pub(super) t: Vec<f64>,
    /// Per usable record: the effect columns, flattened with stride `stage count`.
    pub(super) columns: Vec<Option<usize>>,
    /// Per usable record: the loss.
    pub(super) y: Vec<f64>,
}

impl Design {
    pub(super) fn rows(&self) -> usize {
        self.y.len()
    }

    /// The nonzero entries of row `i`, written into `out`.
    pub(super) fn row(&self, i: usize, out: &mut Vec<(usize, f64)>) {
        out.clear();
        let t = self.t[i];
        let mut power = 1.0;
        for c in 0..self.trend_columns {
            out.push((c, power));
            power *= t;
        }
        let s = self.stages.len();
        for c in self.columns[i * s..(i + 1) * s].iter().flatten() {
            out.push((*c, 1.0));
        }
    }

    pub(super) fn unknown(&self, column: usize) -> Unknown {
        if column < self.trend_columns {
            return Unknown::Trend(column);
        }
        for (stage, miners) in self.stages.iter().enumerate() {
            for (&miner, &(_, c)) in miners {
                if c == Some(column) {
                    return Unknown::Effect { stage, miner };
                }
            }
        }
        Unknown::Trend(column)
    }
}

pub(super) fn build(
    records: &[Record],
    trend_degree: usize,
) -> Result<(Design, usize), EstimateError> {
    let mut excluded = 0;
    let mut stage_count = None;
    let mut used = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        if r.pathway.is_empty() {
            return Err(EstimateError::EmptyPathway { record: i });
        }
        match stage_count {
            None => stage_count = Some(r.pathway.len()),
            Some(expected) if expected != r.pathway.len() => {
                return Err(EstimateError::PathwayLength {
                    record: i,
                    expected,
                    found: r.pathway.len(),
                });
            }
            Some(_) => {}
        }
        if r.loss.is_finite() {
            used.push(r);
        } else {
            excluded += 1;
        }
    }
    let (Some(s), false) = (stage_count, used.is_empty()) else {
        return Err(EstimateError::NoRecords);
    };

    // Fewer distinct orders than trend coefficients cannot support the degree.
    let mut orders: Vec<u64> = used.iter().map(|r| r.order).collect();
    orders.sort_unstable();
    orders.dedup();
    let degree = trend_degree.min(orders.len().saturating_sub(1));
    let trend_columns = degree + 1;
    let lo = orders.first().copied().unwrap_or(0);
    let hi = orders.last().copied().unwrap_or(0);
    let span = (hi - lo) as f64;

    let mut stages: Vec<BTreeMap<Uid, (usize, Option<usize>)>> = vec![BTreeMap::new(); s];
    for r in &used {
        for (stage, &m) in r.pathway.iter().enumerate() {
            stages[stage].insert(m, (0, None));
        }
    }
    let mut next = trend_columns;
    for miners in &mut stages {
        for (k, slot) in miners.values_mut().enumerate() {
            let column = (k > 0).then(|| {
                next += 1;
                next - 1
            });
            *slot = (k, column);
        }
    }

    let mut t = Vec::with_capacity(used.len());
    let mut columns = Vec::with_capacity(used.len() * s);
    let mut y = Vec::with_capacity(used.len());
    for r in &used {
        t.push(if span > 0.0 {
            2.0 * (r.order - lo) as f64 / span - 1.0
        } else {
            0.0
        });
        for (stage, m) in r.pathway.iter().enumerate() {
            columns.push(stages[stage].get(m).and_then(|&(_, c)| c));
        }
        y.push(r.loss);
    }
    Ok((
        Design {
            trend_columns,
            unknowns: next,
            stages,
            t,
            columns,
            y,
        },
        excluded,
    ))
}

/// `XᵀWX` and `XᵀWy`.
pub(super) fn normal_equations(d: &Design, w: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let p = d.unknowns;
    let mut a = vec![0.0; p * p];
    let mut b = vec![0.0; p];
    let mut row = Vec::new();
    for (i, &wi) in w.iter().enumerate() {
        d.row(i, &mut row);
        for &(j, xj) in &row {
            b[j] += wi * xj * d.y[i];
            for &(k, xk) in &row {
                if k <= j {
                    a[j * p + k] += wi * xj * xk;
                }
            }
        }
    }
    for j in 0..p {
        for k in 0..j {
            a[k * p + j] = a[j * p + k];
        }
    }
    (a, b)
}

pub(super) fn residuals(d: &Design, beta: &[f64]) -> Vec<f64> {
    let mut row = Vec::new();
    (0..d.rows())
        .map(|i| {
            d.row(i, &mut row);
            d.y[i] - row.iter().map(|&(j, x)| beta[j] * x).sum::<f64>()
        })
        .collect()
}
