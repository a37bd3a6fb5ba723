#![allow(non_snake_case)] // the table keeps the C names, `rknn_B_normal_layout_to_native_layout` included

//! The function table: every matmul and memory function of the runtime as a function pointer.
//!
//! This table is the seam of the whole SDK. The real `librknnrt.so` fills it through `dlopen`
//! ([`RknnApi::load`]) or the linker ([`RknnApi::linked`], feature `link`); the emulator fills it
//! with its own `extern "C"` functions ([`RknnApi::from_functions`]). Everything above the table
//! runs the same code, with the same pointers and call order, whichever backend is underneath.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use crate::bindings::*;

/// Environment variable naming the runtime library to load instead of the default soname.
pub const RKNN_RUNTIME_PATH_ENV: &str = "RKNN_RUNTIME_PATH";

/// The soname [`RknnApi::load`] asks the dynamic loader for when `RKNN_RUNTIME_PATH` is unset.
pub const DEFAULT_RUNTIME_SONAME: &str = "librknnrt.so";

macro_rules! function_table {
    (
        required { $($req:ident: $req_ty:ident,)* }
        optional { $($opt:ident: $opt_ty:ident,)* }
        extension { $($ext:ident: $ext_ty:ident: $ext_doc:literal,)* }
    ) => {
        /// Every function of the runtime's matmul and memory API, by its C name.
        ///
        /// Required functions exist in every 2.x runtime. Optional ones are `None` when the loaded
        /// runtime does not export them; the exact release that introduced each is not documented
        /// publicly, so the loader treats them as optional instead of refusing an older runtime.
        ///
        /// Extensions are not part of Rockchip's API: functions that the emulator (and its
        /// drop-in library) adds. They are resolved when the loaded library exports them and are
        /// `None` with Rockchip's runtime and with link-time binding.
        #[derive(Clone, Copy, Debug)]
        pub struct RknnFunctions {
            $(
                #[doc = concat!("`", stringify!($req), "` (required).")]
                pub $req: $req_ty,
            )*
            $(
                #[doc = concat!("`", stringify!($opt), "` (optional: absent in some older 2.x runtimes).")]
                pub $opt: Option<$opt_ty>,
            )*
            $(
                #[doc = concat!("`", stringify!($ext), "`: ", $ext_doc)]
                pub $ext: Option<$ext_ty>,
            )*
        }

        impl RknnFunctions {
            /// Names of the symbols every runtime must export.
            pub const REQUIRED_SYMBOLS: &'static [&'static str] = &[$(stringify!($req),)*];
            /// Names of the symbols that may be missing.
            pub const OPTIONAL_SYMBOLS: &'static [&'static str] = &[$(stringify!($opt),)*];
            /// Names of the non-vendor extension symbols (exported by the emulator only).
            pub const EXTENSION_SYMBOLS: &'static [&'static str] = &[$(stringify!($ext),)*];

            /// Resolves every symbol from `lib`.
            ///
            /// # Safety
            /// `lib` must be an RKNN runtime whose exported symbols have the C signatures of
            /// this crate's bindings; nothing can check that from the symbol table.
            unsafe fn resolve(lib: &libloading::Library, path: &std::path::Path) -> Result<Self, LoadError> {
                Ok(Self {
                    $(
                        // SAFETY: the caller guarantees the symbol has this signature; the pointer
                        // is copied out and stays valid while `lib` is loaded, which `RknnApi`
                        // guarantees by owning the library next to the table.
                        $req: unsafe {
                            *lib.get::<$req_ty>(concat!(stringify!($req), "\0").as_bytes())
                                .map_err(|source| LoadError::MissingSymbol {
                                    path: path.to_path_buf(),
                                    symbol: stringify!($req),
                                    source,
                                })?
                        },
                    )*
                    $(
                        // SAFETY: as above.
                        $opt: unsafe {
                            lib.get::<$opt_ty>(concat!(stringify!($opt), "\0").as_bytes()).ok().map(|s| *s)
                        },
                    )*
                    $(
                        // SAFETY: as above; a library that exports an extension symbol is the
                        // emulator, which defines it with this signature.
                        $ext: unsafe {
                            lib.get::<$ext_ty>(concat!(stringify!($ext), "\0").as_bytes()).ok().map(|s| *s)
                        },
                    )*
                })
            }

            /// The table bound at link time to the `rknn_*` symbols of `-lrknnrt`.
            #[cfg(feature = "link")]
            fn linked() -> Self {
                Self {
                    $($req: crate::linked::$req,)*
                    $($opt: Some(crate::linked::$opt),)*
                    // Rockchip's librknnrt has no extension symbols to link against.
                    $($ext: None,)*
                }
            }

            /// Names of the optional symbols that this table lacks (extensions are not counted:
            /// Rockchip's runtime never has them).
            pub fn missing_optional(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $(if self.$opt.is_none() { missing.push(stringify!($opt)); })*
                missing
            }
        }
    };
}

function_table! {
    required {
        rknn_matmul_create: rknn_matmul_create_fn,
        rknn_matmul_set_io_mem: rknn_matmul_set_io_mem_fn,
        rknn_matmul_set_core_mask: rknn_matmul_set_core_mask_fn,
        rknn_matmul_run: rknn_matmul_run_fn,
        rknn_matmul_destroy: rknn_matmul_destroy_fn,
        rknn_create_mem: rknn_create_mem_fn,
        rknn_destroy_mem: rknn_destroy_mem_fn,
        rknn_query: rknn_query_fn,
    }
    optional {
        rknn_matmul_create_dynamic_shape: rknn_matmul_create_dynamic_shape_fn,
        rknn_matmul_set_dynamic_shape: rknn_matmul_set_dynamic_shape_fn,
        rknn_matmul_set_quant_params: rknn_matmul_set_quant_params_fn,
        rknn_matmul_get_quant_params: rknn_matmul_get_quant_params_fn,
        rknn_B_normal_layout_to_native_layout: rknn_B_normal_layout_to_native_layout_fn,
        rknn_create_mem2: rknn_create_mem2_fn,
        rknn_create_mem_from_fd: rknn_create_mem_from_fd_fn,
        rknn_create_mem_from_phys: rknn_create_mem_from_phys_fn,
        rknn_mem_sync: rknn_mem_sync_fn,
        rknn_set_core_mask: rknn_set_core_mask_fn,
    }
    extension {
        rknn_emu_last_error: rknn_emu_last_error_fn: "extension of the rknn-emu emulator, not in \
            Rockchip's runtime (`None` there). Returns the calling thread's last error message of \
            the emulator: NUL-terminated, valid until the calling thread's next call into the \
            emulator, an empty string when no call on this thread has failed. Messages are kept \
            after later successful calls, like `errno`: read it right after a call that failed. \
            Error details should come from this entry only, so that the code above the table \
            works the same with every backend.",
    }
}

/// Where a function table came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiOrigin {
    /// Loaded with `dlopen` from this path (or soname).
    Loaded(PathBuf),
    /// Bound by the linker (feature `link`).
    Linked,
    /// Filled by a Rust implementation, such as the emulator; the string names it.
    Implementation(&'static str),
}

impl fmt::Display for ApiOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiOrigin::Loaded(p) => write!(f, "loaded from {}", p.display()),
            ApiOrigin::Linked => f.write_str("linked at build time"),
            ApiOrigin::Implementation(name) => write!(f, "implemented by {name}"),
        }
    }
}

/// A runtime's function table, keeping the library it came from loaded as long as it lives.
pub struct RknnApi {
    functions: RknnFunctions,
    origin: ApiOrigin,
    // Dropped after `functions` is unreachable: the pointers above point into this library.
    _library: Option<libloading::Library>,
}

impl fmt::Debug for RknnApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RknnApi")
            .field("origin", &self.origin)
            .field("missing_optional", &self.functions.missing_optional())
            .finish()
    }
}

impl std::ops::Deref for RknnApi {
    type Target = RknnFunctions;
    fn deref(&self) -> &RknnFunctions {
        &self.functions
    }
}

impl RknnApi {
    /// Loads the runtime named by `RKNN_RUNTIME_PATH`, or `librknnrt.so` from the loader's
    /// search path when the variable is unset.
    ///
    /// # Safety
    /// Loading a shared library runs its initialisers, and the library's `rknn_*` symbols are
    /// trusted to have the C signatures of these bindings. Only load an RKNN runtime (Rockchip's
    /// or the emulator's drop-in library).
    pub unsafe fn load() -> Result<Self, LoadError> {
        match std::env::var_os(RKNN_RUNTIME_PATH_ENV) {
            Some(path) if !path.is_empty() => {
                // SAFETY: forwarded from the caller.
                unsafe { Self::load_path(PathBuf::from(path), true) }
            }
            // SAFETY: forwarded from the caller.
            _ => unsafe { Self::load_path(PathBuf::from(DEFAULT_RUNTIME_SONAME), false) },
        }
    }

    /// Loads the runtime from `path` (a file path, or a soname for the loader's search path).
    ///
    /// # Safety
    /// As for [`RknnApi::load`].
    pub unsafe fn load_from(path: impl Into<OsString>) -> Result<Self, LoadError> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::load_path(PathBuf::from(path.into()), false) }
    }

    unsafe fn load_path(path: PathBuf, from_env: bool) -> Result<Self, LoadError> {
        // SAFETY: the caller accepts running the library's initialisers.
        let library = unsafe { libloading::Library::new(&path) }.map_err(|source| {
            LoadError::LibraryNotFound {
                path: path.clone(),
                from_env,
                source,
            }
        })?;
        // SAFETY: the caller guarantees the library is an RKNN runtime.
        let functions = unsafe { RknnFunctions::resolve(&library, &path) }?;
        Ok(Self {
            functions,
            origin: ApiOrigin::Loaded(path),
            _library: Some(library),
        })
    }

    /// A table filled by a Rust implementation of the C API (the emulator's seam).
    ///
    /// # Safety
    ///
    /// Every function pointer in `functions` must implement the C contract of its entry: the
    /// signature of its binding and the behaviour Rockchip's runtime documents for that
    /// function, reading and writing only the memory the C API lets it touch given arguments
    /// valid under that contract. Code above the table calls the entries through safe-looking
    /// wrappers on exactly that assumption, so a pointer that breaks it is undefined behaviour
    /// there. The pointers must also stay valid for the table's life; pointers to `extern "C"`
    /// functions compiled into the program always are.
    pub unsafe fn from_functions(functions: RknnFunctions, name: &'static str) -> Self {
        Self {
            functions,
            origin: ApiOrigin::Implementation(name),
            _library: None,
        }
    }

    /// The table bound at link time to `librknnrt` (feature `link`).
    #[cfg(feature = "link")]
    pub fn linked() -> Self {
        Self {
            functions: RknnFunctions::linked(),
            origin: ApiOrigin::Linked,
            _library: None,
        }
    }

    /// Where this table came from.
    pub fn origin(&self) -> &ApiOrigin {
        &self.origin
    }

    /// The function pointers.
    pub fn functions(&self) -> &RknnFunctions {
        &self.functions
    }
}

/// Why a runtime could not be loaded.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// The dynamic loader could not open the library.
    LibraryNotFound {
        /// The path or soname that was tried.
        path: PathBuf,
        /// Whether the path came from `RKNN_RUNTIME_PATH`.
        from_env: bool,
        /// The loader's own error.
        source: libloading::Error,
    },
    /// The library lacks a symbol every 2.x runtime exports.
    MissingSymbol {
        /// The library that was opened.
        path: PathBuf,
        /// The C name of the missing function.
        symbol: &'static str,
        /// The loader's own error.
        source: libloading::Error,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::LibraryNotFound {
                path,
                from_env: true,
                source,
            } => write!(
                f,
                "could not load the RKNN runtime from {} (the path given by {RKNN_RUNTIME_PATH_ENV}): {source}",
                path.display()
            ),
            LoadError::LibraryNotFound {
                path,
                from_env: false,
                source,
            } => write!(
                f,
                "could not load the RKNN runtime {} (set {RKNN_RUNTIME_PATH_ENV} to the library's path \
                 to load another file): {source}",
                path.display()
            ),
            LoadError::MissingSymbol { path, symbol, .. } => write!(
                f,
                "{} is not a usable RKNN 2.x runtime: it does not export `{symbol}` \
                 (runtimes before 2.0 are not supported)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::LibraryNotFound { source, .. } | LoadError::MissingSymbol { source, .. } => {
                Some(source)
            }
        }
    }
}
