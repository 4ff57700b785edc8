//! The circuit relay server within its limits: a stranger that reserves a slot on our relay and
//! another that dials it through the circuit move no more bytes than the circuit allows, and a
//! reservation beyond the relay's limit is refused and counted.

mod common;

use std::time::Duration;

use common::{config, init_tracing, spawn_node, wait_for, TestNode};
use p2p::{multiaddr::Protocol, Config, Event, Path, Reachability, RelayLimits};

/// Bytes one circuit may carry in this test.
const CIRCUIT_BYTES: u64 = 256 << 10;

/// Size of each request pushed through the circuit.
const CHUNK: usize = 32 << 10;

/// Most requests sent: 2 MiB in all, eight times the circuit's limit.
const MAX_REQUESTS: usize = 64;

fn limits() -> RelayLimits {
    RelayLimits {
        max_reservations: 1,
        max_reservations_per_peer: 1,
        max_circuits: 2,
        max_circuits_per_peer: 1,
        max_circuit_bytes: CIRCUIT_BYTES,
        ..RelayLimits::default()
    }
}

/// A node with no listen address and no hole punching: reachable only through a relay.
fn hidden() -> Config {
    Config {
        listen: Vec::new(),
        hole_punch: false,
        ..config()
    }
}

/// Spawns a node that does not listen: it gets no listen address to wait for.
async fn spawn_hidden() -> TestNode {
    let keypair = p2p::identity::Keypair::generate_ed25519();
    let metrics = p2p::Metrics::unregistered();
    let (client, events, task) =
        p2p::spawn(keypair.clone(), hidden(), metrics.clone()).expect("spawn");
    TestNode {
        keypair,
        client,
        events,
        task,
        metrics,
        addr: p2p::Multiaddr::empty(),
    }
}

/// Answers every request with one byte, until the event channel closes.
fn serve(mut node: TestNode) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(event) = node.events.recv().await {
            if let Event::Request { id, .. } = event {
                let _ = node.client.respond(id, vec![1]).await;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_moves_no_more_through_our_relay_than_its_limits() {
    init_tracing();
    let relay = spawn_node(Config {
        relay_server: Some(limits()),
        ..config()
    })
    .await;
    // AutoNAT needs a peer to dial the relay back before it offers itself as a relay.
    let witness = spawn_node(Config {
        bootstrap: vec![relay.addr.clone()],
        ..config()
    })
    .await;
    wait_for(
        "the relay to find itself public",
        Duration::from_secs(30),
        || async {
            let c = relay.client.connectivity().await.expect("connectivity");
            if c.reachability == Reachability::Public {
                Ok(())
            } else {
                Err(format!("{:?}", c.reachability))
            }
        },
    )
    .await;

    // The listener reserves the relay's only slot.
    let listener = spawn_hidden().await;
    let listener_id = listener.peer_id();
    let circuit = relay.addr.clone().with(Protocol::P2pCircuit);
    listener
        .client
        .listen_on(circuit.clone())
        .await
        .expect("listen through the relay");
    wait_for("the reservation", Duration::from_secs(20), || async {
        let c = listener.client.connectivity().await.expect("connectivity");
        if c.relays.contains(&relay.peer_id()) {
            Ok(())
        } else {
            Err(format!("relays {:?}", c.relays))
        }
    })
    .await;

    // A second stranger finds no slot left.
    let squatter = spawn_hidden().await;
    squatter
        .client
        .listen_on(circuit.clone())
        .await
        .expect("listen through the relay");
    wait_for(
        "the refused reservation",
        Duration::from_secs(20),
        || async {
            let denied = relay.metrics.relay_server_denied("reservation");
            if denied >= 1 {
                Ok(())
            } else {
                Err(format!("{denied} refused"))
            }
        },
    )
    .await;
    let c = squatter.client.connectivity().await.expect("connectivity");
    assert!(c.relays.is_empty(), "the squatter holds no reservation");

    // The sender reaches the listener only through the circuit.
    let sender = spawn_hidden().await;
    let _served = serve(listener);
    sender
        .client
        .dial(circuit.with(Protocol::P2p(listener_id)))
        .await
        .expect("dial through the relay");
    wait_for(
        "the relayed connection",
        Duration::from_secs(20),
        || async {
            let c = sender.client.connectivity().await.expect("connectivity");
            match c.peers.get(&listener_id) {
                Some(Path::Relayed) => Ok(()),
                other => Err(format!("path {other:?}")),
            }
        },
    )
    .await;

    let chunk = vec![7u8; CHUNK];
    let mut delivered = 0u64;
    let mut refused = false;
    for _ in 0..MAX_REQUESTS {
        match sender.client.request(listener_id, chunk.clone()).await {
            Ok(_) => delivered += CHUNK as u64,
            Err(error) => {
                eprintln!("request through the relay failed after {delivered} bytes: {error}");
                refused = true;
                break;
            }
        }
    }
    assert!(
        refused,
        "{delivered} bytes went through a circuit limited to {CIRCUIT_BYTES}"
    );
    assert!(
        delivered <= CIRCUIT_BYTES,
        "{delivered} bytes delivered through a circuit limited to {CIRCUIT_BYTES}"
    );
    drop(witness);
}
