/*
 * hrelation: the h-relation superstep of bspweb's `supersteps` example
 * (guest-sdk/examples/supersteps.rs), in C over Open MPI, for comparison in
 * `cargo bench --bench bsp_params`.
 *
 * Each superstep, every process sends h bytes in total, split as evenly as
 * possible over the other p - 1 processes: rank (r + j) % p gets
 * share(h, p - 1, j - 1) bytes for j in 1..p, where share(t, n, i) is
 * t / n plus one for the first t % n parts (bspweb::dist::share). Byte i of
 * what src sends dst in superstep s is (31 src + 17 dst + 7 s + i) mod 256,
 * written before the exchange and checked after it, as the guest does. The
 * exchange is one MPI_Alltoallv followed by one MPI_Barrier (a BSP sync:
 * every message delivered, then everyone past the barrier).
 *
 * Estimator (the one bsp_params uses for bspweb): for each h, run k1 and k2
 * supersteps, each timed from a barrier to the moment the last process is
 * done (MPI_Wtime, max over ranks), keep the minimum of each over the
 * repetitions, and report (T(k2) - T(k1)) / (k2 - k1) per superstep.
 *
 * Usage: mpirun -np P hrelation [-k K1] [-K K2] [-t SECONDS] [-r REPS] H[:K1:K2] ...
 * (defaults K1 = 10, K2 = 110, REPS = 5). With -t, K2 is instead chosen per h
 * (unless given as H:K1:K2) so that K2 - K1 supersteps take about SECONDS,
 * from a pilot run of K1 supersteps. Rank 0 prints, per h, one line
 *   h=<bytes> p=<P> k1=<K1> k2=<K2> t1_s=<s> t2_s=<s> us_per_superstep=<us>
 * and exits non-zero (MPI_Abort) if any byte arrived wrong.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long share(long long total, int parts, int index) {
    return total / parts + (index < total % parts ? 1 : 0);
}

static unsigned char pattern_base(int src, int dst, int step) {
    return (unsigned char)(31u * (unsigned)src + 17u * (unsigned)dst + 7u * (unsigned)step);
}

struct plan {
    int p, rank;
    int *scount, *sdispl, *rcount, *rdispl;
    unsigned char *sbuf, *rbuf;
};

/* Counts and displacements for h (at most INT_MAX bytes per process). */
static void plan_init(struct plan *pl, long long h) {
    int p = pl->p, r = pl->rank;
    long long soff = 0, roff = 0;
    for (int d = 0; d < p; d++) {
        /* What r sends d: j = (d - r) mod p; what d sends r: j = (r - d) mod p. */
        int js = (d - r + p) % p, jr = (r - d + p) % p;
        long long s = (p < 2 || js == 0) ? 0 : share(h, p - 1, js - 1);
        long long q = (p < 2 || jr == 0) ? 0 : share(h, p - 1, jr - 1);
        pl->scount[d] = (int)s;
        pl->sdispl[d] = (int)soff;
        pl->rcount[d] = (int)q;
        pl->rdispl[d] = (int)roff;
        soff += s;
        roff += q;
    }
    free(pl->sbuf);
    free(pl->rbuf);
    pl->sbuf = malloc(soff ? soff : 1);
    pl->rbuf = malloc(roff ? roff : 1);
    if (!pl->sbuf || !pl->rbuf) {
        fprintf(stderr, "hrelation: out of memory for h=%lld\n", h);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

static void superstep(struct plan *pl, int step) {
    int p = pl->p, r = pl->rank;
    for (int d = 0; d < p; d++) {
        unsigned char b = pattern_base(r, d, step), *o = pl->sbuf + pl->sdispl[d];
        for (int i = 0, n = pl->scount[d]; i < n; i++)
            o[i] = (unsigned char)(b + (unsigned char)i);
    }
    MPI_Alltoallv(pl->sbuf, pl->scount, pl->sdispl, MPI_BYTE, pl->rbuf, pl->rcount, pl->rdispl,
                  MPI_BYTE, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    int bad = 0;
    for (int s = 0; s < p; s++) {
        unsigned char b = pattern_base(s, r, step), *in = pl->rbuf + pl->rdispl[s];
        unsigned char diff = 0;
        for (int i = 0, n = pl->rcount[s]; i < n; i++)
            diff |= (unsigned char)(in[i] ^ (unsigned char)(b + (unsigned char)i));
        bad |= diff != 0;
    }
    if (bad) {
        fprintf(stderr, "hrelation: rank %d in superstep %d: corrupted bytes\n", r, step + 1);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

/* Seconds for k supersteps, from a barrier to the last rank's end. */
static double timed(struct plan *pl, int k) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int s = 0; s < k; s++)
        superstep(pl, s);
    double mine = MPI_Wtime() - t0, all;
    MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

static void usage(void) {
    fprintf(stderr, "usage: hrelation [-k K1] [-K K2] [-t SECONDS] [-r REPS] H[:K1:K2] ...\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    struct plan pl = {0};
    MPI_Comm_size(MPI_COMM_WORLD, &pl.p);
    MPI_Comm_rank(MPI_COMM_WORLD, &pl.rank);
    pl.scount = calloc(pl.p, sizeof(int));
    pl.sdispl = calloc(pl.p, sizeof(int));
    pl.rcount = calloc(pl.p, sizeof(int));
    pl.rdispl = calloc(pl.p, sizeof(int));
    int k1 = 10, k2 = 110, reps = 5, any = 0;
    double target = 0;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "-k") && a + 1 < argc) {
            k1 = atoi(argv[++a]);
        } else if (!strcmp(argv[a], "-K") && a + 1 < argc) {
            k2 = atoi(argv[++a]);
        } else if (!strcmp(argv[a], "-t") && a + 1 < argc) {
            target = atof(argv[++a]);
        } else if (!strcmp(argv[a], "-r") && a + 1 < argc) {
            reps = atoi(argv[++a]);
        } else {
            long long h;
            int a1 = k1, a2 = k2, n = 0;
            int got = sscanf(argv[a], "%lld%n:%d:%d", &h, &n, &a1, &a2);
            if (got < 1 || h < 0 || h > 1LL << 30 || a1 < 0 || a2 <= a1 || reps < 1)
                usage();
            if (got == 1 && argv[a][n] != '\0')
                usage();
            any = 1;
            plan_init(&pl, h);
            /* Warm up (connections, buffers); with -t also the pilot. */
            double pilot = timed(&pl, a1 < 2 ? 2 : a1) / (a1 < 2 ? 2 : a1);
            if (target > 0 && got == 1) {
                /* Every rank has the same pilot (a max over ranks). */
                double k = target / (pilot > 1e-7 ? pilot : 1e-7);
                a2 = a1 + (k < 20 ? 20 : k > 1e6 ? 1000000 : (int)k);
            }
            double t1 = 1e300, t2 = 1e300;
            for (int i = 0; i < reps; i++) {
                double x = timed(&pl, a1), y = timed(&pl, a2);
                t1 = x < t1 ? x : t1;
                t2 = y < t2 ? y : t2;
            }
            if (pl.rank == 0) {
                printf("h=%lld p=%d k1=%d k2=%d t1_s=%.6f t2_s=%.6f us_per_superstep=%.3f\n", h,
                       pl.p, a1, a2, t1, t2, (t2 - t1) / (a2 - a1) * 1e6);
                fflush(stdout);
            }
        }
    }
    if (!any)
        usage();
    MPI_Finalize();
    return 0;
}
