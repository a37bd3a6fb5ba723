/*
 * rknn_matmul_ffi.h: declarations of the RKNN runtime's matmul + memory API (SDK 2.x).
 *
 * Written by the rknpu-rs project from its own fact sheet (ABI facts: names, values, layouts);
 * this is NOT Rockchip's header and contains none of its text. It exists for two reasons:
 *   1. `regen-bindings.sh` runs bindgen on it to produce `src/bindings.rs`;
 *   2. C programs can compile against it and run on x86 with the emulator's drop-in
 *      librknnrt.so (see rknn-emu-dropin).
 * A maintainer with the vendor SDK regenerates the bindings from the real headers and diffs.
 * Each function below says when to call it; the block before them gives the call order a board
 * needs. One declaration is ours, not Rockchip's: rknn_emu_last_error (the emulator's).
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#ifndef RKNN_MATMUL_FFI_H
#define RKNN_MATMUL_FFI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RKNN_MAX_DIMS 16
#define RKNN_MAX_NAME_LEN 256
#define RKNN_MAX_DYNAMIC_SHAPE_NUM 512

#define RKNN_SUCC 0
#define RKNN_ERR_FAIL -1
#define RKNN_ERR_TIMEOUT -2
#define RKNN_ERR_DEVICE_UNAVAILABLE -3
#define RKNN_ERR_MALLOC_FAIL -4
#define RKNN_ERR_PARAM_INVALID -5
#define RKNN_ERR_MODEL_INVALID -6
#define RKNN_ERR_CTX_INVALID -7
#define RKNN_ERR_INPUT_INVALID -8
#define RKNN_ERR_OUTPUT_INVALID -9
#define RKNN_ERR_DEVICE_UNMATCH -10
#define RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL -11
#define RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION -12
#define RKNN_ERR_TARGET_PLATFORM_UNMATCH -13

/* rknn_create_mem2 flag: allocate without a context (ctx may be 0). The RKNN_FLAG_MEMORY_* flags
 * are the rknn_mem_alloc_flags enum below. */
#define RKNN_MEM_FLAG_ALLOC_NO_CONTEXT 0x00020000

#if defined(__arm__)
typedef uint32_t rknn_context;
#else
typedef uint64_t rknn_context;
#endif
typedef rknn_context rknn_matmul_ctx;

typedef enum _rknn_query_cmd { RKNN_QUERY_SDK_VERSION = 5 } rknn_query_cmd;

typedef enum _rknn_tensor_type {
    RKNN_TENSOR_FLOAT32 = 0, RKNN_TENSOR_FLOAT16, RKNN_TENSOR_INT8, RKNN_TENSOR_UINT8,
    RKNN_TENSOR_INT16, RKNN_TENSOR_UINT16, RKNN_TENSOR_INT32, RKNN_TENSOR_UINT32,
    RKNN_TENSOR_INT64, RKNN_TENSOR_BOOL, RKNN_TENSOR_INT4, RKNN_TENSOR_BFLOAT16
} rknn_tensor_type;

typedef enum _rknn_core_mask {
    RKNN_NPU_CORE_AUTO = 0, RKNN_NPU_CORE_0 = 1, RKNN_NPU_CORE_1 = 2, RKNN_NPU_CORE_2 = 4,
    RKNN_NPU_CORE_0_1 = 3, RKNN_NPU_CORE_0_1_2 = 7, RKNN_NPU_CORE_ALL = 0xffff,
    RKNN_NPU_CORE_UNDEFINED = 0x10000
} rknn_core_mask;

typedef enum _rknn_mem_alloc_flags {
    RKNN_FLAG_MEMORY_FLAGS_DEFAULT = 0, RKNN_FLAG_MEMORY_CACHEABLE = 1,
    RKNN_FLAG_MEMORY_NON_CACHEABLE = 2, RKNN_FLAG_MEMORY_TRY_ALLOC_SRAM = 4
} rknn_mem_alloc_flags;

typedef enum _rknn_mem_sync_mode {
    RKNN_MEMORY_SYNC_TO_DEVICE = 1, RKNN_MEMORY_SYNC_FROM_DEVICE = 2,
    RKNN_MEMORY_SYNC_BIDIRECTIONAL = 3
} rknn_mem_sync_mode;

typedef enum _rknn_tensor_mem_flags {
    RKNN_TENSOR_MEMORY_FLAGS_ALLOC_INSIDE = 1, RKNN_TENSOR_MEMORY_FLAGS_FROM_FD = 2,
    RKNN_TENSOR_MEMORY_FLAGS_FROM_PHYS = 3, RKNN_TENSOR_MEMORY_FLAGS_UNKNOWN = 4
} rknn_tensor_mem_flags;

typedef struct _rknn_tensor_memory {
    void *virt_addr;
    uint64_t phys_addr;
    int32_t fd;
    int32_t offset;
    uint32_t size;
    uint32_t flags;
    void *priv_data;
} rknn_tensor_mem;

typedef struct _rknn_sdk_version {
    char api_version[256];
    char drv_version[256];
} rknn_sdk_version;

typedef enum _rknn_matmul_type {
    RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32 = 1, RKNN_INT8_MM_INT8_TO_INT32 = 2,
    RKNN_INT8_MM_INT8_TO_INT8 = 3, RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16 = 4,
    RKNN_FLOAT16_MM_INT8_TO_FLOAT32 = 5, RKNN_FLOAT16_MM_INT8_TO_FLOAT16 = 6,
    RKNN_FLOAT16_MM_INT4_TO_FLOAT32 = 7, RKNN_FLOAT16_MM_INT4_TO_FLOAT16 = 8,
    RKNN_INT8_MM_INT8_TO_FLOAT32 = 9, RKNN_INT4_MM_INT4_TO_INT16 = 10,
    RKNN_INT8_MM_INT4_TO_INT32 = 11, RKNN_FLOAT16_MM_INT4_TO_BFLOAT16 = 12,
    RKNN_INT8_MM_INT4_TO_FLOAT16 = 15
} rknn_matmul_type;

typedef enum _rknn_matmul_quant_type {
    RKNN_QUANT_TYPE_PER_LAYER_SYM = 0, RKNN_QUANT_TYPE_PER_LAYER_ASYM = 1,
    RKNN_QUANT_TYPE_PER_CHANNEL_SYM = 2, RKNN_QUANT_TYPE_PER_CHANNEL_ASYM = 3,
    RKNN_QUANT_TYPE_PER_GROUP_SYM = 4, RKNN_QUANT_TYPE_PER_GROUP_ASYM = 5
} rknn_matmul_quant_type;

typedef enum _rknn_matmul_layout {
    RKNN_MM_LAYOUT_NORM = 0, RKNN_MM_LAYOUT_NATIVE = 1, RKNN_MM_LAYOUT_TP_NORM = 2
} rknn_matmul_layout;

typedef struct _rknn_matmul_tensor_attr {
    char name[RKNN_MAX_NAME_LEN];
    uint32_t n_dims;
    uint32_t dims[RKNN_MAX_DIMS];
    uint32_t size;
    rknn_tensor_type type;
} rknn_matmul_tensor_attr;

typedef struct _rknn_matmul_io_attr {
    rknn_matmul_tensor_attr A;
    rknn_matmul_tensor_attr B;
    rknn_matmul_tensor_attr C;
} rknn_matmul_io_attr;

typedef struct rknn_matmul_info_t {
    int32_t M;
    int32_t K;
    int32_t N;
    rknn_matmul_type type;
    int16_t B_layout;
    int16_t B_quant_type;
    int16_t AC_layout;
    int16_t AC_quant_type;
    int32_t iommu_domain_id;
    int16_t group_size;
    int8_t reserved[34];
} rknn_matmul_info;

typedef struct _rknn_matmul_shape {
    int32_t M;
    int32_t K;
    int32_t N;
} rknn_matmul_shape;

typedef struct _rknn_quant_params {
    char name[RKNN_MAX_NAME_LEN];
    float *scale;
    int32_t scale_len;
    int32_t *zp;
    int32_t zp_len;
} rknn_quant_params;

/* ===========================================================================================
 * Functions. Every function returns 0 (RKNN_SUCC) or a negative RKNN_ERR_* code, except the
 * rknn_create_mem* family, which returns NULL on failure. The emulator's drop-in library also
 * prints why on stderr ("E RKNN: <function>: <reason> (<code>)"; RKNN_EMU_LOG=0 silences it) and
 * keeps the reason for rknn_emu_last_error() (below); Rockchip's runtime logs its own reasons.
 *
 * The call order a board needs, for one static-shape context:
 *
 *   1. memset the rknn_matmul_info to 0, fill M, K, N, type, B_layout, AC_layout (and the quant
 *      types, group_size, iommu_domain_id when used);
 *   2. rknn_matmul_create                 -> ctx and io_attr (names, dims, sizes, tile sizes);
 *   3. rknn_matmul_set_core_mask          (optional; RK3588/RK3576 only; one core per context);
 *   4. rknn_matmul_set_quant_params       (optional; once per matrix, BEFORE binding B);
 *   5. rknn_create_mem (or _mem2)         for A, B and C with io_attr.{A,B,C}.size;
 *   6. write A and B through mem->virt_addr in the layouts io_attr describes; a native B comes
 *      from rknn_B_normal_layout_to_native_layout (needed for RKNN_INT4_MM_INT4_TO_INT16 on
 *      RK3588, where a normal B fails at set_io_mem);
 *   7. rknn_mem_sync(TO_DEVICE)           for A and B: memories are cacheable, the NPU reads
 *                                         DRAM, not the CPU's cache;
 *   8. rknn_matmul_set_io_mem             for A, B and C, after every write of A or B (the
 *                                         runtime may read and rearrange the data here);
 *   9. rknn_matmul_run;
 *  10. rknn_mem_sync(FROM_DEVICE)         for C, then read C through virt_addr;
 *      repeat 6-10 for new data (B only if it changed);
 *  11. rknn_destroy_mem for A, B and C (bound memories must stay alive until here), then
 *      rknn_matmul_destroy.
 *
 * Dynamic shapes: create with rknn_matmul_create_dynamic_shape, size the memories for the
 * largest shape, then rknn_matmul_set_dynamic_shape(first shape), bind B once, and per shape:
 * set_dynamic_shape, write A, sync, bind A and C with that shape's io_attr, run, sync C.
 *
 * With the emulator, RKNN_EMU_STRICT_CACHE=1 makes a forgotten sync visible: the NPU side sees
 * stale data, as on a board.
 * =========================================================================================== */

/* Creates a matmul context for info's shape, type, layouts and quantisation, and fills io_attr
 * with what A, B and C must look like: name ("A", "B", "C", used by set_io_mem and the quant
 * params), n_dims/dims (2-D normal; native A/C [K/sK, M, sK] and [N/sN, M, sN]; native B
 * [N/sN, K/sK, sN, sK]: read the tile sizes here, never hard-code them), size in bytes (int4:
 * half a byte per element) and tensor type. Unsupported type on this chip, misaligned K or N,
 * or a bad field: RKNN_ERR_PARAM_INVALID. */
int rknn_matmul_create(rknn_matmul_ctx *ctx, rknn_matmul_info *info, rknn_matmul_io_attr *io_attr);

/* As rknn_matmul_create for shape_num (1..RKNN_MAX_DYNAMIC_SHAPE_NUM) shapes, selected later with
 * rknn_matmul_set_dynamic_shape; info's M, K, N are not used; io_attrs receives one entry per
 * shape. With B_layout NORM or NATIVE every shape must have the same K and N (B is bound once
 * for all of them); TP_NORM B may change K and N, and is then bound again per shape. Quant
 * params (set once) are sized for the context's N: the largest N of the shapes. */
int rknn_matmul_create_dynamic_shape(rknn_matmul_ctx *ctx, rknn_matmul_info *info, int shape_num,
                                     rknn_matmul_shape dynamic_shapes[], rknn_matmul_io_attr io_attrs[]);

/* Selects one of the creation shapes (exact M, K, N). Call it before set_io_mem: A and C must be
 * bound again afterwards, with the io_attr of this shape; B stays bound. */
int rknn_matmul_set_dynamic_shape(rknn_matmul_ctx ctx, rknn_matmul_shape *shape);

/* Binds mem as the matrix attr names (pass &io_attr.A, .B or .C unchanged). Call it after the
 * matrix was written and synced to the device, and again after every later write of A or B:
 * the runtime may read and rearrange the data now. The memory must be at least attr->size
 * bytes, belong to the context's IOMMU domain, and stay alive while it is bound. RK3588 with
 * RKNN_INT4_MM_INT4_TO_INT16 refuses a B that is not in the native layout here. */
int rknn_matmul_set_io_mem(rknn_matmul_ctx ctx, rknn_tensor_mem *mem, rknn_matmul_tensor_attr *attr);

/* RK3588 / RK3576 only (single-core chips return RKNN_ERR_FAIL): runs the context on
 * RKNN_NPU_CORE_AUTO or one core (RKNN_NPU_CORE_0, _1, _2). Combined masks are refused for
 * matmul: to use several cores, make one context per core and run them from one thread each. */
int rknn_matmul_set_core_mask(rknn_matmul_ctx context, rknn_core_mask core_mask);

/* Quantisation parameters of the matrix params->name ("A", "B" or "C"): scale_len scales and
 * zp_len zero points (0 or the same count). Lengths: per-layer 1, per-channel N, per-group
 * N*K/group_size (order [K/group_size][N]). The arrays are copied. Call it once per matrix,
 * after create and before B is bound (B may be converted at set_io_mem with these values). */
int rknn_matmul_set_quant_params(rknn_matmul_ctx context, rknn_quant_params *params);

/* Only for RKNN_INT8_MM_INT8_TO_INT32 with per-channel B: writes one normalised scale to *scale
 * (and, when params->scale holds N floats, the per-channel scales divided by it). */
int rknn_matmul_get_quant_params(rknn_matmul_ctx ctx, rknn_quant_params *params, float *scale);

/* Computes C = A x B with the bound memories (blocking). A and B must be bound (-8 otherwise),
 * C too (-9). Afterwards sync C FROM_DEVICE before the CPU reads it. One context must not be
 * used from two threads at once (on boards this has panicked the kernel; the emulator refuses
 * the second call with RKNN_ERR_FAIL). */
int rknn_matmul_run(rknn_matmul_ctx ctx);

/* Destroys the context. Destroy its memories first. */
int rknn_matmul_destroy(rknn_matmul_ctx ctx);

/* CPU-side conversion of a row-major [K, N] B into the native layout of the configuration in
 * *info (its type and layouts; K and N are the arguments), K segmentation included (on RK3588
 * native B is stored in blocks of 8192 rows of K). B_output must hold io_attr.B.size bytes of a
 * context created with B_layout NATIVE. Input and output must NOT overlap (in place corrupts B
 * on the hardware; the emulator refuses it). int4 input: two values per byte, even element in
 * the low nibble, as Rockchip's 2.x demos pack it; a third-party backend says one value per
 * byte. Unsettled: the emulator reads what RKNN_INT4_B_CONVERTER_INPUT says ("packed", the
 * default, or "one-per-byte"). */
int rknn_B_normal_layout_to_native_layout(void *B_input, void *B_output, int K, int N,
                                          rknn_matmul_info *info);

/* Allocates size bytes of NPU-visible, cacheable memory in the context's IOMMU domain (4 GiB
 * per domain) and returns its descriptor (virt_addr for the CPU, fd, size), or NULL. Each
 * memory holds one dma-buf file descriptor: near 1020 live memories the process runs out of
 * descriptors (ulimit -n 1024). Writing past size faults, as on a board (the emulator maps
 * each memory on its own pages with a guard page after them). */
rknn_tensor_mem *rknn_create_mem(rknn_context ctx, uint32_t size);

/* As rknn_create_mem, with RKNN_FLAG_MEMORY_* flags (cacheable by default, non-cacheable,
 * try SRAM) and RKNN_MEM_FLAG_ALLOC_NO_CONTEXT (then ctx may be 0). size must fit a uint32_t. */
rknn_tensor_mem *rknn_create_mem2(rknn_context ctx, uint64_t size, uint64_t alloc_flags);

/* Wraps an existing dma-buf (fd, its CPU mapping virt_addr, size, offset of the data) as a
 * memory of ctx; rknn_destroy_mem frees only the descriptor. */
rknn_tensor_mem *rknn_create_mem_from_fd(rknn_context ctx, int32_t fd, void *virt_addr, uint32_t size,
                                         int32_t offset);

/* Wraps physically contiguous memory (phys_addr and its CPU mapping virt_addr). */
rknn_tensor_mem *rknn_create_mem_from_phys(rknn_context ctx, uint64_t phys_addr, void *virt_addr,
                                           uint32_t size);

/* Frees a memory made by any rknn_create_mem* (and its descriptor). Not while it is bound to a
 * context that still runs: a later rknn_matmul_run fails. */
int rknn_destroy_mem(rknn_context ctx, rknn_tensor_mem *mem);

/* Cache maintenance of a cacheable memory: RKNN_MEMORY_SYNC_TO_DEVICE after CPU writes (before
 * set_io_mem), RKNN_MEMORY_SYNC_FROM_DEVICE after a run (before the CPU reads C),
 * RKNN_MEMORY_SYNC_BIDIRECTIONAL for both. */
int rknn_mem_sync(rknn_context context, rknn_tensor_mem *mem, rknn_mem_sync_mode mode);

/* RKNN_QUERY_SDK_VERSION fills an rknn_sdk_version (api_version, drv_version): report both in
 * bug reports, runtime/driver version skew is common. ctx may be 0. */
int rknn_query(rknn_context context, rknn_query_cmd cmd, void *info, uint32_t size);

/* The model API's core mask, declared for C code written against the whole vendor API. The
 * emulator has no model API: on a matmul context it acts as rknn_matmul_set_core_mask, any other
 * handle is RKNN_ERR_CTX_INVALID. */
int rknn_set_core_mask(rknn_context context, rknn_core_mask core_mask);

/* rknn-emu extension, NOT part of Rockchip's runtime: the calling thread's last error message of
 * the emulator, "" when no call has failed on this thread. Valid until the thread's next call
 * into the library; kept after later successful calls, like errno. Declared weak, so a program
 * built against this header links with either library; with Rockchip's runtime its address is
 * NULL:
 *     if (rknn_emu_last_error) fprintf(stderr, "%s\n", rknn_emu_last_error());            */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((weak))
#endif
const char *rknn_emu_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* RKNN_MATMUL_FFI_H */
