//! The rules of the requests a miner serves — forwards, evaluations and weights — pure and
//! unit-tested. The router applies them before the miner sees a request.
//!
//! * **Forward**: from the previous stage's miner in the plan of its epoch (current or the
//!   one before), which is the pathway's last hop, and every pathway entry holds its stage
//!   in that plan; its hop receipts prove the pathway so far, the last naming this node and
//!   hashing the sample payload that came, token ids and frame together
//!   ([`crate::wire::receipt`]): a tail signs its loss record's chain only after this check,
//!   so its records are never refused for a hop before it.
//! * **Evaluation**: from a previous-stage miner of the current (or previous) plan.
//! * **Weights**: from a replica of the requested stage in the current plan (a miner that
//!   joins or changes stage), or from a permitted validator of the metagraph (who measures
//!   how far a replica's weights moved from the merged ones in a spot check).
//!
//! The sample payload each forward and evaluation carries ([`messages::pack_sample`]) is
//! checked against [`crate::rules::FrameRules::sample`] (shared: the validator's
//! recomputations check frames too): its token ids must be a block of the run's batch,
//! sequence length and vocabulary ([`Refusal::TokensMalformed`] otherwise), its frame the
//! run's exact shape.

use std::collections::BTreeSet;

use bootstrap::{PeerIdStr, RunConfig};
use training::wire::FrameKind;

use crate::rules::{Expect, FrameRules, Refusal};
use crate::services::consensus::api::{stage_in, PlanBook};
use crate::wire::messages::{self, EvalHeader, ForwardHeader, Service};
use crate::wire::receipt;

/// The pipeline requests this node may serve, judged against the plans.
#[derive(Debug, Clone)]
pub(crate) struct PipelineRequests {
    me: PeerIdStr,
    run_id: u64,
    frames: FrameRules,
}

impl PipelineRequests {
    /// The rules for node `me` of `run`, whose frames carry `run_id`.
    pub(crate) fn new(me: PeerIdStr, run: &RunConfig, run_id: u64) -> anyhow::Result<Self> {
        Ok(PipelineRequests {
            me,
            run_id,
            frames: FrameRules::new(run, run_id)?,
        })
    }

    /// Checks a forward request of `peer`: its header against the plans, its token ids and
    /// its frame's shape, its receipts.
    pub(crate) fn forward(&self, book: &PlanBook, peer: &str, data: &[u8]) -> Result<(), Refusal> {
        let (header, payload) = messages::decode::<ForwardHeader>(Service::Forward, data)
            .map_err(|_| Refusal::FrameMalformed)?;
        let stage = check_forward(book, self.me.as_str(), peer, &header)?;
        self.frames.sample(
            payload,
            Expect {
                sample: Some(header.sample),
                boundary: stage - 1,
                kind: FrameKind::Activation,
            },
        )?;
        check_receipts(self.run_id, self.me.as_str(), &header, payload)
    }

    /// Checks an evaluation request of `peer`: the sender, its token ids and frame.
    pub(crate) fn eval(&self, book: &PlanBook, peer: &str, data: &[u8]) -> Result<(), Refusal> {
        let (_header, payload) = messages::decode::<EvalHeader>(Service::Eval, data)
            .map_err(|_| Refusal::FrameMalformed)?;
        let stage = check_eval(book, self.me.as_str(), peer)?;
        self.frames
            .sample(
                payload,
                Expect {
                    sample: None,
                    boundary: stage - 1,
                    kind: FrameKind::Activation,
                },
            )
            .map(|_| ())
    }

    /// Checks a weights request of `peer`, with `validators` the metagraph's permitted ones.
    pub(crate) fn weights(
        &self,
        book: &PlanBook,
        validators: &BTreeSet<PeerIdStr>,
        peer: &str,
        data: &[u8],
    ) -> Result<(), Refusal> {
        let (request, _) = messages::decode::<messages::WeightsRequest>(Service::Weights, data)
            .map_err(|_| Refusal::FrameMalformed)?;
        check_weights(book, validators, peer, request.stage)
    }
}

/// Checks a forward request from `sender` against the plan of its epoch; returns this
/// node's stage (the pathway's length) when it may be served.
pub(crate) fn check_forward(
    book: &PlanBook,
    me: &str,
    sender: &str,
    header: &ForwardHeader,
) -> Result<u32, Refusal> {
    let plan = book.recent(header.epoch).ok_or(Refusal::WrongEpoch)?;
    let stage = stage_in(plan, me).ok_or(Refusal::WrongStage)?;
    if stage == 0 || header.pathway.len() != stage as usize {
        return Err(Refusal::WrongStage);
    }
    if stage_in(plan, sender) != Some(stage - 1) {
        return Err(Refusal::NotPreviousHop);
    }
    let pathway_ok = header.pathway.last().map(String::as_str) == Some(sender)
        && header
            .pathway
            .iter()
            .enumerate()
            .all(|(s, peer)| stage_in(plan, peer) == Some(s as u32));
    if !pathway_ok {
        return Err(Refusal::BadPathway);
    }
    Ok(stage)
}

/// Checks a forward's hop receipts (after [`check_forward`]): they prove its pathway up to
/// `me`, and the last hashes `payload` (the whole sample payload: the token ids are bound
/// with the frame).
pub(crate) fn check_receipts(
    run_id: u64,
    me: &str,
    header: &ForwardHeader,
    payload: &[u8],
) -> Result<(), Refusal> {
    let sample = receipt::Sample {
        run: run_id,
        epoch: header.epoch,
        sample: header.sample,
        pathway: &header.pathway,
    };
    receipt::verify_chain(&sample, &header.receipts, Some(me)).map_err(|_| Refusal::BadReceipts)?;
    match header.receipts.last() {
        Some(last) if last.sent == receipt::digest(payload) => Ok(()),
        _ => Err(Refusal::BadReceipts),
    }
}

/// Checks an evaluation request from `sender`: it must hold the stage before this node's in
/// the current (or previous) plan. Returns this node's stage.
pub(crate) fn check_eval(book: &PlanBook, me: &str, sender: &str) -> Result<u32, Refusal> {
    let current = book.current().ok_or(Refusal::WrongEpoch)?;
    let stage = stage_in(current, me)
        .filter(|&s| s > 0)
        .ok_or(Refusal::WrongStage)?;
    let allowed = [Some(current), book.recent(current.epoch.wrapping_sub(1))]
        .into_iter()
        .flatten()
        .any(|plan| stage_in(plan, sender) == Some(stage - 1));
    if allowed {
        Ok(stage)
    } else {
        Err(Refusal::NotPreviousStage)
    }
}

/// Checks a weights request for `stage` from `sender`: only a replica of that stage in the
/// current plan (a miner that joins or changes stage) or one of the permitted `validators`
/// is served.
pub(crate) fn check_weights(
    book: &PlanBook,
    validators: &BTreeSet<PeerIdStr>,
    sender: &str,
    stage: u32,
) -> Result<(), Refusal> {
    if validators.contains(sender) {
        return Ok(());
    }
    let current = book.current().ok_or(Refusal::WrongEpoch)?;
    if stage_in(current, sender) == Some(stage) {
        Ok(())
    } else {
        Err(Refusal::NotAReplica)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::consensus::api::fixture::{book, on, peer};

    #[test]
    fn forwards_come_from_the_previous_hop_of_the_plan() {
        let (book, _) = book(&[2, 3]);
        let plan = book.current().unwrap().clone();
        let head = on(&plan, 0)[0].clone();
        let middle = on(&plan, 1)[0].clone();
        let tail = on(&plan, 2)[0].clone();
        let header = |epoch, pathway: Vec<String>| ForwardHeader {
            epoch,
            sample: 1,
            pathway,
            deadline_ms: u64::MAX,
            receipts: Vec::new(),
        };
        let stranger = peer(99).to_string();
        assert_eq!(
            check_forward(&book, &middle, &head, &header(3, vec![head.clone()])),
            Ok(1)
        );
        assert_eq!(
            check_forward(
                &book,
                &middle,
                &stranger,
                &header(3, vec![stranger.clone()])
            ),
            Err(Refusal::NotPreviousHop)
        );
        // A plan member relaying someone else's pathway.
        assert_eq!(
            check_forward(&book, &middle, &head, &header(3, vec![stranger.clone()])),
            Err(Refusal::BadPathway)
        );
        let other_head = on(&plan, 0)[1].clone();
        assert_eq!(
            check_forward(&book, &middle, &head, &header(3, vec![other_head])),
            Err(Refusal::BadPathway)
        );
        // A tail is sent to by the middle stage, with a two-hop pathway.
        assert_eq!(
            check_forward(
                &book,
                &tail,
                &middle,
                &header(3, vec![head.clone(), middle.clone()])
            ),
            Ok(2)
        );
        assert_eq!(
            check_forward(&book, &tail, &head, &header(3, vec![head.clone()])),
            Err(Refusal::WrongStage)
        );
        // The epoch before the current one still counts; older and future ones do not.
        let previous = book.recent(2).unwrap();
        let prev_head = on(previous, 0)[0].clone();
        let prev_middle = on(previous, 1)[0].clone();
        assert_eq!(
            check_forward(
                &book,
                &prev_middle,
                &prev_head,
                &header(2, vec![prev_head.clone()])
            ),
            Ok(1)
        );
        for epoch in [1, 4, u64::MAX] {
            assert_eq!(
                check_forward(&book, &middle, &head, &header(epoch, vec![head.clone()])),
                Err(Refusal::WrongEpoch)
            );
        }
    }

    #[test]
    fn forwards_carry_the_receipts_of_their_pathway_naming_this_hop() {
        use crate::services::consensus::api::fixture::key_of;
        use crate::wire::receipt::fixture::{chain, frame};
        let (book, _) = book(&[0]);
        let plan = book.current().unwrap().clone();
        let pathway = vec![on(&plan, 0)[0].clone(), on(&plan, 1)[0].clone()];
        let tail = on(&plan, 2)[0].clone();
        let run_id = 7;
        let sample = receipt::Sample {
            run: run_id,
            epoch: 0,
            sample: 1,
            pathway: &pathway,
        };
        let keys: Vec<_> = pathway.iter().map(|p| key_of(p)).collect();
        let header = |receipts| ForwardHeader {
            epoch: 0,
            sample: 1,
            pathway: pathway.clone(),
            deadline_ms: u64::MAX,
            receipts,
        };
        // The fixture's middle hop sent `frame(1, 1)`.
        let sent = frame(1, 1);
        let good = header(chain(&sample, &keys, Some(&tail)));
        assert_eq!(check_receipts(run_id, &tail, &good, &sent), Ok(()));
        // Another frame than the one the middle signed for, or a chain naming another tail.
        assert_eq!(
            check_receipts(run_id, &tail, &good, b"another frame"),
            Err(Refusal::BadReceipts)
        );
        let other_tail = on(&plan, 2)[1].clone();
        assert_eq!(
            check_receipts(run_id, &other_tail, &good, &sent),
            Err(Refusal::BadReceipts)
        );
        // No receipts, or only the head's.
        assert_eq!(
            check_receipts(run_id, &tail, &header(Vec::new()), &sent),
            Err(Refusal::BadReceipts)
        );
        let cut = header(chain(&sample, &keys, Some(&tail))[..1].to_vec());
        assert_eq!(
            check_receipts(run_id, &tail, &cut, &sent),
            Err(Refusal::BadReceipts)
        );
    }

    #[test]
    fn forwards_carry_the_runs_token_ids_bound_by_their_receipts() {
        use crate::services::consensus::api::fixture::{key_of, run};
        use crate::wire::messages::pack_sample;
        use crate::wire::receipt::{head_input, sign, Hop};
        let (book, _) = book(&[0]);
        let plan = book.current().unwrap().clone();
        let (head, middle) = (on(&plan, 0)[0].clone(), on(&plan, 1)[0].clone());
        let tail = on(&plan, 2)[0].clone();
        let run = run();
        let run_id = crate::run_spec::run_id(&run);
        let rules = PipelineRequests::new(PeerIdStr::parse(&tail).unwrap(), &run, run_id).unwrap();
        let (b, s, w) = (
            run.batch_size as usize,
            run.seq_len as usize,
            run.bottleneck as usize,
        );
        let meta = training::wire::FrameMeta {
            run: run_id,
            sample: 1,
            stage: 1,
            kind: FrameKind::Activation,
        };
        let codec = training::wire::Codec::new(training::WireDtype::Bf16);
        let frame =
            training::wire::encode(&codec, &meta, &[b, s, w], &vec![0.5; b * s * w]).unwrap();
        let ids: Vec<u32> = (0..b * (s + 1)).map(|i| (i % 200) as u32).collect();
        let tokens = training::dataset::tokens::encode(
            &training::Batch::from_ids(b, s, &ids),
            training::VOCAB,
        );
        // The body the middle stage sends the tail, its receipts over `payload`.
        let body = |payload: &[u8]| {
            let pathway = vec![head.clone(), middle.clone()];
            fn hop(run: u64, stage: u32, next: &str) -> Hop<'_> {
                Hop {
                    run,
                    epoch: 0,
                    sample: 1,
                    stage,
                    next: Some(next),
                }
            }
            let from_head = receipt::digest(b"the head's payload");
            let receipts = vec![
                sign(
                    &key_of(&head),
                    &hop(run_id, 0, &middle),
                    head_input(),
                    from_head,
                )
                .unwrap(),
                sign(
                    &key_of(&middle),
                    &hop(run_id, 1, &tail),
                    from_head,
                    receipt::digest(payload),
                )
                .unwrap(),
            ];
            let header = ForwardHeader {
                epoch: 0,
                sample: 1,
                pathway,
                deadline_ms: u64::MAX,
                receipts,
            };
            messages::encode(Service::Forward, &header, payload).unwrap()
        };
        let good = pack_sample(&tokens, &frame);
        assert_eq!(rules.forward(&book, &middle, &body(&good)), Ok(()));
        // The frame alone, as before ids travelled: refused before anything is decoded.
        assert_eq!(
            rules.forward(&book, &middle, &body(&frame)),
            Err(Refusal::TokensMalformed)
        );
        // Ids past the run's vocabulary, or a token block cut short.
        let mut wide = ids.clone();
        wide[0] = training::VOCAB as u32;
        let wide =
            training::dataset::tokens::encode(&training::Batch::from_ids(b, s, &wide), 1 << 16);
        for bad in [
            pack_sample(&wide, &frame),
            pack_sample(&tokens[..tokens.len() - 2], &frame),
        ] {
            assert_eq!(
                rules.forward(&book, &middle, &body(&bad)),
                Err(Refusal::TokensMalformed)
            );
        }
        // The receipts bind the ids: other ids under the middle's receipt of these.
        let other: Vec<u32> = ids.iter().map(|i| (i + 1) % 200).collect();
        let other = training::dataset::tokens::encode(
            &training::Batch::from_ids(b, s, &other),
            training::VOCAB,
        );
        let mut swapped = body(&good);
        let at = swapped.len() - good.len();
        swapped.truncate(at);
        swapped.extend_from_slice(&pack_sample(&other, &frame));
        assert_eq!(
            rules.forward(&book, &middle, &swapped),
            Err(Refusal::BadReceipts)
        );
    }

    #[test]
    fn evaluations_and_weights_are_served_only_to_the_plan() {
        let (book, _) = book(&[0]);
        let plan = book.current().unwrap().clone();
        let head = on(&plan, 0)[0].clone();
        let middle = on(&plan, 1)[0].clone();
        let other_middle = on(&plan, 1)[1].clone();
        let tail = on(&plan, 2)[0].clone();
        let stranger = peer(99).to_string();
        assert_eq!(check_eval(&book, &middle, &head), Ok(1));
        assert_eq!(check_eval(&book, &tail, &middle), Ok(2));
        assert_eq!(
            check_eval(&book, &middle, &stranger),
            Err(Refusal::NotPreviousStage)
        );
        assert_eq!(
            check_eval(&book, &tail, &head),
            Err(Refusal::NotPreviousStage)
        );
        assert_eq!(check_eval(&book, &head, &head), Err(Refusal::WrongStage));
        let none = BTreeSet::new();
        assert_eq!(check_weights(&book, &none, &other_middle, 1), Ok(()));
        assert_eq!(
            check_weights(&book, &none, &stranger, 1),
            Err(Refusal::NotAReplica)
        );
        assert_eq!(
            check_weights(&book, &none, &head, 1),
            Err(Refusal::NotAReplica)
        );
        // A validator measures how far a replica moved from the merged weights.
        let validators: BTreeSet<PeerIdStr> = [peer(99)].into();
        assert_eq!(check_weights(&book, &validators, &stranger, 1), Ok(()));
    }
}
