//! The daemon's logs: `tracing` events on stderr, filtered by `AGENTD_LOG`
//! (else `RUST_LOG`; `warn` when neither is set), with a span per run
//! (`run{run_id=…}`) and per model request (`request{n=… phase=…}`). Logs
//! are for operators; what a command shows its user (an answer, notices,
//! errors) is printed by the command, never through here.

use tracing_subscriber::EnvFilter;

/// Installs the subscriber once, at start.
pub(crate) fn init() {
    let spec = ["AGENTD_LOG", "RUST_LOG"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| "warn".into());
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|e| {
        eprintln!("agentd: AGENTD_LOG/RUST_LOG {spec:?} is not a log filter ({e}); using `warn`");
        EnvFilter::new("warn")
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
