//! The gossip topics of a run: their names, in one place, for every service that publishes
//! or follows them.

/// The topics of one run.
#[derive(Debug, Clone)]
pub(crate) struct Topics {
    /// Heartbeats of every node.
    pub(crate) heartbeat: String,
    /// Epoch plans, from the orchestrator. Version 2: a plan is a zstd frame of its JSON
    /// ([`bootstrap::EpochPlan::to_wire`]); a node of version 1 does not follow it, so the two
    /// never take each other's plans for malformed ones.
    pub(crate) plan: String,
    /// Loss records, held-out losses, finished heads and merged hashes.
    pub(crate) pipeline: String,
}

impl Topics {
    /// The topics of the run named `run`.
    pub(crate) fn of(run: &str) -> Topics {
        Topics {
            heartbeat: format!("iota/{run}/heartbeat/1"),
            plan: format!("iota/{run}/plan/2"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_plan_frame_fits_a_gossip_envelope_on_the_longest_plan_topic() {
        let topics = Topics::of(&"r".repeat(bootstrap::MAX_RUN_NAME_LEN));
        let key = p2p::identity::Keypair::generate_ed25519();
        let largest = vec![0xFF; bootstrap::MAX_PLAN_WIRE_BYTES];
        let sealed = p2p::Envelope::seal(&key, &topics.plan, largest).unwrap();
        assert!(sealed.encode().len() <= p2p::MAX_ENVELOPE_BYTES);
    }
}
