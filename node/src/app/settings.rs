//! A node's settings: everything `run` needs to know before it starts anything, gathered
//! from the command line in one place.
//!
//! [`NodeSettings::from_args`] reads the files the flags name (`--run`, `--metagraph`, the
//! hotkey), each refused before it is read when it is larger than its format allows, and
//! returns an `anyhow` error whose context names the flag: the node prints it and exits
//! with a failure. Everything else here is pure — the role, the chain source, the
//! bootstrap peers, the fault switches, the warnings a misconfigured node logs — and is
//! unit-tested below.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use bootstrap::identity::HotkeyPair;
use bootstrap::{Metagraph, PeerIdStr, RunConfig};
use p2p::{identity::Keypair, Multiaddr, PeerId, Role};

use crate::cli::{ChainArgs, Fault, NodeArgs, WalletArgs};
use crate::services::chain::api::{Policy, RpcLimits, StakeSource, Submitter};
use crate::services::data::api::DataSettings;
use crate::services::miner::api::MinerFaults;

/// How long a node's own hotkey binding lives; it is renewed at half its life.
pub(crate) const BINDING_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a node runs with, read from its flags and the files they name.
#[derive(Clone)]
pub(crate) struct NodeSettings {
    /// The run configuration (`--run`, or the built-in defaults).
    pub(crate) run: RunConfig,
    /// The stake snapshot of `--metagraph`, if given.
    pub(crate) metagraph: Option<Metagraph>,
    /// The hotkey of `--hotkey` or of the wallet flags, if any was given.
    pub(crate) hotkey: Option<HotkeyPair>,
    /// Where the stake is read from with `--subtensor` and `--netuid`.
    pub(crate) chain: Option<StakeSource>,
    /// How a validator submits its weights to the chain.
    pub(crate) weights: WeightsSettings,
    /// Miner or validator (`--validator`).
    pub(crate) role: Role,
    /// Where the node listens and whom it joins through.
    pub(crate) network: NetworkSettings,
    /// What the node was told to get wrong on purpose (`--fault`).
    pub(crate) faults: Faults,
    /// Time between heartbeats (`--heartbeat-secs`).
    pub(crate) heartbeat: Duration,
    /// How this node assigns miners to stages when it orchestrates (`--placement`).
    pub(crate) placement: crate::services::consensus::api::Placement,
    /// The node's identity and checkpoints (`--data-dir`).
    pub(crate) data_dir: Option<PathBuf>,
    /// What a miner computes on and how many samples a head keeps in flight.
    pub(crate) compute: ComputeSettings,
    /// Where `/metrics` and `/status` are served (`--metrics`).
    pub(crate) metrics: Option<SocketAddr>,
    /// The run's data: `--data`, and where fetched shards are cached.
    pub(crate) data: DataSettings,
    /// What the node must fetch from the run before it starts (`--bootstrap` without `--run`
    /// or, off the chain, without `--metagraph`); none when it has both.
    pub(crate) join: Option<super::join::JoinSpec>,
}

/// Where the node listens and whom it joins through.
#[derive(Debug, Clone)]
pub(crate) struct NetworkSettings {
    /// `--listen`.
    pub(crate) listen: Vec<Multiaddr>,
    /// `--bootstrap`, as given.
    pub(crate) bootstrap: Vec<Multiaddr>,
    /// The peers those addresses name (every one does: the CLI refuses any other).
    pub(crate) bootstrap_peers: BTreeSet<PeerId>,
    /// `--external-address`.
    pub(crate) external: Vec<Multiaddr>,
    /// The relay server's limits (`--relay-server` and `--relay-*`); `None` runs none.
    pub(crate) relay_server: Option<p2p::RelayLimits>,
    /// Not `--no-hole-punch`.
    pub(crate) hole_punch: bool,
}

/// A miner's compute.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ComputeSettings {
    /// `--device` and `--dtype`.
    pub(crate) stage: crate::run_spec::Compute,
    /// `--head-window`.
    pub(crate) head_window: usize,
    /// `--checkpoint-activations`.
    pub(crate) checkpoint_activations: bool,
}

/// How a validator submits its weights (the chain flags besides the stake source's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WeightsSettings {
    /// `--weights-version-key`.
    pub(crate) version_key: u64,
    /// `--weights-every` and `--weights-min-blocks`.
    pub(crate) policy: Policy,
    /// `--chain-genesis`.
    pub(crate) genesis: Option<[u8; 32]>,
}

/// The `--fault` switches, by who acts on them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Faults {
    /// The miner's.
    pub(crate) miner: MinerFaults,
    /// A validator's weights given to the lowest uid it scored.
    pub(crate) skew_weights: bool,
    /// A plan published every heartbeat, naming this node orchestrator.
    pub(crate) forge_plans: bool,
    /// Another run configuration advertised and served to joining nodes.
    pub(crate) lie_join: bool,
}

impl NodeSettings {
    /// Reads the node's settings from its flags and the files they name; an error names the
    /// flag at fault.
    pub(crate) fn from_args(args: &NodeArgs) -> anyhow::Result<NodeSettings> {
        let run = load_run_config(args)?;
        let metagraph = load_metagraph(args)?;
        let hotkey = load_hotkey(&args.wallet)?;
        let chain = chain_source(&args.chain)?;
        let join = join_spec(args, &run, metagraph.as_ref(), chain.as_ref())?;
        Ok(NodeSettings {
            run,
            metagraph,
            hotkey,
            chain,
            weights: WeightsSettings {
                version_key: args.chain.weights_version_key,
                policy: Policy {
                    every_epochs: args.chain.weights_every,
                    min_blocks: args.chain.weights_min_blocks,
                },
                genesis: args.chain.chain_genesis,
            },
            role: role(args.validator),
            network: NetworkSettings {
                listen: args.listen.clone(),
                bootstrap: args.bootstrap.clone(),
                bootstrap_peers: bootstrap_peers(&args.bootstrap),
                external: args.external_address.clone(),
                relay_server: relay_limits(args),
                hole_punch: !args.no_hole_punch,
            },
            faults: faults(&args.fault),
            heartbeat: seconds(args.heartbeat_secs, "--heartbeat-secs")?,
            placement: args.placement,
            data_dir: args.data_dir.clone(),
            compute: ComputeSettings {
                stage: crate::run_spec::Compute {
                    device: args.device,
                    dtype: args.dtype,
                },
                head_window: usize::try_from(args.head_window).unwrap_or(1),
                checkpoint_activations: args.checkpoint_activations,
            },
            metrics: args.metrics,
            data: DataSettings {
                dir: args.data.clone(),
                cache: args.data_dir.as_ref().map(|d| d.join("datasets")),
                cache_bytes: (args.data_cache_gb * 1e9) as u64,
            },
            join,
        })
    }

    /// What a validator's weight submitter needs, when this node has a chain and a hotkey.
    pub(crate) fn submitter(&self) -> Option<Submitter> {
        let (source, hotkey) = (self.chain.as_ref()?, self.hotkey.as_ref()?);
        Some(Submitter {
            url: source.url.clone(),
            netuid: source.netuid,
            version_key: self.weights.version_key,
            policy: self.weights.policy,
            hotkey: hotkey.clone(),
            limits: source.limits,
            genesis: self.weights.genesis,
        })
    }

    /// Why this node's hotkey (or its lack) does not do what the operator may think, if so.
    pub(crate) fn hotkey_warning(&self) -> Option<&'static str> {
        match (&self.hotkey, &self.chain) {
            (Some(_), None) => Some("--hotkey has no effect without --subtensor: the stake comes from --metagraph, which names peer ids itself"),
            (None, Some(_)) => Some("no --hotkey: with stake from the chain this node has none, so it cannot be elected, registered, or submit weights"),
            _ => None,
        }
    }

    /// Why a validator `me` will never be elected by the `--metagraph` it was given, if so
    /// (with stake from the chain, the chain decides, and nothing is known yet).
    pub(crate) fn permit_warning(&self, me: &PeerIdStr) -> Option<&'static str> {
        if self.role != Role::Validator || self.chain.is_some() {
            return None;
        }
        match self.metagraph.as_ref().and_then(|m| m.by_peer_id(me)) {
            Some(n) if n.validator_permit => None,
            Some(_) => {
                Some("this validator has no permit in the metagraph; it will never be elected")
            }
            None => Some("this validator is not in the metagraph; it will never be elected"),
        }
    }

    /// This node's first hotkey binding, when it has a hotkey and reads stake from the chain;
    /// logs what the hotkey does (or why it does nothing).
    pub(crate) fn first_binding(
        &self,
        keypair: &Keypair,
    ) -> anyhow::Result<Option<(p2p::HotkeyBinding, SystemTime)>> {
        if let Some(warning) = self.hotkey_warning() {
            tracing::warn!("{warning}");
        }
        let (Some(hotkey), Some(source)) = (&self.hotkey, &self.chain) else {
            return Ok(None);
        };
        let (binding, expires) = own_binding(hotkey, keypair, source.netuid)?;
        tracing::info!(hotkey = %hotkey.hotkey(), netuid = source.netuid, "this node speaks for its hotkey");
        Ok(Some((binding, expires)))
    }
}

/// Miner unless `--validator`.
/// The relay server a node runs: on a validator unless `--relay-server off`, on any node with
/// `--relay-server on`.
fn relay_limits(args: &NodeArgs) -> Option<p2p::RelayLimits> {
    let on = match args.relay_server {
        crate::cli::RelayServer::On => true,
        crate::cli::RelayServer::Off => false,
        crate::cli::RelayServer::Auto => args.validator,
    };
    on.then(|| p2p::RelayLimits {
        max_reservations: usize::try_from(args.relay_max_reservations).unwrap_or(usize::MAX),
        max_circuits: usize::try_from(args.relay_max_circuits).unwrap_or(usize::MAX),
        max_circuit_bytes: args.relay_circuit_mib << 20,
        max_circuit_duration: std::time::Duration::from_secs(args.relay_circuit_secs),
        ..p2p::RelayLimits::default()
    })
}

fn role(validator: bool) -> Role {
    if validator {
        Role::Validator
    } else {
        Role::Miner
    }
}

/// The stake source of `--subtensor` and `--netuid` (the CLI requires both or neither).
fn chain_source(args: &ChainArgs) -> anyhow::Result<Option<StakeSource>> {
    let (Some(url), Some(netuid)) = (&args.subtensor, args.netuid) else {
        return Ok(None);
    };
    Ok(Some(StakeSource {
        url: url.clone(),
        netuid,
        refresh: seconds(args.stake_refresh_secs, "--stake-refresh-secs")?,
        limits: RpcLimits {
            call_timeout: seconds(args.chain_timeout_secs, "--chain-timeout-secs")?,
            ..Default::default()
        },
    }))
}

/// The peers the `--bootstrap` addresses name (their last `/p2p/<peer>`).
fn bootstrap_peers(addrs: &[Multiaddr]) -> BTreeSet<PeerId> {
    addrs
        .iter()
        .filter_map(|a| match a.iter().last() {
            Some(p2p::multiaddr::Protocol::P2p(peer)) => Some(peer),
            _ => None,
        })
        .collect()
}

/// The `--fault` list as switches.
fn faults(list: &[Fault]) -> Faults {
    let on = |fault: Fault| list.contains(&fault);
    Faults {
        miner: MinerFaults {
            huge_frames: on(Fault::HugeFrames),
            inflate_samples: on(Fault::InflateSamples),
            nan_merge: on(Fault::NanMerge),
            poison_merge: on(Fault::PoisonMerge),
            poison_random: on(Fault::PoisonRandom),
            compute_dies: on(Fault::ComputeDies),
            noise: on(Fault::Noise),
            // A lazy miner that hides its laziness behind one changed ulp.
            lazy: on(Fault::Lazy) || on(Fault::LazyUlp),
            lazy_ulp: on(Fault::LazyUlp),
            noise_grad: on(Fault::NoiseGrad),
            // A dodging miner has something to hide: it lies about its losses too.
            lie_loss: on(Fault::LieLoss) || on(Fault::Dodge),
            inflate: on(Fault::Inflate),
            dodge: on(Fault::Dodge),
            preclaim: on(Fault::Preclaim),
            wrong_tokens: on(Fault::WrongTokens),
            slow: on(Fault::Slow),
        },
        skew_weights: on(Fault::SkewWeights),
        forge_plans: on(Fault::ForgePlans),
        lie_join: on(Fault::LieJoin),
    }
}

/// A flag's seconds as a duration (the CLI has checked the range; this refuses what no
/// duration can hold rather than panic).
fn seconds(secs: f64, flag: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(secs).with_context(|| format!("{flag} {secs}"))
}

/// What the node fetches before it starts, from its flags: with `--bootstrap`, the run
/// configuration when `--run` is not given and, off the chain, the stake snapshot when
/// `--metagraph` is not. A file that is given must hash to its pin (`--run-hash`,
/// `--metagraph-hash`), and so must the built-in defaults of a node that fetches nothing.
fn join_spec(
    args: &NodeArgs,
    run: &RunConfig,
    metagraph: Option<&Metagraph>,
    chain: Option<&StakeSource>,
) -> anyhow::Result<Option<super::join::JoinSpec>> {
    let on_chain = chain.is_some();
    let hex = |h: &[u8; 32]| hex::encode(h);
    let fetch_run = args.run.is_none() && !args.bootstrap.is_empty();
    let fetch_metagraph = metagraph.is_none() && !on_chain && !args.bootstrap.is_empty();
    if let Some(pin) = &args.run_hash {
        let have = run.hash().to_hex();
        if !fetch_run && have != hex(pin) {
            anyhow::bail!(
                "--run-hash {}: the run configuration {} hashes to {have}",
                hex(pin),
                if args.run.is_some() {
                    "of --run"
                } else {
                    "of the built-in defaults"
                }
            );
        }
    }
    if let Some(pin) = &args.metagraph_hash {
        match metagraph {
            Some(m) if hex(&m.hash()) != hex(pin) => anyhow::bail!(
                "--metagraph-hash {}: --metagraph hashes to {}",
                hex(pin),
                hex(&m.hash())
            ),
            None if !fetch_metagraph => anyhow::bail!(
                "--metagraph-hash needs --metagraph or --bootstrap (to fetch the snapshot from)"
            ),
            _ => {}
        }
    }
    if !fetch_run && !fetch_metagraph {
        return Ok(None);
    }
    Ok(Some(super::join::JoinSpec {
        run: (!fetch_run).then(|| run.clone()),
        metagraph: metagraph.cloned(),
        pinned_run: args.run_hash.as_ref().map(hex),
        pinned_metagraph: args.metagraph_hash.as_ref().map(hex),
        chain: chain.cloned(),
    }))
}

/// Loads `--run` (or the built-in defaults).
fn load_run_config(args: &NodeArgs) -> anyhow::Result<RunConfig> {
    let Some(path) = &args.run else {
        return Ok(RunConfig::default());
    };
    let text = crate::fsio::read_limited(path, bootstrap::MAX_RUN_CONFIG_BYTES as u64)
        .with_context(|| format!("--run {}", path.display()))?;
    let run =
        RunConfig::from_toml_str(&text).with_context(|| format!("--run {}", path.display()))?;
    crate::run_spec::check_trainable(&run).with_context(|| format!("--run {}", path.display()))?;
    Ok(run)
}

/// Loads `--metagraph`, if given.
fn load_metagraph(args: &NodeArgs) -> anyhow::Result<Option<Metagraph>> {
    let Some(path) = &args.metagraph else {
        return Ok(None);
    };
    let text = crate::fsio::read_limited(path, bootstrap::metagraph::MAX_METAGRAPH_BYTES as u64)
        .with_context(|| format!("--metagraph {}", path.display()))?;
    Ok(Some(Metagraph::from_json_str(&text).with_context(
        || format!("--metagraph {}", path.display()),
    )?))
}

/// Loads the hotkey of `--hotkey` or of the wallet flags, if any was given.
fn load_hotkey(args: &WalletArgs) -> anyhow::Result<Option<HotkeyPair>> {
    let path = match (&args.hotkey, &args.wallet, &args.wallet_path) {
        (Some(path), _, _) => path.clone(),
        (None, None, None) => return Ok(None),
        (None, wallet, wallet_path) => {
            let home = std::env::var_os("HOME")
                .map(std::path::PathBuf::from)
                .unwrap_or_default();
            bootstrap::identity::hotkey_file_path(
                &home,
                wallet_path.as_deref(),
                wallet.as_deref(),
                args.hotkey_name.as_deref(),
            )
            .context("--wallet-path/--wallet/--hotkey-name")?
        }
    };
    let pair = bootstrap::identity::load_hotkey_file(&path)
        .with_context(|| format!("hotkey {}", path.display()))?;
    Ok(Some(pair))
}

/// A binding of this node's peer id to its hotkey on `netuid`, good for [`BINDING_LIFETIME`].
pub(crate) fn own_binding(
    hotkey: &HotkeyPair,
    keypair: &Keypair,
    netuid: u16,
) -> anyhow::Result<(p2p::HotkeyBinding, SystemTime)> {
    let expires = SystemTime::now() + BINDING_LIFETIME;
    let expires_at = expires
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs();
    let binding = p2p::HotkeyBinding::sign(hotkey, keypair, netuid, expires_at)
        .context("signing the hotkey binding")?;
    Ok((binding, expires))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;

    const PEER: &str = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN";

    /// The node flags as the binary would parse them.
    fn args(flags: &[&str]) -> NodeArgs {
        use clap::Parser;
        crate::cli::Cli::try_parse_from(std::iter::once("iota-p2p").chain(flags.iter().copied()))
            .unwrap()
            .node
    }

    /// A scratch directory of this test's own.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("iota-settings-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_node_with_bootstrap_fetches_what_it_was_not_given() {
        let boot = format!("/ip4/127.0.0.1/tcp/1/p2p/{PEER}");
        // Without --bootstrap there is nobody to fetch from: the built-in defaults.
        assert!(NodeSettings::from_args(&args(&[])).unwrap().join.is_none());
        let alone = NodeSettings::from_args(&args(&["--bootstrap", &boot])).unwrap();
        let spec = alone.join.unwrap();
        assert!(spec.run.is_none() && spec.metagraph.is_none() && spec.chain.is_none());
        // Given a run file, only the snapshot is fetched; the given run must be the run's.
        let dir = scratch("join");
        let run_path = dir.join("run.toml");
        let run = RunConfig {
            seed: 7,
            ..RunConfig::default()
        };
        std::fs::write(&run_path, run.to_toml_string().unwrap()).unwrap();
        let run_flag = run_path.to_str().unwrap();
        let given = NodeSettings::from_args(&args(&["--bootstrap", &boot, "--run", run_flag]))
            .unwrap()
            .join
            .unwrap();
        assert_eq!(given.run.map(|r| r.hash()), Some(run.hash()));
        // On a chain run the stake is the chain's: only the run configuration is fetched.
        let chain = NodeSettings::from_args(&args(&[
            "--bootstrap",
            &boot,
            "--subtensor",
            "ws://127.0.0.1:9944",
            "--netuid",
            "9",
        ]))
        .unwrap()
        .join
        .unwrap();
        assert!(chain.chain.is_some() && chain.run.is_none() && chain.metagraph.is_none());
        // With both, nothing is fetched.
        let both = NodeSettings::from_args(&args(&[
            "--bootstrap",
            &boot,
            "--run",
            run_flag,
            "--subtensor",
            "ws://127.0.0.1:9944",
            "--netuid",
            "9",
        ]))
        .unwrap();
        assert!(both.join.is_none());
        // A pin is carried to the join, and a given file must hash to its pin.
        let pin = run.hash().to_hex();
        let pinned = NodeSettings::from_args(&args(&["--bootstrap", &boot, "--run-hash", &pin]))
            .unwrap()
            .join
            .unwrap();
        assert_eq!(pinned.pinned_run.as_deref(), Some(pin.as_str()));
        assert!(NodeSettings::from_args(&args(&["--run", run_flag, "--run-hash", &pin])).is_ok());
        let other = RunConfig::default().hash().to_hex();
        let error = NodeSettings::from_args(&args(&["--run", run_flag, "--run-hash", &other]))
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("--run-hash") && error.contains(&pin),
            "{error}"
        );
        let error = NodeSettings::from_args(&args(&["--metagraph-hash", &pin]))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("--metagraph-hash needs"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pin_that_is_not_a_hash_is_refused_naming_the_flag() {
        use clap::Parser;
        for flag in ["--run-hash", "--metagraph-hash"] {
            let error = crate::cli::Cli::try_parse_from(["iota-p2p", flag, "abc"])
                .err()
                .unwrap()
                .to_string();
            assert!(
                error.contains(flag) && error.contains("64 hex digits"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_node_is_a_miner_unless_told_to_validate() {
        let miner = NodeSettings::from_args(&args(&[])).unwrap();
        assert_eq!(miner.role, Role::Miner);
        let validator = NodeSettings::from_args(&args(&["--validator"])).unwrap();
        assert_eq!(validator.role, Role::Validator);
    }

    #[test]
    fn validators_run_a_relay_server_and_every_node_listens_on_tcp_and_quic() {
        let miner = NodeSettings::from_args(&args(&[])).unwrap();
        assert!(miner.network.relay_server.is_none());
        assert!(miner.network.hole_punch);
        let listen: Vec<String> = miner.network.listen.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            listen,
            ["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"]
        );
        let validator = NodeSettings::from_args(&args(&["--validator"])).unwrap();
        assert_eq!(
            validator.network.relay_server,
            Some(p2p::RelayLimits::default())
        );
        let off = args(&["--validator", "--relay-server", "off", "--no-hole-punch"]);
        let off = NodeSettings::from_args(&off).unwrap();
        assert!(off.network.relay_server.is_none() && !off.network.hole_punch);
        let small = args(&["--relay-server", "on", "--relay-circuit-mib", "8"]);
        let small = NodeSettings::from_args(&small).unwrap();
        assert_eq!(
            small.network.relay_server.map(|l| l.max_circuit_bytes),
            Some(8 << 20)
        );
        use clap::Parser;
        let error = crate::cli::Cli::try_parse_from(["iota-p2p", "--relay-circuit-mib", "0"])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("--relay-circuit-mib"), "{error}");
    }

    #[test]
    fn activation_checkpointing_is_off_unless_asked_for() {
        let plain = NodeSettings::from_args(&args(&[])).unwrap();
        assert!(!plain.compute.checkpoint_activations);
        let ckpt = NodeSettings::from_args(&args(&["--checkpoint-activations"])).unwrap();
        assert!(ckpt.compute.checkpoint_activations);
        assert_eq!(
            ckpt.run.hash(),
            plain.run.hash(),
            "a node's own choice, not the run's"
        );
    }

    #[test]
    fn stake_comes_from_the_chain_only_with_subtensor_and_netuid() {
        let none = NodeSettings::from_args(&args(&[])).unwrap();
        assert!(none.chain.is_none());
        let chain = NodeSettings::from_args(&args(&[
            "--subtensor",
            "ws://127.0.0.1:9944",
            "--netuid",
            "7",
            "--stake-refresh-secs",
            "60",
            "--chain-timeout-secs",
            "5",
        ]))
        .unwrap();
        let source = chain.chain.as_ref().unwrap();
        assert_eq!(source.url, "ws://127.0.0.1:9944");
        assert_eq!(source.netuid, 7);
        assert_eq!(source.refresh, Duration::from_secs(60));
        assert_eq!(source.limits.call_timeout, Duration::from_secs(5));
        assert_eq!(
            source.limits.connect_timeout,
            RpcLimits::default().connect_timeout
        );
        assert_eq!(
            chain.hotkey_warning(),
            Some("no --hotkey: with stake from the chain this node has none, so it cannot be elected, registered, or submit weights")
        );
        assert!(chain.submitter().is_none(), "no hotkey, no submitter");
        assert_eq!(chain.weights.genesis, None, "no pin unless given");
        let pinned = NodeSettings::from_args(&args(&[
            "--subtensor",
            "ws://127.0.0.1:9944",
            "--netuid",
            "7",
            "--chain-genesis",
            "0x2f0555cc76fc2840a25a6ea3b9637146806f1f44b090c175ffde2a7e5ab36c03",
        ]))
        .unwrap();
        assert_eq!(
            pinned.weights.genesis.map(hex::encode).as_deref(),
            Some("2f0555cc76fc2840a25a6ea3b9637146806f1f44b090c175ffde2a7e5ab36c03")
        );
        assert!(
            <crate::cli::Cli as clap::Parser>::try_parse_from([
                "iota-p2p",
                "--chain-genesis",
                "0x12"
            ])
            .is_err(),
            "a genesis hash is 32 bytes"
        );
    }

    #[test]
    fn bootstrap_peers_are_the_peers_the_addresses_name() {
        let addr = format!("/ip4/127.0.0.1/tcp/4001/p2p/{PEER}");
        let other = format!("/ip4/10.0.0.2/tcp/4001/p2p/{PEER}");
        let settings =
            NodeSettings::from_args(&args(&["--bootstrap", &addr, "--bootstrap", &other])).unwrap();
        assert_eq!(settings.network.bootstrap.len(), 2);
        let peer: PeerId = PEER.parse().unwrap();
        assert_eq!(settings.network.bootstrap_peers, BTreeSet::from([peer]));
        let plain: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().unwrap();
        assert!(bootstrap_peers(&[plain]).is_empty());
    }

    #[test]
    fn fault_switches_follow_the_fault_list() {
        let settings =
            NodeSettings::from_args(&args(&["--fault", "noise,forge-plans,skew-weights"])).unwrap();
        let faults = settings.faults;
        assert!(faults.miner.noise && faults.forge_plans && faults.skew_weights);
        assert!(!faults.miner.lazy && !faults.miner.nan_merge && !faults.miner.huge_frames);
        let none = NodeSettings::from_args(&args(&[])).unwrap().faults;
        assert!(!none.forge_plans && !none.skew_weights && !none.miner.noise);
        assert!(!none.miner.dodge && !none.miner.lie_loss);
        // A dodging miner lies about its losses too.
        let dodge = NodeSettings::from_args(&args(&["--fault", "dodge"]))
            .unwrap()
            .faults;
        assert!(dodge.miner.dodge && dodge.miner.lie_loss && !dodge.miner.noise);
    }

    #[test]
    fn the_heartbeat_interval_and_compute_come_from_their_flags() {
        let settings =
            NodeSettings::from_args(&args(&["--heartbeat-secs", "0.5", "--head-window", "4"]))
                .unwrap();
        assert_eq!(settings.heartbeat, Duration::from_millis(500));
        assert_eq!(settings.compute.head_window, 4);
        assert!(seconds(-1.0, "--heartbeat-secs")
            .unwrap_err()
            .to_string()
            .contains("--heartbeat-secs"));
    }

    #[test]
    fn a_file_over_its_limit_is_refused_naming_its_flag() {
        let dir = scratch("limits");
        let run = dir.join("run.toml");
        std::fs::write(&run, vec![b' '; bootstrap::MAX_RUN_CONFIG_BYTES + 1]).unwrap();
        let error = NodeSettings::from_args(&args(&["--run", run.to_str().unwrap()]))
            .err()
            .unwrap();
        let text = format!("{error:#}");
        assert!(text.starts_with("--run "), "{text}");
        assert!(text.contains("larger than the limit"), "{text}");
        let missing = dir.join("absent.json");
        let error = NodeSettings::from_args(&args(&["--metagraph", missing.to_str().unwrap()]))
            .err()
            .unwrap();
        assert!(
            format!("{error:#}").starts_with("--metagraph "),
            "{error:#}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_validator_missing_from_its_metagraph_is_warned() {
        let me = PeerIdStr::parse(PEER).unwrap();
        let miner = NodeSettings::from_args(&args(&[])).unwrap();
        assert_eq!(miner.permit_warning(&me), None);
        let mut validator = NodeSettings::from_args(&args(&["--validator"])).unwrap();
        assert_eq!(
            validator.permit_warning(&me),
            Some("this validator is not in the metagraph; it will never be elected")
        );
        let neuron = |validator_permit| {
            Metagraph::for_local_run(vec![bootstrap::metagraph::LocalNeuron {
                peer_id: me.clone(),
                stake: 100,
                validator_permit,
            }])
            .unwrap()
        };
        validator.metagraph = Some(neuron(false));
        assert_eq!(
            validator.permit_warning(&me),
            Some("this validator has no permit in the metagraph; it will never be elected")
        );
        validator.metagraph = Some(neuron(true));
        assert_eq!(validator.permit_warning(&me), None);
    }
}
