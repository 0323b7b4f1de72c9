#![no_main]
//! Streaming entry point for the `kimi_k2` format: see ../common.rs.

#[path = "../common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::check(toolparse::Format::KimiK2, data));
