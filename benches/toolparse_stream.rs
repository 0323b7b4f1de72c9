//! Placeholder until the streaming benchmark lands.
fn main() {}
