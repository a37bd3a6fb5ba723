//! Workspace-level examples, benchmarks and integration tests live beside this file.
