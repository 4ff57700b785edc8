use proptest::prelude::*;

use super::*;
use crate::election::{OrchestratorTracker, TrackerConfig, View};
use crate::metagraph::RAO_PER_TAO;
use crate::test_support::{metagraph, peer};
use std::time::Duration;

/// A named input and the refusal it must get.
type Case = (&'static str, Vec<u8>, fn(&PlanDecodeError) -> bool);

fn miners(numbers: impl IntoIterator<Item = u64>) -> BTreeSet<PeerIdStr> {
    numbers.into_iter().map(peer).collect()
}

#[test]
fn first_plan_opens_epoch_zero_with_every_live_miner() {
    let config = RunConfig::default();
    let plan = next_plan(&config, &peer(100), None, None, &miners(0..6)).unwrap();
    assert_eq!(plan.epoch, 0);
    assert_eq!(plan.run, config.run_name);
    assert_eq!(plan.run_hash, config.hash());
    assert_eq!(plan.seed, plan_seed(config.seed, 0));
    assert_eq!(plan.orchestrator, peer(100));
    assert_eq!(plan.assignment.len(), 6);
    assert_eq!(
        (plan.inner_steps, plan.lr, plan.epoch_samples),
        (config.inner_steps, config.lr, config.epoch_samples)
    );
    for stage in 0..3 {
        assert_eq!(plan.miners_of(stage).count(), 2);
    }
    assert_eq!(plan.stage_of(&peer(0)), Some(plan.assignment[&peer(0)]));
    assert_eq!(plan.stage_of(&peer(99)), None);
}

#[test]
fn epoch_numbers_never_repeat_across_an_orchestrator_change() {
    let config = RunConfig::default();
    let live = miners(0..6);
    let first = next_plan(&config, &peer(100), None, None, &live).unwrap();
    let second = next_plan(&config, &peer(100), Some(&first), Some(0), &live).unwrap();
    assert_eq!(second.epoch, 1);
    // The new orchestrator only holds the first plan but has seen epoch 1 accepted.
    let third = next_plan(&config, &peer(101), Some(&first), Some(second.epoch), &live).unwrap();
    assert_eq!(third.epoch, 2);
    // A node that has seen later epochs than its stored plan numbers past them.
    let resumed = next_plan(&config, &peer(101), Some(&first), Some(7), &live).unwrap();
    assert_eq!(resumed.epoch, 8);
    let no_plan = next_plan(&config, &peer(101), None, Some(3), &live).unwrap();
    assert_eq!(no_plan.epoch, 4);
    assert!(matches!(
        next_plan(&config, &peer(101), None, Some(u64::MAX), &live),
        Err(NextPlanError::EpochsExhausted)
    ));
}

#[test]
fn plans_follow_each_other_through_the_tracker_across_a_failover() {
    let config = RunConfig::default();
    let validators = metagraph(&[(100, 2 * RAO_PER_TAO, true), (101, RAO_PER_TAO, true)]);
    let mut tracker = OrchestratorTracker::new(&validators, TrackerConfig::from_run(&config));
    let mut view = View::new();
    let live = miners(0..6);
    let at = Duration::from_secs;
    view.heard(&peer(100), at(0));
    view.heard(&peer(101), at(0));
    assert!(tracker.tick(at(0), &view).is_orchestrator(&peer(100)));
    let first = next_plan(
        &config,
        &peer(100),
        None,
        tracker.last_accepted_epoch(),
        &live,
    )
    .unwrap();
    tracker.accept_plan(&peer(100), &first, at(0)).unwrap();
    // 100 goes silent; 101 resumes from the last accepted epoch with the plan it holds.
    view.heard(&peer(101), at(4));
    assert!(tracker.tick(at(5), &view).is_orchestrator(&peer(101)));
    let next = next_plan(
        &config,
        &peer(101),
        Some(&first),
        tracker.last_accepted_epoch(),
        &live,
    )
    .unwrap();
    tracker.accept_plan(&peer(101), &next, at(5)).unwrap();
    assert_eq!(tracker.last_accepted_epoch(), Some(1));
    assert_eq!(
        next.assignment, first.assignment,
        "same miners, same stages"
    );
}

#[test]
fn previous_plan_of_another_run_is_refused() {
    let config = RunConfig::default();
    let other = RunConfig {
        run_name: "other".to_owned(),
        ..RunConfig::default()
    };
    let prev = next_plan(&other, &peer(100), None, None, &miners(0..3)).unwrap();
    assert!(matches!(
        next_plan(&config, &peer(100), Some(&prev), None, &miners(0..3)),
        Err(NextPlanError::OtherRun { .. })
    ));
}

#[test]
fn plans_round_trip_through_json() {
    let mut plan = next_plan(&RunConfig::default(), &peer(100), None, None, &miners(0..6)).unwrap();
    plan.merge = Some(serde_json::json!({"partitions": 4, "holders": [[0, 1], [2, 3]]}));
    let bytes = plan.to_json().unwrap();
    assert_eq!(EpochPlan::from_json(&bytes).unwrap(), plan);
}

#[test]
fn malformed_plans_are_refused() {
    let plan = next_plan(&RunConfig::default(), &peer(100), None, None, &miners(0..6)).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&plan.to_json().unwrap()).unwrap();
    let edit = |f: fn(&mut serde_json::Value)| {
        let mut v = json.clone();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    };
    let cases: Vec<Case> = vec![
        ("unknown field", edit(|v| v["extra"] = 1.into()), |e| {
            matches!(e, PlanDecodeError::Json(_))
        }),
        (
            "missing field",
            edit(|v| {
                v.as_object_mut().unwrap().remove("seed");
            }),
            |e| matches!(e, PlanDecodeError::Json(_)),
        ),
        (
            "bad peer id",
            edit(|v| v["orchestrator"] = "QmNope".into()),
            |e| matches!(e, PlanDecodeError::Json(_)),
        ),
        (
            "bad run hash",
            edit(|v| v["run_hash"] = "abc".into()),
            |e| matches!(e, PlanDecodeError::Json(_)),
        ),
        (
            "stage past the last",
            edit(|v| v["stages"] = 2.into()),
            |e| {
                matches!(
                    e,
                    PlanDecodeError::Invalid(InvalidPlan {
                        field: "assignment",
                        ..
                    })
                )
            },
        ),
        ("no stages", edit(|v| v["stages"] = 0.into()), |e| {
            matches!(
                e,
                PlanDecodeError::Invalid(InvalidPlan {
                    field: "stages",
                    ..
                })
            )
        }),
        ("zero lr", edit(|v| v["lr"] = 0.0.into()), |e| {
            matches!(e, PlanDecodeError::Invalid(InvalidPlan { field: "lr", .. }))
        }),
        (
            "zero inner steps",
            edit(|v| v["inner_steps"] = 0.into()),
            |e| {
                matches!(
                    e,
                    PlanDecodeError::Invalid(InvalidPlan {
                        field: "inner_steps",
                        ..
                    })
                )
            },
        ),
        (
            "zero samples",
            edit(|v| v["epoch_samples"] = 0.into()),
            |e| {
                matches!(
                    e,
                    PlanDecodeError::Invalid(InvalidPlan {
                        field: "epoch_samples",
                        ..
                    })
                )
            },
        ),
        ("oversized", vec![b' '; MAX_PLAN_BYTES + 1], |e| {
            matches!(e, PlanDecodeError::TooLarge { .. })
        }),
    ];
    for (name, bytes, expected) in cases {
        let err = EpochPlan::from_json(&bytes).unwrap_err();
        assert!(expected(&err), "{name}: got {err:?}");
    }
}

#[test]
fn invalid_or_oversized_plans_are_not_encoded() {
    let plan = next_plan(&RunConfig::default(), &peer(100), None, None, &miners(0..6)).unwrap();
    let nan = EpochPlan {
        lr: f64::NAN,
        ..plan.clone()
    };
    assert!(matches!(nan.to_json(), Err(PlanEncodeError::Invalid(_))));
    let huge = EpochPlan {
        merge: Some(serde_json::Value::String("x".repeat(MAX_PLAN_BYTES))),
        ..plan
    };
    assert!(matches!(
        huge.to_json(),
        Err(PlanEncodeError::TooLarge { .. })
    ));
}

proptest! {
    #[test]
    fn plan_seeds_differ_by_epoch_and_by_run_seed(run_seed in any::<u64>(), epoch in 0u64..u64::MAX) {
        let seed = plan_seed(run_seed, epoch);
        prop_assert_eq!(seed, plan_seed(run_seed, epoch));
        prop_assert_ne!(seed, plan_seed(run_seed, epoch + 1));
        prop_assert_ne!(seed, plan_seed(run_seed.wrapping_add(1), epoch));
    }

    #[test]
    fn next_epoch_is_past_everything_seen(prev_epoch in proptest::option::of(0u64..1000), seen in proptest::option::of(0u64..1000)) {
        let config = RunConfig::default();
        let live = miners(0..3);
        let prev = prev_epoch.map(|e| EpochPlan {
            epoch: e,
            ..next_plan(&config, &peer(100), None, None, &live).unwrap()
        });
        let plan = next_plan(&config, &peer(101), prev.as_ref(), seen, &live).unwrap();
        for last in prev_epoch.into_iter().chain(seen) {
            prop_assert!(plan.epoch > last);
        }
        prop_assert_eq!(plan.epoch, prev_epoch.max(seen).map_or(0, |e| e + 1));
    }
}

#[test]
fn a_plan_never_outgrows_the_gossip_envelope() {
    let config = RunConfig::default();
    let crowd = miners(0..2000);
    let first = next_plan(&config, &peer(100), None, None, &miners(1500..1510)).unwrap();
    let plan = next_plan(&config, &peer(100), Some(&first), None, &crowd).unwrap();
    assert_eq!(plan.assignment.len(), MAX_PLAN_MINERS);
    assert!(
        first
            .assignment
            .keys()
            .all(|m| plan.assignment.contains_key(m)),
        "miners already assigned keep their places"
    );
    let bytes = plan.to_wire().unwrap();
    assert!(bytes.len() <= MAX_PLAN_WIRE_BYTES, "{} bytes", bytes.len());
    assert_eq!(EpochPlan::from_wire(&bytes).unwrap(), plan);
    let mut over = plan.clone();
    over.assignment.insert(peer(5000), 0);
    assert_eq!(over.validate().unwrap_err().field, "assignment");
}

#[test]
fn the_largest_plan_placement_makes_fits_the_gossip_envelope() {
    // One stage, so every miner is a head; every head announced a different rate, so every
    // one carries its own quota: the most a plan of MAX_PLAN_MINERS says.
    let config = RunConfig {
        stages: 1,
        epoch_samples: 1_000_000,
        ..RunConfig::default()
    };
    let crowd = miners(0..MAX_PLAN_MINERS as u64 + 100);
    let rates = crowd
        .iter()
        .enumerate()
        .map(|(i, m)| (m.clone(), 1.0 + i as f64 / 7.0))
        .collect::<BTreeMap<_, _>>();
    let announced = Announced {
        capacity: rates.clone(),
        pathway_rate: rates,
    };
    let mut plan =
        next_plan_by_capacity(&config, &peer(100_000), None, None, &crowd, &announced).unwrap();
    plan.merge = Some(serde_json::json!({ "start_unix_ms": u64::MAX }));
    assert_eq!(plan.assignment.len(), MAX_PLAN_MINERS);
    let quotas = plan
        .head_samples
        .as_ref()
        .expect("heads draw unequal shares");
    assert_eq!(
        quotas.len(),
        MAX_PLAN_MINERS,
        "every miner is a head with a quota"
    );
    let json = plan.to_json().unwrap();
    let wire = plan.to_wire().unwrap();
    println!(
        "{MAX_PLAN_MINERS} miners: {} bytes of JSON, {} on the wire ({} a miner)",
        json.len(),
        wire.len(),
        wire.len() / MAX_PLAN_MINERS
    );
    assert!(wire.len() <= MAX_PLAN_WIRE_BYTES);
    assert_eq!(EpochPlan::from_wire(&wire).unwrap(), plan);
}

#[test]
fn plans_from_the_wire_are_bounded_before_they_are_expanded() {
    let plan = next_plan(&RunConfig::default(), &peer(100), None, None, &miners(0..6)).unwrap();
    let wire = plan.to_wire().unwrap();
    assert_eq!(EpochPlan::from_wire(&wire).unwrap(), plan);
    // A frame that expands past MAX_PLAN_BYTES (a few hundred bytes of spaces' frame).
    let bomb = zstd::bulk::compress(&vec![b' '; MAX_PLAN_BYTES + 1], 19).unwrap();
    assert!(bomb.len() < 1024);
    // A small frame of a valid plan whose merge field pads it far past six times the frame.
    let mut padded = plan.clone();
    padded.merge = Some(serde_json::Value::Array(vec![0.into(); 16 << 10]));
    let padded = zstd::bulk::compress(&padded.to_json().unwrap(), 3).unwrap();
    assert!(padded.len() * MAX_PLAN_EXPANSION < 32 << 10);
    let cases: Vec<Case> = vec![
        ("expands too far", bomb, |e| {
            matches!(e, PlanDecodeError::Frame { .. })
        }),
        ("expands past six times its length", padded, |e| {
            matches!(e, PlanDecodeError::Frame { .. })
        }),
        ("not a frame", plan.to_json().unwrap(), |e| {
            matches!(e, PlanDecodeError::Frame { .. })
        }),
        ("empty", Vec::new(), |e| {
            matches!(e, PlanDecodeError::Json(_))
        }),
        ("truncated", wire[..wire.len() / 2].to_vec(), |e| {
            matches!(e, PlanDecodeError::Frame { .. })
        }),
        ("oversized", vec![0; MAX_PLAN_WIRE_BYTES + 1], |e| {
            matches!(e, PlanDecodeError::WireTooLarge { .. })
        }),
        (
            "a frame of no plan",
            zstd::bulk::compress(b"{\"run\": 1}", 3).unwrap(),
            |e| matches!(e, PlanDecodeError::Json(_)),
        ),
    ];
    for (name, bytes, expected) in cases {
        let err = EpochPlan::from_wire(&bytes).unwrap_err();
        assert!(expected(&err), "{name}: got {err:?}");
    }
}

#[test]
fn honest_plans_expand_less_than_receivers_allow() {
    let mut largest: f64 = 0.0;
    for stages in [1, 3, 16] {
        let config = RunConfig {
            stages,
            ..RunConfig::default()
        };
        for n in [0u64, 1, 6, 64, 512, MAX_PLAN_MINERS as u64] {
            let crowd = miners(0..n);
            let varied = crowd
                .iter()
                .enumerate()
                .map(|(i, m)| (m.clone(), 1.0 + i as f64 / 7.0))
                .collect::<BTreeMap<_, _>>();
            // Every head at the same rate but one: quotas that repeat one number.
            let all_but_one = crowd
                .iter()
                .enumerate()
                .map(|(i, m)| (m.clone(), if i == 0 { 0.5 } else { 1.0 }))
                .collect::<BTreeMap<_, _>>();
            let mut plans = vec![next_plan(&config, &peer(100_000), None, None, &crowd).unwrap()];
            for rates in [varied, all_but_one] {
                let announced = Announced {
                    capacity: rates.clone(),
                    pathway_rate: rates,
                };
                plans.push(
                    next_plan_by_capacity(&config, &peer(100_000), None, None, &crowd, &announced)
                        .unwrap(),
                );
            }
            for mut plan in plans {
                plan.merge =
                    Some(serde_json::json!({ "merge_start_unix_ms": 1_764_000_000_000u64 }));
                let json = plan.to_json().unwrap().len();
                let wire = plan.to_wire().unwrap();
                assert_eq!(EpochPlan::from_wire(&wire).unwrap(), plan);
                if json > MIN_PLAN_EXPANSION {
                    largest = largest.max(json as f64 / wire.len() as f64);
                }
            }
        }
    }
    println!("largest expansion of an honest plan: {largest:.2}");
    assert!(largest < MAX_PLAN_EXPANSION as f64);
}

#[test]
fn a_plan_whose_frame_outgrows_the_envelope_is_not_encoded() {
    let plan = next_plan(&RunConfig::default(), &peer(100), None, None, &miners(0..6)).unwrap();
    // Incompressible text that fits the JSON bound but not the frame's.
    let noise: String = (0..120_000u64)
        .map(|i| {
            let byte = blake3::hash(&i.to_le_bytes()).as_bytes()[0];
            char::from(b'a' + byte % 26)
        })
        .collect();
    let noisy = EpochPlan {
        merge: Some(serde_json::Value::String(noise)),
        ..plan
    };
    assert!(noisy.to_json().is_ok());
    assert!(matches!(
        noisy.to_wire(),
        Err(PlanEncodeError::WireTooLarge { .. })
    ));
}

#[test]
fn a_plan_must_carry_the_runs_own_settings() {
    let config = RunConfig {
        lr_decay_epochs: 10,
        ..RunConfig::default()
    };
    let plan = next_plan(&config, &peer(100), None, Some(3), &miners(0..6)).unwrap();
    plan.matches_run(&config).unwrap();
    // Through JSON, at every epoch of local-swarm's schedule (epochs 2 and 5 parse one
    // unit in the last place away from the computed rate).
    let swarm = RunConfig {
        lr_decay_epochs: 6,
        ..RunConfig::default()
    };
    let mut prev: Option<EpochPlan> = None;
    for _ in 0..12 {
        let next = next_plan(&swarm, &peer(100), prev.as_ref(), None, &miners(0..6)).unwrap();
        let received = EpochPlan::from_json(&next.to_json().unwrap()).unwrap();
        received.matches_run(&swarm).unwrap();
        prev = Some(next);
    }
    type Change = (&'static str, fn(&mut EpochPlan));
    let changes: [Change; 5] = [
        ("run", |p| p.run = "other".into()),
        ("stages", |p| p.stages = 2),
        ("inner_steps", |p| p.inner_steps += 1),
        ("epoch_samples", |p| p.epoch_samples = u64::MAX),
        ("lr", |p| p.lr *= 10.0),
    ];
    for (field, change) in changes {
        let mut forged = plan.clone();
        change(&mut forged);
        assert_eq!(forged.matches_run(&config).unwrap_err().field, field);
    }
}

#[test]
fn head_quotas_name_heads_and_stay_within_the_epoch() {
    let run = RunConfig::default();
    let live: BTreeSet<PeerIdStr> = (0..6).map(peer).collect();
    let mut announced = Announced::default();
    for (i, m) in live.iter().enumerate() {
        announced.capacity.insert(m.clone(), 1.0);
        announced.pathway_rate.insert(m.clone(), 1.0 + i as f64);
    }
    let plan = next_plan_by_capacity(&run, &peer(100), None, None, &live, &announced).unwrap();
    let quotas = plan
        .head_samples
        .clone()
        .expect("unequal heads draw unequally");
    let heads: Vec<&PeerIdStr> = plan.miners_of(0).collect();
    assert_eq!(quotas.keys().collect::<Vec<_>>(), heads);
    assert!(heads
        .iter()
        .any(|h| plan.samples_of(h) == run.epoch_samples));
    assert!(heads.iter().any(|h| plan.samples_of(h) < run.epoch_samples));
    // Round trip, and the checks on a received plan.
    let bytes = plan.to_json().unwrap();
    assert_eq!(EpochPlan::from_json(&bytes).unwrap(), plan);
    let mut not_head = plan.clone();
    let tail = not_head.miners_of(2).next().unwrap().clone();
    not_head.head_samples.as_mut().unwrap().insert(tail, 1);
    assert_eq!(not_head.validate().unwrap_err().field, "head_samples");
    let mut too_many = plan.clone();
    *too_many
        .head_samples
        .as_mut()
        .unwrap()
        .values_mut()
        .next()
        .unwrap() = run.epoch_samples + 1;
    assert_eq!(too_many.validate().unwrap_err().field, "head_samples");
    // A plan by count says nothing of quotas, and a head draws the epoch's samples.
    let by_count = next_plan(&run, &peer(100), None, None, &live).unwrap();
    assert_eq!(by_count.head_samples, None);
    assert_eq!(by_count.samples_of(heads[0]), run.epoch_samples);
}
