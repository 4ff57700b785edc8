//! The chain's JSON-RPC client (`iota_p2p::chain::jsonrpc`) against the replay subtensor loaded
//! with recorded mainnet answers (`shared/chain/netuid23.json`, `netuid1.json`), over HTTP and
//! WebSocket: the recorded bytes come back exactly, and every fault mode of the server gives its
//! own `RpcError` within a bounded time.

use std::path::Path;
use std::time::{Duration, Instant};

use iota_p2p::chain::jsonrpc::{ChainRpc, RpcError, RpcLimits};
use iota_tests::chain_replay::{fixtures_or_skip, Fallback, Fault, Fixture, ReplayChain};
use serde_json::{json, Value};

const NEURONS_LITE: &str = "NeuronInfoRuntimeApi_get_neurons_lite";
const FILES: &[&str] = &["netuid23.json", "netuid1.json"];
/// What the fixtures need: netuid1.json's metadata answers are references to these.
const NEEDED: &[&str] = &[
    "netuid23.json",
    "netuid1.json",
    "metadata_v14.json",
    "metadata_v15.json",
];
/// Far more than any one call takes on loopback; the fault tests bound themselves by it.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

fn limits() -> RpcLimits {
    RpcLimits {
        call_timeout: CALL_TIMEOUT,
        connect_timeout: Duration::from_secs(5),
        max_response_bytes: 1 << 20,
    }
}

/// The recorded result of `method` with exactly `params` in fixture `file`, read independently
/// of the replay server.
fn recorded(dir: &Path, file: &str, method: &str, params: &Value) -> Value {
    let text = std::fs::read(dir.join(file)).expect("fixture readable");
    let fixture: Value = serde_json::from_slice(&text).expect("fixture is JSON");
    fixture["responses"]
        .as_array()
        .expect("responses")
        .iter()
        .find(|r| r["method"] == method && &r["params"] == params)
        .map(|r| r["result"].clone())
        .unwrap_or_else(|| panic!("{file} records {method} {params}"))
}

fn recorded_bytes(dir: &Path, file: &str, params: &Value) -> Vec<u8> {
    let result = recorded(dir, file, "state_call", params);
    let hex = result.as_str().expect("hex result");
    hex::decode(hex.trim_start_matches("0x")).expect("recorded hex")
}

/// Both transports' URLs of `chain`.
fn urls(chain: &ReplayChain) -> [String; 2] {
    [chain.http_url(), chain.ws_url()]
}

#[tokio::test]
async fn neurons_lite_bytes_are_exactly_the_recorded_ones() {
    let Some(dir) = fixtures_or_skip("neurons_lite_bytes_are_exactly_the_recorded_ones", NEEDED)
    else {
        return;
    };
    let chain = ReplayChain::start().await.expect("replay chain");
    let n23 = chain
        .load_fixture(&dir.join("netuid23.json"))
        .expect("netuid23");
    let n1 = chain
        .load_fixture(&dir.join("netuid1.json"))
        .expect("netuid1");
    let params23 = json!([NEURONS_LITE, "0x1700"]);
    let params1 = json!([NEURONS_LITE, "0100", n1.block_hash]);
    let want23 = recorded_bytes(&dir, "netuid23.json", &params23);
    let want1 = recorded_bytes(&dir, "netuid1.json", &params1);
    assert_eq!(want23.len(), 3_471);
    assert_eq!(want1.len(), 186_526);
    for url in urls(&chain) {
        let rpc = ChainRpc::connect(&url, limits()).await.expect("connects");
        let got23 = rpc
            .state_call(NEURONS_LITE, "0x1700", None)
            .await
            .expect("netuid 23 neurons");
        assert_eq!(got23, want23, "{url}");
        let got1 = rpc
            .state_call(NEURONS_LITE, "0100", Some(&n1.block_hash))
            .await
            .expect("netuid 1 neurons");
        assert_eq!(got1, want1, "{url}");
        // netuid 23 (spec 208) wraps the neurons in a Vec<u8>: compact 3,469 = 0x35 0x36.
        assert_eq!(&got23[..2], &[0x35, 0x36]);
        assert!(n23.wrapped_vec_u8 && !n1.wrapped_vec_u8);
        // netuid 1 (spec 343): the compact count 1,024 = 0x01 0x10 first.
        assert_eq!(&got1[..2], &[0x01, 0x10]);
        // The metadata (V14 magic `meta` 14) and the V15 runtime API answer, through the
        // fixture's references to the metadata files.
        let metadata = rpc
            .state_get_metadata(Some(&n1.block_hash))
            .await
            .expect("metadata");
        assert_eq!(&metadata[..5], b"meta\x0e");
        let v15 = rpc
            .state_call(
                "Metadata_metadata_at_version",
                "0x0f000000",
                Some(&n1.block_hash),
            )
            .await
            .expect("metadata v15");
        assert_eq!(v15[0], 1, "Some(OpaqueMetadata)");
    }
}

/// Each fixture alone: head, finalized head, header, block hash and runtime version agree with
/// what the fixture says of its chain state.
#[tokio::test]
async fn chain_state_answers_match_each_fixture() {
    let Some(dir) = fixtures_or_skip("chain_state_answers_match_each_fixture", NEEDED) else {
        return;
    };
    for file in FILES {
        let chain = ReplayChain::start().await.expect("replay chain");
        let fixture: Fixture = chain.load_fixture(&dir.join(file)).expect("fixture");
        let recorded_head = recorded(&dir, file, "chain_getHead", &json!([]));
        assert_eq!(recorded_head, json!(fixture.block_hash));
        for url in urls(&chain) {
            let rpc = ChainRpc::connect(&url, limits()).await.expect("connects");
            let head = rpc.chain_get_head().await.expect("head");
            assert_eq!(head, fixture.block_hash, "{file} {url}");
            assert_eq!(rpc.chain_get_finalized_head().await.expect("final"), head);
            let header = rpc.chain_get_header(&head).await.expect("header");
            assert_eq!(
                header["number"],
                json!(format!("0x{:x}", fixture.block_number)),
                "{file}"
            );
            assert_eq!(
                rpc.chain_get_block_hash(fixture.block_number)
                    .await
                    .expect("block hash"),
                head
            );
            let version = rpc
                .state_get_runtime_version(Some(&head))
                .await
                .expect("runtime version");
            assert_eq!(version["specVersion"], json!(fixture.spec_version));
            // A block the recording does not hold: the replay's JSON-RPC error.
            match rpc.chain_get_block_hash(1).await {
                Err(RpcError::Remote { code: -32601, .. }) => {}
                other => panic!("{file} {url}: {other:?}"),
            }
        }
    }
}

/// Every fault mode, over both transports, gives its own error (or, where the client cannot
/// know, the bytes the fault produced) within a bounded time; clearing it restores the answer.
#[tokio::test]
async fn fault_modes_give_their_errors_in_bounded_time() {
    let Some(dir) = fixtures_or_skip("fault_modes_give_their_errors_in_bounded_time", NEEDED)
    else {
        return;
    };
    let chain = ReplayChain::with_fixtures(&dir, &["netuid23.json"])
        .await
        .expect("replay chain");
    let want = recorded_bytes(&dir, "netuid23.json", &json!([NEURONS_LITE, "0x1700"]));
    for url in urls(&chain) {
        let rpc = ChainRpc::connect(&url, limits()).await.expect("connects");
        let call = || rpc.state_call(NEURONS_LITE, "0x1700", None);

        chain.set_fault("state_call", Some(Fault::WrongShape));
        assert_eq!(call().await.expect("garbage hex is bytes"), vec![0xff; 40]);
        chain.set_fault("chain_getHead", Some(Fault::WrongShape));
        assert!(
            matches!(rpc.chain_get_head().await, Err(RpcError::BadResult { .. })),
            "{url}"
        );
        chain.set_fault("chain_getHead", None);

        chain.set_fault("state_call", Some(Fault::TruncatedResult));
        let cut = call().await.expect("truncated hex is bytes");
        assert_eq!(cut.len(), want.len() / 2);
        assert!(want.starts_with(&cut));

        chain.set_fault("state_call", Some(Fault::TruncatedResponse));
        let got = call().await;
        assert!(
            matches!(got, Err(RpcError::Malformed { .. })),
            "{url}: {got:?}"
        );

        chain.set_fault("state_call", Some(Fault::Oversized(1 << 20)));
        let got = call().await;
        assert!(
            matches!(got, Err(RpcError::TooLarge { limit, .. }) if limit == 1 << 20),
            "{url}: {got:?}"
        );

        chain.set_fault(
            "state_call",
            Some(Fault::RpcError {
                code: -32000,
                message: "Client error: Execution failed".into(),
            }),
        );
        match call().await {
            Err(RpcError::Remote { code, message }) => {
                assert_eq!(code, -32000);
                assert_eq!(message, "Client error: Execution failed");
            }
            other => panic!("{url}: {other:?}"),
        }

        // Never answered: the call fails by its own (short) timeout.
        let timeout = Duration::from_millis(500);
        let short = ChainRpc::connect(
            &url,
            RpcLimits {
                call_timeout: timeout,
                ..limits()
            },
        )
        .await
        .expect("connects");
        chain.set_fault("state_call", Some(Fault::NeverAnswer));
        let start = Instant::now();
        let got = short.state_call(NEURONS_LITE, "0x1700", None).await;
        let took = start.elapsed();
        assert!(
            matches!(got, Err(RpcError::Timeout { after, .. }) if after == timeout),
            "{url}: {got:?}"
        );
        assert!(
            took >= timeout && took < timeout * 6,
            "{url}: took {took:?}"
        );

        // Cleared: the same clients get the recorded bytes again (the WebSocket of the
        // timed-out call was closed and is opened again).
        chain.set_fault("state_call", None);
        assert_eq!(call().await.expect("recorded again"), want, "{url}");
        assert_eq!(
            short
                .state_call(NEURONS_LITE, "0x1700", None)
                .await
                .expect("recorded again after the timeout"),
            want,
            "{url}"
        );
    }
}

/// Exact params first; with the fallback by method a state_call `at` another block gets the
/// recorded answer; a test's own answer replaces the recorded one.
#[tokio::test]
async fn params_fallback_and_overrides() {
    let Some(dir) = fixtures_or_skip("params_fallback_and_overrides", NEEDED) else {
        return;
    };
    let chain = ReplayChain::with_fixtures(&dir, &["netuid23.json"])
        .await
        .expect("replay chain");
    let want = recorded_bytes(&dir, "netuid23.json", &json!([NEURONS_LITE, "0x1700"]));
    let rpc = ChainRpc::connect(&chain.ws_url(), limits())
        .await
        .expect("connects");
    let other_block = format!("0x{}", "12".repeat(32));
    let got = rpc
        .state_call(NEURONS_LITE, "0x1700", Some(&other_block))
        .await;
    assert!(
        matches!(got, Err(RpcError::Remote { code: -32601, .. })),
        "{got:?}"
    );
    chain.set_fallback(Fallback::ByMethod);
    assert_eq!(
        rpc.state_call(NEURONS_LITE, "0x1700", Some(&other_block))
            .await
            .expect("fallback"),
        want
    );
    // Another runtime API is not matched by the fallback of state_call.
    let got = rpc
        .state_call("SubnetInfoRuntimeApi_get_subnet_state", "0x1700", None)
        .await;
    assert!(
        matches!(got, Err(RpcError::Remote { code: -32601, .. })),
        "{got:?}"
    );
    // The test's own SCALE answer: Vec<u8> of 2 bytes [4, 0] (an empty Vec<NeuronInfoLite>
    // would be [0]).
    chain.insert(
        "state_call",
        json!([NEURONS_LITE, "0x1700"]),
        json!("0x080400"),
    );
    assert_eq!(
        rpc.state_call(NEURONS_LITE, "0x1700", None)
            .await
            .expect("override"),
        vec![0x08, 0x04, 0x00]
    );
    assert!(chain
        .requests()
        .iter()
        .all(|(method, _)| method == "state_call"));
}

/// `author_submitExtrinsic` records the bytes and answers a hash; the nonce is the test's.
#[tokio::test]
async fn submissions_are_recorded_and_nonce_is_settable() {
    let chain = ReplayChain::start().await.expect("replay chain");
    chain.set_nonce(41);
    let alice = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";
    for (i, url) in urls(&chain).iter().enumerate() {
        let rpc = ChainRpc::connect(url, limits()).await.expect("connects");
        let before = rpc.system_account_next_index(alice).await.expect("nonce");
        assert_eq!(before, 41 + i as u64);
        let extrinsic = vec![0x84, 0x00, i as u8, 0xff];
        let hash = rpc
            .author_submit_extrinsic(&extrinsic)
            .await
            .expect("submitted");
        assert_eq!(hash, format!("0x{:064x}", i + 1));
        assert_eq!(chain.submitted().last(), Some(&extrinsic));
        assert_eq!(
            rpc.system_account_next_index(alice).await.expect("nonce"),
            before + 1
        );
        chain.set_fault(
            "author_submitExtrinsic",
            Some(Fault::RpcError {
                code: 1010,
                message: "Invalid Transaction".into(),
            }),
        );
        assert!(matches!(
            rpc.author_submit_extrinsic(&extrinsic).await,
            Err(RpcError::Remote { code: 1010, .. })
        ));
        chain.set_fault("author_submitExtrinsic", None);
    }
    assert_eq!(chain.submitted().len(), 2);
}

/// The node drops the WebSocket between calls: the next call opens a new one and succeeds.
#[tokio::test]
async fn a_dropped_websocket_is_reopened_at_the_next_call() {
    let chain = ReplayChain::start().await.expect("replay chain");
    chain.insert("system_chain", json!([]), json!("Bittensor"));
    let rpc = ChainRpc::connect(&chain.ws_url(), limits())
        .await
        .expect("connects");
    assert_eq!(
        rpc.call("system_chain", json!([])).await.expect("chain"),
        json!("Bittensor")
    );
    assert_eq!(chain.accepted_websockets(), 1);
    chain.disconnect_websockets();
    let deadline = Instant::now() + Duration::from_secs(5);
    while chain.open_websockets() != 0 {
        assert!(Instant::now() < deadline, "the server never closed it");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        rpc.call("system_chain", json!([])).await.expect("reopened"),
        json!("Bittensor")
    );
    assert_eq!(chain.accepted_websockets(), 2);
}

/// TLS URLs fail with the clear advice, before any network use.
#[tokio::test]
async fn tls_urls_are_refused_with_advice() {
    match ChainRpc::connect("wss://127.0.0.1:9944", limits()).await {
        Err(e @ RpcError::TlsUnsupported { .. }) => {
            assert!(e.to_string().contains("ws://127.0.0.1:9944"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}
