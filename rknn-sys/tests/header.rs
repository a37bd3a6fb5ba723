//! The C header `include/rknn_matmul_ffi.h` and the committed bindings say the same thing: a C
//! program compiled against the header prints every constant, struct size and field offset, and
//! each must equal the Rust binding's. (bindgen may not be installed where the bindings are
//! edited by hand; this keeps the two in step.) Needs a native C compiler: x86_64 hosts only.

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use rknn_sys::*;

/// `(C expression, value the Rust bindings give it)`.
fn expectations() -> Vec<(String, i128)> {
    let mut v: Vec<(String, i128)> = Vec::new();
    macro_rules! consts {
        ($($name:ident),* $(,)?) => { $(v.push((stringify!($name).into(), $name as i128));)* };
    }
    consts!(
        RKNN_MAX_DIMS,
        RKNN_MAX_NAME_LEN,
        RKNN_MAX_DYNAMIC_SHAPE_NUM,
        RKNN_SUCC,
        RKNN_ERR_FAIL,
        RKNN_ERR_TIMEOUT,
        RKNN_ERR_DEVICE_UNAVAILABLE,
        RKNN_ERR_MALLOC_FAIL,
        RKNN_ERR_PARAM_INVALID,
        RKNN_ERR_MODEL_INVALID,
        RKNN_ERR_CTX_INVALID,
        RKNN_ERR_INPUT_INVALID,
        RKNN_ERR_OUTPUT_INVALID,
        RKNN_ERR_DEVICE_UNMATCH,
        RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL,
        RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION,
        RKNN_ERR_TARGET_PLATFORM_UNMATCH,
        RKNN_MEM_FLAG_ALLOC_NO_CONTEXT,
        RKNN_QUERY_SDK_VERSION,
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
        RKNN_TENSOR_BFLOAT16,
        RKNN_NPU_CORE_AUTO,
        RKNN_NPU_CORE_0,
        RKNN_NPU_CORE_1,
        RKNN_NPU_CORE_2,
        RKNN_NPU_CORE_0_1,
        RKNN_NPU_CORE_0_1_2,
        RKNN_NPU_CORE_ALL,
        RKNN_NPU_CORE_UNDEFINED,
        RKNN_FLAG_MEMORY_FLAGS_DEFAULT,
        RKNN_FLAG_MEMORY_CACHEABLE,
        RKNN_FLAG_MEMORY_NON_CACHEABLE,
        RKNN_FLAG_MEMORY_TRY_ALLOC_SRAM,
        RKNN_MEMORY_SYNC_TO_DEVICE,
        RKNN_MEMORY_SYNC_FROM_DEVICE,
        RKNN_MEMORY_SYNC_BIDIRECTIONAL,
        RKNN_TENSOR_MEMORY_FLAGS_ALLOC_INSIDE,
        RKNN_TENSOR_MEMORY_FLAGS_FROM_FD,
        RKNN_TENSOR_MEMORY_FLAGS_FROM_PHYS,
        RKNN_TENSOR_MEMORY_FLAGS_UNKNOWN,
        RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32,
        RKNN_INT8_MM_INT8_TO_INT32,
        RKNN_INT8_MM_INT8_TO_INT8,
        RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16,
        RKNN_FLOAT16_MM_INT8_TO_FLOAT32,
        RKNN_FLOAT16_MM_INT8_TO_FLOAT16,
        RKNN_FLOAT16_MM_INT4_TO_FLOAT32,
        RKNN_FLOAT16_MM_INT4_TO_FLOAT16,
        RKNN_INT8_MM_INT8_TO_FLOAT32,
        RKNN_INT4_MM_INT4_TO_INT16,
        RKNN_INT8_MM_INT4_TO_INT32,
        RKNN_FLOAT16_MM_INT4_TO_BFLOAT16,
        RKNN_INT8_MM_INT4_TO_FLOAT16,
        RKNN_QUANT_TYPE_PER_LAYER_SYM,
        RKNN_QUANT_TYPE_PER_LAYER_ASYM,
        RKNN_QUANT_TYPE_PER_CHANNEL_SYM,
        RKNN_QUANT_TYPE_PER_CHANNEL_ASYM,
        RKNN_QUANT_TYPE_PER_GROUP_SYM,
        RKNN_QUANT_TYPE_PER_GROUP_ASYM,
        RKNN_MM_LAYOUT_NORM,
        RKNN_MM_LAYOUT_NATIVE,
        RKNN_MM_LAYOUT_TP_NORM,
    );
    macro_rules! layout {
        ($c:literal => $ty:ty { $($field:ident),* }) => {
            v.push((format!("sizeof({})", $c), size_of::<$ty>() as i128));
            v.push((format!("_Alignof({})", $c), std::mem::align_of::<$ty>() as i128));
            $(v.push((
                format!("offsetof({}, {})", $c, stringify!($field).trim_end_matches('_')),
                offset_of!($ty, $field) as i128,
            ));)*
        };
    }
    layout!("rknn_matmul_info" => rknn_matmul_info {
        M, K, N, type_, B_layout, B_quant_type, AC_layout, AC_quant_type, iommu_domain_id,
        group_size, reserved
    });
    layout!("rknn_matmul_tensor_attr" => rknn_matmul_tensor_attr { name, n_dims, dims, size, type_ });
    layout!("rknn_matmul_io_attr" => rknn_matmul_io_attr { A, B, C });
    layout!("rknn_matmul_shape" => rknn_matmul_shape { M, K, N });
    layout!("rknn_quant_params" => rknn_quant_params { name, scale, scale_len, zp, zp_len });
    layout!("rknn_tensor_mem" => rknn_tensor_mem {
        virt_addr, phys_addr, fd, offset, size, flags, priv_data
    });
    layout!("rknn_sdk_version" => rknn_sdk_version { api_version, drv_version });
    layout!("rknn_context" => rknn_context {});
    layout!("rknn_matmul_type" => rknn_matmul_type {});
    layout!("rknn_core_mask" => rknn_core_mask {});
    layout!("rknn_mem_sync_mode" => rknn_mem_sync_mode {});
    v
}

#[test]
#[cfg_attr(
    any(not(target_arch = "x86_64"), miri),
    ignore = "needs a native C toolchain"
)]
fn the_header_and_the_bindings_agree() {
    let expected = expectations();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"rknn_matmul_ffi.h\"\nint main(void) {\n",
    );
    for (expr, _) in &expected {
        src.push_str(&format!(
            "    printf(\"%s=%lld\\n\", \"{expr}\", (long long)({expr}));\n"
        ));
    }
    // Every function the table binds is declared with a matching name (a typo would not link,
    // or not compile with -Werror=implicit-function-declaration).
    for name in RknnFunctions::REQUIRED_SYMBOLS
        .iter()
        .chain(RknnFunctions::OPTIONAL_SYMBOLS)
        .chain(RknnFunctions::EXTENSION_SYMBOLS)
    {
        src.push_str(&format!("    (void)&{name};\n"));
    }
    src.push_str("    return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("rknn_sys_header_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (c, exe) = (dir.join("check.c"), dir.join("check"));
    std::fs::write(&c, src).unwrap();
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    // Compiled only: the functions are referenced, not called, so nothing needs to link but
    // the weak extension; -c plus a link with --unresolved-symbols would be equivalent.
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(&include)
        .arg(&c)
        .arg("-Wl,--unresolved-symbols=ignore-all")
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.status.success());
    let stdout = String::from_utf8(run.stdout).unwrap();
    let got: Vec<(&str, i128)> = stdout
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    assert_eq!(got.len(), expected.len());
    for ((expr, want), (name, value)) in expected.iter().zip(got) {
        assert_eq!(name, expr);
        assert_eq!(value, *want, "{expr}: header says {value}, bindings {want}");
    }
}
