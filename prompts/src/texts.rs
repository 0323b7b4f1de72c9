//! The prompt texts, kept as files beside the crate (`texts/`).

/// System message of research turns: the research strategy.
pub const RESEARCH_SYSTEM: &str = include_str!("../texts/research_system.md");
/// System message of the reserved final turn (research strategy dropped).
pub const FINAL_SYSTEM: &str = include_str!("../texts/final_system.md");
/// The request that closes the final turn's history.
pub const FINAL_USER: &str = include_str!("../texts/final_user.md");
/// The correction request after an answer cites unread sources;
/// `{invalid}` and `{read}` are replaced.
pub const CORRECTION_USER: &str = include_str!("../texts/correction_user.md");
/// System message of a section worker (one section of a long source).
pub const SECTION_SYSTEM: &str = include_str!("../texts/section_system.md");
/// A section worker's request; `{question}`, `{focus}`, `{source}`,
/// `{section}`, `{sections}` and `{text}` are replaced.
pub const SECTION_USER: &str = include_str!("../texts/section_user.md");
