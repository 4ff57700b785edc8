//! The miner: one pipeline stage of the model, trained together with the other miners.
//!
//! Following each accepted [`bootstrap::EpochPlan`]:
//! * at the epoch boundary the replicas of the stage that just ended merge their weights with
//!   the butterfly all-reduce, checkpoint to sled, and gossip the merged hash;
//! * the miner then (re)builds its stage when the plan moves it: from its own checkpoint of the
//!   run, else from a live replica (checked against the gossiped merge hash), else from the
//!   run seed;
//! * head miners draw samples from (epoch seed, head index, counter) and send activations to a
//!   miner of the next stage; each hop picks among the live replicas, weighted by measured
//!   throughput, and retries on another replica when a hop fails. The request's response
//!   carries the gradient back, so the gradient retraces the sample's pathway;
//! * the tail computes the loss, gossips [`LossRecord`](crate::wire::messages::LossRecord)s in small batches and returns the
//!   gradient; every stage steps its AdamW every `inner_steps` backward passes.
//!
//! In-flight samples are bounded by a semaphore per miner (a full miner answers "busy" and the
//! sender tries another replica); a sample whose hop fails everywhere is dropped and its cached
//! graph freed. Tensor work happens on the stage's compute thread
//! ([`training::StageHandle`]); this module only moves bytes and decides.
//!
//! Who owns what: the miner's task ([`task`]) owns its [`state::MinerState`] (plan, stage,
//! merge hashes, lifecycle, losses to flush, throughput, live peers, counters) and publishes
//! what the other tasks read as watch values; requests, the head's samples, merges and stage
//! builds run on tasks of their own and report back through the task's bounded inbox. The
//! few things they share directly are in [`context::Ctx`], each with why.

pub(crate) mod api;
mod checkpoint;
mod context;
mod evidence;
mod faults;
mod gate;
mod head;
mod hop;
mod lifecycle;
mod outer;
mod snapshot;
mod stage;
mod state;
mod task;
mod transition;
mod validate;

use std::sync::Mutex;
use std::time::Duration;

/// How long a miner that joins waits for the merge hash beyond the merge's own budget.
const JOIN_SLACK: Duration = Duration::from_secs(5);

/// How long one hop (and everything after it) may take before the sender gives up.
pub(crate) const HOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Most samples this miner works on at once, all stages of its pathways included.
pub(crate) const MAX_IN_FLIGHT: usize = 16;
/// Loss records per gossip message.
pub(crate) const LOSS_BATCH: usize = 16;
/// Held-out batches evaluated at the start of each epoch.
pub(crate) const VAL_BATCHES: usize = 16;

/// Most samples this miner's `stage` holds in flight at once, as its memory estimate counts
/// them: a head draws its own samples, `head_window` at a time; a later stage holds what the
/// heads routed through it send, up to [`MAX_IN_FLIGHT`] (the estimate counts none kept
/// between passes at a tail, which computes both at once).
fn stage_in_flight(stage: u32, head_window: usize) -> usize {
    if stage == 0 {
        head_window.clamp(1, MAX_IN_FLIGHT)
    } else {
        MAX_IN_FLIGHT
    }
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Locks a std mutex, recovering the data of a poisoned one.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heads_estimate_counts_its_window_and_a_later_stage_the_miners_bound() {
        // On a GPU the 2-stage Llama-3.2-1B head used 15.9 GB of the device while its
        // estimate, counting 16 samples in flight, said 84.6 GB: a head holds its window.
        assert_eq!(stage_in_flight(0, 2), 2);
        assert_eq!(stage_in_flight(0, 0), 1);
        assert_eq!(stage_in_flight(0, 1_000), MAX_IN_FLIGHT);
        for stage in [1, 3] {
            assert_eq!(stage_in_flight(stage, 2), MAX_IN_FLIGHT);
        }
    }
}
