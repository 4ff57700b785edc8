//! The `iota-p2p` node: one participant of a decentralized training run, and the tools around it.
//!
//! `iota-p2p [flags]` runs a node; `keygen` prepares an identity; `local-swarm` starts a
//! network of nodes on this machine. The binary's `main` calls [`main_entry`]; the
//! [`launcher`] is public so that multi-node tests start nodes the way `local-swarm` does.

mod cli;
mod http;
mod identity;
pub mod launcher;
pub mod merge;
mod metrics;
mod node;
mod orchestration;
mod status;
mod swarm;

use clap::Parser;

/// Parses the command line, runs what it asks for, and gives the process exit code.
pub fn main_entry() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    init_tracing();
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
            None => node::run(cli.node).await,
            Some(cli::Command::Keygen(args)) => keygen(&args),
            Some(cli::Command::LocalSwarm(args)) => swarm::run(args).await,
        }
    });
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
    let keypair = identity::load_or_create(&args.data_dir)?;
    println!("{}", keypair.public().to_peer_id());
    Ok(())
}

/// Logs to stderr; `RUST_LOG` filters (default `info`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
