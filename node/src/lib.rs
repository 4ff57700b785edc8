//! The `iota-p2p` node: one participant of a decentralized training run, and the tools around it.
//!
//! `iota-p2p [flags]` runs a node; `keygen` prepares an identity (and a test hotkey);
//! `metagraph` prints a subnet as subtensor holds it; `local-swarm` starts a
//! network of nodes on this machine; `export` writes a run's model and `generate` samples
//! from it. The binary's `main` calls [`main_entry`]; the
//! [`launcher`] is public so that multi-node tests start nodes the way `local-swarm` does.
//!
//! # Layout
//!
//! Each unit uses only units of its own layer or the layers below it, and reaches a service
//! only through that service's `api` (`tests/layers.rs` checks both, and fails on any import
//! cycle):
//!
//! 1. **Formats and bridges** — `wire` (request bodies, pipeline gossip, topics, the service
//!    tags of the shared request-response protocol), `run_spec` (the one bridge from the run
//!    configuration to the training crate), `schedule` (when a plan's merge starts and how
//!    long it may take), `metrics`, `fsio` (files written whole), and `services::inbox` (the
//!    bounded inbox every service's handle uses).
//! 2. **Rules** — `rules`: what every message's rules answer with (a gossip verdict with a
//!    typed reason, a request refusal) and the frame shapes the miner and the validator both
//!    check; each message's own rules live in its service's `validate`. `join`: which run
//!    configuration and stake snapshot a node joining with `--bootstrap` alone adopts (the
//!    validators' stake-weighted vote), and what every node serves to one.
//! 3. **Services** (`services/<name>/`), each a task that owns its state behind a bounded
//!    inbox and publishes what others may read as a watch value; its `api` holds its
//!    messages, handle, views and typed reasons, the rest is its own:
//!    * consensus: heartbeats, the stake election, epoch plans;
//!    * miner: the stage, the forward/backward traffic, the head's epoch;
//!    * merge: the butterfly all-reduce over libp2p, the miner's merges and the validator's
//!      audits;
//!    * validator: spot checks, merge audits, scoring and weights;
//!    * chain: with `--subtensor`, the reader of the subnet's stake, a validator's
//!      `set_weights` submitter, and the `metagraph` command;
//!    * observe: `/status`, `/metrics` and the dashboard at `/`;
//!    * data: the run's tokens (the embedded corpus or a dataset's shards), served to
//!      peers and fetched from them;
//!
//!    and `services::spot_check_tests`, a test of a miner and a validator together (each
//!    through its `api`).
//! 4. **Router** — `router`: the only consumer of the p2p layer's events. It decodes every
//!    message, has the owning service's rules judge it, reports every gossip verdict to
//!    gossipsub, and hands the message to its service's inbox.
//! 5. **Application and tools** — `app` (settings, the services started and stopped, the
//!    heartbeat), `cli`, and `tools`: `launcher`, `local-swarm`, `export`, fuzzing inputs.

#![warn(missing_docs)]

mod app;
mod cli;
mod fsio;
mod join;
mod metrics;
mod router;
mod rules;
mod run_spec;
mod schedule;
mod services;
mod tools;
mod wire;

pub use services::{chain, merge};
#[doc(hidden)]
pub use tools::fuzzing;
pub use tools::launcher;
pub use wire::rpc;

use anyhow::Context;

/// How long the process waits, once its work has ended, for blocking tasks still running.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Parses the command line, runs what it asks for, and gives the process exit code.
pub fn main_entry() -> std::process::ExitCode {
    let cli = cli::Cli::parse_args();
    // A simulation runs the protocol's code for thousands of virtual nodes: its per-node
    // logs would drown the report, so it logs warnings only unless RUST_LOG says otherwise.
    init_tracing(if matches!(cli.command, Some(cli::Command::Simulate(_))) {
        "warn"
    } else {
        "info"
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            None => app::run(cli.node).await,
            Some(cli::Command::Keygen(args)) => keygen(&args),
            Some(cli::Command::Metagraph(args)) => {
                services::chain::api::metagraph_command(&services::chain::api::MetagraphQuery {
                    subtensor: args.subtensor,
                    netuid: args.netuid,
                    json: args.json,
                    node: args.node,
                })
                .await
            }
            Some(cli::Command::LocalSwarm(args)) => tools::swarm::run(args).await,
            Some(cli::Command::Export(args)) => {
                tokio::task::spawn_blocking(move || tools::export::run(&args)).await?
            }
            Some(cli::Command::PrepareData(args)) => {
                tokio::task::spawn_blocking(move || tools::prepare_data::run(&args)).await?
            }
            Some(cli::Command::Generate(args)) => {
                tokio::task::spawn_blocking(move || generate(&args)).await?
            }
            Some(cli::Command::Simulate(args)) => {
                tokio::task::spawn_blocking(move || tools::simulate::run(&args)).await?
            }
            Some(cli::Command::TrainLocal(args)) => {
                tokio::task::spawn_blocking(move || train_local(&args)).await?
            }
        }
    });
    // Dropping the runtime would wait for every blocking task still running (a stage's
    // recomputation, a hash over a large stage): a node asked to stop leaves them instead,
    // as it would on a crash, which the checkpoints survive by design.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    // The compute threads whose handles went with the runtime end after their current
    // command; libtorch must not be torn down under them.
    if !training::worker::wait_for_compute_threads(SHUTDOWN_GRACE) {
        eprintln!("warning: a stage's computation was still running at exit");
    }
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Creates the identity in `--data-dir` if absent and prints the peer id as the last line.
fn keygen(args: &cli::KeygenArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.data_dir {
        let keypair = app::identity::load_or_create(dir)?;
        println!("{}", keypair.public().to_peer_id());
    }
    if let Some(path) = &args.hotkey {
        let key = bootstrap::identity::NewHotkey::generate().context("drawing a new hotkey")?;
        bootstrap::identity::write_hotkey_file(path, &key, false)
            .with_context(|| format!("--hotkey {}", path.display()))?;
        println!("{}", key.pair().hotkey());
    }
    Ok(())
}

/// Samples from an exported model and prints the prompt with its continuation.
fn generate(args: &cli::GenerateArgs) -> anyhow::Result<()> {
    let model = training::generate::Model::load(&args.model)?;
    let sampling = training::generate::Sampling {
        tokens: usize::try_from(args.tokens)?,
        temperature: args.temperature,
        top_k: usize::try_from(args.top_k)?,
        seed: args.seed,
    };
    let text = model.generate(&args.prompt, &sampling)?;
    println!("{}{text}", args.prompt);
    Ok(())
}

/// Runs the single-process reference trainer, printing progress and the `RESULT` line.
fn train_local(args: &cli::TrainLocalArgs) -> anyhow::Result<()> {
    let cfg = training::LocalConfig {
        preset: args.preset,
        model: match &args.model_config {
            Some(shape) => Some(run_spec::model_shape(shape)),
            None => args.run_model.clone(),
        },
        steps: args.steps as usize,
        stages: args.stages as usize,
        bottleneck: training::Bottleneck::new(args.bottleneck_kind, args.bottleneck),
        wire: args.wire,
        grad_wire: args.grad_wire,
        seed: args.seed,
        threads: args.threads as usize,
        batch: args.batch as usize,
        seq_len: args.seq_len as usize,
        lr: args.lr,
        eval_interval: args.eval_interval,
        stale: args.stale as usize,
        device: args.device,
        checkpoint_activations: args.checkpoint_activations,
        dtype: args.dtype,
        data: args.data.clone(),
        ..training::LocalConfig::default()
    };
    let bytes_per_token = match &args.data {
        Some(dir) => training::TrainingData::Shards(std::sync::Arc::new(
            training::Dataset::open(dir, None)
                .with_context(|| format!("--data {}", dir.display()))?,
        ))
        .val_bytes_per_token(),
        None => tools::train_local::EMBEDDED_BYTES_PER_TOKEN,
    };
    let report = training::local::run(&cfg, |p| {
        println!("{}", tools::train_local::progress_line(p, bytes_per_token));
    })?;
    println!(
        "{}",
        tools::train_local::result_line(&report, bytes_per_token)
    );
    Ok(())
}

/// Logs to stderr; `RUST_LOG` filters (default `default`).
fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
