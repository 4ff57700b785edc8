//! Hop receipts: the proof that a sample travelled the pathway its loss record names.
//!
//! Sample ids are public (`sample_id(plan.seed, head, counter)`), so a loss record alone
//! proves nothing: a tail could publish records for the whole epoch the moment the plan is
//! out and take the credit of the tails that really serve the samples. Instead, every hop
//! signs a [`HopReceipt`] with its libp2p identity key (Ed25519) over
//!
//! ```text
//! DOMAIN ++ run (u64 BE) ++ epoch (u64 BE) ++ sample (u64 BE) ++ stage (u32 BE)
//!        ++ next (u16 BE length ++ the next hop's peer id text; empty at the tail)
//!        ++ blake3(frame received) ++ blake3(frame sent)
//! ```
//!
//! The head received no frame ([`head_input`]); a middle stage's frames are the activation
//! it received and the one it sent; the tail's are the activation it received and the
//! gradient it sent back. The chain travels forward in the request header; each hop checks
//! the chain it receives before serving (signers are the pathway's peers, each link's `sent`
//! is the next `received`, the last receipt names this hop and hashes the frame that came),
//! and the tail puts the whole chain, its own receipt last, in its loss record. Routers and
//! validators check the record's chain the same way ([`verify_chain`]).
//!
//! Guarantees: a record passes only if each peer of its pathway signed that very (run,
//! epoch, sample, stage) and named the next one, so a tail cannot claim a sample that did
//! not reach it (it cannot sign for the other hops) nor reuse another tail's chain (the last
//! middle hop named that tail). The verifier needs no key lookup: an Ed25519 peer id embeds
//! its public key. Only Ed25519 identities (what nodes generate) can sign receipts: a miner
//! with another key type cannot send samples on, so no honest tail ever holds a chain that
//! does not verify.
//!
//! What it does not stop: a hop that signs two receipts for one sample, naming two next
//! hops (it did its work; it can share the credit of the stage after it with an accomplice).

use bootstrap::PeerIdStr;
use serde::{Deserialize, Serialize};

/// Domain separation of the signed bytes.
pub(crate) const DOMAIN: &[u8] = b"iota-p2p/hop-receipt/v1\0";

/// A blake3 digest.
pub(crate) type Digest = [u8; 32];

/// Bytes of an Ed25519 signature.
pub(crate) const SIGNATURE_LEN: usize = 64;

/// Multihash code of an identity hash (a peer id that embeds its public key).
const IDENTITY_MULTIHASH: u64 = 0x00;

/// blake3 of a frame.
pub(crate) fn digest(frame: &[u8]) -> Digest {
    *blake3::hash(frame).as_bytes()
}

/// What the head "received": no frame (its input is the sample id).
pub(crate) fn head_input() -> Digest {
    digest(&[])
}

/// One hop's signed statement of what it received and what it sent on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HopReceipt {
    /// blake3 of the frame the hop received (hex on the wire).
    #[serde(with = "hex_bytes")]
    pub(crate) received: Digest,
    /// blake3 of the frame the hop sent (hex on the wire).
    #[serde(with = "hex_bytes")]
    pub(crate) sent: Digest,
    /// The hop's Ed25519 signature of [`signed_bytes`] (hex on the wire).
    #[serde(with = "hex_bytes")]
    pub(crate) signature: [u8; SIGNATURE_LEN],
}

/// Where a receipt sits: the sample, and the hop's stage and next peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hop<'a> {
    /// The run's id ([`crate::run_spec::run_id`]).
    pub(crate) run: u64,
    /// The sample's epoch.
    pub(crate) epoch: u64,
    /// The sample.
    pub(crate) sample: u64,
    /// The hop's stage.
    pub(crate) stage: u32,
    /// The peer the hop sent its frame to; `None` for the tail.
    pub(crate) next: Option<&'a str>,
}

/// The bytes a hop signs.
pub(crate) fn signed_bytes(hop: &Hop<'_>, received: &Digest, sent: &Digest) -> Vec<u8> {
    let next = hop.next.unwrap_or_default().as_bytes();
    let next_len = u16::try_from(next.len()).unwrap_or(u16::MAX);
    let mut bytes = Vec::with_capacity(DOMAIN.len() + 30 + next.len() + 64);
    bytes.extend_from_slice(DOMAIN);
    bytes.extend_from_slice(&hop.run.to_be_bytes());
    bytes.extend_from_slice(&hop.epoch.to_be_bytes());
    bytes.extend_from_slice(&hop.sample.to_be_bytes());
    bytes.extend_from_slice(&hop.stage.to_be_bytes());
    bytes.extend_from_slice(&next_len.to_be_bytes());
    bytes.extend_from_slice(&next[..usize::from(next_len)]);
    bytes.extend_from_slice(received);
    bytes.extend_from_slice(sent);
    bytes
}

/// Why this node could not sign a receipt.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SignError {
    /// The key refused to sign.
    #[error("the identity key cannot sign: {0}")]
    Key(String),
    /// The key is not an Ed25519 key (its signatures are not 64 bytes).
    #[error("the identity key is not an Ed25519 key")]
    NotEd25519,
}

/// Signs `hop`'s receipt with this node's identity key.
pub(crate) fn sign(
    key: &p2p::identity::Keypair,
    hop: &Hop<'_>,
    received: Digest,
    sent: Digest,
) -> Result<HopReceipt, SignError> {
    let signature = key
        .sign(&signed_bytes(hop, &received, &sent))
        .map_err(|error| SignError::Key(error.to_string()))?;
    let signature: [u8; SIGNATURE_LEN] = signature.try_into().map_err(|_| SignError::NotEd25519)?;
    Ok(HopReceipt {
        received,
        sent,
        signature,
    })
}

/// The sample a chain is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample<'a> {
    /// The run's id.
    pub(crate) run: u64,
    /// Its epoch.
    pub(crate) epoch: u64,
    /// The sample id.
    pub(crate) sample: u64,
    /// The pathway so far (the whole one in a loss record), one peer per stage.
    pub(crate) pathway: &'a [String],
}

/// Why a chain of receipts does not prove its pathway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChainError {
    /// Not one receipt per hop of the pathway (none at all, or a chain cut short).
    #[error("{got} receipts for a pathway of {expected} hops")]
    Missing {
        /// Hops of the pathway.
        expected: usize,
        /// Receipts carried.
        got: usize,
    },
    /// The hop's peer id does not embed an Ed25519 key.
    #[error("the peer of stage {stage} has no key to check")]
    UnknownKey {
        /// The hop's stage.
        stage: usize,
    },
    /// The signature is not the hop's over this sample, stage and next peer.
    #[error("the receipt of stage {stage} is not signed by its peer for this sample")]
    BadSignature {
        /// The hop's stage.
        stage: usize,
    },
    /// A hop's `received` is not the `sent` of the hop before it (or, at the head, not
    /// [`head_input`]).
    #[error("the receipt of stage {stage} does not follow the one before it")]
    Broken {
        /// The hop's stage.
        stage: usize,
    },
}

/// Checks that `receipts` prove `sample`'s pathway: one receipt per hop, each signed by that
/// hop's peer for this run, epoch, sample and stage, naming the pathway's next peer (and
/// `last_next` after the last hop: the receiving hop, or `None` for a complete chain whose
/// last hop is the tail), each `received` the `sent` of the hop before. Counts are checked
/// before any signature, and the first failure stops the check.
pub(crate) fn verify_chain(
    sample: &Sample<'_>,
    receipts: &[HopReceipt],
    last_next: Option<&str>,
) -> Result<(), ChainError> {
    if receipts.len() != sample.pathway.len() || receipts.is_empty() {
        return Err(ChainError::Missing {
            expected: sample.pathway.len(),
            got: receipts.len(),
        });
    }
    let mut previous = head_input();
    for (stage, (receipt, peer)) in receipts.iter().zip(sample.pathway).enumerate() {
        if receipt.received != previous {
            return Err(ChainError::Broken { stage });
        }
        let key = public_key(peer).ok_or(ChainError::UnknownKey { stage })?;
        let hop = Hop {
            run: sample.run,
            epoch: sample.epoch,
            sample: sample.sample,
            stage: u32::try_from(stage).map_err(|_| ChainError::BadSignature { stage })?,
            next: match sample.pathway.get(stage + 1) {
                Some(next) => Some(next.as_str()),
                None => last_next,
            },
        };
        if !key.verify(
            &signed_bytes(&hop, &receipt.received, &receipt.sent),
            &receipt.signature,
        ) {
            return Err(ChainError::BadSignature { stage });
        }
        previous = receipt.sent;
    }
    Ok(())
}

/// The Ed25519 public key a peer id embeds.
fn public_key(peer: &str) -> Option<p2p::identity::PublicKey> {
    let id = crate::wire::peer::to_libp2p(&PeerIdStr::parse(peer).ok()?)?;
    let multihash = id.as_ref();
    if multihash.code() != IDENTITY_MULTIHASH {
        return None;
    }
    let key = p2p::identity::PublicKey::try_decode_protobuf(multihash.digest()).ok()?;
    key.clone().try_into_ed25519().ok()?;
    Some(key)
}

/// Fixed-size byte arrays as hex strings, refused unless exactly that long.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer, const N: usize>(
        bytes: &[u8; N],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex::encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        deserializer: D,
    ) -> Result<[u8; N], D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        if text.len() != 2 * N {
            return Err(serde::de::Error::invalid_length(
                text.len(),
                &"a hex string of the exact length",
            ));
        }
        let mut bytes = [0u8; N];
        hex::decode_to_slice(text.as_bytes(), &mut bytes).map_err(serde::de::Error::custom)?;
        Ok(bytes)
    }
}

/// Signing whole chains in tests.
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;

    /// The key of test peer `i` (its id is [`peer`]).
    pub(crate) fn key(i: u8) -> p2p::identity::Keypair {
        p2p::identity::Keypair::ed25519_from_bytes([i; 32]).expect("32 bytes make a key")
    }

    /// Test peer `i`'s id.
    pub(crate) fn peer(i: u8) -> PeerIdStr {
        crate::wire::peer::of(&key(i).public().to_peer_id())
    }

    /// The frame hop `stage` of `sample` sends in the fixtures.
    pub(crate) fn frame(sample: u64, stage: usize) -> Vec<u8> {
        format!("frame {sample} {stage}").into_bytes()
    }

    /// The receipts of `sample`'s first `keys.len()` hops, each signed by its key in
    /// `keys` (the pathway's peers, for a valid chain), the last naming `last_next`.
    pub(crate) fn chain(
        sample: &Sample<'_>,
        keys: &[p2p::identity::Keypair],
        last_next: Option<&str>,
    ) -> Vec<HopReceipt> {
        let mut received = head_input();
        keys.iter()
            .enumerate()
            .map(|(stage, key)| {
                let hop = Hop {
                    run: sample.run,
                    epoch: sample.epoch,
                    sample: sample.sample,
                    stage: stage as u32,
                    next: match sample.pathway.get(stage + 1) {
                        Some(next) => Some(next.as_str()),
                        None => last_next,
                    },
                };
                let sent = digest(&frame(sample.sample, stage));
                let receipt = sign(key, &hop, received, sent).expect("an ed25519 key signs");
                received = sent;
                receipt
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::{chain, key, peer};
    use super::*;

    fn pathway() -> Vec<String> {
        vec![peer(1).into(), peer(2).into(), peer(3).into()]
    }

    fn sample(pathway: &[String]) -> Sample<'_> {
        Sample {
            run: 7,
            epoch: 3,
            sample: 42,
            pathway,
        }
    }

    #[test]
    fn a_chain_signed_by_its_pathway_verifies_and_round_trips() {
        let pathway = pathway();
        let receipts = chain(&sample(&pathway), &[key(1), key(2), key(3)], None);
        assert_eq!(verify_chain(&sample(&pathway), &receipts, None), Ok(()));
        let json = serde_json::to_string(&receipts).unwrap();
        let back: Vec<HopReceipt> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, receipts);
        // A hop on its way: the first two receipts, the last naming the receiver.
        let partial = chain(&sample(&pathway[..2]), &[key(1), key(2)], Some(&pathway[2]));
        assert_eq!(
            verify_chain(&sample(&pathway[..2]), &partial, Some(&pathway[2])),
            Ok(())
        );
        assert!(verify_chain(&sample(&pathway[..2]), &partial, Some(peer(9).as_str())).is_err());
    }

    #[test]
    fn forged_cut_or_foreign_chains_are_refused() {
        let pathway = pathway();
        let s = sample(&pathway);
        let good = chain(&s, &[key(1), key(2), key(3)], None);
        assert_eq!(
            verify_chain(&s, &[], None),
            Err(ChainError::Missing {
                expected: 3,
                got: 0
            })
        );
        assert!(matches!(
            verify_chain(&s, &good[..2], None),
            Err(ChainError::Missing { .. })
        ));
        // The tail signs every hop itself: the best it can do without the others' keys.
        let own = chain(&s, &[key(3), key(3), key(3)], None);
        assert_eq!(
            verify_chain(&s, &own, None),
            Err(ChainError::BadSignature { stage: 0 })
        );
        // Another sample's, epoch's or run's chain.
        for other in [
            Sample { sample: 43, ..s },
            Sample { epoch: 4, ..s },
            Sample { run: 8, ..s },
        ] {
            assert_eq!(
                verify_chain(&other, &good, None),
                Err(ChainError::BadSignature { stage: 0 })
            );
        }
        // Another tail taking this chain: the middle named the real tail.
        let mut copycat = pathway.clone();
        copycat[2] = peer(4).into();
        let mut stolen = good.clone();
        stolen[2] = chain(&sample(&copycat), &[key(1), key(2), key(4)], None)[2].clone();
        assert_eq!(
            verify_chain(&sample(&copycat), &stolen, None),
            Err(ChainError::BadSignature { stage: 1 })
        );
        // A link that does not follow.
        let mut broken = good.clone();
        broken[1].received[0] ^= 1;
        assert_eq!(
            verify_chain(&s, &broken, None),
            Err(ChainError::Broken { stage: 1 })
        );
        // A peer id without an embedded key.
        let mut unkeyed = pathway.clone();
        unkeyed[0] = "not a peer".into();
        assert_eq!(
            verify_chain(&sample(&unkeyed), &good, None),
            Err(ChainError::UnknownKey { stage: 0 })
        );
    }

    #[test]
    fn hex_fields_of_the_wrong_length_or_alphabet_are_refused() {
        let receipt = &chain(&sample(&pathway()[..1]), &[key(1)], Some("x"))[0];
        let json = serde_json::to_value(receipt).unwrap();
        for (field, bad) in [
            ("received", "00"),
            ("sent", &"zz".repeat(32)),
            ("signature", &"00".repeat(65)),
        ] {
            let mut forged = json.clone();
            forged[field] = serde_json::Value::String(bad.to_string());
            assert!(
                serde_json::from_value::<HopReceipt>(forged).is_err(),
                "{field}"
            );
        }
    }
}
