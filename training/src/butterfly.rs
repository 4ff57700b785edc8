//! Butterfly all-reduce: the replicas of a stage average their flat `f32` weight vectors so
//! that every honest member ends with the same bytes, each member moving about three
//! vectors' worth of data whatever the number of members, and nobody can quietly poison the
//! average.
//!
//! The protocol logic is pure where it decides ([`plan`], [`weighted_average`], the ledger
//! of gossip, the inclusion and dispute rules) and written against the small async
//! [`Transport`] trait where it talks, so the node puts libp2p (gossipsub +
//! request-response) under it and tests run many members in one process over
//! [`testing::Network`].
//!
//! # One merge
//!
//! Inputs on every member: the epoch, the stage, the [`Plan`] (from the epoch seed, the
//! sorted member ids, `P` and the vector length; see [`plan`]), the [`Timing`] deadlines,
//! and the member's own vector and sample count. The plan cuts the vector into `P`
//! contiguous partitions and gives each two *holders* drawn from the seed.
//!
//! 1. **Commit.** Each member gossips a [`Commitment`]: its sample count and the blake3 hash
//!    of each of its partitions ([`Hash::of_values`]), then serves (its [`Server`] answers
//!    [`Request::Input`]). It collects commitments until all members have committed or
//!    `commit_by` passes.
//! 2. **Hold.** Each holder fetches its partitions from every member whose commitment
//!    arrived on time, checks each against the commitment, averages the ones that passed
//!    ([`weighted_average`]: sorted member id, `f32`, weighted by samples), makes the result
//!    servable under its hash and gossips a [`SliceHash`] claim `{ included, input_hashes,
//!    result, round }`. Everybody records claims until every partition is *settled* (each
//!    holder that committed on time has a claim, and the claims agree on the result or,
//!    disagreeing, on the included set, so that no further round can change them) or
//!    `claims_by` passes.
//! 3. **Collect.** For each partition, each member takes the agreed result from either
//!    holder ([`Request::Averaged`] names the result hash) and checks the bytes against it.
//!    The merged vector and a [`MergeReport`] come back by `done_by`.
//!
//! # Fault rules
//!
//! - *Inclusion.* A member is in a holder's average only if its commitment arrived before
//!   `commit_by`, the holder could fetch its bytes, and they matched the commitment. The
//!   two holders may see different sets (one timed out on a member, a commitment arrived
//!   late at one of them). Each holder then narrows to the intersection of its set and the
//!   co-holder's latest claim and republishes with a higher round; both sets only shrink,
//!   so two honest holders agree after one exchange. A holder refuses to narrow below
//!   more than half of what it fetched itself, so a co-holder cannot censor the honest
//!   majority; the claims then stay different and the dispute rule below applies.
//!   Rounds stop at [`KEPT_ROUNDS`]` - 1`, so every published round stays servable.
//! - *Unreachable or slow member* (no answer within `fetch_timeout`, or no commitment by
//!   `commit_by`): left out of the averages; the merge goes on. Unreachability is not
//!   provable, so it is recorded in [`MergeReport::unreachable`], not gossiped.
//! - *Dead holder*: no claim from it, so the partition settles on the other holder's
//!   claim alone and members fetch from that holder (and fall back to the other holder
//!   whenever their preferred one does not answer). A lone claim is taken on its holder's
//!   word; the audit is what checks it.
//! - *Both holders dead*: no claim at all; every member keeps its own values for that
//!   partition (listed in [`MergeReport::partitions_kept_local`]) and the merge still
//!   finishes.
//!
//! # Detection
//!
//! - *Wrong average* (a holder adds noise): the two claims differ. Every member then
//!   recomputes each claim from the committed inputs of its included set (fetching
//!   inputs; a holder reuses its own), takes the claim that reproduces (largest included
//!   set, then smallest hash, if both do), and publishes a [`Misbehaviour`] of kind
//!   [`MisbehaviourKind::WrongAverage`] naming each holder whose claim did not. With no
//!   claim reproducible it keeps its own values.
//! - *Equivocation*: bytes served that differ from the commitment (or two different
//!   commitments, or two claims with one round) get the author excluded and named
//!   ([`MisbehaviourKind::Equivocation`]).
//! - *Collusion*: two holders claiming the same wrong result pass every member's checks.
//!   A validator's [`audit`] recomputes a seeded random sample of partitions (rate
//!   configurable) from the committed inputs and names both.
//!
//! - *Poisoned input* (scaled, random or otherwise far from the co-replicas'): with three or
//!   more inputs, a holder leaves out every input that [`robust::outliers`] names and
//!   publishes a [`MisbehaviourKind::Outlier`] report; a disputed claim that admits one is
//!   not taken ([`robust`]); the audit applies the same rule to every verified input of
//!   the partitions it checks.
//!
//! Sample counts are public in the commitments, so validators can compare them with
//! verified work; in the average each counts at most the lower median of the counts
//! ([`robust::capped_samples`]), so a claim buys no more weight than a co-replica has.
//!
//! # Cost
//!
//! With the plan balanced (`2P` a multiple of `N`), member `m` receives, in partition data,
//! `(N − 1)·|p|` for each partition it holds and `|p|` for each it does not:
//! `(3 − 4/N) · 4L` bytes for a vector of `L` floats, the same amount sent; plus
//! `O(N·P)` hashes of gossip (commitments and claims) and small request headers. The
//! loopback test measures this for `N = 2, 4, 8, 16`. A dispute costs each member one more
//! fetch of the disputed partition's inputs.

mod audit;
mod average;
mod codec;
mod fetch;
mod ledger;
mod message;
mod plan;
mod protocol;
pub mod robust;
mod server;
pub mod testing;
mod transport;

#[cfg(test)]
mod tests;

/// A member's id: its libp2p peer id as a string.
pub type MemberId = String;

pub use audit::{audit, sampled, AuditConfig, AuditError, AuditReport};
pub use average::{weighted_average, AverageError, Contribution, Hash, ParseHashError};
pub use codec::{DecodeError, WIRE_VERSION};
pub use ledger::{Check, Decision, Ledger, Observed};
pub use message::{
    Commitment, Evidence, Gossip, Misbehaviour, MisbehaviourKind, Request, Response, SliceHash,
    Unavailable, MAX_GOSSIP_BYTES, MAX_GOSSIP_JSON_BYTES, MAX_PARTITION_VALUES, MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
};
pub use plan::{
    plan, verify, Plan, PlanError, VerifyError, MAX_MEMBERS, MAX_MEMBER_ID_BYTES, MAX_PARTITIONS,
};
pub use protocol::{Merge, MergeConfig, MergeError, MergeOutcome, MergeReport, Timing};
pub use server::{ServedBytes, Server, KEPT_ROUNDS};
pub use transport::{Received, Transport, TransportError};
