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

fn capacities(entries: &[(u64, f64)]) -> BTreeMap<PeerIdStr, f64> {
    entries.iter().map(|&(n, c)| (peer(n), c)).collect()
}

/// Sum of bounded capacity per stage.
fn stage_capacity(a: &Assignment, announced: &BTreeMap<PeerIdStr, f64>, stages: u32) -> Vec<f64> {
    let live: BTreeSet<PeerIdStr> = a.keys().cloned().collect();
    let bounded = bounded_capacity(&live, announced);
    let mut totals = vec![0.0; stages as usize];
    for (m, &s) in a {
        totals[s as usize] += bounded[m];
    }
    totals
}

#[test]
fn with_equal_capacities_placement_by_capacity_is_placement_by_count() {
    let equal = capacities(&(0..9).map(|n| (n, 2.0)).collect::<Vec<_>>());
    let mut by_count = Assignment::new();
    let mut by_capacity = Assignment::new();
    // Miners arriving and leaving over several plans.
    for live in [
        miners(0..5),
        miners(0..7),
        miners([0, 2, 3, 5, 6]),
        miners(0..9),
    ] {
        by_count = assign(&by_count, &live, 3).unwrap();
        by_capacity = assign_by_capacity(&by_capacity, &live, &equal, 3).unwrap();
        assert_eq!(by_count, by_capacity);
    }
}

#[test]
fn a_new_fast_miner_joins_the_stage_with_the_least_capacity_not_the_fewest_miners() {
    // Stage 0 holds two slow miners, stage 1 one fast one.
    let prev: Assignment = [(0, 0), (1, 0), (2, 1)]
        .into_iter()
        .map(|(n, s)| (peer(n), s))
        .collect();
    let announced = capacities(&[(0, 1.0), (1, 1.0), (2, 4.0), (3, 4.0)]);
    let next = assign_by_capacity(&prev, &miners(0..4), &announced, 2).unwrap();
    assert_eq!(next[&peer(3)], 0, "joins the two slow miners' stage");
    assert_eq!(assign(&prev, &miners(0..4), 2).unwrap()[&peer(3)], 1);
}

#[test]
fn a_stage_left_slow_gets_a_miner_moved_from_the_richest_and_no_more() {
    // Stage 1 lost its fast miners: 1 + 1 against stage 0's 4 + 4 + 4.
    let prev: Assignment = [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1)]
        .into_iter()
        .map(|(n, s)| (peer(n), s))
        .collect();
    let announced = capacities(&[(0, 4.0), (1, 4.0), (2, 4.0), (3, 1.0), (4, 1.0)]);
    let next = assign_by_capacity(&prev, &miners(0..5), &announced, 2).unwrap();
    let moved: Vec<_> = (0..5)
        .filter(|&n| next[&peer(n)] != prev[&peer(n)])
        .collect();
    assert_eq!(moved.len(), 1, "one move evens 12 : 2 into 8 : 6");
    assert_eq!(stage_capacity(&next, &announced, 2), [8.0, 6.0]);
    // The next plan, with nothing changed, moves nobody: 8 : 6 is not worth a fetch.
    assert_eq!(
        assign_by_capacity(&next, &miners(0..5), &announced, 2).unwrap(),
        next
    );
}

#[test]
fn an_inflated_capacity_counts_for_at_most_four_medians() {
    let live = miners(0..5);
    let announced = capacities(&[(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 1e9)]);
    let bounded = bounded_capacity(&live, &announced);
    assert_eq!(bounded[&peer(4)], CAPACITY_CAP);
    // Nothing announced, NaN or 0: the median, or the floor.
    let odd = capacities(&[(0, 2.0), (1, 2.0), (2, f64::NAN), (3, 0.0)]);
    let bounded = bounded_capacity(&live, &odd);
    assert_eq!(bounded[&peer(4)], 2.0);
    assert_eq!(bounded[&peer(2)], 2.0 * CAPACITY_FLOOR);
    assert_eq!(bounded[&peer(3)], 2.0 * CAPACITY_FLOOR);
}

#[test]
fn heads_draw_in_proportion_to_their_pathways_and_the_fastest_draws_the_epoch() {
    let a: Assignment = [(0, 0), (1, 0), (2, 0), (3, 1)]
        .into_iter()
        .map(|(n, s)| (peer(n), s))
        .collect();
    let live: BTreeSet<PeerIdStr> = a.keys().cloned().collect();
    let rates = capacities(&[(0, 10.0), (1, 5.0), (2, 2.0)]);
    let quotas = head_quotas(&a, &live, &rates, 100).unwrap();
    assert_eq!(quotas.len(), 3, "heads only");
    assert_eq!(quotas[&peer(0)], 100);
    assert_eq!(quotas[&peer(1)], 50);
    assert_eq!(quotas[&peer(2)], 20);
    // Equal rates: the plan says nothing.
    let equal = capacities(&[(0, 3.0), (1, 3.0), (2, 3.0)]);
    assert_eq!(head_quotas(&a, &live, &equal, 100), None);
    // A head that claims a huge rate cannot push the others below a quarter of the median.
    let liar = capacities(&[(0, 1e9), (1, 5.0), (2, 5.0)]);
    let quotas = head_quotas(&a, &live, &liar, 100).unwrap();
    assert_eq!(quotas[&peer(0)], 100);
    assert_eq!(quotas[&peer(1)], 25);
}

proptest! {
    #[test]
    fn placement_by_capacity_places_every_live_miner_once_and_fills_every_stage(
        n in 0u64..40,
        stages in 1u32..6,
        caps in proptest::collection::vec(0.0f64..100.0, 40),
        gone in proptest::collection::vec(any::<bool>(), 40),
    ) {
        let announced: BTreeMap<PeerIdStr, f64> =
            (0..n).map(|i| (peer(i), caps[i as usize])).collect();
        let first = assign_by_capacity(&Assignment::new(), &miners(0..n), &announced, stages).unwrap();
        let live: BTreeSet<PeerIdStr> = (0..n).filter(|&i| !gone[i as usize]).map(peer).collect();
        let next = assign_by_capacity(&first, &live, &announced, stages).unwrap();
        prop_assert_eq!(next.keys().cloned().collect::<BTreeSet<_>>(), live.clone());
        prop_assert!(next.values().all(|&s| s < stages));
        if live.len() >= stages as usize {
            prop_assert!(stage_sizes(&next, stages).iter().all(|&k| k > 0));
        }
        // Moves beyond refilling emptied stages are bounded.
        let moved = live.iter().filter(|m| first[*m] != next[*m]).count();
        prop_assert!(moved <= stages as usize + 1 + live.len() / 64, "{} moved", moved);
    }
}
