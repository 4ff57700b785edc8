//! Cross-checks of `bootstrap::identity` with bittensor-wallet, an implementation we did not
//! write: its hotkey file and signatures (fixtures from `scripts/wallet_fixtures.py`) load and
//! verify here, and a hotkey file and signatures written here load and verify there
//! (`scripts/wallet_verify.py`, run with the repository's `.venv/bin/python`).

use std::path::{Path, PathBuf};
use std::process::Command;

use bootstrap::identity::{
    hotkey_file_path, load_hotkey_file, verify, write_hotkey_file, BindingClaim, NewHotkey,
};
use bootstrap::PeerIdStr;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate sits in the workspace")
        .to_owned()
}

fn fixtures() -> PathBuf {
    repo_root().join("bootstrap/tests/fixtures/bittensor-wallet")
}

fn hex32(text: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).expect("32 bytes in hex");
    out
}

fn hex64(text: &str) -> [u8; 64] {
    let mut out = [0u8; 64];
    hex::decode_to_slice(text, &mut out).expect("64 bytes in hex");
    out
}

#[test]
fn bittensor_wallet_hotkey_file_loads_and_its_signatures_verify() {
    let spec: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("signatures.json")).unwrap())
            .unwrap();
    let path = hotkey_file_path(
        Path::new("/nonexistent-home"),
        Some(&fixtures().join("wallets")),
        spec["wallet"].as_str(),
        spec["hotkey"].as_str(),
    )
    .unwrap();
    let pair = load_hotkey_file(&path).unwrap();
    assert_eq!(pair.hotkey().as_str(), spec["ss58"].as_str().unwrap());
    let public = hex32(spec["public_key_hex"].as_str().unwrap());
    assert_eq!(pair.public_key(), public);

    // The canonical binding bytes, computed independently in Python, match ours.
    let binding = &spec["binding"];
    let claim = BindingClaim {
        netuid: u16::try_from(binding["netuid"].as_u64().unwrap()).unwrap(),
        hotkey: pair.hotkey(),
        peer_id: PeerIdStr::parse(binding["peer_id"].as_str().unwrap()).unwrap(),
        expires_at: binding["expires_at"].as_u64().unwrap(),
    };
    assert_eq!(
        hex::encode(claim.canonical_bytes()),
        binding["canonical_hex"].as_str().unwrap()
    );

    let messages = spec["messages"].as_array().unwrap();
    assert!(messages.len() >= 4);
    for item in messages {
        let message = hex::decode(item["message_hex"].as_str().unwrap()).unwrap();
        let signature = hex64(item["signature_hex"].as_str().unwrap());
        assert!(verify(&public, &message, &signature), "{}", item["name"]);
        let mut corrupt = signature;
        corrupt[5] ^= 1;
        assert!(!verify(&public, &message, &corrupt), "{}", item["name"]);
        if item["name"] == "binding" {
            assert_eq!(message, claim.canonical_bytes());
            assert!(claim.verify_hotkey_signature(&signature));
        }
    }
}

/// The venv's Python, if it has bittensor_wallet; `None` means skip (panics under `CI`).
fn python_with_bittensor_wallet() -> Option<PathBuf> {
    let python = repo_root().join(".venv/bin/python");
    let found = Command::new(&python)
        .args(["-c", "import bittensor_wallet"])
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false);
    if found {
        return Some(python);
    }
    let why = format!(
        "{} cannot import bittensor_wallet (run scripts/setup.sh)",
        python.display()
    );
    if std::env::var_os("CI").is_some() {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

#[test]
fn bittensor_wallet_loads_our_hotkey_file_and_verifies_our_signatures() {
    let Some(python) = python_with_bittensor_wallet() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!(
        "iota-bittensor-wallet-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let key = NewHotkey::generate().unwrap();
    let path =
        hotkey_file_path(&dir, Some(&dir.join("wallets")), Some("rust"), Some("hot")).unwrap();
    write_hotkey_file(&path, &key, false).unwrap();

    let pair = key.pair();
    let claim = BindingClaim {
        netuid: 9,
        hotkey: pair.hotkey(),
        peer_id: PeerIdStr::from_ed25519_public_key(&[0x2a; 32]),
        expires_at: 1_767_225_600,
    };
    let messages: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"hello, bittensor".to_vec(),
        (0..=255u8).cycle().take(1000).collect(),
        claim.canonical_bytes(),
    ];
    let signed: Vec<Value> = messages
        .iter()
        .map(|m| {
            serde_json::json!({
                "message_hex": hex::encode(m),
                "signature_hex": hex::encode(pair.sign(m)),
            })
        })
        .collect();
    let spec = serde_json::json!({
        "wallet": "rust",
        "hotkey": "hot",
        "ss58": pair.hotkey().as_str(),
        "messages": signed,
    });
    std::fs::write(dir.join("signatures.json"), spec.to_string()).unwrap();

    let out = Command::new(&python)
        .arg(repo_root().join("scripts/wallet_verify.py"))
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "wallet_verify.py failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
