//! Modelled links and gossip.
//!
//! Each node has an upload and a download, each a first-come first-served queue at its rate,
//! and a one-way latency to the network's core; a transfer from `a` to `b` leaves `a`'s
//! upload when the bytes before it have, crosses both latencies, and lands when `b`'s
//! download has taken it (cut through: the download runs while the upload does). There is no
//! congestion inside the core and no TCP slow start: a long-lived libp2p connection is
//! assumed warm.
//!
//! Each request is a new yamux stream, and yamux's flow control is modelled as the node's
//! yamux (0.14) does it: a stream may send 256 KiB before the receiver grants more; the
//! receiver grants what it has read each time it has read half its window, and that update
//! crosses the receiver's upload behind whatever it is already sending, then both latencies.
//! A window doubles when its half was read within two round trips (yamux's auto-tuning, with
//! the round trip of an idle path, as its pings measure it). A message larger than the
//! window therefore stalls while the receiver's upload is busy: on links that are both
//! limited and loaded, the cost that perfect queues leave out.
//!
//! Gossip follows gossipsub's mesh: a message reaches every subscriber in about
//! `⌈log_D N⌉` mesh hops, and each subscriber receives it from about `min(D, N − 1)` mesh
//! peers, the duplicates included (the figures count every copy a node receives).

/// A node's link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Link {
    /// Upload, bytes per second.
    pub(crate) up: f64,
    /// Download, bytes per second.
    pub(crate) down: f64,
    /// One-way latency to the core, seconds.
    pub(crate) latency: f64,
}

/// Every node's link, when its upload and download are next free, and until when a bulk
/// transfer shares them.
#[derive(Debug, Clone)]
pub(crate) struct Links {
    links: Vec<Link>,
    up_free: Vec<f64>,
    down_free: Vec<f64>,
    bulk_up: Vec<f64>,
    bulk_down: Vec<f64>,
}

impl Links {
    /// Links that are all idle.
    pub(crate) fn new(links: Vec<Link>) -> Links {
        let n = links.len();
        Links {
            links,
            up_free: vec![0.0; n],
            down_free: vec![0.0; n],
            bulk_up: vec![0.0; n],
            bulk_down: vec![0.0; n],
        }
    }

    /// Node `i`'s link.
    pub(crate) fn link(&self, i: usize) -> Link {
        self.links[i]
    }

    /// Sends `bytes` from `a` to `b` at `now`; returns when the last byte has arrived. The
    /// queues count the time the bytes take; the message itself also waits for its
    /// stream's window updates ([`flow_stalls`]), time in which the links serve others.
    pub(crate) fn send(&mut self, a: usize, b: usize, bytes: f64, now: f64) -> f64 {
        let (mut la, mut lb) = (self.links[a], self.links[b]);
        // A bulk transfer on either end takes half of that link while it lasts (two TCP
        // connections through one bottleneck share it about evenly).
        if now < self.bulk_up[a] {
            la.up /= 2.0;
        }
        if now < self.bulk_down[b] {
            lb.down /= 2.0;
        }
        let start = now.max(self.up_free[a]);
        let sent = start + bytes / la.up;
        self.up_free[a] = sent;
        let path = la.latency + lb.latency;
        let first = (start + path).max(self.down_free[b]);
        let landed = (first + bytes / lb.down).max(sent + path);
        self.down_free[b] = landed;
        let backlog = (self.up_free[b] - start).max(0.0);
        landed + flow_stalls(bytes, la.up.min(lb.down), path, backlog)
    }

    /// Sends a bulk transfer of `bytes` from `a` to `b` at `now` (a spot check's evidence, a
    /// stage's weights): a connection of its own that shares `a`'s upload and `b`'s
    /// download with their other traffic, at half of each, rather than queueing in front of
    /// it. Returns when it has arrived.
    pub(crate) fn send_bulk(&mut self, a: usize, b: usize, bytes: f64, now: f64) -> f64 {
        let (la, lb) = (self.links[a], self.links[b]);
        let start = now.max(self.bulk_up[a]).max(self.bulk_down[b]);
        let rate = la.up.min(lb.down) / 2.0;
        let done = start + la.latency + lb.latency + bytes / rate;
        self.bulk_up[a] = done;
        self.bulk_down[b] = done;
        done
    }

    /// The slowest download of any node, bytes a second.
    pub(crate) fn slowest_down(&self) -> f64 {
        self.links
            .iter()
            .map(|l| l.down)
            .fold(f64::INFINITY, f64::min)
    }

    /// One round trip between `a` and `b` with no payload.
    pub(crate) fn round_trip(&self, a: usize, b: usize) -> f64 {
        2.0 * (self.links[a].latency + self.links[b].latency)
    }
}

/// A yamux stream's first receive window (yamux's `DEFAULT_CREDIT`).
pub(crate) const STREAM_WINDOW: f64 = 256.0 * 1024.0;

/// Seconds a message of `bytes` on a new yamux stream spends waiting for window updates,
/// sent at `rate` over a path of one-way latency `path`, when the receiver's upload is busy
/// for `backlog` seconds ahead of each update it sends. Zero for a message within the
/// first window.
pub(crate) fn flow_stalls(bytes: f64, rate: f64, path: f64, backlog: f64) -> f64 {
    if bytes <= STREAM_WINDOW || rate <= 0.0 || !rate.is_finite() {
        return 0.0;
    }
    let round_trip = 2.0 * path;
    let mut window = STREAM_WINDOW;
    let mut credit = window;
    let mut next_update = window / 2.0;
    let mut last_update = 0.0f64;
    // (when an update reaches the sender, the credit it grants), in order.
    let mut updates = std::collections::VecDeque::new();
    let (mut sent, mut clock) = (0.0f64, 0.0f64);
    while sent < bytes {
        if sent >= credit {
            let Some((at, granted)) = updates.pop_front() else {
                break;
            };
            clock = clock.max(at);
            credit = f64::max(credit, granted);
            continue;
        }
        // `next_update` is always ahead of `sent` here: it moves on with every update.
        let upto = bytes.min(credit).min(next_update);
        clock += (upto - sent) / rate;
        sent = upto;
        if sent >= next_update && sent < bytes {
            // The receiver has read `sent` bytes: it grants them, doubling its window when
            // half of it went by within two round trips.
            let read_at = clock + path;
            if read_at - last_update < 2.0 * round_trip {
                window *= 2.0;
            }
            last_update = read_at;
            updates.push_back((read_at + backlog + path, sent + window));
            next_update = sent + window / 2.0;
        }
    }
    (clock - bytes / rate).max(0.0)
}

/// How a gossip message of `bytes` spreads over `subscribers` nodes: the time until the last
/// one has it, and how many copies each receives.
pub(crate) fn spread(bytes: f64, subscribers: usize, mesh: usize, link: &Link) -> (f64, usize) {
    if subscribers <= 1 {
        return (0.0, 0);
    }
    let degree = mesh.max(2) as f64;
    let hops = ((subscribers as f64).ln() / degree.ln()).ceil().max(1.0);
    // Each hop: the path's two latencies, and the sender pushing the message to its D mesh
    // peers through its upload.
    let per_hop = 2.0 * link.latency + bytes * degree / link.up;
    (hops * per_hop, mesh.min(subscribers - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_is_a_queue_and_a_path_costs_both_latencies() {
        let link = Link {
            up: 1e6,
            down: 1e6,
            latency: 0.01,
        };
        let mut links = Links::new(vec![link; 3]);
        // 200 kB (within a stream's window) at 1 MB/s and 20 ms of path.
        let first = links.send(0, 1, 2e5, 0.0);
        assert!((first - 0.22).abs() < 1e-9, "{first}");
        // A second transfer from the same node waits for the first to leave its upload.
        let second = links.send(0, 2, 2e5, 0.0);
        assert!((second - 0.42).abs() < 1e-9, "{second}");
        // Spreading over more nodes takes more mesh hops.
        // A bulk transfer shares the sender's upload: a message sent meanwhile goes at half
        // the rate, and the bulk itself at half.
        let bulk = links.send_bulk(1, 2, 1e6, 1.0);
        assert!((bulk - 3.02).abs() < 1e-9, "{bulk}");
        let beside = links.send(1, 0, 2e5, 1.0);
        assert!((beside - 1.42).abs() < 1e-9, "{beside}");
        let (few, copies) = spread(300.0, 6, 6, &link);
        let (many, _) = spread(300.0, 4096, 6, &link);
        assert!(many > few && copies == 5);
    }

    #[test]
    fn a_message_beyond_the_window_waits_for_updates_behind_a_busy_upload() {
        let rate = 12.5e6;
        // Within the first window, or with an idle receiver and a short path: no wait.
        assert_eq!(flow_stalls(STREAM_WINDOW, rate, 0.0, 0.5), 0.0);
        assert!(flow_stalls(485e3, rate, 25e-6, 0.0) < 1e-9);
        // 485 kB needs more credit: the first update leaves the receiver after 128 KiB
        // (10.5 ms) and reaches the sender 40 ms later, while the sender ran out of credit
        // at 21 ms; the next one, sent 10.5 ms later, arrives as that credit runs out.
        let busy = flow_stalls(485e3, rate, 25e-6, 0.040);
        let half = STREAM_WINDOW / 2.0 / rate;
        assert!((busy - (0.040 - half)).abs() < 1e-3, "{busy}");
        // A long path is paid in round trips, fewer of them as the window grows.
        let far = flow_stalls(16e6, 1.25e9, 0.05, 0.0);
        assert!(far > 0.3 && far < 1.5, "{far}");
    }
}
