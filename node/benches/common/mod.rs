//! What the benches that run the binary share: running it with its output echoed, and
//! reading its `RESULT` lines.

use std::process::Command;

/// The `key=value` fields of the `RESULT <name>` line in `output`.
pub(crate) fn result(output: &str, name: &str) -> std::collections::BTreeMap<String, f64> {
    let prefix = format!("RESULT {name} ");
    output
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .next_back()
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs the binary (`IOTA_BENCH_BINARY` when set: a build carried to a machine with no Rust
/// toolchain, see scripts/gpu-bench.sh) with `args`, echoing its output line by line as it
/// comes (the progress of a run of several minutes), and returns it.
pub(crate) fn run(args: &[&str]) -> String {
    use std::io::BufRead;
    let binary = std::env::var_os("IOTA_BENCH_BINARY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_iota-p2p").into());
    let mut child = Command::new(binary)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut text = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            println!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
    }
    let status = child.wait().expect("the binary ends");
    assert!(status.success(), "{args:?} failed:\n{text}");
    text
}
