/*
 * bsp.h: BSPlib for bspweb C guests.
 *
 * The BSPlib API of Hill et al. (1998) as BSPonMPI offers it: SPMD
 * sections, direct remote memory access (DRMA: bsp_push_reg, bsp_put,
 * bsp_get) and bulk synchronous message passing (BSMP: bsp_send, bsp_move).
 * Build with `bspweb cc`, which compiles your C to a bspweb_v1 module.
 *
 * Semantics (docs/c-guests.md has the details):
 * - Registrations (bsp_push_reg, bsp_pop_reg) and tag sizes
 *   (bsp_set_tagsize) take effect at the next bsp_sync; every process must
 *   make the same calls in the same order.
 * - bsp_put and bsp_hpput copy the source when called; bsp_get and
 *   bsp_hpget read the remote memory at the end of the superstep, before any
 *   put of that superstep is applied, and their results are written before
 *   the puts, so a put wins over a get of the same bytes.
 * - Errors end the job with a message naming the function and the problem.
 * - bsp_time() is deterministic: the number of supersteps this process has
 *   completed (a guest sees no clock, so output is reproducible and survives
 *   restores bit for bit).
 */
#ifndef BSPWEB_BSP_H
#define BSPWEB_BSP_H

#ifdef __cplusplus
extern "C" {
#endif

typedef int bsp_pid_t;
typedef int bsp_nprocs_t;
typedef int bsp_size_t;

/* SPMD */
void bsp_init(void (*spmd)(void), int argc, char *argv[]);
void bsp_begin(bsp_pid_t maxprocs);
void bsp_end(void);
void bsp_abort(const char *format, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* Enquiry */
bsp_nprocs_t bsp_nprocs(void);
bsp_pid_t bsp_pid(void);
double bsp_time(void);

/* Superstep */
void bsp_sync(void);

/* DRMA */
void bsp_push_reg(const void *ident, bsp_size_t size);
void bsp_pop_reg(const void *ident);
void bsp_put(bsp_pid_t pid, const void *src, void *dst, bsp_size_t offset, bsp_size_t nbytes);
void bsp_hpput(bsp_pid_t pid, const void *src, void *dst, bsp_size_t offset, bsp_size_t nbytes);
void bsp_get(bsp_pid_t pid, const void *src, bsp_size_t offset, void *dst, bsp_size_t nbytes);
void bsp_hpget(bsp_pid_t pid, const void *src, bsp_size_t offset, void *dst, bsp_size_t nbytes);

/* BSMP */
void bsp_set_tagsize(bsp_size_t *tag_nbytes);
void bsp_send(bsp_pid_t pid, const void *tag, const void *payload, bsp_size_t payload_nbytes);
void bsp_qsize(bsp_nprocs_t *nmessages, bsp_size_t *accum_nbytes);
void bsp_get_tag(bsp_size_t *status, void *tag);
void bsp_move(void *payload, bsp_size_t reception_nbytes);
bsp_size_t bsp_hpmove(void **tag_ptr_buf, void **payload_ptr_buf);

#ifdef __cplusplus
}
#endif

#endif
