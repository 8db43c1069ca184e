/*
 * bsp_native.c: BSPlib (bsp.h) and bspweb.h for one process on the host,
 * so a bspweb C guest also compiles as an ordinary program: the native
 * reference of benches/c_guest.rs, and a quick way to debug a program.
 *
 *     cc -O2 -I guest-c/include PROGRAM.c guest-c/native/bsp_native.c -lm -o PROGRAM
 *
 * There is one process: bsp_nprocs() is 1 and bsp_pid() 0. bsp_sync applies
 * what the superstep asked for with the semantics of guest-c/src/bsp.c:
 * every bsp_get reads its source first, then the gets' results are written
 * and then the puts' (in the order they were called, so a put wins over a
 * get of the same bytes); registrations (pushes, then pops) and a new tag
 * size take effect after that; the messages sent with bsp_send become the
 * queue of the next superstep, last sent first (BSPonMPI's order, which
 * bspweb follows). bsp_put copies its source when called. Errors
 * print the same messages as on bspweb to stderr and exit with status 1.
 * bsp_time() counts supersteps, as on bspweb, so output is the same there
 * and here.
 *
 * bspweb.h: bspweb_args gives argv[1..] as a JSON array of strings (read
 * from /proc/self/cmdline; "[]" where there is none); bspweb_seed reads
 * BSPWEB_SEED (default 0); bspweb_write_raw appends to DIR/pid-0.bin when
 * BSPWEB_RAW_DIR is set (as `bspweb submit --raw-dir DIR` does) and returns
 * -1 otherwise; job resources are the files of BSPWEB_RESOURCE_DIR.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/bsp.h"
#include "../include/bspweb.h"

/* ---- helpers ------------------------------------------------------------ */

static int spmd; /* inside bsp_begin .. bsp_end */

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *fmt, ...) {
    va_list ap;
    spmd = 0; /* no second complaint from check_end_at_exit */
    fflush(stdout);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(p, n * elem);
    if (!q) fail("bsp: out of memory (%zu bytes)", n * elem);
    *cap = n;
    return q;
}

/* A growable byte buffer of records aligned to 16 bytes. */
typedef struct {
    char *data;
    size_t len, cap;
} bytes_t;

static void *bytes_reserve(bytes_t *b, size_t extra) {
    extra = (extra + 15) & ~(size_t)15;
    b->data = grow(b->data, &b->cap, b->len + extra, 1);
    void *at = b->data + b->len;
    b->len += extra;
    return at;
}

/* ---- state ---------------------------------------------------------------- */

static int begun, init_called;
static uint32_t supersteps;

typedef struct {
    const void *addr;
    bsp_size_t size;
} reg_t;
static reg_t *regs; /* active registrations, oldest first */
static size_t nregs, regs_cap;
static reg_t *pushes; /* this superstep's */
static size_t npushes, pushes_cap;
static const void **pops;
static size_t npops, pops_cap;

/* This superstep's puts: a put_t, then the bytes, each; its gets. */
typedef struct {
    char *dst;
    size_t nbytes;
} put_t;
static bytes_t put_buf;
typedef struct {
    const char *src;
    char *dst;
    size_t nbytes;
} get_t;
static get_t *get_list;
static size_t nget, get_cap;
static bytes_t get_data;

/* BSMP: the messages sent in this superstep (msg_t, tag, payload) and the
 * queue received at the last sync, handed out in the order of `order`
 * (offsets into `queue`) from `queue_next` on. */
typedef struct {
    size_t size; /* payload bytes */
} msg_t;
static bytes_t sent, queue;
static size_t *order, queue_len, order_cap, queue_next;
static bsp_size_t tagsize, tagsize_pending, queue_tagsize;

/* ---- checks ------------------------------------------------------------------ */

static void need_spmd(const char *fn) {
    if (!spmd) fail("%s: can only be called within SPMD section (between bsp_begin and bsp_end)", fn);
}

static void need_pid(const char *fn, bsp_pid_t pid) {
    if (pid != 0) fail("%s: The destination process ID %d does not exist (bsp_nprocs() is 1)", fn, pid);
}

/* The newest active registration of `addr`, or -1. */
static long find_reg(const void *addr) {
    for (size_t i = nregs; i-- > 0;)
        if (regs[i].addr == addr) return (long)i;
    return -1;
}

static const reg_t *reg_for(const char *fn, const void *ident) {
    long k = find_reg(ident);
    if (k >= 0) return &regs[k];
    for (size_t i = 0; i < npushes; i++)
        if (pushes[i].addr == ident)
            fail("%s: Remote address was just registered: a bsp_push_reg takes effect at the next bsp_sync", fn);
    fail("%s: address %p is not registered (register it with bsp_push_reg and a bsp_sync first)", fn, ident);
}

/* ---- SPMD ------------------------------------------------------------------------- */

void bsp_init(void (*spmd_part)(void), int argc, char *argv[]) {
    (void)argc;
    (void)argv;
    if (begun) fail("bsp_init: must be called before bsp_begin");
    if (init_called) fail("bsp_init: called twice");
    if (!spmd_part) fail("bsp_init: the SPMD function may not be NULL");
    init_called = 1; /* the one process returns to main, which runs the SPMD part */
}

static void check_end_at_exit(void) {
    if (spmd) {
        fflush(stdout);
        fprintf(stderr, "the program ended inside an SPMD section: call bsp_end before returning from main or calling exit\n");
        _Exit(1);
    }
}

void bsp_begin(bsp_pid_t maxprocs) {
    if (begun) fail("bsp_begin: called twice (a program has one SPMD section)");
    if (maxprocs <= 0) fail("bsp_begin: asked for %d processes; ask for at least 1", maxprocs);
    begun = 1;
    spmd = 1;
    atexit(check_end_at_exit);
}

static void exchange(void);

void bsp_end(void) {
    if (!spmd) fail("bsp_end: can only be called within SPMD section (after bsp_begin, once)");
    exchange();
    spmd = 0;
}

void bsp_abort(const char *format, ...) {
    va_list ap;
    spmd = 0;
    fflush(stdout);
    va_start(ap, format);
    if (format)
        vfprintf(stderr, format, ap);
    else
        fputs("bsp_abort called", stderr);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

bsp_nprocs_t bsp_nprocs(void) { return 1; }

bsp_pid_t bsp_pid(void) {
    need_spmd("bsp_pid");
    return 0;
}

double bsp_time(void) { return (double)supersteps; }

/* ---- DRMA ----------------------------------------------------------------------------- */

void bsp_push_reg(const void *ident, bsp_size_t size) {
    need_spmd("bsp_push_reg");
    if (size < 0) fail("bsp_push_reg: size may not be negative (got %d)", size);
    pushes = grow(pushes, &pushes_cap, npushes + 1, sizeof *pushes);
    pushes[npushes++] = (reg_t){ident, size};
}

void bsp_pop_reg(const void *ident) {
    need_spmd("bsp_pop_reg");
    pops = grow(pops, &pops_cap, npops + 1, sizeof *pops);
    pops[npops++] = ident;
}

static void put(const char *fn, bsp_pid_t pid, const void *src, void *dst, bsp_size_t offset, bsp_size_t nbytes) {
    need_spmd(fn);
    need_pid(fn, pid);
    if (nbytes < 0 || offset < 0) fail("%s: offset (%d) and size (%d) may not be negative", fn, offset, nbytes);
    const reg_t *r = reg_for(fn, dst);
    if ((int64_t)offset + nbytes > r->size)
        fail("%s: Writes %lld bytes beyond registered range (process 0 registered %d bytes there; offset %d, size %d)",
             fn, (long long)offset + nbytes - r->size, r->size, offset, nbytes);
    if (nbytes == 0) return;
    if (!src) fail("%s: source may not be NULL", fn);
    put_t *p = bytes_reserve(&put_buf, sizeof(put_t) + (size_t)nbytes);
    *p = (put_t){(char *)dst + offset, (size_t)nbytes};
    memcpy(p + 1, src, (size_t)nbytes);
}

void bsp_put(bsp_pid_t pid, const void *src, void *dst, bsp_size_t offset, bsp_size_t nbytes) {
    put("bsp_put", pid, src, dst, offset, nbytes);
}

void bsp_hpput(bsp_pid_t pid, const void *src, void *dst, bsp_size_t offset, bsp_size_t nbytes) {
    put("bsp_hpput", pid, src, dst, offset, nbytes);
}

static void get(const char *fn, bsp_pid_t pid, const void *src, bsp_size_t offset, void *dst, bsp_size_t nbytes) {
    need_spmd(fn);
    need_pid(fn, pid);
    if (nbytes < 0 || offset < 0) fail("%s: offset (%d) and size (%d) may not be negative", fn, offset, nbytes);
    const reg_t *r = reg_for(fn, src);
    if ((int64_t)offset + nbytes > r->size)
        fail("%s: Reads %lld bytes beyond registered range (process 0 registered %d bytes there; offset %d, size %d)",
             fn, (long long)offset + nbytes - r->size, r->size, offset, nbytes);
    if (nbytes == 0) return;
    if (!dst) fail("%s: destination may not be NULL", fn);
    get_list = grow(get_list, &get_cap, nget + 1, sizeof *get_list);
    get_list[nget++] = (get_t){(const char *)src + offset, dst, (size_t)nbytes};
}

void bsp_get(bsp_pid_t pid, const void *src, bsp_size_t offset, void *dst, bsp_size_t nbytes) {
    get("bsp_get", pid, src, offset, dst, nbytes);
}

void bsp_hpget(bsp_pid_t pid, const void *src, bsp_size_t offset, void *dst, bsp_size_t nbytes) {
    get("bsp_hpget", pid, src, offset, dst, nbytes);
}

/* ---- BSMP ------------------------------------------------------------------------------- */

void bsp_set_tagsize(bsp_size_t *tag_nbytes) {
    need_spmd("bsp_set_tagsize");
    if (!tag_nbytes) fail("bsp_set_tagsize: NULL ptr as argument is not allowed");
    if (*tag_nbytes < 0) fail("bsp_set_tagsize: the tag size may not be negative (got %d)", *tag_nbytes);
    bsp_size_t old = tagsize_pending;
    tagsize_pending = *tag_nbytes;
    *tag_nbytes = old;
}

void bsp_send(bsp_pid_t pid, const void *tag, const void *payload, bsp_size_t payload_nbytes) {
    need_spmd("bsp_send");
    need_pid("bsp_send", pid);
    if (payload_nbytes < 0) fail("bsp_send: Payload size may not be negative (got %d)", payload_nbytes);
    if (payload_nbytes > 0 && !payload) fail("bsp_send: payload may not be NULL when its size is %d", payload_nbytes);
    if (tagsize > 0 && !tag) fail("bsp_send: tag may not be NULL when the tag size is %d", tagsize);
    msg_t *m = bytes_reserve(&sent, sizeof(msg_t) + (size_t)tagsize + (size_t)payload_nbytes);
    m->size = (size_t)payload_nbytes;
    char *body = (char *)(m + 1);
    if (tagsize) memcpy(body, tag, (size_t)tagsize);
    if (payload_nbytes) memcpy(body + tagsize, payload, (size_t)payload_nbytes);
}

static size_t msg_bytes(const msg_t *m, bsp_size_t tag_bytes) {
    return (sizeof(msg_t) + (size_t)tag_bytes + m->size + 15) & ~(size_t)15;
}

static const msg_t *queued(size_t i) { return (const msg_t *)(queue.data + order[i]); }

void bsp_qsize(bsp_nprocs_t *nmessages, bsp_size_t *accum_nbytes) {
    need_spmd("bsp_qsize");
    if (!nmessages || !accum_nbytes) fail("bsp_qsize: both arguments may not be NULL");
    size_t total = 0;
    for (size_t i = queue_next; i < queue_len; i++) total += queued(i)->size;
    *nmessages = (bsp_nprocs_t)(queue_len - queue_next);
    *accum_nbytes = (bsp_size_t)total;
}

void bsp_get_tag(bsp_size_t *status, void *tag) {
    need_spmd("bsp_get_tag");
    if (!status) fail("bsp_get_tag: first arguments may not be NULL");
    if (queue_next == queue_len) {
        *status = -1;
        return;
    }
    const msg_t *m = queued(queue_next);
    *status = (bsp_size_t)m->size;
    if (queue_tagsize) {
        if (!tag) fail("bsp_get_tag: tag may not be NULL when the tag size is %d", queue_tagsize);
        memcpy(tag, m + 1, (size_t)queue_tagsize);
    }
}

void bsp_move(void *payload, bsp_size_t reception_nbytes) {
    need_spmd("bsp_move");
    if (queue_next == queue_len) fail("bsp_move: Message queue was empty");
    if (reception_nbytes < 0) fail("bsp_move: reception_nbytes may not be negative (got %d)", reception_nbytes);
    if (reception_nbytes > 0 && !payload) fail("bsp_move: payload may not be NULL if reception_nbytes is non-zero");
    const msg_t *m = queued(queue_next++);
    size_t n = m->size < (size_t)reception_nbytes ? m->size : (size_t)reception_nbytes;
    if (n) memcpy(payload, (const char *)(m + 1) + queue_tagsize, n);
}

bsp_size_t bsp_hpmove(void **tag_ptr_buf, void **payload_ptr_buf) {
    need_spmd("bsp_hpmove");
    if (!tag_ptr_buf || !payload_ptr_buf) fail("bsp_hpmove: pointer arguments may not be NULL");
    if (queue_next == queue_len) return -1;
    const msg_t *m = queued(queue_next++);
    *tag_ptr_buf = (void *)(m + 1);
    *payload_ptr_buf = (char *)(m + 1) + queue_tagsize;
    return (bsp_size_t)m->size;
}

/* ---- the synchronisation --------------------------------------------------------------- */

static void exchange(void) {
    /* Gets read before anything is written; their results, then the puts. */
    get_data.len = 0;
    size_t at = 0;
    for (size_t i = 0; i < nget; i++) {
        char *copy = bytes_reserve(&get_data, get_list[i].nbytes);
        memcpy(copy, get_list[i].src, get_list[i].nbytes);
    }
    for (size_t i = 0; i < nget; i++) {
        memcpy(get_list[i].dst, get_data.data + at, get_list[i].nbytes);
        at += (get_list[i].nbytes + 15) & ~(size_t)15;
    }
    nget = 0;
    for (size_t off = 0; off < put_buf.len;) {
        const put_t *p = (const put_t *)(put_buf.data + off);
        memcpy(p->dst, p + 1, p->nbytes);
        off += (sizeof(put_t) + p->nbytes + 15) & ~(size_t)15;
    }
    put_buf.len = 0;

    /* The messages sent become the queue, with the tag size they were sent
     * with, handed out last sent first, as on bspweb (BSPonMPI's order). */
    bytes_t old = queue;
    queue = sent;
    sent = old;
    sent.len = 0;
    queue_tagsize = tagsize;
    queue_len = queue_next = 0;
    for (size_t off = 0; off < queue.len; off += msg_bytes((const msg_t *)(queue.data + off), queue_tagsize)) {
        order = grow(order, &order_cap, queue_len + 1, sizeof *order);
        order[queue_len++] = off;
    }
    for (size_t i = 0, j = queue_len; i + 1 < j; i++, j--) {
        size_t t = order[i];
        order[i] = order[j - 1];
        order[j - 1] = t;
    }

    /* Registrations: pushes, then pops (the newest registration of each address). */
    for (size_t i = 0; i < npushes; i++) {
        regs = grow(regs, &regs_cap, nregs + 1, sizeof *regs);
        regs[nregs++] = pushes[i];
    }
    for (size_t i = 0; i < npops; i++) {
        long k = find_reg(pops[i]);
        if (k < 0) {
            if (!pops[i]) fail("bsp_sync/bsp_pop_reg: Tried to deregister NULL on all processes, but NULL was never registered");
            fail("bsp_sync/bsp_pop_reg: process 0 tried to deregister address %p, which it has not registered", pops[i]);
        }
        memmove(&regs[k], &regs[k + 1], (nregs - (size_t)k - 1) * sizeof *regs);
        nregs--;
    }
    npushes = npops = 0;
    tagsize = tagsize_pending;
    supersteps++;
}

void bsp_sync(void) {
    need_spmd("bsp_sync");
    exchange();
}

/* ---- bspweb.h ----------------------------------------------------------------------------- */

static char *args_json;
static size_t args_json_len;

/* argv[1..] as a JSON array of strings, from /proc/self/cmdline. */
static void read_args(void) {
    if (args_json) return;
    bytes_t cmdline = {0, 0, 0};
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (f) {
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
            cmdline.data = grow(cmdline.data, &cmdline.cap, cmdline.len + n, 1);
            memcpy(cmdline.data + cmdline.len, chunk, n);
            cmdline.len += n;
        }
        fclose(f);
    }
    bytes_t out = {0, 0, 0};
    /* Every byte becomes at most 6 ("\u00XX"); the brackets, commas and quotes fit in 3 per argument. */
    out.data = grow(NULL, &out.cap, 6 * cmdline.len + 3, 1);
    out.data[out.len++] = '[';
    size_t i = 0;
    while (i < cmdline.len && cmdline.data[i]) i++; /* skip argv[0] */
    int first = 1;
    for (i++; i < cmdline.len; i++) {
        if (!first) out.data[out.len++] = ',';
        first = 0;
        out.data[out.len++] = '"';
        for (; i < cmdline.len && cmdline.data[i]; i++) {
            unsigned char c = (unsigned char)cmdline.data[i];
            if (c == '"' || c == '\\') {
                out.data[out.len++] = '\\';
                out.data[out.len++] = (char)c;
            } else if (c < 0x20) {
                out.len += (size_t)sprintf(out.data + out.len, "\\u%04x", c);
            } else {
                out.data[out.len++] = (char)c;
            }
        }
        out.data[out.len++] = '"';
    }
    out.data[out.len++] = ']';
    out.data[out.len] = 0;
    free(cmdline.data);
    args_json = out.data;
    args_json_len = out.len;
}

size_t bspweb_args(char *buf, size_t size) {
    read_args();
    if (args_json_len < size) memcpy(buf, args_json, args_json_len + 1);
    return args_json_len;
}

uint64_t bspweb_seed(void) {
    const char *s = getenv("BSPWEB_SEED");
    return s ? strtoull(s, NULL, 0) : 0;
}

int bspweb_write_raw(const void *data, size_t len) {
    const char *dir = getenv("BSPWEB_RAW_DIR");
    if (!dir) return -1;
    if (len > (1u << 20)) return -3; /* a record is at most 1 MiB, as on bspweb */
    char path[4096];
    snprintf(path, sizeof path, "%s/pid-0.bin", dir);
    FILE *f = fopen(path, "ab");
    if (!f) return -1;
    size_t n = fwrite(data, 1, len, f);
    return fclose(f) == 0 && n == len ? 0 : -1;
}

static FILE *open_resource(const char *name) {
    const char *dir = getenv("BSPWEB_RESOURCE_DIR");
    if (!dir || !*name || strchr(name, '/')) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fopen(path, "rb");
}

long long bspweb_resource_size(const char *name) {
    FILE *f = open_resource(name);
    if (!f) return -1;
    long long size = fseek(f, 0, SEEK_END) == 0 ? (long long)ftell(f) : -1;
    fclose(f);
    return size;
}

int bspweb_resource_read(const char *name, void *dst) {
    long long size = bspweb_resource_size(name);
    FILE *f = open_resource(name);
    if (size < 0 || !f) {
        if (f) fclose(f);
        return -1;
    }
    size_t n = fread(dst, 1, (size_t)size, f);
    fclose(f);
    return n == (size_t)size ? 0 : -1;
}
