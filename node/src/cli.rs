//! Command line of the `iota-p2p` binary.
//!
//! Every node flag can also be set through an `IOTA_…` environment variable; a bad value is
//! rejected by clap before anything starts, with a message naming the flag.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use p2p::Multiaddr;

/// A peer-to-peer node that pretrains one language model together with other nodes.
#[derive(Debug, Parser)]
#[command(name = "iota-p2p", version, about, long_about = None)]
pub(crate) struct Cli {
    /// What to run; without a subcommand the binary runs one node.
    #[command(subcommand)]
    pub(crate) command: Option<Command>,

    /// Node options (used when no subcommand is given).
    #[command(flatten)]
    pub(crate) node: NodeArgs,
}

/// Subcommands besides running a node.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create the node identity in a data directory (if absent) and print its peer id.
    Keygen(KeygenArgs),
    /// Start a small network of nodes on 127.0.0.1 and show them discover each other.
    LocalSwarm(LocalSwarmArgs),
}

/// Options of a node.
#[derive(Debug, Clone, Args)]
pub(crate) struct NodeArgs {
    /// Address to listen on (repeatable). Loopback by default; pass a public address to take
    /// part in a network beyond this machine.
    #[arg(
        long = "listen",
        env = "IOTA_LISTEN",
        value_name = "MULTIADDR",
        value_delimiter = ',',
        default_value = "/ip4/127.0.0.1/tcp/0"
    )]
    pub(crate) listen: Vec<Multiaddr>,

    /// Peer to join the network through (repeatable); must end in `/p2p/<peer id>`.
    #[arg(
        long = "bootstrap",
        env = "IOTA_BOOTSTRAP",
        value_name = "MULTIADDR",
        value_delimiter = ',',
        value_parser = parse_bootstrap
    )]
    pub(crate) bootstrap: Vec<Multiaddr>,

    /// Directory for the node's identity and checkpoints; created if missing. Without it the
    /// node gets a fresh identity each start.
    #[arg(long = "data-dir", env = "IOTA_DATA_DIR", value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,

    /// Run as a validator (audits miners; may be elected orchestrator when it has stake).
    #[arg(long, env = "IOTA_VALIDATOR")]
    pub(crate) validator: bool,

    /// Serve `GET /metrics` (Prometheus) and `GET /status` (JSON) on this address.
    #[arg(long, env = "IOTA_METRICS", value_name = "IP:PORT")]
    pub(crate) metrics: Option<SocketAddr>,

    /// Stake snapshot of the run (JSON: netuid, block, neurons with uid, hotkey, peer_id,
    /// stake in rao, validator_permit); the same file on every node. Without it no
    /// orchestrator can be elected.
    #[arg(long, env = "IOTA_METAGRAPH", value_name = "FILE")]
    pub(crate) metagraph: Option<PathBuf>,

    /// Run configuration (TOML); built-in defaults without it. Every node of a run must use
    /// the same one: its hash travels in heartbeats and a node of another run is refused.
    #[arg(long = "run", env = "IOTA_RUN_CONFIG", value_name = "FILE")]
    pub(crate) run: Option<PathBuf>,

    /// Misbehave on purpose, to test that the other nodes cope.
    #[arg(long, env = "IOTA_FAULT", value_enum, hide = true)]
    pub(crate) fault: Option<Fault>,

    /// Seconds between heartbeats.
    #[arg(long, env = "IOTA_HEARTBEAT_SECS", default_value_t = 1.0, value_parser = parse_positive_secs)]
    pub(crate) heartbeat_secs: f64,
}

/// Faults a node can be told to commit, for tests of the others' defences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Fault {
    /// Publish an epoch plan every heartbeat, naming itself orchestrator.
    ForgePlans,
}

/// Options of `keygen`.
#[derive(Debug, Args)]
pub(crate) struct KeygenArgs {
    /// Directory that holds (or will hold) the node identity.
    #[arg(long = "data-dir", env = "IOTA_DATA_DIR", value_name = "DIR")]
    pub(crate) data_dir: PathBuf,
}

/// Options of `local-swarm`.
#[derive(Debug, Args)]
pub(crate) struct LocalSwarmArgs {
    /// Number of miner processes.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) miners: u32,
    /// Number of validator processes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub(crate) validators: u32,
    /// Directory for the nodes' data and the report; a temporary one by default.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Seconds to wait for every node to see every other one.
    #[arg(long, default_value_t = 60)]
    pub(crate) timeout_secs: u64,
}

/// Parses a `--bootstrap` address: a multiaddr that names the peer it reaches.
fn parse_bootstrap(s: &str) -> Result<Multiaddr, String> {
    let addr: Multiaddr = s.parse().map_err(|e| {
        format!("not a multiaddr ({e}); expected e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3Koo…")
    })?;
    match addr.iter().last() {
        Some(p2p::multiaddr::Protocol::P2p(_)) => Ok(addr),
        _ => Err("must end in /p2p/<peer id> (the LISTEN line a node prints gives it)".into()),
    }
}

/// Parses a positive number of seconds.
fn parse_positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err("expected a number of seconds in (0, 3600]".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_needs_a_peer_id() {
        assert!(parse_bootstrap("/ip4/127.0.0.1/tcp/4001").is_err());
        assert!(parse_bootstrap("not an address").is_err());
        let ok = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN";
        assert!(parse_bootstrap(ok).is_ok());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
