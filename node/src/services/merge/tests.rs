//! Unit tests of the shell without a network: routing of gossip and requests, the bounds
//! of the router's buffers, partition counts, plans and timings.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use p2p::{identity::Keypair, PeerId};
use tokio::time::Instant;
use training::butterfly::{
    Commitment, Evidence, Gossip, Hash, Merge, MergeConfig, Misbehaviour, MisbehaviourKind,
    Request, Response, Timing, Unavailable,
};

use super::*;
use crate::wire::rpc;

const RUN: &str = "r1";

fn peer() -> PeerId {
    Keypair::generate_ed25519().public().to_peer_id()
}

fn commitment(author: &PeerId, stage: u32, epoch: u64) -> Vec<u8> {
    Gossip::Commitment(Commitment {
        epoch,
        stage,
        member: author.to_string(),
        samples: 3,
        partition_hashes: vec![Hash::default(); 2],
    })
    .encode()
}

fn router() -> Router {
    Router::new(RUN, Metrics::unregistered())
}

async fn next(feed: &mut Feed) -> Option<Gossip> {
    tokio::time::timeout(Duration::from_millis(100), feed.recv())
        .await
        .ok()
        .flatten()
        .map(|r| r.message)
}

#[tokio::test]
async fn gossip_on_the_stage_topic_reaches_the_merge_even_before_it_opens() {
    let router = router();
    let a = peer();
    let early = commitment(&a, 2, 7);
    assert!(router.on_gossip(&a, &topic(RUN, 2), &early));
    let mut feed = router.open_feed(2, 7).unwrap();
    assert_eq!(next(&mut feed).await.map(|g| g.encode()), Some(early));
    let b = peer();
    assert!(router.on_gossip(&b, &topic(RUN, 2), &commitment(&b, 2, 7)));
    let got = next(&mut feed).await.expect("delivered to the open feed");
    assert_eq!(got.author(), b.to_string());
    assert_eq!(
        router.open_feed(2, 7).unwrap_err(),
        FeedError::AlreadyOpen { stage: 2, epoch: 7 }
    );
    assert!(router.metrics().bytes_received() > 0);
}

#[tokio::test]
async fn foreign_topics_are_left_alone_and_bad_gossip_is_consumed_but_not_delivered() {
    let router = router();
    let a = peer();
    let good = commitment(&a, 2, 7);
    for other in [
        "iota/r1/plan/2".to_string(),
        topic("r2", 2),
        "iota/r1/butterfly/+2/1".to_string(),
        "iota/r1/butterfly//1".to_string(),
        "iota/r1/butterfly/2/2".to_string(),
    ] {
        assert!(!router.on_gossip(&a, &other, &good), "{other}");
    }
    let mut feed = router.open_feed(2, 7).unwrap();
    // Undecodable, signed by someone else than its author, or on another stage's topic.
    assert!(router.on_gossip(&a, &topic(RUN, 2), b"\x01garbage"));
    assert!(router.on_gossip(&peer(), &topic(RUN, 2), &good));
    assert!(router.on_gossip(&a, &topic(RUN, 3), &good));
    assert_eq!(next(&mut feed).await, None);
    // A closed feed's late gossip is dropped, not kept.
    drop(feed);
    assert!(router.on_gossip(&a, &topic(RUN, 2), &good));
    let mut reopened = router.open_feed(2, 7).unwrap();
    assert_eq!(next(&mut reopened).await, None);
}

#[tokio::test]
async fn pending_gossip_is_bounded_and_the_lowest_epochs_win() {
    let router = router();
    let a = peer();
    // A flood of far-future epochs fills the slots...
    for epoch in 1000..1000 + PENDING_MERGES as u64 + 3 {
        router.on_gossip(&a, &topic(RUN, 0), &commitment(&a, 0, epoch));
    }
    // ...and the next real merge still gets its gossip kept.
    router.on_gossip(&a, &topic(RUN, 0), &commitment(&a, 0, 5));
    let mut feed = router.open_feed(0, 5).unwrap();
    assert!(next(&mut feed).await.is_some());
    // Opening epoch 5 dropped what was kept for older epochs of the stage, none here; the
    // far-future epochs beyond the slots were never kept.
    let mut last = router
        .open_feed(0, 1000 + PENDING_MERGES as u64 + 2)
        .unwrap();
    assert_eq!(next(&mut last).await, None);
    // Per merge, at most PENDING_PER_MERGE messages are kept.
    let b = peer();
    let report = |i: u32| {
        Gossip::Misbehaviour(Misbehaviour {
            epoch: 9,
            stage: 0,
            reporter: b.to_string(),
            accused: a.to_string(),
            kind: MisbehaviourKind::WrongAverage,
            evidence: Evidence::WrongAverage {
                partition: i,
                round: 0,
                claimed: Hash::default(),
                recomputed: Hash::default(),
            },
        })
        .encode()
    };
    for i in 0..PENDING_PER_MERGE as u32 + 10 {
        router.on_gossip(&b, &topic(RUN, 0), &report(i));
    }
    assert_eq!(
        router
            .metrics()
            .misbehaviour_reports(Direction::Received, MisbehaviourKind::WrongAverage),
        PENDING_PER_MERGE as u64 + 10
    );
    let mut feed = router.open_feed(0, 9).unwrap();
    let mut delivered = 0;
    while next(&mut feed).await.is_some() {
        delivered += 1;
    }
    assert_eq!(delivered, PENDING_PER_MERGE);
}

fn server_for(epoch: u64, values: Vec<f32>) -> (Merge, Arc<butterfly::Plan>) {
    let members = vec![peer(), peer()];
    let plan = Arc::new(plan_for(1, 0, &members, values.len()).unwrap());
    let config = MergeConfig {
        epoch,
        stage: 0,
        me: plan.member(0).to_string(),
        plan: Arc::clone(&plan),
        timing: Timing::from_start(
            Instant::now(),
            Duration::from_secs(1),
            Duration::from_secs(1),
        ),
        samples: 1,
        max_concurrent_fetches: 1,
        max_samples: u64::MAX,
    };
    (Merge::new(config, values).unwrap(), plan)
}

fn ask(router: &Router, request: &Request) -> Option<Result<Response, rpc::ResponseError>> {
    let framed = rpc::frame(rpc::BUTTERFLY, &request.encode());
    router.on_request(&peer(), &framed).map(|answer| {
        rpc::open_response(&answer, rpc::BUTTERFLY).map(|p| Response::decode(p).unwrap())
    })
}

#[tokio::test]
async fn requests_are_answered_by_the_servers_of_the_last_merges() {
    let router = router();
    let input = |epoch| Request::Input {
        epoch,
        stage: 0,
        partition: 0,
    };
    assert_eq!(
        ask(&router, &input(1)),
        Some(Ok(Response::Unavailable(Unavailable::WrongMerge)))
    );
    let values: Vec<f32> = (0..10).map(|i| i as f32).collect();
    for epoch in 1..=KEPT_SERVERS as u64 + 1 {
        let (merge, plan) = server_for(epoch, values.clone());
        router.register_server(0, epoch, merge.server());
        let expected = values[plan.range(0)].to_vec();
        assert_eq!(
            ask(&router, &input(epoch)),
            Some(Ok(Response::Values(expected)))
        );
    }
    assert!(!router.serves(0, 1), "the oldest server was dropped");
    assert!((2..=KEPT_SERVERS as u64 + 1).all(|e| router.serves(0, e)));
    assert!(router.unregister_server(0, 2) && !router.unregister_server(0, 2));
    assert_eq!(
        ask(&router, &input(2)),
        Some(Ok(Response::Unavailable(Unavailable::WrongMerge)))
    );
    // Other services' tags are left to them; a butterfly frame that does not parse is
    // refused as malformed.
    assert_eq!(router.on_request(&peer(), &rpc::frame(0x02, b"x")), None);
    assert_eq!(router.on_request(&peer(), b""), None);
    let refused = router
        .on_request(&peer(), &rpc::frame(rpc::BUTTERFLY, b"\x01\x09"))
        .expect("a butterfly frame is answered");
    assert_eq!(
        rpc::open_response(&refused, rpc::BUTTERFLY)
            .unwrap_err()
            .code(),
        Some(rpc::ErrorCode::Malformed)
    );
    assert!(router.metrics().bytes_sent() > 0 && router.metrics().bytes_received() > 0);
}

#[test]
fn partition_counts_balance_the_plan_and_bound_the_partition_size() {
    const MIB: usize = 1 << 20;
    for n in [2usize, 3, 4, 8, 16, 17] {
        for len in [1000usize, MIB, 16 * MIB, 64 * MIB / 4 * 4] {
            let p = partitions_for(n, len, 16 * MIB);
            let unit = if n % 2 == 0 { n / 2 } else { n };
            assert_eq!(p % unit, 0, "n={n} len={len}: {p}");
            assert!(len.div_ceil(p) * 4 <= 16 * MIB, "n={n} len={len}: {p}");
            // The smallest such count.
            assert!(p == unit || len.div_ceil(p - unit) * 4 > 16 * MIB);
        }
    }
    assert_eq!(
        partitions_for(16, 3, 16 * MIB),
        3,
        "never more than the values"
    );
    assert_eq!(partitions_for(1, 10, 16 * MIB), 1);
    assert_eq!(partitions_for(0, 0, 16 * MIB), 1);
    assert_eq!(
        partitions_for(4, 1 << 40, 16 * MIB),
        butterfly::MAX_PARTITIONS
    );
}

#[test]
fn every_node_derives_the_same_plan_and_stages_pair_differently() {
    let members: Vec<PeerId> = (0..8).map(|_| peer()).collect();
    let mut shuffled = members.clone();
    shuffled.reverse();
    let a = plan_for(42, 1, &members, 4096).unwrap();
    assert_eq!(a, plan_for(42, 1, &shuffled, 4096).unwrap());
    butterfly::verify(&a).unwrap();
    let holders = |p: &butterfly::Plan| {
        (0..p.partitions())
            .map(|i| p.holders(i))
            .collect::<Vec<_>>()
    };
    let other_stages: Vec<_> = (2..6)
        .map(|s| holders(&plan_for(42, s, &members, 4096).unwrap()))
        .collect();
    assert!(other_stages.iter().any(|h| *h != holders(&a)));
    assert_ne!(mix(1), mix(2));
}

#[test]
fn timings_follow_the_wall_clock_schedule() {
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let mono = Instant::now();
    let phase = Duration::from_secs(2);
    let ahead = timing_at(wall + Duration::from_secs(3), phase, phase, (wall, mono));
    assert_eq!(ahead.commit_by, mono + Duration::from_secs(5));
    assert_eq!(ahead.done_by, mono + Duration::from_secs(13));
    let behind = timing_at(wall - Duration::from_secs(1), phase, phase, (wall, mono));
    assert_eq!(behind.commit_by, mono + Duration::from_secs(1));
}

#[test]
fn gossip_kept_before_a_merge_opens_is_bounded_in_bytes() {
    let router = router();
    let a = peer();
    // Large, distinct commitments for merges not yet open: far more than the byte bound.
    let large = |epoch: u64, salt: u8| {
        Gossip::Commitment(Commitment {
            epoch,
            stage: 2,
            member: a.to_string(),
            samples: 3,
            partition_hashes: vec![Hash::of_bytes(&[salt]); 1000],
        })
        .encode()
    };
    assert!(large(7, 0).len() > 30 * 1024);
    let mut delivered = 0;
    for i in 0..2000u32 {
        let bytes = large(7 + u64::from(i % 3), (i % 251) as u8);
        if router.route_gossip(&a, &topic(RUN, 2), &bytes) == Routed::Delivered {
            delivered += 1;
        }
    }
    assert_eq!(delivered, 2000, "each message was valid and routed");
    let (total, kept) = router.pending_bytes();
    assert!(total <= PENDING_BYTES, "{total} bytes kept");
    assert!(
        total > PENDING_BYTES / 2,
        "the bound, not something else, stopped it"
    );
    assert_eq!(kept, total);
}
