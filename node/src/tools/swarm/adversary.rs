//! `local-swarm --adversary MODE[:COUNT]`: which miners misbehave, and what the validators
//! made of them.
//!
//! An adversary is an ordinary miner process started with a hidden `--fault` mode; nothing
//! tells the other nodes. Adversaries start once the honest miners are in a plan, so the
//! orchestrator puts each into the stage with the fewest miners at the next epoch: with the
//! default 6 miners on 3 stages and one adversary, the tail, where every mode (`lie-loss`,
//! `inflate`, `dodge` and `preclaim` included) can be committed. New miners are placed in
//! peer id order, so the modes only a tail can commit go to the adversaries with the lowest
//! peer ids, which also start first: with 7 miners and two adversaries, the tail mode lands
//! in the tail. The report shows where each really was.
//!
//! After the run, the first validator's `weights/<epoch>.json` files say, per epoch, whom it
//! flagged and why; its `/status` gives the final consensus weights. From them the report
//! gets a weights table, a bar chart of the final weights with adversaries marked, and the
//! line `RESULT adversaries detected=<k>/<n> honest_flagged=<a>/<b>` (miner-epochs).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::cli::{Adversary, Fault};
use crate::services::validator::api::EpochWeights;

/// Which nodes (by index, of `peers`) misbehave how: the highest-numbered ones. They are
/// started after the honest miners are in a plan, so each joins the stage with the fewest
/// miners (with 5 honest miners on 3 stages, the tail). A plan places the miners that join
/// together in peer id order, so the faults go to the adversaries in that order: the first
/// mode given joins first (with 4 honest miners on 3 stages, the middle stage, then the
/// tail).
pub(crate) fn place<P: Ord>(
    adversaries: &[Adversary],
    peers: &[P],
) -> anyhow::Result<BTreeMap<usize, Fault>> {
    let miners = peers.len();
    let wanted: u32 = adversaries.iter().map(|a| a.count).sum();
    anyhow::ensure!(
        (wanted as usize) < miners,
        "--adversary asks for {wanted} adversaries among {miners} miners: at least one must be honest"
    );
    let faults = adversaries
        .iter()
        .flat_map(|a| std::iter::repeat_n(a.fault, a.count as usize));
    let mut chosen: Vec<usize> = (miners - wanted as usize..miners).collect();
    chosen.sort_by(|a, b| peers[*a].cmp(&peers[*b]));
    Ok(chosen.into_iter().zip(faults).collect())
}

/// What the run's validator concluded about one miner.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct MinerOutcome {
    /// Process name.
    pub(crate) name: String,
    /// Its peer id.
    pub(crate) peer_id: String,
    /// `honest` or the adversary's mode.
    pub(crate) role: String,
    /// Stage in the last epoch it was scored.
    pub(crate) stage: Option<u32>,
    /// Samples on its pathways over the run.
    pub(crate) samples: u64,
    /// CLASP effect in the last epoch it was scored.
    pub(crate) effect: Option<f64>,
    /// Epochs it was scored in, and flagged in.
    pub(crate) epochs: u64,
    /// Epochs flagged, with the reasons.
    pub(crate) flagged: Vec<(u64, String)>,
    /// Final consensus weight (normalised, 0–1).
    pub(crate) weight: f64,
}

/// The outcome per miner, from the validator's epoch files and its final `/status`.
pub(crate) fn outcomes(
    weights_dir: &Path,
    status: &serde_json::Value,
    names: &BTreeMap<String, String>,
    roles: &BTreeMap<String, String>,
) -> Vec<MinerOutcome> {
    let mut by_peer: BTreeMap<String, MinerOutcome> = BTreeMap::new();
    for (peer, role) in roles {
        by_peer.insert(
            peer.clone(),
            MinerOutcome {
                name: names.get(peer).cloned().unwrap_or_default(),
                peer_id: peer.clone(),
                role: role.clone(),
                ..MinerOutcome::default()
            },
        );
    }
    let mut files: Vec<(u64, EpochWeights)> = std::fs::read_dir(weights_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let weights: EpochWeights = serde_json::from_str(&text).ok()?;
            Some((weights.epoch, weights))
        })
        .collect();
    files.sort_by_key(|(epoch, _)| *epoch);
    for (epoch, weights) in &files {
        for miner in &weights.miners {
            let Some(outcome) = by_peer.get_mut(&miner.peer_id) else {
                continue;
            };
            outcome.stage = Some(miner.stage);
            outcome.samples += miner.samples;
            outcome.effect = miner.effect;
            outcome.epochs += 1;
            if miner.flagged {
                let why = miner.reason.clone().unwrap_or_else(|| "flagged".into());
                outcome.flagged.push((*epoch, why));
            }
        }
    }
    if let Some(miners) = status["weights"]["miners"].as_array() {
        for miner in miners {
            let peer = miner["peer_id"].as_str().unwrap_or_default();
            if let Some(outcome) = by_peer.get_mut(peer) {
                outcome.weight = miner["weight"].as_f64().unwrap_or(0.0);
            }
        }
    }
    by_peer.into_values().collect()
}

/// One validator as consensus saw it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct ValidatorOutcome {
    /// Process name.
    pub(crate) name: String,
    /// `honest` or its adversary mode.
    pub(crate) role: String,
    /// Its peer id.
    pub(crate) peer_id: String,
    /// Its share of the validators' stake.
    pub(crate) stake: f64,
    /// The share of its weight that survived clipping to consensus.
    pub(crate) trust: f64,
}

/// The validators of the final consensus in `status`.
pub(crate) fn validators(
    status: &serde_json::Value,
    names: &BTreeMap<String, String>,
    roles: &BTreeMap<String, String>,
) -> Vec<ValidatorOutcome> {
    status["weights"]["validators"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let peer = v["peer_id"].as_str().unwrap_or_default().to_string();
            ValidatorOutcome {
                name: names.get(&peer).cloned().unwrap_or_default(),
                role: roles.get(&peer).cloned().unwrap_or_else(|| "honest".into()),
                stake: v["stake"].as_f64().unwrap_or(0.0),
                trust: v["trust"].as_f64().unwrap_or(0.0),
                peer_id: peer,
            }
        })
        .collect()
}

/// A node's consensus as `/status` shows it: the epoch, and the weight of each uid.
fn consensus_key(s: &serde_json::Value) -> (Option<u64>, Vec<(u64, String)>) {
    let miners: Vec<(u64, String)> = s["weights"]["miners"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["uid"].as_u64().unwrap_or(u64::MAX),
                format!("{:.9}", m["weight"].as_f64().unwrap_or(f64::NAN)),
            )
        })
        .collect();
    (s["consensus_epoch"].as_u64(), miners)
}

/// How many of `statuses` hold exactly the first one's consensus (same epoch, same weight
/// per miner).
pub(crate) fn agreeing(statuses: &[serde_json::Value]) -> usize {
    let Some(first) = statuses.first().map(consensus_key) else {
        return 0;
    };
    if first.0.is_none() {
        return 0;
    }
    statuses
        .iter()
        .filter(|s| consensus_key(s) == first)
        .count()
}

/// The names of the nodes (`names`, in the order of `statuses`) whose consensus is not the
/// first one's: a node its peers' gossip scoring cut off stops hearing the weights.
pub(crate) fn disagreeing(statuses: &[serde_json::Value], names: &[String]) -> Vec<String> {
    let Some(first) = statuses.first().map(consensus_key) else {
        return Vec::new();
    };
    statuses
        .iter()
        .zip(names)
        .filter(|(s, _)| consensus_key(s) != first)
        .map(|(_, name)| name.clone())
        .collect()
}

/// The report's validators section (Markdown).
pub(crate) fn validators_section(
    trust: &[ValidatorOutcome],
    agreeing: usize,
    nodes: usize,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "\n## Validators\n");
    let _ = writeln!(
        md,
        "{agreeing} of {nodes} nodes hold the same consensus. Trust is the share of a \
         validator's weight that survived clipping to the stake-weighted median.\n"
    );
    let _ = writeln!(md, "| validator | role | stake share | trust |");
    let _ = writeln!(md, "|---|---|---|---|");
    for v in trust {
        let _ = writeln!(
            md,
            "| {} | {} | {:.3} | {:.3} |",
            v.name, v.role, v.stake, v.trust
        );
    }
    md
}

/// `RESULT adversaries detected=<k>/<n> honest_flagged=<a>/<b>`: adversaries flagged in at
/// least one epoch, and honest miner-epochs flagged.
pub(crate) fn result_line(outcomes: &[MinerOutcome]) -> String {
    let adversaries: Vec<&MinerOutcome> = outcomes.iter().filter(|o| o.role != "honest").collect();
    let detected = adversaries.iter().filter(|o| !o.flagged.is_empty()).count();
    let honest: Vec<&MinerOutcome> = outcomes.iter().filter(|o| o.role == "honest").collect();
    let honest_epochs: u64 = honest.iter().map(|o| o.epochs).sum();
    let honest_flagged: usize = honest.iter().map(|o| o.flagged.len()).sum();
    format!(
        "RESULT adversaries detected={detected}/{} honest_flagged={honest_flagged}/{honest_epochs}",
        adversaries.len()
    )
}

/// The report's weights section (Markdown).
pub(crate) fn section(outcomes: &[MinerOutcome]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "\n## Weights\n");
    let _ = writeln!(
        md,
        "Per miner, from the first validator: its stage, samples on its pathways, CLASP effect \
         (nats, last epoch scored), the epochs it was flagged in and why, and its final \
         consensus weight.\n"
    );
    let _ = writeln!(md, "![weights](weights.svg)\n");
    let _ = writeln!(
        md,
        "| miner | role | stage | samples | effect | flagged | final weight |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for o in outcomes {
        let flagged = if o.flagged.is_empty() {
            format!("0 of {}", o.epochs)
        } else {
            let first = &o.flagged[0];
            format!(
                "{} of {} (first: epoch {}, {})",
                o.flagged.len(),
                o.epochs,
                first.0,
                first.1
            )
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.2} % |",
            o.name,
            o.role,
            o.stage.map_or("–".into(), |s| s.to_string()),
            o.samples,
            o.effect.map_or("–".into(), |e| format!("{e:+.3}")),
            flagged,
            100.0 * o.weight
        );
    }
    let _ = writeln!(md, "\n`{}`", result_line(outcomes));
    md
}

/// A bar chart of the final consensus weights, adversaries in red.
pub(crate) fn svg(outcomes: &[MinerOutcome]) -> String {
    let (w, h, left, bottom, top) = (640.0, 320.0, 50.0, 60.0, 20.0);
    let n = outcomes.len().max(1) as f64;
    let slot = (w - left - 10.0) / n;
    let max = outcomes
        .iter()
        .map(|o| o.weight)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let plot_h = h - bottom - top;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="14" text-anchor="middle">final consensus weight per miner (red: adversary)</text>"#,
        w / 2.0
    );
    let _ = writeln!(
        svg,
        r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        h - bottom,
        w - 10.0,
        h - bottom
    );
    for (i, o) in outcomes.iter().enumerate() {
        let bar = plot_h * o.weight / max;
        let x = left + slot * i as f64 + slot * 0.15;
        let colour = if o.role == "honest" {
            "#4878a8"
        } else {
            "#c83232"
        };
        let _ = writeln!(
            svg,
            r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bar:.1}" fill="{colour}"/>"#,
            h - bottom - bar,
            slot * 0.7
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{:.1}%</text>"#,
            x + slot * 0.35,
            h - bottom - bar - 3.0,
            100.0 * o.weight
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x + slot * 0.35,
            h - bottom + 14.0,
            o.name
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{colour}">{}</text>"#,
            x + slot * 0.35,
            h - bottom + 28.0,
            o.role
        );
    }
    let _ = writeln!(svg, "</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse_adversary as parse;

    #[test]
    fn modes_and_counts_parse_and_bad_ones_say_what_to_fix() {
        assert_eq!(
            parse("noise").unwrap(),
            Adversary {
                fault: Fault::Noise,
                count: 1
            }
        );
        assert_eq!(parse("lie-loss:2").unwrap().count, 2);
        assert_eq!(parse("dodge").unwrap().fault, Fault::Dodge);
        for bad in ["nois", "noise:0", "noise:x", "forge-plans", "compute-dies"] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains("--adversary"), "{error}");
        }
    }

    #[test]
    fn adversaries_are_the_last_miners_and_one_stays_honest() {
        let adversaries = [parse("lie-loss").unwrap(), parse("noise:2").unwrap()];
        let peers = ["a", "b", "c", "f", "e", "d"];
        let placed = place(&adversaries, &peers).unwrap();
        // The lowest peer id among the last three gets the first mode given.
        assert_eq!(
            placed.into_iter().collect::<Vec<_>>(),
            vec![(3, Fault::Noise), (4, Fault::Noise), (5, Fault::LieLoss)]
        );
        let peers = ["a", "b", "c", "d", "e", "f"];
        let placed = place(&adversaries, &peers).unwrap();
        assert_eq!(
            placed.into_iter().collect::<Vec<_>>(),
            vec![(3, Fault::LieLoss), (4, Fault::Noise), (5, Fault::Noise)]
        );
        assert!(place(&[parse("noise:6").unwrap()], &peers).is_err());
    }

    #[test]
    fn the_result_line_counts_detections_and_honest_flags() {
        let outcome = |role: &str, epochs: u64, flagged: usize| MinerOutcome {
            role: role.into(),
            epochs,
            flagged: (0..flagged as u64).map(|e| (e, "clasp".into())).collect(),
            ..MinerOutcome::default()
        };
        let outcomes = [
            outcome("noise", 3, 3),
            outcome("lazy", 3, 0),
            outcome("honest", 3, 1),
            outcome("honest", 3, 0),
        ];
        assert_eq!(
            result_line(&outcomes),
            "RESULT adversaries detected=1/2 honest_flagged=1/6"
        );
        assert!(svg(&outcomes).contains("#c83232"));
    }

    #[test]
    fn agreement_needs_the_same_epoch_and_the_same_weights() {
        let status = |epoch: u64, w: f64| {
            serde_json::json!({
                "consensus_epoch": epoch,
                "weights": {"miners": [{"uid": 3, "weight": w}, {"uid": 4, "weight": 1.0 - w}]}
            })
        };
        let same = [status(5, 0.25), status(5, 0.25), status(5, 0.25)];
        assert_eq!(agreeing(&same), 3);
        let differ = [status(5, 0.25), status(5, 0.5), status(4, 0.25)];
        assert_eq!(agreeing(&differ), 1);
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert_eq!(disagreeing(&differ, &names), vec!["b", "c"]);
        assert!(disagreeing(&same, &names).is_empty());
        assert_eq!(agreeing(&[serde_json::json!({})]), 0);
    }
}
