#![no_main]
//! Streaming entry point for the `glm45` format: see ../common.rs.

#[path = "../common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::check(toolparse::Format::Glm45, data));
