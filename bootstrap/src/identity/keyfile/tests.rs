use super::*;

/// Substrate's development phrase, as bittensor-wallet 4.1.1 writes it
/// (`Keypair.create_from_mnemonic` then `serialized_keypair_to_keyfile_data`).
const DEV_FILE: &str = r#"{"privateKey":"0x05d65584630d16cd4af6d0bec10f34bb504a5dcb62dba2122d49f5a663763d0afd190cce74df356432b410bd64682309d6dedb27c76845daf388557cbac3ca34","secretPhrase":"bottom drive obey lake curtain smoke basket hold race lonely fit walk","secretSeed":"0xfac7959dbfe72f052e5a0c3c8d6530f202b02fd8f9f5ca3580ec8deb7797479e","ss58Address":"5DfhGyQdFobKM8NsWvEeAKk5EQQgYe9AydgJ7rMB6E1EqRzV","cryptoType":1,"accountId":"0x46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a","publicKey":"0x46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a"}"#;
const DEV_SS58: &str = "5DfhGyQdFobKM8NsWvEeAKk5EQQgYe9AydgJ7rMB6E1EqRzV";
const DEV_PHRASE: &str = "bottom drive obey lake curtain smoke basket hold race lonely fit walk";

fn dev_json() -> serde_json::Map<String, serde_json::Value> {
    serde_json::from_str(DEV_FILE).unwrap()
}

fn with(edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> Vec<u8> {
    let mut map = dev_json();
    edit(&mut map);
    serde_json::to_vec(&map).unwrap()
}

#[test]
fn loads_a_bittensor_wallet_file() {
    let pair = parse_hotkey_file(DEV_FILE.as_bytes()).unwrap();
    assert_eq!(pair.hotkey().as_str(), DEV_SS58);
    assert_eq!(
        hex::encode(pair.public_key()),
        "46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a"
    );
}

#[test]
fn optional_fields_may_be_null_or_absent() {
    for edit in [
        |m: &mut serde_json::Map<_, _>| {
            m.insert("secretPhrase".into(), serde_json::Value::Null);
        },
        |m: &mut serde_json::Map<_, _>| {
            m.remove("secretPhrase");
        },
        |m: &mut serde_json::Map<_, _>| {
            m.remove("secretSeed");
        },
        |m: &mut serde_json::Map<_, _>| {
            m.remove("privateKey");
            m.remove("accountId");
            m.remove("cryptoType");
        },
        |m: &mut serde_json::Map<_, _>| {
            m.insert("somethingNew".into(), 5.into());
        },
    ] {
        let pair = parse_hotkey_file(&with(edit)).unwrap();
        assert_eq!(pair.hotkey().as_str(), DEV_SS58);
    }
    // Surrounding whitespace is fine.
    let padded = format!("\n {DEV_FILE}\n");
    assert!(parse_hotkey_file(padded.as_bytes()).is_ok());
}

#[test]
fn accepts_the_raw_seed_quirk() {
    // bittensor-wallet 4.1.1, `Keypair.create_from_seed("0x" + "01" * 32)`: the seed bytes
    // themselves follow "0x".
    let file = r#"{"privateKey":"0x0bdd6dbf4edf8925e8c128bc2ddd9ed555e36240ca30ca7633d80e18d177de0db17a2a2cf3d4a41a8e4e18cc45c8656d558eceddb0adb46bfa088a5f53bed252","cryptoType":1,"accountId":"0x189dac29296d31814dc8c56cf3d36a0543372bba7538fa322a4aebfebc39e056","secretSeed":"0x\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001\u0001","publicKey":"0x189dac29296d31814dc8c56cf3d36a0543372bba7538fa322a4aebfebc39e056","ss58Address":"5CcyqxXnJucaCnQQvvUg5EPzj1uoNAxACZvzArHw5aVDvgNH"}"#;
    let pair = parse_hotkey_file(file.as_bytes()).unwrap();
    assert_eq!(
        pair.public_key(),
        HotkeyPair::from_seed(&[1u8; 32]).public_key()
    );
}

#[test]
fn refuses_encrypted_files() {
    for (prefix, method) in [
        ("$NACL\u{9a}\u{97}", "NaCl secretbox"),
        ("$ANSIBLE_VAULT;1.1;AES256", "Ansible Vault"),
        ("gAAAAABk", "legacy Fernet"),
        ("$BT1$whatever", "an unknown scheme"),
    ] {
        let err = parse_hotkey_file(prefix.as_bytes()).unwrap_err();
        assert_eq!(err, ParseHotkeyError::Encrypted { method });
        assert!(err
            .to_string()
            .contains("encrypted hotkeys are not supported"));
    }
}

#[test]
fn refuses_malformed_files() {
    assert!(matches!(
        parse_hotkey_file(b"not json"),
        Err(ParseHotkeyError::NotJson { .. })
    ));
    assert!(matches!(
        parse_hotkey_file(b"{\"secretSeed\": 5}"),
        Err(ParseHotkeyError::NotJson {
            what: "a field of the wrong type",
            ..
        })
    ));
    assert!(matches!(
        parse_hotkey_file(b""),
        Err(ParseHotkeyError::NotJson { .. })
    ));
    let big = vec![b' '; MAX_KEYFILE_BYTES as usize + 1];
    assert!(matches!(
        parse_hotkey_file(&big),
        Err(ParseHotkeyError::TooLarge { .. })
    ));
    let ed = with(|m| {
        m.insert("cryptoType".into(), 0.into());
    });
    assert_eq!(
        parse_hotkey_file(&ed).err(),
        Some(ParseHotkeyError::NotSr25519 { crypto_type: 0 })
    );
    let public_only = with(|m| {
        m.remove("secretSeed");
        m.remove("secretPhrase");
    });
    assert_eq!(
        parse_hotkey_file(&public_only).err(),
        Some(ParseHotkeyError::NoSecret)
    );
    for (field, value) in [
        ("secretSeed", "0x1234"),
        (
            "secretPhrase",
            "bottom drive obey lake curtain smoke basket hold race lonely fit fit",
        ),
        ("privateKey", "0xzz"),
        ("publicKey", "0x46eb"),
    ] {
        let bad = with(|m| {
            m.insert(field.into(), value.into());
        });
        assert!(
            matches!(parse_hotkey_file(&bad), Err(ParseHotkeyError::BadField { field: f, .. }) if f == field),
            "{field}"
        );
    }
}

#[test]
fn every_field_must_agree_with_the_secret() {
    let other = NewHotkey::from_entropy(&[9u8; 16]);
    let other_json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&other.keyfile_json().unwrap()).unwrap();
    let swap = |field: &str| {
        with(|m| {
            m.insert(field.into(), other_json[field].clone());
        })
    };
    assert_eq!(
        parse_hotkey_file(&swap("secretPhrase")).err(),
        Some(ParseHotkeyError::SecretsDisagree {
            field: "secretPhrase",
            source_field: "secretSeed"
        })
    );
    assert_eq!(
        parse_hotkey_file(&swap("privateKey")).err(),
        Some(ParseHotkeyError::SecretsDisagree {
            field: "privateKey",
            source_field: "secretSeed"
        })
    );
    for field in ["publicKey", "accountId", "ss58Address"] {
        assert!(
            matches!(
                parse_hotkey_file(&swap(field)),
                Err(ParseHotkeyError::KeyMismatch { field: f, .. }) if f == field
            ),
            "{field}"
        );
    }
    // A different seed with the old public fields: the seed wins, the fields disagree.
    let mut seed_only = dev_json();
    seed_only.remove("secretPhrase");
    seed_only.remove("privateKey");
    seed_only.insert("secretSeed".into(), other_json["secretSeed"].clone());
    assert!(matches!(
        parse_hotkey_file(&serde_json::to_vec(&seed_only).unwrap()),
        Err(ParseHotkeyError::KeyMismatch {
            field: "publicKey",
            ..
        })
    ));
    for field in ["publicKey", "ss58Address"] {
        let missing = with(|m| {
            m.remove(field);
        });
        assert!(
            matches!(parse_hotkey_file(&missing), Err(ParseHotkeyError::MissingField { field: f }) if f == field),
            "{field}"
        );
    }
}

#[test]
fn errors_never_show_secrets() {
    let other = NewHotkey::from_entropy(&[9u8; 16]);
    let other_json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&other.keyfile_json().unwrap()).unwrap();
    for field in ["secretPhrase", "privateKey", "secretSeed"] {
        let bad = with(|m| {
            m.insert(field.into(), other_json[field].clone());
        });
        let text = parse_hotkey_file(&bad).unwrap_err().to_string();
        for secret in ["secretPhrase", "privateKey", "secretSeed"] {
            let value = other_json[secret].as_str().unwrap();
            assert!(!text.contains(&value[2..20]), "{text}");
        }
    }
}

#[test]
fn new_hotkeys_derive_as_substrate_does() {
    let dev = bip39::Mnemonic::parse_in_normalized(bip39::Language::English, DEV_PHRASE).unwrap();
    let (entropy, len) = dev.to_entropy_array();
    assert_eq!(len, 16);
    let key = NewHotkey::from_entropy(entropy[..16].try_into().unwrap());
    assert_eq!(key.phrase(), DEV_PHRASE);
    assert_eq!(key.pair().hotkey().as_str(), DEV_SS58);
    let json = key.keyfile_json().unwrap();
    // Same fields and values as bittensor-wallet's own file.
    let ours: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(ours, dev_json());
    let pair = parse_hotkey_file(json.as_bytes()).unwrap();
    assert_eq!(pair.public_key(), key.pair().public_key());
    let public: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&key.keyfile_pub_json().unwrap()).unwrap();
    assert_eq!(public["ss58Address"], DEV_SS58);
    assert!(public.get("secretSeed").is_none() && public.get("privateKey").is_none());
    let a = NewHotkey::generate().unwrap();
    let b = NewHotkey::generate().unwrap();
    assert_ne!(a.pair().public_key(), b.pair().public_key());
    assert_eq!(a.phrase().split(' ').count(), 12);
    assert!(!format!("{a:?}").contains(a.phrase()));
}

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "iota-keyfile-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn writes_private_files_atomically_and_never_clobbers() {
    let tmp = TempDir::new("write");
    let path = tmp.0.join("wallets/cold/hotkeys/hot");
    let key = NewHotkey::generate().unwrap();
    write_hotkey_file(&path, &key, false).unwrap();
    let loaded = load_hotkey_file(&path).unwrap();
    assert_eq!(loaded.public_key(), key.pair().public_key());
    let pub_path = tmp.0.join("wallets/cold/hotkeys/hotpub.txt");
    assert_eq!(hotkeypub_file_path(&path).unwrap(), pub_path);
    let public = fs::read_to_string(&pub_path).unwrap();
    assert!(public.contains(key.pair().hotkey().as_str()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&pub_path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
    }

    let second = NewHotkey::generate().unwrap();
    assert!(matches!(
        write_hotkey_file(&path, &second, false),
        Err(WriteHotkeyError::Exists { .. })
    ));
    assert_eq!(
        load_hotkey_file(&path).unwrap().public_key(),
        key.pair().public_key()
    );
    write_hotkey_file(&path, &second, true).unwrap();
    assert_eq!(
        load_hotkey_file(&path).unwrap().public_key(),
        second.pair().public_key()
    );
    let names: Vec<_> = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["hot", "hotpub.txt"],
        "no temporary file left behind"
    );
}

#[test]
fn load_reports_io_and_size_problems() {
    let tmp = TempDir::new("load");
    let missing = tmp.0.join("nope");
    assert!(matches!(
        load_hotkey_file(&missing),
        Err(LoadHotkeyError::Io { .. })
    ));
    let big = tmp.0.join("big");
    fs::write(&big, vec![b' '; MAX_KEYFILE_BYTES as usize + 10]).unwrap();
    assert!(matches!(
        load_hotkey_file(&big),
        Err(LoadHotkeyError::TooLarge { .. })
    ));
    let encrypted = tmp.0.join("enc");
    fs::write(&encrypted, b"$NACLxxxx").unwrap();
    let err = load_hotkey_file(&encrypted).unwrap_err();
    assert!(
        matches!(
            &err,
            LoadHotkeyError::Parse {
                source: ParseHotkeyError::Encrypted { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("enc"), "{err}");
    assert!(matches!(
        write_hotkey_file(Path::new("/"), &NewHotkey::from_entropy(&[0; 16]), false),
        Err(WriteHotkeyError::BadPath { .. })
    ));
}
