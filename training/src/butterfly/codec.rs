//! Binary wire format of the merge messages (version 1), with hard size limits.
//!
//! Layout: one version byte, one tag byte, then the fields in declaration order; integers
//! little-endian; strings as `u16` length + UTF-8; lists as `u32` count + items; hashes as
//! 32 raw bytes; values as `u32` count + little-endian `f32`s. Guarantees: decoding never
//! panics, refuses input over the message's limit before reading it, checks every claimed
//! count against both its limit and the bytes actually present before allocating, and
//! rejects trailing bytes, so each message has exactly one encoding.

use super::message::{
    check_count, check_id, Commitment, Evidence, Gossip, Misbehaviour, MisbehaviourKind, Request,
    Response, SliceHash, Unavailable, MAX_GOSSIP_BYTES, MAX_PARTITION_VALUES, MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
};
use super::plan::{MAX_MEMBERS, MAX_PARTITIONS};
use super::Hash;

/// Wire format version written first in every message.
pub const WIRE_VERSION: u8 = 1;

/// Why bytes are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input is longer than the limit for this kind of message.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Input length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The input ends before the message does.
    #[error("message truncated")]
    Truncated,
    /// Bytes left over after a complete message.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A wire version this code does not speak.
    #[error("unknown wire version {0}")]
    UnknownVersion(u8),
    /// An unknown message, variant or enum tag.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// Which tag.
        what: &'static str,
        /// Its value.
        tag: u8,
    },
    /// A list longer than its limit.
    #[error("{count} {what}, at most {max} allowed")]
    TooMany {
        /// Which list.
        what: &'static str,
        /// Count claimed.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A member id that is empty or too long.
    #[error("member id of {len} bytes is empty or too long")]
    BadMemberId {
        /// Its length.
        len: usize,
    },
    /// A string that is not UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// The JSON form did not parse (message of the parser).
    #[error("invalid JSON: {0}")]
    Json(String),
}

impl Gossip {
    /// Binary encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(WIRE_VERSION);
        match self {
            Gossip::Commitment(c) => {
                w.u8(1);
                w.u64(c.epoch);
                w.u32(c.stage);
                w.str(&c.member);
                w.u64(c.samples);
                w.hashes(&c.partition_hashes);
            }
            Gossip::SliceHash(s) => {
                w.u8(2);
                w.u64(s.epoch);
                w.u32(s.stage);
                w.u32(s.partition);
                w.u32(s.round);
                w.str(&s.holder);
                w.u32(s.included.len() as u32);
                s.included.iter().for_each(|m| w.str(m));
                w.hashes(&s.input_hashes);
                w.hash(&s.result);
            }
            Gossip::Misbehaviour(m) => {
                w.u8(3);
                w.u64(m.epoch);
                w.u32(m.stage);
                w.str(&m.reporter);
                w.str(&m.accused);
                w.u8(match m.kind {
                    MisbehaviourKind::WrongAverage => 1,
                    MisbehaviourKind::Equivocation => 2,
                    MisbehaviourKind::NonFinite => 3,
                    MisbehaviourKind::Outlier => 4,
                });
                encode_evidence(&mut w, &m.evidence);
            }
        }
        w.0
    }

    /// Length of [`Gossip::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        self.encode().len()
    }

    /// Decodes the binary form, refusing more than [`MAX_GOSSIP_BYTES`].
    pub fn decode(bytes: &[u8]) -> Result<Gossip, DecodeError> {
        let mut r = Reader::new(bytes, MAX_GOSSIP_BYTES)?;
        let message = match r.u8()? {
            1 => Gossip::Commitment(Commitment {
                epoch: r.u64()?,
                stage: r.u32()?,
                member: r.id()?,
                samples: r.u64()?,
                partition_hashes: r.hashes("partition hashes", MAX_PARTITIONS)?,
            }),
            2 => {
                let epoch = r.u64()?;
                let stage = r.u32()?;
                let partition = r.u32()?;
                let round = r.u32()?;
                let holder = r.id()?;
                let count = r.count("included members", MAX_MEMBERS, 3)?;
                let included = (0..count).map(|_| r.id()).collect::<Result<_, _>>()?;
                Gossip::SliceHash(SliceHash {
                    epoch,
                    stage,
                    partition,
                    round,
                    holder,
                    included,
                    input_hashes: r.hashes("input hashes", MAX_MEMBERS)?,
                    result: r.hash()?,
                })
            }
            3 => Gossip::Misbehaviour(Misbehaviour {
                epoch: r.u64()?,
                stage: r.u32()?,
                reporter: r.id()?,
                accused: r.id()?,
                kind: match r.u8()? {
                    1 => MisbehaviourKind::WrongAverage,
                    2 => MisbehaviourKind::Equivocation,
                    3 => MisbehaviourKind::NonFinite,
                    4 => MisbehaviourKind::Outlier,
                    tag => {
                        return Err(DecodeError::UnknownTag {
                            what: "misbehaviour kind",
                            tag,
                        })
                    }
                },
                evidence: decode_evidence(&mut r)?,
            }),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "gossip",
                    tag,
                })
            }
        };
        r.finish()?;
        message.validate()?;
        Ok(message)
    }
}

fn encode_evidence(w: &mut Writer, evidence: &Evidence) {
    match evidence {
        Evidence::WrongAverage {
            partition,
            round,
            claimed,
            recomputed,
        } => {
            w.u8(1);
            w.u32(*partition);
            w.u32(*round);
            w.hash(claimed);
            w.hash(recomputed);
        }
        Evidence::ServedMismatch {
            partition,
            committed,
            served,
        } => {
            w.u8(2);
            w.u32(*partition);
            w.hash(committed);
            w.hash(served);
        }
        Evidence::ConflictingCommitments { first, second } => {
            w.u8(3);
            w.hash(first);
            w.hash(second);
        }
        Evidence::NonFiniteInput {
            partition,
            committed,
        } => {
            w.u8(5);
            w.u32(*partition);
            w.hash(committed);
        }
        Evidence::OutlierInput {
            partition,
            committed,
        } => {
            w.u8(6);
            w.u32(*partition);
            w.hash(committed);
        }
        Evidence::ConflictingSlices {
            partition,
            round,
            first,
            second,
        } => {
            w.u8(4);
            w.u32(*partition);
            w.u32(*round);
            w.hash(first);
            w.hash(second);
        }
    }
}

fn decode_evidence(r: &mut Reader<'_>) -> Result<Evidence, DecodeError> {
    Ok(match r.u8()? {
        1 => Evidence::WrongAverage {
            partition: r.u32()?,
            round: r.u32()?,
            claimed: r.hash()?,
            recomputed: r.hash()?,
        },
        2 => Evidence::ServedMismatch {
            partition: r.u32()?,
            committed: r.hash()?,
            served: r.hash()?,
        },
        3 => Evidence::ConflictingCommitments {
            first: r.hash()?,
            second: r.hash()?,
        },
        4 => Evidence::ConflictingSlices {
            partition: r.u32()?,
            round: r.u32()?,
            first: r.hash()?,
            second: r.hash()?,
        },
        5 => Evidence::NonFiniteInput {
            partition: r.u32()?,
            committed: r.hash()?,
        },
        6 => Evidence::OutlierInput {
            partition: r.u32()?,
            committed: r.hash()?,
        },
        tag => {
            return Err(DecodeError::UnknownTag {
                what: "evidence",
                tag,
            })
        }
    })
}

impl Request {
    /// Binary encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(WIRE_VERSION);
        match self {
            Request::Input {
                epoch,
                stage,
                partition,
            } => {
                w.u8(1);
                w.u64(*epoch);
                w.u32(*stage);
                w.u32(*partition);
            }
            Request::Averaged {
                epoch,
                stage,
                partition,
                result,
            } => {
                w.u8(2);
                w.u64(*epoch);
                w.u32(*stage);
                w.u32(*partition);
                w.hash(result);
            }
        }
        w.0
    }

    /// Length of [`Request::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        match self {
            Request::Input { .. } => 2 + 8 + 4 + 4,
            Request::Averaged { .. } => 2 + 8 + 4 + 4 + 32,
        }
    }

    /// Decodes the binary form, refusing more than [`MAX_REQUEST_BYTES`].
    pub fn decode(bytes: &[u8]) -> Result<Request, DecodeError> {
        let mut r = Reader::new(bytes, MAX_REQUEST_BYTES)?;
        let request = match r.u8()? {
            1 => Request::Input {
                epoch: r.u64()?,
                stage: r.u32()?,
                partition: r.u32()?,
            },
            2 => Request::Averaged {
                epoch: r.u64()?,
                stage: r.u32()?,
                partition: r.u32()?,
                result: r.hash()?,
            },
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "request",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(request)
    }
}

impl Response {
    /// Binary encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(self.encoded_len()));
        w.u8(WIRE_VERSION);
        match self {
            Response::Values(values) => {
                w.u8(1);
                w.u32(values.len() as u32);
                for v in values {
                    w.0.extend_from_slice(&v.to_le_bytes());
                }
            }
            Response::Unavailable(reason) => {
                w.u8(2);
                w.u8(match reason {
                    Unavailable::WrongMerge => 1,
                    Unavailable::NoSuchPartition => 2,
                    Unavailable::NotHolder => 3,
                    Unavailable::UnknownResult => 4,
                });
            }
        }
        w.0
    }

    /// Length of [`Response::encode`]'s output, without encoding.
    pub fn encoded_len(&self) -> usize {
        match self {
            Response::Values(values) => 2 + 4 + 4 * values.len(),
            Response::Unavailable(_) => 3,
        }
    }

    /// Decodes the binary form, refusing more than [`MAX_RESPONSE_BYTES`].
    pub fn decode(bytes: &[u8]) -> Result<Response, DecodeError> {
        let mut r = Reader::new(bytes, MAX_RESPONSE_BYTES)?;
        let response = match r.u8()? {
            1 => {
                let count = r.count("values", MAX_PARTITION_VALUES, 4)?;
                let raw = r.take(4 * count)?;
                Response::Values(
                    raw.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                )
            }
            2 => Response::Unavailable(match r.u8()? {
                1 => Unavailable::WrongMerge,
                2 => Unavailable::NoSuchPartition,
                3 => Unavailable::NotHolder,
                4 => Unavailable::UnknownResult,
                tag => {
                    return Err(DecodeError::UnknownTag {
                        what: "unavailable",
                        tag,
                    })
                }
            }),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "response",
                    tag,
                })
            }
        };
        r.finish()?;
        Ok(response)
    }
}

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn hash(&mut self, h: &Hash) {
        self.0.extend_from_slice(&h.0);
    }
    fn hashes(&mut self, hs: &[Hash]) {
        self.u32(hs.len() as u32);
        hs.iter().for_each(|h| self.hash(h));
    }
    /// Member ids are at most 128 bytes (checked on decode and by `validate`), so the
    /// `u16` length never truncates for a valid message.
    fn str(&mut self, s: &str) {
        self.0
            .extend_from_slice(&(s.len().min(usize::from(u16::MAX)) as u16).to_le_bytes());
        self.0
            .extend_from_slice(&s.as_bytes()[..s.len().min(usize::from(u16::MAX))]);
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Checks the limit and the version byte.
    fn new(bytes: &'a [u8], max: usize) -> Result<Self, DecodeError> {
        if bytes.len() > max {
            return Err(DecodeError::TooLarge {
                len: bytes.len(),
                max,
            });
        }
        let mut r = Reader { rest: bytes };
        match r.u8()? {
            WIRE_VERSION => Ok(r),
            v => Err(DecodeError::UnknownVersion(v)),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn hash(&mut self) -> Result<Hash, DecodeError> {
        Ok(Hash(self.array()?))
    }

    /// A list count, checked against its limit and against the bytes left (each item takes
    /// at least `min_item` bytes), so nothing is allocated for a count the input cannot
    /// back.
    fn count(
        &mut self,
        what: &'static str,
        max: usize,
        min_item: usize,
    ) -> Result<usize, DecodeError> {
        let count = self.u32()? as usize;
        check_count(what, count, max)?;
        if count.saturating_mul(min_item) > self.rest.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(count)
    }

    fn hashes(&mut self, what: &'static str, max: usize) -> Result<Vec<Hash>, DecodeError> {
        let count = self.count(what, max, 32)?;
        (0..count).map(|_| self.hash()).collect()
    }

    fn id(&mut self) -> Result<String, DecodeError> {
        let len = usize::from(self.u16()?);
        let bytes = self.take(len)?;
        let id = std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)?;
        check_id(id)?;
        Ok(id.to_string())
    }

    fn finish(self) -> Result<(), DecodeError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
