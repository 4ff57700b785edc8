//! Keeps libtorch (and through it libtorch_cuda) a real dependency of every binary of this
//! package: rustc links shared libraries `--as-needed`, and libtorch_cuda is only reached
//! through static initialisers, so without this CUDA silently drops out on GPU machines.

fn main() {
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
}
