//! The small dense solver CLASP needs: Cholesky factorisation of a symmetric positive definite
//! matrix (row-major, `n × n`), solving with it, and the inverse for standard errors.
//!
//! The systems are the normal equations of a few dozen unknowns, so a hand-written `O(n³)`
//! factorisation is both fast enough and dependency-free. A pivot that is not clearly positive
//! (below [`RELATIVE_PIVOT_FLOOR`] times the largest diagonal entry) means the columns are
//! linearly dependent — in CLASP terms, two miners' effects cannot be told apart — and is
//! reported instead of producing a meaningless answer.

/// A pivot at or below this fraction of the largest diagonal entry is taken as zero.
pub(crate) const RELATIVE_PIVOT_FLOOR: f64 = 1e-10;

/// The matrix is not (numerically) positive definite: column `column` depends on earlier ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotPositiveDefinite {
    /// The column whose pivot vanished.
    pub(crate) column: usize,
}

/// The lower-triangular Cholesky factor `L` of `a` (`a = L Lᵀ`), row-major `n × n`.
#[derive(Debug, Clone)]
pub(crate) struct Cholesky {
    n: usize,
    l: Vec<f64>,
}

impl Cholesky {
    /// Factorises the symmetric matrix `a` (only its lower triangle is read).
    pub(crate) fn new(a: &[f64], n: usize) -> Result<Self, NotPositiveDefinite> {
        debug_assert_eq!(a.len(), n * n);
        let max_diag = (0..n).map(|i| a[i * n + i].abs()).fold(0.0_f64, f64::max);
        let floor = RELATIVE_PIVOT_FLOOR * max_diag.max(f64::MIN_POSITIVE);
        let mut l = vec![0.0; n * n];
        for j in 0..n {
            let mut d = a[j * n + j];
            for k in 0..j {
                d -= l[j * n + k] * l[j * n + k];
            }
            if d.is_nan() || d <= floor {
                return Err(NotPositiveDefinite { column: j });
            }
            let djj = d.sqrt();
            l[j * n + j] = djj;
            for i in (j + 1)..n {
                let mut s = a[i * n + j];
                for k in 0..j {
                    s -= l[i * n + k] * l[j * n + k];
                }
                l[i * n + j] = s / djj;
            }
        }
        Ok(Self { n, l })
    }

    /// Solves `a x = b`.
    pub(crate) fn solve(&self, b: &[f64]) -> Vec<f64> {
        let n = self.n;
        let mut y = b.to_vec();
        for i in 0..n {
            let row = &self.l[i * n..i * n + i];
            let s = y[i] - row.iter().zip(&y[..i]).map(|(a, b)| a * b).sum::<f64>();
            y[i] = s / self.l[i * n + i];
        }
        for i in (0..n).rev() {
            let below: f64 = y
                .iter()
                .enumerate()
                .skip(i + 1)
                .map(|(k, yk)| self.l[k * n + i] * yk)
                .sum();
            y[i] = (y[i] - below) / self.l[i * n + i];
        }
        y
    }

    /// The inverse of `a`, row-major.
    pub(crate) fn inverse(&self) -> Vec<f64> {
        let n = self.n;
        let mut inv = vec![0.0; n * n];
        let mut e = vec![0.0; n];
        for j in 0..n {
            e.iter_mut().for_each(|v| *v = 0.0);
            e[j] = 1.0;
            let col = self.solve(&e);
            for i in 0..n {
                inv[i * n + j] = col[i];
            }
        }
        inv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_a_known_system_and_inverts_it() {
        // a = [[4, 2], [2, 3]]; det = 8; a⁻¹ = [[3, -2], [-2, 4]] / 8.
        // a x = [2, 1] ⇒ x = a⁻¹ [2, 1] = [(6 - 2) / 8, (-4 + 4) / 8] = [0.5, 0].
        let a = [4.0, 2.0, 2.0, 3.0];
        let c = Cholesky::new(&a, 2).unwrap();
        let x = c.solve(&[2.0, 1.0]);
        assert!((x[0] - 0.5).abs() < 1e-12 && x[1].abs() < 1e-12, "{x:?}");
        let inv = c.inverse();
        let want = [3.0 / 8.0, -2.0 / 8.0, -2.0 / 8.0, 4.0 / 8.0];
        for (g, w) in inv.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{inv:?}");
        }
    }

    #[test]
    fn dependent_columns_are_reported() {
        // Second column = 2 × first: a = [[1, 2], [2, 4]] is singular.
        let a = [1.0, 2.0, 2.0, 4.0];
        assert_eq!(
            Cholesky::new(&a, 2).unwrap_err(),
            NotPositiveDefinite { column: 1 }
        );
        assert!(Cholesky::new(&[f64::NAN], 1).is_err());
    }
}
