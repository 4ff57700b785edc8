//! CLASP attribution: which miners help or harm the loss, from the pathways of samples.
//!
//! Pure maths, no IO. Filled in by the validator work; the crate exists so the workspace
//! layout is the one the design describes.
