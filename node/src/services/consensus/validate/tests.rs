use super::*;
use crate::services::consensus::plan_book::fixture::{book, key_of, on, peer, run};
use crate::wire::receipt::{self, fixture::chain, HopReceipt};

/// The receipts of `pathway` for `sample` of `plan`'s epoch, each hop signing its own.
fn receipts(plan: &EpochPlan, sample: u64, pathway: &[String]) -> Vec<HopReceipt> {
    let keys: Vec<_> = pathway.iter().map(|p| key_of(p)).collect();
    chain(&sample_of(plan, sample, pathway), &keys, None)
}

fn sample_of<'a>(plan: &EpochPlan, sample: u64, pathway: &'a [String]) -> receipt::Sample<'a> {
    receipt::Sample {
        run: crate::run_spec::run_id(&run()),
        epoch: plan.epoch,
        sample,
        pathway,
    }
}

/// A record of head `head`'s `counter`-th sample through `tail`, with the pathway's receipts.
fn record(plan: &EpochPlan, head: usize, counter: u64, tail: &str) -> LossRecord {
    let heads = on(plan, 0);
    let sample = sample_id(plan.seed, head as u64, counter);
    let pathway = vec![
        heads[head].clone(),
        on(plan, 1)[0].clone(),
        tail.to_string(),
    ];
    LossRecord {
        sample,
        receipts: receipts(plan, sample, &pathway),
        pathway,
        loss: 2.5,
    }
}

fn losses(epoch: u64, records: Vec<LossRecord>) -> PipelineGossip {
    PipelineGossip::Losses {
        epoch,
        tokens_per_sample: u64::from(run().batch_size * run().seq_len),
        records,
    }
}

#[test]
fn held_out_loss_comes_only_from_the_evaluating_head_once() {
    let (book, _) = book(&[0, 1]);
    let plan = book.current().unwrap().clone();
    let mut rules = PipelineRules::new(&run());
    let heads = on(&plan, 0);
    let forged = PipelineGossip::ValLoss {
        epoch: 1,
        loss: 0.1234,
    };
    let stranger = peer(99).to_string();
    assert_eq!(
        rules.check(&book, &stranger, &forged),
        Verdict::Reject(PipelineReason::ValLossNotEvaluator)
    );
    assert_eq!(
        rules.check(&book, &heads[1], &forged),
        Verdict::Reject(PipelineReason::ValLossNotEvaluator),
        "only the first head evaluates"
    );
    assert_eq!(rules.check(&book, &heads[0], &forged), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &heads[0], &forged),
        Verdict::Reject(PipelineReason::ValLossDuplicate)
    );
    let nan = PipelineGossip::ValLoss {
        epoch: 0,
        loss: f32::NAN,
    };
    assert_eq!(
        rules.check(&book, &on(book.recent(0).unwrap(), 0)[0], &nan),
        Verdict::Reject(PipelineReason::ValLossBadValue)
    );
}

#[test]
fn epochs_outside_the_window_are_ignored_and_the_next_waits_for_its_plan() {
    let (book, _) = book(&[4, 5]);
    let mut rules = PipelineRules::new(&run());
    let head = on(book.current().unwrap(), 0)[0].clone();
    for (epoch, expected) in [
        (u64::MAX, Verdict::Ignore(PipelineReason::EpochOutOfWindow)),
        (3, Verdict::Ignore(PipelineReason::EpochOutOfWindow)),
        (7, Verdict::Ignore(PipelineReason::EpochOutOfWindow)),
        (6, Verdict::Ignore(PipelineReason::NoPlanForEpoch)),
        (4, Verdict::Accept),
    ] {
        let message = PipelineGossip::HeadDone {
            epoch,
            samples: 1,
            dropped: 0,
        };
        assert_eq!(
            rules.check(&book, &head, &message),
            expected,
            "epoch {epoch}"
        );
    }
    let empty = PlanBook::default();
    assert_eq!(
        rules.check(
            &empty,
            &head,
            &PipelineGossip::ValLoss {
                epoch: 0,
                loss: 1.0
            }
        ),
        Verdict::Ignore(PipelineReason::NoPlanYet)
    );
}

#[test]
fn loss_records_come_from_tails_for_samples_drawn_once() {
    let (book, _) = book(&[0]);
    let plan = book.current().unwrap().clone();
    let mut rules = PipelineRules::new(&run());
    let tail = on(&plan, 2)[0].clone();
    let head = on(&plan, 0)[0].clone();
    let good = losses(
        0,
        vec![record(&plan, 0, 0, &tail), record(&plan, 1, 3, &tail)],
    );
    assert_eq!(
        rules.check(&book, &head, &good),
        Verdict::Reject(PipelineReason::LossesNotTail)
    );
    assert_eq!(rules.check(&book, &tail, &good), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &tail, &good),
        Verdict::Ignore(PipelineReason::LossesDuplicate),
        "each sample counts once; a message of nothing new is not relayed"
    );
    // Another tail claimed samples first (an `inflate` tail pre-claims samples its heads
    // will draw): the honest tail that really serves them is not punished for it, and its
    // other records still count.
    let other_tail = on(&plan, 2)[1].clone();
    let pre_claimed = losses(0, vec![record(&plan, 1, 1, &other_tail)]);
    assert_eq!(
        rules.check(&book, &other_tail, &pre_claimed),
        Verdict::Accept
    );
    let honest = losses(
        0,
        vec![record(&plan, 1, 1, &tail), record(&plan, 1, 2, &tail)],
    );
    assert_eq!(rules.check(&book, &tail, &honest), Verdict::Accept);
    // A sample no head draws this epoch (counter past epoch_samples).
    let undrawn = losses(0, vec![record(&plan, 0, 4, &tail)]);
    assert_eq!(
        rules.check(&book, &tail, &undrawn),
        Verdict::Reject(PipelineReason::LossesNotDrawn)
    );
    // A sample drawn by the other head than the pathway names.
    let mut swapped = record(&plan, 0, 1, &tail);
    swapped.pathway[0] = on(&plan, 0)[1].clone();
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![swapped])),
        Verdict::Reject(PipelineReason::LossesNotDrawn)
    );
    // A pathway that does not end at the author, or names a stranger.
    let other_tail = on(&plan, 2)[1].clone();
    let mut wrong = record(&plan, 0, 2, &other_tail);
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![wrong.clone()])),
        Verdict::Reject(PipelineReason::LossesBadRecord)
    );
    wrong.pathway[2] = tail.clone();
    wrong.pathway[1] = peer(99).to_string();
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![wrong])),
        Verdict::Reject(PipelineReason::LossesBadRecord)
    );
    let mut nan = record(&plan, 0, 2, &tail);
    nan.loss = f32::INFINITY;
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![nan])),
        Verdict::Reject(PipelineReason::LossesBadRecord)
    );
    // Duplicates inside one message, and forged token counts.
    let twice = losses(
        0,
        vec![record(&plan, 0, 3, &tail), record(&plan, 0, 3, &tail)],
    );
    assert_eq!(rules.check(&book, &tail, &twice), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &tail, &twice),
        Verdict::Ignore(PipelineReason::LossesDuplicate)
    );
    let tokens = PipelineGossip::Losses {
        epoch: 0,
        tokens_per_sample: u64::MAX,
        records: vec![record(&plan, 0, 2, &tail)],
    };
    assert_eq!(
        rules.check(&book, &tail, &tokens),
        Verdict::Reject(PipelineReason::LossesBadTokens)
    );
    // The refused messages consumed nothing: sample 2 of head 0 is still fresh.
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![record(&plan, 0, 2, &tail)])),
        Verdict::Accept
    );
}

#[test]
fn loss_records_without_a_whole_chain_of_receipts_are_refused() {
    let (book, _) = book(&[0]);
    let plan = book.current().unwrap().clone();
    let mut rules = PipelineRules::new(&run());
    let tail = on(&plan, 2)[0].clone();
    let mut bare = record(&plan, 0, 0, &tail);
    bare.receipts.clear();
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![bare])),
        Verdict::Reject(PipelineReason::LossesNoReceipts)
    );
    let mut cut = record(&plan, 0, 0, &tail);
    cut.receipts.pop();
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![cut])),
        Verdict::Reject(PipelineReason::LossesNoReceipts)
    );
    // One bad record refuses the message whole, honest records with it.
    let mut bare = record(&plan, 0, 1, &tail);
    bare.receipts.clear();
    let mixed = losses(0, vec![record(&plan, 0, 0, &tail), bare]);
    assert_eq!(
        rules.check(&book, &tail, &mixed),
        Verdict::Reject(PipelineReason::LossesNoReceipts)
    );
}

#[test]
fn loss_records_with_forged_foreign_or_broken_chains_are_refused() {
    let (book, _) = book(&[0]);
    let plan = book.current().unwrap().clone();
    let mut rules = PipelineRules::new(&run());
    let tail = on(&plan, 2)[0].clone();
    let other_tail = on(&plan, 2)[1].clone();
    // The best a tail can forge: every receipt of the chain signed with its own key.
    let mut forged = record(&plan, 0, 0, &tail);
    let own: Vec<_> = forged.pathway.iter().map(|_| key_of(&tail)).collect();
    forged.receipts = chain(
        &sample_of(&plan, forged.sample, &forged.pathway),
        &own,
        None,
    );
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![forged])),
        Verdict::Reject(PipelineReason::LossesBadReceipt)
    );
    // Another tail's chain, with its own receipt in place of the real tail's: the middle
    // hop named the real tail.
    let real = record(&plan, 0, 1, &tail);
    let mut stolen = real.clone();
    stolen.pathway[2] = other_tail.clone();
    stolen.receipts[2] = receipts(&plan, real.sample, &stolen.pathway)[2].clone();
    assert_eq!(
        rules.check(&book, &other_tail, &losses(0, vec![stolen])),
        Verdict::Reject(PipelineReason::LossesBadReceipt)
    );
    // A chain of another sample, or of a pathway through another middle replica.
    let mut foreign = record(&plan, 0, 2, &tail);
    foreign.receipts = record(&plan, 0, 3, &tail).receipts;
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![foreign])),
        Verdict::Reject(PipelineReason::LossesBadReceipt)
    );
    let mut detour = record(&plan, 0, 2, &tail);
    let mut other_path = detour.pathway.clone();
    other_path[1] = on(&plan, 1)[1].clone();
    detour.receipts = receipts(&plan, detour.sample, &other_path);
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![detour])),
        Verdict::Reject(PipelineReason::LossesBadReceipt)
    );
    // A link that does not follow from the hop before.
    let mut broken = record(&plan, 0, 2, &tail);
    broken.receipts[2].received = broken.receipts[0].sent;
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![broken])),
        Verdict::Reject(PipelineReason::LossesBrokenChain)
    );
    // None of it claimed anything: the tails that served the samples are heard.
    let honest = losses(
        0,
        vec![
            record(&plan, 0, 0, &tail),
            record(&plan, 0, 2, &tail),
            record(&plan, 0, 3, &tail),
        ],
    );
    assert_eq!(rules.check(&book, &tail, &honest), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![real])),
        Verdict::Accept
    );
}

#[test]
fn refusals_for_receipts_are_the_ones_held_against_the_sender_as_forged_credit() {
    for reason in [
        PipelineReason::LossesNoReceipts,
        PipelineReason::LossesBadReceipt,
        PipelineReason::LossesBrokenChain,
    ] {
        assert!(reason.forges_credit(), "{}", reason.label());
    }
    for reason in [
        PipelineReason::LossesNotTail,
        PipelineReason::LossesDuplicate,
        PipelineReason::LossesNotDrawn,
        PipelineReason::LossesBadRecord,
    ] {
        assert!(!reason.forges_credit(), "{}", reason.label());
    }
}

#[test]
fn head_done_comes_from_heads_once_with_counts_within_the_plan() {
    let (book, _) = book(&[0]);
    let plan = book.current().unwrap().clone();
    let mut rules = PipelineRules::new(&run());
    let head = on(&plan, 0)[1].clone();
    let tail = on(&plan, 2)[0].clone();
    let done = |samples, dropped| PipelineGossip::HeadDone {
        epoch: 0,
        samples,
        dropped,
    };
    assert_eq!(
        rules.check(&book, &tail, &done(4, 0)),
        Verdict::Reject(PipelineReason::HeadDoneNotHead)
    );
    assert_eq!(
        rules.check(&book, &head, &done(1, u64::MAX)),
        Verdict::Reject(PipelineReason::HeadDoneBadCounts)
    );
    assert_eq!(
        rules.check(&book, &head, &done(3, 2)),
        Verdict::Reject(PipelineReason::HeadDoneBadCounts)
    );
    assert_eq!(rules.check(&book, &head, &done(3, 1)), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &head, &done(3, 1)),
        Verdict::Reject(PipelineReason::HeadDoneDuplicate)
    );
}

#[test]
fn merged_hashes_come_from_members_of_that_stage() {
    let (book, _) = book(&[0, 1]);
    let closed = book.recent(0).unwrap().clone();
    let mut rules = PipelineRules::new(&run());
    let merged = |stage| PipelineGossip::Merged {
        epoch: 0,
        stage,
        hash: "00".repeat(32),
        wire_bytes: 0,
    };
    let member = on(&closed, 1)[0].clone();
    assert_eq!(
        rules.check(&book, &member, &merged(0)),
        Verdict::Reject(PipelineReason::MergedNotMember)
    );
    assert_eq!(
        rules.check(&book, peer(99).as_ref(), &merged(1)),
        Verdict::Reject(PipelineReason::MergedNotMember)
    );
    assert_eq!(rules.check(&book, &member, &merged(1)), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &member, &merged(1)),
        Verdict::Reject(PipelineReason::MergedDuplicate)
    );
}

#[test]
fn a_node_without_the_previous_plan_takes_its_merge_hashes_from_the_stage_in_force() {
    // A node that joined at epoch 5 holds only plan 5; the merges closing epoch 4 end
    // after it joined, and it needs their hashes to load a stage.
    let (full, _) = book(&[4, 5]);
    let mut book = PlanBook::default();
    book.insert(full.get(5).unwrap().clone());
    let current = book.current().unwrap().clone();
    let mut rules = PipelineRules::new(&run());
    let merged = |epoch, stage| PipelineGossip::Merged {
        epoch,
        stage,
        hash: "00".repeat(32),
        wire_bytes: 0,
    };
    let member = on(&current, 1)[0].clone();
    assert_eq!(rules.check(&book, &member, &merged(4, 1)), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &member, &merged(4, 1)),
        Verdict::Reject(PipelineReason::MergedDuplicate)
    );
    // Not a member of that stage now, or a stranger: refused.
    assert_eq!(
        rules.check(&book, &on(&current, 2)[0], &merged(4, 1)),
        Verdict::Reject(PipelineReason::MergedNotMember)
    );
    assert_eq!(
        rules.check(&book, peer(99).as_ref(), &merged(4, 1)),
        Verdict::Reject(PipelineReason::MergedNotMember)
    );
    // A node that restarted with an old plan keeps merge hashes of later epochs until
    // their plans arrive.
    let (old, _) = self::book(&[2]);
    assert_eq!(
        PipelineRules::new(&run()).check(&old, &member, &merged(4, 1)),
        Verdict::Ignore(PipelineReason::NoPlanForEpoch)
    );
    // Older epochs stay out of the window; other messages of epoch 4 too.
    assert_eq!(
        rules.check(&book, &member, &merged(3, 1)),
        Verdict::Ignore(PipelineReason::EpochOutOfWindow)
    );
    let done = PipelineGossip::HeadDone {
        epoch: 4,
        samples: 1,
        dropped: 0,
    };
    assert_eq!(
        rules.check(&book, &on(&current, 0)[0], &done),
        Verdict::Ignore(PipelineReason::EpochOutOfWindow)
    );
}

#[test]
fn weights_come_from_permitted_validators_once_an_epoch_and_well_formed() {
    let book_at = book;
    let (book, _) = book_at(&[0, 1]);
    let mut rules = PipelineRules::new(&run());
    let validator = peer(150).to_string();
    rules.set_validators(
        [PeerIdStr::parse(&validator).unwrap()]
            .into_iter()
            .collect(),
    );
    let weights = |epoch, weights: Vec<(u16, u16)>| PipelineGossip::Weights { epoch, weights };
    assert_eq!(
        rules.check(&book, peer(151).as_ref(), &weights(0, vec![(1, 65535)])),
        Verdict::Reject(PipelineReason::WeightsNotValidator)
    );
    assert_eq!(
        rules.check(&book, &validator, &weights(0, vec![(1, 65535), (1, 3)])),
        Verdict::Reject(PipelineReason::WeightsDuplicateUid)
    );
    let too_many: Vec<(u16, u16)> = (0..=bootstrap::MAX_PLAN_MINERS as u16)
        .map(|u| (u, 1))
        .collect();
    assert_eq!(
        rules.check(&book, &validator, &weights(0, too_many)),
        Verdict::Reject(PipelineReason::WeightsTooMany)
    );
    assert_eq!(
        rules.check(&book, &validator, &weights(0, vec![(1, 65535)])),
        Verdict::Accept
    );
    assert_eq!(
        rules.check(&book, &validator, &weights(0, vec![(2, 65535)])),
        Verdict::Reject(PipelineReason::WeightsDuplicate)
    );
    // The current epoch is still open: its weights wait for its plan's successor (an honest
    // validator that heard the next plan first scored it; nobody can have scored it yet
    // otherwise), never accepted before it closes. A future one is out of the window.
    assert_eq!(
        rules.check(&book, &validator, &weights(1, vec![(2, 65535)])),
        Verdict::Ignore(PipelineReason::NoPlanForEpoch)
    );
    assert!(waits_for_plan(&rules.check(
        &book,
        &validator,
        &weights(1, vec![(2, 65535)])
    )));
    assert_eq!(
        rules.check(&book, &validator, &weights(7, vec![(2, 65535)])),
        Verdict::Ignore(PipelineReason::EpochOutOfWindow)
    );
    // Epochs move on faster than a validator scores: weights of an epoch several plans
    // back are still taken, once; beyond the window they are not.
    let (later, _) = book_at(&[5, 6]);
    assert_eq!(
        rules.check(&later, &validator, &weights(1, vec![(2, 65535)])),
        Verdict::Accept,
        "epoch 1 closed: its weights are taken now"
    );
    assert_eq!(
        rules.check(&later, &validator, &weights(1, vec![(2, 65535)])),
        Verdict::Reject(PipelineReason::WeightsDuplicate)
    );
    assert_eq!(
        rules.check(&later, &validator, &weights(6, vec![(2, 65535)])),
        Verdict::Ignore(PipelineReason::NoPlanForEpoch),
        "epoch 6 is open"
    );
    assert_eq!(
        rules.check(&later, &validator, &weights(3, vec![(2, 65535)])),
        Verdict::Accept
    );
    let (much_later, _) = book_at(&[20, 21]);
    assert_eq!(
        rules.check(&much_later, &validator, &weights(4, vec![(2, 65535)])),
        Verdict::Ignore(PipelineReason::EpochOutOfWindow)
    );
}

#[test]
fn replayed_or_stale_heartbeats_are_refused_and_restarts_are_heard() {
    let mut gate = HeartbeatGate::default();
    let now = 1_000_000;
    assert_eq!(gate.check("a", now, 1, now), Ok(()));
    assert_eq!(gate.check("a", now + 1000, 2, now + 1000), Ok(()));
    // The same heartbeat again, or an older one, within the skew window.
    assert_eq!(
        gate.check("a", now + 1000, 2, now + 1500),
        Err(Freshness::Replayed)
    );
    assert_eq!(
        gate.check("a", now, 1, now + 1500),
        Err(Freshness::Replayed)
    );
    // A recorded heartbeat replayed after the sender died: too old.
    let later = now + MAX_HEARTBEAT_SKEW_MS + 2000;
    assert_eq!(gate.check("a", now + 1000, 2, later), Err(Freshness::Stale));
    // From the future.
    assert_eq!(
        gate.check("b", later + MAX_HEARTBEAT_SKEW_MS + 1, 1, later),
        Err(Freshness::Stale)
    );
    // A restart: counter back at 1, later send time.
    assert_eq!(gate.check("a", later, 1, later), Ok(()));
    gate.prune(later + 3 * MAX_HEARTBEAT_SKEW_MS);
    assert_eq!(gate.len(), 0, "silent senders are forgotten");
}

#[test]
fn only_the_elected_orchestrator_may_publish_a_plan_and_permitted_validators_wait() {
    let not_orchestrator = PlanOutcome::Rejected(PlanRejected::NotOrchestrator);
    // A permitted validator that is not (yet) the orchestrator here: kept for the election.
    let waiting = plan_verdict(not_orchestrator, true);
    assert_eq!(waiting, Verdict::Ignore(PlanRejected::NotOrchestrator));
    assert!(waits_for_election(&waiting));
    // Anybody else: a forgery.
    let forged = plan_verdict(not_orchestrator, false);
    assert_eq!(forged, Verdict::Reject(PlanRejected::NotOrchestrator));
    assert!(!waits_for_election(&forged));
    // …or the orchestrator's, before this node, just started, heard its author: kept apart.
    assert!(waits_for_metagraph(&forged));
    assert!(!waits_for_metagraph(&waiting));
    assert!(waits_for_metagraph(&plan_verdict(
        PlanOutcome::Rejected(PlanRejected::NoMetagraph),
        false
    )));
    assert!(waits_for_metagraph(&plan_verdict(
        PlanOutcome::Rejected(PlanRejected::UnregisteredMiners),
        true
    )));
    assert!(!waits_for_metagraph(&plan_verdict(
        PlanOutcome::Rejected(PlanRejected::StaleEpoch),
        false
    )));
    // A replaced orchestrator's plan, or one judged without a metagraph: not malice.
    for reason in [PlanRejected::StaleEpoch, PlanRejected::NoMetagraph] {
        assert_eq!(
            plan_verdict(PlanOutcome::Rejected(reason), false),
            Verdict::Ignore(reason)
        );
    }
    for reason in [
        PlanRejected::Malformed,
        PlanRejected::MismatchesRun,
        PlanRejected::MergeStart,
        PlanRejected::UnregisteredMiners,
        PlanRejected::Election("plan_epoch_jump"),
    ] {
        assert_eq!(
            plan_verdict(PlanOutcome::Rejected(reason), true),
            Verdict::Reject(reason)
        );
    }
    assert_eq!(plan_verdict(PlanOutcome::Accepted, false), Verdict::Accept);
    // The election's own stale epoch reads as this node's.
    let stale = bootstrap::PlanRejected::StaleEpoch {
        epoch: 3,
        last_accepted: 4,
    };
    assert_eq!(PlanRejected::from(&stale), PlanRejected::StaleEpoch);
    assert_eq!(PlanRejected::StaleEpoch.label(), "stale_epoch");
}
