/*
 * CPU benchmark: the fused path (convpool_forward_cpu) and, optionally, the reference, on one
 * shape. Wall time per call, median and p20/p80 over --iters runs after --warmup runs, and
 * GFLOP/s from convpool_problem_flops. The reference is slow (serial, double), so it runs on
 * the first --ref-batch samples only; its time is reported per sample and extrapolated to the
 * whole batch, and its pooled means are compared with the fused path's for those samples.
 * PyTorch CPU eager at the same shape and thread count: bench/bench_cpu_torch.py.
 *
 * Inputs follow the PyTorch Model: x ~ U[0, 1), weights and conv bias ~ U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)), bias ~ U(-1, 1); fixed seed.
 */
#define _POSIX_C_SOURCE 200809L

#include "convpool.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct bench_args {
    convpool_problem p;
    int iters, warmup, threads, reference, json;
    int64_t ref_batch;
} bench_args;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uniform01(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static void fill(float *a, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; ++i)
        a[i] = (float)(lo + (hi - lo) * uniform01());
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Element q (0..1) of sorted t[0..n), as bench_gpu.py picks it. */
static double quantile(const double *t, int n, double q)
{
    int i = (int)(q * n);
    return t[i < n ? i : n - 1];
}

static double median(const double *t, int n)
{
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void cpu_name(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *c = strchr(line, ':');
            if (c) {
                c += 1 + (c[1] == ' ');
                snprintf(buf, n, "%s", c);
                buf[strcspn(buf, "\n")] = '\0';
            }
            break;
        }
    }
    fclose(f);
}

static void usage(const char *argv0)
{
    printf("usage: %s [options]\n"
           "  --batch N --in-channels N --out-channels N --depth N --height N --width N\n"
           "  --kernel N (all three) | --kernel-d N --kernel-h N --kernel-w N\n"
           "  --pool N (all three)   | --pool-d N --pool-h N --pool-w N\n"
           "  --divisor X            (defaults: the headline problem)\n"
           "  --threads N            fused-path threads, 0 = all cores (default 0)\n"
           "  --iters N --warmup N   timed and untimed runs (default 10, 2)\n"
           "  --no-reference         skip the reference\n"
           "  --ref-batch N          samples the reference runs on (default 1)\n"
           "  --json                 one JSON object per line instead of text\n",
           argv0);
}

static int parse_int(const char *flag, const char *s, int64_t *v)
{
    char *end;
    long long x = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0') {
        fprintf(stderr, "%s: expected an integer, got '%s'\n", flag, s);
        return 0;
    }
    *v = (int64_t)x;
    return 1;
}

/* Returns 0 to run, 1 to exit successfully (help), 2 on a bad flag. */
static int parse_args(int argc, char **argv, bench_args *a)
{
    a->p = convpool_problem_headline();
    a->iters = 10;
    a->warmup = 2;
    a->threads = 0;
    a->reference = 1;
    a->json = 0;
    a->ref_batch = 1;
    for (int i = 1; i < argc; ++i) {
        const char *f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
            usage(argv[0]);
            return 1;
        }
        if (strcmp(f, "--no-reference") == 0) {
            a->reference = 0;
            continue;
        }
        if (strcmp(f, "--json") == 0) {
            a->json = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s needs a value (--help lists the flags)\n", f);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(f, "--divisor") == 0) {
            char *end;
            a->p.divisor = strtod(v, &end);
            if (*v == '\0' || *end != '\0') {
                fprintf(stderr, "--divisor: expected a number, got '%s'\n", v);
                return 2;
            }
            continue;
        }
        int64_t x;
        if (!parse_int(f, v, &x))
            return 2;
        if (strcmp(f, "--batch") == 0) a->p.batch = x;
        else if (strcmp(f, "--in-channels") == 0) a->p.in_channels = x;
        else if (strcmp(f, "--out-channels") == 0) a->p.out_channels = x;
        else if (strcmp(f, "--depth") == 0) a->p.in_d = x;
        else if (strcmp(f, "--height") == 0) a->p.in_h = x;
        else if (strcmp(f, "--width") == 0) a->p.in_w = x;
        else if (strcmp(f, "--kernel") == 0) a->p.kernel_d = a->p.kernel_h = a->p.kernel_w = x;
        else if (strcmp(f, "--kernel-d") == 0) a->p.kernel_d = x;
        else if (strcmp(f, "--kernel-h") == 0) a->p.kernel_h = x;
        else if (strcmp(f, "--kernel-w") == 0) a->p.kernel_w = x;
        else if (strcmp(f, "--pool") == 0) a->p.pool_d = a->p.pool_h = a->p.pool_w = x;
        else if (strcmp(f, "--pool-d") == 0) a->p.pool_d = x;
        else if (strcmp(f, "--pool-h") == 0) a->p.pool_h = x;
        else if (strcmp(f, "--pool-w") == 0) a->p.pool_w = x;
        else if (strcmp(f, "--threads") == 0) a->threads = (int)x;
        else if (strcmp(f, "--iters") == 0) a->iters = (int)x;
        else if (strcmp(f, "--warmup") == 0) a->warmup = (int)x;
        else if (strcmp(f, "--ref-batch") == 0) a->ref_batch = x;
        else {
            fprintf(stderr, "unknown flag %s (--help lists the flags)\n", f);
            return 2;
        }
    }
    if (a->iters < 1 || a->warmup < 0 || a->ref_batch < 1) {
        fprintf(stderr, "--iters and --ref-batch must be >= 1, --warmup >= 0\n");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench_args a;
    int r = parse_args(argc, argv, &a);
    if (r)
        return r == 1 ? 0 : 2;
    convpool_problem p = a.p;
    if (convpool_problem_validate(&p) != CONVPOOL_OK) {
        fprintf(stderr, "bad problem: %s\n", convpool_last_error());
        return 2;
    }
    const int64_t cout = p.out_channels;
    const int64_t fan_in = p.in_channels * p.kernel_d * p.kernel_h * p.kernel_w;
    const double bound = 1.0 / sqrt((double)fan_in);
    float *x = (float *)malloc((size_t)convpool_x_numel(&p) * sizeof(float));
    float *w = (float *)malloc((size_t)convpool_weight_numel(&p) * sizeof(float));
    float *cb = (float *)malloc((size_t)cout * sizeof(float));
    float *bias = (float *)malloc((size_t)cout * sizeof(float));
    float *pooled = (float *)malloc((size_t)(p.batch * cout) * sizeof(float));
    float *out = (float *)malloc((size_t)p.batch * sizeof(float));
    double *times = (double *)malloc((size_t)a.iters * sizeof(double));
    if (!x || !w || !cb || !bias || !pooled || !out || !times) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    fill(x, convpool_x_numel(&p), 0.0, 1.0);
    fill(w, convpool_weight_numel(&p), -bound, bound);
    fill(cb, cout, -bound, bound);
    fill(bias, cout, -1.0, 1.0);

    for (int i = 0; i < a.warmup + a.iters; ++i) {
        const double t0 = now_s();
        convpool_status s = convpool_forward_cpu(&p, x, w, cb, bias, pooled, out, a.threads);
        const double t1 = now_s();
        if (s != CONVPOOL_OK) {
            fprintf(stderr, "convpool_forward_cpu: %s: %s\n", convpool_status_name(s),
                    convpool_last_error());
            return 1;
        }
        if (i >= a.warmup)
            times[i - a.warmup] = t1 - t0;
    }
    qsort(times, (size_t)a.iters, sizeof(double), cmp_double);
    const double flops = convpool_problem_flops(&p);
    const double med = median(times, a.iters);
    const double p20 = quantile(times, a.iters, 0.2), p80 = quantile(times, a.iters, 0.8);

    char cpu[256], date[32], shape[160];
    cpu_name(cpu, sizeof cpu);
    const time_t tnow = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&tnow));
    snprintf(shape, sizeof shape, "B%lld %lld->%lld %lldx%lldx%lld k%lldx%lldx%lld p%lldx%lldx%lld d%g",
             (long long)p.batch, (long long)p.in_channels, (long long)cout, (long long)p.in_d,
             (long long)p.in_h, (long long)p.in_w, (long long)p.kernel_d, (long long)p.kernel_h,
             (long long)p.kernel_w, (long long)p.pool_d, (long long)p.pool_h, (long long)p.pool_w,
             p.divisor);
    const char *isa = getenv("CONVPOOL_CPU_ISA");
    const char *rev = getenv("CONVPOOL_REV");
    int threads = a.threads;
#ifdef _OPENMP
    if (threads == 0)
        threads = omp_get_max_threads();
#endif

    if (a.json)
        printf("{\"variant\": \"convpool_cpu\", \"shape\": \"%s\", \"batch\": %lld, \"threads\": %d, "
               "\"median_ms\": %.4f, \"p20_ms\": %.4f, \"p80_ms\": %.4f, \"GFLOPs\": %.2f, "
               "\"isa_cap\": \"%s\", \"cpu\": \"%s\", \"date\": \"%s\", \"rev\": \"%s\"}\n",
               shape, (long long)p.batch, threads, med * 1e3, p20 * 1e3, p80 * 1e3,
               flops / med * 1e-9, isa ? isa : "none", cpu, date, rev ? rev : "unknown");
    else
        printf("convpool_cpu  %s  threads %d: median %.3f ms (p20 %.3f, p80 %.3f)  %.1f GFLOP/s  [%s]\n",
               shape, threads, med * 1e3, p20 * 1e3, p80 * 1e3, flops / med * 1e-9, cpu);

    if (a.reference) {
        convpool_problem rp = p;
        rp.batch = a.ref_batch < p.batch ? a.ref_batch : p.batch;
        float *rpooled = (float *)malloc((size_t)(rp.batch * cout) * sizeof(float));
        float *rout = (float *)malloc((size_t)rp.batch * sizeof(float));
        if (!rpooled || !rout) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        const double t0 = now_s();
        convpool_status s = convpool_forward_reference(&rp, x, w, cb, bias, rpooled, rout);
        const double t1 = now_s();
        if (s != CONVPOOL_OK) {
            fprintf(stderr, "convpool_forward_reference: %s: %s\n", convpool_status_name(s),
                    convpool_last_error());
            return 1;
        }
        /* Largest |difference| of the pooled means; "nan" if the two disagree on NaN-ness. */
        double maxdiff = 0.0;
        int nan_mismatch = 0;
        for (int64_t i = 0; i < rp.batch * cout; ++i) {
            const double e = (double)rpooled[i], g = (double)pooled[i];
            if (isnan(e) != isnan(g))
                nan_mismatch = 1;
            else if (!isnan(e) && e != g && fabs(e - g) > maxdiff)
                maxdiff = fabs(e - g);
        }
        char diff[32];
        if (nan_mismatch)
            snprintf(diff, sizeof diff, a.json ? "null" : "nan");
        else
            snprintf(diff, sizeof diff, "%.3g", maxdiff);
        const double per_sample = (t1 - t0) / (double)rp.batch;
        if (a.json)
            printf("{\"variant\": \"reference\", \"shape\": \"%s\", \"batch\": %lld, \"threads\": 1, "
                   "\"samples_run\": %lld, \"ms_per_sample\": %.3f, \"median_ms\": %.3f, "
                   "\"GFLOPs\": %.3f, \"max_abs_diff_pooled\": %s, \"cpu\": \"%s\", "
                   "\"date\": \"%s\", \"rev\": \"%s\"}\n",
                   shape, (long long)p.batch, (long long)rp.batch, per_sample * 1e3,
                   per_sample * (double)p.batch * 1e3,
                   flops / (double)p.batch / per_sample * 1e-9, diff, cpu, date, rev ? rev : "unknown");
        else
            printf("reference     %lld sample(s): %.1f ms/sample, %.1f ms extrapolated to B%lld, "
                   "%.2f GFLOP/s; max |pooled diff| vs fused %s\n",
                   (long long)rp.batch, per_sample * 1e3, per_sample * (double)p.batch * 1e3,
                   (long long)p.batch, flops / (double)p.batch / per_sample * 1e-9, diff);
        free(rpooled);
        free(rout);
    }
    free(x);
    free(w);
    free(cb);
    free(bias);
    free(pooled);
    free(out);
    free(times);
    return 0;
}
