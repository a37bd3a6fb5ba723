//! Batch and thread invariance of the f32 forward pass, and its input checks, on the tiny
//! committed models (every family; tiny-gemma3 has a sliding window of 12 positions on six of
//! its seven layers, so its runs of 200 positions cross the point where the local layers drop
//! keys, see `KvCache`).

mod common;

use std::sync::Arc;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{CacheType, HostF32Factory, Logits, Model, ModelError, REPLAY_ROWS, REWIND};

const TINY: [&str; 16] = [
    "tiny-qwen2.gguf",
    "tiny-llama.gguf",
    "tiny-qwen3.gguf",
    "tiny-gemma3.gguf",
    "tiny-phi3.gguf",
    "tiny-phi3-longrope.gguf",
    "tiny-smollm3.gguf",
    "tiny-granite.gguf",
    "tiny-gemma2.gguf",
    "tiny-qwen3moe.gguf",
    "tiny-olmoe.gguf",
    "tiny-lfm2.gguf",
    "tiny-granitemoe.gguf",
    "tiny-lfm2moe.gguf",
    "tiny-llama-bias.gguf",
    "tiny-qwen35.gguf",
];

fn model(name: &str, threads: usize) -> common::Run {
    common::load_f32(&common::fixtures().join("llm").join(name), threads)
}

/// The bits of a row set.
fn bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|v| v.to_bits()).collect()
}

/// Every row's logits of `b` after `prefix`, evaluated from scratch in a sequence caching `ty`.
fn fresh(model: &Model, ty: CacheType, prefix: &[u32], b: &[u32]) -> Vec<u32> {
    let mut s = model.sequence(ty);
    model.forward(&mut s, prefix, 0, Logits::None).unwrap();
    bits(model.forward(&mut s, b, prefix.len(), Logits::All).unwrap())
}

fn logits_in_chunks(m: &mut common::Run, tokens: &[u32], chunk: usize) -> Vec<u32> {
    m.reset();
    let mut out = Vec::new();
    for (c, part) in tokens.chunks(chunk).enumerate() {
        let l = m.forward(part, c * chunk, Logits::All).unwrap();
        out.extend(l.iter().map(|v| v.to_bits()));
    }
    out
}

#[test]
fn logits_are_bit_identical_for_any_batch_split_and_thread_count() {
    let mut rng = fastrand::Rng::with_seed(12);
    for name in TINY {
        let mut one = model(name, 1);
        let mut two = model(name, 2);
        let n_vocab = one.config().n_vocab as u32;
        let tokens: Vec<u32> = (0..200).map(|_| rng.u32(..n_vocab)).collect();
        let reference = logits_in_chunks(&mut one, &tokens, 1);
        for chunk in [2, 5, 16, 200] {
            assert_eq!(
                logits_in_chunks(&mut one, &tokens, chunk),
                reference,
                "{name} chunk {chunk}, 1 thread"
            );
            assert_eq!(
                logits_in_chunks(&mut two, &tokens, chunk),
                reference,
                "{name} chunk {chunk}, 2 threads"
            );
        }
        // The last row alone equals the last row of All.
        two.reset();
        let last = two.forward(&tokens, 0, Logits::Last).unwrap().to_vec();
        let nv = n_vocab as usize;
        let want: Vec<u32> = reference[reference.len() - nv..].to_vec();
        assert_eq!(
            last.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want,
            "{name}"
        );
    }
}

#[test]
fn an_f16_cache_keeps_batch_invariance_and_stays_close_to_the_f32_cache() {
    let mut rng = fastrand::Rng::with_seed(13);
    for name in TINY {
        let mut exact = model(name, 2);
        let mut half = model(name, 2);
        half.set_cache_type(CacheType::F16);
        assert_eq!(half.cache().cache_type(), CacheType::F16);
        let n_vocab = half.config().n_vocab as u32;
        let tokens: Vec<u32> = (0..41).map(|_| rng.u32(..n_vocab)).collect();
        let reference = logits_in_chunks(&mut half, &tokens, 1);
        for chunk in [3, 16, 41] {
            assert_eq!(
                logits_in_chunks(&mut half, &tokens, chunk),
                reference,
                "{name} chunk {chunk}"
            );
        }
        // Half the bytes of the f32 cache for the same positions (a short-convolution layer's
        // rows stay f32, as llama.cpp keeps that state: n_embd f32 per position each; so does
        // a delta-net layer's recurrent state).
        let f32_logits = logits_in_chunks(&mut exact, &tokens, 41);
        assert_eq!(half.cache().len(), exact.cache().len());
        let c = half.config();
        let conv = (0..c.n_layer).filter(|&l| c.conv(l).is_some()).count();
        let conv_bytes = conv * half.cache().len() * c.n_embd * 4 + half.cache().recurrent_bytes();
        assert_eq!(
            half.cache().recurrent_bytes(),
            exact.cache().recurrent_bytes()
        );
        assert_eq!(
            2 * (half.cache().bytes() - conv_bytes),
            exact.cache().bytes() - conv_bytes
        );
        // Keys and values rounded to 11 bits move the logits a little, not a lot.
        let (mut worst, mut scale) = (0f32, 0f32);
        for (a, b) in reference.iter().zip(&f32_logits) {
            let (a, b) = (f32::from_bits(*a), f32::from_bits(*b));
            worst = worst.max((a - b).abs());
            scale = scale.max(b.abs());
        }
        assert!(worst > 0.0, "{name}: f16 rounding changed nothing");
        assert!(worst < 1e-2 * scale.max(1.0), "{name}: {worst} of {scale}");
    }
}

#[test]
fn rewinding_the_cache_recomputes_the_same_logits() {
    let mut m = model("tiny-qwen2.gguf", 2);
    let a = m.forward(&[1, 2, 3, 4], 0, Logits::Last).unwrap().to_vec();
    m.forward(&[9, 9], 4, Logits::None).unwrap();
    assert_eq!(m.cache().len(), 6);
    // Back to position 3: drop positions 3.. and feed the original fourth token again.
    let b = m.forward(&[4], 3, Logits::Last).unwrap().to_vec();
    assert_eq!(a, b);
    assert_eq!(m.cache().len(), 4);
}

/// LFM2's short-convolution state (each conv layer's `B ⊙ x` rows, kept in the cache like a
/// local layer's keys, with a window of the kernel's 3 taps and the rewind margin): a cut
/// back within the margin and a copy of another sequence's prefix continue with the bits a
/// fresh evaluation of the same tokens gives, for an f32 and an f16 cache; a cut further back
/// than the conv layers keep is refused by `forward` and keeps nothing in `truncate`.
#[test]
fn short_conv_state_rewinds_and_copies_like_keys() {
    let model = model("tiny-lfm2.gguf", 2).model;
    let c = model.config();
    let conv = (0..c.n_layer).filter(|&l| c.conv(l).is_some()).count();
    assert!(conv > 0 && conv < c.n_layer, "conv and attention layers");
    let mut rng = fastrand::Rng::with_seed(21);
    let n_vocab = c.n_vocab as u32;
    let a: Vec<u32> = (0..200).map(|_| rng.u32(..n_vocab)).collect();
    let b: Vec<u32> = (0..20).map(|_| rng.u32(..n_vocab)).collect();
    for ty in [CacheType::F32, CacheType::F16] {
        let fresh = |prefix: &[u32]| fresh(&model, ty, prefix, &b);
        let mut seq = model.sequence(ty);
        for (i, chunk) in a.chunks(7).enumerate() {
            model.forward(&mut seq, chunk, i * 7, Logits::None).unwrap();
        }
        // The conv layers dropped their oldest rows (a query at 60 needs 58 and 59).
        assert!(seq.cache().can_rewind_to(200 - 4 - REWIND));
        assert!(
            !seq.cache().can_rewind_to(60),
            "{ty:?}: nothing was dropped"
        );
        let mut copy = model.sequence(ty);
        for keep in [199, 170, 140] {
            // Another sequence takes the prefix over.
            assert!(copy.copy_prefix(&seq, keep), "{ty:?} {keep}");
            let got = bits(model.forward(&mut copy, &b, keep, Logits::All).unwrap());
            assert_eq!(got, fresh(&a[..keep]), "{ty:?}: copy of {keep}");
        }
        // A rewind past what the conv layers keep: refused, nothing changed; no copy either.
        let err = model.forward(&mut seq, &b, 60, Logits::All).unwrap_err();
        assert!(
            matches!(err, ModelError::RewindPastWindow { pos: 60, .. }),
            "{err}"
        );
        assert_eq!(seq.len(), 200);
        assert!(!copy.copy_prefix(&seq, 60));
        for keep in [199, 170, 140] {
            // Cut back, then a different continuation.
            seq.truncate(keep);
            assert_eq!(seq.len(), keep);
            let got = bits(model.forward(&mut seq, &b, keep, Logits::All).unwrap());
            assert_eq!(got, fresh(&a[..keep]), "{ty:?}: rewind to {keep}");
        }
        // A cut further back keeps nothing: the caller evaluates again from the start.
        seq.truncate(60);
        assert_eq!(seq.len(), 0);
    }
}

/// Qwen3.5's delta-net state (overwritten by every row, not kept per position): a cut back
/// into the last pass (replayed from its base), to a checkpoint (the end of a pass of more
/// than `REPLAY_ROWS` rows) or to 0, and a copy of another sequence's prefix at such a
/// position, continue with the bits a fresh evaluation of the same tokens gives, for an f32
/// and an f16 cache; a position between is refused by `forward` and `copy_prefix`, and
/// `truncate` to it keeps the latest checkpoint before it.
#[test]
fn delta_net_state_rewinds_and_copies_bit_identically() {
    let model = model("tiny-qwen35.gguf", 2).model;
    let c = model.config();
    let delta = (0..c.n_layer).filter(|&l| c.delta(l)).count();
    assert!(
        delta > 0 && delta < c.n_layer,
        "delta-net and attention layers"
    );
    assert_eq!(REPLAY_ROWS, 64, "the passes below straddle it");
    let mut rng = fastrand::Rng::with_seed(35);
    let n_vocab = c.n_vocab as u32;
    let a: Vec<u32> = (0..155).map(|_| rng.u32(..n_vocab)).collect();
    let b: Vec<u32> = (0..20).map(|_| rng.u32(..n_vocab)).collect();
    for ty in [CacheType::F32, CacheType::F16] {
        let fresh = |prefix: &[u32]| fresh(&model, ty, prefix, &b);
        // Passes of 80 (a checkpoint at 80), 70 (one at 150) and 5 rows (replayable from
        // 150).
        let mut seq = model.sequence(ty);
        for (from, to) in [(0, 80), (80, 150), (150, 155)] {
            model
                .forward(&mut seq, &a[from..to], from, Logits::None)
                .unwrap();
        }
        let state = c.delta_net.as_ref().unwrap().state_len() * 4 * delta;
        assert!(
            seq.cache().bytes() > 2 * state,
            "{ty:?}: {} bytes hold no delta-net state",
            seq.cache().bytes()
        );
        for p in [0, 80, 150, 152, 155] {
            assert!(seq.cache().can_rewind_to(p), "{ty:?} {p}");
        }
        for p in [1, 79, 81, 120, 149] {
            assert!(!seq.cache().can_rewind_to(p), "{ty:?} {p}");
        }
        let mut copy = model.sequence(ty);
        for keep in [155, 152, 150, 80, 0] {
            // Another sequence takes the prefix over.
            assert!(copy.copy_prefix(&seq, keep), "{ty:?} {keep}");
            let got = bits(model.forward(&mut copy, &b, keep, Logits::All).unwrap());
            assert_eq!(got, fresh(&a[..keep]), "{ty:?}: copy of {keep}");
        }
        // A position the state cannot be recovered at exactly: refused, nothing changed.
        let err = model.forward(&mut seq, &b, 120, Logits::All).unwrap_err();
        assert!(
            matches!(err, ModelError::RewindPastWindow { pos: 120, .. }),
            "{err}"
        );
        assert_eq!(seq.len(), 155);
        assert!(!copy.copy_prefix(&seq, 120));
        // Cut back inside the last pass twice (a replay from its base), then go on.
        for keep in [153, 151] {
            seq.truncate(keep);
            assert_eq!(seq.len(), keep);
        }
        let got = bits(model.forward(&mut seq, &b, 151, Logits::All).unwrap());
        assert_eq!(got, fresh(&a[..151]), "{ty:?}: rewind to 151");
        // That pass of 20 rows is now the last: back to its start, exactly.
        seq.truncate(151);
        assert_eq!(seq.len(), 151);
        // A cut between checkpoints keeps the one before it; the caller evaluates the rest.
        seq.truncate(120);
        assert_eq!(seq.len(), 80, "{ty:?}");
        let got = bits(model.forward(&mut seq, &b, 80, Logits::All).unwrap());
        assert_eq!(got, fresh(&a[..80]), "{ty:?}: back to the checkpoint at 80");
        // Before the first checkpoint: nothing.
        seq.truncate(60);
        assert_eq!(seq.len(), 0);
    }
}

#[test]
fn local_layers_keep_their_window_and_a_rewind_margin_and_refuse_more() {
    let mut m = model("tiny-gemma3.gguf", 2);
    let sw = m
        .config()
        .sliding_window
        .clone()
        .expect("tiny-gemma3 is windowed");
    let (w, n_local) = (sw.window, sw.layers.iter().filter(|&&l| l).count());
    assert!(
        n_local > 0 && n_local < m.config().n_layer,
        "local and global layers"
    );
    let n_vocab = m.config().n_vocab as u32;
    let mut rng = fastrand::Rng::with_seed(14);
    let tokens: Vec<u32> = (0..400).map(|_| rng.u32(..n_vocab)).collect();
    let mut last = Vec::new();
    for (pos, &t) in tokens.iter().enumerate() {
        last = m.forward(&[t], pos, Logits::Last).unwrap().to_vec();
    }
    // Memory: the global layers hold 400 positions, the local ones at most about
    // 2 × (window + REWIND).
    let c = m.config();
    let per_position = 2 * c.n_head_kv * c.head_dim * 4;
    let global = (c.n_layer - n_local) * 400 * per_position;
    let local_cap = n_local * (2 * (w + REWIND) + 1) * per_position;
    let bytes = m.cache().bytes();
    assert!(bytes < global + local_cap, "{bytes} bytes");
    assert!(
        bytes < c.n_layer * 400 * per_position,
        "the local layers dropped keys"
    );
    // Stepping back REWIND positions recomputes the same logits...
    let back = 400 - REWIND;
    m.forward(&tokens[back..399], back, Logits::None).unwrap();
    assert_eq!(
        m.forward(&[tokens[399]], 399, Logits::Last).unwrap(),
        &last[..]
    );
    // ...stepping back to where the window's keys are gone is a typed error...
    let e = m.forward(&[tokens[10]], 10, Logits::Last).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::RewindPastWindow {
                pos: 10,
                cached: 400
            }
        ),
        "{e}"
    );
    // ...and a truncation there keeps nothing, from where position 0 starts again.
    m.seq.truncate(10);
    assert_eq!(m.cache().len(), 0);
    let first = m.forward(&tokens[..1], 0, Logits::Last).unwrap().to_vec();
    m.reset();
    assert_eq!(
        m.forward(&tokens[..1], 0, Logits::Last).unwrap(),
        &first[..]
    );
}

#[test]
fn a_context_size_bounds_the_sequence() {
    let mut run = model("tiny-llama.gguf", 1);
    let model = Arc::get_mut(&mut run.model).expect("the only owner of its model");
    let trained = model.config().n_ctx;
    assert_eq!(model.n_ctx(), trained);
    let e = model.set_context(trained + 1).unwrap_err();
    assert!(
        matches!(e, ModelError::ContextTooLarge { asked, trained: t } if asked == trained + 1 && t == trained),
        "{e}"
    );
    assert!(e.to_string().contains(&trained.to_string()), "{e}");
    model.set_context(16).unwrap();
    let mut seq = model.sequence(CacheType::F32);
    assert_eq!(seq.n_ctx(), 16);
    model.forward(&mut seq, &[1; 16], 0, Logits::None).unwrap();
    let e = model.forward(&mut seq, &[1], 16, Logits::Last).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::ContextOverflow {
                pos: 16,
                n_tokens: 1,
                n_ctx: 16
            }
        ),
        "{e}"
    );
    // 0 is the trained context, as llama.cpp's -c 0.
    model.set_context(0).unwrap();
    assert_eq!(model.sequence(CacheType::F32).n_ctx(), trained);
}

#[test]
fn bad_inputs_are_errors() {
    let mut m = model("tiny-llama.gguf", 1);
    let n_vocab = m.config().n_vocab;
    let n_ctx = m.config().n_ctx;
    let e = m.forward(&[n_vocab as u32], 0, Logits::Last).unwrap_err();
    assert!(matches!(e, ModelError::BadToken { .. }), "{e}");
    let e = m.forward(&[1], 5, Logits::Last).unwrap_err();
    assert!(
        matches!(e, ModelError::BadPosition { pos: 5, cached: 0 }),
        "{e}"
    );
    let long = vec![1u32; n_ctx + 1];
    let e = m.forward(&long, 0, Logits::Last).unwrap_err();
    assert!(e.to_string().starts_with("context overflow"), "{e}");
    assert!(m.forward(&[], 0, Logits::All).unwrap().is_empty());
}

#[test]
fn unsupported_architecture_is_named() {
    // The gguf-py fixture declares architecture "testarch".
    let file = GgufFile::open(common::fixtures().join("gguf/all_types.gguf")).unwrap();
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap(),
    );
    let e = Model::load(
        &file,
        &mut HostF32Factory::new(pool.clone()),
        pool,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "unsupported architecture \"testarch\" (supported: llama, qwen2, qwen3, gemma3, phi3, smollm3, granite, gemma2, qwen3moe, olmoe, lfm2, granitemoe, lfm2moe, qwen35)"
    );
}
