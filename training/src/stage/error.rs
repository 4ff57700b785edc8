//! Errors of the stage's operations, one enum per operation.

use tch::Kind;

use crate::model::LayoutError;

/// Why a stage could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The split is impossible.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// libtorch refused (for example, the device is not available).
    #[error("creating tensors: {0}")]
    Tensor(#[from] tch::TchError),
    /// The vocabulary is empty or larger than any tokenizer's.
    #[error("a vocabulary of {vocab} tokens (must be 1..={max})")]
    Vocab {
        /// The vocabulary asked for.
        vocab: usize,
        /// The largest accepted ([`crate::preset::MAX_VOCAB`]).
        max: usize,
    },
    /// The model's shape is not a model's.
    #[error("model shape: {0}")]
    Shape(#[from] crate::preset::ShapeError),
}

/// Why a forward pass was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The operation does not apply to this stage (e.g. `forward_loss` on a non-tail stage).
    #[error("stage {index} cannot {op}")]
    WrongRole {
        /// This stage's index.
        index: usize,
        /// The refused operation.
        op: &'static str,
    },
    /// The input's shape or kind is not what this stage takes.
    #[error("bad input: expected {expected}, got shape {got:?} of {kind:?}")]
    BadInput {
        /// What the stage takes.
        expected: String,
        /// The shape given.
        got: Vec<i64>,
        /// The element kind given.
        kind: Option<Kind>,
    },
    /// A sequence is longer than the model's rotary tables.
    #[error("sequence of {seq} exceeds the maximum {max}")]
    SeqTooLong {
        /// Given length.
        seq: i64,
        /// The preset's `max_seq`.
        max: usize,
    },
    /// A token or target is outside the model's vocabulary `0..vocab`.
    #[error("token id {id} outside the vocabulary 0..{vocab}")]
    TokenOutOfRange {
        /// The first offending id (the smallest if one is negative, else the largest).
        id: i64,
        /// The model's vocabulary ([`crate::ModelConfig::vocab`]).
        vocab: usize,
    },
    /// A subspace model's stage after the head was not given the sample's tokens.
    #[error("this stage rebuilds the residual stream from the sample's tokens; none were given")]
    TokensRequired,
    /// The sample id already has a forward pass waiting for its backward.
    #[error("sample {0} is already in flight")]
    DuplicateSample(u64),
    /// [`StageConfig::max_in_flight`] samples are already waiting.
    #[error("{0} samples already in flight")]
    TooManyInFlight(usize),
    /// Weights given for an evaluation are not this stage's.
    #[error("evaluation weights: {0}")]
    EvalWeights(#[source] ParamsError),
    /// libtorch failed.
    #[error("tensor op: {0}")]
    Tensor(#[from] tch::TchError),
}

/// Why a backward pass was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BackwardError {
    /// No forward pass of this sample is waiting (never run, already consumed, or dropped).
    #[error("sample {0} is not in flight")]
    UnknownSample(u64),
    /// The gradient's shape differs from the forward output's.
    #[error("gradient of shape {got:?} for output of shape {expected:?}")]
    ShapeMismatch {
        /// Output shape.
        expected: Vec<i64>,
        /// Gradient shape.
        got: Vec<i64>,
    },
    /// libtorch failed.
    #[error("tensor op: {0}")]
    Tensor(#[from] tch::TchError),
}

/// Why an optimizer step was not taken.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StepError {
    /// No gradient has been accumulated since the last step.
    #[error("no samples accumulated since the last step")]
    NothingAccumulated,
    /// The gradient norm is NaN or infinite; the gradients were discarded.
    #[error("non-finite gradient norm {0}")]
    NonFiniteGradient(f64),
    /// The weights could not be copied for the samples still in flight (out of memory); the
    /// gradients were discarded and the weights are unchanged.
    #[error("copying the weights for the samples in flight: {0}")]
    Stash(String),
    /// The two copies of a tied embedding could not exchange their gradients.
    #[error("summing the tied embedding's gradients: {0}")]
    Tied(String),
}

/// Why weights or optimizer state could not be loaded.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParamsError {
    /// The vector's length is not this stage's parameter count.
    #[error("expected {expected} values, got {got}")]
    LengthMismatch {
        /// This stage's parameter count.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A value is NaN or infinite.
    #[error("non-finite value")]
    NonFinite,
    /// A tied-embedding gradient given to a stage that holds no copy of the tied embedding,
    /// or of another shape than its copy.
    #[error("tied-embedding gradient of shape {got:?} for a copy of shape {expected:?}")]
    TiedShape {
        /// The copy's shape (empty when the stage holds none).
        expected: Vec<i64>,
        /// The gradient's.
        got: Vec<i64>,
    },
    /// The tied-embedding gradient could not be moved to the stage's device and dtype.
    #[error("moving the tied-embedding gradient: {0}")]
    TiedMove(String),
}
