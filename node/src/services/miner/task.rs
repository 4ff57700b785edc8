//! The miner's task: the one owner of its [`MinerState`]. It takes plans, accepted gossip,
//! authorised requests and clock ticks from its bounded inbox, and its own tasks' reports
//! (lifecycle events, hop measurements, losses, the stage a preparation put in force) from a
//! second bounded inbox, in one `select!`; it publishes the views the other tasks read and the
//! miner's status as watch values.
//!
//! Requests are answered from tasks of their own (a forward pass must not hold up the next
//! plan); each plan's transition (merge, stage build, then the head's samples) runs on a task
//! of its own too, and the task never waits on any of them, so none of them can deadlock on
//! its inbox. When the stage's compute thread dies, the task stops: its handle then reports
//! the miner gone and the node exits, rather than heartbeating as a miner that fails every
//! sample.

use std::sync::Arc;
use std::time::Duration;

use bootstrap::{EpochPlan, PeerIdStr};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};
use training::StageHandle;

use super::api::{MinerHandle, MinerMsg, MinerStatus};
use super::context::{Ctx, Miner, Views};
use super::lifecycle::Overrun;
use super::state::{Before, InForce, MergeNews, MinerState, PhaseEvent, Routing};
use super::{evidence, hop, snapshot, transition, LOSS_BATCH};
use crate::services::inbox::INBOX;
use crate::wire::messages::{LossRecord, PipelineGossip, Service};

/// What the miner's own tasks tell its task.
pub(crate) enum Note {
    /// A lifecycle event, made at `at` (time since the miner started).
    Phase { at: Duration, event: PhaseEvent },
    /// `peer` answered a hop in `took`.
    HopAnswered { peer: PeerIdStr, took: Duration },
    /// `peer` failed a hop.
    HopFailed { peer: PeerIdStr },
    /// Loss records of `epoch` to gossip.
    Losses {
        epoch: u64,
        records: Vec<LossRecord>,
    },
    /// A training loss was seen.
    TrainLoss(f32),
    /// A backward pass finished.
    BackwardDone,
    /// As a head, the samples a second its last epoch completed.
    PathwayRate(f64),
    /// A preparation asks what it starts from.
    Before(oneshot::Sender<Before>),
    /// A merge of `param_count` parameters starts: how many samples it weighs.
    MergeStarts {
        param_count: u64,
        reply: oneshot::Sender<u64>,
    },
    /// The stage's weights are those of the merge of `epoch` (`None`: the run seed's).
    Weights { epoch: Option<u64>, hash: String },
    /// A plan is in force from now (answered once request handlers see it).
    PlanInForce(Box<EpochPlan>, oneshot::Sender<()>),
    /// A stage is in force from now (answered once request handlers see it).
    StageInForce {
        stage: u32,
        worker: StageHandle,
        done: oneshot::Sender<()>,
    },
    /// The compute thread of the stage just loaded, watched from now.
    ComputeThread(std::thread::JoinHandle<()>),
}

/// Starts the service; `loss_topic` is where the miner's loss records go. It runs until
/// it is told to shut down, every handle is dropped, or the compute thread dies.
pub(crate) fn spawn(miner: Miner, loss_topic: String) -> (MinerHandle, JoinHandle<()>) {
    let (tx, inbox) = mpsc::channel(INBOX);
    let (notes_tx, notes) = mpsc::channel(INBOX);
    let (status, status_rx) = watch::channel(MinerStatus::default());
    let (in_force, in_force_rx) = watch::channel(InForce::default());
    let (routing, routing_rx) = watch::channel(Routing::default());
    let (news, news_rx) = watch::channel(MergeNews::default());
    let views = Views {
        in_force: in_force_rx,
        routing: routing_rx,
        news: news_rx,
    };
    let task = Task {
        ctx: Arc::new(miner.into_context(views, notes_tx)),
        state: MinerState::default(),
        loss_topic,
        publish: Publish {
            status,
            in_force,
            routing,
            news,
        },
        transition: None,
        preparations: Vec::new(),
        thread: None,
    };
    let handle = MinerHandle {
        tx,
        status: status_rx,
    };
    (handle, tokio::spawn(task.run(inbox, notes)))
}

/// The watch values the task publishes.
struct Publish {
    status: watch::Sender<MinerStatus>,
    in_force: watch::Sender<InForce>,
    routing: watch::Sender<Routing>,
    news: watch::Sender<MergeNews>,
}

/// The miner's task.
struct Task {
    ctx: Arc<Ctx>,
    state: MinerState,
    loss_topic: String,
    publish: Publish,
    /// The current plan's transition (its merge and stage build, then its head loop).
    transition: Option<JoinHandle<()>>,
    /// The merges and stage builds started, for a shutdown to stop (a newer plan does not:
    /// they run to their end).
    preparations: Vec<AbortHandle>,
    /// The compute thread of the stage in force, joined at shutdown.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Whether the task goes on after a message.
enum Flow {
    Continue,
    /// Stop, freeing the stage.
    Stop,
    /// Stopped already (a shutdown answered).
    Stopped,
}

impl Task {
    async fn run(mut self, mut inbox: mpsc::Receiver<MinerMsg>, mut notes: mpsc::Receiver<Note>) {
        loop {
            let flow = tokio::select! {
                message = inbox.recv() => match message {
                    Some(message) => self.on_message(message).await,
                    None => Flow::Stop,
                },
                Some(note) = notes.recv() => {
                    self.on_note(note);
                    Flow::Continue
                }
            };
            match flow {
                Flow::Continue => {}
                Flow::Stop => break,
                Flow::Stopped => return,
            }
        }
        // Stopped for a dead compute thread, or every handle dropped: free the stage.
        self.shutdown(Duration::from_secs(5)).await;
    }

    async fn on_message(&mut self, message: MinerMsg) -> Flow {
        match message {
            MinerMsg::Plan(plan) => {
                self.on_plan(*plan);
                self.publish.status.send_replace(self.state.status());
            }
            MinerMsg::Gossip(message) => self.on_gossip(&message),
            MinerMsg::Request {
                peer,
                service,
                body,
                reply,
            } => {
                let ctx = self.ctx.clone();
                tokio::spawn(async move {
                    let _ = reply.send(answer(&ctx, &peer, service, body).await);
                });
            }
            MinerMsg::Tick { live } => {
                if !self.compute_alive() {
                    tracing::error!("the stage's compute thread stopped; the miner stops");
                    return Flow::Stop;
                }
                self.on_tick(live);
            }
            MinerMsg::Shutdown { grace, done } => {
                self.shutdown(grace).await;
                let _ = done.send(());
                return Flow::Stopped;
            }
        }
        Flow::Continue
    }

    /// Starts the transition into a newly accepted plan: merge of the epoch that ended,
    /// checkpoint, stage (re)build, then training of the new epoch.
    fn on_plan(&mut self, plan: EpochPlan) {
        if let Some(previous) = self.transition.take() {
            // Stop the previous epoch's head loop; its in-flight samples finish on their own.
            previous.abort();
        }
        let now = self.ctx.started.elapsed();
        match self.state.plan_accepted(now, &plan, &self.ctx.me) {
            Ok(phase) => tracing::debug!(?phase, "epoch phase"),
            Err(error) => {
                tracing::warn!(%error, "plan not entered");
                return;
            }
        }
        self.publish.news.send_replace(self.state.news());
        if self.ctx.cfg.faults.preclaim {
            let records = super::faults::preclaims(&self.ctx, &plan);
            let ctx = self.ctx.clone();
            let topic = self.loss_topic.clone();
            let epoch = plan.epoch;
            tokio::spawn(async move {
                for batch in records.chunks(LOSS_BATCH) {
                    publish_losses(&ctx, &topic, epoch, batch.to_vec()).await;
                }
            });
        }
        // The merge and the stage (re)build run to their end even when a newer plan arrives
        // (an aborted merge would leave the merge service's feed open and the replicas'
        // weights half merged): they run in a task of their own, one at a time, which the
        // newer plan's transition waits for.
        let prepared = tokio::spawn(transition::prepare_in_turn(self.ctx.clone(), plan.clone()));
        self.preparations.retain(|p| !p.is_finished());
        self.preparations.push(prepared.abort_handle());
        let ctx = self.ctx.clone();
        self.transition = Some(tokio::spawn(transition::enter_epoch(ctx, plan, prepared)));
    }

    /// Records what other miners gossip.
    fn on_gossip(&mut self, message: &PipelineGossip) {
        if let PipelineGossip::Merged {
            epoch, stage, hash, ..
        } = message
        {
            if self.state.merge_gossiped(*epoch, *stage, hash) {
                tracing::warn!(epoch, stage, "members gossiped different merge hashes");
            }
            self.publish.news.send_replace(self.state.news());
        }
    }

    /// The clock: deadlines, the live peers, buffered loss records, the status.
    fn on_tick(&mut self, live: std::sync::Arc<std::collections::BTreeSet<PeerIdStr>>) {
        if let Some(Overrun::Merge { epoch, late }) = self.state.tick(self.ctx.started.elapsed()) {
            tracing::warn!(
                epoch,
                late_s = late.as_secs_f64(),
                "the merge before this epoch is past its deadline"
            );
        }
        self.state.set_live(live);
        self.publish.routing.send_replace(self.state.routing());
        if let Some((epoch, records)) = self.state.take_losses(LOSS_BATCH) {
            let ctx = self.ctx.clone();
            let topic = self.loss_topic.clone();
            tokio::spawn(async move { publish_losses(&ctx, &topic, epoch, records).await });
        }
        self.publish.status.send_replace(self.state.status());
    }

    fn on_note(&mut self, note: Note) {
        match note {
            Note::Phase { at, event } => match self.state.phase(at, event) {
                Ok(phase) => tracing::debug!(?phase, "epoch phase"),
                // A late event of an older transition: changes nothing.
                Err(error) => tracing::debug!(%error, "epoch event out of order"),
            },
            Note::HopAnswered { peer, took } => {
                self.state.observe(peer, took);
                self.publish.routing.send_replace(self.state.routing());
            }
            Note::HopFailed { peer } => {
                self.state.penalise(peer, std::time::Instant::now());
                self.publish.routing.send_replace(self.state.routing());
            }
            Note::Losses { epoch, records } => self.state.push_losses(epoch, records),
            Note::TrainLoss(loss) => self.state.set_train_loss(loss),
            Note::BackwardDone => self.state.backward_done(),
            Note::PathwayRate(rate) => self.state.pathway_rate(rate),
            Note::Before(reply) => {
                let _ = reply.send(self.state.before());
            }
            Note::MergeStarts { param_count, reply } => {
                let _ = reply.send(self.state.merge_starts(param_count));
            }
            Note::Weights { epoch, hash } => self.state.set_weights(epoch, hash),
            Note::PlanInForce(plan, done) => {
                self.state.set_plan(*plan);
                self.publish.in_force.send_replace(self.state.in_force());
                let _ = done.send(());
            }
            Note::StageInForce {
                stage,
                worker,
                done,
            } => {
                let estimate = crate::run_spec::memory_estimate(
                    &self.ctx.cfg.run,
                    worker.config(),
                    super::stage_in_flight(stage, self.ctx.cfg.head_window),
                );
                let host =
                    crate::run_spec::host_memory_estimate(&self.ctx.cfg.run, worker.num_params());
                self.state.set_stage(
                    stage,
                    worker,
                    super::state::MemoryEstimate {
                        stage: estimate.map(|e| e.total()),
                        host: Some(host),
                    },
                );
                self.publish.status.send_replace(self.state.status());
                self.publish.in_force.send_replace(self.state.in_force());
                let _ = done.send(());
            }
            // The previous stage's thread (if any) ends once its last handle is dropped.
            Note::ComputeThread(thread) => self.thread = Some(thread),
        }
    }

    /// Whether the stage's compute thread, if one was started, still runs. A thread that
    /// died (a failed allocation, a libtorch abort caught as a panic) leaves a miner that
    /// would heartbeat and fail every sample: the node stops instead.
    fn compute_alive(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| !t.is_finished())
    }

    /// Stops training and waits (up to `grace`) for the stage's compute thread to end, so the
    /// process never exits while libtorch is mid-operation on another thread.
    async fn shutdown(&mut self, grace: Duration) {
        if let Some(task) = self.transition.take() {
            task.abort();
            let _ = task.await;
        }
        // Merges and stage builds outlive a transition, not the miner: they hold the stage.
        for preparation in self.preparations.drain(..) {
            preparation.abort();
        }
        let worker = self.state.take_worker();
        self.publish.in_force.send_replace(InForce::default());
        drop(worker);
        if let Some(thread) = self.thread.take() {
            let joined =
                tokio::time::timeout(grace, tokio::task::spawn_blocking(move || thread.join()))
                    .await;
            if joined.is_err() {
                tracing::warn!("the compute thread did not stop in time");
            }
        }
    }
}

/// Answers a pipeline request.
async fn answer(ctx: &Arc<Ctx>, peer: &PeerIdStr, service: Service, body: Vec<u8>) -> Vec<u8> {
    match service {
        Service::Forward => hop::serve_forward(ctx, &body).await,
        Service::Eval => hop::serve_eval(ctx, &body).await,
        Service::Weights => snapshot::serve(ctx, &body),
        Service::SpotCheck => evidence::serve(ctx, peer.as_str(), &body).await,
        // Other services'; the router never hands them to a miner.
        Service::Confirmation | Service::Data | Service::Join => {
            crate::wire::rpc::error_response(crate::wire::rpc::ErrorCode::UnknownService)
        }
    }
}

/// Publishes one batch of loss records: in one message, or halved until each half fits a
/// gossip message (records carry a receipt per stage, so a deep pipeline's batch may not).
async fn publish_losses(ctx: &Ctx, topic: &str, epoch: u64, records: Vec<LossRecord>) {
    let tokens_per_sample = u64::from(ctx.cfg.run.batch_size * ctx.cfg.run.seq_len);
    let mut batches = vec![records];
    while let Some(records) = batches.pop() {
        let message = PipelineGossip::Losses {
            epoch,
            tokens_per_sample,
            records,
        };
        match message.to_bytes() {
            Some(bytes) => {
                if let Err(error) = ctx.client.publish(topic, bytes).await {
                    tracing::debug!(%error, "loss records not published");
                }
            }
            None => {
                let PipelineGossip::Losses { mut records, .. } = message else {
                    continue;
                };
                if records.len() < 2 {
                    tracing::warn!(epoch, "a loss record too large for a gossip message");
                    continue;
                }
                let back = records.split_off(records.len() / 2);
                batches.push(back);
                batches.push(records);
            }
        }
    }
}
