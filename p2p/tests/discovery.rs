//! Discovery: nodes that only know node 0 find each other; unreachable bootstrap peers are
//! retried while the node keeps working.

mod common;

use std::{collections::HashSet, time::Duration};

use common::{config, init_tracing, spawn_node, wait_for, TestNode};
use p2p::{Config, Event, PeerId};

const TOPIC: &str = "swarm-test";

fn gossip_from(author: PeerId) -> impl FnMut(Event) -> Option<Vec<u8>> {
    move |event| match event {
        Event::Gossip {
            author: a,
            topic,
            data,
            ..
        } if a == author && topic == TOPIC => Some(data),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_bootstrapping_from_node_zero_find_each_other_and_gossip_reaches_all() {
    init_tracing();
    let topics = vec![TOPIC.to_owned()];
    let mut nodes: Vec<TestNode> = vec![
        spawn_node(Config {
            topics: topics.clone(),
            ..config()
        })
        .await,
    ];
    let bootstrap = vec![nodes[0].addr.clone()];
    for _ in 1..5 {
        nodes.push(
            spawn_node(Config {
                topics: topics.clone(),
                bootstrap: bootstrap.clone(),
                ..config()
            })
            .await,
        );
    }
    let ids: Vec<PeerId> = nodes.iter().map(TestNode::peer_id).collect();

    // Every node has every other node in its routing table and is connected to it.
    wait_for("full routing tables", Duration::from_secs(30), || async {
        let mut report = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let table: HashSet<PeerId> = node
                .client
                .routing_table_peers()
                .await
                .unwrap()
                .into_iter()
                .collect();
            let connected: HashSet<PeerId> = node
                .client
                .connected_peers()
                .await
                .unwrap()
                .into_iter()
                .collect();
            let others = ids.iter().filter(|p| **p != ids[i]);
            let missing_table = others.clone().filter(|p| !table.contains(p)).count();
            let missing_conn = others.filter(|p| !connected.contains(p)).count();
            if missing_table + missing_conn > 0 {
                report.push(format!(
                    "node {i}: {missing_table} missing in table, {missing_conn} not connected"
                ));
            }
        }
        if report.is_empty() {
            Ok(())
        } else {
            Err(report.join("; "))
        }
    })
    .await;

    // Warm-up: publish until every node has seen something from the last node (gossipsub
    // needs the subscriptions exchanged first).
    let last = ids[4];
    let mut seen = [false; 4];
    for round in 0..60u32 {
        match nodes[4]
            .client
            .publish(TOPIC, format!("warm-up {round}").into_bytes())
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_soft() => {}
            Err(e) => panic!("publish failed: {e}"),
        }
        for (i, node) in nodes[..4].iter_mut().enumerate() {
            if !seen[i] {
                seen[i] = node
                    .next_event(Duration::from_millis(250), gossip_from(last))
                    .await
                    .is_some();
            }
        }
        if seen.iter().all(|s| *s) {
            break;
        }
    }
    assert!(
        seen.iter().all(|s| *s),
        "warm-up gossip did not reach all: {seen:?}"
    );

    // One message, published once, reaches every other node.
    let payload = b"from the last node".to_vec();
    nodes[4]
        .client
        .publish(TOPIC, payload.clone())
        .await
        .unwrap();
    for (i, node) in nodes[..4].iter_mut().enumerate() {
        let got = node
            .next_event(Duration::from_secs(10), |e| {
                gossip_from(last)(e).filter(|d| *d == payload)
            })
            .await;
        assert!(got.is_some(), "node {i} did not receive the message");
        assert!(node.metrics.gossip_received() >= 2);
    }
    for node in &nodes {
        assert_eq!(node.metrics.gossip_rejected("bad_signature"), 0);
        node.client.shutdown().await;
    }
    for node in nodes {
        tokio::time::timeout(Duration::from_secs(5), node.task)
            .await
            .expect("event loop did not stop")
            .expect("event loop panicked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_bootstrap_is_retried_and_the_node_keeps_answering() {
    init_tracing();
    // A port that was just free on 127.0.0.1 and is now closed.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let ghost = PeerId::random();
    let bootstrap = format!("/ip4/127.0.0.1/tcp/{port}/p2p/{ghost}")
        .parse()
        .unwrap();
    let mut node = spawn_node(Config {
        bootstrap: vec![bootstrap],
        ..config()
    })
    .await;

    // First dial at start, retries 1 s and then 2 s later: three failures take at least 3 s
    // if (and only if) the retries back off.
    let started = std::time::Instant::now();
    wait_for(
        "three failed bootstrap dials",
        Duration::from_secs(10),
        || async {
            match node.metrics.bootstrap_dial_failures() {
                n if n >= 3 => Ok(n),
                n => Err(format!("{n} failures")),
            }
        },
    )
    .await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(2900),
        "retried too fast: {elapsed:?}"
    );
    assert!(!node.task.is_finished());

    // Still answering calls, and still usable by other nodes.
    assert!(!node.client.listen_addrs().await.unwrap().is_empty());
    assert!(node.client.connected_peers().await.unwrap().is_empty());
    let mut other = spawn_node(config()).await;
    other.client.dial(node.addr.clone()).await.unwrap();
    let node_id = node.peer_id();
    let connected = other
        .next_event(Duration::from_secs(10), |e| match e {
            Event::PeerConnected(p) if p == node_id => Some(()),
            _ => None,
        })
        .await;
    assert!(connected.is_some(), "a healthy peer could not connect");
    let _ = &mut node;
}

#[tokio::test]
async fn bootstrap_address_without_peer_id_is_refused() {
    let err = p2p::spawn(
        p2p::identity::Keypair::generate_ed25519(),
        Config {
            bootstrap: vec!["/ip4/127.0.0.1/tcp/1".parse().unwrap()],
            ..config()
        },
        p2p::Metrics::unregistered(),
    )
    .unwrap_err();
    assert!(matches!(err, p2p::SpawnError::BootstrapWithoutPeerId(_)));
}

/// A public node (here: one given an external address) keeps only global addresses of its
/// peers: the loopback addresses its bootstrap peer advertises and the DHT hands out are
/// refused and counted, and it never dials a peer it knows only by such an address, while a
/// local node next to it finds that peer. Everything listens on 127.0.0.1; the external
/// address is a loopback port nobody listens on, so whoever dials it dials this host only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_node_refuses_private_addresses_and_never_dials_them() {
    init_tracing();
    let hub = spawn_node(config()).await;
    let bootstrap = vec![hub.addr.clone()];
    let spoke = spawn_node(Config {
        bootstrap: bootstrap.clone(),
        ..config()
    })
    .await;
    let public = spawn_node(Config {
        bootstrap: bootstrap.clone(),
        external: vec!["/ip4/127.0.0.1/tcp/9".parse().unwrap()],
        ..config()
    })
    .await;
    let control = spawn_node(Config {
        bootstrap,
        ..config()
    })
    .await;
    let spoke_id = spoke.peer_id();
    let connected_to = |node: &TestNode, peer: PeerId| {
        let client = node.client.clone();
        async move { client.connected_peers().await.unwrap().contains(&peer) }
    };

    // The local control node, which learns of the spoke the same way, connects to it.
    wait_for(
        "the control node finds the spoke",
        Duration::from_secs(30),
        || async {
            if connected_to(&control, spoke_id).await {
                Ok(())
            } else {
                Err("not connected".to_string())
            }
        },
    )
    .await;
    // The public node reached its bootstrap peer (an address its operator gave) and refused
    // the loopback addresses it was told, its bootstrap peer's and the spoke's.
    wait_for(
        "the public node refuses addresses",
        Duration::from_secs(30),
        || async {
            let refused = public.metrics.peer_addresses_refused();
            if connected_to(&public, hub.peer_id()).await && refused >= 2 {
                Ok(())
            } else {
                Err(format!("{refused} refused"))
            }
        },
    )
    .await;
    assert!(
        !connected_to(&public, spoke_id).await,
        "the public node dialled the spoke's loopback address"
    );
    assert_eq!(
        control.metrics.peer_addresses_refused(),
        0,
        "a local run keeps them all"
    );
}
