#!/usr/bin/env python3
"""Writes bootstrap/tests/fixtures/bittensor-wallet/: a hotkey file made by bittensor-wallet
and signatures it made, for bootstrap/tests/bittensor_wallet.rs to check the Rust side against.

Deterministic key: the hotkey comes from a fixed BIP39 phrase (FIXED_PHRASE below), so the
hotkey file is the same on every run. sr25519 signatures are randomised, so the signatures
differ on every run (each one verifies all the same).

Usage: .venv/bin/python scripts/wallet_fixtures.py   (from the repository root)
"""
import datetime
import json
import os
import shutil
import struct
import sys
import tempfile

import bittensor_wallet
from bittensor_wallet import Keypair, Wallet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bootstrap", "tests", "fixtures", "bittensor-wallet")
# BIP39's test vector for the entropy 7f7f…7f: a valid English phrase nobody uses for money.
FIXED_PHRASE = "legal winner thank year wave sausage worth useful legal winner thank yellow"
WALLET, HOTKEY = "fixture", "fixture"
# The peer bound in the binding fixture: the Ed25519 key of the secret 0x2a * 32.
PEER_SECRET = bytes([0x2A] * 32)
NETUID = 9
EXPIRES_AT = 1_767_225_600  # 2026-01-01T00:00:00Z

BINDING_DOMAIN = b"iota-p2p/hotkey-binding/v1\0"
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def ed25519_peer_id_bytes(public_key: bytes) -> bytes:
    # Identity multihash of the protobuf PublicKey {Type: Ed25519, Data: key}.
    assert len(public_key) == 32
    return bytes([0x00, 36, 0x08, 0x01, 0x12, 32]) + public_key


def binding_bytes(netuid: int, hotkey_public: bytes, peer_id: bytes, expires_at: int) -> bytes:
    """The canonical bytes of bootstrap::identity::BindingClaim, computed independently."""
    assert len(hotkey_public) == 32 and len(peer_id) < 256
    return (
        BINDING_DOMAIN
        + struct.pack("<H", netuid)
        + hotkey_public
        + bytes([len(peer_id)])
        + peer_id
        + struct.pack("<Q", expires_at)
    )


def main() -> int:
    keypair = Keypair.create_from_mnemonic(FIXED_PHRASE)
    with tempfile.TemporaryDirectory() as tmp:
        wallet = Wallet(name=WALLET, hotkey=HOTKEY, path=tmp)
        wallet.set_hotkey(keypair, encrypt=False, overwrite=True)
        src = os.path.join(tmp, WALLET, "hotkeys")
        dst = os.path.join(OUT, "wallets", WALLET, "hotkeys")
        os.makedirs(dst, exist_ok=True)
        for name in sorted(os.listdir(src)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))

    peer_key = Keypair.create_from_seed("0x" + PEER_SECRET.hex(), crypto_type=0)  # ed25519
    peer_id = ed25519_peer_id_bytes(peer_key.public_key)
    canonical = binding_bytes(NETUID, keypair.public_key, peer_id, EXPIRES_AT)

    messages = [("empty", b""), ("hello", b"hello, iota"), ("long", bytes(range(256)) * 4)]
    signed = []
    for name, message in messages + [("binding", canonical)]:
        signature = keypair.sign(message)
        assert keypair.verify(message, signature), name
        signed.append({"name": name, "message_hex": message.hex(), "signature_hex": signature.hex()})

    fixture = {
        "generator": f"bittensor-wallet {bittensor_wallet.__version__}",
        "wallet": WALLET,
        "hotkey": HOTKEY,
        "ss58": keypair.ss58_address,
        "public_key_hex": keypair.public_key.hex(),
        "binding": {
            "netuid": NETUID,
            "peer_id": b58encode(peer_id),
            "expires_at": EXPIRES_AT,
            "canonical_hex": canonical.hex(),
        },
        "messages": signed,
    }
    with open(os.path.join(OUT, "signatures.json"), "w") as f:
        json.dump(fixture, f, indent=2)
        f.write("\n")

    today = datetime.date.today().isoformat()
    with open(os.path.join(OUT, "PROVENANCE.md"), "w") as f:
        f.write(
            f"""# Provenance

Made by `scripts/wallet_fixtures.py` with bittensor-wallet {bittensor_wallet.__version__}
(Python {sys.version.split()[0]}) on {today}.

* `wallets/{WALLET}/hotkeys/{HOTKEY}`: written by
  `Wallet.set_hotkey(encrypt=False)` for the key of the fixed phrase
  `{FIXED_PHRASE}` (BIP39 test vector; no value behind it). Deterministic.
* `signatures.json`: sr25519 signatures by that key (`Keypair.sign`) of a few messages and of
  the canonical hotkey-binding bytes for netuid {NETUID}, the Ed25519 peer of secret
  `0x2a * 32` and expiry {EXPIRES_AT}, computed independently in Python. sr25519 signing is
  randomised: a rerun gives different signatures, all valid.

Regenerate (from the repository root, after `scripts/setup.sh`):

```sh
.venv/bin/python scripts/wallet_fixtures.py
```
"""
        )
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
