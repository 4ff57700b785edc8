//! The `iota-p2p` binary; everything lives in the library so tests can reach the launcher.

fn main() -> std::process::ExitCode {
    iota_p2p::main_entry()
}
