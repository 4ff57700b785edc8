//! Which of a peer's addresses this node keeps and dials: a pure rule over multiaddrs.
//!
//! A peer tells us its addresses (identify) and the DHT tells us others' (kad); both are the
//! peer's word. A node of a public run ([`Reach::Public`]: it listens on a global address or
//! was given an external one) keeps only global addresses: a loopback or private address a
//! stranger advertises would make it dial into its own host or LAN. A node of a local run
//! ([`Reach::Local`]: loopback and private addresses only, as every test and `local-swarm`
//! run) keeps them all, as before. Either way at most [`MAX_PEER_ADDRS`] addresses of one
//! peer are kept from one report, so a peer cannot make us store or dial an unbounded list.
//!
//! [`GuardedTransport`] enforces the rule where every dial passes, whoever asks for it (a
//! discovery query dials the addresses the DHT returned without asking the event loop): in a
//! public run it refuses to dial any address that is not global, except the bootstrap
//! addresses the operator gave.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::pin::Pin;
use std::task::{Context, Poll};

use libp2p::core::transport::{DialOpts, ListenerId, TransportError, TransportEvent};
use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;

use crate::Metrics;

/// Most addresses of one peer taken from one identify report or DHT answer.
pub const MAX_PEER_ADDRS: usize = 8;

/// Whether this node takes part in a public run or a local one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Loopback or private addresses only: every address a peer gives is kept.
    Local,
    /// A global address (listened on, or given as external): only global addresses are kept.
    Public,
}

impl Reach {
    /// The reach of a node that listens on `listen`, was told it is reachable at `external`
    /// and joins through `bootstrap`. An unspecified address (`0.0.0.0`, `::`) says nothing.
    /// A node that bootstraps through a global address takes part in a public run even when
    /// it listens on a LAN address behind a NAT: its LAN addresses, and the ones its peers
    /// give, mean nothing to the run, so it is public too (it reaches others by dialling out,
    /// and is reached through relays and hole punching).
    pub fn of(listen: &[Multiaddr], external: &[Multiaddr], bootstrap: &[Multiaddr]) -> Reach {
        let global = |a: &Multiaddr| scope(a) == Scope::Global;
        if !external.is_empty() || listen.iter().any(global) || bootstrap.iter().any(global) {
            Reach::Public
        } else {
            Reach::Local
        }
    }

    /// `public` or `local`, as `/status` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reach::Public => "public",
            Reach::Local => "local",
        }
    }
}

/// What an address is reachable from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The same host: loopback.
    Host,
    /// A private network: RFC 1918, shared (CGNAT) space, link-local, unique-local IPv6.
    Private,
    /// Unspecified (`0.0.0.0`, `::`): any of the host's addresses.
    Unspecified,
    /// Anywhere: a global IP address, or a DNS name.
    Global,
    /// Not an IP or DNS address (a relay circuit alone, a memory address).
    Other,
}

/// The scope of an address, from its first component.
pub fn scope(addr: &Multiaddr) -> Scope {
    match addr.iter().next() {
        Some(Protocol::Ip4(ip)) => scope_v4(ip),
        Some(Protocol::Ip6(ip)) => scope_v6(ip),
        Some(Protocol::Dns(_) | Protocol::Dns4(_) | Protocol::Dns6(_) | Protocol::Dnsaddr(_)) => {
            Scope::Global
        }
        _ => Scope::Other,
    }
}

fn scope_v4(ip: Ipv4Addr) -> Scope {
    let [a, b, ..] = ip.octets();
    if ip.is_unspecified() {
        Scope::Unspecified
    } else if ip.is_loopback() {
        Scope::Host
    } else if ip.is_private()
        || ip.is_link_local()
        // 100.64.0.0/10, the shared address space carriers NAT behind.
        || (a == 100 && (64..128).contains(&b))
    {
        Scope::Private
    } else if ip.is_broadcast() || ip.is_multicast() || ip.is_documentation() || a == 0 || a >= 240
    {
        Scope::Other
    } else {
        Scope::Global
    }
}

fn scope_v6(ip: Ipv6Addr) -> Scope {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return scope_v4(v4);
    }
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        Scope::Unspecified
    } else if ip.is_loopback() {
        Scope::Host
    } else if (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80 {
        // fc00::/7 unique-local, fe80::/10 link-local.
        Scope::Private
    } else if ip.is_multicast() || first == 0x2001 && ip.segments()[1] == 0x0db8 {
        Scope::Other
    } else {
        Scope::Global
    }
}

/// The addresses of `addrs` this node keeps and may dial, at most [`MAX_PEER_ADDRS`], in the
/// order given; the second number is how many were dropped.
pub fn admit(addrs: impl IntoIterator<Item = Multiaddr>, reach: Reach) -> (Vec<Multiaddr>, usize) {
    let mut kept = Vec::new();
    let mut dropped = 0;
    for addr in addrs {
        let allowed = match reach {
            Reach::Local => true,
            Reach::Public => scope(&addr) == Scope::Global,
        };
        if allowed && kept.len() < MAX_PEER_ADDRS && !kept.contains(&addr) {
            kept.push(addr);
        } else {
            dropped += 1;
        }
    }
    (kept, dropped)
}

/// `addr` without a trailing `/p2p/<peer id>`.
fn without_peer(addr: &Multiaddr) -> Multiaddr {
    let mut addr = addr.clone();
    if let Some(Protocol::P2p(_)) = addr.iter().last() {
        addr.pop();
    }
    addr
}

/// A transport that, in a public run, dials only global addresses and the operator's
/// bootstrap addresses; every other dial fails at once, before a packet is sent, and is
/// counted in `iota_peer_addresses_refused_total`. Listening is unchanged.
#[derive(Debug)]
pub(crate) struct GuardedTransport<T> {
    inner: T,
    reach: Reach,
    allowed: Vec<Multiaddr>,
    metrics: Metrics,
}

impl<T> GuardedTransport<T> {
    /// Wraps `inner` for a node of `reach` whose operator gave `bootstrap`.
    pub(crate) fn new(inner: T, reach: Reach, bootstrap: &[Multiaddr], metrics: Metrics) -> Self {
        GuardedTransport {
            inner,
            reach,
            allowed: bootstrap.iter().map(without_peer).collect(),
            metrics,
        }
    }

    /// Whether a dial of `addr` may go out.
    pub(crate) fn may_dial(&self, addr: &Multiaddr) -> bool {
        self.reach == Reach::Local
            || scope(addr) == Scope::Global
            || self.allowed.contains(&without_peer(addr))
    }
}

impl<T: libp2p::core::Transport + Unpin> libp2p::core::Transport for GuardedTransport<T> {
    type Output = T::Output;
    type Error = T::Error;
    type ListenerUpgrade = T::ListenerUpgrade;
    type Dial = T::Dial;

    fn listen_on(
        &mut self,
        id: ListenerId,
        addr: Multiaddr,
    ) -> Result<(), TransportError<Self::Error>> {
        self.inner.listen_on(id, addr)
    }

    fn remove_listener(&mut self, id: ListenerId) -> bool {
        self.inner.remove_listener(id)
    }

    fn dial(
        &mut self,
        addr: Multiaddr,
        opts: DialOpts,
    ) -> Result<Self::Dial, TransportError<Self::Error>> {
        if !self.may_dial(&addr) {
            self.metrics.addresses_refused(1);
            tracing::debug!(address = %addr, "not dialling a private address in a public run");
            return Err(TransportError::MultiaddrNotSupported(addr));
        }
        self.inner.dial(addr, opts)
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, Self::Error>> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Multiaddr {
        s.parse().unwrap()
    }

    /// The unspecified IPv4 address (any of the host's) and `port`; parsed, never used.
    fn any_v4(port: u16) -> Multiaddr {
        Multiaddr::from(Ipv4Addr::UNSPECIFIED).with(Protocol::Tcp(port))
    }

    #[test]
    fn a_public_node_dials_global_and_bootstrap_addresses_only() {
        let boot =
            a("/ip4/10.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN");
        let public = GuardedTransport::new(
            (),
            Reach::Public,
            std::slice::from_ref(&boot),
            Metrics::unregistered(),
        );
        assert!(public.may_dial(&a("/ip4/8.8.8.8/tcp/1")));
        assert!(public.may_dial(&boot), "the operator's bootstrap address");
        assert!(public.may_dial(&a("/ip4/10.0.0.1/tcp/4001")));
        assert!(!public.may_dial(&a("/ip4/10.0.0.1/tcp/4002")));
        assert!(!public.may_dial(&a("/ip4/127.0.0.1/tcp/1")));
        let local = GuardedTransport::new((), Reach::Local, &[], Metrics::unregistered());
        assert!(local.may_dial(&a("/ip4/127.0.0.1/tcp/1")));
    }

    #[test]
    fn addresses_are_scoped_by_their_ip() {
        for (addr, want) in [
            ("/ip4/127.0.0.1/tcp/1", Scope::Host),
            ("/ip6/::1/tcp/1", Scope::Host),
            ("/ip4/10.1.2.3/tcp/1", Scope::Private),
            ("/ip4/172.16.0.1/tcp/1", Scope::Private),
            ("/ip4/192.168.1.1/tcp/1", Scope::Private),
            ("/ip4/100.64.0.1/tcp/1", Scope::Private),
            ("/ip4/169.254.0.1/tcp/1", Scope::Private),
            ("/ip6/fd00::1/tcp/1", Scope::Private),
            ("/ip6/fe80::1/tcp/1", Scope::Private),
            ("/ip6/::ffff:10.0.0.1/tcp/1", Scope::Private),
            ("/ip6/::/tcp/1", Scope::Unspecified),
            ("/ip4/8.8.8.8/tcp/1", Scope::Global),
            ("/ip4/100.128.0.1/tcp/1", Scope::Global),
            ("/ip6/2a00:1450::1/tcp/1", Scope::Global),
            ("/dns4/example.org/tcp/1", Scope::Global),
            ("/ip4/224.0.0.1/tcp/1", Scope::Other),
            ("/ip4/192.0.2.1/tcp/1", Scope::Other),
            ("/ip6/2001:db8::1/tcp/1", Scope::Other),
            ("/memory/1", Scope::Other),
        ] {
            assert_eq!(scope(&a(addr)), want, "{addr}");
        }
        assert_eq!(scope(&any_v4(1)), Scope::Unspecified);
    }

    #[test]
    fn a_node_is_public_when_it_listens_on_is_told_or_bootstraps_through_a_global_address() {
        let loopback = [a("/ip4/127.0.0.1/tcp/0")];
        assert_eq!(Reach::of(&loopback, &[], &[]), Reach::Local);
        assert_eq!(Reach::of(&[any_v4(4001)], &[], &[]), Reach::Local);
        let lan = [a("/ip4/192.168.0.2/tcp/4001")];
        assert_eq!(Reach::of(&lan, &[], &[]), Reach::Local);
        assert_eq!(
            Reach::of(
                &[a("/ip4/203.0.113.0/tcp/4001"), a("/ip4/8.8.4.4/tcp/4001")],
                &[],
                &[]
            ),
            Reach::Public
        );
        assert_eq!(
            Reach::of(&[any_v4(4001)], &[a("/ip4/8.8.4.4/tcp/4001")], &[]),
            Reach::Public
        );
        // A run on a LAN: a node bootstrapping through a LAN address stays local.
        assert_eq!(
            Reach::of(&lan, &[], &[a("/ip4/192.168.0.1/tcp/4001")]),
            Reach::Local
        );
        // A miner behind a NAT joining a public run.
        assert_eq!(
            Reach::of(&lan, &[], &[a("/ip4/8.8.4.4/tcp/4001")]),
            Reach::Public
        );
    }

    #[test]
    fn a_public_node_keeps_only_global_addresses_and_never_too_many() {
        let offered = vec![
            a("/ip4/127.0.0.1/tcp/1"),
            a("/ip4/10.0.0.5/tcp/1"),
            any_v4(1),
            a("/ip4/8.8.8.8/tcp/1"),
            a("/ip4/8.8.8.8/tcp/1"),
        ];
        let (kept, dropped) = admit(offered.clone(), Reach::Public);
        assert_eq!(kept, vec![a("/ip4/8.8.8.8/tcp/1")]);
        assert_eq!(dropped, 4);
        // A local run keeps loopback and private addresses, as every test on 127.0.0.1 needs.
        let (kept, dropped) = admit(offered, Reach::Local);
        assert_eq!(kept.len(), 4);
        assert_eq!(dropped, 1);
        let many: Vec<Multiaddr> = (0..100u16)
            .map(|port| a(&format!("/ip4/8.8.8.8/tcp/{}", port + 1)))
            .collect();
        let (kept, dropped) = admit(many, Reach::Public);
        assert_eq!(
            (kept.len(), dropped),
            (MAX_PEER_ADDRS, 100 - MAX_PEER_ADDRS)
        );
    }
}
