//! The heartbeat: a task of its own that, every `--heartbeat-secs`, renews this node's hotkey
//! binding when half its life is gone, publishes a [`Heartbeat`] (with
//! the binding, the run hash, the node's epoch and stage, and its dashboard URL), refreshes
//! the live peers in `/status` (each as the run knows it, with only the run's dashboards
//! offered), tells the p2p layer who the run's members are (whose requests may use the whole
//! request byte budget), and, while nobody is elected, says now and then why.
//!
//! It reads what consensus agreed from consensus's view and tells consensus only of a
//! renewed binding; it ends (with [`ServiceGone`]) only when consensus has stopped.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use bootstrap::{Metagraph, PeerIdStr, RunConfig};
use p2p::Heartbeat;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::settings::{own_binding, NodeSettings, BINDING_LIFETIME};
use crate::metrics::ChainMetrics;
use crate::schedule::unix_ms;
use crate::services::consensus::api::{ConsensusHandle, ConsensusView};
use crate::services::inbox::ServiceGone;
use crate::services::observe::api::{run_peers, NodeView};
use crate::wire::topics::Topics;

/// How long a node waits for an orchestrator before it says why there is none, and how often
/// it says it again.
const NO_ORCHESTRATOR_HINT: Duration = Duration::from_secs(15);

/// Everything the heartbeat task works with.
pub(crate) struct Heartbeats {
    /// The network.
    pub(crate) client: p2p::Client,
    /// The run's topics (heartbeats; plans, for the `forge-plans` fault).
    pub(crate) topics: Topics,
    /// What consensus agreed, and where a renewed binding goes.
    pub(crate) consensus: ConsensusHandle,
    /// The node's `/status` view (live peers, their dashboards, heartbeats sent).
    pub(crate) view: watch::Sender<NodeView>,
    /// With `--subtensor`: the bound hotkeys gauge.
    pub(crate) chain_metrics: Option<ChainMetrics>,
    /// This node.
    pub(crate) me: PeerIdStr,
    /// This node's key, which counter-signs a renewed binding.
    pub(crate) keypair: p2p::identity::Keypair,
    /// This node's hotkey binding and when it expires.
    pub(crate) binding: Option<(p2p::HotkeyBinding, SystemTime)>,
    /// This node's `/status` URL, announced to its peers.
    pub(crate) dashboard: Option<String>,
    /// The node's settings (interval, role, hotkey, run, metagraph, faults).
    pub(crate) settings: NodeSettings,
    /// The dataset this node holds whole and serves, announced to its peers.
    pub(crate) dataset: Option<String>,
    /// The run configuration and stake snapshot this node advertises to joining nodes (its
    /// own, unless it lies on purpose with the `lie-join` fault).
    pub(crate) advertised: crate::join::JoinFiles,
    /// A miner's status: the capacity and pathway rate it announces.
    pub(crate) miner: Option<watch::Receiver<crate::services::miner::api::MinerStatus>>,
}

/// Starts the heartbeat task.
pub(crate) fn spawn(heartbeats: Heartbeats) -> JoinHandle<Result<(), ServiceGone>> {
    tokio::spawn(heartbeats.run())
}

impl Heartbeats {
    async fn run(mut self) -> Result<(), ServiceGone> {
        let mut interval = tokio::time::interval(self.settings.heartbeat);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        let mut last_hint: Option<Instant> = None;
        let mut counter = 0u64;
        let mut members = BTreeSet::new();
        loop {
            interval.tick().await;
            counter += 1;
            let agreed = self.consensus.view();
            if let Some(metrics) = &self.chain_metrics {
                metrics.bound_hotkeys.set(agreed.bound_hotkeys as i64);
            }
            self.renew_binding().await?;
            self.publish(&agreed, counter).await;
            // Say why nothing happens, now and then, while nobody is elected.
            let waiting = agreed.orchestrator.is_none()
                && started.elapsed() >= NO_ORCHESTRATOR_HINT
                && last_hint.is_none_or(|t| t.elapsed() >= NO_ORCHESTRATOR_HINT);
            if waiting {
                last_hint = Some(Instant::now());
                let live: BTreeSet<String> = agreed
                    .live
                    .peers
                    .iter()
                    .map(ToString::to_string)
                    .chain([self.me.to_string()])
                    .collect();
                let why = no_orchestrator_reason(self.settings.metagraph.as_ref(), &live);
                tracing::warn!("{why}");
            }
            let run = run_peers(&agreed.live, &agreed.validators, agreed.current.as_ref());
            self.view.send_modify(|v| {
                v.heartbeats_sent = counter;
                v.live_peers = agreed.live.peers.clone();
                v.peers = run.peers;
                v.peer_dashboards = run.dashboards;
            });
            members = self.tell_members(&agreed, members).await;
        }
    }

    /// Tells the p2p layer the run's members when they changed since `told`; returns what it
    /// now knows.
    async fn tell_members(
        &self,
        agreed: &ConsensusView,
        told: BTreeSet<PeerIdStr>,
    ) -> BTreeSet<PeerIdStr> {
        let members = run_members(agreed);
        if members == told {
            return told;
        }
        let peers = members
            .iter()
            .filter_map(crate::wire::peer::to_libp2p)
            .collect();
        match self.client.set_members(peers).await {
            Ok(()) => members,
            Err(error) => {
                tracing::debug!(%error, "run members not told to the network");
                told
            }
        }
    }

    /// Renews this node's binding at half its life, and tells consensus.
    async fn renew_binding(&mut self) -> Result<(), ServiceGone> {
        let (Some((_, expires)), Some(hotkey), Some(source)) =
            (&self.binding, &self.settings.hotkey, &self.settings.chain)
        else {
            return Ok(());
        };
        let left = expires
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        if left >= BINDING_LIFETIME / 2 {
            return Ok(());
        }
        match own_binding(hotkey, &self.keypair, source.netuid) {
            Ok(renewed) => {
                self.consensus
                    .own_binding(renewed.0.clone(), unix_ms(SystemTime::now()))
                    .await?;
                tracing::info!("hotkey binding renewed");
                self.binding = Some(renewed);
            }
            Err(error) => tracing::warn!(%error, "hotkey binding not renewed"),
        }
        Ok(())
    }

    /// A figure of the miner's status in thousandths, as heartbeats carry it.
    fn announced(
        &self,
        figure: impl Fn(&crate::services::miner::api::MinerStatus) -> Option<f64>,
    ) -> Option<u32> {
        let status = self.miner.as_ref()?.borrow();
        let value = figure(&status)?;
        (value.is_finite() && value > 0.0)
            .then(|| (value * 1000.0).round().min(f64::from(u32::MAX)) as u32)
    }

    /// Publishes the `counter`-th heartbeat (and, with the `forge-plans` fault, a forged plan).
    async fn publish(&self, agreed: &ConsensusView, counter: u64) {
        let beat = Heartbeat {
            peer_id: self.me.to_string(),
            role: self.settings.role,
            counter,
            sent_at_ms: unix_ms(SystemTime::now()),
            run_hash: if self.settings.faults.lie_join {
                self.advertised.run_hash().to_string()
            } else {
                agreed.run_hash.clone()
            },
            metagraph_hash: self.advertised.metagraph_hash().map(str::to_string),
            epoch: agreed.epoch(),
            stage: agreed.stage,
            dashboard: self.dashboard.clone(),
            binding: self.binding.as_ref().map(|(b, _)| b.clone()),
            dataset: self.dataset.clone(),
            capacity: self.announced(|s| s.capacity),
            pathway_rate: self.announced(|s| s.pathway_rate),
        };
        if let Err(error) = self
            .client
            .publish(&self.topics.heartbeat, beat.to_bytes())
            .await
        {
            tracing::debug!(%error, "heartbeat not published");
        }
        if self.settings.faults.forge_plans {
            forge_plan(
                &self.client,
                &self.topics.plan,
                &self.settings.run,
                &self.me,
                counter,
            )
            .await;
        }
    }
}

/// The run's members (pure): the validators with a permit and the miners of every kept plan
/// (a member of the epoch that just closed may still fetch merges and answer spot checks).
fn run_members(agreed: &ConsensusView) -> BTreeSet<PeerIdStr> {
    agreed
        .book
        .members()
        .into_values()
        .flatten()
        .chain(agreed.validators.iter().cloned())
        .collect()
}

/// Why no orchestrator is elected, for a node that waits on one (pure): `live` are the peers
/// heard (and this node).
fn no_orchestrator_reason(metagraph: Option<&Metagraph>, live: &BTreeSet<String>) -> String {
    let Some(metagraph) = metagraph else {
        return "no orchestrator: this node has no --metagraph, so nobody can be elected; start \
                every node of the run with the same --metagraph <file> (and --run <file>)"
            .into();
    };
    let candidates: Vec<String> = metagraph
        .neurons()
        .iter()
        .filter(|n| n.validator_permit && n.stake > 0)
        .map(|n| n.peer_id.to_string())
        .collect();
    if candidates.is_empty() {
        return "no orchestrator: the metagraph has no validator with a permit and stake".into();
    }
    let heard: Vec<&String> = candidates.iter().filter(|c| live.contains(*c)).collect();
    if heard.is_empty() {
        format!(
            "no orchestrator: no validator with stake is live; start one of {} with --validator \
             and the same --metagraph and --run",
            candidates.join(", ")
        )
    } else {
        format!(
            "no orchestrator yet: validator(s) {} are live, waiting for the election to settle \
             (a node of another --run is refused: check that every node uses the same file)",
            heard
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// Fault injection for tests: a node that is not the orchestrator publishes a plan naming
/// itself, which every honest node must drop.
async fn forge_plan(
    client: &p2p::Client,
    topic: &str,
    run: &RunConfig,
    me: &PeerIdStr,
    counter: u64,
) {
    let miners = BTreeSet::from([me.clone()]);
    let plan = bootstrap::next_plan(run, me, None, Some(counter + 1_000_000), &miners);
    match plan.map(|p| p.to_wire()) {
        Ok(Ok(bytes)) => {
            if let Err(error) = client.publish(topic, bytes).await {
                tracing::debug!(%error, "forged plan not published");
            }
        }
        _ => tracing::debug!("forged plan not built"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_members_are_the_permitted_validators_and_every_kept_plans_miners() {
        use crate::services::consensus::api::fixture;
        let (book, miners) = fixture::book(&[0, 1]);
        let validator = fixture::peer(1);
        let agreed = ConsensusView {
            validators: BTreeSet::from([validator.clone()]),
            current: book.current().cloned(),
            book: std::sync::Arc::new(book),
            ..ConsensusView::default()
        };
        let members = run_members(&agreed);
        let expected: BTreeSet<PeerIdStr> = miners.into_iter().chain([validator]).collect();
        assert_eq!(members, expected);
        assert!(!members.contains(&fixture::peer(99)));
    }

    #[test]
    fn a_waiting_node_says_why_nobody_is_elected() {
        let none = no_orchestrator_reason(None, &BTreeSet::new());
        assert!(none.contains("no --metagraph"), "{none}");
        let v = "12D3KooWLu6EsLa3gHbJx33AMA3ssTscrCEWeLH56hWM5xnLaeQB";
        let m = "12D3KooWNcQ3TSvfDjiVTgRfVkGXLiAYAz82Soata9Mm59LKg7Wo";
        let local = |stake: u64| {
            Metagraph::for_local_run(vec![
                bootstrap::metagraph::LocalNeuron {
                    peer_id: PeerIdStr::parse(v).unwrap(),
                    stake,
                    validator_permit: true,
                },
                bootstrap::metagraph::LocalNeuron {
                    peer_id: PeerIdStr::parse(m).unwrap(),
                    stake: 0,
                    validator_permit: false,
                },
            ])
            .unwrap()
        };
        let staked = local(100);
        let gone = no_orchestrator_reason(Some(&staked), &BTreeSet::from([m.to_string()]));
        assert!(
            gone.contains("no validator with stake is live") && gone.contains(v),
            "{gone}"
        );
        let heard = no_orchestrator_reason(Some(&staked), &BTreeSet::from([v.to_string()]));
        assert!(heard.contains("are live"), "{heard}");
        let unstaked = local(0);
        let empty = no_orchestrator_reason(Some(&unstaked), &BTreeSet::new());
        assert!(
            empty.contains("no validator with a permit and stake"),
            "{empty}"
        );
    }
}
