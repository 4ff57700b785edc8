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

/// Who this node is: its key, its peer id in both forms, and the secret its spot checks'
/// schedule is drawn from.
pub(crate) struct NodeIdentity {
    /// The node's key (the one in `--data-dir`, or a fresh one without it).
    pub(crate) keypair: Keypair,
    /// Its peer id.
    pub(crate) peer_id: p2p::PeerId,
    /// The same, in the validated text form `bootstrap` uses.
    pub(crate) me: bootstrap::PeerIdStr,
    /// Derived from the private key: unpredictable to others.
    pub(crate) spot_check_secret: [u8; 32],
}

/// Loads (or creates) the identity of `data_dir`, or draws a fresh one without it.
pub(crate) fn of_node(data_dir: Option<&Path>) -> anyhow::Result<NodeIdentity> {
    let keypair = match data_dir {
        Some(dir) => load_or_create(dir)?,
        None => Keypair::generate_ed25519(),
    };
    let peer_id = keypair.public().to_peer_id();
    // The spot checks' schedule is drawn from the private key: unpredictable to others.
    let spot_check_secret = blake3::derive_key(
        "iota-p2p validator spot-check schedule v1",
        &keypair
            .to_protobuf_encoding()
            .context("encoding the node key")?,
    );
    let me = crate::wire::peer::of(&peer_id);
    Ok(NodeIdentity {
        keypair,
        peer_id,
        me,
        spot_check_secret,
    })
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

    #[test]
    fn a_node_without_a_data_dir_gets_a_fresh_identity_with_its_own_secret() {
        let one = of_node(None).unwrap();
        let two = of_node(None).unwrap();
        assert_eq!(one.me.to_string(), one.peer_id.to_string());
        assert_ne!(one.peer_id, two.peer_id);
        assert_ne!(one.spot_check_secret, two.spot_check_secret);
    }
}
