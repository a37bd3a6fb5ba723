//! The safe layer: RAII objects over the result layer, each owning an `Arc` of what it needs
//! (a context of its runtime, a memory of its context), so any drop order is right.
//!
//! Bottom up: [`runtime`] (the backend, the chip, the guards held for its life, the errors a
//! `Drop` could not return), [`context`] (the owner of one raw matmul context), [`mem`]
//! (`TensorMem`), [`matmul`] (`Matmul`, its builder and runs), [`capability`] (what the chip
//! can multiply), and the field-hazard guards ([`guard`]).

pub(crate) mod capability;
pub(crate) mod context;
pub mod guard;
pub(crate) mod matmul;
pub(crate) mod mem;
pub(crate) mod runtime;
