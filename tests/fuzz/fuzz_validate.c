/*
 * libFuzzer target: convpool_problem_validate against an independent check in 128-bit integers.
 *
 * The input decodes into the 12 caller-set size fields and the divisor of a convpool_problem
 * (built with convpool_problem_make). The harness works out the verdict on its own, in the
 * order convpool.h documents and src/problem.c implements (the first failing check decides):
 *   1. every size > 0                                   else CONVPOOL_ERR_INVALID_SIZE
 *   2. in_d/h/w >= kernel_d/h/w                         else CONVPOOL_ERR_INPUT_TOO_SMALL
 *   3. conv extent (in - kernel + 1) >= pool, d/h/w     else CONVPOOL_ERR_EMPTY_OUTPUT
 *   4. x, weight, conv-output element counts and the multiply-add count fit in int64,
 *      in that order                                    else CONVPOOL_ERR_OVERFLOW
 * and traps (__builtin_trap) on any disagreement: another status, wrong derived fields, a
 * changed caller field, a problem written on failure, or an error message that is empty,
 * stale or does not name the field. The divisor never matters (any double is valid).
 *
 * Input format (missing bytes read as 0; tests/fuzz/make_corpus.py writes seeds in it):
 *   byte 0      flags: bit 0 = structured (in = kernel + pool - 1 + extra, so most inputs
 *               reach the overflow checks), bits 1-3 = divisor choice (7 = 8 raw bytes at the
 *               end)
 *   then        structured: batch, in_channels, out_channels, then per axis d, h, w: kernel,
 *               pool, extra; otherwise the 12 fields in struct order. Each value is one
 *               selector byte plus payload, see pick(): small sizes, -2..2, negatives, powers
 *               of two near 2^31 and 2^62, INT64_MAX - small, raw 64-bit, 2^k +- 1, and roots
 *               of 2^63 whose products land right at the int64 limit.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convpool.h"
#include "fuzz_common.h"

typedef __int128 i128;

typedef struct reader {
    const uint8_t *p;
    size_t n, i;
} reader;

static uint8_t rd_u8(reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }

static uint64_t rd_u64(reader *r)
{
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k)
        v |= (uint64_t)rd_u8(r) << (8 * k);
    return v;
}

static int64_t rd_delta(reader *r, int span) { return (int64_t)(rd_u8(r) % (2 * span + 1)) - span; }

/* One size field, biased towards small valid values and the int64 edges. */
static int64_t pick(reader *r)
{
    static const int64_t roots[16] = {
        128, 129, 6208, 6209, 55108, 55109, 2097151, 2097152, 2097153, 3037000499, 3037000500,
        INT64_C(2147483647), INT64_C(2147483648), INT64_C(4294967295), INT64_C(4294967296),
        INT64_C(4398046511104)};
    const uint8_t sel = rd_u8(r);
    switch (sel % 16) {
    case 0: case 1: case 2: case 3: case 4:
        return 1 + rd_u8(r) % 16;
    case 5:
        return rd_delta(r, 2);
    case 6: /* [INT64_MIN, -1] */
        return -(int64_t)(rd_u64(r) >> 1) - 1;
    case 7: { /* around 2^31 */
        const int k = 28 + rd_u8(r) % 7;
        return ((int64_t)1 << k) + rd_delta(r, 2);
    }
    case 8: { /* around 2^62 */
        const int k = 58 + rd_u8(r) % 5;
        return ((int64_t)1 << k) + rd_delta(r, 2);
    }
    case 9:
        return INT64_MAX - rd_u8(r) % 4;
    case 10:
        return (int64_t)rd_u64(r);
    case 11: {
        const int k = rd_u8(r) % 63;
        return ((int64_t)1 << k) + rd_delta(r, 1);
    }
    case 12: { /* a root of 2^63 or so; with the selector's top bit, +- 1 */
        const int64_t v = roots[rd_u8(r) % 16];
        return (sel & 0x80) ? v + rd_delta(r, 1) : v;
    }
    default:
        return 1 + rd_u8(r) % 4;
    }
}

static int64_t clamp64(i128 v)
{
    if (v > (i128)INT64_MAX)
        return INT64_MAX;
    if (v < (i128)INT64_MIN)
        return INT64_MIN;
    return (int64_t)v;
}

/* Product of positive factors, exact; stops once past INT64_MAX (so 128 bits never wrap). */
static int fits_int64(const int64_t *f, int n, i128 *prod)
{
    i128 acc = 1;
    for (int i = 0; i < n; ++i) {
        acc *= (i128)f[i];
        if (acc > (i128)INT64_MAX)
            return 0;
    }
    *prod = acc;
    return 1;
}

#define FAIL(...)                                                                                \
    do {                                                                                         \
        fprintf(stderr, "fuzz_validate: " __VA_ARGS__);                                          \
        fprintf(stderr, "\n");                                                                   \
        dump(&in, s, msg);                                                                       \
        __builtin_trap();                                                                        \
    } while (0)

static void dump(const convpool_problem *p, convpool_status s, const char *msg)
{
    fuzz_print_problem(p);
    fprintf(stderr, "\n  library: %s \"%s\"\n", convpool_status_name(s), msg);
}


/* word occurs in msg with no identifier character on either side. */
static int mentions(const char *msg, const char *word)
{
    const size_t n = strlen(word);
    for (const char *q = strstr(msg, word); q; q = strstr(q + 1, word)) {
        const char before = q == msg ? ' ' : q[-1], after = q[n];
        const int id_before = (before >= 'a' && before <= 'z') || (before >= 'A' && before <= 'Z') ||
                              (before >= '0' && before <= '9') || before == '_';
        const int id_after = (after >= 'a' && after <= 'z') || (after >= 'A' && after <= 'Z') ||
                             (after >= '0' && after <= '9') || after == '_';
        if (!id_before && !id_after)
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const uint8_t flags = rd_u8(&r);
    int64_t f[12]; /* batch, cin, cout, in d h w, kernel d h w, pool d h w */
    if (flags & 1) {
        for (int i = 0; i < 3; ++i)
            f[i] = pick(&r);
        for (int a = 0; a < 3; ++a) {
            f[6 + a] = pick(&r);
            f[9 + a] = pick(&r);
            const int64_t extra = pick(&r);
            f[3 + a] = clamp64((i128)f[6 + a] + (i128)f[9 + a] - 1 + (i128)extra);
        }
    } else {
        for (int i = 0; i < 12; ++i)
            f[i] = pick(&r);
    }
    static const double divisors[7] = {2.0, 0.0, -1.5, INFINITY, NAN, 1e-39, -0.0};
    const int dsel = (flags >> 1) & 7;
    double divisor;
    if (dsel < 7) {
        divisor = divisors[dsel];
    } else {
        const uint64_t bits = rd_u64(&r);
        memcpy(&divisor, &bits, sizeof divisor);
    }

    const convpool_problem in = convpool_problem_make(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7],
                                                      f[8], f[9], f[10], f[11], divisor);
    convpool_status s = CONVPOOL_OK;
    const char *msg = "";

    /* A known message first, so a failure that leaves the old message in place is caught. */
    s = convpool_problem_validate(NULL);
    msg = convpool_last_error();
    if (s != CONVPOOL_ERR_NULL_POINTER || strcmp(msg, "problem is NULL") != 0)
        FAIL("validate(NULL) gave %s \"%s\"", convpool_status_name(s), msg);

    convpool_problem p = in;
    s = convpool_problem_validate(&p);
    msg = convpool_last_error();

    /* ---- the independent verdict ---- */
    static const char *const size_name[12] = {"batch",    "in_channels", "out_channels", "in_d",
                                              "in_h",     "in_w",        "kernel_d",     "kernel_h",
                                              "kernel_w", "pool_d",      "pool_h",       "pool_w"};
    static const char *const conv_name[3] = {"conv_d", "conv_h", "conv_w"};
    convpool_status want = CONVPOOL_OK;
    const char *field = NULL, *field2 = NULL; /* the message must name one of them */
    int64_t conv[3] = {0, 0, 0};
    i128 prod[4] = {0, 0, 0, 0};
    for (int i = 0; i < 12 && want == CONVPOOL_OK; ++i)
        if (f[i] <= 0) {
            want = CONVPOOL_ERR_INVALID_SIZE;
            field = size_name[i];
        }
    for (int a = 0; a < 3 && want == CONVPOOL_OK; ++a)
        if (f[3 + a] < f[6 + a]) {
            want = CONVPOOL_ERR_INPUT_TOO_SMALL;
            field = size_name[3 + a];
            field2 = size_name[6 + a];
        }
    for (int a = 0; a < 3 && want == CONVPOOL_OK; ++a) {
        const i128 c = (i128)f[3 + a] - (i128)f[6 + a] + 1;
        if (c < (i128)f[9 + a]) {
            want = CONVPOOL_ERR_EMPTY_OUTPUT;
            field = size_name[9 + a];
            field2 = conv_name[a];
        }
        conv[a] = (int64_t)c;
    }
    if (want == CONVPOOL_OK) {
        const int64_t x_f[5] = {f[0], f[1], f[3], f[4], f[5]};
        const int64_t w_f[5] = {f[2], f[1], f[6], f[7], f[8]};
        const int64_t y_f[5] = {f[0], f[2], conv[0], conv[1], conv[2]};
        const int64_t m_f[9] = {f[0], f[2], conv[0], conv[1], conv[2], f[1], f[6], f[7], f[8]};
        if (!fits_int64(x_f, 5, &prod[0]) || !fits_int64(w_f, 5, &prod[1]) ||
            !fits_int64(y_f, 5, &prod[2]) || !fits_int64(m_f, 9, &prod[3]))
            want = CONVPOOL_ERR_OVERFLOW;
    }

    if (fuzz_verbose()) {
        dump(&in, s, msg);
        fprintf(stderr, "  expected: %s\n", convpool_status_name(want));
    }
    if (s != want)
        FAIL("status %s, expected %s", convpool_status_name(s), convpool_status_name(want));

    /* The caller-set fields are never changed (the divisor bit for bit). */
    if (memcmp(&p, &in, offsetof(convpool_problem, conv_d)) != 0)
        FAIL("validate changed a caller-set field");

    if (want != CONVPOOL_OK) {
        if (memcmp(&p, &in, sizeof p) != 0)
            FAIL("validate wrote the problem on failure");
        if (msg[0] == '\0')
            FAIL("empty error message on failure");
        if (strcmp(msg, "problem is NULL") == 0)
            FAIL("stale error message on failure");
        if (field && !mentions(msg, field) && !(field2 && mentions(msg, field2)))
            FAIL("error message does not name %s%s%s", field, field2 ? " or " : "",
                 field2 ? field2 : "");
        return 0;
    }

    for (int a = 0; a < 3; ++a) {
        const int64_t got_conv = a == 0 ? p.conv_d : a == 1 ? p.conv_h : p.conv_w;
        const int64_t got_pool = a == 0 ? p.pooled_d : a == 1 ? p.pooled_h : p.pooled_w;
        if (got_conv != conv[a])
            FAIL("%s = %lld, expected %lld", conv_name[a], (long long)got_conv, (long long)conv[a]);
        if (got_pool != conv[a] / f[9 + a])
            FAIL("pooled extent %d = %lld, expected %lld", a, (long long)got_pool,
                 (long long)(conv[a] / f[9 + a]));
    }
    if ((i128)convpool_x_numel(&p) != prod[0])
        FAIL("convpool_x_numel = %lld, expected %lld", (long long)convpool_x_numel(&p), (long long)prod[0]);
    if ((i128)convpool_weight_numel(&p) != prod[1])
        FAIL("convpool_weight_numel = %lld, expected %lld", (long long)convpool_weight_numel(&p),
             (long long)prod[1]);
    const double flops = convpool_problem_flops(&p), want_flops = 2.0 * (double)prod[3];
    if (!(fabs(flops - want_flops) <= 1e-12 * want_flops))
        FAIL("convpool_problem_flops = %.17g, expected %.17g", flops, want_flops);
    return 0;
}
