//! The `agentd` binary: the command line of the `agentd` library.

fn main() -> std::process::ExitCode {
    agentd::main()
}
