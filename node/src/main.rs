//! The `iota-p2p` binary.

fn main() -> anyhow::Result<()> {
    Ok(())
}
