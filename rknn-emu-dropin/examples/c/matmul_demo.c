/*
 * matmul_demo.c: the RKNN matmul C API used the way a board needs it, checked against a naive
 * reference. It builds against rknn-sys/include/rknn_matmul_ffi.h and runs with any
 * librknnrt.so: Rockchip's on an RK3588 board, or the emulator's drop-in library on x86:
 *
 *   cargo build --release -p rknn-emu-dropin
 *   cc -O2 -I rknn-sys/include rknn-emu-dropin/examples/c/matmul_demo.c \
 *      -L target/release -lrknnrt -o matmul_demo
 *   RKNN_EMU_STRICT_CACHE=1 LD_LIBRARY_PATH=target/release ./matmul_demo
 *
 * RKNN_EMU_STRICT_CACHE=1 makes the emulator's NPU side see only what was synced, as on a
 * board: every rknn_mem_sync below is needed, and dropping one makes a check fail.
 *
 * Four programs in one, each a complete life cycle (create, memories, write, sync, bind, run,
 * sync back, check, destroy):
 *   1. int8 x int8 -> int32, normal layouts: the result must be exact;
 *   2. float16 x float16 -> float32 with B in the native layout, made by
 *      rknn_B_normal_layout_to_native_layout;
 *   3. a dynamic-shape int8 context: B converted and bound once, then per shape only A and C;
 *   4. int4 x int4 -> int16 (RK3588's only int4 mode), which needs a native B there.
 * Prints "ok" and exits 0 when every result matches.
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rknn_matmul_ffi.h"

/* ------------------------------------------------------------------------------------------
 * Error reporting. The runtime returns negative codes; the emulator also says why through its
 * extension rknn_emu_last_error (declared weak in the header: NULL with Rockchip's runtime).
 * ---------------------------------------------------------------------------------------- */
static int failed(const char *what, int rc) {
    fprintf(stderr, "FAIL: %s returned %d", what, rc);
    if (rknn_emu_last_error && rknn_emu_last_error()[0])
        fprintf(stderr, ": %s", rknn_emu_last_error());
    fprintf(stderr, "\n");
    return 1;
}

#define CHECK(call)                              \
    do {                                         \
        int rc_ = (call);                        \
        if (rc_ != RKNN_SUCC) return failed(#call, rc_); \
    } while (0)

/* A small deterministic generator, so that runs are reproducible. */
static uint32_t seed = 2024;
static int next_int(int lo, int hi) { /* lo..=hi */
    seed = seed * 1664525u + 1013904223u;
    return lo + (int)((seed >> 8) % (uint32_t)(hi - lo + 1));
}

/* IEEE binary16 <-> float, written out so that the demo needs no compiler extension. Only
 * values with an exact binary16 form are converted here, so no rounding is needed. */
static uint16_t f32_to_f16_exact(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0) return (uint16_t)sign; /* zero */
    int e = (int)exp - 127 + 15;          /* normal binary16 range only (|f| in 2^-14..65504) */
    return (uint16_t)(sign | ((uint32_t)e << 10) | (man >> 13));
}

/* ------------------------------------------------------------------------------------------
 * 1. int8 x int8 -> int32, A [M, K], B [K, N], C [M, N], all row-major ("normal").
 * ---------------------------------------------------------------------------------------- */
static int demo_int8(void) {
    const int M = 5, K = 96, N = 64;
    rknn_matmul_info info;
    memset(&info, 0, sizeof(info)); /* reserved fields must be zero */
    info.M = M;
    info.K = K;
    info.N = N;
    info.type = RKNN_INT8_MM_INT8_TO_INT32;
    info.B_layout = RKNN_MM_LAYOUT_NORM;
    info.AC_layout = RKNN_MM_LAYOUT_NORM;

    rknn_matmul_io_attr io;
    memset(&io, 0, sizeof(io));
    rknn_matmul_ctx ctx = 0;
    CHECK(rknn_matmul_create(&ctx, &info, &io));

    /* Optional: pin the context to one NPU core. RK3588/RK3576 only (one context per core);
     * the single-core chips answer RKNN_ERR_FAIL, which is not an error for this demo. */
    int rc = rknn_matmul_set_core_mask(ctx, RKNN_NPU_CORE_0);
    if (rc != RKNN_SUCC && rc != RKNN_ERR_FAIL) return failed("rknn_matmul_set_core_mask", rc);

    /* One memory per matrix, with the sizes the runtime reported. rknn_create_mem2 takes the
     * allocation flags: the default is cacheable memory, hence the syncs below. */
    rknn_tensor_mem *A = rknn_create_mem2(ctx, io.A.size, RKNN_FLAG_MEMORY_CACHEABLE);
    rknn_tensor_mem *B = rknn_create_mem(ctx, io.B.size);
    rknn_tensor_mem *C = rknn_create_mem(ctx, io.C.size);
    if (!A || !B || !C) return failed("rknn_create_mem", RKNN_ERR_MALLOC_FAIL);

    /* Write A and B straight into the NPU memories. */
    int8_t *a = (int8_t *)A->virt_addr, *b = (int8_t *)B->virt_addr;
    for (int i = 0; i < M * K; i++) a[i] = (int8_t)next_int(-128, 127);
    for (int i = 0; i < K * N; i++) b[i] = (int8_t)next_int(-128, 127);
    a[0] = -128; /* the extreme product -128 * -128 */
    b[0] = -128;

    /* CPU writes sit in the CPU's cache: push them to DRAM before the NPU reads them. */
    CHECK(rknn_mem_sync(ctx, A, RKNN_MEMORY_SYNC_TO_DEVICE));
    CHECK(rknn_mem_sync(ctx, B, RKNN_MEMORY_SYNC_TO_DEVICE));

    /* Bind after writing: the runtime may read and rearrange the data now. */
    CHECK(rknn_matmul_set_io_mem(ctx, A, &io.A));
    CHECK(rknn_matmul_set_io_mem(ctx, B, &io.B));
    CHECK(rknn_matmul_set_io_mem(ctx, C, &io.C));
    CHECK(rknn_matmul_run(ctx));

    /* The NPU wrote DRAM: drop stale cache lines before the CPU reads C. */
    CHECK(rknn_mem_sync(ctx, C, RKNN_MEMORY_SYNC_FROM_DEVICE));
    const int32_t *c = (const int32_t *)C->virt_addr;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t want = 0;
            for (int k = 0; k < K; k++) want += (int32_t)a[m * K + k] * (int32_t)b[k * N + n];
            if (c[m * N + n] != want) {
                fprintf(stderr, "FAIL: int8 C[%d,%d] = %d, want %d\n", m, n, c[m * N + n], want);
                return 1;
            }
        }

    /* Memories first, then the context. */
    CHECK(rknn_destroy_mem(ctx, A));
    CHECK(rknn_destroy_mem(ctx, B));
    CHECK(rknn_destroy_mem(ctx, C));
    CHECK(rknn_matmul_destroy(ctx));
    printf("int8  %dx%dx%d: exact\n", M, K, N);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * 2. float16 x float16 -> float32, B in the native layout via the runtime's converter.
 * ---------------------------------------------------------------------------------------- */
static int demo_f16_native_b(void) {
    const int M = 3, K = 64, N = 48;
    rknn_matmul_info info;
    memset(&info, 0, sizeof(info));
    info.M = M;
    info.K = K;
    info.N = N;
    info.type = RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32;
    info.B_layout = RKNN_MM_LAYOUT_NATIVE; /* io.B then has 4 dims: [N/sN, K/sK, sN, sK] */
    info.AC_layout = RKNN_MM_LAYOUT_NORM;

    rknn_matmul_io_attr io;
    memset(&io, 0, sizeof(io));
    rknn_matmul_ctx ctx = 0;
    CHECK(rknn_matmul_create(&ctx, &info, &io));
    if (io.B.n_dims != 4) return failed("native B has 4 dims", -100);

    rknn_tensor_mem *A = rknn_create_mem(ctx, io.A.size);
    rknn_tensor_mem *B = rknn_create_mem(ctx, io.B.size);
    rknn_tensor_mem *C = rknn_create_mem(ctx, io.C.size);
    if (!A || !B || !C) return failed("rknn_create_mem", RKNN_ERR_MALLOC_FAIL);

    /* Values in -2..2 in steps of 1/8: exact in binary16, and their products and sums are
     * exact in float32 too, so the reference below is exact whatever the summation order. */
    float *af = malloc(sizeof(float) * M * K), *bf = malloc(sizeof(float) * K * N);
    uint16_t *b_normal = malloc(sizeof(uint16_t) * K * N);
    uint16_t *a16 = (uint16_t *)A->virt_addr;
    for (int i = 0; i < M * K; i++) {
        af[i] = (float)next_int(-16, 16) / 8.0f;
        a16[i] = f32_to_f16_exact(af[i]);
    }
    for (int i = 0; i < K * N; i++) {
        bf[i] = (float)next_int(-16, 16) / 8.0f;
        b_normal[i] = f32_to_f16_exact(bf[i]);
    }

    /* Convert the row-major B into the native layout, straight into B's memory. Input and
     * output must be different buffers: converting in place corrupts B on the hardware. */
    CHECK(rknn_B_normal_layout_to_native_layout(b_normal, B->virt_addr, K, N, &info));

    CHECK(rknn_mem_sync(ctx, A, RKNN_MEMORY_SYNC_TO_DEVICE));
    CHECK(rknn_mem_sync(ctx, B, RKNN_MEMORY_SYNC_TO_DEVICE));
    CHECK(rknn_matmul_set_io_mem(ctx, A, &io.A));
    CHECK(rknn_matmul_set_io_mem(ctx, B, &io.B));
    CHECK(rknn_matmul_set_io_mem(ctx, C, &io.C));
    CHECK(rknn_matmul_run(ctx));
    CHECK(rknn_mem_sync(ctx, C, RKNN_MEMORY_SYNC_FROM_DEVICE));

    const float *c = (const float *)C->virt_addr;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double want = 0;
            for (int k = 0; k < K; k++) want += (double)af[m * K + k] * bf[k * N + n];
            /* f16 accumulation precision is not documented: compare with a tolerance. */
            if (fabs(c[m * N + n] - want) > 1e-3 * (1.0 + fabs(want))) {
                fprintf(stderr, "FAIL: f16 C[%d,%d] = %g, want %g\n", m, n, c[m * N + n], want);
                return 1;
            }
        }
    free(af);
    free(bf);
    free(b_normal);
    CHECK(rknn_destroy_mem(ctx, A));
    CHECK(rknn_destroy_mem(ctx, B));
    CHECK(rknn_destroy_mem(ctx, C));
    CHECK(rknn_matmul_destroy(ctx));
    printf("f16   %dx%dx%d native B: matches\n", M, K, N);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * 3. Dynamic shapes: one context for M = 1, 4 and 16 with the same K and N. B is converted and
 *    bound once; for each shape only A and C are bound again.
 * ---------------------------------------------------------------------------------------- */
static int demo_dynamic_shapes(void) {
    enum { SHAPES = 3 };
    const int K = 64, N = 32;
    rknn_matmul_shape shapes[SHAPES] = {{1, 64, 32}, {4, 64, 32}, {16, 64, 32}};
    rknn_matmul_io_attr io[SHAPES];
    memset(io, 0, sizeof(io));

    rknn_matmul_info info;
    memset(&info, 0, sizeof(info)); /* M, K, N come from the shapes */
    info.type = RKNN_INT8_MM_INT8_TO_INT32;
    info.B_layout = RKNN_MM_LAYOUT_NATIVE;
    info.AC_layout = RKNN_MM_LAYOUT_NORM;
    rknn_matmul_ctx ctx = 0;
    CHECK(rknn_matmul_create_dynamic_shape(&ctx, &info, SHAPES, shapes, io));

    /* Memories for the largest shape. */
    uint32_t a_size = 0, c_size = 0;
    for (int s = 0; s < SHAPES; s++) {
        if (io[s].A.size > a_size) a_size = io[s].A.size;
        if (io[s].C.size > c_size) c_size = io[s].C.size;
    }
    rknn_tensor_mem *A = rknn_create_mem(ctx, a_size);
    rknn_tensor_mem *B = rknn_create_mem(ctx, io[0].B.size);
    rknn_tensor_mem *C = rknn_create_mem(ctx, c_size);
    if (!A || !B || !C) return failed("rknn_create_mem", RKNN_ERR_MALLOC_FAIL);

    /* B: converted from row-major with the context's K and N, synced and bound once, after
     * selecting the first shape. */
    int8_t *b = malloc((size_t)K * N);
    for (int i = 0; i < K * N; i++) b[i] = (int8_t)next_int(-128, 127);
    info.K = K;
    info.N = N;
    CHECK(rknn_B_normal_layout_to_native_layout(b, B->virt_addr, K, N, &info));
    CHECK(rknn_mem_sync(ctx, B, RKNN_MEMORY_SYNC_TO_DEVICE));
    CHECK(rknn_matmul_set_dynamic_shape(ctx, &shapes[0]));
    CHECK(rknn_matmul_set_io_mem(ctx, B, &io[0].B));

    int8_t *a = (int8_t *)A->virt_addr;
    for (int s = 0; s < SHAPES; s++) {
        const int M = shapes[s].M;
        /* Select the shape first: it unbinds A and C, whose sizes change. */
        CHECK(rknn_matmul_set_dynamic_shape(ctx, &shapes[s]));
        for (int i = 0; i < M * K; i++) a[i] = (int8_t)next_int(-128, 127);
        CHECK(rknn_mem_sync(ctx, A, RKNN_MEMORY_SYNC_TO_DEVICE));
        CHECK(rknn_matmul_set_io_mem(ctx, A, &io[s].A)); /* this shape's attributes */
        CHECK(rknn_matmul_set_io_mem(ctx, C, &io[s].C));
        CHECK(rknn_matmul_run(ctx));
        CHECK(rknn_mem_sync(ctx, C, RKNN_MEMORY_SYNC_FROM_DEVICE));
        const int32_t *c = (const int32_t *)C->virt_addr;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                int32_t want = 0;
                for (int k = 0; k < K; k++) want += (int32_t)a[m * K + k] * (int32_t)b[k * N + n];
                if (c[m * N + n] != want) {
                    fprintf(stderr, "FAIL: dynamic M=%d C[%d,%d] = %d, want %d\n", M, m, n,
                            c[m * N + n], want);
                    return 1;
                }
            }
    }
    free(b);
    CHECK(rknn_destroy_mem(ctx, A));
    CHECK(rknn_destroy_mem(ctx, B));
    CHECK(rknn_destroy_mem(ctx, C));
    CHECK(rknn_matmul_destroy(ctx));
    printf("int8  dynamic M = 1, 4, 16 with B bound once: exact\n");
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * 4. int4 x int4 -> int16 (W4A4, RK3588's only int4 mode). RK3588 needs B native here: a
 *    normal B is accepted by create but fails at set_io_mem. int4 values are packed two per
 *    byte, even element in the low nibble, in A and in the converter's input.
 * ---------------------------------------------------------------------------------------- */
static void pack_int4(const int8_t *v, int count, uint8_t *out) {
    for (int i = 0; i < count; i += 2)
        out[i / 2] = (uint8_t)((v[i] & 0xf) | ((i + 1 < count ? v[i + 1] & 0xf : 0) << 4));
}

static int demo_int4(void) {
    const int M = 2, K = 64, N = 64; /* N: a multiple of 64 for int4 */
    rknn_matmul_info info;
    memset(&info, 0, sizeof(info));
    info.M = M;
    info.K = K;
    info.N = N;
    info.type = RKNN_INT4_MM_INT4_TO_INT16;
    info.B_layout = RKNN_MM_LAYOUT_NATIVE;
    info.AC_layout = RKNN_MM_LAYOUT_NORM;
    rknn_matmul_io_attr io;
    memset(&io, 0, sizeof(io));
    rknn_matmul_ctx ctx = 0;
    int rc = rknn_matmul_create(&ctx, &info, &io);
    if (rc == RKNN_ERR_PARAM_INVALID) { /* e.g. RK3566: no int4 matmul */
        printf("int4  not supported on this chip: skipped\n");
        return 0;
    }
    CHECK(rc);
    if (io.A.size != (uint32_t)(M * K / 2)) return failed("int4 A is half a byte each", -100);

    rknn_tensor_mem *A = rknn_create_mem(ctx, io.A.size);
    rknn_tensor_mem *B = rknn_create_mem(ctx, io.B.size);
    rknn_tensor_mem *C = rknn_create_mem(ctx, io.C.size);
    if (!A || !B || !C) return failed("rknn_create_mem", RKNN_ERR_MALLOC_FAIL);

    int8_t a[2 * 64], b[64 * 64];
    for (int i = 0; i < M * K; i++) a[i] = (int8_t)next_int(-8, 7);
    for (int i = 0; i < K * N; i++) b[i] = (int8_t)next_int(-8, 7);
    pack_int4(a, M * K, (uint8_t *)A->virt_addr);
    /* The converter's int4 input: packed as Rockchip's demos pack it (the emulator's default;
     * RKNN_INT4_B_CONVERTER_INPUT=one-per-byte selects the other reading). */
    uint8_t b_packed[64 * 64] = {0}; /* K*N/2 bytes used; sized so either reading stays inside */
    pack_int4(b, K * N, b_packed);
    CHECK(rknn_B_normal_layout_to_native_layout(b_packed, B->virt_addr, K, N, &info));

    CHECK(rknn_mem_sync(ctx, A, RKNN_MEMORY_SYNC_TO_DEVICE));
    CHECK(rknn_mem_sync(ctx, B, RKNN_MEMORY_SYNC_TO_DEVICE));
    CHECK(rknn_matmul_set_io_mem(ctx, A, &io.A));
    CHECK(rknn_matmul_set_io_mem(ctx, B, &io.B));
    CHECK(rknn_matmul_set_io_mem(ctx, C, &io.C));
    CHECK(rknn_matmul_run(ctx));
    CHECK(rknn_mem_sync(ctx, C, RKNN_MEMORY_SYNC_FROM_DEVICE));

    /* K = 64 keeps every sum within int16 (|sum| <= 64 * 64): exact. */
    const int16_t *c = (const int16_t *)C->virt_addr;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int want = 0;
            for (int k = 0; k < K; k++) want += a[m * K + k] * b[k * N + n];
            if (c[m * N + n] != want) {
                fprintf(stderr, "FAIL: int4 C[%d,%d] = %d, want %d\n", m, n, c[m * N + n], want);
                return 1;
            }
        }
    CHECK(rknn_destroy_mem(ctx, A));
    CHECK(rknn_destroy_mem(ctx, B));
    CHECK(rknn_destroy_mem(ctx, C));
    CHECK(rknn_matmul_destroy(ctx));
    printf("int4  %dx%dx%d native B: exact\n", M, K, N);
    return 0;
}

int main(void) {
    rknn_sdk_version v;
    memset(&v, 0, sizeof(v));
    if (rknn_query(0, RKNN_QUERY_SDK_VERSION, &v, sizeof(v)) == RKNN_SUCC)
        printf("runtime %s, driver %s\n", v.api_version, v.drv_version);
    if (demo_int8() || demo_f16_native_b() || demo_dynamic_shapes() || demo_int4()) return 1;
    printf("ok\n");
    return 0;
}
