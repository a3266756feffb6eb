/* Same-host exchange of expert-parallel partial sums: exchange.h says what and why. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "strata.h"
#include "exchange.h"

#define LINE 64
#define MAX_WORLD 4096

typedef struct {
    int64_t seq;
    int64_t pid;
} header;

static header *line_of(uint8_t *seg, int r) { return (header *)(seg + (int64_t)r * LINE); }

static float *slot_of(uint8_t *seg, int world, int64_t slot_floats, int64_t seq, int r) {
    const int64_t buffer = seq & 1;
    return (float *)(seg + (int64_t)world * LINE) + (buffer * world + r) * slot_floats;
}

int64_t strata_exchange_bytes(int world, int64_t slot_floats) {
    if (world < 1 || world > MAX_WORLD || slot_floats < 1 || slot_floats > ((int64_t)1 << 40) / (8 * world))
        return -1;
    return (int64_t)world * LINE + 2 * (int64_t)world * slot_floats * (int64_t)sizeof(float);
}

static int check_layout(const uint8_t *seg, int64_t seg_len, int world, int rank, int64_t slot_floats) {
    if (seg == NULL || rank < 0 || rank >= world) return STRATA_E_ARG;
    const int64_t need = strata_exchange_bytes(world, slot_floats);
    if (need < 0) return STRATA_E_ARG;
    if (seg_len < need || ((uintptr_t)seg % LINE) != 0) return STRATA_E_SIZE;
    return STRATA_OK;
}

int strata_exchange_init(uint8_t *seg, int64_t seg_len, int world, int rank, int64_t slot_floats, int64_t pid) {
    const int status = check_layout(seg, seg_len, world, rank, slot_floats);
    if (status != STRATA_OK) return status;
    header *h = line_of(seg, rank);
    __atomic_store_n(&h->pid, pid, __ATOMIC_RELAXED);
    __atomic_store_n(&h->seq, 0, __ATOMIC_RELEASE);
    return STRATA_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether process `pid` has ended: gone, or a zombie not yet reaped by its parent. */
static int process_ended(int64_t pid) {
    if (pid <= 0) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return errno == ENOENT;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close = strrchr(buf, ')');  /* "pid (comm) S ...": the state follows the name */
    return close != NULL && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* The first rank whose sequence is below `seq`, or -1 when every rank has published it. */
static int first_missing(uint8_t *seg, int world, int64_t seq) {
    for (int r = 0; r < world; r++)
        if (__atomic_load_n(&line_of(seg, r)->seq, __ATOMIC_ACQUIRE) < seq) return r;
    return -1;
}

static int await_all(uint8_t *seg, int world, int64_t seq, double timeout_s, int *late) {
    int missing = first_missing(seg, world, seq);
    for (int spin = 0; missing >= 0 && spin < 4000; spin++) {  /* a few microseconds */
        relax();
        missing = first_missing(seg, world, seq);
    }
    if (missing < 0) return STRATA_OK;
    const double start = now_s();
    double next_check = start + 0.02;
    for (;;) {
        missing = first_missing(seg, world, seq);
        if (missing < 0) return STRATA_OK;
        const double t = now_s();
        if (t >= next_check) {
            next_check = t + 0.02;
            if (process_ended(__atomic_load_n(&line_of(seg, missing)->pid, __ATOMIC_RELAXED))) {
                if (late) *late = missing;
                return STRATA_E_CLOSED;
            }
        }
        if (t - start > timeout_s) {
            if (late) *late = missing;
            return STRATA_E_TIMEOUT;
        }
        if (t - start < 200e-6) {
            sched_yield();
        } else {
            const struct timespec step = {0, 50000};
            nanosleep(&step, NULL);
        }
    }
}

int strata_exchange_sum(uint8_t *seg, int64_t seg_len, int world, int rank, int64_t slot_floats, int64_t seq,
                        const float *partial, int64_t n, float *out, double timeout_s, int *late) {
    const int status = check_layout(seg, seg_len, world, rank, slot_floats);
    if (status != STRATA_OK) return status;
    if (seq < 1 || n < 0 || (n > 0 && (partial == NULL || out == NULL)) || !(timeout_s >= 0)) return STRATA_E_ARG;
    if (n > slot_floats) return STRATA_E_SIZE;
    if (late) *late = -1;
    memcpy(slot_of(seg, world, slot_floats, seq, rank), partial, (size_t)n * sizeof(float));
    __atomic_store_n(&line_of(seg, rank)->seq, seq, __ATOMIC_RELEASE);
    const int waited = await_all(seg, world, seq, timeout_s, late);
    if (waited != STRATA_OK) return waited;
    const float *first = slot_of(seg, world, slot_floats, seq, 0);
    memcpy(out, first, (size_t)n * sizeof(float));
    for (int r = 1; r < world; r++) {
        const float *s = slot_of(seg, world, slot_floats, seq, r);
        for (int64_t i = 0; i < n; i++) out[i] += s[i];
    }
    return STRATA_OK;
}
