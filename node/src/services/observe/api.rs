//! What the rest of the node uses of the observe service: the HTTP server, the node's view it
//! reports, and the run statistics' types.

pub(crate) use super::http::serve;
pub(crate) use super::peers::run_peers;
pub(crate) use super::serve::HttpLimits;
pub(crate) use super::status::{EpochStats, NodeView, StatusSource};
