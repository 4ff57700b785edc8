//! A scenario's report: the figures as JSON, a Markdown table, a `RESULT` line, and an SVG
//! of tokens/s over virtual time with churn and failures marked.

use std::fmt::Write as _;

use super::engine::Outcome;
use super::scenario::Scenario;

/// What one scenario produced: its runs (the scenario's placement first, then any
/// comparison runs) and the wall time they took.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Report {
    pub(crate) scenario: String,
    pub(crate) description: String,
    pub(crate) seed: u64,
    pub(crate) runs: Vec<Outcome>,
    /// What each run cost in wall time (not part of the seeded figures).
    pub(crate) costs: Vec<super::engine::WallCosts>,
    pub(crate) wall_secs: f64,
}

impl Report {
    /// The first run: the scenario as written.
    pub(crate) fn main(&self) -> &Outcome {
        &self.runs[0]
    }

    fn find(&self, placement: &str, datacenter: bool) -> Option<&Outcome> {
        self.runs
            .iter()
            .find(|r| r.placement == placement && r.datacenter == datacenter)
    }

    /// One line of figures, for scripts.
    pub(crate) fn result_line(&self) -> String {
        let m = self.main();
        let mut line = format!(
            "RESULT simulate scenario={} placement={} miners={} tokens_per_s={:.1} perfect_ratio={:.3} epoch_s={:.2} merge_s={:.2} gossip_bytes_per_node_epoch={:.0} plan_miners={} dropped={}",
            self.scenario,
            m.placement,
            m.miners_start,
            m.tokens_per_s,
            m.tokens_per_s / m.perfect_tokens_per_s.max(1e-9),
            m.mean_epoch_secs,
            m.mean_merge_secs,
            m.gossip.total_bytes,
            m.plan_miners_max,
            m.samples_dropped,
        );
        if let Some(dc) = self.find(m.placement, true) {
            let _ = write!(
                line,
                " datacenter_ratio={:.3}",
                m.tokens_per_s / dc.tokens_per_s.max(1e-9)
            );
        }
        if let Some(other) = self
            .runs
            .iter()
            .find(|r| r.placement != m.placement && !r.datacenter)
        {
            let (count, thr) = if m.placement == "count" {
                (m, other)
            } else {
                (other, m)
            };
            let _ = write!(
                line,
                " throughput_over_count={:.3}",
                thr.tokens_per_s / count.tokens_per_s.max(1e-9)
            );
        }
        if let Some(f) = m.failover_secs {
            let _ = write!(line, " failover_s={f:.2}");
        }
        if let Some(c) = &m.clasp {
            let _ = write!(
                line,
                " clasp_recall={:.3} clasp_fpr={:.4}",
                c.recall, c.false_positive_rate
            );
        }
        line
    }

    /// The Markdown report.
    pub(crate) fn markdown(&self, scenario: &Scenario) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# Scenario `{}`\n", self.scenario);
        if !self.description.is_empty() {
            let _ = writeln!(md, "{}\n", self.description.trim());
        }
        let _ = writeln!(
            md,
            "Seed {}, {:.0} virtual seconds, {} miners and {} validators at the start; {:.1} s of wall time for {} run(s).\n",
            self.seed,
            scenario.duration_secs,
            scenario.miner_count(),
            scenario.validators.count,
            self.wall_secs,
            self.runs.len()
        );
        let _ = writeln!(md, "![tokens/s]({}.svg)\n", self.scenario);
        let _ = writeln!(
            md,
            "| run | tokens/s | of a perfect pipeline | epoch s | merge s | samples | dropped | miners in plan | moves | plan bytes | gossip per node per epoch | failover s | CLASP recall / FPR | weight to bad miners |"
        );
        let _ = writeln!(
            md,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
        );
        for r in &self.runs {
            let _ = writeln!(
                md,
                "| {}{} | {:.0} | {:.3} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {:.1} KB in {:.0} messages | {} | {} | {} |",
                r.placement,
                if r.datacenter { ", datacenter links" } else { "" },
                r.tokens_per_s,
                r.tokens_per_s / r.perfect_tokens_per_s.max(1e-9),
                r.mean_epoch_secs,
                r.mean_merge_secs,
                r.samples_done,
                r.samples_dropped,
                r.plan_miners_max,
                r.epochs.iter().map(|e| e.moved).sum::<usize>(),
                r.plan_bytes_max,
                r.gossip.total_bytes / 1e3,
                r.gossip.total_messages,
                r.failover_secs.map_or("–".to_owned(), |f| format!("{f:.2}")),
                r.clasp.as_ref().map_or("–".to_owned(), |c| format!(
                    "{:.2} / {:.3} ({} epochs)",
                    c.recall, c.false_positive_rate, c.epochs_fitted
                )),
                r.bad_weight_share.map_or("–".to_owned(), |s| format!("{s:.4}")),
            );
        }
        for (r, c) in self.runs.iter().zip(&self.costs) {
            if c.clasp_fit_unknowns > 0 {
                let _ = writeln!(
                    md,
                    "\n{} run: the longest CLASP fit of an epoch took {:.2} s of wall time ({} unknowns); the run {:.1} s.",
                    r.placement, c.clasp_fit_secs_max, c.clasp_fit_unknowns, c.run_secs
                );
            }
        }
        let m = self.main();
        let _ = writeln!(
            md,
            "\nGossip per node per epoch (every copy received): heartbeats {:.1} KB ({:.0} messages), loss records {:.1} KB, plans {:.1} KB, merges {:.1} KB. Spot-check evidence a validator fetches: {:.2} MB/s. Miners' lifecycles: {} merges reported past their deadline, {} late events refused. Merges' ledgers: {} members left out (late commitments), {} member-partitions kept local values.\n",
            m.gossip.heartbeat_bytes / 1e3,
            m.gossip.heartbeat_messages,
            m.gossip.loss_bytes / 1e3,
            m.gossip.plan_bytes / 1e3,
            m.gossip.merge_bytes / 1e3,
            m.spot_check_bytes_per_s / 1e6,
            m.merge_overruns,
            m.lifecycle_refused,
            m.merge_excluded,
            m.merge_kept_local
        );
        let _ = writeln!(md, "## Epochs of the first run\n");
        let _ = writeln!(
            md,
            "| epoch | start s | s | merge s | samples | miners | moved | plan bytes |"
        );
        let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|");
        for e in m.epochs.iter().take(40) {
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {} |",
                e.epoch, e.start, e.secs, e.merge_secs, e.samples, e.miners, e.moved, e.plan_bytes
            );
        }
        let _ = writeln!(
            md,
            "\n## Limits hit (first of each kind, in the order hit)\n"
        );
        if m.limits.is_empty() {
            let _ = writeln!(md, "None in this run.");
        }
        for limit in &m.limits {
            let _ = writeln!(md, "- {limit}");
        }
        md.push_str("\n```\n");
        md.push_str(&self.result_line());
        md.push_str("\n```\n");
        md
    }

    /// Tokens/s over virtual time, one line per run (datacenter runs left out), churn and
    /// failures as ticks along the bottom.
    pub(crate) fn svg(&self) -> String {
        let (w, h, pad) = (720.0, 300.0, 48.0);
        let runs: Vec<&Outcome> = self.runs.iter().filter(|r| !r.datacenter).collect();
        let t_max = self.main().virtual_secs.max(1.0);
        let y_max = runs
            .iter()
            .flat_map(|r| r.series.iter().map(|p| p.1))
            .fold(1.0, f64::max)
            * 1.1;
        let x = |t: f64| pad + (w - 2.0 * pad) * t / t_max;
        let y = |v: f64| h - pad - (h - 2.0 * pad) * v / y_max;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        let _ = writeln!(
            svg,
            "<text x=\"{pad}\" y=\"16\">{}: tokens/s over virtual time (max {:.0})</text>",
            self.scenario,
            y_max / 1.1
        );
        let _ = writeln!(
            svg,
            "<line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{}\" stroke=\"black\"/>",
            h - pad,
            w - pad,
            h - pad,
            h - pad
        );
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0} s</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0}</text>",
            w - pad,
            h - pad + 16.0,
            t_max,
            pad - 4.0,
            pad + 4.0,
            y_max
        );
        let colours = ["#1f77b4", "#d62728", "#2ca02c"];
        for (k, run) in runs.iter().enumerate() {
            let points: Vec<String> = run
                .series
                .iter()
                .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
                .collect();
            let colour = colours[k % colours.len()];
            let _ = writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
                points.join(" ")
            );
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" fill=\"{colour}\">{} placement</text>",
                w - pad - 140.0,
                pad + 14.0 * k as f64,
                run.placement
            );
        }
        for (t, what) in &self.main().events {
            let colour = if what.starts_with("leave") {
                "#999"
            } else if what.starts_with("join") {
                "#2ca02c"
            } else {
                "#d62728"
            };
            let _ = writeln!(
                svg,
                "<line x1=\"{0:.1}\" y1=\"{1}\" x2=\"{0:.1}\" y2=\"{2}\" stroke=\"{colour}\"><title>{what} at {t:.0} s</title></line>",
                x(*t),
                h - pad,
                h - pad - 8.0
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}
