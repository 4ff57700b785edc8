//! Application verdicts and peer scoring over real connections, on a line A - B - C: what B
//! accepts is relayed to C; what B ignores or rejects is not; a rejection lowers the sender's
//! score at B, an ignore does not.

mod common;

use std::time::Duration;

use common::{config, init_tracing, report, spawn_node, wait_for, TestNode};
use p2p::{Client, Config, Event, PeerId, Verdict};
use tokio::sync::mpsc;

/// B accepts A's messages here.
const OK: &str = "ok";
/// B ignores A's messages here.
const IGNORED: &str = "ignored";
/// B rejects A's messages here.
const ROGUE: &str = "rogue";

/// A gossip message a node received, with the verdict it reported.
#[derive(Debug)]
struct Judged {
    author: PeerId,
    topic: String,
    data: Vec<u8>,
    verdict: Verdict,
}

/// Reads every event of a node, reports `rule`'s verdict on each gossip message and passes the
/// message on to the test.
fn judge(
    client: Client,
    mut events: mpsc::Receiver<Event>,
    rule: impl Fn(&PeerId, &str) -> Verdict + Send + 'static,
) -> mpsc::Receiver<Judged> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let Event::Gossip {
                author,
                topic,
                data,
                id,
            } = event
            {
                let verdict = rule(&author, &topic);
                report(&client, id, verdict).await;
                let judged = Judged {
                    author,
                    topic,
                    data,
                    verdict,
                };
                if tx.send(judged).await.is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// Publishes `data` on `topic` from `node`, retrying while no subscriber is known yet.
async fn publish_when_ready(node: &TestNode, topic: &str, data: &[u8]) {
    wait_for("a subscribed peer", Duration::from_secs(15), || async {
        match node.client.publish(topic, data.to_vec()).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_soft() => Err(e.to_string()),
            Err(e) => panic!("publish failed: {e}"),
        }
    })
    .await
}

/// Waits for the next message `seen` receives matching (`author`, `topic`, `data`), keeping
/// everything it passes over in `log`.
async fn receive(
    seen: &mut mpsc::Receiver<Judged>,
    log: &mut Vec<Judged>,
    (author, topic, data): (PeerId, &str, &[u8]),
    timeout: Duration,
) -> Judged {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, seen.recv()).await {
            Ok(Some(j)) if j.author == author && j.topic == topic && j.data == data => return j,
            Ok(Some(j)) => log.push(j),
            Ok(None) => panic!("judge task ended"),
            Err(_) => panic!(
                "no {topic:?} message {:?} by {author} within {timeout:?}; saw {log:?}",
                String::from_utf8_lossy(data)
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_gossip_is_not_relayed_and_lowers_the_senders_score_while_accepted_gossip_is() {
    init_tracing();
    let started = std::time::Instant::now();
    let topics = vec![OK.to_owned(), IGNORED.to_owned(), ROGUE.to_owned()];
    // A holds one connection in all, B's; C's and A's dials to each other (found through
    // discovery) are refused, so whatever C gets from A came through B.
    let a = spawn_node(Config {
        topics: topics.clone(),
        max_connections_total: 1,
        ..config()
    })
    .await;
    let b = spawn_node(Config {
        topics: topics.clone(),
        bootstrap: vec![a.addr.clone()],
        ..config()
    })
    .await;
    let c = spawn_node(Config {
        topics,
        bootstrap: vec![b.addr.clone()],
        ..config()
    })
    .await;
    let (a_id, b_id, c_id) = (a.peer_id(), b.peer_id(), c.peer_id());
    wait_for(
        "B connected to A and C",
        Duration::from_secs(10),
        || async {
            let peers = b.client.connected_peers().await.expect("connected_peers");
            if peers.contains(&a_id) && peers.contains(&c_id) {
                Ok(())
            } else {
                Err(format!("B's peers: {peers:?}"))
            }
        },
    )
    .await;

    let mut b_seen = judge(b.client.clone(), b.events, move |author, topic| {
        match (*author == a_id, topic) {
            (true, ROGUE) => Verdict::Reject,
            (true, IGNORED) => Verdict::Ignore,
            _ => Verdict::Accept,
        }
    });
    let mut c_seen = judge(c.client.clone(), c.events, |_, _| Verdict::Accept);
    let (mut b_log, mut c_log) = (Vec::new(), Vec::new());

    // Accepted by B: relayed to C. B forwards to its mesh, which C joins at a heartbeat after
    // its subscription arrives; a message B takes before then would reach C only by a later
    // offer, which gossipsub does not make to a peer that has meanwhile joined the mesh.
    wait_for("C in B's mesh", Duration::from_secs(10), || async {
        let mesh = b.client.mesh_peers(OK).await.expect("mesh_peers");
        if mesh.contains(&c_id) {
            Ok(())
        } else {
            Err(format!("B's mesh for {OK:?}: {mesh:?}"))
        }
    })
    .await;
    publish_when_ready(&a, OK, b"accepted").await;
    let at_b = receive(
        &mut b_seen,
        &mut b_log,
        (a_id, OK, b"accepted"),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(at_b.verdict, Verdict::Accept);
    receive(
        &mut c_seen,
        &mut c_log,
        (a_id, OK, b"accepted"),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(a.client.connected_peers().await.unwrap(), vec![b_id]);
    let relayed_at = started.elapsed();

    // Ignored by B: costs A nothing.
    a.client
        .publish(IGNORED, b"ignored".to_vec())
        .await
        .unwrap();
    receive(
        &mut b_seen,
        &mut b_log,
        (a_id, IGNORED, b"ignored"),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(b.client.peer_score(a_id).await.unwrap(), Some(0.0));

    // Rejected by B: A's score at B falls below zero.
    for data in [&b"rogue 1"[..], b"rogue 2"] {
        a.client.publish(ROGUE, data.to_vec()).await.unwrap();
        let at_b = receive(
            &mut b_seen,
            &mut b_log,
            (a_id, ROGUE, data),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(at_b.verdict, Verdict::Reject);
    }
    let score = wait_for(
        "A's score at B below zero",
        Duration::from_secs(5),
        || async {
            match b.client.peer_score(a_id).await.unwrap() {
                Some(s) if s < 0.0 => Ok(s),
                other => Err(format!("score {other:?}")),
            }
        },
    )
    .await;
    assert_eq!(b.metrics.gossip_verdicts(Verdict::Reject), 2);
    assert_eq!(b.metrics.gossip_verdicts(Verdict::Ignore), 1);
    // An honest peer stays at exactly 0.
    assert_eq!(b.client.peer_score(c_id).await.unwrap(), Some(0.0));

    // Neither the ignored nor the rejected messages reached C: B's own marker, published after
    // its verdicts, arrives, and nothing of A's on those topics comes before it or within two
    // heartbeats after it (time for gossip's IHAVE/IWANT to have offered them).
    b.client.publish(ROGUE, b"marker".to_vec()).await.unwrap();
    receive(
        &mut c_seen,
        &mut c_log,
        (b_id, ROGUE, b"marker"),
        Duration::from_secs(10),
    )
    .await;
    let grace = tokio::time::Instant::now() + Duration::from_secs(2);
    while let Ok(Some(j)) = tokio::time::timeout_at(grace, c_seen.recv()).await {
        c_log.push(j);
    }
    let leaked: Vec<&Judged> = c_log
        .iter()
        .filter(|j| j.author == a_id && j.topic != OK)
        .collect();
    assert!(leaked.is_empty(), "C received {leaked:?}");
    assert_eq!(a.client.connected_peers().await.unwrap(), vec![b_id]);
    eprintln!(
        "relayed after {relayed_at:?}; A's score at B {score}; done after {:?}",
        started.elapsed()
    );
}
