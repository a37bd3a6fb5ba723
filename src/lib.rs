//! Workspace-level examples, benchmarks and integration tests live beside this file.
//!
//! The README's Rust snippets are compiled and run as doc tests from here, so the README cannot
//! drift from the API.

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeSnippets;

/// The Rust snippets of docs/npu-matmul-performance.md, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/npu-matmul-performance.md")]
pub struct PerformanceDocSnippets;
