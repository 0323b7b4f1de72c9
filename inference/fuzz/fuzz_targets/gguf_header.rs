//! GGUF header parsing never panics and never allocates by the file's
//! claims: any bytes give a header or a typed error.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let _ = inference::gguf::Header::parse(&mut r, data.len() as u64);
});
