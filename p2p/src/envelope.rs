//! The signed envelope every gossip payload travels in.
//!
//! gossipsub signs messages itself, but that signature is checked inside libp2p and its
//! failures are invisible to us. Wrapping each payload in our own [`Envelope`] makes tampering
//! detectable and countable at this layer, and binds the payload to its topic.
//!
//! Wire format (version 1), all integers big-endian:
//! `0x01 | u16 key_len | key (protobuf libp2p public key) | u16 sig_len | signature | payload`
//! where the payload runs to the end. The signature covers
//! `"iota-gossip-v1" || u32 topic_len || topic || payload`; the topic length makes the split
//! between topic and payload unambiguous. Guarantees: decoding never panics and never
//! allocates more than the input; inputs over [`MAX_ENVELOPE_BYTES`] are refused before
//! parsing; [`Envelope::open`] accepts only an envelope whose signature verifies under its key
//! and whose key belongs to the claimed author.

use libp2p::{
    identity::{Keypair, PublicKey, SigningError},
    PeerId,
};

use crate::metrics::RejectReason;

/// Domain-separation tag prepended to the signed bytes.
pub const DOMAIN: &[u8] = b"iota-gossip-v1";

/// Largest encoded envelope; leaves room under gossipsub's 64 KiB transmit limit for its own
/// framing (topic, sequence number, its signature and key).
pub const MAX_ENVELOPE_BYTES: usize = 63 * 1024;

const VERSION: u8 = 1;

/// A payload with its author's public key and signature.
///
/// Built only by [`Envelope::seal`] or [`Envelope::decode`], so every field fits its `u16` or
/// size limit and [`Envelope::encode`] is exact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    payload: Vec<u8>,
    public_key: Vec<u8>,
    signature: Vec<u8>,
}

/// Why [`Envelope::seal`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The encoded envelope would exceed [`MAX_ENVELOPE_BYTES`].
    #[error("envelope of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Encoded size it would have had.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The keypair could not sign.
    #[error("signing failed")]
    Signing(#[source] SigningError),
}

/// Why [`Envelope::decode`] failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input is larger than [`MAX_ENVELOPE_BYTES`].
    #[error("envelope of {0} bytes exceeds the maximum")]
    TooLarge(usize),
    /// The input ends before a field it announces.
    #[error("envelope truncated")]
    Truncated,
    /// The version byte is not one this code understands.
    #[error("unknown envelope version {0}")]
    UnknownVersion(u8),
}

/// Why [`Envelope::open`] refused an envelope.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The bytes are not an envelope.
    #[error("malformed envelope")]
    Malformed(#[source] DecodeError),
    /// The public key field does not decode as a libp2p public key.
    #[error("undecodable public key")]
    BadPublicKey,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// Validly signed, but not by the peer gossipsub names as the source.
    #[error("envelope signed by {signer}, not by the message source")]
    AuthorMismatch {
        /// Peer id of the envelope's key.
        signer: PeerId,
    },
}

impl OpenError {
    /// The metric reason this failure is counted under.
    pub fn reason(&self) -> RejectReason {
        match self {
            OpenError::Malformed(_) | OpenError::BadPublicKey => RejectReason::Malformed,
            OpenError::BadSignature => RejectReason::BadSignature,
            OpenError::AuthorMismatch { .. } => RejectReason::AuthorMismatch,
        }
    }
}

/// A verified envelope's author and payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    /// Peer id of the key that signed.
    pub author: PeerId,
    /// The payload.
    pub payload: Vec<u8>,
}

fn signed_bytes(topic: &str, payload: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(DOMAIN.len() + 4 + topic.len() + payload.len());
    msg.extend_from_slice(DOMAIN);
    // Topics are short; a topic over 4 GiB cannot reach here through gossipsub.
    msg.extend_from_slice(&u32::try_from(topic.len()).unwrap_or(u32::MAX).to_be_bytes());
    msg.extend_from_slice(topic.as_bytes());
    msg.extend_from_slice(payload);
    msg
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], DecodeError> {
    if input.len() < n {
        return Err(DecodeError::Truncated);
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

fn take_u16(input: &mut &[u8]) -> Result<usize, DecodeError> {
    let b = take(input, 2)?;
    Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
}

impl Envelope {
    /// Signs `payload` for `topic` with `keypair`.
    pub fn seal(keypair: &Keypair, topic: &str, payload: Vec<u8>) -> Result<Self, SealError> {
        let too_large = |len| SealError::TooLarge {
            len,
            max: MAX_ENVELOPE_BYTES,
        };
        // Cheap refusal before hashing a large payload.
        if payload.len() > MAX_ENVELOPE_BYTES {
            return Err(too_large(payload.len()));
        }
        let signature = keypair
            .sign(&signed_bytes(topic, &payload))
            .map_err(SealError::Signing)?;
        let envelope = Self {
            payload,
            public_key: keypair.public().encode_protobuf(),
            signature,
        };
        match envelope.encoded_len() {
            len if len > MAX_ENVELOPE_BYTES => Err(too_large(len)),
            _ => Ok(envelope),
        }
    }

    /// The application bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Protobuf encoding of the author's libp2p public key.
    pub fn public_key(&self) -> &[u8] {
        &self.public_key
    }

    /// Signature by that key over the domain tag, the topic and the payload.
    pub fn signature(&self) -> &[u8] {
        &self.signature
    }

    fn encoded_len(&self) -> usize {
        1 + 2 + self.public_key.len() + 2 + self.signature.len() + self.payload.len()
    }

    /// Binary encoding (see the module documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(VERSION);
        for field in [&self.public_key, &self.signature] {
            // Both fields come from `seal` (a libp2p key and its signature, far below 64 KiB
            // as the total is bounded by MAX_ENVELOPE_BYTES) or `decode` (read as u16).
            let len = u16::try_from(field.len()).expect("envelope fields are bounded by u16");
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(field);
        }
        out.extend_from_slice(&self.payload);
        out
    }

    /// Parses the binary encoding; does not verify anything.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() > MAX_ENVELOPE_BYTES {
            return Err(DecodeError::TooLarge(bytes.len()));
        }
        let mut input = bytes;
        let version = take(&mut input, 1)?[0];
        if version != VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let key_len = take_u16(&mut input)?;
        let public_key = take(&mut input, key_len)?.to_vec();
        let sig_len = take_u16(&mut input)?;
        let signature = take(&mut input, sig_len)?.to_vec();
        Ok(Self {
            payload: input.to_vec(),
            public_key,
            signature,
        })
    }

    /// Decodes `bytes` received on `topic` from gossipsub source `source` and verifies them.
    pub fn open(bytes: &[u8], topic: &str, source: Option<PeerId>) -> Result<Opened, OpenError> {
        let envelope = Self::decode(bytes).map_err(OpenError::Malformed)?;
        let key = PublicKey::try_decode_protobuf(&envelope.public_key)
            .map_err(|_| OpenError::BadPublicKey)?;
        if !key.verify(&signed_bytes(topic, &envelope.payload), &envelope.signature) {
            return Err(OpenError::BadSignature);
        }
        let signer = key.to_peer_id();
        if source != Some(signer) {
            return Err(OpenError::AuthorMismatch { signer });
        }
        Ok(Opened {
            author: signer,
            payload: envelope.payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(kp: &Keypair, topic: &str, payload: &[u8]) -> Vec<u8> {
        Envelope::seal(kp, topic, payload.to_vec())
            .unwrap()
            .encode()
    }

    #[test]
    fn sealed_envelope_opens_for_its_author() {
        let kp = Keypair::generate_ed25519();
        let bytes = sealed(&kp, "plans", b"hello");
        let opened = Envelope::open(&bytes, "plans", Some(kp.public().to_peer_id())).unwrap();
        assert_eq!(opened.author, kp.public().to_peer_id());
        assert_eq!(opened.payload, b"hello");
        assert_eq!(Envelope::decode(&bytes).unwrap().encode(), bytes);
    }

    #[test]
    fn flipped_payload_bit_is_a_bad_signature() {
        let kp = Keypair::generate_ed25519();
        let mut bytes = sealed(&kp, "plans", b"hello");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let err = Envelope::open(&bytes, "plans", Some(kp.public().to_peer_id())).unwrap_err();
        assert_eq!(err.reason(), RejectReason::BadSignature);
    }

    #[test]
    fn envelope_replayed_on_another_topic_is_a_bad_signature() {
        let kp = Keypair::generate_ed25519();
        let bytes = sealed(&kp, "ab", b"c");
        let err = Envelope::open(&bytes, "a", Some(kp.public().to_peer_id())).unwrap_err();
        assert_eq!(err.reason(), RejectReason::BadSignature);
    }

    #[test]
    fn envelope_signed_by_someone_else_is_an_author_mismatch() {
        let author = Keypair::generate_ed25519();
        let relay = Keypair::generate_ed25519();
        let bytes = sealed(&author, "t", b"x");
        let err = Envelope::open(&bytes, "t", Some(relay.public().to_peer_id())).unwrap_err();
        assert_eq!(err.reason(), RejectReason::AuthorMismatch);
        let err = Envelope::open(&bytes, "t", None).unwrap_err();
        assert_eq!(err.reason(), RejectReason::AuthorMismatch);
    }

    #[test]
    fn every_truncation_and_garbage_is_malformed_not_a_panic() {
        let kp = Keypair::generate_ed25519();
        let peer = Some(kp.public().to_peer_id());
        let bytes = sealed(&kp, "t", b"payload");
        let header = 1 + 2 + kp.public().encode_protobuf().len() + 2 + 64;
        for cut in 0..header {
            let err = Envelope::open(&bytes[..cut], "t", peer).unwrap_err();
            assert_eq!(err.reason(), RejectReason::Malformed, "cut at {cut}");
        }
        // Cutting into the payload keeps the structure but breaks the signature.
        let err = Envelope::open(&bytes[..header + 2], "t", peer).unwrap_err();
        assert_eq!(err.reason(), RejectReason::BadSignature);

        let mut wrong_version = bytes.clone();
        wrong_version[0] = 2;
        assert!(matches!(
            Envelope::open(&wrong_version, "t", peer),
            Err(OpenError::Malformed(DecodeError::UnknownVersion(2)))
        ));
        let mut bad_key = bytes.clone();
        bad_key[3] ^= 0xff;
        assert_eq!(
            Envelope::open(&bad_key, "t", peer).unwrap_err().reason(),
            RejectReason::Malformed
        );
        let raw = b"not an envelope at all".to_vec();
        assert_eq!(
            Envelope::open(&raw, "t", peer).unwrap_err().reason(),
            RejectReason::Malformed
        );
    }

    #[test]
    fn size_limits_hold_on_both_sides() {
        let kp = Keypair::generate_ed25519();
        assert!(matches!(
            Envelope::seal(&kp, "t", vec![0; MAX_ENVELOPE_BYTES]),
            Err(SealError::TooLarge { .. })
        ));
        let fits = Envelope::seal(&kp, "t", vec![0; MAX_ENVELOPE_BYTES - 300]).unwrap();
        assert!(fits.encode().len() <= MAX_ENVELOPE_BYTES);
        assert_eq!(
            Envelope::decode(&vec![1; MAX_ENVELOPE_BYTES + 1]),
            Err(DecodeError::TooLarge(MAX_ENVELOPE_BYTES + 1))
        );
    }
}
