//! Table-style scenarios with fake timestamps, and properties of the election.

use std::collections::BTreeSet;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::metagraph::{Hotkey, Neuron, RAO_PER_TAO};
use crate::plan::{plan_seed, EpochPlan};
use crate::run_config::RunConfig;
use crate::test_support::{metagraph, peer};

/// What a scenario step does, at its timestamp.
enum Step {
    /// These validators (by peer number) send a heartbeat.
    Beat(&'static [u64]),
    /// Tick; the phase must be the one given.
    Expect(Want),
    /// `Accept(author, epoch)`: validator `author` publishes the plan for `epoch`, accepted.
    Accept(u64, u64),
    /// `Reject(author, epoch, reason)`: the same, rejected with this metric label.
    Reject(u64, u64, &'static str),
}

/// A phase, by peer numbers.
enum Want {
    Vacant,
    Serving(u64),
    Handover(u64, u64),
}

use Step::{Accept, Beat, Expect, Reject};
use Want::{Handover, Serving, Vacant};

/// Validators 1, 2 and 3 with 300, 200 and 100 TAO; 1 ranks first.
const ABC: &[(u64, u64, bool)] = &[
    (1, 300 * RAO_PER_TAO, true),
    (2, 200 * RAO_PER_TAO, true),
    (3, 100 * RAO_PER_TAO, true),
];

fn config() -> RunConfig {
    RunConfig {
        heartbeat_timeout_ms: 5_000,
        epoch_timeout_secs: 60,
        ..RunConfig::default()
    }
}

fn plan_by(author: u64, epoch: u64) -> EpochPlan {
    let config = config();
    EpochPlan {
        run: config.run_name.clone(),
        run_hash: config.hash(),
        epoch,
        seed: plan_seed(config.seed, epoch),
        orchestrator: peer(author),
        stages: config.stages,
        assignment: Default::default(),
        merge: None,
        inner_steps: config.inner_steps,
        lr: config.lr,
        epoch_samples: config.epoch_samples,
        head_samples: None,
    }
}

fn want_phase(want: &Want) -> Phase {
    match *want {
        Vacant => Phase::Vacant,
        Serving(o) => Phase::Serving {
            orchestrator: peer(o),
        },
        Handover(o, s) => Phase::Handover {
            orchestrator: peer(o),
            successor: peer(s),
        },
    }
}

/// Runs `steps` (timestamps in milliseconds) against one node's tracker.
fn run(validators: &[(u64, u64, bool)], steps: &[(u64, Step)]) {
    let mut tracker =
        OrchestratorTracker::new(&metagraph(validators), TrackerConfig::from_run(&config()));
    let mut view = View::new();
    for (i, (ms, step)) in steps.iter().enumerate() {
        let now = Duration::from_millis(*ms);
        match step {
            Beat(peers) => peers.iter().for_each(|&p| view.heard(&peer(p), now)),
            Expect(want) => {
                let decision = tracker.tick(now, &view);
                assert_eq!(decision.phase, want_phase(want), "step {i} at {ms} ms");
            }
            Accept(author, epoch) | Reject(author, epoch, _) => {
                let want = match step {
                    Reject(.., reason) => Err(*reason),
                    _ => Ok(()),
                };
                let got = tracker
                    .accept_plan(&peer(*author), &plan_by(*author, *epoch), now)
                    .map_err(|e| e.reason());
                assert_eq!(got, want, "step {i} at {ms} ms");
            }
        }
    }
}

#[test]
fn first_live_validator_takes_the_vacant_duty() {
    run(
        ABC,
        &[
            (0, Expect(Vacant)),
            (0, Reject(1, 0, "not_orchestrator")),
            (100, Beat(&[2])),
            (100, Expect(Serving(2))),
        ],
    );
}

#[test]
fn highest_stake_among_live_validators_is_elected() {
    run(ABC, &[(0, Beat(&[3, 2])), (0, Expect(Serving(2)))]);
}

#[test]
fn election_moves_on_when_orchestrator_goes_silent() {
    run(
        ABC,
        &[
            (0, Beat(&[1, 2, 3])),
            (0, Expect(Serving(1))),
            (4_000, Beat(&[2, 3])),
            (4_999, Expect(Serving(1))),
            // Silent for the whole timeout: the next candidate takes over.
            (5_000, Expect(Serving(2))),
            (8_000, Beat(&[3])),
            (8_999, Expect(Serving(2))),
            (9_000, Expect(Serving(3))),
            (13_000, Expect(Vacant)),
        ],
    );
}

#[test]
fn new_orchestrator_resumes_after_the_last_accepted_epoch() {
    run(
        ABC,
        &[
            (0, Beat(&[1, 2])),
            (0, Expect(Serving(1))),
            (0, Accept(1, 5)),
            (6_000, Beat(&[2])),
            (6_000, Expect(Serving(2))),
            (6_000, Reject(2, 5, "stale_epoch")),
            (6_000, Reject(2, 4, "stale_epoch")),
            (6_000, Reject(1, 6, "not_orchestrator")),
            (6_000, Accept(2, 6)),
        ],
    );
}

#[test]
fn returning_higher_stake_waits_for_epoch_boundary() {
    run(
        ABC,
        &[
            (0, Beat(&[1, 2])),
            (0, Expect(Serving(1))),
            (0, Accept(1, 0)),
            (6_000, Beat(&[2])),
            (6_000, Expect(Serving(2))),
            (6_000, Accept(2, 1)),
            // 1 is back mid-epoch: 2 keeps the duty until its next plan.
            (10_000, Beat(&[1, 2])),
            (10_000, Expect(Handover(2, 1))),
            (10_000, Reject(1, 2, "not_orchestrator")),
            (12_000, Beat(&[1, 2])),
            (12_000, Expect(Handover(2, 1))),
            // 2's plan closes its epoch; the plan is the boundary.
            (12_000, Accept(2, 2)),
            (12_000, Expect(Serving(1))),
            (12_000, Reject(2, 3, "not_orchestrator")),
            (12_000, Accept(1, 3)),
        ],
    );
}

#[test]
fn returning_higher_stake_takes_over_at_once_before_any_plan() {
    run(
        ABC,
        &[
            (0, Beat(&[2])),
            (0, Expect(Serving(2))),
            (1_000, Beat(&[1, 2])),
            (1_000, Expect(Serving(1))),
        ],
    );
}

#[test]
fn handover_completes_at_the_epoch_deadline_without_a_plan() {
    // Deadline: plan accepted at 0 + epoch timeout 60 s + heartbeat timeout 5 s.
    run(
        ABC,
        &[
            (0, Beat(&[2])),
            (0, Expect(Serving(2))),
            (0, Accept(2, 0)),
            (1_000, Beat(&[1, 2])),
            (1_000, Expect(Handover(2, 1))),
            (64_999, Beat(&[1, 2])),
            (64_999, Expect(Handover(2, 1))),
            (65_000, Expect(Serving(1))),
        ],
    );
}

#[test]
fn successor_that_goes_silent_again_is_dropped() {
    run(
        ABC,
        &[
            (0, Beat(&[3])),
            (0, Expect(Serving(3))),
            (0, Accept(3, 0)),
            (1_000, Beat(&[1, 2, 3])),
            (1_000, Expect(Handover(3, 1))),
            // 1 falls silent: the best live successor is now 2.
            (4_000, Beat(&[2, 3])),
            (6_000, Expect(Handover(3, 2))),
            (8_000, Beat(&[3])),
            (9_000, Expect(Serving(3))),
        ],
    );
}

#[test]
fn silent_orchestrator_during_handover_is_replaced_at_once() {
    run(
        ABC,
        &[
            (0, Beat(&[2])),
            (0, Expect(Serving(2))),
            (0, Accept(2, 0)),
            (1_000, Beat(&[1, 2])),
            (1_000, Expect(Handover(2, 1))),
            (5_000, Beat(&[1])),
            (6_000, Expect(Serving(1))),
            (6_000, Accept(1, 1)),
        ],
    );
}

#[test]
fn validators_without_permit_or_below_min_stake_are_never_elected() {
    let min_stake = 10 * RAO_PER_TAO;
    let m = metagraph(&[
        (1, 1_000 * RAO_PER_TAO, false),
        (2, min_stake - 1, true),
        (3, min_stake, true),
    ]);
    let config = TrackerConfig {
        min_validator_stake: min_stake,
        ..TrackerConfig::from_run(&config())
    };
    let mut tracker = OrchestratorTracker::new(&m, config);
    let mut view = View::new();
    let now = Duration::ZERO;
    for p in [1, 2] {
        view.heard(&peer(p), now);
    }
    assert_eq!(tracker.tick(now, &view).phase, Phase::Vacant);
    view.heard(&peer(3), now);
    assert!(tracker.tick(now, &view).is_orchestrator(&peer(3)));
    let ranked: Vec<_> = tracker
        .ranking()
        .candidates()
        .iter()
        .map(|c| c.uid)
        .collect();
    assert_eq!(ranked, [2], "only uid 2 (peer 3) is eligible");
}

/// A tracker with validator 1 elected and epoch 0 accepted.
fn serving_one() -> OrchestratorTracker {
    let mut tracker = OrchestratorTracker::new(&metagraph(ABC), TrackerConfig::from_run(&config()));
    let mut view = View::new();
    view.heard(&peer(1), Duration::ZERO);
    tracker.tick(Duration::ZERO, &view);
    tracker
        .accept_plan(&peer(1), &plan_by(1, 0), Duration::ZERO)
        .unwrap();
    tracker
}

#[test]
fn plans_of_another_run_or_with_a_forged_seed_are_rejected() {
    let other_run = RunConfig {
        seed: 99,
        ..config()
    };
    let cases: Vec<(&str, EpochPlan, &str)> = vec![
        (
            "another run",
            EpochPlan {
                run_hash: other_run.hash(),
                ..plan_by(1, 1)
            },
            "wrong_run",
        ),
        (
            "ground seed",
            EpochPlan {
                seed: plan_by(1, 1).seed ^ 1,
                ..plan_by(1, 1)
            },
            "wrong_seed",
        ),
        (
            "seed of another epoch",
            EpochPlan {
                seed: plan_by(1, 2).seed,
                ..plan_by(1, 1)
            },
            "wrong_seed",
        ),
        (
            "names someone else",
            EpochPlan {
                orchestrator: peer(2),
                ..plan_by(1, 1)
            },
            "not_orchestrator",
        ),
    ];
    for (name, plan, reason) in cases {
        let mut tracker = serving_one();
        let err = tracker
            .accept_plan(&peer(1), &plan, Duration::ZERO)
            .unwrap_err();
        assert_eq!(err.reason(), reason, "{name}: {err}");
        assert_eq!(
            tracker.last_accepted_epoch(),
            Some(0),
            "{name} changed the tracker"
        );
    }
    let mut tracker = serving_one();
    tracker
        .accept_plan(&peer(1), &plan_by(1, 1), Duration::ZERO)
        .unwrap();
    assert_eq!(tracker.last_accepted_epoch(), Some(1));
}

#[test]
fn decision_reports_each_change_once() {
    let mut tracker = OrchestratorTracker::new(&metagraph(ABC), TrackerConfig::from_run(&config()));
    let mut view = View::new();
    let at = Duration::from_millis;
    assert!(!tracker.tick(at(0), &view).changed, "vacant from the start");
    view.heard(&peer(2), at(0));
    assert!(tracker.tick(at(0), &view).changed);
    assert!(!tracker.tick(at(1), &view).changed);
    tracker
        .accept_plan(&peer(2), &plan_by(2, 0), at(1))
        .unwrap();
    view.heard(&peer(1), at(2));
    let handover = tracker.tick(at(2), &view);
    assert!(
        !handover.changed,
        "a pending handover does not change the orchestrator"
    );
    tracker
        .accept_plan(&peer(2), &plan_by(2, 1), at(3))
        .unwrap();
    let after = tracker.tick(at(3), &view);
    assert!(after.changed && after.is_orchestrator(&peer(1)));
    assert!(!tracker.tick(at(4), &view).changed);
}

#[test]
fn view_keeps_the_latest_heartbeat_whatever_the_arrival_order() {
    let mut view = View::new();
    let p = peer(1);
    view.heard(&p, Duration::from_secs(9));
    view.heard(&p, Duration::from_secs(3));
    assert_eq!(view.last_heard(&p), Some(Duration::from_secs(9)));
    let timeout = Duration::from_secs(5);
    assert!(view.is_live(&p, Duration::from_millis(13_999), timeout));
    assert!(!view.is_live(&p, Duration::from_secs(14), timeout));
    assert!(!view.is_live(&peer(2), Duration::ZERO, timeout));
}

#[test]
fn equal_stakes_are_ordered_by_lowest_peer_id_hash() {
    let m = metagraph(&[(1, 50, true), (2, 50, true), (3, 50, true), (4, 70, true)]);
    let ranking = Ranking::new(&m, 0);
    let ranked: Vec<&PeerIdStr> = ranking.candidates().iter().map(|c| &c.peer_id).collect();
    assert_eq!(ranked[0], &peer(4), "higher stake first");
    let mut tied = [peer(1), peer(2), peer(3)];
    tied.sort_by_key(tie_break_hash);
    assert_eq!(ranked[1..], tied.iter().collect::<Vec<_>>()[..]);
    let live = [peer(1), peer(2), peer(3)];
    assert_eq!(elect(&m, 0, &live), Some(tied[0].clone()));
}

/// (stake in whole TAO, permit, live) of each validator.
type ValidatorSet = Vec<(u64, bool, bool)>;

/// A validator set, (stake in whole TAO, with few values so ties happen, permit, live) each,
/// and two permutations of its positions.
fn validator_sets() -> impl Strategy<Value = (ValidatorSet, Vec<usize>, Vec<usize>)> {
    prop::collection::vec((0u64..4, any::<bool>(), any::<bool>()), 0..12).prop_flat_map(|set| {
        let positions: Vec<usize> = (0..set.len()).collect();
        (
            Just(set),
            Just(positions.clone()).prop_shuffle(),
            Just(positions).prop_shuffle(),
        )
    })
}

/// `items` in the order `permutation` gives.
fn permuted<T: Clone>(items: &[T], permutation: &[usize]) -> Vec<T> {
    permutation.iter().map(|&i| items[i].clone()).collect()
}

/// Neurons of `set`, uid and peer number = position.
fn neurons(set: &[(u64, bool, bool)]) -> Vec<Neuron> {
    set.iter()
        .zip(0u16..)
        .map(|(&(stake, permit, _), uid)| Neuron {
            uid,
            hotkey: Hotkey::local_stand_in(&uid.to_le_bytes()),
            peer_id: peer(uid.into()),
            stake: stake * RAO_PER_TAO,
            validator_permit: permit,
        })
        .collect()
}

proptest! {
    #[test]
    fn nodes_with_the_same_view_elect_the_same_peer(
        (set, neuron_order, heard_order) in validator_sets(),
        min_tao in 0u64..3,
    ) {
        let neurons = neurons(&set);
        let live: Vec<PeerIdStr> = neurons
            .iter()
            .zip(&set)
            .filter(|(_, &(_, _, live))| live)
            .map(|(n, _)| n.peer_id.clone())
            .collect();
        // Another node got the same entries and heard the same peers, in other orders.
        let other_neurons = permuted(&neurons, &neuron_order);
        let other_live: Vec<PeerIdStr> = permuted(&neurons, &heard_order)
            .into_iter()
            .map(|n| n.peer_id)
            .filter(|p| live.contains(p))
            .collect();
        let min = min_tao * RAO_PER_TAO;
        let mine = Metagraph::new(9, 1, neurons.clone()).unwrap();
        let theirs = Metagraph::new(9, 1, other_neurons).unwrap();
        let elected = elect(&mine, min, &live);
        prop_assert_eq!(&elected, &elect(&theirs, min, &other_live));

        // The elected peer is the best eligible live one by (stake, lowest tie-break hash).
        let best = neurons
            .iter()
            .filter(|n| n.validator_permit && n.stake >= min && live.contains(&n.peer_id))
            .min_by_key(|n| (std::cmp::Reverse(n.stake), tie_break_hash(&n.peer_id)))
            .map(|n| n.peer_id.clone());
        prop_assert_eq!(&elected, &best);

        // Trackers fed the same heartbeats in other orders reach the same decision.
        let tracker_config = TrackerConfig {
            min_validator_stake: min,
            ..TrackerConfig::from_run(&config())
        };
        let now = Duration::from_secs(1);
        let decide = |metagraph: &Metagraph, heard: &[PeerIdStr]| {
            let mut view = View::new();
            heard.iter().for_each(|p| view.heard(p, now));
            OrchestratorTracker::new(metagraph, tracker_config.clone()).tick(now, &view)
        };
        let decision = decide(&mine, &live);
        prop_assert_eq!(&decision, &decide(&theirs, &other_live));
        prop_assert_eq!(decision.orchestrator(), elected.as_ref());
    }

    #[test]
    fn tie_break_order_is_a_total_order_on_distinct_peers(a in 0u64..1000, b in 0u64..1000) {
        prop_assume!(a != b);
        prop_assert_ne!(tie_break_hash(&peer(a)), tie_break_hash(&peer(b)));
    }
}

#[test]
fn live_peers_outside_the_metagraph_are_ignored() {
    let m = metagraph(ABC);
    let strangers: BTreeSet<PeerIdStr> = (100..110).map(peer).collect();
    assert_eq!(elect(&m, 0, &strangers), None);
}

#[test]
fn the_epoch_grows_no_faster_than_time_allows() {
    run(
        ABC,
        &[
            (0, Beat(&[1])),
            (0, Expect(Serving(1))),
            (0, Accept(1, 5)),
            // Within the first gap only the next epoch may follow.
            (500, Reject(1, 7, "plan_epoch_jump")),
            (500, Reject(1, u64::MAX, "plan_epoch_jump")),
            // Three seconds later a node that missed plans catches up to 5 + 1 + 3.
            (3_000, Reject(1, 10, "plan_epoch_jump")),
            (3_000, Accept(1, 9)),
            (3_500, Accept(1, 10)),
        ],
    );
}

#[test]
fn a_new_stake_snapshot_re_ranks_and_unseats_an_orchestrator_that_lost_its_candidacy() {
    let mut tracker = serving_one();
    let mut view = View::new();
    let now = Duration::from_millis(100);
    view.heard(&peer(1), now);
    view.heard(&peer(2), now);
    // Validator 1's stake moved away (or its binding lapsed): it is no candidate any more.
    tracker.set_metagraph(&metagraph(&[(2, 200 * RAO_PER_TAO, true)]));
    assert_eq!(tracker.phase(), &Phase::Vacant);
    assert_eq!(
        tracker.tick(now, &view).phase,
        Phase::Serving {
            orchestrator: peer(2)
        }
    );
    assert_eq!(
        tracker.last_accepted_epoch(),
        Some(0),
        "accepted plans stay"
    );
    // Validator 3 outranks 2 in the next snapshot: 2 keeps the duty until the boundary.
    tracker.set_metagraph(&metagraph(&[
        (2, 200 * RAO_PER_TAO, true),
        (3, 900 * RAO_PER_TAO, true),
    ]));
    view.heard(&peer(3), now);
    assert_eq!(
        tracker.tick(now, &view).phase,
        Phase::Handover {
            orchestrator: peer(2),
            successor: peer(3)
        }
    );
    // And if 3 drops out again before the boundary, 2 simply keeps serving.
    tracker.set_metagraph(&metagraph(&[(2, 200 * RAO_PER_TAO, true)]));
    assert_eq!(
        tracker.phase(),
        &Phase::Serving {
            orchestrator: peer(2)
        }
    );
}
