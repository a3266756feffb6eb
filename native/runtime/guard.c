/*
 * Guard: reads of a memory-mapped model file that was cut short while mapped (see strata.h).
 *
 * Touching a page of a file mapping that lies past the file's end raises SIGBUS, whose default
 * action kills the process: a model file truncated (or rewritten in place: `cp` truncates first)
 * under a running model would take the server with it. The guard's SIGBUS handler turns such a
 * fault, when its address lies inside a range registered here, into anonymous zero pages mapped
 * over the rest of that range (MAP_FIXED: the faulting instruction then reads zeros when the
 * handler returns) and counts it for the range; Python checks the count after each step and fails
 * that step's requests, so the zeros never reach a user. Every page from the faulting one to the
 * range's end is replaced at once: a fault means the file ends before that page, so the pages
 * after it would fault too (one signal per truncation rather than one per page). The count is
 * sticky: pages replaced by zeros stay zeros even if the file grows back.
 *
 * A SIGBUS outside every registered range (or not raised by a fault) goes to the handler that was
 * installed before the guard (Python's faulthandler under pytest or -X faulthandler), or, when
 * that was the default action, the process dies of it as it would have without the guard.
 *
 * Process-wide state is unavoidable here (a signal handler has no argument): a fixed table of
 * ranges, written under a mutex by add/remove and read lock-free by the handler (base published
 * last, cleared first), and the handler that was installed before the guard's.
 */
#include "strata.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_RANGES 4096           /* mappings guarded at once: one per file of each open model */

typedef struct {
    _Atomic uintptr_t base;       /* 0: a free entry */
    _Atomic int64_t nbytes;
    _Atomic int64_t faults;       /* faults turned into zero pages since the range was added */
    _Atomic int64_t zeroed_from;  /* offset of the first zero page from base (nbytes: none) */
} guard_range;

static guard_range ranges[MAX_RANGES];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous;  /* the SIGBUS action in place before the guard's */
static uintptr_t page_bytes;

static void die_of(int sig) {
    /* The default action, as without the guard: the signal stays blocked until the handler
     * returns, and a fault re-executed after that faults again. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void pass_on(int sig, siginfo_t *info, void *ctx) {
    if (info->si_code <= 0) {
        /* Sent by a process (kill, raise), not a fault. A handler that re-raises (faulthandler
         * restores its own predecessor, the guard's when it was enabled after it, then raises)
         * lands here: going back to it would loop. */
        die_of(sig);
    } else if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction) previous.sa_sigaction(sig, info, ctx);
        else die_of(sig);
    } else if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
        die_of(sig);  /* an ignored fault would re-execute for ever */
    } else {
        previous.sa_handler(sig);
    }
}

static void on_sigbus(int sig, siginfo_t *info, void *ctx) {
    const int saved_errno = errno;
    const uintptr_t addr = (uintptr_t)info->si_addr;
    if (info->si_code > 0) {
        for (int i = 0; i < MAX_RANGES; i++) {
            const uintptr_t base = atomic_load_explicit(&ranges[i].base, memory_order_acquire);
            const uintptr_t end = base + (uintptr_t)atomic_load_explicit(&ranges[i].nbytes, memory_order_relaxed);
            const uintptr_t from = addr / page_bytes * page_bytes;
            const uintptr_t to = (end + page_bytes - 1) / page_bytes * page_bytes;  /* the mapping's end */
            if (!base || addr < base || addr >= to) continue;
            /* mmap is a plain system call on Linux (no lock, no allocation): safe in a handler. */
            void *zeros = mmap((void *)from, to - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (zeros == MAP_FAILED) break;
            int64_t first = atomic_load_explicit(&ranges[i].zeroed_from, memory_order_relaxed);
            while ((int64_t)(from - base) < first &&
                   !atomic_compare_exchange_weak_explicit(&ranges[i].zeroed_from, &first, (int64_t)(from - base),
                                                          memory_order_relaxed, memory_order_relaxed)) {}
            atomic_fetch_add_explicit(&ranges[i].faults, 1, memory_order_release);
            errno = saved_errno;
            return;
        }
    }
    pass_on(sig, info, ctx);
    errno = saved_errno;
}

/* Install the handler, unless it is the current one (mutex held). Installed again over a handler
 * put in its place since: that one becomes the one it passes foreign faults to. */
static int install(void) {
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) != 0) return STRATA_E_ARG;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus) return STRATA_OK;
    previous = now;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    /* SA_ONSTACK: on the thread's alternate stack where it has one (faulthandler's, Python's main
     * thread); SA_RESTART: a system call interrupted elsewhere resumes. */
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, NULL) == 0 ? STRATA_OK : STRATA_E_ARG;
}

int strata_guard_add(const void *base, int64_t nbytes, int32_t *id) {
    if (!base || nbytes <= 0 || !id) return STRATA_E_ARG;
    pthread_mutex_lock(&mu);
    if (!page_bytes) page_bytes = (uintptr_t)sysconf(_SC_PAGESIZE);
    int st = install();
    if (st == STRATA_OK && (uintptr_t)base % page_bytes != 0) st = STRATA_E_ARG;
    int32_t found = -1;
    for (int32_t i = 0; st == STRATA_OK && i < MAX_RANGES && found < 0; i++)
        if (atomic_load_explicit(&ranges[i].base, memory_order_relaxed) == 0) found = i;
    if (st == STRATA_OK && found < 0) st = STRATA_E_NOMEM;
    if (st == STRATA_OK) {
        atomic_store_explicit(&ranges[found].nbytes, nbytes, memory_order_relaxed);
        atomic_store_explicit(&ranges[found].faults, 0, memory_order_relaxed);
        atomic_store_explicit(&ranges[found].zeroed_from, nbytes, memory_order_relaxed);
        atomic_store_explicit(&ranges[found].base, (uintptr_t)base, memory_order_release);
        *id = found;
    }
    pthread_mutex_unlock(&mu);
    return st;
}

int strata_guard_remove(int32_t id) {
    if (id < 0 || id >= MAX_RANGES) return STRATA_E_ARG;
    pthread_mutex_lock(&mu);
    const int st = atomic_load_explicit(&ranges[id].base, memory_order_relaxed) ? STRATA_OK : STRATA_E_ARG;
    atomic_store_explicit(&ranges[id].base, 0, memory_order_release);
    pthread_mutex_unlock(&mu);
    return st;
}

int strata_guard_faults(int32_t id, int64_t *faults, int64_t *zeroed_from) {
    if (id < 0 || id >= MAX_RANGES || !faults || !zeroed_from) return STRATA_E_ARG;
    if (!atomic_load_explicit(&ranges[id].base, memory_order_acquire)) return STRATA_E_ARG;
    *faults = atomic_load_explicit(&ranges[id].faults, memory_order_acquire);
    *zeroed_from = atomic_load_explicit(&ranges[id].zeroed_from, memory_order_relaxed);
    return STRATA_OK;
}
