/*
 * The fused CUDA backward (src/cuda/backward.cu) against the double-precision reference
 * backward (convpool_backward_reference), on a seeded set of problems: odd sizes, pool
 * remainders, kernel 1 and 5, anisotropic kernels and pools, a negative divisor, a window of
 * 512 positions (2-byte codes), grad_pooled or grad_out alone, and every subset of outputs;
 * the tiled kernels across their tile seams and both kernels' simple fall-backs. The training
 * forward's own codes (convpool_forward_train_cuda: the k3p2 and general kernels) are checked
 * against the pooling kernel's, and its refusal of problems other kernels plan.
 *
 * The training forward's codes come from convpool_pool_forward_train_cuda on y, the conv
 * output (conv bias added) computed here in double and rounded to float, as the reference
 * rounds its own conv values: both then pick the arg-max on the same float32 values y / d.
 * Outputs are poisoned first (NaN) and must be fully written; a rerun must be bit-identical.
 *
 * Tolerance: the reference is double; the kernels sum in float (grad_weight: a float sum over
 * the windows of one (b, c), then double over b). |got - ref| <= 1e-4 * max|ref| + 1e-30 per
 * gradient, far below what one wrong arg-max or a missing tap changes.
 * Without CUDA or a device it prints "SKIPPED" and exits 77.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CONVPOOL_HAVE_CUDA

int main(void)
{
    printf("SKIPPED: no CUDA device (convpool was built without CUDA)\n");
    return CHECK_SKIP;
}

#else

#include "check_cuda.h"

/* y[b][c][...] = cb + conv(x, w), accumulated in double and rounded to float. */
static void conv_host(const convpool_problem *p, const float *x, const float *w, const float *cb, float *y)
{
    const int64_t B = p->batch, C = p->out_channels, CI = p->in_channels;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < C; ++c)
            for (int64_t d = 0; d < p->conv_d; ++d)
                for (int64_t h = 0; h < p->conv_h; ++h)
                    for (int64_t v = 0; v < p->conv_w; ++v) {
                        double acc = (double)cb[c]; /* as the reference: bias first, then the taps */
                        for (int64_t ci = 0; ci < CI; ++ci)
                            for (int64_t i = 0; i < p->kernel_d; ++i)
                                for (int64_t j = 0; j < p->kernel_h; ++j)
                                    for (int64_t k = 0; k < p->kernel_w; ++k)
                                        acc += (double)w[(((c * CI + ci) * p->kernel_d + i) * p->kernel_h + j) *
                                                             p->kernel_w +
                                                         k] *
                                               (double)x[(((b * CI + ci) * p->in_d + d + i) * p->in_h + h + j) *
                                                             p->in_w +
                                                         v + k];
                        y[(((b * C + c) * p->conv_d + d) * p->conv_h + h) * p->conv_w + v] = (float)acc;
                    }
}

static void *dcopy(const void *h, size_t n)
{
    void *d = NULL;
    if (!CUDA_OK(cudaMalloc(&d, n ? n : 1)))
        return NULL;
    if (h && !CUDA_OK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice))) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

/* rel: the tolerance relative to the largest finite reference magnitude. FP32 sums (and grad_x
 * in strict mode and from the portable kernels in TF32 mode, whose products are FP32-accurate):
 * 1e-4; a TF32-rounded S would miss it (3e-4). TF32 grad_weight: each x is rounded to 10
 * mantissa bits (relative error <= 2^-11, as cuDNN's TF32 weight gradient rounds it), so a sum
 * of N terms of one sign is off by up to 2^-11 of itself; 2e-3 is 4 such ulps of the largest
 * entry. TF32 grad_x from grad_x_sm90 (grad_x_tf32_rel): each S w rounded once to 11 bits, the
 * same 2e-3. A NaN or inf in the reference must be the same NaN or inf. */
/* An environment switch as the library reads it (common.cuh's env_switch): -1 unset or empty,
 * 0 for "0", else 1. */
static int env_switch(const char *name)
{
    const char *e = getenv(name);
    return !e || !*e ? -1 : strcmp(e, "0") == 0 ? 0 : 1;
}

/* TF32 grad_x's tolerance: 2e-3 wherever grad_x_sm90 may sum one float16 piece of S w (a cc 9.0
 * GPU, unless CONVPOOL_GRADX_SM90=0 keeps grad_x_fold or CONVPOOL_GRADX_TWO_PIECES=1 keeps two
 * pieces: then 1e-4, so the FP32-accurate kernels keep their bound). */
static double grad_x_tf32_rel(void)
{
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    const int one_piece = major == 9 && minor == 0 && env_switch("CONVPOOL_GRADX_SM90") != 0 &&
                          env_switch("CONVPOOL_GRADX_TWO_PIECES") != 1;
    return one_piece ? 2e-3 : 1e-4;
}

static void compare(const char *label, const char *what, const float *got, const double *ref, int64_t n, double rel)
{
    double scale = 0.0, worst = 0.0;
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < n; ++i)
        if (isfinite(ref[i]))
            scale = fmax(scale, fabs(ref[i]));
    const double tol = rel * scale + 1e-30;
    int64_t bad = -1;
    for (int64_t i = 0; i < n; ++i) {
        if (!isfinite(ref[i])) {
            ++nonfinite;
            const int same = isnan(ref[i]) ? isnan(got[i]) : (double)got[i] == ref[i];
            if (!same && bad < 0)
                bad = i;
            continue;
        }
        const double e = fabs((double)got[i] - ref[i]);
        if (!(e <= tol) && bad < 0)
            bad = i;
        if (e > worst)
            worst = e;
    }
    CHECK(bad < 0, "%s: %s[%lld] = %.9g, reference %.9g (tolerance %.3g)", label, what, (long long)bad,
          bad < 0 ? 0.0 : (double)got[bad], bad < 0 ? 0.0 : ref[bad], tol);
    printf("test_cuda_backward: %-44s %-14s max err %.3g of scale %.3g", label, what, worst, scale);
    printf(nonfinite ? ", %lld NaN/inf as the reference\n" : "\n", (long long)nonfinite);
}

typedef struct bw_case {
    const char *name;
    int64_t b, cin, cout, d, h, w, kd, kh, kw, pd, ph, pw;
    double div;
    int grads; /* 1: grad_pooled, 2: grad_out, 3: both */
    int odd_grads; /* 1: grad_pooled[0..2] = NaN, 0 (with grad_out 0 for sample 0), 1e30;
                    * 2: every gradient times 1e-38 (S subnormal); 3: times 1e25, and the
                    * weights of channel c times 2^(12 (c % 4) - 20); 4: x times 1e-6;
                    * 5: x times 1e5 (past float16's range) */
    int nonfinite; /* 1: x holds +inf and -inf, 2: the weights do (far apart: no inf - inf),
                    * 4: x's first and last elements are +inf and -inf (one conv position each) */
} bw_case;

/* Code i of a buffer of codes of width cb bytes. */
static uint32_t code_at(const void *buf, int cb, int64_t i)
{
    if (cb == 1)
        return ((const uint8_t *)buf)[i];
    if (cb == 2)
        return ((const uint16_t *)buf)[i];
    return ((const uint32_t *)buf)[i];
}

/* convpool_forward_train_cuda_deferred, then convpool_settle_codes_cuda (twice), against
 * convpool_forward_train_cuda's codes want and pooled want_pooled of the same problem and
 * precision: pooled bit for bit; before the settle every code is want's or the flag value (all
 * bits of the width), and under CONVPOOL_TEST_RECHECK_ALL (all) every code of a plan that
 * defers is the flag; after it the codes are want's, byte for byte. */
static void check_deferred(const bw_case *k, const convpool_problem *p, convpool_precision pr, int all, const float *dx,
                           const float *dw, const float *dcb, const void *want, const float *want_pooled, size_t ws)
{
    const int64_t B = p->batch, C = p->out_channels, n = B * C * p->pooled_d * p->pooled_h * p->pooled_w;
    const int cb = convpool_code_bytes(p);
    const uint32_t flag = cb >= 4 ? 0xffffffffu : (1u << (8 * cb)) - 1u;
    const size_t nbytes = (size_t)n * (size_t)cb;
    const char *mode = pr == CONVPOOL_PRECISION_STRICT ? "strict" : all ? "TF32-all" : "TF32";
    void *h = check_alloc(nbytes), *dcodes = dcopy(NULL, nbytes), *dws = dcopy(NULL, ws ? ws : 16);
    float *hp = (float *)check_alloc(sizeof(float) * (size_t)(B * C));
    float *dpooled = (float *)dcopy(NULL, sizeof(float) * (size_t)(B * C));
    if (h && hp && dcodes && dws && dpooled && CUDA_OK(cudaMemset(dcodes, 0xa5, nbytes))) {
        if (all)
            setenv("CONVPOOL_TEST_RECHECK_ALL", "1", 1);
        convpool_status s =
            convpool_forward_train_cuda_deferred(p, pr, dx, dw, dcb, NULL, dpooled, NULL, dcodes, dws, ws, NULL);
        unsetenv("CONVPOOL_TEST_RECHECK_ALL");
        CHECK(s == CONVPOOL_OK, "%s: %s deferred training forward: %s", k->name, mode, convpool_last_error());
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(h, dcodes, nbytes, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(hp, dpooled, sizeof(float) * (size_t)(B * C), cudaMemcpyDeviceToHost));
        CHECK(memcmp(hp, want_pooled, sizeof(float) * (size_t)(B * C)) == 0,
              "%s: %s deferred training forward: pooled differs from the training forward's", k->name, mode);
        int64_t flagged = 0, bad = -1;
        for (int64_t i = 0; i < n; ++i) {
            const uint32_t got = code_at(h, cb, i);
            flagged += got == flag;
            if (got != flag && got != code_at(want, cb, i) && bad < 0)
                bad = i;
        }
        CHECK(bad < 0, "%s: %s deferred training forward: code %lld is %u, neither the flag nor the settled %u",
              k->name, mode, (long long)bad, bad < 0 ? 0u : code_at(h, cb, bad), bad < 0 ? 0u : code_at(want, cb, bad));
        CHECK(!all || flagged == n, "%s: TF32-all deferred training forward: %lld of %lld codes flagged", k->name,
              (long long)flagged, (long long)n);
        for (int round = 0; round < 2; ++round) {
            s = convpool_settle_codes_cuda(p, pr, dx, dw, dcb, dcodes, NULL);
            CHECK(s == CONVPOOL_OK, "%s: %s settle: %s", k->name, mode, convpool_last_error());
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(h, dcodes, nbytes, cudaMemcpyDeviceToHost));
            int64_t differ = 0;
            for (int64_t i = 0; i < n; ++i)
                differ += code_at(h, cb, i) != code_at(want, cb, i);
            CHECK(differ == 0, "%s: %s settle %d: %lld of %lld codes differ from the training forward's", k->name,
                  mode, round + 1, (long long)differ, (long long)n);
        }
        printf("test_cuda_backward: %-44s %-8s deferred: %lld of %lld codes flagged, settled to the forward's\n",
               k->name, mode, (long long)flagged, (long long)n);
    }
    cudaFree(dcodes), cudaFree(dws), cudaFree(dpooled);
    free(h), free(hp);
}

/* The training forward's own codes (convpool_forward_train_cuda, both precisions) against the
 * pooling kernel's on y, accumulated in double: equal, or a near-tie of q = y / divisor between
 * the two positions (its conv values are TF32 or 3xTF32 sums). Poisoned codes must all be
 * written, pooled must match. A problem the plan gives neither k3p2 (pool 2^3) nor the general
 * kernel is refused with UNSUPPORTED, codes untouched. */
static void check_forward_train(const bw_case *k, const convpool_problem *p, const float *y, const float *dx,
                                const float *dw, const float *dcb, const void *dref, const float *dpooled_ref)
{
    const int64_t B = p->batch, C = p->out_channels, npool = p->pooled_d * p->pooled_h * p->pooled_w;
    const int64_t n = B * C * npool, vol = p->pool_d * p->pool_h * p->pool_w;
    const int cb = convpool_code_bytes(p);
    const size_t nbytes = (size_t)n * (size_t)cb;
    void *hc = check_alloc(nbytes), *hr = check_alloc(nbytes);
    float *hp = (float *)check_alloc(sizeof(float) * (size_t)(B * C)), *hpr = (float *)check_alloc(sizeof(float) * (size_t)(B * C));
    if (!hc || !hr || !hp || !hpr)
        goto out;
    double qmax = 0.0;
    for (int64_t i = 0; i < B * C * p->conv_d * p->conv_h * p->conv_w; ++i)
        qmax = fmax(qmax, fabs((double)y[i] / p->divisor));
    /* Modes: TF32; TF32 with every window rechecked in FP32 (the general kernel's recheck_kernel
     * writes every code: CONVPOOL_TEST_RECHECK_ALL); strict. */
    for (int mode = 0; mode < 3; ++mode) {
        const int prec = mode == 2, all = mode == 1;
        /* CONVPOOL_TEST_K3P2_NO_RERUN: k3p2's float16 training forward without its TF32 rerun,
         * so only cases inside float16's range (not x times 1e-6 or 1e5) can pass in TF32. */
        if (!prec && env_switch("CONVPOOL_TEST_K3P2_NO_RERUN") == 1 && (k->odd_grads == 4 || k->odd_grads == 5))
            continue;
        const convpool_precision pr = prec ? CONVPOOL_PRECISION_STRICT : CONVPOOL_PRECISION_TF32;
        convpool_cuda_plan plan0;
        const int general = convpool_cuda_plan_make(p, pr, CONVPOOL_DTYPE_F32, &plan0) == CONVPOOL_OK &&
                            plan0.kernel == CONVPOOL_CUDA_KERNEL_GENERAL;
        if (all && !(general && vol != 256 && vol != 65536))
            continue;
        /* TF32 picks: k3p2's stand (near-ties of TF32 sums flip); the general kernel's near-ties
         * (within eight standard deviations of the TF32 error, general.cu) are recomputed in
         * FP32 (vol <= its code width's spare value), so FP32's bound. */
        const double tol = (prec || (general && vol != 256 && vol != 65536) ? 1e-5 : 4e-3) * qmax;
        convpool_cuda_plan plan;
        size_t ws = 0;
        CHECK(convpool_cuda_plan_make(p, pr, CONVPOOL_DTYPE_F32, &plan) == CONVPOOL_OK &&
                  convpool_cuda_workspace_size(p, pr, CONVPOOL_DTYPE_F32, &ws) == CONVPOOL_OK,
              "%s: forward queries: %s", k->name, convpool_last_error());
        void *dcodes = dcopy(NULL, nbytes), *dws = dcopy(NULL, ws ? ws : 16);
        float *dpooled = (float *)dcopy(NULL, sizeof(float) * (size_t)(B * C));
        /* Poison 0xa5 (not 0xff, the recheck's flag for 1-byte codes, which it would rewrite). */
        if (dcodes && dws && dpooled && CUDA_OK(cudaMemset(dcodes, 0xa5, nbytes))) {
            if (all)
                setenv("CONVPOOL_TEST_RECHECK_ALL", "1", 1);
            const convpool_status s =
                convpool_forward_train_cuda(p, pr, dx, dw, dcb, NULL, dpooled, NULL, dcodes, dws, ws, NULL);
            unsetenv("CONVPOOL_TEST_RECHECK_ALL");
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(hc, dcodes, nbytes, cudaMemcpyDeviceToHost));
            const int serves = (plan.kernel == CONVPOOL_CUDA_KERNEL_K3P2 && vol == 8 && p->pool_d == 2 && p->pool_h == 2) ||
                                plan.kernel == CONVPOOL_CUDA_KERNEL_GENERAL;
            if (!serves) {
                int64_t touched = 0;
                for (size_t i = 0; i < nbytes; ++i)
                    touched += ((const uint8_t *)hc)[i] != 0xa5;
                CHECK(s == CONVPOOL_ERR_UNSUPPORTED && strstr(convpool_last_error(), "k3p2") && touched == 0,
                      "%s: the training forward on a %s problem: status %d, %lld codes written (%s)", k->name,
                      convpool_cuda_kernel_name(plan.kernel), (int)s, (long long)touched, convpool_last_error());
            } else {
                CHECK(s == CONVPOOL_OK, "%s: training forward: %s", k->name, convpool_last_error());
                CUDA_OK(cudaMemcpy(hr, dref, nbytes, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(hp, dpooled, sizeof(float) * (size_t)(B * C), cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(hpr, dpooled_ref, sizeof(float) * (size_t)(B * C), cudaMemcpyDeviceToHost));
                int64_t differ = 0, bad = -1;
                for (int64_t i = 0; i < n && bad < 0; ++i) {
                    const uint32_t got = code_at(hc, cb, i), want = code_at(hr, cb, i);
                    if (got >= (uint32_t)vol) {
                        bad = i;
                        break;
                    }
                    if (got == want)
                        continue;
                    ++differ;
                    const int64_t bc = i / npool, win = i % npool, pw = win % p->pooled_w;
                    const int64_t ph = (win / p->pooled_w) % p->pooled_h, pd = win / (p->pooled_w * p->pooled_h);
                    double q[2];
                    for (int j = 0; j < 2; ++j) {
                        const int64_t code = j ? want : got, od = code / (p->pool_h * p->pool_w);
                        const int64_t oh = (code / p->pool_w) % p->pool_h, ow = code % p->pool_w;
                        q[j] = (double)y[((bc * p->conv_d + pd * p->pool_d + od) * p->conv_h + ph * p->pool_h + oh) *
                                             p->conv_w +
                                         pw * p->pool_w + ow] /
                               p->divisor;
                    }
                    if (fabs(q[0] - q[1]) > tol)
                        bad = i;
                }
                CHECK(bad < 0, "%s: %s training forward: code %lld is %u, the pooling kernel's %u", k->name,
                      prec ? "strict" : all ? "TF32-all" : "TF32", (long long)bad, bad < 0 ? 0u : code_at(hc, cb, bad),
                      bad < 0 ? 0u : code_at(hr, cb, bad));
                double perr = 0.0, pscale = 0.0;
                for (int64_t i = 0; i < B * C; ++i)
                    perr = fmax(perr, fabs((double)hp[i] - hpr[i])), pscale = fmax(pscale, fabs((double)hpr[i]));
                CHECK(perr <= (prec ? 1e-5 : 4e-3) * (pscale + qmax), "%s: training forward pooled off by %.3g",
                      k->name, perr);
                printf("test_cuda_backward: %-44s %-8s training forward (%s): %lld of %lld codes differ (near-ties)\n",
                       k->name, prec ? "strict" : all ? "TF32-all" : "TF32", convpool_cuda_kernel_name(plan.kernel), (long long)differ,
                       (long long)n);
                check_deferred(k, p, pr, all, dx, dw, dcb, hc, hp, ws);
            }
        }
        cudaFree(dcodes), cudaFree(dws), cudaFree(dpooled);
    }
out:
    free(hc), free(hr), free(hp), free(hpr);
}

/* convpool_backward_cuda_all's grad_bias, with grad_out at stride 2 (d2; its values go): every
 * channel gets sum_b go[b] (the double sum, rounded once), the other gradients keep the bits of
 * the call without it (gx_ref, gw_ref); grad_bias alone (no workspace) gives the same, without
 * grad_out zeros, and a grad_bias over grad_out is refused naming it. */
static void check_grad_bias(const convpool_problem *p, convpool_precision pr, const char *label, const float *dx,
                            const float *dw, const void *dcodes, const float *dgp, const float *go, float *d2,
                            float *dgx, float *dgw, float *dgcb, void *dbws, size_t ws, const float *gx_ref,
                            const float *gw_ref)
{
    const int64_t B = p->batch, C = p->out_channels, nx = convpool_x_numel(p), nw = convpool_weight_numel(p);
    float *hx = (float *)malloc(sizeof(float) * (size_t)nx), *hw = (float *)malloc(sizeof(float) * (size_t)nw);
    float *hb = (float *)malloc(sizeof(float) * (size_t)C);
    float *db = (float *)dcopy(NULL, sizeof(float) * (size_t)C);
    if (!hx || !hw || !hb || !db) {
        CHECK(0, "%s: grad_bias: out of memory", label);
        goto done;
    }
    double want = 0.0, scale = 0.0;
    for (int64_t b = 0; b < B; ++b)
        want += go[b], scale += fabs(go[b]);
    const double tol = 1e-7 * scale + 1e-30;
    for (int round = 0; round < 3; ++round) {
        /* 0: with every other gradient; 1: grad_bias alone, no workspace; 2: grad_out NULL. */
        CUDA_OK(cudaMemset(db, 0xff, sizeof(float) * (size_t)C)); /* NaN poison */
        const convpool_status st =
            round == 0 ? convpool_backward_cuda_all(p, pr, dx, dw, dcodes, dgp, d2, 2, dgx, dgw, dgcb, db, dbws, ws, NULL)
            : round == 1 ? convpool_backward_cuda_all(p, pr, dx, dw, dcodes, dgp, d2, 2, NULL, NULL, NULL, db, NULL, 0,
                                                      NULL)
                         : convpool_backward_cuda_all(p, pr, dx, dw, dcodes, dgp, NULL, 1, NULL, NULL, NULL, db, NULL,
                                                      0, NULL);
        CHECK(st == CONVPOOL_OK, "%s: grad_bias round %d: %s", label, round, convpool_last_error());
        CUDA_OK(cudaMemcpy(hb, db, sizeof(float) * (size_t)C, cudaMemcpyDeviceToHost));
        const double w = round == 2 ? 0.0 : want;
        int64_t bad = -1;
        for (int64_t c = 0; c < C; ++c)
            if (!(fabs((double)hb[c] - w) <= tol) || hb[c] != hb[0])
                bad = c;
        CHECK(bad < 0, "%s: grad_bias round %d: channel %lld is %.9g, want %.9g", label, round, (long long)bad,
              bad < 0 ? 0.0 : (double)hb[bad], w);
        if (round == 0) {
            CUDA_OK(cudaMemcpy(hx, dgx, sizeof(float) * (size_t)nx, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hw, dgw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost));
            CHECK(memcmp(hx, gx_ref, sizeof(float) * (size_t)nx) == 0 &&
                      memcmp(hw, gw_ref, sizeof(float) * (size_t)nw) == 0,
                  "%s: grad_x or grad_weight moved with grad_bias asked", label);
        }
    }
    CHECK(convpool_backward_cuda_all(p, pr, dx, dw, dcodes, dgp, d2, 2, NULL, NULL, NULL, d2, NULL, 0, NULL) ==
                  CONVPOOL_ERR_INVALID_ARGUMENT &&
              strstr(convpool_last_error(), "grad_bias"),
          "%s: grad_bias over grad_out not refused by name: %s", label, convpool_last_error());
done:
    cudaFree(db);
    free(hx);
    free(hw);
    free(hb);
}

/* convpool_backward_cuda_strided: grad_out at stride 2 (NaN between the samples' values) gives
 * the dense call's bits (gx_ref, gw_ref); stride 0 (one value for every sample, autograd's
 * expand of a scalar loss's gradient) gives the bits of a dense vector of that value; a negative
 * stride is refused. */
static void check_strided_grad_out(const convpool_problem *p, convpool_precision pr, const char *label, const float *dx,
                                   const float *dw, const void *dcodes, const float *dgp, const float *go, float *dgx,
                                   float *dgw, float *dgcb, void *dbws, size_t ws, const float *gx_ref,
                                   const float *gw_ref)
{
    const int64_t B = p->batch, nx = convpool_x_numel(p), nw = convpool_weight_numel(p);
    float *h2 = (float *)malloc(sizeof(float) * (size_t)(2 * B));
    float *hx = (float *)malloc(sizeof(float) * (size_t)nx), *hw = (float *)malloc(sizeof(float) * (size_t)nw);
    float *hx0 = (float *)malloc(sizeof(float) * (size_t)nx), *hw0 = (float *)malloc(sizeof(float) * (size_t)nw);
    if (!h2 || !hx || !hw || !hx0 || !hw0) {
        CHECK(0, "%s: strided grad_out: out of host memory", label);
        goto done;
    }
    for (int64_t b = 0; b < B; ++b) {
        h2[2 * b] = go[b];
        h2[2 * b + 1] = NAN;
    }
    float *d2 = (float *)dcopy(h2, sizeof(float) * (size_t)(2 * B));
    CHECK(d2 && convpool_backward_cuda_strided(p, pr, dx, dw, dcodes, dgp, d2, 2, dgx, dgw, dgcb, dbws, ws, NULL) ==
                    CONVPOOL_OK,
          "%s: grad_out stride 2: %s", label, convpool_last_error());
    CUDA_OK(cudaMemcpy(hx, dgx, sizeof(float) * (size_t)nx, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hw, dgw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost));
    CHECK(memcmp(hx, gx_ref, sizeof(float) * (size_t)nx) == 0 && memcmp(hw, gw_ref, sizeof(float) * (size_t)nw) == 0,
          "%s: grad_out at stride 2 differs from the dense call", label);
    check_grad_bias(p, pr, label, dx, dw, dcodes, dgp, go, d2, dgx, dgw, dgcb, dbws, ws, gx_ref, gw_ref);
    /* Stride 0 against a dense vector of go[0]. */
    for (int64_t b = 0; b < B; ++b)
        h2[b] = go[0];
    CUDA_OK(cudaMemcpy(d2, h2, sizeof(float) * (size_t)B, cudaMemcpyHostToDevice));
    CHECK(convpool_backward_cuda(p, pr, dx, dw, dcodes, dgp, d2, dgx, dgw, dgcb, dbws, ws, NULL) == CONVPOOL_OK,
          "%s: grad_out all go[0]: %s", label, convpool_last_error());
    CUDA_OK(cudaMemcpy(hx0, dgx, sizeof(float) * (size_t)nx, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hw0, dgw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost));
    CHECK(convpool_backward_cuda_strided(p, pr, dx, dw, dcodes, dgp, d2, 0, dgx, dgw, dgcb, dbws, ws, NULL) ==
              CONVPOOL_OK,
          "%s: grad_out stride 0: %s", label, convpool_last_error());
    CUDA_OK(cudaMemcpy(hx, dgx, sizeof(float) * (size_t)nx, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hw, dgw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost));
    CHECK(memcmp(hx, hx0, sizeof(float) * (size_t)nx) == 0 && memcmp(hw, hw0, sizeof(float) * (size_t)nw) == 0,
          "%s: grad_out at stride 0 differs from a dense vector of its value", label);
    CHECK(convpool_backward_cuda_strided(p, pr, dx, dw, dcodes, dgp, d2, -1, dgx, dgw, dgcb, dbws, ws, NULL) ==
              CONVPOOL_ERR_INVALID_ARGUMENT,
          "%s: grad_out stride -1 not refused", label);
    cudaFree(d2);
done:
    free(h2);
    free(hx);
    free(hw);
    free(hx0);
    free(hw0);
}

static void run_case(const bw_case *k, uint64_t seed)
{
    convpool_problem p = convpool_problem_make(k->b, k->cin, k->cout, k->d, k->h, k->w, k->kd, k->kh, k->kw, k->pd,
                                               k->ph, k->pw, k->div);
    CHECK(convpool_problem_validate(&p) == CONVPOOL_OK, "%s: bad problem", k->name);
    const int64_t B = p.batch, C = p.out_channels, nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p);
    const int64_t ny = B * C * p.conv_d * p.conv_h * p.conv_w;
    check_rng r = check_rng_seed(seed);
    float *x = (float *)check_alloc(sizeof(float) * (size_t)nx), *w = (float *)check_alloc(sizeof(float) * (size_t)nw);
    float *cb = (float *)check_alloc(sizeof(float) * (size_t)C), *y = (float *)check_alloc(sizeof(float) * (size_t)ny);
    float *gp = (float *)check_alloc(sizeof(float) * (size_t)(B * C)), *go = (float *)check_alloc(sizeof(float) * (size_t)B);
    float *rx = (float *)check_alloc(sizeof(float) * (size_t)nx), *rw = (float *)check_alloc(sizeof(float) * (size_t)nw);
    float *rcb = (float *)check_alloc(sizeof(float) * (size_t)C);
    float *hx = (float *)check_alloc(sizeof(float) * (size_t)nx), *hw = (float *)check_alloc(sizeof(float) * (size_t)nw);
    float *hcb = (float *)check_alloc(sizeof(float) * (size_t)C), *hx2 = (float *)check_alloc(sizeof(float) * (size_t)nx);
    float *hw2 = (float *)check_alloc(sizeof(float) * (size_t)nw);
    double *ref = (double *)check_alloc(sizeof(double) * (size_t)(nx > nw ? nx : nw));
    if (!x || !w || !cb || !y || !gp || !go || !rx || !rw || !rcb || !hx || !hw || !hcb || !hx2 || !hw2 || !ref)
        goto done;
    check_fill_uniform(&r, x, nx, -1.0f, 1.0f);
    check_fill_uniform(&r, w, nw, -0.5f, 0.5f);
    check_fill_uniform(&r, cb, C, -0.5f, 0.5f);
    check_fill_normal(&r, gp, B * C, 1.0f);
    check_fill_normal(&r, go, B, 1.0f);
    if (k->odd_grads >= 4) {
        /* x float16 cannot hold to TF32's bits: weight_sm90's float16 instance flags it
         * (NF_RANGE) and its TF32 instance computes the sums again. */
        const float f = k->odd_grads == 4 ? 1e-6f : 1e5f;
        for (int64_t i = 0; i < nx; ++i)
            x[i] *= f;
    } else if (k->odd_grads >= 2) {
        /* S at the ends of float's range and channels 2^36 apart: grad_x_sm90's float16
         * instance scales A and B per channel and the stores by 2^E (backward.cu,
         * grad_x_sm90_setup). */
        const float f = k->odd_grads == 2 ? 1e-38f : 1e25f;
        for (int64_t i = 0; i < B * C; ++i)
            gp[i] *= f;
        for (int64_t i = 0; i < B; ++i)
            go[i] *= f;
        if (k->odd_grads == 3)
            for (int64_t i = 0; i < nw; ++i)
                w[i] = ldexpf(w[i], 12 * (int)((i / (nw / C)) % 4) - 20);
    }
    if (k->odd_grads == 1) {
        /* S NaN (its arg-max patches turn NaN, nothing else), exactly 0 and ~1e28: the
         * tensor-core grad_x splits S into a power of two and a mantissa, except the first
         * two, which it keeps whole. Channels 0-2 of sample 0: Cout >= 3. */
        gp[0] = NAN, gp[1] = 0.0f, gp[2] = 1e30f, go[0] = 0.0f;
    }
    /* Infinities (not NaN: several NaN in one window would make the arg-max depend on which
     * NaN each side keeps), which the backward must meet with the dense formula's 0 * inf
     * terms: grad_weight (x) or grad_x (w) turns NaN wherever a zero gradient meets them and
     * +-inf where only S * inf does. */
    if (k->nonfinite & 1) {
        x[((0 * p.in_channels + 0) * p.in_d + 1) * p.in_h * p.in_w + 1 * p.in_w + 1] = INFINITY;
        x[(((B - 1) * p.in_channels + p.in_channels - 1) * p.in_d + p.in_d - 2) * p.in_h * p.in_w +
          (p.in_h - 2) * p.in_w + p.in_w - 2] = -INFINITY;
    }
    if (k->nonfinite & 4)
        x[0] = INFINITY, x[nx - 1] = -INFINITY;
    if (k->nonfinite & 2)
        w[0] = INFINITY, w[nw - 1] = -INFINITY; /* channel 0 and channel Cout - 1 */
    const float *gpp = k->grads & 1 ? gp : NULL, *gop = k->grads & 2 ? go : NULL;
    conv_host(&p, x, w, cb, y);
    CHECK(convpool_backward_reference(&p, x, w, cb, gpp, gop, rx, rw, rcb, NULL) == CONVPOOL_OK, "%s: reference: %s",
          k->name, convpool_last_error());

    size_t codes_bytes = 0, pool_ws = 0, bw_ws[2] = {0, 0};
    CHECK(convpool_codes_size(&p, &codes_bytes) == CONVPOOL_OK && convpool_cuda_pool_workspace_size(&p, &pool_ws) == CONVPOOL_OK &&
              convpool_backward_cuda_workspace_size(&p, CONVPOOL_PRECISION_TF32, &bw_ws[0]) == CONVPOOL_OK &&
              convpool_backward_cuda_workspace_size(&p, CONVPOOL_PRECISION_STRICT, &bw_ws[1]) == CONVPOOL_OK,
          "%s: size queries: %s", k->name, convpool_last_error());
    const size_t ws_max = bw_ws[0] > bw_ws[1] ? bw_ws[0] : bw_ws[1];
    float *dx = (float *)dcopy(x, sizeof(float) * (size_t)nx), *dw = (float *)dcopy(w, sizeof(float) * (size_t)nw);
    float *dy = (float *)dcopy(y, sizeof(float) * (size_t)ny);
    float *dgp = (float *)dcopy(gp, sizeof(float) * (size_t)(B * C)), *dgo = (float *)dcopy(go, sizeof(float) * (size_t)B);
    float *dpooled = (float *)dcopy(NULL, sizeof(float) * (size_t)(B * C));
    void *dcodes = dcopy(NULL, codes_bytes), *dpws = dcopy(NULL, pool_ws), *dbws = dcopy(NULL, ws_max);
    float *dgx = (float *)dcopy(NULL, sizeof(float) * (size_t)nx), *dgw = (float *)dcopy(NULL, sizeof(float) * (size_t)nw);
    float *dgcb = (float *)dcopy(NULL, sizeof(float) * (size_t)C);
    if (dx && dw && dy && dgp && dgo && dpooled && dcodes && dpws && dbws && dgx && dgw && dgcb) {
        CHECK(convpool_pool_forward_train_cuda(&p, dy, NULL, dpooled, NULL, dcodes, dpws, pool_ws, NULL) == CONVPOOL_OK,
              "%s: train forward: %s", k->name, convpool_last_error());
        float *dcb = (float *)dcopy(cb, sizeof(float) * (size_t)C);
        if (dcb && !k->nonfinite) /* its tolerance is relative to max |y| */
            check_forward_train(k, &p, y, dx, dw, dcb, dcodes, dpooled);
        cudaFree(dcb);
        for (int prec = 0; prec < 2; ++prec) {
            const convpool_precision pr = prec ? CONVPOOL_PRECISION_STRICT : CONVPOOL_PRECISION_TF32;
            const size_t ws = bw_ws[prec];
            char label[96];
            snprintf(label, sizeof label, "%s, %s", k->name, prec ? "strict" : "TF32");
            /* Every subset of the outputs: none is computed unless asked for. */
            for (int mask = 1; mask < 8; ++mask) {
                check_poison(hx, nx);
                check_poison(hw, nw);
                check_poison(hcb, C);
                CUDA_OK(cudaMemcpy(dgx, hx, sizeof(float) * (size_t)nx, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(dgw, hw, sizeof(float) * (size_t)nw, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(dgcb, hcb, sizeof(float) * (size_t)C, cudaMemcpyHostToDevice));
                const convpool_status s = convpool_backward_cuda(
                    &p, pr, dx, dw, dcodes, gpp ? dgp : NULL, gop ? dgo : NULL, mask & 1 ? dgx : NULL,
                    mask & 2 ? dgw : NULL, mask & 4 ? dgcb : NULL, dbws, ws, NULL);
                CHECK(s == CONVPOOL_OK, "%s: backward: %s", label, convpool_last_error());
                if (s != CONVPOOL_OK || !CUDA_OK(cudaDeviceSynchronize()))
                    break;
                CUDA_OK(cudaMemcpy(hx, dgx, sizeof(float) * (size_t)nx, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(hw, dgw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(hcb, dgcb, sizeof(float) * (size_t)C, cudaMemcpyDeviceToHost));
                CHECK((mask & 1 ? check_count_poison(hx, nx) == 0 : check_count_poison(hx, nx) == nx) &&
                          (mask & 2 ? check_count_poison(hw, nw) == 0 : check_count_poison(hw, nw) == nw) &&
                          (mask & 4 ? check_count_poison(hcb, C) == 0 : check_count_poison(hcb, C) == C),
                      "%s: outputs %d written wrongly", label, mask);
                if (mask != 7)
                    continue;
                for (int64_t i = 0; i < nx; ++i)
                    ref[i] = rx[i];
                compare(label, "grad_x", hx, ref, nx, prec ? 1e-4 : grad_x_tf32_rel());
                for (int64_t i = 0; i < nw; ++i)
                    ref[i] = rw[i];
                compare(label, "grad_weight", hw, ref, nw, prec ? 1e-4 : 2e-3);
                for (int64_t i = 0; i < C; ++i)
                    ref[i] = rcb[i];
                compare(label, "grad_conv_bias", hcb, ref, C, 1e-4);
                /* A rerun is bit-identical. */
                memcpy(hx2, hx, sizeof(float) * (size_t)nx);
                convpool_backward_cuda(&p, pr, dx, dw, dcodes, gpp ? dgp : NULL, gop ? dgo : NULL, dgx, dgw, dgcb,
                                       dbws, ws, NULL);
                CUDA_OK(cudaMemcpy(hx, dgx, sizeof(float) * (size_t)nx, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(hw2, dgw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost));
                CHECK(memcmp(hx, hx2, sizeof(float) * (size_t)nx) == 0, "%s: rerun's grad_x differs", label);
                CHECK(memcmp(hw, hw2, sizeof(float) * (size_t)nw) == 0, "%s: rerun's grad_weight differs", label);
                /* grad_x alone needs only the workspace's head (the PyTorch binding runs it so, on
                 * a second stream beside grad_weight): the same bits, and a byte less refused. */
                const float *gpa = gpp ? dgp : NULL, *goa = gop ? dgo : NULL;
                const size_t xws = CONVPOOL_BACKWARD_X_WORKSPACE_BYTES;
                CHECK(convpool_backward_cuda(&p, pr, dx, dw, dcodes, gpa, goa, dgx, NULL, NULL, dbws, xws, NULL) ==
                          CONVPOOL_OK,
                      "%s: grad_x alone: %s", label, convpool_last_error());
                CUDA_OK(cudaMemcpy(hx, dgx, sizeof(float) * (size_t)nx, cudaMemcpyDeviceToHost));
                CHECK(memcmp(hx, hx2, sizeof(float) * (size_t)nx) == 0, "%s: grad_x alone differs", label);
                CHECK(convpool_backward_cuda(&p, pr, dx, dw, dcodes, gpa, goa, dgx, NULL, NULL, dbws, xws - 1, NULL) ==
                          CONVPOOL_ERR_WORKSPACE,
                      "%s: grad_x alone with a short workspace not refused", label);
                if (goa)
                    check_strided_grad_out(&p, pr, label, dx, dw, dcodes, gpa, go, dgx, dgw, dgcb, dbws, ws, hx2, hw2);
            }
            /* Errors name the argument and write nothing. */
            CHECK(convpool_backward_cuda(&p, pr, dx, dw, NULL, dgp, dgo, dgx, dgw, dgcb, dbws, ws, NULL) ==
                          CONVPOOL_ERR_NULL_POINTER &&
                      strstr(convpool_last_error(), "codes") != NULL,
                  "%s: NULL codes not refused: %s", label, convpool_last_error());
            if (ws > 0)
                CHECK(convpool_backward_cuda(&p, pr, dx, dw, dcodes, dgp, dgo, dgx, dgw, dgcb, dbws, ws - 1, NULL) ==
                          CONVPOOL_ERR_WORKSPACE,
                      "%s: short workspace not refused", label);
            CHECK(convpool_backward_cuda(&p, pr, dx, dw, dcodes, dgp, dgo, dx, dgw, dgcb, dbws, ws, NULL) ==
                          CONVPOOL_ERR_INVALID_ARGUMENT,
                  "%s: grad_x overlapping x not refused", label);
        }
        CHECK(convpool_backward_cuda(&p, (convpool_precision)7, dx, dw, dcodes, dgp, dgo, dgx, dgw, dgcb, dbws, ws_max,
                                     NULL) == CONVPOOL_ERR_INVALID_ARGUMENT &&
                  strstr(convpool_last_error(), "precision") != NULL,
              "%s: precision 7 not refused: %s", k->name, convpool_last_error());
    }
    cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dgp), cudaFree(dgo), cudaFree(dpooled), cudaFree(dcodes);
    cudaFree(dpws), cudaFree(dbws), cudaFree(dgx), cudaFree(dgw), cudaFree(dgcb);
done:
    free(x), free(w), free(cb), free(y), free(gp), free(go), free(rx), free(rw), free(rcb), free(hx), free(hw);
    free(hcb), free(hx2), free(hw2), free(ref);
}

/* The code PyTorch's max_pool3d gives window i (codes' order: [b][c][windows]) over values
 * q(ctx, bc, z, y, x) at conv position (z, y, x) of sample-channel bc: the first greatest, a
 * NaN replacing the pick (raster order, from -inf at position 0). *tied: the pick's value also
 * came at an earlier position. */
typedef float (*window_value_fn)(const void *ctx, int64_t bc, int64_t z, int64_t y, int64_t x);
static uint32_t rule_code(const convpool_problem *p, int64_t i, window_value_fn q, const void *ctx, int *tied)
{
    const int64_t npool = p->pooled_d * p->pooled_h * p->pooled_w, bc = i / npool, win = i % npool;
    const int64_t pw = win % p->pooled_w, ph = (win / p->pooled_w) % p->pooled_h, pd = win / (p->pooled_w * p->pooled_h);
    float best = -INFINITY;
    uint32_t pick = 0, pos = 0;
    int t = 0;
    for (int64_t od = 0; od < p->pool_d; ++od)
        for (int64_t oh = 0; oh < p->pool_h; ++oh)
            for (int64_t ow = 0; ow < p->pool_w; ++ow, ++pos) {
                const float v = q(ctx, bc, pd * p->pool_d + od, ph * p->pool_h + oh, pw * p->pool_w + ow);
                t |= v == best;
                if (v > best || isnan(v))
                    best = v, pick = pos, t = 0;
            }
    *tied = t;
    return pick;
}

/* q = y / divisor in float32, y the conv output with its bias (conv_host). */
typedef struct {
    const convpool_problem *p;
    const float *y;
    float div;
} y_values;
static float q_of_y(const void *ctx, int64_t bc, int64_t z, int64_t y, int64_t x)
{
    const y_values *c = (const y_values *)ctx;
    const convpool_problem *p = c->p;
    return c->y[((bc * p->conv_d + z) * p->conv_h + y) * p->conv_w + x] / c->div;
}

/* q = ((float)(the conv summed in double) + conv bias) / divisor in float32: the correctly
 * rounded FP32 conv's values, as PyTorch's ops form q from them. */
typedef struct {
    const convpool_problem *p;
    const float *x, *w, *cb;
    float div;
} exact_values;
static float q_exact(const void *ctx, int64_t bc, int64_t z, int64_t y, int64_t xx)
{
    const exact_values *e = (const exact_values *)ctx;
    const convpool_problem *p = e->p;
    const int64_t taps = p->kernel_d * p->kernel_h * p->kernel_w, K = p->in_channels * taps;
    const int64_t b = bc / p->out_channels, c = bc % p->out_channels;
    double acc = 0.0;
    for (int64_t k = 0; k < K; ++k) {
        const int64_t ic = k / taps, t = k % taps;
        const int64_t td = t / (p->kernel_h * p->kernel_w), th = (t / p->kernel_w) % p->kernel_h, tw = t % p->kernel_w;
        acc += (double)e->w[c * K + k] *
               e->x[(((b * p->in_channels + ic) * p->in_d + z + td) * p->in_h + y + th) * p->in_w + xx + tw];
    }
    return ((float)acc + e->cb[c]) / e->div;
}

/* The training forward's codes on grid inputs, against PyTorch's rule applied here in float:
 * equal at every window, ties included. x in {0, 1/4, ..., 1}, w in {-1/4, ..., 1/4} by 1/8 and
 * the conv bias in {-1/2, ..., 1/2} by 1/4 make every conv value exact in TF32, 3xTF32 and FP32
 * whatever the summation order, and make exact ties common; the first position of a tie must
 * win. check_forward_train forgives near-ties, so it forgives every tie; this does not. Rows:
 * k3p2 (pool 2^3) with divisors 2 and 2^100 (the code rule's product), 3 (its division) and
 * -1.5; the general kernel (pool 3, whose TF32 picks send exact ties to the FP32 recheck).
 * The float16 instance (test_cuda_backward_k3p2_f16*) picks on c = v + bias where q = c / d
 * keeps c's order, so the rows where it does not are here too: divisor 2^-126 (q past float's
 * range for |c| >= 4: distinct c tie at inf, the first wins), 2^126 (q subnormal for |c| < 1),
 * 0 (q = +-inf or NaN, the literal rule: the last NaN wins), and a conv bias of 2^24 (bias
 * offset cbo: c rounds to even integers, so distinct v tie in c itself). The strict picks,
 * which order raw v, flag the windows whose q nears inf (2^-126 here, k3p2 and the general
 * kernel's pool 3) for the recheck. poison: 1, a NaN weight in channel 1 (every conv value of
 * that channel NaN: the last position wins everywhere; the float16 instance's range check
 * does not see a NaN weight, so its own pick meets it); 2, a NaN in x; 3, +inf in x (0 * inf
 * and inf - inf make NaN, the other sums +-inf, whatever the order). x out of float16's range
 * sends the float16 instance's call to its TF32 rerun, whose codes must then be exact too. */
static void test_codes_exact(void)
{
    static const struct {
        int64_t b, ci, co, d, h, w, k, pool;
        double div, cbo;
        int poison;
    } cases[] = {
        {2, 8, 16, 6, 10, 36, 3, 2, 2.0, 0.0, 0},      {1, 8, 16, 6, 10, 36, 3, 2, 0x1p100, 0.0, 0},
        {1, 8, 16, 6, 10, 36, 3, 2, 3.0, 0.0, 0},      {1, 8, 16, 6, 10, 36, 3, 2, -1.5, 0.0, 0},
        {1, 8, 16, 6, 10, 36, 3, 2, 0x1p-126, 0.0, 0}, {1, 8, 16, 6, 10, 36, 3, 2, -0x1p126, 0.0, 0},
        {1, 8, 16, 6, 10, 36, 3, 2, 0.0, 0.0, 0},      {1, 8, 16, 6, 10, 36, 3, 2, 2.0, 0x1p24, 0},
        {1, 8, 16, 6, 10, 36, 3, 2, 2.0, 0.0, 1},      {1, 8, 16, 6, 10, 36, 3, 2, -1.5, 0.0, 2},
        {1, 8, 16, 6, 10, 36, 3, 2, 2.0, 0.0, 3},      {1, 3, 5, 7, 13, 38, 3, 3, 2.0, 0.0, 0},
        {1, 3, 5, 7, 13, 38, 3, 3, -0.75, 0.0, 0},     {1, 3, 5, 7, 13, 38, 3, 3, 0x1p-126, 0.0, 0},
        {1, 3, 5, 7, 13, 38, 3, 3, 2.0, 0.0, 2},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        convpool_problem p =
            convpool_problem_make(cases[ci].b, cases[ci].ci, cases[ci].co, cases[ci].d, cases[ci].h, cases[ci].w,
                                  cases[ci].k, cases[ci].k, cases[ci].k, cases[ci].pool, cases[ci].pool, cases[ci].pool,
                                  cases[ci].div);
        CHECK(convpool_problem_validate(&p) == CONVPOOL_OK, "exact codes case %zu invalid", ci);
        const int64_t B = p.batch, C = p.out_channels, nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p);
        const int64_t ny = B * C * p.conv_d * p.conv_h * p.conv_w, npool = p.pooled_d * p.pooled_h * p.pooled_w;
        const int64_t n = B * C * npool;
        const int cbytes = convpool_code_bytes(&p);
        float *x = (float *)check_alloc(sizeof(float) * (size_t)nx), *w = (float *)check_alloc(sizeof(float) * (size_t)nw);
        float *cb = (float *)check_alloc(sizeof(float) * (size_t)C), *y = (float *)check_alloc(sizeof(float) * (size_t)ny);
        void *got = check_alloc((size_t)n * (size_t)cbytes);
        if (!x || !w || !cb || !y || !got) {
            free(x), free(w), free(cb), free(y), free(got);
            return;
        }
        check_rng r = check_rng_seed(5000 + ci);
        for (int64_t i = 0; i < nx; ++i)
            x[i] = (float)check_rng_int(&r, 0, 4) * 0.25f;
        for (int64_t i = 0; i < nw; ++i)
            w[i] = (float)check_rng_int(&r, -2, 2) * 0.125f;
        for (int64_t i = 0; i < C; ++i)
            cb[i] = (float)(cases[ci].cbo + (double)check_rng_int(&r, -2, 2) * 0.25);
        if (cases[ci].poison == 1)
            w[nw / C] = NAN;
        else if (cases[ci].poison >= 2)
            x[nx / 2] = cases[ci].poison == 2 ? NAN : INFINITY;
        conv_host(&p, x, w, cb, y); /* exact: conv plus bias, rounded once, as the kernels form v + bias */
        float *dx = (float *)dcopy(x, sizeof(float) * (size_t)nx), *dw = (float *)dcopy(w, sizeof(float) * (size_t)nw);
        float *dcb = (float *)dcopy(cb, sizeof(float) * (size_t)C);
        float *dpooled = (float *)dcopy(NULL, sizeof(float) * (size_t)(B * C));
        void *dcodes = dcopy(NULL, (size_t)n * (size_t)cbytes);
        const float div = (float)p.divisor; /* PyTorch divides the float32 tensor by it in float32 */
        for (int prec = 0; prec < 2 && dx && dw && dcb && dpooled && dcodes; ++prec) {
            /* x out of float16's range without the rerun behind it: the float16 instance's own
             * (void) codes, as check_forward_train skips its cases. */
            if (!prec && cases[ci].poison >= 2 && env_switch("CONVPOOL_TEST_K3P2_NO_RERUN") == 1)
                continue;
            const convpool_precision pr = prec ? CONVPOOL_PRECISION_STRICT : CONVPOOL_PRECISION_TF32;
            convpool_cuda_plan plan;
            size_t ws = 0;
            CHECK(convpool_cuda_plan_make(&p, pr, CONVPOOL_DTYPE_F32, &plan) == CONVPOOL_OK &&
                      convpool_cuda_workspace_size(&p, pr, CONVPOOL_DTYPE_F32, &ws) == CONVPOOL_OK,
                  "exact codes case %zu: queries: %s", ci, convpool_last_error());
            const int serves = (plan.kernel == CONVPOOL_CUDA_KERNEL_K3P2 && p.pool_d == 2 && p.pool_h == 2 && p.pool_w == 2) ||
                               plan.kernel == CONVPOOL_CUDA_KERNEL_GENERAL;
            CHECK(serves, "exact codes case %zu (%s): planned on %s, which writes no codes: pick another shape", ci,
                  prec ? "strict" : "TF32", convpool_cuda_kernel_name(plan.kernel));
            void *dws = dcopy(NULL, ws ? ws : 16);
            if (!serves || !dws || !CUDA_OK(cudaMemset(dcodes, 0xa5, (size_t)n * (size_t)cbytes))) {
                cudaFree(dws);
                continue;
            }
            const convpool_status s =
                convpool_forward_train_cuda(&p, pr, dx, dw, dcb, NULL, dpooled, NULL, dcodes, dws, ws, NULL);
            CHECK(s == CONVPOOL_OK, "exact codes case %zu: training forward: %s", ci, convpool_last_error());
            if (s == CONVPOOL_OK && CUDA_OK(cudaDeviceSynchronize()) &&
                CUDA_OK(cudaMemcpy(got, dcodes, (size_t)n * (size_t)cbytes, cudaMemcpyDeviceToHost))) {
                int64_t bad = -1, ties = 0;
                uint32_t want_bad = 0;
                const y_values yv = {&p, y, div};
                for (int64_t i = 0; i < n && bad < 0; ++i) {
                    int tied = 0;
                    const uint32_t want = rule_code(&p, i, q_of_y, &yv, &tied);
                    ties += tied;
                    if (code_at(got, cbytes, i) != want)
                        bad = i, want_bad = want;
                }
                CHECK(bad < 0, "exact codes case %zu (%s, %s): window %lld has code %u, PyTorch's rule %u", ci,
                      prec ? "strict" : "TF32", convpool_cuda_kernel_name(plan.kernel), (long long)bad,
                      bad < 0 ? 0u : code_at(got, cbytes, bad), want_bad);
                static const char *const poisons[] = {"", ", NaN weight", ", NaN in x", ", inf in x"};
                printf("test_cuda_backward: exact codes, divisor %-8g pool %lld %-6s (%s%s): %lld windows, %lld with a "
                       "tied max\n",
                       (double)div, (long long)p.pool_d, prec ? "strict" : "TF32", convpool_cuda_kernel_name(plan.kernel),
                       poisons[cases[ci].poison], (long long)n, (long long)ties);
            }
            cudaFree(dws);
        }
        cudaFree(dx), cudaFree(dw), cudaFree(dcb), cudaFree(dpooled), cudaFree(dcodes);
        free(x), free(w), free(cb), free(y), free(got);
    }
}

/* Strict codes at near-ties, against the correctly rounded FP32 conv's pick, exactly:
 * v = (float) of the conv summed in double, q = (v + conv bias) / divisor in float32, the first
 * greatest q (NaN rule as PyTorch's). x = 64 + eps u (u uniform in [0, 1)) puts a large common
 * part under every window and eps the spread between its positions: eps 2^-12 leaves them a few
 * float32 ulps apart (exact ties common, every window beyond the 3xTF32 sums' error, so all are
 * recomputed in double), 2^-6 a mix of flagged and clear windows (a too small near-tie bound
 * keeps a wrong pick there), 1 few flagged; then x = 64 everywhere (every window an exact tie,
 * which k3p2 settles without a recheck where a window's x field is constant) and x = u with the
 * left half of every row 0 (constant regions beside random ones). The same codes must come with every window rechecked
 * (CONVPOOL_TEST_RECHECK_ALL), and for x = 64 in TF32 too. Rows: k3p2 with 16-byte rows and
 * padded ones (the recheck per chunk of the padded copy), negative divisor, divisor 0 (the
 * literal mode: a constant field's NaN or inf q is rechecked, never settled as a tie); the
 * general kernel with 1-byte codes (pool 3, the staged wide recheck) and 2-byte ones (a
 * 512-position window, the lane-over-K recheck), whose flat windows flat_codes_kernel settles
 * before the recheck: Cout 17 (two channel groups, a channel count past a multiple of 4) with
 * divisor 0 and channel 0's conv bias 0, so its zero fields have q = NaN (the last position),
 * and Cin 34, Cout 33 (past the 32 channels its shuffles and its per-warp reuse serve). */
static void test_codes_strict_near_ties(void)
{
    static const struct {
        int64_t b, ci, co, d, h, w, kd, kh, kw, pd, ph, pw;
        double div;
    } cases[] = {
        {2, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, 2.0},     {1, 5, 11, 6, 9, 35, 3, 3, 3, 2, 2, 2, -1.5},
        {1, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, 0.0},     {1, 3, 5, 7, 13, 38, 3, 3, 3, 3, 3, 3, 2.0},
        {1, 2, 2, 4, 17, 17, 2, 2, 2, 2, 16, 16, 0.75},   {1, 4, 17, 7, 12, 40, 3, 3, 3, 3, 3, 3, 0.0},
        {1, 34, 33, 5, 8, 22, 3, 3, 3, 3, 3, 3, -1.25},
    };
    /* eps 0: x = 64 everywhere; -1: x = u, 0 in the left half of every row */
    static const float eps[] = {0x1p-12f, 0x1p-6f, 1.0f, 0.0f, -1.0f};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        convpool_problem p = convpool_problem_make(cases[ci].b, cases[ci].ci, cases[ci].co, cases[ci].d, cases[ci].h,
                                                   cases[ci].w, cases[ci].kd, cases[ci].kh, cases[ci].kw, cases[ci].pd,
                                                   cases[ci].ph, cases[ci].pw, cases[ci].div);
        CHECK(convpool_problem_validate(&p) == CONVPOOL_OK, "strict near-tie case %zu invalid", ci);
        const int64_t B = p.batch, C = p.out_channels, nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p);
        const int64_t npool = p.pooled_d * p.pooled_h * p.pooled_w, n = B * C * npool;
        const int cbytes = convpool_code_bytes(&p);
        const size_t nbytes = (size_t)n * (size_t)cbytes;
        float *x = (float *)check_alloc(sizeof(float) * (size_t)nx), *w = (float *)check_alloc(sizeof(float) * (size_t)nw);
        float *cb = (float *)check_alloc(sizeof(float) * (size_t)C);
        uint32_t *want = (uint32_t *)check_alloc(sizeof(uint32_t) * (size_t)n);
        void *got = check_alloc(nbytes);
        convpool_cuda_plan plan;
        size_t ws = 0, ws_tf32 = 0;
        CHECK(convpool_cuda_plan_make(&p, CONVPOOL_PRECISION_STRICT, CONVPOOL_DTYPE_F32, &plan) == CONVPOOL_OK &&
                  convpool_cuda_workspace_size(&p, CONVPOOL_PRECISION_STRICT, CONVPOOL_DTYPE_F32, &ws) == CONVPOOL_OK &&
                  convpool_cuda_workspace_size(&p, CONVPOOL_PRECISION_TF32, CONVPOOL_DTYPE_F32, &ws_tf32) == CONVPOOL_OK,
              "strict near-tie case %zu: queries: %s", ci, convpool_last_error());
        ws = ws > ws_tf32 ? ws : ws_tf32;
        const int serves = (plan.kernel == CONVPOOL_CUDA_KERNEL_K3P2 && p.pool_d == 2 && p.pool_h == 2 && p.pool_w == 2) ||
                           plan.kernel == CONVPOOL_CUDA_KERNEL_GENERAL;
        CHECK(serves, "strict near-tie case %zu: planned on %s, which writes no codes: pick another shape", ci,
              convpool_cuda_kernel_name(plan.kernel));
        float *dx = (float *)dcopy(NULL, sizeof(float) * (size_t)nx), *dw = (float *)dcopy(NULL, sizeof(float) * (size_t)nw);
        float *dcb = (float *)dcopy(NULL, sizeof(float) * (size_t)C);
        float *dpooled = (float *)dcopy(NULL, sizeof(float) * (size_t)(B * C));
        void *dcodes = dcopy(NULL, nbytes), *dws = dcopy(NULL, ws ? ws : 16);
        for (size_t ei = 0; ei < sizeof eps / sizeof eps[0] && serves && x && w && cb && want && got && dx && dw &&
                            dcb && dpooled && dcodes && dws;
             ++ei) {
            check_rng r = check_rng_seed(7000 + 16 * ci + ei);
            check_fill_uniform(&r, x, nx, 0.0f, 1.0f);
            for (int64_t i = 0; i < nx; ++i)
                x[i] = eps[ei] < 0.0f ? (i % p.in_w < p.in_w / 2 ? 0.0f : x[i]) : 64.0f + eps[ei] * x[i];
            check_fill_uniform(&r, w, nw, -0.5f, 0.5f);
            check_fill_uniform(&r, cb, C, -0.5f, 0.5f);
            if (p.divisor == 0.0)
                cb[0] = 0.0f; /* q = 0 / 0 where channel 0's conv is 0 (a zero field): NaN, the last position */
            const exact_values ev = {&p, x, w, cb, (float)p.divisor};
            int64_t ties = 0;
            for (int64_t i = 0; i < n; ++i) {
                int tied = 0;
                want[i] = rule_code(&p, i, q_exact, &ev, &tied);
                ties += tied;
            }
            if (!CUDA_OK(cudaMemcpy(dx, x, sizeof(float) * (size_t)nx, cudaMemcpyHostToDevice)) ||
                !CUDA_OK(cudaMemcpy(dw, w, sizeof(float) * (size_t)nw, cudaMemcpyHostToDevice)) ||
                !CUDA_OK(cudaMemcpy(dcb, cb, sizeof(float) * (size_t)C, cudaMemcpyHostToDevice)))
                break;
            /* Modes: strict; strict with every window rechecked; TF32 where x is one constant (its
             * picks elsewhere are the TF32 sums', not the correctly rounded conv's; here every
             * window is an exact tie: the first position, or the last where q is NaN). */
            for (int mode = 0; mode < 3; ++mode) {
                const int all = mode == 1;
                if (mode == 2 && eps[ei] != 0.0f)
                    continue;
                if (!CUDA_OK(cudaMemset(dcodes, 0xa5, nbytes)))
                    break;
                if (all)
                    setenv("CONVPOOL_TEST_RECHECK_ALL", "1", 1);
                const convpool_precision pr = mode == 2 ? CONVPOOL_PRECISION_TF32 : CONVPOOL_PRECISION_STRICT;
                const convpool_status s =
                    convpool_forward_train_cuda(&p, pr, dx, dw, dcb, NULL, dpooled, NULL, dcodes, dws, ws, NULL);
                unsetenv("CONVPOOL_TEST_RECHECK_ALL");
                CHECK(s == CONVPOOL_OK, "strict near-tie case %zu: training forward: %s", ci, convpool_last_error());
                if (s != CONVPOOL_OK || !CUDA_OK(cudaDeviceSynchronize()) ||
                    !CUDA_OK(cudaMemcpy(got, dcodes, nbytes, cudaMemcpyDeviceToHost)))
                    break;
                int64_t bad = -1, differ = 0;
                for (int64_t i = 0; i < n; ++i)
                    if (code_at(got, cbytes, i) != want[i]) {
                        differ++;
                        if (bad < 0)
                            bad = i;
                    }
                CHECK(bad < 0,
                      "strict near-tie case %zu (%s), eps %g%s: %lld of %lld codes differ from the correctly rounded "
                      "conv's; window %lld has %u, want %u",
                      ci, convpool_cuda_kernel_name(plan.kernel), (double)eps[ei],
                      all ? ", all rechecked" : mode == 2 ? ", TF32" : "",
                      (long long)differ, (long long)n, (long long)bad, bad < 0 ? 0u : code_at(got, cbytes, bad),
                      bad < 0 ? 0u : want[bad]);
                if (mode == 0)
                    printf("test_cuda_backward: strict near-ties, %-8s %lld-position windows, eps %-9g: %lld windows, "
                           "%lld with a tied max, all equal to the correctly rounded conv's\n",
                           convpool_cuda_kernel_name(plan.kernel), (long long)(p.pool_d * p.pool_h * p.pool_w),
                           (double)eps[ei], (long long)n, (long long)ties);
            }
        }
        cudaFree(dx), cudaFree(dw), cudaFree(dcb), cudaFree(dpooled), cudaFree(dcodes), cudaFree(dws);
        free(x), free(w), free(cb), free(want), free(got);
    }
}

int main(void)
{
    if (!convpool_cuda_available()) {
        printf("SKIPPED: no CUDA device\n");
        return CHECK_SKIP;
    }
    static const bw_case cases[] = {
        {"headline-like 2x3->5, 7x9x11", 2, 3, 5, 7, 9, 11, 3, 3, 3, 2, 2, 2, 2.0, 3, 0, 0},
        {"anisotropic, divisor -1.5", 1, 4, 6, 9, 8, 10, 1, 3, 2, 3, 1, 2, -1.5, 3, 0, 0},
        {"kernel 5x3x5, pool 1x2x2", 2, 2, 3, 6, 9, 9, 5, 3, 5, 1, 2, 2, 0.5, 3, 0, 0},
        {"kernel 1, pool 1", 1, 3, 2, 5, 20, 20, 1, 1, 1, 1, 1, 1, 3.0, 3, 0, 0},
        /* The general kernel's compile-time 7x7 taps (its CODES instance too), pool remainders. */
        {"kernel 1x7x7, pool 1x2x2", 2, 3, 5, 4, 15, 22, 1, 7, 7, 1, 2, 2, 2.0, 3, 0, 0},
        {"window of 512 (2-byte codes)", 1, 2, 2, 4, 17, 17, 2, 2, 2, 2, 16, 16, 1.0, 3, 0, 0},
        {"grad_pooled only, Cin 9 (2 ci chunks)", 2, 9, 4, 6, 7, 8, 3, 3, 3, 2, 2, 2, 2.0, 1, 0, 0},
        {"grad_out only, pool 3 remainders", 1, 2, 17, 8, 11, 13, 2, 2, 2, 3, 3, 3, -0.75, 2, 0, 0},
        /* The tiled kernels' seams: 3 grad_x tiles along w, 3 along d, 2 along h; 2 weight
         * units along pooled w (34 windows); Cout 24 x 14 column chunks = 2 weight passes. */
        {"wide rows, 3 x tiles, 2 weight units", 2, 3, 4, 5, 6, 70, 3, 3, 3, 2, 2, 2, 2.0, 3, 0, 0},
        {"Cout 24 (2 weight passes), batch 3", 3, 8, 24, 4, 6, 9, 3, 3, 3, 2, 2, 2, 1.25, 3, 0, 0},
        /* k3p2 with 16-byte rows (the others above pad theirs): the training forward in place. */
        {"k3p2, aligned rows, Cin 8 -> 16", 2, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, 2.0, 3, 0, 0},
        /* Power-of-two divisors far from 1: the code rule divides by multiplying with 2^-k
         * (pow2_recip, common.cuh), so the reciprocal's exponent must be right at both ends. */
        {"k3p2, divisor 2^100", 2, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, 0x1p100, 3, 0, 0},
        {"k3p2, divisor -2^-100", 1, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, -0x1p-100, 3, 0, 0},
        /* grad_x_sm90_kernel (forced in test_cuda_backward_gradx_sm90): 3 w tiles (62, 62 and
         * the last 7 columns), odd d and h, Cin 7 and Cout 13 padded to 8 and 16. */
        {"k3p2, 3 wgmma w tiles, odd d and h", 1, 7, 13, 5, 9, 131, 3, 3, 3, 2, 2, 2, 2.0, 3, 0, 0},
        {"k3p2, Cin 3 -> 8, w 68, h 11, divisor 0.5", 3, 3, 8, 6, 11, 68, 3, 3, 3, 2, 2, 2, 0.5, 3, 0, 0},
        /* weight_sm90_kernel (forced in test_cuda_backward_wgrad_sm90; "weight units on every
         * axis" below also takes it: 96 columns, chunks of 4 conv rows with a remainder of 2):
         * 128 columns (units of 4 rows: 4, 4, 2), and a batch of 128 whose blocks take 3 or 4
         * units each (10 conv d-rows a sample, 3 shares; 1 or 2 units in 8 shares under
         * CONVPOOL_WGRAD_BALANCE=0, test_cuda_backward_wgrad_sm90), Cin 5 and Cout 11 padded. */
        {"k3p2, wgmma grad_w, 128 columns", 1, 8, 16, 6, 12, 128, 3, 3, 3, 2, 2, 2, 2.0, 3, 0, 0},
        {"k3p2, wgmma grad_w, 2 units a block", 128, 5, 11, 12, 10, 36, 3, 3, 3, 2, 2, 2, -1.5, 3, 0, 0},
        /* weight_sm90's cost-balanced shares (backward.cu, wg90::share_cost): 4 conv d-rows x 6
         * h chunks (the last of 8 rows too) a sample, 3 shares of 8 units (2 on a GPU of 114 SMs)
         * that span two chunks each, so the default takes the balanced split. */
        {"k3p2, wgmma grad_w, cost-balanced shares", 128, 5, 11, 6, 50, 20, 3, 3, 3, 2, 2, 2, 1.5, 3, 0, 0},
        /* The tensor-core grad_weight (weight_mma_kernel): units along every axis with
         * remainders (pooled 4 x 5 x 37 against units of 2 x 4 x 32; rows of 76 take the
         * 16-byte staging, the cases of 70 and 75 wide the scalar one), 3 column groups of
         * 7 m-tiles and a second 16-channel chunk of 4 channels, 2 column passes (k5, Cin 8:
         * 63 m-tiles). */
        {"weight units on every axis", 3, 3, 5, 11, 13, 76, 3, 3, 3, 2, 2, 2, 1.5, 3, 0, 0},
        {"weight units, scalar staging", 2, 2, 3, 6, 7, 75, 3, 3, 3, 2, 2, 2, 1.5, 3, 0, 0},
        {"Cin 12 -> 20, pool 1x3x2", 2, 12, 20, 5, 12, 14, 3, 3, 3, 1, 3, 2, -2.5, 3, 0, 0},
        {"kernel 5, Cin 8 (2 column passes)", 2, 8, 6, 7, 8, 12, 5, 5, 5, 1, 1, 2, -0.5, 3, 0, 0},
        {"pool 3 x 5 x 4, batch 4", 4, 2, 16, 6, 13, 17, 3, 2, 3, 3, 5, 4, 3.0, 3, 0, 0},
        /* grad_x_fold_kernel's kernel-height instances (2 to 5): kh 4 with 2 input- and 2
         * output-channel chunks (Cin 9, Cout 10), 2 row tiles, 64-column tiles with a remainder. */
        {"kernel 2x4x3, Cin 9 -> 10", 2, 9, 10, 5, 13, 37, 2, 4, 3, 2, 2, 2, 1.5, 3, 0, 0},
        /* The other (tile width, kh) instances: kh 2 and 5 at 64 columns (kh 5 builds its A
         * fragments in registers), kh 4 at 32 columns with a pool remainder along w. */
        {"kernel 1x2x3, 64-column fold tiles", 2, 3, 4, 3, 10, 70, 1, 2, 3, 1, 2, 2, 1.0, 3, 0, 0},
        {"kernel 3x5x1, 64-column fold tiles", 1, 4, 9, 6, 12, 40, 3, 5, 1, 2, 2, 1, -1.0, 3, 0, 0},
        {"kernel 2x4x5, 32-column fold tiles", 2, 5, 6, 5, 11, 20, 2, 4, 5, 2, 2, 3, 2.5, 3, 0, 0},
        /* The general kernel's recheck with a receptive field of 8 x 8^3 floats, past a warp's
         * shared-memory slice: gathers from global x. */
        {"kernel 5, pool 4, Cin 8 (recheck from x)", 1, 8, 5, 12, 13, 14, 5, 5, 5, 4, 4, 4, -1.25, 3, 0, 0},
        /* Past the tiled kernels' limits: the simple kernels. */
        {"kernel width 33 (simple grad_x)", 1, 2, 3, 3, 4, 40, 1, 2, 33, 1, 1, 2, 2.0, 3, 0, 0},
        {"Cin 64, kernel 3x7x7 (simple grad_w)", 1, 64, 2, 4, 8, 8, 3, 7, 7, 2, 1, 1, -2.0, 3, 0, 0},
        /* grad_pooled holding NaN, 0 and 1e30: the NaN's reach, a zero S, a large exponent. */
        {"grad_pooled NaN, 0, 1e30", 2, 3, 5, 7, 9, 40, 3, 3, 3, 2, 2, 2, 2.0, 3, 1, 0},
        {"grad_pooled NaN, 0, 1e30, kernel 5", 2, 8, 3, 6, 9, 9, 5, 5, 5, 1, 1, 1, -1.0, 1, 1, 0},
        /* The k3p2 shapes (grad_x_sm90 where forced): S subnormal; S ~1e22 with channels whose
         * weights lie 2^36 apart. */
        {"k3p2, S subnormal", 1, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, 2.0, 3, 2, 0},
        {"k3p2, S 1e22, weights 2^36 apart", 2, 8, 13, 6, 10, 36, 3, 3, 3, 2, 2, 2, -2.0, 3, 3, 0},
        /* weight_sm90's float16 instance, x out of its range: the TF32 instance takes over. */
        {"k3p2, x times 1e-6 (float16 subnormals)", 2, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, 2.0, 3, 4, 0},
        {"k3p2, x times 1e5 (past float16)", 2, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, 2.0, 3, 5, 0},
        /* inf in x or the weights: the tensor-core kernels step aside for the gathers (device
         * flags), and the fix-up kernels add the 0 * inf terms; the simple kernels' shape too. */
        {"inf in x", 2, 3, 5, 7, 9, 40, 3, 3, 3, 2, 2, 2, 2.0, 3, 0, 1},
        {"inf in the weights", 2, 3, 5, 7, 9, 40, 3, 3, 3, 2, 2, 2, -2.0, 3, 0, 2},
        {"inf in x, kernel width 33", 1, 2, 3, 3, 4, 40, 1, 2, 33, 1, 1, 2, 2.0, 3, 0, 1},
        {"inf in the weights, kernel width 33", 1, 2, 3, 3, 4, 40, 1, 2, 33, 1, 1, 2, 2.0, 3, 0, 2},
        /* weight_sm90_kernel as x's inf check (even conv depth and height: its units stage all
         * of x, and nonfinite_kernel skips x); the corners are staged by the first and the last
         * unit only; with an odd conv depth the last plane is not staged and the scan runs. */
        {"inf in x, wgmma grad_w checks x", 2, 8, 16, 6, 10, 36, 3, 3, 3, 2, 2, 2, 2.0, 3, 0, 1},
        {"inf at x's corners, 128 columns", 1, 8, 16, 6, 12, 128, 3, 3, 3, 2, 2, 2, -1.5, 3, 0, 4},
        {"inf at x's corners, odd conv depth", 2, 5, 11, 7, 10, 36, 3, 3, 3, 2, 2, 2, 2.0, 3, 0, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        run_case(&cases[i], 1000 + i);
    test_codes_exact();
    test_codes_strict_near_ties();
    return check_exit_code("test_cuda_backward");
}

#endif /* CONVPOOL_HAVE_CUDA */
