/*
 * Pager: a pool of worker threads reading file ranges into caller buffers (see strata.h).
 *
 * State, all under one mutex:
 *   reqs[MAX]   request table; a ticket is (generation << TICKET_BITS) | index, so a spent or
 *               reused slot is told apart from the request the caller holds a ticket for
 *   free_list   indices of FREE slots (a stack)
 *   queue       ring of indices of requests with chunks no worker has claimed yet, oldest first
 * Request life: FREE -> submit -> QUEUED -> (last chunk claimed) RUNNING -> (last chunk read)
 * DONE -> wait -> FREE. Workers claim the next chunk of the oldest queued request, so the chunks
 * of one large request run on several workers at once (queue depth), and requests finish in
 * roughly the order they were submitted.
 *
 * O_DIRECT: offset, length and buffer must be multiples of the file system's alignment. GGUF
 * slabs are only 32-byte aligned, so a direct request reads the enclosing aligned range
 * [floor(offset), ceil(offset + nbytes)) into dst and reports where the slab starts. That range is
 * at most round_up(nbytes, align) + align bytes long; the caller's buffer must hold it, else the
 * request is read buffered. The last aligned block may pass the end of the file: the read there
 * comes back short, which is fine as long as it covers the requested bytes.
 *
 * Parts: a model split in several files (llama.cpp's gguf-split) is one address space. Part i's
 * byte 0 lies at offset base[i] of it (bases ascending, no part overlapping the next); a request
 * lies inside one part and is read from that part's descriptors at offset - base. Bases that are
 * multiples of the O_DIRECT alignment keep aligned ranges aligned in every file; a part whose base
 * is not, or whose file system refuses O_DIRECT, is read buffered.
 *
 * Nothing is allocated after open: the parts, the request table, the queue and the workers are fixed.
 */
#include "strata.h"
#include "common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQUESTS 4096
#define TICKET_BITS 12            /* 2^12 == MAX_REQUESTS */
#define MAX_THREADS 256
#define DEFAULT_CHUNK (1 << 20)
#define FALLBACK_ALIGN 4096       /* when statx cannot say: a page covers every block size in use */
#define MAX_PARTS 65535           /* split.count is a u16 */

_Static_assert((1 << TICKET_BITS) == MAX_REQUESTS, "ticket index bits");

enum { REQ_FREE, REQ_QUEUED, REQ_RUNNING, REQ_DONE };

typedef struct {
    int64_t generation;
    int state;
    int status;
    int direct;
    int os_errno;
    int32_t part;         /* index of the part the request lies in */
    uint8_t *dst;
    int64_t read_start;   /* file offset of dst[0] */
    int64_t read_end;     /* end of the range read (aligned for direct; may pass EOF) */
    int64_t need_end;     /* offset + nbytes: every byte before it must arrive */
    int64_t nbytes, data_offset, error_offset;
    int64_t n_chunks, next_chunk, chunks_left;
} request;

typedef struct {
    int fd_buffered, fd_direct;   /* fd_direct is -1 when O_DIRECT is not used for this part */
    const uint8_t *map;           /* read-only mapping for FALLBACK_MMAP, else NULL */
    int32_t guard, guarded;       /* the map's range in the SIGBUS guard (guard.c), when guarded */
    int64_t base, size;           /* where its byte 0 lies in the pager's offsets; its file size */
} part_file;

struct strata_pager {
    part_file *parts;
    int32_t n_parts;
    int64_t file_size;            /* the last part's end: every offset is below it */
    int64_t align, chunk_bytes;   /* align: a multiple of every direct part's alignment; 0 when none */
    int n_threads, started, closed;

    pthread_mutex_t mu;
    pthread_cond_t work;          /* a chunk was queued, or the pager is closing */
    pthread_cond_t done;          /* a request finished */
    pthread_t threads[MAX_THREADS];

    request reqs[MAX_REQUESTS];
    int free_list[MAX_REQUESTS];
    int n_free;
    int queue[MAX_REQUESTS];
    int q_head, q_len;

    strata_pager_stats stats;
    int64_t busy_since_ns;
};

static int64_t round_down(int64_t x, int64_t a) { return x / a * a; }
static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* ---- Reading one chunk ---- */

/* Read file bytes [start, end) into dst, stopping early only at end of file once `need` bytes
 * (counted from start) have arrived. A direct read that comes back short of an aligned length
 * (an interrupted transfer) continues buffered: the next offset is no longer aligned. */
static int read_range(const strata_pager *p, const part_file *f, int direct, uint8_t *dst, int64_t start,
                      int64_t end, int64_t need, int *os_errno, int64_t *error_offset, int64_t *got_out) {
    int64_t got = 0;
    while (got < end - start) {
        int fd = direct && got % p->align == 0 ? f->fd_direct : f->fd_buffered;
        ssize_t r = pread(fd, dst + got, (size_t)(end - start - got), (off_t)(start + got - f->base));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            *os_errno = errno;
            *error_offset = start + got;
            return STRATA_E_IO;
        }
        if (r == 0) break;  /* end of file */
        got += r;
    }
    *got_out = got;
    if (got < need) {       /* the file shrank since open */
        *os_errno = 0;
        *error_offset = start + got;
        return STRATA_E_IO;
    }
    return STRATA_OK;
}

static int read_chunk(const strata_pager *p, const request *r, int64_t chunk,
                      int *os_errno, int64_t *error_offset, int64_t *bytes_read) {
    const int64_t start = r->read_start + chunk * p->chunk_bytes;
    int64_t end = start + p->chunk_bytes;
    if (end > r->read_end) end = r->read_end;
    int64_t need = (r->need_end < end ? r->need_end : end) - start;
    uint8_t *dst = r->dst + (start - r->read_start);
    const part_file *f = &p->parts[r->part];
    if (!r->direct && f->map) {
        memcpy(dst, f->map + (start - f->base), (size_t)(end - start));  /* in range: checked at submit */
        *bytes_read = end - start;
        int64_t faults = 0, zeroed_from = 0;
        strata_guard_faults(f->guard, &faults, &zeroed_from);
        if (faults && zeroed_from < end - f->base) {  /* the file shrank: past there the map reads zeros */
            *os_errno = 0;
            *error_offset = start;
            return STRATA_E_IO;
        }
        return STRATA_OK;
    }
    return read_range(p, f, r->direct, dst, start, end, need, os_errno, error_offset, bytes_read);
}

/* ---- Request bookkeeping (mutex held) ---- */

static void finish_request(strata_pager *p, request *r) {
    r->state = REQ_DONE;
    p->stats.completed++;
    p->stats.failed += r->status == STRATA_E_IO;
    if (r->status == STRATA_OK) {
        p->stats.direct += r->direct;
        p->stats.bytes_requested += r->nbytes;
    }
    if (--p->stats.in_flight == 0) p->stats.busy_ns += strata_now_ns() - p->busy_since_ns;
    pthread_cond_broadcast(&p->done);
}

/* The next unclaimed chunk of the oldest queued request; -1 when the queue is empty. */
static int claim_chunk(strata_pager *p, int64_t *chunk) {
    if (p->q_len == 0) return -1;
    int idx = p->queue[p->q_head];
    request *r = &p->reqs[idx];
    *chunk = r->next_chunk++;
    if (r->next_chunk == r->n_chunks) {
        r->state = REQ_RUNNING;
        p->q_head = (p->q_head + 1) % MAX_REQUESTS;
        p->q_len--;
    }
    return idx;
}

static void *worker_main(void *arg) {
    strata_pager *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int64_t chunk;
        int idx;
        while ((idx = claim_chunk(p, &chunk)) < 0 && !p->closed) pthread_cond_wait(&p->work, &p->mu);
        if (idx < 0) break;  /* closed and nothing queued */
        request *r = &p->reqs[idx];
        int skip = r->status != STRATA_OK;  /* an earlier chunk failed: the request is lost anyway */
        pthread_mutex_unlock(&p->mu);

        int os_errno = 0, status = STRATA_OK;
        int64_t error_offset = 0, bytes = 0, t0 = strata_now_ns();
        if (!skip) status = read_chunk(p, r, chunk, &os_errno, &error_offset, &bytes);
        int64_t t1 = strata_now_ns();

        pthread_mutex_lock(&p->mu);
        p->stats.read_ns += t1 - t0;
        p->stats.bytes_read += bytes;
        p->stats.chunks += !skip;
        if (status != STRATA_OK && r->status == STRATA_OK) {
            r->status = status;
            r->os_errno = os_errno;
            r->error_offset = error_offset;
        }
        if (--r->chunks_left == 0) finish_request(p, r);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- Open: descriptors, O_DIRECT probe, workers ---- */

/* The O_DIRECT alignment the file system reports for this file (statx, Linux 6.1+), else a page.
 * 0 when the file system says direct I/O is not supported on it. */
static int64_t direct_alignment(const char *path) {
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(AT_FDCWD, path, 0, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (sx.stx_dio_offset_align == 0) return 0;
        int64_t a = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align : sx.stx_dio_mem_align;
        return a;
    }
#endif
    return FALLBACK_ALIGN;
}

/* Open `path` with O_DIRECT and read its first aligned block: some file systems accept the flag
 * at open and refuse the reads. Returns the descriptor, or -1 (direct I/O not usable). */
static int open_direct(const char *path, int64_t align) {
    if (align <= 0) return -1;
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) return -1;
    void *buf = NULL;
    if (posix_memalign(&buf, (size_t)align, (size_t)align) != 0) {
        close(fd);
        return -1;
    }
    ssize_t r;
    do r = pread(fd, buf, (size_t)align, 0); while (r < 0 && errno == EINTR);
    free(buf);
    if (r < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Open one part: its buffered descriptor, size, O_DIRECT descriptor and mapping as `flags` ask.
 * *align is the part's direct alignment (0 when it is read buffered). */
static int open_part(part_file *f, const char *path, int flags, int64_t *align, int *os_errno) {
    f->fd_buffered = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd_buffered < 0) {
        *os_errno = errno;
        return STRATA_E_OPEN;
    }
    struct stat st;
    if (fstat(f->fd_buffered, &st) != 0) {
        *os_errno = errno;
        return STRATA_E_OPEN;
    }
    if (!S_ISREG(st.st_mode)) {  /* a pager reads files, not devices or directories */
        *os_errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return STRATA_E_OPEN;
    }
    f->size = st.st_size;
    *align = 0;
    if (!(flags & STRATA_PAGER_DIRECT_OFF)) {
        int64_t a = direct_alignment(path);
        f->fd_direct = open_direct(path, a);
        *align = f->fd_direct >= 0 ? a : 0;
    }
    if ((flags & STRATA_PAGER_DIRECT_REQUIRED) && f->fd_direct < 0) return STRATA_E_DIRECT;
    if ((flags & STRATA_PAGER_FALLBACK_MMAP) && f->size > 0) {
        void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, f->fd_buffered, 0);
        if (m == MAP_FAILED) {
            *os_errno = errno;
            return STRATA_E_OPEN;
        }
        f->map = m;
        /* Guarded: a copy from a page the file no longer has reads zeros and fails its request
         * (read_chunk), instead of SIGBUS. */
        int st = strata_guard_add(m, f->size, &f->guard);
        if (st != STRATA_OK) return st;
        f->guarded = 1;
    }
    return STRATA_OK;
}

/* Open every part; a part that overlaps the next one's base is STRATA_E_ARG. *bad_part names the
 * part that failed. The common alignment is the largest part's (alignments are powers of two). */
static int open_files(strata_pager *p, const char *const *paths, const int64_t *bases, int flags,
                      int *os_errno, int32_t *bad_part) {
    for (int32_t i = 0; i < p->n_parts; i++) {
        part_file *f = &p->parts[i];
        int64_t align;
        *bad_part = i;
        f->base = bases[i];
        int st = open_part(f, paths[i], flags, &align, os_errno);
        if (st != STRATA_OK) return st;
        if (align > p->align) p->align = align;
        if (i > 0 && p->parts[i - 1].size > f->base - p->parts[i - 1].base) {
            *bad_part = i - 1;
            return STRATA_E_ARG;
        }
    }
    *bad_part = -1;
    const part_file *last = &p->parts[p->n_parts - 1];
    p->file_size = last->base + last->size;
    return STRATA_OK;
}

static int init_sync(strata_pager *p) {
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) return STRATA_E_NOMEM;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);  /* timed waits immune to clock changes */
    int ok = pthread_mutex_init(&p->mu, NULL) == 0 && pthread_cond_init(&p->work, &attr) == 0
             && pthread_cond_init(&p->done, &attr) == 0;
    pthread_condattr_destroy(&attr);
    return ok ? STRATA_OK : STRATA_E_NOMEM;
}

static void release_files(strata_pager *p) {
    for (int32_t i = 0; p->parts && i < p->n_parts; i++) {
        part_file *f = &p->parts[i];
        if (f->guarded) strata_guard_remove(f->guard);  /* before the range can be mapped anew */
        f->guarded = 0;
        if (f->map) munmap((void *)f->map, (size_t)f->size);
        if (f->fd_direct >= 0) close(f->fd_direct);
        if (f->fd_buffered >= 0) close(f->fd_buffered);
        f->map = NULL;
        f->fd_direct = f->fd_buffered = -1;
    }
}

static int check_open_args(const char *const *paths, const int64_t *bases, int32_t n_parts, int n_threads,
                           int64_t chunk_bytes, int flags) {
    if (!paths || !bases || n_parts < 1 || n_parts > MAX_PARTS || n_threads < 1 || n_threads > MAX_THREADS
        || chunk_bytes < 0
        || (flags & ~(STRATA_PAGER_DIRECT_OFF | STRATA_PAGER_DIRECT_REQUIRED | STRATA_PAGER_FALLBACK_MMAP))
        || ((flags & STRATA_PAGER_DIRECT_OFF) && (flags & STRATA_PAGER_DIRECT_REQUIRED)))
        return STRATA_E_ARG;
    for (int32_t i = 0; i < n_parts; i++)
        if (!paths[i] || bases[i] < 0 || (i > 0 && bases[i] <= bases[i - 1])) return STRATA_E_ARG;
    return STRATA_OK;
}

static strata_pager *new_pager(int32_t n_parts) {
    strata_pager *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->parts = calloc((size_t)n_parts, sizeof *p->parts);
    if (!p->parts) {
        free(p);
        return NULL;
    }
    p->n_parts = n_parts;
    for (int32_t i = 0; i < n_parts; i++) p->parts[i].fd_buffered = p->parts[i].fd_direct = -1;
    return p;
}

static void drop_pager(strata_pager *p) {
    release_files(p);
    free(p->parts);
    free(p);
}

int strata_pager_open(const char *path, int n_threads, int64_t chunk_bytes, int flags,
                      strata_pager **pager, int *os_errno) {
    const int64_t base = 0;
    int32_t bad_part;
    return strata_pager_open_parts(&path, &base, 1, n_threads, chunk_bytes, flags, pager, os_errno, &bad_part);
}

int strata_pager_open_parts(const char *const *paths, const int64_t *bases, int32_t n_parts, int n_threads,
                            int64_t chunk_bytes, int flags, strata_pager **pager, int *os_errno, int32_t *bad_part) {
    if (!pager || !os_errno || !bad_part) return STRATA_E_ARG;
    *bad_part = -1;
    int st = check_open_args(paths, bases, n_parts, n_threads, chunk_bytes, flags);
    if (st != STRATA_OK) return st;
    *pager = NULL;
    *os_errno = 0;
    strata_pager *p = new_pager(n_parts);
    if (!p) return STRATA_E_NOMEM;
    st = open_files(p, paths, bases, flags, os_errno, bad_part);
    if (st == STRATA_OK) st = init_sync(p);
    if (st != STRATA_OK) {
        drop_pager(p);
        return st;
    }
    p->chunk_bytes = chunk_bytes ? chunk_bytes : DEFAULT_CHUNK;
    if (p->align) p->chunk_bytes = round_up(p->chunk_bytes, p->align);
    p->n_threads = n_threads;
    for (int i = 0; i < MAX_REQUESTS; i++) p->free_list[i] = MAX_REQUESTS - 1 - i;
    p->n_free = MAX_REQUESTS;
    for (; p->started < n_threads; p->started++)
        if (pthread_create(&p->threads[p->started], NULL, worker_main, p) != 0) break;
    if (p->started == 0) {
        strata_pager_free(p);
        return STRATA_E_THREAD;
    }
    *pager = p;
    return STRATA_OK;
}

int strata_pager_get_info(strata_pager *p, strata_pager_info *info) {
    if (!p || !info) return STRATA_E_ARG;
    int direct = p->align > 0, mapped = 0;  /* direct: every part is read with O_DIRECT */
    for (int32_t i = 0; i < p->n_parts; i++) {
        direct &= p->parts[i].fd_direct >= 0 && (!p->align || p->parts[i].base % p->align == 0);
        mapped |= p->parts[i].map != NULL;
    }
    *info = (strata_pager_info){
        .file_size = p->file_size, .align = p->align, .chunk_bytes = p->chunk_bytes,
        .n_threads = p->started, .direct = direct, .mmap = mapped,
        .max_requests = MAX_REQUESTS, .n_parts = p->n_parts,
    };
    return STRATA_OK;
}

int strata_pager_get_part(strata_pager *p, int32_t index, strata_pager_part *part) {
    if (!p || !part || index < 0 || index >= p->n_parts) return STRATA_E_ARG;
    const part_file *f = &p->parts[index];
    *part = (strata_pager_part){.base = f->base, .size = f->size,
                                .direct = f->fd_direct >= 0 && p->align > 0 && f->base % p->align == 0};
    return STRATA_OK;
}

/* ---- Submit, poll, wait ---- */

/* The part holding offset: the last one whose base is at or below it (bases ascend). */
static int32_t find_part(const strata_pager *p, int64_t offset) {
    int32_t lo = 0, hi = p->n_parts - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (p->parts[mid].base <= offset) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Whether a request can be read with O_DIRECT into dst, and the range it then reads. */
static int plan_direct(const strata_pager *p, const part_file *f, int64_t offset, int64_t nbytes, const void *dst,
                       int64_t dst_bytes, int64_t *start, int64_t *end) {
    if (f->fd_direct < 0 || !p->align || f->base % p->align || (uintptr_t)dst % (uintptr_t)p->align) return 0;
    *start = round_down(offset, p->align);
    *end = round_up(offset + nbytes, p->align);
    return *end - *start <= dst_bytes;
}

int strata_pager_submit(strata_pager *p, int64_t offset, int64_t nbytes, void *dst, int64_t dst_bytes,
                        int64_t *ticket) {
    if (!p || !ticket || offset < 0 || nbytes < 0 || dst_bytes < 0 || (nbytes > 0 && !dst)) return STRATA_E_ARG;
    int32_t part = find_part(p, offset);
    const part_file *f = &p->parts[part];
    /* Overflow-safe: base <= offset <= base + size, so the subtraction cannot wrap. */
    if (offset < f->base || offset - f->base > f->size || nbytes > f->size - (offset - f->base) || nbytes > dst_bytes)
        return STRATA_E_SIZE;
    pthread_mutex_lock(&p->mu);
    int st = p->closed ? STRATA_E_CLOSED : p->n_free == 0 ? STRATA_E_BUSY : STRATA_OK;
    if (st != STRATA_OK) {
        pthread_mutex_unlock(&p->mu);
        return st;
    }
    int idx = p->free_list[--p->n_free];
    request *r = &p->reqs[idx];
    int64_t generation = r->generation + 1;
    *r = (request){.generation = generation, .state = REQ_QUEUED, .status = STRATA_OK, .part = part,
                   .dst = dst, .nbytes = nbytes, .need_end = offset + nbytes};
    r->direct = nbytes > 0 && plan_direct(p, f, offset, nbytes, dst, dst_bytes, &r->read_start, &r->read_end);
    if (!r->direct) {
        r->read_start = offset;
        r->read_end = offset + nbytes;
    }
    r->data_offset = offset - r->read_start;
    r->n_chunks = r->chunks_left = (r->read_end - r->read_start + p->chunk_bytes - 1) / p->chunk_bytes;
    p->stats.submitted++;
    if (p->stats.in_flight++ == 0) p->busy_since_ns = strata_now_ns();
    if (r->n_chunks == 0) {
        finish_request(p, r);
    } else {
        p->queue[(p->q_head + p->q_len++) % MAX_REQUESTS] = idx;
        pthread_cond_broadcast(&p->work);
    }
    *ticket = (generation << TICKET_BITS) | idx;
    pthread_mutex_unlock(&p->mu);
    return STRATA_OK;
}

/* The request a ticket names, or NULL when it is not pending (mutex held). */
static request *find_request(strata_pager *p, int64_t ticket) {
    if (ticket <= 0) return NULL;
    request *r = &p->reqs[ticket & (MAX_REQUESTS - 1)];
    return r->state != REQ_FREE && r->generation == ticket >> TICKET_BITS ? r : NULL;
}

int strata_pager_poll(strata_pager *p, int64_t ticket, int *done) {
    if (!p || !done) return STRATA_E_ARG;
    pthread_mutex_lock(&p->mu);
    request *r = find_request(p, ticket);
    int st = p->closed ? STRATA_E_CLOSED : r ? STRATA_OK : STRATA_E_TICKET;
    *done = r && r->state == REQ_DONE;
    pthread_mutex_unlock(&p->mu);
    return st;
}

static struct timespec deadline_after(int64_t timeout_ns) {
    int64_t t = strata_now_ns() + timeout_ns;
    return (struct timespec){.tv_sec = t / 1000000000, .tv_nsec = t % 1000000000};
}

int strata_pager_wait(strata_pager *p, int64_t ticket, int64_t timeout_ns, strata_pager_result *result) {
    if (!p || !result) return STRATA_E_ARG;
    if (timeout_ns > INT64_MAX / 2) timeout_ns = -1;  /* centuries: forever, and no overflow below */
    struct timespec deadline = deadline_after(timeout_ns < 0 ? 0 : timeout_ns);
    pthread_mutex_lock(&p->mu);
    if (p->closed) {
        pthread_mutex_unlock(&p->mu);
        return STRATA_E_CLOSED;
    }
    request *r;
    /* Re-check the ticket after every wake: another thread may have collected it meanwhile. */
    while ((r = find_request(p, ticket)) && r->state != REQ_DONE) {
        if (timeout_ns < 0) {
            pthread_cond_wait(&p->done, &p->mu);
        } else if (pthread_cond_timedwait(&p->done, &p->mu, &deadline) == ETIMEDOUT) {
            r = find_request(p, ticket);
            if (r && r->state != REQ_DONE) {
                pthread_mutex_unlock(&p->mu);
                return STRATA_E_TIMEOUT;
            }
        }
    }
    if (!r) {
        pthread_mutex_unlock(&p->mu);
        return STRATA_E_TICKET;
    }
    *result = (strata_pager_result){.data_offset = r->data_offset, .nbytes = r->nbytes,
                                    .error_offset = r->error_offset, .os_errno = r->os_errno,
                                    .direct = r->direct};
    int st = r->status;
    r->state = REQ_FREE;
    p->free_list[p->n_free++] = (int)(r - p->reqs);
    pthread_mutex_unlock(&p->mu);
    return st;
}

int strata_pager_get_stats(strata_pager *p, strata_pager_stats *stats) {
    if (!p || !stats) return STRATA_E_ARG;
    pthread_mutex_lock(&p->mu);
    *stats = p->stats;
    if (stats->in_flight) stats->busy_ns += strata_now_ns() - p->busy_since_ns;
    pthread_mutex_unlock(&p->mu);
    return STRATA_OK;
}

/* ---- Close ---- */

int strata_pager_close(strata_pager *p) {
    if (!p) return STRATA_E_ARG;
    pthread_mutex_lock(&p->mu);
    if (p->closed) {
        pthread_mutex_unlock(&p->mu);
        return STRATA_OK;
    }
    p->closed = 1;
    /* Cancel the chunks no worker has claimed; chunks being read finish, then the workers exit. */
    for (; p->q_len; p->q_len--, p->q_head = (p->q_head + 1) % MAX_REQUESTS) {
        request *r = &p->reqs[p->queue[p->q_head]];
        r->chunks_left -= r->n_chunks - r->next_chunk;
        r->next_chunk = r->n_chunks;
        r->state = REQ_RUNNING;
        if (r->status == STRATA_OK) r->status = STRATA_E_CLOSED;
        if (r->chunks_left == 0) finish_request(p, r);
    }
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    p->started = 0;
    release_files(p);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->done);  /* waiters of the cancelled requests */
    pthread_mutex_unlock(&p->mu);
    return STRATA_OK;
}

void strata_pager_free(strata_pager *p) {
    if (!p) return;
    strata_pager_close(p);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->parts);
    free(p);
}

const char *strata_pager_status_string(int status) {
    switch (status) {
    case STRATA_E_IO: return "read failed";
    case STRATA_E_CLOSED: return "pager is closed";
    case STRATA_E_TICKET: return "not a pending ticket of this pager";
    case STRATA_E_TIMEOUT: return "request still in flight at the timeout";
    case STRATA_E_BUSY: return "too many uncollected requests";
    case STRATA_E_OPEN: return "cannot open the file";
    case STRATA_E_DIRECT: return "O_DIRECT is not supported for this file";
    case STRATA_E_SIZE: return "range outside the file (or across two of its parts) or destination too small";
    default: return strata_status_string(status);
    }
}

/* ---- NUMA, without libnuma ----
 * Nodes are read from /sys/devices/system/node. On a machine with one node (or none reported)
 * binding is a no-op: every CPU is as close to every buffer as any other. */

static int is_node_dir(const char *name) {
    if (strncmp(name, "node", 4) != 0 || !name[4]) return 0;
    for (const char *c = name + 4; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    return 1;
}

int strata_numa_count_nodes(int *n_nodes) {
    if (!n_nodes) return STRATA_E_ARG;
    int n = 0;
    DIR *d = opendir("/sys/devices/system/node");
    if (d) {
        for (struct dirent *e; (e = readdir(d));) n += is_node_dir(e->d_name);
        closedir(d);
    }
    *n_nodes = n > 0 ? n : 1;
    return STRATA_OK;
}

int strata_numa_locate(const void *addr, int *node) {
    if (!addr || !node) return STRATA_E_ARG;
    int n_nodes;
    strata_numa_count_nodes(&n_nodes);
    *node = 0;
    if (n_nodes <= 1) return STRATA_OK;
#ifdef SYS_get_mempolicy
    /* get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR): the node of the page holding addr (faults it in). */
    int found = 0;
    if (syscall(SYS_get_mempolicy, &found, NULL, 0UL, addr, 1UL | 2UL) == 0) *node = found;
#endif
    return STRATA_OK;
}

/* Parse a sysfs CPU list ("0-3,8,10-11") into a CPU set. */
static int parse_cpulist(const char *s, cpu_set_t *set) {
    CPU_ZERO(set);
    while (*s && *s != '\n') {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s) return 0;
        if (*end == '-') hi = strtol(end + 1, &end, 10);
        for (long c = lo; c <= hi && c < CPU_SETSIZE; c++) CPU_SET((int)c, set);
        s = *end == ',' ? end + 1 : end;
    }
    return CPU_COUNT(set) > 0;
}

int strata_pager_bind_node(strata_pager *p, int node) {
    if (!p || node < 0) return STRATA_E_ARG;
    int n_nodes;
    strata_numa_count_nodes(&n_nodes);
    if (node >= n_nodes) return STRATA_E_ARG;
    if (n_nodes <= 1) return STRATA_OK;
    char path[64], list[4096];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
    FILE *f = fopen(path, "r");
    if (!f) return STRATA_OK;  /* best effort: an unreadable node keeps the workers where they are */
    size_t n = fread(list, 1, sizeof list - 1, f);
    fclose(f);
    list[n] = 0;
    cpu_set_t set;
    if (!parse_cpulist(list, &set)) return STRATA_OK;
    pthread_mutex_lock(&p->mu);
    int st = p->closed ? STRATA_E_CLOSED : STRATA_OK;
    for (int i = 0; st == STRATA_OK && i < p->started; i++)
        pthread_setaffinity_np(p->threads[i], sizeof set, &set);
    pthread_mutex_unlock(&p->mu);
    return st;
}
