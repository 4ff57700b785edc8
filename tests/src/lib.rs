//! Multi-node tests of iota-p2p: nodes on 127.0.0.1 ports, driven through the binary.
