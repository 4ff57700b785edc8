//! What a node needs to join a run: run configuration, stake snapshot, orchestrator election.
//!
//! Pure and deterministic: no networking, no clocks, no randomness of its own.
