//! Network namespaces for multi-node tests that need real networks: public hosts on one
//! shared segment and hosts behind NAT routers, to test NAT traversal (relay, hole punching).
//!
//! A [`Topology`] is a set of namespaces named `iota-<pid>-<tag>-…`:
//!
//! - `…-wan` holds a bridge, `br0`, that stands for the internet. It has no address.
//! - a public host (`add_public`) has one interface, `eth0`, addressed `10.77.0.N/24`, whose
//!   peer end (`p<N>`) is a port of `br0`. Everything public is on that /24, so it needs no
//!   default route.
//! - NAT `i` (1-based) is a router namespace `…-nat<i>`: `wan0` on the bridge
//!   (`10.77.0.<200 + i>/24`) and a LAN bridge `lan0` (`10.77.<i>.1/24`). Its nftables masquerade
//!   what leaves `wan0` from the LAN, and its forward chain drops everything but LAN → WAN and
//!   the replies to it: there is no port forwarding, so nothing on the wan can open a connection
//!   into the LAN. A [`NatKind::Cone`] router masquerades plainly (Linux keeps a flow's source
//!   port when it is free, so the mapping does not depend on the destination and hole punching
//!   works); a [`NatKind::Symmetric`] one picks a random port per flow
//!   (`random,fully-random`), so punching fails.
//! - a host behind NAT `i` (`add_behind_nat`) has `eth0` at `10.77.<i>.N/24` on that LAN,
//!   with its default route through the router.
//!
//! Every address exists only inside these namespaces, every nftables rule lives in a router
//! namespace, and nothing is created in the root namespace. Dropping the topology removes its
//! namespaces (the veth pairs and bridges go with them), also while a failed test unwinds;
//! [`Topology::create`] first removes those that a killed test process left behind.
//!
//! Code runs inside a namespace through [`in_netns`]: a fresh thread that enters it, so the
//! sockets it creates belong to that namespace (and stay there when handed back to other
//! threads).

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context};

/// Every topology's namespaces start with this, then `<pid>-<tag>-`.
const PREFIX: &str = "iota-";
/// Where `ip netns` keeps the namespaces' handles.
const NETNS_DIR: &str = "/var/run/netns";
/// The interface of every host (public or behind a NAT), in its own namespace.
pub const HOST_DEV: &str = "eth0";
/// Public hosts take `10.77.0.1` up to this; the routers' outer addresses are above it.
const LAST_PUBLIC: u8 = 199;
/// The most NATs a topology has (router `i` is `10.77.0.<200 + i>`).
const MAX_NATS: usize = 50;
/// How long a namespace's processes get to die before it is deleted anyway.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Whether the namespace tests can run here: root (with the capabilities to create
/// namespaces and configure their networks), `ip` and `nft`.
///
/// Outside CI, when they cannot, it prints why and gives `Ok(false)` (the test skips); under
/// CI (`CI` set) that is an error naming what is missing.
pub fn available() -> anyhow::Result<bool> {
    let missing = missing_requirements();
    if missing.is_empty() {
        return Ok(true);
    }
    let why = format!(
        "the network namespace tests need {}; run them as root on a machine with iproute2 and \
         nftables (scripts/setup.sh installs nftables)",
        missing.join(", ")
    );
    if std::env::var_os("CI").is_some() {
        bail!("{why}");
    }
    eprintln!("skipped: {why}");
    Ok(false)
}

/// What [`available`] finds missing, in words.
fn missing_requirements() -> Vec<String> {
    let mut missing = Vec::new();
    match std::fs::read_to_string("/proc/self/status") {
        Ok(status) => {
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or_default()
                    .to_string()
            };
            let euid = field("Uid:").split_whitespace().nth(1).map(str::to_string);
            if euid.as_deref() != Some("0") {
                missing.push(format!(
                    "root (effective uid {})",
                    euid.unwrap_or_else(|| "unknown".into())
                ));
            }
            // CAP_NET_ADMIN (12) configures the networks, CAP_SYS_ADMIN (21) creates and enters
            // the namespaces.
            let caps = u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(0);
            if caps & (1 << 12) == 0 || caps & (1 << 21) == 0 {
                missing.push("CAP_NET_ADMIN and CAP_SYS_ADMIN".into());
            }
        }
        Err(error) => missing.push(format!("a readable /proc/self/status ({error})")),
    }
    for (tool, args, package) in [
        ("ip", ["-V"], "iproute2"),
        ("nft", ["--version"], "nftables"),
    ] {
        let runs = Command::new(tool)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !runs {
            missing.push(format!("`{tool}` ({package})"));
        }
    }
    missing
}

/// Runs `program args…` to completion, with `input` on its stdin when given; its stdout, or
/// an error with its stderr.
fn run(program: &str, args: &[&str], input: Option<&str>) -> anyhow::Result<String> {
    let line = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting `{line}`"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .with_context(|| format!("writing the input of `{line}`"))?;
    }
    let output = child
        .wait_with_output()
        .with_context(|| format!("waiting for `{line}`"))?;
    ensure!(
        output.status.success(),
        "`{line}` failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `ip args…`.
fn ip(args: &[&str]) -> anyhow::Result<String> {
    run("ip", args, None)
}

/// Names of the network namespaces that exist.
fn namespaces() -> anyhow::Result<Vec<String>> {
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Process ids running in namespace `ns`, this process left out.
fn pids_in(ns: &str) -> Vec<i32> {
    let me = std::process::id();
    ip(&["netns", "pids", ns])
        .map(|out| {
            out.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .filter(|&p| p != me)
                .filter_map(|p| i32::try_from(p).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills (SIGKILL) what still runs in `ns`, waits (up to [`KILL_WAIT`]) for it to go, and
/// deletes `ns`.
fn delete_namespace(ns: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let pids = pids_in(ns);
        if pids.is_empty() || Instant::now() >= deadline {
            break;
        }
        for pid in pids {
            // SAFETY: kill(2) with a pid and a signal number has no memory effects.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ip(&["netns", "del", ns]).map(drop)
}

/// Removes the namespaces named `iota-<pid>-…` whose process no longer runs (left by a test
/// that was killed before it could clean up).
fn remove_stale() -> anyhow::Result<()> {
    for ns in namespaces()? {
        let Some(pid) = ns
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match delete_namespace(&ns) {
            Ok(()) => eprintln!("netns: removed {ns}, left by process {pid}, which is gone"),
            // Another test of this process removed it meanwhile.
            Err(_) if !Path::new(NETNS_DIR).join(&ns).exists() => {}
            Err(error) => eprintln!("netns: cannot remove stale {ns}: {error:#}"),
        }
    }
    Ok(())
}

/// A name that can go into a namespace name: letters, digits and `_`.
fn check_name(what: &str, name: &str) -> anyhow::Result<()> {
    ensure!(
        !name.is_empty()
            && name.len() <= 32
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "{what} {name:?}: use 1 to 32 letters, digits or `_`"
    );
    Ok(())
}

/// How a NAT router maps its LAN's flows to its outer address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    /// Endpoint-independent mapping: plain `masquerade`, which keeps a flow's source port
    /// when it is free. UDP and TCP hole punching can work through it.
    Cone,
    /// A random port per flow (`masquerade random,fully-random`): the port a peer learns from
    /// one flow is not the one the next flow gets, so hole punching fails.
    Symmetric,
}

impl NatKind {
    /// The nftables statement that translates the LAN's flows.
    fn masquerade(self) -> &'static str {
        match self {
            NatKind::Cone => "masquerade",
            NatKind::Symmetric => "masquerade random,fully-random",
        }
    }
}

/// A host of a [`Topology`]: its namespace and its address there (on [`HOST_DEV`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Name of the host's network namespace.
    pub ns: String,
    /// The host's address: `10.77.0.N` for a public host, `10.77.<i>.N` behind NAT `i`.
    pub addr: Ipv4Addr,
}

/// One NAT router of a topology.
#[derive(Debug)]
struct Nat {
    kind: NatKind,
    /// The router's namespace.
    ns: String,
    /// Last host octet given on its LAN (the router is `.1`).
    last_host: u8,
}

/// Namespaces joined into a small internet with NAT routers; dropping it removes them all.
#[derive(Debug)]
pub struct Topology {
    /// `iota-<pid>-<tag>-`: every namespace of the topology starts with it.
    prefix: String,
    nats: Vec<Nat>,
    /// Last host octet given on the wan.
    last_public: u8,
    /// Namespaces created so far, in order.
    created: Vec<String>,
}

impl Topology {
    /// Creates the wan and one router with an empty LAN per entry of `nats` (NAT `i` is
    /// `nats[i - 1]`). `tag` tells apart the topologies of one test process. Stale namespaces
    /// of dead test processes are removed first. On error, what was made is removed.
    pub fn create(tag: &str, nats: &[NatKind]) -> anyhow::Result<Topology> {
        check_name("tag", tag)?;
        ensure!(
            nats.len() <= MAX_NATS,
            "{} NATs asked for; at most {MAX_NATS}",
            nats.len()
        );
        remove_stale().context("removing the namespaces of dead test processes")?;
        let mut topo = Topology {
            prefix: format!("{PREFIX}{}-{tag}-", std::process::id()),
            nats: Vec::new(),
            last_public: 0,
            created: Vec::new(),
        };
        let wan = topo.wan();
        topo.add_ns(&wan)?;
        ip(&["-n", &wan, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &wan, "link", "set", "br0", "up"])?;
        for (index, &kind) in nats.iter().enumerate() {
            topo.add_nat(index + 1, kind)
                .with_context(|| format!("creating NAT {} ({kind:?})", index + 1))?;
        }
        Ok(topo)
    }

    /// The prefix of every namespace of this topology (`iota-<pid>-<tag>-`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The namespace holding the wan bridge.
    pub fn wan(&self) -> String {
        format!("{}wan", self.prefix)
    }

    /// The namespaces created so far.
    pub fn namespaces(&self) -> &[String] {
        &self.created
    }

    /// NAT `nat`'s router: its namespace and its outer (wan) address, the address its LAN's
    /// flows come from.
    pub fn router(&self, nat: usize) -> anyhow::Result<Host> {
        let router = self.nat(nat)?;
        Ok(Host {
            ns: router.ns.clone(),
            addr: Self::router_addr(nat)?,
        })
    }

    fn router_addr(nat: usize) -> anyhow::Result<Ipv4Addr> {
        let octet = u8::try_from(200 + nat).context("NAT number out of range")?;
        Ok(Ipv4Addr::new(10, 77, 0, octet))
    }

    fn nat(&self, nat: usize) -> anyhow::Result<&Nat> {
        nat.checked_sub(1)
            .and_then(|i| self.nats.get(i))
            .ok_or_else(|| anyhow!("no NAT {nat}: this topology has {}", self.nats.len()))
    }

    fn add_ns(&mut self, ns: &str) -> anyhow::Result<()> {
        ip(&["netns", "add", ns])?;
        self.created.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Router `i`: `wan0` on the wan bridge, the LAN bridge `lan0`, forwarding on, and the
    /// nftables NAT and filter.
    fn add_nat(&mut self, i: usize, kind: NatKind) -> anyhow::Result<()> {
        let ns = format!("{}nat{i}", self.prefix);
        let wan = self.wan();
        self.add_ns(&ns)?;
        let outer = format!("{}/24", Self::router_addr(i)?);
        let lan = format!("10.77.{i}.1/24");
        let peer = format!("n{i}");
        // Both ends are created in their namespaces: nothing appears in the root one.
        ip(&[
            "link", "add", "wan0", "netns", &ns, "type", "veth", "peer", "name", &peer, "netns",
            &wan,
        ])?;
        ip(&["-n", &wan, "link", "set", &peer, "master", "br0"])?;
        ip(&["-n", &wan, "link", "set", &peer, "up"])?;
        ip(&["-n", &ns, "addr", "add", &outer, "dev", "wan0"])?;
        ip(&["-n", &ns, "link", "set", "wan0", "up"])?;
        ip(&["-n", &ns, "link", "add", "lan0", "type", "bridge"])?;
        ip(&["-n", &ns, "addr", "add", &lan, "dev", "lan0"])?;
        ip(&["-n", &ns, "link", "set", "lan0", "up"])?;
        // /proc/sys/net shows the network namespace of the thread that opens it.
        in_netns(&ns, || {
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
                .context("writing /proc/sys/net/ipv4/ip_forward")
        })??;
        let rules = nat_rules(i, kind);
        run(
            "ip",
            &["netns", "exec", &ns, "nft", "-f", "-"],
            Some(&rules),
        )
        .with_context(|| format!("loading the nftables rules of {ns}:\n{rules}"))?;
        self.nats.push(Nat {
            kind,
            ns,
            last_host: 1,
        });
        Ok(())
    }

    /// A public host named `name`: `eth0` at the next free `10.77.0.N/24`, on the wan bridge.
    pub fn add_public(&mut self, name: &str) -> anyhow::Result<Host> {
        check_name("host name", name)?;
        ensure!(
            self.last_public < LAST_PUBLIC,
            "at most {LAST_PUBLIC} public hosts"
        );
        let n = self.last_public + 1;
        let addr = Ipv4Addr::new(10, 77, 0, n);
        let ns = format!("{}{name}", self.prefix);
        let wan = self.wan();
        self.add_ns(&ns)?;
        self.last_public = n;
        self.add_link(&ns, addr, &wan, &format!("p{n}"), "br0")
            .with_context(|| format!("connecting public host {name}"))?;
        Ok(Host { ns, addr })
    }

    /// A host named `name` behind NAT `nat` (1-based): `eth0` at the next free
    /// `10.77.<nat>.N/24` on its LAN, default route through the router.
    pub fn add_behind_nat(&mut self, nat: usize, name: &str) -> anyhow::Result<Host> {
        check_name("host name", name)?;
        let (router, last) = {
            let router = self.nat(nat)?;
            (router.ns.clone(), router.last_host)
        };
        ensure!(last < 254, "NAT {nat}'s LAN is full");
        let n = last + 1;
        let subnet = u8::try_from(nat).context("NAT number out of range")?;
        let addr = Ipv4Addr::new(10, 77, subnet, n);
        let ns = format!("{}{name}", self.prefix);
        self.add_ns(&ns)?;
        if let Some(router) = nat.checked_sub(1).and_then(|i| self.nats.get_mut(i)) {
            router.last_host = n;
        }
        self.add_link(&ns, addr, &router, &format!("h{n}"), "lan0")
            .with_context(|| format!("connecting {name} to NAT {nat}"))?;
        let gateway = format!("10.77.{nat}.1");
        ip(&["-n", &ns, "route", "add", "default", "via", &gateway])?;
        Ok(Host { ns, addr })
    }

    /// A veth pair from `ns` (`eth0`, address `addr/24`) to `peer` in `hub`, a port of
    /// `bridge` there.
    fn add_link(
        &self,
        ns: &str,
        addr: Ipv4Addr,
        hub: &str,
        peer: &str,
        bridge: &str,
    ) -> anyhow::Result<()> {
        ip(&[
            "link", "add", HOST_DEV, "netns", ns, "type", "veth", "peer", "name", peer, "netns",
            hub,
        ])?;
        ip(&["-n", hub, "link", "set", peer, "master", bridge])?;
        ip(&["-n", hub, "link", "set", peer, "up"])?;
        let cidr = format!("{addr}/24");
        ip(&["-n", ns, "addr", "add", &cidr, "dev", HOST_DEV])?;
        ip(&["-n", ns, "link", "set", HOST_DEV, "up"])?;
        Ok(())
    }

    /// Limits what `host` sends to `rate_mbit` Mbit/s with a token bucket on its interface.
    /// (The kernel here has no `netem`: bandwidth only, no latency.)
    pub fn shape(&self, host: &Host, rate_mbit: u32) -> anyhow::Result<()> {
        ensure!(
            self.created.contains(&host.ns),
            "{} is not a host of this topology",
            host.ns
        );
        ensure!(rate_mbit > 0, "a rate of 0 Mbit/s");
        let rate = format!("{rate_mbit}mbit");
        run(
            "tc",
            &[
                "-n", &host.ns, "qdisc", "add", "dev", HOST_DEV, "root", "tbf", "rate", &rate,
                "burst", "32kbit", "latency", "50ms",
            ],
            None,
        )
        .map(drop)
    }

    /// Limits both directions of `host`'s link to `rate_mbit` Mbit/s: a token bucket on its
    /// interface (what it sends) and one on the link's other end, its port on the wan bridge
    /// or on its router's LAN bridge (what it receives). Each bucket holds 10 ms of the rate,
    /// and at least one 64 KiB GSO packet, and queues at most 50 ms before it drops. A second
    /// call replaces the limits.
    pub fn shape_both(&self, host: &Host, rate_mbit: u32) -> anyhow::Result<()> {
        ensure!(
            self.created.contains(&host.ns),
            "{} is not a host of this topology",
            host.ns
        );
        ensure!(rate_mbit > 0, "a rate of 0 Mbit/s");
        let bits = u64::from(rate_mbit) * 1_000_000;
        let rate = format!("{bits}bit");
        let burst = (bits / 8 / 100).max(64 << 10).to_string();
        let [_, _, subnet, n] = host.addr.octets();
        // The far end of the host's veth pair, as `add_link` named it.
        let far = if subnet == 0 {
            (self.wan(), format!("p{n}"))
        } else {
            (self.nat(usize::from(subnet))?.ns.clone(), format!("h{n}"))
        };
        for (ns, dev) in [(host.ns.clone(), HOST_DEV.to_string()), far] {
            run(
                "tc",
                &[
                    "-n", &ns, "qdisc", "replace", "dev", &dev, "root", "tbf", "rate", &rate,
                    "burst", &burst, "latency", "50ms",
                ],
                None,
            )
            .with_context(|| format!("limiting {dev} in {ns} to {rate_mbit} Mbit/s"))?;
        }
        Ok(())
    }

    /// The kind of NAT `nat`.
    pub fn nat_kind(&self, nat: usize) -> anyhow::Result<NatKind> {
        Ok(self.nat(nat)?.kind)
    }
}

/// Router `i`'s nftables: masquerade the LAN's flows out of `wan0`; forward LAN → WAN and the
/// replies to it, nothing else; and drop, silently, whatever the wan opens to the router
/// itself, as home routers do. (Answering with a reset instead would kill a hole punch whose
/// first packet arrives a moment before the LAN host's own packet opened the mapping: the
/// reset reaches the other side's NAT and closes its mapping too. Dropped, the packet is
/// retransmitted and passes.)
fn nat_rules(i: usize, kind: NatKind) -> String {
    format!(
        "table ip nat {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr 10.77.{i}.0/24 oifname \"wan0\" {}
  }}
}}
table ip filter {{
  chain forward {{
    type filter hook forward priority filter; policy drop;
    iifname \"lan0\" oifname \"wan0\" accept
    iifname \"wan0\" oifname \"lan0\" ct state established,related accept
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname \"wan0\" ct state new drop
  }}
}}
",
        kind.masquerade()
    )
}

impl Drop for Topology {
    fn drop(&mut self) {
        while let Some(ns) = self.created.pop() {
            if let Err(error) = delete_namespace(&ns) {
                eprintln!("netns: cannot remove {ns}: {error:#}");
            }
        }
    }
}

/// Starts node `name` on `host` (data under `dir/name`, its log at `dir/name.log`),
/// listening on TCP and QUIC at the host's address, with `extra` arguments.
pub async fn start_on(
    dir: &Path,
    host: &Host,
    name: &str,
    extra: &[String],
) -> anyhow::Result<iota_p2p::launcher::NodeProcess> {
    let mut args = vec![
        "--data-dir".to_string(),
        dir.join(name).display().to_string(),
    ];
    args.extend(extra.iter().cloned());
    let spec = iota_p2p::launcher::NodeSpec {
        name: name.to_string(),
        args,
        log: dir.join(format!("{name}.log")),
        netns: Some(host.ns.clone()),
        listen: Some(format!("/ip4/{0}/tcp/0,/ip4/{0}/udp/0/quic-v1", host.addr)),
    };
    iota_p2p::launcher::NodeProcess::spawn(crate::binary(), spec, crate::READY_TIMEOUT).await
}

/// Runs `f` on a fresh thread that first enters network namespace `ns`; the sockets `f`
/// creates belong to `ns`. Blocks until `f` returns; a panic in `f` becomes an error.
pub fn in_netns<R: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> anyhow::Result<R> {
    let path = format!("{NETNS_DIR}/{ns}");
    let handle = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    let thread = std::thread::Builder::new()
        .name(format!("netns {ns}"))
        .spawn(move || -> std::io::Result<R> {
            // SAFETY: setns(2) on a descriptor this thread owns for its whole call; it changes
            // this thread's network namespace only.
            let entered = unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) };
            if entered != 0 {
                return Err(std::io::Error::last_os_error());
            }
            drop(handle);
            Ok(f())
        })
        .context("spawning a thread")?;
    match thread.join() {
        Ok(result) => result.with_context(|| format!("entering network namespace {ns}")),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            bail!("in network namespace {ns}: {message}")
        }
    }
}

/// `GET url` (5 s timeout) from inside namespace `ns`, without blocking the async threads.
pub async fn http_get_in(ns: String, url: String) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || {
        let what = format!("GET {url} in {ns}");
        in_netns(&ns, move || -> anyhow::Result<String> {
            let response = ureq::get(&url)
                .timeout(Duration::from_secs(5))
                .call()
                .with_context(|| format!("GET {url}"))?;
            response
                .into_string()
                .with_context(|| format!("reading the body of {url}"))
        })
        .and_then(|got| got)
        .context(what)
    })
    .await
    .context("the GET's thread failed")?
}
