//! Inbound request bodies are bounded before they are read: each frame reserves its claimed
//! length against a per-peer and a total byte budget from its prefix, a frame whose
//! reservation fails is refused (its stream reset) and counted, reservations come back when the
//! request is answered or its connection goes, and a connection carries a bounded number of
//! streams.

mod common;

use std::time::Duration;

use common::flood::{self, Flood};
use common::{config, init_tracing, spawn_node, wait_for, TestNode};
use p2p::{identity::Keypair, Config, Event, RequestRefusal};

const MIB: usize = 1 << 20;

/// A victim with 1 MiB frames and the given budgets.
async fn victim(per_peer: u64, total: u64) -> TestNode {
    spawn_node(Config {
        max_frame_bytes: MIB,
        max_request_bytes_per_peer: per_peer,
        max_request_bytes_total: total,
        ..config()
    })
    .await
}

/// Waits until `node` has counted `n` refusals for `reason`.
async fn refusals(node: &TestNode, reason: RequestRefusal, n: u64) {
    wait_for(
        &format!("{n} frames refused for {reason:?}"),
        Duration::from_secs(15),
        || async {
            match node.metrics.rr_requests_refused(reason) {
                got if got >= n => Ok(()),
                got => Err(format!(
                    "{got} refused, {} bytes reserved",
                    node.metrics.rr_request_bytes_reserved()
                )),
            }
        },
    )
    .await;
}

/// Waits until `node` holds exactly `bytes` of reservations.
async fn reserved(node: &TestNode, bytes: u64) {
    wait_for(
        &format!("{bytes} bytes reserved"),
        Duration::from_secs(15),
        || async {
            match node.metrics.rr_request_bytes_reserved() {
                got if got == bytes => Ok(()),
                got => Err(format!("{got} bytes reserved")),
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_past_a_peers_byte_budget_are_refused_before_their_body_and_others_still_get_through(
) {
    init_tracing();
    let node = victim(2 * MIB as u64, 64 * MIB as u64).await;
    // Eight streams each claiming a full frame and sending all of it but a trickle: two fit
    // the peer's budget, six are refused at their prefix.
    let flood = Flood {
        claim: MIB as u64,
        send: MIB / 2,
    };
    let attacker = flood::start(
        node.addr.clone(),
        node.peer_id(),
        8,
        flood,
        Duration::from_secs(60),
    );
    refusals(&node, RequestRefusal::PeerBudget, 6).await;
    reserved(&node, 2 * MIB as u64).await;
    wait_for(
        "the attacker sees six streams reset",
        Duration::from_secs(15),
        || async {
            match attacker.closed() {
                n if n >= 6 => Ok(()),
                n => Err(format!("{n} closed")),
            }
        },
    )
    .await;

    // Another peer's full frame still gets through while the attacker holds its budget.
    let honest = spawn_node(Config {
        bootstrap: vec![node.addr.clone()],
        max_frame_bytes: MIB,
        ..config()
    })
    .await;
    let (victim_id, honest_id) = (node.peer_id(), honest.peer_id());
    let client = honest.client.clone();
    let request = tokio::spawn(async move { client.request(victim_id, vec![7; MIB]).await });
    let mut node = node;
    let id = node
        .next_event(Duration::from_secs(15), |e| match e {
            Event::Request { peer, id, data } if peer == honest_id => {
                assert_eq!(data.len(), MIB);
                Some(id)
            }
            _ => None,
        })
        .await
        .expect("the honest request arrives");
    node.client.respond(id, b"ok".to_vec()).await.unwrap();
    assert_eq!(request.await.unwrap().unwrap(), b"ok");

    // The attacker goes: everything it held comes back.
    drop(attacker);
    reserved(&node, 0).await;
    assert_eq!(
        node.metrics
            .rr_requests_refused(RequestRefusal::TotalBudget),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_past_the_total_byte_budget_are_refused_whoever_sends_them() {
    init_tracing();
    let node = victim(2 * MIB as u64, 3 * MIB as u64).await;
    let (first_key, second_key) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    // Both are the run's members: only the total binds them.
    node.client
        .set_members(vec![
            first_key.public().to_peer_id(),
            second_key.public().to_peer_id(),
        ])
        .await
        .unwrap();
    let flood = Flood {
        claim: MIB as u64,
        send: 1024,
    };
    let hold = Duration::from_secs(60);
    let (addr, id) = (node.addr.clone(), node.peer_id());
    let first = flood::start_as(first_key, addr.clone(), id, 2, flood, hold);
    reserved(&node, 2 * MIB as u64).await;
    // A second peer, within its own budget, finds room for one frame only.
    let second = flood::start_as(second_key, addr, id, 2, flood, hold);
    refusals(&node, RequestRefusal::TotalBudget, 1).await;
    reserved(&node, 3 * MIB as u64).await;
    assert_eq!(
        node.metrics.rr_requests_refused(RequestRefusal::PeerBudget),
        0
    );
    drop((first, second));
    reserved(&node, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_filling_their_share_leave_room_for_the_runs_members() {
    init_tracing();
    let mut node = victim(2 * MIB as u64, 4 * MIB as u64).await;
    let member = spawn_node(Config {
        bootstrap: vec![node.addr.clone()],
        max_frame_bytes: MIB,
        ..config()
    })
    .await;
    let member_id = member.peer_id();
    node.client.set_members(vec![member_id]).await.unwrap();
    // Three strangers, each within its own budget, together claim 6 MiB: their share is half
    // the total, 2 MiB.
    let flood = Flood {
        claim: MIB as u64,
        send: MIB / 2,
    };
    let strangers: Vec<flood::Flooder> = (0..3)
        .map(|_| {
            flood::start(
                node.addr.clone(),
                node.peer_id(),
                2,
                flood,
                Duration::from_secs(60),
            )
        })
        .collect();
    refusals(&node, RequestRefusal::StrangersBudget, 4).await;
    reserved(&node, 2 * MIB as u64).await;

    // The member's full frames still fit, two of them.
    let victim_id = node.peer_id();
    let requests: Vec<_> = (0..2)
        .map(|_| {
            let client = member.client.clone();
            tokio::spawn(async move { client.request(victim_id, vec![3; MIB]).await })
        })
        .collect();
    for _ in 0..2 {
        let id = node
            .next_event(Duration::from_secs(15), |e| match e {
                Event::Request { peer, id, .. } if peer == member_id => Some(id),
                _ => None,
            })
            .await
            .expect("the member's request arrives");
        node.client.respond(id, b"ok".to_vec()).await.unwrap();
    }
    for request in requests {
        assert_eq!(request.await.unwrap().unwrap(), b"ok");
    }
    drop(strangers);
    reserved(&node, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_held_until_the_request_is_answered() {
    init_tracing();
    let mut node = victim(2 * MIB as u64, 64 * MIB as u64).await;
    let honest = spawn_node(Config {
        bootstrap: vec![node.addr.clone()],
        max_frame_bytes: MIB,
        ..config()
    })
    .await;
    let victim_id = node.peer_id();
    let client = honest.client.clone();
    let request = tokio::spawn(async move { client.request(victim_id, vec![1; 3000]).await });
    let id = node
        .next_event(Duration::from_secs(15), |e| match e {
            Event::Request { id, .. } => Some(id),
            _ => None,
        })
        .await
        .expect("the request arrives");
    // Delivered but not answered: its bytes are still held.
    assert_eq!(node.metrics.rr_request_bytes_reserved(), 3000);
    node.client.respond(id, b"done".to_vec()).await.unwrap();
    assert_eq!(request.await.unwrap().unwrap(), b"done");
    reserved(&node, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_per_connection_cap_are_dropped() {
    init_tracing();
    let node = spawn_node(Config {
        max_streams_per_connection: 4,
        ..config()
    })
    .await;
    // Small claims, far within the byte budgets: only the stream cap refuses them.
    let flood = Flood { claim: 64, send: 1 };
    let attacker = flood::start(
        node.addr.clone(),
        node.peer_id(),
        10,
        flood,
        Duration::from_secs(60),
    );
    wait_for("six streams dropped", Duration::from_secs(15), || async {
        match attacker.closed() {
            n if n >= 6 => Ok(()),
            n => Err(format!("{n} closed")),
        }
    })
    .await;
    reserved(&node, 4 * 64).await;
    drop(attacker);
    reserved(&node, 0).await;
}
