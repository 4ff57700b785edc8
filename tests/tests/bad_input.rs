//! Bad input gets a clear error and the node keeps what it has.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use iota_tests::{binary, keygen, run_files, scratch_dir, start_node, wait_for};

#[test]
fn malformed_bootstrap_exits_nonzero_naming_the_flag() {
    for bad in [
        "not-a-multiaddr",
        // a well-formed address that does not say which peer it reaches
        "/ip4/127.0.0.1/tcp/4001",
    ] {
        let output = std::process::Command::new(binary())
            .args(["--bootstrap", bad])
            .output()
            .unwrap();
        assert!(
            !output.status.success(),
            "{bad}: exit status {}",
            output.status
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--bootstrap"),
            "{bad}: message names the flag: {stderr}"
        );
    }
}

#[test]
fn bad_metrics_address_exits_nonzero_naming_the_flag() {
    let output = std::process::Command::new(binary())
        .args(["--metrics", "localhost"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--metrics"));
}

#[test]
fn head_window_out_of_range_exits_nonzero_naming_the_flag() {
    for bad in ["0", "9", "two"] {
        let output = std::process::Command::new(binary())
            .args(["--head-window", bad])
            .output()
            .unwrap();
        assert!(!output.status.success(), "--head-window {bad} was accepted");
        assert!(String::from_utf8_lossy(&output.stderr).contains("--head-window"));
    }
}

#[test]
fn bad_chain_and_hotkey_flags_exit_nonzero_naming_what_to_fix() {
    let dir = scratch_dir("bad-chain-flags");
    let missing = dir.join("no-such-hotkey");
    let not_a_hotkey = dir.join("not-a-hotkey");
    std::fs::write(&not_a_hotkey, "{\"secretSeed\": \"0x00\"}").unwrap();
    let chain = ["--subtensor", "ws://127.0.0.1:9", "--netuid", "1"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--subtensor", "wss://example.invalid", "--netuid", "1"],
            "TLS",
        ),
        (
            vec!["--subtensor", "ftp://127.0.0.1", "--netuid", "1"],
            "--subtensor",
        ),
        (vec!["--subtensor", "ws://127.0.0.1:9"], "--netuid"),
        (vec!["--netuid", "1"], "--subtensor"),
        (
            [&["--metagraph", "m.json"][..], &chain[..]].concat(),
            "--metagraph",
        ),
        (
            [&["--hotkey", missing.to_str().unwrap()][..], &chain[..]].concat(),
            "no-such-hotkey",
        ),
        (
            [
                &["--hotkey", not_a_hotkey.to_str().unwrap()][..],
                &chain[..],
            ]
            .concat(),
            "not-a-hotkey",
        ),
        (vec!["--hotkey-name", "x"], "--wallet"),
        (
            vec![
                "metagraph",
                "--subtensor",
                "wss://example.invalid",
                "--netuid",
                "1",
            ],
            "TLS",
        ),
    ];
    for (args, names) in cases {
        let output = std::process::Command::new(binary())
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(names), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_bootstrap_is_retried_and_the_node_keeps_running() {
    let dir = scratch_dir("unreachable");
    // A port that was just free: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let nobody = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN";
    let addr = format!("/ip4/127.0.0.1/tcp/{port}/p2p/{nobody}");
    // With the run's files, so that it does not wait to fetch them from the run (a joining
    // node serves no /status until it has joined).
    let me = keygen(&dir, "lonely");
    let mut args = run_files(&dir, &[(me, 0, false)], &bootstrap::RunConfig::default());
    // Told it is reachable at a loopback port nobody listens on: a public node, which still
    // dials its operator's bootstrap address (a private one here).
    args.extend([
        "--bootstrap".to_string(),
        addr,
        "--external-address".to_string(),
        "/ip4/127.0.0.1/tcp/9".to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let node = start_node(&dir, "lonely", &args).await.unwrap();

    let log = node.log_path().to_path_buf();
    wait_for(
        "two logged retries of the bootstrap peer",
        Duration::from_secs(20),
        Duration::from_millis(250),
        || {
            let log = log.clone();
            async move {
                let text = std::fs::read_to_string(&log)?;
                let failures = text
                    .lines()
                    .filter(|l| l.contains("WARN") && l.contains(nobody))
                    .count();
                Ok((
                    failures >= 2,
                    format!("{failures} warnings naming the peer"),
                ))
            }
        },
    )
    .await
    .unwrap();

    let status = node.status().await.unwrap();
    assert_eq!(status["connected_peers"], 0);
    assert_eq!(status["role"], "miner");
    assert_eq!(status["reachability"], "public", "{status}");
    assert_eq!(
        status["external_addrs"],
        serde_json::json!(["/ip4/127.0.0.1/tcp/9"])
    );
    let exit = node.stop(Duration::from_secs(10)).await.unwrap();
    assert!(exit.success(), "clean exit on SIGTERM: {exit}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn restarted_node_keeps_its_peer_id() {
    let dir = scratch_dir("keygen");
    let data = dir.join("node");
    let run = || {
        let output = std::process::Command::new(binary())
            .args(["keygen", "--data-dir"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string()
    };
    let first = run();
    assert!(first.starts_with("12D3Koo"), "an ed25519 peer id: {first}");
    assert_eq!(first, run());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn local_swarm_refuses_to_empty_a_directory_it_did_not_write() {
    let dir = scratch_dir("swarm-out");
    let precious = dir.join("thesis.tex");
    std::fs::write(&precious, "years of work").unwrap();
    let output = std::process::Command::new(binary())
        .args(["local-swarm", "--epochs", "1", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "it ran: {stderr}");
    assert!(
        stderr.contains("--out"),
        "the message names the flag: {stderr}"
    );
    assert!(precious.exists(), "the directory was emptied");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_preset_is_refused_before_anything_is_touched() {
    let dir = scratch_dir("swarm-preset");
    let out = dir.join("out");
    for command in [
        vec!["local-swarm", "--preset", "huge", "--out"],
        vec!["train-local", "--preset", "huge", "--steps", "1"],
    ] {
        let mut cmd = std::process::Command::new(binary());
        cmd.args(&command);
        if command[0] == "local-swarm" {
            cmd.arg(&out);
        }
        let output = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{command:?} ran");
        // Parsed the same way in every command: clap names the flag and the choices.
        assert!(
            stderr.contains("--preset") && stderr.contains("tiny, small, base"),
            "{command:?}: {stderr}"
        );
        assert!(!out.exists(), "{command:?} created its output first");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cuda_device_the_machine_lacks_or_a_bad_dtype_exits_nonzero_before_anything_starts() {
    let dir = scratch_dir("missing-cuda");
    let out = dir.join("out");
    let out_arg = out.display().to_string();
    // No machine has 64 GPUs, so this holds on a GPU machine too; on one without CUDA the
    // message says CUDA is missing.
    for command in [
        vec!["--device", "cuda:63"],
        vec!["train-local", "--steps", "1", "--device", "cuda:63"],
        vec!["local-swarm", "--out", &out_arg, "--device", "cpu,cuda:63"],
        vec!["--dtype", "fp16"],
        vec!["train-local", "--steps", "1", "--dtype", "fp16"],
        vec!["local-swarm", "--out", &out_arg, "--dtype", "fp16"],
    ] {
        let output = std::process::Command::new(binary())
            .args(&command)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{command:?} ran");
        let flag = if command.contains(&"fp16") {
            "--dtype"
        } else {
            "--device"
        };
        assert!(stderr.contains(flag), "{command:?}: {stderr}");
        assert!(
            stderr.contains("CUDA") || stderr.contains("f32, bf16"),
            "{command:?} says what is missing or allowed: {stderr}"
        );
        assert!(!out.exists(), "{command:?} created its output first");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_bottleneck_kind_or_gradient_format_exits_naming_the_flag_and_the_choices() {
    for (flag, value, choices) in [
        (
            "--bottleneck-kind",
            "resnet",
            "iota, plain, resbm, subspace",
        ),
        ("--grad-wire", "fp8", "int4"),
    ] {
        let output = std::process::Command::new(binary())
            .args([
                "train-local",
                "--steps",
                "1",
                "--bottleneck",
                "8",
                flag,
                value,
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flag} {value} ran");
        assert!(
            stderr.contains(flag) && stderr.contains(choices),
            "{flag}: {stderr}"
        );
    }
}

#[test]
fn node_flags_with_a_subcommand_are_refused_and_node_settings_do_not_break_it() {
    let dir = scratch_dir("keygen-flags");
    // `--validator keygen` used to run keygen and drop `--validator` without a word.
    let output = std::process::Command::new(binary())
        .args(["--validator", "keygen", "--data-dir"])
        .arg(dir.join("a"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "--validator keygen was accepted");
    assert!(stderr.contains("--validator"), "{stderr}");
    // A node setting in the environment is no business of keygen's.
    let output = std::process::Command::new(binary())
        .args(["keygen", "--data-dir"])
        .arg(dir.join("b"))
        .env("IOTA_DEVICE", "quantum")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "keygen with IOTA_DEVICE=quantum: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let peer = String::from_utf8_lossy(&output.stdout);
    assert!(peer.trim().starts_with("12D3KooW"), "{peer}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_model_config_is_refused_naming_the_flag_and_the_key_before_anything_is_touched() {
    let dir = scratch_dir("bad-model-config");
    let out = dir.join("out");
    let missing = dir.join("missing-kv-heads.json");
    std::fs::write(
        &missing,
        r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128, "rope_theta": 10000.0,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-5}"#,
    )
    .unwrap();
    let scaled = dir.join("linear-rope-scaling.json");
    std::fs::write(
        &scaled,
        r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "rope_theta": 10000.0, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0}}"#,
    )
    .unwrap();
    // The binary's stderr for `args`, which it must refuse.
    let refused = |args: &[&str]| -> String {
        let output = std::process::Command::new(binary())
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} ran");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let out_arg = out.to_str().unwrap();
    for (file, key) in [(&missing, "num_key_value_heads"), (&scaled, "rope_scaling")] {
        let file = file.to_str().unwrap();
        for command in [
            vec!["local-swarm", "--model-config", file, "--out", out_arg],
            vec!["train-local", "--model-config", file, "--steps", "1"],
        ] {
            let stderr = refused(&command);
            assert!(
                stderr.contains("--model-config") && stderr.contains(key),
                "{command:?}: {stderr}"
            );
            assert!(!out.exists(), "{command:?} created its output first");
        }
    }
    // A tied model is a model train-local trains, but not one the network can yet: local-swarm
    // says so, naming the key, before it writes anything.
    let tied = dir.join("tied.json");
    std::fs::write(
        &tied,
        r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "rope_theta": 10000.0, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": true}"#,
    )
    .unwrap();
    let tied_arg = tied.to_str().unwrap();
    let stderr = refused(&["local-swarm", "--model-config", tied_arg, "--out", out_arg]);
    assert!(stderr.contains("model.tie_word_embeddings"), "{stderr}");
    assert!(
        !out.exists(),
        "the tied local-swarm created its output first"
    );
    // train-local's --run: a run configuration whose [model] table no model has.
    let run = dir.join("run.toml");
    std::fs::write(
        &run,
        "[model]\nhidden_size = 64\nnum_hidden_layers = 2\nnum_attention_heads = 4\n\
         num_key_value_heads = 3\nintermediate_size = 128\nrope_theta = 10000.0\n\
         max_position_embeddings = 256\nrms_norm_eps = 1e-5\n",
    )
    .unwrap();
    let stderr = refused(&[
        "train-local",
        "--run",
        run.to_str().unwrap(),
        "--steps",
        "1",
    ]);
    assert!(
        stderr.contains("--run") && stderr.contains("model.num_key_value_heads"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
