#![no_main]
//! Streaming entry point for the `deepseek_v41` format: see ../common.rs.

#[path = "../common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::check(toolparse::Format::DeepSeekV41, data));
