//! Builds the swarm: TCP + Noise + Yamux and QUIC transports (both behind the dial guard of
//! [`crate::addresses`]), relay circuits over either, and the configured [`Behaviour`].
//!
//! Protocol parameters live here as documented constants so that every node of a run agrees
//! on them.

use std::time::Duration;

use libp2p::{
    autonat,
    connection_limits::{self, ConnectionLimits},
    core::{upgrade, Transport},
    dcutr, gossipsub, identify,
    identity::Keypair,
    kad, noise, ping, quic, relay, request_response,
    swarm::behaviour::toggle::Toggle,
    tcp, yamux, StreamProtocol, Swarm, SwarmBuilder,
};

use crate::{
    addresses::{GuardedTransport, Reach},
    behaviour::Behaviour,
    budget::ByteBudget,
    codec, gossip, rr, scoring, Config, Metrics, RelayLimits, SpawnError,
};

/// Kademlia protocol name; nodes of other networks do not join our routing tables.
pub(crate) const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/iota/kad/1.0.0");

/// Identify protocol version string.
const IDENTIFY_PROTOCOL: &str = "/iota/id/1.0.0";

/// gossipsub transmit limit: gossip stays small; tensors go by request-response.
pub(crate) const GOSSIP_MAX_TRANSMIT: usize = 64 * 1024;

/// gossipsub mesh degree; with `MESH_N_LOW` and `MESH_N_HIGH` this works from 3 to hundreds of
/// peers (flood publishing covers the small networks).
const MESH_N: usize = 4;
const MESH_N_LOW: usize = 2;
const MESH_N_HIGH: usize = 8;
const MESH_OUTBOUND_MIN: usize = 1;

/// Kademlia query timeout: our networks are small and local enough that 10 s is generous.
const KAD_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// AutoNAT's first probe, this long after start: time for identify to bring the address a
/// first peer sees us at (libp2p's default waits 15 s).
const AUTONAT_BOOT_DELAY: Duration = Duration::from_secs(2);

/// AutoNAT probes again this often while unsure, and every [`AUTONAT_REFRESH`] once sure.
const AUTONAT_RETRY: Duration = Duration::from_secs(10);
const AUTONAT_REFRESH: Duration = Duration::from_secs(5 * 60);

/// A peer asked to dial us back is asked again only after this long.
const AUTONAT_THROTTLE_SERVER: Duration = Duration::from_secs(5);

/// AutoNAT dial-back requests served: at most this many from one peer per second, and 30 per
/// second in all (libp2p's defaults). Each costs a dial.
const AUTONAT_CLIENTS_PER_PEER: usize = 3;

fn autonat_config(reach: Reach) -> autonat::Config {
    autonat::Config {
        boot_delay: AUTONAT_BOOT_DELAY,
        retry_interval: AUTONAT_RETRY,
        refresh_interval: AUTONAT_REFRESH,
        throttle_server_period: AUTONAT_THROTTLE_SERVER,
        throttle_clients_peer_max: AUTONAT_CLIENTS_PER_PEER,
        // A public run probes and dials back only global addresses; a local run (every test,
        // `local-swarm`) its loopback and private ones.
        only_global_ips: reach == Reach::Public,
        ..autonat::Config::default()
    }
}

fn relay_config(limits: &RelayLimits) -> relay::Config {
    relay::Config {
        max_reservations: limits.max_reservations,
        max_reservations_per_peer: limits.max_reservations_per_peer,
        reservation_duration: limits.reservation_duration,
        max_circuits: limits.max_circuits,
        max_circuits_per_peer: limits.max_circuits_per_peer,
        max_circuit_duration: limits.max_circuit_duration,
        max_circuit_bytes: limits.max_circuit_bytes,
        // libp2p's rate limits: per peer and per IP address, reservations and circuits.
        ..relay::Config::default()
    }
}

fn gossipsub_config() -> Result<gossipsub::Config, SpawnError> {
    gossipsub::ConfigBuilder::default()
        .validation_mode(gossipsub::ValidationMode::Strict)
        // Messages are forwarded only after our envelope check and the application's verdict
        // accept them.
        .validate_messages()
        .message_id_fn(|m: &gossipsub::Message| {
            gossipsub::MessageId::from(blake3::hash(&m.data).as_bytes().to_vec())
        })
        .mesh_n(MESH_N)
        .mesh_n_low(MESH_N_LOW)
        .mesh_n_high(MESH_N_HIGH)
        .mesh_outbound_min(MESH_OUTBOUND_MIN)
        .flood_publish(true)
        .max_transmit_size(GOSSIP_MAX_TRANSMIT)
        .heartbeat_interval(Duration::from_secs(1))
        .build()
        .map_err(|e| SpawnError::Gossipsub(e.to_string()))
}

fn behaviour(
    key: &Keypair,
    relay_client: relay::client::Behaviour,
    config: &Config,
    reach: Reach,
    metrics: &Metrics,
) -> Result<Behaviour, SpawnError> {
    let peer_id = key.public().to_peer_id();

    let mut kad_config = kad::Config::new(KAD_PROTOCOL);
    kad_config.set_query_timeout(KAD_QUERY_TIMEOUT);
    // The event loop runs its own discovery rounds.
    kad_config.set_periodic_bootstrap_interval(None);
    let mut kad =
        kad::Behaviour::with_config(peer_id, kad::store::MemoryStore::new(peer_id), kad_config);
    // Without a confirmed external address kad would stay a client and never answer queries.
    kad.set_mode(Some(kad::Mode::Server));

    let identify = identify::Behaviour::new(
        identify::Config::new(IDENTIFY_PROTOCOL.to_owned(), key.public())
            .with_agent_version(format!("iota-p2p/{}", env!("CARGO_PKG_VERSION")))
            // A public node advertises only its external addresses: those the operator gave,
            // those AutoNAT confirmed, and relay circuits; never a listen address it has not
            // seen reached. A local run advertises its listen addresses as well.
            .with_hide_listen_addrs(reach == Reach::Public)
            // Peers learn at once of a new relay circuit or a confirmed address.
            .with_push_listen_addr_updates(true),
    );

    let mut gossipsub = gossipsub::Behaviour::new(
        gossipsub::MessageAuthenticity::Signed(key.clone()),
        gossipsub_config()?,
    )
    .map_err(|e| SpawnError::Gossipsub(e.to_owned()))?;
    gossipsub
        .with_peer_score(
            scoring::peer_score_params(&config.topics),
            scoring::thresholds(),
        )
        .map_err(SpawnError::Gossipsub)?;

    let limits = connection_limits::Behaviour::new(
        ConnectionLimits::default()
            .with_max_established_per_peer(Some(config.max_connections_per_peer))
            .with_max_established(Some(config.max_connections_total))
            .with_max_pending_incoming(Some(config.max_pending_incoming)),
    );

    let budget = ByteBudget::new(
        config.max_request_bytes_per_peer,
        config.max_request_bytes_total,
        metrics.clone(),
    );
    let binder = codec::Binder::default();
    let codec = codec::Codec::new(
        config.max_frame_bytes,
        budget.clone(),
        binder.clone(),
        metrics.clone(),
    );
    let rr = rr::Behaviour::new(
        request_response::Behaviour::with_codec(
            codec,
            [(codec::PROTOCOL, request_response::ProtocolSupport::Full)],
            request_response::Config::default()
                .with_request_timeout(config.request_timeout)
                .with_max_concurrent_streams(config.max_streams_per_connection),
        ),
        binder,
        budget,
    );

    Ok(Behaviour {
        limits,
        kad,
        identify,
        ping: ping::Behaviour::new(
            ping::Config::new()
                .with_interval(config.ping_interval)
                .with_timeout(config.ping_timeout),
        ),
        gossipsub: gossip::Behaviour::new(gossipsub),
        rr,
        autonat: autonat::Behaviour::new(peer_id, autonat_config(reach)),
        relay_client,
        relay: Toggle::from(
            config
                .relay_server
                .as_ref()
                .map(|limits| relay::Behaviour::new(peer_id, relay_config(limits))),
        ),
        dcutr: Toggle::from(config.hole_punch.then(|| dcutr::Behaviour::new(peer_id))),
    })
}

/// The transport and behaviour of one node.
pub(crate) fn build(
    keypair: Keypair,
    config: &Config,
    reach: Reach,
    metrics: &Metrics,
) -> Result<Swarm<Behaviour>, SpawnError> {
    let mut behaviour_error = None;
    let swarm = SwarmBuilder::with_existing_identity(keypair)
        .with_tokio()
        .with_other_transport(|key| {
            // TCP, as `with_tcp` builds it, behind the dial guard of a public run.
            let tcp = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true));
            let guarded = GuardedTransport::new(tcp, reach, &config.bootstrap, metrics.clone());
            let noise = noise::Config::new(key)
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                guarded
                    .upgrade(upgrade::Version::V1)
                    .authenticate(noise)
                    // Defaults on purpose: libp2p-yamux 0.48 exposes only the stream limit,
                    // and with a patched yamux neither 64/256 KiB frames nor a 16 MiB initial
                    // window moved 16 MiB request throughput beyond run-to-run noise; the
                    // cost is CPU in ChaCha20-Poly1305 and Noise's buffer copies
                    // (benches/transport.rs).
                    .multiplex(yamux::Config::default()),
            )
        })
        .map_err(|e| SpawnError::Transport(e.to_string()))?
        .with_other_transport(|key| {
            // QUIC (TLS 1.3, its own multiplexing), behind the same guard.
            let quic = quic::tokio::Transport::new(quic::Config::new(key));
            GuardedTransport::new(quic, reach, &config.bootstrap, metrics.clone())
        })
        .map_err(|e| SpawnError::Transport(e.to_string()))?
        .with_relay_client(noise::Config::new, yamux::Config::default)
        .map_err(|e| SpawnError::Transport(e.to_string()))?
        .with_behaviour(|key, relay_client| {
            match behaviour(key, relay_client, config, reach, metrics) {
                Ok(b) => Ok(b),
                Err(e) => {
                    let message = e.to_string();
                    behaviour_error = Some(e);
                    Err(message.into())
                }
            }
        });
    let swarm = match (swarm, behaviour_error) {
        (_, Some(e)) => return Err(e),
        (Ok(builder), None) => builder,
        (Err(e), None) => return Err(SpawnError::Transport(e.to_string())),
    };
    Ok(swarm
        .with_swarm_config(|c| c.with_idle_connection_timeout(config.idle_connection_timeout))
        .build())
}
