use super::*;

use bootstrap::identity::MAX_BINDING_LIFETIME_SECS;

const NETUID: u16 = 9;
const NOW: u64 = 1_750_000_000;
const EXPIRES: u64 = NOW + 3600;

fn hotkey(n: u8) -> HotkeyPair {
    HotkeyPair::from_seed(&[n; 32])
}

fn peer_key(n: u8) -> Keypair {
    let mut secret = [n; 32];
    Keypair::ed25519_from_bytes(&mut secret).unwrap()
}

fn signed() -> (HotkeyBinding, PeerId) {
    let peer = peer_key(1);
    let binding = HotkeyBinding::sign(&hotkey(1), &peer, NETUID, EXPIRES).unwrap();
    (binding, peer.public().to_peer_id())
}

#[test]
fn a_signed_binding_verifies_and_round_trips() {
    let (binding, sender) = signed();
    let verified = binding.verify(&sender, NETUID, NOW).unwrap();
    assert_eq!(verified.hotkey(), &hotkey(1).hotkey());
    assert_eq!(verified.peer(), &sender);
    assert_eq!(verified.netuid(), NETUID);
    assert_eq!(verified.expires_at(), EXPIRES);
    let json = binding.to_json().unwrap();
    assert!(json.len() < 600, "{} bytes", json.len());
    assert!(binding.peer_public_key.is_none());
    assert_eq!(HotkeyBinding::from_json(&json).unwrap(), binding);
}

#[test]
fn rejects_wrong_netuid() {
    let (binding, sender) = signed();
    assert_eq!(
        binding.verify(&sender, NETUID + 1, NOW),
        Err(BindingError::WrongNetuid {
            expected: NETUID + 1,
            found: NETUID
        })
    );
}

#[test]
fn rejects_expired() {
    let (binding, sender) = signed();
    for now in [EXPIRES, EXPIRES + 1, u64::MAX] {
        assert!(matches!(
            binding.verify(&sender, NETUID, now),
            Err(BindingError::Time(BindingTimeError::Expired { .. }))
        ));
    }
}

#[test]
fn rejects_expiry_too_far_ahead() {
    let peer = peer_key(1);
    let far = NOW + MAX_BINDING_LIFETIME_SECS + 1;
    let binding = HotkeyBinding::sign(&hotkey(1), &peer, NETUID, far).unwrap();
    let sender = peer.public().to_peer_id();
    assert!(matches!(
        binding.verify(&sender, NETUID, NOW),
        Err(BindingError::Time(BindingTimeError::TooFarInFuture { .. }))
    ));
    // Exactly the cap is fine.
    assert!(binding.verify(&sender, NETUID, NOW + 1).is_ok());
}

#[test]
fn rejects_a_binding_replayed_by_another_peer() {
    let (binding, _) = signed();
    let other = peer_key(2).public().to_peer_id();
    assert!(matches!(
        binding.verify(&other, NETUID, NOW),
        Err(BindingError::NotSender { .. })
    ));
    // Rewriting the peer id to the replayer's breaks the hotkey signature.
    let mut stolen = binding;
    stolen.peer_id = other.to_base58();
    assert_eq!(
        stolen.verify(&other, NETUID, NOW),
        Err(BindingError::BadHotkeySignature)
    );
}

#[test]
fn rejects_missing_hotkey_signature() {
    let (mut binding, sender) = signed();
    binding.hotkey_signature.clear();
    assert_eq!(
        binding.verify(&sender, NETUID, NOW),
        Err(BindingError::MissingHotkeySignature)
    );
    let mut json: serde_json::Value =
        serde_json::from_slice(&signed().0.to_json().unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("hotkey_signature");
    assert!(matches!(
        HotkeyBinding::from_json(json.to_string().as_bytes()),
        Err(BindingDecodeError::Json(_))
    ));
}

#[test]
fn rejects_invalid_hotkey_signature() {
    let (binding, sender) = signed();
    let mut flipped = binding.clone();
    let mut sig = hex::decode(&flipped.hotkey_signature).unwrap();
    sig[10] ^= 1;
    flipped.hotkey_signature = hex::encode(sig);
    assert_eq!(
        flipped.verify(&sender, NETUID, NOW),
        Err(BindingError::BadHotkeySignature)
    );
    // Another hotkey claiming the same signature.
    let mut other_hotkey = binding.clone();
    other_hotkey.hotkey = hotkey(2).hotkey().to_string();
    assert_eq!(
        other_hotkey.verify(&sender, NETUID, NOW),
        Err(BindingError::BadHotkeySignature)
    );
    // A later expiry than the hotkey signed.
    let mut extended = binding.clone();
    extended.expires_at += 1;
    assert_eq!(
        extended.verify(&sender, NETUID, NOW),
        Err(BindingError::BadHotkeySignature)
    );
    let mut short = binding;
    short.hotkey_signature.truncate(100);
    assert!(matches!(
        short.verify(&sender, NETUID, NOW),
        Err(BindingError::Malformed {
            field: "hotkey_signature",
            ..
        })
    ));
}

#[test]
fn rejects_invalid_peer_signature() {
    let (binding, sender) = signed();
    let mut flipped = binding.clone();
    let mut sig = hex::decode(&flipped.peer_signature).unwrap();
    sig[0] ^= 1;
    flipped.peer_signature = hex::encode(sig);
    assert_eq!(
        flipped.verify(&sender, NETUID, NOW),
        Err(BindingError::BadPeerSignature)
    );
    // The hotkey signed for peer 1, but peer 2's key counter-signed.
    let claim = BindingClaim {
        netuid: NETUID,
        hotkey: hotkey(1).hotkey(),
        peer_id: PeerIdStr::from_bytes(&sender.to_bytes()).unwrap(),
        expires_at: EXPIRES,
    };
    let hotkey_signature = claim.sign(&hotkey(1)).unwrap();
    let mut wrong = HotkeyBinding::countersign(&claim, &hotkey_signature, &peer_key(2)).unwrap();
    wrong.peer_id = sender.to_base58();
    assert_eq!(
        wrong.verify(&sender, NETUID, NOW),
        Err(BindingError::BadPeerSignature)
    );
    let mut empty = binding;
    empty.peer_signature.clear();
    assert_eq!(
        empty.verify(&sender, NETUID, NOW),
        Err(BindingError::BadPeerSignature)
    );
}

#[test]
fn countersigning_checks_the_hotkey_signature() {
    let peer = peer_key(1);
    let claim = BindingClaim {
        netuid: NETUID,
        hotkey: hotkey(1).hotkey(),
        peer_id: PeerIdStr::from_bytes(&peer.public().to_peer_id().to_bytes()).unwrap(),
        expires_at: EXPIRES,
    };
    let by_other = hotkey(2).sign(&claim.canonical_bytes());
    assert!(matches!(
        HotkeyBinding::countersign(&claim, &by_other, &peer),
        Err(BindingSignError::BadHotkeySignature)
    ));
    let good = claim.sign(&hotkey(1)).unwrap();
    let binding = HotkeyBinding::countersign(&claim, &good, &peer).unwrap();
    assert!(binding
        .verify(&peer.public().to_peer_id(), NETUID, NOW)
        .is_ok());
}

#[test]
fn rejects_oversized_or_unknown_shapes() {
    let (binding, sender) = signed();
    let big = vec![b' '; MAX_BINDING_BYTES + 1];
    assert_eq!(
        HotkeyBinding::from_json(&big),
        Err(BindingDecodeError::TooLarge {
            len: MAX_BINDING_BYTES + 1
        })
    );
    let mut json: serde_json::Value = serde_json::from_slice(&binding.to_json().unwrap()).unwrap();
    json["extra"] = 1.into();
    assert!(matches!(
        HotkeyBinding::from_json(json.to_string().as_bytes()),
        Err(BindingDecodeError::Json(_))
    ));
    for field in ["hotkey", "peer_id", "hotkey_signature", "peer_signature"] {
        let mut long = binding.clone();
        let text = match field {
            "hotkey" => &mut long.hotkey,
            "peer_id" => &mut long.peer_id,
            "hotkey_signature" => &mut long.hotkey_signature,
            _ => &mut long.peer_signature,
        };
        text.push_str(&"a".repeat(200));
        assert_eq!(
            long.verify(&sender, NETUID, NOW),
            Err(BindingError::Malformed {
                field,
                problem: "too long"
            }),
            "{field}"
        );
    }
    let mut bad_hotkey = binding.clone();
    bad_hotkey.hotkey = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQX".into();
    assert!(matches!(
        bad_hotkey.verify(&sender, NETUID, NOW),
        Err(BindingError::Malformed {
            field: "hotkey",
            ..
        })
    ));
    let mut bad_peer = binding.clone();
    bad_peer.peer_id = "not a peer".into();
    assert!(matches!(
        bad_peer.verify(&sender, NETUID, NOW),
        Err(BindingError::Malformed {
            field: "peer_id",
            ..
        })
    ));
    let mut extra_key = binding;
    extra_key.peer_public_key = Some(hex::encode(peer_key(1).public().encode_protobuf()));
    assert!(matches!(
        extra_key.verify(&sender, NETUID, NOW),
        Err(BindingError::Malformed {
            field: "peer_public_key",
            ..
        })
    ));
}

#[test]
fn a_hashed_peer_id_needs_its_key_in_the_record() {
    // A sha2-256 peer id (as for RSA keys): the key is not in the id.
    let mut bytes = vec![0x12, 0x20];
    bytes.extend_from_slice(&[3u8; 32]);
    let peer = PeerId::from_bytes(&bytes).unwrap();
    let claim = BindingClaim {
        netuid: NETUID,
        hotkey: hotkey(1).hotkey(),
        peer_id: PeerIdStr::from_bytes(&bytes).unwrap(),
        expires_at: EXPIRES,
    };
    let hotkey_signature = claim.sign(&hotkey(1)).unwrap();
    let mut binding = HotkeyBinding {
        netuid: NETUID,
        hotkey: claim.hotkey.to_string(),
        peer_id: peer.to_base58(),
        expires_at: EXPIRES,
        hotkey_signature: hex::encode(hotkey_signature),
        peer_signature: hex::encode([0u8; 64]),
        peer_public_key: None,
    };
    assert!(matches!(
        binding.verify(&peer, NETUID, NOW),
        Err(BindingError::PeerKey(_))
    ));
    // A key that does not hash to the id.
    binding.peer_public_key = Some(hex::encode(peer_key(1).public().encode_protobuf()));
    assert!(matches!(
        binding.verify(&peer, NETUID, NOW),
        Err(BindingError::PeerKey(_))
    ));
}

fn verified(hotkey_n: u8, peer_n: u8, expires_at: u64) -> VerifiedBinding {
    VerifiedBinding {
        hotkey: hotkey(hotkey_n).hotkey(),
        peer: peer_key(peer_n).public().to_peer_id(),
        netuid: NETUID,
        expires_at,
    }
}

fn peer(n: u8) -> PeerId {
    peer_key(n).public().to_peer_id()
}

#[test]
fn book_adds_and_looks_up() {
    let mut book = BindingBook::new();
    assert!(book.is_empty());
    assert_eq!(
        book.insert(verified(1, 1, EXPIRES), NOW),
        BookUpdate::Accepted {
            replaced_peer: None,
            evicted_hotkey: None
        }
    );
    assert_eq!(book.peer_of(&hotkey(1).hotkey()), Some(&peer(1)));
    assert_eq!(book.hotkey_of(&peer(1)), Some(&hotkey(1).hotkey()));
    assert_eq!(book.expires_at(&hotkey(1).hotkey()), Some(EXPIRES));
    assert_eq!(book.len(), 1);
    assert_eq!(book.iter().count(), 1);
    assert_eq!(book.insert(verified(2, 2, NOW), NOW), BookUpdate::Expired);
}

#[test]
fn book_rotates_to_a_newer_binding_of_the_same_hotkey() {
    let mut book = BindingBook::new();
    book.insert(verified(1, 1, EXPIRES), NOW);
    // An older or equally old binding to another peer changes nothing.
    assert_eq!(
        book.insert(verified(1, 2, EXPIRES - 1), NOW),
        BookUpdate::NotNewer
    );
    assert_eq!(
        book.insert(verified(1, 1, EXPIRES), NOW),
        BookUpdate::NotNewer
    );
    assert_eq!(
        book.insert(verified(1, 2, EXPIRES + 1), NOW),
        BookUpdate::Accepted {
            replaced_peer: Some(peer(1)),
            evicted_hotkey: None
        }
    );
    assert_eq!(book.peer_of(&hotkey(1).hotkey()), Some(&peer(2)));
    assert_eq!(
        book.hotkey_of(&peer(1)),
        None,
        "the old peer no longer speaks"
    );
    // Renewal by the same peer.
    assert_eq!(
        book.insert(verified(1, 2, EXPIRES + 10), NOW),
        BookUpdate::Accepted {
            replaced_peer: None,
            evicted_hotkey: None
        }
    );
    assert_eq!(book.expires_at(&hotkey(1).hotkey()), Some(EXPIRES + 10));
    assert_eq!(book.len(), 1);
}

#[test]
fn book_gives_a_peer_one_hotkey_the_newer_binding_wins() {
    let mut book = BindingBook::new();
    book.insert(verified(1, 1, EXPIRES), NOW);
    // Peer 1 also bound to hotkey 2, but expiring earlier: ignored.
    assert_eq!(
        book.insert(verified(2, 1, EXPIRES - 1), NOW),
        BookUpdate::PeerTaken {
            holder: hotkey(1).hotkey()
        }
    );
    assert_eq!(book.peer_of(&hotkey(2).hotkey()), None);
    // Expiring later: peer 1 now speaks for hotkey 2 and hotkey 1 is dropped.
    assert_eq!(
        book.insert(verified(2, 1, EXPIRES + 1), NOW),
        BookUpdate::Accepted {
            replaced_peer: None,
            evicted_hotkey: Some(hotkey(1).hotkey())
        }
    );
    assert_eq!(book.hotkey_of(&peer(1)), Some(&hotkey(2).hotkey()));
    assert_eq!(book.peer_of(&hotkey(1).hotkey()), None);
    assert_eq!(book.len(), 1);
}

#[test]
fn book_ties_resolve_the_same_in_either_order() {
    // Two bindings that conflict (same hotkey, or same peer) and expire together: whichever
    // arrives first, the book ends the same.
    let pairs = [
        (verified(1, 1, EXPIRES), verified(1, 2, EXPIRES)),
        (verified(1, 1, EXPIRES), verified(2, 1, EXPIRES)),
    ];
    for (x, y) in pairs {
        let state = |first: &VerifiedBinding, second: &VerifiedBinding| {
            let mut book = BindingBook::new();
            book.insert(first.clone(), NOW);
            book.insert(second.clone(), NOW);
            book.iter()
                .map(|(h, p, e)| (h.clone(), *p, e))
                .collect::<Vec<_>>()
        };
        let forward = state(&x, &y);
        assert_eq!(forward.len(), 1);
        assert_eq!(forward, state(&y, &x));
    }
}

#[test]
fn book_drops_expired_entries() {
    let mut book = BindingBook::new();
    book.insert(verified(1, 1, NOW + 10), NOW);
    book.insert(verified(2, 2, NOW + 20), NOW);
    assert!(book.expire(NOW + 9).is_empty());
    assert_eq!(book.expire(NOW + 10), vec![(hotkey(1).hotkey(), peer(1))]);
    assert_eq!(book.hotkey_of(&peer(1)), None);
    assert_eq!(book.len(), 1);
    // Insert expires entries too.
    book.insert(verified(3, 3, NOW + 100), NOW + 20);
    assert_eq!(book.peer_of(&hotkey(2).hotkey()), None);
    assert_eq!(book.len(), 1);
}

#[test]
fn book_is_bounded_and_a_full_book_turns_newcomers_away() {
    let mut book = BindingBook::with_capacity(2);
    book.insert(verified(1, 1, NOW + 10), NOW);
    book.insert(verified(2, 2, NOW + 20), NOW);
    assert_eq!(book.insert(verified(3, 3, NOW + 30), NOW), BookUpdate::Full);
    assert_eq!(book.len(), 2);
    assert_eq!(book.peer_of(&hotkey(3).hotkey()), None);
    // Those already in the book still renew, rotate and switch hotkeys.
    assert!(matches!(
        book.insert(verified(1, 4, NOW + 40), NOW),
        BookUpdate::Accepted { .. }
    ));
    assert!(matches!(
        book.insert(verified(3, 2, NOW + 50), NOW),
        BookUpdate::Accepted {
            evicted_hotkey: Some(_),
            ..
        }
    ));
    assert_eq!(book.len(), 2);
    // A lapsed entry makes room.
    assert_eq!(book.expire(NOW + 40), vec![(hotkey(1).hotkey(), peer(4))]);
    assert!(matches!(
        book.insert(verified(5, 5, NOW + 60), NOW + 40),
        BookUpdate::Accepted { .. }
    ));
}

#[test]
fn book_expires_in_expiry_order_after_renewals_and_removals() {
    let mut book = BindingBook::new();
    for i in 1..=5u8 {
        book.insert(verified(i, i, NOW + u64::from(i) * 10), NOW);
    }
    // Hotkey 1 renews past everyone; hotkey 2 rotates to peer 9; hotkey 3 leaves.
    book.insert(verified(1, 1, NOW + 100), NOW);
    book.insert(verified(2, 9, NOW + 25), NOW);
    assert_eq!(book.remove(&hotkey(3).hotkey()), Some(peer(3)));
    assert_eq!(book.remove(&hotkey(3).hotkey()), None);
    assert_eq!(book.expire(NOW + 25), vec![(hotkey(2).hotkey(), peer(9))]);
    assert_eq!(
        book.expire(NOW + 50),
        vec![(hotkey(4).hotkey(), peer(4)), (hotkey(5).hotkey(), peer(5))]
    );
    assert_eq!(book.len(), 1);
    assert_eq!(book.expire(NOW + 100), vec![(hotkey(1).hotkey(), peer(1))]);
    assert!(book.is_empty());
}

/// The hotkey signature bittensor-wallet made over the canonical bytes (see
/// bootstrap/tests/fixtures/bittensor-wallet/PROVENANCE.md), counter-signed here by the peer
/// it names, verifies as a whole binding; and Python's peer id of that Ed25519 key is libp2p's.
#[test]
fn a_python_hotkey_signature_makes_a_valid_binding() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bootstrap/tests/fixtures/bittensor-wallet/signatures.json");
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let binding = &spec["binding"];
    let peer = peer_key(0x2a);
    let sender = peer.public().to_peer_id();
    assert_eq!(sender.to_base58(), binding["peer_id"].as_str().unwrap());
    let item = spec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "binding")
        .unwrap();
    let mut signature = [0u8; 64];
    hex::decode_to_slice(item["signature_hex"].as_str().unwrap(), &mut signature).unwrap();
    let expires_at = binding["expires_at"].as_u64().unwrap();
    let claim = BindingClaim {
        netuid: u16::try_from(binding["netuid"].as_u64().unwrap()).unwrap(),
        hotkey: Hotkey::parse(spec["ss58"].as_str().unwrap()).unwrap(),
        peer_id: PeerIdStr::parse(binding["peer_id"].as_str().unwrap()).unwrap(),
        expires_at,
    };
    let wire = HotkeyBinding::countersign(&claim, &signature, &peer).unwrap();
    let verified = wire.verify(&sender, claim.netuid, expires_at - 60).unwrap();
    assert_eq!(verified.hotkey(), &claim.hotkey);
}
