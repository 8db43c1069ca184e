/*
 * The fault tests' guest program in C with BSPlib (tests/all/faults.rs):
 * the same computation and output, record for record, as the WebAssembly
 * text guest `program_wat` there, so the harness's native model checks its
 * failure-free run too. Per pid p and superstep s:
 *
 * 1. acc = mix(seed, p) at s = 0; else fold in the message of every pid
 *    (in order of source, as bsp_move delivers them here) after checking
 *    its source, superstep, length and payload: acc = mix(acc, v ^ src << 32);
 *    (bsp_move hands them out in another order; they are folded by source)
 * 2. fold in one word of state written supersteps ago, mix `work` rounds,
 *    rewrite `dirty` of the `ballast` 64 KiB state pages with acc + j;
 * 3. print "pid p step s acc ..." (stdout) and "... chk ..." (stderr),
 *    write a 24-byte raw record p, s, acc, chk;
 * 4. at s = steps print "pid p done after steps supersteps" and end; else
 *    send mix(acc, d) (padded to `payload` bytes) to every pid d and sync.
 *
 * `acc` and `s` live in main's locals across bsp_sync: a restore must bring
 * back the stack that Asyncify saved, not only the heap.
 *
 * Arguments (a JSON array): steps work payload ballast dirty.
 */
#include <bsp.h>
#include <bspweb.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORDS 8192 /* u64 words in a 64 KiB page */

static uint64_t mix(uint64_t a, uint64_t b) {
    uint64_t x = (a ^ b) * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

static uint8_t pattern(uint32_t src, uint32_t step, uint32_t j) {
    return (uint8_t)(src * 31u + step * 7u + j);
}

int main(int argc, char **argv) {
    if (argc != 6) bsp_abort("usage: steps work payload ballast dirty (got %d arguments)", argc - 1);
    uint32_t steps = (uint32_t)atol(argv[1]), work = (uint32_t)atol(argv[2]);
    uint32_t payload = (uint32_t)atol(argv[3]), ballast = (uint32_t)atol(argv[4]);
    uint32_t dirty = (uint32_t)atol(argv[5]);
    if (payload < 16 || ballast < 1 || dirty < 1 || dirty > ballast) bsp_abort("bad workload arguments");

    bsp_begin(bsp_nprocs());
    uint32_t p = (uint32_t)bsp_pid(), n = (uint32_t)bsp_nprocs();
    uint64_t *state = calloc((size_t)ballast * WORDS, sizeof(uint64_t));
    uint8_t *msg = malloc(payload);
    uint64_t *value = malloc(n * sizeof(uint64_t));
    uint8_t *seen = calloc(n, 1);
    if (!state || !msg || !value || !seen) bsp_abort("out of memory");

    uint64_t acc = 0;
    for (uint32_t s = 0;; s++) {
        if (s == 0) {
            acc = mix(bspweb_seed(), p);
        } else {
            bsp_nprocs_t count;
            bsp_size_t bytes;
            bsp_qsize(&count, &bytes);
            if ((uint32_t)count != n) bsp_abort("wrong number of messages");
            /* bsp_move hands messages out last received first (as
             * BSPonMPI): take them all, then fold them in by source. */
            for (uint32_t i = 0; i < n; i++) {
                bsp_size_t len;
                bsp_get_tag(&len, NULL);
                if ((uint32_t)len != payload) bsp_abort("a message has the wrong source, superstep or length");
                bsp_move(msg, payload);
                uint64_t v;
                uint32_t from, step;
                memcpy(&v, msg, 8);
                memcpy(&from, msg + 8, 4);
                memcpy(&step, msg + 12, 4);
                if (from >= n || seen[from] || step != s - 1)
                    bsp_abort("a message has the wrong source, superstep or length");
                for (uint32_t j = 16; j < payload; j++)
                    if (msg[j] != pattern(from, step, j)) bsp_abort("a message payload is corrupted");
                seen[from] = 1;
                value[from] = v;
            }
            for (uint32_t src = 0; src < n; src++) {
                acc = mix(acc, value[src] ^ ((uint64_t)src << 32));
                seen[src] = 0;
            }
        }
        uint32_t page = (s + 1) * dirty % ballast;
        acc = mix(acc, state[(size_t)page * WORDS + (s & 8191)]);
        for (uint32_t i = 0; i < work; i++) acc = mix(acc, i);
        for (uint32_t q = 0; q < dirty; q++) {
            uint64_t *pg = state + (size_t)((s * dirty + q) % ballast) * WORDS;
            for (uint32_t j = 0; j < WORDS; j++) pg[j] = acc + j;
        }
        uint64_t chk = mix(acc, 0xE77);
        printf("pid %08" PRIx32 " step %08" PRIx32 " acc %016" PRIx64 "\n", p, s, acc);
        fprintf(stderr, "pid %08" PRIx32 " step %08" PRIx32 " chk %016" PRIx64 "\n", p, s, chk);
        uint8_t raw[24];
        memcpy(raw, &p, 4);
        memcpy(raw + 4, &s, 4);
        memcpy(raw + 8, &acc, 8);
        memcpy(raw + 16, &chk, 8);
        if (bspweb_write_raw(raw, sizeof raw) < 0) bsp_abort("a host call failed");
        if (s == steps) {
            printf("pid %08" PRIx32 " done after %08" PRIx32 " supersteps\n", p, steps);
            break;
        }
        for (uint32_t d = 0; d < n; d++) {
            uint64_t v = mix(acc, d);
            memcpy(msg, &v, 8);
            memcpy(msg + 8, &p, 4);
            memcpy(msg + 12, &s, 4);
            for (uint32_t j = 16; j < payload; j++) msg[j] = pattern(p, s, j);
            bsp_send((bsp_pid_t)d, NULL, msg, (bsp_size_t)payload);
        }
        bsp_sync();
    }
    bsp_end();
    return 0;
}
