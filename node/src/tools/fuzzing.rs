//! Exists only so that the fuzz benchmark (`node/benches/fuzz.rs`) can reach the crate's
//! private decoders; not an API. Each function decodes a request-response body or a gossip
//! message exactly as the node does and says whether it was accepted, and
//! [`pipeline_samples`] gives valid encodings to mutate. Nothing here has logic of its own.

use crate::wire::messages::{
    self, ConfirmationReply, ConfirmationRequest, EvalHeader, EvalReply, ForwardHeader,
    ForwardReply, LossRecord, PipelineGossip, Service, SpotCheckReply, SpotCheckRequest,
    WeightsReply, WeightsRequest,
};

/// [`messages::MAX_HEADER_BYTES`]: the largest JSON header of a request-response body.
pub const MAX_HEADER_BYTES: usize = messages::MAX_HEADER_BYTES;

/// [`messages::MAX_GOSSIP_BYTES`]: the largest pipeline gossip message.
pub const MAX_GOSSIP_BYTES: usize = messages::MAX_GOSSIP_BYTES;

/// Windows of the token blocks in [`pipeline_samples`]' forwards and evaluations.
const SAMPLE_BATCH: usize = 2;

/// Tokens per window given to the model in those blocks.
const SAMPLE_SEQ: usize = 8;

/// Their vocabulary (byte-level).
const SAMPLE_VOCAB: usize = 256;

/// [`messages::unpack_sample`] of a forward's or an evaluation's payload, bounded as the
/// node bounds it, then the token block's decoding for a run of [`SAMPLE_BATCH`] ×
/// [`SAMPLE_SEQ`] over [`SAMPLE_VOCAB`] (the frame is fuzzed on its own).
fn sample_payload(payload: &[u8]) -> bool {
    use training::dataset::tokens;
    let max = tokens::max_len(SAMPLE_BATCH, SAMPLE_SEQ, SAMPLE_VOCAB);
    messages::unpack_sample(payload, max).is_ok_and(|(block, _frame)| {
        tokens::decode(block, SAMPLE_BATCH, SAMPLE_SEQ, SAMPLE_VOCAB).is_ok()
    })
}

/// [`messages::decode`] of a forward request, then its sample payload, as the next stage
/// does.
pub fn forward_request(body: &[u8]) -> bool {
    messages::decode::<ForwardHeader>(Service::Forward, body)
        .is_ok_and(|(_, payload)| sample_payload(payload))
}

/// [`messages::decode`] of a forward reply, as the previous stage does.
pub fn forward_reply(body: &[u8]) -> bool {
    messages::decode::<ForwardReply>(Service::Forward, body).is_ok()
}

/// [`messages::decode`] of an evaluation request, then its sample payload.
pub fn eval_request(body: &[u8]) -> bool {
    messages::decode::<EvalHeader>(Service::Eval, body)
        .is_ok_and(|(_, payload)| sample_payload(payload))
}

/// [`messages::decode`] of an evaluation reply.
pub fn eval_reply(body: &[u8]) -> bool {
    messages::decode::<EvalReply>(Service::Eval, body).is_ok()
}

/// [`messages::decode`] of a weights request.
pub fn weights_request(body: &[u8]) -> bool {
    messages::decode::<WeightsRequest>(Service::Weights, body).is_ok()
}

/// [`messages::decode`] of a weights reply, then [`messages::f32_from_bytes`] of its payload
/// when it carries weights, as a joining replica does.
pub fn weights_reply(body: &[u8]) -> bool {
    match messages::decode::<WeightsReply>(Service::Weights, body) {
        Ok((WeightsReply::Weights { .. }, payload)) => messages::f32_from_bytes(payload).is_some(),
        Ok((WeightsReply::NotHeld, _)) => true,
        Err(_) => false,
    }
}

/// [`messages::decode`] of a spot-check request, as a miner does.
pub fn spot_check_request(body: &[u8]) -> bool {
    messages::decode::<SpotCheckRequest>(Service::SpotCheck, body).is_ok()
}

/// A validator's reading of a spot-check reply (for a middle stage and for a tail), then,
/// for evidence whole in one chunk, its gathering against the run's sizes (those of
/// [`pipeline_samples`]: 64 weights), its split and [`messages::f32_from_bytes`] of the
/// weights.
pub fn spot_check_reply(body: &[u8]) -> bool {
    use crate::services::validator::api::{parse_reply, Assembly, Bounds, Reply, Target};
    let target = Target {
        epoch: 1,
        peer: String::new(),
        stage: 1,
        tail: false,
        sample: 0,
        claimed_loss: 1.0,
        served: 0,
        later: 0,
        receipt: None,
        replicas: Vec::new(),
    };
    let tail = Target {
        tail: true,
        ..target.clone()
    };
    let _ = parse_reply(body, &tail);
    let bounds = Bounds {
        weights: 64,
        frame: 1 << 20,
    };
    match parse_reply(body, &target) {
        Ok(Reply::Evidence(chunk)) => Assembly::start(chunk, bounds).is_ok_and(|assembly| {
            assembly
                .finish()
                .is_ok_and(|evidence| messages::f32_from_bytes(evidence.weights).is_some())
        }),
        Ok(Reply::Superseded(_)) | Err(_) => false,
    }
}

/// [`messages::decode`] of a merge-confirmation request, as a validator does.
pub fn confirmation_request(body: &[u8]) -> bool {
    messages::decode::<ConfirmationRequest>(Service::Confirmation, body).is_ok()
}

/// [`messages::decode`] of a validator's word on a merge, as a joining replica does.
pub fn confirmation_reply(body: &[u8]) -> bool {
    messages::decode::<ConfirmationReply>(Service::Confirmation, body).is_ok()
}

/// [`PipelineGossip::from_bytes`], as the node's gossip handler does.
pub fn pipeline_gossip(bytes: &[u8]) -> bool {
    PipelineGossip::from_bytes(bytes).is_some()
}

/// Valid encodings of every message the functions above decode: request and reply bodies
/// of each service, then gossip messages.
pub fn pipeline_samples() -> Vec<Vec<u8>> {
    let frame = FRAME;
    let weights: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
    forward_and_eval_bodies(frame)
        .into_iter()
        .chain(weights_and_confirmation_bodies(&weights))
        .chain(spot_check_bodies(frame, &weights))
        .chain(gossip_samples().iter().map(PipelineGossip::to_bytes))
        .flatten()
        .collect()
}

/// A stand-in for an activation frame (the decoders here do not look into it).
const FRAME: &[u8] = b"IOTW\x01\x00\x01\x02 stand-in for an activation frame";

/// A sample payload: a real token block of [`SAMPLE_BATCH`] × [`SAMPLE_SEQ`] ids beside
/// `frame`.
fn sample(frame: &[u8]) -> Vec<u8> {
    let ids: Vec<u32> = (0..SAMPLE_BATCH * (SAMPLE_SEQ + 1))
        .map(|i| (i * 37 % SAMPLE_VOCAB) as u32)
        .collect();
    let batch = training::Batch::from_ids(SAMPLE_BATCH, SAMPLE_SEQ, &ids);
    let block = training::dataset::tokens::encode(&batch, SAMPLE_VOCAB);
    messages::pack_sample(&block, frame)
}

/// `n` peer ids as they appear in pathways.
fn peers(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("12D3KooWPeer{i}")).collect()
}

/// A hop receipt of the right shape (its signature verifies for nobody).
fn stand_in_receipt() -> crate::wire::receipt::HopReceipt {
    crate::wire::receipt::HopReceipt {
        received: [1; 32],
        sent: [2; 32],
        signature: [3; 64],
    }
}

/// Forward and evaluation requests (their payloads sample payloads) and replies.
fn forward_and_eval_bodies(frame: &[u8]) -> Vec<Option<Vec<u8>>> {
    vec![
        body(
            Service::Forward,
            &ForwardHeader {
                epoch: 3,
                sample: 42,
                pathway: peers(1),
                deadline_ms: 1_700_000_030_000,
                receipts: vec![stand_in_receipt()],
            },
            &sample(frame),
        ),
        body(
            Service::Forward,
            &ForwardHeader {
                epoch: 0,
                sample: 0,
                pathway: vec![],
                deadline_ms: 0,
                receipts: Vec::new(),
            },
            &sample(b""),
        ),
        body(
            Service::Forward,
            &ForwardReply::Done {
                loss: 2.5,
                pathway: peers(3),
            },
            frame,
        ),
        body(
            Service::Forward,
            &ForwardReply::Failed {
                reason: "busy".into(),
            },
            b"",
        ),
        body(Service::Eval, &EvalHeader { batch: 7 }, &sample(frame)),
        body(Service::Eval, &EvalReply::Loss(1.75), b""),
        body(
            Service::Eval,
            &EvalReply::Failed("no stage yet".into()),
            b"",
        ),
    ]
}

/// Weights and merge-confirmation requests and replies.
fn weights_and_confirmation_bodies(weights: &[f32]) -> Vec<Option<Vec<u8>>> {
    vec![
        body(
            Service::Weights,
            &WeightsRequest {
                stage: 2,
                offset: 0,
                count: 1 << 22,
            },
            b"",
        ),
        body(
            Service::Weights,
            &WeightsReply::Weights {
                stage: 2,
                epoch: Some(5),
                hash: "ab".repeat(32),
                total: weights.len() as u64,
                offset: 0,
            },
            &messages::f32_bytes(weights),
        ),
        body(
            Service::Weights,
            &WeightsReply::Weights {
                stage: 0,
                epoch: None,
                hash: String::new(),
                total: 1 << 20,
                offset: 1 << 19,
            },
            b"",
        ),
        body(Service::Weights, &WeightsReply::NotHeld, b""),
        body(
            Service::Confirmation,
            &ConfirmationRequest { epoch: 4, stage: 1 },
            b"",
        ),
        body(
            Service::Confirmation,
            &ConfirmationReply::Confirmed {
                hash: "ab".repeat(32),
            },
            b"",
        ),
        body(Service::Confirmation, &ConfirmationReply::Pending, b""),
    ]
}

/// Spot-check requests and replies (a middle stage's evidence: the sample payloads it
/// received and sent, and its weights).
fn spot_check_bodies(frame: &[u8], weights: &[f32]) -> Vec<Option<Vec<u8>>> {
    let payload = sample(frame);
    let evidence = [&payload[..], &payload, &messages::f32_bytes(weights)].concat();
    let header = SpotCheckReply::Evidence {
        stage: 1,
        loss: None,
        input_len: payload.len() as u64,
        output_len: payload.len() as u64,
        weights_len: weights.len() as u64,
        received_len: 0,
        sent_back_len: 0,
        total: evidence.len() as u64,
        hash: blake3::hash(&evidence).to_hex().to_string(),
        offset: 0,
    };
    vec![
        body(
            Service::SpotCheck,
            &SpotCheckRequest {
                epoch: 3,
                sample: 42,
                offset: 0,
            },
            b"",
        ),
        body(Service::SpotCheck, &header, &evidence),
        body(Service::SpotCheck, &SpotCheckReply::NotHeld, b""),
        body(
            Service::SpotCheck,
            &SpotCheckReply::Superseded {
                epoch: Some(1),
                hash: "ab".repeat(32),
            },
            b"",
        ),
    ]
}

/// One pipeline gossip message of each kind.
fn gossip_samples() -> [PipelineGossip; 4] {
    let records = (0..16)
        .map(|i| LossRecord {
            sample: i,
            pathway: peers(3),
            loss: 3.0 - i as f32 / 8.0,
            receipts: vec![stand_in_receipt(); 3],
        })
        .collect();
    [
        PipelineGossip::Losses {
            epoch: 4,
            tokens_per_sample: 1024,
            records,
        },
        PipelineGossip::ValLoss {
            epoch: 4,
            loss: 1.9,
        },
        PipelineGossip::HeadDone {
            epoch: 4,
            samples: 100,
            dropped: 2,
        },
        PipelineGossip::Merged {
            epoch: 4,
            stage: 1,
            hash: "cd".repeat(32),
            wire_bytes: 1 << 20,
        },
    ]
}

/// `messages::encode`, `None` if the header does not serialise within its limit.
fn body<H: serde::Serialize>(service: Service, header: &H, payload: &[u8]) -> Option<Vec<u8>> {
    messages::encode(service, header, payload).ok()
}
