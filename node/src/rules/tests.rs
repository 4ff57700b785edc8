use super::*;
use std::collections::BTreeSet;

fn peer(i: u8) -> PeerIdStr {
    PeerIdStr::from_ed25519_public_key(&[i; 32])
}

fn run() -> RunConfig {
    RunConfig {
        epoch_samples: 4,
        ..RunConfig::default()
    }
}

/// Six miners on 3 stages, orchestrated by peer 1; plans of `epochs`.
fn book(epochs: &[u64]) -> (PlanBook, Vec<PeerIdStr>) {
    let run = run();
    let miners: BTreeSet<PeerIdStr> = (10..16).map(peer).collect();
    let mut book = PlanBook::default();
    let mut prev: Option<EpochPlan> = None;
    for &e in epochs {
        let plan =
            bootstrap::next_plan(&run, &peer(1), prev.as_ref(), e.checked_sub(1), &miners).unwrap();
        assert_eq!(plan.epoch, e);
        book.insert(plan.clone());
        prev = Some(plan);
    }
    (book, miners.into_iter().collect())
}

fn on(plan: &EpochPlan, stage: u32) -> Vec<String> {
    plan.miners_of(stage).map(|p| p.to_string()).collect()
}

fn record(plan: &EpochPlan, head: usize, counter: u64, tail: &str) -> LossRecord {
    let heads = on(plan, 0);
    LossRecord {
        sample: sample_id(plan.seed, head as u64, counter),
        pathway: vec![
            heads[head].clone(),
            on(plan, 1)[0].clone(),
            tail.to_string(),
        ],
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
        Verdict::Reject("val_loss_not_evaluator")
    );
    assert_eq!(
        rules.check(&book, &heads[1], &forged),
        Verdict::Reject("val_loss_not_evaluator"),
        "only the first head evaluates"
    );
    assert_eq!(rules.check(&book, &heads[0], &forged), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &heads[0], &forged),
        Verdict::Reject("val_loss_duplicate")
    );
    let nan = PipelineGossip::ValLoss {
        epoch: 0,
        loss: f32::NAN,
    };
    assert_eq!(
        rules.check(&book, &on(book.recent(0).unwrap(), 0)[0], &nan),
        Verdict::Reject("val_loss_bad_value")
    );
}

#[test]
fn epochs_outside_the_window_are_ignored_and_the_next_waits_for_its_plan() {
    let (book, _) = book(&[4, 5]);
    let mut rules = PipelineRules::new(&run());
    let head = on(book.current().unwrap(), 0)[0].clone();
    for (epoch, expected) in [
        (u64::MAX, Verdict::Ignore("epoch_out_of_window")),
        (3, Verdict::Ignore("epoch_out_of_window")),
        (7, Verdict::Ignore("epoch_out_of_window")),
        (6, Verdict::Ignore("no_plan_for_epoch")),
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
        Verdict::Ignore("no_plan_yet")
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
        Verdict::Reject("losses_not_tail")
    );
    assert_eq!(rules.check(&book, &tail, &good), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &tail, &good),
        Verdict::Ignore("losses_duplicate"),
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
        Verdict::Reject("losses_not_drawn")
    );
    // A sample drawn by the other head than the pathway names.
    let mut swapped = record(&plan, 0, 1, &tail);
    swapped.pathway[0] = on(&plan, 0)[1].clone();
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![swapped])),
        Verdict::Reject("losses_not_drawn")
    );
    // A pathway that does not end at the author, or names a stranger.
    let other_tail = on(&plan, 2)[1].clone();
    let mut wrong = record(&plan, 0, 2, &other_tail);
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![wrong.clone()])),
        Verdict::Reject("losses_bad_record")
    );
    wrong.pathway[2] = tail.clone();
    wrong.pathway[1] = peer(99).to_string();
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![wrong])),
        Verdict::Reject("losses_bad_record")
    );
    let mut nan = record(&plan, 0, 2, &tail);
    nan.loss = f32::INFINITY;
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![nan])),
        Verdict::Reject("losses_bad_record")
    );
    // Duplicates inside one message, and forged token counts.
    let twice = losses(
        0,
        vec![record(&plan, 0, 3, &tail), record(&plan, 0, 3, &tail)],
    );
    assert_eq!(rules.check(&book, &tail, &twice), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &tail, &twice),
        Verdict::Ignore("losses_duplicate")
    );
    let tokens = PipelineGossip::Losses {
        epoch: 0,
        tokens_per_sample: u64::MAX,
        records: vec![record(&plan, 0, 2, &tail)],
    };
    assert_eq!(
        rules.check(&book, &tail, &tokens),
        Verdict::Reject("losses_bad_tokens")
    );
    // The refused messages consumed nothing: sample 2 of head 0 is still fresh.
    assert_eq!(
        rules.check(&book, &tail, &losses(0, vec![record(&plan, 0, 2, &tail)])),
        Verdict::Accept
    );
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
        Verdict::Reject("head_done_not_head")
    );
    assert_eq!(
        rules.check(&book, &head, &done(1, u64::MAX)),
        Verdict::Reject("head_done_bad_counts")
    );
    assert_eq!(
        rules.check(&book, &head, &done(3, 2)),
        Verdict::Reject("head_done_bad_counts")
    );
    assert_eq!(rules.check(&book, &head, &done(3, 1)), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &head, &done(3, 1)),
        Verdict::Reject("head_done_duplicate")
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
        Verdict::Reject("merged_not_member")
    );
    assert_eq!(
        rules.check(&book, peer(99).as_ref(), &merged(1)),
        Verdict::Reject("merged_not_member")
    );
    assert_eq!(rules.check(&book, &member, &merged(1)), Verdict::Accept);
    assert_eq!(
        rules.check(&book, &member, &merged(1)),
        Verdict::Reject("merged_duplicate")
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
        Verdict::Reject("merged_duplicate")
    );
    // Not a member of that stage now, or a stranger: refused.
    assert_eq!(
        rules.check(&book, &on(&current, 2)[0], &merged(4, 1)),
        Verdict::Reject("merged_not_member")
    );
    assert_eq!(
        rules.check(&book, peer(99).as_ref(), &merged(4, 1)),
        Verdict::Reject("merged_not_member")
    );
    // A node that restarted with an old plan keeps merge hashes of later epochs until
    // their plans arrive.
    let (old, _) = self::book(&[2]);
    assert_eq!(
        PipelineRules::new(&run()).check(&old, &member, &merged(4, 1)),
        Verdict::Ignore("no_plan_for_epoch")
    );
    // Older epochs stay out of the window; other messages of epoch 4 too.
    assert_eq!(
        rules.check(&book, &member, &merged(3, 1)),
        Verdict::Ignore("epoch_out_of_window")
    );
    let done = PipelineGossip::HeadDone {
        epoch: 4,
        samples: 1,
        dropped: 0,
    };
    assert_eq!(
        rules.check(&book, &on(&current, 0)[0], &done),
        Verdict::Ignore("epoch_out_of_window")
    );
}

#[test]
fn weights_come_from_permitted_validators_once_an_epoch_and_well_formed() {
    let book_at = book;
    let (book, _) = book_at(&[0, 1]);
    let mut rules = PipelineRules::new(&run());
    let validator = peer(150).to_string();
    rules.set_validators([validator.clone()].into_iter().collect());
    let weights = |epoch, weights: Vec<(u16, u16)>| PipelineGossip::Weights { epoch, weights };
    assert_eq!(
        rules.check(&book, peer(151).as_ref(), &weights(0, vec![(1, 65535)])),
        Verdict::Reject("weights_not_validator")
    );
    assert_eq!(
        rules.check(&book, &validator, &weights(0, vec![(1, 65535), (1, 3)])),
        Verdict::Reject("weights_duplicate_uid")
    );
    let too_many: Vec<(u16, u16)> = (0..=bootstrap::MAX_PLAN_MINERS as u16)
        .map(|u| (u, 1))
        .collect();
    assert_eq!(
        rules.check(&book, &validator, &weights(0, too_many)),
        Verdict::Reject("weights_too_many")
    );
    assert_eq!(
        rules.check(&book, &validator, &weights(0, vec![(1, 65535)])),
        Verdict::Accept
    );
    assert_eq!(
        rules.check(&book, &validator, &weights(0, vec![(2, 65535)])),
        Verdict::Reject("weights_duplicate")
    );
    // The current epoch is another epoch; a future one is out of the window.
    assert_eq!(
        rules.check(&book, &validator, &weights(1, vec![(2, 65535)])),
        Verdict::Accept
    );
    assert_eq!(
        rules.check(&book, &validator, &weights(7, vec![(2, 65535)])),
        Verdict::Ignore("epoch_out_of_window")
    );
    // Epochs move on faster than a validator scores: weights of an epoch several plans
    // back are still taken, once; beyond the window they are not.
    let (later, _) = book_at(&[5, 6]);
    assert_eq!(
        rules.check(&later, &validator, &weights(1, vec![(2, 65535)])),
        Verdict::Reject("weights_duplicate")
    );
    assert_eq!(
        rules.check(&later, &validator, &weights(3, vec![(2, 65535)])),
        Verdict::Accept
    );
    let (much_later, _) = book_at(&[20, 21]);
    assert_eq!(
        rules.check(&much_later, &validator, &weights(4, vec![(2, 65535)])),
        Verdict::Ignore("epoch_out_of_window")
    );
}

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
    assert_eq!(check_weights(&book, &other_middle, 1), Ok(()));
    assert_eq!(
        check_weights(&book, &stranger, 1),
        Err(Refusal::NotAReplica)
    );
    assert_eq!(check_weights(&book, &head, 1), Err(Refusal::NotAReplica));
}

#[test]
fn spot_checks_are_answered_only_to_permitted_validators() {
    let (book, _) = book(&[3]);
    let plan = book.get(3).unwrap();
    let validator = peer(200).to_string();
    let validators: BTreeSet<String> = [validator.clone()].into();
    assert_eq!(check_spot_check(&validators, &validator), Ok(()));
    // Neither a miner of the plan nor a stranger may ask for a miner's evidence.
    let miner = on(plan, 1)[0].clone();
    assert_eq!(
        check_spot_check(&validators, &miner),
        Err(Refusal::NotValidator)
    );
    assert_eq!(
        check_spot_check(&validators, peer(201).as_str()),
        Err(Refusal::NotValidator)
    );
    assert_eq!(
        check_spot_check(&BTreeSet::new(), &validator),
        Err(Refusal::NotValidator)
    );
}

fn frame(run_id: u64, sample: u64, stage: u32, kind: FrameKind, shape: &[usize]) -> Vec<u8> {
    let meta = wire::FrameMeta {
        run: run_id,
        sample,
        stage,
        kind,
    };
    let n: usize = shape.iter().product();
    let codec = wire::Codec::new(training::WireDtype::Bf16);
    wire::encode(&codec, &meta, shape, &vec![0.0; n]).unwrap()
}

#[test]
fn frames_must_have_the_runs_exact_shape_before_anything_is_decoded() {
    let run = run();
    let rules = FrameRules::new(&run, 7).unwrap();
    let (b, s, w) = (
        run.batch_size as usize,
        run.seq_len as usize,
        run.bottleneck as usize,
    );
    let expect = Expect {
        sample: Some(5),
        boundary: 0,
        kind: FrameKind::Activation,
    };
    assert_eq!(
        rules.check(&frame(7, 5, 0, FrameKind::Activation, &[b, s, w]), expect),
        Ok(())
    );
    // A huge batch of zeros: a few KiB on the wire, refused on its header.
    let huge = frame(7, 5, 0, FrameKind::Activation, &[1024, s, w]);
    assert!(huge.len() < 64 * 1024, "{} bytes", huge.len());
    assert_eq!(rules.check(&huge, expect), Err(Refusal::FrameShape));
    for bad in [
        frame(7, 5, 0, FrameKind::Activation, &[b, s, w + 1]),
        frame(7, 5, 0, FrameKind::Activation, &[b * s, w]),
    ] {
        assert_eq!(rules.check(&bad, expect), Err(Refusal::FrameShape));
    }
    for mismatched in [
        frame(8, 5, 0, FrameKind::Activation, &[b, s, w]),
        frame(7, 6, 0, FrameKind::Activation, &[b, s, w]),
        frame(7, 5, 1, FrameKind::Activation, &[b, s, w]),
        frame(7, 5, 0, FrameKind::Gradient, &[b, s, w]),
    ] {
        assert_eq!(
            rules.check(&mismatched, expect),
            Err(Refusal::FrameMismatch)
        );
    }
    assert_eq!(
        rules.check(b"not a frame", expect),
        Err(Refusal::FrameMalformed)
    );
    let gradient = Expect {
        sample: Some(5),
        boundary: 1,
        kind: FrameKind::Gradient,
    };
    assert_eq!(
        rules.check(&frame(7, 5, 2, FrameKind::Gradient, &[b, s, w]), gradient),
        Ok(())
    );
}

#[test]
fn request_budget_bounds_each_peer_and_gives_slots_back() {
    let budget = RequestBudget::default();
    let slots: Vec<BudgetSlot> = (0..MAX_REQUESTS_PER_PEER)
        .map(|_| budget.acquire("a").unwrap())
        .collect();
    assert_eq!(budget.acquire("a").unwrap_err(), Refusal::TooManyRequests);
    assert!(budget.acquire("b").is_ok(), "another peer is not starved");
    drop(slots);
    assert!(budget.acquire("a").is_ok());
    let many: Vec<BudgetSlot> = (0..MAX_REQUESTS_TOTAL)
        .map(|i| budget.acquire(&format!("p{i}")).unwrap())
        .collect();
    assert_eq!(
        budget.acquire("fresh").unwrap_err(),
        Refusal::TooManyRequests
    );
    drop(many);
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
        Err("replayed_heartbeat")
    );
    assert_eq!(
        gate.check("a", now, 1, now + 1500),
        Err("replayed_heartbeat")
    );
    // A recorded heartbeat replayed after the sender died: too old.
    let later = now + MAX_HEARTBEAT_SKEW_MS + 2000;
    assert_eq!(
        gate.check("a", now + 1000, 2, later),
        Err("stale_heartbeat")
    );
    // From the future.
    assert_eq!(
        gate.check("b", later + MAX_HEARTBEAT_SKEW_MS + 1, 1, later),
        Err("stale_heartbeat")
    );
    // A restart: counter back at 1, later send time.
    assert_eq!(gate.check("a", later, 1, later), Ok(()));
    gate.prune(later + 3 * MAX_HEARTBEAT_SKEW_MS);
    assert_eq!(gate.len(), 0, "silent senders are forgotten");
}

#[test]
fn butterfly_gossip_comes_from_that_merges_members_or_validators() {
    let (book, peers) = book(&[4]);
    let plan = book.get(4).unwrap();
    let members: BTreeSet<PeerIdStr> = plan.miners_of(1).cloned().collect();
    let outsider = peer(200);
    let validator = peer(201);
    let readers = Readers {
        members: [((4, 1), members.clone())].into_iter().collect(),
        validators: [validator.clone()].into_iter().collect(),
    };
    let member = members.iter().next().unwrap();
    assert_eq!(
        check_butterfly_author(&readers, member, 4, 1),
        Verdict::Accept
    );
    assert_eq!(
        check_butterfly_author(&readers, &validator, 4, 1),
        Verdict::Accept
    );
    assert_eq!(
        check_butterfly_author(&readers, &outsider, 4, 1),
        Verdict::Reject("butterfly_not_member")
    );
    // A member of stage 1 is not a member of stage 0's merge.
    let on_stage0: BTreeSet<PeerIdStr> = plan.miners_of(0).cloned().collect();
    let readers0 = Readers {
        members: [((4, 0), on_stage0)].into_iter().collect(),
        ..Readers::default()
    };
    assert_eq!(
        check_butterfly_author(&readers0, member, 4, 0),
        Verdict::Reject("butterfly_not_member")
    );
    // No plan for that merge: not judged, not delivered.
    assert_eq!(
        check_butterfly_author(&readers, member, 9, 1),
        Verdict::Ignore("butterfly_unknown_merge")
    );
    assert!(peers.len() > 2);
}
