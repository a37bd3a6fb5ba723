//! `ModelBuilder`: each backend and why it was chosen, the weight cache it keeps, the context
//! rule, the chat template, the host pool, and a typed error for each bad setting. Its logits
//! on the f32 backend are checked against llama.cpp by every test of
//! `forward_vs_llama_cpp.rs` (which loads through it); here, that the engine's backends it
//! builds are the engine's (bit-identical to loading by hand) and agree with f32.

mod common;

use std::path::PathBuf;

use rknn_llm::chat::{ChatOptions, Message};
use rknn_llm::gguf::{GgufError, GgufFile};
use rknn_llm::model::{
    CacheOutcome, CacheType, EngineFactory, EngineOptions, HostPool, Logits, Model, ModelError,
    Residual,
};
use rknn_llm::{Backend, DEFAULT_CONTEXT, LoadError};
use rknn_matmul::engine::{Engine, EngineConfig};
use rknn_matmul::{Platform, Runtime, RuntimeOptions};

fn tiny(name: &str) -> PathBuf {
    common::fixtures().join(format!("llm/{name}.gguf"))
}

/// A fresh directory under cargo's scratch space.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("builder-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The logits of every position of a fixed prompt.
fn logits(model: &Model) -> Vec<f32> {
    let mut seq = model.sequence(CacheType::F32);
    let ids: Vec<u32> = (1..13).collect();
    model
        .forward(&mut seq, &ids, 0, Logits::All)
        .unwrap()
        .to_vec()
}

#[test]
fn the_emulator_backend_is_the_engine_and_the_cache_gives_the_same_logits() {
    let path = tiny("tiny-llama");
    let dir = scratch("cache");
    let build = || {
        rknn_llm::Model::builder(&path)
            .backend(Backend::Emulator)
            .weight_cache_dir(&dir)
            .pool(HostPool::workers(2).unwrap())
    };
    let first = build().load().unwrap();
    assert_eq!(first.backend, Backend::Emulator);
    assert!(!first.backend_reason.is_empty());
    let engine = first.model.engine().expect("an engine");
    assert!(engine.runtime().is_emulator());
    assert_eq!(engine.runtime().platform(), Platform::Rk3588);
    assert!(
        matches!(&first.weight_cache, Some(CacheOutcome::Written(p)) if p.starts_with(&dir)),
        "{:?}",
        first.weight_cache
    );
    let second = build().load().unwrap();
    assert!(
        matches!(&second.weight_cache, Some(CacheOutcome::Hit(_))),
        "{:?}",
        second.weight_cache
    );
    let (a, b) = (logits(&first.model), logits(&second.model));
    assert_eq!(a, b, "a cache hit gives the converted weights' logits");

    // The same engine and options by hand: the builder adds nothing of its own.
    let rt = Runtime::open(
        rknn_matmul::Backend::Emulator(Platform::Rk3588),
        RuntimeOptions::default(),
    )
    .unwrap();
    let e = Engine::new(&rt, EngineConfig::default()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let opts = EngineOptions {
        residual: first.model.config().family.w8a8_residual,
        ..EngineOptions::default()
    };
    let by_hand = Model::load(
        &file,
        &mut EngineFactory::new(e, opts),
        HostPool::workers(2).unwrap(),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(logits(&by_hand), a);

    // And W8A8 stays near the f32 path (its accuracy bar is docs/llm.md's; this is a sanity
    // bound on a random tiny model).
    let f32 = rknn_llm::Model::builder(&path)
        .backend(Backend::F32)
        .load()
        .unwrap();
    assert_eq!((f32.backend, &f32.weight_cache), (Backend::F32, &None));
    assert!(f32.model.engine().is_none());
    let reference = logits(&f32.model);
    let worst = a
        .iter()
        .zip(&reference)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    let scale = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(
        worst < 0.05 * scale,
        "W8A8 {worst} from f32 (logits up to {scale})"
    );
}

#[test]
fn auto_says_which_backend_it_chose_and_why() {
    let loaded = rknn_llm::Model::builder(tiny("tiny-qwen2"))
        .no_weight_cache()
        .load()
        .unwrap();
    let rt = loaded
        .model
        .engine()
        .expect("auto runs on the engine")
        .runtime();
    let want = match rt.is_emulator() {
        true => Backend::Emulator,
        false => Backend::Npu,
    };
    assert_eq!(loaded.backend, want);
    assert_eq!(loaded.backend_reason, rt.selection_reason());
    assert_eq!(loaded.weight_cache, None);
}

#[test]
fn the_family_sets_the_residual_policy_unless_told() {
    // Gemma 3 quantises every linear's activations twice; the key of the cache file says which
    // policy the weights were converted with.
    let path = tiny("tiny-gemma3");
    let key_of = |residual: Option<Residual>, name: &str| {
        let dir = scratch(name);
        let mut b = rknn_llm::Model::builder(&path)
            .backend(Backend::Emulator)
            .weight_cache_dir(&dir);
        if let Some(r) = residual {
            b = b.residual(r);
        }
        let loaded = b.load().unwrap();
        let cache = rknn_llm::model::WeightCache::new(&dir, u64::MAX);
        let entries = cache.entries().unwrap();
        assert_eq!(entries.len(), 1);
        assert!(loaded.weight_cache.is_some());
        entries[0].key.clone().unwrap()
    };
    assert!(key_of(None, "family").contains("residual=All\n"));
    assert!(key_of(Some(Residual::Output), "told").contains("residual=Output\n"));
}

#[test]
fn the_context_is_bounded_by_default_and_checked_against_the_trained_one() {
    let path = tiny("tiny-llama");
    let f32 = || rknn_llm::Model::builder(&path).backend(Backend::F32);
    let trained = f32().load().unwrap().model.config().n_ctx;
    assert_eq!(
        f32().load().unwrap().model.n_ctx(),
        DEFAULT_CONTEXT.min(trained)
    );
    assert_eq!(f32().context(0).load().unwrap().model.n_ctx(), trained);
    assert_eq!(f32().context(7).load().unwrap().model.n_ctx(), 7);
    match f32().context(trained + 1).load() {
        Err(LoadError::Model(ModelError::ContextTooLarge { asked, trained: t })) => {
            assert_eq!((asked, t), (trained + 1, trained));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_chat_template_is_the_models_or_the_one_given() {
    let path = tiny("tiny-llama");
    let f32 = || rknn_llm::Model::builder(&path).backend(Backend::F32);
    let source = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
    let given = f32().chat_template("mine", source).load().unwrap();
    let t = given.chat_template.unwrap().expect("the template given");
    assert_eq!(t.name(), "mine");
    let text = t
        .render(&[Message::user("hi")], false, &ChatOptions::default())
        .unwrap();
    assert_eq!(text, "[user] hi\n");

    // The same from a file.
    let dir = scratch("template");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.jinja");
    std::fs::write(&file, source).unwrap();
    let from_file = f32().chat_template_file(&file).load().unwrap();
    let t = from_file.chat_template.unwrap().unwrap();
    let text = t
        .render(&[Message::user("hi")], false, &ChatOptions::default())
        .unwrap();
    assert_eq!(text, "[user] hi\n");

    // What the file says otherwise: the tiny model has no template.
    let own = f32().load().unwrap();
    let file_has = GgufFile::open(&path)
        .unwrap()
        .metadata()
        .get_str("tokenizer.chat_template")
        .is_some();
    assert_eq!(own.chat_template.unwrap().is_some(), file_has);

    // A template given that does not compile, or cannot be read, fails the load.
    match f32().chat_template("broken", "{% for %}").load() {
        Err(LoadError::ChatTemplate(e)) => assert!(e.to_string().contains("broken"), "{e}"),
        other => panic!("{other:?}"),
    }
    let missing = dir.join("missing.jinja");
    match f32().chat_template_file(&missing).load() {
        Err(e @ LoadError::Read { .. }) => {
            assert!(e.to_string().contains("missing.jinja"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_settings_and_files_are_typed_errors() {
    let f32 = |p: PathBuf| rknn_llm::Model::builder(p).backend(Backend::F32);
    match f32(tiny("tiny-llama")).threads(0).load() {
        Err(LoadError::Setting { setting, .. }) => assert_eq!(setting, "threads"),
        other => panic!("{other:?}"),
    }
    match f32(tiny("no-such-model")).load() {
        Err(LoadError::Gguf(GgufError::Io { path, .. })) => {
            assert!(path.ends_with("no-such-model.gguf"))
        }
        other => panic!("{other:?}"),
    }
    // A file that is not a model at all.
    let not_gguf = common::fixtures().join("text/eval_english.txt");
    assert!(matches!(f32(not_gguf).load(), Err(LoadError::Gguf(_))));
    // An engine setting the engine refuses.
    let e = rknn_llm::Model::builder(tiny("tiny-llama"))
        .backend(Backend::Emulator)
        .no_weight_cache()
        .max_n_per_context(16)
        .load()
        .unwrap_err();
    assert!(e.to_string().contains("max_n_per_context"), "{e}");
    // Per-group int4 with a format whose C cannot carry group scales.
    let e = rknn_llm::Model::builder(tiny("tiny-llama"))
        .backend(Backend::Emulator)
        .platform(Platform::Rk3576)
        .no_weight_cache()
        .int4_group(std::num::NonZeroU16::new(32))
        .load()
        .unwrap_err();
    match &e {
        LoadError::Setting { setting, rule, .. } => {
            assert_eq!(*setting, "int4_group");
            assert!(rule.contains("w4a16"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_default_pool_is_driven_by_the_loading_thread_and_sessions_take_the_cache_type() {
    std::thread::spawn(|| {
        let loaded = rknn_llm::Model::builder(tiny("tiny-llama"))
            .backend(Backend::F32)
            .threads(2)
            .kv_cache(CacheType::F16)
            .load()
            .unwrap();
        let pool = loaded.model.pool();
        assert_eq!(pool.driver(), Some(std::thread::current().id()));
        assert_eq!(pool.current_num_threads(), 2);
        let session = loaded.session(Default::default()).unwrap();
        assert_eq!(session.sequence().cache().cache_type(), CacheType::F16);
        // A pool given is used as it is.
        let given = rknn_llm::Model::builder(tiny("tiny-llama"))
            .backend(Backend::F32)
            .pool(HostPool::workers(3).unwrap())
            .load()
            .unwrap();
        assert_eq!(given.model.pool().driver(), None);
        assert_eq!(given.model.pool().current_num_threads(), 3);
    })
    .join()
    .unwrap();
}
