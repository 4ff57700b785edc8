//! Connection limits: connections beyond `max_connections_per_peer` are refused and counted,
//! and the connection already there keeps working.

mod common;

use std::time::Duration;

use common::{config, init_tracing, spawn_node, wait_for, TestNode};
use p2p::{Config, Direction, Event};

/// Waits until `node`'s count of refused connections in `direction` reaches 1.
async fn one_refusal(node: &TestNode, direction: Direction) {
    wait_for(
        &format!("one {direction:?} connection refused"),
        Duration::from_secs(10),
        || async {
            match node.metrics.connections_refused(direction) {
                0 => Err("none refused".to_owned()),
                n => Ok(n),
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_to_the_same_peer_is_refused_and_the_first_keeps_working() {
    init_tracing();
    let started = std::time::Instant::now();
    let mut x = spawn_node(Config {
        max_connections_per_peer: 1,
        ..config()
    })
    .await;
    let mut y = spawn_node(Config {
        bootstrap: vec![x.addr.clone()],
        ..config()
    })
    .await;
    let (x_id, y_id) = (x.peer_id(), y.peer_id());
    wait_for("X and Y connected", Duration::from_secs(10), || async {
        let at_x = x.client.connected_peers().await.unwrap();
        let at_y = y.client.connected_peers().await.unwrap();
        if at_x == [y_id] && at_y == [x_id] {
            Ok(())
        } else {
            Err(format!("X's peers {at_x:?}, Y's peers {at_y:?}"))
        }
    })
    .await;
    assert_eq!(x.metrics.connections_refused(Direction::Inbound), 0);
    assert_eq!(x.metrics.connections_refused(Direction::Outbound), 0);

    // Y (limit 2) dials X again: X refuses the connection.
    y.client.dial(x.addr.clone()).await.unwrap();
    one_refusal(&x, Direction::Inbound).await;
    // X dials Y again: X refuses its own second connection.
    x.client.dial(y.addr.clone()).await.unwrap();
    one_refusal(&x, Direction::Outbound).await;
    // Y, within its limit of 2, refused nothing.
    assert_eq!(y.metrics.connections_refused(Direction::Inbound), 0);
    assert_eq!(y.metrics.connections_refused(Direction::Outbound), 0);

    // The first connection is still there and carries a request. Neither side ever saw the
    // peer go: the refused connections were never its only one.
    assert_eq!(x.client.connected_peers().await.unwrap(), [y_id]);
    assert_eq!(y.client.connected_peers().await.unwrap(), [x_id]);
    for node in [&mut x, &mut y] {
        while let Ok(event) = node.events.try_recv() {
            assert!(!matches!(event, Event::PeerDisconnected(_)), "{event:?}");
        }
    }
    let request = {
        let client = y.client.clone();
        tokio::spawn(async move { client.request(x_id, b"still there?".to_vec()).await })
    };
    let id = x
        .next_event(Duration::from_secs(10), |e| match e {
            Event::Request { peer, id, .. } if peer == y_id => Some(id),
            Event::PeerDisconnected(peer) => panic!("X lost {peer}"),
            _ => None,
        })
        .await
        .expect("the request did not arrive");
    x.client.respond(id, b"yes".to_vec()).await.unwrap();
    assert_eq!(request.await.unwrap().unwrap(), b"yes");
    assert_eq!(y.client.connected_peers().await.unwrap(), [x_id]);
    eprintln!("done after {:?}", started.elapsed());
}

#[tokio::test]
async fn zero_connection_limits_are_refused() {
    for config in [
        Config {
            max_connections_per_peer: 0,
            ..config()
        },
        Config {
            max_connections_total: 0,
            ..config()
        },
        Config {
            max_pending_incoming: 0,
            ..config()
        },
    ] {
        let err = p2p::spawn(
            p2p::identity::Keypair::generate_ed25519(),
            config,
            p2p::Metrics::unregistered(),
        )
        .unwrap_err();
        assert!(matches!(err, p2p::SpawnError::InvalidConfig(_)), "{err:?}");
    }
}
