//! Activation checkpointing: a forward pass that keeps only each block's input, and the
//! backward pass that recomputes the blocks from them, one at a time.
//!
//! A stage's forward pass is a chain of segments ([`Net::enter`], each [`Net::layer`],
//! [`Net::exit`]). Kept whole, the autograd graph of a sample holds every intermediate
//! tensor of every segment until its backward pass: for a block, the normed inputs, the
//! queries, keys and values, the attention output and the MLP's three `ffn`-wide tensors,
//! about `10·d + 3·ffn` values per token, against the `d` of its input alone.
//!
//! Checkpointed, the forward pass runs without autograd and keeps the stage's input and the
//! input of every segment after the entry. The backward pass walks the segments in reverse:
//! it recomputes the segment with autograd from its saved input (a fresh leaf), pushes the
//! gradient of its output through it (the vector–Jacobian product `Σ y·g`, as the whole
//! graph's backward pass does), and hands the leaf's gradient to the segment below.
//! Parameter gradients accumulate on the weights the sample was forwarded with, as they do
//! with the whole graph. The cost is one more forward pass of the stage per sample; at most
//! one segment's graph is alive at a time.
//!
//! Recomputation is exact when the forward maths is deterministic on the device (it is on
//! the CPU): the same ops on the same inputs give the same values, so the gradients equal
//! the whole graph's up to the order in which a residual's two contributions are summed.

use tch::{Kind, TchError, Tensor};

use crate::model::{Context, Net};

/// What a checkpointed forward pass keeps of a sample.
pub(super) struct Saved {
    /// The stage's input, as prepared (tokens for the head, else the hidden state).
    input: Tensor,
    /// The sample's tokens, for a subspace stage after the head.
    tokens: Option<Tensor>,
    /// The input of every block, in order.
    blocks: Vec<Tensor>,
    /// The input of the exit (the last block's output).
    last: Tensor,
}

impl Saved {
    /// Bytes of the tensors kept (the input, the tokens and the states), each storage
    /// once (a stage that neither embeds nor projects its input keeps it as its first
    /// block's input too).
    pub(super) fn bytes(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        std::iter::once(&self.input)
            .chain(&self.tokens)
            .chain(&self.blocks)
            .chain(std::iter::once(&self.last))
            .filter(|t| seen.insert(t.data_ptr() as usize))
            .map(tensor_bytes)
            .sum()
    }
}

/// Bytes of a tensor's elements.
fn tensor_bytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

/// Runs the entry and the blocks without autograd, keeping each block's input and the
/// exit's; the exit is left to the caller.
pub(super) fn forward_to_exit(net: &Net, input: Tensor, tokens: Option<Tensor>) -> Saved {
    run_blocks(net, input, tokens).0
}

/// The whole forward pass without autograd: the stage's output and what its backward pass
/// needs.
pub(super) fn forward(net: &Net, input: Tensor, tokens: Option<Tensor>) -> (Tensor, Saved) {
    let (saved, ctx) = run_blocks(net, input, tokens);
    let out = tch::no_grad(|| net.exit(&saved.last, &ctx));
    (out, saved)
}

/// [`forward_to_exit`], and the sample's context for the exit.
fn run_blocks(net: &Net, input: Tensor, tokens: Option<Tensor>) -> (Saved, Context) {
    tch::no_grad(|| {
        let ctx = net.context(&input, tokens.as_ref());
        let mut blocks = Vec::with_capacity(net.num_layers());
        let mut h = net.enter(&input);
        for i in 0..net.num_layers() {
            let next = net.layer(i, &h, &ctx);
            blocks.push(h);
            h = next;
        }
        let saved = Saved {
            input,
            tokens,
            blocks,
            last: h,
        };
        (saved, ctx)
    })
}

/// The backward pass of a checkpointed sample. `seed` is given the exit's output, recomputed
/// with autograd, and back-propagates into it (`Σ y·g` for a gradient `g` from the next
/// stage, the loss for the tail). Returns the gradient with respect to the stage's input
/// (`None` for the head, whose input is tokens).
pub(super) fn backward(
    net: &Net,
    saved: Saved,
    head: bool,
    seed: impl FnOnce(&Tensor) -> Result<(), TchError>,
) -> Result<Option<Tensor>, TchError> {
    let Saved {
        input,
        tokens,
        blocks,
        last,
    } = saved;
    let ctx = tch::no_grad(|| net.context(&input, tokens.as_ref()));
    let leaf = last.f_detach()?.set_requires_grad(true);
    seed(&net.exit(&leaf, &ctx))?;
    let mut g = grad_of(&leaf)?;
    // Each block's input is freed once its recomputation has consumed it.
    for (i, h) in blocks.into_iter().enumerate().rev() {
        let leaf = h.f_detach()?.set_requires_grad(true);
        vjp(&net.layer(i, &leaf, &ctx), &g)?;
        g = grad_of(&leaf)?;
    }
    if head {
        vjp(&net.enter(&input), &g)?;
        return Ok(None);
    }
    let leaf = input.f_detach()?.set_requires_grad(true);
    vjp(&net.enter(&leaf), &g)?;
    Ok(Some(grad_of(&leaf)?))
}

/// Back-propagates the gradient `g` of `y` into the graph that made `y`.
pub(super) fn vjp(y: &Tensor, g: &Tensor) -> Result<(), TchError> {
    // d/dy of Σ y·g is g.
    (y * g.f_to_kind(y.kind())?)
        .f_sum(Kind::Float)?
        .f_backward()
}

/// The gradient accumulated on `leaf` (zeros if none reached it), detached.
fn grad_of(leaf: &Tensor) -> Result<Tensor, TchError> {
    let g = leaf.grad();
    if g.defined() {
        g.f_detach()
    } else {
        leaf.f_zeros_like()
    }
}
