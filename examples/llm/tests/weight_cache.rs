//! The converted-weight cache: a cached load gives logits bit-identical to a converting load;
//! a file that does not match what would be made now (any field of its header, its directory,
//! its trailer, any linear's bytes, a truncation anywhere) is reported in one line and rebuilt,
//! never used; an unwritable directory degrades to converting; the size cap removes the least
//! recently used files.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::weight_cache::Invalid;
use rknn_llm::model::{
    CacheOutcome, CacheType, EngineFactory, EngineOptions, Logits, Model, WeightCache,
};
use rknn_matmul::engine::{Engine, EngineConfig};
use rknn_matmul::{Platform, Runtime};

fn pool() -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    )
}

fn engine() -> Engine {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    Engine::new(&rt, EngineConfig::default()).unwrap()
}

/// A fresh directory for one test, with a copy of the tiny model `name`.
fn workdir(test: &str, name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("rknn-llm-wcache-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join(format!("{name}.gguf"));
    std::fs::copy(common::fixtures().join(format!("llm/{name}.gguf")), &gguf).unwrap();
    (dir, gguf)
}

/// The logits of every position of a short prompt, as bits.
fn logits(model: &Model) -> Vec<u32> {
    let mut seq = model.sequence(CacheType::F32);
    let n = model.config().n_vocab as u32;
    let tokens: Vec<u32> = (0..6).map(|i| (i * 37 + 1) % n).collect();
    let out = model.forward(&mut seq, &tokens, 0, Logits::All).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

fn load(gguf: &Path, cache: &WeightCache, opts: EngineOptions) -> (Model, CacheOutcome) {
    let file = GgufFile::open(gguf).unwrap();
    Model::load_cached(gguf, &file, engine(), opts, cache, pool(), &mut |_, _| {}).unwrap()
}

/// The converting load without any cache: the reference.
fn converting(gguf: &Path, opts: EngineOptions) -> Vec<u32> {
    let file = GgufFile::open(gguf).unwrap();
    let mut f = EngineFactory::new(engine(), opts);
    logits(&Model::load(&file, &mut f, pool(), &mut |_, _| {}).unwrap())
}

fn cache_file(outcome: &CacheOutcome) -> PathBuf {
    match outcome {
        CacheOutcome::Written(p) | CacheOutcome::Hit(p) => p.clone(),
        CacheOutcome::Rebuilt { path, .. } => path.clone(),
        other => panic!("expected a cache file, got {other:?}"),
    }
}

#[test]
fn a_cached_load_reads_what_the_first_wrote_and_gives_identical_logits() {
    // Tied (qwen2: the output head is the embedding) and untied (llama) models, both formats.
    for (name, format) in [
        ("tiny-llama", rknn_matmul::engine::WeightFormat::W8A8),
        ("tiny-qwen2", rknn_matmul::engine::WeightFormat::W8A8),
        ("tiny-gemma3", rknn_matmul::engine::WeightFormat::F16),
    ] {
        let (dir, gguf) = workdir(&format!("identical-{name}"), name);
        let opts = EngineOptions {
            format,
            ..EngineOptions::default()
        };
        let want = converting(&gguf, opts);
        let cache = WeightCache::new(dir.join("cache"), WeightCache::DEFAULT_CAP);
        let (cold, first) = load(&gguf, &cache, opts);
        assert!(matches!(first, CacheOutcome::Written(_)), "{first:?}");
        assert_eq!(
            logits(&cold),
            want,
            "{name}: the converting load that wrote the cache"
        );
        drop(cold);
        let (warm, second) = load(&gguf, &cache, opts);
        assert_eq!(second, CacheOutcome::Hit(cache_file(&first)), "{name}");
        assert_eq!(logits(&warm), want, "{name}: the cached load");
        // One file, no temporary left behind.
        let names: Vec<_> = std::fs::read_dir(cache.dir()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Where each part of a cache file starts, read back from its own lengths (the layout of
/// `weight_cache/file.rs`): (what, offset).
fn landmarks(bytes: &[u8]) -> Vec<(String, usize)> {
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let key_len = u32_at(12);
    let mut marks = vec![
        ("magic".to_string(), 0),
        ("layout version".into(), 8),
        ("key length".into(), 12),
    ];
    // Every key field's value (its first byte after '=').
    let key = std::str::from_utf8(&bytes[16..16 + key_len]).unwrap();
    let mut at = 16;
    for line in key.split_inclusive('\n') {
        let eq = line.find('=').unwrap();
        marks.push((format!("key field {}", &line[..eq]), at + eq + 1));
        at += line.len();
    }
    marks.push(("key checksum".into(), 16 + key_len));
    let t = bytes.len() - 32;
    let (dir_at, dir_len) = (u64_at(t), u64_at(t + 8));
    // Each section: its first value, its last scale byte; each directory entry's fields.
    let mut p = dir_at + 4;
    for _ in 0..u32_at(dir_at) {
        let nl = u32_at(p);
        let name = String::from_utf8_lossy(&bytes[p + 4..p + 4 + nl]).into_owned();
        marks.push((format!("{name}: directory name"), p + 4));
        let f = p + 4 + nl;
        marks.push((format!("{name}: directory format"), f));
        let fields = [
            "n", "k", "n_pad", "k_pad", "offset", "values", "scales", "xxh3",
        ];
        for (i, field) in fields.iter().enumerate() {
            marks.push((format!("{name}: directory {field}"), f + 1 + 8 * i));
        }
        let (off, values, scales) = (u64_at(f + 33), u64_at(f + 41), u64_at(f + 49));
        marks.push((format!("{name}: first value"), off));
        marks.push((format!("{name}: last byte"), off + values + scales - 1));
        p = f + 65;
    }
    assert_eq!(
        p,
        dir_at + dir_len,
        "the landmarks walk the whole directory"
    );
    marks.push(("directory count".into(), dir_at));
    for (i, f) in [
        "directory offset",
        "directory length",
        "directory checksum",
        "end magic",
    ]
    .iter()
    .enumerate()
    {
        marks.push(((*f).into(), t + 8 * i));
    }
    marks
}

#[test]
fn a_file_changed_anywhere_is_reported_and_rebuilt_never_used() {
    let (dir, gguf) = workdir("corrupt", "tiny-qwen2");
    let opts = EngineOptions::default();
    let want = converting(&gguf, opts);
    let cache = WeightCache::new(dir.join("cache"), WeightCache::DEFAULT_CAP);
    let path = cache_file(&load(&gguf, &cache, opts).1);
    assert_eq!(load(&gguf, &cache, opts).1, CacheOutcome::Hit(path.clone()));
    let good = std::fs::read(&path).unwrap();
    let marks = landmarks(&good);
    assert!(marks.len() > 60, "{} landmarks", marks.len());
    for (what, at) in &marks {
        let mut bad = good.clone();
        bad[*at] ^= 0x5A;
        std::fs::write(&path, &bad).unwrap();
        let (model, outcome) = load(&gguf, &cache, opts);
        let CacheOutcome::Rebuilt { reason, .. } = &outcome else {
            panic!("{what} (byte {at}) changed, yet: {outcome:?}");
        };
        // The line says what kind of mismatch it met.
        let line = outcome.to_string();
        assert!(line.contains(&reason.to_string()), "{line}");
        if what.starts_with("key field") {
            // The header checksum covers the key: a changed key is corrupt before it is stale.
            assert!(matches!(reason, Invalid::Corrupt(_)), "{what}: {reason}");
        }
        assert_eq!(logits(&model), want, "{what}: the rebuilt load");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            good,
            "{what}: rebuilt as before"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_truncated_file_is_reported_and_rebuilt() {
    let (dir, gguf) = workdir("truncated", "tiny-llama");
    let opts = EngineOptions::default();
    let want = converting(&gguf, opts);
    let cache = WeightCache::new(dir.join("cache"), WeightCache::DEFAULT_CAP);
    let path = cache_file(&load(&gguf, &cache, opts).1);
    assert_eq!(load(&gguf, &cache, opts).1, CacheOutcome::Hit(path.clone()));
    let good = std::fs::read(&path).unwrap();
    // At every landmark (the start of every section and of every part of the header,
    // directory and trailer), one byte further, and at the very ends.
    let mut cuts: Vec<usize> = landmarks(&good)
        .iter()
        .flat_map(|(_, at)| [*at, at + 1])
        .chain([0, 1, good.len() - 1])
        .filter(|&c| c < good.len())
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts {
        std::fs::write(&path, &good[..cut]).unwrap();
        let (model, outcome) = load(&gguf, &cache, opts);
        assert!(
            matches!(outcome, CacheOutcome::Rebuilt { .. }),
            "cut at {cut} of {}: {outcome:?}",
            good.len()
        );
        assert_eq!(logits(&model), want, "cut at {cut}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), good);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rewrites the key of the cache file at `path` with `edit`, with a valid checksum: a file
/// made by something else, not a damaged one.
fn rekey(path: &Path, edit: impl Fn(&str) -> String) {
    let b = std::fs::read(path).unwrap();
    let key_len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    let key = edit(std::str::from_utf8(&b[16..16 + key_len]).unwrap());
    assert_eq!(key.len(), key_len, "the edit keeps the key's length");
    let mut out = b[..16].to_vec();
    out.extend_from_slice(key.as_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out.extend_from_slice(&b[16 + key_len + 8..]);
    std::fs::write(path, out).unwrap();
}

#[test]
fn a_file_made_for_another_chip_version_or_gguf_is_stale() {
    let (dir, gguf) = workdir("stale", "tiny-llama");
    let opts = EngineOptions::default();
    let want = converting(&gguf, opts);
    let cache = WeightCache::new(dir.join("cache"), WeightCache::DEFAULT_CAP);
    let path = cache_file(&load(&gguf, &cache, opts).1);
    assert_eq!(load(&gguf, &cache, opts).1, CacheOutcome::Hit(path.clone()));
    // (field, what it says now, what another build or chip would have written)
    let edits = [
        ("chip", "chip=RK3588", "chip=RK3568"),
        ("converter", "conversion 3", "conversion 2"),
        ("weight format", "format=w8a8", "format=w8a9"),
        (
            "residual",
            "residual=OutputAndDown",
            "residual=OutputAndDowN",
        ),
    ];
    for (field, now, other) in edits {
        rekey(&path, |k| k.replace(now, other));
        let (model, outcome) = load(&gguf, &cache, opts);
        match &outcome {
            CacheOutcome::Rebuilt {
                reason: Invalid::Stale(why),
                ..
            } => assert!(why.contains(field), "{field}: {why}"),
            other => panic!("{field}: {other:?}"),
        }
        assert_eq!(logits(&model), want);
    }
    // Another layout version is refused by name.
    let mut b = std::fs::read(&path).unwrap();
    b[8] = b[8].wrapping_add(1);
    std::fs::write(&path, &b).unwrap();
    let outcome = load(&gguf, &cache, opts).1;
    assert!(
        matches!(&outcome, CacheOutcome::Rebuilt { reason: Invalid::Format(w), .. } if w.contains("layout version")),
        "{outcome:?}"
    );
    // The GGUF rewritten (same bytes, a new modification time): stale, rebuilt in place.
    let f = std::fs::File::options().append(true).open(&gguf).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let outcome = load(&gguf, &cache, opts).1;
    match &outcome {
        CacheOutcome::Rebuilt {
            path: p,
            reason: Invalid::Stale(why),
        } => {
            assert_eq!(p, &path);
            assert!(why.contains("gguf mtime"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(load(&gguf, &cache, opts).1, CacheOutcome::Hit(_)));
    // Other settings are another file, beside this one.
    let seeded = EngineOptions { seed: 99, ..opts };
    let other = cache_file(&load(&gguf, &cache, seeded).1);
    assert_ne!(other, path);
    assert_eq!(cache.entries().unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_directory_degrades_to_converting() {
    let (dir, gguf) = workdir("unwritable", "tiny-llama");
    let opts = EngineOptions::default();
    let want = converting(&gguf, opts);
    // A directory under a regular file cannot be created, even by root.
    let blocker = dir.join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let cache = WeightCache::new(blocker.join("cache"), WeightCache::DEFAULT_CAP);
    let (model, outcome) = load(&gguf, &cache, opts);
    assert!(
        matches!(outcome, CacheOutcome::NotWritten { .. }),
        "{outcome:?}"
    );
    assert!(outcome.to_string().starts_with("warning: "), "{outcome}");
    assert_eq!(logits(&model), want);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_cap_removes_the_least_recently_used_files_and_clear_empties() {
    let (dir, gguf) = workdir("cap", "tiny-llama");
    let base = EngineOptions::default();
    let roomy = WeightCache::new(dir.join("cache"), WeightCache::DEFAULT_CAP);
    let a = cache_file(&load(&gguf, &roomy, base).1);
    let one = std::fs::metadata(&a).unwrap().len();
    // Room for two files: the third removes the least recently used, which is `b` once `a`
    // has been read again.
    let cache = WeightCache::new(dir.join("cache"), 2 * one + one / 2);
    let opts = |seed| EngineOptions { seed, ..base };
    std::thread::sleep(std::time::Duration::from_millis(20));
    let b = cache_file(&load(&gguf, &cache, opts(2)).1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(matches!(load(&gguf, &cache, base).1, CacheOutcome::Hit(_)));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let c = cache_file(&load(&gguf, &cache, opts(3)).1);
    let left = cache.entries().unwrap();
    let paths: Vec<&PathBuf> = left.iter().map(|e| &e.path).collect();
    assert_eq!(paths, [&a, &c], "least recently used first; {b:?} removed");
    let bytes: u64 = left.iter().map(|e| e.bytes).sum();
    assert_eq!(cache.clear().unwrap(), (2, bytes));
    assert!(cache.entries().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn llm_decode_caches_lists_and_clears() {
    let (dir, gguf) = workdir("cli", "tiny-llama");
    let cache = dir.join("cache");
    let run = |extra: &[&str]| {
        let mut cmd = common::llm_decode();
        cmd.arg("-m").arg(&gguf);
        cmd.args(["-p", "Hello", "-n", "8", "--temp", "0", "-t", "2", "--json"]);
        cmd.arg("--weight-cache").arg(&cache).args(extra);
        common::run_json(cmd, &[])
    };
    let first = run(&[]);
    let second = run(&[]);
    let off = run(&["--no-weight-cache"]);
    let outcome = |j: &serde_json::Value| j["stats"]["weight_cache"]["outcome"].clone();
    assert_eq!(outcome(&first), "written");
    assert_eq!(outcome(&second), "hit");
    assert!(off["stats"]["weight_cache"].is_null());
    assert_eq!(first["generated_ids"], second["generated_ids"]);
    assert_eq!(first["generated_ids"], off["generated_ids"]);
    // The footprint is reported, and the weights are in it.
    let mem = &second["stats"]["memory"];
    assert!(mem["peak_rss_bytes"].as_u64().unwrap() > mem["weight_bytes"].as_u64().unwrap());
    assert!(mem["weight_bytes"].as_u64().unwrap() > 0);

    let text = |args: &[&str]| {
        let out = common::llm_decode()
            .arg("--weight-cache")
            .arg(&cache)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let listed = text(&["--weight-cache-list"]);
    assert!(listed.contains("1 file(s)"), "{listed}");
    assert!(listed.contains("tiny-llama.gguf"), "{listed}");
    let cleared = text(&["--weight-cache-clear"]);
    assert!(cleared.starts_with("removed 1 file(s)"), "{cleared}");
    assert!(text(&["--weight-cache-list"]).contains("0 file(s)"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// RK3576's int4 formats go through the cache like the others: each written once and read
/// back with the converting load's logits, bit for bit, and keyed on the format: W4A16, W4A8
/// and W8A8 of one model in one directory are three files, none read for another.
#[test]
fn int4_formats_are_cached_and_keyed_on_the_format() {
    use rknn_matmul::engine::WeightFormat;
    let variants =
        [WeightFormat::W4A16, WeightFormat::W4A8, WeightFormat::W8A8].map(|format| EngineOptions {
            format,
            ..EngineOptions::default()
        });
    cached_on_rk3576_one_file_each("int4", &variants);
}

/// Per-group int4 W4A16 goes through the cache too: its group scales and offsets are written
/// and read back with the converting load's logits, bit for bit, and the file is keyed on the
/// group: groups of 32, 64 and per-channel W4A16 of one model are three files.
#[test]
fn per_group_int4_is_cached_and_keyed_on_the_group() {
    use rknn_matmul::engine::WeightFormat;
    use std::num::NonZeroU16;
    let variants = [NonZeroU16::new(32), NonZeroU16::new(64), None].map(|group| EngineOptions {
        format: WeightFormat::W4A16,
        int4_group: group,
        ..EngineOptions::default()
    });
    cached_on_rk3576_one_file_each("int4-group", &variants);
}

/// Loads tiny-qwen2 on an emulated RK3576 with each of `variants` through one cache directory:
/// the first cached load writes a file and gives the converting load's logits, the second
/// reads that file and gives them again, and no two variants share a file.
fn cached_on_rk3576_one_file_each(name: &str, variants: &[EngineOptions]) {
    let rk3576 = || {
        Engine::new(
            &Runtime::emulator(Platform::Rk3576).unwrap(),
            EngineConfig::default(),
        )
        .unwrap()
    };
    let (dir, gguf) = workdir(name, "tiny-qwen2");
    let cache = WeightCache::new(dir.join("cache"), WeightCache::DEFAULT_CAP);
    let file = GgufFile::open(&gguf).unwrap();
    let mut files = Vec::new();
    for &opts in variants {
        let what = format!("{} group {:?}", opts.format, opts.int4_group);
        let mut f = EngineFactory::new(rk3576(), opts);
        let want = logits(&Model::load(&file, &mut f, pool(), &mut |_, _| {}).unwrap());
        let load = || {
            Model::load_cached(&gguf, &file, rk3576(), opts, &cache, pool(), &mut |_, _| {})
                .unwrap()
        };
        let (cold, first) = load();
        assert!(
            matches!(first, CacheOutcome::Written(_)),
            "{what}: {first:?}"
        );
        assert_eq!(logits(&cold), want, "{what}: the load that wrote the cache");
        drop(cold);
        let (warm, second) = load();
        assert_eq!(second, CacheOutcome::Hit(cache_file(&first)), "{what}");
        assert_eq!(logits(&warm), want, "{what}: the cached load");
        files.push(cache_file(&first));
    }
    files.sort();
    files.dedup();
    assert_eq!(files.len(), variants.len(), "{files:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
