//! A run's budget (docs/budgets.md "Reserve finalization at admission"): the
//! limits of its admission snapshot and what it has spent. Research may
//! spend the total allowance less the finalization reserve, and only within
//! its share of the run deadline; the final turn and its one correction
//! spend the reserve, within the hard deadline. Requests and time are
//! checked together; a refusal is the run's own (`local_budget_exhausted`).

use crate::events::Phase;
use crate::events::{RunError, Stop};
use crate::provider::Refused;
use crate::state::policy::{self, Policies};
use crate::state::store::Usage;
use std::time::{Duration, Instant};

/// Run time: what earlier processes spent, plus this one's since it took
/// the run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    before: Duration,
    started: Instant,
}

impl Clock {
    pub(super) fn elapsed(&self) -> Duration {
        self.before + self.started.elapsed()
    }
}

/// A run's budget: the admission snapshot's limits and what was spent.
#[derive(Debug, Clone)]
pub(super) struct Budget {
    pub(super) rounds: usize,
    total: usize,
    reserve: usize,
    deadline: Duration,
    research_share: Duration,
    pub(super) turn_tokens: usize,
    /// Requests in the ledger from the research allowance.
    research_used: usize,
    /// Requests in the ledger from the reserve (final and correction).
    reserve_used: usize,
    /// Section-worker requests the run may send (`research/section-requests`);
    /// each also spends the research allowance.
    pub(super) sections: usize,
    /// Section-worker requests in the ledger.
    section_used: usize,
    /// The section limit cut an analysis short: research ends (docs/budgets.md
    /// "Section analysis spends research, never the reserve").
    pub(super) sections_cut: bool,
    /// Section size, worker output tokens, workers at once.
    pub(super) section_limits: super::sections::Limits,
    /// Segments host-led entry research reads (`research/entry-reads`).
    pub(super) entry_reads: usize,
    /// Tokens a composed answer's request may show (`research/composed-view-tokens`).
    pub(super) composed_view: usize,
    clock: Clock,
}

impl Budget {
    /// A fresh budget under `p`, its clock starting now.
    pub(super) fn from_policies(p: &Policies) -> Budget {
        let deadline = Duration::from_secs(p.get(policy::DEADLINE) as u64);
        Budget {
            rounds: p.get(policy::ROUNDS) as usize,
            total: p.get(policy::TOTAL_REQUESTS) as usize,
            reserve: p.get(policy::RESERVE) as usize,
            deadline,
            research_share: deadline * p.get(policy::RESEARCH_SHARE) as u32 / 100,
            turn_tokens: p.get(policy::TURN_TOKENS) as usize,
            research_used: 0,
            reserve_used: 0,
            sections: p.get(policy::SECTION_REQUESTS) as usize,
            section_used: 0,
            sections_cut: false,
            section_limits: super::sections::Limits::from_policies(p),
            entry_reads: p.get(policy::ENTRY_READS) as usize,
            composed_view: p.get(policy::COMPOSED_VIEW) as usize,
            clock: Clock { before: Duration::ZERO, started: Instant::now() },
        }
    }

    /// The budget of a recovered run: its snapshot's limits, what its
    /// ledger says it spent and the run time earlier processes used — never
    /// a fresh allowance.
    pub(super) fn recovered(p: &Policies, used: Usage, elapsed_before: Duration) -> Budget {
        let mut b = Budget::from_policies(p);
        b.research_used = used.research;
        b.reserve_used = used.reserve;
        b.section_used = used.section;
        b.clock.before = elapsed_before;
        b
    }

    pub(super) fn clock(&self) -> Clock {
        self.clock
    }

    pub(super) fn elapsed(&self) -> Duration {
        self.clock.elapsed()
    }

    /// Requests admitted so far, both allowances.
    pub(super) fn requests(&self) -> usize {
        self.research_used + self.reserve_used
    }

    /// Section-worker requests still allowed: by the section limit and by
    /// the research allowance (never the reserve).
    pub(super) fn sections_left(&self) -> usize {
        if self.research_open().is_err() {
            return 0;
        }
        let research_left = self.total - self.reserve - self.research_used;
        self.sections.saturating_sub(self.section_used).min(research_left)
    }

    /// The research share of the run deadline is spent.
    pub(super) fn research_time_spent(&self) -> bool {
        self.elapsed() >= self.research_share
    }

    /// Research may continue: requests and time checked together.
    pub(super) fn research_open(&self) -> Result<(), Stop> {
        if self.research_used >= self.total - self.reserve {
            return Err(Stop::Budget);
        }
        if self.research_time_spent() {
            return Err(Stop::Deadline);
        }
        Ok(())
    }

    /// Admits one request of `phase`, spending from its allowance.
    pub(super) fn admit(&mut self, phase: Phase) -> Result<(), Refused> {
        match phase {
            Phase::Research => {
                self.research_open().map_err(|_| Refused)?;
                self.research_used += 1;
            }
            Phase::Section => {
                if self.sections_left() == 0 {
                    return Err(Refused);
                }
                self.research_used += 1;
                self.section_used += 1;
            }
            Phase::Final | Phase::Correction => {
                if self.reserve_used >= self.reserve || self.elapsed() >= self.deadline {
                    return Err(Refused);
                }
                self.reserve_used += 1;
            }
        }
        Ok(())
    }

    /// What the ledger says of a refused request.
    pub(super) fn refusal(&self) -> String {
        format!(
            "not sent: research used {} of {}, sections {} of {}, reserve used {} of {}, {:.0} s of {:.0} s",
            self.research_used,
            self.total - self.reserve,
            self.section_used,
            self.sections,
            self.reserve_used,
            self.reserve,
            self.elapsed().as_secs_f64(),
            self.deadline.as_secs_f64()
        )
    }

    /// The run's error when its own allowance left no request for the answer.
    pub(super) fn exhausted(&self) -> RunError {
        RunError::new(
            "PROVIDER_CALL_BUDGET_EXCEEDED",
            "local_budget_exhausted",
            format!(
                "this run's own request allowance is spent ({} research of {}, {} final of {}); the provider was not asked",
                self.research_used,
                self.total - self.reserve,
                self.reserve_used,
                self.reserve
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn section_workers_spend_research_within_their_own_limit() {
        let mut p = Policies::from_snapshot(&json!({})).unwrap();
        p.values.insert(policy::TOTAL_REQUESTS.into(), 6);
        p.values.insert(policy::SECTION_REQUESTS.into(), 2);
        let mut b = Budget::from_policies(&p);
        assert_eq!(b.sections_left(), 2);
        assert_eq!(b.admit(Phase::Section), Ok(()));
        assert_eq!(b.admit(Phase::Section), Ok(()));
        assert_eq!(b.admit(Phase::Section), Err(Refused), "the section limit");
        assert_eq!(b.admit(Phase::Research), Ok(()));
        assert_eq!(b.admit(Phase::Research), Ok(()));
        assert_eq!(b.admit(Phase::Research), Err(Refused), "sections spent research");
        assert_eq!(b.admit(Phase::Final), Ok(()), "never the reserve");
        let r =
            Budget::recovered(&p, Usage { research: 2, reserve: 0, section: 2 }, Duration::ZERO);
        assert_eq!(r.sections_left(), 0, "a resumed run keeps its spent sections");
    }

    #[test]
    fn research_never_spends_the_reserve() {
        let mut p = Policies::from_snapshot(&json!({})).unwrap();
        p.values.insert(policy::TOTAL_REQUESTS.into(), 4);
        let mut b = Budget::from_policies(&p);
        assert_eq!(b.admit(Phase::Research), Ok(()));
        assert_eq!(b.admit(Phase::Research), Ok(()));
        assert_eq!(b.admit(Phase::Research), Err(Refused), "two of four are the reserve");
        assert_eq!(b.research_open(), Err(Stop::Budget));
        assert_eq!(b.admit(Phase::Final), Ok(()));
        assert_eq!(b.admit(Phase::Correction), Ok(()));
        assert_eq!(b.admit(Phase::Final), Err(Refused));
        assert_eq!(b.requests(), 4);
        let r = Budget::recovered(
            &p,
            Usage { research: 2, reserve: 1, section: 0 },
            Duration::from_secs(3),
        );
        assert_eq!(r.requests(), 3);
        assert!(r.elapsed() >= Duration::from_secs(3));
    }
}
