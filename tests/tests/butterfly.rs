//! The butterfly all-reduce over real libp2p nodes: in-process `p2p` nodes on 127.0.0.1,
//! each with a pump task that feeds its [`Router`], merging through `iota_p2p::merge`.
//!
//! Faults are injected around the honest protocol, never inside it: a transport wrapper
//! rewrites what a faulty member publishes (forged claims, silence after committing) and
//! the faulty node's pump rewrites what it serves (noisy inputs, forged averages) or shuts
//! the node down on the first request.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "butterfly/harness.rs"]
mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use harness::{
    network, Forgeries, Forging, Mute, Node, Serving, EPOCH, FETCH_TIMEOUT, LEN, PHASE, POLL, STAGE,
};
use iota_p2p::merge::butterfly::{
    weighted_average, AuditReport, Contribution, Evidence, Hash, MergeOutcome, MisbehaviourKind,
    Plan, Request, Response, Timing, Transport,
};
use iota_p2p::merge::{self, AuditParams, Direction, MergeParams, P2pTransport};
use iota_p2p::rpc;
use iota_tests::wait_for;
use p2p::PeerId;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The inputs of one merge among `members`.
struct Inputs {
    plan: Arc<Plan>,
    values: BTreeMap<String, Vec<f32>>,
    samples: BTreeMap<String, u64>,
    timing: Timing,
}

fn random_values(seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..LEN)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

impl Inputs {
    fn new(members: &[&Node], seed: u64) -> Inputs {
        let peers: Vec<PeerId> = members.iter().map(|n| n.peer()).collect();
        let plan = Arc::new(merge::plan_for(seed, STAGE, &peers, LEN).expect("valid plan"));
        let values = members
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id(), random_values(seed * 100 + i as u64)))
            .collect();
        let samples = members
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id(), 10 + 7 * i as u64))
            .collect();
        Inputs {
            plan,
            values,
            samples,
            timing: Timing::from_start(Instant::now(), PHASE, FETCH_TIMEOUT),
        }
    }

    fn params(&self, node: &Node) -> MergeParams {
        MergeParams {
            stage: STAGE,
            epoch: EPOCH,
            plan: Arc::clone(&self.plan),
            timing: self.timing,
            samples: self.samples[&node.id()],
            max_concurrent_fetches: merge::DEFAULT_MAX_CONCURRENT_FETCHES,
            max_samples: u64::MAX,
        }
    }

    /// The weighted average of `included`, computed directly.
    fn expected(&self, included: &[String]) -> Vec<f32> {
        let contributions: Vec<Contribution<'_>> = included
            .iter()
            .map(|id| Contribution {
                member: id,
                samples: self.samples[id],
                values: &self.values[id],
            })
            .collect();
        weighted_average(&contributions).expect("same lengths")
    }

    /// Latest moment any merge or audit may still be running.
    fn limit(&self) -> Instant {
        self.timing.done_by + 4 * FETCH_TIMEOUT + Duration::from_secs(2)
    }
}

type MergeTask = JoinHandle<MergeOutcome>;

/// `node` merges over the plain libp2p transport.
fn start_merge(node: &Node, inputs: &Inputs) -> MergeTask {
    let (client, router) = (node.client.clone(), node.router.clone());
    let (params, values) = (inputs.params(node), inputs.values[&node.id()].clone());
    tokio::spawn(async move {
        merge::merge(&client, &router, params, values)
            .await
            .expect("merge starts")
    })
}

/// `node` merges over `wrap(its libp2p transport)`.
fn start_merge_over<T: Transport>(
    node: &Node,
    inputs: &Inputs,
    wrap: impl FnOnce(P2pTransport) -> T + Send + 'static,
) -> MergeTask {
    let (client, router) = (node.client.clone(), node.router.clone());
    let (params, values) = (inputs.params(node), inputs.values[&node.id()].clone());
    tokio::spawn(async move {
        let transport = P2pTransport::open(client.clone(), &router, STAGE, EPOCH)
            .await
            .expect("transport opens");
        let me = client.local_peer_id().to_string();
        merge::merge_over(&router, me, params, values, Arc::new(wrap(transport)))
            .await
            .expect("merge starts")
    })
}

async fn finish<T>(task: JoinHandle<T>, limit: Instant) -> T {
    tokio::time::timeout_at(limit, task)
        .await
        .expect("finished by its deadline")
        .expect("task did not panic")
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Panics, saying where and how much, unless `got` has exactly the bits of `want`.
fn assert_same(got: &[f32], want: &[f32], plan: &Plan, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let differing: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    let partitions: BTreeSet<usize> = differing
        .iter()
        .filter_map(|&i| (0..plan.partitions()).find(|&p| plan.range(p).contains(&i)))
        .collect();
    assert!(
        differing.is_empty(),
        "{what}: {} values differ, in partitions {partitions:?}; first at {}: {} vs {}",
        differing.len(),
        differing[0],
        got[differing[0]],
        want[differing[0]]
    );
}

fn ids(nodes: &[&Node]) -> Vec<String> {
    let mut ids: Vec<String> = nodes.iter().map(|n| n.id()).collect();
    ids.sort();
    ids
}

fn named(outcome: &MergeOutcome) -> BTreeSet<(String, MisbehaviourKind)> {
    outcome
        .report
        .misbehaviour
        .iter()
        .map(|m| (m.accused.clone(), m.kind))
        .collect()
}

/// Waits until `node` has received at least `count` reports of `kind` over gossip.
async fn wait_for_received(node: &Node, kind: MisbehaviourKind, count: u64) {
    wait_for(
        "misbehaviour reports received",
        Duration::from_secs(10),
        POLL,
        || async {
            let got = node
                .metrics()
                .misbehaviour_reports(Direction::Received, kind);
            Ok((
                got >= count,
                format!("{} received {got} of {count}", node.peer()),
            ))
        },
    )
    .await
    .expect("reports arrive over gossip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_honest_members_end_with_the_same_weighted_average_over_libp2p() {
    let nodes = network(vec![Serving::Honest; 4]).await;
    let members: Vec<&Node> = nodes.iter().collect();
    let inputs = Inputs::new(&members, 11);
    let tasks: Vec<MergeTask> = members.iter().map(|n| start_merge(n, &inputs)).collect();
    let everyone = ids(&members);
    let expected = inputs.expected(&everyone);
    for (node, task) in members.iter().zip(tasks) {
        let outcome = finish(task, inputs.limit()).await;
        let report = &outcome.report;
        assert_same(
            &outcome.values,
            &expected,
            &inputs.plan,
            &format!("{} {:?}", node.peer(), outcome.report),
        );
        assert_eq!(report.result_hash, Hash::of_values(&expected));
        assert!(report.included.iter().all(|inc| *inc == everyone));
        assert!(report.partitions_kept_local.is_empty() && report.misbehaviour.is_empty());
        assert_eq!(report.mismatches, 0);
        // The node's counters saw at least what the merge itself counted.
        let metrics = node.metrics();
        assert!(report.bytes_received > 4 * LEN as u64 / 2);
        assert!(metrics.bytes_received() >= report.bytes_received);
        assert!(metrics.bytes_sent() >= report.bytes_sent && report.bytes_sent > 0);
        assert_eq!(metrics.mismatches(), 0);
    }

    // The request-response protocol is shared: other tags are refused, not dropped.
    let (a, b) = (&nodes[0], nodes[1].peer());
    let ask = |data: Vec<u8>| async move { a.client.request(b, data).await.expect("answered") };
    let unknown = ask(rpc::frame(0xF7, b"?")).await;
    assert_eq!(
        rpc::open_response(&unknown, rpc::BUTTERFLY)
            .unwrap_err()
            .code(),
        Some(rpc::ErrorCode::UnknownService)
    );
    let malformed = ask(rpc::frame(rpc::BUTTERFLY, b"\x01\x07")).await;
    assert_eq!(
        rpc::open_response(&malformed, rpc::BUTTERFLY)
            .unwrap_err()
            .code(),
        Some(rpc::ErrorCode::Malformed)
    );
    // The server outlives its merge, and answers only for its own merge.
    for (epoch, served) in [(EPOCH, true), (EPOCH + 1, false)] {
        let request = Request::Input {
            epoch,
            stage: STAGE,
            partition: 0,
        };
        let answer = ask(rpc::frame(rpc::BUTTERFLY, &request.encode())).await;
        let response = Response::decode(rpc::open_response(&answer, rpc::BUTTERFLY).unwrap());
        assert_eq!(
            matches!(response, Ok(Response::Values(_))),
            served,
            "epoch {epoch}: {response:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_answering_is_left_out_and_its_partitions_come_from_the_co_holder() {
    let mut servings = vec![Serving::Honest; 3];
    servings.push(Serving::DieOnFirstRequest);
    let nodes = network(servings).await;
    let members: Vec<&Node> = nodes.iter().collect();
    let inputs = Inputs::new(&members, 12);
    let victim = &nodes[3];
    let victim_index = inputs.plan.index_of(&victim.id()).expect("a member");
    assert!(
        !inputs.plan.held_by(victim_index).is_empty(),
        "the victim is a holder"
    );
    let live: Vec<&Node> = nodes[..3].iter().collect();
    let tasks: Vec<MergeTask> = live.iter().map(|n| start_merge(n, &inputs)).collect();
    let victim_task = start_merge_over(victim, &inputs, Mute);

    let live_ids = ids(&live);
    let expected = inputs.expected(&live_ids);
    let mut unreachable = BTreeSet::new();
    for (node, task) in live.iter().zip(tasks) {
        let outcome = finish(task, inputs.limit()).await;
        let report = &outcome.report;
        assert_same(
            &outcome.values,
            &expected,
            &inputs.plan,
            &format!("{} {:?}", node.peer(), outcome.report),
        );
        // Both holders of every partition left the victim out, and its partitions came
        // from their other holder.
        assert!(report.included.iter().all(|inc| *inc == live_ids));
        assert!(report.partitions_kept_local.is_empty());
        assert!(report.misbehaviour.is_empty(), "silence is not provable");
        unreachable.extend(report.unreachable.iter().cloned());
    }
    assert_eq!(unreachable, BTreeSet::from([victim.id()]));
    wait_for(
        "the victim's node to stop",
        Duration::from_secs(5),
        POLL,
        || async {
            Ok((
                victim.event_loop.is_finished(),
                String::from("still running"),
            ))
        },
    )
    .await
    .expect("the victim shut down on the first request");
    victim_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_holder_is_outvoted_named_over_gossip_and_counted() {
    let forgeries = Forgeries::default();
    let mut servings = vec![Serving::Honest; 3];
    servings.push(Serving::Forge(Arc::clone(&forgeries)));
    let nodes = network(servings).await;
    let members: Vec<&Node> = nodes.iter().collect();
    let inputs = Inputs::new(&members, 13);
    let noisy = &nodes[3];
    let honest: Vec<&Node> = nodes[..3].iter().collect();
    let mut tasks: Vec<MergeTask> = honest.iter().map(|n| start_merge(n, &inputs)).collect();
    let router = noisy.router.clone();
    tasks.push(start_merge_over(noisy, &inputs, move |inner| Forging {
        inner,
        router,
        partitions: None,
        forgeries,
    }));

    // Its inputs were honest, so it stays included; its averages are not used.
    let expected = inputs.expected(&ids(&members));
    for (node, task) in members.iter().zip(tasks) {
        let outcome = finish(task, inputs.limit()).await;
        assert_same(
            &outcome.values,
            &expected,
            &inputs.plan,
            &format!("{} {:?}", node.peer(), outcome.report),
        );
        assert_eq!(node.metrics().mismatches(), outcome.report.mismatches);
        if node.peer() == noisy.peer() {
            continue;
        }
        assert!(
            outcome.report.mismatches >= 1,
            "{} saw no dispute",
            node.peer()
        );
        assert_eq!(
            named(&outcome),
            BTreeSet::from([(noisy.id(), MisbehaviourKind::WrongAverage)])
        );
        assert_eq!(
            node.metrics()
                .misbehaviour_reports(Direction::Published, MisbehaviourKind::WrongAverage),
            1
        );
    }
    // Every node hears the other honest members' reports.
    for node in &members {
        let others = if node.peer() == noisy.peer() { 3 } else { 2 };
        wait_for_received(node, MisbehaviourKind::WrongAverage, others).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equivocating_member_is_excluded_and_named() {
    let mut servings = vec![Serving::Honest; 3];
    servings.push(Serving::Equivocate);
    let nodes = network(servings).await;
    let members: Vec<&Node> = nodes.iter().collect();
    let inputs = Inputs::new(&members, 14);
    let liar = &nodes[3];
    let tasks: Vec<MergeTask> = members.iter().map(|n| start_merge(n, &inputs)).collect();
    let honest: Vec<&Node> = nodes[..3].iter().collect();
    let honest_ids = ids(&honest);
    let expected = inputs.expected(&honest_ids);
    let mut accused = BTreeSet::new();
    let mut mismatches = 0;
    for (node, task) in members.iter().zip(tasks) {
        let outcome = finish(task, inputs.limit()).await;
        if node.peer() == liar.peer() {
            continue;
        }
        assert_same(
            &outcome.values,
            &expected,
            &inputs.plan,
            &format!("{} {:?}", node.peer(), outcome.report),
        );
        assert!(outcome.report.included.iter().all(|inc| *inc == honest_ids));
        assert!(outcome
            .report
            .misbehaviour
            .iter()
            .all(|m| matches!(m.evidence, Evidence::ServedMismatch { .. })));
        accused.extend(named(&outcome));
        mismatches += node.metrics().mismatches();
    }
    assert_eq!(
        accused,
        BTreeSet::from([(liar.id(), MisbehaviourKind::Equivocation)])
    );
    assert!(mismatches > 0);
    let published: u64 = honest
        .iter()
        .map(|n| {
            n.metrics()
                .misbehaviour_reports(Direction::Published, MisbehaviourKind::Equivocation)
        })
        .sum();
    assert!(published >= 1);
    wait_for_received(liar, MisbehaviourKind::Equivocation, published).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colluding_holders_pass_the_members_but_not_a_validators_audit() {
    let maps: Vec<Forgeries> = (0..4).map(|_| Forgeries::default()).collect();
    let mut servings: Vec<Serving> = maps.iter().cloned().map(Serving::Forge).collect();
    servings.push(Serving::Honest);
    let nodes = network(servings).await;
    let members: Vec<&Node> = nodes[..4].iter().collect();
    let validator = &nodes[4];
    let inputs = Inputs::new(&members, 15);
    let q = 0u32;
    let colluders: BTreeSet<String> = inputs
        .plan
        .holders(q as usize)
        .iter()
        .map(|&i| inputs.plan.member(i).to_string())
        .collect();
    let tasks: Vec<MergeTask> = members
        .iter()
        .zip(&maps)
        .map(|(node, map)| {
            if !colluders.contains(&node.id()) {
                return start_merge(node, &inputs);
            }
            let (router, forgeries) = (node.router.clone(), Arc::clone(map));
            start_merge_over(node, &inputs, move |inner| Forging {
                inner,
                router,
                partitions: Some(BTreeSet::from([q])),
                forgeries,
            })
        })
        .collect();
    let params = AuditParams {
        stage: STAGE,
        epoch: EPOCH,
        plan: Arc::clone(&inputs.plan),
        timing: inputs.timing,
        rate: 1.0,
        seed: 99,
        max_concurrent_fetches: merge::DEFAULT_MAX_CONCURRENT_FETCHES,
        max_samples: u64::MAX,
    };
    let (client, router) = (validator.client.clone(), validator.router.clone());
    let auditor: JoinHandle<AuditReport> = tokio::spawn(async move {
        merge::audit(&client, &router, params)
            .await
            .expect("audit starts")
    });

    let honest_q = inputs.expected(&ids(&members))[inputs.plan.range(q as usize)].to_vec();
    let mut bystander_values = Vec::new();
    for (node, task) in members.iter().zip(tasks) {
        let outcome = finish(task, inputs.limit()).await;
        if colluders.contains(&node.id()) {
            continue;
        }
        // The members cannot tell: the claims agree, so they take the colluders' bytes
        // and name nobody.
        assert_ne!(
            bits(&outcome.values[inputs.plan.range(q as usize)]),
            bits(&honest_q)
        );
        assert!(outcome.report.misbehaviour.is_empty() && outcome.report.mismatches == 0);
        bystander_values.push(bits(&outcome.values));
    }
    assert!(bystander_values.windows(2).all(|w| w[0] == w[1]));

    let audit = finish(auditor, inputs.limit()).await;
    let all: Vec<u32> = (0..inputs.plan.partitions() as u32).collect();
    assert_eq!(audit.audited, all, "rate 1.0 recomputes every partition");
    let named: BTreeSet<(String, MisbehaviourKind)> = audit
        .misbehaviour
        .iter()
        .map(|m| (m.accused.clone(), m.kind))
        .collect();
    let expected: BTreeSet<(String, MisbehaviourKind)> = colluders
        .iter()
        .map(|c| (c.clone(), MisbehaviourKind::WrongAverage))
        .collect();
    assert_eq!(named, expected);
    assert!(audit
        .misbehaviour
        .iter()
        .all(|m| matches!(m.evidence, Evidence::WrongAverage { partition, .. } if partition == q)));
    assert_eq!(
        validator
            .metrics()
            .misbehaviour_reports(Direction::Published, MisbehaviourKind::WrongAverage),
        2
    );
    for node in &members {
        wait_for_received(node, MisbehaviourKind::WrongAverage, 2).await;
    }
}
