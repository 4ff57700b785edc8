//! Placement by throughput against placement by count, with one slow miner, live: the same
//! `local-swarm` run twice in one command, once with validators that balance stage counts
//! (`--placement count`, the rule before) and once with validators that balance announced
//! capacity and let heads draw by their pathways' rate (`--placement throughput`). One miner
//! computes five times as slowly (`--adversary slow`, its compute thread sleeps four times
//! what it computed); it joins after the first plan, so count balancing puts it on the
//! head stage (7 miners, 3 stages: the stages hold 2, 2, 2 before it and ties go to stage 0).
//!
//! Prints each run's `RESULT local-swarm` line, then
//! `RESULT placement tokens_per_s_count=… tokens_per_s_throughput=… ratio=…`. The order of
//! the two runs alternates with `IOTA_BENCH_ORDER=throughput,count` to check that the
//! machine did not drift between them.
//!
//! Settings: `IOTA_BENCH_EPOCHS` (6), `IOTA_BENCH_SAMPLES` (100 a head an epoch),
//! `IOTA_BENCH_ORDER` (`count,throughput`), `IOTA_BENCH_KEEP` (keep the runs' folders).

mod common;

use common::{result, run};

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() {
    let epochs = setting("IOTA_BENCH_EPOCHS", "6");
    let samples = setting("IOTA_BENCH_SAMPLES", "100");
    let order = setting("IOTA_BENCH_ORDER", "count,throughput");
    let mut rates = std::collections::BTreeMap::new();
    for placement in order.split(',').map(str::trim) {
        assert!(
            placement == "count" || placement == "throughput",
            "IOTA_BENCH_ORDER: {placement} is neither count nor throughput"
        );
        let out_dir = std::env::temp_dir().join(format!(
            "iota-bench-placement-{}-{placement}",
            std::process::id()
        ));
        let out = run(&[
            "local-swarm",
            "--miners",
            "7",
            "--adversary",
            "slow:1",
            "--placement",
            placement,
            "--epochs",
            &epochs,
            "--samples-per-epoch",
            &samples,
            "--no-sample",
            "--out",
            &out_dir.display().to_string(),
        ]);
        if std::env::var_os("IOTA_BENCH_KEEP").is_some() {
            println!("({placement}'s output kept in {})", out_dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&out_dir);
        }
        let tokens_per_s = result(&out, "local-swarm")
            .get("tokens_per_s")
            .copied()
            .unwrap_or(f64::NAN);
        rates.insert(placement.to_string(), tokens_per_s);
    }
    let count = rates.get("count").copied().unwrap_or(f64::NAN);
    let throughput = rates.get("throughput").copied().unwrap_or(f64::NAN);
    println!(
        "RESULT placement tokens_per_s_count={count:.1} tokens_per_s_throughput={throughput:.1} ratio={:.3}",
        throughput / count
    );
}
