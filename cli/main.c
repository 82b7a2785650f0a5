/*
 * convpool: the command-line driver.
 *
 * Runs the fused block (conv3d -> / divisor -> max_pool3d -> global mean -> + bias -> sum
 * over channels) on seeded random inputs, times it, and checks a sample of the batch
 * against the float64 reference. With no arguments it runs the headline problem
 * (KernelBench L2 #8) on the GPU when there is one and on the CPU otherwise.
 *
 * Sections: option table and parsing, problem setup (PRNG, inputs), run_cpu, run_cuda,
 * check against the reference, report (text or JSON), main.
 *
 * Exit status: 0 the check passed (or was skipped), 1 it failed, or out of memory, or a
 * CUDA error; 2 a bad argument or a problem the library rejects (a file that cannot be read
 * or written, an option this build cannot serve).
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */

#include "convpool.h"

#ifndef CONVPOOL_CLI_CJSON
#define CONVPOOL_CLI_CJSON 0
#endif
#if CONVPOOL_CLI_CJSON
#include "io.h"

#include <cjson/cJSON.h>
#endif

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef CONVPOOL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define EXIT_CHECK_FAILED 1
#define EXIT_USAGE        2
#define DEFAULT_ITERS_CPU 10
#define DEFAULT_ITERS_GPU 50
#define GPU_WARMUP_RUNS   3
#define OUT_VALUES_SHOWN  4
#define MISMATCHES_SHOWN  4
#define TWO_PI            6.283185307179586476925286766559

/* ------------------------------------------------------------------------------------ */
/* Options                                                                              */
/* ------------------------------------------------------------------------------------ */

typedef enum device_kind { DEVICE_AUTO = 0, DEVICE_CPU = 1, DEVICE_CUDA = 2 } device_kind;

typedef struct options {
    int64_t batch, in_channels, out_channels, depth, height, width;
    int64_t kernel[3], pool[3];
    double divisor;
    device_kind device;
    convpool_precision precision;
    int64_t threads; /* 0 = all cores */
    uint64_t seed;
    int64_t iters;       /* 0 = the device's default */
    int64_t check_batch; /* 0 = no check */
    int json;
    int explain;
    int help;
    const char *input, *weights, *output, *pooled; /* files (NULL: random inputs, no files) */
    unsigned given;                                 /* GIVEN_* bits of the size flags set */
} options;

/* Size flags the files can contradict. */
enum { GIVEN_BATCH = 1, GIVEN_CIN = 2, GIVEN_COUT = 4, GIVEN_DEPTH = 8, GIVEN_HEIGHT = 16, GIVEN_WIDTH = 32,
       GIVEN_KERNEL = 64 };

/* Caps on the run flags, stated in --help: a larger --iters only times the same thing longer
 * (and a huge one would never end), and the library caps threads at the cores anyway. */
#define MAX_ITERS 1000000
#define TOL_FLOOR (8.0 * 0x1.0p-149)
#define MAX_ITERS_TEXT "1000000"
#define MAX_THREADS 4096
#define MAX_THREADS_TEXT "4096"

typedef enum arg_kind {
    ARG_SIZE,   /* positive int64 */
    ARG_SIZE3,  /* positive int64, or three of them comma-separated */
    ARG_NUMBER, /* any double, inf and nan included */
    ARG_COUNT,  /* non-negative int64 */
    ARG_ITERS,  /* positive int64; 0 in the struct means "device default" */
    ARG_SEED,   /* uint64 */
    ARG_DEVICE,
    ARG_PRECISION,
    ARG_PATH, /* a file name */
    ARG_FLAG  /* takes no value */
} arg_kind;

typedef struct option_spec {
    const char *name; /* without the leading "--" */
    arg_kind kind;
    size_t offset; /* of the field in struct options */
    const char *metavar;
    const char *help;
    const char *section; /* printed as a heading before this option in --help, or NULL */
} option_spec;

static const option_spec option_table[] = {
    {"batch", ARG_SIZE, offsetof(options, batch), "N", "batch size", "problem"},
    {"in-channels", ARG_SIZE, offsetof(options, in_channels), "N", "input channels", NULL},
    {"out-channels", ARG_SIZE, offsetof(options, out_channels), "N", "output channels", NULL},
    {"depth", ARG_SIZE, offsetof(options, depth), "N", "input depth D", NULL},
    {"height", ARG_SIZE, offsetof(options, height), "N", "input height H", NULL},
    {"width", ARG_SIZE, offsetof(options, width), "N", "input width W", NULL},
    {"kernel", ARG_SIZE3, offsetof(options, kernel), "K|KD,KH,KW", "conv kernel extent", NULL},
    {"pool", ARG_SIZE3, offsetof(options, pool), "P|PD,PH,PW", "max-pool window (= stride)", NULL},
    {"divisor", ARG_NUMBER, offsetof(options, divisor), "X",
     "divide the conv output by X (0, inf, nan allowed)", NULL},
    {"device", ARG_DEVICE, offsetof(options, device), "auto|cpu|cuda",
     "auto: the GPU if one is usable, else the CPU", "run"},
    {"precision", ARG_PRECISION, offsetof(options, precision), "tf32|strict",
     "GPU conv multiplies: TF32 operands or FP32-accurate", NULL},
    {"threads", ARG_COUNT, offsetof(options, threads), "N",
     "CPU threads, 0 = all cores; at most " MAX_THREADS_TEXT " (the library\n"
     "                             itself starts no more than the cores OpenMP sees)",
     NULL},
    {"seed", ARG_SEED, offsetof(options, seed), "N", "seed of the random inputs", NULL},
    {"iters", ARG_ITERS, offsetof(options, iters), "N", "timed runs (median reported), at most " MAX_ITERS_TEXT,
     NULL},
    {"check-batch", ARG_COUNT, offsetof(options, check_batch), "N",
     "batch items checked against the reference,\n"
     "                             spread over the batch incl. the last; 0 = none",
     NULL},
    {"input", ARG_PATH, offsetof(options, input), "X.npy",
     "x from a .npy file: float32 or float16, (N, Cin, D, H, W)\n"
     "                             or one sample (Cin, D, H, W); sizes come from the file",
     "files"},
    {"weights", ARG_PATH, offsetof(options, weights), "W.safetensors",
     "conv.weight, conv.bias and bias from a safetensors file\n"
     "                             (Model.state_dict() keys; F32, F16 or BF16)",
     NULL},
    {"output", ARG_PATH, offsetof(options, output), "OUT.npy", "write out, float32 (N,), to a .npy file", NULL},
    {"pooled", ARG_PATH, offsetof(options, pooled), "P.npy", "write P, float32 (N, Cout), to a .npy file", NULL},
    {"json", ARG_FLAG, offsetof(options, json), NULL,
     "print one JSON object on stdout instead of text", "output"},
    {"explain", ARG_FLAG, offsetof(options, explain), NULL,
     "print the GPU plan (kernel, tile, why) for the problem and\n"
     "                             precision, and exit; without a GPU it plans for sm_90",
     NULL},
    {"help", ARG_FLAG, offsetof(options, help), NULL, "print this help and exit", NULL},
};
#define N_OPTIONS (sizeof option_table / sizeof option_table[0])

static const char *const device_names[] = {"auto", "cpu", "cuda"};
static const char *const precision_names[] = {"tf32", "strict"};

static void options_default(options *o)
{
    const convpool_problem h = convpool_problem_headline();
    memset(o, 0, sizeof *o);
    o->batch = h.batch;
    o->in_channels = h.in_channels;
    o->out_channels = h.out_channels;
    o->depth = h.in_d;
    o->height = h.in_h;
    o->width = h.in_w;
    o->kernel[0] = h.kernel_d;
    o->kernel[1] = h.kernel_h;
    o->kernel[2] = h.kernel_w;
    o->pool[0] = h.pool_d;
    o->pool[1] = h.pool_h;
    o->pool[2] = h.pool_w;
    o->divisor = h.divisor;
    o->device = DEVICE_AUTO;
    o->precision = CONVPOOL_PRECISION_TF32;
    o->threads = 0;
    o->seed = 42;
    o->iters = 0;
    o->check_batch = 2;
}

static void *option_field(options *o, const option_spec *spec) { return (char *)o + spec->offset; }

/* Digits only: strtoll alone would accept leading blanks and signs. */
static int parse_int64(const char *s, int64_t min, int64_t *v)
{
    if (!isdigit((unsigned char)s[0]))
        return 0;
    errno = 0;
    char *end;
    long long r = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || r < min)
        return 0;
    *v = (int64_t)r;
    return 1;
}

static int parse_size3(const char *s, int64_t v[3])
{
    int64_t got[3];
    int n = 0;
    const char *p = s;
    for (;;) {
        if (n == 3 || !isdigit((unsigned char)*p))
            return 0;
        errno = 0;
        char *end;
        long long r = strtoll(p, &end, 10);
        if (errno != 0 || r <= 0)
            return 0;
        got[n++] = (int64_t)r;
        if (*end == '\0')
            break;
        if (*end != ',')
            return 0;
        p = end + 1;
    }
    if (n == 2)
        return 0;
    for (int i = 0; i < 3; ++i)
        v[i] = n == 1 ? got[0] : got[i];
    return 1;
}

/* 1, or 0 when s is not a number, or -1 when it is one beyond a double's range (*v then holds
 * what strtod made of it: 1e999 is inf, 1e-400 zero; "inf" and "0" ask for those). A subnormal
 * is kept. */
static int parse_number(const char *s, double *v)
{
    if (s[0] == '\0' || isspace((unsigned char)s[0]))
        return 0;
    char *end;
    errno = 0;
    double r = strtod(s, &end);
    if (*end != '\0')
        return 0;
    *v = r;
    return errno == ERANGE && (r == 0.0 || isinf(r)) ? -1 : 1;
}

static int parse_uint64(const char *s, uint64_t *v)
{
    if (!isdigit((unsigned char)s[0]))
        return 0;
    errno = 0;
    char *end;
    unsigned long long r = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return 0;
    *v = (uint64_t)r;
    return 1;
}

static int parse_name(const char *s, const char *const *names, int n, int *v)
{
    for (int i = 0; i < n; ++i)
        if (strcmp(s, names[i]) == 0) {
            *v = i;
            return 1;
        }
    return 0;
}

/* Parses one value into its field; on failure prints the one-line error and returns 0. */
static int apply_option(options *o, const option_spec *spec, const char *value)
{
    void *field = option_field(o, spec);
    const char *expected = "";
    int ok = 0, idx = 0;
    switch (spec->kind) {
    case ARG_SIZE:
        ok = parse_int64(value, 1, (int64_t *)field);
        expected = "a positive integer";
        break;
    case ARG_SIZE3:
        ok = parse_size3(value, (int64_t *)field);
        expected = spec->offset == offsetof(options, kernel) ? "a positive integer or KD,KH,KW"
                                                             : "a positive integer or PD,PH,PW";
        break;
    case ARG_NUMBER:
        ok = parse_number(value, (double *)field);
        expected = "a number";
        if (ok < 0) {
            const double r = *(double *)field;
            const char *became = r == 0.0 ? "0" : r > 0 ? "inf" : "-inf";
            fprintf(stderr, "convpool: --%s: '%s' is beyond the range of a double (it would silently become %s; "
                            "write %s to mean that)\n",
                    spec->name, value, became, became);
            return 0;
        }
        break;
    case ARG_COUNT:
        ok = parse_int64(value, 0, (int64_t *)field);
        expected = "a non-negative integer";
        break;
    case ARG_ITERS:
        ok = parse_int64(value, 1, (int64_t *)field) && *(int64_t *)field <= MAX_ITERS;
        expected = "an integer from 1 to " MAX_ITERS_TEXT;
        break;
    case ARG_SEED:
        ok = parse_uint64(value, (uint64_t *)field);
        expected = "a non-negative integer below 2^64";
        break;
    case ARG_DEVICE:
        ok = parse_name(value, device_names, 3, &idx);
        if (ok)
            *(device_kind *)field = (device_kind)idx;
        expected = "auto, cpu or cuda";
        break;
    case ARG_PRECISION:
        ok = parse_name(value, precision_names, 2, &idx);
        if (ok)
            *(convpool_precision *)field = (convpool_precision)idx;
        expected = "tf32 or strict";
        break;
    case ARG_PATH:
        *(const char **)field = value;
        ok = value[0] != '\0';
        expected = "a file name";
        break;
    case ARG_FLAG:
        *(int *)field = 1;
        ok = 1;
        break;
    }
    static const struct { size_t offset; unsigned bit; } size_flags[] = {
        {offsetof(options, batch), GIVEN_BATCH},   {offsetof(options, in_channels), GIVEN_CIN},
        {offsetof(options, out_channels), GIVEN_COUT}, {offsetof(options, depth), GIVEN_DEPTH},
        {offsetof(options, height), GIVEN_HEIGHT}, {offsetof(options, width), GIVEN_WIDTH},
        {offsetof(options, kernel), GIVEN_KERNEL},
    };
    for (size_t i = 0; ok && i < sizeof size_flags / sizeof size_flags[0]; ++i)
        if (spec->offset == size_flags[i].offset)
            o->given |= size_flags[i].bit;
    if (!ok)
        fprintf(stderr, "convpool: --%s: expected %s, got '%s'\n", spec->name, expected, value);
    return ok;
}

static const option_spec *find_option(const char *name, size_t len)
{
    for (size_t i = 0; i < N_OPTIONS; ++i)
        if (strlen(option_table[i].name) == len && strncmp(option_table[i].name, name, len) == 0)
            return &option_table[i];
    return NULL;
}

/* Returns 0 on success, else the exit status (the error line is already printed). */
static int parse_args(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; ++i) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            fprintf(stderr,
                    "convpool: unexpected argument '%s' (options start with --; see --help)\n",
                    arg);
            return EXIT_USAGE;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const option_spec *spec = find_option(name, len);
        if (!spec) {
            fprintf(stderr, "convpool: unknown option '--%.*s' (see --help)\n", (int)len, name);
            return EXIT_USAGE;
        }
        const char *value = NULL;
        if (spec->kind == ARG_FLAG) {
            if (eq) {
                fprintf(stderr, "convpool: --%s takes no value, got '%s'\n", spec->name, eq + 1);
                return EXIT_USAGE;
            }
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            value = argv[++i];
        } else {
            fprintf(stderr, "convpool: --%s: missing value (%s)\n", spec->name, spec->metavar);
            return EXIT_USAGE;
        }
        if (!apply_option(o, spec, value))
            return EXIT_USAGE;
    }
    return 0;
}

static void format_default(const options *d, const option_spec *spec, char *buf, size_t n)
{
    options copy = *d;
    const void *field = option_field(&copy, spec);
    const int64_t *v = (const int64_t *)field;
    buf[0] = '\0';
    switch (spec->kind) {
    case ARG_SIZE:
    case ARG_COUNT:
        snprintf(buf, n, "%lld", (long long)*v);
        break;
    case ARG_SIZE3:
        if (v[0] == v[1] && v[1] == v[2])
            snprintf(buf, n, "%lld", (long long)v[0]);
        else
            snprintf(buf, n, "%lld,%lld,%lld", (long long)v[0], (long long)v[1], (long long)v[2]);
        break;
    case ARG_NUMBER:
        snprintf(buf, n, "%g", *(const double *)field);
        break;
    case ARG_ITERS:
        snprintf(buf, n, "%d on CPU, %d on GPU", DEFAULT_ITERS_CPU, DEFAULT_ITERS_GPU);
        break;
    case ARG_SEED:
        snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)field);
        break;
    case ARG_DEVICE:
        snprintf(buf, n, "%s", device_names[*(const device_kind *)field]);
        break;
    case ARG_PRECISION:
        snprintf(buf, n, "%s", precision_names[*(const convpool_precision *)field]);
        break;
    case ARG_PATH:
        break;
    case ARG_FLAG:
        break;
    }
}

static void print_usage(FILE *f)
{
    options d;
    options_default(&d);
    fprintf(f,
            "usage: convpool [options]\n"
            "\n"
            "Runs conv3d -> / divisor -> max_pool3d -> global mean -> + bias -> sum over channels\n"
            "on your files (--input, --weights) or on seeded random inputs (x ~ U[0,1), weight and\n"
            "conv bias as nn.Conv3d initialises them, bias ~ N(0,1)), times it and checks a sample\n"
            "of the batch against the float64 reference; --output and --pooled save the results.\n"
            "With no options: the headline problem, KernelBench L2 #8.\n");
    for (size_t i = 0; i < N_OPTIONS; ++i) {
        const option_spec *s = &option_table[i];
        char left[64], def[64];
        if (s->section)
            fprintf(f, "\n%s:\n", s->section);
        snprintf(left, sizeof left, "--%s%s%s", s->name, s->metavar ? " " : "",
                 s->metavar ? s->metavar : "");
        format_default(&d, s, def, sizeof def);
        if (def[0])
            fprintf(f, "  %-26s %s (default %s)\n", left, s->help, def);
        else
            fprintf(f, "  %-26s %s\n", left, s->help);
    }
    fprintf(
        f,
        "\n"
        "Every option also takes the form --option=value.\n"
        "Exit status: 0 check passed (or skipped), 1 check failed, out of memory or CUDA error,\n"
        "2 bad argument or invalid problem (a file that cannot be read or written, or an option\n"
        "this build lacks, such as --explain without CUDA).\n");
}

/* Library field names in a validation message, mapped back to the flags that set them, in the
 * message's order; an overflow message blames one field (the first it names), so only that
 * flag is given. */
static void print_problem_error(const char *msg, convpool_status status)
{
    static const struct {
        const char *field, *flag;
    } map[] = {
        {"batch", "--batch"},
        {"in_channels", "--in-channels"},
        {"out_channels", "--out-channels"},
        {"in_d", "--depth"},
        {"in_h", "--height"},
        {"in_w", "--width"},
        {"kernel_d", "--kernel"},
        {"kernel_h", "--kernel"},
        {"kernel_w", "--kernel"},
        {"pool_d", "--pool"},
        {"pool_h", "--pool"},
        {"pool_w", "--pool"},
    };
    const size_t n_map = sizeof map / sizeof map[0];
    char flags[256] = "";
    size_t used = 0;
    /* Walk the message so the flags come out in the order the fields are named. */
    for (const char *p = msg; *p; ++p) {
        if (p != msg && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
            continue;
        for (size_t i = 0; i < n_map; ++i) {
            size_t len = strlen(map[i].field);
            if (strncmp(p, map[i].field, len) != 0 || isalnum((unsigned char)p[len]) ||
                p[len] == '_')
                continue;
            if (!strstr(flags, map[i].flag) && used + strlen(map[i].flag) + 3 < sizeof flags)
                used += (size_t)snprintf(flags + used, sizeof flags - used, "%s%s",
                                         used ? ", " : "", map[i].flag);
        }
        if (used && status == CONVPOOL_ERR_OVERFLOW)
            break;
    }
    if (used)
        fprintf(stderr, "convpool: %s: invalid problem: %s\n", flags, msg);
    else
        fprintf(stderr, "convpool: invalid problem: %s\n", msg);
}

/* ------------------------------------------------------------------------------------ */
/* Problem setup: timing, progress, PRNG and the inputs                                 */
/* ------------------------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A "label i/n ..." line on stderr, only on a terminal and only for phases that run (or
 * are expected to run) longer than about a second; cleared when the phase ends. */
typedef struct progress {
    int enabled, shown;
    double start, expect_s;
    const char *label;
} progress;

static void progress_begin(progress *pr, const char *label, double expect_s)
{
    pr->enabled = isatty(STDERR_FILENO);
    pr->shown = 0;
    pr->start = now_s();
    pr->expect_s = expect_s;
    pr->label = label;
}

static void progress_step(progress *pr, int64_t i, int64_t n)
{
    if (!pr->enabled)
        return;
    double elapsed = now_s() - pr->start;
    double total = i > 0 ? elapsed / (double)i * (double)n : pr->expect_s;
    if (elapsed < 1.0 && total < 1.0)
        return;
    fprintf(stderr, "\r%s %lld/%lld ...", pr->label, (long long)(i + 1), (long long)n);
    fflush(stderr);
    pr->shown = 1;
}

static void progress_end(progress *pr)
{
    if (pr->shown) {
        fprintf(stderr, "\r%-60s\r", "");
        fflush(stderr);
    }
    pr->shown = 0;
}

/* xoshiro256** seeded through splitmix64: small, fast, good enough for test inputs. */
typedef struct rng {
    uint64_t s[4];
} rng;

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One independent stream per (seed, tensor, chunk), so a chunk's values do not depend on
 * which thread fills it. */
static rng rng_make(uint64_t seed, uint64_t stream, uint64_t chunk)
{
    uint64_t st = seed;
    uint64_t key = splitmix64(&st);
    st = key ^ (stream * 0xD1B54A32D192ED03ull);
    key = splitmix64(&st);
    st = key ^ (chunk * 0x8CB92BA72F3D8DD7ull);
    rng r;
    for (int i = 0; i < 4; ++i)
        r.s[i] = splitmix64(&st);
    return r;
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng *r)
{
    uint64_t *s = r->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* [0, 1) on the float grid of 2^-24, like torch.rand. */
static float rng_uniform_f32(rng *r) { return (float)(rng_next(r) >> 40) * 0x1.0p-24f; }

static double rng_uniform_f64(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* Box-Muller; u1 in (0, 1] keeps the log finite. */
static double rng_normal(rng *r)
{
    double u1 = (double)((rng_next(r) >> 11) + 1) * 0x1.0p-53;
    double u2 = rng_uniform_f64(r);
    return sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2);
}

enum { STREAM_X = 1, STREAM_WEIGHT = 2, STREAM_CONV_BIAS = 3, STREAM_BIAS = 4 };
#define FILL_CHUNK ((int64_t)1 << 16)

static void fill_x(float *x, int64_t n, uint64_t seed, int threads)
{
    const int64_t chunks = (n + FILL_CHUNK - 1) / FILL_CHUNK;
    /* The library's thread cap: OMP_NUM_THREADS=100000 would otherwise kill the runtime here. */
    const int nt = convpool_cpu_thread_count(threads);
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
        rng r = rng_make(seed, STREAM_X, (uint64_t)c);
        const int64_t end = c * FILL_CHUNK + FILL_CHUNK < n ? c * FILL_CHUNK + FILL_CHUNK : n;
        for (int64_t i = c * FILL_CHUNK; i < end; ++i)
            x[i] = rng_uniform_f32(&r);
    }
}

typedef struct host_buffers {
    float *x, *weight, *conv_bias, *bias; /* inputs */
    float *pooled, *out;                  /* outputs of the timed path */
} host_buffers;

static void format_bytes(double bytes, char *buf, size_t n)
{
    if (bytes >= 1e9)
        snprintf(buf, n, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6)
        snprintf(buf, n, "%.1f MB", bytes / 1e6);
    else if (bytes >= 1e3)
        snprintf(buf, n, "%.1f kB", bytes / 1e3);
    else
        snprintf(buf, n, "%.0f B", bytes);
}

static void *host_alloc(int64_t count, size_t elem, const char *what)
{
    if (count < 1)
        count = 1;
    if ((uint64_t)count > SIZE_MAX / elem) {
        fprintf(stderr, "convpool: out of memory: %s needs %lld elements of %zu bytes\n", what,
                (long long)count, elem);
        return NULL;
    }
    size_t bytes = (size_t)count * elem;
    void *ptr = malloc(bytes);
    if (!ptr) {
        char size[32];
        format_bytes((double)bytes, size, sizeof size);
        fprintf(stderr, "convpool: out of memory allocating %s (%s)\n", what, size);
    }
    return ptr;
}

static void host_buffers_free(host_buffers *h)
{
    free(h->x);
    free(h->weight);
    free(h->conv_bias);
    free(h->bias);
    free(h->pooled);
    free(h->out);
    memset(h, 0, sizeof *h);
}

/* Returns 0, or 1 when out of memory (message printed). */
static int host_buffers_alloc(host_buffers *h, const convpool_problem *p)
{
    memset(h, 0, sizeof *h);
    h->x = (float *)host_alloc(convpool_x_numel(p), sizeof(float), "x");
    if (h->x)
        h->weight = (float *)host_alloc(convpool_weight_numel(p), sizeof(float), "weight");
    if (h->weight)
        h->conv_bias = (float *)host_alloc(p->out_channels, sizeof(float), "conv_bias");
    if (h->conv_bias)
        h->bias = (float *)host_alloc(p->out_channels, sizeof(float), "bias");
    if (h->bias)
        h->pooled = (float *)host_alloc(p->batch * p->out_channels, sizeof(float), "pooled");
    if (h->pooled)
        h->out = (float *)host_alloc(p->batch, sizeof(float), "out");
    if (!h->out) {
        host_buffers_free(h);
        return 1;
    }
    return 0;
}

/* nn.Conv3d's initialisation: kaiming_uniform(a = sqrt(5)) gives weight and conv bias both
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels * kernel volume. bias is
 * torch.randn. The stream differs from torch's; the distributions match. */
static void fill_inputs(host_buffers *h, const convpool_problem *p, uint64_t seed, int threads)
{
    const int64_t fan_in = p->in_channels * p->kernel_d * p->kernel_h * p->kernel_w;
    const double bound = 1.0 / sqrt((double)fan_in);
    fill_x(h->x, convpool_x_numel(p), seed, threads);
    rng r = rng_make(seed, STREAM_WEIGHT, 0);
    for (int64_t i = 0; i < convpool_weight_numel(p); ++i)
        h->weight[i] = (float)(bound * (2.0 * rng_uniform_f64(&r) - 1.0));
    r = rng_make(seed, STREAM_CONV_BIAS, 0);
    for (int64_t c = 0; c < p->out_channels; ++c)
        h->conv_bias[c] = (float)(bound * (2.0 * rng_uniform_f64(&r) - 1.0));
    r = rng_make(seed, STREAM_BIAS, 0);
    for (int64_t c = 0; c < p->out_channels; ++c)
        h->bias[c] = (float)rng_normal(&r);
}

/* ------------------------------------------------------------------------------------ */
/* Devices and runs                                                                     */
/* ------------------------------------------------------------------------------------ */

typedef struct device_info {
    int is_cuda;
    int cores, threads; /* CPU */
    char name[256];     /* GPU */
    int sm_count, cc_major, cc_minor;
    double memory_gib;
    size_t workspace_bytes;
    convpool_precision precision;
} device_info;

typedef struct timing {
    int64_t iters, warmup;
    double *ms; /* iters entries, in run order */
    double median_ms, min_ms, max_ms, gflops;
} timing;

static int status_exit_code(convpool_status s)
{
    return s == CONVPOOL_ERR_OUT_OF_MEMORY || s == CONVPOOL_ERR_CUDA ? 1 : EXIT_USAGE;
}

static int library_failure(const char *call, convpool_status s)
{
    fprintf(stderr, "convpool: %s: %s (%s)\n", call, convpool_last_error(),
            convpool_status_name(s));
    return status_exit_code(s);
}

static void query_cpu(device_info *dev, int64_t threads)
{
    memset(dev, 0, sizeof *dev);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    dev->cores = cores > 0 ? (int)cores : 1;
    /* What the library starts (at most), not what was asked: it caps the count. */
    dev->threads = convpool_cpu_thread_count((int)threads);
}

static int run_cpu(const convpool_problem *p, const host_buffers *h, int threads, timing *t)
{
    progress pr;
    /* Expect ~10 GFLOP/s per thread: only decides whether progress shows from the start. */
    const double expect_s =
        convpool_problem_flops(p) * (double)t->iters / (1e10 * (double)(threads > 0 ? threads : 1));
    /* NaN outputs first: a value the path never writes fails the check. */
    for (int64_t i = 0; i < p->batch * p->out_channels; ++i)
        h->pooled[i] = NAN;
    for (int64_t b = 0; b < p->batch; ++b)
        h->out[b] = NAN;
    progress_begin(&pr, "running", expect_s);
    for (int64_t i = 0; i < t->iters; ++i) {
        progress_step(&pr, i, t->iters);
        const double t0 = now_s();
        convpool_status s = convpool_forward_cpu(p, h->x, h->weight, h->conv_bias, h->bias,
                                                 h->pooled, h->out, threads);
        const double t1 = now_s();
        if (s != CONVPOOL_OK) {
            progress_end(&pr);
            return library_failure("convpool_forward_cpu", s);
        }
        t->ms[i] = (t1 - t0) * 1e3;
    }
    progress_end(&pr);
    return 0;
}

#ifdef CONVPOOL_HAVE_CUDA

static void cuda_fail(cudaError_t err, const char *stmt, const char *file, int line)
{
    if (err == cudaErrorMemoryAllocation)
        fprintf(stderr, "convpool: out of GPU memory: %s (%s:%d)\n", stmt, file, line);
    else
        fprintf(stderr, "convpool: CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(err),
                cudaGetErrorString(err), file, line, stmt);
    exit(1);
}

#define CUDA_CHECK(stmt)                                                                           \
    do {                                                                                           \
        cudaError_t cuda_err_ = (stmt);                                                            \
        if (cuda_err_ != cudaSuccess)                                                              \
            cuda_fail(cuda_err_, #stmt, __FILE__, __LINE__);                                       \
    } while (0)

static void query_cuda(device_info *dev, convpool_precision precision)
{
    int id;
    struct cudaDeviceProp prop;
    memset(dev, 0, sizeof *dev);
    CUDA_CHECK(cudaGetDevice(&id));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, id));
    dev->is_cuda = 1;
    snprintf(dev->name, sizeof dev->name, "%s", prop.name);
    dev->sm_count = prop.multiProcessorCount;
    dev->cc_major = prop.major;
    dev->cc_minor = prop.minor;
    dev->memory_gib = (double)prop.totalGlobalMem / (double)(1ull << 30);
    dev->precision = precision;
}

static int run_cuda(const convpool_problem *p, const host_buffers *h, device_info *dev, timing *t)
{
    const size_t x_bytes = (size_t)convpool_x_numel(p) * sizeof(float);
    const size_t w_bytes = (size_t)convpool_weight_numel(p) * sizeof(float);
    const size_t c_bytes = (size_t)p->out_channels * sizeof(float);
    const size_t pooled_bytes = (size_t)(p->batch * p->out_channels) * sizeof(float);
    const size_t out_bytes = (size_t)p->batch * sizeof(float);
    size_t ws_bytes = 0;
    convpool_status s =
        convpool_cuda_workspace_size(p, dev->precision, CONVPOOL_DTYPE_F32, &ws_bytes);
    if (s != CONVPOOL_OK)
        return library_failure("convpool_cuda_workspace_size", s);
    dev->workspace_bytes = ws_bytes;

    float *d_x, *d_weight, *d_conv_bias, *d_bias, *d_pooled, *d_out;
    void *d_ws = NULL;
    cudaStream_t stream;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaMalloc((void **)&d_x, x_bytes));
    CUDA_CHECK(cudaMalloc((void **)&d_weight, w_bytes));
    CUDA_CHECK(cudaMalloc((void **)&d_conv_bias, c_bytes));
    CUDA_CHECK(cudaMalloc((void **)&d_bias, c_bytes));
    CUDA_CHECK(cudaMalloc((void **)&d_pooled, pooled_bytes));
    CUDA_CHECK(cudaMalloc((void **)&d_out, out_bytes));
    if (ws_bytes > 0)
        CUDA_CHECK(cudaMalloc(&d_ws, ws_bytes));
    CUDA_CHECK(cudaMemcpyAsync(d_x, h->x, x_bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(d_weight, h->weight, w_bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(d_conv_bias, h->conv_bias, c_bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(d_bias, h->bias, c_bytes, cudaMemcpyHostToDevice, stream));
    /* All-ones bytes are NaN floats: an output the kernel never writes fails the check. */
    CUDA_CHECK(cudaMemsetAsync(d_pooled, 0xFF, pooled_bytes, stream));
    CUDA_CHECK(cudaMemsetAsync(d_out, 0xFF, out_bytes, stream));

    /* x alone is far larger than L2 for the headline, so runs are not flushed here; the
     * benchmarks (bench/) flush L2 for their published numbers. */
    int rc = 0;
    progress pr;
    progress_begin(&pr, "running", 0.0);
    const int64_t total = t->warmup + t->iters;
    for (int64_t i = 0; i < total; ++i) {
        const int timed = i >= t->warmup;
        progress_step(&pr, i, total);
        if (timed)
            CUDA_CHECK(cudaEventRecord(start, stream));
        s = convpool_forward_cuda(p, dev->precision, CONVPOOL_DTYPE_F32, d_x, d_weight, d_conv_bias,
                                  d_bias, d_pooled, d_out, d_ws, ws_bytes, (void *)stream);
        if (s != CONVPOOL_OK) {
            rc = library_failure("convpool_forward_cuda", s);
            break;
        }
        if (timed) {
            float ms = 0.0f;
            CUDA_CHECK(cudaEventRecord(stop, stream));
            CUDA_CHECK(cudaEventSynchronize(stop));
            CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
            t->ms[i - t->warmup] = (double)ms;
        } else {
            CUDA_CHECK(cudaStreamSynchronize(stream));
        }
    }
    progress_end(&pr);
    if (rc == 0) {
        CUDA_CHECK(
            cudaMemcpyAsync(h->pooled, d_pooled, pooled_bytes, cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaMemcpyAsync(h->out, d_out, out_bytes, cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    CUDA_CHECK(cudaFree(d_ws));
    CUDA_CHECK(cudaFree(d_out));
    CUDA_CHECK(cudaFree(d_pooled));
    CUDA_CHECK(cudaFree(d_bias));
    CUDA_CHECK(cudaFree(d_conv_bias));
    CUDA_CHECK(cudaFree(d_weight));
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaStreamDestroy(stream));
    return rc;
}

#endif /* CONVPOOL_HAVE_CUDA */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void timing_finish(timing *t, const convpool_problem *p)
{
    double *sorted = (double *)malloc((size_t)t->iters * sizeof(double));
    if (!sorted) {
        t->median_ms = t->min_ms = t->max_ms = t->ms[0];
    } else {
        memcpy(sorted, t->ms, (size_t)t->iters * sizeof(double));
        qsort(sorted, (size_t)t->iters, sizeof(double), cmp_double);
        const int64_t m = t->iters / 2;
        t->median_ms = t->iters % 2 ? sorted[m] : 0.5 * (sorted[m - 1] + sorted[m]);
        t->min_ms = sorted[0];
        t->max_ms = sorted[t->iters - 1];
        free(sorted);
    }
    t->gflops = t->median_ms > 0.0 ? convpool_problem_flops(p) / (t->median_ms * 1e-3) / 1e9 : 0.0;
}

/* ------------------------------------------------------------------------------------ */
/* Check against the reference                                                          */
/* ------------------------------------------------------------------------------------ */

typedef struct mismatch {
    int64_t item, channel; /* channel -1: out[item] */
    double got, ref, tol;
} mismatch;

typedef struct check_result {
    int64_t n_items;
    int64_t *items;
    double u_op, u_acc; /* unit roundoffs of the conv's products and of its accumulation */
    double rel_pooled, rel_out;
    double atol_max; /* largest absolute tolerance used for a P value */
    int64_t compared, mismatches;
    double max_abs, max_rel, worst_ratio; /* worst |err| / tol */
    mismatch shown[MISMATCHES_SHOWN];
    int n_shown;
    int pass;
} check_result;

/* Items spread evenly over the batch, always including the last. */
static int64_t *check_items(int64_t batch, int64_t n)
{
    int64_t *items = (int64_t *)malloc((size_t)n * sizeof(int64_t));
    if (!items)
        return NULL;
    if (n == 1)
        items[0] = batch - 1;
    else
        for (int64_t k = 0; k < n; ++k)
            items[k] = k * (batch - 1) / (n - 1);
    return items;
}

/* Scale of |got - ref| a conv value divided by d may carry: the absolute tolerance is
 * linear in 1/|d|. d = 0 makes every value +-inf or NaN, which are compared exactly; so
 * does d = +-inf (every value 0) and d = NaN. */
static double inv_abs_divisor(double d)
{
    if (d == 0.0)
        return INFINITY;
    if (!isfinite(d))
        return 0.0;
    return 1.0 / fabs(d);
}

static void compare_value(check_result *c, int64_t item, int64_t channel, double got, double ref,
                          double tol)
{
    int ok;
    double err = 0.0;
    c->compared++;
    if (isnan(ref) || isnan(got)) {
        ok = isnan(ref) && isnan(got);
    } else if (isinf(ref) || isinf(got)) {
        ok = got == ref;
    } else {
        err = fabs(got - ref);
        ok = err <= tol;
        if (err > c->max_abs)
            c->max_abs = err;
        if (ref != 0.0 && err / fabs(ref) > c->max_rel)
            c->max_rel = err / fabs(ref);
        if (tol > 0.0 && err / tol > c->worst_ratio)
            c->worst_ratio = err / tol;
        else if (tol == 0.0 && err > 0.0)
            c->worst_ratio = INFINITY;
    }
    if (!ok) {
        c->mismatches++;
        if (c->n_shown < MISMATCHES_SHOWN) {
            mismatch *m = &c->shown[c->n_shown++];
            m->item = item;
            m->channel = channel;
            m->got = got;
            m->ref = ref;
            m->tol = tol;
        }
    }
}

/*
 * Tolerance. A conv value y_c = sum over taps of x*w + cb_c; with |x| <= X, its float
 * error has two parts:
 *   - rounding of the operands/products, relative u_op each, independent and unbiased, so
 *     they add like a random walk: ~ u_op * sqrt(sum (x w)^2) <= u_op * X * ||w_c||_2.
 *     TF32 operands (10-bit mantissa, round to nearest): u_op = 2^-11. FP32: 2^-24; GPU
 *     strict gets 2^-22 so a 3xTF32 split that drops the small*small term still fits.
 *   - FP32 accumulation over taps = Cin*kd*kh*kw terms: the probabilistic bound
 *     u_acc * sqrt(taps) * sum |terms| <= u_acc * sqrt(taps) * (X * ||w_c||_1 + |cb_c|).
 * Times 8 for margin (about 10 standard deviations of the first part) and divided by
 * |divisor|. Max-pooling and the mean cannot make an error larger than the largest one.
 * On top, the float mean over the pooled positions and the float sum over channels:
 * rel = 1e-6 + 4 * 2^-24 * sqrt(count) relative to the result.
 * P[b][c]:  tol = atol_c + rel_pooled * |ref|
 * out[b]:   tol = sum_c (atol_c + rel_pooled * |P_c|) + rel_out * sum_c |P_c + bias_c|
 * For the headline (X = 1, ||w_c||_1 ~ 7.3, ||w_c||_2 ~ 0.58, d = 2) atol_c is ~3e-5 on
 * CPU / GPU strict and ~1e-3 for TF32; P is of order 0.1. A conv tap or pooling window
 * off by one moves P by ~5e-4 on random data, caught by the CPU and strict bounds; the
 * TF32 bound only catches grosser errors, so validate a GPU kernel with --precision strict.
 */
static int run_check(const convpool_problem *p, const host_buffers *h, const device_info *dev,
                     int64_t n_items, check_result *c)
{
    const int64_t cout = p->out_channels;
    const int64_t taps = p->in_channels * p->kernel_d * p->kernel_h * p->kernel_w;
    const int64_t item_numel = convpool_x_numel(p) / p->batch;
    const double inv_d = inv_abs_divisor(p->divisor);
    const int tf32 = dev->is_cuda && dev->precision == CONVPOOL_PRECISION_TF32;

    memset(c, 0, sizeof *c);
    c->pass = 1;
    c->n_items = n_items;
    c->u_op = tf32 ? 0x1.0p-11 : dev->is_cuda ? 0x1.0p-22 : 0x1.0p-24;
    c->u_acc = 0x1.0p-24;
    c->rel_pooled =
        1e-6 + 4.0 * 0x1.0p-24 * sqrt((double)(p->pooled_d * p->pooled_h * p->pooled_w));
    c->rel_out = 1e-6 + 4.0 * 0x1.0p-24 * sqrt((double)cout);
    if (n_items == 0)
        return 0;

    c->items = check_items(p->batch, n_items);
    double *w_l1 = (double *)malloc((size_t)cout * sizeof(double));
    double *w_l2 = (double *)malloc((size_t)cout * sizeof(double));
    float *ref_pooled = (float *)malloc((size_t)cout * sizeof(float));
    if (!c->items || !w_l1 || !w_l2 || !ref_pooled) {
        free(w_l1);
        free(w_l2);
        free(ref_pooled);
        fprintf(stderr, "convpool: out of memory setting up the reference check\n");
        return 1;
    }
    for (int64_t co = 0; co < cout; ++co) {
        double s1 = 0.0, s2 = 0.0;
        for (int64_t t = 0; t < taps; ++t) {
            const double w = (double)h->weight[co * taps + t];
            s1 += fabs(w);
            s2 += w * w;
        }
        w_l1[co] = s1;
        w_l2[co] = sqrt(s2);
    }

    /* Each item is checked as a batch-1 problem whose x points into the full batch. */
    convpool_problem one = *p;
    one.batch = 1;
    int rc = 0;
    progress pr;
    const double item_flops = convpool_problem_flops(p) / (double)p->batch;
    progress_begin(&pr, "checking", item_flops * (double)n_items / 1e9); /* ~1 GFLOP/s */
    for (int64_t k = 0; k < n_items; ++k) {
        const int64_t b = c->items[k];
        const float *xb = h->x + b * item_numel;
        float ref_out = 0.0f;
        progress_step(&pr, k, n_items);
        const convpool_status s = convpool_forward_reference(&one, xb, h->weight, h->conv_bias,
                                                             h->bias, ref_pooled, &ref_out);
        if (s != CONVPOOL_OK) {
            rc = library_failure("convpool_forward_reference", s);
            break;
        }
        double xmax = 0.0;
        for (int64_t i = 0; i < item_numel; ++i)
            if (fabs((double)xb[i]) > xmax)
                xmax = fabs((double)xb[i]);

        double out_atol = 0.0, out_mag = 0.0;
        for (int64_t co = 0; co < cout; ++co) {
            const double conv_err =
                c->u_op * xmax * w_l2[co] +
                c->u_acc * sqrt((double)taps) * (xmax * w_l1[co] + fabs((double)h->conv_bias[co]));
            /* 0 * inf is NaN: an exact-zero error scale stays exact. */
            /* Floor: a float32 result in the subnormal range is spaced 2^-149 apart whatever its
             * relative precision, so a correct one can be off by a few such steps. */
            const double atol = (conv_err == 0.0 ? 0.0 : 8.0 * conv_err * inv_d) + TOL_FLOOR;
            const double ref = (double)ref_pooled[co];
            if (atol > c->atol_max)
                c->atol_max = atol;
            compare_value(c, b, co, (double)h->pooled[b * cout + co], ref,
                          atol + c->rel_pooled * fabs(ref));
            out_atol += atol + c->rel_pooled * fabs(ref);
            out_mag += fabs(ref + (double)h->bias[co]);
        }
        compare_value(c, b, -1, (double)h->out[b], (double)ref_out,
                      out_atol + c->rel_out * out_mag);
    }
    progress_end(&pr);
    free(w_l1);
    free(w_l2);
    free(ref_pooled);
    c->pass = rc == 0 && c->mismatches == 0;
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Report                                                                               */
/* ------------------------------------------------------------------------------------ */

typedef struct summary {
    double out_sum, out_abs, pooled_sum, pooled_abs;
} summary;

static summary summarise(const convpool_problem *p, const host_buffers *h)
{
    summary s;
    memset(&s, 0, sizeof s);
    for (int64_t b = 0; b < p->batch; ++b) {
        s.out_sum += (double)h->out[b];
        s.out_abs += fabs((double)h->out[b]);
    }
    for (int64_t i = 0; i < p->batch * p->out_channels; ++i) {
        s.pooled_sum += (double)h->pooled[i];
        s.pooled_abs += fabs((double)h->pooled[i]);
    }
    return s;
}

static void format_ms(double ms, char *buf, size_t n)
{
    if (ms >= 1000.0)
        snprintf(buf, n, "%.3f s", ms / 1e3);
    else if (ms >= 1.0)
        snprintf(buf, n, "%.3f ms", ms);
    else
        snprintf(buf, n, "%.2f us", ms * 1e3);
}

static const char *tol_formula = "|got-ref| <= 8*(u_op*max|x|*||w_c||_2 + "
                                 "u_acc*sqrt(taps)*(max|x|*||w_c||_1 + |cb_c|))/|divisor|"
                                 " + rel*|ref| + 8*2^-149";

static void text_header(const convpool_problem *p, const device_info *dev, const options *o)
{
    char xb[32];
    format_bytes((double)convpool_x_numel(p) * 4.0, xb, sizeof xb);
    printf(
        "convpool %d.%d.%d: conv3d -> /divisor -> max_pool3d -> global mean -> +bias -> sum over "
        "channels\n",
        CONVPOOL_VERSION_MAJOR, CONVPOOL_VERSION_MINOR, CONVPOOL_VERSION_PATCH);
    printf("problem  x [%lld, %lld, %lld, %lld, %lld], weight [%lld, %lld, %lld, %lld, %lld], "
           "pool %lldx%lldx%lld, divisor %g\n",
           (long long)p->batch, (long long)p->in_channels, (long long)p->in_d, (long long)p->in_h,
           (long long)p->in_w, (long long)p->out_channels, (long long)p->in_channels,
           (long long)p->kernel_d, (long long)p->kernel_h, (long long)p->kernel_w,
           (long long)p->pool_d, (long long)p->pool_h, (long long)p->pool_w, p->divisor);
    printf(
        "         conv %lldx%lldx%lld -> pooled %lldx%lldx%lld -> P [%lld, %lld] -> out [%lld]\n",
        (long long)p->conv_d, (long long)p->conv_h, (long long)p->conv_w, (long long)p->pooled_d,
        (long long)p->pooled_h, (long long)p->pooled_w, (long long)p->batch,
        (long long)p->out_channels, (long long)p->batch);
    printf("         %.4g GFLOP (2 x conv multiply-adds), x %s float32, seed %llu\n",
           convpool_problem_flops(p) / 1e9, xb, (unsigned long long)o->seed);
    if (o->input || o->weights)
        printf("files    x %s%s, weights %s%s\n", o->input ? "from " : "random", o->input ? o->input : "",
               o->weights ? "from " : "random", o->weights ? o->weights : "");
    if (dev->is_cuda) {
        printf("device   GPU %s: sm_%d%d, %d SMs, %.1f GiB; precision %s\n", dev->name,
               dev->cc_major, dev->cc_minor, dev->sm_count, dev->memory_gib,
               precision_names[dev->precision]);
        convpool_cuda_plan plan;
        if (convpool_cuda_plan_make(p, dev->precision, CONVPOOL_DTYPE_F32, &plan) == CONVPOOL_OK)
            printf("plan     %s\n", plan.description);
    }
    else
        printf("device   CPU: %d core%s, %d thread%s; fused float32 path\n", dev->cores,
               dev->cores == 1 ? "" : "s", dev->threads, dev->threads == 1 ? "" : "s");
    fflush(stdout);
}

static void text_results(const convpool_problem *p, const host_buffers *h, const timing *t,
                         const check_result *c)
{
    const summary s = summarise(p, h);
    const int64_t shown = p->batch < OUT_VALUES_SHOWN ? p->batch : OUT_VALUES_SHOWN;
    printf("output   out[0:%lld] =", (long long)shown);
    for (int64_t b = 0; b < shown; ++b)
        printf(" %.7g", (double)h->out[b]);
    printf("%s\n", shown < p->batch ? " ..." : "");
    printf("         sum(out) %.9g, sum|out| %.9g; sum(P) %.9g, sum|P| %.9g\n", s.out_sum,
           s.out_abs, s.pooled_sum, s.pooled_abs);
    char med[32], lo[32], hi[32];
    format_ms(t->median_ms, med, sizeof med);
    format_ms(t->min_ms, lo, sizeof lo);
    format_ms(t->max_ms, hi, sizeof hi);
    printf("time     median %s over %lld runs%s (min %s, max %s) -> %.4g GFLOP/s\n", med,
           (long long)t->iters, t->warmup ? " after warm-up" : "", lo, hi, t->gflops);
    if (c->n_items == 0) {
        printf("check    skipped (--check-batch 0)\n");
        return;
    }
    printf("check    vs convpool_forward_reference (float64), batch items");
    for (int64_t k = 0; k < c->n_items; ++k) {
        if (k == 6 && c->n_items > 8) {
            printf(" ... %lld", (long long)c->items[c->n_items - 1]);
            break;
        }
        printf("%s %lld", k ? "," : "", (long long)c->items[k]);
    }
    printf(": %lld values\n", (long long)c->compared);
    printf("         max abs err %.3g, max rel err %.3g, worst err/tol %.3g\n", c->max_abs,
           c->max_rel, c->worst_ratio);
    printf("         tolerance %s\n", tol_formula);
    printf("         u_op 2^%d, u_acc 2^%d, atol up to %.3g, rel %.3g (P) / %.3g (out)\n",
           (int)lround(log2(c->u_op)), (int)lround(log2(c->u_acc)), c->atol_max, c->rel_pooled,
           c->rel_out);
    for (int i = 0; i < c->n_shown; ++i) {
        const mismatch *m = &c->shown[i];
        if (m->channel < 0)
            printf("         mismatch out[%lld]: got %.9g, ref %.9g, tol %.3g\n",
                   (long long)m->item, m->got, m->ref, m->tol);
        else
            printf("         mismatch P[%lld][%lld]: got %.9g, ref %.9g, tol %.3g\n",
                   (long long)m->item, (long long)m->channel, m->got, m->ref, m->tol);
    }
    if (c->pass)
        printf("result   PASS\n");
    else
        printf("result   FAIL: %lld of %lld values outside the tolerance\n",
               (long long)c->mismatches, (long long)c->compared);
}

#if CONVPOOL_CLI_CJSON
/* --json, built with cJSON. JSON has no inf or NaN: they become null (the divisor a string). */
static cJSON *json_num(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static cJSON *json_triple(int64_t a, int64_t b, int64_t c)
{
    const double v[3] = {(double)a, (double)b, (double)c};
    return cJSON_CreateDoubleArray(v, 3);
}

static void json_report(const convpool_problem *p, const device_info *dev, const options *o,
                        const host_buffers *h, const timing *t, const check_result *c)
{
    const summary s = summarise(p, h);
    char text[64];
    cJSON *root = cJSON_CreateObject();
    snprintf(text, sizeof text, "%d.%d.%d", CONVPOOL_VERSION_MAJOR, CONVPOOL_VERSION_MINOR, CONVPOOL_VERSION_PATCH);
    cJSON_AddStringToObject(root, "version", text);

    cJSON *pr = cJSON_AddObjectToObject(root, "problem");
    cJSON_AddNumberToObject(pr, "batch", (double)p->batch);
    cJSON_AddNumberToObject(pr, "in_channels", (double)p->in_channels);
    cJSON_AddNumberToObject(pr, "out_channels", (double)p->out_channels);
    cJSON_AddItemToObject(pr, "input", json_triple(p->in_d, p->in_h, p->in_w));
    cJSON_AddItemToObject(pr, "kernel", json_triple(p->kernel_d, p->kernel_h, p->kernel_w));
    cJSON_AddItemToObject(pr, "pool", json_triple(p->pool_d, p->pool_h, p->pool_w));
    if (isfinite(p->divisor))
        cJSON_AddNumberToObject(pr, "divisor", p->divisor);
    else
        cJSON_AddStringToObject(pr, "divisor", isnan(p->divisor) ? "nan" : p->divisor > 0 ? "inf" : "-inf");
    cJSON_AddItemToObject(pr, "conv", json_triple(p->conv_d, p->conv_h, p->conv_w));
    cJSON_AddItemToObject(pr, "pooled", json_triple(p->pooled_d, p->pooled_h, p->pooled_w));
    cJSON_AddNumberToObject(pr, "flops", convpool_problem_flops(p));
    cJSON_AddNumberToObject(pr, "x_bytes", (double)convpool_x_numel(p) * 4.0);
    cJSON_AddNumberToObject(pr, "seed", (double)o->seed);
    cJSON_AddItemToObject(pr, "input_file", o->input ? cJSON_CreateString(o->input) : cJSON_CreateNull());
    cJSON_AddItemToObject(pr, "weights_file", o->weights ? cJSON_CreateString(o->weights) : cJSON_CreateNull());

    cJSON *dv = cJSON_AddObjectToObject(root, "device");
    if (dev->is_cuda) {
        cJSON_AddStringToObject(dv, "type", "cuda");
        cJSON_AddStringToObject(dv, "name", dev->name);
        snprintf(text, sizeof text, "%d.%d", dev->cc_major, dev->cc_minor);
        cJSON_AddStringToObject(dv, "compute_capability", text);
        cJSON_AddNumberToObject(dv, "sm_count", dev->sm_count);
        cJSON_AddNumberToObject(dv, "memory_gib", dev->memory_gib);
        cJSON_AddStringToObject(dv, "precision", precision_names[dev->precision]);
        cJSON_AddNumberToObject(dv, "workspace_bytes", (double)dev->workspace_bytes);
    } else {
        cJSON_AddStringToObject(dv, "type", "cpu");
        cJSON_AddNumberToObject(dv, "cores", dev->cores);
        cJSON_AddNumberToObject(dv, "threads", dev->threads);
    }

    cJSON *out = cJSON_AddObjectToObject(root, "output");
    cJSON *first = cJSON_AddArrayToObject(out, "out_first");
    const int64_t shown = p->batch < OUT_VALUES_SHOWN ? p->batch : OUT_VALUES_SHOWN;
    for (int64_t b = 0; b < shown; ++b)
        cJSON_AddItemToArray(first, json_num((double)h->out[b]));
    cJSON_AddItemToObject(out, "out_sum", json_num(s.out_sum));
    cJSON_AddItemToObject(out, "out_abs_sum", json_num(s.out_abs));
    cJSON_AddItemToObject(out, "pooled_sum", json_num(s.pooled_sum));
    cJSON_AddItemToObject(out, "pooled_abs_sum", json_num(s.pooled_abs));

    cJSON *tm = cJSON_AddObjectToObject(root, "timing");
    cJSON_AddNumberToObject(tm, "iters", (double)t->iters);
    cJSON_AddNumberToObject(tm, "warmup", (double)t->warmup);
    cJSON_AddItemToObject(tm, "median_ms", json_num(t->median_ms));
    cJSON_AddItemToObject(tm, "min_ms", json_num(t->min_ms));
    cJSON_AddItemToObject(tm, "max_ms", json_num(t->max_ms));
    cJSON_AddItemToObject(tm, "gflops", json_num(t->gflops));
    cJSON *times = cJSON_AddArrayToObject(tm, "times_ms");
    for (int64_t i = 0; i < t->iters; ++i)
        cJSON_AddItemToArray(times, json_num(t->ms[i]));

    cJSON *ck = cJSON_AddObjectToObject(root, "check");
    cJSON_AddStringToObject(ck, "reference", "convpool_forward_reference");
    cJSON *items = cJSON_AddArrayToObject(ck, "items");
    for (int64_t k = 0; k < c->n_items; ++k)
        cJSON_AddItemToArray(items, cJSON_CreateNumber((double)c->items[k]));
    cJSON_AddNumberToObject(ck, "compared", (double)c->compared);
    cJSON_AddNumberToObject(ck, "mismatches", (double)c->mismatches);
    cJSON_AddItemToObject(ck, "max_abs_err", json_num(c->max_abs));
    cJSON_AddItemToObject(ck, "max_rel_err", json_num(c->max_rel));
    cJSON_AddItemToObject(ck, "worst_err_over_tol", json_num(c->worst_ratio));
    cJSON *tol = cJSON_AddObjectToObject(ck, "tolerance");
    cJSON_AddStringToObject(tol, "formula", tol_formula);
    cJSON_AddNumberToObject(tol, "u_op", c->u_op);
    cJSON_AddNumberToObject(tol, "u_acc", c->u_acc);
    cJSON_AddItemToObject(tol, "atol_max", json_num(c->atol_max));
    cJSON_AddNumberToObject(tol, "rel_pooled", c->rel_pooled);
    cJSON_AddNumberToObject(tol, "rel_out", c->rel_out);
    cJSON *mm = cJSON_AddArrayToObject(ck, "first_mismatches");
    for (int i = 0; i < c->n_shown; ++i) {
        const mismatch *m = &c->shown[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "item", (double)m->item);
        if (m->channel < 0)
            snprintf(text, sizeof text, "out");
        else
            snprintf(text, sizeof text, "P[%lld]", (long long)m->channel);
        cJSON_AddStringToObject(e, "value", text);
        cJSON_AddItemToObject(e, "got", json_num(m->got));
        cJSON_AddItemToObject(e, "ref", json_num(m->ref));
        cJSON_AddItemToObject(e, "tol", json_num(m->tol));
        cJSON_AddItemToArray(mm, e);
    }
    cJSON_AddStringToObject(ck, "result", c->n_items == 0 ? "SKIPPED" : c->pass ? "PASS" : "FAIL");
    cJSON_AddStringToObject(root, "result", c->pass ? "PASS" : "FAIL");

    char *txt = cJSON_Print(root);
    if (txt) {
        puts(txt);
        cJSON_free(txt);
    }
    cJSON_Delete(root);
}
#endif

/* ------------------------------------------------------------------------------------ */
/* main                                                                                 */
/* ------------------------------------------------------------------------------------ */

/* Picks the device; returns 0, or the exit status after printing why. */
/* ------------------------------------------------------------------------------------ */
/* Files                                                                                */
/* ------------------------------------------------------------------------------------ */

#if CONVPOOL_CLI_CJSON
typedef struct files {
    cp_array x;
    cp_model_tensors t;
} files;

static void files_free(files *f)
{
    cp_array_free(&f->x);
    cp_model_tensors_free(&f->t);
}

/* A size the file fixes: an explicit flag that disagrees is an error naming both. */
static int take_size(options *o, unsigned bit, const char *flag, int64_t *field, int64_t value, const char *file,
                     const char *what)
{
    if ((o->given & bit) && *field != value) {
        fprintf(stderr, "convpool: --%s %lld disagrees with %s, whose %s is %lld\n", flag, (long long)*field, file,
                what, (long long)value);
        return EXIT_USAGE;
    }
    *field = value;
    return 0;
}

static int file_error(const char *msg)
{
    fprintf(stderr, "convpool: %s\n", msg);
    return EXIT_USAGE;
}

/* Reads --input and --weights and sets the problem sizes from them. Returns 0 or an exit
 * status (one line printed). */
/* An array's shape as "d0, d1, ..." for messages. */
static void shape_text(const cp_array *a, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < a->ndim && used < n; ++i)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
}

static int load_files(options *o, files *f)
{
    char err[512];
    memset(f, 0, sizeof *f);
    if (o->input) {
        if (cp_npy_read(o->input, &f->x, err, sizeof err))
            return file_error(err);
        const cp_array *x = &f->x;
        if (x->ndim != 4 && x->ndim != 5) {
            fprintf(stderr, "convpool: %s: x must be 5-D (N, Cin, D, H, W) or 4-D (Cin, D, H, W), got %d-D\n",
                    o->input, x->ndim);
            return EXIT_USAGE;
        }
        for (int i = 0; i < x->ndim; ++i)
            if (x->shape[i] < 1) {
                fprintf(stderr, "convpool: %s: x has an empty dimension (dim %d is %lld)\n", o->input, i,
                        (long long)x->shape[i]);
                return EXIT_USAGE;
            }
        const int64_t *sh = x->shape + (x->ndim - 4);
        int rc = take_size(o, GIVEN_BATCH, "batch", &o->batch, x->ndim == 5 ? x->shape[0] : 1, o->input,
                           "batch (dim 0)");
        if (!rc)
            rc = take_size(o, GIVEN_CIN, "in-channels", &o->in_channels, sh[0], o->input, "channel count");
        if (!rc)
            rc = take_size(o, GIVEN_DEPTH, "depth", &o->depth, sh[1], o->input, "depth");
        if (!rc)
            rc = take_size(o, GIVEN_HEIGHT, "height", &o->height, sh[2], o->input, "height");
        if (!rc)
            rc = take_size(o, GIVEN_WIDTH, "width", &o->width, sh[3], o->input, "width");
        if (rc)
            return rc;
    }
    if (o->weights) {
        if (cp_safetensors_read_model(o->weights, &f->t, err, sizeof err))
            return file_error(err);
        const cp_array *w = &f->t.weight;
        if (w->ndim != 5) {
            fprintf(stderr, "convpool: %s: conv.weight must be 5-D (Cout, Cin, kD, kH, kW), got %d-D\n", o->weights,
                    w->ndim);
            return EXIT_USAGE;
        }
        for (int i = 0; i < 5; ++i)
            if (w->shape[i] < 1) {
                fprintf(stderr, "convpool: %s: conv.weight has an empty dimension (dim %d)\n", o->weights, i);
                return EXIT_USAGE;
            }
        const int64_t cout = w->shape[0];
        /* nn.Conv3d's bias is [Cout]; the Model's bias holds one value a channel in any shape. */
        const cp_array *cb = &f->t.conv_bias;
        if (cb->ndim != 1 || cb->shape[0] != cout) {
            char shape[160];
            shape_text(cb, shape, sizeof shape);
            fprintf(stderr, "convpool: %s: conv.bias must be 1-D [Cout = %lld], got shape [%s]\n", o->weights,
                    (long long)cout, shape);
            return EXIT_USAGE;
        }
        if (f->t.conv_bias.numel != cout || f->t.bias.numel != cout) {
            fprintf(stderr, "convpool: %s: conv.bias and bias must hold Cout = %lld values, got %lld and %lld\n",
                    o->weights, (long long)cout, (long long)f->t.conv_bias.numel, (long long)f->t.bias.numel);
            return EXIT_USAGE;
        }
        /* The CLI computes Model with one bias value a channel (out = sum_c P + bias[c]): that is
         * Model's own result only where bias broadcasts against the pooled (N, Cout, 1, 1, 1) as
         * (1, Cout, 1, 1, 1). A Model built with another bias_shape of Cout values ((Cout,),
         * (1, Cout), (Cout, 1, 1)) broadcasts it along other axes and returns another shape:
         * refused rather than answered with something that model does not compute. */
        {
            const cp_array *bb = &f->t.bias;
            int per_channel = bb->ndim <= 5;
            for (int i = 0; i < bb->ndim && per_channel; ++i)
                per_channel = bb->shape[i] == (5 - bb->ndim + i == 1 ? cout : 1);
            if (!per_channel) {
                char shape[160];
                shape_text(bb, shape, sizeof shape);
                fprintf(stderr,
                        "convpool: %s: bias of shape [%s] is not one value a channel of the pooled (N, Cout = %lld, "
                        "1, 1, 1) tensor (PyTorch broadcasts it along other axes); the CLI computes Model with "
                        "bias_shape (Cout, 1, 1, 1) or (1, Cout, 1, 1, 1)\n",
                        o->weights, shape, (long long)cout);
                return EXIT_USAGE;
            }
        }
        if (o->input && w->shape[1] != o->in_channels) {
            fprintf(stderr, "convpool: %s has %lld input channels but %s has %lld\n", o->weights,
                    (long long)w->shape[1], o->input, (long long)o->in_channels);
            return EXIT_USAGE;
        }
        int rc = take_size(o, GIVEN_COUT, "out-channels", &o->out_channels, cout, o->weights, "Cout (conv.weight dim 0)");
        if (!rc && !o->input)
            rc = take_size(o, GIVEN_CIN, "in-channels", &o->in_channels, w->shape[1], o->weights,
                           "Cin (conv.weight dim 1)");
        if (!rc && (o->given & GIVEN_KERNEL) &&
            (o->kernel[0] != w->shape[2] || o->kernel[1] != w->shape[3] || o->kernel[2] != w->shape[4])) {
            fprintf(stderr, "convpool: --kernel %lld,%lld,%lld disagrees with %s, whose conv.weight kernel is "
                            "%lld,%lld,%lld\n",
                    (long long)o->kernel[0], (long long)o->kernel[1], (long long)o->kernel[2], o->weights,
                    (long long)w->shape[2], (long long)w->shape[3], (long long)w->shape[4]);
            return EXIT_USAGE;
        }
        if (rc)
            return rc;
        for (int i = 0; i < 3; ++i)
            o->kernel[i] = w->shape[2 + i];
    }
    return 0;
}

/* --output and --pooled: each a temporary beside its target until both are written. */
typedef struct outputs {
    cp_out_file out, pooled;
} outputs;

static void outputs_discard(outputs *w)
{
    cp_out_discard(&w->out);
    cp_out_discard(&w->pooled);
}

/* Creates the temporaries before the run, so that an output which cannot be created is
 * reported before the computation rather than after it. Returns 0 or an exit status. */
static int outputs_open(const options *o, outputs *w)
{
    char err[512];
    memset(w, 0, sizeof *w);
    if ((o->output && cp_out_open(&w->out, o->output, err, sizeof err)) ||
        (o->pooled && cp_out_open(&w->pooled, o->pooled, err, sizeof err))) {
        outputs_discard(w);
        return file_error(err);
    }
    return 0;
}

/* Writes both, then renames both into place only when both were written: a failed write leaves
 * every target as it was. Returns 0 or an exit status. */
static int outputs_write(const options *o, outputs *w, const convpool_problem *p, const host_buffers *h)
{
    char err[512];
    const int64_t out_shape[1] = {p->batch}, p_shape[2] = {p->batch, p->out_channels};
    int rc = o->output ? cp_npy_write_out(&w->out, h->out, 1, out_shape, err, sizeof err) : 0;
    if (!rc && o->pooled)
        rc = cp_npy_write_out(&w->pooled, h->pooled, 2, p_shape, err, sizeof err);
    if (!rc && o->output)
        rc = cp_out_commit(&w->out, err, sizeof err);
    if (!rc && o->pooled)
        rc = cp_out_commit(&w->pooled, err, sizeof err);
    outputs_discard(w);
    return rc ? file_error(err) : 0;
}
#else
/* Built without cJSON: the file options and --json say so. */
typedef struct files {
    int unused;
} files;

static void files_free(files *f) { (void)f; }

static int load_files(options *o, files *f)
{
    memset(f, 0, sizeof *f);
    const char *flag = o->input ? "--input" : o->weights ? "--weights" : o->output ? "--output"
                     : o->pooled ? "--pooled" : o->json ? "--json" : NULL;
    if (flag) {
        fprintf(stderr, "convpool: %s: this build has no cJSON (install libcjson-dev and rebuild)\n", flag);
        return EXIT_USAGE;
    }
    return 0;
}

typedef struct outputs {
    int unused;
} outputs;

static void outputs_discard(outputs *w) { (void)w; }

static int outputs_open(const options *o, outputs *w)
{
    (void)o, (void)w;
    return 0;
}

static int outputs_write(const options *o, outputs *w, const convpool_problem *p, const host_buffers *h)
{
    (void)o, (void)w, (void)p, (void)h;
    return 0;
}
#endif

/* The file a path names, to compare two paths: its real path or, for one not there yet, its
 * directory's real path and its name. 0 when neither resolves. */
static int canonical_path(const char *path, char *buf, size_t n)
{
    char *r = realpath(path, NULL);
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    if (!r) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
        r = realpath(dir, NULL);
        if (!r)
            return 0;
        snprintf(buf, n, "%s/%s", r, name);
    } else {
        snprintf(buf, n, "%s", r);
    }
    free(r);
    return 1;
}

/* Whether two paths name one file: the same text, the same inode (links, "./x" and "x"), or for
 * files not there yet the same canonical path. Two names of one character device (/dev/null)
 * are not a clash: nothing is destroyed there. */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    const int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && !S_ISCHR(sa.st_mode);
    if (strcmp(a, b) == 0)
        return 1;
    char ca[PATH_MAX], cb[PATH_MAX];
    return !ea && !eb && canonical_path(a, ca, sizeof ca) && canonical_path(b, cb, sizeof cb) && strcmp(ca, cb) == 0;
}

/* --output and --pooled must not name --input, --weights or each other: writing one would
 * destroy the other's data (or the first result). Returns 0 or an exit status. */
static int check_output_paths(const options *o)
{
    const struct {
        const char *flag, *path;
    } outs[2] = {{"output", o->output}, {"pooled", o->pooled}},
      others[3] = {{"input", o->input}, {"weights", o->weights}, {"output", o->output}};
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3 && outs[i].path; ++j)
            if (others[j].path && outs[i].path != others[j].path && same_file(outs[i].path, others[j].path)) {
                fprintf(stderr, "convpool: --%s: '%s' is the same file as --%s '%s'; refusing to overwrite it\n",
                        outs[i].flag, outs[i].path, others[j].flag, others[j].path);
                return EXIT_USAGE;
            }
    return 0;
}

static int choose_device(const options *o, device_info *dev)
{
    /* Asking for a GPU can start a CUDA context, so --device cpu never asks. */
    const int have_gpu = o->device != DEVICE_CPU && convpool_cuda_available();
    if (o->device == DEVICE_CUDA && !have_gpu) {
#ifdef CONVPOOL_HAVE_CUDA
        fprintf(stderr, "convpool: --device cuda: no usable CUDA device found\n");
#else
        fprintf(stderr, "convpool: --device cuda: this build of convpool has no CUDA support\n");
#endif
        return EXIT_USAGE;
    }
    if (o->device == DEVICE_CPU || !have_gpu) {
        query_cpu(dev, o->threads);
        return 0;
    }
#ifdef CONVPOOL_HAVE_CUDA
    query_cuda(dev, o->precision);
#endif
    return 0;
}

/* --explain: the plan convpool_forward_cuda follows for this problem. */
static int print_plan(const convpool_problem *p, convpool_precision precision)
{
    convpool_cuda_plan plan;
    const convpool_status s = convpool_cuda_plan_make(p, precision, CONVPOOL_DTYPE_F32, &plan);
    if (s != CONVPOOL_OK) {
        /* A build without CUDA is UNSUPPORTED: exit 2, as --device cuda there. */
        fprintf(stderr, "convpool: --explain: %s\n", convpool_last_error());
        return status_exit_code(s);
    }
    printf("plan %s\n", plan.description);
    return 0;
}

/* Everything after the options and files: problem, device, run, check, report, outputs. */
static int run_main(options *op, const files *f)
{
    const options o = *op;
    int rc = 0;
    convpool_problem p = convpool_problem_make(
        o.batch, o.in_channels, o.out_channels, o.depth, o.height, o.width, o.kernel[0],
        o.kernel[1], o.kernel[2], o.pool[0], o.pool[1], o.pool[2], o.divisor);
    const convpool_status vst = convpool_problem_validate(&p);
    if (vst != CONVPOOL_OK) {
        print_problem_error(convpool_last_error(), vst);
        return EXIT_USAGE;
    }
    if (convpool_x_numel(&p) > INT64_MAX / (int64_t)sizeof(float)) {
        fprintf(stderr, "convpool: out of memory: x would need more than 2^63 bytes\n");
        return 1;
    }

    if (o.explain)
        return print_plan(&p, o.precision);

    device_info dev;
    rc = choose_device(&o, &dev);
    if (rc != 0)
        return rc;
    const int threads = (int)o.threads;
    outputs w;
    rc = outputs_open(&o, &w);
    if (rc != 0)
        return rc;

    timing t;
    memset(&t, 0, sizeof t);
    t.iters = o.iters > 0 ? o.iters : dev.is_cuda ? DEFAULT_ITERS_GPU : DEFAULT_ITERS_CPU;
    t.warmup = dev.is_cuda ? GPU_WARMUP_RUNS : 0; /* the CPU median absorbs a cold first run */
    t.ms = (double *)host_alloc(t.iters, sizeof(double), "the timing table");
    if (!t.ms) {
        outputs_discard(&w);
        return 1;
    }

    host_buffers h;
    if (host_buffers_alloc(&h, &p) != 0) {
        free(t.ms);
        outputs_discard(&w);
        return 1;
    }
    if (!o.json)
        text_header(&p, &dev, &o);
    fill_inputs(&h, &p, o.seed, threads);
    /* The files' data replace the random inputs (their sizes made the problem). */
#if CONVPOOL_CLI_CJSON
    if (f->x.data)
        memcpy(h.x, f->x.data, sizeof(float) * (size_t)convpool_x_numel(&p));
    if (f->t.weight.data) {
        memcpy(h.weight, f->t.weight.data, sizeof(float) * (size_t)convpool_weight_numel(&p));
        memcpy(h.conv_bias, f->t.conv_bias.data, sizeof(float) * (size_t)p.out_channels);
        memcpy(h.bias, f->t.bias.data, sizeof(float) * (size_t)p.out_channels);
    }
#else
    (void)f;
#endif

    check_result c;
    memset(&c, 0, sizeof c);
    do {
#ifdef CONVPOOL_HAVE_CUDA
        rc = dev.is_cuda ? run_cuda(&p, &h, &dev, &t) : run_cpu(&p, &h, threads, &t);
#else
        rc = run_cpu(&p, &h, threads, &t);
#endif
        if (rc != 0)
            break;
        timing_finish(&t, &p);
        rc = run_check(&p, &h, &dev, o.check_batch < p.batch ? o.check_batch : p.batch, &c);
        if (rc != 0)
            break;
        /* The files are in place before the report: a JSON reader never sees a run reported
         * whose files are missing (then stdout stays empty and stderr says why). */
        rc = outputs_write(&o, &w, &p, &h);
#if CONVPOOL_CLI_CJSON
        if (o.json) {
            if (rc == 0)
                json_report(&p, &dev, &o, &h, &t, &c);
        } else
#endif
            text_results(&p, &h, &t, &c);
        if (rc == 0)
            rc = c.pass ? 0 : EXIT_CHECK_FAILED;
    } while (0);

    outputs_discard(&w);
    free(c.items);
    free(t.ms);
    host_buffers_free(&h);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    options_default(&o);
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc;
    if (o.help) {
        print_usage(stdout);
        return 0;
    }
    if (o.threads > MAX_THREADS) {
        fprintf(stderr, "convpool: --threads: expected at most " MAX_THREADS_TEXT ", got %lld\n",
                (long long)o.threads);
        return EXIT_USAGE;
    }

    rc = check_output_paths(&o);
    if (rc != 0)
        return rc;
    files f;
    rc = load_files(&o, &f);
    if (rc == 0)
        rc = run_main(&o, &f);
    files_free(&f);
    return rc;
}

