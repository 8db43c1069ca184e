/*
 * bsp.c: BSPlib on the bspweb_v1 ABI.
 *
 * Every process keeps the same registration table: slot k holds, for every
 * process, the address and size it registered k-th. bsp_sync sends each
 * process a header naming this superstep's registrations, deregistrations,
 * tag-size changes and whether it asked for gets; all processes check the
 * same headers in the same way, so an inconsistent program aborts with the
 * same message everywhere, and a put or get is checked against the remote
 * registration when it is called.
 *
 * Messages carry their kind in the host tag:
 *   HEADER   kind, counts, then pushes (addr, size) and pops (addr, pushes
 *            made before it: registrations change in call order)
 *   PUT      slot, offset, bytes                    (applied after gets)
 *   GET_REQ  slot, offset, nbytes, destination      (served at the sync)
 *   GET_REP  destination, bytes                     (second host superstep)
 *   BSMP     tag bytes, payload
 *
 * A bsp_sync is one host superstep, or two when some process called
 * bsp_get: the first carries requests, the second the replies. Gets read
 * the remote memory before that superstep's puts are applied, and their
 * results are written before the local puts, as BSPlib specifies.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/bsp.h"
#include "host.h"

enum { TAG_HEADER = 1, TAG_PUT, TAG_GET_REQ, TAG_GET_REP, TAG_BSMP };
enum { KIND_SYNC = 1, KIND_END = 2 };

/* The largest data a put or get reply carries in one host message (the host
 * takes at most 8 MiB per message; 16 bytes for our header). Larger puts and
 * gets are split. */
#define CHUNK_BYTES ((size_t)(8u << 20) - 16)

/* ---- small helpers --------------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    bspweb__fail(msg);
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    if (need > (SIZE_MAX / 2) / elem) fail("bsp: out of memory (%zu elements of %zu bytes)", need, elem);
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(p, n * elem);
    if (!q) fail("bsp: out of memory (%zu bytes)", n * elem);
    *cap = n;
    return q;
}

/* A growable byte buffer. */
typedef struct {
    char *data;
    size_t len, cap;
} bytes_t;

static void *bytes_reserve(bytes_t *b, size_t extra) {
    b->data = grow(b->data, &b->cap, b->len + extra, 1);
    void *at = b->data + b->len;
    b->len += extra;
    return at;
}

/* ---- state --------------------------------------------------------------------- */

static int spmd;          /* inside bsp_begin .. bsp_end */
static int begun;         /* bsp_begin was called */
static int ended;         /* bsp_end was called */
static int init_called;   /* bsp_init was called */
static bsp_pid_t P;       /* processes of the SPMD section */
static bsp_pid_t me;

/* Registration slots, in push order; `who` has P entries. */
typedef struct {
    uint32_t addr, size;
} reg_t;
typedef struct {
    uint32_t id;
    reg_t *who;
} slot_t;
static slot_t *slots;
static size_t nslots, slots_cap;
static uint32_t next_slot_id;

/* This superstep's requests. */
static reg_t *pushes;
static size_t npushes, pushes_cap;
typedef struct {
    uint32_t addr;
    uint32_t after; /* pushes of this superstep made before the pop */
} pop_t;
static pop_t *pops;
static size_t npops, pops_cap;
static uint32_t tagsize_sets;
static bsp_size_t tagsize = 0, tagsize_pending = 0;
static uint32_t gets_issued;

static bytes_t scratch;

/* The BSMP queue of this superstep: messages copied out of the host. */
typedef struct {
    uint32_t offset; /* into queue_bytes: tag, then payload */
    uint32_t size;   /* payload bytes */
} qmsg_t;
static qmsg_t *queue;
static size_t queue_len, queue_cap, queue_next;
static bytes_t queue_bytes;
static bsp_size_t queue_tagsize;

/* Puts held while gets are served (two-round syncs). */
static bytes_t held_puts;

/* ---- checks ---------------------------------------------------------------------- */

static void need_spmd(const char *fn) {
    if (!spmd) fail("%s: can only be called within SPMD section (between bsp_begin and bsp_end)", fn);
}

static void need_pid(const char *fn, bsp_pid_t pid) {
    if (pid < 0 || pid >= P)
        fail("%s: The destination process ID %d does not exist (bsp_nprocs() is %d)", fn, pid, P);
}

static uint32_t addr_of(const void *p) { return (uint32_t)(uintptr_t)p; }

/* The newest active slot this process registered at `addr`, or -1. */
static long find_slot(uint32_t addr) {
    for (size_t i = nslots; i-- > 0;)
        if (slots[i].who[me].addr == addr) return (long)i;
    return -1;
}

static int pending_push(uint32_t addr) {
    for (size_t i = 0; i < npushes; i++)
        if (pushes[i].addr == addr) return 1;
    return 0;
}

static long slot_for(const char *fn, const void *ident) {
    long k = find_slot(addr_of(ident));
    if (k >= 0) return k;
    if (pending_push(addr_of(ident)))
        fail("%s: Remote address was just registered: a bsp_push_reg takes effect at the next bsp_sync", fn);
    fail("%s: address %p is not registered (register it with bsp_push_reg and a bsp_sync first)", fn, ident);
}

/* ---- SPMD --------------------------------------------------------------------------- */

void bsp_init(void (*spmd_part)(void), int argc, char *argv[]) {
    (void)argc;
    (void)argv;
    if (begun) fail("bsp_init: must be called before bsp_begin");
    if (init_called) fail("bsp_init: called twice");
    if (!spmd_part) fail("bsp_init: the SPMD function may not be NULL");
    init_called = 1;
    if (host_pid() != 0) {
        /* Every process but 0 runs the SPMD part and ends; process 0
         * returns to main, which calls the SPMD part itself. */
        spmd_part();
        exit(0);
    }
}

static void check_end_at_exit(void) {
    if (spmd) bspweb__fail("the program ended inside an SPMD section: call bsp_end before returning from main or calling exit");
}

/* Process 0's argument decides, as in BSPonMPI: with bsp_init, the other
 * processes often call bsp_begin(P) before they could know P (BSPedupack's
 * programs read it on process 0). One host superstep tells everyone. */
void bsp_begin(bsp_pid_t maxprocs) {
    if (begun) fail("bsp_begin: called twice (a program has one SPMD section)");
    begun = 1;
    int available = host_nprocs();
    me = host_pid();
    if (me == 0) {
        host_set_tag(TAG_HEADER);
        host_send_range(0, available, &maxprocs, sizeof maxprocs);
    }
    bspweb__sync();
    int32_t asked = 0;
    uint32_t info[3];
    int32_t n = host_msg_count();
    int found = 0;
    for (int32_t i = 0; i < n; i++) {
        if (host_msg_info(i, info) == 0 && info[0] == 0 && info[2] == sizeof asked && host_msg_tag(i) == TAG_HEADER) {
            host_msg_read(i, &asked);
            found = 1;
        }
    }
    if (!found) fail("bsp_begin: process 0 did not call bsp_begin (it ended or called bsp_sync first)");
    if (asked <= 0) fail("bsp_begin: process 0 asked for %d processes; ask for at least 1", asked);
    P = asked < available ? asked : available;
    if (me >= P) exit(0); /* not needed: this process ends here */
    spmd = 1;
    atexit(check_end_at_exit);
}

static void exchange(int kind);

void bsp_end(void) {
    if (!spmd) fail("bsp_end: can only be called within SPMD section (after bsp_begin, once)");
    exchange(KIND_END);
    spmd = 0;
    ended = 1;
}

void bsp_abort(const char *format, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, format);
    if (format)
        vsnprintf(msg, sizeof msg, format, ap);
    else
        snprintf(msg, sizeof msg, "bsp_abort called");
    va_end(ap);
    bspweb__fail(msg);
}

bsp_nprocs_t bsp_nprocs(void) { return begun ? P : host_nprocs(); }

bsp_pid_t bsp_pid(void) {
    need_spmd("bsp_pid");
    return me;
}

double bsp_time(void) { return (double)bspweb__supersteps; }

/* ---- DRMA --------------------------------------------------------------------------- */

void bsp_push_reg(const void *ident, bsp_size_t size) {
    need_spmd("bsp_push_reg");
    if (size < 0) fail("bsp_push_reg: size may not be negative (got %d)", size);
    if (!ident && size > 0) fail("bsp_push_reg: NULL cannot be registered with a size (%d bytes); register NULL with size 0", size);
    uint64_t memory = (uint64_t)__builtin_wasm_memory_size(0) * 65536u;
    if ((uint64_t)addr_of(ident) + (uint64_t)size > memory)
        fail("bsp_push_reg: the block of %d bytes at %p lies outside memory", size, ident);
    pushes = grow(pushes, &pushes_cap, npushes + 1, sizeof *pushes);
    pushes[npushes++] = (reg_t){addr_of(ident), (uint32_t)size};
}

void bsp_pop_reg(const void *ident) {
    need_spmd("bsp_pop_reg");
    pops = grow(pops, &pops_cap, npops + 1, sizeof *pops);
    pops[npops++] = (pop_t){addr_of(ident), (uint32_t)npushes};
}

static void put(const char *fn, bsp_pid_t pid, const void *src, void *dst, bsp_size_t offset, bsp_size_t nbytes) {
    need_spmd(fn);
    if (nbytes < 0 || offset < 0) fail("%s: offset (%d) and size (%d) may not be negative", fn, offset, nbytes);
    if (nbytes == 0) return; /* as BSPonMPI: nothing to check or send */
    need_pid(fn, pid);
    long k = slot_for(fn, dst);
    reg_t remote = slots[k].who[pid];
    if ((uint64_t)offset + (uint64_t)nbytes > remote.size)
        fail("%s: Writes %u bytes beyond registered range (process %d registered %u bytes there; offset %d, size %d)", fn,
             (unsigned)((uint64_t)offset + (uint64_t)nbytes - remote.size), pid, remote.size, offset, nbytes);
    if (!src) fail("%s: source may not be NULL", fn);
    /* One message per chunk: a host message carries at most 8 MiB. */
    host_set_tag(TAG_PUT);
    for (size_t done = 0; done < (size_t)nbytes;) {
        size_t n = (size_t)nbytes - done < CHUNK_BYTES ? (size_t)nbytes - done : CHUNK_BYTES;
        scratch.len = 0;
        uint32_t *h = bytes_reserve(&scratch, 8 + n);
        h[0] = slots[k].id;
        h[1] = (uint32_t)offset + (uint32_t)done;
        memcpy(h + 2, (const char *)src + done, n);
        if (host_send(pid, scratch.data, (int32_t)scratch.len) < 0)
            fail("%s: the host refused a message of %zu bytes", fn, scratch.len);
        done += n;
    }
}

void bsp_put(bsp_pid_t pid, const void *src, void *dst, bsp_size_t offset, bsp_size_t nbytes) {
    put("bsp_put", pid, src, dst, offset, nbytes);
}

void bsp_hpput(bsp_pid_t pid, const void *src, void *dst, bsp_size_t offset, bsp_size_t nbytes) {
    put("bsp_hpput", pid, src, dst, offset, nbytes);
}

static void get(const char *fn, bsp_pid_t pid, const void *src, bsp_size_t offset, void *dst, bsp_size_t nbytes) {
    need_spmd(fn);
    if (nbytes < 0 || offset < 0) fail("%s: offset (%d) and size (%d) may not be negative", fn, offset, nbytes);
    if (nbytes == 0) return;
    need_pid(fn, pid);
    long k = slot_for(fn, src);
    reg_t remote = slots[k].who[pid];
    if ((uint64_t)offset + (uint64_t)nbytes > remote.size)
        fail("%s: Reads %u bytes beyond registered range (process %d registered %u bytes there; offset %d, size %d)", fn,
             (unsigned)((uint64_t)offset + (uint64_t)nbytes - remote.size), pid, remote.size, offset, nbytes);
    if (!dst) fail("%s: destination may not be NULL", fn);
    host_set_tag(TAG_GET_REQ);
    for (uint32_t done = 0; done < (uint32_t)nbytes;) {
        uint32_t n = (uint32_t)nbytes - done < CHUNK_BYTES ? (uint32_t)nbytes - done : (uint32_t)CHUNK_BYTES;
        uint32_t req[4] = {slots[k].id, (uint32_t)offset + done, n, addr_of(dst) + done};
        host_send(pid, req, sizeof req);
        done += n;
    }
    gets_issued++;
}

void bsp_get(bsp_pid_t pid, const void *src, bsp_size_t offset, void *dst, bsp_size_t nbytes) {
    get("bsp_get", pid, src, offset, dst, nbytes);
}

void bsp_hpget(bsp_pid_t pid, const void *src, bsp_size_t offset, void *dst, bsp_size_t nbytes) {
    get("bsp_hpget", pid, src, offset, dst, nbytes);
}

/* ---- BSMP --------------------------------------------------------------------------- */

void bsp_set_tagsize(bsp_size_t *tag_nbytes) {
    need_spmd("bsp_set_tagsize");
    if (!tag_nbytes) fail("bsp_set_tagsize: NULL ptr as argument is not allowed");
    if (*tag_nbytes < 0) fail("bsp_set_tagsize: the tag size may not be negative (got %d)", *tag_nbytes);
    bsp_size_t old = tagsize_pending;
    tagsize_pending = *tag_nbytes;
    *tag_nbytes = old;
    tagsize_sets++;
}

void bsp_send(bsp_pid_t pid, const void *tag, const void *payload, bsp_size_t payload_nbytes) {
    need_spmd("bsp_send");
    if (pid < 0 || pid >= P) fail("bsp_send: The destination process ID %d does not exist (bsp_nprocs() is %d)", pid, P);
    if (payload_nbytes < 0) fail("bsp_send: Payload size may not be negative (got %d)", payload_nbytes);
    if (payload_nbytes > 0 && !payload) fail("bsp_send: payload may not be NULL when its size is %d", payload_nbytes);
    if (tagsize > 0 && !tag) fail("bsp_send: tag may not be NULL when the tag size is %d", tagsize);
    if ((uint64_t)tagsize + (uint64_t)payload_nbytes > (8u << 20))
        fail("bsp_send: a message of %d payload and %d tag bytes is more than the 8 MiB one message can carry; send it in parts",
             payload_nbytes, tagsize);
    scratch.len = 0;
    char *m = bytes_reserve(&scratch, (size_t)tagsize + (size_t)payload_nbytes);
    if (tagsize) memcpy(m, tag, (size_t)tagsize);
    if (payload_nbytes) memcpy(m + tagsize, payload, (size_t)payload_nbytes);
    host_set_tag(TAG_BSMP);
    if (host_send(pid, scratch.data, (int32_t)scratch.len) < 0)
        fail("bsp_send: the host refused a message of %zu bytes", scratch.len);
}

void bsp_qsize(bsp_nprocs_t *nmessages, bsp_size_t *accum_nbytes) {
    need_spmd("bsp_qsize");
    if (!nmessages || !accum_nbytes) fail("bsp_qsize: both arguments may not be NULL");
    size_t total = 0;
    for (size_t i = queue_next; i < queue_len; i++) total += queue[i].size;
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
    qmsg_t *q = &queue[queue_next];
    *status = (bsp_size_t)q->size;
    if (queue_tagsize) {
        if (!tag) fail("bsp_get_tag: tag may not be NULL when the tag size is %d", queue_tagsize);
        memcpy(tag, queue_bytes.data + q->offset, (size_t)queue_tagsize);
    }
}

void bsp_move(void *payload, bsp_size_t reception_nbytes) {
    need_spmd("bsp_move");
    if (queue_next == queue_len) fail("bsp_move: Message queue was empty");
    if (reception_nbytes < 0) fail("bsp_move: reception_nbytes may not be negative (got %d)", reception_nbytes);
    if (reception_nbytes > 0 && !payload) fail("bsp_move: payload may not be NULL if reception_nbytes is non-zero");
    qmsg_t *q = &queue[queue_next++];
    size_t n = q->size < (uint32_t)reception_nbytes ? q->size : (size_t)reception_nbytes;
    if (n) memcpy(payload, queue_bytes.data + q->offset + queue_tagsize, n);
}

bsp_size_t bsp_hpmove(void **tag_ptr_buf, void **payload_ptr_buf) {
    need_spmd("bsp_hpmove");
    if (!tag_ptr_buf || !payload_ptr_buf) fail("bsp_hpmove: pointer arguments may not be NULL");
    if (queue_next == queue_len) return -1;
    qmsg_t *q = &queue[queue_next++];
    *tag_ptr_buf = queue_bytes.data + q->offset;
    *payload_ptr_buf = queue_bytes.data + q->offset + queue_tagsize;
    return (bsp_size_t)q->size;
}

/* ---- the synchronisation -------------------------------------------------------------- */

typedef struct {
    uint32_t kind, npush, npop, ntagset, tagsize, ngets;
} header_t;

static header_t *headers;     /* P of them, by source */
static char **header_body;    /* pushes then pops of each source */
static size_t headers_cap, bodies_cap;
static bytes_t header_bytes;

static const char *kind_name(uint32_t k) { return k == KIND_END ? "bsp_end" : "bsp_sync"; }

/* Copy host message i into b (replacing its contents); returns its payload. */
static char *read_msg(int32_t i, uint32_t len, bytes_t *b) {
    b->len = 0;
    char *at = bytes_reserve(b, len ? len : 1);
    host_msg_read(i, at);
    return at;
}

static void apply_put(const char *msg, uint32_t len, bsp_pid_t from) {
    const uint32_t *h = (const uint32_t *)msg;
    uint32_t id = h[0], offset = h[1], n = len - 8;
    for (size_t i = nslots; i-- > 0;) {
        if (slots[i].id != id) continue;
        reg_t r = slots[i].who[me];
        if ((uint64_t)offset + n > r.size)
            fail("bsp_put: process %d writes %u bytes at offset %u of a %u-byte registration", from, n, offset, r.size);
        memcpy((char *)(uintptr_t)r.addr + offset, msg + 8, n);
        return;
    }
    fail("bsp_put: process %d wrote to a registration this process does not have (a runtime bug)", from);
}

static void serve_get(const uint32_t *req, bsp_pid_t from) {
    uint32_t id = req[0], offset = req[1], n = req[2], dst = req[3];
    for (size_t i = nslots; i-- > 0;) {
        if (slots[i].id != id) continue;
        reg_t r = slots[i].who[me];
        if ((uint64_t)offset + n > r.size)
            fail("bsp_get: process %d reads %u bytes at offset %u of a %u-byte registration", from, n, offset, r.size);
        scratch.len = 0;
        uint32_t *rep = bytes_reserve(&scratch, 4 + (size_t)n);
        rep[0] = dst;
        memcpy(rep + 1, (const char *)(uintptr_t)r.addr + offset, n);
        host_set_tag(TAG_GET_REP);
        host_send(from, scratch.data, (int32_t)scratch.len);
        return;
    }
    fail("bsp_get: process %d read a registration this process does not have (a runtime bug)", from);
}

static void check_headers(int kind) {
    for (bsp_pid_t s = 0; s < P; s++) {
        if (headers[s].kind == 0)
            fail("%s: process %d has ended (returned from main or called exit) while process %d called %s",
                 kind_name((uint32_t)kind), s, me, kind_name((uint32_t)kind));
    }
    for (bsp_pid_t s = 1; s < P; s++) {
        const header_t *a = &headers[0], *b = &headers[s];
        if (a->kind != b->kind)
            fail("bsp_sync/bsp_end: Some processes have called bsp_sync, while others have called bsp_end instead "
                 "(process 0 called %s, process %d %s)", kind_name(a->kind), s, kind_name(b->kind));
        if (a->npush != b->npush)
            fail("bsp_sync/bsp_push_reg: Not all processes registered the same number of memory blocks "
                 "(process 0: %u, process %d: %u)", a->npush, s, b->npush);
        if (a->npop != b->npop)
            fail("bsp_sync/bsp_pop_reg: Not all processes popped the same number of registrations "
                 "(process 0: %u, process %d: %u)", a->npop, s, b->npop);
        if (a->ntagset != b->ntagset)
            fail("bsp_sync/bsp_set_tagsize: Not all processes set the tag size same number of times "
                 "(process 0: %u, process %d: %u)", a->ntagset, s, b->ntagset);
        if (a->ntagset && a->tagsize != b->tagsize)
            fail("bsp_sync/bsp_set_tagsize: Not all processes announced the same tag size "
                 "(process 0: %u, process %d: %u)", a->tagsize, s, b->tagsize);
    }
}

/* Pop j of process s: its address and how many of this superstep's pushes
 * came before it. */
static pop_t pop_of(bsp_pid_t s, uint32_t npush, uint32_t j) {
    pop_t p;
    memcpy(&p, header_body[s] + npush * sizeof(reg_t) + j * sizeof(pop_t), sizeof p);
    return p;
}

/* The registrations change in each process's call order: pop j of process
 * s removes the newest registration of its address among those that
 * existed when it was called (earlier slots, and the pushes of this
 * superstep made before it, less what earlier pops removed). Every process
 * must pop the same registration; NULL pops match a registration of NULL. */
static void apply_registrations(void) {
    uint32_t npush = headers[0].npush, npop = headers[0].npop;
    for (uint32_t j = 0; j < npush; j++) {
        reg_t *who = malloc(sizeof(reg_t) * (size_t)P);
        if (!who) fail("bsp_sync: out of memory");
        for (bsp_pid_t s = 0; s < P; s++) memcpy(&who[s], header_body[s] + j * sizeof(reg_t), sizeof(reg_t));
        slots = grow(slots, &slots_cap, nslots + 1, sizeof *slots);
        slots[nslots++] = (slot_t){next_slot_id++, who};
    }
    for (uint32_t j = 0; j < npop; j++) {
        long k = -1;
        bsp_pid_t by = -1;
        uint32_t visible_min = npush;
        for (bsp_pid_t s = 0; s < P; s++) {
            pop_t pp = pop_of(s, npush, j);
            if (pp.after > npush) fail("bsp_sync: malformed header from process %d", s);
            if (pp.after < visible_min) visible_min = pp.after;
            if (pp.addr == 0) continue;
            /* slots visible to s at its pop: the old ones and its first `after` pushes (those still there) */
            long ks = -1;
            for (size_t i = nslots; i-- > 0;) {
                int is_new = slots[i].id >= next_slot_id - npush;
                if (is_new && slots[i].id - (next_slot_id - npush) >= pp.after) continue;
                if (slots[i].who[s].addr == pp.addr) { ks = (long)i; break; }
            }
            if (ks < 0)
                fail("bsp_sync/bsp_pop_reg: process %d tried to deregister address %#x, which it had not registered", s, pp.addr);
            if (k >= 0 && ks != k)
                fail("bsp_sync/bsp_pop_reg: Processes %d and %d did not pop the same memory registration", by, s);
            k = ks;
            by = s;
        }
        if (k < 0) {
            /* everyone popped NULL: the newest registration of NULL everywhere, visible to all */
            int any_null = 0;
            for (size_t i = nslots; i-- > 0 && k < 0;) {
                int is_new = slots[i].id >= next_slot_id - npush;
                if (is_new && slots[i].id - (next_slot_id - npush) >= visible_min) continue;
                int all = 1;
                for (bsp_pid_t s = 0; s < P; s++) {
                    if (slots[i].who[s].addr != 0) all = 0;
                    else any_null = 1;
                }
                if (all) k = (long)i;
            }
            if (k < 0) {
                if (any_null)
                    fail("bsp_sync/bsp_pop_reg: Tried to deregister NULL on all processes, but could not find a matching registration");
                fail("bsp_sync/bsp_pop_reg: Tried to deregister NULL on all processes, but NULL was never registered");
            }
        } else {
            for (bsp_pid_t s = 0; s < P; s++) {
                pop_t pp = pop_of(s, npush, j);
                int is_new = slots[k].id >= next_slot_id - npush;
                int visible = !is_new || slots[k].id - (next_slot_id - npush) < pp.after;
                if (pp.addr == 0 && (slots[k].who[s].addr != 0 || !visible))
                    fail("bsp_sync/bsp_pop_reg: Processes %d and %d did not pop the same memory registration", by, s);
            }
        }
        free(slots[k].who);
        memmove(&slots[k], &slots[k + 1], (nslots - (size_t)k - 1) * sizeof *slots);
        nslots--;
    }
}

static void exchange(int kind) {
    /* 1. Tell everyone what this process did. */
    size_t body = npushes * sizeof(reg_t) + npops * sizeof(pop_t);
    scratch.len = 0;
    header_t *h = bytes_reserve(&scratch, sizeof(header_t) + body);
    *h = (header_t){(uint32_t)kind, (uint32_t)npushes, (uint32_t)npops, tagsize_sets, (uint32_t)tagsize_pending, gets_issued};
    memcpy(h + 1, pushes, npushes * sizeof(reg_t));
    memcpy((char *)(h + 1) + npushes * sizeof(reg_t), pops, npops * sizeof(pop_t));
    host_set_tag(TAG_HEADER);
    host_send_range(0, P, scratch.data, (int32_t)scratch.len);

    bspweb__sync();

    /* 2. Read the headers. */
    headers = grow(headers, &headers_cap, (size_t)P, sizeof *headers);
    header_body = grow(header_body, &bodies_cap, (size_t)P, sizeof *header_body);
    memset(headers, 0, sizeof(header_t) * (size_t)P);
    int32_t n = host_msg_count();
    uint32_t info[3];
    size_t total = 0;
    for (int32_t i = 0; i < n; i++)
        if (host_msg_tag(i) == TAG_HEADER && host_msg_info(i, info) == 0) total += info[2];
    header_bytes.len = 0;
    bytes_reserve(&header_bytes, total ? total : 1);
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        if (host_msg_tag(i) != TAG_HEADER) continue;
        host_msg_info(i, info);
        uint32_t src = info[0], len = info[2];
        if (src >= (uint32_t)P || len < sizeof(header_t)) fail("bsp_sync: malformed header from process %u", src);
        host_msg_read(i, header_bytes.data + at);
        memcpy(&headers[src], header_bytes.data + at, sizeof(header_t));
        header_body[src] = header_bytes.data + at + sizeof(header_t);
        at += len;
    }
    check_headers(kind);
    uint32_t any_gets = 0;
    for (bsp_pid_t s = 0; s < P; s++) any_gets += headers[s].ngets;

    /* 3. Puts (held if gets come first), get requests, BSMP messages. */
    queue_len = queue_next = 0;
    queue_bytes.len = 0;
    queue_tagsize = tagsize;
    held_puts.len = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t tag = host_msg_tag(i);
        if (tag == TAG_HEADER) continue;
        host_msg_info(i, info);
        uint32_t src = info[0], len = info[2];
        switch (tag) {
        case TAG_PUT:
            if (len < 8) fail("bsp_sync: malformed put from process %u", src);
            if (any_gets) {
                uint32_t *rec = bytes_reserve(&held_puts, 8 + ((len + 3) & ~3u));
                rec[0] = src;
                rec[1] = len;
                host_msg_read(i, rec + 2);
            } else {
                apply_put(read_msg(i, len, &scratch), len, (bsp_pid_t)src);
            }
            break;
        case TAG_GET_REQ: {
            uint32_t req[4];
            if (len != sizeof req) fail("bsp_sync: malformed get request from process %u", src);
            host_msg_read(i, req);
            serve_get(req, (bsp_pid_t)src);
            break;
        }
        case TAG_BSMP: {
            if (len < (uint32_t)queue_tagsize) fail("bsp_sync: malformed message from process %u", src);
            queue = grow(queue, &queue_cap, queue_len + 1, sizeof *queue);
            uint32_t off = (uint32_t)queue_bytes.len;
            char *at2 = bytes_reserve(&queue_bytes, ((size_t)len + 7) & ~(size_t)7);
            host_msg_read(i, at2);
            queue[queue_len++] = (qmsg_t){off, len - (uint32_t)queue_tagsize};
            break;
        }
        default:
            fail("bsp_sync: a message of unknown kind %lld from process %u", (long long)tag, src);
        }
    }

    /* BSPonMPI hands messages out last received first; programs written
     * for it may rely on that, so do the same (BSPlib leaves it open). */
    for (size_t i = 0, j = queue_len; i + 1 < j; i++, j--) {
        qmsg_t t = queue[i];
        queue[i] = queue[j - 1];
        queue[j - 1] = t;
    }

    /* 4. Second round: the replies to gets, then the held puts. */
    if (any_gets) {
        bspweb__sync();
        n = host_msg_count();
        for (int32_t i = 0; i < n; i++) {
            host_msg_info(i, info);
            uint32_t len = info[2];
            if (host_msg_tag(i) != TAG_GET_REP || len < 4) fail("bsp_sync: malformed get reply from process %u", info[0]);
            char *rep = read_msg(i, len, &scratch);
            uint32_t dst;
            memcpy(&dst, rep, 4);
            memcpy((char *)(uintptr_t)dst, rep + 4, len - 4);
        }
        for (size_t off = 0; off < held_puts.len;) {
            uint32_t *rec = (uint32_t *)(held_puts.data + off);
            apply_put((const char *)(rec + 2), rec[1], (bsp_pid_t)rec[0]);
            off += 8 + ((rec[1] + 3) & ~3u);
        }
    }

    /* 5. Registrations and the tag size change now. */
    apply_registrations();
    if (headers[0].ntagset) tagsize = (bsp_size_t)headers[0].tagsize;
    tagsize_pending = tagsize;
    npushes = npops = 0;
    tagsize_sets = gets_issued = 0;
    bspweb__supersteps++;
}

void bsp_sync(void) {
    need_spmd("bsp_sync");
    exchange(KIND_SYNC);
}
