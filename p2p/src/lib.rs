//! The libp2p layer of an iota-p2p node.
