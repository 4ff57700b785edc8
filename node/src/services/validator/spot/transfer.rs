//! A spot check's evidence, fetched in chunks: the bookkeeping, pure and unit-tested.
//!
//! A stage's weights outgrow any request-response frame (a `base` stage of 2 is 229 MB, the
//! frame limit 64 MiB), so the evidence travels in chunks of exactly
//! [`messages::EVIDENCE_CHUNK_BYTES`] (the last one shorter). The miner freezes its evidence
//! when a check's first request comes (it keeps training meanwhile) and every reply repeats
//! the evidence's layout, its total length and its blake3 hash; the validator asks for the
//! chunks in order. What the validator holds is bounded by the run's sizes for the stage
//! checked ([`Bounds`]), never by what the miner declares: a layout that does not fit them is
//! malformed before anything is allocated. A chunk out of place (another layout, total or
//! hash than the first reply's, another offset or length than asked) and a whole that does
//! not hash to the declared hash are malformed evidence too: the miner is caught. A chunk the
//! miner does not serve (no answer, an error, `NotHeld`, `Superseded`, or not all of them
//! within [`fetch_timeout`] of the first request) is a dodge
//! ([`SpotInconclusive::ChunkNotServed`]), like the other checks a miner ends without
//! evidence.
//!
//! The transfer knows only a payload's bytes, its length and hash: the split into frames and
//! weights is [`Layout`]'s, so evidence with more parts needs a longer layout, not another
//! transfer.

use std::time::Duration;

use super::{Evidence, Outcome, Reply, SpotFailure, SpotInconclusive, Target};
use crate::wire::messages;

/// The evidence does not parse, or does not fit the run.
const MALFORMED: Outcome = Outcome::Fail(SpotFailure::EvidenceMalformed);

/// Slowest transfer a miner may serve its evidence at, in bytes per second (50 Mbit/s).
const LEAST_RATE: u64 = 50_000_000 / 8;

/// Time a miner has for the whole evidence besides the transfer itself (it freezes it first).
const FETCH_SLACK: Duration = Duration::from_secs(30);

/// How long a miner has to serve `total` bytes of evidence: [`FETCH_SLACK`] plus the bytes
/// at [`LEAST_RATE`] (a 2-stage `base` stage: 66 s; a 2-stage `large` one: 6 min). The
/// validator checks one miner at a time, so a miner that drips its chunks delays the next
/// check by no more than this.
pub(crate) fn fetch_timeout(total: u64) -> Duration {
    FETCH_SLACK + Duration::from_secs(total / LEAST_RATE)
}

/// What the evidence holds, in payload order, as the miner declares it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Layout {
    /// The stage the miner says it served the sample at.
    pub(crate) stage: u32,
    /// Bytes of the sample payload received (none at the head).
    pub(crate) input_len: u64,
    /// Bytes of the frame it sent on.
    pub(crate) output_len: u64,
    /// Number of f32 weights.
    pub(crate) weights_len: u64,
    /// Bytes of the gradient frame received from the next stage (a middle stage's).
    pub(crate) received_len: u64,
    /// Bytes of the gradient frame sent back upstream (a middle stage's).
    pub(crate) sent_back_len: u64,
}

impl Layout {
    /// Bytes of the whole payload, if that fits in a `u64`.
    fn total(&self) -> Option<u64> {
        self.weights_len
            .checked_mul(4)?
            .checked_add(self.input_len)?
            .checked_add(self.output_len)?
            .checked_add(self.received_len)?
            .checked_add(self.sent_back_len)
    }
}

/// One reply's piece of the evidence.
#[derive(Debug, PartialEq)]
pub(crate) struct Chunk<'a> {
    /// What the whole evidence holds.
    pub(crate) layout: Layout,
    /// Bytes of the whole evidence.
    pub(crate) total: u64,
    /// blake3 of the whole evidence.
    pub(crate) hash: [u8; 32],
    /// Where this chunk starts in the whole.
    pub(crate) offset: u64,
    /// The chunk.
    pub(crate) bytes: &'a [u8],
}

/// The largest evidence the validator accepts for the stage checked: the run's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// The stage's number of parameters: the weights must be exactly these.
    pub(crate) weights: u64,
    /// Bytes of the largest frame the run can send.
    pub(crate) frame: u64,
}

/// The evidence gathered so far.
#[derive(Debug)]
pub(crate) struct Assembly {
    layout: Layout,
    total: u64,
    hash: [u8; 32],
    bytes: Vec<u8>,
}

impl Assembly {
    /// Starts with the check's first reply, which must fit `bounds` and start the payload.
    pub(crate) fn start(first: Chunk<'_>, bounds: Bounds) -> Result<Assembly, Outcome> {
        let layout = first.layout;
        let fits = layout.weights_len == bounds.weights
            && layout.input_len <= bounds.frame
            && layout.output_len <= bounds.frame
            && layout.received_len <= bounds.frame
            && layout.sent_back_len <= bounds.frame;
        if !fits || layout.total() != Some(first.total) {
            return Err(MALFORMED);
        }
        let total = usize::try_from(first.total).map_err(|_| MALFORMED)?;
        let mut assembly = Assembly {
            layout,
            total: first.total,
            hash: first.hash,
            bytes: Vec::new(),
        };
        assembly
            .bytes
            .try_reserve_exact(total)
            .map_err(|_| MALFORMED)?;
        assembly.add(first)?;
        Ok(assembly)
    }

    /// Where the next chunk starts, while one is missing.
    pub(crate) fn next_offset(&self) -> Option<u64> {
        let have = self.bytes.len() as u64;
        (have < self.total).then_some(have)
    }

    /// Chunks the whole evidence takes.
    pub(crate) fn chunks(&self) -> u64 {
        self.total.div_ceil(messages::EVIDENCE_CHUNK_BYTES).max(1)
    }

    /// Bytes of the whole evidence.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Adds the next chunk: the same evidence as the first, exactly where and as long as
    /// asked.
    pub(crate) fn add(&mut self, chunk: Chunk<'_>) -> Result<(), Outcome> {
        let have = self.bytes.len() as u64;
        let expected_len = (self.total - have).min(messages::EVIDENCE_CHUNK_BYTES);
        let in_place = chunk.layout == self.layout
            && chunk.total == self.total
            && chunk.hash == self.hash
            && chunk.offset == have
            && chunk.bytes.len() as u64 == expected_len;
        if !in_place {
            return Err(MALFORMED);
        }
        self.bytes.extend_from_slice(chunk.bytes);
        Ok(())
    }

    /// The whole evidence, split, once every chunk is in and the whole hashes to the
    /// declared hash.
    pub(crate) fn finish(&self) -> Result<Evidence<'_>, Outcome> {
        if self.next_offset().is_some() || *blake3::hash(&self.bytes).as_bytes() != self.hash {
            return Err(MALFORMED);
        }
        let layout = self.layout;
        let (input, rest) = self.bytes.split_at(layout.input_len as usize);
        let (output, rest) = rest.split_at(layout.output_len as usize);
        let (weights, rest) = rest.split_at(4 * layout.weights_len as usize);
        let (received, sent_back) = rest.split_at(layout.received_len as usize);
        Ok(Evidence {
            stage: layout.stage,
            input,
            output,
            weights,
            received,
            sent_back,
        })
    }
}

/// A reply to a request for a later chunk: a chunk, or how the check ends. Evidence that
/// does not parse is malformed; any other answer leaves the chunk unserved (a dodge).
pub(crate) fn parse_chunk<'a>(reply: &'a [u8], target: &Target) -> Result<Chunk<'a>, Outcome> {
    let not_served = Outcome::Inconclusive(SpotInconclusive::ChunkNotServed);
    match super::parse_reply(reply, target) {
        Ok(Reply::Evidence(chunk)) => Ok(chunk),
        Err(MALFORMED) => Err(MALFORMED),
        Ok(Reply::Superseded(_)) | Err(_) => Err(not_served),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::messages::{Service, SpotCheckReply, EVIDENCE_CHUNK_BYTES};

    const CHUNK: usize = EVIDENCE_CHUNK_BYTES as usize;

    fn payload(layout: Layout) -> Vec<u8> {
        let n = layout.total().unwrap() as usize;
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn layout() -> Layout {
        Layout {
            stage: 1,
            input_len: 1000,
            output_len: 700,
            // Two chunks and a bit.
            weights_len: (2 * CHUNK as u64 + 123) / 4,
            received_len: 600,
            sent_back_len: 500,
        }
    }

    fn bounds() -> Bounds {
        Bounds {
            weights: layout().weights_len,
            frame: 4096,
        }
    }

    fn chunk(layout: Layout, payload: &[u8], offset: usize) -> Chunk<'_> {
        let end = (offset + CHUNK).min(payload.len());
        Chunk {
            layout,
            total: payload.len() as u64,
            hash: *blake3::hash(payload).as_bytes(),
            offset: offset as u64,
            bytes: &payload[offset..end],
        }
    }

    fn target() -> Target {
        Target {
            epoch: 2,
            peer: "p".into(),
            stage: 1,
            tail: true,
            sample: 9,
            claimed_loss: 2.0,
            served: 40,
            later: 0,
            receipt: None,
            replicas: Vec::new(),
        }
    }

    #[test]
    fn evidence_larger_than_a_frame_is_gathered_chunk_by_chunk_and_split() {
        let layout = layout();
        let whole = payload(layout);
        let mut assembly = Assembly::start(chunk(layout, &whole, 0), bounds()).unwrap();
        assert_eq!(assembly.chunks(), 3);
        assert_eq!(assembly.total(), whole.len() as u64);
        assert!(assembly.finish().is_err(), "not whole yet");
        while let Some(offset) = assembly.next_offset() {
            assembly
                .add(chunk(layout, &whole, offset as usize))
                .unwrap();
        }
        let evidence = assembly.finish().unwrap();
        assert_eq!(evidence.stage, 1);
        assert_eq!(evidence.input, &whole[..1000]);
        assert_eq!(evidence.output, &whole[1000..1700]);
        let weights_end = whole.len() - 1100;
        assert_eq!(evidence.weights, &whole[1700..weights_end]);
        assert_eq!(evidence.received, &whole[weights_end..weights_end + 600]);
        assert_eq!(evidence.sent_back, &whole[weights_end + 600..]);
    }

    #[test]
    fn evidence_that_does_not_fit_the_run_is_refused_before_it_is_held() {
        let layout = layout();
        let whole = payload(layout);
        let refused = |first: Chunk<'_>| Assembly::start(first, bounds()).map(|_| ());
        // Weights of another stage's size, frames larger than the run sends.
        for wrong in [
            Layout {
                weights_len: layout.weights_len + 1,
                ..layout
            },
            Layout {
                weights_len: u64::MAX / 2,
                ..layout
            },
            Layout {
                input_len: 4097,
                ..layout
            },
            Layout {
                output_len: u64::MAX,
                ..layout
            },
            Layout {
                received_len: 4097,
                ..layout
            },
            Layout {
                sent_back_len: u64::MAX,
                ..layout
            },
        ] {
            assert_eq!(
                refused(chunk(wrong, &whole, 0)),
                Err(MALFORMED),
                "{wrong:?}"
            );
        }
        // A total that is not the layout's, a first chunk that does not start the payload.
        let mut first = chunk(layout, &whole, 0);
        first.total += 1;
        assert_eq!(refused(first), Err(MALFORMED));
        assert_eq!(refused(chunk(layout, &whole, CHUNK)), Err(MALFORMED));
        let mut short = chunk(layout, &whole, 0);
        short.bytes = &short.bytes[1..];
        assert_eq!(refused(short), Err(MALFORMED));
    }

    #[test]
    fn chunks_out_of_place_or_a_whole_of_another_hash_are_malformed() {
        let layout = layout();
        let whole = payload(layout);
        let start = || Assembly::start(chunk(layout, &whole, 0), bounds()).unwrap();
        let next = chunk(layout, &whole, CHUNK);
        let cases: Vec<Chunk<'_>> = vec![
            // Skipped ahead, or asked again.
            chunk(layout, &whole, 2 * CHUNK),
            chunk(layout, &whole, 0),
            Chunk {
                hash: [0; 32],
                ..chunk(layout, &whole, CHUNK)
            },
            Chunk {
                total: next.total + 4,
                ..chunk(layout, &whole, CHUNK)
            },
            Chunk {
                layout: Layout { stage: 2, ..layout },
                ..chunk(layout, &whole, CHUNK)
            },
            Chunk {
                bytes: &whole[CHUNK..2 * CHUNK - 1],
                ..chunk(layout, &whole, CHUNK)
            },
        ];
        for bad in cases {
            assert_eq!(start().add(bad), Err(MALFORMED));
        }
        // Every chunk in place, but the bytes are not those hashed: caught at the end.
        let mut other = whole.clone();
        other[CHUNK + 5] ^= 1;
        let mut assembly = start();
        while let Some(offset) = assembly.next_offset() {
            let mut piece = chunk(layout, &other, offset as usize);
            piece.hash = *blake3::hash(&whole).as_bytes();
            assembly.add(piece).unwrap();
        }
        assert_eq!(assembly.finish().map(|_| ()), Err(MALFORMED));
    }

    #[test]
    fn a_miner_has_time_for_its_evidence_in_proportion_to_its_size() {
        assert_eq!(fetch_timeout(0), FETCH_SLACK);
        // A 2-stage base stage, and a 2-stage large one.
        assert_eq!(fetch_timeout(227_418_030), Duration::from_secs(66));
        assert_eq!(fetch_timeout(2_057_474_048), Duration::from_secs(359));
    }

    #[test]
    fn a_later_chunk_not_served_is_a_dodge_and_garbage_is_malformed() {
        let not_served = Err(Outcome::Inconclusive(SpotInconclusive::ChunkNotServed));
        let not_held = messages::encode(Service::SpotCheck, &SpotCheckReply::NotHeld, &[]).unwrap();
        // A tail that showed the sample's first chunk cannot be said not to hold it.
        assert_eq!(parse_chunk(&not_held, &target()), not_served);
        let superseded = messages::encode(
            Service::SpotCheck,
            &SpotCheckReply::Superseded {
                epoch: Some(1),
                hash: "0f".repeat(32),
            },
            &[],
        )
        .unwrap();
        assert_eq!(parse_chunk(&superseded, &target()), not_served);
        let busy = crate::wire::rpc::error_response(crate::wire::rpc::ErrorCode::Busy);
        assert_eq!(parse_chunk(&busy, &target()), not_served);
        assert_eq!(
            parse_chunk(&[crate::wire::rpc::SPOT_CHECK, 0, 0], &target()),
            Err(MALFORMED)
        );
    }
}
