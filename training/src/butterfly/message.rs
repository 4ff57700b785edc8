//! The messages of a merge: what is gossiped (commitments, slice hashes, misbehaviour
//! reports) and what is asked of a peer (a member's partition, a holder's average).
//!
//! Guarantees: every message that decodes (binary, see `codec`, or JSON here) has passed
//! [`Gossip::validate`] or the equivalent request/response checks, so no list is longer
//! than the limits in this module and no id is empty or oversized. Signatures are not
//! here: the network layer wraps each gossip message in a signed envelope and hands the
//! protocol the verified signer, which must equal the message's author field
//! ([`Gossip::author`]).

use serde::{Deserialize, Serialize};

use super::plan::{MAX_MEMBERS, MAX_MEMBER_ID_BYTES, MAX_PARTITIONS};
use super::{DecodeError, Hash, MemberId};

/// Largest binary gossip message accepted: fits, with the signature, in the p2p layer's
/// 63 KiB gossip envelope. The largest valid messages (a commitment for [`MAX_PARTITIONS`]
/// partitions, about 33 KiB; a claim for [`MAX_MEMBERS`] members with the longest ids,
/// about 42 KiB) stay below it.
pub const MAX_GOSSIP_BYTES: usize = 60 * 1024;
/// Largest JSON gossip message accepted (hashes double in size as hex).
pub const MAX_GOSSIP_JSON_BYTES: usize = 256 * 1024;
/// Largest binary request accepted.
pub const MAX_REQUEST_BYTES: usize = 64;
/// Most values one response may carry (256 MiB of `f32`): pick `P` so partitions fit.
pub const MAX_PARTITION_VALUES: usize = 64 * 1024 * 1024;
/// Largest binary response accepted.
pub const MAX_RESPONSE_BYTES: usize = 8 + 4 * MAX_PARTITION_VALUES;

/// A member's promise of what it will serve, gossiped before it serves anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commitment {
    /// Epoch of the merge.
    pub epoch: u64,
    /// Stage whose replicas merge.
    pub stage: u32,
    /// The committing member (must be the envelope's signer).
    pub member: MemberId,
    /// Samples processed this epoch: the member's weight in every average.
    pub samples: u64,
    /// blake3 of each partition the member will serve, in partition order.
    pub partition_hashes: Vec<Hash>,
}

/// A holder's claim about one partition's average, gossiped after it averaged. A holder
/// publishes round 0, then a higher round each time it narrows its included set to agree
/// with its co-holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceHash {
    /// Epoch of the merge.
    pub epoch: u64,
    /// Stage whose replicas merge.
    pub stage: u32,
    /// Partition index.
    pub partition: u32,
    /// Revision of this holder's claim; receivers keep the highest.
    pub round: u32,
    /// The holder (must be the envelope's signer).
    pub holder: MemberId,
    /// Members whose inputs are in the average, sorted ascending.
    pub included: Vec<MemberId>,
    /// Hash of each included member's input, in the order of `included`.
    pub input_hashes: Vec<Hash>,
    /// Hash of the averaged partition.
    pub result: Hash,
}

/// What a misbehaviour report accuses someone of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MisbehaviourKind {
    /// A holder published an average nobody can reproduce from the committed inputs.
    WrongAverage,
    /// A member served bytes that differ from its commitment, or committed twice
    /// differently; a holder published two different claims in one round.
    Equivocation,
    /// A member committed, and served, values that are NaN or infinite: averaged in, one
    /// such value would poison the whole partition for every member.
    NonFinite,
    /// A member's committed input of a partition is far from its co-replicas' (scaled,
    /// random or otherwise poisoned; see [`crate::butterfly::robust`]): averaged in, it
    /// would drag every replica with it.
    Outlier,
}

/// The facts behind a report, enough for a third party to check with the inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Evidence {
    /// The accused holder's result differs from the average the reporter recomputed from
    /// the committed inputs of the holder's own included set.
    WrongAverage {
        /// Partition index.
        partition: u32,
        /// Round of the accused claim.
        round: u32,
        /// Result the holder published.
        claimed: Hash,
        /// Result the reporter computed.
        recomputed: Hash,
    },
    /// The accused member served bytes whose hash differs from its commitment.
    ServedMismatch {
        /// Partition index.
        partition: u32,
        /// Hash in the member's commitment.
        committed: Hash,
        /// Hash of the bytes it served.
        served: Hash,
    },
    /// The accused member's bytes match its commitment but hold a NaN or an infinity.
    NonFiniteInput {
        /// Partition index.
        partition: u32,
        /// Hash in the member's commitment (of the bytes it served).
        committed: Hash,
    },
    /// The accused member's committed input of `partition` is an outlier among the inputs
    /// of the partition's claim (anyone can fetch them all and apply the rule).
    OutlierInput {
        /// Partition index.
        partition: u32,
        /// Hash in the member's commitment.
        committed: Hash,
    },
    /// The accused member gossiped two different commitments for one merge.
    ConflictingCommitments {
        /// Hash of the binary encoding of the first one seen.
        first: Hash,
        /// Hash of the binary encoding of the second.
        second: Hash,
    },
    /// The accused holder gossiped two different claims with the same round.
    ConflictingSlices {
        /// Partition index.
        partition: u32,
        /// The round both claims carry.
        round: u32,
        /// Result of the first claim seen.
        first: Hash,
        /// Result of the second.
        second: Hash,
    },
}

/// A signed-by-envelope accusation, gossiped by whoever detects misbehaviour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Misbehaviour {
    /// Epoch of the merge.
    pub epoch: u64,
    /// Stage whose replicas merge.
    pub stage: u32,
    /// Who reports (must be the envelope's signer).
    pub reporter: MemberId,
    /// Who is accused.
    pub accused: MemberId,
    /// What of.
    pub kind: MisbehaviourKind,
    /// The facts.
    pub evidence: Evidence,
}

/// Everything gossiped on a stage's merge topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Gossip {
    /// A member's commitment.
    Commitment(Commitment),
    /// A holder's claim.
    SliceHash(SliceHash),
    /// An accusation.
    Misbehaviour(Misbehaviour),
}

/// Request-response: what one peer asks of another during a merge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// The served member's own values of a partition (asked by holders and auditors).
    Input {
        /// Epoch of the merge.
        epoch: u64,
        /// Stage.
        stage: u32,
        /// Partition index.
        partition: u32,
    },
    /// A holder's averaged partition whose hash is `result`.
    Averaged {
        /// Epoch of the merge.
        epoch: u64,
        /// Stage.
        stage: u32,
        /// Partition index.
        partition: u32,
        /// The result hash the asker expects (a holder keeps each round's average).
        result: Hash,
    },
}

/// Request-response: the answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// The partition's values.
    Values(Vec<f32>),
    /// The server has nothing matching the request.
    Unavailable(Unavailable),
}

/// Why a server could not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Unavailable {
    /// The request names another epoch or stage.
    WrongMerge,
    /// The partition index is out of range.
    NoSuchPartition,
    /// The server does not hold that partition.
    NotHolder,
    /// The server holds the partition but has no average with that hash (not computed yet,
    /// or a round it no longer keeps).
    UnknownResult,
}

impl Gossip {
    /// Epoch and stage the message belongs to.
    pub fn merge(&self) -> (u64, u32) {
        match self {
            Gossip::Commitment(c) => (c.epoch, c.stage),
            Gossip::SliceHash(s) => (s.epoch, s.stage),
            Gossip::Misbehaviour(m) => (m.epoch, m.stage),
        }
    }

    /// Who wrote the message: the network layer must check this against the signer.
    pub fn author(&self) -> &str {
        match self {
            Gossip::Commitment(c) => &c.member,
            Gossip::SliceHash(s) => &s.holder,
            Gossip::Misbehaviour(m) => &m.reporter,
        }
    }

    /// Checks the size limits and shapes that every decoder enforces.
    pub fn validate(&self) -> Result<(), DecodeError> {
        match self {
            Gossip::Commitment(c) => {
                check_id(&c.member)?;
                check_count("partition hashes", c.partition_hashes.len(), MAX_PARTITIONS)
            }
            Gossip::SliceHash(s) => {
                check_id(&s.holder)?;
                check_count("included members", s.included.len(), MAX_MEMBERS)?;
                check_count("input hashes", s.input_hashes.len(), MAX_MEMBERS)?;
                s.included.iter().try_for_each(|m| check_id(m))
            }
            Gossip::Misbehaviour(m) => {
                check_id(&m.reporter)?;
                check_id(&m.accused)
            }
        }
    }

    /// JSON form, for logs, `/status` and tools.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("gossip has only string map keys and no floats")
    }

    /// Parses the JSON form, refusing more than [`MAX_GOSSIP_JSON_BYTES`].
    pub fn from_json(bytes: &[u8]) -> Result<Gossip, DecodeError> {
        if bytes.len() > MAX_GOSSIP_JSON_BYTES {
            return Err(DecodeError::TooLarge {
                len: bytes.len(),
                max: MAX_GOSSIP_JSON_BYTES,
            });
        }
        let message: Gossip =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
        message.validate()?;
        Ok(message)
    }
}

pub(crate) fn check_id(id: &str) -> Result<(), DecodeError> {
    if id.is_empty() || id.len() > MAX_MEMBER_ID_BYTES {
        return Err(DecodeError::BadMemberId { len: id.len() });
    }
    Ok(())
}

pub(crate) fn check_count(what: &'static str, count: usize, max: usize) -> Result<(), DecodeError> {
    if count > max {
        return Err(DecodeError::TooMany { what, count, max });
    }
    Ok(())
}
