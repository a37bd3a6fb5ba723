//! rknn-emu: the RKNN runtime's matmul and memory API implemented in Rust. (Work in progress.)
pub mod kernels;
