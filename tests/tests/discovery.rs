//! Nodes find each other with no central server, and keep working when one of them dies.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::time::Duration;

use iota_tests::{peer_id_of, scratch_dir, start_node, strings, wait_for, NodeProcess};

const POLL: Duration = Duration::from_millis(500);

/// Waits until every node in `nodes` has all of `expected` (minus itself) in its routing table
/// and in its live-peer view, and none of `gone` among its live peers.
async fn wait_until_everyone_knows(
    what: &str,
    nodes: &[&NodeProcess],
    expected: &BTreeSet<String>,
    gone: &BTreeSet<String>,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    wait_for(what, timeout, POLL, || async {
        let mut lacking = Vec::new();
        for node in nodes {
            let status = node.status().await?;
            let me = status["peer_id"].as_str().unwrap_or_default().to_string();
            let routing: BTreeSet<String> = strings(&status, "routing_table").into_iter().collect();
            let live: BTreeSet<String> = strings(&status, "live_peers").into_iter().collect();
            let want: BTreeSet<&String> = expected.iter().filter(|p| **p != me).collect();
            let missing_routing = want.iter().filter(|p| !routing.contains(**p)).count();
            let missing_live = want.iter().filter(|p| !live.contains(**p)).count();
            let stale = gone.iter().filter(|p| live.contains(*p)).count();
            if missing_routing + missing_live + stale > 0 {
                lacking.push(format!(
                    "{}: {missing_routing} missing from routing table, {missing_live} not heard, {stale} stale",
                    node.name
                ));
            }
        }
        Ok((lacking.is_empty(), lacking.join("; ")))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_nodes_find_each_other_and_survive_losing_the_bootstrap_node() {
    let dir = scratch_dir("discovery");
    let first = start_node(&dir, "node-0", &[]).await.unwrap();
    let bootstrap = first.listen_addr();
    // The other seven at once: each joins through node 0, which follows a run without a stake
    // snapshot, so each waits a few seconds for a validator to advertise one before it takes
    // node 0's run configuration.
    let mut starting = tokio::task::JoinSet::new();
    for i in 1..8 {
        let (dir, bootstrap) = (dir.clone(), bootstrap.clone());
        starting.spawn(async move {
            let name = format!("node-{i}");
            (
                i,
                start_node(&dir, &name, &["--bootstrap", &bootstrap]).await,
            )
        });
    }
    let mut started = Vec::new();
    while let Some(joined) = starting.join_next().await {
        let (i, node) = joined.unwrap();
        started.push((i, node.unwrap()));
    }
    started.sort_by_key(|(i, _)| *i);
    let mut nodes = vec![first];
    nodes.extend(started.into_iter().map(|(_, node)| node));
    let ids: Vec<String> = nodes.iter().map(|n| peer_id_of(&n.listen_addr())).collect();
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(all.len(), 8, "every node has its own peer id");

    // Routing tables fill through Kademlia from node 0 alone, and every node hears the
    // heartbeats gossiped by every other, the last node's included.
    let everyone: Vec<&NodeProcess> = nodes.iter().collect();
    let took = wait_until_everyone_knows(
        "8 nodes discover each other",
        &everyone,
        &all,
        &BTreeSet::new(),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    eprintln!("8 nodes discovered each other in {took:?}");
    let last = &ids[7];
    for node in &nodes[..7] {
        let live = strings(&node.status().await.unwrap(), "live_peers");
        assert!(
            live.contains(last),
            "{} heard the last node's gossip",
            node.name
        );
    }

    // Kill the bootstrap node as a crash would: the rest keep gossiping, long enough for its
    // own heartbeats to expire everywhere while theirs stay fresh.
    let mut nodes = nodes.into_iter();
    let node0 = nodes.next().unwrap();
    node0.kill().await.unwrap();
    let survivors: Vec<NodeProcess> = nodes.collect();
    let alive: BTreeSet<String> = ids[1..].iter().cloned().collect();
    let dead: BTreeSet<String> = [ids[0].clone()].into_iter().collect();
    let refs: Vec<&NodeProcess> = survivors.iter().collect();
    wait_until_everyone_knows(
        "7 survivors keep gossiping without node 0",
        &refs,
        &alive,
        &dead,
        Duration::from_secs(30),
    )
    .await
    .unwrap();

    // A newcomer that knows only node 3 finds all of them.
    let via = survivors[2].listen_addr();
    assert_eq!(peer_id_of(&via), ids[3]);
    let newcomer = start_node(&dir, "node-8", &["--bootstrap", &via])
        .await
        .unwrap();
    wait_until_everyone_knows(
        "a newcomer bootstrapping from node 3 finds the 7",
        &[&newcomer],
        &alive,
        &dead,
        Duration::from_secs(30),
    )
    .await
    .unwrap();

    // The operator's view agrees: metrics and status report the peers and the gossip.
    let metrics = survivors[0].metrics().await.unwrap();
    for name in [
        "iota_connected_peers",
        "iota_routing_table_peers",
        "iota_gossip_messages_received_total",
    ] {
        assert!(metrics.contains(name), "/metrics has {name}:\n{metrics}");
    }
    let received = metric_value(&metrics, "iota_gossip_messages_received_total");
    assert!(received > 0.0, "heartbeats were counted: {received}");
    let status = survivors[0].status().await.unwrap();
    assert!(status["connected_peers"].as_u64().unwrap() >= 1);
    assert!(status["routing_table_peers"].as_u64().unwrap() >= 7);
    assert!(!strings(&status, "listen_addrs").is_empty());

    for node in survivors.into_iter().chain(std::iter::once(newcomer)) {
        let name = node.name.clone();
        let status = node.stop(Duration::from_secs(10)).await.unwrap();
        assert!(status.success(), "{name} exits 0 on SIGTERM, got {status}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The value of an unlabelled sample in Prometheus text.
fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(f64::NAN)
}
