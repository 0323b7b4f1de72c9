#![no_main]
//! Streaming entry point for the `llama4_pythonic` format: see ../common.rs.

#[path = "../common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::check(toolparse::Format::Llama4Pythonic, data));
