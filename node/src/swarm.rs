//! `iota-p2p local-swarm`: a whole network on this machine, started with one command.
//!
//! Starts the validators and miners as separate processes of this same binary on 127.0.0.1,
//! each bootstrapping only from the first, shows them discover each other through Kademlia and
//! hear each other's heartbeats over gossip, then stops every process it started — also on
//! Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use crate::cli::LocalSwarmArgs;
use crate::launcher::{wait_for, NodeProcess, NodeSpec};

/// How long a node gets to print its addresses.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a node gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs the local swarm to completion.
pub(crate) async fn run(args: LocalSwarmArgs) -> anyhow::Result<()> {
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("iota-local-swarm-{}", std::process::id())),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let binary = std::env::current_exe().context("locating this binary")?;
    let total = args.validators + args.miners;
    println!(
        "local-swarm: {} validator(s) + {} miner(s) on 127.0.0.1, data and logs in {}",
        args.validators,
        args.miners,
        out.display()
    );

    let mut nodes: Vec<NodeProcess> = Vec::new();
    let outcome = tokio::select! {
        result = drive(&args, &binary, &out, total, &mut nodes) => result,
        _ = crate::node::shutdown_signal() => {
            println!("local-swarm: interrupted, stopping the nodes");
            Err(anyhow::anyhow!("interrupted"))
        }
    };
    let mut stop_errors = 0;
    for node in nodes {
        let name = node.name.clone();
        if let Err(error) = node.stop(STOP_GRACE).await {
            stop_errors += 1;
            eprintln!("local-swarm: {name}: {error:#}");
        }
    }
    println!("local-swarm: stopped {total} node(s)");
    outcome?;
    anyhow::ensure!(
        stop_errors == 0,
        "{stop_errors} node(s) did not stop cleanly"
    );
    Ok(())
}

/// Starts the nodes (pushing each into `nodes` so the caller can stop them whatever happens)
/// and waits for full discovery.
async fn drive(
    args: &LocalSwarmArgs,
    binary: &std::path::Path,
    out: &std::path::Path,
    total: u32,
    nodes: &mut Vec<NodeProcess>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut bootstrap = None::<String>;
    for i in 0..total {
        let validator = i < args.validators;
        let name = format!("{}-{i}", if validator { "validator" } else { "miner" });
        let data_dir: PathBuf = out.join(&name);
        let mut node_args = vec!["--data-dir".to_string(), data_dir.display().to_string()];
        if validator {
            node_args.push("--validator".into());
        }
        if let Some(addr) = &bootstrap {
            node_args.extend(["--bootstrap".to_string(), addr.clone()]);
        }
        let spec = NodeSpec {
            name: name.clone(),
            args: node_args,
            log: out.join(format!("{name}.log")),
        };
        let node = NodeProcess::spawn(binary, spec, READY_TIMEOUT).await?;
        println!("  started {name:<12} {}", node.listen_addr());
        if bootstrap.is_none() {
            bootstrap = Some(node.listen_addr());
        }
        nodes.push(node);
    }

    let others = total.saturating_sub(1) as usize;
    let last_print = std::cell::Cell::new(Instant::now());
    let elapsed = wait_for(
        "every node sees every other",
        Duration::from_secs(args.timeout_secs),
        Duration::from_millis(500),
        || async {
            let mut min_routing = usize::MAX;
            let mut min_live = usize::MAX;
            for node in nodes.iter() {
                let status = node.status().await?;
                min_routing = min_routing.min(count(&status, "routing_table"));
                min_live = min_live.min(count(&status, "live_peers"));
            }
            let progress = format!(
                "fewest peers in a routing table {min_routing}/{others}, fewest live peers heard {min_live}/{others}"
            );
            if last_print.get().elapsed() >= Duration::from_secs(1) {
                println!("  t={:>5.1}s  {progress}", started.elapsed().as_secs_f64());
                last_print.set(Instant::now());
            }
            Ok((min_routing >= others && min_live >= others, progress))
        },
    )
    .await?;
    println!(
        "local-swarm: all {total} nodes found each other through Kademlia and hear each other's heartbeats"
    );
    println!(
        "RESULT local-swarm nodes={total} discovered_in_s={:.1}",
        elapsed.as_secs_f64()
    );
    Ok(())
}

/// Length of a JSON array field of a status, 0 when absent.
fn count(status: &serde_json::Value, field: &str) -> usize {
    status
        .get(field)
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len)
}
