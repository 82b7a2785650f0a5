/*
 * The conv-tail entries (convpool_tail_train_{cpu,cuda}, convpool_tail_backward_{cpu,cuda})
 * against a plain reference written here: PyTorch's divide and max pool on a conv output y of
 * each dtype, and their backward. The reference rounds to float16 and bfloat16 in double
 * arithmetic (rint of the value over its quantum), independently of the library's integer
 * conversions, and forms the quotient as PyTorch does on each device: a division on the CPU,
 * a product with the float32 reciprocal on CUDA. Every comparison is bit for bit (NaN: both
 * NaN). y covers every class of 16-bit value (random bit patterns: subnormals, infinities,
 * NaN), and the divisors make quotients overflow and underflow. Outputs are poisoned first.
 *
 *   test_tail        the CPU entries (and their argument errors)
 *   test_tail cuda   the CUDA entries against the same reference (exit 77 without a GPU)
 */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CONVPOOL_HAVE_CUDA
#include "check_cuda.h"
#endif

/* ---- the reference ---- */

/* v rounded to nearest even with `bits` significand bits and smallest quantum 2^min_exp,
 * overflowing to inf past max: float16 (11, -24, 65504), bfloat16 (8, -133, FLT_MAX's). */
static float round_to(float v, int bits, int min_exp, double max)
{
    if (isnan(v) || isinf(v) || v == 0.0f)
        return v;
    int e = 0;
    (void)frexp((double)v, &e); /* v = m 2^e, 0.5 <= |m| < 1 */
    const int qe = e - bits > min_exp ? e - bits : min_exp;
    const double r = ldexp(rint(ldexp((double)v, -qe)), qe);
    if (fabs(r) > max)
        return v > 0 ? INFINITY : -INFINITY;
    return (float)r;
}

static float ref_round(float v, convpool_dtype dt)
{
    if (dt == CONVPOOL_DTYPE_F16)
        return round_to(v, 11, -24, 65504.0);
    if (dt == CONVPOOL_DTYPE_BF16)
        return round_to(v, 8, -133, ldexp(255.0, 120));
    return v;
}

/* 16-bit storage: float16 bits to float by its definition; bfloat16 is float's top half. */
static float f16_value(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0x1f)
        return m ? NAN : (float)(s * INFINITY);
    return (float)(s * (e ? ldexp(1024.0 + m, e - 25) : ldexp((double)m, -24)));
}

static float bf16_value(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float load(const void *a, convpool_dtype dt, int64_t i)
{
    return dt == CONVPOOL_DTYPE_F32   ? ((const float *)a)[i]
         : dt == CONVPOOL_DTYPE_F16 ? f16_value(((const uint16_t *)a)[i])
                                      : bf16_value(((const uint16_t *)a)[i]);
}

static uint32_t code_at(const void *codes, int width, int64_t i)
{
    return width == 1 ? ((const uint8_t *)codes)[i] : width == 2 ? ((const uint16_t *)codes)[i] : ((const uint32_t *)codes)[i];
}

static int same(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0; }

/* The quotient as PyTorch forms it on the device (cuda: times the float reciprocal). */
static float quotient(float y, double divisor, int cuda)
{
    const float d = (float)divisor;
    if (cuda) {
        volatile float inv = 1.0f / d; /* rounded to float before the product */
        return y * inv;
    }
    return y / d;
}

typedef struct tail_case {
    const char *name;
    int64_t b, c, d, h, w;    /* the conv output's sizes */
    int64_t pd, ph, pw;       /* pool */
    double divisor;
} tail_case;

static size_t elem_size(convpool_dtype dt) { return dt == CONVPOOL_DTYPE_F32 ? 4 : 2; }

/* y, random: float32 normal values times a scale; 16-bit dtypes random bit patterns (every
 * class: a NaN or an infinity about 1 in 32 elements, subnormals, both signs). */
static void fill_y(check_rng *r, void *y, int64_t n, convpool_dtype dt)
{
    for (int64_t i = 0; i < n; ++i) {
        if (dt == CONVPOOL_DTYPE_F32) {
            const uint64_t k = check_rng_u64(r) % 64;
            ((float *)y)[i] = k == 0 ? NAN : k == 1 ? INFINITY : k == 2 ? -INFINITY : check_rng_normal(r) * 3.0f;
        } else {
            ((uint16_t *)y)[i] = (uint16_t)check_rng_u64(r);
        }
    }
}

/* One case in one dtype on the CPU (cuda 0) or CUDA (cuda 1). */
static void run_case(const tail_case *tc, convpool_dtype dt, int cuda, uint64_t seed)
{
    convpool_problem p = convpool_problem_make(tc->b, 1, tc->c, tc->d, tc->h, tc->w, 1, 1, 1, tc->pd, tc->ph, tc->pw,
                                               tc->divisor);
    CHECK(convpool_problem_validate(&p) == CONVPOOL_OK, "%s: problem", tc->name);
    const int width = convpool_code_bytes(&p);
    const size_t es = elem_size(dt);
    const int64_t ny = tc->b * tc->c * tc->d * tc->h * tc->w;
    const int64_t npool = p.pooled_d * p.pooled_h * p.pooled_w, nm = tc->b * tc->c * npool;
    check_rng r = check_rng_seed(seed);
    void *y = malloc((size_t)ny * es), *m = malloc((size_t)nm * es), *gm = malloc((size_t)nm * es);
    void *gy = malloc((size_t)ny * es), *codes = malloc((size_t)nm * (size_t)width);
    fill_y(&r, y, ny, dt);
    fill_y(&r, gm, nm, dt);
    memset(m, 0xff, (size_t)nm * es);
    memset(gy, 0xff, (size_t)ny * es);
    memset(codes, 0xee, (size_t)nm * (size_t)width);
    convpool_status s1 = CONVPOOL_OK, s2 = CONVPOOL_OK;
#ifdef CONVPOOL_HAVE_CUDA
    if (cuda) {
        void *dy = NULL, *dm = NULL, *dgm = NULL, *dgy = NULL, *dcodes = NULL;
        if (CUDA_OK(cudaMalloc(&dy, (size_t)ny * es)) && CUDA_OK(cudaMalloc(&dm, (size_t)nm * es)) &&
            CUDA_OK(cudaMalloc(&dgm, (size_t)nm * es)) && CUDA_OK(cudaMalloc(&dgy, (size_t)ny * es)) &&
            CUDA_OK(cudaMalloc(&dcodes, (size_t)nm * (size_t)width))) {
            CUDA_OK(cudaMemcpy(dy, y, (size_t)ny * es, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dgm, gm, (size_t)nm * es, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dm, m, (size_t)nm * es, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dgy, gy, (size_t)ny * es, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dcodes, codes, (size_t)nm * (size_t)width, cudaMemcpyHostToDevice));
            s1 = convpool_tail_train_cuda(&p, dt, dy, dm, dcodes, NULL);
            s2 = convpool_tail_backward_cuda(&p, dt, dcodes, dgm, dgy, NULL);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(m, dm, (size_t)nm * es, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(gy, dgy, (size_t)ny * es, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(codes, dcodes, (size_t)nm * (size_t)width, cudaMemcpyDeviceToHost));
        }
        cudaFree(dy), cudaFree(dm), cudaFree(dgm), cudaFree(dgy), cudaFree(dcodes);
    } else
#endif
    {
        s1 = convpool_tail_train_cpu(&p, dt, y, m, codes, 0);
        s2 = convpool_tail_backward_cpu(&p, dt, codes, gm, gy, 0);
    }
    CHECK(s1 == CONVPOOL_OK && s2 == CONVPOOL_OK, "%s dtype %d: status %d %d (%s)", tc->name, (int)dt, (int)s1,
          (int)s2, convpool_last_error());

    /* The reference: each window's pick, then the dense gradient. */
    int64_t bad_m = 0, bad_code = 0, bad_g = 0;
    float *want_g = malloc((size_t)ny * sizeof(float));
    const float zero = ref_round(quotient(0.0f, tc->divisor, cuda), dt);
    for (int64_t i = 0; i < ny; ++i)
        want_g[i] = zero;
    for (int64_t bc = 0; bc < tc->b * tc->c; ++bc)
        for (int64_t wd = 0; wd < p.pooled_d; ++wd)
            for (int64_t wh = 0; wh < p.pooled_h; ++wh)
                for (int64_t ww = 0; ww < p.pooled_w; ++ww) {
                    const int64_t win = ((bc * p.pooled_d + wd) * p.pooled_h + wh) * p.pooled_w + ww;
                    float best = -INFINITY;
                    int64_t code = 0, pos = 0, at = 0;
                    for (int64_t i = 0; i < tc->pd; ++i)
                        for (int64_t j = 0; j < tc->ph; ++j)
                            for (int64_t k = 0; k < tc->pw; ++k, ++pos) {
                                const int64_t e =
                                    ((bc * tc->d + wd * tc->pd + i) * tc->h + wh * tc->ph + j) * tc->w + ww * tc->pw + k;
                                const float q = ref_round(quotient(load(y, dt, e), tc->divisor, cuda), dt);
                                if (pos == 0)
                                    at = e; /* the pick while nothing beats -inf */
                                if (q > best || isnan(q)) {
                                    best = q;
                                    code = pos;
                                    at = e;
                                }
                            }
                    bad_m += !same(load(m, dt, win), best);
                    bad_code += (int64_t)code_at(codes, width, win) != code;
                    want_g[at] = ref_round(quotient(load(gm, dt, win), tc->divisor, cuda), dt);
                }
    for (int64_t i = 0; i < ny; ++i) {
        bad_g += !same(load(gy, dt, i), want_g[i]);
        if (getenv("TAIL_DEBUG") && !same(load(gy, dt, i), want_g[i]))
            printf("%lld: got %a want %a\n", (long long)i, (double)load(gy, dt, i), (double)want_g[i]);
    }
    CHECK(bad_m == 0 && bad_code == 0 && bad_g == 0,
          "%s (%s, dtype %d): %lld of %lld m, %lld codes, %lld of %lld grad_y elements differ from the reference",
          tc->name, cuda ? "cuda" : "cpu", (int)dt, (long long)bad_m, (long long)nm, (long long)bad_code,
          (long long)bad_g, (long long)ny);

    /* The CPU's results do not depend on the thread count. */
    if (!cuda) {
        void *m1 = malloc((size_t)nm * es), *gy1 = malloc((size_t)ny * es), *c1 = malloc((size_t)nm * (size_t)width);
        CHECK(convpool_tail_train_cpu(&p, dt, y, m1, c1, 1) == CONVPOOL_OK &&
                  convpool_tail_backward_cpu(&p, dt, c1, gm, gy1, 3) == CONVPOOL_OK,
              "%s: 1 and 3 threads", tc->name);
        CHECK(memcmp(m1, m, (size_t)nm * es) == 0 && memcmp(c1, codes, (size_t)nm * (size_t)width) == 0 &&
                  memcmp(gy1, gy, (size_t)ny * es) == 0,
              "%s dtype %d: results differ between thread counts", tc->name, (int)dt);
        free(m1), free(gy1), free(c1);
    }
    free(y), free(m), free(gm), free(gy), free(codes), free(want_g);
}

static const tail_case cases[] = {
    {"2x3 channels, 7x9x11, pool 2 with remainders", 2, 3, 7, 9, 11, 2, 2, 2, 2.0},
    {"divisor 0.37 (16-bit quotients round)", 1, 2, 6, 6, 40, 2, 2, 2, 0.37},
    {"divisor 1e-3 (quotients overflow 16 bits)", 1, 2, 4, 5, 6, 2, 2, 2, 1e-3},
    {"divisor 3e4 (quotients underflow to subnormals)", 1, 2, 4, 5, 6, 2, 2, 2, 3e4},
    {"divisor -1.5, anisotropic pool 3x1x2", 2, 2, 10, 5, 9, 3, 1, 2, -1.5},
    {"pool 1", 1, 3, 3, 4, 5, 1, 1, 1, 0.5},
    {"divisor 0 (NaN and inf everywhere)", 1, 2, 4, 4, 4, 2, 2, 2, 0.0},
    {"divisor -inf", 1, 2, 4, 4, 4, 2, 2, 2, -INFINITY},
    {"divisor NaN", 1, 1, 2, 2, 2, 2, 2, 2, NAN},
    {"divisor 1e-40 (float32 subnormal: its reciprocal is inf)", 1, 1, 2, 4, 4, 2, 2, 2, 1e-40},
    {"window of 512 (2-byte codes)", 1, 2, 2, 17, 35, 2, 16, 16, 1.0},
    {"one pooled d-row, wide rows (70 windows a row)", 1, 1, 2, 2, 141, 2, 2, 2, 2.0},
    /* 131072 positions: 4-byte codes, and the CPU backward's offsets computed, not tabled. */
    {"window of 2x256x256 (4-byte codes)", 1, 1, 3, 256, 257, 2, 256, 256, 0.75},
    /* pool_w 2048: wider than the CPU train call's quotient buffer (element by element). */
    {"pool_w 2048 (past the CPU buffer)", 1, 2, 1, 2, 2051, 1, 2, 2048, -3.0},
};

static void run_all(int cuda)
{
    const convpool_dtype dts[] = {CONVPOOL_DTYPE_F32, CONVPOOL_DTYPE_F16, CONVPOOL_DTYPE_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        for (int k = 0; k < 3; ++k)
            run_case(&cases[i], dts[k], cuda, 1000 + 10 * i + (uint64_t)k);
}

/* Every argument error names the argument and touches nothing; then a valid call works. */
static void check_errors(int cuda)
{
    convpool_problem p = convpool_problem_make(1, 1, 2, 4, 4, 4, 1, 1, 1, 2, 2, 2, 2.0);
    float y[128], m[16], gm[16], gy[128];
    uint8_t codes[16];
    for (int i = 0; i < 128; ++i)
        y[i] = (float)i, gy[i] = 1.0f;
    for (int i = 0; i < 16; ++i)
        gm[i] = 1.0f;
    if (cuda) {
#ifdef CONVPOOL_HAVE_CUDA
        CHECK_STATUS("tail_train_cuda NULL problem", convpool_tail_train_cuda(NULL, CONVPOOL_DTYPE_F32, y, m, codes, NULL),
                     CONVPOOL_ERR_NULL_POINTER, "problem");
        CHECK_STATUS("tail_train_cuda NULL y", convpool_tail_train_cuda(&p, CONVPOOL_DTYPE_F32, NULL, m, codes, NULL),
                     CONVPOOL_ERR_NULL_POINTER, "y");
        CHECK_STATUS("tail_train_cuda NULL m", convpool_tail_train_cuda(&p, CONVPOOL_DTYPE_F32, y, NULL, codes, NULL),
                     CONVPOOL_ERR_NULL_POINTER, "m");
        CHECK_STATUS("tail_train_cuda NULL codes", convpool_tail_train_cuda(&p, CONVPOOL_DTYPE_F32, y, m, NULL, NULL),
                     CONVPOOL_ERR_NULL_POINTER, "codes");
        CHECK_STATUS("tail_train_cuda dtype 7", convpool_tail_train_cuda(&p, (convpool_dtype)7, y, m, codes, NULL),
                     CONVPOOL_ERR_INVALID_ARGUMENT, "dtype");
        CHECK_STATUS("tail_backward_cuda NULL grad_m",
                     convpool_tail_backward_cuda(&p, CONVPOOL_DTYPE_F32, codes, NULL, gy, NULL),
                     CONVPOOL_ERR_NULL_POINTER, "grad_m");
        CHECK_STATUS("tail_backward_cuda NULL grad_y",
                     convpool_tail_backward_cuda(&p, CONVPOOL_DTYPE_F32, codes, gm, NULL, NULL),
                     CONVPOOL_ERR_NULL_POINTER, "grad_y");
        CHECK_STATUS("tail_backward_cuda grad_y over the codes",
                     convpool_tail_backward_cuda(&p, CONVPOOL_DTYPE_F32, codes, gm, (void *)codes, NULL),
                     CONVPOOL_ERR_INVALID_ARGUMENT, "grad_y");
        /* The context is not poisoned: a valid case still matches the reference. */
        run_case(&cases[0], CONVPOOL_DTYPE_F32, 1, 7);
#endif
        return;
    }
    CHECK_STATUS("tail_train_cpu NULL problem", convpool_tail_train_cpu(NULL, CONVPOOL_DTYPE_F32, y, m, codes, 0),
                 CONVPOOL_ERR_NULL_POINTER, "problem");
    CHECK_STATUS("tail_train_cpu NULL y", convpool_tail_train_cpu(&p, CONVPOOL_DTYPE_F32, NULL, m, codes, 0),
                 CONVPOOL_ERR_NULL_POINTER, "y");
    CHECK_STATUS("tail_train_cpu NULL m", convpool_tail_train_cpu(&p, CONVPOOL_DTYPE_F32, y, NULL, codes, 0),
                 CONVPOOL_ERR_NULL_POINTER, "m");
    CHECK_STATUS("tail_train_cpu NULL codes", convpool_tail_train_cpu(&p, CONVPOOL_DTYPE_F32, y, m, NULL, 0),
                 CONVPOOL_ERR_NULL_POINTER, "codes");
    CHECK_STATUS("tail_train_cpu dtype 7", convpool_tail_train_cpu(&p, (convpool_dtype)7, y, m, codes, 0),
                 CONVPOOL_ERR_INVALID_ARGUMENT, "dtype");
    CHECK_STATUS("tail_train_cpu threads -1", convpool_tail_train_cpu(&p, CONVPOOL_DTYPE_F32, y, m, codes, -1),
                 CONVPOOL_ERR_INVALID_ARGUMENT, "threads");
    CHECK_STATUS("tail_train_cpu m over y", convpool_tail_train_cpu(&p, CONVPOOL_DTYPE_F32, y, y + 8, codes, 0),
                 CONVPOOL_ERR_INVALID_ARGUMENT, "m");
    CHECK_STATUS("tail_backward_cpu NULL grad_m", convpool_tail_backward_cpu(&p, CONVPOOL_DTYPE_F32, codes, NULL, gy, 0),
                 CONVPOOL_ERR_NULL_POINTER, "grad_m");
    CHECK_STATUS("tail_backward_cpu NULL grad_y", convpool_tail_backward_cpu(&p, CONVPOOL_DTYPE_F32, codes, gm, NULL, 0),
                 CONVPOOL_ERR_NULL_POINTER, "grad_y");
    CHECK_STATUS("tail_backward_cpu grad_y over grad_m",
                 convpool_tail_backward_cpu(&p, CONVPOOL_DTYPE_F32, codes, gm, gm, 0), CONVPOOL_ERR_INVALID_ARGUMENT,
                 "grad_y");
    for (int i = 0; i < 128; ++i)
        CHECK(gy[i] == 1.0f && y[i] == (float)i, "a refused call wrote element %d", i);
    /* Codes outside their window give that window no gradient and write nothing outside grad_y. */
    memset(codes, 0xff, sizeof codes);
    CHECK(convpool_tail_backward_cpu(&p, CONVPOOL_DTYPE_F32, codes, gm, gy, 0) == CONVPOOL_OK, "bad codes");
    for (int i = 0; i < 128; ++i)
        CHECK(gy[i] == 0.0f, "a window with a bad code got gradient at %d", i);
}

int main(int argc, char **argv)
{
    const int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (cuda && !convpool_cuda_available()) {
        printf("SKIPPED: no CUDA device (or convpool was built without CUDA)\n");
        return CHECK_SKIP;
    }
    if (!cuda) {
        /* The reference's own rounding, spot-checked: ties to even, overflow, subnormals. */
        CHECK(ref_round(1.0f + 0x1p-11f, CONVPOOL_DTYPE_F16) == 1.0f, "f16 tie to even");
        CHECK(ref_round(1.0f + 0x1.8p-11f, CONVPOOL_DTYPE_F16) == 1.0f + 0x1p-10f, "f16 round up");
        CHECK(isinf(ref_round(65520.0f, CONVPOOL_DTYPE_F16)) && ref_round(65519.0f, CONVPOOL_DTYPE_F16) == 65504.0f,
              "f16 overflow");
        CHECK(ref_round(0x1p-25f, CONVPOOL_DTYPE_F16) == 0.0f && ref_round(0x1.8p-25f, CONVPOOL_DTYPE_F16) == 0x1p-24f,
              "f16 subnormals");
        CHECK(ref_round(1.0f + 0x1p-8f, CONVPOOL_DTYPE_BF16) == 1.0f &&
                  ref_round(1.0f + 0x1.8p-8f, CONVPOOL_DTYPE_BF16) == 1.0f + 0x1p-7f,
              "bf16 ties");
        CHECK(f16_value(0x3c00) == 1.0f && f16_value(0x0001) == 0x1p-24f && isinf(f16_value(0x7c00)),
              "f16 decoding");
    }
    run_all(cuda);
    check_errors(cuda);
    return check_exit_code(cuda ? "test_tail cuda" : "test_tail");
}
