/*
 * pagerank.c: PageRank of a generated graph, block-distributed, in C with
 * BSPlib: the kernel of the Rust guest guest-sdk/examples/pagerank.rs
 * (guest-sdk/examples/pagerank/kernel.rs has the graph generator and the
 * argument why the result is the same for every number of processes), with
 * the same arguments and the same output, byte for byte.
 *
 * The graph: n vertices, exactly m edges; edge e comes from the (e + 1)-th
 * output of SplitMix64 seeded with `seed` (uniform source, target skewed
 * toward low ids), so any process computes any edge alone. Ranks are
 * fixed-point integers (ONE = 10^15): every division involves one vertex's
 * values, and values of different vertices are only added as integers, so
 * the ranks do not depend on p.
 *
 * Process s of p owns the vertices [s n / p, (s + 1) n / p) and their
 * out-lists (CSR). Each of the `iters` supersteps:
 *  1. scatter: push each owned vertex's share r / deg along its out-edges
 *     into an accumulator with an entry per vertex of the graph; sum the
 *     owned dangling vertices' ranks;
 *  2. bsp_put to every other process q, into row s of q's registered
 *     receive buffer, this process's dangling sum and then the accumulator
 *     entries of q's vertices (puts of at most 1 MiB); zero the entries sent
 *     (bsp_put copied them; zeroed before the sync their pages are the same
 *     as at the last checkpoint); bsp_sync;
 *  3. add the rows received into the owned entries and the dangling sums
 *     into the total, then update the owned ranks:
 *     r'(v) = (15 ONE + 85 D) / (100 n) + 85 in(v) / 100.
 * Then every process puts the summary of its block (count of dangling
 * vertices, sum of ranks, last change, checksum, top 5) to process 0,
 * which prints:
 *
 *     pagerank of {n} vertices ({dangling} dangling), {m} edges, seed {seed}, damping 0.85, {iters} iterations
 *     sum of ranks 0.999999999…
 *     change in the last iteration (L1) 0.000000…
 *     top 1: vertex {v} rank 0.00…          (5 lines, or n if fewer)
 *     checksum {16 hex digits}
 *
 * Arguments: n m iters [seed] (default 200000 1000000 100 1; the Rust
 * guest's {"n", "m", "iters", "seed"}).
 *
 * Build and run on bspweb:
 *     bspweb cc guest-c/examples/pagerank.c -o pagerank.wasm
 *     bspweb submit pagerank.wasm -n 4 --args '["200000","1000000","100"]' --follow
 * Natively, on one process (guest-c/native/bsp_native.c; benches/c_guest.rs):
 *     cc -O2 -I guest-c/include guest-c/examples/pagerank.c guest-c/native/bsp_native.c -lm -o pagerank
 *     ./pagerank 200000 1000000 100
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <bsp.h>

#define ONE UINT64_C(1000000000000000) /* a rank of 1.0 */
#define DIGITS 15                       /* decimal digits of ONE */
#define DAMPING_PERCENT 85
#define MAX_VERTICES (UINT64_C(1) << 26)
#define MAX_EDGES (UINT64_C(1) << 28)
#define TOP 5
#define CHUNK_WORDS ((1 << 20) / 8) /* words per put: 1 MiB */

/* ---- the graph ------------------------------------------------------------ */

/* The SplitMix64 output function (Steele, Lea and Flood 2014). */
static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Maps a 32-bit value uniformly onto 0..n. */
static uint32_t scale(uint64_t x, uint32_t n) { return (uint32_t)((x * n) >> 32); }

/* Edge e: its source and target. */
static void edge(uint64_t seed, uint32_t n, uint32_t e, uint32_t *src, uint32_t *dst) {
    uint64_t x = mix(seed + ((uint64_t)e + 1) * UINT64_C(0x9e3779b97f4a7c15));
    uint64_t a = x >> 32, b = x & 0xffffffffu;
    *src = scale(a, n);
    *dst = scale((b * b) >> 32, n);
}

/* The out-lists of the vertices lo..hi as CSR: targets[offsets[i] ..
 * offsets[i + 1]] is the out-list of vertex lo + i, in edge order. */
typedef struct {
    uint32_t lo, hi;
    uint32_t *offsets, *targets;
} graph_t;

static void *alloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) bsp_abort("process %d: out of memory (%zu bytes)", bsp_pid(), n * size);
    return p;
}

__attribute__((noinline)) static graph_t generate(uint64_t seed, uint32_t n, uint32_t m, uint32_t lo, uint32_t hi) {
    graph_t g = {lo, hi, alloc((size_t)(hi - lo) + 1, sizeof(uint32_t)), NULL};
    uint32_t len = hi - lo, src, dst;
    for (uint32_t e = 0; e < m; e++) {
        edge(seed, n, e, &src, &dst);
        if (src >= lo && src < hi) g.offsets[src - lo + 1]++;
    }
    for (uint32_t i = 0; i < len; i++) g.offsets[i + 1] += g.offsets[i];
    uint32_t *next = alloc(len, sizeof(uint32_t));
    memcpy(next, g.offsets, len * sizeof(uint32_t));
    g.targets = alloc(g.offsets[len], sizeof(uint32_t));
    for (uint32_t e = 0; e < m; e++) {
        edge(seed, n, e, &src, &dst);
        if (src >= lo && src < hi) g.targets[next[src - lo]++] = dst;
    }
    free(next);
    return g;
}

/* ---- the iteration ---------------------------------------------------------- */

/* The hot loops (generate, scatter, update) are in functions of their own,
 * never inlined into main:
 * Asyncify instruments every function on a path to bsp_sync (main, here)
 * and leaves the others as clang compiled them. */

/* Pushes every owned vertex's share into acc (the owned entries cleared
 * first, the others zero already); returns the owned dangling rank. */
__attribute__((noinline)) static uint64_t scatter(const graph_t *g, const uint64_t *ranks, uint64_t *acc) {
    uint32_t len = g->hi - g->lo;
    memset(acc + g->lo, 0, len * sizeof(uint64_t));
    uint64_t dangling = 0;
    for (uint32_t i = 0; i < len; i++) {
        uint32_t begin = g->offsets[i], end = g->offsets[i + 1];
        if (begin == end) {
            dangling += ranks[i];
            continue;
        }
        uint64_t share = ranks[i] / (end - begin);
        for (uint32_t k = begin; k < end; k++) acc[g->targets[k]] += share;
    }
    return dangling;
}

/* The next ranks from the accumulated shares and the total dangling rank;
 * returns Σ |r' − r|. */
__attribute__((noinline)) static uint64_t update(const graph_t *g, uint32_t n, uint64_t dangling, const uint64_t *acc, uint64_t *ranks) {
    uint64_t base = (uint64_t)(((unsigned __int128)15 * ONE + (unsigned __int128)DAMPING_PERCENT * dangling) /
                               ((unsigned __int128)100 * n));
    uint64_t delta = 0;
    for (uint32_t i = 0; i < g->hi - g->lo; i++) {
        uint64_t next = base + acc[g->lo + i] * DAMPING_PERCENT / 100;
        delta += next > ranks[i] ? next - ranks[i] : ranks[i] - next;
        ranks[i] = next;
    }
    return delta;
}

/* ---- the summary ------------------------------------------------------------ */

/* The words of a summary as it travels: dangling, sum, delta, checksum, the
 * number of top entries, then (vertex, rank) pairs, highest first. */
enum { S_DANGLING, S_SUM, S_DELTA, S_CHECKSUM, S_NTOP, S_TOP, S_WORDS = S_TOP + 2 * TOP };

/* Adds (v, r) to the top list if it belongs there: highest rank first,
 * ties by lower vertex. */
static void offer(uint64_t *s, uint64_t v, uint64_t r) {
    uint64_t *top = s + S_TOP, len = s[S_NTOP];
#define BEFORE(v1, r1, v2, r2) ((r1) > (r2) || ((r1) == (r2) && (v1) < (v2)))
    if (len == TOP && !BEFORE(v, r, top[2 * (TOP - 1)], top[2 * (TOP - 1) + 1])) return;
    uint64_t at = 0;
    while (at < len && BEFORE(top[2 * at], top[2 * at + 1], v, r)) at++;
    if (len < TOP) len++;
    for (uint64_t k = len - 1; k > at; k--) {
        top[2 * k] = top[2 * (k - 1)];
        top[2 * k + 1] = top[2 * (k - 1) + 1];
    }
    top[2 * at] = v;
    top[2 * at + 1] = r;
    s[S_NTOP] = len;
#undef BEFORE
}

static void summarize(const graph_t *g, const uint64_t *ranks, uint64_t delta, uint64_t *s) {
    memset(s, 0, S_WORDS * sizeof(uint64_t));
    s[S_DELTA] = delta;
    for (uint32_t i = 0; i < g->hi - g->lo; i++) {
        uint64_t v = g->lo + i, r = ranks[i];
        if (g->offsets[i] == g->offsets[i + 1]) s[S_DANGLING]++;
        s[S_SUM] += r;
        s[S_CHECKSUM] += mix(mix(v ^ UINT64_C(0x5052414e4b21)) ^ r);
        offer(s, v, r);
    }
}

static void merge(uint64_t *total, const uint64_t *part) {
    for (int k = S_DANGLING; k <= S_CHECKSUM; k++) total[k] += part[k];
    for (uint64_t i = 0; i < part[S_NTOP] && i < TOP; i++) offer(total, part[S_TOP + 2 * i], part[S_TOP + 2 * i + 1]);
}

static void print_fixed(const char *before, uint64_t x) {
    printf("%s%" PRIu64 ".%0*" PRIu64 "\n", before, x / ONE, DIGITS, x % ONE);
}

/* ---- the program ---------------------------------------------------------------- */

/* argv[i] as a decimal integer of at most `max`, or `dflt` if absent. */
static uint64_t parse(int argc, char **argv, int i, const char *what, uint64_t dflt, uint64_t max) {
    if (argc <= i) return dflt;
    const char *t = argv[i];
    uint64_t v = 0;
    int ok = *t != 0;
    for (; *t && ok; t++) {
        unsigned d = (unsigned)(*t - '0');
        ok = d < 10 && v <= (max - d) / 10;
        v = v * 10 + d;
    }
    if (!ok) bsp_abort("%s must be an integer from 0 to %" PRIu64 ", not \"%s\"", what, max, argv[i]);
    return v;
}

/* The first vertex of the block of `s`: s n / p. */
static uint32_t block_start(uint32_t n, int p, int s) { return (uint32_t)((uint64_t)n * (uint64_t)s / (uint64_t)p); }

int main(int argc, char **argv) {
    bsp_begin(bsp_nprocs());
    int p = bsp_nprocs(), s = bsp_pid();
    uint64_t n64 = parse(argc, argv, 1, "n (vertices)", 200000, MAX_VERTICES);
    uint32_t m = (uint32_t)parse(argc, argv, 2, "m (edges)", 1000000, MAX_EDGES);
    uint32_t iters = (uint32_t)parse(argc, argv, 3, "iters", 100, UINT32_MAX);
    uint64_t seed = parse(argc, argv, 4, "seed", 1, UINT64_MAX);
    if (n64 == 0) bsp_abort("n must be at least 1 (the graph needs a vertex)");
    uint32_t n = (uint32_t)n64;

    uint32_t lo = block_start(n, p, s), hi = block_start(n, p, s + 1);
    uint32_t row = 1 + (n + (uint32_t)p - 1) / (uint32_t)p; /* the dangling sum, then a block */
    graph_t g = generate(seed, n, m, lo, hi);
    uint64_t *ranks = alloc(hi - lo, sizeof(uint64_t));
    for (uint32_t i = 0; i < hi - lo; i++) ranks[i] = ONE / n;
    uint64_t *acc = alloc(n, sizeof(uint64_t));
    /* Row t holds what process t sent (this process's row is unused). */
    uint64_t *recv = alloc((size_t)p * row, sizeof(uint64_t));
    uint64_t *summaries = alloc((size_t)p * S_WORDS, sizeof(uint64_t));
    bsp_push_reg(recv, (bsp_size_t)((size_t)p * row * sizeof(uint64_t)));
    bsp_push_reg(summaries, (bsp_size_t)((size_t)p * S_WORDS * sizeof(uint64_t)));
    bsp_sync();

    uint64_t delta = 0;
    for (uint32_t it = 0; it < iters; it++) {
        uint64_t own_dangling = scatter(&g, ranks, acc);
        for (int q = 0; q < p; q++) {
            if (q == s) continue;
            bsp_size_t at = (bsp_size_t)(((size_t)s * row) * sizeof(uint64_t));
            bsp_put(q, &own_dangling, recv, at, sizeof(uint64_t));
            uint32_t qlo = block_start(n, p, q), qhi = block_start(n, p, q + 1);
            for (uint32_t v = qlo; v < qhi; v += CHUNK_WORDS) {
                uint32_t words = qhi - v < CHUNK_WORDS ? qhi - v : CHUNK_WORDS;
                bsp_put(q, &acc[v], recv, at + (bsp_size_t)((1 + v - qlo) * sizeof(uint64_t)),
                        (bsp_size_t)(words * sizeof(uint64_t)));
            }
        }
        /* Sent (bsp_put copies): zero until the next scatter. */
        memset(acc, 0, lo * sizeof(uint64_t));
        memset(acc + hi, 0, (n - hi) * sizeof(uint64_t));
        bsp_sync();

        uint64_t dangling = own_dangling;
        for (int t = 0; t < p; t++) {
            if (t == s) continue;
            const uint64_t *in = recv + (size_t)t * row;
            dangling += in[0];
            for (uint32_t i = 0; i < hi - lo; i++) acc[lo + i] += in[1 + i];
        }
        delta = update(&g, n, dangling, acc, ranks);
    }

    uint64_t mine[S_WORDS];
    summarize(&g, ranks, delta, mine);
    if (s != 0) bsp_put(0, mine, summaries, (bsp_size_t)(s * S_WORDS * sizeof(uint64_t)), sizeof mine);
    bsp_sync();
    if (s == 0) {
        for (int t = 1; t < p; t++) merge(mine, summaries + (size_t)t * S_WORDS);
        printf("pagerank of %" PRIu32 " vertices (%" PRIu64 " dangling), %" PRIu32 " edges, seed %" PRIu64
               ", damping 0.85, %" PRIu32 " iterations\n",
               n, mine[S_DANGLING], m, seed, iters);
        print_fixed("sum of ranks ", mine[S_SUM]);
        print_fixed("change in the last iteration (L1) ", mine[S_DELTA]);
        for (uint64_t i = 0; i < mine[S_NTOP]; i++) {
            printf("top %" PRIu64 ": vertex %" PRIu64 " rank ", i + 1, mine[S_TOP + 2 * i]);
            print_fixed("", mine[S_TOP + 2 * i + 1]);
        }
        printf("checksum %016" PRIx64 "\n", mine[S_CHECKSUM]);
    }
    bsp_pop_reg(summaries);
    bsp_pop_reg(recv);
    bsp_end();
    return 0;
}
