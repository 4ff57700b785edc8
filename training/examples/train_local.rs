//! Runs the local reference trainer: `cargo run -p training --release --example train_local --
//! preset=tiny steps=600 stages=3 bottleneck=16 bottleneck_kind=iota wire=int8 grad_wire=bf16
//! batch=16 seq=64 lr=0.003`.
//! (The `iota-p2p train-local` command is the user-facing entry point; this example exists to
//! measure the trainer without the node.)

use training::local::{self, LocalConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = LocalConfig::default();
    for arg in std::env::args().skip(1) {
        let (k, v) = arg.split_once('=').ok_or("arguments are key=value")?;
        match k {
            "preset" => cfg.preset = v.parse()?,
            "steps" => cfg.steps = v.parse()?,
            "stages" => cfg.stages = v.parse()?,
            "bottleneck" => cfg.bottleneck.width = v.parse()?,
            "bottleneck_kind" => cfg.bottleneck.kind = v.parse()?,
            "wire" => cfg.wire = v.parse()?,
            "grad_wire" => cfg.grad_wire = Some(v.parse()?),
            "seed" => cfg.seed = v.parse()?,
            "threads" => cfg.threads = v.parse()?,
            "batch" => cfg.batch = v.parse()?,
            "seq" => cfg.seq_len = v.parse()?,
            "lr" => cfg.lr = v.parse()?,
            "warmup" => cfg.warmup = v.parse()?,
            "eval_interval" => cfg.eval_interval = v.parse()?,
            "eval_batches" => cfg.eval_batches = v.parse()?,
            "dtype" => cfg.dtype = v.parse()?,
            "device" => cfg.device = training::parse_device(v)?,
            _ => return Err(format!("unknown key {k}").into()),
        }
    }
    let report = local::run(&cfg, |p| {
        println!(
            "step {:>5}/{} train_loss {} val_loss {} tokens/s {:.0}",
            p.step,
            p.steps,
            p.train_loss.map_or("-".into(), |l| format!("{l:.4}")),
            p.val_loss.map_or("-".into(), |l| format!("{l:.4}")),
            p.tokens_per_s
        );
    })?;
    println!("{report:?}");
    println!("{}", report.result_line());
    Ok(())
}
