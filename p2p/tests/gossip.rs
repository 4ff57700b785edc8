//! The receive path of gossip: only verified envelopes are delivered; the rest are rejected
//! and counted.

mod common;

use std::time::Duration;

use common::{config, init_tracing, spawn_node, spawn_node_as, wait_for, TestNode};
use p2p::{identity::Keypair, Config, Envelope, Event, PublishError, Verdict};

const TOPIC: &str = "plans";

async fn two_subscribed_nodes() -> (TestNode, TestNode) {
    let topics = vec![TOPIC.to_owned()];
    let a = spawn_node(Config {
        topics: topics.clone(),
        ..config()
    })
    .await;
    let b = spawn_node(Config {
        topics,
        bootstrap: vec![a.addr.clone()],
        ..config()
    })
    .await;
    (a, b)
}

/// Publishes raw bytes, retrying while no subscriber is known yet.
async fn publish_raw_when_ready(node: &TestNode, data: Vec<u8>) {
    wait_for("a subscribed peer", Duration::from_secs(15), || {
        let data = data.clone();
        async move {
            match node.client.publish_raw(TOPIC, data).await {
                Ok(()) => Ok(()),
                Err(e) if e.is_soft() => Err(e.to_string()),
                Err(e) => panic!("publish_raw failed: {e}"),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_envelope_is_dropped_and_counted_while_a_good_one_is_delivered() {
    init_tracing();
    let (mut a, mut b) = two_subscribed_nodes().await;
    let a_id = a.peer_id();

    // Tampered: a valid envelope by `a` with one payload bit flipped.
    let mut tampered = Envelope::seal(&a.keypair, TOPIC, b"stage 3 to peer x".to_vec())
        .unwrap()
        .encode();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    publish_raw_when_ready(&a, tampered).await;
    // Validly signed, but by a key that is not the gossip source.
    let stranger = Keypair::generate_ed25519();
    let foreign = Envelope::seal(&stranger, TOPIC, b"forged".to_vec())
        .unwrap()
        .encode();
    a.client.publish_raw(TOPIC, foreign).await.unwrap();
    // Not an envelope at all.
    a.client
        .publish_raw(TOPIC, b"garbage".to_vec())
        .await
        .unwrap();
    // And a good one.
    a.client.publish(TOPIC, b"good".to_vec()).await.unwrap();

    let delivered = b
        .next_event(Duration::from_secs(10), |e| match e {
            Event::Gossip {
                author,
                topic,
                data,
                ..
            } => Some((author, topic, data)),
            _ => None,
        })
        .await
        .expect("the good message was not delivered");
    // The first gossip event is the good one: none of the bad ones got through.
    assert_eq!(delivered, (a_id, TOPIC.to_owned(), b"good".to_vec()));
    wait_for("all rejections counted", Duration::from_secs(5), || async {
        let counts = [
            b.metrics.gossip_rejected("bad_signature"),
            b.metrics.gossip_rejected("author_mismatch"),
            b.metrics.gossip_rejected("malformed"),
        ];
        if counts == [1, 1, 1] {
            Ok(())
        } else {
            Err(format!(
                "[bad_signature, author_mismatch, malformed] = {counts:?}"
            ))
        }
    })
    .await;
    assert_eq!(b.metrics.gossip_received(), 1);
    // Envelope failures are rejected by the layer; the good one was accepted by `next_event`.
    assert_eq!(b.metrics.gossip_verdicts(Verdict::Reject), 3);
    assert_eq!(b.metrics.gossip_verdicts(Verdict::Accept), 1);
    // The publisher does not receive its own messages.
    assert_eq!(a.metrics.gossip_received(), 0);
    let _ = &mut a;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_beyond_a_full_event_channel_is_dropped_and_counted() {
    init_tracing();
    let a = spawn_node(Config {
        topics: vec![TOPIC.to_owned()],
        ..config()
    })
    .await;
    let mut b = spawn_node(Config {
        topics: vec![TOPIC.to_owned()],
        bootstrap: vec![a.addr.clone()],
        event_buffer: 2,
        ..config()
    })
    .await;
    // Nobody reads b's events while a publishes.
    publish_raw_when_ready(
        &a,
        Envelope::seal(&a.keypair, TOPIC, b"0".to_vec())
            .unwrap()
            .encode(),
    )
    .await;
    const SENT: u64 = 10;
    for i in 1..SENT {
        a.client
            .publish(TOPIC, i.to_string().into_bytes())
            .await
            .unwrap();
    }
    wait_for("all messages verified", Duration::from_secs(10), || async {
        match b.metrics.gossip_received() {
            SENT => Ok(()),
            n => Err(format!("{n} verified")),
        }
    })
    .await;
    let dropped = b.metrics.events_dropped(p2p::DroppedEvent::Gossip);
    let mut delivered = 0;
    while b
        .next_event(Duration::from_millis(300), |e| match e {
            Event::Gossip { .. } => Some(()),
            _ => None,
        })
        .await
        .is_some()
    {
        delivered += 1;
    }
    assert!(dropped > 0, "nothing dropped with a 2-slot channel");
    assert!(delivered > 0, "nothing delivered");
    assert_eq!(delivered + dropped, SENT);
    // Each dropped message was ignored by the layer, each delivered one accepted by the test.
    assert_eq!(b.metrics.gossip_verdicts(Verdict::Ignore), dropped);
    assert_eq!(b.metrics.gossip_verdicts(Verdict::Accept), delivered);
}

#[tokio::test]
async fn publish_without_peers_is_a_soft_error_and_the_node_goes_on() {
    init_tracing();
    let node = spawn_node(Config {
        topics: vec![TOPIC.to_owned()],
        ..config()
    })
    .await;
    node.client.subscribe("another").await.unwrap();
    let err = node.client.publish(TOPIC, b"x".to_vec()).await.unwrap_err();
    assert!(
        matches!(err, PublishError::NoPeers) && err.is_soft(),
        "{err:?}"
    );
    let err = node
        .client
        .publish(TOPIC, vec![0; p2p::MAX_ENVELOPE_BYTES])
        .await
        .unwrap_err();
    assert!(
        matches!(err, PublishError::TooLarge { .. }) && !err.is_soft(),
        "{err:?}"
    );
    assert!(!node.client.listen_addrs().await.unwrap().is_empty());
}

#[tokio::test]
async fn shutdown_stops_the_event_loop_and_later_calls_fail() {
    init_tracing();
    let node = spawn_node(config()).await;
    let client = node.client.clone();
    node.client.shutdown().await;
    tokio::time::timeout(Duration::from_secs(5), node.task)
        .await
        .expect("event loop did not stop")
        .expect("event loop panicked");
    assert!(matches!(
        client.connected_peers().await,
        Err(p2p::ClientError::EventLoopStopped)
    ));
    assert!(matches!(
        client.publish(TOPIC, vec![1]).await,
        Err(PublishError::EventLoopStopped)
    ));
}

#[tokio::test]
async fn dropping_every_client_stops_the_event_loop() {
    init_tracing();
    let node = spawn_node(config()).await;
    let TestNode { client, task, .. } = node;
    drop(client);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("event loop did not stop")
        .expect("event loop panicked");
}

/// A peer back under the same identity while its old connection to us is still open (a
/// restart we have not noticed yet) learns what we subscribe to, so its gossip reaches us once
/// the old connection is gone. gossipsub alone sends our subscriptions on a peer's first
/// connection only (see `p2p/src/gossip.rs`): the restarted node would never learn that we
/// subscribe, and its publishes would fail with `NoPeers` for as long as it stays connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_back_before_its_old_connection_closed_learns_our_subscriptions() {
    init_tracing();
    let topics = vec![TOPIC.to_owned()];
    let mut b = spawn_node(Config {
        topics: topics.clone(),
        ..config()
    })
    .await;
    let key = Keypair::generate_ed25519();
    let following_b = || Config {
        topics: topics.clone(),
        bootstrap: vec![b.addr.clone()],
        ..config()
    };
    let old = spawn_node_as(key.clone(), following_b()).await;
    publish_when_ready(&old, "the old node knows b subscribes").await;

    // The same identity dials `b` again while the old node is still up, so `b` holds both
    // connections; then the old node goes, as a crashed process's connection does.
    let restarted = spawn_node_as(key.clone(), following_b()).await;
    let b_id = b.peer_id();
    wait_for(
        "the restarted node connects to b",
        Duration::from_secs(10),
        || {
            let client = restarted.client.clone();
            async move {
                let peers = client.connected_peers().await.map_err(|e| e.to_string())?;
                if peers.contains(&b_id) {
                    Ok(())
                } else {
                    Err(format!("connected to {peers:?}"))
                }
            }
        },
    )
    .await;
    old.client.shutdown().await;

    let data = publish_when_ready(&restarted, "the restarted node knows b subscribes").await;
    let author = b
        .next_event(Duration::from_secs(10), |e| match e {
            Event::Gossip {
                author, data: got, ..
            } if got == data => Some(author),
            _ => None,
        })
        .await;
    assert_eq!(author, Some(key.public().to_peer_id()));
}

/// Publishes a new message until one goes out (a subscribed peer is known); returns it.
async fn publish_when_ready(node: &TestNode, what: &str) -> Vec<u8> {
    let mut tries = 0u32;
    wait_for(what, Duration::from_secs(10), || {
        tries += 1;
        let data = format!("{what}, try {tries}").into_bytes();
        let client = node.client.clone();
        async move {
            match client.publish(TOPIC, data.clone()).await {
                Ok(()) => Ok(data),
                Err(e) if e.is_soft() => Err(e.to_string()),
                Err(e) => panic!("publish failed: {e}"),
            }
        }
    })
    .await
}
