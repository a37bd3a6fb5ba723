//! Sizes, alignments, field offsets and constant values, asserted against the fact sheet
//! (`docs/rknn-matmul-facts.md` sections 1-3). A mismatch here means memory corruption at the
//! C boundary, so every field and every constant is listed.

use rknn_sys::*;
use std::mem::{align_of, offset_of, size_of};

macro_rules! assert_layout {
    ($ty:ty, size $size:expr, align $align:expr, { $($field:ident @ $off:expr),* $(,)? }) => {{
        assert_eq!(size_of::<$ty>(), $size, "size of {}", stringify!($ty));
        assert_eq!(align_of::<$ty>(), $align, "align of {}", stringify!($ty));
        $(assert_eq!(offset_of!($ty, $field), $off, "offset of {}.{}", stringify!($ty), stringify!($field));)*
    }};
}

#[test]
fn handles_have_the_platform_width() {
    #[cfg(not(target_arch = "arm"))]
    assert_eq!(size_of::<rknn_context>(), 8);
    #[cfg(target_arch = "arm")]
    assert_eq!(size_of::<rknn_context>(), 4);
    assert_eq!(size_of::<rknn_matmul_ctx>(), size_of::<rknn_context>());
}

#[test]
fn every_enum_is_a_c_int() {
    assert_eq!(size_of::<rknn_matmul_type>(), 4);
    assert_eq!(size_of::<rknn_matmul_quant_type>(), 4);
    assert_eq!(size_of::<rknn_matmul_layout>(), 4);
    assert_eq!(size_of::<rknn_core_mask>(), 4);
    assert_eq!(size_of::<rknn_tensor_type>(), 4);
    assert_eq!(size_of::<rknn_mem_alloc_flags>(), 4);
    assert_eq!(size_of::<rknn_mem_sync_mode>(), 4);
    assert_eq!(size_of::<rknn_tensor_mem_flags>(), 4);
    assert_eq!(size_of::<rknn_query_cmd>(), 4);
}

#[cfg(target_pointer_width = "64")]
#[test]
fn struct_layouts_match_lp64() {
    assert_layout!(rknn_matmul_info, size 64, align 4, {
        M @ 0, K @ 4, N @ 8, type_ @ 12, B_layout @ 16, B_quant_type @ 18, AC_layout @ 20,
        AC_quant_type @ 22, iommu_domain_id @ 24, group_size @ 28, reserved @ 30,
    });
    assert_eq!(size_of::<[i8; 34]>(), 34, "reserved is 34 bytes");
    assert_layout!(rknn_matmul_tensor_attr, size 332, align 4, {
        name @ 0, n_dims @ 256, dims @ 260, size @ 324, type_ @ 328,
    });
    assert_layout!(rknn_matmul_io_attr, size 996, align 4, { A @ 0, B @ 332, C @ 664 });
    assert_layout!(rknn_matmul_shape, size 12, align 4, { M @ 0, K @ 4, N @ 8 });
    assert_layout!(rknn_quant_params, size 288, align 8, {
        name @ 0, scale @ 256, scale_len @ 264, zp @ 272, zp_len @ 280,
    });
    assert_layout!(rknn_tensor_mem, size 40, align 8, {
        virt_addr @ 0, phys_addr @ 8, fd @ 16, offset @ 20, size @ 24, flags @ 28, priv_data @ 32,
    });
    assert_layout!(rknn_sdk_version, size 512, align 1, { api_version @ 0, drv_version @ 256 });
}

#[test]
fn array_constants() {
    assert_eq!(RKNN_MAX_DIMS, 16);
    assert_eq!(RKNN_MAX_NAME_LEN, 256);
    assert_eq!(RKNN_MAX_DYNAMIC_SHAPE_NUM, 512);
    let attr = rknn_matmul_tensor_attr::default();
    assert_eq!(attr.dims.len(), RKNN_MAX_DIMS as usize);
    assert_eq!(attr.name.len(), RKNN_MAX_NAME_LEN as usize);
}

#[test]
fn matmul_types() {
    let table: [(rknn_matmul_type, u32); 13] = [
        (RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32, 1),
        (RKNN_INT8_MM_INT8_TO_INT32, 2),
        (RKNN_INT8_MM_INT8_TO_INT8, 3),
        (RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16, 4),
        (RKNN_FLOAT16_MM_INT8_TO_FLOAT32, 5),
        (RKNN_FLOAT16_MM_INT8_TO_FLOAT16, 6),
        (RKNN_FLOAT16_MM_INT4_TO_FLOAT32, 7),
        (RKNN_FLOAT16_MM_INT4_TO_FLOAT16, 8),
        (RKNN_INT8_MM_INT8_TO_FLOAT32, 9),
        (RKNN_INT4_MM_INT4_TO_INT16, 10),
        (RKNN_INT8_MM_INT4_TO_INT32, 11),
        (RKNN_FLOAT16_MM_INT4_TO_BFLOAT16, 12),
        (RKNN_INT8_MM_INT4_TO_FLOAT16, 15),
    ];
    for (c, v) in table {
        assert_eq!(c, v);
        assert!(matmul_type_name(c).is_some());
    }
    // 13 and 14 do not exist.
    assert_eq!(matmul_type_name(13), None);
    assert_eq!(matmul_type_name(14), None);
    assert_eq!(
        matmul_type_name(RKNN_INT8_MM_INT8_TO_INT32),
        Some("RKNN_INT8_MM_INT8_TO_INT32")
    );
}

#[test]
fn quant_types_and_layouts() {
    assert_eq!(
        [
            RKNN_QUANT_TYPE_PER_LAYER_SYM,
            RKNN_QUANT_TYPE_PER_LAYER_ASYM,
            RKNN_QUANT_TYPE_PER_CHANNEL_SYM,
            RKNN_QUANT_TYPE_PER_CHANNEL_ASYM,
            RKNN_QUANT_TYPE_PER_GROUP_SYM,
            RKNN_QUANT_TYPE_PER_GROUP_ASYM
        ],
        [0, 1, 2, 3, 4, 5]
    );
    assert_eq!(
        [
            RKNN_MM_LAYOUT_NORM,
            RKNN_MM_LAYOUT_NATIVE,
            RKNN_MM_LAYOUT_TP_NORM
        ],
        [0, 1, 2]
    );
}

#[test]
fn core_masks() {
    assert_eq!(RKNN_NPU_CORE_AUTO, 0);
    assert_eq!(RKNN_NPU_CORE_0, 1);
    assert_eq!(RKNN_NPU_CORE_1, 2);
    assert_eq!(RKNN_NPU_CORE_2, 4);
    assert_eq!(RKNN_NPU_CORE_0_1, 3);
    assert_eq!(RKNN_NPU_CORE_0_1_2, 7);
    assert_eq!(RKNN_NPU_CORE_ALL, 0xffff);
    assert_eq!(RKNN_NPU_CORE_UNDEFINED, 0x10000);
}

#[test]
fn tensor_types() {
    assert_eq!(
        [
            RKNN_TENSOR_FLOAT32,
            RKNN_TENSOR_FLOAT16,
            RKNN_TENSOR_INT8,
            RKNN_TENSOR_UINT8,
            RKNN_TENSOR_INT16,
            RKNN_TENSOR_UINT16,
            RKNN_TENSOR_INT32,
            RKNN_TENSOR_UINT32,
            RKNN_TENSOR_INT64,
            RKNN_TENSOR_BOOL,
            RKNN_TENSOR_INT4,
            RKNN_TENSOR_BFLOAT16
        ],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    );
}

#[test]
fn memory_flags_and_sync_modes() {
    assert_eq!(RKNN_FLAG_MEMORY_FLAGS_DEFAULT, 0);
    assert_eq!(RKNN_FLAG_MEMORY_CACHEABLE, 1);
    assert_eq!(RKNN_FLAG_MEMORY_NON_CACHEABLE, 2);
    assert_eq!(RKNN_FLAG_MEMORY_TRY_ALLOC_SRAM, 4);
    assert_eq!(RKNN_MEM_FLAG_ALLOC_NO_CONTEXT, 0x0002_0000);
    assert_eq!(RKNN_MEMORY_SYNC_TO_DEVICE, 1);
    assert_eq!(RKNN_MEMORY_SYNC_FROM_DEVICE, 2);
    assert_eq!(RKNN_MEMORY_SYNC_BIDIRECTIONAL, 3);
    assert_eq!(RKNN_TENSOR_MEMORY_FLAGS_ALLOC_INSIDE, 1);
    assert_eq!(RKNN_TENSOR_MEMORY_FLAGS_FROM_FD, 2);
    assert_eq!(RKNN_TENSOR_MEMORY_FLAGS_FROM_PHYS, 3);
    assert_eq!(RKNN_TENSOR_MEMORY_FLAGS_UNKNOWN, 4);
    assert_eq!(RKNN_QUERY_SDK_VERSION, 5);
}

#[test]
fn error_codes() {
    let table = [
        (RKNN_SUCC as i32, 0),
        (RKNN_ERR_FAIL, -1),
        (RKNN_ERR_TIMEOUT, -2),
        (RKNN_ERR_DEVICE_UNAVAILABLE, -3),
        (RKNN_ERR_MALLOC_FAIL, -4),
        (RKNN_ERR_PARAM_INVALID, -5),
        (RKNN_ERR_MODEL_INVALID, -6),
        (RKNN_ERR_CTX_INVALID, -7),
        (RKNN_ERR_INPUT_INVALID, -8),
        (RKNN_ERR_OUTPUT_INVALID, -9),
        (RKNN_ERR_DEVICE_UNMATCH, -10),
        (RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL, -11),
        (RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION, -12),
        (RKNN_ERR_TARGET_PLATFORM_UNMATCH, -13),
    ];
    for (c, v) in table {
        assert_eq!(c, v);
        assert!(error_name(c).is_some(), "{c} has a name");
    }
    assert_eq!(error_name(-14), None, "undocumented codes stay raw");
}

#[test]
fn the_table_lists_every_function_of_the_fact_sheet_once() {
    let mut all: Vec<&str> = RknnFunctions::REQUIRED_SYMBOLS
        .iter()
        .chain(RknnFunctions::OPTIONAL_SYMBOLS)
        .copied()
        .collect();
    all.sort_unstable();
    let mut expected = vec![
        "rknn_matmul_create",
        "rknn_matmul_create_dynamic_shape",
        "rknn_matmul_set_dynamic_shape",
        "rknn_matmul_set_io_mem",
        "rknn_matmul_set_core_mask",
        "rknn_matmul_set_quant_params",
        "rknn_matmul_get_quant_params",
        "rknn_matmul_run",
        "rknn_matmul_destroy",
        "rknn_B_normal_layout_to_native_layout",
        "rknn_create_mem",
        "rknn_create_mem2",
        "rknn_create_mem_from_fd",
        "rknn_create_mem_from_phys",
        "rknn_destroy_mem",
        "rknn_mem_sync",
        "rknn_query",
        "rknn_set_core_mask",
    ];
    expected.sort_unstable();
    assert_eq!(all, expected);
    // The one non-vendor entry, resolved optionally and never counted as a missing function.
    assert_eq!(RknnFunctions::EXTENSION_SYMBOLS, ["rknn_emu_last_error"]);
}

#[test]
fn function_pointer_types_have_the_c_signatures() {
    // A mismatch here is a wrong ABI at the call: checked by coercing functions of the exact
    // Rust signature to the bound types.
    unsafe extern "C" fn set_core_mask(_: rknn_context, _: rknn_core_mask) -> std::ffi::c_int {
        0
    }
    unsafe extern "C" fn last_error() -> *const std::ffi::c_char {
        c"".as_ptr()
    }
    let f: rknn_set_core_mask_fn = set_core_mask;
    let g: rknn_emu_last_error_fn = last_error;
    // SAFETY: the local functions above touch nothing.
    unsafe {
        assert_eq!(f(0, RKNN_NPU_CORE_0), 0);
        assert_eq!(*g(), 0, "an empty C string");
    }
}
