//! Native layouts, K segmentation, int4 packing and `io_attr` descriptors against the fact
//! sheet §6-7. Every expected buffer is built here from the sheet's formulas, element by element.

mod common;

use common::{a_sk, accepted_pairs, b_tile, bits, c_sn, mt, segment};
use rknn_chip::layout::{
    self, NativeB, native_a_index, native_a_len, native_b_len, native_c_index, native_c_len,
    pack_a_native, pack_c_native, pack_i4, unpack_a_native, unpack_c_native, unpack_i4,
};
use rknn_chip::{
    ElemKind, Layout, MatmulConfig, Platform, QuantType, ShapeRules, Tiles, parse_info,
};

const SENTINEL: u32 = 0xdead_beef;

/// Distinct, non-zero values, so a misplaced element or a missing zero shows.
fn values(len: usize, rng: &mut fastrand::Rng) -> Vec<u32> {
    let base = rng.u32(1..1 << 20);
    (0..len as u32).map(|i| base + i).collect()
}

/// §7 native A / C (same shape, `d` is K for A and N for C): `[ceil(D/s), M, s]`.
fn ref_native_mx(src: &[u32], m: usize, d: usize, s: usize) -> Vec<u32> {
    let mut out = vec![0; d.div_ceil(s) * m * s];
    for mi in 0..m {
        for di in 0..d {
            out[((di / s) * m + mi) * s + di % s] = src[mi * d + di];
        }
    }
    out
}

/// §7 native B of one block (no segmentation), from row-major [K, N] rows `k0..k0 + kb`.
fn ref_native_b_block(
    src: &[u32],
    n: usize,
    k0: usize,
    kb: usize,
    sn: usize,
    sk: usize,
) -> Vec<u32> {
    let k1 = kb.div_ceil(sk);
    let mut out = vec![0; n.div_ceil(sn) * k1 * sn * sk];
    for k in 0..kb {
        for j in 0..n {
            out[((j / sn) * k1 + k / sk) * sn * sk + (j % sn) * sk + k % sk] =
                src[(k0 + k) * n + j];
        }
    }
    out
}

/// §6: T = ceil(K / S) blocks, each converted as if its K were the block's K, stored one after
/// another. Without a segment (or K <= S) one block.
fn ref_native_b(
    src: &[u32],
    k: usize,
    n: usize,
    sn: usize,
    sk: usize,
    seg: Option<usize>,
) -> (Vec<u32>, usize) {
    let s = match seg {
        Some(s) if k > s => s,
        _ => k,
    };
    let mut out = Vec::new();
    let mut blocks = 0;
    let mut k0 = 0;
    while k0 < k {
        let kb = s.min(k - k0);
        out.extend(ref_native_b_block(src, n, k0, kb, sn, sk));
        k0 += kb;
        blocks += 1;
    }
    (out, blocks)
}

fn transpose(src: &[u32], rows: usize, cols: usize) -> Vec<u32> {
    let mut out = vec![0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = src[r * cols + c];
        }
    }
    out
}

fn check_a(m: usize, k: usize, sk: usize, rng: &mut fastrand::Rng) {
    let src = values(m * k, rng);
    let expected = ref_native_mx(&src, m, k, sk);
    assert_eq!(
        native_a_len(m, k, sk),
        Some(expected.len()),
        "native_a_len M={m} K={k} sK={sk}"
    );
    let extra = rng.usize(0..3);
    let mut dst = vec![SENTINEL; expected.len() + extra];
    pack_a_native(&src, m, k, sk, &mut dst);
    assert_eq!(
        dst[..expected.len()],
        expected[..],
        "pack_a_native M={m} K={k} sK={sk}"
    );
    assert!(
        dst[expected.len()..].iter().all(|&v| v == SENTINEL),
        "pack_a_native wrote past its length"
    );
    let mut back = vec![SENTINEL; m * k];
    unpack_a_native(&expected, m, k, sk, &mut back);
    assert_eq!(back, src, "unpack_a_native M={m} K={k} sK={sk}");
    for _ in 0..8 {
        let (mi, ki) = (rng.usize(0..m), rng.usize(0..k));
        assert_eq!(
            native_a_index(m, sk, mi, ki),
            ((ki / sk) * m + mi) * sk + ki % sk
        );
    }
}

fn check_c(m: usize, n: usize, sn: usize, rng: &mut fastrand::Rng) {
    let src = values(m * n, rng);
    let expected = ref_native_mx(&src, m, n, sn);
    assert_eq!(
        native_c_len(m, n, sn),
        Some(expected.len()),
        "native_c_len M={m} N={n} sN={sn}"
    );
    let mut dst = vec![SENTINEL; expected.len()];
    pack_c_native(&src, m, n, sn, &mut dst);
    assert_eq!(dst, expected, "pack_c_native M={m} N={n} sN={sn}");
    let mut back = vec![SENTINEL; m * n];
    unpack_c_native(&expected, m, n, sn, &mut back);
    assert_eq!(back, src, "unpack_c_native M={m} N={n} sN={sn}");
    for _ in 0..8 {
        let (mi, ni) = (rng.usize(0..m), rng.usize(0..n));
        assert_eq!(
            native_c_index(m, sn, mi, ni),
            ((ni / sn) * m + mi) * sn + ni % sn
        );
    }
}

/// Checks `geo` (for a K x N matrix with tiles sn x sk, segment `seg`) against the reference.
fn check_b(
    geo: &NativeB,
    k: usize,
    n: usize,
    sn: usize,
    sk: usize,
    seg: Option<usize>,
    rng: &mut fastrand::Rng,
) {
    let what = format!("K={k} N={n} sN={sn} sK={sk} segment={seg:?}");
    let src = values(k * n, rng);
    let (expected, blocks) = ref_native_b(&src, k, n, sn, sk, seg);
    assert_eq!(geo.len(), expected.len(), "len {what}");
    assert_eq!(
        native_b_len(k, n, sn, sk),
        Some(expected.len()),
        "native_b_len {what}"
    );
    assert_eq!(geo.segments(), blocks, "segments {what}");

    let mut dst = vec![SENTINEL; expected.len()];
    geo.pack_from_kn(&src, &mut dst);
    assert!(dst == expected, "pack_from_kn {what}");

    let src_nk = transpose(&src, k, n);
    let mut dst = vec![SENTINEL; expected.len()];
    geo.pack_from_nk(&src_nk, &mut dst);
    assert!(dst == expected, "pack_from_nk {what}");

    let mut back = vec![SENTINEL; k * n];
    geo.unpack_to_nk(&expected, &mut back);
    assert!(back == src_nk, "unpack_to_nk {what}");

    // Values are distinct, so index() is right iff it finds each element where the reference put it.
    let samples = (k * n).min(2000);
    for s in 0..samples {
        let (ki, ni) = if samples == k * n {
            (s / n, s % n)
        } else {
            (rng.usize(0..k), rng.usize(0..n))
        };
        assert_eq!(
            expected[geo.index(ki, ni)],
            src[ki * n + ni],
            "index({ki}, {ni}) {what}"
        );
    }
}

#[test]
fn tiles_match_the_fact_sheet() {
    for (p, t) in accepted_pairs() {
        let tiles = p.tiles(t).unwrap_or_else(|| panic!("{p:?} {t} has tiles"));
        let (b_n, b_k) = b_tile(p, t.b).unwrap();
        let expected = Tiles {
            a_k: a_sk(p, t.a).unwrap(),
            b_n,
            b_k,
            c_n: c_sn(t.c),
        };
        assert_eq!(tiles, expected, "{p:?} {t}");
        // Every A/C cell is 16 bytes on RK3588 (§7).
        if p == Platform::Rk3588 {
            assert_eq!(tiles.a_k * bits(t.a) / 8, 16, "{t} A cell");
            assert_eq!(tiles.c_n * bits(t.c) / 8, 16, "{t} C cell");
        }
    }
    for p in [Platform::Rk3562, Platform::Rk3566, Platform::Rk3568] {
        assert_eq!(p.tiles(mt(10)), None, "{p:?} has no int4 tiles");
    }
    for p in Platform::ALL {
        assert_eq!(p.k_segment(), segment(p), "{p:?}");
    }
}

#[test]
fn native_a_and_c_random_shapes() {
    let mut rng = fastrand::Rng::with_seed(0xa11c_0001);
    let mut cases = 0;
    for (p, t) in accepted_pairs() {
        let tiles = p.tiles(t).unwrap();
        for _ in 0..150 {
            let m = rng.usize(1..=24);
            check_a(m, rng.usize(1..=160), tiles.a_k, &mut rng);
            check_c(m, rng.usize(1..=160), tiles.c_n, &mut rng);
            cases += 1;
        }
        // Edges: one row, one column, exactly one tile, one past a tile.
        for (m, d) in [
            (1, 1),
            (1, tiles.a_k),
            (2, tiles.a_k + 1),
            (5, 2 * tiles.a_k - 1),
            (3, 1),
        ] {
            check_a(m, d, tiles.a_k, &mut rng);
        }
        for (m, d) in [
            (1, 1),
            (1, tiles.c_n),
            (2, tiles.c_n + 1),
            (5, 2 * tiles.c_n - 1),
            (3, 1),
        ] {
            check_c(m, d, tiles.c_n, &mut rng);
        }
    }
    assert!(cases >= 2500);
}

#[test]
fn native_a_works_for_other_element_types() {
    // f16 bit patterns and int8 values.
    let (m, k, sk) = (3, 21, 8);
    let src: Vec<u16> = (0..(m * k) as u16).map(|i| 0x3c00 + i).collect();
    let mut dst = vec![0xffffu16; native_a_len(m, k, sk).unwrap()];
    pack_a_native(&src, m, k, sk, &mut dst);
    for mi in 0..m {
        for ki in 0..k {
            assert_eq!(dst[((ki / sk) * m + mi) * sk + ki % sk], src[mi * k + ki]);
        }
    }
    assert_eq!(dst.iter().filter(|&&v| v == 0).count(), dst.len() - m * k);
    let src: Vec<i8> = (0..(m * k) as i32).map(|i| (i % 255 - 127) as i8).collect();
    let mut dst = vec![-1i8; native_a_len(m, k, 16).unwrap()];
    pack_a_native(&src, m, k, 16, &mut dst);
    let mut back = vec![0i8; m * k];
    unpack_a_native(&dst, m, k, 16, &mut back);
    assert_eq!(back, src);
}

#[test]
fn native_b_unsegmented_random_shapes() {
    let mut rng = fastrand::Rng::with_seed(0xb0b0_0001);
    for (p, t) in accepted_pairs() {
        let tiles = p.tiles(t).unwrap();
        for _ in 0..120 {
            let (k, n) = (rng.usize(1..=160), rng.usize(1..=140));
            let geo = layout::native_b_geometry(p, t, k, n).unwrap();
            assert_eq!((geo.k, geo.n, geo.sn, geo.sk), (k, n, tiles.b_n, tiles.b_k));
            check_b(&geo, k, n, tiles.b_n, tiles.b_k, segment(p), &mut rng);
        }
        for (k, n) in [
            (1, 1),
            (tiles.b_k, tiles.b_n),
            (tiles.b_k + 1, tiles.b_n + 1),
            (1, 2 * tiles.b_n),
        ] {
            let geo = layout::native_b_geometry(p, t, k, n).unwrap();
            check_b(&geo, k, n, tiles.b_n, tiles.b_k, segment(p), &mut rng);
        }
    }
}

#[test]
fn native_b_segmented_on_rk3588_and_rk3576() {
    let mut rng = fastrand::Rng::with_seed(0x5e9_0001);
    for p in [Platform::Rk3588, Platform::Rk3576] {
        let s = segment(p).unwrap();
        let mut seen = Vec::new();
        for (q, t) in accepted_pairs() {
            let tiles = q.tiles(t).unwrap();
            if q != p || seen.contains(&(tiles.b_n, tiles.b_k)) {
                continue;
            }
            seen.push((tiles.b_n, tiles.b_k));
            let mut shapes = vec![
                (s, 3),
                (s + 1, 5),
                (2 * s, 2),
                (2 * s + 17, tiles.b_n + 1),
                (s + 32, 1),
            ];
            if p == Platform::Rk3588 {
                shapes.push((15360, 3)); // [hw] K = 15360: two blocks, 8192 + 7168.
            } else {
                shapes.push((3 * s + 1, 2));
            }
            for _ in 0..4 {
                shapes.push((
                    rng.usize(s + 1..=5 * s / 2),
                    rng.usize(1..=2 * tiles.b_n + 3),
                ));
            }
            for (k, n) in shapes {
                let geo = layout::native_b_geometry(p, t, k, n).unwrap();
                check_b(&geo, k, n, tiles.b_n, tiles.b_k, Some(s), &mut rng);
                assert_eq!(geo.segments(), k.div_ceil(s), "{p:?} K={k}");
            }
        }
        assert!(!seen.is_empty());
    }
}

#[test]
fn native_b_never_segmented_on_single_core_chips() {
    let mut rng = fastrand::Rng::with_seed(0x5e9_0002);
    for p in [Platform::Rk3562, Platform::Rk3566, Platform::Rk3568] {
        for raw in [1, 2] {
            let t = mt(raw);
            let tiles = p.tiles(t).unwrap();
            let (k, n) = (10240, 9);
            let geo = layout::native_b_geometry(p, t, k, n).unwrap();
            assert_eq!(geo.segments(), 1);
            check_b(&geo, k, n, tiles.b_n, tiles.b_k, None, &mut rng);
        }
    }
}

#[test]
fn native_b_small_segments_random_shapes() {
    // The segmentation rule with small segments, to cover many block boundaries cheaply.
    let mut rng = fastrand::Rng::with_seed(0x5e9_0003);
    let tiles = [(64, 32), (32, 32), (16, 32), (8, 32), (8, 16)];
    for i in 0..1500 {
        let (sn, sk) = tiles[i % tiles.len()];
        let seg = sk * rng.usize(1..=4);
        let k = rng.usize(1..=6 * seg);
        let n = rng.usize(1..=2 * sn + 5);
        let geo = NativeB::new(k, n, sn, sk, Some(seg)).unwrap();
        check_b(&geo, k, n, sn, sk, Some(seg), &mut rng);
        let geo = NativeB::new(k, n, sn, sk, None).unwrap();
        check_b(&geo, k, n, sn, sk, None, &mut rng);
    }
}

#[test]
fn int4_round_trip_all_values() {
    for a in -8i8..=7 {
        for b in -8i8..=7 {
            let mut packed = [0u8; 1];
            pack_i4(&[a, b], &mut packed);
            assert_eq!(
                packed[0],
                (a as u8 & 0x0f) | ((b as u8 & 0x0f) << 4),
                "({a}, {b})"
            );
            let mut back = [0i8; 2];
            unpack_i4(&packed, &mut back);
            assert_eq!(back, [a, b]);
        }
    }
    // Even element in the low nibble, two's complement.
    let mut packed = [0u8; 2];
    pack_i4(&[1, -1, -8, 7], &mut packed);
    assert_eq!(packed, [0xf1, 0x78]);
}

#[test]
fn int4_odd_counts_and_random_sequences() {
    let mut rng = fastrand::Rng::with_seed(0x14_0001);
    let lens: Vec<usize> = (0..70)
        .chain((0..200).map(|_| rng.usize(0..1000)))
        .collect();
    for len in lens {
        let vals: Vec<i8> = (0..len).map(|_| rng.i8(-8..=7)).collect();
        let bytes = len.div_ceil(2);
        assert_eq!(ElemKind::I4.bytes_for(len), Some(bytes));
        let mut packed = vec![0xaau8; bytes + 1];
        pack_i4(&vals, &mut packed);
        for (i, &v) in vals.iter().enumerate() {
            let nib = if i % 2 == 0 {
                packed[i / 2] & 0x0f
            } else {
                packed[i / 2] >> 4
            };
            assert_eq!(nib, v as u8 & 0x0f, "len {len} element {i}");
        }
        if len % 2 == 1 {
            assert_eq!(
                packed[len / 2] >> 4,
                0,
                "odd count leaves the last high nibble zero (len {len})"
            );
        }
        assert_eq!(
            packed[bytes], 0xaa,
            "pack_i4 wrote past its length (len {len})"
        );
        let mut back = vec![99i8; len];
        unpack_i4(&packed[..bytes], &mut back);
        assert_eq!(back, vals, "len {len}");
    }
}

// ---------------------------------------------------------------- io_descs

fn expect_desc(
    d: &layout::TensorDesc,
    name: &str,
    dims: &[usize],
    kind: ElemKind,
    layout: Layout,
    what: &str,
) {
    assert_eq!(d.name, name, "{what}");
    assert_eq!(&d.dims[..d.n_dims], dims, "{name} dims {what}");
    assert_eq!(d.kind, kind, "{name} kind {what}");
    assert_eq!(
        d.kind.tensor_type(),
        common::tensor_type(kind),
        "{name} tensor type {what}"
    );
    assert_eq!(d.layout, layout, "{name} layout {what}");
    let elements: usize = dims.iter().product();
    assert_eq!(d.elements(), elements, "{name} elements {what}");
    assert_eq!(
        d.size_bytes(),
        (elements * bits(kind)).div_ceil(8),
        "{name} bytes {what}"
    );
}

fn check_descs(p: Platform, cfg: &MatmulConfig) {
    let what = format!(
        "{p:?} {} M={} K={} N={} B {:?} AC {:?}",
        cfg.t, cfg.m, cfg.k, cfg.n, cfg.b_layout, cfg.ac_layout
    );
    let (m, k, n, t) = (cfg.m, cfg.k, cfg.n, cfg.t);
    let (ask, (bsn, bsk), csn) = (a_sk(p, t.a).unwrap(), b_tile(p, t.b).unwrap(), c_sn(t.c));
    let [a, b, c] = layout::io_descs(p, cfg).unwrap_or_else(|e| panic!("io_descs {what}: {e}"));
    match cfg.ac_layout {
        Layout::Native => {
            expect_desc(
                &a,
                "A",
                &[k.div_ceil(ask), m, ask],
                t.a,
                Layout::Native,
                &what,
            );
            expect_desc(
                &c,
                "C",
                &[n.div_ceil(csn), m, csn],
                t.c,
                Layout::Native,
                &what,
            );
            assert_eq!(Some(a.elements()), native_a_len(m, k, ask));
            assert_eq!(Some(c.elements()), native_c_len(m, n, csn));
        }
        _ => {
            expect_desc(&a, "A", &[m, k], t.a, Layout::Norm, &what);
            expect_desc(&c, "C", &[m, n], t.c, Layout::Norm, &what);
        }
    }
    match cfg.b_layout {
        Layout::Native => {
            expect_desc(
                &b,
                "B",
                &[n.div_ceil(bsn), k.div_ceil(bsk), bsn, bsk],
                t.b,
                Layout::Native,
                &what,
            );
            assert_eq!(Some(b.elements()), native_b_len(k, n, bsn, bsk));
        }
        Layout::TpNorm => expect_desc(&b, "B", &[n, k], t.b, Layout::TpNorm, &what),
        Layout::Norm => expect_desc(&b, "B", &[k, n], t.b, Layout::Norm, &what),
    }
}

#[test]
fn io_descs_from_parsed_infos() {
    let mut rng = fastrand::Rng::with_seed(0x10_0001);
    for (p, t) in accepted_pairs() {
        let (ka, na) = {
            let (ka, na) = common::align(p, t.a).unwrap();
            let (kb, nb) = common::align(p, t.b).unwrap();
            (ka.max(kb), na.max(nb))
        };
        for b_layout in 0..=2i16 {
            for ac_layout in 0..=1i16 {
                for _ in 0..6 {
                    let info = rknn_sys::rknn_matmul_info {
                        M: rng.i32(1..=70),
                        K: (ka * rng.usize(1..=12)) as i32,
                        N: (na * rng.usize(1..=12)) as i32,
                        type_: t.raw(),
                        B_layout: b_layout,
                        AC_layout: ac_layout,
                        ..Default::default()
                    };
                    let cfg = parse_info(p, &ShapeRules::accepted(p), &info).unwrap();
                    check_descs(p, &cfg);
                }
            }
        }
    }
}

#[test]
fn io_descs_with_unaligned_shapes_round_tiles_up() {
    // Layout math does not depend on validation: ceil division for K and N, none for M.
    let mut rng = fastrand::Rng::with_seed(0x10_0002);
    let per_layer = QuantType::from_raw(0).unwrap();
    for (p, t) in accepted_pairs() {
        for b_layout in [Layout::Norm, Layout::Native, Layout::TpNorm] {
            for ac_layout in [Layout::Norm, Layout::Native] {
                for _ in 0..10 {
                    let cfg = MatmulConfig {
                        t,
                        m: rng.usize(1..=40),
                        k: rng.usize(1..=300),
                        n: rng.usize(1..=300),
                        b_layout,
                        ac_layout,
                        b_quant: per_layer,
                        ac_quant: per_layer,
                        group_size: 0,
                    };
                    check_descs(p, &cfg);
                }
            }
        }
    }
}

#[test]
fn io_descs_int4_sizes_are_half_a_byte() {
    let p = Platform::Rk3588;
    let t = mt(10);
    let info = rknn_sys::rknn_matmul_info {
        M: 3,
        K: 64,
        N: 128,
        type_: 10,
        B_layout: 1,
        AC_layout: 1,
        ..Default::default()
    };
    let cfg = parse_info(p, &ShapeRules::accepted(p), &info).unwrap();
    let [a, b, c] = layout::io_descs(p, &cfg).unwrap();
    assert_eq!((a.kind, b.kind, c.kind), (t.a, t.b, t.c));
    assert_eq!(&a.dims[..3], &[2, 3, 32]);
    assert_eq!(a.size_bytes(), 2 * 3 * 32 / 2);
    assert_eq!(&b.dims[..4], &[2, 2, 64, 32]);
    assert_eq!(b.size_bytes(), 64 * 128 / 2);
    assert_eq!(&c.dims[..3], &[16, 3, 8]);
    assert_eq!(c.size_bytes(), 3 * 128 * 2);
}
