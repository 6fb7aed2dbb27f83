//! Compiles proto/ with protox (pure Rust: no system protoc) and prost, and
//! rebuilds the crate when migrations/ changes.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // The migrations are embedded by refinery's macro, which cannot tell
    // cargo that a new file appeared: rebuild when the directory changes.
    println!("cargo:rerun-if-changed=migrations");
    let descriptors = protox::compile(
        ["agent.proto", "callback.proto", "bmaas_server.proto"],
        ["proto"],
    )?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
