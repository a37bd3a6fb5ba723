//! The key of a cache file: everything its converted weights depend on, as `field=value`
//! lines, compared field by field so that a mismatch names what changed.

use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use super::super::npu::EngineOptions;
use crate::gguf::GgufFile;

/// The layout of the cache file and of the converted weights in it. Changing either changes
/// this.
pub const LAYOUT_VERSION: u32 = 2;

/// The version of the converting code (the crate's, and its conversion's): a build that
/// converts differently never reads another's files. (Conversion 2: int4 weights' scales are
/// searched, no longer max-abs; 3: per-group int4 only for the GGUF's 4-bit tensors.)
pub const CONVERTER: &str = concat!("rknn-llm ", env!("CARGO_PKG_VERSION"), ", conversion 3");

/// The key's fields, in order.
pub(super) struct Key {
    pub(super) fields: Vec<(&'static str, String)>,
}

impl Key {
    /// The key of `file` (opened from `path`) converted with `opts` for `chip`.
    pub(super) fn new(
        path: &Path,
        file: &GgufFile,
        chip: &str,
        opts: &EngineOptions,
    ) -> std::io::Result<Key> {
        let meta = std::fs::metadata(path)?;
        let mtime = meta
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::fs::canonicalize(path)?;
        Ok(Key {
            fields: vec![
                ("layout", LAYOUT_VERSION.to_string()),
                ("converter", CONVERTER.to_owned()),
                ("gguf", path.display().to_string()),
                ("gguf bytes", meta.len().to_string()),
                ("gguf mtime ns", mtime.to_string()),
                (
                    "gguf header and tensor directory xxh3",
                    format!("{:016x}", xxh3_64(file.header_bytes())),
                ),
                ("chip", chip.to_owned()),
                ("weight format", opts.format.name().to_owned()),
                ("rotation", opts.rotate.to_string()),
                ("rotation seed", opts.seed.to_string()),
                ("residual", format!("{:?}", opts.residual)),
                (
                    "int4 group",
                    opts.int4_group.map_or("none".into(), |g| g.to_string()),
                ),
            ],
        })
    }

    /// The key as stored.
    pub(super) fn text(&self) -> String {
        self.fields
            .iter()
            .map(|(f, v)| format!("{f}={v}\n"))
            .collect()
    }

    /// What names the cache file: the GGUF's path and the settings, not the file's state, so
    /// that a changed GGUF finds its old entry, reports it stale and replaces it.
    pub(super) fn name_hash(&self) -> u64 {
        let stable: String = self
            .fields
            .iter()
            .filter(|(f, _)| !f.starts_with("gguf ") && *f != "layout" && *f != "converter")
            .map(|(f, v)| format!("{f}={v}\n"))
            .collect();
        xxh3_64(stable.as_bytes())
    }
}

/// The first field in which the key `found` in a file differs from `expected`, in words.
pub(super) fn difference(expected: &str, found: &str) -> String {
    let split = |s: &'_ str| -> Vec<(String, String)> {
        s.lines()
            .map(|l| match l.split_once('=') {
                Some((f, v)) => (f.to_owned(), v.to_owned()),
                None => (l.to_owned(), String::new()),
            })
            .collect()
    };
    let (e, f) = (split(expected), split(found));
    for (i, (field, want)) in e.iter().enumerate() {
        match f.get(i) {
            Some((ff, got)) if ff == field && got == want => continue,
            Some((ff, got)) if ff == field => {
                return format!("its {field} is {got}, now {want}");
            }
            _ => return format!("its key has no {field}"),
        }
    }
    "its key has more fields than this build writes".into()
}
