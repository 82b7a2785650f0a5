/*
 * The smallest C program on an installed convpool: one small problem on the fused CPU path,
 * checked against the double-precision reference. Builds with find_package(convpool) (the
 * CMakeLists.txt here) or with pkg-config:
 *     cc main.c $(pkg-config --cflags --libs convpool) -o convpool_example
 */
#include <convpool.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    convpool_problem p = convpool_problem_make(2, 3, 4, 6, 9, 10, 3, 3, 3, 2, 2, 2, 2.0);
    if (convpool_problem_validate(&p) != CONVPOOL_OK) {
        fprintf(stderr, "invalid problem: %s\n", convpool_last_error());
        return 1;
    }
    const int64_t nx = convpool_x_numel(&p), nw = convpool_weight_numel(&p), nc = p.out_channels;
    float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)nw);
    float cb[4], bias[4], pooled[8], out[2], ref_pooled[8], ref_out[2];
    if (!x || !w)
        return 1;
    unsigned s = 12345u;
    for (int64_t i = 0; i < nx; ++i)
        x[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f;
    for (int64_t i = 0; i < nw; ++i)
        w[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
    for (int64_t c = 0; c < nc; ++c) {
        cb[c] = 0.1f * (float)c;
        bias[c] = 1.0f - 0.25f * (float)c;
    }
    if (convpool_forward_cpu(&p, x, w, cb, bias, pooled, out, 0) != CONVPOOL_OK ||
        convpool_forward_reference(&p, x, w, cb, bias, ref_pooled, ref_out) != CONVPOOL_OK) {
        fprintf(stderr, "forward failed: %s\n", convpool_last_error());
        return 1;
    }
    double worst = 0.0;
    for (int b = 0; b < 2; ++b)
        worst = fmax(worst, fabs((double)out[b] - (double)ref_out[b]) / (1.0 + fabs((double)ref_out[b])));
    printf("convpool %d.%d.%d: out = [%.6f, %.6f], reference [%.6f, %.6f], cuda %s: %s\n",
           CONVPOOL_VERSION_MAJOR, CONVPOOL_VERSION_MINOR, CONVPOOL_VERSION_PATCH, (double)out[0],
           (double)out[1], (double)ref_out[0], (double)ref_out[1],
           convpool_cuda_available() ? "available" : "not available", worst < 1e-4 ? "PASS" : "FAIL");
    free(x);
    free(w);
    return worst < 1e-4 ? 0 : 1;
}
