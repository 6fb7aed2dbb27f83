//! `takeover-agent`, the program shepherd uploads to every machine: see
//! `shepherd_agent::program`. Built as a target of the shepherd package (so
//! its tests and benchmarks find it), it calls into the agent's crate only.

fn main() {
    shepherd_agent::program::main()
}
