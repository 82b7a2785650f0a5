/*
 * The fused CPU path against the reference over a seeded sweep of small problems: every
 * kernel size 1..5 and pool 1..4 per axis, pool remainders, 1..17 channels, batch 1..3,
 * divisors of both signs, 0, -0, +-inf, NaN, inputs with NaN/Inf, conv_bias NULL or
 * non-finite, out/bias NULL. For each: outputs fully written (poisoned first, guard
 * elements after the end untouched), within the float32 error model of the reference
 * (check_tol_fp32 + check_tol_fp64), and bit-identical across threads 1,2,3,4,7 and reruns.
 * Both paths also run once with x and weight ending flush against an inaccessible page, so
 * reading past the end of either faults; and the fused path runs with each instruction-set
 * variant (CONVPOOL_CPU_ISA, read on every call), which src/cpu.c promises give the same bits.
 */
#define _DEFAULT_SOURCE /* setenv, mmap's MAP_ANONYMOUS under -std=c11 */
#include "check.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__)
#include <sys/mman.h>
#include <unistd.h>
#define HAVE_FENCE 1
#else
#define HAVE_FENCE 0
#endif

enum {
    N_RANDOM = 400, /* random configurations; the first 125 walk all kernel shapes */
    GUARD = 16,     /* poisoned elements after each output that must stay untouched */
};

/* Multiply-adds per configuration, so the whole sweep stays within seconds. */
#define MAC_CAP 4.0e6

typedef struct sweep_cfg {
    convpool_problem p;
    check_inputs_spec in; /* x kind, NaN/Inf voxels, conv bias kind, zero channel (check.h) */
    int outputs;          /* 0 pooled+out, 1 pooled only with bias, 2 pooled only with bias NULL */
} sweep_cfg;

typedef struct coverage {
    int kernel[3][6], pool[3][5], remainder[3];
    int div_zero, div_negzero, div_inf, div_neginf, div_nan, div_neg;
    int nan_in, inf_in, cin1, cout1, c17, cb_null, cb_nonfinite, out_null, bias_null;
} coverage;

static sweep_cfg random_cfg(check_rng *r, int i)
{
    /* check.h's generator and filler, which test_cuda's sweep shares. */
    static const check_problem_spec spec = {3, 17, 17, 3, 0, MAC_CAP};
    sweep_cfg c;
    memset(&c, 0, sizeof c);
    const int64_t walk[3] = {1 + i % 5, 1 + (i / 5) % 5, 1 + (i / 25) % 5};
    c.p = check_random_problem(r, &spec, i < 125 ? walk : NULL);
    c.in = check_random_inputs(r, &c.p, 1);
    const int64_t o = check_rng_int(r, 0, 9);
    c.outputs = o == 0 ? 1 : o == 1 ? 2 : 0;
    return c;
}

/* Fixed larger configurations: the headline channels, where the threads split real work. */
static sweep_cfg fixed_cfg(int i)
{
    sweep_cfg c;
    memset(&c, 0, sizeof c);
    switch (i) {
    case 0: c.p = convpool_problem_make(3, 8, 16, 10, 18, 18, 3, 3, 3, 2, 2, 2, 2.0); break;
    case 1: c.p = convpool_problem_make(1, 8, 16, 16, 32, 32, 3, 3, 3, 2, 2, 2, 2.0); break;
    case 2: c.p = convpool_problem_make(2, 8, 16, 9, 17, 19, 3, 3, 3, 2, 2, 2, -2.0); c.in.x_kind = 1; break;
    default: c.p = convpool_problem_make(2, 8, 16, 9, 17, 19, 3, 3, 3, 2, 2, 2, 0.0); c.in.x_kind = 1; break;
    }
    c.in.conv_bias = 1;
    return c;
}

static void note_coverage(coverage *cv, const sweep_cfg *c, const convpool_problem *p, const float *cb_used,
                          const float *bias_used, const float *out_used)
{
    const int64_t k[3] = {p->kernel_d, p->kernel_h, p->kernel_w};
    const int64_t pl[3] = {p->pool_d, p->pool_h, p->pool_w};
    const int64_t conv[3] = {p->conv_d, p->conv_h, p->conv_w};
    for (int a = 0; a < 3; ++a) {
        cv->kernel[a][k[a]] = 1;
        cv->pool[a][pl[a]] = 1;
        cv->remainder[a] |= conv[a] % pl[a] != 0;
    }
    const double d = p->divisor;
    cv->div_zero |= d == 0.0 && !signbit(d);
    cv->div_negzero |= d == 0.0 && signbit(d);
    cv->div_inf |= isinf(d) && d > 0;
    cv->div_neginf |= isinf(d) && d < 0;
    cv->div_nan |= isnan(d);
    cv->div_neg |= isfinite(d) && d < 0;
    cv->nan_in |= c->in.n_nan > 0;
    cv->inf_in |= c->in.n_inf > 0;
    cv->cin1 |= p->in_channels == 1;
    cv->cout1 |= p->out_channels == 1;
    cv->c17 |= p->in_channels == 17 || p->out_channels == 17;
    cv->cb_null |= cb_used == NULL;
    cv->cb_nonfinite |= c->in.conv_bias >= 2;
    cv->out_null |= out_used == NULL;
    cv->bias_null |= bias_used == NULL;
}

/* n floats ending exactly at a PROT_NONE page (malloc where there is no mmap). */
typedef struct fenced {
    void *base;
    size_t len;
    float *p;
} fenced;

static float *fenced_copy(fenced *f, const float *src, int64_t n)
{
    const size_t bytes = sizeof(float) * (size_t)n;
    memset(f, 0, sizeof *f);
#if HAVE_FENCE
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data = (bytes + page - 1) / page * page;
    f->len = data + page;
    f->base = mmap(NULL, f->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (f->base == MAP_FAILED || mprotect((char *)f->base + data, page, PROT_NONE) != 0) {
        CHECK(0, "mmap/mprotect of %zu bytes failed", f->len);
        f->base = NULL;
        return NULL;
    }
    f->p = (float *)((char *)f->base + data - bytes);
#else
    f->base = check_alloc(bytes);
    f->p = (float *)f->base;
#endif
    if (f->p)
        memcpy(f->p, src, bytes);
    return f->p;
}

static void fenced_free(fenced *f)
{
#if HAVE_FENCE
    if (f->base)
        munmap(f->base, f->len);
#else
    free(f->base);
#endif
    memset(f, 0, sizeof *f);
}

/* The configuration running now, named if it crashes (an over-read of a fenced input). */
static char current[320];

static void on_crash(int sig)
{
    static const char msg[] = "\nFAIL: crashed (signal) while running: ";
    (void)sig;
#if HAVE_FENCE
    if (write(2, msg, sizeof msg - 1) < 0 || write(2, current, strlen(current)) < 0 || write(2, "\n", 1) < 0)
        _exit(3);
    _exit(2);
#else
    fputs(msg, stderr);
    fputs(current, stderr);
    abort();
#endif
}

/* Largest error / tolerance over the sweep, printed to show the margin. */
static double worst_ratio;

static void run_cfg(int idx, const sweep_cfg *c, check_rng *r, coverage *cv)
{
    convpool_problem p = c->p;
    convpool_status s = convpool_problem_validate(&p);
    CHECK(s == CONVPOOL_OK, "config %d invalid: %s", idx, convpool_last_error());
    if (s != CONVPOOL_OK)
        return;
    const int64_t nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p), C = p.out_channels;
    const int64_t np = p.batch * C, B = p.batch;
    float *x = (float *)check_alloc(sizeof(float) * (size_t)nx);
    float *w = (float *)check_alloc(sizeof(float) * (size_t)nw);
    float *cb = (float *)check_alloc(sizeof(float) * (size_t)C);
    float *bias = (float *)check_alloc(sizeof(float) * (size_t)C);
    float *ref_p = (float *)check_alloc(sizeof(float) * (size_t)(np + GUARD));
    float *ref_o = (float *)check_alloc(sizeof(float) * (size_t)(B + GUARD));
    float *cpu_p = (float *)check_alloc(sizeof(float) * (size_t)(np + GUARD));
    float *cpu_o = (float *)check_alloc(sizeof(float) * (size_t)(B + GUARD));
    float *alt_p = (float *)check_alloc(sizeof(float) * (size_t)(np + GUARD));
    float *alt_o = (float *)check_alloc(sizeof(float) * (size_t)(B + GUARD));
    if (!x || !w || !cb || !bias || !ref_p || !ref_o || !cpu_p || !cpu_o || !alt_p || !alt_o)
        goto done;
    check_fill_inputs(r, &p, &c->in, x, w, cb, bias);
    const float *cb_used = c->in.conv_bias ? cb : NULL;
    const float *bias_used = c->outputs == 2 ? NULL : bias;
    float *ref_out = c->outputs ? NULL : ref_o;
    float *cpu_out = c->outputs ? NULL : cpu_o;
    float *alt_out = c->outputs ? NULL : alt_o;
    note_coverage(cv, c, &p, cb_used, bias_used, ref_out);

    char label[256];
    snprintf(label, sizeof label,
             "cfg %d [B%lld Cin%lld Cout%lld in %lldx%lldx%lld k %lldx%lldx%lld pool %lldx%lldx%lld d %g"
             " nan%d inf%d cb%d outputs%d zero%d]",
             idx, (long long)p.batch, (long long)p.in_channels, (long long)C, (long long)p.in_d,
             (long long)p.in_h, (long long)p.in_w, (long long)p.kernel_d, (long long)p.kernel_h,
             (long long)p.kernel_w, (long long)p.pool_d, (long long)p.pool_h, (long long)p.pool_w, p.divisor,
             c->in.n_nan, c->in.n_inf, c->in.conv_bias, c->outputs, c->in.zero_channel);

    snprintf(current, sizeof current, "%s", label);
    check_poison(ref_p, np + GUARD);
    check_poison(ref_o, B + GUARD);
    s = convpool_forward_reference(&c->p, x, w, cb_used, bias_used, ref_p, ref_out);
    CHECK(s == CONVPOOL_OK, "%s: reference returned %s: %s", label, convpool_status_name(s),
          convpool_last_error());
    CHECK(check_count_poison(ref_p, np) == 0, "%s: reference left P unwritten", label);
    CHECK(check_all_poison(ref_p + np, GUARD), "%s: reference wrote past the end of P", label);
    if (ref_out) {
        CHECK(check_count_poison(ref_o, B) == 0, "%s: reference left out unwritten", label);
        CHECK(check_all_poison(ref_o + B, GUARD), "%s: reference wrote past the end of out", label);
    } else {
        CHECK(check_all_poison(ref_o, B + GUARD), "%s: reference wrote out although it is NULL", label);
    }

    check_poison(cpu_p, np + GUARD);
    check_poison(cpu_o, B + GUARD);
    s = convpool_forward_cpu(&c->p, x, w, cb_used, bias_used, cpu_p, cpu_out, 1);
    CHECK(s == CONVPOOL_OK, "%s: cpu returned %s: %s", label, convpool_status_name(s), convpool_last_error());
    CHECK(check_count_poison(cpu_p, np) == 0, "%s: cpu left P unwritten", label);
    CHECK(check_all_poison(cpu_p + np, GUARD), "%s: cpu wrote past the end of P", label);
    if (cpu_out) {
        CHECK(check_count_poison(cpu_o, B) == 0, "%s: cpu left out unwritten", label);
        CHECK(check_all_poison(cpu_o + B, GUARD), "%s: cpu wrote past the end of out", label);
    } else {
        CHECK(check_all_poison(cpu_o, B + GUARD), "%s: cpu wrote out although it is NULL", label);
    }

    /* Reference error is its final rounding (fp64 model); the fused path's is float32. */
    const check_tol t = check_tol_add(check_tol_fp32(&p), check_tol_fp64(&p));
    double ratio = 0.0;
    const int64_t bad = check_forward_f(label, &p, x, w, cb_used, bias_used, cpu_p, cpu_out, ref_p,
                                        ref_out, t, &ratio);
    CHECK(bad == 0, "%s: cpu differs from the reference", label);
    if (ratio > worst_ratio)
        worst_ratio = ratio;

    /* Bit-identical across thread counts and reruns. */
    const int threads[6] = {2, 3, 4, 7, 1, 0};
    for (int ti = 0; ti < 6; ++ti) {
        check_poison(alt_p, np + GUARD);
        check_poison(alt_o, B + GUARD);
        s = convpool_forward_cpu(&c->p, x, w, cb_used, bias_used, alt_p, alt_out, threads[ti]);
        CHECK(s == CONVPOOL_OK, "%s threads %d: %s", label, threads[ti], convpool_last_error());
        if (check_same_bits("P", alt_p, cpu_p, np + GUARD) ||
            (alt_out && check_same_bits("out", alt_o, cpu_o, B + GUARD)))
            CHECK(0, "%s: threads %d not bit-identical to threads 1", label, threads[ti]);
    }
    /* Each instruction-set variant gives the same bits (the library falls back to the widest
     * one the CPU has below the requested one). */
    static const char *isas[3] = {"scalar", "avx2", "avx512"};
    for (int k = 0; k < 3; ++k) {
        setenv("CONVPOOL_CPU_ISA", isas[k], 1);
        s = convpool_forward_cpu(&c->p, x, w, cb_used, bias_used, alt_p, alt_out, 2);
        unsetenv("CONVPOOL_CPU_ISA");
        CHECK(s == CONVPOOL_OK, "%s isa %s: %s", label, isas[k], convpool_last_error());
        if (check_same_bits("P", alt_p, cpu_p, np) || (alt_out && check_same_bits("out", alt_o, cpu_o, B)))
            CHECK(0, "%s: CONVPOOL_CPU_ISA=%s not bit-identical to the default variant", label, isas[k]);
    }
    /* x and weight flush against an inaccessible page: an over-read faults. */
    fenced fx, fw;
    const float *x_f = fenced_copy(&fx, x, nx), *w_f = fenced_copy(&fw, w, nw);
    if (x_f && w_f) {
        snprintf(current, sizeof current, "reference, fenced x and weight, %s", label);
        s = convpool_forward_reference(&c->p, x_f, w_f, cb_used, bias_used, alt_p, alt_out);
        CHECK(s == CONVPOOL_OK && check_same_bits("P", alt_p, ref_p, np) == 0,
              "%s: reference on fenced inputs differs", label);
        snprintf(current, sizeof current, "cpu, fenced x and weight, %s", label);
        s = convpool_forward_cpu(&c->p, x_f, w_f, cb_used, bias_used, alt_p, alt_out, 3);
        CHECK(s == CONVPOOL_OK && check_same_bits("P", alt_p, cpu_p, np) == 0,
              "%s: cpu on fenced inputs differs", label);
    }
    fenced_free(&fx);
    fenced_free(&fw);
    /* Asking for out must not change P. */
    if (!cpu_out && bias_used) {
        s = convpool_forward_cpu(&c->p, x, w, cb_used, bias_used, alt_p, alt_o, 2);
        CHECK(s == CONVPOOL_OK && check_same_bits("P", alt_p, cpu_p, np) == 0,
              "%s: P changes when out is requested", label);
    }
done:
    free(x);
    free(w);
    free(cb);
    free(bias);
    free(ref_p);
    free(ref_o);
    free(cpu_p);
    free(cpu_o);
    free(alt_p);
    free(alt_o);
}

static void check_coverage(const coverage *cv)
{
    static const char *axis[3] = {"d", "h", "w"};
    for (int a = 0; a < 3; ++a) {
        for (int k = 1; k <= 5; ++k)
            CHECK(cv->kernel[a][k], "sweep misses kernel_%s = %d", axis[a], k);
        for (int q = 1; q <= 4; ++q)
            CHECK(cv->pool[a][q], "sweep misses pool_%s = %d", axis[a], q);
        CHECK(cv->remainder[a], "sweep has no pool remainder in %s", axis[a]);
    }
    CHECK(cv->div_zero && cv->div_negzero && cv->div_inf && cv->div_neginf && cv->div_nan && cv->div_neg,
          "sweep misses a divisor class (0 %d, -0 %d, inf %d, -inf %d, NaN %d, negative %d)", cv->div_zero,
          cv->div_negzero, cv->div_inf, cv->div_neginf, cv->div_nan, cv->div_neg);
    CHECK(cv->nan_in && cv->inf_in, "sweep misses NaN (%d) or Inf (%d) inputs", cv->nan_in, cv->inf_in);
    CHECK(cv->cin1 && cv->cout1 && cv->c17, "sweep misses Cin 1 (%d), Cout 1 (%d) or 17 channels (%d)",
          cv->cin1, cv->cout1, cv->c17);
    CHECK(cv->cb_null && cv->cb_nonfinite && cv->out_null && cv->bias_null,
          "sweep misses conv_bias NULL (%d), non-finite conv_bias (%d), out NULL (%d) or bias NULL (%d)",
          cv->cb_null, cv->cb_nonfinite, cv->out_null, cv->bias_null);
}

int main(void)
{
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    check_rng r = check_rng_seed(20240607);
    coverage cv;
    memset(&cv, 0, sizeof cv);
    int n = 0;
    for (int i = 0; i < N_RANDOM; ++i, ++n) {
        const sweep_cfg c = random_cfg(&r, i);
        run_cfg(n, &c, &r, &cv);
    }
    for (int i = 0; i < 4; ++i, ++n) {
        const sweep_cfg c = fixed_cfg(i);
        run_cfg(n, &c, &r, &cv);
    }
    check_coverage(&cv);
    printf("test_cpu_sweep: %d configurations, largest error/tolerance %.3g\n", n, worst_ratio);
    return check_exit_code("test_cpu_sweep");
}
