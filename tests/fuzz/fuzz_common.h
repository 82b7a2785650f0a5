/* Shared by the fuzz targets of this folder: the verbose switch and the problem printout. */
#ifndef CONVPOOL_FUZZ_COMMON_H
#define CONVPOOL_FUZZ_COMMON_H

#include "convpool.h"

#include <stdio.h>
#include <stdlib.h>

/* CONVPOOL_FUZZ_VERBOSE=1 prints every decoded problem (to check seeds, or to read a crash). */
static inline int fuzz_verbose(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CONVPOOL_FUZZ_VERBOSE");
        v = e && e[0] && e[0] != '0';
    }
    return v;
}

/* "  problem: batch .. divisor .." without a newline, for the target to finish the line. */
static inline void fuzz_print_problem(const convpool_problem *p)
{
    fprintf(stderr,
            "  problem: batch %lld cin %lld cout %lld in %lld %lld %lld kernel %lld %lld %lld "
            "pool %lld %lld %lld divisor %.17g",
            (long long)p->batch, (long long)p->in_channels, (long long)p->out_channels, (long long)p->in_d,
            (long long)p->in_h, (long long)p->in_w, (long long)p->kernel_d, (long long)p->kernel_h,
            (long long)p->kernel_w, (long long)p->pool_d, (long long)p->pool_h, (long long)p->pool_w, p->divisor);
}

#endif /* CONVPOOL_FUZZ_COMMON_H */
