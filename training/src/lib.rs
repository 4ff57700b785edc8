//! Model, pipeline stages, activation compression and checkpoints for iota-p2p.

pub mod butterfly;
