//! Scenario tests: whole merges of many members in one process over the loopback network,
//! with faults injected.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::time::Instant;

use super::testing::Network;
use super::*;

mod bandwidth;

const EPOCH: u64 = 7;
const STAGE: u32 = 2;
const PHASE: Duration = Duration::from_millis(300);
const FETCH_TIMEOUT: Duration = Duration::from_millis(200);

/// N members with random vectors and different sample counts, on one loopback network.
struct Swarm {
    network: Network,
    plan: Arc<Plan>,
    values: Vec<Vec<f32>>,
    samples: Vec<u64>,
    timing: Timing,
    /// Cap on every member's sample count, as the node sets it from the plan.
    max_samples: u64,
}

struct Run {
    outcomes: Vec<Option<MergeOutcome>>,
    audit: Option<AuditReport>,
}

impl Swarm {
    fn new(n: usize, partitions: usize, len: usize) -> Swarm {
        Self::with_phase(n, partitions, len, PHASE)
    }

    fn with_phase(n: usize, partitions: usize, len: usize, phase: Duration) -> Swarm {
        let members: Vec<MemberId> = (0..n).map(|i| format!("m{i:02}")).collect();
        let plan = Arc::new(plan(0x5eed ^ n as u64, &members, partitions, len).unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(n as u64 * 31 + len as u64);
        let values = (0..n)
            .map(|_| (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
            .collect();
        let samples = (0..n).map(|i| 10 + 7 * i as u64).collect();
        let timing = Timing::from_start(Instant::now(), phase, FETCH_TIMEOUT);
        Swarm {
            network: Network::new(),
            plan,
            values,
            samples,
            timing,
            max_samples: u64::MAX,
        }
    }

    fn n(&self) -> usize {
        self.plan.members().len()
    }

    fn id(&self, i: usize) -> &str {
        self.plan.member(i)
    }

    fn ids(&self, members: impl IntoIterator<Item = usize>) -> Vec<MemberId> {
        members
            .into_iter()
            .map(|i| self.id(i).to_string())
            .collect()
    }

    fn all_but(&self, excluded: &[usize]) -> Vec<usize> {
        (0..self.n()).filter(|i| !excluded.contains(i)).collect()
    }

    /// Runs the members in `live` (the others never start) and, if `audit_rate` is set, a
    /// validator; `before` runs once every endpoint exists and before anyone starts.
    async fn run_with(
        &self,
        live: &[usize],
        audit_rate: Option<f64>,
        before: impl FnOnce(&Network),
    ) -> Run {
        let mut ready = Vec::new();
        for &i in live {
            let config = MergeConfig {
                epoch: EPOCH,
                stage: STAGE,
                me: self.id(i).to_string(),
                plan: Arc::clone(&self.plan),
                timing: self.timing,
                samples: self.samples[i],
                max_concurrent_fetches: 8,
                max_samples: self.max_samples,
            };
            let merge = Merge::new(config, self.values[i].clone()).unwrap();
            self.network.serve(self.id(i), merge.server());
            ready.push((i, merge, self.network.endpoint(self.id(i))));
        }
        let validator = audit_rate.map(|rate| {
            let config = AuditConfig {
                epoch: EPOCH,
                stage: STAGE,
                auditor: "validator".into(),
                plan: Arc::clone(&self.plan),
                timing: self.timing,
                rate,
                seed: 99,
                max_concurrent_fetches: 8,
                max_samples: self.max_samples,
            };
            (self.network.endpoint("validator"), config)
        });
        before(&self.network);
        let handles: Vec<_> = ready
            .into_iter()
            .map(|(i, merge, endpoint)| (i, tokio::spawn(merge.run(endpoint))))
            .collect();
        let auditor = validator.map(|(endpoint, config)| tokio::spawn(audit(endpoint, config)));
        // Merges end by done_by by construction; the margin only absorbs scheduling.
        let limit = self.timing.done_by + Duration::from_secs(2);
        let mut outcomes = vec![None; self.n()];
        for (i, handle) in handles {
            let outcome = tokio::time::timeout_at(limit, handle)
                .await
                .expect("merge finished by its deadline")
                .expect("merge task");
            outcomes[i] = Some(outcome);
        }
        let audit = match auditor {
            Some(handle) => Some(
                tokio::time::timeout_at(limit, handle)
                    .await
                    .expect("audit finished by its deadline")
                    .expect("audit task")
                    .expect("valid plan"),
            ),
            None => None,
        };
        Run { outcomes, audit }
    }

    async fn run(&self, live: &[usize]) -> Vec<Option<MergeOutcome>> {
        self.run_with(live, None, |_| {}).await.outcomes
    }

    /// The average of partition `p` over `included`, computed directly.
    fn average_of(&self, p: usize, included: &[usize]) -> Vec<f32> {
        let contributions: Vec<Contribution<'_>> = included
            .iter()
            .map(|&i| Contribution {
                member: self.id(i),
                samples: self.samples[i].min(self.max_samples),
                values: &self.values[i][self.plan.range(p)],
            })
            .collect();
        weighted_average(&contributions).unwrap()
    }

    /// The merged vector when partition `p` averages `included(p)`.
    fn expected(&self, included: impl Fn(usize) -> Vec<usize>) -> Vec<f32> {
        (0..self.plan.partitions())
            .flat_map(|p| self.average_of(p, &included(p)))
            .collect()
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn outcome(outcomes: &[Option<MergeOutcome>], i: usize) -> &MergeOutcome {
    outcomes[i].as_ref().expect("member ran")
}

/// All `members` ended with the same bytes, equal to `expected`.
fn assert_all_equal(outcomes: &[Option<MergeOutcome>], members: &[usize], expected: &[f32]) {
    for &i in members {
        let o = outcome(outcomes, i);
        assert_eq!(
            bits(&o.values),
            bits(expected),
            "member {i} differs from the expected average"
        );
        assert_eq!(o.report.result_hash, Hash::of_values(expected));
    }
}

fn accused(
    outcomes: &[Option<MergeOutcome>],
    members: &[usize],
) -> BTreeSet<(String, MisbehaviourKind)> {
    members
        .iter()
        .flat_map(|&i| outcome(outcomes, i).report.misbehaviour.iter())
        .map(|m| (m.accused.clone(), m.kind))
        .collect()
}

#[tokio::test]
async fn honest_members_end_with_the_same_weighted_average() {
    let swarm = Swarm::new(5, 5, 1003);
    let everyone = swarm.all_but(&[]);
    let run = swarm.run_with(&everyone, Some(1.0), |_| {}).await;
    let expected = swarm.expected(|_| everyone.clone());
    assert_all_equal(&run.outcomes, &everyone, &expected);
    // The bytes are the mean weighted by sample counts capped at their lower median (10,
    // 17, 24, 31, 38 samples weigh 10, 17, 24, 24, 24), to f32 rounding.
    let weight = |i: usize| swarm.samples[i].min(24) as f64;
    let total: f64 = (0..5).map(weight).sum();
    for (j, v) in expected.iter().enumerate() {
        let exact: f64 = (0..5)
            .map(|i| swarm.values[i][j] as f64 * weight(i))
            .sum::<f64>()
            / total;
        assert!(
            (*v as f64 - exact).abs() < 1e-5,
            "value {j}: {v} vs {exact}"
        );
    }
    for &i in &everyone {
        let report = &outcome(&run.outcomes, i).report;
        assert!(report
            .included
            .iter()
            .all(|inc| *inc == swarm.ids(everyone.clone())));
        assert_eq!(report.mismatches, 0);
        assert!(report.misbehaviour.is_empty() && report.partitions_kept_local.is_empty());
        assert!(report.bytes_received > 0 && report.bytes_sent > 0);
    }
    let audit = run.audit.expect("audit ran");
    assert_eq!(audit.audited.len(), 5);
    assert!(audit.misbehaviour.is_empty());
}

#[tokio::test]
async fn a_single_member_merge_changes_nothing_and_sends_nothing() {
    let swarm = Swarm::new(1, 3, 10);
    let outcomes = swarm.run(&[0]).await;
    let o = outcome(&outcomes, 0);
    assert_eq!(bits(&o.values), bits(&swarm.values[0]));
    assert_eq!((o.report.bytes_sent, o.report.bytes_received), (0, 0));
    assert_eq!(swarm.network.bytes("m00").sent, 0);
}

#[tokio::test]
async fn a_dead_member_is_left_out_and_its_partitions_come_from_the_other_holder() {
    let swarm = Swarm::new(6, 6, 600);
    let dead = 2;
    assert!(!swarm.plan.held_by(dead).is_empty());
    let live = swarm.all_but(&[dead]);
    let outcomes = swarm.run(&live).await;
    assert_all_equal(&outcomes, &live, &swarm.expected(|_| live.clone()));
    for &i in &live {
        let report = &outcome(&outcomes, i).report;
        assert!(report.partitions_kept_local.is_empty());
        assert!(report
            .included
            .iter()
            .all(|inc| !inc.contains(&swarm.id(dead).to_string())));
    }
}

#[tokio::test]
async fn a_partition_whose_holders_both_died_stays_local_and_the_merge_finishes() {
    let swarm = Swarm::new(6, 6, 600);
    let [a, b] = swarm.plan.holders(0);
    let live = swarm.all_but(&[a, b]);
    let orphaned: Vec<u32> = (0..6)
        .filter(|&p| swarm.plan.holders(p) == [a, b])
        .map(|p| p as u32)
        .collect();
    let started = Instant::now();
    let outcomes = swarm.run(&live).await;
    assert!(
        Instant::now() <= swarm.timing.done_by + Duration::from_millis(500),
        "took {:?}",
        started.elapsed()
    );
    for &i in &live {
        let o = outcome(&outcomes, i);
        assert_eq!(o.report.partitions_kept_local, orphaned);
        for p in 0..6 {
            let range = swarm.plan.range(p);
            if orphaned.contains(&(p as u32)) {
                assert_eq!(
                    bits(&o.values[range.clone()]),
                    bits(&swarm.values[i][range])
                );
            } else {
                assert_eq!(bits(&o.values[range]), bits(&swarm.average_of(p, &live)));
            }
        }
    }
}

#[tokio::test]
async fn a_slow_member_is_left_out_and_its_co_holders_still_agree() {
    let swarm = Swarm::new(5, 5, 500);
    let slow = 3;
    swarm.network.slow(swarm.id(slow), Duration::from_secs(10));
    let everyone = swarm.all_but(&[]);
    let outcomes = swarm.run(&everyone).await;
    let without = swarm.all_but(&[slow]);
    // The slow member, too, ends with the common result: it narrowed its own claims to
    // its co-holders' sets and fetched everything else in time.
    assert_all_equal(&outcomes, &everyone, &swarm.expected(|_| without.clone()));
    for &i in &everyone {
        let report = &outcome(&outcomes, i).report;
        assert_eq!(
            report.mismatches, 0,
            "member {i}: holders should agree, not dispute"
        );
        assert!(report
            .included
            .iter()
            .all(|inc| *inc == swarm.ids(without.clone())));
    }
    let holder = swarm.all_but(&[slow])[0];
    assert!(outcome(&outcomes, holder)
        .report
        .unreachable
        .contains(&swarm.id(slow).to_string()));
}

#[tokio::test]
async fn holders_that_fetched_different_sets_converge_on_the_intersection() {
    let swarm = Swarm::new(5, 5, 500);
    let h = swarm.plan.holders(0)[0];
    let c = (0..5)
        .find(|&m| !swarm.plan.holders(0).contains(&m))
        .unwrap();
    // h cannot reach c; c's co-holders and everyone else can.
    swarm.network.cut(swarm.id(h), swarm.id(c));
    let everyone = swarm.all_but(&[]);
    let outcomes = swarm.run(&everyone).await;
    let without_c = swarm.all_but(&[c]);
    let included = |p: usize| {
        if swarm.plan.is_holder(p, h) {
            without_c.clone()
        } else {
            everyone.clone()
        }
    };
    assert_all_equal(&outcomes, &everyone, &swarm.expected(included));
    for &i in &everyone {
        let report = &outcome(&outcomes, i).report;
        assert_eq!(report.mismatches, 0, "member {i} saw a dispute");
        for p in 0..5 {
            assert_eq!(
                report.included[p],
                swarm.ids(included(p)),
                "member {i} partition {p}"
            );
        }
    }
}

#[tokio::test]
async fn an_equivocating_member_is_excluded_and_named() {
    let swarm = Swarm::new(5, 5, 500);
    let liar = 1;
    swarm.network.equivocate(swarm.id(liar));
    let everyone = swarm.all_but(&[]);
    let outcomes = swarm.run(&everyone).await;
    let honest = swarm.all_but(&[liar]);
    assert_all_equal(&outcomes, &honest, &swarm.expected(|_| honest.clone()));
    let named = accused(&outcomes, &honest);
    assert_eq!(
        named,
        BTreeSet::from([(swarm.id(liar).to_string(), MisbehaviourKind::Equivocation)])
    );
    let reports = honest
        .iter()
        .flat_map(|&i| outcome(&outcomes, i).report.misbehaviour.clone())
        .collect::<Vec<_>>();
    assert!(reports
        .iter()
        .all(|m| matches!(m.evidence, Evidence::ServedMismatch { .. })));
    assert!(honest
        .iter()
        .any(|&i| outcome(&outcomes, i).report.mismatches > 0));
}

#[tokio::test]
async fn a_member_claiming_every_sample_weighs_no_more_than_the_cap() {
    let mut swarm = Swarm::new(4, 4, 400);
    let greedy = 2;
    swarm.samples[greedy] = u64::MAX;
    swarm.max_samples = 100;
    let everyone = swarm.all_but(&[]);
    let outcomes = swarm.run(&everyone).await;
    // Every member (the greedy one too) ends with the average in which the claim counts
    // as the cap: 100 against 10, 17 and 31 honest samples, not the whole stage.
    let expected = swarm.expected(|_| everyone.clone());
    assert_all_equal(&outcomes, &everyone, &expected);
    let uncapped_weight = swarm.values[greedy][0];
    assert_ne!(
        bits(&outcome(&outcomes, 0).values[..1]),
        bits(&[uncapped_weight]),
        "the greedy member's values did not replace the stage"
    );
    // Every member names the greedy one as capped, and only it.
    let greedy_id = swarm.plan.member(greedy).to_string();
    for &i in &everyone {
        assert_eq!(
            outcome(&outcomes, i).report.weights_capped,
            vec![greedy_id.clone()],
            "member {i}"
        );
    }
}

#[tokio::test]
async fn a_member_with_non_finite_weights_is_left_out_and_named() {
    let mut swarm = Swarm::new(4, 4, 400);
    let poisoned = 1;
    // One bad value in each partition, so that each partition's holders see it.
    for p in 0..swarm.plan.partitions() {
        let at = swarm.plan.range(p).start + 3;
        swarm.values[poisoned][at] = if p % 2 == 0 { f32::NAN } else { f32::INFINITY };
    }
    let everyone = swarm.all_but(&[]);
    let outcomes = swarm.run(&everyone).await;
    let honest = swarm.all_but(&[poisoned]);
    assert_all_equal(&outcomes, &honest, &swarm.expected(|_| honest.clone()));
    for &i in &honest {
        assert!(outcome(&outcomes, i).values.iter().all(|v| v.is_finite()));
    }
    let named = accused(&outcomes, &honest);
    assert_eq!(
        named,
        BTreeSet::from([(swarm.id(poisoned).to_string(), MisbehaviourKind::NonFinite)])
    );
}

#[tokio::test]
async fn a_member_with_two_commitments_is_excluded_and_named() {
    let swarm = Swarm::new(5, 5, 500);
    let liar = 4;
    let everyone = swarm.all_but(&[]);
    let forged = Gossip::Commitment(Commitment {
        epoch: EPOCH,
        stage: STAGE,
        member: swarm.id(liar).to_string(),
        samples: 1,
        partition_hashes: vec![Hash::default(); 5],
    });
    let run = swarm
        .run_with(&everyone, None, |network| {
            network.inject(swarm.id(liar), forged)
        })
        .await;
    let honest = swarm.all_but(&[liar]);
    assert_all_equal(&run.outcomes, &honest, &swarm.expected(|_| honest.clone()));
    let named = accused(&run.outcomes, &honest);
    assert_eq!(
        named,
        BTreeSet::from([(swarm.id(liar).to_string(), MisbehaviourKind::Equivocation)])
    );
}

#[tokio::test]
async fn a_noisy_holder_is_outvoted_by_recomputation_and_named() {
    let swarm = Swarm::new(5, 5, 500);
    let noisy = 0;
    swarm.network.forge(swarm.id(noisy), None);
    let everyone = swarm.all_but(&[]);
    let outcomes = swarm.run(&everyone).await;
    // Its inputs were honest, so it stays included; its averages are not used.
    assert_all_equal(&outcomes, &everyone, &swarm.expected(|_| everyone.clone()));
    let others = swarm.all_but(&[noisy]);
    for &i in &others {
        let report = &outcome(&outcomes, i).report;
        assert!(
            report.mismatches >= 1,
            "member {i} did not notice the dispute"
        );
        let named: BTreeSet<_> = report
            .misbehaviour
            .iter()
            .map(|m| (m.accused.as_str(), m.kind))
            .collect();
        assert_eq!(
            named,
            BTreeSet::from([(swarm.id(noisy), MisbehaviourKind::WrongAverage)]),
            "member {i}"
        );
    }
}

#[tokio::test]
async fn colluding_holders_pass_the_members_but_not_the_audit() {
    let swarm = Swarm::new(6, 6, 600);
    let q = 2;
    let [a, b] = swarm.plan.holders(q);
    swarm.network.forge(swarm.id(a), Some(&[q as u32]));
    swarm.network.forge(swarm.id(b), Some(&[q as u32]));
    let everyone = swarm.all_but(&[]);
    let run = swarm.run_with(&everyone, Some(1.0), |_| {}).await;
    let bystanders = swarm.all_but(&[a, b]);
    let honest_q = swarm.average_of(q, &everyone);
    let first = outcome(&run.outcomes, bystanders[0]);
    for &i in &bystanders {
        let o = outcome(&run.outcomes, i);
        // The members cannot tell: they took the colluders' bytes and named nobody.
        assert_eq!(bits(&o.values), bits(&first.values));
        assert_ne!(bits(&o.values[swarm.plan.range(q)]), bits(&honest_q));
        assert!(o.report.misbehaviour.is_empty());
    }
    let audit = run.audit.expect("audit ran");
    assert_eq!(audit.audited.len(), 6);
    let named: BTreeSet<(String, MisbehaviourKind)> = audit
        .misbehaviour
        .iter()
        .map(|m| (m.accused.clone(), m.kind))
        .collect();
    let colluders = BTreeSet::from([
        (swarm.id(a).to_string(), MisbehaviourKind::WrongAverage),
        (swarm.id(b).to_string(), MisbehaviourKind::WrongAverage),
    ]);
    assert_eq!(named, colluders);
    assert!(audit.misbehaviour.iter().all(
        |m| matches!(m.evidence, Evidence::WrongAverage { partition, .. } if partition == q as u32)
    ));
}

#[tokio::test]
async fn the_audit_names_poisoned_inputs_and_inflated_sample_counts() {
    let mut swarm = Swarm::new(4, 4, 400);
    let (poisoned, greedy) = (1, 3);
    for p in 0..swarm.plan.partitions() {
        let at = swarm.plan.range(p).start + 3;
        swarm.values[poisoned][at] = f32::NAN;
    }
    swarm.samples[greedy] = u64::MAX;
    swarm.max_samples = 100;
    let everyone = swarm.all_but(&[]);
    // An audit rate of 0 samples no partition: the members' reports of the poisoned input
    // lead the audit to it, and it checks them itself.
    let run = swarm.run_with(&everyone, Some(0.0), |_| {}).await;
    let audit = run.audit.expect("audit ran");
    let named: BTreeSet<(String, MisbehaviourKind)> = audit
        .misbehaviour
        .iter()
        .map(|m| (m.accused.clone(), m.kind))
        .collect();
    assert_eq!(
        named,
        BTreeSet::from([(swarm.id(poisoned).to_string(), MisbehaviourKind::NonFinite)]),
        "the member that committed NaN is named once, with its evidence"
    );
    assert!(audit
        .misbehaviour
        .iter()
        .all(|m| matches!(m.evidence, Evidence::NonFiniteInput { .. })));
    assert_eq!(audit.weights_capped, vec![swarm.id(greedy).to_string()]);
}

#[test]
fn merge_config_is_checked() {
    let members = vec!["a".to_string(), "b".to_string()];
    let plan = Arc::new(plan(1, &members, 2, 4).unwrap());
    let now = Instant::now();
    let config = MergeConfig {
        epoch: 1,
        stage: 0,
        me: "a".into(),
        plan,
        timing: Timing::from_start(now, PHASE, FETCH_TIMEOUT),
        samples: 1,
        max_concurrent_fetches: 1,
        max_samples: u64::MAX,
    };
    let stranger = MergeConfig {
        me: "z".into(),
        ..config.clone()
    };
    assert_eq!(
        Merge::new(stranger, vec![0.0; 4]).unwrap_err(),
        MergeError::NotAMember("z".into())
    );
    assert_eq!(
        Merge::new(config.clone(), vec![0.0; 3]).unwrap_err(),
        MergeError::LengthMismatch {
            expected: 4,
            got: 3
        }
    );
    let no_slots = MergeConfig {
        max_concurrent_fetches: 0,
        max_samples: u64::MAX,
        ..config.clone()
    };
    assert_eq!(
        Merge::new(no_slots, vec![0.0; 4]).unwrap_err(),
        MergeError::NoFetchSlots
    );
    let mut backwards = config.clone();
    backwards.timing.claims_by = backwards.timing.commit_by;
    assert_eq!(
        Merge::new(backwards, vec![0.0; 4]).unwrap_err(),
        MergeError::Deadlines
    );
    assert!(Merge::new(config.clone(), vec![0.0; 4]).is_ok());
    // A plan whose holders were tampered with in transit is refused.
    let mut json = serde_json::to_value(&*config.plan).unwrap();
    json["holders"][0] = serde_json::json!([0, 0]);
    let tampered: Plan = serde_json::from_value(json).unwrap();
    let tampered = MergeConfig {
        plan: Arc::new(tampered),
        ..config
    };
    assert!(matches!(
        Merge::new(tampered, vec![0.0; 4]),
        Err(MergeError::Plan(VerifyError::Holders { partition: 0 }))
    ));
}

/// A swarm of `n` replicas that started from one vector and each moved by its own small
/// step, as replicas of a stage do over an epoch.
fn replica_swarm(n: usize, partitions: usize, len: usize) -> Swarm {
    let mut swarm = Swarm::new(n, partitions, len);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let start: Vec<f32> = (0..len).map(|_| rng.gen_range(-0.1f32..0.1)).collect();
    for values in &mut swarm.values {
        for (v, w) in values.iter_mut().zip(&start) {
            *v = w + rng.gen_range(-0.02f32..0.02);
        }
    }
    swarm
}

#[tokio::test]
async fn a_member_whose_weights_are_scaled_is_left_out_of_every_partition() {
    let mut swarm = replica_swarm(3, 3, 600);
    let poisoner = 1;
    swarm.values[poisoner].iter_mut().for_each(|w| *w *= 10.0);
    swarm.samples[poisoner] = u64::MAX;
    swarm.max_samples = 1000;
    let everyone = swarm.all_but(&[]);
    let honest = swarm.all_but(&[poisoner]);
    let run = swarm.run_with(&everyone, Some(1.0), |_| {}).await;
    // The honest members end with their own average: the poisoner's values weigh nothing.
    let expected = swarm.expected(|_| honest.clone());
    assert_all_equal(&run.outcomes, &honest, &expected);
    // Both honest holders name it, and so does the validator's audit.
    let outlier = (swarm.id(poisoner).to_string(), MisbehaviourKind::Outlier);
    assert!(accused(&run.outcomes, &honest).contains(&outlier));
    let audit = run.audit.expect("audit ran");
    assert!(audit
        .misbehaviour
        .iter()
        .any(|m| (m.accused.clone(), m.kind) == outlier));
}

#[tokio::test]
async fn a_member_with_random_finite_weights_is_left_out_and_named() {
    let mut swarm = replica_swarm(4, 4, 800);
    let poisoner = 3;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    swarm.values[poisoner]
        .iter_mut()
        .for_each(|w| *w = rng.gen_range(-0.1f32..0.1));
    let everyone = swarm.all_but(&[]);
    let honest = swarm.all_but(&[poisoner]);
    let run = swarm.run_with(&everyone, Some(1.0), |_| {}).await;
    let expected = swarm.expected(|_| honest.clone());
    assert_all_equal(&run.outcomes, &honest, &expected);
    let outlier = (swarm.id(poisoner).to_string(), MisbehaviourKind::Outlier);
    assert!(accused(&run.outcomes, &honest).contains(&outlier));
}

#[tokio::test]
async fn a_member_claiming_the_cap_weighs_no_more_than_its_co_replicas() {
    // Two replicas: no majority to name an outlier, but the claim buys no weight.
    let mut swarm = replica_swarm(2, 2, 200);
    swarm.samples = vec![60, 1000];
    swarm.max_samples = 1000;
    let everyone = swarm.all_but(&[]);
    let outcomes = swarm.run(&everyone).await;
    let equal: Vec<f32> = (0..200)
        .map(|j| 0.5 * swarm.values[0][j] + 0.5 * swarm.values[1][j])
        .collect();
    let merged = &outcome(&outcomes, 0).values;
    for (m, e) in merged.iter().zip(&equal) {
        assert!((m - e).abs() < 1e-6, "{m} is not the equal-weight mean {e}");
    }
}
