//! Rebuilds the crate when migrations/ changes. (The protobuf types are
//! generated in the protocol's crate, `proto/build.rs`.)

fn main() {
    // The migrations are embedded by refinery's macro, which cannot tell
    // cargo that a new file appeared: rebuild when the directory changes.
    println!("cargo:rerun-if-changed=migrations");
}
