//! Messages of the training pipeline: request-response frames between miners and the small
//! gossip messages that report losses and merged weights.
//!
//! Request-response bodies share the node's one protocol; the first byte names the service
//! (see [`Service`] and the tag table in [`crate::wire::rpc`]). A body is `tag, u32 header length (big-endian), JSON header, payload`,
//! where the payload is a tensor frame of the training crate's wire codec, raw f32 weights,
//! or, for forwards and evaluations, a *sample payload* ([`pack_sample`]): the sample's token
//! ids beside its activation, so that only heads read data.
//! Headers are bounded by [`MAX_HEADER_BYTES`] and checked before they are parsed, so a
//! malformed body is an error, never a panic or a large allocation.
//!
//! | bytes | sample payload |
//! | --- | --- |
//! | 4 | length `n` of the token block, little-endian |
//! | `n` | the token block ([`training::dataset::tokens`]) |
//! | … | the activation frame |

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::wire::rpc;

/// Largest JSON header accepted in a pipeline body.
pub(crate) const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Largest gossip message the pipeline publishes (the p2p layer caps gossip at 64 KiB).
pub(crate) const MAX_GOSSIP_BYTES: usize = 48 * 1024;

/// The first byte of a request-response body: which service it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    /// Forward an activation; the response carries the gradient back.
    Forward = rpc::PIPELINE_FORWARD as isize,
    /// Evaluate held-out data without gradients.
    Eval = rpc::PIPELINE_EVAL as isize,
    /// Fetch a stage's current weights.
    Weights = rpc::STAGE_WEIGHTS as isize,
    /// A validator's spot check: the evidence of one recent sample.
    SpotCheck = rpc::SPOT_CHECK as isize,
    /// Ask a validator which merge hash of a stage its audit confirmed.
    Confirmation = rpc::MERGE_CONFIRMATION as isize,
    /// The run's data: a manifest, a tokenizer or a shard chunk, by hash.
    Data = rpc::DATA as isize,
    /// Joining a run: its name and hashes, its configuration and stake snapshot by hash.
    Join = rpc::JOIN as isize,
}

impl Service {
    /// The service a body is for, from its first byte.
    pub(crate) fn of(body: &[u8]) -> Option<Service> {
        match *body.first()? {
            rpc::PIPELINE_FORWARD => Some(Service::Forward),
            rpc::PIPELINE_EVAL => Some(Service::Eval),
            rpc::STAGE_WEIGHTS => Some(Service::Weights),
            rpc::SPOT_CHECK => Some(Service::SpotCheck),
            rpc::MERGE_CONFIRMATION => Some(Service::Confirmation),
            rpc::DATA => Some(Service::Data),
            rpc::JOIN => Some(Service::Join),
            _ => None,
        }
    }
}

/// Why a pipeline body did not decode.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// Shorter than its fixed part or its declared header.
    #[error("truncated pipeline message")]
    Truncated,
    /// The tag names another service.
    #[error("pipeline message for another service")]
    WrongService,
    /// The header is larger than [`MAX_HEADER_BYTES`].
    #[error("pipeline header of {0} bytes is too large")]
    HeaderTooLarge(usize),
    /// The header is not the expected JSON.
    #[error("malformed pipeline header: {0}")]
    Header(#[from] serde_json::Error),
}

/// Encodes `header` and `payload` for `service`.
pub(crate) fn encode<H: Serialize>(
    service: Service,
    header: &H,
    payload: &[u8],
) -> Result<Vec<u8>, BodyError> {
    let json = serde_json::to_vec(header)?;
    if json.len() > MAX_HEADER_BYTES {
        return Err(BodyError::HeaderTooLarge(json.len()));
    }
    let mut out = Vec::with_capacity(5 + json.len() + payload.len());
    out.push(service as u8);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Decodes a body of `service` into its header and payload.
pub(crate) fn decode<H: DeserializeOwned>(
    service: Service,
    body: &[u8],
) -> Result<(H, &[u8]), BodyError> {
    if body.len() < 5 {
        return Err(BodyError::Truncated);
    }
    if body[0] != service as u8 {
        return Err(BodyError::WrongService);
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > MAX_HEADER_BYTES {
        return Err(BodyError::HeaderTooLarge(len));
    }
    let rest = &body[5..];
    if rest.len() < len {
        return Err(BodyError::Truncated);
    }
    let header = serde_json::from_slice(&rest[..len])?;
    Ok((header, &rest[len..]))
}

/// Why a sample payload did not unpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SampleError {
    /// Shorter than the token block's length field.
    #[error("sample payload of {0} bytes has no token block length")]
    Truncated(usize),
    /// The token block claims more bytes than any token block of the run can take.
    #[error("token block of {len} bytes where the run's take at most {max}")]
    TooLarge {
        /// The length claimed.
        len: usize,
        /// The run's most.
        max: usize,
    },
    /// The token block runs past the end of the payload.
    #[error("token block of {len} bytes in a payload with {left} bytes left")]
    PastEnd {
        /// The length claimed.
        len: usize,
        /// Bytes after the length field.
        left: usize,
    },
}

/// A sample payload: `tokens` (a token block, [`training::dataset::tokens::encode`]) beside
/// `frame` (the activation).
pub(crate) fn pack_sample(tokens: &[u8], frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + tokens.len() + frame.len());
    out.extend_from_slice(
        &u32::try_from(tokens.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(tokens);
    out.extend_from_slice(frame);
    out
}

/// Splits a sample payload into its token block and its frame, refusing a token block longer
/// than `max_tokens` (the most a block of the run's batch × (seq + 1) ids can take, see
/// [`crate::rules::FrameRules::max_token_bytes`]) before slicing. Neither part is decoded.
pub(crate) fn unpack_sample(
    payload: &[u8],
    max_tokens: usize,
) -> Result<(&[u8], &[u8]), SampleError> {
    let Some((len, rest)) = payload.split_first_chunk::<4>() else {
        return Err(SampleError::Truncated(payload.len()));
    };
    let len = u32::from_le_bytes(*len) as usize;
    if len > max_tokens {
        return Err(SampleError::TooLarge {
            len,
            max: max_tokens,
        });
    }
    if len > rest.len() {
        return Err(SampleError::PastEnd {
            len,
            left: rest.len(),
        });
    }
    Ok(rest.split_at(len))
}

/// Header of a forward request; the payload is a sample payload ([`pack_sample`]): the
/// sample's token ids and the activation frame.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ForwardHeader {
    /// Epoch the sample belongs to.
    pub(crate) epoch: u64,
    /// The sample's id (it determines its tokens).
    pub(crate) sample: u64,
    /// Peers the sample went through so far, one per stage.
    pub(crate) pathway: Vec<String>,
    /// When the head stops waiting for this sample, in milliseconds since the Unix epoch:
    /// every stage after it drops the sample once this passes, so that no stage works on a
    /// sample its head gave up on. A stage never waits longer than its own hop timeout,
    /// whatever a sender writes here.
    pub(crate) deadline_ms: u64,
    /// One receipt per hop of `pathway`, the sender's last, naming the receiver
    /// ([`crate::wire::receipt`]); the tail puts them, and its own, in its loss record. A
    /// header without them decodes, and is refused for it.
    #[serde(default)]
    pub(crate) receipts: Vec<crate::wire::receipt::HopReceipt>,
}

/// Header of a forward response; on success the payload is the gradient frame for the sender.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) enum ForwardReply {
    /// The sample went to the tail and back.
    Done {
        /// The tail's loss.
        loss: f32,
        /// The whole pathway, one peer per stage.
        pathway: Vec<String>,
    },
    /// The sample was not processed; the sender should try another replica or drop it.
    Failed {
        /// Why, for the sender's log.
        reason: String,
    },
}

/// Header of an evaluation request; the payload is a sample payload ([`pack_sample`]): the
/// held-out batch's token ids and the activation frame.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct EvalHeader {
    /// Index of the validation batch (it determines the targets).
    pub(crate) batch: u64,
}

/// Header of an evaluation response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) enum EvalReply {
    /// Mean loss of the batch.
    Loss(f32),
    /// Not evaluated.
    Failed(String),
}

/// Header of a weights request: a chunk of a stage's merged snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct WeightsRequest {
    /// The stage whose weights are wanted.
    pub(crate) stage: u32,
    /// First value of the chunk.
    pub(crate) offset: u64,
    /// Values wanted (the server sends at most its chunk bound).
    pub(crate) count: u64,
}

/// Header of a weights response; the payload is a chunk of the little-endian f32 weight
/// vector, values `offset .. offset + payload / 4` of `total`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) enum WeightsReply {
    /// The stage's weights as of the end of `epoch`'s merge (the initial weights when
    /// `None`): the snapshot a replica keeps, not its live weights.
    Weights {
        /// Stage of the weights.
        stage: u32,
        /// The merge they come from.
        epoch: Option<u64>,
        /// blake3 of the whole vector's little-endian bytes, hex (the merge hash).
        hash: String,
        /// Values in the whole vector.
        total: u64,
        /// First value of this chunk.
        offset: u64,
    },
    /// This node does not hold that stage.
    NotHeld,
}

/// Bytes of a spot check's evidence one reply carries (the last chunk fewer): far below any
/// request-response frame limit, so a stage of any size can be checked.
pub(crate) const EVIDENCE_CHUNK_BYTES: u64 = 8 << 20;

/// Header of a spot-check request: a validator asks a miner for the evidence of a sample
/// it took part in, one chunk at a time.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SpotCheckRequest {
    /// Epoch of the sample.
    pub(crate) epoch: u64,
    /// The sample.
    pub(crate) sample: u64,
    /// First byte of the evidence wanted. At 0 the miner freezes its evidence of the sample
    /// (with its current weights) for this validator; the later chunks come from that copy.
    #[serde(default)]
    pub(crate) offset: u64,
}

/// Header of a spot-check response. With `Evidence` the payload is bytes `offset ..` of the
/// evidence, [`EVIDENCE_CHUNK_BYTES`] of them (the last chunk fewer). The evidence is the
/// sample payload received ([`pack_sample`], `input_len` bytes; none at the head, which
/// draws the ids its sample id names), then what the miner sent on (`output_len` bytes: the
/// sample payload with its activation, or the gradient at the tail), then its weights as little-endian f32 (`weights_len` values), then, from a
/// middle stage, the gradient frame it received from the next stage (`received_len` bytes)
/// and the one it sent back upstream (`sent_back_len` bytes): `total` bytes in all, hashing
/// to `hash`; every chunk's header is the same but for `offset`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) enum SpotCheckReply {
    /// What the miner kept of the sample.
    Evidence {
        /// The stage it served the sample at.
        stage: u32,
        /// The loss it computed (the tail only).
        loss: Option<f32>,
        /// Bytes of the input frame.
        input_len: u64,
        /// Bytes of the output frame.
        output_len: u64,
        /// Number of f32 weights.
        weights_len: u64,
        /// Bytes of the gradient frame received from the next stage (a middle stage's).
        #[serde(default)]
        received_len: u64,
        /// Bytes of the gradient frame sent back upstream (a middle stage's).
        #[serde(default)]
        sent_back_len: u64,
        /// Bytes of the whole evidence.
        total: u64,
        /// blake3 of the whole evidence, hex.
        hash: String,
        /// First byte of this chunk.
        offset: u64,
    },
    /// The miner kept nothing of that sample (it never served it, or too long ago).
    NotHeld,
    /// The miner served the sample, but its weights have been replaced since, by the ones it
    /// holds now: the merge of its stage closing `epoch` (none: the run seed), whose merged
    /// weights hash to `hash` (blake3, hex). The validator checks the claim against the
    /// merge hashes the stage's replicas gossiped.
    Superseded {
        /// The epoch whose closing merge the miner's weights come from.
        epoch: Option<u64>,
        /// The hash of that merge's weights.
        hash: String,
    },
}

/// A joining node's question (the header of a [`Service::Join`] request; no payload).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) enum JoinRequest {
    /// The run's name and the hashes of what this node follows.
    Summary,
    /// The run configuration (TOML) whose [`bootstrap::RunConfig::hash`] is `hash` (hex).
    Run {
        /// The hash wanted.
        hash: String,
    },
    /// The stake snapshot (JSON) whose [`bootstrap::Metagraph::hash`] is `hash` (hex).
    Metagraph {
        /// The hash wanted.
        hash: String,
    },
}

/// The header of a [`Service::Join`] response. With `Bytes` the payload is the file asked
/// for; the asker checks its hash before it believes a byte of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) enum JoinReply {
    /// What the answering node follows. Only a hint: a joining node believes the validators'
    /// heartbeats, not this.
    Summary {
        /// The run's name (its gossip topics are named by it).
        run_name: String,
        /// The run configuration's hash, hex.
        run_hash: String,
        /// The stake snapshot's hash, hex, when the node follows a snapshot.
        metagraph_hash: Option<String>,
    },
    /// The file asked for follows.
    Bytes,
    /// This node does not hold a file of that hash.
    Missing,
}

/// A joining replica asks a validator about the merge of `stage` that closed `epoch`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ConfirmationRequest {
    /// Epoch the merge closed.
    pub(crate) epoch: u64,
    /// Stage.
    pub(crate) stage: u32,
}

/// A validator's word on one merge (the whole response is this header).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) enum ConfirmationReply {
    /// The audit reproduced every sampled partition and named nobody, and every member
    /// gossiped this hash of the merged weights.
    Confirmed {
        /// blake3 of the merged weights, hex.
        hash: String,
    },
    /// The audit (or the members' hashes) is not in yet: ask again shortly.
    Pending,
    /// The validator did not audit that merge (too old, one member, or not a validator).
    Unaudited,
    /// The audit named a member of the merge.
    Caught,
    /// The members gossiped different hashes.
    Disputed,
}

/// One sample's result, as a tail reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct LossRecord {
    /// The sample.
    pub(crate) sample: u64,
    /// One peer per stage.
    pub(crate) pathway: Vec<String>,
    /// Mean cross-entropy in nats per token.
    pub(crate) loss: f32,
    /// One receipt per hop of the pathway, the tail's last: the proof that the sample
    /// travelled it ([`crate::wire::receipt`]). A record without them decodes, and is
    /// refused for it.
    #[serde(default)]
    pub(crate) receipts: Vec<crate::wire::receipt::HopReceipt>,
}

/// What the pipeline gossips.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) enum PipelineGossip {
    /// Loss records of one epoch, in small batches from a tail.
    Losses {
        /// Epoch of the samples.
        epoch: u64,
        /// Tokens per sample.
        tokens_per_sample: u64,
        /// The records.
        records: Vec<LossRecord>,
    },
    /// Held-out loss of the model as it is at the start of `epoch` (after the previous merge).
    ValLoss {
        /// Epoch whose start was evaluated.
        epoch: u64,
        /// Mean held-out loss, nats per token.
        loss: f32,
    },
    /// A head finished drawing its samples of `epoch`.
    HeadDone {
        /// The epoch.
        epoch: u64,
        /// Samples that went through the whole pipeline.
        samples: u64,
        /// Samples dropped after every retry failed.
        dropped: u64,
    },
    /// A validator's weights for the miners after scoring `epoch`, in chain form.
    Weights {
        /// The epoch scored.
        epoch: u64,
        /// `(uid, weight)`, the largest weight 65 535.
        weights: Vec<(u16, u16)>,
    },
    /// A replica's weights after the merge that closed `epoch`.
    Merged {
        /// Epoch the merge closed.
        epoch: u64,
        /// Stage.
        stage: u32,
        /// blake3 of the merged weights, hex.
        hash: String,
        /// Wire bytes this miner sent per boundary this epoch.
        wire_bytes: u64,
    },
}

impl PipelineGossip {
    /// JSON encoding, refused above [`MAX_GOSSIP_BYTES`].
    pub(crate) fn to_bytes(&self) -> Option<Vec<u8>> {
        serde_json::to_vec(self)
            .ok()
            .filter(|b| b.len() <= MAX_GOSSIP_BYTES)
    }

    /// Decodes a message, refusing oversized input before parsing.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > MAX_GOSSIP_BYTES {
            return None;
        }
        serde_json::from_slice(bytes).ok()
    }
}

/// Little-endian bytes of an f32 vector.
pub(crate) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// An f32 vector from little-endian bytes; `None` unless the length is a multiple of 4.
pub(crate) fn f32_from_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    if bytes.len() % 4 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// Appends a weights chunk's little-endian f32 `payload` to `values`, a vector being
/// gathered up to `len` values (reserved whole with the first chunk): a chunk that is not
/// f32, is empty or would run past `len` is refused and nothing is kept.
pub(crate) fn append_f32_chunk(
    values: &mut Vec<f32>,
    payload: &[u8],
    len: usize,
) -> Result<(), &'static str> {
    let chunk = f32_from_bytes(payload).ok_or("chunk not f32")?;
    if chunk.is_empty() || values.len() + chunk.len() > len {
        return Err("chunk of the wrong size");
    }
    if values.is_empty() {
        values.reserve_exact(len);
    }
    values.extend_from_slice(&chunk);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_chunks_are_gathered_up_to_their_length_and_no_further() {
        let mut values = Vec::new();
        append_f32_chunk(&mut values, &f32_bytes(&[1.0, 2.0]), 3).unwrap();
        assert_eq!(values.capacity(), 3);
        assert_eq!(
            append_f32_chunk(&mut values, &f32_bytes(&[3.0, 4.0]), 3),
            Err("chunk of the wrong size")
        );
        assert_eq!(
            append_f32_chunk(&mut values, &[], 3),
            Err("chunk of the wrong size")
        );
        assert_eq!(
            append_f32_chunk(&mut values, &[0, 0, 0], 3),
            Err("chunk not f32")
        );
        append_f32_chunk(&mut values, &f32_bytes(&[3.0]), 3).unwrap();
        assert_eq!(values, vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn bodies_round_trip_and_garbage_is_rejected() {
        let header = ForwardHeader {
            epoch: 3,
            sample: 42,
            pathway: vec!["a".into()],
            deadline_ms: 1_700_000_000_000,
            receipts: Vec::new(),
        };
        let body = encode(Service::Forward, &header, b"frame").unwrap();
        assert_eq!(Service::of(&body), Some(Service::Forward));
        let (back, payload): (ForwardHeader, _) = decode(Service::Forward, &body).unwrap();
        assert_eq!(back, header);
        assert_eq!(payload, b"frame");
        assert!(decode::<ForwardHeader>(Service::Eval, &body).is_err());
        for cut in 0..body.len() - 5 {
            assert!(decode::<ForwardHeader>(Service::Forward, &body[..cut]).is_err());
        }
        let mut huge = body.clone();
        huge[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            decode::<ForwardHeader>(Service::Forward, &huge),
            Err(BodyError::HeaderTooLarge(_))
        ));
        assert_eq!(Service::of(&[0x7f]), None);
    }

    #[test]
    fn sample_payloads_round_trip_and_bad_lengths_are_refused_before_slicing() {
        let packed = pack_sample(b"tokens", b"frame");
        assert_eq!(
            unpack_sample(&packed, 6),
            Ok((&b"tokens"[..], &b"frame"[..]))
        );
        assert_eq!(
            unpack_sample(&packed, 5),
            Err(SampleError::TooLarge { len: 6, max: 5 })
        );
        assert_eq!(
            unpack_sample(&packed[..3], 64),
            Err(SampleError::Truncated(3))
        );
        assert_eq!(
            unpack_sample(&packed[..8], 64),
            Err(SampleError::PastEnd { len: 6, left: 4 })
        );
        // A length field claiming 4 GiB is refused on the bound, whatever follows.
        let mut huge = packed.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            unpack_sample(&huge, 64),
            Err(SampleError::TooLarge { .. })
        ));
        assert_eq!(
            unpack_sample(&pack_sample(b"", b""), 0),
            Ok((&b""[..], &b""[..]))
        );
    }

    #[test]
    fn weights_round_trip_through_bytes() {
        let w = vec![1.5f32, -0.0, f32::MIN_POSITIVE];
        assert_eq!(f32_from_bytes(&f32_bytes(&w)).unwrap(), w);
        assert!(f32_from_bytes(&[1, 2, 3]).is_none());
    }
}
