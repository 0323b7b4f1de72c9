//! Shared helpers for the benchmarks (inputs and fixtures).
