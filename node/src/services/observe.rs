//! The observe service: `/status` (from the other services' watch values), `/metrics` and the
//! dashboard at `/`. It reads what the others publish and changes nothing.

pub(crate) mod api;
pub(crate) mod http;
pub(crate) mod peers;
pub(crate) mod serve;
pub(crate) mod status;
