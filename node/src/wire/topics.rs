//! The gossip topics of a run: their names, in one place, for every service that publishes
//! or follows them.

/// The topics of one run.
#[derive(Debug, Clone)]
pub(crate) struct Topics {
    /// Heartbeats of every node.
    pub(crate) heartbeat: String,
    /// Epoch plans, from the orchestrator.
    pub(crate) plan: String,
    /// Loss records, held-out losses, finished heads and merged hashes.
    pub(crate) pipeline: String,
}

impl Topics {
    /// The topics of the run named `run`.
    pub(crate) fn of(run: &str) -> Topics {
        Topics {
            heartbeat: format!("iota/{run}/heartbeat/1"),
            plan: format!("iota/{run}/plan/1"),
            pipeline: format!("iota/{run}/pipeline/1"),
        }
    }

    /// Every topic, for subscribing at start.
    pub(crate) fn all(&self) -> Vec<String> {
        vec![
            self.heartbeat.clone(),
            self.plan.clone(),
            self.pipeline.clone(),
        ]
    }
}

/// The gossip topic of the butterfly merges of `stage` in the run named `run`.
pub(crate) fn butterfly(run: &str, stage: u32) -> String {
    format!("iota/{run}/butterfly/{stage}/1")
}
