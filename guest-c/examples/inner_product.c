/*
 * inner_product.c: the inner product of two vectors, BSPlib style
 * (Bisseling, "Parallel Scientific Computation", program bspip).
 *
 * Process s of p owns the block [s n / p, (s + 1) n / p) of both vectors,
 * x[i] = (i mod 7) / 2 and y[i] = (i mod 5) + 1, computes its partial sum,
 * and puts it into slot s of the registered array `partial` on every
 * process; after the sync each process adds the p partial sums in pid order,
 * so all of them hold the same result. Every product is a multiple of 1/2
 * below 16, so every partial sum and the total are exact in a double (for
 * n < 2^48): the result does not depend on p, and process 0 checks it
 * against the closed form.
 *
 * With `reps` > 1 the product is computed `reps` times, a superstep each
 * (for benchmarks: the vectors are generated once).
 *
 * Arguments: n (default 1000000), reps (default 1).
 *
 * Build and run on bspweb:
 *     bspweb cc guest-c/examples/inner_product.c -o inner_product.wasm
 *     bspweb submit inner_product.wasm -n 4 --args '["1000000"]' --follow
 * Natively, on one process (guest-c/native/bsp_native.c):
 *     cc -O2 -I guest-c/include guest-c/examples/inner_product.c guest-c/native/bsp_native.c -o inner_product
 *     ./inner_product 1000000
 *
 * Output (process 0, the same for every p):
 *     inner product of 1000000-vectors: 4499993.000000 (closed form 4499993.000000: ok)
 */
#include <stdio.h>
#include <stdlib.h>

#include <bsp.h>

/* Not static: bsp_sync might change them, as far as the compiler knows, so
 * it computes the product again in every repetition. */
double *x_local, *y_local;

/* Σ x[i] y[i] over the local block. Not inlined: a function that never
 * reaches bsp_sync is left alone by Asyncify, which instruments main (on
 * the path to bsp_sync) and, with it, any loop inlined into main. */
__attribute__((noinline)) static double dot(const double *x, const double *y, long long len) {
    double sum = 0;
    for (long long i = 0; i < len; i++) sum += x[i] * y[i];
    return sum;
}

/* The first of the block of `s`: s n / p without overflow. */
static long long block_start(long long n, int p, int s) { return (long long)((__int128)n * s / p); }

/* Σ_{i < n} x[i] y[i] from the period of 35: Σ_{a < 7} a · Σ_{b < 5} (b + 1)
 * = 21 · 15 = 315 per period, halved. */
static double closed_form(long long n) {
    long long periods = n / 35, twice = periods * 315;
    for (long long i = periods * 35; i < n; i++) twice += (i % 7) * (i % 5 + 1);
    return twice / 2.0;
}

static long long parse(const char *text, const char *what, long long min) {
    char *end;
    long long v = strtoll(text, &end, 10);
    if (*text == 0 || *end != 0 || v < min) bsp_abort("%s must be an integer of at least %lld, not \"%s\"", what, min, text);
    return v;
}

int main(int argc, char **argv) {
    bsp_begin(bsp_nprocs());
    int p = bsp_nprocs(), s = bsp_pid();
    long long n = argc > 1 ? parse(argv[1], "n", 0) : 1000000;
    long long reps = argc > 2 ? parse(argv[2], "reps", 1) : 1;
    if (n >= (1LL << 48)) bsp_abort("n = %lld is too large: at most 2^48 - 1 (for exact sums)", n);

    long long lo = block_start(n, p, s), len = block_start(n, p, s + 1) - lo;
    x_local = malloc(sizeof(double) * (size_t)(len ? len : 1));
    y_local = malloc(sizeof(double) * (size_t)(len ? len : 1));
    double *partial = calloc((size_t)p, sizeof(double));
    if (!x_local || !y_local || !partial) bsp_abort("process %d: out of memory for %lld elements", s, len);
    for (long long i = 0; i < len; i++) {
        long long g = lo + i;
        x_local[i] = (double)(g % 7) * 0.5;
        y_local[i] = (double)(g % 5 + 1);
    }
    bsp_push_reg(partial, p * (int)sizeof(double));
    bsp_sync();

    double alpha = 0;
    for (long long r = 0; r < reps; r++) {
        double mine = dot(x_local, y_local, len);
        for (int t = 0; t < p; t++) bsp_put(t, &mine, partial, s * (int)sizeof(double), sizeof(double));
        bsp_sync();
        alpha = 0;
        for (int t = 0; t < p; t++) alpha += partial[t];
    }

    if (s == 0) {
        double expected = closed_form(n);
        printf("inner product of %lld-vectors: %.6f (closed form %.6f: %s)\n", n, alpha, expected,
               alpha == expected ? "ok" : "WRONG");
    }
    bsp_pop_reg(partial);
    bsp_end();
    free(partial);
    free(y_local);
    free(x_local);
    return 0;
}
