//! Model, pipeline stages, activation compression and checkpoints for iota-p2p.
//!
//! - [`data`]: the embedded Shakespeare corpus and a deterministic sample loader.
//! - [`dataset`]: token shards named by a manifest, memory-mapped, and the ids a sample
//!   carries between stages.
//! - [`model`]: the Llama-style decoder and how it is cut into stages (with IOTA, ResBM or
//!   subspace bottlenecks).
//! - [`stage`]: one stage with its optimizer: forward, backward, step, flat weights.
//! - [`wire`]: the codec for activations and gradients between stages.
//! - [`local`]: the single-process reference trainer.
//! - [`memory`]: what a stage costs in memory, estimated from its shape and workload, and
//!   the process's measured peak.
//! - [`worker`]: a stage on its own compute thread behind an async handle.
//! - [`checkpoint`]: weights and optimizer state on disk, newest verified first.
//! - [`butterfly`]: partition plan, averaging and verification of stage replicas.
//! - [`outer`]: the outer Nesterov step a merge takes on the replicas' averaged change.
//! - [`export`]: the stages' weights as one safetensors model in the Hugging Face Llama layout.
//! - [`generate`]: sampling with a KV cache from an exported model, through its tokenizer.
//! - [`tokenizer`]: the run's `tokenizer.json` (byte-level by default), named by its hash.

pub mod butterfly;
pub mod checkpoint;
pub mod data;
pub mod dataset;
pub mod export;
pub mod generate;
pub mod local;
pub mod memory;
pub mod model;
pub mod outer;
pub mod preset;
pub mod stage;
pub mod tokenizer;
pub mod wire;
pub mod worker;

pub use checkpoint::CheckpointStore;
pub use data::{Batch, Corpus};
pub use dataset::{Dataset, TrainingData};
pub use local::{LocalConfig, LocalReport};
pub use model::{Bottleneck, BottleneckKind, StageLayout};
pub use preset::{
    cuda_device_count, parse_device, DType, ModelConfig, Preset, RopeScaling, ShapeError,
    MAX_VOCAB, VOCAB,
};
pub use stage::{AdamW, LossOutput, Stage, StageConfig, StageState, StepReport};
pub use tch::Device;
pub use tokenizer::Tokenizer;
pub use wire::WireDtype;
pub use worker::StageHandle;
