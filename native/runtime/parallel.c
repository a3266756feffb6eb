/*
 * Row-parallel execution shared by the dequantizer and the quantizer: whole rows per thread, the
 * first (n_rows % n_threads) threads taking one row more. Threads are started per call; a thread
 * that fails to start has its rows run on the calling thread, so a loaded machine slows down
 * instead of failing.
 */
#include "kernels.h"

#include <pthread.h>

#define STRATA_MAX_THREADS 256

typedef struct {
    strata_rows_fn fn;
    void *ctx;
    int64_t first_row, n_rows;
} strata_rows_job;

static void *rows_thread(void *arg) {
    const strata_rows_job *j = arg;
    j->fn(j->ctx, j->first_row, j->n_rows);
    return NULL;
}

void strata_parallel_rows(int64_t n_rows, int n_threads, strata_rows_fn fn, void *ctx) {
    if (n_rows <= 0) return;
    if (n_threads > STRATA_MAX_THREADS) n_threads = STRATA_MAX_THREADS;
    if (n_threads > n_rows) n_threads = (int)n_rows;
    if (n_threads < 1) n_threads = 1;

    strata_rows_job jobs[STRATA_MAX_THREADS];
    pthread_t threads[STRATA_MAX_THREADS];
    int64_t row = 0;
    for (int t = 0; t < n_threads; t++) {
        const int64_t rows = n_rows / n_threads + (t < n_rows % n_threads);
        jobs[t] = (strata_rows_job){.fn = fn, .ctx = ctx, .first_row = row, .n_rows = rows};
        row += rows;
    }
    int started = 0;
    for (int t = 1; t < n_threads; t++) {
        if (pthread_create(&threads[t], NULL, rows_thread, &jobs[t]) != 0) break;
        started = t;
    }
    rows_thread(&jobs[0]);
    for (int t = started + 1; t < n_threads; t++) rows_thread(&jobs[t]);
    for (int t = 1; t <= started; t++) pthread_join(threads[t], NULL);
}
