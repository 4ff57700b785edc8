//! AdamW with global gradient-norm clipping, over a stage's parameters.
//!
//! Moments are kept in f32 whatever the compute dtype; with bf16 compute the update is applied
//! to an f32 master copy and then written into the bf16 parameter, so small updates are not
//! lost to rounding.

use tch::{Kind, Tensor};

/// AdamW hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate (the caller may change it between steps for a schedule).
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices only (not to norm gains).
    pub weight_decay: f64,
    /// Clip the global gradient norm to this value; 0 disables clipping.
    pub grad_clip: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
        }
    }
}

/// One trainable tensor with its optimizer state.
pub(crate) struct Param {
    /// The leaf used in the forward pass, in the stage dtype, `requires_grad`.
    pub(crate) tensor: Tensor,
    /// f32 master copy when the stage dtype is not f32.
    pub(crate) master: Option<Tensor>,
    /// First moment, f32.
    pub(crate) m: Tensor,
    /// Second moment, f32.
    pub(crate) v: Tensor,
    /// Whether weight decay applies.
    pub(crate) decay: bool,
    /// f32 gradients back-propagated through earlier versions of this parameter (samples
    /// forwarded before a step and back-propagated after it), not yet stepped on.
    pub(crate) stashed: Option<Tensor>,
}

impl Param {
    /// The f32 values the optimizer updates: the master if any, else the parameter itself.
    pub(crate) fn f32_values(&self) -> Tensor {
        match &self.master {
            Some(m) => m.shallow_clone(),
            None => self.tensor.shallow_clone(),
        }
    }

    /// Overwrites the values (and the master), outside autograd.
    pub(crate) fn assign(&self, src: &Tensor) {
        let _guard = tch::no_grad_guard();
        if let Some(master) = &self.master {
            master.shallow_clone().copy_(src);
        }
        self.tensor.shallow_clone().copy_(src);
    }

    /// The accumulated gradient as f32 (the live parameter's and the stashed one), zeros if
    /// none has been accumulated.
    pub(crate) fn grad_f32(&self) -> Tensor {
        let g = self.tensor.grad();
        let live = g.defined().then(|| g.to_kind(Kind::Float));
        match (live, &self.stashed) {
            (Some(live), Some(stashed)) => live + stashed,
            (Some(live), None) => live,
            (None, Some(stashed)) => stashed.shallow_clone(),
            (None, None) => self.m.zeros_like(),
        }
    }

    /// Moves the gradient accumulated on `version` (an earlier version of this parameter that
    /// a sample's graph was recorded with) into [`Param::stashed`] and clears it there. Does
    /// nothing for the live parameter, whose gradient stays where autograd put it.
    pub(crate) fn harvest(&mut self, version: &Tensor) {
        if version.data_ptr() == self.tensor.data_ptr() {
            return;
        }
        let mut g = version.grad();
        if !g.defined() {
            return;
        }
        let _guard = tch::no_grad_guard();
        match &self.stashed {
            Some(stashed) => {
                let _ = stashed.shallow_clone().g_add_(&g.to_kind(Kind::Float));
            }
            None => self.stashed = Some(g.to_kind(Kind::Float).detach_copy()),
        }
        let _ = g.detach_().zero_();
    }

    /// Adds `g` (f32, the parameter's shape) to the gradient accumulated since the last step.
    pub(crate) fn add_stashed(&mut self, g: &Tensor) {
        let _guard = tch::no_grad_guard();
        match &self.stashed {
            Some(stashed) => {
                let _ = stashed.shallow_clone().g_add_(g);
            }
            None => self.stashed = Some(g.detach_copy()),
        }
    }

    pub(crate) fn zero_grad(&mut self) {
        let mut g = self.tensor.grad();
        if g.defined() {
            let _ = g.detach_().zero_();
        }
        self.stashed = None;
    }

    /// A fresh leaf with the parameter's values, to replace it while the old tensor stays
    /// untouched for the graphs recorded with it (the caller rebuilds the forward pass's
    /// view of the weights).
    pub(crate) fn fresh_copy(&self) -> Result<Tensor, tch::TchError> {
        let copy = {
            let _guard = tch::no_grad_guard();
            self.tensor.f_detach()?.f_detach_copy()?
        };
        Ok(copy.set_requires_grad(true))
    }
}

/// Outcome of an optimizer step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Steps taken so far, this one included.
    pub step: u64,
    /// Global norm of the averaged gradient before clipping.
    pub grad_norm: f64,
    /// Samples whose gradients were averaged into this step.
    pub samples: usize,
    /// Samples still waiting for their backward pass, kept with the weights they were
    /// forwarded with (their gradients go into a later step).
    pub kept_in_flight: usize,
}

/// Global L2 norm of `grads`, with one device synchronisation.
pub(crate) fn global_norm(grads: &[Tensor]) -> f64 {
    if grads.is_empty() {
        return 0.0;
    }
    let sq: Vec<Tensor> = grads.iter().map(|g| g.square().sum(Kind::Double)).collect();
    Tensor::stack(&sq, 0)
        .sum(Kind::Double)
        .double_value(&[])
        .sqrt()
}

/// Applies one AdamW update with step number `t` (1-based) to `params`, given their
/// already-averaged f32 gradients.
pub(crate) fn adamw_update(cfg: &AdamW, t: u64, params: &[Param], grads: &[Tensor], clip: f64) {
    let _guard = tch::no_grad_guard();
    let t = t as i32;
    let bc1 = 1.0 - cfg.beta1.powi(t);
    let bc2 = 1.0 - cfg.beta2.powi(t);
    for (p, g) in params.iter().zip(grads) {
        let g = if clip < 1.0 {
            g * clip
        } else {
            g.shallow_clone()
        };
        let mut m = p.m.shallow_clone();
        let mut v = p.v.shallow_clone();
        let _ = m.g_mul_scalar_(cfg.beta1);
        let _ = m.g_add_(&(&g * (1.0 - cfg.beta1)));
        let _ = v.g_mul_scalar_(cfg.beta2);
        let _ = v.g_add_(&(g.square() * (1.0 - cfg.beta2)));
        let denom = (&v / bc2).sqrt() + cfg.eps;
        let mut w = p.f32_values();
        if p.decay && cfg.weight_decay > 0.0 {
            let _ = w.g_mul_scalar_(1.0 - cfg.lr * cfg.weight_decay);
        }
        let _ = w.g_add_(&(&m / denom * (-cfg.lr / bc1)));
        if p.master.is_some() {
            p.tensor.shallow_clone().copy_(&w);
        }
    }
}
