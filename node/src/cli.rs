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
#[command(
    name = "iota-p2p",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    /// What to run; without a subcommand the binary runs one node.
    #[command(subcommand)]
    pub(crate) command: Option<Command>,

    /// Node options (used when no subcommand is given).
    #[command(flatten)]
    pub(crate) node: NodeArgs,
}

impl Cli {
    /// Parses the process's arguments (exiting with clap's message on a bad one). Node flags
    /// and a subcommand together are refused; a subcommand ignores the node's `IOTA_…`
    /// environment variables, so that a node setting (`IOTA_DEVICE=…`) cannot break it.
    pub(crate) fn parse_args() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let mut command = Cli::command();
        let subcommand = std::env::args_os()
            .nth(1)
            .and_then(|a| a.into_string().ok())
            .is_some_and(|a| command.find_subcommand(&a).is_some());
        if subcommand {
            command = command.mut_args(|a| a.env(None));
        }
        let matches = command.get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// Subcommands besides running a node.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create the node identity in a data directory (if absent) and print its peer id.
    Keygen(KeygenArgs),
    /// Train a whole network of nodes on 127.0.0.1: validators, miners, epochs, merges.
    LocalSwarm(LocalSwarmArgs),
    /// Train in one process: the reference every distributed figure is compared with.
    TrainLocal(TrainLocalArgs),
    /// Write a run's model (the latest merged weights of every stage) as one
    /// `model.safetensors` and a `config.json` in the Hugging Face Llama layout, with its
    /// `tokenizer.json` and the files `transformers` loads it with.
    Export(ExportArgs),
    /// Sample text from an exported model (token by token through its tokenizer, with a KV
    /// cache).
    Generate(GenerateArgs),
    /// Tokenize text, JSON Lines and Parquet files into a dataset of token shards (llm.c's
    /// `.bin` layout) with a `manifest.json` whose blake3 names it; or index `.bin` shards
    /// made elsewhere (`--index`).
    PrepareData(PrepareDataArgs),
    /// Print a subnet's neurons as read from subtensor: uid, hotkey, stake, permit, active,
    /// and the peer id a running node has verified for the hotkey. On dynamic-TAO runtimes
    /// the stake is the subnet's alpha (α), not TAO.
    Metagraph(MetagraphArgs),
    /// Run scenario files of thousands of miners on virtual time: the protocol's own code
    /// (election, plans, stage assignment, hop routing, butterfly plans, CLASP, Yuma) over
    /// modelled links and GPUs, in minutes of wall time; writes a report per scenario.
    Simulate(SimulateArgs),
}

/// Options of `simulate`.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Scenario files (TOML), repeatable; without one, every `*.toml` of `scenarios/`.
    #[arg(long, value_name = "FILE.toml")]
    pub(crate) scenario: Vec<PathBuf>,
    /// Directory for the reports (JSON, Markdown and an SVG per scenario).
    #[arg(long, value_name = "DIR", default_value = "out/simulate")]
    pub(crate) out: PathBuf,
    /// Seed over the scenario's own.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Virtual seconds to simulate over the scenario's own `duration_secs`.
    #[arg(long, value_parser = parse_positive_secs)]
    pub(crate) duration_secs: Option<f64>,
}

/// Options of `metagraph`.
#[derive(Debug, Args)]
pub(crate) struct MetagraphArgs {
    /// Subtensor node (`ws://` or `http://`).
    #[arg(long, value_name = "URL", value_parser = parse_chain_url)]
    pub(crate) subtensor: String,
    /// The subnet.
    #[arg(long, value_name = "N")]
    pub(crate) netuid: u16,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// A running node's HTTP server (its `--metrics` address, `http://IP:PORT`): the peer ids
    /// bound to the hotkeys are read from its `/status`.
    #[arg(long, value_name = "URL")]
    pub(crate) node: Option<String>,
}

/// Options of a node.
#[derive(Debug, Clone, Args)]
pub(crate) struct NodeArgs {
    /// Address to listen on (repeatable): TCP (`/ip4/<ip>/tcp/<port>`) and QUIC
    /// (`/ip4/<ip>/udp/<port>/quic-v1`). Loopback, both transports, by default; pass public
    /// addresses to take part in a network beyond this machine.
    #[arg(
        long = "listen",
        env = "IOTA_LISTEN",
        value_name = "MULTIADDR",
        value_delimiter = ',',
        default_value = "/ip4/127.0.0.1/tcp/0,/ip4/127.0.0.1/udp/0/quic-v1"
    )]
    pub(crate) listen: Vec<Multiaddr>,

    /// Address others can reach this node at (repeatable), as its operator knows it: a
    /// public IP and port, a forwarded port. It is the only address the node advertises (its
    /// listen addresses are then kept to itself), and it makes the node public: it keeps and
    /// dials only global addresses of its peers, never private or loopback ones.
    #[arg(
        long = "external-address",
        env = "IOTA_EXTERNAL_ADDRESS",
        value_name = "MULTIADDR",
        value_delimiter = ','
    )]
    pub(crate) external_address: Vec<Multiaddr>,

    /// Run a circuit relay server for peers behind NATs: `auto` (on a validator), `on` or
    /// `off`. It is offered only while the node is publicly reachable (AutoNAT confirmed it,
    /// or `--external-address` was given), within the `--relay-*` limits.
    #[arg(
        long = "relay-server",
        env = "IOTA_RELAY_SERVER",
        value_enum,
        default_value = "auto"
    )]
    pub(crate) relay_server: RelayServer,

    /// Relay server: most reservations held at once (each peer behind a NAT holds two, on
    /// two relays).
    #[arg(long = "relay-max-reservations", value_name = "N", default_value_t = 128,
        value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) relay_max_reservations: u32,

    /// Relay server: most circuits open at once.
    #[arg(long = "relay-max-circuits", value_name = "N", default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) relay_max_circuits: u32,

    /// Relay server: most MiB one circuit carries before it is closed (the peers open
    /// another, within the relay's rate limits).
    #[arg(long = "relay-circuit-mib", value_name = "MIB", default_value_t = 256,
        value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub(crate) relay_circuit_mib: u64,

    /// Relay server: longest a circuit stays open, in seconds.
    #[arg(long = "relay-circuit-secs", value_name = "SECS", default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub(crate) relay_circuit_secs: u64,

    /// Never replace a relayed connection by a hole-punched direct one (DCUtR): traffic
    /// with peers behind NATs stays on the relays.
    #[arg(long = "no-hole-punch", env = "IOTA_NO_HOLE_PUNCH")]
    pub(crate) no_hole_punch: bool,

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
    /// stake in rao, validator_permit); the same file on every node. Without it (or
    /// `--subtensor`) a node with `--bootstrap` fetches the one the run's validators
    /// advertise; a node with neither elects no orchestrator.
    #[arg(
        long,
        env = "IOTA_METAGRAPH",
        value_name = "FILE",
        conflicts_with = "subtensor"
    )]
    pub(crate) metagraph: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) chain: ChainArgs,

    #[command(flatten)]
    pub(crate) wallet: WalletArgs,

    /// Run configuration (TOML). Every node of a run must use the same one: its hash travels
    /// in heartbeats and a node of another run is refused. Without it, a node with
    /// `--bootstrap` fetches the run's from its validators (adopting what validators with
    /// more than half of the stake advertise), and a node without runs the built-in defaults.
    #[arg(long = "run", env = "IOTA_RUN_CONFIG", value_name = "FILE")]
    pub(crate) run: Option<PathBuf>,

    /// Accept only the run configuration of this hash (64 hex digits, as nodes print it):
    /// checked against `--run` when it is given, else against what the run's validators
    /// follow (a node whose pin they do not follow stops, saying what they follow).
    #[arg(long = "run-hash", env = "IOTA_RUN_HASH", value_name = "HEX", value_parser = parse_hash)]
    pub(crate) run_hash: Option<[u8; 32]>,

    /// Accept only the stake snapshot of this hash (64 hex digits): checked against
    /// `--metagraph` when it is given, else the only snapshot fetched. Pin it when you know
    /// the run's snapshot: an unpinned one is trusted on first use.
    #[arg(
        long = "metagraph-hash",
        env = "IOTA_METAGRAPH_HASH",
        value_name = "HEX",
        value_parser = parse_hash,
        conflicts_with = "subtensor"
    )]
    pub(crate) metagraph_hash: Option<[u8; 32]>,

    /// A dataset made by `prepare-data` (a directory with `manifest.json`), the one the run
    /// names: the node trains on it and serves it to peers. Without it a node whose run
    /// names a dataset fetches what it needs from the peers that serve it.
    #[arg(long = "data", env = "IOTA_DATA", value_name = "DIR")]
    pub(crate) data: Option<PathBuf>,

    /// Most gigabytes of dataset shards fetched from peers kept on disk (least recently
    /// used evicted first); they live under `--data-dir`, else the system's temporary
    /// directory.
    #[arg(long = "data-cache-gb", env = "IOTA_DATA_CACHE_GB", default_value_t = 10.0, value_parser = parse_cache_gb)]
    pub(crate) data_cache_gb: f64,

    /// Device the node's stages (a miner's, a validator's spot checks) compute on: `cpu`,
    /// `cuda` (the first GPU) or `cuda:N`; a CUDA device this machine lacks is refused.
    #[arg(long, env = "IOTA_DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub(crate) device: training::Device,

    /// Precision the node's stages compute in: `f32`, or `bf16` (bf16 compute over f32
    /// master weights and optimizer state; for GPUs).
    #[arg(long, env = "IOTA_DTYPE", default_value = "f32", value_parser = parse_dtype)]
    pub(crate) dtype: training::DType,

    /// Misbehave on purpose, to test that the other nodes cope (comma-separated).
    #[arg(
        long,
        env = "IOTA_FAULT",
        value_enum,
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) fault: Vec<Fault>,

    /// Seconds between heartbeats.
    #[arg(long, env = "IOTA_HEARTBEAT_SECS", default_value_t = 1.0, value_parser = parse_positive_secs)]
    pub(crate) heartbeat_secs: f64,

    /// Samples a head-stage miner keeps in flight. More keep the pipeline busier; each step
    /// then takes the gradients of the samples that finish together (a step never takes a
    /// stale gradient), so the effective batch grows with it. See docs/BENCHMARKS.md.
    #[arg(long, env = "IOTA_HEAD_WINDOW", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=8))]
    pub(crate) head_window: u64,

    /// As orchestrator, how to assign miners to stages: `count` balances each stage's miner
    /// count; `throughput` balances the samples a second its miners announce and lets heads
    /// draw in proportion to what their pathways carried (see `iota-p2p simulate`).
    #[arg(long, env = "IOTA_PLACEMENT", value_enum, default_value_t = crate::services::consensus::api::Placement::Count)]
    pub(crate) placement: crate::services::consensus::api::Placement,

    /// Activation checkpointing: a miner's stage keeps only each block's input for the
    /// samples in flight and recomputes the blocks in their backward pass: less memory per
    /// sample for one more forward pass, the same gradients. This node's own choice, not
    /// the run's. See docs/BENCHMARKS.md, "Memory per stage".
    #[arg(long, env = "IOTA_CHECKPOINT_ACTIVATIONS")]
    pub(crate) checkpoint_activations: bool,
}

/// Where a node reads stake from the chain, and how often it talks to it.
#[derive(Debug, Clone, Args)]
pub(crate) struct ChainArgs {
    /// Subtensor node to read the subnet's stake from and to submit weights to (`ws://` or
    /// `http://`; this build has no TLS), instead of `--metagraph`. A peer's stake
    /// counts only once it proves its hotkey (see `--hotkey`).
    #[arg(long, env = "IOTA_SUBTENSOR", value_name = "URL", requires = "netuid", value_parser = parse_chain_url)]
    pub(crate) subtensor: Option<String>,

    /// The subnet on the chain.
    #[arg(long, env = "IOTA_NETUID", value_name = "N", requires = "subtensor")]
    pub(crate) netuid: Option<u16>,

    /// Seconds between reads of the subnet's neurons (default: one tempo, 360 blocks of 12 s).
    #[arg(long, env = "IOTA_STAKE_REFRESH_SECS", default_value_t = 4320.0, value_parser = parse_refresh_secs)]
    pub(crate) stake_refresh_secs: f64,

    /// A validator submits its weights once every this many scored epochs.
    #[arg(long, env = "IOTA_WEIGHTS_EVERY", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub(crate) weights_every: u64,

    /// ... and never within this many blocks of its last submission (subtensor's default
    /// `WeightsSetRateLimit` is 100 blocks; a submission sooner is refused by the chain).
    #[arg(long, env = "IOTA_WEIGHTS_MIN_BLOCKS", default_value_t = 100)]
    pub(crate) weights_min_blocks: u64,

    /// Seconds one call to the chain node may take before it counts as failed.
    #[arg(long, env = "IOTA_CHAIN_TIMEOUT_SECS", default_value_t = 30.0, value_parser = parse_positive_secs)]
    pub(crate) chain_timeout_secs: f64,

    /// `version_key` of the weights submitted (the subnet's `WeightsVersionKey`).
    #[arg(long, env = "IOTA_WEIGHTS_VERSION_KEY", default_value_t = 0)]
    pub(crate) weights_version_key: u64,

    /// The chain's genesis hash (`0x` and 64 hex digits; finney's is
    /// `0x2f0555cc76fc2840a25a6ea3b9637146806f1f44b090c175ffde2a7e5ab36c03`): the node signs
    /// nothing for a `--subtensor` endpoint of another chain.
    #[arg(long, env = "IOTA_CHAIN_GENESIS", value_name = "HEX", value_parser = parse_genesis)]
    pub(crate) chain_genesis: Option<[u8; 32]>,
}

/// A Bittensor hotkey, given as a file or the wallet way (`<wallet-path>/<wallet>/hotkeys/<hotkey-name>`).
#[derive(Debug, Clone, Args)]
pub(crate) struct WalletArgs {
    /// Hotkey file (a Bittensor wallet's `hotkeys/<name>` JSON) the node proves its stake
    /// with: it signs a binding of this node's peer id that every heartbeat carries.
    #[arg(long, env = "IOTA_HOTKEY", value_name = "FILE", conflicts_with_all = ["wallet", "hotkey_name"])]
    pub(crate) hotkey: Option<PathBuf>,
    /// Directory of the Bittensor wallets (default `~/.bittensor/wallets`).
    #[arg(long = "wallet-path", env = "IOTA_WALLET_PATH", value_name = "DIR")]
    pub(crate) wallet_path: Option<PathBuf>,
    /// Wallet name (the hotkey is `<wallet-path>/<wallet>/hotkeys/<hotkey-name>`).
    #[arg(long = "wallet", env = "IOTA_WALLET", value_name = "NAME")]
    pub(crate) wallet: Option<String>,
    /// Hotkey name inside the wallet (default `default`).
    #[arg(
        long = "hotkey-name",
        env = "IOTA_HOTKEY_NAME",
        value_name = "NAME",
        requires = "wallet"
    )]
    pub(crate) hotkey_name: Option<String>,
}

/// Faults a node can be told to commit, for tests of the others' defences (and of its own
/// failure handling).
/// `--relay-server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RelayServer {
    /// On a validator, off on a miner.
    Auto,
    /// Always (offered only while publicly reachable).
    On,
    /// Never.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Fault {
    /// Publish an epoch plan every heartbeat, naming itself orchestrator.
    ForgePlans,
    /// Send activations (and gradients) declaring a batch of 1 024 windows: a few KiB of
    /// zeros on the wire that would cost the receiver hundreds of MB.
    HugeFrames,
    /// Claim every sample there is (`u64::MAX`) as its weight in the merge.
    InflateSamples,
    /// Commit and serve NaN weights in the merge.
    NanMerge,
    /// Commit and serve its weights scaled ×10 in the merge, claiming every sample the
    /// epoch could feed.
    PoisonMerge,
    /// Commit and serve random finite weights (of its weights' scale) in the merge,
    /// claiming every sample the epoch could feed.
    PoisonRandom,
    /// The stage's compute thread panics once the first epoch trains (as a failed allocation
    /// would end it): the node must exit with a clear error, not linger as a miner.
    ComputeDies,
    /// Answer with random activations and gradients of the right shape and scale.
    Noise,
    /// Serve samples but never take an optimizer step, bringing stale weights to the merge.
    Lazy,
    /// As `lazy`, but answer spot checks with one weight changed by one ulp, so that the
    /// weights shown never hash to the epoch's starting weights.
    LazyUlp,
    /// Forward honest activations, but send random gradients of the right shape and scale
    /// upstream (a middle stage's or a tail's backward pass, faked).
    NoiseGrad,
    /// As a tail, report losses 20 % below what was computed.
    LieLoss,
    /// As a tail, claim samples never served (one per sample served).
    Inflate,
    /// Lie about losses as `lie-loss` does, and answer every spot check `Superseded`
    /// (naming the merge its weights come from) instead of showing the evidence.
    Dodge,
    /// As a tail, publish a loss record of every sample the epoch's heads draw as soon as
    /// the plan is out, through pathways and at losses of its choosing, with receipts it
    /// signed itself (it cannot sign for the other hops) on half of them and none on the rest.
    Preclaim,
    /// Compute every sample five times as slowly (the compute thread sleeps four times what
    /// it computed): a slow GPU, for measuring placement by throughput.
    Slow,
    /// As a validator, publish weights that give everything to the lowest uid it scored
    /// (a validator out of line with the others, whom consensus must discount).
    SkewWeights,
    /// As a head, send (and compute on) the token ids of another sample than the one its
    /// sample id names.
    WrongTokens,
    /// Advertise (in heartbeats) and serve to joining nodes a run configuration other than
    /// the one it runs (its seed changed).
    LieJoin,
}

/// Options of `keygen`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["data_dir", "hotkey"])))]
pub(crate) struct KeygenArgs {
    /// Directory that holds (or will hold) the node identity.
    #[arg(long = "data-dir", env = "IOTA_DATA_DIR", value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Also (or only) create a test hotkey file, in the format of Bittensor wallets, at this
    /// path (refused if it exists); prints its SS58 address.
    #[arg(long = "hotkey", value_name = "FILE")]
    pub(crate) hotkey: Option<PathBuf>,
}

/// Options of `export`.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// A `local-swarm` output directory, or node data directories (repeatable): where the
    /// stages' checkpoints are. Every node of the run must be stopped.
    #[arg(long = "from", value_name = "DIR", required = true, num_args = 1..)]
    pub(crate) from: Vec<PathBuf>,
    /// Directory to write `model.safetensors`, `config.json` and the tokenizer's files into
    /// (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
    /// The `tokenizer.json` the run trained with (refused when it is not the one the run
    /// names); the model's vocabulary is its size. Default: the one a node cached with the
    /// run's dataset under `--from`, or the byte-level tokenizer of the embedded corpus.
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
    /// The run's configuration (TOML): the `run.toml` of a `local-swarm` output when there
    /// is one, else the built-in defaults.
    #[arg(long = "run", value_name = "FILE")]
    pub(crate) run: Option<PathBuf>,
    /// The epoch whose merged weights to export (default: the newest every stage has).
    #[arg(long)]
    pub(crate) epoch: Option<u64>,
}

/// Options of `generate`.
#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
    /// Directory `export` wrote (`config.json`, `model.safetensors` and `tokenizer.json`; an
    /// export without `tokenizer.json` is read as byte-level).
    #[arg(long, value_name = "DIR")]
    pub(crate) model: PathBuf,
    /// Text to continue.
    #[arg(long, default_value = "ROMEO:")]
    pub(crate) prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub(crate) tokens: u64,
    /// Softmax temperature; 0 always takes the most likely token.
    #[arg(long, default_value_t = 0.8, value_parser = parse_temperature)]
    pub(crate) temperature: f64,
    /// Sample among the k most likely tokens only (0: all of them; at most the tokenizer's
    /// vocabulary).
    #[arg(long = "top-k", default_value_t = 40, value_parser = clap::value_parser!(u64).range(0..=training::MAX_VOCAB as u64))]
    pub(crate) top_k: u64,
    /// Seed of the sampling: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
}

/// Options of `prepare-data`.
#[derive(Debug, Args)]
pub(crate) struct PrepareDataArgs {
    /// The tokenizer (a Hugging Face `tokenizer.json`); copied into the dataset.
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: PathBuf,
    /// Text (`.txt`: one document per file), JSON Lines (`.jsonl`) or Parquet (`.parquet`)
    /// files, or directories of them (walked recursively in name order; other files in them
    /// are skipped with a warning).
    #[arg(long, value_name = "PATH", num_args = 1.., required_unless_present = "index", conflicts_with = "index")]
    pub(crate) input: Vec<PathBuf>,
    /// Directory to write the dataset into (created if missing; a dataset already there is
    /// replaced once the new one is complete).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "index",
        conflicts_with = "index"
    )]
    pub(crate) out: Option<PathBuf>,
    /// Write a manifest for the `.bin` shards in this directory (llm.c's or nanoGPT's), without
    /// rewriting them, instead of tokenizing inputs.
    #[arg(long, value_name = "DIR")]
    pub(crate) index: Option<PathBuf>,
    /// The JSON Lines field, or the Parquet column, that holds each document's text.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "text",
        conflicts_with = "index"
    )]
    pub(crate) text_field: String,
    /// The token appended to every document (default: the first of `<|endoftext|>`, `</s>`,
    /// `<|end_of_text|>`, `<eos>` that the tokenizer has).
    #[arg(long, value_name = "TOKEN")]
    pub(crate) eod_token: Option<String>,
    /// Most tokens per shard.
    #[arg(long, value_name = "N", default_value_t = 100_000_000, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64), conflicts_with = "index")]
    pub(crate) shard_tokens: u64,
    /// Hold out exactly the first N tokens for validation (default: every hundredth
    /// document, about 1 % of the tokens).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "index")]
    pub(crate) val_tokens: Option<u64>,
    /// With `--index`: the held-out shards' file names (default: those whose name contains
    /// `val`, llm.c's convention).
    #[arg(long, value_name = "NAME", value_delimiter = ',', requires = "index")]
    pub(crate) val_shards: Vec<String>,
}

/// A softmax temperature: a finite number of at least 0.
fn parse_temperature(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(format!("{s:?} is not a number of at least 0")),
    }
}

/// Options of `local-swarm`.
#[derive(Debug, Args)]
pub(crate) struct LocalSwarmArgs {
    /// Number of miner processes.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) miners: u32,
    /// How the validators assign miners to stages when they orchestrate: `count` or
    /// `throughput` (see the node's `--placement`).
    #[arg(long, value_enum, default_value_t = crate::services::consensus::api::Placement::Count)]
    pub(crate) placement: crate::services::consensus::api::Placement,
    /// Number of validator processes (at least one: a validator orchestrates).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub(crate) validators: u32,
    /// Pipeline stages the model is cut into.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub(crate) stages: u32,
    /// Epochs to train.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) epochs: u32,
    /// Samples each head miner draws per epoch.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) samples_per_epoch: u64,
    /// Model preset: tiny, small, base, large, llama-3.2-1b or llama-3.2-3b.
    #[arg(long, default_value = "tiny", value_parser = parse_preset)]
    pub(crate) preset: training::Preset,
    /// Directory for the nodes' data, their logs and the report: emptied first when it is the
    /// output of an earlier local-swarm, refused when it holds anything else.
    #[arg(long, value_name = "DIR", default_value = "out/local-swarm")]
    pub(crate) out: PathBuf,
    /// Seconds the whole run may take before it is stopped as failed.
    #[arg(long, default_value_t = 1200)]
    pub(crate) timeout_secs: u64,
    /// Miners that misbehave: MODE[:COUNT], repeatable. Modes: noise, noise-grad, lazy,
    /// lazy-ulp, lie-loss, inflate, preclaim, dodge, inflate-samples, nan-merge, poison-merge,
    /// poison-random, wrong-tokens, slow (miners), skew-weights (a validator). Adversaries join in the order given.
    /// The report shows what the validators made of them.
    #[arg(long, value_name = "MODE[:COUNT]", value_parser = parse_adversary)]
    pub(crate) adversary: Vec<Adversary>,
    /// Held-out loss of the single-process reference after the same tokens, drawn in
    /// `loss.svg` as a line (the swarm benchmark passes the one it measured).
    #[arg(long, value_name = "NATS")]
    pub(crate) reference_loss: Option<f64>,
    /// Run configuration fields (TOML) over the swarm's own: e.g. `outer_lr = 1.5`.
    #[arg(long = "run", value_name = "FILE")]
    pub(crate) run: Option<PathBuf>,
    /// A Hugging Face Llama `config.json` whose shape the run trains (its `[model]` table)
    /// instead of the preset's; the vocabulary stays the run's. Refused with a `--run` whose
    /// `[model]` table differs.
    #[arg(long, value_name = "CONFIG.JSON", conflicts_with = "preset", value_parser = parse_model_config)]
    pub(crate) model_config: Option<bootstrap::ModelShape>,
    /// Train on a dataset made by `prepare-data` instead of the embedded corpus. Only the
    /// first validator is given it: every other node fetches what it needs from it.
    #[arg(long = "data", value_name = "DIR")]
    pub(crate) data: Option<PathBuf>,
    /// Start every miner with `--checkpoint-activations` (recompute each block in the
    /// backward pass instead of keeping its activations).
    #[arg(long)]
    pub(crate) checkpoint_activations: bool,
    /// Devices the nodes compute on, comma-separated: `cpu`, `cuda` (every node shares the
    /// first GPU), or a list such as `cuda:0,cuda:1` dealt round-robin in start-up order
    /// (validators first, then miners: node i gets entry i mod the list's length).
    #[arg(long, value_delimiter = ',', default_value = "cpu", value_parser = parse_device)]
    pub(crate) device: Vec<training::Device>,
    /// Precision every node computes in: f32, or bf16 (bf16 compute over f32 master weights
    /// and optimizer state).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub(crate) dtype: training::DType,
    /// End once the report is written, without exporting the model and sampling text from
    /// it (which takes a while for the large presets).
    #[arg(long)]
    pub(crate) no_sample: bool,
}

/// Options of `train-local`.
#[derive(Debug, Args)]
pub(crate) struct TrainLocalArgs {
    /// Model preset: tiny, small, base, large, llama-3.2-1b or llama-3.2-3b.
    #[arg(long, default_value = "tiny", value_parser = parse_preset)]
    pub(crate) preset: training::Preset,
    /// A Hugging Face Llama `config.json` whose shape is trained instead of the preset's;
    /// the vocabulary stays the data's.
    #[arg(long, value_name = "CONFIG.JSON", conflicts_with = "preset", value_parser = parse_model_config)]
    pub(crate) model_config: Option<bootstrap::ModelShape>,
    /// The model of a run configuration (TOML) instead of the preset's: its `[model]` table,
    /// else its preset. Only the model is taken from it; the vocabulary stays the data's.
    #[arg(long = "run", value_name = "FILE", conflicts_with_all = ["preset", "model_config"], value_parser = parse_run_model)]
    pub(crate) run_model: Option<training::ModelConfig>,
    /// Optimizer steps (one sample of `--batch` windows each).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) steps: u64,
    /// Stages the model is split into inside this process (tensors cross the wire codec).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) stages: u64,
    /// Bottleneck width at every stage boundary (0: none).
    #[arg(long, default_value_t = 0)]
    pub(crate) bottleneck: usize,
    /// How a boundary compresses: iota (linear encoder and decoder beside a truncated
    /// identity), plain (no identity), resbm (two-layer encoder and decoder beside the
    /// identity) or subspace (the residual stream confined to a fixed subspace).
    #[arg(long, default_value = "iota", value_parser = parse_bottleneck_kind)]
    pub(crate) bottleneck_kind: training::BottleneckKind,
    /// Element encoding on the wire: f32, bf16, int8 or int4.
    #[arg(long, default_value = "f32", value_parser = parse_wire)]
    pub(crate) wire: training::WireDtype,
    /// Element encoding of the gradients sent back (default: the same as `--wire`).
    #[arg(long, value_parser = parse_wire)]
    pub(crate) grad_wire: Option<training::WireDtype>,
    /// Seed of initialisation and data order.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// libtorch threads.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(crate) threads: u64,
    /// Windows per sample.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) batch: u64,
    /// Tokens per window.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=8192))]
    pub(crate) seq_len: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub(crate) lr: f64,
    /// Evaluate every this many steps.
    #[arg(long, default_value_t = 100)]
    pub(crate) eval_interval: usize,
    /// Samples whose forward pass through the stages before the tail runs ahead of the
    /// current sample's backward pass (as in a pipeline with that many more samples in
    /// flight): their gradients are that many steps stale. 0 is plain training.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=64))]
    pub(crate) stale: u64,
    /// Train on a dataset made by `prepare-data` instead of the embedded corpus.
    #[arg(long = "data", value_name = "DIR")]
    pub(crate) data: Option<PathBuf>,
    /// Device: cpu, cuda or cuda:N; a CUDA device this machine lacks is refused.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub(crate) device: training::Device,
    /// Recompute each block in the backward pass instead of keeping its activations (less
    /// memory, one more forward pass, the same gradients).
    #[arg(long)]
    pub(crate) checkpoint_activations: bool,
    /// Precision: f32, or bf16 (bf16 compute over f32 master weights and optimizer state).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub(crate) dtype: training::DType,
}

/// Parses a model preset.
fn parse_preset(s: &str) -> Result<training::Preset, String> {
    s.parse()
        .map_err(|e: training::preset::ParseNameError| e.to_string())
}

/// The text of the file a flag names, at most `limit` bytes.
fn read_flag_file(path: &str, limit: usize) -> Result<String, String> {
    crate::fsio::read_limited(std::path::Path::new(path), limit as u64)
        .map_err(|e| format!("cannot read {path}: {e}"))
}

/// Reads a `--model-config` file: the shape of a Hugging Face Llama `config.json`.
fn parse_model_config(path: &str) -> Result<bootstrap::ModelShape, String> {
    let text = read_flag_file(path, bootstrap::MAX_HF_CONFIG_BYTES)?;
    bootstrap::model_shape_from_hf_config(&text).map_err(|e| format!("{path}: {e}"))
}

/// Reads a train-local `--run` file: the model of a run configuration.
fn parse_run_model(path: &str) -> Result<training::ModelConfig, String> {
    let text = read_flag_file(path, bootstrap::MAX_RUN_CONFIG_BYTES)?;
    let run = bootstrap::RunConfig::from_toml_str(&text).map_err(|e| format!("{path}: {e}"))?;
    Ok(crate::run_spec::model(&run))
}

/// Parses a bottleneck kind.
fn parse_bottleneck_kind(s: &str) -> Result<training::BottleneckKind, String> {
    s.parse::<training::BottleneckKind>()
        .map_err(|e| e.to_string())
}

/// Parses a wire format.
fn parse_wire(s: &str) -> Result<training::WireDtype, String> {
    s.parse::<training::WireDtype>().map_err(|e| e.to_string())
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

/// Parses a compute device, refusing a CUDA device this machine does not have.
fn parse_device(s: &str) -> Result<training::Device, String> {
    let device = training::parse_device(s).map_err(|e| e.to_string())?;
    present(device, training::cuda_device_count())?;
    Ok(device)
}

/// `device`, on a machine where libtorch sees `cuda_devices` GPUs: the CPU always exists, a
/// GPU only below that count.
fn present(device: training::Device, cuda_devices: i64) -> Result<(), String> {
    match device {
        training::Device::Cuda(_) if cuda_devices <= 0 => Err(
            "CUDA is not available on this machine (no GPU, no driver, or a CPU-only libtorch)"
                .to_string(),
        ),
        training::Device::Cuda(i) if i as i64 >= cuda_devices => Err(format!(
            "cuda:{i} does not exist: this machine has {cuda_devices} CUDA device(s)"
        )),
        _ => Ok(()),
    }
}

/// Parses a compute precision.
fn parse_dtype(s: &str) -> Result<training::DType, String> {
    s.parse::<training::DType>().map_err(|e| e.to_string())
}

/// A genesis hash: `0x` (optional) and 64 hex digits.
/// Parses a blake3 hash: 64 hex digits.
fn parse_hash(s: &str) -> Result<[u8; 32], String> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(s, &mut hash)
        .map_err(|_| format!("{s:?} is not a hash (64 hex digits)"))?;
    Ok(hash)
}

fn parse_genesis(s: &str) -> Result<[u8; 32], String> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(s.strip_prefix("0x").unwrap_or(s), &mut hash)
        .map_err(|_| format!("{s:?} is not a block hash (0x and 64 hex digits)"))?;
    Ok(hash)
}

/// Checks a chain node's URL (`ws://` or `http://`, a host, a port) before the node starts.
fn parse_chain_url(s: &str) -> Result<String, String> {
    crate::services::chain::api::check_url(s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}

/// Parses the seconds between stake refreshes: at least 1, at most a day.
fn parse_refresh_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (1.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err("expected a number of seconds in [1, 86400]".into()),
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
    fn a_cuda_device_is_refused_where_the_machine_has_none_or_fewer() {
        use training::Device::{Cpu, Cuda};
        assert_eq!(present(Cpu, 0), Ok(()));
        let none = present(Cuda(0), 0).unwrap_err();
        assert!(none.contains("CUDA is not available"), "{none}");
        assert_eq!(present(Cuda(1), 2), Ok(()));
        let missing = present(Cuda(2), 2).unwrap_err();
        assert!(
            missing.contains("cuda:2") && missing.contains("2 CUDA"),
            "{missing}"
        );
        assert!(parse_dtype("bf16").is_ok());
        assert!(parse_dtype("fp16").unwrap_err().contains("f32, bf16"));
    }

    #[test]
    fn a_genesis_hash_is_32_bytes_of_hex() {
        let finney = "0x2f0555cc76fc2840a25a6ea3b9637146806f1f44b090c175ffde2a7e5ab36c03";
        let bytes = parse_genesis(finney).unwrap();
        assert_eq!(hex::encode(bytes), finney[2..]);
        assert_eq!(bytes[..2], [0x2f, 0x05]);
        assert_eq!(parse_genesis(&finney[2..]), parse_genesis(finney));
        assert!(parse_genesis("0x2f05").is_err());
        assert!(parse_genesis(&format!("{finney}00")).is_err());
        assert!(parse_genesis(&finney.replace('f', "g")).is_err());
    }

    #[test]
    fn chain_urls_are_checked_before_the_node_starts() {
        assert!(parse_chain_url("ws://127.0.0.1:9944").is_ok());
        assert!(parse_chain_url("http://localhost:9933/").is_ok());
        let tls = parse_chain_url("wss://entrypoint-finney.opentensor.ai:443").unwrap_err();
        assert!(tls.contains("ws://127.0.0.1:9944"), "{tls}");
        assert!(parse_chain_url("ftp://x").is_err());
        assert!(parse_chain_url("ws://").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

/// One `--adversary` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Adversary {
    /// What it does.
    pub(crate) fault: Fault,
    /// How many miners do it.
    pub(crate) count: u32,
}

/// Parses `MODE[:COUNT]`.
pub(crate) fn parse_adversary(text: &str) -> Result<Adversary, String> {
    let (mode, count) = match text.split_once(':') {
        Some((mode, count)) => (
            mode,
            count
                .parse::<u32>()
                .ok()
                .filter(|c| *c >= 1)
                .ok_or_else(|| format!("--adversary {text}: COUNT must be a whole number ≥ 1"))?,
        ),
        None => (text, 1),
    };
    let fault = <Fault as clap::ValueEnum>::from_str(mode, false).map_err(|_| {
        format!("--adversary {text}: unknown mode {mode:?}; expected one of {MODES}")
    })?;
    if fault_name(fault).is_none() {
        return Err(format!(
            "--adversary {text}: {mode} is not a miner's misbehaviour; expected one of {MODES}"
        ));
    }
    Ok(Adversary { fault, count })
}

/// The modes `--adversary` takes.
pub(crate) const MODES: &str =
    "noise, noise-grad, lazy, lazy-ulp, lie-loss, inflate, preclaim, inflate-samples, nan-merge, poison-merge, poison-random, dodge, wrong-tokens, slow (miners), skew-weights (a validator)";

/// The `--fault` value of a miner misbehaviour (`None` for faults that are not one).
pub(crate) fn fault_name(fault: Fault) -> Option<&'static str> {
    match fault {
        Fault::Noise => Some("noise"),
        Fault::Lazy => Some("lazy"),
        Fault::LazyUlp => Some("lazy-ulp"),
        Fault::NoiseGrad => Some("noise-grad"),
        Fault::LieLoss => Some("lie-loss"),
        Fault::Inflate => Some("inflate"),
        Fault::Dodge => Some("dodge"),
        Fault::Preclaim => Some("preclaim"),
        Fault::InflateSamples => Some("inflate-samples"),
        Fault::NanMerge => Some("nan-merge"),
        Fault::PoisonMerge => Some("poison-merge"),
        Fault::PoisonRandom => Some("poison-random"),
        Fault::SkewWeights => Some("skew-weights"),
        Fault::WrongTokens => Some("wrong-tokens"),
        Fault::Slow => Some("slow"),
        Fault::ForgePlans | Fault::HugeFrames | Fault::ComputeDies | Fault::LieJoin => None,
    }
}

/// A cache size in gigabytes: a finite number, at least 0.01.
fn parse_cache_gb(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(gb) if gb.is_finite() && gb >= 0.01 => Ok(gb),
        _ => Err(format!(
            "{text:?} is not a size in gigabytes of at least 0.01"
        )),
    }
}
