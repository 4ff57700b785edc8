//! Modelled links and gossip.
//!
//! Each node has an upload and a download, each a first-come first-served queue at its rate,
//! and a one-way latency to the network's core; a transfer from `a` to `b` leaves `a`'s
//! upload when the bytes before it have, crosses both latencies, and lands when `b`'s
//! download has taken it (cut through: the download runs while the upload does). There is no
//! congestion inside the core and no TCP slow start: a long-lived libp2p connection is
//! assumed warm.
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

/// Every node's link and when its upload and download are next free.
#[derive(Debug, Clone)]
pub(crate) struct Links {
    links: Vec<Link>,
    up_free: Vec<f64>,
    down_free: Vec<f64>,
}

impl Links {
    /// Links that are all idle.
    pub(crate) fn new(links: Vec<Link>) -> Links {
        let n = links.len();
        Links {
            links,
            up_free: vec![0.0; n],
            down_free: vec![0.0; n],
        }
    }

    /// Node `i`'s link.
    pub(crate) fn link(&self, i: usize) -> Link {
        self.links[i]
    }

    /// Sends `bytes` from `a` to `b` at `now`; returns when the last byte has arrived.
    pub(crate) fn send(&mut self, a: usize, b: usize, bytes: f64, now: f64) -> f64 {
        let (la, lb) = (self.links[a], self.links[b]);
        let start = now.max(self.up_free[a]);
        let sent = start + bytes / la.up;
        self.up_free[a] = sent;
        let path = la.latency + lb.latency;
        let first = (start + path).max(self.down_free[b]);
        let landed = (first + bytes / lb.down).max(sent + path);
        self.down_free[b] = landed;
        landed
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
        // 1 MB at 1 MB/s and 20 ms of path.
        let first = links.send(0, 1, 1e6, 0.0);
        assert!((first - 1.02).abs() < 1e-9, "{first}");
        // A second transfer from the same node waits for the first to leave its upload.
        let second = links.send(0, 2, 1e6, 0.0);
        assert!((second - 2.02).abs() < 1e-9, "{second}");
        // Spreading over more nodes takes more mesh hops.
        let (few, copies) = spread(300.0, 6, 6, &link);
        let (many, _) = spread(300.0, 4096, 6, &link);
        assert!(many > few && copies == 5);
    }
}
