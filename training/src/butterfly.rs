//! Butterfly all-reduce: partition plan, averaging and verification of stage replicas.
