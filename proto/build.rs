//! Compiles the .proto files beside this (the contract: CONTRACTS.md §1
//! and §4) with protox (pure Rust: no system protoc) and prost.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const FILES: [&str; 3] = ["agent.proto", "callback.proto", "bmaas_server.proto"];
    for f in FILES {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(FILES, ["."])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
