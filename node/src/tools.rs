//! The tools around a node: the [`launcher`] that starts node processes (multi-node tests use
//! it), `local-swarm`, `export`, `prepare-data`, `train-local`'s output, the `simulate`
//! tool, and the fuzzing inputs.

pub(crate) mod export;
#[doc(hidden)]
pub mod fuzzing;
pub mod launcher;
pub(crate) mod prepare_data;
pub(crate) mod simulate;
pub(crate) mod swarm;
pub(crate) mod train_local;
