#![no_main]
//! Streaming entry point for the `qwen3_xml` format: see ../common.rs.

#[path = "../common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::check(toolparse::Format::Qwen3Xml, data));
