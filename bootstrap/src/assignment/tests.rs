use proptest::prelude::*;

use super::*;
use crate::test_support::peer;

fn miners(numbers: impl IntoIterator<Item = u64>) -> BTreeSet<PeerIdStr> {
    numbers.into_iter().map(peer).collect()
}

fn of(assignment: &Assignment, numbers: &[u64]) -> Vec<u32> {
    numbers.iter().map(|&n| assignment[&peer(n)]).collect()
}

#[test]
fn six_miners_on_three_stages_split_two_two_two() {
    let a = assign(&Assignment::new(), &miners(0..6), 3).unwrap();
    assert_eq!(a.len(), 6);
    assert_eq!(stage_sizes(&a, 3), [2, 2, 2]);
}

#[test]
fn new_miner_joins_the_stage_with_fewest_miners() {
    let prev = assign(&Assignment::new(), &miners(0..5), 3).unwrap();
    assert_eq!(stage_sizes(&prev, 3), [2, 2, 1]);
    let next = assign(&prev, &miners(0..6), 3).unwrap();
    assert_eq!(next[&peer(5)], 2);
    // Ties go to the lowest stage.
    let after = assign(&next, &miners(0..7), 3).unwrap();
    assert_eq!(after[&peer(6)], 0);
}

#[test]
fn miners_that_stay_keep_their_stage() {
    let prev = assign(&Assignment::new(), &miners(0..9), 3).unwrap();
    let live = miners([0, 2, 3, 5, 6, 8, 9, 10]);
    let next = assign(&prev, &live, 3).unwrap();
    for miner in live.iter().filter(|m| prev.contains_key(*m)) {
        assert_eq!(next[miner], prev[miner], "{miner} moved");
    }
}

#[test]
fn departed_miners_are_removed() {
    let prev = assign(&Assignment::new(), &miners(0..6), 3).unwrap();
    let next = assign(&prev, &miners([0, 1, 2, 4]), 3).unwrap();
    assert_eq!(
        next.keys().cloned().collect::<BTreeSet<_>>(),
        miners([0, 1, 2, 4])
    );
}

#[test]
fn empty_stage_is_refilled_from_the_largest() {
    let prev: Assignment = [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2)]
        .into_iter()
        .map(|(n, s)| (peer(n), s))
        .collect();
    let next = assign(&prev, &miners(0..4), 3).unwrap();
    assert_eq!(stage_sizes(&next, 3), [2, 1, 1]);
    // The mover is the greatest peer id of stage 0.
    let mover = [0, 1, 2].into_iter().map(peer).max().unwrap();
    assert_eq!(next[&mover], 2);
    assert_eq!(of(&next, &[3]), [1]);
}

#[test]
fn refill_takes_from_the_lowest_of_equally_large_stages() {
    let prev: Assignment = [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2)]
        .into_iter()
        .map(|(n, s)| (peer(n), s))
        .collect();
    let next = assign(&prev, &miners(0..4), 3).unwrap();
    assert_eq!(stage_sizes(&next, 3), [1, 2, 1]);
    assert_eq!(of(&next, &[2, 3]), [1, 1]);
}

#[test]
fn fewer_miners_than_stages_fill_the_first_stages() {
    let a = assign(&Assignment::new(), &miners(0..2), 3).unwrap();
    assert_eq!(stage_sizes(&a, 3), [1, 1, 0]);
}

#[test]
fn miners_on_stages_that_no_longer_exist_are_placed_again() {
    let prev = assign(&Assignment::new(), &miners(0..8), 4).unwrap();
    let next = assign(&prev, &miners(0..8), 2).unwrap();
    assert_eq!(stage_sizes(&next, 2), [4, 4]);
    assert!(next.values().all(|&s| s < 2));
}

#[test]
fn stage_count_must_be_in_range() {
    for stages in [0, MAX_STAGES + 1, u32::MAX] {
        assert_eq!(
            assign(&Assignment::new(), &miners(0..3), stages),
            Err(AssignmentError::StageCount { stages })
        );
    }
}

/// One epoch's live set: a subset of 24 possible miners.
fn live_sets() -> impl Strategy<Value = BTreeSet<u64>> {
    prop::collection::btree_set(0u64..24, 0..24)
}

proptest! {
    #[test]
    fn joins_from_empty_are_balanced(n in 0u64..40, stages in 1u32..8) {
        let a = assign(&Assignment::new(), &miners(0..n), stages).unwrap();
        let sizes = stage_sizes(&a, stages);
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        prop_assert!(max - min <= 1, "{sizes:?}");
    }

    #[test]
    fn every_live_miner_has_exactly_one_stage_and_no_stage_is_left_empty(
        epochs in prop::collection::vec(live_sets(), 1..8),
        stages in 1u32..6,
    ) {
        let mut prev = Assignment::new();
        for live in epochs {
            let live = miners(live);
            let next = assign(&prev, &live, stages).unwrap();
            // A map has one entry per key: exactly the live miners, each with one stage.
            prop_assert_eq!(next.keys().cloned().collect::<BTreeSet<_>>(), live.clone());
            prop_assert!(next.values().all(|&s| s < stages));
            let sizes = stage_sizes(&next, stages);
            prop_assert_eq!(sizes.iter().sum::<usize>(), live.len());
            if live.len() >= stages as usize {
                prop_assert!(sizes.iter().all(|&s| s > 0), "{sizes:?}");
            }
            prop_assert_eq!(&assign(&prev, &live, stages).unwrap(), &next, "deterministic");
            prev = next;
        }
    }
}
