/*
 * Internal interface of the persistent thread pool (pool.c); the public create/threads/free live
 * in strata.h.
 *
 * A job is fn(ctx, first, count) over items [0, n_items), split into P = min(threads,
 * n_items / grain) (at least 1) whole contiguous ranges: range p holds n_items / P items, the first
 * (n_items % P) ranges one more; each range is run once, by whichever thread claims it first (the
 * caller claims until none is left, so it never waits for a worker that has not started). `grain`
 * is the fewest items worth a thread: a job too small to repay a dispatch (a few microseconds)
 * runs on the calling thread alone. The split depends only on n_items and the
 * pool's thread count, never on timing, so a job whose items write disjoint outputs gives the same
 * bytes on every run.
 *
 * One job at a time per pool: strata_pool_run holds the pool's job mutex for the whole job, so two
 * threads that share a pool serialize instead of corrupting each other's job. fn must not call
 * strata_pool_run on the same pool (it would wait for itself).
 */
#ifndef STRATA_POOL_H
#define STRATA_POOL_H
#include <stdint.h>

#include "strata.h"

typedef void (*strata_pool_fn)(void *ctx, int64_t first, int64_t count);

/* Run fn over [0, n_items) on the pool; pool NULL runs fn(ctx, 0, n_items) on the calling thread.
 * Returns when every range has finished. grain < 1 counts as 1. */
void strata_pool_run(strata_pool *pool, int64_t n_items, int64_t grain, strata_pool_fn fn, void *ctx);

#endif
