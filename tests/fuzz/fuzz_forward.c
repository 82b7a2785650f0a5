/*
 * libFuzzer target: convpool_forward_cpu against convpool_forward_reference on small problems.
 *
 * The input decodes into a small valid problem (batch 1-3, channels 1-6, kernel 1-4, pool 1-4,
 * extents up to 12, divisor from {2, -1.5, 0.5, 0, inf, NaN, 1e-39, 3}) and its inputs (x,
 * weight, conv_bias, bias), which may hold NaN, inf, 3e38, FLT_MAX, subnormals and -0. Every
 * input runs:
 *   - the reference, and the fused CPU path with threads 1 and 3 (default instruction set),
 *     threads 1 with CONVPOOL_CPU_ISA=scalar and threads 3 with CONVPOOL_CPU_ISA=avx2;
 *   - every CPU run must return OK, write every output and be bit-identical to the first;
 *   - the last sample run alone (batch 1) must give the same bits as within the batch;
 *   - when every input is finite with |value| < 1e30, and the error scale of check.h's model,
 *     S[b,c] = max|x[b]| * sum|w[c]| + |conv_bias[c]|, is below 1e30 (so neither path can
 *     overflow inside the convolution, where their semantics may legitimately differ), the CPU
 *     result must agree with the reference: within 1e-3 * S / |divisor| where both are finite,
 *     NaN exactly where the reference is NaN and the same infinity where it is infinite. A
 *     (b, c) whose classification depends on rounding (a conv value within 1e-3 * S of 0 when
 *     the divisor is 0, or of the float overflow threshold after the divisor) is exempt from
 *     the NaN/inf rule; the harness finds those with its own double convolution.
 * The fused CPU backward runs too (codes from x, then the gradients; see the block at the end):
 * bit-identical at 1 and 3 threads for any input, and the reference backward's gradients on grid
 * inputs; the training forward's codes must be convpool_codes_cpu's and its outputs the
 * forward's.
 * Any disagreement prints the problem and traps.
 *
 * Input format (tests/fuzz/make_corpus.py writes seeds in it). Header, one byte each:
 *   0 batch (1 + b % 3)   1 in_channels (1 + b % 6)   2 out_channels (1 + b % 6)
 *   3..11  per axis d, h, w: kernel (1 + b % 4), pool (1 + b % 4), extent byte e:
 *          in = kernel + pool - 1 + (e & 0x80 ? e % (13 - kernel - pool + 1) : e % 3)
 *   12 divisor index (b % 8 into the list above)
 *   13 flags: bit 0 no conv_bias, bit 1 no out, bit 2 (no out) no bias either, bit 3 bias
 *      shares conv_bias's memory, bits 4-5 value mode of x, bits 6-7 value mode of weights/biases
 *   14 scale: values are scaled by 2^(b % 41 - 20) (modes 0, 1, 3)
 * Then the values of x, weight, conv_bias, bias in that order, each by its mode:
 *   0 grid      1 byte: (int8) b / 8 (exact sums)
 *   1 uniform   2 bytes: uniform in [-1, 1)
 *   2 wide      4 bytes: random sign and mantissa, exponent 2^-40..2^40 (1 in 16 subnormal)
 *   3 special   1 control byte: >= 0xf0 gives NaN, +-inf, +-3e38, FLT_MAX, 1e30, subnormals, -0;
 *               otherwise a grid value from 1 more byte
 * When the input runs out, bytes come from a generator seeded with a hash of the whole input.
 */
#define _DEFAULT_SOURCE /* setenv, unsetenv */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convpool.h"
#include "fuzz_common.h"

typedef struct source {
    const uint8_t *p;
    size_t n, i;
    uint64_t s; /* splitmix64 state once the input is used up */
} source;

static uint8_t src_u8(source *r)
{
    if (r->i < r->n)
        return r->p[r->i++];
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint8_t)((z ^ (z >> 31)) >> 56);
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float grid(source *r, float scale) { return (float)(int8_t)src_u8(r) / 8.0f * scale; }

static float value(source *r, int mode, float scale)
{
    switch (mode) {
    case 0:
        return grid(r, scale);
    case 1: {
        const int v = src_u8(r) | src_u8(r) << 8;
        return (float)(v - 32768) / 32768.0f * scale;
    }
    case 2: {
        const uint32_t lo = src_u8(r) | (uint32_t)src_u8(r) << 8 | (uint32_t)src_u8(r) << 16;
        const uint8_t e = src_u8(r);
        const uint32_t exp = (e & 0x0f) == 0 ? 0 : 127 - 40 + (e >> 4) * 5 + (e & 3);
        return bits_float((lo & 0x007fffffu) | exp << 23 | (uint32_t)(e & 4) << 29);
    }
    default: {
        const uint8_t c = src_u8(r);
        if (c < 0xf0)
            return grid(r, scale);
        switch (c & 15) {
        case 0: case 1: return NAN;
        case 2: return INFINITY;
        case 3: return -INFINITY;
        case 4: return 3e38f;
        case 5: return -3e38f;
        case 6: return FLT_MAX;
        case 7: return 1e30f;
        case 8: return FLT_MIN / 4.0f;             /* subnormal */
        case 9: return -bits_float(1);             /* -smallest subnormal */
        case 10: return bits_float(0x007fffffu);   /* largest subnormal */
        case 11: return -0.0f;
        case 12: return 1e-39f;
        default: return grid(r, scale);
        }
    }
    }
}

#define FAIL(...)                                                                                \
    do {                                                                                         \
        fprintf(stderr, "fuzz_forward: " __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                                   \
        dump(&p, flags);                                                                         \
        __builtin_trap();                                                                        \
    } while (0)

static void dump(const convpool_problem *p, int flags)
{
    fuzz_print_problem(p);
    fprintf(stderr, " flags 0x%02x (x mode %d, weight mode %d)\n", flags, (flags >> 4) & 3, (flags >> 6) & 3);
}


/* The float32 overflow threshold: a value at or above it in magnitude rounds to inf. */
#define OVERFLOW_T 0x1.ffffffp127

/* Poison: a signalling-NaN pattern no arithmetic produces and no input here holds. */
#define POISON 0x7fbadbadu

static void poison(float *a, int64_t n)
{
    for (int64_t i = 0; i < n; ++i)
        a[i] = bits_float(POISON);
}

static int64_t count_poison(const float *a, int64_t n)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i)
        k += float_bits(a[i]) == POISON;
    return k;
}

/* got agrees with ref: same class (NaN, same infinity) unless ambiguous; finite pairs within
 * tol; a finite value within tol of the overflow threshold may meet the same-signed inf. */
static int agree(double ref, double got, double tol, int ambiguous)
{
    if (isnan(ref) || isnan(got))
        return (isnan(ref) && isnan(got)) || ambiguous;
    if (isinf(ref) || isinf(got)) {
        if (ref == got || ambiguous)
            return 1;
        const double fin = isinf(ref) ? got : ref, inf = isinf(ref) ? ref : got;
        return !isinf(fin) && signbit(fin) == signbit(inf) && fabs(fin) + tol >= FLT_MAX;
    }
    return fabs(ref - got) <= tol;
}

enum { N_RUNS = 4 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the whole input seeds the generator */
    for (size_t i = 0; i < size; ++i)
        h = (h ^ data[i]) * 0x100000001b3ull;
    source r = {data, size, 0, h};

    int64_t ext[3], ker[3], pol[3];
    const int64_t batch = 1 + src_u8(&r) % 3;
    const int64_t cin = 1 + src_u8(&r) % 6;
    const int64_t cout = 1 + src_u8(&r) % 6;
    for (int a = 0; a < 3; ++a) {
        ker[a] = 1 + src_u8(&r) % 4;
        pol[a] = 1 + src_u8(&r) % 4;
        const int64_t base = ker[a] + pol[a] - 1;
        const uint8_t e = src_u8(&r);
        ext[a] = base + ((e & 0x80) ? e % (13 - base) : e % 3);
    }
    static const double divisors[8] = {2.0, -1.5, 0.5, 0.0, INFINITY, NAN, 1e-39, 3.0};
    const double divisor = divisors[src_u8(&r) % 8];
    const int flags = src_u8(&r);
    const float scale = ldexpf(1.0f, src_u8(&r) % 41 - 20);
    const int xmode = (flags >> 4) & 3, wmode = (flags >> 6) & 3;

    convpool_problem p = convpool_problem_make(batch, cin, cout, ext[0], ext[1], ext[2], ker[0], ker[1],
                                               ker[2], pol[0], pol[1], pol[2], divisor);
    if (convpool_problem_validate(&p) != CONVPOOL_OK)
        return 0;
    if (fuzz_verbose())
        dump(&p, flags);

    const int64_t nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p);
    float *x = malloc((size_t)nx * sizeof *x);
    float *w = malloc((size_t)nw * sizeof *w);
    float *cb = malloc((size_t)cout * sizeof *cb);
    float *bias_own = malloc((size_t)cout * sizeof *bias_own);
    float *ref_pooled = malloc((size_t)(batch * cout) * sizeof(float));
    float *ref_out = malloc((size_t)batch * sizeof(float));
    float *pooled[N_RUNS], *out[N_RUNS];
    for (int k = 0; k < N_RUNS; ++k) {
        pooled[k] = malloc((size_t)(batch * cout) * sizeof(float));
        out[k] = malloc((size_t)batch * sizeof(float));
    }
    for (int64_t i = 0; i < nx; ++i)
        x[i] = value(&r, xmode, scale);
    for (int64_t i = 0; i < nw; ++i)
        w[i] = value(&r, wmode, scale);
    for (int64_t i = 0; i < cout; ++i)
        cb[i] = value(&r, wmode, scale);
    for (int64_t i = 0; i < cout; ++i)
        bias_own[i] = value(&r, wmode, scale);

    const float *conv_bias = (flags & 1) ? NULL : cb;
    const int want_out = !(flags & 2);
    const float *bias = (!want_out && (flags & 4)) ? NULL : (flags & 8) ? cb : bias_own;

    /* ---- every path ---- */
    poison(ref_pooled, batch * cout);
    poison(ref_out, batch);
    convpool_status s = convpool_forward_reference(&p, x, w, conv_bias, bias, ref_pooled, want_out ? ref_out : NULL);
    if (s != CONVPOOL_OK)
        FAIL("reference: %s %s", convpool_status_name(s), convpool_last_error());
    if (count_poison(ref_pooled, batch * cout) || (want_out && count_poison(ref_out, batch)))
        FAIL("reference left outputs unwritten");

    static const struct { int threads; const char *isa; } runs[N_RUNS] = {
        {1, NULL}, {3, NULL}, {1, "scalar"}, {3, "avx2"}};
    for (int k = 0; k < N_RUNS; ++k) {
        if (runs[k].isa)
            setenv("CONVPOOL_CPU_ISA", runs[k].isa, 1);
        else
            unsetenv("CONVPOOL_CPU_ISA");
        poison(pooled[k], batch * cout);
        poison(out[k], batch);
        s = convpool_forward_cpu(&p, x, w, conv_bias, bias, pooled[k], want_out ? out[k] : NULL, runs[k].threads);
        if (s != CONVPOOL_OK)
            FAIL("cpu threads %d isa %s: %s %s", runs[k].threads, runs[k].isa ? runs[k].isa : "default",
                 convpool_status_name(s), convpool_last_error());
        if (count_poison(pooled[k], batch * cout) || (want_out && count_poison(out[k], batch)))
            FAIL("cpu threads %d isa %s left outputs unwritten", runs[k].threads,
                 runs[k].isa ? runs[k].isa : "default");
        if (!want_out && count_poison(out[k], batch) != batch)
            FAIL("cpu wrote out although out was NULL");
        if (k > 0 && (memcmp(pooled[k], pooled[0], (size_t)(batch * cout) * sizeof(float)) != 0 ||
                      (want_out && memcmp(out[k], out[0], (size_t)batch * sizeof(float)) != 0))) {
            for (int64_t i = 0; i < batch * cout; ++i)
                if (float_bits(pooled[k][i]) != float_bits(pooled[0][i]))
                    fprintf(stderr, "  pooled[%lld]: %a (0x%08x) vs %a (0x%08x)\n", (long long)i,
                            (double)pooled[k][i], float_bits(pooled[k][i]), (double)pooled[0][i],
                            float_bits(pooled[0][i]));
            for (int64_t i = 0; want_out && i < batch; ++i)
                if (float_bits(out[k][i]) != float_bits(out[0][i]))
                    fprintf(stderr, "  out[%lld]: %a vs %a\n", (long long)i, (double)out[k][i], (double)out[0][i]);
            FAIL("cpu threads %d isa %s is not bit-identical to threads 1, default isa", runs[k].threads,
                 runs[k].isa ? runs[k].isa : "default");
        }
    }
    unsetenv("CONVPOOL_CPU_ISA");

    /* A sample's result does not depend on the rest of the batch: the last one alone. */
    if (batch > 1) {
        convpool_problem one = p;
        one.batch = 1;
        float one_pooled[6], one_out[1];
        poison(one_pooled, cout);
        poison(one_out, 1);
        s = convpool_forward_cpu(&one, x + (batch - 1) * (nx / batch), w, conv_bias, bias, one_pooled,
                                 want_out ? one_out : NULL, 2);
        if (s != CONVPOOL_OK)
            FAIL("cpu, last sample alone: %s %s", convpool_status_name(s), convpool_last_error());
        if (memcmp(one_pooled, pooled[0] + (batch - 1) * cout, (size_t)cout * sizeof(float)) != 0 ||
            (want_out && memcmp(one_out, out[0] + batch - 1, sizeof(float)) != 0))
            FAIL("cpu: the last sample alone is not bit-identical to the same sample in the batch");
    }

    /* ---- agreement with the reference, where both semantics are well defined ---- */
    int tame = 1;
    for (int64_t i = 0; i < nx && tame; ++i)
        tame = fabsf(x[i]) < 1e30f;
    for (int64_t i = 0; i < nw && tame; ++i)
        tame = fabsf(w[i]) < 1e30f;
    for (int64_t i = 0; i < cout && tame; ++i)
        tame = (!conv_bias || fabsf(conv_bias[i]) < 1e30f) && (!bias || fabsf(bias[i]) < 1e30f);

    const int64_t cd = p.conv_d, ch = p.conv_h, cw = p.conv_w;
    const int64_t plane = cd * ch * cw;
    double *sv = malloc((size_t)plane * sizeof *sv);
    const double divf = (double)(float)divisor;
    for (int64_t b = 0; b < batch && tame; ++b) {
        /* The error scale of check.h's model: max|x[b]| * sum|w[c]| + |conv_bias[c]|. Per
         * (b, c), not per conv value: Winograd mixes a whole input tile into each output, so
         * a value's error follows the tile's magnitudes, not just its own window's. */
        double xmax = 0.0;
        for (int64_t i = 0; i < nx / batch; ++i)
            xmax = fmax(xmax, fabs((double)x[b * (nx / batch) + i]));
        double out_tol = 0.0, out_mag = 0.0;
        int out_amb = 0;
        for (int64_t c = 0; c < cout && tame; ++c) {
            const double cbv = conv_bias ? (double)conv_bias[c] : 0.0;
            double wsum = 0.0;
            for (int64_t i = 0; i < nw / cout; ++i)
                wsum += fabs((double)w[c * (nw / cout) + i]);
            const double scale_bc = xmax * wsum + fabs(cbv);
            if (!(scale_bc < 1e30)) {
                tame = 0;
                break;
            }
            /* The harness's own conv (double), only to find values whose class is ambiguous. */
            for (int64_t i = 0; i < plane; ++i)
                sv[i] = cbv;
            for (int64_t ci = 0; ci < cin; ++ci)
                for (int64_t kd = 0; kd < ker[0]; ++kd)
                    for (int64_t kh = 0; kh < ker[1]; ++kh)
                        for (int64_t kw = 0; kw < ker[2]; ++kw) {
                            const double wv = w[(((c * cin + ci) * ker[0] + kd) * ker[1] + kh) * ker[2] + kw];
                            for (int64_t d = 0; d < cd; ++d)
                                for (int64_t hh = 0; hh < ch; ++hh) {
                                    const float *xr = x + (((b * cin + ci) * ext[0] + d + kd) * ext[1] + hh + kh) * ext[2] + kw;
                                    double *sr = sv + (d * ch + hh) * cw;
                                    for (int64_t ww = 0; ww < cw; ++ww)
                                        sr[ww] += wv * (double)xr[ww];
                                }
                        }
            /* Error bound of a conv value (both paths together, generous), the bound it puts
             * on a quotient, and whether rounding can change a quotient's class. */
            const double e = 1e-3 * scale_bc + 1e3 * 0x1p-149;
            const double max_err = isfinite(divf) && divf != 0.0 ? e / fabs(divf) : 0.0;
            int amb = 0;
            for (int64_t d = 0; d < p.pooled_d * p.pool_d; ++d)
                for (int64_t hh = 0; hh < p.pooled_h * p.pool_h; ++hh)
                    for (int64_t ww = 0; ww < p.pooled_w * p.pool_w; ++ww) {
                        const double sa = fabs(sv[(d * ch + hh) * cw + ww]);
                        if (divf == 0.0) {
                            amb |= sa <= e;
                        } else if (isfinite(divf)) {
                            const double lo = (sa - e) / fabs(divf) * (1 - 1e-6);
                            const double hi = (sa + e) / fabs(divf) * (1 + 1e-6);
                            amb |= lo <= OVERFLOW_T && hi >= OVERFLOW_T;
                        }
                    }
            const double ref = ref_pooled[b * cout + c], got = pooled[0][b * cout + c];
            const double tol = max_err + 1e-6 * (isfinite(ref) ? fabs(ref) : 0.0) + 4 * 0x1p-149;
            if (!agree(ref, got, tol, amb))
                FAIL("pooled[%lld][%lld]: cpu %.9g, reference %.9g (tolerance %.3g%s)", (long long)b,
                     (long long)c, got, ref, tol, amb ? ", class ambiguous" : "");
            out_tol += tol;
            out_mag += (isfinite(ref) ? fabs(ref) : 0.0) + (bias ? fabs((double)bias[c]) : 0.0);
            out_amb |= amb;
        }
        if (tame && want_out) {
            const double ref = ref_out[b], got = out[0][b];
            const double tol = out_tol + 1e-6 * out_mag + 0x1p-23 * (isfinite(ref) ? fabs(ref) : 0.0) +
                               4 * 0x1p-149;
            if (!agree(ref, got, tol, out_amb))
                FAIL("out[%lld]: cpu %.9g, reference %.9g (tolerance %.3g%s)", (long long)b, got, ref, tol,
                     out_amb ? ", class ambiguous" : "");
        }
    }

    free(sv);

    /* ---- the fused CPU backward: convpool_codes_cpu + convpool_backward_cpu ----
     * Any input: OK, every requested gradient written, codes and gradients bit-identical at 1
     * and 3 threads. Grid x and weights (mode 0: every conv sum is exact in float and in double,
     * so both pick the same arg-max, ties included) with a finite divisor of magnitude >= 1e-30:
     * within 1e-4 of each gradient's largest magnitude of the reference backward. */
    {
        size_t ncode = 0;
        if (convpool_codes_size(&p, &ncode) != CONVPOOL_OK)
            FAIL("codes size: %s", convpool_last_error());
        unsigned char *codes[2] = {malloc(ncode ? ncode : 1), malloc(ncode ? ncode : 1)};
        float *gp = malloc((size_t)(batch * cout) * sizeof(float));
        float *g[3][3];
        const int64_t gn[3] = {nx, nw, cout};
        for (int k = 0; k < 3; ++k)
            for (int i = 0; i < 3; ++i)
                g[k][i] = malloc((size_t)gn[i] * sizeof(float));
        for (int64_t i = 0; i < batch * cout; ++i)
            gp[i] = (float)((i * 7) % 5 - 2) * 0.5f;
        for (int k = 0; k < 2; ++k) {
            for (int i = 0; i < 3; ++i)
                poison(g[k][i], gn[i]);
            s = convpool_codes_cpu(&p, x, w, conv_bias, codes[k], k ? 3 : 1);
            if (s != CONVPOOL_OK)
                FAIL("codes_cpu: %s %s", convpool_status_name(s), convpool_last_error());
            s = convpool_backward_cpu(&p, x, w, codes[k], gp, NULL, g[k][0], g[k][1], conv_bias ? g[k][2] : NULL,
                                      k ? 3 : 1);
            if (s != CONVPOOL_OK)
                FAIL("backward_cpu: %s %s", convpool_status_name(s), convpool_last_error());
            for (int i = 0; i < (conv_bias ? 3 : 2); ++i)
                if (count_poison(g[k][i], gn[i]))
                    FAIL("backward_cpu left gradient %d unwritten", i);
        }
        if (memcmp(codes[0], codes[1], ncode) != 0)
            FAIL("codes differ between 1 and 3 threads");
        for (int i = 0; i < (conv_bias ? 3 : 2); ++i)
            if (memcmp(g[0][i], g[1][i], (size_t)gn[i] * sizeof(float)) != 0)
                FAIL("gradient %d differs between 1 and 3 threads", i);
        const int exact = xmode == 0 && wmode == 0 && isfinite(divf) && fabs(divf) >= 1e-30;
        if (exact) {
            s = convpool_backward_reference(&p, x, w, conv_bias, gp, NULL, g[2][0], g[2][1],
                                             conv_bias ? g[2][2] : NULL, NULL);
            if (s != CONVPOOL_OK)
                FAIL("reference backward: %s %s", convpool_status_name(s), convpool_last_error());
            /* The terms' scale, per gradient: |S| <= max|gp| / (N |d|) and each gradient element
             * sums at most B N (grad_weight), C N (grad_x) or B N (grad_conv_bias) terms, so the
             * sum of their magnitudes is at most T below. Float sums whose terms cancel (the
             * reference, in double, can be exactly 0) leave rounding of that size, not of the
             * result's: 2^-15 T covers the few hundred float roundings per element. */
            double gpmax = 0.0, xmax = 0.0, wmax = 0.0;
            for (int64_t k = 0; k < batch * cout; ++k)
                gpmax = fmax(gpmax, fabs((double)gp[k]));
            for (int64_t k = 0; k < nx; ++k)
                xmax = fmax(xmax, fabs((double)x[k]));
            for (int64_t k = 0; k < nw; ++k)
                wmax = fmax(wmax, fabs((double)w[k]));
            const double sfac = gpmax / fabs(divf);
            const double terms[3] = {(double)cout * sfac * wmax, (double)batch * sfac * xmax, (double)batch * sfac};
            for (int i = 0; i < (conv_bias ? 3 : 2); ++i) {
                double mag = 0.0;
                for (int64_t k = 0; k < gn[i]; ++k)
                    mag = fmax(mag, fabs((double)g[2][i][k]));
                for (int64_t k = 0; k < gn[i]; ++k) {
                    const double a = g[0][i][k], e = g[2][i][k];
                    if (!(fabs(a - e) <= 1e-4 * mag + 0x1p-15 * terms[i] + 4 * 0x1p-149))
                        FAIL("backward gradient %d [%lld]: fused %.9g, reference %.9g (scale %.3g)", i, (long long)k,
                             a, e, mag);
                }
            }
        }
        /* The training forward: its codes are convpool_codes_cpu's and its pooled and out the
         * forward's, bit for bit (a NaN may differ only in its payload). */
        {
            unsigned char *tc = malloc(ncode ? ncode : 1);
            float *tp = malloc((size_t)(batch * cout) * sizeof(float)), *to = malloc((size_t)batch * sizeof(float));
            memset(tc, 0xee, ncode ? ncode : 1);
            poison(tp, batch * cout);
            poison(to, batch);
            s = convpool_forward_train_cpu(&p, x, w, conv_bias, bias, tp, want_out ? to : NULL, tc, 3);
            if (s != CONVPOOL_OK)
                FAIL("forward_train_cpu: %s %s", convpool_status_name(s), convpool_last_error());
            if (memcmp(tc, codes[0], ncode) != 0)
                FAIL("the training forward's codes differ from convpool_codes_cpu's");
            for (int64_t i = 0; i < batch * cout; ++i)
                if (float_bits(tp[i]) != float_bits(pooled[0][i]) && !(isnan(tp[i]) && isnan(pooled[0][i])))
                    FAIL("training forward pooled[%lld] %a, the forward's %a", (long long)i, (double)tp[i],
                         (double)pooled[0][i]);
            for (int64_t i = 0; want_out && i < batch; ++i)
                if (float_bits(to[i]) != float_bits(out[0][i]) && !(isnan(to[i]) && isnan(out[0][i])))
                    FAIL("training forward out[%lld] %a, the forward's %a", (long long)i, (double)to[i],
                         (double)out[0][i]);
            free(tc);
            free(tp);
            free(to);
        }
        free(codes[0]);
        free(codes[1]);
        free(gp);
        for (int k = 0; k < 3; ++k)
            for (int i = 0; i < 3; ++i)
                free(g[k][i]);
    }

    free(x);
    free(w);
    free(cb);
    free(bias_own);
    free(ref_pooled);
    free(ref_out);
    for (int k = 0; k < N_RUNS; ++k) {
        free(pooled[k]);
        free(out[k]);
    }
    return 0;
}
