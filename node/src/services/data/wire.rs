//! The data service's messages: a request names what it wants by hash, a reply carries the
//! bytes or says it has none. Bodies are the pipeline's `tag, header, payload` layout
//! ([`crate::wire::messages`]).

use serde::{Deserialize, Serialize};

/// What a peer asks the data service for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum DataRequest {
    /// The manifest whose blake3 is this (hex).
    Manifest(String),
    /// The tokenizer whose blake3 is this (hex).
    Tokenizer(String),
    /// Chunk `index` of the shard whose blake3 is `shard` (hex), of the dataset `dataset`.
    Chunk {
        /// The dataset (manifest blake3, hex).
        dataset: String,
        /// The shard (blake3, hex).
        shard: String,
        /// Which chunk.
        index: u32,
    },
}

/// The data service's answer; on `Bytes` the payload is the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum DataReply {
    /// The bytes follow.
    Bytes,
    /// This node does not have it.
    Missing,
}
