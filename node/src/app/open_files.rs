//! The node's open-file limit, and the connection budgets derived from it.
//!
//! Every p2p connection, every connection still in its handshake and every HTTP connection
//! holds a file descriptor, next to the node's own files (its data directory, checkpoints,
//! data shards, logs). A node that runs out of descriptors fails in odd places (an accept
//! loop that spins, a checkpoint that cannot be written), so at start it raises its soft
//! limit to the hard one ([`raise`]) and sizes its connection limits to fit what it got
//! ([`Budgets::for_open_files`], pure): [`RESERVED_FILES`] stay for the node's own files, and
//! the rest goes to p2p connections, pending handshakes and HTTP connections, each within a
//! floor and a ceiling. Streams are not descriptors (yamux multiplexes them on the
//! connection), so their cap and the request byte budgets stay the p2p layer's defaults; the
//! start logs every figure it chose.

/// Descriptors kept for the node's own files.
pub(crate) const RESERVED_FILES: u64 = 256;

/// Most p2p connections: a plan holds at most [`bootstrap::MAX_PLAN_MINERS`] (1 280) miners
/// and a node connects to about every other node of the run, so this leaves room for
/// validators and newcomers waiting for a place.
const MAX_P2P_CONNECTIONS: u64 = 2048;
/// Fewest p2p connections, whatever the limit: below this a run cannot form.
const MIN_P2P_CONNECTIONS: u64 = 16;
/// Most connections in their handshake (the p2p layer's default).
const MAX_PENDING_INCOMING: u64 = p2p::DEFAULT_MAX_PENDING_INCOMING as u64;
/// Most HTTP connections (what the observe service's defaults allow).
const MAX_HTTP_CONNECTIONS: u64 = 64;
/// Fewest pending handshakes and HTTP connections.
const MIN_SMALL: u64 = 4;

/// The soft limit is raised no higher than this, which is more than any budget here uses
/// (and what `setrlimit` refuses on some systems when the hard limit is "unlimited").
const MAX_OPEN_FILES: u64 = 1 << 20;

/// Connection limits that fit an open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budgets {
    /// The open-file limit they were derived from.
    pub(crate) open_files: u64,
    /// Established p2p connections, in all.
    pub(crate) p2p_connections: u32,
    /// p2p connections in their handshake.
    pub(crate) pending_incoming: u32,
    /// HTTP connections.
    pub(crate) http_connections: usize,
}

impl Budgets {
    /// The budgets that fit `open_files` descriptors; see the module documentation.
    pub(crate) fn for_open_files(open_files: u64) -> Budgets {
        let spare = open_files.saturating_sub(RESERVED_FILES);
        let http = (spare / 16).clamp(MIN_SMALL, MAX_HTTP_CONNECTIONS);
        let pending = (spare / 16).clamp(MIN_SMALL, MAX_PENDING_INCOMING);
        let p2p = spare
            .saturating_sub(http + pending)
            .clamp(MIN_P2P_CONNECTIONS, MAX_P2P_CONNECTIONS);
        Budgets {
            open_files,
            p2p_connections: u32::try_from(p2p).unwrap_or(u32::MAX),
            pending_incoming: u32::try_from(pending).unwrap_or(u32::MAX),
            http_connections: usize::try_from(http).unwrap_or(usize::MAX),
        }
    }

    /// Whether the limit is below what the floors need (the node runs, but may run out of
    /// descriptors under load).
    pub(crate) fn tight(&self) -> bool {
        let needed = RESERVED_FILES
            + u64::from(self.p2p_connections)
            + u64::from(self.pending_incoming)
            + self.http_connections as u64;
        self.open_files < needed
    }
}

/// The open-file limit before and after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raised {
    /// The soft limit the node started with.
    pub(crate) was: u64,
    /// The soft limit now.
    pub(crate) now: u64,
}

/// Why the limit could not be read or raised.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RaiseError {
    /// `getrlimit(RLIMIT_NOFILE)` failed.
    #[error("reading the open-file limit: {0}")]
    Read(#[source] nix::Error),
    /// `setrlimit(RLIMIT_NOFILE)` refused the hard limit.
    #[error("raising the open-file limit from {was} to {wanted}: {source}")]
    Raise {
        /// The soft limit, unchanged.
        was: u64,
        /// What was asked for.
        wanted: u64,
        /// The system's refusal.
        #[source]
        source: nix::Error,
    },
}

/// Raises the soft open-file limit to the hard one (at most [`MAX_OPEN_FILES`]).
pub(crate) fn raise() -> Result<Raised, RaiseError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(RaiseError::Read)?;
    let (was, hard): (u64, u64) = (soft, hard);
    let wanted = hard.min(MAX_OPEN_FILES);
    if was >= wanted {
        return Ok(Raised { was, now: was });
    }
    setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).map_err(|source| RaiseError::Raise {
        was,
        wanted,
        source,
    })?;
    Ok(Raised { was, now: wanted })
}

/// Raises the limit, derives the budgets from what it got, and logs both.
pub(crate) fn raise_and_derive() -> Budgets {
    let open_files = match raise() {
        Ok(raised) => {
            if raised.now > raised.was {
                tracing::info!(was = raised.was, now = raised.now, "open-file limit raised");
            }
            raised.now
        }
        Err(error @ RaiseError::Raise { was, .. }) => {
            tracing::warn!(%error, "open-file limit not raised");
            was
        }
        Err(error) => {
            tracing::warn!(%error, "open-file limit unknown; budgeting for 1024");
            1024
        }
    };
    let budgets = Budgets::for_open_files(open_files);
    if budgets.tight() {
        tracing::warn!(
            open_files,
            "the open-file limit is below what the smallest budgets need; raise it (ulimit -n)"
        );
    }
    budgets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_fill_what_the_limit_leaves_within_their_bounds() {
        // The usual default soft limit.
        let common = Budgets::for_open_files(1024);
        assert_eq!(
            (
                common.p2p_connections,
                common.pending_incoming,
                common.http_connections
            ),
            (672, 48, 48)
        );
        assert!(!common.tight());
        // A raised limit: every budget at its ceiling.
        let raised = Budgets::for_open_files(1 << 20);
        assert_eq!(
            (
                raised.p2p_connections,
                raised.pending_incoming,
                raised.http_connections
            ),
            (2048, 64, 64)
        );
        // Every miner a plan can hold, and room for validators and newcomers.
        assert!(raised.p2p_connections as usize >= bootstrap::MAX_PLAN_MINERS + 256);
        // A limit that leaves nothing spare: the floors, and a warning.
        let tiny = Budgets::for_open_files(256);
        assert_eq!(
            (
                tiny.p2p_connections,
                tiny.pending_incoming,
                tiny.http_connections
            ),
            (16, 4, 4)
        );
        assert!(tiny.tight());
        assert!(Budgets::for_open_files(0).tight());
    }

    #[test]
    fn the_budgets_never_ask_for_more_descriptors_than_a_roomy_limit_has() {
        for open_files in [300, 400, 512, 1000, 1024, 2048, 4096, 65_536, u64::MAX] {
            let b = Budgets::for_open_files(open_files);
            let used = RESERVED_FILES
                + u64::from(b.p2p_connections)
                + u64::from(b.pending_incoming)
                + b.http_connections as u64;
            assert!(
                b.tight() || used <= open_files,
                "{open_files}: {b:?} uses {used}"
            );
            assert!(b.p2p_connections >= 16 && u64::from(b.p2p_connections) <= MAX_P2P_CONNECTIONS);
        }
    }

    #[test]
    fn raising_leaves_the_soft_limit_at_least_where_it_was() {
        let raised = raise().expect("the open-file limit is readable on this system");
        assert!(raised.now >= raised.was);
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, raised.now);
    }
}
