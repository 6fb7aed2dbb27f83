//! Compiles the project's proto/ with protox (pure Rust: no system protoc)
//! and prost. The service reads these types through this crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto");
    let descriptors = protox::compile(
        ["agent.proto", "callback.proto", "bmaas_server.proto"],
        ["../proto"],
    )?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
