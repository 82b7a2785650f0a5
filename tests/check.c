/* Test harness: comparisons, tolerance models, golden files, generator. See check.h. */
#include "check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t check_failures = 0;

/* Printed mismatching pairs per comparison: enough to see a pattern, short enough to read. */
enum { CHECK_SHOW = 6 };

void check_fail(const char *file, int line, const char *expr, const char *fmt, ...)
{
    va_list ap;
    ++check_failures;
    fprintf(stderr, "FAIL %s:%d: (%s) ", file, line, expr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int check_exit_code(const char *test_name)
{
    if (check_failures) {
        printf("%s: %lld FAILURE(S)\n", test_name, (long long)check_failures);
        return 1;
    }
    printf("%s: all checks passed\n", test_name);
    return 0;
}

static int ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

int check_mentions(const char *msg, const char *word)
{
    const size_t n = strlen(word);
    if (!msg || n == 0)
        return 0;
    for (const char *s = strstr(msg, word); s; s = strstr(s + 1, word)) {
        const int left_ok = s == msg || !ident_char(s[-1]);
        const int right_ok = !ident_char(s[n]);
        if (left_ok && right_ok)
            return 1;
    }
    return 0;
}

int check_mentions_any(const char *msg, const char *words)
{
    char word[128];
    const char *s = words;
    while (*s) {
        size_t n = strcspn(s, "|");
        if (n >= sizeof word)
            n = sizeof word - 1;
        memcpy(word, s, n);
        word[n] = '\0';
        if (check_mentions(msg, word))
            return 1;
        s += n;
        if (*s == '|')
            ++s;
    }
    return 0;
}

void check_status_at(const char *file, int line, const char *what, convpool_status got,
                     convpool_status want, const char *field)
{
    if (got != want) {
        check_fail(file, line, "status", "%s: got %s, want %s (message: \"%s\")", what,
                   convpool_status_name(got), convpool_status_name(want), convpool_last_error());
        return;
    }
    if (want != CONVPOOL_OK && field && !check_mentions_any(convpool_last_error(), field))
        check_fail(file, line, "message names the field", "%s: message \"%s\" does not name \"%s\"",
                   what, convpool_last_error(), field);
}

check_rng check_rng_seed(uint64_t seed)
{
    check_rng r;
    r.s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    return r;
}

uint64_t check_rng_u64(check_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double check_rng_uniform(check_rng *r) { return (double)(check_rng_u64(r) >> 11) * 0x1.0p-53; }

float check_rng_normal(check_rng *r)
{
    const double u1 = 1.0 - check_rng_uniform(r); /* (0, 1]: log is finite */
    const double u2 = check_rng_uniform(r);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int64_t check_rng_int(check_rng *r, int64_t lo, int64_t hi)
{
    const uint64_t span = (uint64_t)(hi - lo) + 1u;
    return lo + (int64_t)(check_rng_u64(r) % span);
}

void check_fill_uniform(check_rng *r, float *a, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; ++i)
        a[i] = lo + (hi - lo) * (float)(check_rng_u64(r) >> 40) * 0x1.0p-24f;
}

void check_fill_normal(check_rng *r, float *a, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; ++i)
        a[i] = scale * check_rng_normal(r);
}

static float poison_value(void)
{
    const uint32_t bits = CHECK_POISON_BITS;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static int is_poison(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits == CHECK_POISON_BITS;
}

void check_poison(float *a, int64_t n)
{
    const float v = poison_value();
    for (int64_t i = 0; i < n; ++i)
        a[i] = v;
}

int64_t check_count_poison(const float *a, int64_t n)
{
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i)
        c += is_poison(a[i]);
    return c;
}

int check_all_poison(const float *a, int64_t n) { return check_count_poison(a, n) == n; }

int64_t check_same_bits(const char *what, const float *a, const float *b, int64_t n)
{
    int64_t diff = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (memcmp(&a[i], &b[i], sizeof(float)) == 0)
            continue;
        if (diff < CHECK_SHOW)
            fprintf(stderr, "  %s: [%lld] %.9g vs %.9g differ in bits\n", what, (long long)i,
                    (double)a[i], (double)b[i]);
        ++diff;
    }
    if (diff)
        fprintf(stderr, "  %s: %lld of %lld elements not bit-identical\n", what, (long long)diff,
                (long long)n);
    return diff;
}

int64_t check_close(const char *what, const float *got, const double *exp, int64_t n,
                    const double *atol, double atol_all, double rtol, check_result *res)
{
    check_result r;
    memset(&r, 0, sizeof r);
    r.n = n;
    for (int64_t i = 0; i < n; ++i) {
        const double g = (double)got[i], e = exp[i];
        const double tol = (atol ? atol[i] : atol_all) + (isfinite(e) ? rtol * fabs(e) : 0.0) + CHECK_TOL_FLOOR;
        const char *why = NULL;
        if (isnan(e) || isnan(g)) {
            if (!(isnan(e) && isnan(g))) {
                why = isnan(e) ? "NaN expected" : "unexpected NaN";
                ++r.nan_mismatches;
            }
        } else if (isinf(e) || isinf(g)) {
            if (g != e) {
                why = isinf(e) ? (isinf(g) ? "Inf sign differs" : "Inf expected") : "unexpected Inf";
                ++r.inf_mismatches;
            }
        } else {
            const double err = fabs(g - e);
            if (err > r.max_abs)
                r.max_abs = err;
            if (tol > 0 && err / tol > r.max_ratio)
                r.max_ratio = err / tol;
            if (!(err <= tol))
                why = "outside tolerance";
        }
        if (!why)
            continue;
        if (r.mismatches < CHECK_SHOW) {
            const double err = fabs(g - e);
            if (isfinite(e) && isfinite(g))
                fprintf(stderr, "  %s: [%lld] got % .9g expected % .17g abs %.3g rel %.3g tol %.3g: %s\n",
                        what, (long long)i, g, e, err, e != 0 ? err / fabs(e) : err, tol, why);
            else
                fprintf(stderr, "  %s: [%lld] got % .9g expected % .17g: %s\n", what, (long long)i, g, e,
                        why);
        }
        ++r.mismatches;
    }
    if (r.mismatches)
        fprintf(stderr, "  %s: %lld of %lld mismatch (%lld NaN disagreements, %lld Inf disagreements), "
                "max finite abs error %.3g\n",
                what, (long long)r.mismatches, (long long)n, (long long)r.nan_mismatches,
                (long long)r.inf_mismatches, r.max_abs);
    if (res)
        *res = r;
    return r.mismatches;
}

static int64_t taps(const convpool_problem *p)
{
    return p->in_channels * p->kernel_d * p->kernel_h * p->kernel_w;
}

static int64_t pooled_count(const convpool_problem *p)
{
    return p->pooled_d * p->pooled_h * p->pooled_w;
}

/* Unit roundoffs: round to nearest float32 / float64. */
static const double U32 = 0x1.0p-24, U64 = 0x1.0p-53;

/*
 * Effective number of roundings in a float sum of n terms. The worst case is n (every
 * rounding the same sign), which no real sum approaches: the roundings of a sum behave like
 * a random walk, about sqrt(n/3) * u * (largest partial sum) at one standard deviation, so
 * 4*sqrt(n) is ~7 sigma. Using n for large sums would hide errors of a missing tap or a
 * wrong pooling window. Never more than the worst case n.
 */
static double eff_roundings(int64_t n)
{
    const double walk = 4.0 * sqrt((double)n);
    return walk < (double)n ? walk : (double)n;
}

check_tol check_tol_fp32(const convpool_problem *p)
{
    check_tol t;
    /* The conv: a float sum of K = Cin*kd*kh*kw products (fma or mul+add); +3 for the conv
     * bias add, the divisor rounded to float and the divide (or multiply by 1/d). */
    t.conv_rel = (eff_roundings(taps(p)) + 3.0) * U32;
    /* The mean: a float sum of N pooled values, each at most S/|d|, then one divide. */
    t.mean_rel = (eff_roundings(pooled_count(p)) + 1.0) * U32;
    /* Final rounding of P and out to float, half an ulp each, times 2 for margin. */
    t.rtol = 2.0 * U32;
    /* out: a float sum over C channels of (P + bias), terms at most |P| + |bias|. */
    t.out_rel = (eff_roundings(p->out_channels) + 2.0) * U32;
    t.conv_l2_rel = 0.0;
    t.p_rel = 0.0;
    return t;
}

check_tol check_tol_fp64(const convpool_problem *p)
{
    check_tol t;
    /* Double sums (worst case, u = 2^-53, negligible), plus, where the divisor is not a
     * float, its rounding to float as PyTorch's float32 path does (the reference copies
     * that): 2^-24 of every pooled value, whose magnitude is at most S/|d|. */
    const double d = p->divisor;
    const int d_exact = !isfinite(d) || fabs(d) > 3.4e38 || (double)(float)d == d;
    t.conv_rel = (double)(taps(p) + 4) * U64 + (d_exact ? 0.0 : U32);
    t.mean_rel = (double)(pooled_count(p) + 1) * U64;
    /* The single rounding of P (or out) to float: <= 2^-24 |P|, doubled for margin. */
    t.rtol = 2.0 * U32;
    /* out may be summed from the float-rounded P (each off by <= 2^-24 |P|): one more u. */
    t.out_rel = 2.0 * U32 + (double)(p->out_channels + 2) * U64;
    t.conv_l2_rel = 0.0;
    t.p_rel = 0.0;
    return t;
}

check_tol check_tol_add(check_tol a, check_tol b)
{
    check_tol t;
    t.conv_rel = a.conv_rel + b.conv_rel;
    t.conv_l2_rel = a.conv_l2_rel + b.conv_l2_rel;
    t.mean_rel = a.mean_rel + b.mean_rel;
    t.p_rel = a.p_rel + b.p_rel;
    t.rtol = a.rtol + b.rtol;
    t.out_rel = a.out_rel + b.out_rel;
    return t;
}

static double finite_or_zero(double v) { return isfinite(v) ? v : 0.0; }

void check_tolerances(const convpool_problem *p, const float *x, const float *weight,
                      const float *conv_bias, const float *bias, const double *p_exp,
                      check_tol t, double *atol_p, double *atol_out)
{
    const int64_t C = p->out_channels;
    const int64_t x_item = p->in_channels * p->in_d * p->in_h * p->in_w;
    const int64_t w_item = taps(p);
    const double d = p->divisor;
    /* d = 0, +-inf or NaN: every pooled value is +-inf, NaN or exactly +-0, compared by
     * class or exactly, so no conv/mean error term. */
    const double inv_d = (isfinite(d) && d != 0.0) ? 1.0 / fabs(d) : 0.0;
    for (int64_t b = 0; b < p->batch; ++b) {
        double xmax = 0.0;
        for (int64_t i = 0; i < x_item; ++i) {
            const double v = fabs((double)x[b * x_item + i]);
            if (isfinite(v) && v > xmax)
                xmax = v;
        }
        double out_tol = 0.0, out_mag = 0.0;
        for (int64_t c = 0; c < C; ++c) {
            double wsum = 0.0, wsq = 0.0;
            for (int64_t i = 0; i < w_item; ++i) {
                const double a = finite_or_zero(fabs((double)weight[c * w_item + i]));
                wsum += a;
                wsq += a * a;
            }
            const double cb = conv_bias ? finite_or_zero(fabs((double)conv_bias[c])) : 0.0;
            const double s = xmax * wsum + cb;
            const double tol = ((t.conv_rel + t.mean_rel) * s + t.conv_l2_rel * xmax * sqrt(wsq)) * inv_d +
                               t.p_rel * (finite_or_zero(fabs(p_exp[b * C + c])) + cb * inv_d);
            if (atol_p)
                atol_p[b * C + c] = tol;
            out_tol += tol;
            out_mag += finite_or_zero(fabs(p_exp[b * C + c])) +
                       (bias ? finite_or_zero(fabs((double)bias[c])) : 0.0);
        }
        if (atol_out)
            atol_out[b] = out_tol + t.out_rel * out_mag;
    }
}

int64_t check_forward(const char *label, const convpool_problem *p, const float *x,
                      const float *weight, const float *conv_bias, const float *bias,
                      const float *got_p, const float *got_out, const double *exp_p,
                      const double *exp_out, check_tol t, double *ratio)
{
    const int64_t np = p->batch * p->out_channels;
    double *atol_p = (double *)check_alloc(sizeof(double) * (size_t)np);
    double *atol_out = (double *)check_alloc(sizeof(double) * (size_t)p->batch);
    int64_t bad = 0;
    check_result rp, ro;
    char what[256];
    memset(&ro, 0, sizeof ro);
    if (!atol_p || !atol_out) {
        free(atol_p);
        free(atol_out);
        return 1;
    }
    check_tolerances(p, x, weight, conv_bias, bias, exp_p, t, atol_p, atol_out);
    snprintf(what, sizeof what, "%s P", label);
    bad += check_close(what, got_p, exp_p, np, atol_p, 0.0, t.rtol, &rp);
    if (got_out) {
        snprintf(what, sizeof what, "%s out", label);
        bad += check_close(what, got_out, exp_out, p->batch, atol_out, 0.0, t.rtol, &ro);
    }
    if (ratio)
        *ratio = rp.max_ratio > ro.max_ratio ? rp.max_ratio : ro.max_ratio;
    free(atol_p);
    free(atol_out);
    return bad;
}

int64_t check_forward_f(const char *label, const convpool_problem *p, const float *x,
                        const float *weight, const float *conv_bias, const float *bias,
                        const float *got_p, const float *got_out, const float *exp_p,
                        const float *exp_out, check_tol t, double *ratio)
{
    const int64_t np = p->batch * p->out_channels;
    double *ep = (double *)check_alloc(sizeof(double) * (size_t)np);
    double *eo = (double *)check_alloc(sizeof(double) * (size_t)p->batch);
    int64_t bad = 1;
    if (ep && eo) {
        for (int64_t i = 0; i < np; ++i)
            ep[i] = (double)exp_p[i];
        for (int64_t i = 0; i < p->batch; ++i)
            eo[i] = exp_out ? (double)exp_out[i] : 0.0;
        bad = check_forward(label, p, x, weight, conv_bias, bias, got_p, exp_out ? got_out : NULL,
                            ep, eo, t, ratio);
    }
    free(ep);
    free(eo);
    return bad;
}

void *check_alloc(size_t bytes)
{
    void *ptr = malloc(bytes ? bytes : 1);
    if (!ptr) {
        ++check_failures;
        fprintf(stderr, "FAIL: out of host memory allocating %zu bytes\n", bytes);
    }
    return ptr;
}

static int host_is_little_endian(void)
{
    const uint32_t one = 1;
    unsigned char c;
    memcpy(&c, &one, 1);
    return c == 1;
}

/* Copies count elements of size elem from blob at *off into a new buffer. */
static void *take(const unsigned char *blob, size_t *off, int64_t count, size_t elem)
{
    const size_t bytes = (size_t)count * elem;
    void *dst = check_alloc(bytes);
    if (dst)
        memcpy(dst, blob + *off, bytes);
    *off += bytes;
    return dst;
}

int check_golden_load(const char *path, check_golden *g)
{
    static const char magic[8] = {'C', 'P', 'G', 'O', 'L', 'D', 'E', 'N'};
    enum { HEADER = 8 + 8 + 12 * 8 + 8 };
    memset(g, 0, sizeof *g);
    const char *base = strrchr(path, '/');
    snprintf(g->name, sizeof g->name, "%s", base ? base + 1 : path);
    if (!host_is_little_endian()) {
        fprintf(stderr, "%s: golden files are little-endian; this host is not\n", path);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < HEADER) {
        fprintf(stderr, "%s: %ld bytes, shorter than the header\n", path, size);
        fclose(f);
        return -1;
    }
    unsigned char *blob = (unsigned char *)check_alloc((size_t)size);
    if (!blob || fread(blob, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "%s: read failed\n", path);
        free(blob);
        fclose(f);
        return -1;
    }
    fclose(f);
    int64_t version, s[12];
    double divisor;
    memcpy(&version, blob + 8, 8);
    memcpy(s, blob + 16, sizeof s);
    memcpy(&divisor, blob + 112, 8);
    if (memcmp(blob, magic, 8) != 0 || version != 1) {
        fprintf(stderr, "%s: bad magic or version %lld\n", path, (long long)version);
        free(blob);
        return -1;
    }
    g->p = convpool_problem_make(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10],
                                 s[11], divisor);
    if (convpool_problem_validate(&g->p) != CONVPOOL_OK) {
        fprintf(stderr, "%s: invalid problem: %s\n", path, convpool_last_error());
        free(blob);
        return -1;
    }
    const int64_t nx = convpool_x_numel(&g->p), nw = convpool_weight_numel(&g->p);
    const int64_t B = g->p.batch, C = g->p.out_channels;
    const int64_t want = HEADER + 4 * (nx + nw + 2 * C + B + B * C) + 8 * (B + B * C);
    if (want != (int64_t)size) {
        fprintf(stderr, "%s: %ld bytes, the header implies %lld\n", path, size, (long long)want);
        free(blob);
        return -1;
    }
    size_t off = HEADER;
    g->x = (float *)take(blob, &off, nx, 4);
    g->weight = (float *)take(blob, &off, nw, 4);
    g->conv_bias = (float *)take(blob, &off, C, 4);
    g->bias = (float *)take(blob, &off, C, 4);
    g->out32 = (float *)take(blob, &off, B, 4);
    g->p32 = (float *)take(blob, &off, B * C, 4);
    g->out64 = (double *)take(blob, &off, B, 8);
    g->p64 = (double *)take(blob, &off, B * C, 8);
    free(blob);
    if (!g->x || !g->weight || !g->conv_bias || !g->bias || !g->out32 || !g->p32 || !g->out64 ||
        !g->p64) {
        check_golden_free(g);
        return -1;
    }
    return 0;
}

void check_golden_free(check_golden *g)
{
    free(g->x);
    free(g->weight);
    free(g->conv_bias);
    free(g->bias);
    free(g->out32);
    free(g->p32);
    free(g->out64);
    free(g->p64);
    memset(g, 0, sizeof *g);
}

int check_golden_manifest(const char *dir, char names[][128], int max)
{
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        char name[128];
        if (line[0] == '#' || sscanf(line, "%127s", name) != 1)
            continue;
        memcpy(names[n], name, sizeof name);
        ++n;
    }
    fclose(f);
    return n;
}

double check_macs(const convpool_problem *p)
{
    const double conv = (double)(p->in_d - p->kernel_d + 1) * (double)(p->in_h - p->kernel_h + 1) *
                        (double)(p->in_w - p->kernel_w + 1);
    return (double)p->batch * (double)p->out_channels * conv * (double)p->in_channels *
           (double)(p->kernel_d * p->kernel_h * p->kernel_w);
}

double check_pick_divisor(check_rng *r)
{
    static const double finite[] = {2.0, -2.0, 0.5, -0.3, 1.0, 3.7, -1.5, 1e-3, 0.3, -7.0};
    const int64_t u = check_rng_int(r, 0, 99);
    if (u < 5)
        return 0.0;
    if (u < 8)
        return -0.0;
    if (u < 12)
        return INFINITY;
    if (u < 15)
        return -INFINITY;
    if (u < 19)
        return NAN;
    return finite[check_rng_int(r, 0, (int64_t)(sizeof finite / sizeof finite[0]) - 1)];
}

/* ---- the sweeps' generator and filler ---- */

convpool_problem check_shrink_to_macs(convpool_problem p, double cap)
{
    while (check_macs(&p) > cap) {
        if (p.in_channels > 1 && p.in_channels >= p.out_channels)
            p.in_channels = (p.in_channels + 1) / 2;
        else if (p.out_channels > 1)
            p.out_channels = (p.out_channels + 1) / 2;
        else if (p.batch > 1)
            --p.batch;
        else {
            int64_t *in[3] = {&p.in_d, &p.in_h, &p.in_w};
            const int64_t pl[3] = {p.pool_d, p.pool_h, p.pool_w};
            int big = 0;
            for (int a = 1; a < 3; ++a)
                if (*in[a] - pl[a] > *in[big] - pl[big])
                    big = a;
            if (*in[big] - pl[big] < 1)
                break; /* nothing left to take */
            *in[big] -= pl[big]; /* one pooled position fewer; the remainder stays */
        }
    }
    return p;
}

convpool_problem check_random_problem(check_rng *r, const check_problem_spec *s, const int64_t *kernel)
{
    int64_t k[3], pool[3], conv[3];
    for (int a = 0; a < 3; ++a) {
        k[a] = kernel ? kernel[a] : check_rng_int(r, 1, 5);
        pool[a] = check_rng_int(r, 1, 4);
        conv[a] = pool[a] * check_rng_int(r, 1, s->max_reps) + check_rng_int(r, 0, pool[a] - 1);
    }
    if (!kernel && s->headline_one_in > 0 && check_rng_int(r, 1, s->headline_one_in) == 1)
        for (int a = 0; a < 3; ++a) {
            k[a] = 3;
            pool[a] = 2;
            conv[a] = 2 * check_rng_int(r, 1, 8) + check_rng_int(r, 0, 1);
        }
    const int64_t cin = check_rng_int(r, 0, 3) == 0 ? 1 : check_rng_int(r, 1, s->max_cin);
    const int64_t cout = check_rng_int(r, 0, 3) == 0 ? 1 : check_rng_int(r, 1, s->max_cout);
    const int64_t batch = check_rng_int(r, 1, s->max_batch);
    const convpool_problem p =
        convpool_problem_make(batch, cin, cout, conv[0] + k[0] - 1, conv[1] + k[1] - 1, conv[2] + k[2] - 1, k[0],
                              k[1], k[2], pool[0], pool[1], pool[2], check_pick_divisor(r));
    return check_shrink_to_macs(p, s->mac_cap);
}

check_inputs_spec check_random_inputs(check_rng *r, const convpool_problem *p, int special)
{
    check_inputs_spec c;
    memset(&c, 0, sizeof c);
    c.conv_bias = 1;
    if (!special)
        return c;
    c.x_kind = (int)check_rng_int(r, 0, 2);
    c.n_nan = check_rng_int(r, 0, 6) == 0 ? (int)check_rng_int(r, 1, 3) : 0;
    c.n_inf = check_rng_int(r, 0, 6) == 0 ? (int)check_rng_int(r, 1, 3) : 0;
    const int64_t cb = check_rng_int(r, 0, 19);
    c.conv_bias = cb < 2 ? 0 : cb == 2 ? 2 : cb == 3 ? 3 : 1;
    if (p->divisor == 0.0 && c.conv_bias == 0)
        c.conv_bias = 1; /* divisor 0 needs the sign-fixing conv bias */
    c.zero_channel = p->out_channels > 1 && check_rng_int(r, 0, 4) == 0;
    return c;
}

void check_fill_inputs(check_rng *r, const convpool_problem *p, const check_inputs_spec *c, float *x, float *w,
                       float *cb, float *bias)
{
    const int64_t nx = convpool_x_numel(p), nw = convpool_weight_numel(p), C = p->out_channels;
    if (c->x_kind == 0)
        check_fill_uniform(r, x, nx, 0.0f, 1.0f);
    else
        check_fill_normal(r, x, nx, c->x_kind == 2 ? 100.0f : 1.0f);
    /* PyTorch's default Conv3d init: uniform in +-1/sqrt(fan_in). */
    const float bound = (float)(1.0 / sqrt((double)(nw / C)));
    check_fill_uniform(r, w, nw, -bound, bound);
    check_fill_uniform(r, cb, C, -bound, bound);
    check_fill_normal(r, bias, C, 1.0f);
    for (int i = 0; i < c->n_nan; ++i)
        x[check_rng_int(r, 0, nx - 1)] = NAN;
    for (int i = 0; i < c->n_inf; ++i)
        x[check_rng_int(r, 0, nx - 1)] = check_rng_int(r, 0, 1) ? INFINITY : -INFINITY;
    if (c->zero_channel) {
        memset(w, 0, sizeof(float) * (size_t)(nw / C));
        cb[0] = 0.0f;
    }
    if (p->divisor == 0.0) {
        /* x/0 turns the sign of every conv value into +-inf, so a value within rounding of zero
         * (FP32 or TF32) would make the expected result depend on rounding. */
        double xmax = 0.0;
        for (int64_t i = 0; i < nx; ++i)
            if (isfinite(x[i]) && fabs((double)x[i]) > xmax)
                xmax = fabs((double)x[i]);
        for (int64_t co = (c->zero_channel ? 1 : 0); co < C; ++co) {
            double sum = 0.0;
            for (int64_t i = 0; i < nw / C; ++i)
                sum += fabs((double)w[co * (nw / C) + i]);
            cb[co] = (float)((check_rng_int(r, 0, 1) ? 1.0 : -1.0) * (1.5 * xmax * sum + 0.1));
        }
    }
    if (c->conv_bias == 2)
        cb[check_rng_int(r, 0, C - 1)] = check_rng_int(r, 0, 1) ? INFINITY : -INFINITY;
    if (c->conv_bias == 3)
        cb[check_rng_int(r, 0, C - 1)] = NAN;
}
