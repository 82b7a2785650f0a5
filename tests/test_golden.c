/*
 * PyTorch golden files (tests/golden, made by make_golden.py): the reference and the fused
 * CPU path against PyTorch's float64 and float32 results, P and out, for every file in the
 * manifest. Tolerances come from the error models in check.c:
 *   reference vs float64: double sums on both sides, then one rounding to float (1 ulp);
 *   fused CPU vs float64: worst-case float32 accumulation bounds (check_tol_fp32);
 *   anything vs PyTorch float32: both sides' budgets added.
 * PyTorch's own float32 result must also satisfy the float32 model: that checks the model.
 */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CONVPOOL_GOLDEN_DIR
#define CONVPOOL_GOLDEN_DIR "tests/golden"
#endif

enum { MAX_FILES = 256 };

static double max_abs_err(const float *got, const double *exp, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; ++i)
        if (isfinite(exp[i]) && isfinite((double)got[i]) && fabs((double)got[i] - exp[i]) > m)
            m = fabs((double)got[i] - exp[i]);
    return m;
}

static void run_file(const char *dir, const char *name)
{
    char path[1024], label[256];
    check_golden g;
    snprintf(path, sizeof path, "%.880s/%.127s", dir, name);
    if (check_golden_load(path, &g) != 0) {
        CHECK(0, "cannot load golden file %s", path);
        return;
    }
    const convpool_problem *p = &g.p;
    const int64_t B = p->batch, np = p->batch * p->out_channels;
    float *ref_p = (float *)check_alloc(sizeof(float) * (size_t)np);
    float *ref_o = (float *)check_alloc(sizeof(float) * (size_t)B);
    float *cpu_p = (float *)check_alloc(sizeof(float) * (size_t)np);
    float *cpu_o = (float *)check_alloc(sizeof(float) * (size_t)B);
    if (!ref_p || !ref_o || !cpu_p || !cpu_o)
        goto done;

    check_poison(ref_p, np);
    check_poison(ref_o, B);
    convpool_status s =
        convpool_forward_reference(p, g.x, g.weight, g.conv_bias, g.bias, ref_p, ref_o);
    CHECK(s == CONVPOOL_OK, "%s: reference returned %s: %s", name, convpool_status_name(s),
          convpool_last_error());
    check_poison(cpu_p, np);
    check_poison(cpu_o, B);
    s = convpool_forward_cpu(p, g.x, g.weight, g.conv_bias, g.bias, cpu_p, cpu_o, 0);
    CHECK(s == CONVPOOL_OK, "%s: cpu returned %s: %s", name, convpool_status_name(s),
          convpool_last_error());
    CHECK(check_count_poison(ref_p, np) == 0 && check_count_poison(ref_o, B) == 0,
          "%s: reference left outputs unwritten", name);
    CHECK(check_count_poison(cpu_p, np) == 0 && check_count_poison(cpu_o, B) == 0,
          "%s: cpu left outputs unwritten", name);

    const check_tol t32 = check_tol_fp32(p), t64 = check_tol_fp64(p);
    /* Reference vs PyTorch float64: two double computations (both sums' errors) and the
     * reference's one rounding to float (t64.rtol). */
    check_tol ref64 = t64;
    ref64.conv_rel *= 2.0;
    ref64.mean_rel *= 2.0;
    double r_ref64 = 0, r_ref32 = 0, r_cpu64 = 0, r_cpu32 = 0, r_torch = 0;
    int64_t bad = 0;

    snprintf(label, sizeof label, "%s reference vs torch float64", name);
    bad += check_forward(label, p, g.x, g.weight, g.conv_bias, g.bias, ref_p, ref_o, g.p64, g.out64, ref64,
                         &r_ref64);
    snprintf(label, sizeof label, "%s reference vs torch float32", name);
    bad += check_forward_f(label, p, g.x, g.weight, g.conv_bias, g.bias, ref_p, ref_o, g.p32, g.out32,
                           check_tol_add(t32, t64), &r_ref32);
    snprintf(label, sizeof label, "%s cpu vs torch float64", name);
    bad += check_forward(label, p, g.x, g.weight, g.conv_bias, g.bias, cpu_p, cpu_o, g.p64, g.out64, t32,
                         &r_cpu64);
    snprintf(label, sizeof label, "%s cpu vs torch float32", name);
    bad += check_forward_f(label, p, g.x, g.weight, g.conv_bias, g.bias, cpu_p, cpu_o, g.p32, g.out32,
                           check_tol_add(t32, t32), &r_cpu32);
    /* The float32 model must hold PyTorch's own float32 result, or the model is wrong. */
    snprintf(label, sizeof label, "%s torch float32 vs torch float64 (error model check)", name);
    bad += check_forward(label, p, g.x, g.weight, g.conv_bias, g.bias, g.p32, g.out32, g.p64, g.out64, t32,
                         &r_torch);
    CHECK(bad == 0, "%s: %lld mismatching values (details above)", name, (long long)bad);

    /* Max |error| of P against float64: the fused path beside PyTorch's own float32 error. */
    printf("%-28s err/tol: ref64 %.2e ref32 %.2e cpu64 %.2e cpu32 %.2e torch32 %.2e | "
           "max|P-P64|: cpu %.2e torch32 %.2e ref %.2e\n",
           name, r_ref64, r_ref32, r_cpu64, r_cpu32, r_torch, max_abs_err(cpu_p, g.p64, np),
           max_abs_err(g.p32, g.p64, np), max_abs_err(ref_p, g.p64, np));
done:
    free(ref_p);
    free(ref_o);
    free(cpu_p);
    free(cpu_o);
    check_golden_free(&g);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : CONVPOOL_GOLDEN_DIR;
    static char names[MAX_FILES][128];
    const int n = check_golden_manifest(dir, names, MAX_FILES);
    CHECK(n >= 16, "found %d golden files in %s/manifest.txt, want at least 16", n, dir);
    for (int i = 0; i < n; ++i)
        run_file(dir, names[i]);
    printf("test_golden: %d golden files\n", n < 0 ? 0 : n);
    return check_exit_code("test_golden");
}
