//! `iota-p2p local-swarm`: a whole training run on this machine, started with one command.
//!
//! Creates an identity per node, a stake snapshot (the validators hold stake and permits) and
//! a run configuration, starts the validators and miners as separate processes of this same
//! binary on 127.0.0.1 (each bootstrapping only from the first), follows the run through the
//! first validator's `/status`, prints a line per epoch, writes a report (Markdown and an SVG
//! loss curve) into `--out`, and stops every process it started — also on Ctrl-C or SIGTERM.

mod adversary;
mod report;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use bootstrap::{
    LocalNeuron, Metagraph, ModelPreset, ModelShape, PeerIdStr, RunConfig, RAO_PER_TAO,
};
use tokio::time::Instant;

use crate::cli::LocalSwarmArgs;
use crate::services::observe::api::EpochStats;
use crate::tools::launcher::{http_get, wait_for, NodeProcess, NodeSpec};

/// How long a node gets to print its addresses.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a node gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// Runs the local swarm to completion.
pub(crate) async fn run(args: LocalSwarmArgs) -> anyhow::Result<()> {
    // A run the swarm cannot train is refused before anything on disk is touched.
    let run = run_config(&args)?;
    let out = args.out.clone();
    if out.exists() {
        if let Some(stranger) = not_ours(&out)? {
            anyhow::bail!(
                "--out {}: it holds {}, which no local-swarm wrote; choose another directory \
                 (or empty this one yourself)",
                out.display(),
                stranger
            );
        }
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let binary = std::env::current_exe().context("locating this binary")?;
    println!(
        "local-swarm: {} validator(s) + {} miner(s), {} stages of the {}, {} epochs; data, logs and report in {}",
        args.validators,
        args.miners,
        run.stages,
        report::model_words(&run),
        args.epochs,
        out.display()
    );

    let mut nodes: Vec<NodeProcess> = Vec::new();
    let outcome = tokio::select! {
        result = drive(&args, &binary, &out, &mut nodes) => result,
        _ = crate::app::shutdown_signal() => {
            println!("local-swarm: interrupted, stopping the nodes");
            Err(anyhow::anyhow!("interrupted"))
        }
    };
    let total = nodes.len();
    let mut stop_errors = 0;
    for node in nodes {
        let name = node.name.clone();
        if let Err(error) = node.stop(STOP_GRACE).await {
            stop_errors += 1;
            eprintln!("local-swarm: {name}: {error:#}");
        }
    }
    println!("local-swarm: stopped {total} node(s)");
    outcome?;
    anyhow::ensure!(
        stop_errors == 0,
        "{stop_errors} node(s) did not stop cleanly"
    );
    if args.no_sample {
        return Ok(());
    }
    if let Err(error) = sample(&out) {
        println!("local-swarm: no model exported or sampled: {error:#}");
    }
    Ok(())
}

/// Exports the run's model to `out/model` and ends the report with a short text from it.
fn sample(out: &Path) -> anyhow::Result<()> {
    let model_dir = out.join("model");
    crate::tools::export::run(&crate::cli::ExportArgs {
        from: vec![out.to_path_buf()],
        out: model_dir.clone(),
        run: None,
        epoch: None,
        tokenizer: None,
    })?;
    let model = training::generate::Model::load(&model_dir)?;
    let prompt = "ROMEO:";
    let sampling = training::generate::Sampling {
        tokens: 200,
        temperature: 0.8,
        top_k: 40,
        seed: 0,
    };
    let text = format!("{prompt}{}", model.generate(prompt, &sampling)?);
    println!(
        "local-swarm: model in {}; a sample from it:\n{text}",
        model_dir.display()
    );
    let report = out.join("report.md");
    let mut md = std::fs::read_to_string(&report)?;
    md.push_str(&format!(
        "\n## A sample from the model\n\n`iota-p2p generate --model {} --prompt \"{prompt}\" --tokens 200 --seed 0`:\n\n```text\n{text}\n```\n",
        model_dir.display()
    ));
    std::fs::write(&report, md)?;
    Ok(())
}

/// Writes the run's files, starts the nodes (pushing each into `nodes` so the caller can stop
/// them whatever happens) and follows the run to its last epoch.
async fn drive(
    args: &LocalSwarmArgs,
    binary: &Path,
    out: &Path,
    nodes: &mut Vec<NodeProcess>,
) -> anyhow::Result<()> {
    let (cast, neurons) = cast(args, out)?;
    let files = write_run_files(args, out, neurons)?;
    let started = Instant::now();
    let hardware = Hardware {
        devices: args.device.clone(),
        dtype: args.dtype,
    };
    start_nodes(binary, out, &cast, &files, &hardware, nodes).await?;
    let watcher = nodes
        .first()
        .context("local-swarm needs at least one node")?;
    println!(
        "local-swarm: dashboard of {} at {}/",
        watcher.name,
        watcher.metrics_url()
    );
    let epochs = u64::from(args.epochs);
    let rows = follow(nodes, epochs, Duration::from_secs(args.timeout_secs)).await?;
    let summary = report::Summary::new(&rows, epochs, &files.run, started.elapsed())?;
    report::write(out, &rows, &summary, &files.run, nodes, args.reference_loss)?;
    if !args.adversary.is_empty() {
        report_adversaries(out, nodes, epochs, &cast).await?;
    }
    println!("local-swarm: report in {}", out.join("report.md").display());
    println!("{}", summary.result_line());
    Ok(())
}

/// Who the nodes are: their names (validators first), the miners' peer ids, and which of
/// them misbehave on purpose.
struct Cast {
    /// `validator-<i>` then `miner-<i>`, in start-up order before the adversaries are held
    /// back.
    names: Vec<String>,
    /// How many of `names` are validators.
    validators: usize,
    /// The miners' peer ids, in the order of their names.
    miner_peers: Vec<PeerIdStr>,
    /// The misbehaving miners, by index among the miners.
    faults: std::collections::BTreeMap<usize, crate::cli::Fault>,
    /// The misbehaving validators, by index among the validators.
    validator_faults: std::collections::BTreeMap<usize, crate::cli::Fault>,
    /// Each miner's role in the report (`honest` or its fault), by peer id.
    roles: std::collections::BTreeMap<String, String>,
    /// Each validator's role in the report, by peer id.
    validator_roles: std::collections::BTreeMap<String, String>,
    /// Flags every miner is started with beside its own (`--checkpoint-activations`).
    miner_flags: Vec<String>,
    /// What every validator is started with besides its files (`--placement`).
    validator_flags: Vec<String>,
}

impl Cast {
    /// Whether node `i` of [`Cast::names`] is a misbehaving miner.
    fn is_adversary(&self, i: usize) -> bool {
        i >= self.validators && self.faults.contains_key(&(i - self.validators))
    }

    /// The `--fault` value node `i` runs with, if any.
    fn fault_of(&self, i: usize) -> Option<&'static str> {
        let fault = if i < self.validators {
            self.validator_faults.get(&i)
        } else {
            self.faults.get(&(i - self.validators))
        };
        fault.and_then(|f| crate::cli::fault_name(*f))
    }
}

/// Creates every node's identity in `out`, places the adversaries (printing who they are),
/// and returns the cast with the stake snapshot's neurons.
fn cast(args: &LocalSwarmArgs, out: &Path) -> anyhow::Result<(Cast, Vec<LocalNeuron>)> {
    let names: Vec<String> = (0..args.validators)
        .map(|i| format!("validator-{i}"))
        .chain((0..args.miners).map(|i| format!("miner-{i}")))
        .collect();
    let mut neurons = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let keypair = crate::app::identity::load_or_create(&out.join(name))?;
        let validator = (i as u32) < args.validators;
        neurons.push(LocalNeuron {
            peer_id: crate::wire::peer::of(&keypair.public().to_peer_id()),
            // Validators get decreasing stake: 100, 50, 33, … TAO.
            stake: if validator {
                100 * RAO_PER_TAO / (i as u64 + 1)
            } else {
                0
            },
            validator_permit: validator,
        });
    }
    let validators = args.validators as usize;
    let miner_peers: Vec<PeerIdStr> = neurons
        .iter()
        .skip(validators)
        .map(|n| n.peer_id.clone())
        .collect();
    let (validator_adversaries, miner_adversaries): (Vec<_>, Vec<_>) = args
        .adversary
        .iter()
        .partition(|a| a.fault == crate::cli::Fault::SkewWeights);
    let faults = adversary::place(&miner_adversaries, &miner_peers)?;
    let validator_peers: Vec<&PeerIdStr> = neurons
        .iter()
        .take(validators)
        .map(|n| &n.peer_id)
        .collect();
    let validator_faults = adversary::place(&validator_adversaries, &validator_peers)?;
    let role_of = |fault: Option<&crate::cli::Fault>| {
        fault
            .and_then(|f| crate::cli::fault_name(*f))
            .unwrap_or("honest")
            .to_string()
    };
    let roles = miner_peers
        .iter()
        .enumerate()
        .map(|(i, peer)| (peer.to_string(), role_of(faults.get(&i))))
        .collect();
    let validator_roles = neurons
        .iter()
        .take(validators)
        .enumerate()
        .map(|(i, n)| (n.peer_id.to_string(), role_of(validator_faults.get(&i))))
        .collect();
    for (i, fault) in &validator_faults {
        println!("  validator-{i} is an adversary: {}", role_of(Some(fault)));
    }
    for (i, fault) in &faults {
        println!("  miner-{i} is an adversary: {}", role_of(Some(fault)));
    }
    let cast = Cast {
        names,
        validators,
        miner_peers,
        faults,
        validator_faults,
        roles,
        validator_roles,
        miner_flags: miner_flags(args),
        validator_flags: vec!["--placement".into(), args.placement.name().into()],
    };
    Ok((cast, neurons))
}

/// The flags of `args` that every miner process is given: the node's own compute choices,
/// which are no part of the run configuration.
fn miner_flags(args: &LocalSwarmArgs) -> Vec<String> {
    let mut flags = Vec::new();
    if args.checkpoint_activations {
        flags.push("--checkpoint-activations".to_string());
    }
    flags
}

/// The run configuration of the swarm: its own, with `--run`'s fields, `--model-config` and
/// `--data` over it, checked (also that the network can train it).
fn run_config(args: &LocalSwarmArgs) -> anyhow::Result<RunConfig> {
    let run = RunConfig {
        run_name: "local-swarm".into(),
        preset: model_preset(args.preset)?,
        stages: args.stages,
        epoch_samples: args.samples_per_epoch,
        // The learning rate follows a cosine over the run, as train-local's does over its steps.
        lr_decay_epochs: u64::from(args.epochs),
        ..RunConfig::default()
    };
    let run = match &args.run {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the run configuration {}", path.display()))?;
            run.with_toml_str(&text)
                .with_context(|| format!("in the run configuration {}", path.display()))?
        }
        None => run,
    };
    let run = match &args.model_config {
        Some(shape) => with_model(run, shape)?,
        None => run,
    };
    let run = match &args.data {
        Some(dir) => with_dataset(run, dir)?,
        None => run,
    };
    run.validate()?;
    crate::run_spec::check_trainable(&run)?;
    Ok(run)
}

/// The files every node of the run reads, and the run configuration they hold.
struct RunFiles {
    /// The stake snapshot (`--metagraph`).
    metagraph: std::path::PathBuf,
    /// The run configuration (`--run`).
    run_path: std::path::PathBuf,
    /// What `run_path` holds.
    run: RunConfig,
    /// The dataset given to the first validator (`--data`).
    data: Option<std::path::PathBuf>,
}

/// Writes the stake snapshot and the run configuration (the swarm's own, with `--run`'s
/// fields over it) into `out`.
fn write_run_files(
    args: &LocalSwarmArgs,
    out: &Path,
    neurons: Vec<LocalNeuron>,
) -> anyhow::Result<RunFiles> {
    let metagraph = Metagraph::for_local_run(neurons)?;
    let metagraph_path = out.join("metagraph.json");
    std::fs::write(&metagraph_path, metagraph.to_json())?;
    let run = run_config(args)?;
    let run_path = out.join("run.toml");
    std::fs::write(&run_path, run.to_toml_string()?)?;
    Ok(RunFiles {
        metagraph: metagraph_path,
        run_path,
        run,
        data: args.data.clone(),
    })
}

/// `run` training the model of `--model-config`: refused when `--run` gave another.
fn with_model(run: RunConfig, shape: &ModelShape) -> anyhow::Result<RunConfig> {
    if let Some(table) = &run.model {
        anyhow::ensure!(
            table == shape,
            "--model-config and the [model] table of --run give different shapes; give one"
        );
    }
    Ok(RunConfig {
        model: Some(shape.clone()),
        ..run
    })
}

/// `run` training on the dataset in `dir`: its manifest's hash, its tokenizer and vocabulary
/// (every shard checked first, so a bad dataset fails here rather than in a node).
fn with_dataset(run: RunConfig, dir: &Path) -> anyhow::Result<RunConfig> {
    let d =
        training::Dataset::open(dir, None).with_context(|| format!("--data {}", dir.display()))?;
    let hash = blake3::Hash::from_bytes(d.hash()).to_hex().to_string();
    let t = &d.manifest().tokenizer;
    println!(
        "  dataset {hash}: {} shards, vocabulary {}",
        d.manifest().shards.len(),
        t.vocab_size
    );
    Ok(RunConfig {
        dataset: Some(hash),
        tokenizer: Some(t.blake3.clone()),
        vocab: Some(t.vocab_size),
        ..run
    })
}

/// Starts every node, each bootstrapping from the first: the honest ones first, the
/// adversaries once the honest miners are in a plan.
/// Where the nodes compute: `--device`'s list, dealt round-robin, and `--dtype`.
struct Hardware {
    devices: Vec<training::Device>,
    dtype: training::DType,
}

impl Hardware {
    /// The `--device` and `--dtype` flags of node `i` in start-up order (validators first).
    fn args(&self, i: usize) -> [String; 4] {
        let device = match self.devices.get(i % self.devices.len().max(1)) {
            Some(training::Device::Cuda(n)) => format!("cuda:{n}"),
            _ => "cpu".to_string(),
        };
        let dtype = match self.dtype {
            training::DType::F32 => "f32",
            training::DType::Bf16 => "bf16",
        };
        [
            "--device".to_string(),
            device,
            "--dtype".to_string(),
            dtype.to_string(),
        ]
    }
}

async fn start_nodes(
    binary: &Path,
    out: &Path,
    cast: &Cast,
    files: &RunFiles,
    hardware: &Hardware,
    nodes: &mut Vec<NodeProcess>,
) -> anyhow::Result<()> {
    let mut bootstrap = None::<String>;
    // Adversaries start in peer id order (the order the orchestrator places new miners in):
    // the tail modes, which `adversary::place` gives the lowest ids, first.
    let mut adversaries: Vec<usize> = (0..cast.names.len())
        .filter(|&i| cast.is_adversary(i))
        .collect();
    adversaries.sort_by_key(|&i| {
        i.checked_sub(cast.validators)
            .and_then(|m| cast.miner_peers.get(m).cloned())
    });
    let order: Vec<usize> = (0..cast.names.len())
        .filter(|&i| !cast.is_adversary(i))
        .chain(adversaries)
        .collect();
    let honest_miners = cast.miner_peers.len() - cast.faults.len();
    for i in order {
        let name = &cast.names[i];
        if cast.is_adversary(i) && nodes.len() == cast.names.len() - cast.faults.len() {
            wait_for_plan(&nodes[0], honest_miners).await?;
        }
        let mut node_args = vec![
            "--data-dir".to_string(),
            out.join(name).display().to_string(),
        ];
        node_args.extend(hardware.args(i));
        if i < cast.validators {
            // The validators hold the run's files; a miner joins with `--bootstrap` alone and
            // fetches them from the validators, as a miner of a public run does.
            node_args.extend([
                "--metagraph".into(),
                files.metagraph.display().to_string(),
                "--run".into(),
                files.run_path.display().to_string(),
                "--validator".into(),
            ]);
            node_args.extend(cast.validator_flags.iter().cloned());
        } else {
            node_args.extend(cast.miner_flags.iter().cloned());
        }
        if let (0, Some(dir)) = (i, &files.data) {
            node_args.extend(["--data".to_string(), dir.display().to_string()]);
        }
        if let Some(fault) = cast.fault_of(i) {
            node_args.extend(["--fault".to_string(), fault.to_string()]);
        }
        if let Some(addr) = &bootstrap {
            node_args.extend(["--bootstrap".to_string(), addr.clone()]);
        }
        let spec = NodeSpec {
            name: name.clone(),
            args: node_args,
            log: out.join(format!("{name}.log")),
            netns: None,
            listen: None,
        };
        let node = NodeProcess::spawn(binary, spec, READY_TIMEOUT).await?;
        println!("  started {name:<12} {}", node.listen_addr());
        if bootstrap.is_none() {
            bootstrap = Some(node.listen_addr());
        }
        nodes.push(node);
    }
    Ok(())
}

/// Follows the run through `watcher`'s `/status`: one line per finished epoch, until the
/// held-out loss after the last epoch is known (or `timeout` runs out). Returns the epochs'
/// rows as the watcher last reported them.
async fn follow(
    nodes: &mut [NodeProcess],
    epochs: u64,
    timeout: Duration,
) -> anyhow::Result<Vec<EpochStats>> {
    let printed = std::cell::Cell::new(0u64);
    let rows = std::cell::RefCell::new(Vec::<EpochStats>::new());
    let exits = std::cell::RefCell::new(Exits::new(nodes));
    wait_for(
        "the run to finish its epochs",
        timeout,
        Duration::from_secs(1),
        || async {
            // A node that died is named at once; the run goes on without it (the network
            // survives a lost node) unless it was the one followed, or every miner.
            exits.borrow_mut().look()?;
            let url = exits.borrow().watcher()?.metrics_url();
            let status: serde_json::Value =
                serde_json::from_str(&http_get(format!("{url}/status")).await?)
                    .context("the followed node's /status is not JSON")?;
            let got: Vec<EpochStats> = serde_json::from_value(status["epochs"].clone())?;
            for row in &got {
                // An epoch is reported once the next one's start has been evaluated.
                let next = got
                    .iter()
                    .find(|r| r.epoch == row.epoch + 1 && r.val_loss.is_some());
                if row.epoch == printed.get() && row.epoch < epochs {
                    if let Some(next) = next {
                        println!("{}", report::progress_line(row, next));
                        printed.set(row.epoch + 1);
                    }
                }
            }
            let done = got
                .iter()
                .any(|r| r.epoch == epochs && r.val_loss.is_some());
            *rows.borrow_mut() = got;
            Ok((
                done,
                format!("{} of {epochs} epochs reported", printed.get()),
            ))
        },
    )
    .await?;
    Ok(rows.into_inner())
}

/// The swarm's processes while the run is followed, and which of them have exited.
struct Exits<'a> {
    nodes: &'a mut [NodeProcess],
    /// Whether node `i` was seen exited (and named).
    gone: Vec<bool>,
}

impl<'a> Exits<'a> {
    fn new(nodes: &'a mut [NodeProcess]) -> Self {
        let gone = vec![false; nodes.len()];
        Exits { nodes, gone }
    }

    /// Names every node that exited since the last look; an error once the followed node
    /// (the first) or every miner is gone, since the run cannot end then.
    fn look(&mut self) -> anyhow::Result<()> {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if self.gone[i] {
                continue;
            }
            if let Some(status) = node.try_exit_status()? {
                self.gone[i] = true;
                println!(
                    "local-swarm: {} exited during the run ({}); its log: {}",
                    node.name,
                    exit_cause(&status),
                    node.log_path().display()
                );
            }
        }
        if self.gone.first().copied().unwrap_or(false) {
            let first = &self.nodes[0];
            anyhow::bail!(
                "{}, whose status the run is followed by, exited; its log: {}",
                first.name,
                first.log_path().display()
            );
        }
        let miners: Vec<bool> = self
            .nodes
            .iter()
            .zip(&self.gone)
            .filter(|(n, _)| n.name.starts_with("miner-"))
            .map(|(_, gone)| *gone)
            .collect();
        if !miners.is_empty() && miners.iter().all(|gone| *gone) {
            anyhow::bail!("every miner exited: the run cannot train");
        }
        Ok(())
    }

    /// The node the run is followed by.
    fn watcher(&self) -> anyhow::Result<&NodeProcess> {
        self.nodes
            .first()
            .context("local-swarm needs at least one node")
    }
}

/// How a node's exit reads to the person running the swarm.
fn exit_cause(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        // Nothing in the swarm sends SIGKILL before the run ends; the kernel does when it
        // runs out of memory.
        Some(9) => format!(
            "{status}: killed, most likely by the kernel for want of memory \
             (`dmesg | grep -i oom`); see docs/BENCHMARKS.md \"Memory per stage\""
        ),
        _ => status.to_string(),
    }
}

/// What the validators made of the adversaries: `weights.svg`, `weights.json`, a section of
/// the report, and the `RESULT` lines.
async fn report_adversaries(
    out: &Path,
    nodes: &[NodeProcess],
    epochs: u64,
    cast: &Cast,
) -> anyhow::Result<()> {
    // Let the last epoch's scores and their consensus settle before reading them.
    let honest: Vec<bool> = nodes
        .iter()
        .map(|n| {
            cast.names
                .iter()
                .position(|name| *name == n.name)
                .is_none_or(|i| !cast.is_adversary(i))
        })
        .collect();
    let statuses = settled_weights(nodes, epochs, cast.validators, &honest).await;
    let names: std::collections::BTreeMap<String, String> = nodes
        .iter()
        .map(|n| {
            (
                crate::tools::launcher::peer_of(&n.listen_addr()),
                n.name.clone(),
            )
        })
        .collect();
    let status = statuses.first().cloned().unwrap_or_default();
    let outcomes = adversary::outcomes(
        &out.join(names_first(nodes)).join("weights"),
        &status,
        &names,
        &cast.roles,
    );
    let trust = adversary::validators(&status, &names, &cast.validator_roles);
    let agreeing = adversary::agreeing(&statuses);
    let node_names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let disagreeing = adversary::disagreeing(&statuses, &node_names);
    std::fs::write(out.join("weights.svg"), adversary::svg(&outcomes))?;
    std::fs::write(
        out.join("weights.json"),
        serde_json::to_vec_pretty(&serde_json::json!({
            "consensus_epoch": status["consensus_epoch"],
            "miners": outcomes,
            "validators": trust,
            "nodes": statuses.len(),
            "agreeing_nodes": agreeing,
            "disagreeing_nodes": disagreeing,
        }))?,
    )?;
    let mut md = std::fs::read_to_string(out.join("report.md"))?;
    md.push_str(&adversary::section(&outcomes));
    md.push_str(&adversary::validators_section(
        &trust,
        agreeing,
        statuses.len(),
    ));
    std::fs::write(out.join("report.md"), md)?;
    println!("{}", adversary::result_line(&outcomes));
    println!(
        "RESULT consensus agreeing_nodes={agreeing}/{}",
        statuses.len()
    );
    Ok(())
}

/// Waits (bounded) until the plan in force at `watcher` holds `miners` miners.
async fn wait_for_plan(watcher: &NodeProcess, miners: usize) -> anyhow::Result<()> {
    println!(
        "  waiting for the {miners} honest miners to be in a plan before the adversaries start"
    );
    wait_for(
        "the honest miners to be in a plan",
        READY_TIMEOUT * 2,
        Duration::from_millis(500),
        || async {
            let status = watcher.status().await?;
            let sizes: Vec<usize> = serde_json::from_value(status["stage_sizes"].clone())?;
            let total: usize = sizes.iter().sum();
            Ok((total >= miners, format!("{total} miners in the plan")))
        },
    )
    .await?;
    Ok(())
}

/// The first node's name (the validator whose weights the report reads).
fn names_first(nodes: &[NodeProcess]) -> String {
    nodes.first().map(|n| n.name.clone()).unwrap_or_default()
}

/// Every node's `/status` once each honest one's (`honest`, in the order of `nodes`)
/// consensus covers the last trained epoch with the weights of all `validators` (a validator
/// that scores a moment later would otherwise be missing), or after a bounded wait, whatever
/// they hold then; in the order of `nodes`. Adversaries are not waited for: one whose
/// gossip its peers cut off never catches up.
async fn settled_weights(
    nodes: &[NodeProcess],
    epochs: u64,
    validators: usize,
    honest: &[bool],
) -> Vec<serde_json::Value> {
    let latest = std::cell::RefCell::new(Vec::new());
    // Once the honest nodes have the last epoch's weights, the others get a little longer to
    // hear them too: an adversary still in the run may be a gossip round behind, while one
    // its peers' scoring cut off never catches up.
    let honest_settled = std::cell::Cell::new(None::<std::time::Instant>);
    let waited = wait_for(
        "every node's consensus on the last epoch's weights",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            let mut statuses = Vec::with_capacity(nodes.len());
            for node in nodes {
                statuses.push(node.status().await?);
            }
            let is_behind = |s: &serde_json::Value| {
                let heard = s["weights"]["validators"].as_array().map_or(0, Vec::len);
                s["consensus_epoch"].as_u64().is_none_or(|e| e + 1 < epochs) || heard < validators
            };
            let behind = statuses
                .iter()
                .zip(honest)
                .filter(|(s, honest)| **honest && is_behind(s))
                .count();
            let others_behind = statuses
                .iter()
                .zip(honest)
                .filter(|(s, honest)| !**honest && is_behind(s))
                .count();
            *latest.borrow_mut() = statuses;
            if behind > 0 {
                return Ok((false, format!("{behind} node(s) behind")));
            }
            let since = honest_settled.get().unwrap_or_else(std::time::Instant::now);
            honest_settled.set(Some(since));
            let done = others_behind == 0 || since.elapsed() >= ADVERSARY_GRACE;
            Ok((done, format!("{others_behind} adversary node(s) behind")))
        },
    )
    .await;
    if let Err(error) = waited {
        println!("local-swarm: {error:#}; reporting the weights as they are");
    }
    latest.into_inner()
}

/// How much longer than the honest nodes the others get to hear the last weights.
const ADVERSARY_GRACE: Duration = Duration::from_secs(5);

/// The run configuration's name for `preset`.
fn model_preset(preset: training::Preset) -> anyhow::Result<ModelPreset> {
    let text = format!("preset = \"{}\"", preset.name());
    Ok(RunConfig::from_toml_str(&text)
        .with_context(|| format!("--preset {preset}: not a preset of the run configuration"))?
        .preset)
}

/// The first entry of `dir` that a local-swarm run does not write (`None`: `dir` is empty or
/// an earlier run's output, which may be emptied).
fn not_ours(dir: &Path) -> anyhow::Result<Option<String>> {
    if !dir.is_dir() {
        return Ok(Some("no directory but a file".into()));
    }
    // `model` is the directory the run's export writes.
    const FILES: [&str; 7] = [
        "model",
        "report.md",
        "loss.svg",
        "weights.svg",
        "weights.json",
        "metagraph.json",
        "run.toml",
    ];
    let node = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .map(|rest| rest.strip_suffix(".log").unwrap_or(rest))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let ours =
            FILES.contains(&name.as_str()) || node(&name, "miner-") || node(&name, "validator-");
        if !ours {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_node_killed_by_sigkill_is_named_as_short_of_memory() {
        use std::os::unix::process::ExitStatusExt;
        // A raw wait status of 9 is "killed by signal 9"; 256 is "exited with 1".
        let killed = super::exit_cause(&std::process::ExitStatus::from_raw(9));
        assert!(killed.contains("for want of memory"), "{killed}");
        let failed = super::exit_cause(&std::process::ExitStatus::from_raw(256));
        assert!(!failed.contains("memory"), "{failed}");
        assert!(failed.contains('1'), "{failed}");
    }

    #[test]
    fn devices_are_dealt_round_robin_in_start_up_order() {
        use training::Device::{Cpu, Cuda};
        let two = super::Hardware {
            devices: vec![Cuda(0), Cuda(1)],
            dtype: training::DType::Bf16,
        };
        let flags: Vec<String> = (0..3).map(|i| two.args(i)[1].clone()).collect();
        assert_eq!(flags, ["cuda:0", "cuda:1", "cuda:0"]);
        assert_eq!(two.args(0)[2..], ["--dtype", "bf16"]);
        let cpu = super::Hardware {
            devices: vec![Cpu],
            dtype: training::DType::F32,
        };
        assert_eq!(cpu.args(5), ["--device", "cpu", "--dtype", "f32"]);
    }

    use super::*;

    #[test]
    fn an_earlier_runs_output_with_its_exported_model_may_be_emptied_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("iota-swarm-out-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("model")).unwrap();
        std::fs::create_dir_all(dir.join("miner-0")).unwrap();
        std::fs::write(dir.join("report.md"), "# run").unwrap();
        std::fs::write(dir.join("validator-0.log"), "").unwrap();
        assert_eq!(
            not_ours(&dir).unwrap(),
            None,
            "a whole earlier run, model included"
        );
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        assert_eq!(not_ours(&dir).unwrap(), Some("notes.txt".to_string()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn checkpoint_activations_is_passed_to_every_miner_and_the_node_accepts_it() {
        use clap::Parser;
        let swarm_args = |flags: &[&str]| {
            let argv = ["iota-p2p", "local-swarm"].iter().chain(flags).copied();
            match crate::cli::Cli::try_parse_from(argv).unwrap().command {
                Some(crate::cli::Command::LocalSwarm(args)) => args,
                other => panic!("not local-swarm: {other:?}"),
            }
        };
        assert!(miner_flags(&swarm_args(&[])).is_empty());
        let flags = miner_flags(&swarm_args(&["--checkpoint-activations"]));
        assert_eq!(flags, ["--checkpoint-activations"]);
        let argv = std::iter::once("iota-p2p").chain(flags.iter().map(String::as_str));
        assert!(
            crate::cli::Cli::try_parse_from(argv)
                .unwrap()
                .node
                .checkpoint_activations
        );
    }

    #[test]
    fn model_config_sets_the_run_model_table_and_is_refused_against_another() {
        let shape = ModelShape {
            hidden_size: 64,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            intermediate_size: 128,
            rope_theta: 10_000.0,
            max_position_embeddings: 256,
            rms_norm_eps: 1e-5,
            rope_scaling: None,
            tie_word_embeddings: false,
        };
        let run = with_model(RunConfig::default(), &shape).unwrap();
        assert_eq!(run.model.as_ref(), Some(&shape));
        assert_ne!(run.hash(), RunConfig::default().hash());
        // The same table in --run is no conflict; another is.
        assert_eq!(with_model(run.clone(), &shape).unwrap(), run);
        let other = ModelShape {
            num_key_value_heads: 4,
            ..shape.clone()
        };
        let err = with_model(run, &other).unwrap_err().to_string();
        assert!(
            err.contains("--model-config") && err.contains("[model]"),
            "{err}"
        );
    }
}
