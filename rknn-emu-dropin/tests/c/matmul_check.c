/*
 * A C program written against the runtime's C API (our clean-room header, which declares the
 * same names and layouts as Rockchip's): it runs int8 matmuls through whatever librknnrt.so
 * the loader finds and checks them against a naive loop. The test suite runs it against the
 * emulator's drop-in library. Exit code 0 and "ok" on success.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rknn_matmul_ffi.h"

static int fail(const char *what, int rc) {
    fprintf(stderr, "FAIL: %s (rc=%d)\n", what, rc);
    return 1;
}

static uint32_t seed = 12345;
static int8_t rnd8(void) {
    seed = seed * 1103515245u + 12345u;
    return (int8_t)(seed >> 16);
}

/* One int8 matmul with B in `b_layout`, normal A/C; B native goes through the converter. */
static int check(int M, int K, int N, int b_layout) {
    rknn_matmul_info info;
    memset(&info, 0, sizeof(info));
    info.M = M; info.K = K; info.N = N;
    info.type = RKNN_INT8_MM_INT8_TO_INT32;
    info.B_layout = (int16_t)b_layout;
    info.AC_layout = RKNN_MM_LAYOUT_NORM;
    rknn_matmul_io_attr io;
    memset(&io, 0, sizeof(io));
    rknn_matmul_ctx ctx = 0;
    int rc = rknn_matmul_create(&ctx, &info, &io);
    if (rc != 0) return fail("rknn_matmul_create", rc);
    if (strcmp(io.A.name, "A") || io.A.n_dims != 2 || io.A.dims[0] != (uint32_t)M || io.A.size != (uint32_t)(M * K))
        return fail("io_attr.A", -100);
    if (io.C.size != (uint32_t)(M * N * 4) || io.C.type != RKNN_TENSOR_INT32) return fail("io_attr.C", -100);

    int8_t *a = malloc((size_t)M * K), *b = malloc((size_t)K * N);
    for (int i = 0; i < M * K; i++) a[i] = rnd8();
    for (int i = 0; i < K * N; i++) b[i] = rnd8();
    a[0] = -128; b[0] = -128; /* the extreme product */

    rknn_tensor_mem *A = rknn_create_mem(ctx, io.A.size);
    rknn_tensor_mem *B = rknn_create_mem(ctx, io.B.size);
    rknn_tensor_mem *C = rknn_create_mem(ctx, io.C.size);
    if (!A || !B || !C) return fail("rknn_create_mem", -4);
    memcpy(A->virt_addr, a, (size_t)M * K);
    if (b_layout == RKNN_MM_LAYOUT_NATIVE) {
        rc = rknn_B_normal_layout_to_native_layout(b, B->virt_addr, K, N, &info);
        if (rc != 0) return fail("rknn_B_normal_layout_to_native_layout", rc);
    } else {
        memcpy(B->virt_addr, b, (size_t)K * N);
    }
    rknn_mem_sync(ctx, A, RKNN_MEMORY_SYNC_TO_DEVICE);
    rknn_mem_sync(ctx, B, RKNN_MEMORY_SYNC_TO_DEVICE);
    if ((rc = rknn_matmul_set_io_mem(ctx, A, &io.A)) != 0) return fail("set_io_mem A", rc);
    if ((rc = rknn_matmul_set_io_mem(ctx, B, &io.B)) != 0) return fail("set_io_mem B", rc);
    if ((rc = rknn_matmul_set_io_mem(ctx, C, &io.C)) != 0) return fail("set_io_mem C", rc);
    if ((rc = rknn_matmul_run(ctx)) != 0) return fail("rknn_matmul_run", rc);
    rknn_mem_sync(ctx, C, RKNN_MEMORY_SYNC_FROM_DEVICE);

    const int32_t *c = (const int32_t *)C->virt_addr;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t want = 0;
            for (int k = 0; k < K; k++) want += (int32_t)a[m * K + k] * (int32_t)b[k * N + n];
            if (c[m * N + n] != want) {
                fprintf(stderr, "FAIL: C[%d,%d] = %d, want %d\n", m, n, c[m * N + n], want);
                return 1;
            }
        }
    rknn_destroy_mem(ctx, A);
    rknn_destroy_mem(ctx, B);
    rknn_destroy_mem(ctx, C);
    free(a);
    free(b);
    return rknn_matmul_destroy(ctx) == 0 ? 0 : fail("rknn_matmul_destroy", -1);
}

int main(void) {
    if (sizeof(rknn_matmul_info) != 64 || sizeof(rknn_matmul_io_attr) != 996 || sizeof(rknn_tensor_mem) != 40)
        return fail("struct sizes", -100);
    if (check(3, 64, 32, RKNN_MM_LAYOUT_NORM) || check(5, 96, 64, RKNN_MM_LAYOUT_NATIVE) ||
        check(1, 8192 + 64, 32, RKNN_MM_LAYOUT_NATIVE))
        return 1;

    /* RK3588 has no weight-only int4: creation fails with RKNN_ERR_PARAM_INVALID. */
    rknn_matmul_info info;
    memset(&info, 0, sizeof(info));
    info.M = 1; info.K = 32; info.N = 64; info.type = RKNN_FLOAT16_MM_INT4_TO_FLOAT32;
    rknn_matmul_io_attr io;
    rknn_matmul_ctx ctx = 0;
    int rc = rknn_matmul_create(&ctx, &info, &io);
    if (rc != RKNN_ERR_PARAM_INVALID) return fail("weight-only int4 must be refused", rc);

    /* Bad handles are errors, not crashes. */
    if (rknn_matmul_run((rknn_matmul_ctx)0xdead) != RKNN_ERR_CTX_INVALID) return fail("bad handle", -1);
    if (rknn_destroy_mem(0, NULL) != RKNN_ERR_PARAM_INVALID) return fail("NULL mem", -1);

    printf("ok\n");
    return 0;
}
