/*
 * Persistent compute pool: n_threads - 1 workers that wait between jobs, the caller as thread 0.
 * The decode path dispatches ~100 jobs per token, so a dispatch is a store seen by spinning
 * workers (about a microsecond), not a thread start. A worker spins for POOL_SPIN_NS after its last
 * job, then sleeps on a condition variable, so an idle pool uses no CPU.
 *
 * Joining, not waiting for everyone: the job's parts are claimed from a counter by whoever comes,
 * the caller included, and the caller never waits for a worker that has not joined. On a machine
 * with more runnable threads than cores a worker may not run for a whole scheduler slice
 * (milliseconds); the caller then does the job alone instead of waiting. A worker joins by raising
 * the `active` count in the job word while the job is still open; the caller closes the job once it
 * has no part left to claim and waits only for the workers that joined (they are running parts).
 * The job word packs generation, open flag and active count, so a late worker cannot join a closed
 * job or the next one by mistake.
 *
 * Hand-off protocol for sleeping workers (no lost wake-ups): a worker announces `sleepers++`
 * before re-checking the job word under `lock`; the caller stores the new job word before reading
 * `sleepers`. With sequentially consistent atomics one of them sees the other's write, and the
 * broadcast is sent under `lock`, so a worker between its check and its wait cannot miss it.
 */
#include "pool.h"
#include "common.h"

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
 * matrix calls of one decode step (waking a sleeping worker costs ~60 us), short enough that a
 * pool left idle stops burning a core. */
#define POOL_SPIN_NS 1000000

/* Job word: generation << 17 | open << 16 | active (workers inside the job). */
#define JOB_ACTIVE_MASK 0xffffull
#define JOB_OPEN (1ull << 16)
#define JOB_GEN_SHIFT 17

struct strata_pool {
    int n_threads;
    pthread_t *threads;

    pthread_mutex_t job_lock;      /* one job at a time */
    pthread_mutex_t lock;          /* guards sleeping and waking */
    pthread_cond_t wake;

    atomic_uint_fast64_t job;      /* the job word */
    atomic_int sleepers;
    atomic_int stop;
    atomic_int next_part;          /* parts of the current job claimed so far */

    /* The current job: written by the caller before the job word opens it, read by joined workers. */
    strata_pool_fn fn;
    void *ctx;
    int64_t n_items;
    int n_parts;
};

/* Claim and run parts of the current job until none is left. */
static void run_parts(strata_pool *p) {
    const int64_t base = p->n_items / p->n_parts, extra = p->n_items % p->n_parts;
    for (int part; (part = atomic_fetch_add(&p->next_part, 1)) < p->n_parts;) {
        const int64_t first = part * base + (part < extra ? part : extra);
        p->fn(p->ctx, first, base + (part < extra));
    }
}

/* Wait until the job word's generation differs from `seen` (or stop); returns the job word. */
static uint_fast64_t wait_for_job(strata_pool *p, uint_fast64_t seen) {
    const int64_t deadline = strata_now_ns() + POOL_SPIN_NS;
    for (int i = 0;; i++) {
        const uint_fast64_t j = atomic_load(&p->job);
        if (j >> JOB_GEN_SHIFT != seen || atomic_load(&p->stop)) return j;
        if ((i & 63) == 63) {
            if (strata_now_ns() > deadline) break;
            sched_yield();  /* on an oversubscribed machine, let the caller run */
        }
        POOL_PAUSE();
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    while (atomic_load(&p->job) >> JOB_GEN_SHIFT == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
    return atomic_load(&p->job);
}

/* Join the job of generation `gen` if it is still open: active++ in the job word. */
static int join(strata_pool *p, uint_fast64_t gen) {
    uint_fast64_t j = atomic_load(&p->job);
    while (j >> JOB_GEN_SHIFT == gen && (j & JOB_OPEN))
        if (atomic_compare_exchange_weak(&p->job, &j, j + 1)) return 1;
    return 0;
}

static void *worker_main(void *arg) {
    strata_pool *p = arg;
    uint_fast64_t seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen) >> JOB_GEN_SHIFT;
        if (atomic_load(&p->stop)) return NULL;
        if (!join(p, seen)) continue;
        run_parts(p);
        atomic_fetch_sub(&p->job, 1);  /* leave: seq_cst, the caller sees this part's outputs */
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
    atomic_store(&p->next_part, 0);
    const uint_fast64_t gen = (atomic_load(&p->job) >> JOB_GEN_SHIFT) + 1;
    atomic_store(&p->job, gen << JOB_GEN_SHIFT | JOB_OPEN);  /* no worker is inside: active 0 */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    run_parts(p);
    /* Every part is claimed (the caller found none left): close the job, then wait for the
     * workers inside it, who are finishing parts they claimed. */
    atomic_fetch_and(&p->job, ~(uint_fast64_t)JOB_OPEN);
    for (int i = 1; atomic_load(&p->job) & JOB_ACTIVE_MASK; i++) {
        if (i % 256 == 0) sched_yield();
        POOL_PAUSE();
    }
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
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->job_lock);
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
    pthread_mutex_init(&p->job_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->job, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next_part, 0);
    if (!p->threads) {
        destroy(p);
        return STRATA_E_NOMEM;
    }
    for (int i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
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
