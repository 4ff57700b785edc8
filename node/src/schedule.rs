//! When an epoch-closing merge starts and how long it may take, read from the epoch plans:
//! pure functions of a plan and the clock, shared by the orchestrator (which writes the
//! start into each plan), the miner (which sizes its merge deadline) and the merge service.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bootstrap::EpochPlan;

/// Key of the merge start in [`EpochPlan::merge`].
const START_KEY: &str = "merge_start_unix_ms";
/// How long after a plan is published the merge that closes the previous epoch starts:
/// enough for the plan to reach every member.
pub(crate) const MERGE_DELAY: Duration = Duration::from_millis(1500);
/// Shortest phase of a merge (commit, claims and collection take 1, 2 and 2 phases).
const MIN_PHASE: Duration = Duration::from_secs(2);
/// Bytes per second a phase is sized for, so large stages get longer phases: the slowest
/// upload a member is expected to have. The input phase (two phases long) moves twice the
/// vector through each member's upload, so a member whose upload is at least this rate
/// finishes in time. 8 MB/s is a 64 Mbit/s home uplink; 40 MB/s (the rate before) cut off
/// the merges of a 1 B model's stages on 100 Mbit/s uplinks (`iota-p2p simulate`, scenarios
/// mixed-256 and churn: inputs took 74-77 s against a 24 s budget, so partitions kept
/// local values).
const PHASE_BYTES_PER_S: f64 = 8e6;

/// The `merge` field of a plan that opens an epoch at `now`: when the merge closing the
/// previous epoch starts.
pub(crate) fn merge_field(now: SystemTime) -> serde_json::Value {
    let start = now + MERGE_DELAY;
    let ms = start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    serde_json::json!({ START_KEY: ms })
}

/// When the merge closing the epoch before `plan` starts; `now + MERGE_DELAY` when the plan
/// does not say.
pub(crate) fn merge_start(plan: &EpochPlan) -> SystemTime {
    plan.merge
        .as_ref()
        .and_then(|m| m.get(START_KEY))
        .and_then(serde_json::Value::as_u64)
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
        .unwrap_or_else(|| SystemTime::now() + MERGE_DELAY)
}

/// How far from now a plan may place the merge it opens with: a plan takes well under a
/// second to spread, and clocks agree within that; a start far off would stall the stage.
const MAX_MERGE_START_SKEW: Duration = Duration::from_secs(60);

/// Whether `plan`'s merge start (if it names one) lies within [`MAX_MERGE_START_SKEW`] of
/// `now`.
pub(crate) fn merge_start_is_plausible(plan: &EpochPlan, now: SystemTime) -> bool {
    let Some(value) = plan.merge.as_ref() else {
        return true;
    };
    let Some(ms) = value.get(START_KEY).and_then(serde_json::Value::as_u64) else {
        return false;
    };
    let Some(start) = UNIX_EPOCH.checked_add(Duration::from_millis(ms)) else {
        return false;
    };
    let gap = match start.duration_since(now) {
        Ok(ahead) => ahead,
        Err(behind) => behind.duration(),
    };
    gap <= MAX_MERGE_START_SKEW
}

/// The most samples a member's weight in the merge closing `plan`'s epoch may rest on: every
/// sample the epoch's heads draw. A member's count is its own word, so it is capped at what
/// the plan can feed: no member outweighs a whole epoch's work (a count of `u64::MAX` would
/// otherwise replace the stage with its sender's weights).
pub(crate) fn max_samples(plan: &EpochPlan) -> u64 {
    let heads = plan.miners_of(0).count() as u64;
    plan.epoch_samples.saturating_mul(heads.max(1))
}

/// How long a merge of `len` values takes at most once it starts: its five phases (commit,
/// two of claims, two of collection), each sized for the vector's bytes.
pub(crate) fn merge_budget(len: usize) -> Duration {
    phase_for(len) * 5
}

/// One phase of a merge of `len` values.
pub(crate) fn phase_for(len: usize) -> Duration {
    let bytes = len.saturating_mul(4) as f64;
    // An hour per phase is far beyond any stage this node can hold.
    MIN_PHASE.max(Duration::from_secs_f64(
        (bytes / PHASE_BYTES_PER_S).min(3600.0),
    ))
}

/// Milliseconds since the Unix epoch of `wall` (0 before it).
pub(crate) fn unix_ms(wall: std::time::SystemTime) -> u64 {
    wall.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
