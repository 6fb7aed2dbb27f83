//! Compiles the .proto files beside this (the contract: CONTRACTS.md §1
//! and §4; boot.proto is §5, shepherd's own) with protox (pure Rust: no system protoc) and prost.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const FILES: [&str; 4] = [
        "agent.proto",
        "callback.proto",
        "bmaas_server.proto",
        "boot.proto",
    ];
    for f in FILES {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(FILES, ["."])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
