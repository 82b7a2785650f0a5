/*
 * GPU benchmark of convpool_forward_cuda: one shape, one precision, one dtype.
 *
 * Allocates everything on the device, fills x with uniform [0,1) and the parameters like
 * PyTorch's default init, flushes L2 (writes a buffer of twice the L2 size) before each timed
 * call, and times the call alone with CUDA events. Prints median, p20 and p80 in ms, TFLOP/s
 * (direct-convolution FLOPs) and GB/s (bytes of x and weight read once). Also the host time
 * of one call (200 calls enqueued back to back, no sync between): the baseline against which
 * bench_gpu.py measures the Python binding's overhead.
 *
 * --train times the training forward (convpool_forward_train_cuda: the forward that also writes
 * the arg-max codes; float32 x, the problems it serves). host_query_us is the host time of the
 * call's workspace query alone (the planning every call repeats inside the library).
 * --train-deferred times convpool_forward_train_cuda_deferred instead (the training forward
 * without its near-tie recheck, which PyTorch's binding runs in the backward: what a forward with
 * gradients enabled costs when its output is never differentiated).
 *
 * --backward x|w|xw times convpool_backward_cuda instead (grad_x; grad_weight and
 * grad_conv_bias; or all three) from random arg-max codes (uniform over each window: the
 * kernels' work does not depend on which position wins) and random incoming gradients, float32
 * x, in the given precision; TFLOP/s is then the forward's conv FLOPs per backward second.
 *
 *   bench_gpu [--batch N --cin N --cout N --d N --h N --w N --k N | --kd --kh --kw
 *              --pool N | --pd --ph --pw --divisor F --precision tf32|strict
 *              --dtype f32|f16|bf16 --train | --train-deferred | --backward x|w|xw --iters N --warmup N --seed N
 *              --x-zero-half --x-scale F --json]
 * --x-zero-half: x is 0 in the first half of every row (a flat background beside random values;
 * the strict training forward settles its ties without the near-tie recheck).
 * --x-scale F: x is F times its uniform [0, 1) draw (e.g. 1e5 puts x past float16's range, so
 * the TF32 training paths take their exact fallbacks; 1e-4 puts it under their 2^-9 floor).
 * Defaults: the headline problem, tf32, f32, 100 iterations, 10 warm-up calls.
 */
#define _POSIX_C_SOURCE 200809L

#include "convpool.h"

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_CUDA(call)                                                                         \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "bench_gpu: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), \
                    __FILE__, __LINE__);                                                         \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

typedef struct {
    convpool_problem p;
    convpool_precision precision;
    convpool_dtype dtype;
    int iters, warmup, json;
    int backward; /* 0: the forward; else bit 1 grad_x, bit 2 grad_weight and grad_conv_bias */
    int train;    /* the training forward (with codes): 1, or 2 for the deferred form */
    uint64_t seed;
    int x_zero_half;
    float x_scale;
} options;

static uint64_t rng_state;

static double rng_uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

/* float -> IEEE half, round to nearest even (finite inputs of moderate size). */
static uint16_t float_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        const uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u)))
            ++h;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        ++h;
    return (uint16_t)(sign | h);
}

static uint16_t float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Microseconds from a to b, per call of n. */
static double us_per_call(struct timespec a, struct timespec b, int n)
{
    return ((double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) * 1e-3) / n;
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_gpu [--batch N] [--cin N] [--cout N] [--d N] [--h N] [--w N]\n"
            "                 [--k N | --kd N --kh N --kw N] [--pool N | --pd N --ph N --pw N]\n"
            "                 [--divisor F] [--precision tf32|strict] [--dtype f32|f16|bf16]\n"
            "                 [--train | --train-deferred | --backward x|w|xw] [--iters N] [--warmup N] [--seed N]\n"
            "                 [--x-zero-half] [--x-scale F] [--json]\n");
}

static int parse(int argc, char **argv, options *o)
{
    o->p = convpool_problem_headline();
    o->precision = CONVPOOL_PRECISION_TF32;
    o->dtype = CONVPOOL_DTYPE_F32;
    o->iters = 100;
    o->warmup = 10;
    o->json = 0;
    o->x_zero_half = 0;
    o->x_scale = 1.0f;
    o->train = 0;
    o->backward = 0;
    o->seed = 12345;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *field = NULL;
        if (!strcmp(a, "--train") || !strcmp(a, "--train-deferred")) {
            o->train = a[7] ? 2 : 1;
            continue;
        }
        if (!strcmp(a, "--x-zero-half")) {
            o->x_zero_half = 1;
            continue;
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "bench_gpu: %s needs a value\n", a);
            return 0;
        }
        ++i;
        if (!strcmp(a, "--batch")) field = &o->p.batch;
        else if (!strcmp(a, "--cin")) field = &o->p.in_channels;
        else if (!strcmp(a, "--cout")) field = &o->p.out_channels;
        else if (!strcmp(a, "--d")) field = &o->p.in_d;
        else if (!strcmp(a, "--h")) field = &o->p.in_h;
        else if (!strcmp(a, "--w")) field = &o->p.in_w;
        else if (!strcmp(a, "--kd")) field = &o->p.kernel_d;
        else if (!strcmp(a, "--kh")) field = &o->p.kernel_h;
        else if (!strcmp(a, "--kw")) field = &o->p.kernel_w;
        else if (!strcmp(a, "--pd")) field = &o->p.pool_d;
        else if (!strcmp(a, "--ph")) field = &o->p.pool_h;
        else if (!strcmp(a, "--pw")) field = &o->p.pool_w;
        else if (!strcmp(a, "--k")) {
            o->p.kernel_d = o->p.kernel_h = o->p.kernel_w = strtoll(v, NULL, 10);
        } else if (!strcmp(a, "--pool")) {
            o->p.pool_d = o->p.pool_h = o->p.pool_w = strtoll(v, NULL, 10);
        } else if (!strcmp(a, "--divisor")) {
            o->p.divisor = strtod(v, NULL);
        } else if (!strcmp(a, "--x-scale")) {
            o->x_scale = strtof(v, NULL);
        } else if (!strcmp(a, "--precision")) {
            if (!strcmp(v, "tf32")) o->precision = CONVPOOL_PRECISION_TF32;
            else if (!strcmp(v, "strict")) o->precision = CONVPOOL_PRECISION_STRICT;
            else {
                fprintf(stderr, "bench_gpu: --precision must be tf32 or strict, got %s\n", v);
                return 0;
            }
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f32")) o->dtype = CONVPOOL_DTYPE_F32;
            else if (!strcmp(v, "f16")) o->dtype = CONVPOOL_DTYPE_F16;
            else if (!strcmp(v, "bf16")) o->dtype = CONVPOOL_DTYPE_BF16;
            else {
                fprintf(stderr, "bench_gpu: --dtype must be f32, f16 or bf16, got %s\n", v);
                return 0;
            }
        } else if (!strcmp(a, "--backward")) {
            o->backward = (strchr(v, 'x') ? 1 : 0) | (strchr(v, 'w') ? 2 : 0);
            if (!o->backward || strspn(v, "xw") != strlen(v)) {
                fprintf(stderr, "bench_gpu: --backward must be x, w or xw, got %s\n", v);
                return 0;
            }
        } else if (!strcmp(a, "--iters")) {
            o->iters = atoi(v);
        } else if (!strcmp(a, "--warmup")) {
            o->warmup = atoi(v);
        } else if (!strcmp(a, "--seed")) {
            o->seed = strtoull(v, NULL, 10);
        } else {
            fprintf(stderr, "bench_gpu: unknown option %s\n", a);
            usage();
            return 0;
        }
        if (field)
            *field = strtoll(v, NULL, 10);
    }
    if ((o->backward || o->train) && o->dtype != CONVPOOL_DTYPE_F32) {
        fprintf(stderr, "bench_gpu: --backward and --train take float32 x (--dtype f32)\n");
        return 0;
    }
    if (o->backward && o->train) {
        fprintf(stderr, "bench_gpu: --train and --backward are separate runs\n");
        return 0;
    }
    if (o->iters < 1 || o->warmup < 0) {
        fprintf(stderr, "bench_gpu: --iters must be >= 1 and --warmup >= 0\n");
        return 0;
    }
    return 1;
}

/* One timed call: the forward, or the backward for the outputs --backward names. */
static convpool_status run_once(const options *o, const convpool_problem *p, const void *dx, const float *dw,
                                const float *dcb, const float *db, float *dpooled, float *dout, void *dcodes,
                                const float *dgp, const float *dgo, float *dgx, float *dgw, float *dgcb, void *dws,
                                size_t ws_bytes, cudaStream_t stream)
{
    if (o->train)
        return (o->train == 2 ? convpool_forward_train_cuda_deferred : convpool_forward_train_cuda)(
            p, o->precision, (const float *)dx, dw, dcb, db, dpooled, dout, dcodes, dws, ws_bytes, stream);
    if (!o->backward)
        return convpool_forward_cuda(p, o->precision, o->dtype, dx, dw, dcb, db, dpooled, dout, dws, ws_bytes, stream);
    return convpool_backward_cuda(p, o->precision, (const float *)dx, dw, dcodes, dgp, dgo, dgx, dgw, dgcb, dws,
                                  ws_bytes, stream);
}

int main(int argc, char **argv)
{
    options o;
    if (!parse(argc, argv, &o))
        return 2;
    convpool_problem p = o.p;
    if (convpool_problem_validate(&p) != CONVPOOL_OK) {
        fprintf(stderr, "bench_gpu: invalid problem: %s\n", convpool_last_error());
        return 2;
    }
    if (!convpool_cuda_available()) {
        fprintf(stderr, "bench_gpu: no usable CUDA device: %s\n", convpool_last_error());
        return 1;
    }
    int dev = 0, l2 = 0;
    struct cudaDeviceProp prop;
    BENCH_CUDA(cudaGetDevice(&dev));
    BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
    BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));

    const int64_t nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p);
    const size_t xelem = o.dtype == CONVPOOL_DTYPE_F32 ? 4 : 2;
    rng_state = o.seed * 2654435761u + 1;
    void *hx = malloc((size_t)nx * xelem);
    float *hw = (float *)malloc((size_t)nw * sizeof(float));
    float *hcb = (float *)malloc((size_t)p.out_channels * sizeof(float));
    float *hb = (float *)malloc((size_t)p.out_channels * sizeof(float));
    if (!hx || !hw || !hcb || !hb) {
        fprintf(stderr, "bench_gpu: host allocation failed\n");
        return 1;
    }
    for (int64_t i = 0; i < nx; ++i) {
        const float u = (float)rng_uniform();
        const float v = o.x_zero_half && i % p.in_w < p.in_w / 2 ? 0.0f : u * o.x_scale;
        if (o.dtype == CONVPOOL_DTYPE_F32) ((float *)hx)[i] = v;
        else if (o.dtype == CONVPOOL_DTYPE_F16) ((uint16_t *)hx)[i] = float_to_f16(v);
        else ((uint16_t *)hx)[i] = float_to_bf16(v);
    }
    const double bound = 1.0 / sqrt((double)(nw / p.out_channels));
    for (int64_t i = 0; i < nw; ++i)
        hw[i] = (float)((2.0 * rng_uniform() - 1.0) * bound);
    for (int64_t i = 0; i < p.out_channels; ++i) {
        hcb[i] = (float)((2.0 * rng_uniform() - 1.0) * bound);
        hb[i] = (float)rng_uniform();
    }

    size_t ws_bytes = 0;
    const convpool_status wq = o.backward ? convpool_backward_cuda_workspace_size(&p, o.precision, &ws_bytes)
                                          : convpool_cuda_workspace_size(&p, o.precision, o.dtype, &ws_bytes);
    if (wq != CONVPOOL_OK) {
        fprintf(stderr, "bench_gpu: workspace query failed: %s\n", convpool_last_error());
        return 1;
    }
    void *dx, *dws = NULL, *dflush;
    float *dw, *dcb, *db, *dpooled, *dout;
    const size_t flush_bytes = 2 * (size_t)(l2 > 0 ? l2 : (64 << 20));
    BENCH_CUDA(cudaMalloc(&dx, (size_t)nx * xelem));
    BENCH_CUDA(cudaMalloc((void **)&dw, (size_t)nw * sizeof(float)));
    BENCH_CUDA(cudaMalloc((void **)&dcb, (size_t)p.out_channels * sizeof(float)));
    BENCH_CUDA(cudaMalloc((void **)&db, (size_t)p.out_channels * sizeof(float)));
    BENCH_CUDA(cudaMalloc((void **)&dpooled, (size_t)(p.batch * p.out_channels) * sizeof(float)));
    BENCH_CUDA(cudaMalloc((void **)&dout, (size_t)p.batch * sizeof(float)));
    if (ws_bytes)
        BENCH_CUDA(cudaMalloc(&dws, ws_bytes));
    BENCH_CUDA(cudaMalloc(&dflush, flush_bytes));
    BENCH_CUDA(cudaMemcpy(dx, hx, (size_t)nx * xelem, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(dw, hw, (size_t)nw * sizeof(float), cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(dcb, hcb, (size_t)p.out_channels * sizeof(float), cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(db, hb, (size_t)p.out_channels * sizeof(float), cudaMemcpyHostToDevice));

    /* The backward's inputs: codes uniform over each window, incoming gradients in [-1, 1). */
    void *dcodes = NULL;
    float *dgp = NULL, *dgo = NULL, *dgx = NULL, *dgw = NULL, *dgcb = NULL;
    if (o.train) {
        size_t codes_bytes = 0;
        convpool_codes_size(&p, &codes_bytes);
        BENCH_CUDA(cudaMalloc(&dcodes, codes_bytes ? codes_bytes : 1));
    }
    if (o.backward) {
        const int cb = convpool_code_bytes(&p);
        size_t codes_bytes = 0;
        convpool_codes_size(&p, &codes_bytes);
        const int64_t ncodes = (int64_t)(codes_bytes / (size_t)cb), win = p.pool_d * p.pool_h * p.pool_w;
        unsigned char *hc = (unsigned char *)malloc(codes_bytes ? codes_bytes : 1);
        float *hg = (float *)malloc((size_t)(p.batch * p.out_channels + p.batch) * sizeof(float));
        if (!hc || !hg)
            return 1;
        for (int64_t i = 0; i < ncodes; ++i) {
            const uint32_t c = (uint32_t)(rng_uniform() * (double)win);
            if (cb == 1) hc[i] = (unsigned char)c;
            else if (cb == 2) ((uint16_t *)hc)[i] = (uint16_t)c;
            else ((uint32_t *)hc)[i] = c;
        }
        for (int64_t i = 0; i < p.batch * p.out_channels + p.batch; ++i)
            hg[i] = (float)(2.0 * rng_uniform() - 1.0);
        BENCH_CUDA(cudaMalloc(&dcodes, codes_bytes ? codes_bytes : 1));
        BENCH_CUDA(cudaMalloc((void **)&dgp, (size_t)(p.batch * p.out_channels) * sizeof(float)));
        BENCH_CUDA(cudaMalloc((void **)&dgo, (size_t)p.batch * sizeof(float)));
        BENCH_CUDA(cudaMemcpy(dcodes, hc, codes_bytes, cudaMemcpyHostToDevice));
        BENCH_CUDA(cudaMemcpy(dgp, hg, (size_t)(p.batch * p.out_channels) * sizeof(float), cudaMemcpyHostToDevice));
        BENCH_CUDA(cudaMemcpy(dgo, hg + p.batch * p.out_channels, (size_t)p.batch * sizeof(float),
                              cudaMemcpyHostToDevice));
        if (o.backward & 1)
            BENCH_CUDA(cudaMalloc((void **)&dgx, (size_t)nx * sizeof(float)));
        if (o.backward & 2) {
            BENCH_CUDA(cudaMalloc((void **)&dgw, (size_t)nw * sizeof(float)));
            BENCH_CUDA(cudaMalloc((void **)&dgcb, (size_t)p.out_channels * sizeof(float)));
        }
        free(hc);
        free(hg);
    }

    cudaStream_t stream;
    cudaEvent_t ev0, ev1;
    BENCH_CUDA(cudaStreamCreate(&stream));
    BENCH_CUDA(cudaEventCreate(&ev0));
    BENCH_CUDA(cudaEventCreate(&ev1));

    float *times = (float *)malloc((size_t)o.iters * sizeof(float));
    if (!times)
        return 1;
    for (int i = 0; i < o.warmup + o.iters; ++i) {
        BENCH_CUDA(cudaMemsetAsync(dflush, i & 0xff, flush_bytes, stream));
        BENCH_CUDA(cudaEventRecord(ev0, stream));
        const convpool_status s = run_once(&o, &p, dx, dw, dcb, db, dpooled, dout, dcodes, dgp, dgo, dgx, dgw,
                                           dgcb, dws, ws_bytes, stream);
        BENCH_CUDA(cudaEventRecord(ev1, stream));
        if (s != CONVPOOL_OK) {
            fprintf(stderr, "bench_gpu: %s: %s: %s\n",
                    o.backward ? "convpool_backward_cuda" : o.train == 2 ? "convpool_forward_train_cuda_deferred" : o.train ? "convpool_forward_train_cuda" : "convpool_forward_cuda",
                    convpool_status_name(s), convpool_last_error());
            return 1;
        }
        BENCH_CUDA(cudaEventSynchronize(ev1));
        if (i >= o.warmup)
            BENCH_CUDA(cudaEventElapsedTime(&times[i - o.warmup], ev0, ev1));
    }
    enum { HOST_CALLS = 200 };
    struct timespec h0, h1;
    clock_gettime(CLOCK_MONOTONIC, &h0);
    for (int i = 0; i < HOST_CALLS; ++i)
        if (run_once(&o, &p, dx, dw, dcb, db, dpooled, dout, dcodes, dgp, dgo, dgx, dgw, dgcb, dws, ws_bytes,
                     stream) != CONVPOOL_OK)
            return 1;
    clock_gettime(CLOCK_MONOTONIC, &h1);
    BENCH_CUDA(cudaStreamSynchronize(stream));
    const double host_us = us_per_call(h0, h1, HOST_CALLS);
    clock_gettime(CLOCK_MONOTONIC, &h0);
    for (int i = 0; i < HOST_CALLS; ++i) {
        size_t b = 0;
        if ((o.backward ? convpool_backward_cuda_workspace_size(&p, o.precision, &b)
                        : convpool_cuda_workspace_size(&p, o.precision, o.dtype, &b)) != CONVPOOL_OK)
            return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &h1);
    const double query_us = us_per_call(h0, h1, HOST_CALLS);

    qsort(times, (size_t)o.iters, sizeof(float), cmp_float);
    const double med = times[o.iters / 2], p20 = times[(o.iters * 20) / 100],
                 p80 = times[(o.iters * 80) / 100 < o.iters ? (o.iters * 80) / 100 : o.iters - 1];
    const double flops = convpool_problem_flops(&p);
    const double bytes = (double)nx * (double)xelem + (double)nw * 4.0;
    const double tflops = flops / (med * 1e-3) / 1e12, gbs = bytes / (med * 1e-3) / 1e9;
    const char *prec = o.precision == CONVPOOL_PRECISION_TF32 ? "tf32" : "strict";
    const char *dt = o.dtype == CONVPOOL_DTYPE_F32 ? "f32" : o.dtype == CONVPOOL_DTYPE_F16 ? "f16" : "bf16";
    static const char *variants[4] = {"convpool_cuda", "convpool_cuda_backward_x", "convpool_cuda_backward_w",
                                      "convpool_cuda_backward_xw"};
    const char *variant = o.train ? "convpool_cuda_train" : variants[o.backward];
    if (o.json) {
        printf("{\"variant\": \"%s\", \"gpu\": \"%s\", \"batch\": %lld, \"cin\": %lld, "
               "\"cout\": %lld, \"d\": %lld, \"h\": %lld, \"w\": %lld, \"kernel\": [%lld, %lld, %lld], "
               "\"pool\": [%lld, %lld, %lld], \"divisor\": %g, \"precision\": \"%s\", \"dtype\": \"%s\", "
               "\"iters\": %d, \"median_ms\": %.5f, \"p20_ms\": %.5f, \"p80_ms\": %.5f, "
               "\"tflops\": %.3f, \"gbps\": %.1f, \"host_us\": %.2f, \"host_query_us\": %.2f}\n",
               variant, prop.name, (long long)p.batch, (long long)p.in_channels, (long long)p.out_channels,
               (long long)p.in_d, (long long)p.in_h, (long long)p.in_w, (long long)p.kernel_d,
               (long long)p.kernel_h, (long long)p.kernel_w, (long long)p.pool_d, (long long)p.pool_h,
               (long long)p.pool_w, p.divisor, prec, dt, o.iters, med, p20, p80, tflops, gbs, host_us, query_us);
    } else {
        printf("%s %s | x (%lld, %lld, %lld, %lld, %lld) cout %lld k %lldx%lldx%lld pool %lldx%lldx%lld | "
               "%s %s | median %.4f ms (p20 %.4f, p80 %.4f) | %.1f TFLOP/s | %.0f GB/s | host %.1f us/call "
               "(workspace query %.1f)\n",
               variant, prop.name, (long long)p.batch, (long long)p.in_channels, (long long)p.in_d,
               (long long)p.in_h, (long long)p.in_w, (long long)p.out_channels, (long long)p.kernel_d,
               (long long)p.kernel_h, (long long)p.kernel_w, (long long)p.pool_d, (long long)p.pool_h,
               (long long)p.pool_w, prec, dt, med, p20, p80, tflops, gbs, host_us, query_us);
    }

    free(times);
    free(hx);
    free(hw);
    free(hcb);
    free(hb);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dcb);
    cudaFree(db);
    cudaFree(dpooled);
    cudaFree(dout);
    cudaFree(dws);
    cudaFree(dflush);
    cudaFree(dcodes);
    cudaFree(dgp);
    cudaFree(dgo);
    cudaFree(dgx);
    cudaFree(dgw);
    cudaFree(dgcb);
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaStreamDestroy(stream);
    return 0;
}
