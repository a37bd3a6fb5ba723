//! `--weight-cache-list` and `--weight-cache-clear`: the converted-weight cache's files.

use super::{Args, Error};

/// `--weight-cache-list` and `--weight-cache-clear`.
pub(crate) fn run(args: &Args) -> Result<(), Error> {
    let Some(cache) = args.load.weight_cache()? else {
        return Err(
            "no weight cache (--no-weight-cache, or no home directory: give --weight-cache DIR)"
                .into(),
        );
    };
    if args.weight_cache_clear {
        let (files, bytes) = cache.clear()?;
        println!(
            "removed {files} file(s), {:.1} MiB, from {}",
            bytes as f64 / (1u64 << 20) as f64,
            cache.dir().display()
        );
        return Ok(());
    }
    let entries = cache.entries()?;
    let total: u64 = entries.iter().map(|e| e.bytes).sum();
    println!(
        "{}: {} file(s), {:.1} of {:.1} GiB (least recently used first)",
        cache.dir().display(),
        entries.len(),
        total as f64 / (1u64 << 30) as f64,
        cache.cap() as f64 / (1u64 << 30) as f64
    );
    for e in entries {
        let what = match &e.key {
            Ok(key) => key
                .lines()
                .filter(|l| {
                    ["gguf=", "chip=", "weight format=", "rotation seed="]
                        .iter()
                        .any(|p| l.starts_with(p))
                })
                .collect::<Vec<_>>()
                .join(", "),
            Err(why) => format!("unusable: {why}"),
        };
        let age = e.used.elapsed().map_or(0, |d| d.as_secs());
        println!(
            "{:>9.1} MiB  used {age} s ago  {}  ({what})",
            e.bytes as f64 / (1u64 << 20) as f64,
            e.path.display()
        );
    }
    Ok(())
}
