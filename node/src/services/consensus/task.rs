//! The consensus task: one task that owns the node's [`Orchestration`] and the run's shared
//! picture (the plan book, the pipeline gossip's rules, liveness, the run statistics). It
//! takes heartbeats, plans, pipeline gossip and clock ticks from its bounded inbox, answers
//! each with its verdict, saves every plan the state adopts (the IO stays here, outside the
//! state), publishes all of it as a watch value, and publishes this node's own plans when it
//! orchestrates.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use bootstrap::PeerIdStr;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::liveness::{LivePeers, Liveness};
use super::plan_book::PlanBook;
use super::plan_store::PlanStore;
use super::state::Orchestration;
use super::stats::{EpochStats, RunStats};
use super::validate::{plan_verdict, PipelineRules};
use crate::rules::Verdict;
use crate::services::consensus::api::{
    ConsensusHandle, ConsensusMsg, ConsensusView, PipelineReason,
};
use crate::services::inbox::INBOX;
use crate::wire::messages::PipelineGossip;

/// What the consensus task is started with.
pub(crate) struct ConsensusParts {
    /// The pure core, set up (and possibly continued from a stored plan).
    pub(crate) orchestration: Orchestration,
    /// Where adopted plans are saved, with a data dir.
    pub(crate) store: Option<PlanStore>,
    /// The network, for this node's own plans.
    pub(crate) client: p2p::Client,
    /// The plan topic.
    pub(crate) plan_topic: String,
}

/// Starts the service; it runs until every handle is dropped.
pub(crate) fn spawn(parts: ConsensusParts) -> (ConsensusHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(INBOX);
    let publisher = Publisher {
        client: parts.client,
        topic: parts.plan_topic,
    };
    let (consensus, view) = Consensus::new(parts.orchestration, parts.store, publisher);
    let task = tokio::spawn(run(consensus, rx));
    (ConsensusHandle { tx, view }, task)
}

/// Publishes this node's own plans.
struct Publisher {
    client: p2p::Client,
    topic: String,
}

impl Publisher {
    /// Publishes from a task: the inbox keeps moving while the network loop is busy (once an
    /// epoch, and only on the orchestrator).
    fn publish(&self, bytes: Vec<u8>) {
        let client = self.client.clone();
        let topic = self.topic.clone();
        tokio::spawn(async move {
            if let Err(error) = client.publish(&topic, bytes).await {
                tracing::warn!(%error, "plan not published");
            }
        });
    }
}

/// Everything the task owns.
struct Consensus {
    orchestration: Orchestration,
    store: Option<PlanStore>,
    book: Arc<PlanBook>,
    rules: PipelineRules,
    liveness: Liveness,
    live: Arc<LivePeers>,
    stats: RunStats,
    epochs: Arc<Vec<EpochStats>>,
    started: Instant,
    publisher: Publisher,
    view: watch::Sender<ConsensusView>,
    /// The metagraph generation the rules' validators were taken from.
    validators_of: u64,
}

impl Consensus {
    fn new(
        orchestration: Orchestration,
        store: Option<PlanStore>,
        publisher: Publisher,
    ) -> (Self, watch::Receiver<ConsensusView>) {
        let mut book = PlanBook::default();
        if let Some(plan) = orchestration.current() {
            book.insert(plan.clone());
        }
        let mut rules = PipelineRules::new(orchestration.run());
        // Who may publish weights: the validators of the metagraph in force, refreshed
        // whenever it changes (see `judge_pipeline`).
        rules.set_validators(orchestration.validators());
        let validators_of = orchestration.metagraph_generation();
        let (view, rx) = watch::channel(ConsensusView::default());
        let consensus = Consensus {
            liveness: Liveness::new(orchestration.run().heartbeat_timeout()),
            orchestration,
            store,
            book: Arc::new(book),
            rules,
            live: Arc::default(),
            stats: RunStats::default(),
            epochs: Arc::default(),
            started: Instant::now(),
            publisher,
            view,
            validators_of,
        };
        consensus.publish();
        (consensus, rx)
    }

    /// Handles one message. Whatever it changes in the view is published before its answer
    /// goes out: whoever hears "accepted" reads the new plan.
    fn on_message(&mut self, message: ConsensusMsg) {
        let now = self.started.elapsed();
        match message {
            ConsensusMsg::Heartbeat {
                peer,
                author,
                beat,
                wall_ms,
                reply,
            } => {
                let verdict = self
                    .orchestration
                    .on_heartbeat(&author, &beat, now, wall_ms);
                if verdict.is_ok() {
                    self.liveness
                        .observe(peer, *beat, Instant::now().into_std());
                }
                // Liveness reaches the view on the next tick.
                let _ = reply.send(verdict);
            }
            ConsensusMsg::Plan {
                author,
                data,
                reply,
            } => {
                let outcome = self
                    .orchestration
                    .on_plan(&author, &data, now, SystemTime::now());
                self.take_adopted();
                let verdict = plan_verdict(outcome, self.orchestration.is_validator(&author));
                if verdict == Verdict::Accept {
                    let current = self.orchestration.current();
                    tracing::info!(epoch = ?current.map(|p| p.epoch), stage = ?self.orchestration.stage(), "epoch plan accepted");
                }
                self.publish();
                let _ = reply.send(verdict);
            }
            ConsensusMsg::Pipeline {
                author,
                message,
                reply,
            } => {
                let verdict = self.judge_pipeline(&author, &message);
                if verdict == Verdict::Accept {
                    self.stats.observe(author.as_str(), &message, now);
                    if let PipelineGossip::Weights { epoch, weights } = &*message {
                        self.orchestration
                            .on_weights(author, *epoch, weights.clone());
                        self.publish();
                    }
                }
                let _ = reply.send((verdict, message));
            }
            ConsensusMsg::Weights {
                validator,
                epoch,
                weights,
            } => {
                self.orchestration.on_weights(validator, epoch, weights);
                self.publish();
            }
            ConsensusMsg::OwnBinding { binding, wall_ms } => {
                self.orchestration.on_own_binding(&binding, wall_ms);
                self.publish();
            }
            ConsensusMsg::ChainStake(stake) => {
                self.orchestration
                    .on_chain_stake(*stake, crate::schedule::unix_ms(SystemTime::now()));
                self.publish();
            }
            ConsensusMsg::Tick => self.tick(),
        }
    }

    /// The rules' verdict on pipeline gossip of `author`, with the validators allowed to
    /// publish weights taken from the metagraph in force now: on a chain run it changes as
    /// stake is read and hotkey bindings arrive.
    fn judge_pipeline(
        &mut self,
        author: &PeerIdStr,
        message: &PipelineGossip,
    ) -> Verdict<PipelineReason> {
        let generation = self.orchestration.metagraph_generation();
        if generation != self.validators_of {
            self.rules.set_validators(self.orchestration.validators());
            self.validators_of = generation;
        }
        self.rules.check(&self.book, author.as_str(), message)
    }

    /// The clock: who is live, where the epoch stands, the election, and this node's plan.
    fn tick(&mut self) {
        self.live = Arc::new(self.liveness.snapshot(Instant::now().into_std()));
        let live_now: BTreeSet<String> = self
            .live
            .peers
            .iter()
            .map(ToString::to_string)
            .chain(std::iter::once(self.orchestration.me().to_string()))
            .collect();
        let progress = self
            .stats
            .progress(self.orchestration.current(), &self.book, &live_now);
        let plan = self
            .orchestration
            .tick(self.started.elapsed(), SystemTime::now(), progress);
        self.take_adopted();
        self.epochs = Arc::new(self.stats.epochs());
        self.publish();
        if let Some(bytes) = plan {
            self.publisher.publish(bytes);
        }
    }

    /// Takes the plan the state adopted, if it is new, into the plan book and the store.
    fn take_adopted(&mut self) {
        let Some(plan) = self.orchestration.current() else {
            return;
        };
        if self.book.get(plan.epoch).is_some() {
            return;
        }
        if let Some(store) = &self.store {
            if let Err(error) = store.save(plan) {
                tracing::warn!(%error, "plan not persisted");
            }
        }
        Arc::make_mut(&mut self.book).insert(plan.clone());
    }

    /// The view of everything.
    fn view(&self) -> ConsensusView {
        let o = &self.orchestration;
        ConsensusView {
            run_hash: o.run_hash().to_hex(),
            current: o.current().cloned(),
            orchestrator: o.orchestrator().map(|p| p.to_string()),
            is_orchestrator: o.is_orchestrator(),
            validators: o.validators(),
            stage: o.stage(),
            weights: o.consensus_weights().cloned(),
            uids: o.uids(),
            metagraph_generation: o.metagraph_generation(),
            bindings: o.bindings(),
            bound_hotkeys: o.bound_hotkeys(),
            book: self.book.clone(),
            live: self.live.clone(),
            epochs: self.epochs.clone(),
        }
    }

    /// Updates the watch value when anything in it changed: the view is derived whole and
    /// compared whole, so no field can be forgotten.
    fn publish(&self) {
        let new = self.view();
        self.view.send_if_modified(|current| {
            if *current == new {
                return false;
            }
            *current = new;
            true
        });
    }
}

async fn run(mut consensus: Consensus, mut inbox: mpsc::Receiver<ConsensusMsg>) {
    while let Some(message) = inbox.recv().await {
        consensus.on_message(message);
    }
}

#[cfg(test)]
mod tests {
    use bootstrap::{LocalNeuron, Metagraph, RAO_PER_TAO};
    use p2p::Role;
    use tokio::sync::oneshot;

    use super::*;
    use crate::services::consensus::plan_book::fixture::{book, peer, run};

    /// A metagraph of the plan's orchestrator (peer 1, a validator), its miners, and peer 150
    /// with or without a validator permit.
    fn metagraph(permit_150: bool) -> Metagraph {
        let neuron = |peer_id, stake, validator_permit| LocalNeuron {
            peer_id,
            stake,
            validator_permit,
        };
        Metagraph::for_local_run(
            [
                neuron(peer(1), 100 * RAO_PER_TAO, true),
                neuron(peer(150), 50 * RAO_PER_TAO, permit_150),
            ]
            .into_iter()
            .chain((10..16).map(|i| neuron(peer(i), 0, false))),
        )
        .expect("a valid metagraph")
    }

    async fn judge(consensus: &mut Consensus, author: u8, epoch: u64) -> Verdict<PipelineReason> {
        let (reply, answer) = oneshot::channel();
        consensus.on_message(ConsensusMsg::Pipeline {
            author: peer(author),
            message: Box::new(PipelineGossip::Weights {
                epoch,
                weights: vec![(2, 65535)],
            }),
            reply,
        });
        answer.await.expect("an answer").0
    }

    #[tokio::test]
    async fn a_validator_permitted_after_start_may_publish_weights() {
        let (plans, _) = book(&[0, 1]);
        let plan = plans.current().expect("a plan").clone();
        let orchestration = Orchestration::new(
            peer(1),
            Role::Validator,
            run(),
            Some(metagraph(false)),
            Some(plan),
        );
        let (client, _events, _task) = p2p::spawn(
            p2p::identity::Keypair::generate_ed25519(),
            p2p::Config::default(),
            p2p::Metrics::unregistered(),
        )
        .expect("a p2p node on 127.0.0.1");
        let publisher = Publisher {
            client,
            topic: "plans".into(),
        };
        let (mut consensus, _view) = Consensus::new(orchestration, None, publisher);
        assert_eq!(
            judge(&mut consensus, 150, 0).await,
            Verdict::Reject(PipelineReason::WeightsNotValidator),
            "no permit yet"
        );
        // The metagraph in force changes (a chain read, or a binding): peer 150 now holds a
        // validator permit, and its weights are taken from then on.
        consensus.orchestration.set_metagraph(metagraph(true));
        assert_eq!(judge(&mut consensus, 150, 0).await, Verdict::Accept);
        // And the other way: a permit withdrawn stops them.
        consensus.orchestration.set_metagraph(metagraph(false));
        assert_eq!(
            judge(&mut consensus, 150, 0).await,
            Verdict::Reject(PipelineReason::WeightsNotValidator)
        );
    }
}
