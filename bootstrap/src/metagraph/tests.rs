use serde_json::{json, Value};

use super::*;
use crate::test_support::{hotkey, peer};

fn neuron_json(uid: u64, n: u64, stake: u64, permit: bool) -> Value {
    json!({
        "uid": uid,
        "hotkey": hotkey(n).as_str(),
        "peer_id": peer(n).as_str(),
        "stake": stake,
        "validator_permit": permit,
    })
}

fn snapshot(neurons: Vec<Value>) -> String {
    json!({"netuid": 9, "block": 4_200_000, "neurons": neurons}).to_string()
}

fn three_neurons() -> Vec<Value> {
    vec![
        neuron_json(7, 1, 5 * RAO_PER_TAO, true),
        neuron_json(2, 2, 0, false),
        neuron_json(4, 3, 1_000 * RAO_PER_TAO, true),
    ]
}

#[test]
fn parses_a_snapshot_and_looks_up_by_peer_id_and_uid() {
    let m = Metagraph::from_json_str(&snapshot(three_neurons())).unwrap();
    assert_eq!((m.netuid(), m.block(), m.len()), (9, 4_200_000, 3));
    let uids: Vec<u16> = m.neurons().iter().map(|n| n.uid).collect();
    assert_eq!(uids, [2, 4, 7], "neurons are held in uid order");
    let n = m.by_peer_id(&peer(3)).unwrap();
    assert_eq!(
        (n.uid, n.stake, n.validator_permit),
        (4, 1_000 * RAO_PER_TAO, true)
    );
    assert_eq!(n.hotkey, hotkey(3));
    assert_eq!(m.by_uid(7).unwrap().peer_id, peer(1));
    assert!(m.by_peer_id(&peer(99)).is_none());
    assert!(m.by_uid(3).is_none());
    let validators: Vec<u16> = m.validators().map(|n| n.uid).collect();
    assert_eq!(validators, [4, 7]);
}

#[test]
fn entry_order_in_the_file_does_not_matter() {
    let mut reversed = three_neurons();
    reversed.reverse();
    assert_eq!(
        Metagraph::from_json_str(&snapshot(three_neurons())).unwrap(),
        Metagraph::from_json_str(&snapshot(reversed)).unwrap()
    );
}

#[test]
fn extra_fields_are_ignored() {
    let mut neurons = three_neurons();
    neurons[0]["coldkey"] = json!("5Cold");
    neurons[0]["trust"] = json!(0.5);
    let mut top: Value = serde_json::from_str(&snapshot(neurons)).unwrap();
    top["exported_by"] = json!("btcli");
    let plain = Metagraph::from_json_str(&snapshot(three_neurons())).unwrap();
    assert_eq!(Metagraph::from_json_str(&top.to_string()).unwrap(), plain);
}

#[test]
fn local_run_snapshot_round_trips_through_json() {
    let m = Metagraph::for_local_run((0..5).map(|n| LocalNeuron {
        peer_id: peer(n),
        stake: n * RAO_PER_TAO,
        validator_permit: n % 2 == 0,
    }))
    .unwrap();
    assert_eq!(m.netuid(), LOCAL_NETUID);
    assert_eq!(
        m.by_uid(3).unwrap().peer_id,
        peer(3),
        "uids follow the given order"
    );
    let back = Metagraph::from_json_str(&m.to_json()).unwrap();
    assert_eq!(back, m);
}

#[test]
fn local_run_with_a_repeated_peer_is_rejected() {
    let entry = |stake| LocalNeuron {
        peer_id: peer(1),
        stake,
        validator_permit: true,
    };
    let err = Metagraph::for_local_run([entry(1), entry(2)]).unwrap_err();
    assert!(
        matches!(
            err,
            MetagraphError::DuplicatePeerId {
                index: 1,
                uid: 1,
                first_uid: 0,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Replaces field `field` of neuron #1 (uid 2) with `value` (`Null` removes it).
fn with_field(field: &str, value: Value) -> String {
    let mut neurons = three_neurons();
    match value {
        Value::Null => {
            neurons[1].as_object_mut().unwrap().remove(field);
        }
        value => neurons[1][field] = value,
    }
    snapshot(neurons)
}

#[test]
fn malformed_neuron_fields_name_the_entry_and_the_field() {
    type Case = (&'static str, Value, Option<u16>, fn(&FieldProblem) -> bool);
    let cases: Vec<Case> = vec![
        ("uid", Value::Null, None, |p| *p == FieldProblem::Missing),
        ("uid", json!(-1), None, |p| {
            matches!(p, FieldProblem::OutOfRange { .. })
        }),
        ("uid", json!(70_000), None, |p| {
            matches!(p, FieldProblem::OutOfRange { .. })
        }),
        ("uid", json!("2"), None, |p| {
            matches!(p, FieldProblem::WrongType { .. })
        }),
        ("hotkey", Value::Null, Some(2), |p| {
            *p == FieldProblem::Missing
        }),
        ("hotkey", json!("5Short"), Some(2), |p| {
            matches!(p, FieldProblem::Hotkey(HotkeyError::WrongLength { .. }))
        }),
        ("hotkey", json!(12), Some(2), |p| {
            matches!(p, FieldProblem::WrongType { .. })
        }),
        ("peer_id", json!("QmNotAPeerId"), Some(2), |p| {
            matches!(p, FieldProblem::PeerId(_))
        }),
        ("peer_id", json!(""), Some(2), |p| {
            *p == FieldProblem::PeerId(PeerIdError::Empty)
        }),
        ("stake", json!("100"), Some(2), |p| {
            matches!(p, FieldProblem::WrongType { .. })
        }),
        ("stake", json!(1.5), Some(2), |p| {
            matches!(p, FieldProblem::WrongType { .. })
        }),
        ("stake", json!(1e30), Some(2), |p| {
            matches!(p, FieldProblem::OutOfRange { .. })
        }),
        ("stake", json!(-5), Some(2), |p| {
            matches!(p, FieldProblem::OutOfRange { .. })
        }),
        ("validator_permit", json!("yes"), Some(2), |p| {
            matches!(p, FieldProblem::WrongType { .. })
        }),
        ("validator_permit", Value::Null, Some(2), |p| {
            *p == FieldProblem::Missing
        }),
    ];
    for (field, value, want_uid, want_problem) in cases {
        let input = with_field(field, value.clone());
        let err = Metagraph::from_json_str(&input).unwrap_err();
        let MetagraphError::Neuron {
            index,
            uid,
            field: named,
            ref problem,
        } = err
        else {
            panic!("{field} = {value}: got {err:?}");
        };
        assert_eq!(
            (index, uid, named),
            (1, want_uid, field),
            "{field} = {value}"
        );
        assert!(want_problem(problem), "{field} = {value}: got {problem:?}");
        let message = err.to_string();
        assert!(message.starts_with("neuron #1 (uid "), "{message}");
        assert!(message.contains(&format!("`{field}`")), "{message}");
    }
}

#[test]
fn malformed_files_give_typed_errors() {
    let dup = |field: &str| {
        let mut neurons = three_neurons();
        neurons[2][field] = neurons[0][field].clone();
        snapshot(neurons)
    };
    let mut not_object = three_neurons();
    not_object[1] = json!([1, 2]);
    type Case = (&'static str, String, fn(&MetagraphError) -> bool);
    let cases: Vec<Case> = vec![
        ("not json", "{\"netuid\": 9,".to_owned(), |e| {
            matches!(e, MetagraphError::Json(_))
        }),
        ("top level array", "[]".to_owned(), |e| {
            matches!(e, MetagraphError::NotAnObject)
        }),
        (
            "no netuid",
            r#"{"block": 1, "neurons": []}"#.to_owned(),
            |e| {
                matches!(
                    e,
                    MetagraphError::Field {
                        field: "netuid",
                        problem: FieldProblem::Missing
                    }
                )
            },
        ),
        (
            "netuid past u16",
            r#"{"netuid": 65536, "block": 1, "neurons": []}"#.to_owned(),
            |e| {
                matches!(
                    e,
                    MetagraphError::Field {
                        field: "netuid",
                        problem: FieldProblem::OutOfRange { .. }
                    }
                )
            },
        ),
        (
            "neurons not an array",
            r#"{"netuid": 1, "block": 1, "neurons": {}}"#.to_owned(),
            |e| {
                matches!(
                    e,
                    MetagraphError::Field {
                        field: "neurons",
                        problem: FieldProblem::WrongType { .. }
                    }
                )
            },
        ),
        ("entry not an object", snapshot(not_object), |e| {
            matches!(e, MetagraphError::NeuronNotAnObject { index: 1 })
        }),
        ("duplicate uid", dup("uid"), |e| {
            matches!(
                e,
                MetagraphError::DuplicateUid {
                    index: 2,
                    uid: 7,
                    first_index: 0
                }
            )
        }),
        ("duplicate peer id", dup("peer_id"), |e| {
            matches!(
                e,
                MetagraphError::DuplicatePeerId {
                    index: 2,
                    uid: 4,
                    first_uid: 7,
                    ..
                }
            )
        }),
        ("duplicate hotkey", dup("hotkey"), |e| {
            matches!(
                e,
                MetagraphError::DuplicateHotkey {
                    index: 2,
                    uid: 4,
                    first_uid: 7,
                    ..
                }
            )
        }),
    ];
    for (name, input, expected) in cases {
        let err = Metagraph::from_json_str(&input).unwrap_err();
        assert!(expected(&err), "{name}: got {err:?}");
    }
}

#[test]
fn oversized_files_are_refused_unparsed() {
    let big = vec![b' '; MAX_METAGRAPH_BYTES + 1];
    let err = Metagraph::from_json_slice(&big).unwrap_err();
    assert!(
        matches!(err, MetagraphError::TooLarge { len, .. } if len == MAX_METAGRAPH_BYTES + 1),
        "{err:?}"
    );
}
