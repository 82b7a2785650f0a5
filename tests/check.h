/*
 * Test harness shared by the convpool tests: failure counting, a seeded generator, output
 * poisoning, the golden-file reader, and the comparison with NaN/Inf-aware reporting and
 * per-element tolerances derived from the problem (the error model is in check.c).
 */
#ifndef CONVPOOL_TEST_CHECK_H
#define CONVPOOL_TEST_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "convpool.h"

#if defined(__GNUC__)
#define CHECK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CHECK_PRINTF(a, b)
#endif

/* ctest's convention for "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
#define CHECK_SKIP 77

/* Failures so far in this process; each test's main returns check_exit_code(). */
extern int64_t check_failures;

void check_fail(const char *file, int line, const char *expr, const char *fmt, ...) CHECK_PRINTF(4, 5);
int check_exit_code(const char *test_name);

/* On failure prints the location, the condition and the formatted message; never aborts. */
#define CHECK(cond, ...)                                                                         \
    do {                                                                                         \
        if (!(cond))                                                                             \
            check_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                  \
    } while (0)

/* Expects status s == want; also requires the last error to name `field` (as a whole word;
 * "a|b" accepts either) when field is non-NULL and want is not CONVPOOL_OK. */
void check_status_at(const char *file, int line, const char *what, convpool_status got,
                     convpool_status want, const char *field);
#define CHECK_STATUS(what, got, want, field) check_status_at(__FILE__, __LINE__, what, got, want, field)

/* 1 if msg contains word bounded by characters that cannot continue an identifier. */
int check_mentions(const char *msg, const char *word);
/* The same for any of the '|'-separated words. */
int check_mentions_any(const char *msg, const char *words);

/* splitmix64: seeded, portable, fast. */
typedef struct check_rng {
    uint64_t s;
} check_rng;

check_rng check_rng_seed(uint64_t seed);
uint64_t check_rng_u64(check_rng *r);
double check_rng_uniform(check_rng *r);              /* [0, 1) */
float check_rng_normal(check_rng *r);                /* standard normal */
int64_t check_rng_int(check_rng *r, int64_t lo, int64_t hi); /* inclusive */
void check_fill_uniform(check_rng *r, float *a, int64_t n, float lo, float hi);
void check_fill_normal(check_rng *r, float *a, int64_t n, float scale);
/* Multiply-adds of the direct conv of a problem whose derived sizes may not be set yet. */
double check_macs(const convpool_problem *p);
/* A divisor for random sweeps: mostly finite of either sign, sometimes +-0, +-inf or NaN. */
double check_pick_divisor(check_rng *r);

/* ---- the sweeps' one problem generator and one input filler (test_cpu_sweep, test_cuda) ---- */

/* A family of random problems: kernel 1..5 per axis (or the given extents), pool 1..4, pooled
 * positions 1..max_reps per axis plus a random remainder, Cin 1..max_cin and Cout 1..max_cout
 * (each 1 with probability 1/4), batch 1..max_batch; one problem in headline_one_in (0: none)
 * is kernel 3^3 / pool 2^3 with odd extents; then shrunk to mac_cap multiply-adds. */
typedef struct check_problem_spec {
    int64_t max_reps, max_cin, max_cout, max_batch;
    int64_t headline_one_in;
    double mac_cap;
} check_problem_spec;
convpool_problem check_random_problem(check_rng *r, const check_problem_spec *s, const int64_t *kernel);
/* Channels first, then batch, then pooled positions (remainders kept) until p costs at most cap
 * multiply-adds. */
convpool_problem check_shrink_to_macs(convpool_problem p, double cap);

/* What goes into a problem's inputs. */
typedef struct check_inputs_spec {
    int x_kind;       /* 0 uniform [0,1) (torch.rand), 1 normal, 2 normal x100 */
    int n_nan, n_inf; /* input voxels set to NaN / +-inf */
    int conv_bias;    /* 1 finite, 2 one channel +-inf, 3 one channel NaN (0: the caller drops it) */
    int zero_channel; /* channel 0: zero weights and conv bias (0/0 under divisor 0) */
} check_inputs_spec;
/* A random spec: special = 0 gives finite uniform x and a finite conv bias. */
check_inputs_spec check_random_inputs(check_rng *r, const convpool_problem *p, int special);
/* x, weights and conv bias as nn.Conv3d initialises them (uniform +-1/sqrt(fan_in)), bias
 * normal, then the spec's specials. Under divisor 0 every channel's conv bias is made larger
 * than the rest of its conv sum, so no conv value's sign (hence +-inf) depends on rounding. */
void check_fill_inputs(check_rng *r, const convpool_problem *p, const check_inputs_spec *s, float *x, float *w,
                       float *cb, float *bias);

/* Poison: a signalling-NaN bit pattern no arithmetic produces, so an output element still
 * holding it was never written. */
#define CHECK_POISON_BITS 0x7fbadbadu
void check_poison(float *a, int64_t n);
int64_t check_count_poison(const float *a, int64_t n);
/* 1 if every element still holds the poison. */
int check_all_poison(const float *a, int64_t n);

/* Bit-identical comparison; prints the first differing elements. Returns differing count. */
int64_t check_same_bits(const char *what, const float *a, const float *b, int64_t n);

/* Summary of one comparison. max_ratio is the largest |got-exp| / tol over finite pairs. */
/* Added to every tolerance: a float32 result in the subnormal range (below 2^-126) is spaced
 * 2^-149 apart whatever its relative precision, so a correct float computation can be off by a
 * few such steps where a relative tolerance (or an error scale of exact zero) allows less. */
#define CHECK_TOL_FLOOR (8.0 * 0x1.0p-149)

typedef struct check_result {
    int64_t n, mismatches, nan_mismatches, inf_mismatches;
    double max_abs, max_ratio;
} check_result;

/*
 * Element i passes when both are NaN, both are the same infinity, or both are finite with
 * |got - exp| <= atol_i + rtol * |exp| where atol_i = atol ? atol[i] : atol_all.
 * On failure prints (prefixed with what) the first few mismatching pairs with index, got,
 * expected, absolute and relative error and tolerance, then the counts.
 * Returns the mismatch count; res (may be NULL) receives the summary.
 */
int64_t check_close(const char *what, const float *got, const double *exp, int64_t n,
                    const double *atol, double atol_all, double rtol, check_result *res);

/*
 * Error model of one implementation, as bounds relative to the scale of the quantity. Per
 * (b, c), with S = max|x[b]| * sum|w[c]| + |conv_bias[c]| (max over finite x), the pooled
 * value P[b,c] may be off by (a max-pool is 1-Lipschitz, so the conv error passes to the
 * pooled maxima and to their mean unchanged, then / |divisor|):
 *   conv_rel * S / |d|                      conv sum, worst-case or counted roundings
 *   conv_l2_rel * max|x[b]| * ||w[c]||_2 / |d|  zero-mean per-product errors (a random walk)
 *   mean_rel * S / |d|                      the average over the N pooled values
 *   p_rel * (|P| + |conv_bias[c]| / |d|)    a bias common to all products (scales the conv)
 *   rtol * |P|                              the final roundings
 * out[b] may be off by the sum of its channels' P tolerances plus out_rel * sum_c (|P|+|bias|)
 * (the float sum over channels) plus rtol * |out|.
 */
typedef struct check_tol {
    double conv_rel, conv_l2_rel, mean_rel, p_rel, rtol, out_rel;
} check_tol;

/* Float32 accumulation everywhere (the fused CPU path, PyTorch's own float32 result): a
 * float sum of n terms counts min(n, 4*sqrt(n)) roundings (check.c says why). */
check_tol check_tol_fp32(const convpool_problem *p);
/* Double accumulation (the reference, PyTorch float64): the final float rounding and the
 * divisor rounded to float are left. */
check_tol check_tol_fp64(const convpool_problem *p);
/* Two error budgets added (comparing two inexact results against each other). */
check_tol check_tol_add(check_tol a, check_tol b);

/* Fills atol_p[batch*out_channels] and atol_out[batch] (either may be NULL) for the
 * tolerance model t; p_exp are the expected pooled values (their magnitude sizes the out
 * tolerance). conv_bias may be NULL. Non-finite contributions are ignored: where they
 * matter the expected value is itself non-finite and compared by class. */
void check_tolerances(const convpool_problem *p, const float *x, const float *weight,
                      const float *conv_bias, const float *bias, const double *p_exp,
                      check_tol t, double *atol_p, double *atol_out);

/*
 * Compares pooled (and out, when got_out is non-NULL) against expected values under model t;
 * label prefixes the messages. Returns mismatches. ratio (may be NULL) receives the largest
 * error/tolerance seen.
 */
int64_t check_forward(const char *label, const convpool_problem *p, const float *x,
                      const float *weight, const float *conv_bias, const float *bias,
                      const float *got_p, const float *got_out, const double *exp_p,
                      const double *exp_out, check_tol t, double *ratio);

/* The same with float expected values (another implementation's output). */
int64_t check_forward_f(const char *label, const convpool_problem *p, const float *x,
                        const float *weight, const float *conv_bias, const float *bias,
                        const float *got_p, const float *got_out, const float *exp_p,
                        const float *exp_out, check_tol t, double *ratio);

/* A golden file (format: tests/golden/README.md). */
typedef struct check_golden {
    char name[128];
    convpool_problem p; /* validated */
    float *x, *weight, *conv_bias, *bias, *out32, *p32;
    double *out64, *p64;
} check_golden;

/* Returns 0 on success; on failure prints why and returns -1. */
int check_golden_load(const char *path, check_golden *g);
void check_golden_free(check_golden *g);

/* Reads dir/manifest.txt: up to max names (first token of each non-comment line) into
 * names[i] (each at most 127 characters). Returns the count, or -1 if unreadable. */
int check_golden_manifest(const char *dir, char names[][128], int max);

/* malloc that reports and counts a failure instead of returning NULL silently. */
void *check_alloc(size_t bytes);

#endif /* CONVPOOL_TEST_CHECK_H */
