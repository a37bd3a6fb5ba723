//! Command-line tools of rknpu-rs. The binaries are the product; this library holds what they
//! share.
//!
//! * `rknn-info`: the backend, chip, NPU cores, runtime and driver versions, file-descriptor
//!   limits, NPU lock state and the matmul capability table, as text or JSON.
//! * `rknn-conformance`: the emulator's facts checked against a runtime, side by side on the
//!   same inputs ([`conformance`]).

use std::io::Write;

pub mod conformance;

/// Writes `text` to stdout, treating a closed pipe (`rknn-info | head`) as the end of output
/// rather than an error: returns `false` when the reader has gone.
pub fn print_out(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => false,
        Err(e) => {
            eprintln!("cannot write to stdout: {e}");
            false
        }
    }
}
