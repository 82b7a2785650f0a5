/*
 * The GPU plan (src/cuda/plan.cu): each shape family goes to the kernel meant for it, in both
 * precisions and all x dtypes; the workspace the plan reports is what the query returns; the
 * description names the kernel and why the faster families were passed over; the
 * CONVPOOL_CUDA_KERNEL override reaches every family that can take the shape and no other; bad
 * arguments fail with a message naming them. A silent fall-back to a slower family fails here,
 * not only in a benchmark. Needs no GPU (without one the plan is made for an sm_90 device);
 * skipped in builds without CUDA.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct plan_case {
    const char *name;
    convpool_problem p;
    convpool_cuda_kernel want;
} plan_case;

static convpool_problem mk(int64_t b, int64_t cin, int64_t cout, int64_t d, int64_t h, int64_t w, int64_t kd,
                           int64_t kh, int64_t kw, int64_t pd, int64_t ph, int64_t pw)
{
    return convpool_problem_make(b, cin, cout, d, h, w, kd, kh, kw, pd, ph, pw, 2.0);
}

static const char *kname(convpool_cuda_kernel k) { return convpool_cuda_kernel_name(k); }

static void test_families(void)
{
    const plan_case cases[] = {
        {"headline", mk(128, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2), CONVPOOL_CUDA_KERNEL_K3P2},
        {"headline Cin 3 Cout 5", mk(2, 3, 5, 7, 9, 11, 3, 3, 3, 2, 2, 2), CONVPOOL_CUDA_KERNEL_K3P2},
        {"k3 Cout 64", mk(16, 32, 64, 16, 32, 32, 3, 3, 3, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k3 Cin 9", mk(2, 9, 16, 8, 8, 8, 3, 3, 3, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k2", mk(8, 8, 16, 16, 64, 64, 2, 2, 2, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k1", mk(8, 8, 16, 16, 64, 64, 1, 1, 1, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k5", mk(8, 8, 16, 16, 64, 64, 5, 5, 5, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"k 1x7x7", mk(8, 8, 16, 16, 64, 64, 1, 7, 7, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"k 3x1x1", mk(8, 8, 16, 16, 64, 64, 3, 1, 1, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k 3x1x1 pool 1x2x2", mk(2, 5, 7, 9, 10, 35, 3, 1, 1, 1, 2, 2), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k 1x3x3 Cout 40 pool 4", mk(2, 12, 40, 9, 18, 40, 1, 3, 3, 4, 4, 4), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k 3x3x1 (no group instance)", mk(2, 8, 16, 8, 12, 40, 3, 3, 1, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"k 7x7x7", mk(2, 4, 8, 16, 20, 20, 7, 7, 7, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"k 1x3x3", mk(8, 8, 16, 16, 64, 64, 1, 3, 3, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GROUP},
        /* Pools the tile reduces in registers (pool_h 1, 2, 4; pool_w 1, 2, 4, 8; any pool_d). */
        {"pool 1", mk(8, 8, 16, 16, 64, 64, 3, 3, 3, 1, 1, 1), CONVPOOL_CUDA_KERNEL_K3P2},
        {"pool 4", mk(8, 8, 16, 16, 64, 64, 3, 3, 3, 4, 4, 4), CONVPOOL_CUDA_KERNEL_K3P2},
        {"pool 1x2x2", mk(8, 8, 16, 16, 64, 64, 3, 3, 3, 1, 2, 2), CONVPOOL_CUDA_KERNEL_K3P2},
        {"pool 2x4x4", mk(8, 8, 16, 16, 64, 64, 3, 3, 3, 2, 4, 4), CONVPOOL_CUDA_KERNEL_K3P2},
        {"pool 5x1x8", mk(2, 3, 5, 13, 9, 40, 3, 3, 3, 5, 1, 8), CONVPOOL_CUDA_KERNEL_K3P2},
        {"k3 Cout 64 pool 1x2x2", mk(4, 16, 64, 8, 32, 32, 3, 3, 3, 1, 2, 2), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k1 pool 4", mk(8, 8, 16, 16, 64, 64, 1, 1, 1, 4, 4, 4), CONVPOOL_CUDA_KERNEL_GROUP},
        {"k2 pool 3x2x1", mk(2, 5, 7, 11, 12, 13, 2, 2, 2, 3, 2, 1), CONVPOOL_CUDA_KERNEL_GROUP},
        /* Pools the tile does not (a window's rows or columns would cross a thread's or warp's). */
        {"pool 3", mk(8, 8, 16, 16, 64, 64, 3, 3, 3, 3, 3, 3), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"pool 2x2x16", mk(2, 8, 16, 8, 16, 64, 3, 3, 3, 2, 2, 16), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"pool 2x8x2", mk(2, 8, 16, 8, 20, 16, 3, 3, 3, 2, 8, 2), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"pool bigger than a sub-tile", mk(1, 2, 3, 9, 40, 70, 2, 3, 2, 3, 9, 40), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"kernel 9 wide", mk(1, 2, 3, 12, 12, 12, 2, 3, 9, 2, 2, 2), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"kernel 11 wide (a wider staged row)", mk(1, 2, 3, 12, 12, 12, 2, 3, 11, 1, 1, 1), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"kernel 40 wide", mk(1, 2, 3, 4, 6, 50, 1, 3, 40, 1, 2, 2), CONVPOOL_CUDA_KERNEL_GENERAL},
        {"kernel 200 tall: no staged plane fits", mk(1, 2, 3, 4, 210, 8, 1, 200, 3, 1, 1, 1),
         CONVPOOL_CUDA_KERNEL_GENERIC},
    };
    const convpool_dtype dts[3] = {CONVPOOL_DTYPE_F32, CONVPOOL_DTYPE_F16, CONVPOOL_DTYPE_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        for (int prec = 0; prec < 2; ++prec)
            for (int d = 0; d < 3; ++d) {
                convpool_problem p = cases[i].p;
                convpool_cuda_plan plan;
                memset(&plan, 0x5a, sizeof plan);
                const convpool_status st = convpool_cuda_plan_make(&p, (convpool_precision)prec, dts[d], &plan);
                CHECK(st == CONVPOOL_OK, "%s: plan failed: %s", cases[i].name, convpool_last_error());
                if (st != CONVPOOL_OK)
                    continue;
                CHECK(plan.kernel == cases[i].want, "%s (precision %d, dtype %d): plan picked %s, want %s (%s)",
                      cases[i].name, prec, d, kname(plan.kernel), kname(cases[i].want), plan.description);
                CHECK(strncmp(plan.description, kname(plan.kernel), strlen(kname(plan.kernel))) == 0,
                      "%s: description \"%s\" does not start with the kernel name", cases[i].name,
                      plan.description);
                CHECK(memchr(plan.description, '\0', sizeof plan.description) != NULL,
                      "%s: description not terminated", cases[i].name);
                if (cases[i].want != CONVPOOL_CUDA_KERNEL_K3P2)
                    CHECK(strstr(plan.description, "not k3p2:") != NULL,
                          "%s: description does not say why k3p2 was passed over: %s", cases[i].name,
                          plan.description);
                size_t ws = 0;
                CHECK_STATUS("workspace size", convpool_cuda_workspace_size(&p, (convpool_precision)prec, dts[d], &ws),
                             CONVPOOL_OK, NULL);
                CHECK(ws == plan.workspace_bytes, "%s: workspace query %zu, plan %zu", cases[i].name, ws,
                      plan.workspace_bytes);
                CHECK(plan.parts >= 1, "%s: %lld parts", cases[i].name, (long long)plan.parts);
                CHECK(plan.workspace_bytes >= (size_t)(p.batch * p.out_channels * plan.parts) * sizeof(float),
                      "%s: the workspace does not hold the partial sums", cases[i].name);
            }
}

/* How the plan sizes its work items for the GPU, one table:
 * - k3p2 cuts the depth into items only when the batch alone cannot fill the GPU: the headline
 *   at batch 1 (32 (h, w) slabs for 2 x 132 block slots) gets 2-row d-step items, one partial
 *   sum per slab and step, and says so; at batch 128 an item keeps all 7 steps. Pool 3x2x2
 *   cuts in whole windows (3 steps = 2 windows).
 * - The general kernel's item tile follows waves x units: pool 3 at 16x64x64 at batch 2 would
 *   fill 80 of 528 block slots with the windows that waste the least of a 4x32 sub-tile (4x10
 *   windows, 27 units an item), so it takes 1x10 windows and 1 pooled d-row (320 items of 9
 *   units); at batch 16 there are enough items for 5x10. */
static void test_item_sizes(void)
{
    setenv("CONVPOOL_K3P2_SM90", "0", 1); /* the mma.sync kernel's items (test_sm90 has the others) */
    const convpool_cuda_kernel K3P2 = CONVPOOL_CUDA_KERNEL_K3P2, GENERAL = CONVPOOL_CUDA_KERNEL_GENERAL;
    const struct {
        const char *name;
        convpool_problem p;
        convpool_cuda_kernel kernel;
        int64_t parts;
        const char *text; /* in the description when present, else absent */
        int present;
    } cases[] = {
        {"headline batch 1", mk(1, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2), K3P2, 7 * 32, "d-steps", 1},
        {"headline batch 128", mk(128, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2), K3P2, 32, "d-steps", 0},
        {"pool 3x2x2 batch 1", mk(1, 8, 16, 20, 64, 64, 3, 3, 3, 3, 2, 2), K3P2, 3 * 32, "d-steps", 1},
        {"pool 3 batch 2", mk(2, 8, 16, 16, 64, 64, 3, 3, 3, 3, 3, 3), GENERAL, 4 * 20 * 2,
         "1x10 pooled windows x 1 pooled", 1},
        {"pool 3 batch 16", mk(16, 8, 16, 16, 64, 64, 3, 3, 3, 3, 3, 3), GENERAL, 4 * 4 * 2,
         "5x10 pooled windows x 1 pooled", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        convpool_cuda_plan plan;
        CHECK_STATUS("plan", convpool_cuda_plan_make(&cases[i].p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &plan),
                     CONVPOOL_OK, NULL);
        CHECK(plan.kernel == cases[i].kernel, "%s: plan picked %s, want %s", cases[i].name, kname(plan.kernel),
              kname(cases[i].kernel));
        CHECK(plan.parts == cases[i].parts, "%s: %lld parts, want %lld (%s)", cases[i].name, (long long)plan.parts,
              (long long)cases[i].parts, plan.description);
        CHECK((strstr(plan.description, cases[i].text) != NULL) == cases[i].present, "%s: description %s \"%s\": %s",
              cases[i].name, cases[i].present ? "lacks" : "has", cases[i].text, plan.description);
    }
    unsetenv("CONVPOOL_K3P2_SM90");
}

/* k3p2's mma.sync kernel runs TF32 f32-x pool-2^3 problems on its float16-operand instance from
 * 2^21 x positions (batch 32 at the headline; k3p2.cu, k3p2_f16_picks), and the description
 * says so; CONVPOOL_K3P2_F16 = 1 / 0 forces it at any size / keeps the TF32 instance. Never in
 * STRICT, for 16-bit x or for other pools. */
static void test_f16_instance(void)
{
    setenv("CONVPOOL_K3P2_SM90", "0", 1);
    static const struct {
        const char *name, *env;
        int64_t batch, pool_d;
        convpool_precision prec;
        convpool_dtype dt;
        int present;
    } cases[] = {
        {"headline b128", NULL, 128, 2, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1},
        {"headline b32 (2^21 positions)", NULL, 32, 2, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1},
        {"headline b31", NULL, 31, 2, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 0},
        {"headline b4 forced", "1", 4, 2, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1},
        {"headline b128 off", "0", 128, 2, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 0},
        {"headline b128 strict", "1", 128, 2, CONVPOOL_PRECISION_STRICT, CONVPOOL_DTYPE_F32, 0},
        {"headline b128 f16 x", "1", 128, 2, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F16, 0},
        {"headline b128 pool 1x2x2", "1", 128, 1, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        if (cases[i].env)
            setenv("CONVPOOL_K3P2_F16", cases[i].env, 1);
        const convpool_problem p = mk(cases[i].batch, 8, 16, 16, 64, 64, 3, 3, 3, cases[i].pool_d, 2, 2);
        convpool_cuda_plan plan;
        CHECK_STATUS("plan", convpool_cuda_plan_make(&p, cases[i].prec, cases[i].dt, &plan), CONVPOOL_OK, NULL);
        unsetenv("CONVPOOL_K3P2_F16");
        CHECK(plan.kernel == CONVPOOL_CUDA_KERNEL_K3P2, "%s: plan picked %s", cases[i].name, kname(plan.kernel));
        CHECK((strstr(plan.description, "float16-operand") != NULL) == cases[i].present,
              "%s: float16 instance %s: %s", cases[i].name, cases[i].present ? "absent" : "present",
              plan.description);
    }
    unsetenv("CONVPOOL_K3P2_SM90");
}

/* k3p2's wgmma kernel (k3p2_sm90.cu) on the cc 9.0 device the plan assumes: TF32 pool-2^3 on f32
 * x, where a build holds sm_90a code, for rows the mma.sync kernel would pad (W % 4 != 0) with
 * tiles of 31 pooled columns that use at least 80% of their rows; anywhere it can run with
 * CONVPOOL_K3P2_SM90=1; never with "0", in STRICT, for 16-bit x or other pools. Its item is (b, pooled d, w tile, chunk of pooled h rows): one part per (pooled d, w
 * tile, chunk); chunks only where the batch alone leaves block slots (2 an SM) empty. Its rows
 * are read element by element, so no padding. */
static void test_sm90(void)
{
    static const struct {
        const char *name, *env;
        convpool_problem p;
        convpool_precision prec;
        convpool_dtype dt;
        int sm90;      /* the wgmma kernel, in a build with sm_90a code */
        int64_t parts; /* its parts (0: not checked) */
    } cases[] = {
        {"headline b128 (aligned rows)", NULL, {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 0, 0},
        {"headline b128 forced", "1", {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1, 7},
        {"headline b1 forced", "1", {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1, 7 * 31},
        {"headline b16 forced", "1", {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1, 7 * 2},
        {"W 61 strict", NULL, {0}, CONVPOOL_PRECISION_STRICT, CONVPOOL_DTYPE_F32, 0, 0},
        {"W 61 f16", NULL, {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F16, 0, 0},
        {"W 61 off", "0", {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 0, 0},
        {"W 61 (no padding)", NULL, {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1, 0},
        {"W 33 (tile half used)", NULL, {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 0, 0},
        {"W 32 forced", "1", {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1, 0},
        {"W 126, 2 tiles", NULL, {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 1, 7 * 2},
        {"W 61 pool 1x2x2", "1", {0}, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, 0, 0},
    };
    const convpool_problem ps[] = {
        mk(128, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2),   mk(128, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2),
        mk(1, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2),     mk(16, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2),
        mk(128, 8, 16, 15, 61, 61, 3, 3, 3, 2, 2, 2),   mk(128, 8, 16, 15, 61, 61, 3, 3, 3, 2, 2, 2),
        mk(128, 8, 16, 15, 61, 61, 3, 3, 3, 2, 2, 2),   mk(128, 8, 16, 15, 61, 61, 3, 3, 3, 2, 2, 2),
        mk(128, 8, 16, 16, 64, 33, 3, 3, 3, 2, 2, 2),   mk(128, 8, 16, 16, 64, 32, 3, 3, 3, 2, 2, 2),
        mk(128, 8, 16, 16, 64, 126, 3, 3, 3, 2, 2, 2),  mk(128, 8, 16, 15, 61, 61, 3, 3, 3, 1, 2, 2),
    };
#if defined(CONVPOOL_HAVE_SM90A)
    const int built = 1;
#else
    const int built = 0;
#endif
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        if (cases[i].env)
            setenv("CONVPOOL_K3P2_SM90", cases[i].env, 1);
        convpool_cuda_plan plan;
        CHECK_STATUS("plan", convpool_cuda_plan_make(&ps[i], cases[i].prec, cases[i].dt, &plan), CONVPOOL_OK, NULL);
        unsetenv("CONVPOOL_K3P2_SM90");
        const int want = built && cases[i].sm90;
        CHECK(plan.kernel == CONVPOOL_CUDA_KERNEL_K3P2, "%s: plan picked %s", cases[i].name, kname(plan.kernel));
        CHECK((strstr(plan.description, "sm_90a wgmma") != NULL) == want, "%s: wgmma %s, want %d: %s",
              cases[i].name, want ? "absent" : "present", want, plan.description);
        if (want && cases[i].parts)
            CHECK(plan.parts == cases[i].parts, "%s: %lld parts, want %lld (%s)", cases[i].name,
                  (long long)plan.parts, (long long)cases[i].parts, plan.description);
        if (want)
            CHECK(strstr(plan.description, "padded") == NULL, "%s: padded: %s", cases[i].name, plan.description);
    }
}

/* CONVPOOL_CUDA_KERNEL forces a family where it can take the shape; otherwise the plan falls
 * to the always-capable generic kernel and says so. */
static void test_override(void)
{
    convpool_problem head = mk(4, 8, 16, 8, 20, 36, 3, 3, 3, 2, 2, 2);
    convpool_problem pool3 = mk(4, 8, 16, 8, 20, 36, 3, 3, 3, 3, 3, 3);
    convpool_problem pool4 = mk(4, 8, 16, 9, 20, 36, 3, 3, 3, 1, 4, 4);
    const struct {
        const char *env;
        convpool_problem *p;
        convpool_cuda_kernel want;
    } cases[] = {
        {"general", &head, CONVPOOL_CUDA_KERNEL_GENERAL}, {"group", &head, CONVPOOL_CUDA_KERNEL_GROUP},
        {"generic", &head, CONVPOOL_CUDA_KERNEL_GENERIC}, {"k3p2", &head, CONVPOOL_CUDA_KERNEL_K3P2},
        {"k3p2", &pool3, CONVPOOL_CUDA_KERNEL_GENERIC},   {"group", &pool3, CONVPOOL_CUDA_KERNEL_GENERIC},
        {"group", &pool4, CONVPOOL_CUDA_KERNEL_GROUP},    {"general", &pool4, CONVPOOL_CUDA_KERNEL_GENERAL},
        {"bogus", &pool3, CONVPOOL_CUDA_KERNEL_GENERAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        setenv("CONVPOOL_CUDA_KERNEL", cases[i].env, 1);
        convpool_cuda_plan plan;
        CHECK_STATUS("plan", convpool_cuda_plan_make(cases[i].p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &plan),
                     CONVPOOL_OK, NULL);
        CHECK(plan.kernel == cases[i].want, "CONVPOOL_CUDA_KERNEL=%s: plan picked %s, want %s", cases[i].env,
              kname(plan.kernel), kname(cases[i].want));
        const int known = strcmp(cases[i].env, "bogus") != 0;
        CHECK(!known || strstr(plan.description, "forced by CONVPOOL_CUDA_KERNEL") != NULL,
              "CONVPOOL_CUDA_KERNEL=%s: description does not mention the override: %s", cases[i].env,
              plan.description);
    }
    unsetenv("CONVPOOL_CUDA_KERNEL");
}

static void test_errors(void)
{
    convpool_problem p = mk(2, 3, 4, 6, 6, 6, 3, 3, 3, 2, 2, 2);
    convpool_cuda_plan plan;
    CHECK_STATUS("NULL plan", convpool_cuda_plan_make(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, NULL),
                 CONVPOOL_ERR_NULL_POINTER, "plan");
    CHECK_STATUS("NULL problem", convpool_cuda_plan_make(NULL, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &plan),
                 CONVPOOL_ERR_NULL_POINTER, "problem");
    CHECK_STATUS("bad precision", convpool_cuda_plan_make(&p, (convpool_precision)7, CONVPOOL_DTYPE_F32, &plan),
                 CONVPOOL_ERR_INVALID_ARGUMENT, "precision");
    CHECK_STATUS("bad dtype", convpool_cuda_plan_make(&p, CONVPOOL_PRECISION_TF32, (convpool_dtype)9, &plan),
                 CONVPOOL_ERR_INVALID_ARGUMENT, "dtype");
    convpool_problem bad = mk(2, 3, 4, 6, 6, 6, 3, 3, 3, 5, 2, 2);
    CHECK_STATUS("empty pool", convpool_cuda_plan_make(&bad, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &plan),
                 CONVPOOL_ERR_EMPTY_OUTPUT, "pool_d");
    size_t bytes = 0;
    CHECK_STATUS("pool workspace NULL", convpool_cuda_pool_workspace_size(&p, NULL), CONVPOOL_ERR_NULL_POINTER,
                 "bytes");
    CHECK_STATUS("pool workspace", convpool_cuda_pool_workspace_size(&p, &bytes), CONVPOOL_OK, NULL);
    CHECK(bytes >= (size_t)(p.batch * p.out_channels) * sizeof(float), "pool workspace %zu too small", bytes);
    CHECK(strcmp(convpool_cuda_kernel_name((convpool_cuda_kernel)42), "unknown") == 0,
          "an unknown kernel must print as unknown");
}

/* Rows that are not whole 16-byte chunks (W % 4 for f32, W % 8 for 16-bit x) are padded into
 * the workspace for the tensor-core families, a bounded chunk of samples at a time; aligned
 * rows and the scalar generic kernel read x in place. */
static void test_padding(void)
{
    setenv("CONVPOOL_K3P2_SM90", "0", 1); /* the wgmma kernel reads any row in place (test_sm90) */
    static const struct {
        const char *name;
        convpool_problem p;
        convpool_dtype dt;
        int padded;
    } cases[] = {
        {"W 64 f32", {0}, CONVPOOL_DTYPE_F32, 0},  {"W 61 f32", {0}, CONVPOOL_DTYPE_F32, 1},
        {"W 60 f32", {0}, CONVPOOL_DTYPE_F32, 0},  {"W 60 f16", {0}, CONVPOOL_DTYPE_F16, 1},
        {"W 64 bf16", {0}, CONVPOOL_DTYPE_BF16, 0}, {"W 61 group", {0}, CONVPOOL_DTYPE_F32, 1},
        {"W 61 general", {0}, CONVPOOL_DTYPE_F32, 1}, {"W 9 generic", {0}, CONVPOOL_DTYPE_F32, 0},
    };
    const int64_t w[] = {64, 61, 60, 60, 64, 61, 61, 9};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        convpool_problem p = mk(128, 8, 16, 15, 61, w[i], 3, 3, 3, 2, 2, 2);
        if (i == 5)
            p = mk(16, 16, 32, 15, 61, w[i], 3, 3, 3, 2, 2, 2);
        if (i == 6)
            p = mk(16, 8, 16, 15, 61, w[i], 5, 5, 5, 2, 2, 2);
        if (i == 7)
            p = mk(1, 2, 3, 3, 130, w[i], 1, 125, 2, 1, 1, 1);
        convpool_cuda_plan plan;
        CHECK_STATUS("plan", convpool_cuda_plan_make(&p, CONVPOOL_PRECISION_TF32, cases[i].dt, &plan), CONVPOOL_OK,
                     NULL);
        const int padded = strstr(plan.description, "padded") != NULL;
        CHECK(padded == cases[i].padded, "%s: padded %d, want %d (%s)", cases[i].name, padded, cases[i].padded,
              plan.description);
        if (padded) {
            /* The copy is bounded (64 MiB of samples), so a big batch takes several passes. */
            const double esize = cases[i].dt == CONVPOOL_DTYPE_F32 ? 4.0 : 2.0;
            const double x_bytes = (double)convpool_x_numel(&p) * esize;
            CHECK((double)plan.workspace_bytes < x_bytes + 80.0 * 1048576.0,
                  "%s: workspace %zu for x of %.0f bytes", cases[i].name, plan.workspace_bytes, x_bytes);
            CHECK((double)plan.workspace_bytes >= (i == 1 ? 64.0 * 1048576.0 * 0.9 : 1.0),
                  "%s: workspace %zu holds no padded copy", cases[i].name, plan.workspace_bytes);
        }
    }
    unsetenv("CONVPOOL_K3P2_SM90");
}

int main(void)
{
    convpool_problem p = mk(1, 1, 1, 3, 3, 3, 3, 3, 3, 1, 1, 1);
    convpool_cuda_plan plan;
    if (convpool_cuda_plan_make(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &plan) == CONVPOOL_ERR_UNSUPPORTED) {
        printf("SKIPPED: built without CUDA (%s)\n", convpool_last_error());
        return CHECK_SKIP;
    }
    unsetenv("CONVPOOL_CUDA_KERNEL");
    test_families();
    test_item_sizes();
    test_f16_instance();
    test_sm90();
    test_override();
    test_padding();
    test_errors();
    return check_exit_code("test_plan");
}
