/*
 * The CUDA path against the reference: every golden file and a seeded sweep of random
 * problems (headline 3^3 / 2^3 with 8->16 channels at several batch and spatial sizes,
 * anisotropic kernels, remainders, odd channel counts, divisors of both signs, 0, +-inf,
 * NaN, NaN/Inf inputs), in both precisions, x as F32 and (where supported) F16 and BF16.
 * Also: outputs poisoned first and guard elements past the end untouched, the workspace
 * exactly as large as the query says, a non-default stream, capture in a CUDA graph (global
 * capture mode: no allocation or synchronisation inside), bit-identical reruns, the
 * full-size headline against the fused CPU path, and the error cases.
 *
 * Tolerance, on top of the float32 model of check.c (FP32 accumulation, the mean, the final
 * roundings). With u the operands' unit roundoff:
 *   TF32 (u = 2^-11): rounding x and w to TF32 makes each product's relative error
 *     d_k = dx_k + dw_k. Their zero-mean part is a random walk over the K products: standard
 *     deviation <= sqrt(2/3) u * max|x| * ||w[c]||_2, so 8 u * max|x| * ||w[c]||_2 is ~10
 *     sigma. Their mean (0 when rounding to nearest, -2u if the hardware truncates) scales the
 *     whole conv, hence P, by (1 + mean): 4u * (|P| + |conv_bias|/|d|). The worst-case form
 *     k u max|x| sum|w[c]| would be about sqrt(K) times looser and lets a missing tap of the
 *     headline (K = 216) pass.
 *   STRICT (u = 2^-23): worst case, 8u * max|x| * sum|w[c]|. Plain FFMA is exact per product;
 *     a 3xTF32 split drops the lo*lo term and rounds the split residuals, about 3 * 2^-22 = 6u.
 *   F16/BF16 x: the reference runs on the same rounded x, so x carries no error. In TF32 mode
 *     the weights may be rounded to the input type to feed its MMA: u becomes 2^-11 (F16) or
 *     2^-9 (BF16), on w only.
 * Without CUDA or a device the test prints "SKIPPED" and exits 77.
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

#ifndef CONVPOOL_GOLDEN_DIR
#define CONVPOOL_GOLDEN_DIR "tests/golden"
#endif

enum {
    GUARD = 16,    /* poisoned elements past each output that must stay untouched */
    N_RANDOM = 220, /* random sweep configurations (headline and channel-group ones come on top) */
    MAX_FILES = 256,
};

/* Multiply-adds per random configuration: the double reference is the cost. */
#define MAC_CAP 4.0e6

static const char *prec_name[2] = {"TF32", "STRICT"};
static const char *dtype_name[3] = {"F32", "F16", "BF16"};

/* Per (precision, dtype): runs, largest error/tolerance seen, unsupported (skipped) runs. */
static int64_t n_runs[2][3], n_unsupported[2][3];
static double worst_ratio[2][3];
static cudaStream_t side_stream;

/* ---- F16 / BF16 on the host, round to nearest even ---- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    const uint32_t x = f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {
        /* Below the smallest normal 2^-14: a multiple of 2^-24, rounded to nearest even. */
        const long m = lrintf(bits_f32(a) * 16777216.0f);
        return (uint16_t)(sign | (uint16_t)m);
    }
    uint32_t h = ((((a >> 23) - 127u + 15u) << 10) | ((a & 0x7fffffu) >> 13));
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        ++h; /* a carry into the exponent is still the right encoding */
    return (uint16_t)(sign | (uint16_t)h);
}

static float f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e - 15u + 127u) << 23) | (m << 13));
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* ---- one problem on the host ---- */

typedef struct host_case {
    convpool_problem p; /* validated */
    float *x, *w, *cb, *bias; /* cb, bias may be NULL */
    int want_out;
} host_case;

static check_tol gpu_tol(const convpool_problem *p, convpool_precision prec, convpool_dtype dt)
{
    check_tol t = check_tol_fp32(p);
    if (prec == CONVPOOL_PRECISION_TF32) {
        const double u = dt == CONVPOOL_DTYPE_BF16 ? 0x1.0p-9 : 0x1.0p-11;
        t.conv_l2_rel += 8.0 * u;
        t.p_rel += 4.0 * u;
    } else {
        t.conv_rel += 8.0 * 0x1.0p-23;
    }
    return t;
}

static int reference(const host_case *hc, const float *x, float *pooled, float *out)
{
    const convpool_status s = convpool_forward_reference(&hc->p, x, hc->w, hc->cb, hc->bias, pooled,
                                                         hc->want_out ? out : NULL);
    CHECK(s == CONVPOOL_OK, "reference failed: %s", convpool_last_error());
    return s == CONVPOOL_OK;
}

/* x converted to dtype: the bytes for the device and the float values they hold. */
static void *to_dtype(const float *x, int64_t n, convpool_dtype dt, float *rounded)
{
    if (dt == CONVPOOL_DTYPE_F32) {
        memcpy(rounded, x, sizeof(float) * (size_t)n);
        return NULL;
    }
    uint16_t *h = (uint16_t *)check_alloc(sizeof(uint16_t) * (size_t)n);
    if (!h)
        return NULL;
    for (int64_t i = 0; i < n; ++i) {
        h[i] = dt == CONVPOOL_DTYPE_F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
        rounded[i] = dt == CONVPOOL_DTYPE_F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
    }
    return h;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    if (!CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1)))
        return NULL;
    if (host && !CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice))) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

/*
 * convpool_forward_cuda on device copies of the inputs; x_bytes of x_host already in dtype.
 * Outputs are poisoned with guards; on success pooled/out (host) receive the results and the
 * outputs are checked fully written and the guards untouched. Returns the status
 * (CONVPOOL_ERR_UNSUPPORTED for a dtype or precision the build does not offer).
 */
static convpool_status gpu_forward(const char *label, const host_case *hc, convpool_precision prec,
                                   convpool_dtype dt, const void *x_host, size_t x_bytes, cudaStream_t stream,
                                   int graph, float *pooled, float *out)
{
    const convpool_problem *p = &hc->p;
    const int64_t C = p->out_channels, B = p->batch, np = B * C;
    const size_t wb = sizeof(float) * (size_t)convpool_weight_numel(p);
    convpool_status s = CONVPOOL_ERR_CUDA;
    size_t ws_bytes = 0;
    void *dx = NULL, *dws = NULL;
    float *dw = NULL, *dcb = NULL, *dbias = NULL, *dp = NULL, *dout = NULL;
    float *hp = (float *)check_alloc(sizeof(float) * (size_t)(np + GUARD));
    float *ho = (float *)check_alloc(sizeof(float) * (size_t)(B + GUARD));
    if (!hp || !ho)
        goto done;

    s = convpool_cuda_workspace_size(p, prec, dt, &ws_bytes);
    if (s == CONVPOOL_ERR_UNSUPPORTED && dt != CONVPOOL_DTYPE_F32)
        goto done;
    CHECK(s == CONVPOOL_OK, "%s: workspace query returned %s: %s", label, convpool_status_name(s),
          convpool_last_error());
    if (s != CONVPOOL_OK)
        goto done;
    s = CONVPOOL_ERR_CUDA;
    check_poison(hp, np + GUARD);
    check_poison(ho, B + GUARD);
    dx = dev_copy(x_host, x_bytes);
    dw = (float *)dev_copy(hc->w, wb);
    dcb = hc->cb ? (float *)dev_copy(hc->cb, sizeof(float) * (size_t)C) : NULL;
    dbias = hc->bias ? (float *)dev_copy(hc->bias, sizeof(float) * (size_t)C) : NULL;
    dp = (float *)dev_copy(hp, sizeof(float) * (size_t)(np + GUARD));
    dout = (float *)dev_copy(ho, sizeof(float) * (size_t)(B + GUARD));
    /* Exactly the queried size, so an overrun shows up under compute-sanitizer. */
    if (ws_bytes)
        dws = dev_copy(NULL, ws_bytes);
    if (!dx || !dw || (hc->cb && !dcb) || (hc->bias && !dbias) || !dp || !dout || (ws_bytes && !dws))
        goto done;
    /* A pageable cudaMemcpy may return before its DMA lands, and a non-blocking stream does
     * not wait for the legacy stream. */
    if (!CUDA_OK(cudaDeviceSynchronize()))
        goto done;

    /* Global capture mode refuses any allocation or synchronisation inside the call. */
    if (graph && !CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal)))
        goto done;
    s = convpool_forward_cuda(p, prec, dt, dx, dw, dcb, dbias, dp, hc->want_out ? dout : NULL, dws, ws_bytes,
                              (void *)stream);
    if (graph) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        const int captured = CUDA_OK(cudaStreamEndCapture(stream, &g));
        if (s == CONVPOOL_OK && captured && CUDA_OK(cudaGraphInstantiate(&ge, g, 0)))
            CUDA_OK(cudaGraphLaunch(ge, stream));
        if (ge)
            cudaGraphExecDestroy(ge);
        if (g)
            cudaGraphDestroy(g);
    }
    if (s == CONVPOOL_ERR_UNSUPPORTED && dt != CONVPOOL_DTYPE_F32)
        goto done;
    CHECK(s == CONVPOOL_OK, "%s%s: convpool_forward_cuda returned %s: %s", label, graph ? " (graph capture)" : "",
          convpool_status_name(s), convpool_last_error());
    if (s != CONVPOOL_OK)
        goto done;
    if (!CUDA_OK(cudaStreamSynchronize(stream)) || !CUDA_OK(cudaGetLastError()) ||
        !CUDA_OK(cudaMemcpy(hp, dp, sizeof(float) * (size_t)(np + GUARD), cudaMemcpyDeviceToHost)) ||
        !CUDA_OK(cudaMemcpy(ho, dout, sizeof(float) * (size_t)(B + GUARD), cudaMemcpyDeviceToHost))) {
        s = CONVPOOL_ERR_CUDA;
        goto done;
    }
    CHECK(check_count_poison(hp, np) == 0, "%s: P not fully written (%lld left)", label,
          (long long)check_count_poison(hp, np));
    CHECK(check_all_poison(hp + np, GUARD), "%s: wrote past the end of P", label);
    if (hc->want_out) {
        CHECK(check_count_poison(ho, B) == 0, "%s: out not fully written", label);
        CHECK(check_all_poison(ho + B, GUARD), "%s: wrote past the end of out", label);
    } else {
        CHECK(check_all_poison(ho, B + GUARD), "%s: wrote out although it was NULL", label);
    }
    memcpy(pooled, hp, sizeof(float) * (size_t)np);
    memcpy(out, ho, sizeof(float) * (size_t)B);
done:
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dcb);
    cudaFree(dbias);
    cudaFree(dp);
    cudaFree(dout);
    cudaFree(dws);
    free(hp);
    free(ho);
    return s;
}

enum { RUN_DETERMINISM = 1, RUN_STREAM = 2, RUN_DTYPES = 4, RUN_GRAPH = 8 };

static void note_unsupported(convpool_precision prec, convpool_dtype dt)
{
    if (n_unsupported[prec][dt]++ == 0)
        printf("SKIP: x dtype %s in %s: CONVPOOL_ERR_UNSUPPORTED (%s)\n", dtype_name[dt], prec_name[prec],
               convpool_last_error());
}

/*
 * All checks of one problem. exp64_p/exp64_out (may be NULL): PyTorch float64 results to
 * compare the F32 runs with as well.
 */
static void run_case(const char *name, const host_case *hc, int flags, const double *exp64_p,
                     const double *exp64_out)
{
    const convpool_problem *p = &hc->p;
    const int64_t nx = convpool_x_numel(p), np = p->batch * p->out_channels, B = p->batch;
    float *xr = (float *)check_alloc(sizeof(float) * (size_t)nx);
    float *ref_p = (float *)check_alloc(sizeof(float) * (size_t)np);
    float *ref_o = (float *)check_alloc(sizeof(float) * (size_t)B);
    float *g_p = (float *)check_alloc(sizeof(float) * (size_t)np);
    float *g_o = (float *)check_alloc(sizeof(float) * (size_t)B);
    float *h_p = (float *)check_alloc(sizeof(float) * (size_t)np);
    float *h_o = (float *)check_alloc(sizeof(float) * (size_t)B);
    char label[320];
    if (!xr || !ref_p || !ref_o || !g_p || !g_o || !h_p || !h_o)
        goto done;
    for (int di = 0; di < 3; ++di) {
        const convpool_dtype dt = (convpool_dtype)di;
        if (dt != CONVPOOL_DTYPE_F32 && !(flags & RUN_DTYPES))
            continue;
        void *xh = to_dtype(hc->x, nx, dt, xr);
        const void *x_host = dt == CONVPOOL_DTYPE_F32 ? (const void *)hc->x : xh;
        const size_t x_bytes = (size_t)nx * (dt == CONVPOOL_DTYPE_F32 ? 4u : 2u);
        if (!x_host || !reference(hc, xr, ref_p, ref_o)) {
            free(xh);
            continue;
        }
        for (int pi = 0; pi < 2; ++pi) {
            const convpool_precision prec = (convpool_precision)pi;
            snprintf(label, sizeof label, "%s %s x=%s", name, prec_name[pi], dtype_name[di]);
            convpool_status s = gpu_forward(label, hc, prec, dt, x_host, x_bytes, NULL, 0, g_p, g_o);
            if (s == CONVPOOL_ERR_UNSUPPORTED && dt != CONVPOOL_DTYPE_F32) {
                note_unsupported(prec, dt);
                continue;
            }
            if (s != CONVPOOL_OK)
                continue;
            ++n_runs[pi][di];
            double ratio = 0.0;
            const check_tol t = check_tol_add(gpu_tol(p, prec, dt), check_tol_fp64(p));
            CHECK(check_forward_f(label, p, xr, hc->w, hc->cb, hc->bias, g_p, hc->want_out ? g_o : NULL, ref_p,
                                  hc->want_out ? ref_o : NULL, t, &ratio) == 0,
                  "%s: differs from the reference", label);
            if (ratio > worst_ratio[pi][di])
                worst_ratio[pi][di] = ratio;
            if (exp64_p && dt == CONVPOOL_DTYPE_F32) {
                char l2[400];
                snprintf(l2, sizeof l2, "%s vs torch float64", label);
                CHECK(check_forward(l2, p, xr, hc->w, hc->cb, hc->bias, g_p, hc->want_out ? g_o : NULL, exp64_p,
                                    exp64_out, check_tol_add(gpu_tol(p, prec, dt), check_tol_fp64(p)), NULL) == 0,
                      "%s: differs from PyTorch float64", l2);
            }
            if (flags & RUN_DETERMINISM) {
                if (gpu_forward(label, hc, prec, dt, x_host, x_bytes, NULL, 0, h_p, h_o) == CONVPOOL_OK)
                    CHECK(check_same_bits("P", g_p, h_p, np) == 0 &&
                              (!hc->want_out || check_same_bits("out", g_o, h_o, B) == 0),
                          "%s: a rerun is not bit-identical", label);
            }
            if (flags & RUN_STREAM) {
                if (gpu_forward(label, hc, prec, dt, x_host, x_bytes, side_stream, 0, h_p, h_o) == CONVPOOL_OK)
                    CHECK(check_same_bits("P", g_p, h_p, np) == 0 &&
                              (!hc->want_out || check_same_bits("out", g_o, h_o, B) == 0),
                          "%s: the run on a non-default stream differs from the default stream", label);
            }
            if (flags & RUN_GRAPH) {
                if (gpu_forward(label, hc, prec, dt, x_host, x_bytes, side_stream, 1, h_p, h_o) == CONVPOOL_OK)
                    CHECK(check_same_bits("P", g_p, h_p, np) == 0 &&
                              (!hc->want_out || check_same_bits("out", g_o, h_o, B) == 0),
                          "%s: the run captured in a CUDA graph differs from the direct run", label);
            }
        }
        free(xh);
    }
done:
    free(xr);
    free(ref_p);
    free(ref_o);
    free(g_p);
    free(g_o);
    free(h_p);
    free(h_o);
}

/* ---- golden files ---- */

static void run_golden(const char *dir)
{
    static char names[MAX_FILES][128];
    const int n = check_golden_manifest(dir, names, MAX_FILES);
    CHECK(n >= 16, "found %d golden files in %s", n, dir);
    for (int i = 0; i < n; ++i) {
        char path[1024];
        check_golden g;
        snprintf(path, sizeof path, "%.880s/%.127s", dir, names[i]);
        if (check_golden_load(path, &g) != 0) {
            CHECK(0, "cannot load %s", path);
            continue;
        }
        host_case hc;
        hc.p = g.p;
        hc.x = g.x;
        hc.w = g.weight;
        hc.cb = g.conv_bias;
        hc.bias = g.bias;
        hc.want_out = 1;
        run_case(names[i], &hc, RUN_DETERMINISM | RUN_DTYPES | (i % 4 == 0 ? RUN_STREAM : 0), g.p64, g.out64);
        check_golden_free(&g);
    }
    printf("test_cuda: %d golden files\n", n < 0 ? 0 : n);
}

/* ---- random sweep ---- */

/* Headline block (8->16, 3^3, pool 2^3) at several batch and spatial sizes. */
static convpool_problem headline_variant(int i)
{
    static const int64_t s[][4] = {
        {1, 16, 64, 64}, {2, 16, 64, 64}, {3, 8, 32, 32}, {4, 16, 34, 35}, {5, 5, 9, 130},
        {1, 4, 4, 4},    {7, 10, 18, 66}, {2, 16, 64, 63}, {6, 4, 66, 8},  {3, 17, 19, 21},
    };
    return convpool_problem_make(s[i][0], 8, 16, s[i][1], s[i][2], s[i][3], 3, 3, 3, 2, 2, 2, 2.0);
}
enum { N_HEADLINE = 10 };

/* The channel-group tensor-core path (kernel 1, 2 or 3, pool 2^3, Cin > 8 or Cout > 16):
 * every pair of Cin {9, 16, 32} x Cout {17, 32, 64} with kernel 3, conv W both even and odd
 * (W % 4 != 0 takes the unaligned staging), then kernels 1 and 2 with Cin > 8, Cout not a
 * multiple of 16 and a pool remainder on every axis. */
static convpool_problem group_variant(int i)
{
    static const int64_t cin[3] = {9, 16, 32}, cout[3] = {17, 32, 64};
    if (i < 9)
        return convpool_problem_make(2, cin[i / 3], cout[i % 3], 6, 9, i % 2 ? 13 : 12, 3, 3, 3, 2, 2, 2,
                                     i % 3 == 1 ? -1.5 : 2.0);
    static const int64_t o[][5] = {
        /* cin, cout, kernel, in_w, batch */
        {12, 20, 2, 9, 2}, {40, 8, 2, 16, 1}, {16, 24, 1, 11, 3}, {9, 70, 1, 8, 1},
    };
    const int64_t *c = o[i - 9], k = c[2];
    return convpool_problem_make(c[4], c[0], c[1], 4 + k, 6 + k, c[3], k, k, k, 2, 2, 2, i % 2 ? 0.7 : -2.0);
}
enum { N_GROUP = 13 };

/* The general tensor-core path: several item tiles along h and w (an item's region starting
 * off a 16-byte boundary), pools of 1, 3, anisotropic and wider than a 4x32 sub-tile, kernels
 * (1,7,7), (3,1,1), 5^3, 7^3, kw 9 and wider kernels (13, 33: a wider staged row), several input
 * and output channel groups, odd W. */
static convpool_problem general_variant(int i)
{
    static const struct { int64_t b, cin, cout, d, h, w, kd, kh, kw, pd, ph, pw; double div; } g[] = {
        {2, 8, 16, 5, 14, 64, 3, 3, 3, 3, 3, 3, 2.0},    {1, 3, 5, 4, 9, 72, 3, 3, 3, 1, 1, 1, -1.5},
        {2, 9, 17, 4, 12, 40, 1, 7, 7, 1, 2, 2, 2.0},    {1, 4, 20, 9, 11, 48, 3, 1, 1, 2, 2, 2, 0.5},
        {1, 2, 3, 9, 20, 44, 7, 7, 7, 2, 2, 2, 2.0},     {1, 5, 6, 6, 30, 80, 2, 3, 2, 3, 9, 40, 1.0},
        {2, 17, 33, 5, 10, 36, 2, 2, 2, 1, 2, 2, -0.75}, {1, 8, 16, 6, 16, 64, 5, 5, 5, 2, 2, 2, 2.0},
        {3, 6, 7, 4, 7, 35, 3, 3, 3, 2, 4, 4, 3.0},      {1, 8, 16, 4, 6, 130, 1, 3, 9, 1, 1, 5, 2.0},
        {1, 3, 5, 3, 7, 80, 1, 3, 13, 1, 2, 3, 2.0},     {2, 2, 3, 4, 5, 64, 2, 2, 33, 1, 1, 2, -1.0},
    };
    return convpool_problem_make(g[i].b, g[i].cin, g[i].cout, g[i].d, g[i].h, g[i].w, g[i].kd, g[i].kh, g[i].kw,
                                 g[i].pd, g[i].ph, g[i].pw, g[i].div);
}
enum { N_GENERAL = 12 };

/* Pools other than 2^3 that the k3p2 and group tiles reduce in registers (pool_h 1, 2, 4;
 * pool_w 1, 2, 4, 8; any pool_d): windows spanning steps (pool_d 3, 4, 5, 9), 1-wide pools,
 * windows across lanes (pool_w 4, 8), odd W (unaligned staging), pool remainders, and a conv
 * d extent that is odd and fully pooled (the last step's second d-row would read the plane past
 * the input: cases 0, 5, 10, 11). 0-6 plan k3p2, 7-15 group (test_plan checks the picks), 12-15
 * with group's 1x3x3 and 3x1x1 kernels. */
static convpool_problem tilepool_variant(int i)
{
    static const struct { int64_t b, cin, cout, d, h, w, k, pd, ph, pw; double div; } g[] = {
        {2, 8, 16, 7, 11, 70, 3, 1, 1, 1, 2.0},   {3, 5, 11, 9, 14, 37, 3, 1, 2, 2, -1.5},
        {1, 8, 16, 12, 18, 66, 3, 4, 4, 4, 2.0},  {2, 3, 7, 8, 10, 35, 3, 2, 4, 4, 0.5},
        {1, 8, 16, 9, 7, 42, 3, 3, 1, 8, -2.0},   {2, 4, 16, 17, 9, 20, 3, 5, 2, 1, 1.0},
        {1, 8, 16, 6, 13, 64, 3, 1, 4, 2, 3.0},   {2, 12, 20, 7, 10, 37, 3, 1, 2, 2, 2.0},
        {1, 8, 16, 9, 19, 64, 1, 4, 4, 4, -1.0},  {2, 9, 33, 8, 9, 19, 2, 3, 1, 4, 0.75},
        {1, 20, 8, 5, 12, 40, 3, 1, 1, 1, 2.0},   {3, 16, 17, 10, 8, 24, 2, 9, 2, 8, 2.0},
        /* group's anisotropic kernels: 1x3x3 and 3x1x1 (k = 13 and 31 below) */
        {2, 8, 16, 6, 12, 37, 13, 2, 2, 2, 2.0},  {1, 11, 24, 5, 11, 40, 13, 1, 4, 4, -1.0},
        {2, 8, 16, 9, 8, 36, 31, 2, 2, 2, 0.5},   {1, 3, 21, 7, 9, 19, 31, 1, 2, 2, 2.0},
    };
    const int64_t k = g[i].k, kd = k == 13 ? 1 : k == 31 ? 3 : k, khw = k == 13 ? 3 : k == 31 ? 1 : k;
    return convpool_problem_make(g[i].b, g[i].cin, g[i].cout, g[i].d, g[i].h, g[i].w, kd, khw, khw, g[i].pd, g[i].ph,
                                 g[i].pw, g[i].div);
}
enum { N_TILEPOOL = 16 };

/* Random problems from check.h's generator (shared with test_cpu_sweep): more pooled
 * positions, up to 33 output channels and batch 4, and one in four the headline kernel and pool
 * with odd extents. */
static convpool_problem random_problem(check_rng *r)
{
    static const check_problem_spec spec = {6, 17, 33, 4, 4, MAC_CAP};
    return check_random_problem(r, &spec, NULL);
}

/* Fills hc's buffers for hc->p (validated) with check.h's filler, as test_cpu_sweep does. */
static int fill_case(check_rng *r, host_case *hc, int with_cb, int want_out, int special)
{
    const convpool_problem *p = &hc->p;
    const int64_t nx = convpool_x_numel(p), nw = convpool_weight_numel(p), C = p->out_channels;
    hc->x = (float *)check_alloc(sizeof(float) * (size_t)nx);
    hc->w = (float *)check_alloc(sizeof(float) * (size_t)nw);
    hc->cb = (float *)check_alloc(sizeof(float) * (size_t)C);
    hc->bias = (float *)check_alloc(sizeof(float) * (size_t)C);
    hc->want_out = want_out;
    if (!hc->x || !hc->w || !hc->cb || !hc->bias)
        return 0;
    /* check.h's filler (shared with test_cpu_sweep); special: NaN/Inf voxels, a zero channel,
     * a non-finite conv bias, normal x. */
    const check_inputs_spec in = check_random_inputs(r, p, special);
    check_fill_inputs(r, p, &in, hc->x, hc->w, hc->cb, hc->bias);
    if (p->divisor == 0.0 || in.conv_bias >= 2)
        with_cb = 1; /* the sign-fixing or the non-finite conv bias is the point */
    if (!with_cb) {
        free(hc->cb);
        hc->cb = NULL;
    }
    if (!want_out && check_rng_int(r, 0, 1)) {
        free(hc->bias);
        hc->bias = NULL;
    }
    return 1;
}

static void free_case(host_case *hc)
{
    free(hc->x);
    free(hc->w);
    free(hc->cb);
    free(hc->bias);
}

static void run_sweep(void)
{
    check_rng r = check_rng_seed(777);
    int n = 0;
    enum { GROUP0 = N_HEADLINE, GENERAL0 = GROUP0 + N_GROUP, TILEPOOL0 = GENERAL0 + N_GENERAL,
           RANDOM0 = TILEPOOL0 + N_TILEPOOL };
    for (int i = 0; i < RANDOM0 + N_RANDOM; ++i) {
        host_case hc;
        memset(&hc, 0, sizeof hc);
        hc.p = i < GROUP0      ? headline_variant(i)
             : i < GENERAL0    ? group_variant(i - GROUP0)
             : i < TILEPOOL0   ? general_variant(i - GENERAL0)
             : i < RANDOM0     ? tilepool_variant(i - TILEPOOL0)
                               : random_problem(&r);
        if (convpool_problem_validate(&hc.p) != CONVPOOL_OK) {
            CHECK(0, "sweep config %d invalid: %s", i, convpool_last_error());
            continue;
        }
        const int headline = i < N_HEADLINE;
        const int with_cb = headline || check_rng_int(&r, 0, 9) != 0;
        const int want_out = headline || check_rng_int(&r, 0, 5) != 0;
        if (fill_case(&r, &hc, with_cb, want_out, !headline)) {
            char name[320];
            snprintf(name, sizeof name,
                     "sweep %d [B%lld Cin%lld Cout%lld in %lldx%lldx%lld k %lldx%lldx%lld pool %lldx%lldx%lld d %g%s%s]",
                     i, (long long)hc.p.batch, (long long)hc.p.in_channels, (long long)hc.p.out_channels,
                     (long long)hc.p.in_d, (long long)hc.p.in_h, (long long)hc.p.in_w, (long long)hc.p.kernel_d,
                     (long long)hc.p.kernel_h, (long long)hc.p.kernel_w, (long long)hc.p.pool_d,
                     (long long)hc.p.pool_h, (long long)hc.p.pool_w, hc.p.divisor, hc.cb ? "" : " no-conv-bias",
                     hc.want_out ? "" : (hc.bias ? " P-only" : " P-only no-bias"));
            const int every_dtype = i >= GENERAL0 && i < RANDOM0; /* the general and tile-pool cases */
            const int flags = RUN_DETERMINISM | (every_dtype || i % 3 == 0 ? RUN_DTYPES : 0) | (i % 5 == 0 ? RUN_STREAM : 0) |
                              (headline || i % 7 == 0 ? RUN_GRAPH : 0);
            run_case(name, &hc, flags, NULL, NULL);
            ++n;
        }
        free_case(&hc);
    }
    printf("test_cuda: %d sweep configurations\n", n);
}

/* ---- big problems against the fused CPU path ---- */

/* p (batch <= 128, Cout <= 16) on the GPU in both precisions against
 * the fused CPU path, x from torch.rand's range and nn.Conv3d's initial weights. */
static void run_vs_cpu(const char *name, convpool_problem p)
{
    host_case hc;
    memset(&hc, 0, sizeof hc);
    hc.p = p;
    CHECK(convpool_problem_validate(&hc.p) == CONVPOOL_OK && hc.p.batch <= 128 && hc.p.out_channels <= 16,
          "%s: bad test problem", name);
    check_rng r = check_rng_seed(128);
    const int64_t nx = convpool_x_numel(&hc.p), nw = convpool_weight_numel(&hc.p), C = hc.p.out_channels;
    hc.x = (float *)check_alloc(sizeof(float) * (size_t)nx);
    hc.w = (float *)check_alloc(sizeof(float) * (size_t)nw);
    hc.cb = (float *)check_alloc(sizeof(float) * (size_t)C);
    hc.bias = (float *)check_alloc(sizeof(float) * (size_t)C);
    hc.want_out = 1;
    float cpu_p[128 * 16], cpu_o[128], g_p[128 * 16], g_o[128];
    if (hc.x && hc.w && hc.cb && hc.bias) {
        check_fill_uniform(&r, hc.x, nx, 0.0f, 1.0f); /* torch.rand, as in KernelBench */
        const float bound = (float)(1.0 / sqrt((double)(nw / C)));
        check_fill_uniform(&r, hc.w, nw, -bound, bound);
        check_fill_uniform(&r, hc.cb, C, -bound, bound);
        check_fill_normal(&r, hc.bias, C, 1.0f);
        convpool_status s = convpool_forward_cpu(&hc.p, hc.x, hc.w, hc.cb, hc.bias, cpu_p, cpu_o, 0);
        CHECK(s == CONVPOOL_OK, "%s cpu: %s", name, convpool_last_error());
        for (int pi = 0; pi < 2 && s == CONVPOOL_OK; ++pi) {
            const convpool_precision prec = (convpool_precision)pi;
            char label[160];
            snprintf(label, sizeof label, "%s %s vs fused CPU", name, prec_name[pi]);
            if (gpu_forward(label, &hc, prec, CONVPOOL_DTYPE_F32, hc.x, sizeof(float) * (size_t)nx, NULL, 0, g_p,
                            g_o) != CONVPOOL_OK)
                continue;
            double ratio = 0.0;
            const check_tol t = check_tol_add(gpu_tol(&hc.p, prec, CONVPOOL_DTYPE_F32), check_tol_fp32(&hc.p));
            CHECK(check_forward_f(label, &hc.p, hc.x, hc.w, hc.cb, hc.bias, g_p, g_o, cpu_p, cpu_o, t, &ratio) == 0,
                  "%s: mismatch", label);
            printf("test_cuda: %s: max err/tol %.3g, out[0] %.9g vs %.9g\n", label, ratio, (double)g_o[0],
                   (double)cpu_o[0]);
        }
    }
    free_case(&hc);
}

static void run_big(void)
{
    run_vs_cpu("full headline (batch 128)", convpool_problem_headline());
    /* W 241: rows padded to 244 into the workspace, 64 MiB of samples (2 of 3) a pass, so the
     * second pass starts mid-batch. */
    run_vs_cpu("padded rows, 2 passes (3x8x16x241x241)",
               convpool_problem_make(3, 8, 16, 16, 241, 241, 3, 3, 3, 2, 2, 2, 2.0));
    run_vs_cpu("padded rows, general kernel, 2 passes (3x8x16x241x241, kernel 5)",
               convpool_problem_make(3, 8, 16, 16, 241, 241, 5, 5, 5, 2, 2, 2, -2.0));
}

/* ---- error cases ---- */

static void run_errors(void)
{
    host_case hc;
    memset(&hc, 0, sizeof hc);
    hc.p = convpool_problem_make(2, 3, 4, 6, 7, 8, 3, 3, 3, 2, 2, 2, 2.0);
    convpool_problem_validate(&hc.p);
    check_rng r = check_rng_seed(5);
    if (!fill_case(&r, &hc, 1, 1, 0)) {
        free_case(&hc);
        return;
    }
    const convpool_problem *p = &hc.p;
    const int64_t nx = convpool_x_numel(p), nw = convpool_weight_numel(p), C = 4, np = 8, B = 2;
    float hp[8 + GUARD], ho[2 + GUARD];
    size_t ws = 0;
    float *dx = (float *)dev_copy(hc.x, sizeof(float) * (size_t)nx);
    float *dw = (float *)dev_copy(hc.w, sizeof(float) * (size_t)nw);
    float *dcb = (float *)dev_copy(hc.cb, sizeof(float) * (size_t)C);
    float *dbias = (float *)dev_copy(hc.bias, sizeof(float) * (size_t)C);
    check_poison(hp, np + GUARD);
    check_poison(ho, B + GUARD);
    float *dp = (float *)dev_copy(hp, sizeof hp);
    float *dout = (float *)dev_copy(ho, sizeof ho);
    void *dws = NULL;
    const convpool_precision TF = CONVPOOL_PRECISION_TF32;
    const convpool_dtype F32 = CONVPOOL_DTYPE_F32;
    if (!dx || !dw || !dcb || !dbias || !dp || !dout)
        goto done;

    CHECK_STATUS("workspace query", convpool_cuda_workspace_size(p, TF, F32, &ws), CONVPOOL_OK, NULL);
    CHECK_STATUS("workspace query, problem NULL", convpool_cuda_workspace_size(NULL, TF, F32, &ws),
                 CONVPOOL_ERR_NULL_POINTER, "problem");
    CHECK_STATUS("workspace query, bytes NULL", convpool_cuda_workspace_size(p, TF, F32, NULL),
                 CONVPOOL_ERR_NULL_POINTER, "bytes");
    CHECK_STATUS("workspace query, bad precision",
                 convpool_cuda_workspace_size(p, (convpool_precision)7, F32, &ws), CONVPOOL_ERR_INVALID_ARGUMENT,
                 "precision");
    CHECK_STATUS("workspace query, bad dtype", convpool_cuda_workspace_size(p, TF, (convpool_dtype)9, &ws),
                 CONVPOOL_ERR_INVALID_ARGUMENT, "dtype");
    convpool_cuda_workspace_size(p, TF, F32, &ws);
    if (ws)
        dws = dev_copy(NULL, ws);

#define EXPECT_FAIL(what, call, want, field)                                                            \
    do {                                                                                                \
        CHECK_STATUS(what, call, want, field);                                                          \
        float bp[8 + GUARD], bo[2 + GUARD];                                                             \
        if (CUDA_OK(cudaDeviceSynchronize()) &&                                                         \
            CUDA_OK(cudaMemcpy(bp, dp, sizeof bp, cudaMemcpyDeviceToHost)) &&                           \
            CUDA_OK(cudaMemcpy(bo, dout, sizeof bo, cudaMemcpyDeviceToHost)))                           \
            CHECK(check_all_poison(bp, np + GUARD) && check_all_poison(bo, B + GUARD),                  \
                  "%s: outputs written on failure", what);                                              \
    } while (0)

    EXPECT_FAIL("problem NULL",
                convpool_forward_cuda(NULL, TF, F32, dx, dw, dcb, dbias, dp, dout, dws, ws, NULL),
                CONVPOOL_ERR_NULL_POINTER, "problem");
    EXPECT_FAIL("x NULL", convpool_forward_cuda(p, TF, F32, NULL, dw, dcb, dbias, dp, dout, dws, ws, NULL),
                CONVPOOL_ERR_NULL_POINTER, "x");
    EXPECT_FAIL("weight NULL", convpool_forward_cuda(p, TF, F32, dx, NULL, dcb, dbias, dp, dout, dws, ws, NULL),
                CONVPOOL_ERR_NULL_POINTER, "weight");
    EXPECT_FAIL("pooled NULL", convpool_forward_cuda(p, TF, F32, dx, dw, dcb, dbias, NULL, dout, dws, ws, NULL),
                CONVPOOL_ERR_NULL_POINTER, "pooled");
    EXPECT_FAIL("bias NULL with out",
                convpool_forward_cuda(p, TF, F32, dx, dw, dcb, NULL, dp, dout, dws, ws, NULL),
                CONVPOOL_ERR_NULL_POINTER, "bias");
    EXPECT_FAIL("bad precision",
                convpool_forward_cuda(p, (convpool_precision)7, F32, dx, dw, dcb, dbias, dp, dout, dws, ws, NULL),
                CONVPOOL_ERR_INVALID_ARGUMENT, "precision");
    EXPECT_FAIL("bad dtype",
                convpool_forward_cuda(p, TF, (convpool_dtype)9, dx, dw, dcb, dbias, dp, dout, dws, ws, NULL),
                CONVPOOL_ERR_INVALID_ARGUMENT, "dtype");
    {
        convpool_problem bad = *p;
        bad.kernel_d = 0;
        EXPECT_FAIL("kernel_d 0", convpool_forward_cuda(&bad, TF, F32, dx, dw, dcb, dbias, dp, dout, dws, ws, NULL),
                    CONVPOOL_ERR_INVALID_SIZE, "kernel_d");
        bad = *p;
        bad.pool_w = 7;
        EXPECT_FAIL("pool_w too large",
                    convpool_forward_cuda(&bad, TF, F32, dx, dw, dcb, dbias, dp, dout, dws, ws, NULL),
                    CONVPOOL_ERR_EMPTY_OUTPUT, "pool_w");
        bad = *p;
        bad.in_h = 2;
        EXPECT_FAIL("in_h below kernel_h",
                    convpool_forward_cuda(&bad, TF, F32, dx, dw, dcb, dbias, dp, dout, dws, ws, NULL),
                    CONVPOOL_ERR_INPUT_TOO_SMALL, "kernel_h");
        bad = convpool_problem_make((int64_t)1 << 40, (int64_t)1 << 30, 1, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1.0);
        EXPECT_FAIL("x count overflow",
                    convpool_forward_cuda(&bad, TF, F32, dx, dw, dcb, dbias, dp, dout, dws, ws, NULL),
                    CONVPOOL_ERR_OVERFLOW, "x");
    }
    if (ws) {
        EXPECT_FAIL("workspace NULL", convpool_forward_cuda(p, TF, F32, dx, dw, dcb, dbias, dp, dout, NULL, ws, NULL),
                    CONVPOOL_ERR_WORKSPACE, "workspace|workspace_bytes");
        EXPECT_FAIL("workspace 1 byte short",
                    convpool_forward_cuda(p, TF, F32, dx, dw, dcb, dbias, dp, dout, dws, ws - 1, NULL),
                    CONVPOOL_ERR_WORKSPACE, "workspace|workspace_bytes");
        EXPECT_FAIL("workspace 0 bytes",
                    convpool_forward_cuda(p, TF, F32, dx, dw, dcb, dbias, dp, dout, dws, 0, NULL),
                    CONVPOOL_ERR_WORKSPACE, "workspace|workspace_bytes");
    } else {
        printf("test_cuda: the workspace query says 0 bytes; the too-small-workspace case does not apply\n");
    }
    /* Outputs overlapping inputs or each other: refused, naming both, nothing written. */
    EXPECT_FAIL("out == pooled", convpool_forward_cuda(p, TF, F32, dx, dw, dcb, dbias, dp, dp, dws, ws, NULL),
                CONVPOOL_ERR_INVALID_ARGUMENT, "pooled");
    EXPECT_FAIL("workspace == x", convpool_forward_cuda(p, TF, F32, dx, dw, dcb, dbias, dp, dout, dx, ws, NULL),
                CONVPOOL_ERR_INVALID_ARGUMENT, "workspace");
    EXPECT_FAIL("workspace == out", convpool_forward_cuda(p, TF, F32, dx, dw, dcb, dbias, dp, dout, dout, ws, NULL),
                CONVPOOL_ERR_INVALID_ARGUMENT, "out");
    for (int pi = 0; pi < 2; ++pi)
        for (int di = 0; di < 3; ++di) {
            size_t b = 0;
            const convpool_status s =
                convpool_cuda_workspace_size(p, (convpool_precision)pi, (convpool_dtype)di, &b);
            printf("test_cuda: workspace %s x=%s: %s, %zu bytes\n", prec_name[pi], dtype_name[di],
                   convpool_status_name(s), b);
        }
    CHECK(cudaGetLastError() == cudaSuccess, "an argument error left a CUDA error behind");
#undef EXPECT_FAIL
done:
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dcb);
    cudaFree(dbias);
    cudaFree(dp);
    cudaFree(dout);
    cudaFree(dws);
    free_case(&hc);
}

/* convpool_pool_forward_cl_cuda (y channels-last) against convpool_pool_forward_cuda on the same
 * values in the dense layout: random y with NaN and infinities planted, divisors of both signs
 * and zero, pool remainders, Cout above and below one block of threads. Pooled means may differ
 * in the last bits (the two kernels add a (b, c)'s windows in different orders); NaN and inf
 * must land in the same places. */
static void run_channels_last_pool(void)
{
    static const struct { int64_t b, c, d, h, w, pd, ph, pw; double div; } g[] = {
        {2, 16, 5, 7, 9, 2, 2, 2, 2.0}, {1, 130, 4, 6, 7, 3, 1, 2, -1.5},
        {3, 5, 6, 5, 11, 1, 2, 3, 0.0}, {1, 64, 9, 10, 10, 2, 4, 4, 0.5},
    };
    check_rng r = check_rng_seed(99);
    for (size_t i = 0; i < sizeof g / sizeof g[0]; ++i) {
        /* kernel 1: the "conv output" is the input's shape */
        convpool_problem p = convpool_problem_make(g[i].b, 1, g[i].c, g[i].d, g[i].h, g[i].w, 1, 1, 1, g[i].pd,
                                                   g[i].ph, g[i].pw, g[i].div);
        if (convpool_problem_validate(&p) != CONVPOOL_OK) {
            CHECK(0, "channels-last case %zu invalid: %s", i, convpool_last_error());
            continue;
        }
        const int64_t B = p.batch, C = p.out_channels, S = p.in_d * p.in_h * p.in_w, n = B * C * S;
        float *y = (float *)check_alloc(sizeof(float) * (size_t)n), *ycl = (float *)check_alloc(sizeof(float) * (size_t)n);
        float *bias = (float *)check_alloc(sizeof(float) * (size_t)C);
        float *got_p = (float *)check_alloc(sizeof(float) * (size_t)(B * C)), *want_p = (float *)check_alloc(sizeof(float) * (size_t)(B * C));
        float got_o[4], want_o[4];
        if (!y || !ycl || !bias || !got_p || !want_p) {
            CHECK(0, "out of host memory");
            goto next;
        }
        for (int64_t k = 0; k < n; ++k)
            y[k] = (float)(4.0 * check_rng_uniform(&r) - 2.0);
        y[n / 3] = NAN;
        y[n / 2] = INFINITY;
        y[(2 * n) / 3] = -INFINITY;
        for (int64_t c = 0; c < C; ++c)
            bias[c] = (float)(2.0 * check_rng_uniform(&r) - 1.0);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < C; ++c)
                for (int64_t sp = 0; sp < S; ++sp)
                    ycl[(b * S + sp) * C + c] = y[(b * C + c) * S + sp];
        size_t ws = 0, ws_cl = 0;
        CHECK_STATUS("pool workspace", convpool_cuda_pool_workspace_size(&p, &ws), CONVPOOL_OK, NULL);
        CHECK_STATUS("pool cl workspace", convpool_cuda_pool_cl_workspace_size(&p, &ws_cl), CONVPOOL_OK, NULL);
        for (int layout = 0; layout < 2; ++layout) {
            float *dy = (float *)dev_copy(layout ? ycl : y, sizeof(float) * (size_t)n);
            float *db = (float *)dev_copy(bias, sizeof(float) * (size_t)C);
            float *dp = (float *)dev_copy(NULL, sizeof(float) * (size_t)(B * C));
            float *dout = (float *)dev_copy(NULL, sizeof(float) * (size_t)B);
            void *dws = dev_copy(NULL, layout ? ws_cl : ws);
            if (dy && db && dp && dout && dws) {
                const convpool_status st =
                    layout ? convpool_pool_forward_cl_cuda(&p, dy, db, dp, dout, dws, ws_cl, NULL)
                           : convpool_pool_forward_cuda(&p, dy, db, dp, dout, dws, ws, NULL);
                CHECK(st == CONVPOOL_OK, "channels-last case %zu layout %d: %s", i, layout, convpool_last_error());
                CUDA_OK(cudaMemcpy(layout ? got_p : want_p, dp, sizeof(float) * (size_t)(B * C), cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(layout ? got_o : want_o, dout, sizeof(float) * (size_t)B, cudaMemcpyDeviceToHost));
            } else {
                CHECK(0, "device allocation failed");
            }
            cudaFree(dy);
            cudaFree(db);
            cudaFree(dp);
            cudaFree(dout);
            cudaFree(dws);
        }
        for (int64_t k = 0; k < B * C + B; ++k) {
            const float a = k < B * C ? got_p[k] : got_o[k - B * C], e = k < B * C ? want_p[k] : want_o[k - B * C];
            const int same_class = (isnan(a) && isnan(e)) || (isinf(a) && isinf(e) && (a > 0) == (e > 0)) ||
                                   (isfinite(a) && isfinite(e) && fabsf(a - e) <= 1e-5f * (1.0f + fabsf(e)));
            CHECK(same_class, "channels-last case %zu: %s[%lld] = %g, dense layout gives %g", i,
                  k < B * C ? "pooled" : "out", (long long)(k < B * C ? k : k - B * C), a, e);
        }
    next:
        free(y);
        free(ycl);
        free(bias);
        free(got_p);
        free(want_p);
    }
}

/* convpool_forward_cuda_lowp (a float16/bfloat16 model: parameters and out in x's dtype)
 * against convpool_forward_cuda on the same values widened to float32 on the host: P must be
 * bit-identical (the same kernel reads the same float weights), and out must be the PyTorch
 * rounding steps of the tail done here, P -> dtype, + bias -> dtype, the sum -> dtype, bit for
 * bit. One problem per family (k3p2, group, general, padded rows), both precisions and
 * dtypes, with and without conv bias, a P-only call, and an inf and a NaN in x. The workspace
 * is exactly the queried size and out's guard elements must stay untouched. */
static float round_dt(float v, convpool_dtype dt)
{
    return dt == CONVPOOL_DTYPE_F16 ? f16_to_f32(f32_to_f16(v)) : bf16_to_f32(f32_to_bf16(v));
}

static uint16_t bits_dt(float v, convpool_dtype dt)
{
    return dt == CONVPOOL_DTYPE_F16 ? f32_to_f16(v) : f32_to_bf16(v);
}

static void run_lowp(void)
{
    static const struct { int64_t b, ci, co, d, h, w, kd, kh, kw, pd, ph, pw; double div; } g[] = {
        {2, 8, 16, 6, 10, 32, 3, 3, 3, 2, 2, 2, 2.0},   /* k3p2 */
        {2, 12, 20, 6, 10, 13, 3, 3, 3, 2, 2, 2, -1.5}, /* group, rows padded */
        {2, 9, 17, 9, 13, 40, 2, 3, 5, 3, 2, 4, 0.5},   /* general */
        {1, 3, 5, 7, 9, 11, 3, 3, 3, 2, 2, 2, 2.0},     /* k3p2, rows padded */
    };
    enum { OGUARD = 4 };
    check_rng r = check_rng_seed(4242);
    int n = 0;
    for (size_t i = 0; i < sizeof g / sizeof g[0]; ++i)
        for (int di = 1; di < 3; ++di)
            for (int pi = 0; pi < 2; ++pi)
                for (int variant = 0; variant < 2; ++variant) {
                    const convpool_dtype dt = (convpool_dtype)di;
                    const convpool_precision prec = (convpool_precision)pi;
                    convpool_problem p = convpool_problem_make(g[i].b, g[i].ci, g[i].co, g[i].d, g[i].h, g[i].w,
                                                               g[i].kd, g[i].kh, g[i].kw, g[i].pd, g[i].ph, g[i].pw,
                                                               g[i].div);
                    if (convpool_problem_validate(&p) != CONVPOOL_OK) {
                        CHECK(0, "lowp case %zu invalid: %s", i, convpool_last_error());
                        continue;
                    }
                    /* variant 1: no conv bias; even cases an inf and a NaN in x, odd ones P only */
                    const int with_cb = variant == 0, want_out = variant == 0 || i % 2 == 0;
                    const int64_t B = p.batch, C = p.out_channels, nx = convpool_x_numel(&p),
                                  nw = convpool_weight_numel(&p);
                    float *x = (float *)check_alloc(sizeof(float) * (size_t)nx);
                    float *xr = (float *)check_alloc(sizeof(float) * (size_t)nx);
                    float *par = (float *)check_alloc(sizeof(float) * (size_t)(nw + 2 * C));
                    float *parr = (float *)check_alloc(sizeof(float) * (size_t)(nw + 2 * C));
                    float *got_p = (float *)check_alloc(sizeof(float) * (size_t)(B * C));
                    float *want_p = (float *)check_alloc(sizeof(float) * (size_t)(B * C));
                    uint16_t got_o[8 + OGUARD];
                    void *x16 = NULL, *par16 = NULL;
                    void *dx = NULL, *dpar16 = NULL, *dparf = NULL, *dws = NULL, *dws_ref = NULL;
                    float *dp = NULL, *dp_ref = NULL;
                    uint16_t *dout = NULL;
                    size_t ws = 0;
                    if (!x || !xr || !par || !parr || !got_p || !want_p || B > 8) {
                        CHECK(0, "out of host memory");
                        goto next;
                    }
                    for (int64_t k = 0; k < nx; ++k)
                        x[k] = (float)check_rng_uniform(&r);
                    if (variant == 1 && i % 2 == 0) {
                        x[nx / 3] = INFINITY;
                        x[(2 * nx) / 3] = NAN;
                    }
                    for (int64_t k = 0; k < nw + 2 * C; ++k)
                        par[k] = (float)(0.4 * check_rng_normal(&r));
                    x16 = to_dtype(x, nx, dt, xr);
                    par16 = to_dtype(par, nw + 2 * C, dt, parr); /* weights, conv bias, bias */
                    CHECK_STATUS("lowp workspace", convpool_cuda_workspace_size(&p, prec, dt, &ws), CONVPOOL_OK, NULL);
                    dx = dev_copy(x16, sizeof(uint16_t) * (size_t)nx);
                    dpar16 = dev_copy(par16, sizeof(uint16_t) * (size_t)(nw + 2 * C));
                    dparf = dev_copy(parr, sizeof(float) * (size_t)(nw + 2 * C));
                    dws = dev_copy(NULL, ws);
                    dws_ref = dev_copy(NULL, ws);
                    dp = (float *)dev_copy(NULL, sizeof(float) * (size_t)(B * C));
                    dp_ref = (float *)dev_copy(NULL, sizeof(float) * (size_t)(B * C));
                    for (int k = 0; k < 8 + OGUARD; ++k)
                        got_o[k] = 0x7e01u; /* poison, and a guard past B */
                    dout = (uint16_t *)dev_copy(got_o, sizeof got_o);
                    if (!x16 || !par16 || !dx || !dpar16 || !dparf || !dws || !dws_ref || !dp || !dp_ref || !dout) {
                        CHECK(0, "lowp case %zu: allocation failed", i);
                        goto next;
                    }
                    {
                        const uint16_t *w16 = (const uint16_t *)dpar16;
                        const float *wf = (const float *)dparf;
                        convpool_status st = convpool_forward_cuda(&p, prec, dt, dx, wf, with_cb ? wf + nw : NULL, NULL,
                                                                   dp_ref, NULL, dws_ref, ws, NULL);
                        CHECK(st == CONVPOOL_OK, "lowp case %zu reference call: %s", i, convpool_last_error());
                        st = convpool_forward_cuda_lowp(&p, prec, dt, dx, w16, with_cb ? w16 + nw : NULL,
                                                        want_out ? w16 + nw + C : NULL, dp, want_out ? dout : NULL,
                                                        dws, ws, NULL);
                        CHECK(st == CONVPOOL_OK, "lowp case %zu: %s", i, convpool_last_error());
                        CUDA_OK(cudaMemcpy(got_p, dp, sizeof(float) * (size_t)(B * C), cudaMemcpyDeviceToHost));
                        CUDA_OK(cudaMemcpy(want_p, dp_ref, sizeof(float) * (size_t)(B * C), cudaMemcpyDeviceToHost));
                        CUDA_OK(cudaMemcpy(got_o, dout, sizeof got_o, cudaMemcpyDeviceToHost));
                    }
                    CHECK(memcmp(got_p, want_p, sizeof(float) * (size_t)(B * C)) == 0,
                          "lowp case %zu %s %s variant %d: P differs from convpool_forward_cuda on the widened "
                          "parameters", i, dtype_name[dt], prec_name[prec], variant);
                    for (int64_t b = 0; b < B; ++b) {
                        double acc = 0.0;
                        for (int64_t c = 0; c < C; ++c)
                            acc += (double)round_dt(round_dt(want_p[b * C + c], dt) + parr[nw + C + c], dt);
                        const uint16_t want = want_out ? bits_dt((float)acc, dt) : 0x7e01u;
                        const int nan_ok = want_out && isnan((float)acc) &&
                                           (dt == CONVPOOL_DTYPE_F16 ? (got_o[b] & 0x7c00u) == 0x7c00u && (got_o[b] & 0x3ffu)
                                                                     : (got_o[b] & 0x7f80u) == 0x7f80u && (got_o[b] & 0x7fu));
                        CHECK(got_o[b] == want || nan_ok,
                              "lowp case %zu %s %s variant %d: out[%lld] = 0x%04x, the rounding steps give 0x%04x", i,
                              dtype_name[dt], prec_name[prec], variant, (long long)b, got_o[b], want);
                    }
                    for (int64_t k = B; k < 8 + OGUARD; ++k)
                        CHECK(got_o[k] == 0x7e01u, "lowp case %zu: out written past batch %lld at %lld", i,
                              (long long)B, (long long)k);
                    ++n;
                next:
                    cudaFree(dx);
                    cudaFree(dpar16);
                    cudaFree(dparf);
                    cudaFree(dws);
                    cudaFree(dws_ref);
                    cudaFree(dp);
                    cudaFree(dp_ref);
                    cudaFree(dout);
                    free(x16);
                    free(par16);
                    free(x);
                    free(xr);
                    free(par);
                    free(parr);
                    free(got_p);
                    free(want_p);
                }
    /* float32 is convpool_forward_cuda's; the message names the argument. */
    {
        convpool_problem p = convpool_problem_make(1, 3, 5, 7, 9, 11, 3, 3, 3, 2, 2, 2, 2.0);
        int dummy = 0;
        CHECK_STATUS("lowp float32", convpool_forward_cuda_lowp(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &dummy,
                                                                &dummy, NULL, NULL, (float *)&dummy, NULL, NULL, 0,
                                                                NULL),
                     CONVPOOL_ERR_INVALID_ARGUMENT, "dtype");
    }
    printf("test_cuda: %d lowp (16-bit parameters) runs\n", n);
}

int main(int argc, char **argv)
{
    if (!convpool_cuda_available()) {
        printf("SKIPPED: no CUDA device\n");
        return CHECK_SKIP;
    }
    /* --channels-last, --lowp: only the channels-last pooling check or the 16-bit-parameter
     * forward (the sanitize stage of scripts/device.sh runs them under compute-sanitizer; the
     * CLI cannot reach those kernels). */
    const int cl_only = argc > 1 && strcmp(argv[1], "--channels-last") == 0;
    const int lowp_only = argc > 1 && strcmp(argv[1], "--lowp") == 0;
    const char *dir = argc > 1 && !cl_only && !lowp_only ? argv[1] : CONVPOOL_GOLDEN_DIR;
    int dev = 0;
    struct cudaDeviceProp prop;
    if (CUDA_OK(cudaGetDevice(&dev)) && CUDA_OK(cudaGetDeviceProperties(&prop, dev)))
        printf("test_cuda: device %d: %s, sm_%d%d\n", dev, prop.name, prop.major, prop.minor);
    if (!CUDA_OK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking)))
        return check_exit_code("test_cuda");
    if (cl_only) {
        run_channels_last_pool();
        cudaStreamDestroy(side_stream);
        return check_exit_code("test_cuda --channels-last");
    }
    if (lowp_only) {
        run_lowp();
        cudaStreamDestroy(side_stream);
        return check_exit_code("test_cuda --lowp");
    }
    run_errors();
    run_channels_last_pool();
    run_lowp();
    run_golden(dir);
    run_sweep();
    run_big();
    for (int pi = 0; pi < 2; ++pi)
        for (int di = 0; di < 3; ++di)
            printf("test_cuda: %-6s x=%-4s %5lld runs, %lld unsupported, max err/tol %.3g\n", prec_name[pi],
                   dtype_name[di], (long long)n_runs[pi][di], (long long)n_unsupported[pi][di],
                   worst_ratio[pi][di]);
    cudaStreamDestroy(side_stream);
    return check_exit_code("test_cuda");
}

#endif /* CONVPOOL_HAVE_CUDA */
