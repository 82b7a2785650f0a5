/*
 * 64-bit indexing on the GPU: the headline block (8->16, 3^3, pool 2^3, divisor 2) at batch
 * 4400, so x holds 4400*8*16*64*64 = 2.31e9 elements (9.2 GB), past 2^31 elements, and the
 * conv output 3.8e9 positions. TF32. P and out of a few batch items (the first, one in the
 * middle, the last one below element 2^31, the first one starting at 2^31, the last) are
 * compared with the reference run on just that item: a batch-1 problem pointing into x.
 * Tolerance: test_cuda's TF32 model (see there) on top of the float32 model of check.c.
 * Skips (exit 77) without a GPU or without the device or host memory.
 */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CONVPOOL_HAVE_CUDA

int main(void)
{
    printf("SKIPPED: no CUDA device (convpool was built without CUDA)\n");
    return CHECK_SKIP;
}

#else

#include "check_cuda.h"

/* Overridable (-DCONVPOOL_TEST_BIG_BATCH=n) to try the test on a smaller device. */
#ifdef CONVPOOL_TEST_BIG_BATCH
enum { BIG_BATCH = CONVPOOL_TEST_BIG_BATCH };
#else
enum { BIG_BATCH = 4400 };
#endif

/* Counter-based, so the fill parallelises and does not depend on the thread count. */
static float uniform_at(uint64_t i)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * 0x1.0p-24f;
}

int main(void)
{
    if (!convpool_cuda_available()) {
        printf("SKIPPED: no CUDA device\n");
        return CHECK_SKIP;
    }
    convpool_problem p = convpool_problem_headline();
    p.batch = BIG_BATCH;
    if (convpool_problem_validate(&p) != CONVPOOL_OK) {
        CHECK(0, "big problem invalid: %s", convpool_last_error());
        return check_exit_code("test_cuda_big");
    }
    const int64_t nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p), C = p.out_channels;
    const int64_t B = p.batch, np = B * C;
    const int64_t item = nx / B;
    const size_t x_bytes = sizeof(float) * (size_t)nx;
    printf("test_cuda_big: x %lld elements (%.2f GB), 2^31 = %lld\n", (long long)nx, (double)x_bytes / 1e9,
           (long long)1 << 31);

    size_t free_b = 0, total_b = 0;
    if (!CUDA_OK(cudaMemGetInfo(&free_b, &total_b)))
        return check_exit_code("test_cuda_big");
    if (free_b < x_bytes + ((size_t)256 << 20)) {
        printf("SKIPPED: needs %.2f GB of device memory, %.2f GB free\n", (double)x_bytes / 1e9,
               (double)free_b / 1e9);
        return CHECK_SKIP;
    }
    float *x = (float *)malloc(x_bytes);
    if (!x) {
        printf("SKIPPED: cannot allocate %.2f GB of host memory\n", (double)x_bytes / 1e9);
        return CHECK_SKIP;
    }
    void *dx = NULL;
    const cudaError_t me = cudaMalloc(&dx, x_bytes);
    if (me == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        free(x);
        printf("SKIPPED: cudaMalloc of %.2f GB failed: out of device memory\n", (double)x_bytes / 1e9);
        return CHECK_SKIP;
    }
    if (!CUDA_OK(me)) {
        free(x);
        return check_exit_code("test_cuda_big");
    }

#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nx; ++i)
        x[i] = uniform_at((uint64_t)i); /* torch.rand-like, as in KernelBench */

    check_rng r = check_rng_seed(4400);
    float *w = (float *)check_alloc(sizeof(float) * (size_t)nw);
    float cb[16], bias[16];
    float *pooled = (float *)check_alloc(sizeof(float) * (size_t)np);
    float out[BIG_BATCH];
    float *dw = NULL, *dcb = NULL, *dbias = NULL, *dp = NULL, *dout = NULL;
    void *dws = NULL;
    size_t ws = 0;
    if (!w || !pooled)
        goto done;
    const float bound = (float)(1.0 / sqrt(216.0));
    check_fill_uniform(&r, w, nw, -bound, bound);
    check_fill_uniform(&r, cb, C, -bound, bound);
    check_fill_normal(&r, bias, C, 1.0f);
    check_poison(pooled, np);
    check_poison(out, B);

    CHECK_STATUS("workspace query", convpool_cuda_workspace_size(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &ws),
                 CONVPOOL_OK, NULL);
    if (!CUDA_OK(cudaMemcpy(dx, x, x_bytes, cudaMemcpyHostToDevice)) ||
        !CUDA_OK(cudaMalloc((void **)&dw, sizeof(float) * (size_t)nw)) ||
        !CUDA_OK(cudaMalloc((void **)&dcb, sizeof cb)) || !CUDA_OK(cudaMalloc((void **)&dbias, sizeof bias)) ||
        !CUDA_OK(cudaMalloc((void **)&dp, sizeof(float) * (size_t)np)) ||
        !CUDA_OK(cudaMalloc((void **)&dout, sizeof out)) || (ws && !CUDA_OK(cudaMalloc(&dws, ws))) ||
        !CUDA_OK(cudaMemcpy(dw, w, sizeof(float) * (size_t)nw, cudaMemcpyHostToDevice)) ||
        !CUDA_OK(cudaMemcpy(dcb, cb, sizeof cb, cudaMemcpyHostToDevice)) ||
        !CUDA_OK(cudaMemcpy(dbias, bias, sizeof bias, cudaMemcpyHostToDevice)) ||
        !CUDA_OK(cudaMemcpy(dp, pooled, sizeof(float) * (size_t)np, cudaMemcpyHostToDevice)) ||
        !CUDA_OK(cudaMemcpy(dout, out, sizeof out, cudaMemcpyHostToDevice)))
        goto done;

    cudaEvent_t t0, t1;
    float ms = 0.0f;
    if (!CUDA_OK(cudaEventCreate(&t0)) || !CUDA_OK(cudaEventCreate(&t1)))
        goto done;
    cudaEventRecord(t0, NULL);
    const convpool_status s = convpool_forward_cuda(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, dx, dw, dcb,
                                                    dbias, dp, dout, dws, ws, NULL);
    cudaEventRecord(t1, NULL);
    CHECK(s == CONVPOOL_OK, "convpool_forward_cuda returned %s: %s", convpool_status_name(s), convpool_last_error());
    if (s != CONVPOOL_OK || !CUDA_OK(cudaEventSynchronize(t1)) || !CUDA_OK(cudaGetLastError()))
        goto done;
    cudaEventElapsedTime(&ms, t0, t1);
    printf("test_cuda_big: TF32 forward %.1f ms, %.1f TFLOP/s\n", (double)ms,
           convpool_problem_flops(&p) / ((double)ms * 1e-3) / 1e12);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    if (!CUDA_OK(cudaMemcpy(pooled, dp, sizeof(float) * (size_t)np, cudaMemcpyDeviceToHost)) ||
        !CUDA_OK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost)))
        goto done;
    CHECK(check_count_poison(pooled, np) == 0 && check_count_poison(out, B) == 0,
          "outputs not fully written (%lld of P, %lld of out)", (long long)check_count_poison(pooled, np),
          (long long)check_count_poison(out, B));
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < np; ++i)
        nonfinite += !isfinite(pooled[i]);
    CHECK(nonfinite == 0, "%lld non-finite P values from finite inputs", (long long)nonfinite);

    /* The items around element 2^31: 4095 ends just below it, 4096 starts on it. */
    const int64_t items[5] = {0, B / 2, ((int64_t)1 << 31) / item - 1, ((int64_t)1 << 31) / item, B - 1};
    convpool_problem one = p;
    one.batch = 1;
    check_tol t = check_tol_add(check_tol_fp32(&one), check_tol_fp64(&one));
    t.conv_l2_rel += 8.0 * 0x1.0p-11;
    t.p_rel += 4.0 * 0x1.0p-11;
    for (int i = 0; i < 5; ++i) {
        const int64_t b = items[i];
        if (b >= B)
            continue;
        float ref_p[16], ref_o[1];
        const float *xb = x + b * item;
        CHECK_STATUS("reference on one item", convpool_forward_reference(&one, xb, w, cb, bias, ref_p, ref_o),
                     CONVPOOL_OK, NULL);
        char label[128];
        double ratio = 0.0;
        snprintf(label, sizeof label, "batch item %lld (x elements from %lld)", (long long)b, (long long)(b * item));
        CHECK(check_forward_f(label, &one, xb, w, cb, bias, pooled + b * C, out + b, ref_p, ref_o, t, &ratio) == 0,
              "%s differs from the reference", label);
        printf("test_cuda_big: %s: max err/tol %.3g\n", label, ratio);
    }
done:
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dcb);
    cudaFree(dbias);
    cudaFree(dp);
    cudaFree(dout);
    cudaFree(dws);
    free(x);
    free(w);
    free(pooled);
    return check_exit_code("test_cuda_big");
}

#endif /* CONVPOOL_HAVE_CUDA */
