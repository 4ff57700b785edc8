#!/usr/bin/env python3
"""Checks, with bittensor-wallet, a hotkey file and signatures that the Rust side wrote.

Usage: .venv/bin/python scripts/wallet_verify.py DIR

DIR holds `wallets/<wallet>/hotkeys/<hotkey>` (and maybe `<hotkey>pub.txt`, checked if there), and `signatures.json`:
{"wallet": …, "hotkey": …, "ss58": …, "messages": [{"message_hex": …, "signature_hex": …}]}.
Loads the hotkey the way btcli does (Wallet(...).hotkey), checks its address, and verifies every
signature with bittensor-wallet's sr25519 (and that a corrupted one fails).
Exit code: 0 all good, 1 a check failed, 2 bad usage or input.
"""
import json
import os
import sys

from bittensor_wallet import Keypair, Wallet


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1]
    try:
        with open(os.path.join(root, "signatures.json")) as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:
        print(f"wallet_verify: cannot read signatures.json: {e}", file=sys.stderr)
        return 2
    wallet = Wallet(name=spec["wallet"], hotkey=spec["hotkey"], path=os.path.join(root, "wallets"))
    failures = []
    hotkey = wallet.hotkey  # raises if the file is unreadable or encrypted without a password
    if hotkey.ss58_address != spec["ss58"]:
        failures.append(f"hotkey file gives {hotkey.ss58_address}, Rust says {spec['ss58']}")
    with open(wallet.hotkey_file.path) as f:
        stored = json.load(f)
    if stored.get("ss58Address") != hotkey.ss58_address:
        failures.append("ss58Address field disagrees with the key bittensor-wallet derives")
    if stored.get("publicKey") != "0x" + hotkey.public_key.hex():
        failures.append("publicKey field disagrees with the key bittensor-wallet derives")
    if os.path.exists(wallet.hotkeypub_file.path):
        pub = wallet.hotkeypub
        if pub.ss58_address != spec["ss58"]:
            failures.append(f"hotkeypub file gives {pub.ss58_address}")
    # Verify as a third party would: from the address alone.
    verifier = Keypair(ss58_address=spec["ss58"])
    for i, item in enumerate(spec["messages"]):
        message = bytes.fromhex(item["message_hex"])
        signature = bytes.fromhex(item["signature_hex"])
        if not verifier.verify(message, signature):
            failures.append(f"signature {i} does not verify")
        corrupt = bytearray(signature)
        corrupt[0] ^= 1
        if verifier.verify(message, bytes(corrupt)):
            failures.append(f"corrupted signature {i} verifies")
    for failure in failures:
        print(f"wallet_verify: {failure}", file=sys.stderr)
    if not failures:
        print(f"wallet_verify: {len(spec['messages'])} signatures by {spec['ss58']} verify")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
