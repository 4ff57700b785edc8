//! `iota-p2p simulate`: thousands of miners on virtual time, running the protocol's own code.
//!
//! A scenario file ([`scenario`]) names the miners (GPU class, link, stragglers), the
//! validators, the run's configuration and the model's shape, churn and planted bad miners.
//! The [`engine`] drives the node's pure code with modelled links ([`net`]) and compute
//! ([`compute`]) on virtual time, deterministic from the seed; [`report`] writes what each
//! scenario measured. See `scenarios/README.md` for the files we ship and
//! docs/BENCHMARKS.md for what they gave.

pub(crate) mod compute;
mod engine;
mod net;
mod report;
pub(crate) mod scenario;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};

use crate::cli::SimulateArgs;
pub(crate) use engine::Outcome;
pub(crate) use report::Report;
use scenario::Scenario;

/// The directory of scenario files `simulate` runs when none is named.
const SCENARIOS: &str = "scenarios";

/// Runs the scenarios `args` names and writes their reports.
pub(crate) fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    let files = if args.scenario.is_empty() {
        every_scenario(Path::new(SCENARIOS))?
    } else {
        args.scenario.clone()
    };
    // Every file is read and checked before anything runs: a typo in the last one should
    // not cost the minutes the first ones take.
    let mut scenarios = Vec::new();
    for file in &files {
        let mut scenario = Scenario::load(file)?;
        if let Some(seed) = args.seed {
            scenario.seed = seed;
        }
        if let Some(secs) = args.duration_secs {
            scenario.duration_secs = secs;
        }
        scenarios.push(scenario);
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut summary = String::from(
        "| scenario | miners | tokens/s | of a perfect pipeline | of the same GPUs in one datacenter | throughput / count placement | epoch s | merge s | gossip KB per node per epoch | plan miners | failover s | CLASP recall / FPR | first limit |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n",
    );
    for scenario in &scenarios {
        let report = run_scenario(scenario)?;
        let base = args.out.join(&scenario.name);
        std::fs::write(
            base.with_extension("json"),
            serde_json::to_vec_pretty(&report)?,
        )?;
        std::fs::write(base.with_extension("md"), report.markdown(scenario))?;
        std::fs::write(base.with_extension("svg"), report.svg())?;
        println!("{}", report.result_line());
        summary.push_str(&summary_row(&report));
    }
    std::fs::write(args.out.join("summary.md"), &summary)?;
    println!("simulate: reports in {}", args.out.display());
    Ok(())
}

/// Every `*.toml` in `dir`, sorted.
fn every_scenario(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).with_context(|| {
        format!(
            "reading {} (run from the repository's root, or name files with --scenario)",
            dir.display()
        )
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{} holds no scenario (*.toml)", dir.display());
    }
    Ok(files)
}

/// Runs one scenario and the comparisons it asks for.
pub(crate) fn run_scenario(scenario: &Scenario) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut wanted = vec![(scenario.placement, false)];
    if scenario.compare_placement {
        wanted.push((scenario.placement.other(), false));
    }
    if scenario.compare_datacenter {
        wanted.push((scenario.placement, true));
    }
    let mut runs = Vec::new();
    let mut costs = Vec::new();
    for (placement, datacenter) in wanted {
        let (outcome, cost) = engine::simulate_timed(scenario, placement, datacenter)?;
        runs.push(outcome);
        costs.push(cost);
    }
    Ok(Report {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        seed: scenario.seed,
        runs,
        costs,
        wall_secs: started.elapsed().as_secs_f64(),
    })
}

fn summary_row(report: &Report) -> String {
    let m = report.main();
    let ratio = |other: Option<&Outcome>| {
        other.map_or("–".to_owned(), |o| {
            format!("{:.3}", m.tokens_per_s / o.tokens_per_s.max(1e-9))
        })
    };
    let datacenter = report.runs.iter().find(|r| r.datacenter);
    let placement = report
        .runs
        .iter()
        .find(|r| !r.datacenter && r.placement != m.placement)
        .map_or("–".to_owned(), |other| {
            let (count, thr) = if m.placement == "count" {
                (m, other)
            } else {
                (other, m)
            };
            format!("{:.3}", thr.tokens_per_s / count.tokens_per_s.max(1e-9))
        });
    format!(
        "| {} | {} | {:.0} | {:.3} | {} | {} | {:.2} | {:.2} | {:.1} | {} | {} | {} | {} |\n",
        report.scenario,
        m.miners_start,
        m.tokens_per_s,
        m.tokens_per_s / m.perfect_tokens_per_s.max(1e-9),
        ratio(datacenter),
        placement,
        m.mean_epoch_secs,
        m.mean_merge_secs,
        m.gossip.total_bytes / 1e3,
        m.plan_miners_max,
        m.failover_secs
            .map_or("–".to_owned(), |f| format!("{f:.2}")),
        m.clasp.as_ref().map_or("–".to_owned(), |c| format!(
            "{:.2} / {:.3}",
            c.recall, c.false_positive_rate
        )),
        m.limits.first().map_or("none".to_owned(), |l| {
            l.split(';').next().unwrap_or(l).to_owned()
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(SCENARIOS)
    }

    /// `scenario` simulated under its own placement rule.
    fn simulated(scenario: &Scenario) -> engine::Outcome {
        engine::simulate_timed(scenario, scenario.placement, false)
            .unwrap()
            .0
    }

    /// Whether one of `outcome`'s limits says every one of `words`.
    fn hit(outcome: &engine::Outcome, words: &[&str]) -> bool {
        outcome
            .limits
            .iter()
            .any(|l| words.iter().all(|w| l.contains(w)))
    }

    #[test]
    fn a_seed_gives_the_same_figures_and_another_seed_other_ones() {
        let scenario = Scenario::load(&shipped().join("local-swarm.toml")).unwrap();
        let first = simulated(&scenario);
        let again = simulated(&scenario);
        assert_eq!(first, again);
        // The figures are of a run that trained: samples went through, within what the
        // machine's cores could do, in epochs that each opened with a plan.
        assert!(first.samples_done > 500, "{}", first.samples_done);
        assert!(first.tokens_per_s > 0.0 && first.tokens_per_s < first.perfect_tokens_per_s);
        assert!(first.epochs.len() >= 5, "{} epochs", first.epochs.len());
        // The first plan has nothing to merge; every later one opens with a merge, and a
        // merge's mean length (what the live runs' logs give) is over those alone.
        assert_eq!(first.epochs[0].merge_secs, 0.0);
        let merges: Vec<f64> = first.epochs[1..].iter().map(|e| e.merge_secs).collect();
        assert!(merges.iter().all(|&m| m > 0.0), "{merges:?}");
        let mean = merges.iter().sum::<f64>() / merges.len() as f64;
        assert!((first.mean_merge_secs - mean).abs() < 1e-9, "{first:?}");
        // Each miner's lifecycle took a plan, a merge and training for every epoch after the
        // first (and a plan and training for the first).
        let miners = scenario.miner_count() as u64;
        let epochs = first.epochs.len() as u64;
        assert!(
            first.lifecycle_events >= miners * (3 * epochs - 1),
            "{} lifecycle events for {miners} miners and {epochs} epochs",
            first.lifecycle_events
        );
        // Every miner's lifecycle took every event in order and no merge ran late; the
        // validator's spot checks fetched evidence (a stage's weights, about 1 MB a check,
        // about one check a second).
        assert_eq!((first.lifecycle_refused, first.merge_overruns), (0, 0));
        assert_eq!((first.merge_excluded, first.merge_kept_local), (0, 0));
        assert!(
            (0.3e6..3e6).contains(&first.spot_check_bytes_per_s),
            "{}",
            first.spot_check_bytes_per_s
        );
        let other = Scenario {
            seed: scenario.seed + 1,
            ..scenario.clone()
        };
        let different = simulated(&other);
        assert_ne!(first.series, different.series);
    }

    #[test]
    fn a_member_too_slow_to_commit_is_left_out_of_its_merge() {
        // The local swarm with a seventh miner whose passes take minutes: whenever a plan
        // closes an epoch it is mid-pass, its snapshot (and so its commitment) comes after
        // the commit deadline, and the merge's ledger leaves it out.
        let mut scenario = Scenario::load(&shipped().join("local-swarm.toml")).unwrap();
        let mut slow = scenario.miners[0].clone();
        slow.count = 1;
        slow.slowdown = 300.0;
        scenario.miners.push(slow);
        scenario.duration_secs = 150.0;
        let outcome = simulated(&scenario);
        assert!(outcome.merge_excluded > 0, "{outcome:?}");
        assert!(hit(&outcome, &["commitment(s) late"]));
    }

    #[test]
    fn a_merge_past_its_budget_is_reported_by_the_miners_lifecycles() {
        // The local swarm with three replicas a stage on one core and 1 Mbit/s links: a
        // member fetching the averages it does not hold needs more than the merge's budget,
        // its stage's merges end at the deadline, and the members' own work on the one core
        // comes after it. Each miner's lifecycle, ticked as the node ticks it, reports it.
        let mut scenario = Scenario::load(&shipped().join("local-swarm.toml")).unwrap();
        scenario.miners[0].count = 9;
        scenario.miners[0].up_mbit = 1.0;
        scenario.miners[0].down_mbit = 1.0;
        scenario.validators.up_mbit = 1.0;
        scenario.validators.down_mbit = 1.0;
        scenario.host.as_mut().unwrap().cores = 1;
        scenario.duration_secs = 300.0;
        let outcome = simulated(&scenario);
        assert!(outcome.merge_overruns > 0, "{outcome:?}");
        assert!(hit(&outcome, &["passed its deadline", "lifecycle"]));
    }

    #[test]
    fn every_shipped_scenario_runs() {
        let files = every_scenario(&shipped()).unwrap();
        assert!(files.len() >= 8, "{files:?}");
        for file in files {
            let scenario = Scenario {
                duration_secs: 20.0,
                ..Scenario::load(&file).unwrap()
            };
            let report = run_scenario(&scenario).unwrap();
            assert!(!report.runs.is_empty(), "{}", file.display());
            assert!(report.svg().starts_with("<svg"));
        }
    }

    #[test]
    fn a_bad_scenario_is_refused_with_the_field_to_fix() {
        let dir = std::env::temp_dir().join(format!("iota-sim-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            ("name = \"x\"\nduration_secs = 10\nminers = []\n[validators]\ncount = 1\n", "at least one miner"),
            ("name = \"x\"\nduration_secs = -1\n[[miners]]\ncount = 1\n[validators]\ncount = 1\n", "duration_secs"),
            ("name = \"x\"\nduration_secs = 10\n[[miners]]\ncount = 1\ngpu = \"tpu\"\n[validators]\ncount = 1\n", "tpu"),
            ("name = \"x\"\nduration_secs = 10\n[[miners]]\ncount = 1\n[validators]\ncount = 1\n[run]\nstages = 0\n", "stages"),
            ("name = \"x\"\nduration_secs = 10\nbogus = 1\n[[miners]]\ncount = 1\n[validators]\ncount = 1\n", "bogus"),
        ];
        for (text, expected) in cases {
            let file = dir.join("bad.toml");
            std::fs::write(&file, text).unwrap();
            let error = format!("{:#}", Scenario::load(&file).unwrap_err());
            assert!(error.contains(expected), "{expected:?} not in {error}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
