/*
 * Persistent compute pool: n_threads - 1 workers that wait between jobs, the caller as thread 0.
 * The decode path dispatches ~100 jobs per token, so a dispatch is a generation counter bump seen
 * by spinning workers (about a microsecond), not a thread start. A worker spins for POOL_SPIN_NS
 * after its last job, then sleeps on a condition variable, so an idle pool uses no CPU.
 *
 * Hand-off protocol (no lost wake-ups): a worker announces `sleepers++` before re-checking the
 * generation under `lock`; the caller bumps the generation before reading `sleepers`. With
 * sequentially consistent atomics one of them sees the other's write, and the broadcast is sent
 * under `lock`, so a worker between its check and its wait cannot miss it. The caller's wait for
 * the end of a job mirrors this with `caller_sleeping` and `pending`.
 *
 * Every worker acknowledges every job (`pending` counts all workers, those without a range
 * included), so no worker can lag a job behind and read the next job's fields as its own.
 */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

#define POOL_MAX_THREADS 256
/* Spin this long after a job before sleeping: long enough to cover the Python work between two
 * matrix calls of one decode step, short enough that a pool left idle stops burning a core. */
#define POOL_SPIN_NS 1000000

typedef struct {
    strata_pool *pool;
    int index;              /* 1..n_threads-1 */
} pool_worker;

struct strata_pool {
    int n_threads;
    pthread_t *threads;
    pool_worker *workers;

    pthread_mutex_t job_lock;      /* one job at a time */
    pthread_mutex_t lock;          /* guards sleeping and waking */
    pthread_cond_t wake, done;

    atomic_uint_fast64_t generation;
    atomic_int sleepers;
    atomic_int caller_sleeping;
    atomic_int pending;            /* workers that have not finished the current job */
    atomic_int stop;

    /* The current job: written by the caller before the generation bump, read by workers after. */
    strata_pool_fn fn;
    void *ctx;
    int64_t n_items;
    int n_parts;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void run_part(strata_pool *p, int part) {
    if (part >= p->n_parts) return;
    const int64_t base = p->n_items / p->n_parts, extra = p->n_items % p->n_parts;
    const int64_t first = part * base + (part < extra ? part : extra);
    p->fn(p->ctx, first, base + (part < extra));
}

/* Wait until the generation differs from `seen` (or stop); returns the new generation. */
static uint_fast64_t wait_for_job(strata_pool *p, uint_fast64_t seen) {
    const int64_t deadline = now_ns() + POOL_SPIN_NS;
    for (int i = 0;; i++) {
        const uint_fast64_t g = atomic_load(&p->generation);
        if (g != seen || atomic_load(&p->stop)) return g;
        if ((i & 63) == 63) {
            if (now_ns() > deadline) break;
            sched_yield();  /* on an oversubscribed machine, let the thread we wait for run */
        }
        POOL_PAUSE();
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
    return atomic_load(&p->generation);
}

static void *worker_main(void *arg) {
    const pool_worker *w = arg;
    strata_pool *p = w->pool;
    uint_fast64_t seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load(&p->stop)) return NULL;
        run_part(p, w->index);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

static void wait_for_workers(strata_pool *p) {
    const int64_t deadline = now_ns() + POOL_SPIN_NS;
    for (int i = 0; atomic_load(&p->pending) > 0; i++) {
        if ((i & 63) == 63 && now_ns() > deadline) {
            pthread_mutex_lock(&p->lock);
            atomic_store(&p->caller_sleeping, 1);
            while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->lock);
            atomic_store(&p->caller_sleeping, 0);
            pthread_mutex_unlock(&p->lock);
            return;
        }
        if ((i & 63) == 63) sched_yield();
        POOL_PAUSE();
    }
}

void strata_pool_run(strata_pool *p, int64_t n_items, int64_t grain, strata_pool_fn fn, void *ctx) {
    if (n_items <= 0) return;
    const int64_t fit = n_items / (grain > 1 ? grain : 1);
    if (!p || p->n_threads == 1 || fit <= 1) {
        fn(ctx, 0, n_items);
        return;
    }
    pthread_mutex_lock(&p->job_lock);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    p->n_parts = fit < p->n_threads ? (int)fit : p->n_threads;
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    run_part(p, 0);
    wait_for_workers(p);
    pthread_mutex_unlock(&p->job_lock);
}

static void stop_workers(strata_pool *p, int started) {
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < started; i++) pthread_join(p->threads[i], NULL);
}

static void destroy(strata_pool *p) {
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->job_lock);
    free(p->workers);
    free(p->threads);
    free(p);
}

int strata_pool_create(int n_threads, strata_pool **pool) {
    if (!pool) return STRATA_E_ARG;
    *pool = NULL;
    if (n_threads < 1 || n_threads > POOL_MAX_THREADS) return STRATA_E_ARG;
    strata_pool *p = calloc(1, sizeof(*p));
    if (!p) return STRATA_E_NOMEM;
    p->n_threads = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof(*p->threads));
    p->workers = calloc((size_t)n_threads, sizeof(*p->workers));
    pthread_mutex_init(&p->job_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    if (!p->threads || !p->workers) {
        destroy(p);
        return STRATA_E_NOMEM;
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i] = (pool_worker){.pool = p, .index = i + 1};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]) != 0) {
            stop_workers(p, i);
            destroy(p);
            return STRATA_E_THREAD;
        }
    }
    *pool = p;
    return STRATA_OK;
}

int strata_pool_threads(strata_pool *pool) { return pool ? pool->n_threads : 1; }

void strata_pool_free(strata_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->job_lock);  /* a job still running on another thread finishes first */
    stop_workers(pool, pool->n_threads - 1);
    pthread_mutex_unlock(&pool->job_lock);
    destroy(pool);
}
