/*
 * bspweb.h: what a bspweb C guest can use besides BSPlib (bsp.h) and the C
 * library: the job's arguments and seed, raw output records, job resources.
 *
 * Communicate through bsp.h only: its messages carry BSPlib's own framing.
 */
#ifndef BSPWEB_BSPWEB_H
#define BSPWEB_BSPWEB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The job's arguments as JSON text (`bspweb submit --args`), NUL-terminated
 * in `buf` if it fits. Returns the text's length (without the NUL); when that
 * is >= `size`, nothing was written. A JSON array of strings and numbers is
 * also passed to main as argv[1..]. */
size_t bspweb_args(char *buf, size_t size);

/* The job's seed: the same on every process and in every run of the job. */
uint64_t bspweb_seed(void);

/* One raw output record for the user (`bspweb submit --raw-dir`). Returns 0,
 * or a negative error code. */
int bspweb_write_raw(const void *data, size_t len);

/* Size of the job resource `name`, or -1 if the job has none by that name. */
long long bspweb_resource_size(const char *name);

/* Copy the job resource `name` into `dst` (bspweb_resource_size bytes).
 * Returns 0, or -1 if there is no such resource. */
int bspweb_resource_read(const char *name, void *dst);

#ifdef __cplusplus
}
#endif

#endif
