//! The run's training data: the corpus embedded in the binary, or a dataset of token shards
//! named by the run's configuration, which peers serve each other.
//!
//! A node started with `--data <dir>` holding the run's dataset serves its manifest, its
//! tokenizer and its shards, in chunks, to anyone who asks (under the router's per-peer
//! request budget) and says so in its heartbeats. A node without it learns the manifest
//! from such a peer, checks it against the run's hash, and fetches the shards its samples
//! need as they come up: every chunk is checked against the manifest's chunk hash as it
//! arrives and the whole shard against its blake3 before it is used; a peer that serves
//! bytes that do not match is named in the log, counted, and not asked for that shard again.
//! Fetched shards are cached under the node's data directory within `--data-cache-gb`, the
//! least recently used evicted first.
//!
//! * [`api`]: the handle miners and validators draw samples through, and the settings.
//! * `wire`: the request and reply of the data service, pure.
//! * `fetch`: finding servers and fetching a shard, checked chunk by chunk.

pub(crate) mod api;
mod fetch;
mod wire;
