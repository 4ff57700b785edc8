//! Table tests of the ledger and the pure inclusion and dispute rules.

use std::collections::BTreeSet;

use super::*;
use crate::butterfly::plan;

const EPOCH: u64 = 4;
const STAGE: u32 = 1;

fn setup(n: usize, partitions: usize) -> (Arc<Plan>, Ledger) {
    let members: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let plan = Arc::new(plan(11, &members, partitions, partitions * 4).unwrap());
    let ledger = Ledger::new(EPOCH, STAGE, Arc::clone(&plan), "me".into());
    (plan, ledger)
}

fn commitment(plan: &Plan, member: usize, salt: u8) -> Gossip {
    Gossip::Commitment(Commitment {
        epoch: EPOCH,
        stage: STAGE,
        member: plan.member(member).into(),
        samples: 10,
        partition_hashes: (0..plan.partitions())
            .map(|p| Hash([member as u8 * 16 + p as u8 + salt; 32]))
            .collect(),
    })
}

fn claim(
    plan: &Plan,
    p: usize,
    slot: usize,
    round: u32,
    included: &[usize],
    result: u8,
) -> SliceHash {
    SliceHash {
        epoch: EPOCH,
        stage: STAGE,
        partition: p as u32,
        round,
        holder: plan.member(plan.holders(p)[slot]).into(),
        included: included
            .iter()
            .map(|&m| plan.member(m).to_string())
            .collect(),
        input_hashes: included
            .iter()
            .map(|&m| Hash([m as u8 * 16 + p as u8; 32]))
            .collect(),
        result: Hash([result; 32]),
    }
}

fn observe_claim(ledger: &mut Ledger, s: SliceHash) -> Observed {
    let from = s.holder.clone();
    ledger.observe(&from, Gossip::SliceHash(s), false)
}

fn set(v: &[usize]) -> BTreeSet<usize> {
    v.iter().copied().collect()
}

#[test]
fn commitments_are_kept_first_come_and_conflicts_reported_once() {
    let (plan, mut ledger) = setup(4, 4);
    assert_eq!(
        ledger.observe("m0", commitment(&plan, 0, 0), true),
        Observed::Commitment(0)
    );
    assert_eq!(
        ledger.observe("m0", commitment(&plan, 0, 0), true),
        Observed::Nothing
    );
    assert_eq!(
        ledger.observe("m1", commitment(&plan, 1, 0), false),
        Observed::Commitment(1)
    );
    assert_eq!(
        ledger.on_time(),
        set(&[0]),
        "a late commitment does not count"
    );
    assert!(
        ledger.commitment(1).is_some(),
        "but it is kept for checking claims"
    );
    match ledger.observe("m0", commitment(&plan, 0, 1), true) {
        Observed::Conflict(report) => {
            assert_eq!(report.accused, "m0");
            assert_eq!(report.kind, MisbehaviourKind::Equivocation);
            assert!(matches!(
                report.evidence,
                Evidence::ConflictingCommitments { .. }
            ));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        ledger.observe("m0", commitment(&plan, 0, 2), true),
        Observed::Nothing
    );
    assert!(ledger.on_time().is_empty());
    assert!(ledger.commitment(0).is_none());
    assert!(!ledger.all_committed());
}

#[test]
fn messages_that_do_not_fit_change_nothing() {
    let (plan, mut ledger) = setup(4, 4);
    let mut other_epoch = commitment(&plan, 0, 0);
    if let Gossip::Commitment(c) = &mut other_epoch {
        c.epoch += 1;
    }
    assert_eq!(ledger.observe("m0", other_epoch, true), Observed::Nothing);
    assert!(matches!(
        ledger.observe("m1", commitment(&plan, 0, 0), true),
        Observed::Invalid(_)
    ));
    let mut stranger = commitment(&plan, 0, 0);
    if let Gossip::Commitment(c) = &mut stranger {
        c.member = "x".into();
    }
    assert!(matches!(
        ledger.observe("x", stranger, true),
        Observed::Invalid(_)
    ));
    let mut short = commitment(&plan, 0, 0);
    if let Gossip::Commitment(c) = &mut short {
        c.partition_hashes.pop();
    }
    assert!(matches!(
        ledger.observe("m0", short, true),
        Observed::Invalid(_)
    ));
    let non_holder = (0..4).find(|m| !plan.is_holder(0, *m)).unwrap();
    let mut s = claim(&plan, 0, 0, 0, &[0, 1], 1);
    s.holder = plan.member(non_holder).into();
    assert!(matches!(
        observe_claim(&mut ledger, s),
        Observed::Invalid(_)
    ));
    let unsorted = claim(&plan, 0, 0, 0, &[1, 0], 1);
    assert!(matches!(
        observe_claim(&mut ledger, unsorted),
        Observed::Invalid(_)
    ));
    let mut out_of_range = claim(&plan, 0, 0, 0, &[0], 1);
    out_of_range.partition = 9;
    assert!(matches!(
        observe_claim(&mut ledger, out_of_range),
        Observed::Invalid(_)
    ));
    assert_eq!(ledger.claims(0).count(), 0);
    assert!(ledger.on_time().is_empty());
}

#[test]
fn claims_advance_by_round_and_same_round_conflicts_are_reported() {
    let (plan, mut ledger) = setup(4, 4);
    assert_eq!(
        observe_claim(&mut ledger, claim(&plan, 0, 0, 1, &[0, 1, 2], 5)),
        Observed::Slice(0)
    );
    assert_eq!(
        observe_claim(&mut ledger, claim(&plan, 0, 0, 0, &[0, 1, 2, 3], 4)),
        Observed::Nothing
    );
    assert_eq!(ledger.claims(0).next().unwrap().round, 1);
    match observe_claim(&mut ledger, claim(&plan, 0, 0, 1, &[0, 1], 6)) {
        Observed::Conflict(report) => {
            assert_eq!(report.accused, plan.member(plan.holders(0)[0]));
            assert!(matches!(
                report.evidence,
                Evidence::ConflictingSlices { round: 1, .. }
            ));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        observe_claim(&mut ledger, claim(&plan, 0, 0, 2, &[0, 1], 6)),
        Observed::Slice(0)
    );
    assert_eq!(ledger.claims(0).next().unwrap().result, Hash([6; 32]));
}

#[test]
fn a_partition_settles_when_every_on_time_holder_agrees() {
    let (plan, mut ledger) = setup(4, 4);
    let [a, b] = plan.holders(0);
    // Nobody committed: nothing is expected.
    assert!(ledger.settled(0));
    ledger.observe(plan.member(a), commitment(&plan, a, 0), true);
    ledger.observe(plan.member(b), commitment(&plan, b, 0), true);
    assert!(!ledger.settled(0));
    observe_claim(&mut ledger, claim(&plan, 0, 0, 0, &[a, b], 7));
    assert!(
        !ledger.settled(0),
        "the other holder committed, so its claim is awaited"
    );
    observe_claim(&mut ledger, claim(&plan, 0, 1, 0, &[a], 8));
    assert!(
        !ledger.settled(0),
        "sets differ: a narrower round may follow"
    );
    observe_claim(&mut ledger, claim(&plan, 0, 1, 1, &[a, b], 7));
    assert!(ledger.settled(0), "agreement");
    observe_claim(&mut ledger, claim(&plan, 0, 1, 2, &[a, b], 9));
    assert!(
        ledger.settled(0),
        "same set, different results: a dispute to settle now"
    );
    // A holder that never committed is not waited for.
    let (plan, mut ledger) = setup(4, 4);
    let [a, _] = plan.holders(1);
    ledger.observe(plan.member(a), commitment(&plan, a, 0), true);
    observe_claim(&mut ledger, claim(&plan, 1, 0, 0, &[a], 3));
    assert!(ledger.settled(1));
}

#[test]
fn decisions_follow_the_claims() {
    let (plan, mut ledger) = setup(4, 4);
    for m in 0..4 {
        ledger.observe(plan.member(m), commitment(&plan, m, 0), true);
    }
    let p = 0;
    let [a, b] = plan.holders(p);
    let others: Vec<usize> = (0..4).filter(|m| *m != a && *m != b).collect();
    assert_eq!(ledger.decide(p, Some(others[0])), Decision::KeepLocal);
    observe_claim(&mut ledger, claim(&plan, p, 0, 0, &[0, 1, 2, 3], 9));
    match ledger.decide(p, Some(others[0])) {
        Decision::Accept { sources, .. } => assert_eq!(sources, vec![a]),
        other => panic!("{other:?}"),
    }
    observe_claim(&mut ledger, claim(&plan, p, 1, 0, &[0, 1, 2, 3], 9));
    // The two non-holders start with different holders; a holder takes its own copy first.
    let firsts: BTreeSet<usize> = others
        .iter()
        .map(|&m| match ledger.decide(p, Some(m)) {
            Decision::Accept { sources, .. } => {
                assert_eq!(sources.len(), 2);
                sources[0]
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(firsts, set(&[a, b]));
    match ledger.decide(p, Some(b)) {
        Decision::Accept { sources, .. } => assert_eq!(sources[0], b),
        other => panic!("{other:?}"),
    }
    observe_claim(&mut ledger, claim(&plan, p, 1, 1, &[0, 1, 2, 3], 10));
    assert!(
        matches!(ledger.decide(p, Some(others[0])), Decision::Dispute { claims } if claims.len() == 2)
    );
}

#[test]
fn a_claim_whose_input_hashes_contradict_commitments_is_not_used() {
    let (plan, mut ledger) = setup(4, 4);
    for m in 0..4 {
        ledger.observe(plan.member(m), commitment(&plan, m, 0), true);
    }
    let mut lying = claim(&plan, 0, 0, 0, &[0, 1, 2, 3], 9);
    lying.input_hashes[2] = Hash([0xee; 32]);
    assert!(!ledger.consistent(&lying));
    observe_claim(&mut ledger, lying);
    assert_eq!(ledger.decide(0, None), Decision::KeepLocal);
    observe_claim(&mut ledger, claim(&plan, 0, 1, 0, &[0, 1, 2, 3], 8));
    assert!(
        matches!(ledger.decide(0, None), Decision::Accept { claim, .. } if claim.result == Hash([8; 32]))
    );
}

#[test]
fn narrowing_meets_in_the_middle_but_never_below_half() {
    // (fetched, current, co-holder's, expected)
    type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], Option<&'a [usize]>);
    let cases: [Case<'_>; 5] = [
        (&[0, 1, 2, 3], &[0, 1, 2, 3], &[0, 1, 2, 3], None),
        (&[0, 1, 2, 3], &[0, 1, 2, 3], &[0, 1, 2], Some(&[0, 1, 2])),
        (&[0, 1, 2, 3], &[0, 1, 2], &[0, 1, 2, 3], None),
        (&[0, 1, 2, 3], &[0, 1, 2, 3], &[0, 1], None),
        (
            &[0, 1, 2, 3, 4],
            &[0, 1, 2, 3, 4],
            &[0, 1, 2, 5],
            Some(&[0, 1, 2]),
        ),
    ];
    for (fetched, current, theirs, expected) in cases {
        assert_eq!(
            narrow(&set(fetched), &set(current), &set(theirs)),
            expected.map(set),
            "fetched {fetched:?} current {current:?} theirs {theirs:?}"
        );
    }
}

#[test]
fn disputes_go_to_the_reproducible_claim_with_the_most_members() {
    let (plan, _) = setup(4, 4);
    let big = claim(&plan, 0, 0, 0, &[0, 1, 2, 3], 1);
    let small = claim(&plan, 0, 1, 0, &[0, 1, 2], 2);
    let other_small = claim(&plan, 0, 1, 0, &[0, 1, 3], 0);
    let refuted = Check::Refuted(Hash([3; 32]));
    let cases = [
        (
            vec![(big.clone(), Check::Reproduced), (small.clone(), refuted)],
            Some(0),
            vec![1],
        ),
        (
            vec![(big.clone(), refuted), (small.clone(), Check::Reproduced)],
            Some(1),
            vec![0],
        ),
        (
            vec![
                (small.clone(), Check::Reproduced),
                (big.clone(), Check::Reproduced),
            ],
            Some(1),
            vec![],
        ),
        (
            vec![
                (small.clone(), Check::Reproduced),
                (other_small, Check::Reproduced),
            ],
            Some(1),
            vec![],
        ),
        (
            vec![(big.clone(), Check::Unknown), (small.clone(), refuted)],
            None,
            vec![1],
        ),
        (vec![(big, refuted), (small, refuted)], None, vec![0, 1]),
    ];
    for (claims, chosen, wrong) in cases {
        assert_eq!(resolve(&claims), (chosen, wrong));
    }
}
