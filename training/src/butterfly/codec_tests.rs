//! Round trips and malformed-input tests of the binary and JSON codecs.

use proptest::prelude::*;

use super::*;
use crate::butterfly::message::MAX_GOSSIP_JSON_BYTES;
use crate::butterfly::plan::MAX_MEMBER_ID_BYTES;

fn h(i: u8) -> Hash {
    Hash([i; 32])
}

fn samples() -> Vec<Gossip> {
    vec![
        Gossip::Commitment(Commitment {
            epoch: 9,
            stage: 2,
            member: "12D3KooWabc".into(),
            samples: 1234,
            partition_hashes: vec![h(1), h(2), h(3)],
        }),
        Gossip::SliceHash(SliceHash {
            epoch: 9,
            stage: 2,
            partition: 5,
            round: 1,
            holder: "holder".into(),
            included: vec!["a".into(), "b".into()],
            input_hashes: vec![h(4), h(5)],
            result: h(6),
        }),
        Gossip::Misbehaviour(Misbehaviour {
            epoch: 9,
            stage: 2,
            reporter: "r".into(),
            accused: "x".into(),
            kind: MisbehaviourKind::WrongAverage,
            evidence: Evidence::WrongAverage {
                partition: 1,
                round: 0,
                claimed: h(7),
                recomputed: h(8),
            },
        }),
        Gossip::Misbehaviour(Misbehaviour {
            epoch: 9,
            stage: 2,
            reporter: "r".into(),
            accused: "x".into(),
            kind: MisbehaviourKind::Equivocation,
            evidence: Evidence::ServedMismatch {
                partition: 1,
                committed: h(7),
                served: h(8),
            },
        }),
        Gossip::Misbehaviour(Misbehaviour {
            epoch: 1,
            stage: 0,
            reporter: "r".into(),
            accused: "x".into(),
            kind: MisbehaviourKind::Equivocation,
            evidence: Evidence::ConflictingCommitments {
                first: h(1),
                second: h(2),
            },
        }),
        Gossip::Misbehaviour(Misbehaviour {
            epoch: 1,
            stage: 0,
            reporter: "r".into(),
            accused: "x".into(),
            kind: MisbehaviourKind::Equivocation,
            evidence: Evidence::ConflictingSlices {
                partition: 3,
                round: 2,
                first: h(1),
                second: h(2),
            },
        }),
    ]
}

#[test]
fn gossip_round_trips_in_binary_and_json() {
    for message in samples() {
        let bytes = message.encode();
        assert_eq!(bytes.len(), message.encoded_len());
        assert_eq!(Gossip::decode(&bytes), Ok(message.clone()));
        assert_eq!(Gossip::from_json(&message.to_json()), Ok(message));
    }
}

#[test]
fn requests_and_responses_round_trip() {
    let requests = [
        Request::Input {
            epoch: 1,
            stage: 2,
            partition: 3,
        },
        Request::Averaged {
            epoch: 1,
            stage: 2,
            partition: 3,
            result: h(9),
        },
    ];
    for request in requests {
        let bytes = request.encode();
        assert_eq!(bytes.len(), request.encoded_len());
        assert!(bytes.len() <= MAX_REQUEST_BYTES);
        assert_eq!(Request::decode(&bytes), Ok(request));
    }
    let responses = [
        Response::Values(vec![1.5, -0.0, f32::NAN, f32::INFINITY]),
        Response::Values(vec![]),
        Response::Unavailable(Unavailable::WrongMerge),
        Response::Unavailable(Unavailable::NoSuchPartition),
        Response::Unavailable(Unavailable::NotHolder),
        Response::Unavailable(Unavailable::UnknownResult),
    ];
    for response in responses {
        let bytes = response.encode();
        assert_eq!(bytes.len(), response.encoded_len());
        let back = Response::decode(&bytes).unwrap();
        // Compare bit patterns so NaN round trips count.
        match (&response, &back) {
            (Response::Values(a), Response::Values(b)) => assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            ),
            _ => assert_eq!(back, response),
        }
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    for message in samples() {
        let bytes = message.encode();
        for cut in 0..bytes.len() {
            assert!(
                Gossip::decode(&bytes[..cut]).is_err(),
                "prefix {cut} decoded"
            );
        }
    }
    let bytes = Response::Values(vec![1.0; 10]).encode();
    for cut in 0..bytes.len() {
        assert!(Response::decode(&bytes[..cut]).is_err());
    }
}

#[test]
fn trailing_bytes_version_and_tags_are_rejected() {
    let mut bytes = samples()[0].encode();
    bytes.push(0);
    assert_eq!(Gossip::decode(&bytes), Err(DecodeError::TrailingBytes(1)));
    let mut bytes = samples()[0].encode();
    bytes[0] = 7;
    assert_eq!(Gossip::decode(&bytes), Err(DecodeError::UnknownVersion(7)));
    bytes[0] = WIRE_VERSION;
    bytes[1] = 99;
    assert_eq!(
        Gossip::decode(&bytes),
        Err(DecodeError::UnknownTag {
            what: "gossip",
            tag: 99
        })
    );
    assert!(matches!(
        Request::decode(&[WIRE_VERSION, 5]),
        Err(DecodeError::UnknownTag { .. })
    ));
}

#[test]
fn claimed_counts_beyond_the_input_are_refused_before_allocating() {
    // A values response claiming 64 Mi floats but carrying 8 bytes.
    let mut bytes = vec![WIRE_VERSION, 1];
    bytes.extend_from_slice(&(MAX_PARTITION_VALUES as u32).to_le_bytes());
    bytes.extend_from_slice(&[0; 8]);
    assert_eq!(Response::decode(&bytes), Err(DecodeError::Truncated));
    // Over the limit outright.
    let mut bytes = vec![WIRE_VERSION, 1];
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        Response::decode(&bytes),
        Err(DecodeError::TooMany { what: "values", .. })
    ));
    // A commitment claiming too many hashes.
    let mut c = samples()[0].encode();
    let at = 2 + 8 + 4 + 2 + "12D3KooWabc".len() + 8;
    c[at..at + 4].copy_from_slice(&(MAX_PARTITIONS as u32 + 1).to_le_bytes());
    assert!(matches!(
        Gossip::decode(&c),
        Err(DecodeError::TooMany {
            what: "partition hashes",
            ..
        })
    ));
}

#[test]
fn the_largest_valid_messages_fit_the_limits() {
    let long_id = |i: usize| format!("{i:0>width$}", width = MAX_MEMBER_ID_BYTES);
    let commitment = Gossip::Commitment(Commitment {
        epoch: u64::MAX,
        stage: u32::MAX,
        member: long_id(0),
        samples: u64::MAX,
        partition_hashes: vec![h(1); MAX_PARTITIONS],
    });
    let claim = Gossip::SliceHash(SliceHash {
        epoch: u64::MAX,
        stage: u32::MAX,
        partition: u32::MAX,
        round: u32::MAX,
        holder: long_id(0),
        included: (0..MAX_MEMBERS).map(long_id).collect(),
        input_hashes: vec![h(2); MAX_MEMBERS],
        result: h(3),
    });
    for message in [commitment, claim] {
        let bytes = message.encode();
        assert!(bytes.len() <= MAX_GOSSIP_BYTES, "{} bytes", bytes.len());
        assert_eq!(Gossip::decode(&bytes), Ok(message.clone()));
        let json = message.to_json();
        assert!(
            json.len() <= MAX_GOSSIP_JSON_BYTES,
            "{} JSON bytes",
            json.len()
        );
        assert_eq!(Gossip::from_json(&json), Ok(message));
    }
}

#[test]
fn oversized_inputs_are_refused() {
    let big = vec![0u8; MAX_GOSSIP_BYTES + 1];
    assert!(matches!(
        Gossip::decode(&big),
        Err(DecodeError::TooLarge { .. })
    ));
    let big_json = vec![b' '; MAX_GOSSIP_JSON_BYTES + 1];
    assert!(matches!(
        Gossip::from_json(&big_json),
        Err(DecodeError::TooLarge { .. })
    ));
    assert!(matches!(
        Request::decode(&[0u8; MAX_REQUEST_BYTES + 1]),
        Err(DecodeError::TooLarge { .. })
    ));
}

#[test]
fn bad_member_ids_are_refused_in_both_forms() {
    let mut message = samples()[0].clone();
    if let Gossip::Commitment(c) = &mut message {
        c.member = String::new();
    }
    assert_eq!(
        Gossip::decode(&message.encode()),
        Err(DecodeError::BadMemberId { len: 0 })
    );
    assert_eq!(
        Gossip::from_json(&message.to_json()),
        Err(DecodeError::BadMemberId { len: 0 })
    );
    // Invalid UTF-8 in an id.
    let mut bytes = samples()[0].encode();
    let at = 2 + 8 + 4 + 2;
    bytes[at] = 0xff;
    assert_eq!(Gossip::decode(&bytes), Err(DecodeError::InvalidUtf8));
    assert!(matches!(
        Gossip::from_json(b"{\"type\":\"nope\"}"),
        Err(DecodeError::Json(_))
    ));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Gossip::decode(&bytes);
        let _ = Request::decode(&bytes);
        let _ = Response::decode(&bytes);
        let _ = Gossip::from_json(&bytes);
    }

    #[test]
    fn mutated_messages_never_panic(index in 0usize..6, at in any::<usize>(), byte in any::<u8>()) {
        let mut bytes = samples()[index].encode();
        let at = at % bytes.len();
        bytes[at] = byte;
        if let Ok(message) = Gossip::decode(&bytes) {
            // Whatever decodes re-encodes to the same bytes: one encoding per message.
            prop_assert_eq!(message.encode(), bytes);
        }
    }
}
