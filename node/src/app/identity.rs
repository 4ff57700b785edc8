//! The node's ed25519 identity, created once in its data directory and reused after.
//!
//! A restarted node keeps its peer id, which is what the metagraph binds stake to.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use p2p::identity::Keypair;

/// File name of the identity inside a data directory.
const IDENTITY_FILE: &str = "identity.key";

/// Path of the identity file inside `data_dir`.
pub(crate) fn identity_path(data_dir: &Path) -> PathBuf {
    data_dir.join(IDENTITY_FILE)
}

/// Loads the identity from `data_dir`, creating the directory and a new identity if absent.
pub(crate) fn load_or_create(data_dir: &Path) -> anyhow::Result<Keypair> {
    let path = identity_path(data_dir);
    if path.exists() {
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        if bytes.len() > 4096 {
            bail!("{} is not a node identity (too large)", path.display());
        }
        return Keypair::from_protobuf_encoding(&bytes)
            .with_context(|| format!("{} is not a node identity", path.display()));
    }
    fs::create_dir_all(data_dir)
        .with_context(|| format!("creating data dir {}", data_dir.display()))?;
    let keypair = Keypair::generate_ed25519();
    let bytes = keypair
        .to_protobuf_encoding()
        .context("encoding the new identity")?;
    crate::fsio::write_atomically(&path, &bytes, true)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(keypair)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_created_once_and_reused() {
        let dir = std::env::temp_dir().join(format!("iota-id-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let first = load_or_create(&dir).unwrap();
        let second = load_or_create(&dir).unwrap();
        assert_eq!(first.public().to_peer_id(), second.public().to_peer_id());
        fs::write(identity_path(&dir), b"garbage").unwrap();
        assert!(load_or_create(&dir).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
