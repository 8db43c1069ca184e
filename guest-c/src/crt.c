/*
 * crt.c: the process model of a bspweb C guest.
 *
 * The host calls the export `bspweb_resume` once per superstep. The first
 * call runs the constructors and `main`; `bsp_sync` (through bspweb__sync)
 * unwinds the whole C call stack into linear memory with Binaryen's
 * Asyncify and returns STATUS_SYNC; the next call rewinds it and `bsp_sync`
 * returns. Between calls no WebAssembly frame is live: memory plus the
 * mutable globals (the C stack pointer and Asyncify's two) are the whole
 * state, which is what a checkpoint records.
 *
 * `bspweb cc` runs `wasm-opt --asyncify` with this file's bspweb_resume on
 * the remove-list (it drives the unwinding and must not be instrumented).
 *
 * The C library is Debian's wasi-libc; its WASI calls are answered here,
 * inside the module, so the module imports only bspweb_v1: stdout and
 * stderr go to the job's output line by line, argv comes from the job's
 * arguments, clocks are deterministic, and there is no file system.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/bspweb.h"
#include "host.h"

#define ASYNCIFY(name) __attribute__((import_module("asyncify"), import_name(#name)))
ASYNCIFY(start_unwind) void asyncify_start_unwind(void *data);
ASYNCIFY(stop_unwind) void asyncify_stop_unwind(void);
ASYNCIFY(start_rewind) void asyncify_start_rewind(void *data);
ASYNCIFY(stop_rewind) void asyncify_stop_rewind(void);

int __main_void(void);
void __wasm_call_ctors(void);

/* Asyncify's save area: the locals and call indices of every frame between
 * bspweb_resume and bspweb__sync. 256 KiB holds deep call chains; pages
 * never touched cost nothing in a checkpoint. */
#define UNWIND_BYTES (256 * 1024)
static struct {
    char *cur;
    char *end;
} unwind_data;
static char unwind_area[UNWIND_BYTES] __attribute__((aligned(16)));

enum phase { FRESH, RUNNING, SUSPENDED, ENDED };
static enum phase phase = FRESH;
static int unwinding, rewinding, exiting;
uint32_t bspweb__supersteps; /* counted by bsp_sync */

/* ---- output: one host `print` per line ---------------------------------- */

#define LINE_MAX_BYTES 4096
static struct line {
    char buf[LINE_MAX_BYTES];
    uint32_t len;
} lines[2];

static void line_flush(int stream) {
    struct line *l = &lines[stream - 1];
    if (l->len) {
        host_print(stream, l->buf, (int32_t)l->len);
        l->len = 0;
    }
}

static void line_write(int stream, const char *p, uint32_t n) {
    struct line *l = &lines[stream - 1];
    for (uint32_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\n') {
            host_print(stream, l->buf, (int32_t)l->len);
            l->len = 0;
            continue;
        }
        if (l->len == LINE_MAX_BYTES)
            line_flush(stream);
        l->buf[l->len++] = c;
    }
}

static void flush_all(void) {
    fflush(NULL);
    line_flush(1);
    line_flush(2);
}

/* ---- the process model -------------------------------------------------- */

/* exit is called through a volatile pointer: the compiler must not learn
 * that run_program never returns, because with Asyncify it does (every
 * time the stack unwinds to bspweb_resume). */
static void (*volatile exit_fn)(int) = exit;

static int constructed;

/* Instrumented by Asyncify (bspweb_resume is not): the constructors run
 * here, so one that ends the process (exit) unwinds like main. */
__attribute__((noinline)) static void run_program(void) {
    if (!constructed) {
        constructed = 1;
        __wasm_call_ctors();
    }
    int status = __main_void();
    exit_fn(status); /* flushes stdio, then proc_exit below */
}

__attribute__((export_name("bspweb_resume"))) int32_t bspweb_resume(void) {
    switch (phase) {
    case FRESH:
        phase = RUNNING;
        break;
    case SUSPENDED:
        phase = RUNNING;
        rewinding = 1;
        asyncify_start_rewind(&unwind_data);
        break;
    default:
        bspweb__fail("bspweb_resume called after the program ended (a host bug)");
    }
    run_program();
    if (!unwinding)
        bspweb__fail("the program returned from its entry without exit (a runtime bug)");
    unwinding = 0;
    asyncify_stop_unwind();
    if (exiting) {
        phase = ENDED;
        line_flush(1);
        line_flush(2);
        return STATUS_DONE;
    }
    phase = SUSPENDED;
    return STATUS_SYNC;
}

/* Unwinds to bspweb_resume (first call) or finishes the rewind (second). */
static void unwind_to_host(void) {
    if (rewinding) {
        rewinding = 0;
        asyncify_stop_rewind();
        return;
    }
    unwind_data.cur = unwind_area;
    unwind_data.end = unwind_area + UNWIND_BYTES;
    unwinding = 1;
    asyncify_start_unwind(&unwind_data);
}

void bspweb__sync(void) { unwind_to_host(); }

void bspweb__fail(const char *reason) {
    flush_all();
    size_t n = strlen(reason);
    while (n && (reason[n - 1] == '\n' || reason[n - 1] == ' '))
        n--;
    host_abort(reason, (int32_t)n);
}

/* abort() and assert() end the job with a message instead of a bare trap. */
void abort(void) { bspweb__fail("the program called abort()"); }

/* ---- bspweb.h ------------------------------------------------------------ */

size_t bspweb_args(char *buf, size_t size) {
    size_t n = (size_t)host_args_len();
    if (n < size) {
        host_args_read(buf);
        buf[n] = 0;
    }
    return n;
}

uint64_t bspweb_seed(void) { return (uint64_t)host_seed(); }

int bspweb_write_raw(const void *data, size_t len) {
    return host_write_raw(data, (int32_t)len);
}

long long bspweb_resource_size(const char *name) {
    return host_resource_len(name, (int32_t)strlen(name));
}

int bspweb_resource_read(const char *name, void *dst) {
    return host_resource_read(name, (int32_t)strlen(name), dst) < 0 ? -1 : 0;
}

/* ---- argv from a JSON array of strings and numbers ------------------------ */

static char *args_text;  /* the decoded strings, NUL-separated */
static uint32_t args_count, args_bytes;
static int args_parsed;

static const char program_name[] = "bspweb-guest";

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Appends the UTF-8 encoding of `cp` at `out`; returns its length. */
static uint32_t put_utf8(char *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* Parses the job's arguments once. Only a JSON array of strings and numbers
 * becomes argv[1..]; anything else (an object, say) leaves argc at 1. */
static void parse_args(void) {
    if (args_parsed) return;
    args_parsed = 1;
    size_t n = (size_t)host_args_len();
    char *json = malloc(n + 1);
    char *out = malloc(n + 1); /* decoded text is never longer than the JSON */
    if (!json || !out) bspweb__fail("out of memory reading the job's arguments");
    host_args_read(json);
    json[n] = 0;
    const char *p = skip_ws(json);
    uint32_t count = 0, used = 0;
    if (*p == '[') {
        p = skip_ws(p + 1);
        while (*p && *p != ']') {
            if (*p == '"') {
                p++;
                while (*p && *p != '"') {
                    if (*p != '\\') { out[used++] = *p++; continue; }
                    p++;
                    char e = *p++;
                    switch (e) {
                    case 'n': out[used++] = '\n'; break;
                    case 't': out[used++] = '\t'; break;
                    case 'r': out[used++] = '\r'; break;
                    case 'b': out[used++] = '\b'; break;
                    case 'f': out[used++] = '\f'; break;
                    case 'u': {
                        uint32_t cp = 0;
                        for (int i = 0; i < 4; i++) {
                            int h = hexval(*p);
                            if (h < 0) goto invalid;
                            cp = cp << 4 | (uint32_t)h;
                            p++;
                        }
                        used += put_utf8(out + used, cp);
                        break;
                    }
                    case 0: goto invalid;
                    default: out[used++] = e; break;
                    }
                }
                if (*p != '"') goto invalid;
                p++;
            } else {
                /* a number, true, false or null: its text as written */
                if (*p == '[' || *p == '{') goto invalid;
                while (*p && *p != ',' && *p != ']' && *p != ' ' && *p != '\n' && *p != '\t' && *p != '\r')
                    out[used++] = *p++;
            }
            out[used++] = 0;
            count++;
            p = skip_ws(p);
            if (*p == ',') p = skip_ws(p + 1);
            else if (*p != ']') goto invalid;
        }
    }
    free(json);
    args_text = out;
    args_count = count;
    args_bytes = used;
    return;
invalid:
    free(json);
    free(out);
    args_text = 0;
    args_count = 0;
    args_bytes = 0;
}

/* ---- WASI, answered inside the module ------------------------------------ */

#define WASI(name) __imported_wasi_snapshot_preview1_##name
#define WASI_ESUCCESS 0
#define WASI_EBADF 8
#define WASI_ENOSYS 52
#define WASI_ESPIPE 70

int32_t WASI(args_sizes_get)(int32_t argc_out, int32_t bytes_out) {
    parse_args();
    *(uint32_t *)argc_out = 1 + args_count;
    *(uint32_t *)bytes_out = sizeof program_name + args_bytes;
    return WASI_ESUCCESS;
}

int32_t WASI(args_get)(int32_t argv_out, int32_t buf_out) {
    parse_args();
    char **argv = (char **)argv_out;
    char *buf = (char *)buf_out;
    memcpy(buf, program_name, sizeof program_name);
    argv[0] = buf;
    buf += sizeof program_name;
    memcpy(buf, args_text, args_bytes);
    for (uint32_t i = 0; i < args_count; i++) {
        argv[1 + i] = buf;
        buf += strlen(buf) + 1;
    }
    return WASI_ESUCCESS;
}

int32_t WASI(environ_sizes_get)(int32_t count_out, int32_t bytes_out) {
    *(uint32_t *)count_out = 0;
    *(uint32_t *)bytes_out = 0;
    return WASI_ESUCCESS;
}

int32_t WASI(environ_get)(int32_t a0, int32_t a1) {
    (void)a0;
    (void)a1;
    return WASI_ESUCCESS;
}

/* Every clock reads the supersteps completed, in seconds: deterministic, so
 * a restored process prints what the original would have. */
int32_t WASI(clock_time_get)(int32_t id, int64_t precision, int32_t out) {
    (void)id;
    (void)precision;
    *(uint64_t *)out = (uint64_t)bspweb__supersteps * 1000000000ull;
    return WASI_ESUCCESS;
}

int32_t WASI(clock_res_get)(int32_t id, int32_t out) {
    (void)id;
    *(uint64_t *)out = 1000000000ull;
    return WASI_ESUCCESS;
}

struct ciovec {
    const char *buf;
    uint32_t len;
};

int32_t WASI(fd_write)(int32_t fd, int32_t iovs, int32_t count, int32_t written) {
    if (fd != 1 && fd != 2) return WASI_EBADF;
    const struct ciovec *v = (const struct ciovec *)iovs;
    uint32_t total = 0;
    for (int32_t i = 0; i < count; i++) {
        line_write(fd, v[i].buf, v[i].len);
        total += v[i].len;
    }
    *(uint32_t *)written = total;
    return WASI_ESUCCESS;
}

int32_t WASI(fd_read)(int32_t fd, int32_t iovs, int32_t count, int32_t read) {
    (void)iovs;
    (void)count;
    if (fd != 0) return WASI_EBADF;
    *(uint32_t *)read = 0; /* stdin is empty */
    return WASI_ESUCCESS;
}

int32_t WASI(fd_fdstat_get)(int32_t fd, int32_t out) {
    if (fd < 0 || fd > 2) return WASI_EBADF;
    memset((void *)out, 0, 24);
    /* A character device without seek and tell rights is a terminal to
     * wasi-libc's isatty, so stdout is line-buffered: each line reaches the
     * job's output in order with stderr and raw records. */
    *(uint8_t *)out = 2;
    *(uint64_t *)(out + 8) = ~(uint64_t)0 & ~((1ull << 2) | (1ull << 5));
    return WASI_ESUCCESS;
}

int32_t WASI(fd_close)(int32_t fd) { return fd >= 0 && fd <= 2 ? WASI_ESUCCESS : WASI_EBADF; }

int32_t WASI(fd_seek)(int32_t fd, int64_t offset, int32_t whence, int32_t out) {
    (void)offset;
    (void)whence;
    (void)out;
    return fd >= 0 && fd <= 2 ? WASI_ESPIPE : WASI_EBADF;
}

int32_t WASI(fd_prestat_get)(int32_t fd, int32_t out) {
    (void)fd;
    (void)out;
    return WASI_EBADF; /* no preopened directories: no file system */
}

/* Deterministic "randomness": a SplitMix64 stream from the job's seed and
 * this process's id, its position kept in linear memory (so checkpointed). */
static uint64_t random_state;
static int random_seeded;

int32_t WASI(random_get)(int32_t buf, int32_t len) {
    if (!random_seeded) {
        random_state = (uint64_t)host_seed() ^ ((uint64_t)host_pid() * 0x9E3779B97F4A7C15ull);
        random_seeded = 1;
    }
    uint8_t *p = (uint8_t *)buf;
    for (int32_t i = 0; i < len; i++) {
        if ((i & 7) == 0) random_state += 0x9E3779B97F4A7C15ull;
        uint64_t z = random_state;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        p[i] = (uint8_t)(z >> ((i & 7) * 8));
    }
    return WASI_ESUCCESS;
}

int32_t WASI(sched_yield)(void) { return WASI_ESUCCESS; }

/* exit(0) (and returning 0 from main) ends the process normally: unwind the
 * stack and report STATUS_DONE. Any other status ends the job with it. */
void WASI(proc_exit)(int32_t status) {
    if (status != 0) {
        char reason[64];
        snprintf(reason, sizeof reason, "the program exited with status %d", (int)status);
        bspweb__fail(reason);
    }
    exiting = 1;
    unwind_to_host();
}

/* The rest of WASI is not there: files, sockets, polling. */
#define WASI_UNSUPPORTED(name, params) \
    int32_t WASI(name) params { return WASI_ENOSYS; }
WASI_UNSUPPORTED(fd_advise, (int32_t a0, int64_t a1, int64_t a2, int32_t a3))
WASI_UNSUPPORTED(fd_allocate, (int32_t a0, int64_t a1, int64_t a2))
WASI_UNSUPPORTED(fd_datasync, (int32_t a0))
WASI_UNSUPPORTED(fd_fdstat_set_flags, (int32_t a0, int32_t a1))
WASI_UNSUPPORTED(fd_fdstat_set_rights, (int32_t a0, int64_t a1, int64_t a2))
WASI_UNSUPPORTED(fd_filestat_get, (int32_t a0, int32_t a1))
WASI_UNSUPPORTED(fd_filestat_set_size, (int32_t a0, int64_t a1))
WASI_UNSUPPORTED(fd_filestat_set_times, (int32_t a0, int64_t a1, int64_t a2, int32_t a3))
WASI_UNSUPPORTED(fd_pread, (int32_t a0, int32_t a1, int32_t a2, int64_t a3, int32_t a4))
WASI_UNSUPPORTED(fd_prestat_dir_name, (int32_t a0, int32_t a1, int32_t a2))
WASI_UNSUPPORTED(fd_pwrite, (int32_t a0, int32_t a1, int32_t a2, int64_t a3, int32_t a4))
WASI_UNSUPPORTED(fd_readdir, (int32_t a0, int32_t a1, int32_t a2, int64_t a3, int32_t a4))
WASI_UNSUPPORTED(fd_renumber, (int32_t a0, int32_t a1))
WASI_UNSUPPORTED(fd_sync, (int32_t a0))
WASI_UNSUPPORTED(fd_tell, (int32_t a0, int32_t a1))
WASI_UNSUPPORTED(path_create_directory, (int32_t a0, int32_t a1, int32_t a2))
WASI_UNSUPPORTED(path_filestat_get, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t a4))
WASI_UNSUPPORTED(path_filestat_set_times, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int64_t a4, int64_t a5, int32_t a6))
WASI_UNSUPPORTED(path_link, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t a4, int32_t a5, int32_t a6))
WASI_UNSUPPORTED(path_open, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t a4, int64_t a5, int64_t a6, int32_t a7, int32_t a8))
WASI_UNSUPPORTED(path_readlink, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t a4, int32_t a5))
WASI_UNSUPPORTED(path_remove_directory, (int32_t a0, int32_t a1, int32_t a2))
WASI_UNSUPPORTED(path_rename, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t a4, int32_t a5))
WASI_UNSUPPORTED(path_symlink, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t a4))
WASI_UNSUPPORTED(path_unlink_file, (int32_t a0, int32_t a1, int32_t a2))
WASI_UNSUPPORTED(poll_oneoff, (int32_t a0, int32_t a1, int32_t a2, int32_t a3))
WASI_UNSUPPORTED(sock_accept, (int32_t a0, int32_t a1, int32_t a2))
WASI_UNSUPPORTED(sock_recv, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t a4, int32_t a5))
WASI_UNSUPPORTED(sock_send, (int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t a4))
WASI_UNSUPPORTED(sock_shutdown, (int32_t a0, int32_t a1))
