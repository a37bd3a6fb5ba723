//! Bad input at the edges: dimensions the C API cannot carry, sizes that overflow, layout rules,
//! and the int4 converter setting. Every case returns a typed error, never a wrapped number
//! or a panic.

mod common;

use common::mt;
use rknn_chip::layout::{self, NativeB, converter_input_len, native_a_len, native_b_len};
use rknn_chip::{
    Dim, ElemKind, INT4_CONVERTER_INPUT_ENV, Int4ConverterInput, Layout, MatmulConfig, MatmulType,
    Platform, QuantType, RuleViolation, check_dims, check_layouts,
};

const I32_MAX: usize = i32::MAX as usize;

#[test]
fn check_dims_refuses_zero_with_the_dimension_named() {
    for (m, k, n, dim) in [(0, 64, 32, Dim::M), (1, 0, 32, Dim::K), (1, 64, 0, Dim::N)] {
        let err = check_dims(m, k, n).unwrap_err();
        assert_eq!(err, RuleViolation::NotPositive { dim, value: 0 });
        assert_eq!(err.to_string(), format!("{dim}=0 must be at least 1"));
    }
    assert_eq!(check_dims(1, 1, 1), Ok(()));
}

#[test]
fn check_dims_refuses_what_an_i32_cannot_carry() {
    assert_eq!(check_dims(I32_MAX, I32_MAX, I32_MAX), Ok(()));
    // K = 2^32 + 32 would reach the runtime as 32 after `as i32`.
    #[cfg(target_pointer_width = "64")]
    let cases = [
        (I32_MAX + 1, 64, 32, Dim::M, I32_MAX + 1),
        (1, (1usize << 32) + 32, 32, Dim::K, (1usize << 32) + 32),
        (1, 64, usize::MAX, Dim::N, usize::MAX),
    ];
    #[cfg(not(target_pointer_width = "64"))]
    let cases = [
        (I32_MAX + 1, 64, 32, Dim::M, I32_MAX + 1),
        (1, usize::MAX, 32, Dim::K, usize::MAX),
        (1, 64, usize::MAX, Dim::N, usize::MAX),
    ];
    for (m, k, n, dim, value) in cases {
        let err = check_dims(m, k, n).unwrap_err();
        assert_eq!(
            err,
            RuleViolation::DimTooLarge {
                dim,
                value,
                max: I32_MAX
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("{dim}={value}")) && msg.contains("2147483647"),
            "{msg}"
        );
    }
}

#[test]
fn bytes_for_is_checked() {
    assert_eq!(
        ElemKind::I32.bytes_for(usize::MAX / 4),
        Some(usize::MAX / 4 * 4)
    );
    assert_eq!(ElemKind::I32.bytes_for(usize::MAX / 4 + 1), None);
    assert_eq!(ElemKind::F16.bytes_for(usize::MAX / 2 + 1), None);
    assert_eq!(ElemKind::I8.bytes_for(usize::MAX), Some(usize::MAX));
    // int4 never overflows: half a byte each, rounded up.
    assert_eq!(ElemKind::I4.bytes_for(usize::MAX), Some(usize::MAX / 2 + 1));
}

#[test]
fn native_lengths_are_checked() {
    assert_eq!(native_a_len(usize::MAX, 32, 16), None);
    assert_eq!(
        native_a_len(2, usize::MAX, 16),
        None,
        "K rounds up past usize"
    );
    assert_eq!(native_a_len(2, 64, 0), None, "a zero tile has no layout");
    assert_eq!(native_b_len(usize::MAX / 2, 64, 32, 32), None);
    assert_eq!(layout::native_c_len(3, usize::MAX, 4), None);
    assert_eq!(NativeB::new(usize::MAX / 2, 64, 32, 32, None), None);
    assert_eq!(NativeB::new(64, 64, 0, 32, None), None);
    // A segment that is not a multiple of the K tile does not define a layout.
    assert_eq!(NativeB::new(100, 64, 32, 32, Some(48)), None);
    assert_eq!(NativeB::new(100, 64, 32, 32, Some(0)), None);
    let geo = NativeB::new(100, 64, 32, 32, Some(64)).unwrap();
    assert_eq!((geo.len(), geo.segments()), (64 * 128, 2));
}

fn cfg(t: MatmulType, m: usize, k: usize, n: usize) -> MatmulConfig {
    let q = QuantType::from_raw(0).unwrap();
    MatmulConfig {
        t,
        m,
        k,
        n,
        b_layout: Layout::Norm,
        ac_layout: Layout::Norm,
        b_quant: q,
        ac_quant: q,
        group_size: 0,
    }
}

#[test]
fn io_descs_refuse_sizes_a_tensor_attribute_cannot_describe() {
    let p = Platform::Rk3588;
    // An i8 A of 65536 x 65536 bytes is u32::MAX + 1.
    let err = layout::io_descs(p, &cfg(mt(2), 65536, 65536, 32)).unwrap_err();
    assert_eq!(
        err,
        RuleViolation::TooManyBytes {
            matrix: "A",
            bytes: 1 << 32,
            max: u32::MAX as usize
        }
    );
    assert!(err.to_string().contains("4294967295"), "{err}");
    // C of i32: M x N x 4 bytes.
    let err = layout::io_descs(p, &cfg(mt(2), 32768, 32, 32768)).unwrap_err();
    assert!(
        matches!(err, RuleViolation::TooManyBytes { matrix: "C", bytes, .. } if bytes == 1 << 32),
        "{err:?}"
    );
    let [a, b, c] = layout::io_descs(p, &cfg(mt(2), 65535, 65536, 32)).unwrap();
    assert_eq!(
        (a.size_bytes(), b.size_bytes(), c.size_bytes()),
        (65535 * 65536, 65536 * 32, 65535 * 32 * 4)
    );
}

#[cfg(target_pointer_width = "64")]
#[test]
fn io_descs_report_overflow_instead_of_wrapping() {
    // The layout math takes any usize (check_dims bounds the dims first): M = N = 2^31 gives C
    // 2^62 elements of 4 bytes, 2^64 bytes, which wraps in usize; M = N = 2^32 wraps the count.
    let p = Platform::Rk3588;
    for d in [1usize << 31, 1 << 32] {
        let err = layout::io_descs(p, &cfg(mt(2), d, 32, d)).unwrap_err();
        assert_eq!(
            err,
            RuleViolation::SizeOverflow {
                matrix: "C",
                m: d,
                k: 32,
                n: d
            }
        );
        assert!(err.to_string().contains("overflows"), "{err}");
    }
    // The largest legal dims do not overflow: they exceed the u32 size instead.
    let err = layout::io_descs(p, &cfg(mt(2), I32_MAX, 32, I32_MAX)).unwrap_err();
    assert!(
        matches!(err, RuleViolation::TooManyBytes { matrix: "A", .. }),
        "{err:?}"
    );
}

#[test]
fn io_descs_name_an_unsupported_type() {
    let err = layout::io_descs(Platform::Rk3566, &cfg(mt(10), 1, 64, 64)).unwrap_err();
    assert!(
        matches!(
            err,
            RuleViolation::UnsupportedType {
                platform: Platform::Rk3566,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn tp_norm_is_a_layout_of_b_only() {
    for p in Platform::ALL {
        for &t in MatmulType::ALL {
            let err = check_layouts(p, t, Layout::Norm, Layout::TpNorm).unwrap_err();
            assert_eq!(
                err,
                RuleViolation::BadLayout {
                    matrix: "A/C",
                    value: 2
                }
            );
            assert!(err.to_string().contains("B only"), "{err}");
            assert_eq!(check_layouts(p, t, Layout::Native, Layout::Native), Ok(()));
        }
    }
}

#[test]
fn int4_w4a4_on_rk3588_needs_native_b_and_nothing_else_does() {
    // [hw]: RK3588, type 10, B NORM: created, then set_io_mem fails. TP_NORM is not native
    // either.
    let t = mt(10);
    for b in [Layout::Norm, Layout::TpNorm] {
        for ac in [Layout::Norm, Layout::Native] {
            let err = check_layouts(Platform::Rk3588, t, b, ac).unwrap_err();
            assert_eq!(
                err,
                RuleViolation::NeedsNativeB {
                    platform: Platform::Rk3588,
                    t
                }
            );
            let msg = err.to_string();
            assert!(
                msg.contains("RKNN_INT4_MM_INT4_TO_INT16") && msg.contains("native"),
                "{msg}"
            );
        }
    }
    for p in Platform::ALL {
        for &other in MatmulType::ALL {
            for b in [Layout::Norm, Layout::Native, Layout::TpNorm] {
                let needs = p == Platform::Rk3588 && other == t && b != Layout::Native;
                assert_eq!(
                    check_layouts(p, other, b, Layout::Norm).is_err(),
                    needs,
                    "{p} {other} {b:?}"
                );
            }
        }
    }
}

#[test]
fn the_int4_converter_setting_parses_its_two_values() {
    assert_eq!(Int4ConverterInput::default(), Int4ConverterInput::Packed);
    for (s, v) in [
        ("packed", Int4ConverterInput::Packed),
        ("one-per-byte", Int4ConverterInput::OnePerByte),
        (" Packed ", Int4ConverterInput::Packed),
    ] {
        assert_eq!(s.parse::<Int4ConverterInput>(), Ok(v));
        assert_eq!(v.to_string().parse::<Int4ConverterInput>(), Ok(v));
    }
    let err = "nibbles".parse::<Int4ConverterInput>().unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("nibbles") && msg.contains(INT4_CONVERTER_INPUT_ENV),
        "{msg}"
    );
    assert_eq!(INT4_CONVERTER_INPUT_ENV, "RKNN_INT4_B_CONVERTER_INPUT");
}

#[test]
fn the_converter_reads_what_the_setting_says() {
    // int4: K*N/2 bytes packed, K*N one per byte; other kinds by their element size.
    let (k, n) = (96, 64);
    assert_eq!(
        converter_input_len(ElemKind::I4, k, n, Int4ConverterInput::Packed),
        Some(k * n / 2)
    );
    assert_eq!(
        converter_input_len(ElemKind::I4, k, n, Int4ConverterInput::OnePerByte),
        Some(k * n)
    );
    for int4 in [Int4ConverterInput::Packed, Int4ConverterInput::OnePerByte] {
        assert_eq!(converter_input_len(ElemKind::I8, k, n, int4), Some(k * n));
        assert_eq!(
            converter_input_len(ElemKind::F16, k, n, int4),
            Some(2 * k * n)
        );
        assert_eq!(
            converter_input_len(ElemKind::F16, usize::MAX, 2, int4),
            None
        );
    }
}
