//! What the probe examples share, by what it is: the command-line flags (`flags`), the cases,
//! their operands and the checking of their results (`cases`), the report of the figures:
//! reference figures, table and JSON (`report`), and the SVG plot (`plot`); and `run`, the
//! probes' exit on an error or a wrong result.

pub mod cases;
pub mod flags;
pub mod plot;
pub mod report;

/// Runs `main`, printing an error with `Display` (not `Debug`) and exiting non-zero.
pub fn run(
    name: &str,
    main: impl FnOnce() -> Result<bool, Box<dyn std::error::Error>>,
) -> std::process::ExitCode {
    match main() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("{name}: a result differed from the host reference (see the table)");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
