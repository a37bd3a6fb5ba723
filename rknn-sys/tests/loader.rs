//! The loader's error paths. Loading a real library through the loader is tested by the
//! emulator's drop-in crate (`rknn-emu-dropin/tests/loader.rs`), which builds one.

use rknn_sys::{LoadError, RknnApi};

#[test]
fn a_missing_library_names_the_path_and_the_variable() {
    // SAFETY: the path does not exist, so nothing is loaded.
    let err = unsafe { RknnApi::load_from("/nonexistent/librknnrt.so") }.unwrap_err();
    assert!(
        matches!(err, LoadError::LibraryNotFound { ref path, .. } if path.ends_with("librknnrt.so"))
    );
    let msg = err.to_string();
    assert!(msg.contains("/nonexistent/librknnrt.so"), "{msg}");
    assert!(msg.contains("RKNN_RUNTIME_PATH"), "{msg}");
}

#[test]
fn a_library_without_the_symbols_is_refused_by_name() {
    // libc is loaded in every process and exports no rknn_* symbol.
    // SAFETY: libc's initialisers already ran; no symbol is called.
    let err = unsafe { RknnApi::load_from("libc.so.6") }.unwrap_err();
    match &err {
        LoadError::MissingSymbol { symbol, .. } => assert_eq!(*symbol, "rknn_matmul_create"),
        other => panic!("expected MissingSymbol, got {other}"),
    }
    assert!(err.to_string().contains("rknn_matmul_create"));
}
