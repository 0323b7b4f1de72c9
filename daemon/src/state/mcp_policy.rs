//! The `mcp` module's policies (docs/mcp.md "Governance"),
//! declared like every other module's in `policy`: calls per server and
//! run, the per-call timeout, the result size cap and the servers' start
//! timeout, with the composition check, made when servers are configured,
//! that a call must fit the research share of the run deadline. `tools::mcp` enforces them.

use super::policy::{p, Policies, Policy, Unit, DEADLINE, RESEARCH_SHARE};
use anyhow::{bail, Result};

/// Calls one MCP server may receive in one run.
pub(crate) const CALLS: &str = "mcp/calls-per-server-per-run";
/// How long one call may take before it fails.
pub(crate) const CALL_TIMEOUT: &str = "mcp/call-timeout";
/// The most characters of a result the model sees (the rest is cut, with a marker).
pub(crate) const RESULT_SIZE: &str = "mcp/result-size";
/// How long a server may take to start and list its tools.
pub(crate) const START_TIMEOUT: &str = "mcp/server-start-timeout";

/// The `mcp` module's declarations.
pub(crate) fn declarations() -> Vec<Policy> {
    let o = "mcp";
    let v = "mcp-policy@1";
    vec![
        p(CALLS, o, v, Unit::Calls, 32, 512, None),
        p(CALL_TIMEOUT, o, v, Unit::Seconds, 60, 3600, None),
        p(RESULT_SIZE, o, v, Unit::Characters, 16_000, 1_000_000, None),
        p(START_TIMEOUT, o, v, Unit::Seconds, 30, 600, None),
    ]
}

/// The module's own bounds (checked with every composition).
pub(crate) fn check(ps: &Policies) -> Result<()> {
    if ps.get(CALL_TIMEOUT) < 1 || ps.get(START_TIMEOUT) < 1 {
        bail!("{CALL_TIMEOUT} and {START_TIMEOUT} must each be at least 1 s");
    }
    Ok(())
}

/// Composition when MCP servers are configured (checked before they
/// start): a call must be able to finish within the research share of the
/// run deadline.
pub(crate) fn check_with_servers(ps: &Policies) -> Result<()> {
    let g = |id| ps.get(id);
    let research = g(DEADLINE) * g(RESEARCH_SHARE) / 100;
    if g(CALL_TIMEOUT) > research {
        bail!(
            "{CALL_TIMEOUT} = {} s does not fit the research share of the run deadline ({DEADLINE} = {} s × {RESEARCH_SHARE} = {} % = {} s): one MCP call could outlive research; lower {CALL_TIMEOUT} or raise {DEADLINE}",
            g(CALL_TIMEOUT), g(DEADLINE), g(RESEARCH_SHARE), research
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_timeout_beyond_the_research_share_is_refused_naming_both() {
        let mut ps = Policies::from_snapshot(&serde_json::json!({})).unwrap();
        ps.check().unwrap();
        // 1800 s × 80 % = 1440 s of research.
        ps.values.insert(CALL_TIMEOUT.into(), 1441);
        ps.check().unwrap();
        let e = check_with_servers(&ps).unwrap_err().to_string();
        for n in [CALL_TIMEOUT, DEADLINE, RESEARCH_SHARE, "1440"] {
            assert!(e.contains(n), "{e}");
        }
        ps.values.insert(CALL_TIMEOUT.into(), 1440);
        check_with_servers(&ps).unwrap();
        assert!(ps.describe().iter().any(|p| p["id"] == CALLS && p["owner"] == "mcp"));
    }
}
