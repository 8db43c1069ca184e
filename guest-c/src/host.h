/* The bspweb_v1 host functions (abi/src/lib.rs has the contract) and what
 * the C runtime's parts share. Private to guest-c/src. */
#ifndef BSPWEB_HOST_H
#define BSPWEB_HOST_H

#include <stdint.h>

#define HOST(name) __attribute__((import_module("bspweb_v1"), import_name(#name)))

HOST(pid) int32_t host_pid(void);
HOST(nprocs) int32_t host_nprocs(void);
HOST(superstep) int32_t host_superstep(void);
HOST(seed) int64_t host_seed(void);
HOST(args_len) int32_t host_args_len(void);
HOST(args_read) void host_args_read(void *dst);
HOST(send) int32_t host_send(int32_t pid, const void *ptr, int32_t len);
HOST(send_range) int32_t host_send_range(int32_t lo, int32_t hi, const void *ptr, int32_t len);
HOST(msg_count) int32_t host_msg_count(void);
HOST(msg_info) int32_t host_msg_info(int32_t index, uint32_t *out);
HOST(msg_read) int32_t host_msg_read(int32_t index, void *dst);
HOST(set_tag) void host_set_tag(int32_t tag);
HOST(msg_tag) int64_t host_msg_tag(int32_t index);
HOST(print) int32_t host_print(int32_t stream, const void *ptr, int32_t len);
HOST(write_raw) int32_t host_write_raw(const void *ptr, int32_t len);
HOST(flush) int32_t host_flush(void);
HOST(abort) __attribute__((noreturn)) void host_abort(const void *ptr, int32_t len);
HOST(resource_len) int64_t host_resource_len(const void *name, int32_t name_len);
HOST(resource_read) int32_t host_resource_read(const void *name, int32_t name_len, void *dst);

#define STATUS_SYNC 0
#define STATUS_DONE 1

/* Ends the superstep: returns to the host (Asyncify unwinds the stack into
 * linear memory) and comes back here when the host resumes the process. */
void bspweb__sync(void);

/* Flushes stdio and the line buffers, then ends the job with `reason`. */
__attribute__((noreturn)) void bspweb__fail(const char *reason);

/* Supersteps this process has completed (what bsp_time reports). */
extern uint32_t bspweb__supersteps;

#endif
