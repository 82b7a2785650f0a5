/*
 * The API contract: status names, derived sizes of the headline, FLOP count, and every
 * invalid argument (status, a message naming the field, outputs untouched), for the
 * validator and both CPU forwards; the CUDA entry points fail cleanly without a GPU (with
 * CONVPOOL_ERR_UNSUPPORTED); training codes refuse windows past 32 bits.
 */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__unix__)
#include <sys/resource.h>
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CONVPOOL_TEST_HAS_ASAN 1
#endif
#endif
#ifndef CONVPOOL_TEST_HAS_ASAN
#define CONVPOOL_TEST_HAS_ASAN 0
#endif

/* A small valid problem: conv 3x4x5, pooled 1x2x2. */
static convpool_problem small_problem(void)
{
    return convpool_problem_make(2, 2, 3, 5, 6, 7, 3, 3, 3, 2, 2, 2, 2.0);
}

static void test_status_names(void)
{
    static const struct { convpool_status s; const char *name; } names[] = {
        {CONVPOOL_OK, "CONVPOOL_OK"},
        {CONVPOOL_ERR_NULL_POINTER, "CONVPOOL_ERR_NULL_POINTER"},
        {CONVPOOL_ERR_INVALID_SIZE, "CONVPOOL_ERR_INVALID_SIZE"},
        {CONVPOOL_ERR_INPUT_TOO_SMALL, "CONVPOOL_ERR_INPUT_TOO_SMALL"},
        {CONVPOOL_ERR_EMPTY_OUTPUT, "CONVPOOL_ERR_EMPTY_OUTPUT"},
        {CONVPOOL_ERR_OVERFLOW, "CONVPOOL_ERR_OVERFLOW"},
        {CONVPOOL_ERR_INVALID_ARGUMENT, "CONVPOOL_ERR_INVALID_ARGUMENT"},
        {CONVPOOL_ERR_OUT_OF_MEMORY, "CONVPOOL_ERR_OUT_OF_MEMORY"},
        {CONVPOOL_ERR_WORKSPACE, "CONVPOOL_ERR_WORKSPACE"},
        {CONVPOOL_ERR_UNSUPPORTED, "CONVPOOL_ERR_UNSUPPORTED"},
        {CONVPOOL_ERR_CUDA, "CONVPOOL_ERR_CUDA"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
        const char *got = convpool_status_name(names[i].s);
        CHECK(got && strcmp(got, names[i].name) == 0, "status %d named \"%s\", want \"%s\"",
              (int)names[i].s, got ? got : "(null)", names[i].name);
    }
    const char *unknown = convpool_status_name((convpool_status)99);
    CHECK(unknown && unknown[0], "an unknown status must still have a printable name");
}

static void test_headline(void)
{
    convpool_problem p = convpool_problem_headline();
    CHECK(p.batch == 128 && p.in_channels == 8 && p.out_channels == 16 && p.in_d == 16 &&
              p.in_h == 64 && p.in_w == 64 && p.kernel_d == 3 && p.kernel_h == 3 && p.kernel_w == 3 &&
              p.pool_d == 2 && p.pool_h == 2 && p.pool_w == 2 && p.divisor == 2.0,
          "headline fields differ from KernelBench L2 #8");
    CHECK(p.conv_d == 0 && p.pooled_w == 0, "derived fields must be zero before validation");
    CHECK_STATUS("validate headline", convpool_problem_validate(&p), CONVPOOL_OK, NULL);
    CHECK(p.conv_d == 14 && p.conv_h == 62 && p.conv_w == 62, "conv extent %lld,%lld,%lld, want 14,62,62",
          (long long)p.conv_d, (long long)p.conv_h, (long long)p.conv_w);
    CHECK(p.pooled_d == 7 && p.pooled_h == 31 && p.pooled_w == 31,
          "pooled extent %lld,%lld,%lld, want 7,31,31", (long long)p.pooled_d, (long long)p.pooled_h,
          (long long)p.pooled_w);
    CHECK(convpool_x_numel(&p) == 67108864, "x numel %lld", (long long)convpool_x_numel(&p));
    CHECK(convpool_weight_numel(&p) == 3456, "weight numel %lld", (long long)convpool_weight_numel(&p));
    /* 2 * 128*16*14*62*62 outputs * 8*27 taps, exact in a double. */
    const double want = 2.0 * 128 * 16 * 14 * 62 * 62 * 8 * 27;
    CHECK(want == 47612952576.0 && convpool_problem_flops(&p) == want, "flops %.17g, want %.17g",
          convpool_problem_flops(&p), want);
}

static void test_make_and_derived(void)
{
    convpool_problem p = convpool_problem_make(3, 4, 5, 9, 10, 11, 1, 3, 5, 1, 2, 3, -0.5);
    CHECK(p.batch == 3 && p.in_channels == 4 && p.out_channels == 5 && p.in_d == 9 && p.in_h == 10 &&
              p.in_w == 11 && p.kernel_d == 1 && p.kernel_h == 3 && p.kernel_w == 5 && p.pool_d == 1 &&
              p.pool_h == 2 && p.pool_w == 3 && p.divisor == -0.5,
          "convpool_problem_make does not store its arguments");
    CHECK(p.conv_d == 0 && p.conv_h == 0 && p.conv_w == 0 && p.pooled_d == 0 && p.pooled_h == 0 &&
              p.pooled_w == 0,
          "convpool_problem_make must zero the derived fields");
    CHECK_STATUS("validate anisotropic", convpool_problem_validate(&p), CONVPOOL_OK, NULL);
    CHECK(p.conv_d == 9 && p.conv_h == 8 && p.conv_w == 7 && p.pooled_d == 9 && p.pooled_h == 4 &&
              p.pooled_w == 2,
          "derived sizes of (9,10,11) k(1,3,5) pool(1,2,3) wrong: conv %lld,%lld,%lld pooled %lld,%lld,%lld",
          (long long)p.conv_d, (long long)p.conv_h, (long long)p.conv_w, (long long)p.pooled_d,
          (long long)p.pooled_h, (long long)p.pooled_w);

    /* Smallest valid: input = kernel, pool 1; and conv = pool exactly. */
    convpool_problem q = convpool_problem_make(1, 1, 1, 3, 4, 5, 3, 4, 5, 1, 1, 1, 1.0);
    CHECK_STATUS("input equal to kernel", convpool_problem_validate(&q), CONVPOOL_OK, NULL);
    q = convpool_problem_make(1, 1, 1, 4, 5, 6, 3, 3, 3, 2, 3, 4, 1.0);
    CHECK_STATUS("conv extent equal to pool", convpool_problem_validate(&q), CONVPOOL_OK, NULL);
    CHECK(q.pooled_d == 1 && q.pooled_h == 1 && q.pooled_w == 1, "pooled must be 1x1x1");

    /* Any divisor is a valid problem. */
    const double divisors[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, -3.0, 1e-30};
    for (size_t i = 0; i < sizeof divisors / sizeof divisors[0]; ++i) {
        convpool_problem r = small_problem();
        r.divisor = divisors[i];
        CHECK_STATUS("divisor accepted", convpool_problem_validate(&r), CONVPOOL_OK, NULL);
    }
}

/* Pointers to the 12 caller-set sizes with their field names. */
static int64_t *size_field(convpool_problem *p, int i, const char **name)
{
    static const char *names[12] = {"batch", "in_channels", "out_channels", "in_d", "in_h", "in_w",
                                    "kernel_d", "kernel_h", "kernel_w", "pool_d", "pool_h", "pool_w"};
    int64_t *f[12] = {&p->batch,    &p->in_channels, &p->out_channels, &p->in_d,
                      &p->in_h,     &p->in_w,        &p->kernel_d,     &p->kernel_h,
                      &p->kernel_w, &p->pool_d,      &p->pool_h,       &p->pool_w};
    *name = names[i];
    return f[i];
}

typedef struct bad_case {
    char what[160];
    convpool_problem p;
    convpool_status want;
    const char *field;
} bad_case;

/* Every invalid problem this test knows, in one list, so the forwards see them all too. */
static int bad_problems(bad_case *cases, int max)
{
    int n = 0;
    const int64_t bad_values[3] = {0, -1, INT64_MIN};
    for (int i = 0; i < 12; ++i)
        for (int j = 0; j < 3 && n < max; ++j) {
            bad_case *c = &cases[n++];
            c->p = small_problem();
            const char *name;
            *size_field(&c->p, i, &name) = bad_values[j];
            snprintf(c->what, sizeof c->what, "%s = %lld", name, (long long)bad_values[j]);
            c->want = CONVPOOL_ERR_INVALID_SIZE;
            c->field = name;
        }
    static const char *kernel_names[3] = {"kernel_d", "kernel_h", "kernel_w"};
    static const char *pool_names[3] = {"pool_d", "pool_h", "pool_w"};
    for (int a = 0; a < 3 && n + 2 <= max; ++a) {
        bad_case *c = &cases[n++];
        const char *name;
        c->p = small_problem();
        *size_field(&c->p, 3 + a, &name) = 2; /* input 2 < kernel 3 */
        snprintf(c->what, sizeof c->what, "%s smaller than kernel", name);
        c->want = CONVPOOL_ERR_INPUT_TOO_SMALL;
        c->field = kernel_names[a];

        c = &cases[n++];
        c->p = small_problem();
        *size_field(&c->p, 9 + a, &name) = 5; /* conv extents are 3,4,5: pool 5 leaves d,h empty */
        if (a == 2)
            c->p.pool_w = 6;
        snprintf(c->what, sizeof c->what, "%s larger than the conv extent", name);
        c->want = CONVPOOL_ERR_EMPTY_OUTPUT;
        c->field = pool_names[a];
    }
    const int64_t big = (int64_t)1 << 40, mid = (int64_t)1 << 30, m20 = (int64_t)1 << 20;
    if (n + 5 <= max) {
        /* x count 2^40 * 2^30 * 27 overflows; weight, conv output fine. */
        cases[n].p = convpool_problem_make(big, mid, 1, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1.0);
        snprintf(cases[n].what, sizeof cases[n].what, "x element count overflow");
        cases[n].want = CONVPOOL_ERR_OVERFLOW;
        cases[n++].field = "x";
        /* weight count 2^40 * 2^30 * 27 overflows; x = 2^30 * 27 fine. */
        cases[n].p = convpool_problem_make(1, mid, big, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1.0);
        snprintf(cases[n].what, sizeof cases[n].what, "weight element count overflow");
        cases[n].want = CONVPOOL_ERR_OVERFLOW;
        cases[n++].field = "weight";
        /* conv output 2^40 * 2^30 * 27 overflows; x = 2^40 * 27 and weight = 2^30 fine. */
        cases[n].p = convpool_problem_make(big, 1, mid, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1.0);
        snprintf(cases[n].what, sizeof cases[n].what, "conv output element count overflow");
        cases[n].want = CONVPOOL_ERR_OVERFLOW;
        cases[n++].field = "conv";
        /* x = 2^62, weight = 2^60, conv output ~2^40 all fit; multiply-adds ~2^100 do not. */
        cases[n].p = convpool_problem_make(1, 1, 1, m20, 2 * m20, 2 * m20, m20, m20, m20, 1, 1, 1, 1.0);
        snprintf(cases[n].what, sizeof cases[n].what, "multiply-add count overflow");
        cases[n].want = CONVPOOL_ERR_OVERFLOW;
        cases[n++].field = "multiply";
        /* The largest batch: x count overflows at once. */
        cases[n].p = convpool_problem_make(INT64_MAX, 2, 3, 5, 6, 7, 3, 3, 3, 2, 2, 2, 2.0);
        snprintf(cases[n].what, sizeof cases[n].what, "batch = INT64_MAX");
        cases[n].want = CONVPOOL_ERR_OVERFLOW;
        cases[n++].field = "x";
    }
    return n;
}

static void test_validate_errors(void)
{
    bad_case cases[64];
    const int n = bad_problems(cases, 64);
    CHECK(n >= 47, "built %d invalid cases", n);
    CHECK_STATUS("validate(NULL)", convpool_problem_validate(NULL), CONVPOOL_ERR_NULL_POINTER, "problem");
    for (int i = 0; i < n; ++i) {
        convpool_problem p = cases[i].p;
        p.conv_d = p.conv_h = p.conv_w = -7;
        p.pooled_d = p.pooled_h = p.pooled_w = -7;
        CHECK_STATUS(cases[i].what, convpool_problem_validate(&p), cases[i].want, cases[i].field);
        CHECK(p.conv_d == -7 && p.conv_h == -7 && p.conv_w == -7 && p.pooled_d == -7 &&
                  p.pooled_h == -7 && p.pooled_w == -7,
              "%s: a failed validation wrote the derived fields", cases[i].what);
    }
    /* The size check names the first bad field in declaration order. */
    convpool_problem p = small_problem();
    p.in_h = 0;
    p.pool_w = -3;
    CHECK_STATUS("in_h and pool_w both bad", convpool_problem_validate(&p), CONVPOOL_ERR_INVALID_SIZE, "in_h");
}

typedef struct buffers {
    convpool_problem p;
    float *x, *w, *cb, *bias, *pooled, *out;
} buffers;

static void buffers_init(buffers *b)
{
    b->p = small_problem();
    convpool_problem v = b->p;
    convpool_problem_validate(&v);
    const int64_t nx = convpool_x_numel(&v), nw = convpool_weight_numel(&v);
    check_rng r = check_rng_seed(7);
    b->x = (float *)check_alloc(sizeof(float) * (size_t)nx);
    b->w = (float *)check_alloc(sizeof(float) * (size_t)nw);
    b->cb = (float *)check_alloc(sizeof(float) * 3);
    b->bias = (float *)check_alloc(sizeof(float) * 3);
    b->pooled = (float *)check_alloc(sizeof(float) * 6);
    b->out = (float *)check_alloc(sizeof(float) * 2);
    check_fill_normal(&r, b->x, nx, 1.0f);
    check_fill_normal(&r, b->w, nw, 0.2f);
    check_fill_normal(&r, b->cb, 3, 0.2f);
    check_fill_normal(&r, b->bias, 3, 1.0f);
}

static void buffers_free(buffers *b)
{
    free(b->x);
    free(b->w);
    free(b->cb);
    free(b->bias);
    free(b->pooled);
    free(b->out);
}

/* which = 0: the reference (threads ignored); 1: the fused CPU path. */
static convpool_status forward(int which, const convpool_problem *p, const float *x, const float *w,
                               const float *cb, const float *bias, float *pooled, float *out, int threads)
{
    if (which == 0)
        return convpool_forward_reference(p, x, w, cb, bias, pooled, out);
    return convpool_forward_cpu(p, x, w, cb, bias, pooled, out, threads);
}

static void expect_forward_fails(int which, const char *what, const convpool_problem *p, const float *x,
                                 const float *w, const float *cb, const float *bias, float *pooled,
                                 float *out, int threads, convpool_status want, const char *field)
{
    static const char *path[2] = {"reference", "cpu"};
    char label[256];
    snprintf(label, sizeof label, "%s: %s", path[which], what);
    if (pooled)
        check_poison(pooled, 6);
    if (out)
        check_poison(out, 2);
    CHECK_STATUS(label, forward(which, p, x, w, cb, bias, pooled, out, threads), want, field);
    if (pooled)
        CHECK(check_all_poison(pooled, 6), "%s: pooled written on failure", label);
    if (out)
        CHECK(check_all_poison(out, 2), "%s: out written on failure", label);
}

static void test_forward_errors(void)
{
    buffers b;
    buffers_init(&b);
    if (check_failures)
        return;
    bad_case cases[64];
    const int n = bad_problems(cases, 64);
    for (int which = 0; which < 2; ++which) {
        const convpool_problem *p = &b.p;
        expect_forward_fails(which, "problem NULL", NULL, b.x, b.w, b.cb, b.bias, b.pooled, b.out, 1,
                             CONVPOOL_ERR_NULL_POINTER, "problem");
        expect_forward_fails(which, "x NULL", p, NULL, b.w, b.cb, b.bias, b.pooled, b.out, 1,
                             CONVPOOL_ERR_NULL_POINTER, "x");
        expect_forward_fails(which, "weight NULL", p, b.x, NULL, b.cb, b.bias, b.pooled, b.out, 1,
                             CONVPOOL_ERR_NULL_POINTER, "weight");
        expect_forward_fails(which, "pooled NULL", p, b.x, b.w, b.cb, b.bias, NULL, b.out, 1,
                             CONVPOOL_ERR_NULL_POINTER, "pooled");
        expect_forward_fails(which, "bias NULL with out", p, b.x, b.w, b.cb, NULL, b.pooled, b.out, 1,
                             CONVPOOL_ERR_NULL_POINTER, "bias");
        for (int i = 0; i < n; ++i)
            expect_forward_fails(which, cases[i].what, &cases[i].p, b.x, b.w, b.cb, b.bias, b.pooled,
                                 b.out, 1, cases[i].want, cases[i].field);
        /* Problem errors come before pointer errors (the documented order). */
        convpool_problem bad = b.p;
        bad.kernel_h = 0;
        expect_forward_fails(which, "bad problem and NULL x", &bad, NULL, b.w, b.cb, b.bias, b.pooled,
                             b.out, 1, CONVPOOL_ERR_INVALID_SIZE, "kernel_h");
    }
    const int bad_threads[3] = {-1, -2, -1000000};
    for (int i = 0; i < 3; ++i) {
        char what[64];
        snprintf(what, sizeof what, "threads = %d", bad_threads[i]);
        expect_forward_fails(1, what, &b.p, b.x, b.w, b.cb, b.bias, b.pooled, b.out, bad_threads[i],
                             CONVPOOL_ERR_INVALID_ARGUMENT, "threads");
    }

    /* Allowed: an unvalidated problem (derived fields zero), out and bias NULL, conv_bias NULL,
     * threads 0 (all cores) and more threads than cores. */
    float ref_p[6], ref_o[2];
    CHECK_STATUS("reference", convpool_forward_reference(&b.p, b.x, b.w, b.cb, b.bias, ref_p, ref_o),
                 CONVPOOL_OK, NULL);
    CHECK(b.p.conv_d == 0, "the forward must not write the caller's problem");
    for (int which = 0; which < 2; ++which) {
        const int threads_list[3] = {0, 1, 64};
        for (int t = 0; t < (which ? 3 : 1); ++t) {
            check_poison(b.pooled, 6);
            check_poison(b.out, 2);
            CHECK_STATUS("out and bias NULL", forward(which, &b.p, b.x, b.w, b.cb, NULL, b.pooled, NULL,
                                                      threads_list[t]),
                         CONVPOOL_OK, NULL);
            CHECK(check_count_poison(b.pooled, 6) == 0, "pooled not fully written (threads %d)",
                  threads_list[t]);
            CHECK(check_all_poison(b.out, 2), "out written although NULL was passed");
            check_poison(b.pooled, 6);
            CHECK_STATUS("out NULL, bias given", forward(which, &b.p, b.x, b.w, b.cb, b.bias, b.pooled, NULL,
                                                         threads_list[t]),
                         CONVPOOL_OK, NULL);
            check_poison(b.pooled, 6);
            CHECK_STATUS("conv_bias NULL", forward(which, &b.p, b.x, b.w, NULL, b.bias, b.pooled, b.out,
                                                   threads_list[t]),
                         CONVPOOL_OK, NULL);
            CHECK(check_count_poison(b.pooled, 6) == 0 && check_count_poison(b.out, 2) == 0,
                  "outputs not fully written with conv_bias NULL");
        }
    }
    buffers_free(&b);
}

/* Without a usable GPU the CUDA entry points return a clean error and touch nothing. */
static void test_cuda_without_gpu(void)
{
    if (convpool_cuda_available()) {
        printf("test_api: a CUDA device is present; test_cuda covers the GPU path\n");
        return;
    }
    convpool_problem p = small_problem();
    size_t bytes = 12345;
    convpool_status s = convpool_cuda_workspace_size(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &bytes);
    CHECK(s == CONVPOOL_OK || s == CONVPOOL_ERR_UNSUPPORTED || s == CONVPOOL_ERR_CUDA,
          "workspace query without a GPU returned %s", convpool_status_name(s));
    if (s != CONVPOOL_OK)
        CHECK(convpool_last_error()[0] != '\0', "workspace query failed without a message");

    /* Host pointers and otherwise valid arguments (the workspace as large as the query said):
     * the call must refuse for want of a device before touching them as device memory. */
    float x[2 * 2 * 5 * 6 * 7], w[3 * 2 * 27], cb[3], bias[3], pooled[6], out[2];
    memset(x, 0, sizeof x);
    memset(w, 0, sizeof w);
    memset(cb, 0, sizeof cb);
    memset(bias, 0, sizeof bias);
    check_poison(pooled, 6);
    check_poison(out, 2);
    const size_t ws_bytes = s == CONVPOOL_OK ? bytes : 0;
    void *ws = ws_bytes ? check_alloc(ws_bytes) : NULL;
    s = convpool_forward_cuda(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, x, w, cb, bias, pooled, out, ws,
                              ws_bytes, NULL);
    /* convpool.h: UNSUPPORTED for "no usable GPU" (no device, or a driver too old for the
     * runtime), not a CUDA error. */
    CHECK(s == CONVPOOL_ERR_UNSUPPORTED, "convpool_forward_cuda without a GPU returned %s: %s",
          convpool_status_name(s), convpool_last_error());
    CHECK(convpool_last_error()[0] != '\0', "convpool_forward_cuda failed without a message");
    CHECK(check_all_poison(pooled, 6) && check_all_poison(out, 2), "convpool_forward_cuda wrote outputs");
    printf("test_api: no CUDA device; convpool_forward_cuda returns %s: %s\n", convpool_status_name(s),
           convpool_last_error());
    /* Any other argument error is fine too, as long as it is an error. */
    s = convpool_forward_cuda(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, x, w, cb, bias, pooled, out, NULL,
                              0, NULL);
    CHECK(s != CONVPOOL_OK && convpool_last_error()[0] != '\0',
          "convpool_forward_cuda without a GPU and without workspace returned %s", convpool_status_name(s));
    CHECK(check_all_poison(pooled, 6) && check_all_poison(out, 2), "convpool_forward_cuda wrote outputs");
    s = convpool_forward_cuda(NULL, CONVPOOL_PRECISION_STRICT, CONVPOOL_DTYPE_F32, NULL, NULL, NULL, NULL,
                              NULL, NULL, NULL, 0, NULL);
    CHECK(s != CONVPOOL_OK, "convpool_forward_cuda(NULL ...) returned OK");

    /* Every other entry point that needs the device says UNSUPPORTED too. */
    size_t cbytes = 0, pbytes = 0;
    CHECK_STATUS("codes size", convpool_codes_size(&p, &cbytes), CONVPOOL_OK, NULL);
    unsigned char *codes = (unsigned char *)check_alloc(cbytes);
    s = convpool_forward_train_cuda(&p, CONVPOOL_PRECISION_TF32, x, w, cb, bias, pooled, out, codes, ws, ws_bytes,
                                    NULL);
    CHECK(s == CONVPOOL_ERR_UNSUPPORTED, "convpool_forward_train_cuda without a GPU returned %s: %s",
          convpool_status_name(s), convpool_last_error());
    s = convpool_forward_train_cuda_deferred(&p, CONVPOOL_PRECISION_TF32, x, w, cb, bias, pooled, out, codes, ws,
                                             ws_bytes, NULL);
    CHECK(s == CONVPOOL_ERR_UNSUPPORTED, "convpool_forward_train_cuda_deferred without a GPU returned %s: %s",
          convpool_status_name(s), convpool_last_error());
    s = convpool_settle_codes_cuda(&p, CONVPOOL_PRECISION_STRICT, x, w, cb, codes, NULL);
    CHECK(s == CONVPOOL_ERR_UNSUPPORTED, "convpool_settle_codes_cuda without a GPU returned %s: %s",
          convpool_status_name(s), convpool_last_error());
    CHECK(check_all_poison(pooled, 6) && check_all_poison(out, 2), "a training forward without a GPU wrote outputs");
    s = convpool_cuda_pool_workspace_size(&p, &pbytes);
    void *pws = s == CONVPOOL_OK && pbytes ? check_alloc(pbytes) : NULL;
    float y[2 * 3 * 3 * 4 * 5];
    memset(y, 0, sizeof y);
    s = convpool_pool_forward_cuda(&p, y, bias, pooled, out, pws, pws ? pbytes : 0, NULL);
    CHECK(s == CONVPOOL_ERR_UNSUPPORTED, "convpool_pool_forward_cuda without a GPU returned %s: %s",
          convpool_status_name(s), convpool_last_error());
    float gcb[3];
    check_poison(gcb, 3);
    s = convpool_backward_cuda(&p, CONVPOOL_PRECISION_TF32, x, w, codes, pooled, NULL, NULL, NULL, gcb, NULL, 0, NULL);
    CHECK(s == CONVPOOL_ERR_UNSUPPORTED, "convpool_backward_cuda without a GPU returned %s: %s",
          convpool_status_name(s), convpool_last_error());
    s = convpool_backward_cuda_strided(&p, CONVPOOL_PRECISION_TF32, x, w, codes, pooled, out, 0, NULL, NULL, gcb,
                                       NULL, 0, NULL);
    CHECK(s == CONVPOOL_ERR_UNSUPPORTED, "convpool_backward_cuda_strided without a GPU returned %s: %s",
          convpool_status_name(s), convpool_last_error());
    s = convpool_backward_cuda_strided(&p, CONVPOOL_PRECISION_TF32, x, w, codes, pooled, out, -1, NULL, NULL, gcb,
                                       NULL, 0, NULL);
    CHECK(s == CONVPOOL_ERR_INVALID_ARGUMENT && strstr(convpool_last_error(), "grad_out_stride"),
          "convpool_backward_cuda_strided took stride -1: %s", convpool_status_name(s));
    float gb[3];
    check_poison(gb, 3);
    s = convpool_backward_cuda_all(&p, CONVPOOL_PRECISION_TF32, x, w, codes, pooled, out, 0, NULL, NULL, gcb, gb,
                                   NULL, 0, NULL);
    CHECK(s == CONVPOOL_ERR_UNSUPPORTED, "convpool_backward_cuda_all without a GPU returned %s: %s",
          convpool_status_name(s), convpool_last_error());
    CHECK(check_all_poison(pooled, 6) && check_all_poison(out, 2) && check_all_poison(gcb, 3) &&
              check_all_poison(gb, 3),
          "a CUDA entry point without a GPU wrote outputs");
    free(pws);
    free(codes);
    free(ws);
}

/* The last error is per thread: a failure on one thread leaves another's message alone. */
static void test_error_is_per_thread(void)
{
#ifdef _OPENMP
    convpool_problem bad = small_problem();
    bad.pool_h = 0;
    convpool_problem_validate(&bad); /* main thread's message names pool_h */
    int other_ok = 0, mine_ok = 0;
#pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 1) {
            other_ok = !check_mentions(convpool_last_error(), "pool_h");
            convpool_problem_validate(NULL);
        }
#pragma omp barrier
        if (omp_get_thread_num() == 0)
            mine_ok = check_mentions(convpool_last_error(), "pool_h");
    }
    CHECK(mine_ok, "main thread's message changed by another thread's failure: \"%s\"", convpool_last_error());
    CHECK(other_ok, "another thread saw the main thread's message");
#endif
}


/* ---- hardening: each reproducer of the "Hardening" issue is a clean error or PyTorch's answer ---- */

/* An output overlapping an input or the other output is refused, naming both, before any
 * output is written; inputs may share memory. */
static void test_overlap(void)
{
    buffers b;
    buffers_init(&b);
    if (check_failures)
        return;
    const convpool_problem *p = &b.p;
    const struct {
        const char *what;
        float *pooled, *out;
        const char *a, *other;
        int poison; /* 0: pooled sits in a buffer shorter than 6 floats */
    } cases[] = {
        {"out == pooled", b.pooled, b.pooled, "pooled", "out", 1},
        {"pooled == x", b.x, b.out, "pooled", "x", 1},
        {"pooled inside x", b.x + 100, b.out, "pooled", "x", 1},
        {"pooled == weight", b.w, b.out, "pooled", "weight", 1},
        {"pooled == conv_bias", b.cb, b.out, "pooled", "conv_bias", 0},
        {"out == bias", b.pooled, b.bias, "out", "bias", 1},
        {"out at the end of x", b.pooled, b.x + 418, "out", "x", 1},
        {"out overlapping pooled's tail", b.pooled, b.pooled + 4, "pooled", "out", 1},
    };
    for (int which = 0; which < 2; ++which)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
            if (cases[i].poison) {
                check_poison(cases[i].pooled, 6);
                check_poison(cases[i].out, 2);
            }
            const convpool_status st =
                forward(which, p, b.x, b.w, b.cb, b.bias, cases[i].pooled, cases[i].out, 1);
            CHECK(st == CONVPOOL_ERR_INVALID_ARGUMENT, "%s (path %d): status %s, want INVALID_ARGUMENT",
                  cases[i].what, which, convpool_status_name(st));
            CHECK(check_mentions(convpool_last_error(), cases[i].a) &&
                      check_mentions(convpool_last_error(), cases[i].other),
                  "%s: message \"%s\" does not name %s and %s", cases[i].what, convpool_last_error(), cases[i].a,
                  cases[i].other);
            CHECK(!cases[i].poison || (check_all_poison(cases[i].pooled, 6) && check_all_poison(cases[i].out, 2)),
                  "%s (path %d): an output was written on failure", cases[i].what, which);
        }
    /* Inputs sharing memory are fine: x doubles as the weight and both biases. */
    for (int which = 0; which < 2; ++which)
        CHECK_STATUS("inputs overlapping each other", forward(which, p, b.x, b.x, b.x, b.x, b.pooled, b.out, 1),
                     CONVPOOL_OK, NULL);
    buffers_free(&b);
}

/* threads far beyond the machine: capped inside the library, same bits as one thread. */
static void test_huge_threads(void)
{
    const int64_t n = 100000;
    convpool_problem p = convpool_problem_make(n, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1.0);
    float *x = (float *)check_alloc(sizeof(float) * (size_t)n), w = 0.75f, cb = 0.25f, bias = -1.0f;
    float *p1 = (float *)check_alloc(sizeof(float) * (size_t)n), *o1 = (float *)check_alloc(sizeof(float) * (size_t)n);
    float *pn = (float *)check_alloc(sizeof(float) * (size_t)n), *on = (float *)check_alloc(sizeof(float) * (size_t)n);
    if (x && p1 && o1 && pn && on) {
        check_rng r = check_rng_seed(11);
        check_fill_normal(&r, x, n, 1.0f);
        CHECK_STATUS("threads 1", convpool_forward_cpu(&p, x, &w, &cb, &bias, p1, o1, 1), CONVPOOL_OK, NULL);
        const int many[3] = {50000, 100000, 2147483647};
        for (int i = 0; i < 3; ++i) {
            check_poison(pn, n);
            CHECK_STATUS("threads huge", convpool_forward_cpu(&p, x, &w, &cb, &bias, pn, on, many[i]), CONVPOOL_OK,
                         NULL);
            CHECK(check_same_bits("pooled, huge thread count vs 1", pn, p1, n) == 0 &&
                      check_same_bits("out, huge thread count vs 1", on, o1, n) == 0,
                  "threads %d changed the result", many[i]);
        }
    }
    free(x);
    free(p1);
    free(o1);
    free(pn);
    free(on);
}

/* Problems that pass validation but could never fit in memory: a clean OUT_OF_MEMORY with a
 * finite size, not a wrapped scratch size (SIGFPE, signed overflow). The buffers are tiny: the
 * call must fail before it touches them. */
static void test_scratch_overflow(void)
{
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 1, 1}, cb[4] = {0}, bias[4] = {0}, pooled[4], out[4];
    for (int k = 57; k <= 62; ++k) {
        for (int which_field = 0; which_field < 2; ++which_field) {
            const int64_t big = (int64_t)1 << k;
            convpool_problem p = which_field == 0 ? convpool_problem_make(1, 1, big, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1.0)
                                                  : convpool_problem_make(1, big, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1.0);
            convpool_problem v = p;
            if (convpool_problem_validate(&v) != CONVPOOL_OK)
                continue; /* over int64 somewhere: validation's job, tested elsewhere */
            check_poison(pooled, 4);
            check_poison(out, 4);
            const convpool_status st = convpool_forward_cpu(&p, x, w, cb, bias, pooled, out, 2);
            CHECK(st == CONVPOOL_ERR_OUT_OF_MEMORY, "%s = 2^%d: status %s (%s), want OUT_OF_MEMORY",
                  which_field ? "in_channels" : "out_channels", k, convpool_status_name(st), convpool_last_error());
            CHECK(strstr(convpool_last_error(), "bytes") && !strstr(convpool_last_error(), "-"),
                  "2^%d: the message should give a positive size: %s", k, convpool_last_error());
            CHECK(check_all_poison(pooled, 4) && check_all_poison(out, 4), "2^%d: outputs written on failure", k);
        }
    }
}

/* PyTorch's conv output is float32: beyond FLT_MAX it is inf, and so is P, although a double
 * pipeline would divide 6e38 by 2 and stay finite. */
static void test_float32_conv_overflow(void)
{
    convpool_problem p = convpool_problem_make(1, 1, 1, 1, 1, 2, 1, 1, 2, 1, 1, 1, 2.0);
    const float x[2] = {3e38f, 3e38f}, w[2] = {1.0f, 1.0f}, cb = 0.0f, bias = 0.0f;
    for (int which = 0; which < 2; ++which) {
        float pooled = 0.0f, out = 0.0f;
        CHECK_STATUS("conv overflow", forward(which, &p, x, w, &cb, &bias, &pooled, &out, 1), CONVPOOL_OK, NULL);
        CHECK(isinf(pooled) && pooled > 0 && isinf(out) && out > 0,
              "path %d: x = [3e38, 3e38], kernel of ones, divisor 2 gave P %g, out %g; PyTorch gives +inf", which,
              (double)pooled, (double)out);
    }
}

/* An overflowing product blames its largest factor first (the CLI names that flag). */
static void test_overflow_blame(void)
{
    convpool_problem p = convpool_problem_headline();
    p.in_w = (int64_t)1 << 40;
    CHECK_STATUS("in_w 2^40", convpool_problem_validate(&p), CONVPOOL_ERR_OVERFLOW, "in_w");
    CHECK(strncmp(convpool_last_error(), "in_w (", 6) == 0, "the message should start with in_w: %s",
          convpool_last_error());
    p = convpool_problem_headline();
    p.out_channels = (int64_t)1 << 60;
    CHECK_STATUS("out_channels 2^60", convpool_problem_validate(&p), CONVPOOL_ERR_OVERFLOW, "out_channels");
    CHECK(strncmp(convpool_last_error(), "out_channels (", 14) == 0, "the message should start with out_channels: %s",
          convpool_last_error());
}

/* Training codes: width by window size, the size query, and its errors. */
static void test_codes(void)
{
    static const struct {
        int64_t pd, ph, pw;
        int bytes;
    } w[] = {{2, 2, 2, 1}, {1, 16, 16, 1}, {2, 16, 16, 2}, {1, 256, 256, 2}, {2, 256, 256, 4}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; ++i) {
        convpool_problem p = convpool_problem_make(3, 2, 5, 4, 600, 600, 1, 1, 1, w[i].pd, w[i].ph, w[i].pw, 2.0);
        CHECK(convpool_problem_validate(&p) == CONVPOOL_OK, "codes case %zu invalid", i);
        CHECK(convpool_code_bytes(&p) == w[i].bytes, "pool %lldx%lldx%lld: %d code bytes, want %d", (long long)w[i].pd,
              (long long)w[i].ph, (long long)w[i].pw, convpool_code_bytes(&p), w[i].bytes);
        size_t bytes = 0;
        CHECK(convpool_codes_size(&p, &bytes) == CONVPOOL_OK, "codes size: %s", convpool_last_error());
        const size_t want = (size_t)(3 * 5 * (4 / w[i].pd) * (600 / w[i].ph) * (600 / w[i].pw)) * (size_t)w[i].bytes;
        CHECK(bytes == want, "pool %lldx%lldx%lld: codes size %zu, want %zu", (long long)w[i].pd, (long long)w[i].ph,
              (long long)w[i].pw, bytes, want);
    }
    convpool_problem p = small_problem();
    size_t bytes = 0;
    CHECK(convpool_codes_size(NULL, &bytes) == CONVPOOL_ERR_NULL_POINTER && strstr(convpool_last_error(), "problem"),
          "codes size of NULL: %s", convpool_last_error());
    CHECK(convpool_codes_size(&p, NULL) == CONVPOOL_ERR_NULL_POINTER && strstr(convpool_last_error(), "bytes"),
          "codes size into NULL: %s", convpool_last_error());
    convpool_problem bad = p;
    bad.pool_w = 0;
    CHECK(convpool_codes_size(&bad, &bytes) == CONVPOOL_ERR_INVALID_SIZE, "codes size of a bad problem: %s",
          convpool_last_error());
}

/* A window of more than 2^32 positions has no 32-bit code: every entry that writes or reads codes
 * refuses it, naming the pool, before it touches a buffer (the buffers are far too small: a call
 * that went on would read or write past them). 2^32 positions exactly still fit. */
static void test_code_window(void)
{
    convpool_problem p = convpool_problem_make(1, 1, 1, 1, 65537, 65537, 1, 1, 1, 1, 65537, 65537, 1.0);
    CHECK_STATUS("validate pool 65537^2", convpool_problem_validate(&p), CONVPOOL_OK, NULL);
    const char *pool = "pool_d|pool_h|pool_w";
    size_t bytes = 0;
    CHECK_STATUS("codes size", convpool_codes_size(&p, &bytes), CONVPOOL_ERR_INVALID_ARGUMENT, pool);
    float x[4] = {0}, w[1] = {1.0f}, bias[1] = {0}, pooled[1], out[1], gx[4], gw[1], gcb[1], gp[1] = {1.0f};
    uint32_t codes[2] = {0xdeadbeef, 0xdeadbeef};
    check_poison(pooled, 1);
    check_poison(out, 1);
    check_poison(gx, 4);
    check_poison(gw, 1);
    check_poison(gcb, 1);
    CHECK_STATUS("pool codes cpu", convpool_pool_codes_cpu(&p, x, codes, 1), CONVPOOL_ERR_INVALID_ARGUMENT, pool);
    CHECK_STATUS("codes cpu", convpool_codes_cpu(&p, x, w, NULL, codes, 1), CONVPOOL_ERR_INVALID_ARGUMENT, pool);
    CHECK_STATUS("forward train cpu", convpool_forward_train_cpu(&p, x, w, NULL, bias, pooled, out, codes, 1),
                 CONVPOOL_ERR_INVALID_ARGUMENT, pool);
    CHECK_STATUS("backward cpu", convpool_backward_cpu(&p, x, w, codes, gp, NULL, gx, gw, gcb, 1),
                 CONVPOOL_ERR_INVALID_ARGUMENT, pool);
#ifdef CONVPOOL_HAVE_CUDA
    /* The CUDA entries check on the host, before they look for a device. */
    const convpool_status want = CONVPOOL_ERR_INVALID_ARGUMENT;
#else
    const convpool_status want = CONVPOOL_ERR_UNSUPPORTED;
    pool = NULL;
#endif
    CHECK_STATUS("forward train cuda",
                 convpool_forward_train_cuda(&p, CONVPOOL_PRECISION_TF32, x, w, NULL, bias, pooled, out, codes, NULL,
                                             0, NULL),
                 want, pool);
    CHECK_STATUS("forward train cuda deferred",
                 convpool_forward_train_cuda_deferred(&p, CONVPOOL_PRECISION_TF32, x, w, NULL, bias, pooled, out, codes,
                                                      NULL, 0, NULL),
                 want, pool);
    CHECK_STATUS("settle codes cuda", convpool_settle_codes_cuda(&p, CONVPOOL_PRECISION_STRICT, x, w, NULL, codes, NULL),
                 want, pool);
    CHECK_STATUS("pool forward train cuda",
                 convpool_pool_forward_train_cuda(&p, x, bias, pooled, out, codes, NULL, 0, NULL), want, pool);
    CHECK_STATUS("backward cuda",
                 convpool_backward_cuda(&p, CONVPOOL_PRECISION_TF32, x, w, codes, gp, NULL, gx, gw, gcb, NULL, 0,
                                        NULL),
                 want, pool);
    CHECK(codes[0] == 0xdeadbeef && codes[1] == 0xdeadbeef && check_all_poison(pooled, 1) &&
              check_all_poison(out, 1) && check_all_poison(gx, 4) && check_all_poison(gw, 1) &&
              check_all_poison(gcb, 1),
          "a refused codes call wrote an output");
    convpool_problem q = convpool_problem_make(1, 1, 1, 1, 65536, 65536, 1, 1, 1, 1, 65536, 65536, 1.0);
    CHECK_STATUS("codes size, 2^32 positions", convpool_codes_size(&q, &bytes), CONVPOOL_OK, NULL);
    CHECK(bytes == 4 && convpool_code_bytes(&q) == 4, "2^32 positions: %zu code bytes, want 4", bytes);
}

/* The backward writes nothing when it fails: here its buffers (x-sized, 2^36 floats of x) cannot
 * be allocated, after the code check passed, where grad_conv_bias was once already written.
 * RLIMIT_AS makes the allocation fail on any host, however much memory it has. x and the
 * weight are on the stack, the outputs static (below): their spans do not overlap, so the call
 * gets that far. Skipped under ASan, whose allocator aborts on a failed allocation. */
static void test_backward_no_write_on_failure(void)
{
#if defined(__unix__) && !defined(__SANITIZE_ADDRESS__) && !CONVPOOL_TEST_HAS_ASAN
    static float gw[1], gcb[1];
    float x[1] = {1.0f}, w[1] = {1.0f}, gp[1] = {1.0f}, go[1] = {1.0f};
    unsigned char codes[1] = {0};
    convpool_problem p = convpool_problem_make(1, (int64_t)1 << 36, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1.0);
    struct rlimit old, cap;
    if (getrlimit(RLIMIT_AS, &old) != 0)
        return;
    cap = old;
    cap.rlim_cur = (rlim_t)64 << 30; /* far below the 256 GiB asked for, far above what runs here */
    if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < cap.rlim_cur)
        cap.rlim_cur = old.rlim_cur;
    if (setrlimit(RLIMIT_AS, &cap) != 0)
        return;
    check_poison(gw, 1);
    check_poison(gcb, 1);
    const convpool_status st = convpool_backward_cpu(&p, x, w, codes, gp, go, NULL, gw, gcb, 1);
    setrlimit(RLIMIT_AS, &old);
    CHECK_STATUS("backward, 2^36 input channels", st, CONVPOOL_ERR_OUT_OF_MEMORY, NULL);
    CHECK(check_all_poison(gw, 1) && check_all_poison(gcb, 1), "a failed backward wrote grad_weight or grad_conv_bias");
#endif
}

/* Names and sizes of what is not a valid problem: the argument the message names, and a
 * sentinel (not a wrapped product or a crash) from the size helpers. */
static void test_helpers_robust(void)
{
    float y[4] = {0};
    unsigned char codes[8];
    convpool_problem p = small_problem();
    CHECK_STATUS("pool codes of NULL y", convpool_pool_codes_cpu(&p, NULL, codes, 0), CONVPOOL_ERR_NULL_POINTER, "y");
    CHECK_STATUS("pool codes into NULL", convpool_pool_codes_cpu(&p, y, NULL, 0), CONVPOOL_ERR_NULL_POINTER, "codes");
    CHECK(convpool_code_bytes(NULL) == 0, "convpool_code_bytes(NULL) = %d, want 0", convpool_code_bytes(NULL));
    CHECK(convpool_x_numel(NULL) == -1 && convpool_weight_numel(NULL) == -1, "numel of NULL must be -1");
    convpool_problem big = convpool_problem_make(INT64_MAX / 2, 4, 4, 4, 4, 4, 3, 3, 3, 1, 1, 1, 1.0);
    CHECK(convpool_x_numel(&big) == -1, "x numel overflowing int64: %lld, want -1", (long long)convpool_x_numel(&big));
    big = convpool_problem_make(1, 4, INT64_MAX / 2, 4, 4, 4, 3, 3, 3, 1, 1, 1, 1.0);
    CHECK(convpool_weight_numel(&big) == -1, "weight numel overflowing int64: %lld, want -1",
          (long long)convpool_weight_numel(&big));
    big = convpool_problem_make(0, 4, 4, 4, 4, 4, 3, 3, 3, 1, 1, 1, 1.0);
    CHECK(convpool_x_numel(&big) == -1, "x numel with batch 0: %lld, want -1", (long long)convpool_x_numel(&big));
    CHECK(convpool_x_numel(&p) == 2 * 2 * 5 * 6 * 7 && convpool_weight_numel(&p) == 3 * 2 * 27,
          "numel of an unvalidated valid problem must be exact");
}

/* The thread count the CPU calls start: capped however many are asked for (test_api_many_threads
 * runs this with OMP_NUM_THREADS=100000, which the CLI's own filler once asked OpenMP for). */
static void test_thread_count(void)
{
    int procs = 1;
#ifdef _OPENMP
    procs = omp_get_num_procs();
#endif
    const int asked[4] = {0, 1, 100000, 2147483647};
    for (int i = 0; i < 4; ++i) {
        const int n = convpool_cpu_thread_count(asked[i]);
        CHECK(n >= 1 && n <= procs && n <= 1024, "threads %d: %d started, want 1..%d", asked[i], n, procs);
    }
    CHECK(convpool_cpu_thread_count(1) == 1, "one thread asked, %d started", convpool_cpu_thread_count(1));
    CHECK(convpool_cpu_thread_count(-5) == 1, "a negative count gives %d, want 1", convpool_cpu_thread_count(-5));
}

/* Which CPU path a shape takes (the PyTorch binding routes by it): Winograd for kernel 3 in h
 * and w with even pool_h and pool_w, the direct path otherwise; 0 for NULL and invalid problems.
 * (test_cpu_sweep checks both paths' results against the reference.) */
static void test_cpu_winograd(void)
{
    const struct { int kd, kh, kw, pd, ph, pw, want; } c[] = {
        {3, 3, 3, 2, 2, 2, 1}, {1, 3, 3, 1, 2, 2, 1}, {3, 3, 3, 2, 4, 4, 1}, {5, 5, 5, 2, 2, 2, 0},
        {3, 3, 3, 3, 3, 3, 0}, {3, 3, 3, 2, 2, 1, 0}, {3, 1, 1, 2, 2, 2, 0}, {2, 3, 5, 2, 2, 2, 0},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; ++i) {
        convpool_problem p = convpool_problem_make(2, 8, 16, 16, 20, 24, c[i].kd, c[i].kh, c[i].kw, c[i].pd,
                                                   c[i].ph, c[i].pw, 2.0);
        CHECK(convpool_cpu_winograd(&p) == c[i].want, "kernel %dx%dx%d pool %dx%dx%d: winograd %d, want %d",
              c[i].kd, c[i].kh, c[i].kw, c[i].pd, c[i].ph, c[i].pw, convpool_cpu_winograd(&p), c[i].want);
    }
    CHECK(convpool_cpu_winograd(NULL) == 0, "NULL problem gives %d", convpool_cpu_winograd(NULL));
    convpool_problem bad = convpool_problem_make(2, 8, 16, 2, 20, 24, 3, 3, 3, 2, 2, 2, 2.0); /* depth 2 < kernel */
    CHECK(convpool_cpu_winograd(&bad) == 0, "invalid problem gives %d", convpool_cpu_winograd(&bad));
}

/* The CPU training entry points: errors name the argument and write nothing. */
static void test_training_cpu_errors(void)
{
    convpool_problem p = small_problem();
    CHECK(convpool_problem_validate(&p) == CONVPOOL_OK, "small problem invalid");
    const int64_t nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p), C = p.out_channels;
    size_t nc = 0;
    CHECK(convpool_codes_size(&p, &nc) == CONVPOOL_OK, "codes size: %s", convpool_last_error());
    float *x = (float *)check_alloc(sizeof(float) * (size_t)nx), *w = (float *)check_alloc(sizeof(float) * (size_t)nw);
    float *gx = (float *)check_alloc(sizeof(float) * (size_t)nx), *gw = (float *)check_alloc(sizeof(float) * (size_t)nw);
    float *gp = (float *)check_alloc(sizeof(float) * (size_t)(p.batch * C));
    unsigned char *codes = (unsigned char *)check_alloc(nc);
    if (x && w && gx && gw && gp && codes) {
        check_rng r = check_rng_seed(5);
        check_fill_uniform(&r, x, nx, 0.0f, 1.0f);
        check_fill_uniform(&r, w, nw, -0.5f, 0.5f);
        check_fill_uniform(&r, gp, p.batch * C, -1.0f, 1.0f);
        CHECK_STATUS("codes", convpool_codes_cpu(&p, x, w, NULL, codes, 1), CONVPOOL_OK, NULL);
        CHECK_STATUS("codes NULL", convpool_codes_cpu(&p, x, w, NULL, NULL, 1), CONVPOOL_ERR_NULL_POINTER, "codes");
        CHECK_STATUS("codes x NULL", convpool_codes_cpu(&p, NULL, w, NULL, codes, 1), CONVPOOL_ERR_NULL_POINTER, "x");
        CHECK_STATUS("codes threads", convpool_codes_cpu(&p, x, w, NULL, codes, -1), CONVPOOL_ERR_INVALID_ARGUMENT,
                     "threads");
        CHECK_STATUS("codes over x", convpool_codes_cpu(&p, x, w, NULL, x, 1), CONVPOOL_ERR_INVALID_ARGUMENT, "codes");
        CHECK_STATUS("pool codes threads", convpool_pool_codes_cpu(&p, x, codes, -2), CONVPOOL_ERR_INVALID_ARGUMENT,
                     "threads");
        check_poison(gx, nx);
        check_poison(gw, nw);
        CHECK_STATUS("backward codes NULL", convpool_backward_cpu(&p, x, w, NULL, gp, NULL, gx, gw, NULL, 1),
                     CONVPOOL_ERR_NULL_POINTER, "codes");
        CHECK_STATUS("backward threads", convpool_backward_cpu(&p, x, w, codes, gp, NULL, gx, gw, NULL, -1),
                     CONVPOOL_ERR_INVALID_ARGUMENT, "threads");
        CHECK_STATUS("backward grad_x over x", convpool_backward_cpu(&p, x, w, codes, gp, NULL, x, gw, NULL, 1),
                     CONVPOOL_ERR_INVALID_ARGUMENT, "grad_x");
        CHECK_STATUS("backward grad_weight over codes",
                     convpool_backward_cpu(&p, x, w, codes, gp, NULL, gx, (float *)codes, NULL, 1),
                     CONVPOOL_ERR_INVALID_ARGUMENT, "grad_weight");
        CHECK(check_all_poison(gx, nx) && check_all_poison(gw, nw), "a refused backward wrote its outputs");
        /* Only what is asked for is written. */
        CHECK_STATUS("backward grad_x only", convpool_backward_cpu(&p, x, w, codes, gp, NULL, gx, NULL, NULL, 0),
                     CONVPOOL_OK, NULL);
        CHECK(check_count_poison(gx, nx) == 0 && check_all_poison(gw, nw), "grad_x only: wrong outputs written");
#ifdef CONVPOOL_HAVE_CUDA
        /* The settle checks its arguments on the host, before it looks for a device (these
         * buffers are host memory: a call that got further would be refused for that). */
        CHECK_STATUS("settle codes NULL", convpool_settle_codes_cuda(&p, CONVPOOL_PRECISION_TF32, x, w, NULL, NULL, NULL),
                     CONVPOOL_ERR_NULL_POINTER, "codes");
        CHECK_STATUS("settle x NULL", convpool_settle_codes_cuda(&p, CONVPOOL_PRECISION_TF32, NULL, w, NULL, codes, NULL),
                     CONVPOOL_ERR_NULL_POINTER, "x");
        CHECK_STATUS("settle codes over x", convpool_settle_codes_cuda(&p, CONVPOOL_PRECISION_STRICT, x, w, NULL, x, NULL),
                     CONVPOOL_ERR_INVALID_ARGUMENT, "codes");
        CHECK_STATUS("settle precision", convpool_settle_codes_cuda(&p, (convpool_precision)7, x, w, NULL, codes, NULL),
                     CONVPOOL_ERR_INVALID_ARGUMENT, "precision");
#endif
    }
    free(x), free(w), free(gx), free(gw), free(gp), free(codes);
}

int main(void)
{
    /* Before any failure the message is empty. */
    CHECK(convpool_last_error() != NULL && strcmp(convpool_last_error(), "") == 0,
          "last error before any failure is \"%s\"", convpool_last_error());
    test_status_names();
    test_headline();
    test_make_and_derived();
    test_validate_errors();
    test_forward_errors();
    test_cuda_without_gpu();
    test_error_is_per_thread();
    test_overlap();
    test_huge_threads();
    test_scratch_overflow();
    test_float32_conv_overflow();
    test_overflow_blame();
    test_codes();
    test_training_cpu_errors();
    test_code_window();
    test_backward_no_write_on_failure();
    test_helpers_robust();
    test_thread_count();
    test_cpu_winograd();
    return check_exit_code("test_api");
}
