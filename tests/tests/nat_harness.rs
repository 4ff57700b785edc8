//! The network namespace harness itself (`iota_tests::netns`): hosts behind a NAT reach the
//! public hosts, which see the router's outer address; nothing on the wan reaches into a LAN;
//! a cone NAT keeps a flow's source port and a symmetric one does not; the namespaces are gone
//! after the topology is dropped. And the node launcher runs a process in a namespace as
//! `ip netns exec`, holding (and killing) the process itself, and reads its HTTP server from
//! inside that namespace.
//!
//! Both tests need root, `ip` and `nft`: without them they print why and pass, except under
//! CI, where they fail.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use iota_tests::netns::{self, in_netns, Host, NatKind, Topology, HOST_DEV};
use iota_tests::{scratch_dir, NodeProcess, NodeSpec};

/// Connect timeout, and how long a listener waits for a connection that must come.
const CONNECT: Duration = Duration::from_secs(2);
/// How often a non-blocking socket is polled.
const POLL: Duration = Duration::from_millis(10);

/// Accepts one connection on non-blocking `listener` within `timeout`.
fn accept_within(listener: &TcpListener, timeout: Duration) -> anyhow::Result<SocketAddr> {
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((_, from)) => return Ok(from),
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(POLL)
            }
            Err(e) => return Err(e).context("accepting a connection"),
        }
    }
}

/// Connects from `host`'s namespace to `target` (timeout [`CONNECT`]).
fn connect_from(host: &Host, target: SocketAddr) -> anyhow::Result<std::io::Result<TcpStream>> {
    in_netns(&host.ns, move || {
        TcpStream::connect_timeout(&target, CONNECT)
    })
}

/// A TCP listener on `addr:port` in `host`'s namespace, non-blocking.
fn listen_in(host: &Host, port: u16) -> anyhow::Result<TcpListener> {
    let addr = SocketAddr::from((host.addr, port));
    let listener = in_netns(&host.ns, move || TcpListener::bind(addr))?
        .with_context(|| format!("binding {addr} in {}", host.ns))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// A UDP socket on `addr:port` in `host`'s namespace, with a [`CONNECT`] read timeout.
fn udp_in(host: &Host, port: u16) -> anyhow::Result<UdpSocket> {
    let addr = SocketAddr::from((host.addr, port));
    let socket = in_netns(&host.ns, move || UdpSocket::bind(addr))?
        .with_context(|| format!("binding UDP {addr} in {}", host.ns))?;
    socket.set_read_timeout(Some(CONNECT))?;
    Ok(socket)
}

/// Runs `ip args…`; its stdout.
fn ip(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    ensure!(
        output.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn behind_nat_hosts_reach_out_and_nothing_reaches_in() -> anyhow::Result<()> {
    if !netns::available()? {
        return Ok(());
    }
    let started = Instant::now();
    let mut topo = Topology::create("nat", &[NatKind::Cone, NatKind::Symmetric])?;
    let public = topo.add_public("pub")?;
    let behind = [
        topo.add_behind_nat(1, "cone")?,
        topo.add_behind_nat(2, "sym")?,
    ];
    let routers = [topo.router(1)?, topo.router(2)?];
    let prefix = topo.prefix().to_string();

    // Out: each LAN host connects to the public host, which sees the router's outer address.
    let listener = listen_in(&public, 7000)?;
    for ((host, router), nat) in behind.iter().zip(&routers).zip(1..) {
        let kind = topo.nat_kind(nat)?;
        let stream = connect_from(host, SocketAddr::from((public.addr, 7000)))?
            .with_context(|| format!("{} connecting to the public host", host.ns))?;
        let local = stream.local_addr()?;
        let from = accept_within(&listener, CONNECT)?;
        println!("TCP {local} behind the {kind:?} NAT arrives from {from}");
        ensure!(
            from.ip() == router.addr,
            "{kind:?}: the connection from {local} arrived from {from}, not from the router's {}",
            router.addr
        );
        if kind == NatKind::Cone {
            ensure!(
                from.port() == local.port(),
                "the cone NAT changed the TCP source port {} to {}",
                local.port(),
                from.port()
            );
        }
    }

    // In: a listener on each LAN host is reachable neither at its LAN address (not routed on
    // the wan) nor at the router's outer address (no port forwarding).
    let inside = [listen_in(&behind[0], 7001)?, listen_in(&behind[1], 7001)?];
    for (host, router) in behind.iter().zip(&routers) {
        for target in [host.addr, router.addr] {
            let target = SocketAddr::from((target, 7001));
            if connect_from(&public, target)?.is_ok() {
                bail!("the public host connected to {target}, inside {}", host.ns);
            }
        }
    }
    // Even with a route to the LANs through their routers, their forward chains drop what
    // the wan opens (the connection times out).
    for (router, nat) in routers.iter().zip(1..) {
        let (lan, gateway) = (format!("10.77.{nat}.0/24"), router.addr.to_string());
        ip(&[
            "-n", &public.ns, "route", "add", &lan, "via", &gateway, "dev", HOST_DEV,
        ])?;
    }
    let attempts: Vec<_> = behind
        .iter()
        .map(|host| {
            let (public, target) = (public.clone(), SocketAddr::from((host.addr, 7001)));
            std::thread::spawn(move || (target, connect_from(&public, target)))
        })
        .collect();
    for attempt in attempts {
        let (target, got) = attempt
            .join()
            .map_err(|_| anyhow::anyhow!("a connect thread panicked"))?;
        match got? {
            Ok(_) => bail!("the public host connected to {target} through its router"),
            Err(e) => {
                println!("routed connect to {target}: {e} (dropped by the router, as wanted)");
                ensure!(
                    e.kind() == ErrorKind::TimedOut,
                    "connecting to {target} failed with {e}, not by timing out"
                );
            }
        }
    }
    for (listener, host) in inside.iter().zip(&behind) {
        match listener.accept() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => bail!("{} accepted a connection from the wan: {other:?}", host.ns),
        }
    }

    // UDP: one socket behind each NAT sends to two public ports. The cone NAT gives both flows
    // the socket's own port; the symmetric one random ports.
    let servers = [udp_in(&public, 9000)?, udp_in(&public, 9001)?];
    for ((host, router), nat) in behind.iter().zip(&routers).zip(1..) {
        let kind = topo.nat_kind(nat)?;
        let port = 40_000 + u16::try_from(nat)?;
        let socket = udp_in(host, port)?;
        let mut seen = Vec::new();
        for server in &servers {
            let to = server.local_addr()?;
            socket.send_to(b"punch", to)?;
            let mut buf = [0u8; 16];
            let (len, from) = server
                .recv_from(&mut buf)
                .with_context(|| format!("{kind:?}: waiting for the datagram to {to}"))?;
            ensure!(&buf[..len] == b"punch", "a stray datagram from {from}");
            ensure!(
                from.ip() == router.addr,
                "{kind:?}: UDP arrived from {from}, not the router"
            );
            seen.push(from.port());
        }
        println!("UDP from port {port} behind the {kind:?} NAT arrives from ports {seen:?}");
        match kind {
            NatKind::Cone => ensure!(
                seen.iter().all(|&p| p == port),
                "the cone NAT did not keep UDP port {port}: {seen:?}"
            ),
            NatKind::Symmetric => ensure!(
                seen.iter().any(|&p| p != port),
                "the symmetric NAT kept UDP port {port} for both flows: {seen:?}"
            ),
        }
    }

    // A token bucket on the public host's link.
    topo.shape(&public, 100)?;
    let qdisc = Command::new("tc")
        .args(["-n", &public.ns, "qdisc", "show", "dev", HOST_DEV])
        .output()?;
    let qdisc = String::from_utf8_lossy(&qdisc.stdout);
    ensure!(qdisc.contains("tbf"), "no tbf qdisc after shape: {qdisc}");

    drop((listener, inside, servers));
    drop(topo);
    let left: Vec<String> = ip(&["netns", "list"])?
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_string)
        .collect();
    ensure!(left.is_empty(), "namespaces left after drop: {left:?}");
    println!("done in {:?}", started.elapsed());
    Ok(())
}

/// Answers `count` HTTP requests on non-blocking `listener` with `body`, within `timeout`.
fn serve(listener: TcpListener, body: &str, count: usize, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    for _ in 0..count {
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(POLL)
                }
                Err(e) => return Err(e).context("waiting for a request"),
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(CONNECT))?;
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 64 * 1024 {
            let n = stream.read(&mut buf).context("reading a request")?;
            ensure!(n > 0, "the client closed before its request ended");
            request.extend_from_slice(&buf[..n]);
        }
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )?;
    }
    Ok(())
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Starts a stand-in node in `host`'s namespace through the launcher: `sh` prints the
/// `LISTEN` line with the `--listen` it was given and the `METRICS` line with `metrics`, then
/// becomes `sleep`.
async fn stand_in(
    host: &Host,
    dir: &Path,
    name: &str,
    metrics: &str,
) -> anyhow::Result<NodeProcess> {
    // The launcher appends `--listen <addr> --metrics 127.0.0.1:0`: $1 to $4.
    let script =
        format!("echo \"LISTEN $2/p2p/{name}\"; echo \"METRICS {metrics}\"; exec sleep 60");
    let spec = NodeSpec {
        name: name.to_string(),
        args: vec!["-c".into(), script, name.to_string()],
        log: dir.join(format!("{name}.log")),
        netns: Some(host.ns.clone()),
        listen: Some(format!("/ip4/{}/tcp/4001", host.addr)),
    };
    NodeProcess::spawn(Path::new("/bin/sh"), spec, Duration::from_secs(10)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_launcher_runs_and_kills_a_node_inside_a_namespace() -> anyhow::Result<()> {
    if !netns::available()? {
        return Ok(());
    }
    let mut topo = Topology::create("launch", &[])?;
    let host = topo.add_public("node")?;
    let dir = scratch_dir("nat_harness");

    // The node's HTTP server: on the namespace's own loopback, answering the launcher's
    // /status and one GET through the harness.
    let server = in_netns(&host.ns, || TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))?
        .context("binding 127.0.0.1 in the namespace")?;
    server.set_nonblocking(true)?;
    let metrics = format!("http://127.0.0.1:{}", server.local_addr()?.port());
    let serving = std::thread::spawn(move || serve(server, r#"{"in":"netns"}"#, 2, CONNECT * 5));

    let node = stand_in(&host, &dir, "a", &metrics).await?;
    ensure!(
        node.listen_addr() == format!("/ip4/{}/tcp/4001/p2p/a", host.addr),
        "the node was not given the spec's --listen: {}",
        node.listen_addr()
    );
    ensure!(node.netns() == Some(host.ns.as_str()));
    let pid = node.pid().context("the node runs")?;
    // `ip netns exec` execs in place: the pid the launcher holds is the node (here sh, or the
    // sleep it became), not `ip`, and it runs in the namespace.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    println!("pid {pid} runs {}", exe.display());
    ensure!(
        exe.file_name().is_some_and(|n| n != "ip"),
        "the launcher holds `ip` ({}), not the node",
        exe.display()
    );
    let in_ns = ip(&["netns", "pids", &host.ns])?;
    ensure!(
        in_ns.split_whitespace().any(|p| p == pid.to_string()),
        "pid {pid} is not in {}: {in_ns:?}",
        host.ns
    );
    let status = node.status().await?;
    ensure!(status["in"] == "netns", "/status gave {status}");
    let body = netns::http_get_in(host.ns.clone(), format!("{metrics}/status")).await?;
    ensure!(body.contains("netns"), "http_get_in gave {body:?}");
    serving
        .join()
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))??;

    // kill: SIGKILL to the node itself.
    node.kill().await?;
    ensure!(gone(pid), "pid {pid} still runs after kill");

    // stop: SIGTERM reaches the node itself (sleep dies of it).
    let node = stand_in(&host, &dir, "b", &metrics).await?;
    let status = node.stop(Duration::from_secs(5)).await?;
    ensure!(
        status.signal() == Some(libc::SIGTERM),
        "stop ended the node with {status}, not SIGTERM"
    );

    // drop: kill_on_drop kills the node itself.
    let node = stand_in(&host, &dir, "c", &metrics).await?;
    let pid = node.pid().context("the node runs")?;
    drop(node);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(pid) {
        ensure!(Instant::now() < deadline, "pid {pid} still runs after drop");
        tokio::time::sleep(POLL).await;
    }
    ensure!(
        ip(&["netns", "pids", &host.ns])?.trim().is_empty(),
        "processes left in {}",
        host.ns
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
