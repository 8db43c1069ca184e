/*
 * prefix_sum.c: the parallel prefix sum (scan) of n integers, BSPlib style
 * (Bisseling, "Parallel Scientific Computation", exercise 1.2 / bspscan).
 *
 * Process s of p owns the block [s n / p, (s + 1) n / p) of the input
 * a[i] = (i mod 100) + 1 and, in three supersteps:
 *
 *  1. scans its block locally and sends its block total to every process
 *     after it with bsp_send (the tag is the sender's pid: BSMP);
 *  2. adds the totals it received (in any order: integer addition) to every
 *     element of its block, which is now the global prefix sum, and checks
 *     each against the closed form S(k) = 5050 (k / 100) + r (r + 1) / 2
 *     with r = k mod 100, for the first k = i + 1 elements;
 *  3. process 0 fetches every process's error count and last prefix with
 *     bsp_get from a registered array, and prints one line.
 *
 * Arguments: n (default 1000000).
 *
 * Build and run on bspweb:
 *     bspweb cc guest-c/examples/prefix_sum.c -o prefix_sum.wasm
 *     bspweb submit prefix_sum.wasm -n 4 --args '["1000000"]' --follow
 * Natively, on one process (guest-c/native/bsp_native.c):
 *     cc -O2 -I guest-c/include guest-c/examples/prefix_sum.c guest-c/native/bsp_native.c -o prefix_sum
 *
 * Output (process 0, the same for every p):
 *     prefix sums of 1000000 integers: total 50500000, 1000000 of 1000000 prefixes match the closed form: ok
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <bsp.h>

/* The first of the block of `s`: s n / p without overflow. */
static int64_t block_start(int64_t n, int p, int s) { return (int64_t)((__int128)n * s / p); }

/* a[0] + … + a[k - 1] for a[i] = (i mod 100) + 1. */
static int64_t closed_form(int64_t k) {
    int64_t r = k % 100;
    return 5050 * (k / 100) + r * (r + 1) / 2;
}

int main(int argc, char **argv) {
    bsp_begin(bsp_nprocs());
    int p = bsp_nprocs(), s = bsp_pid();
    int64_t n = 1000000;
    if (argc > 1) {
        char *end;
        n = strtoll(argv[1], &end, 10);
        if (*argv[1] == 0 || *end != 0 || n < 0 || n > (INT64_C(1) << 40))
            bsp_abort("n must be an integer from 0 to 2^40, not \"%s\"", argv[1]);
    }
    int64_t lo = block_start(n, p, s), len = block_start(n, p, s + 1) - lo;
    int64_t *a = malloc(sizeof(int64_t) * (size_t)(len ? len : 1));
    if (!a) bsp_abort("process %d: out of memory for %" PRId64 " elements", s, len);
    for (int64_t i = 0; i < len; i++) a[i] = (lo + i) % 100 + 1;

    /* Superstep 1: local scan; the block total to every later process. */
    for (int64_t i = 1; i < len; i++) a[i] += a[i - 1];
    int64_t total = len ? a[len - 1] : 0;
    bsp_size_t tagsize = sizeof(int);
    bsp_set_tagsize(&tagsize);
    /* report[0]: mismatches, report[1]: the last prefix of the block. */
    int64_t report[2] = {0, 0};
    bsp_push_reg(report, sizeof report);
    bsp_sync();
    for (int t = s + 1; t < p; t++) bsp_send(t, &s, &total, sizeof total);
    bsp_sync();

    /* Superstep 2: add the earlier blocks' totals; check every prefix. */
    bsp_nprocs_t messages;
    bsp_size_t bytes;
    bsp_qsize(&messages, &bytes);
    if (messages != s) bsp_abort("process %d received %d block totals, not %d", s, messages, s);
    int64_t offset = 0;
    for (int m = 0; m < messages; m++) {
        bsp_size_t size;
        int from;
        int64_t t;
        bsp_get_tag(&size, &from);
        if (size != sizeof t || from < 0 || from >= s) bsp_abort("process %d: a malformed block total from %d", s, from);
        bsp_move(&t, sizeof t);
        offset += t;
    }
    for (int64_t i = 0; i < len; i++) {
        a[i] += offset;
        if (a[i] != closed_form(lo + i + 1)) report[0]++;
    }
    report[1] = len ? a[len - 1] : offset;
    bsp_sync();

    /* Superstep 3: process 0 collects the reports. */
    int64_t *reports = malloc(sizeof(int64_t) * 2 * (size_t)p);
    if (!reports) bsp_abort("out of memory");
    if (s == 0)
        for (int t = 0; t < p; t++) bsp_get(t, report, 0, &reports[2 * t], sizeof report);
    bsp_sync();
    if (s == 0) {
        int64_t wrong = 0;
        for (int t = 0; t < p; t++) wrong += reports[2 * t];
        int64_t last = reports[2 * (p - 1) + 1];
        int ok = wrong == 0 && last == closed_form(n);
        printf("prefix sums of %" PRId64 " integers: total %" PRId64 ", %" PRId64 " of %" PRId64
               " prefixes match the closed form: %s\n",
               n, last, n - wrong, n, ok ? "ok" : "WRONG");
    }
    bsp_pop_reg(report);
    bsp_end();
    free(reports);
    free(a);
    return 0;
}
