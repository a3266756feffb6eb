/*
 * Matrix products straight from packed GGML weights, on the compute pool: strata_matmul
 * (y[T, N] = x[T, K] @ W[N, K]^T) and the fused SwiGLU MoE layer (strata_moe_swiglu). The
 * arithmetic is the tile kernels' (qdot.h); this file checks arguments, lays out scratch, rounds
 * activations once and splits the work.
 *
 * Each call is one pool job: every thread runs the call's phases in turn, claiming work items of a
 * phase from a shared counter (so a thread the OS delays holds up one item, not half the call) and
 * waiting between phases until the previous phase's items are all done (not until every thread
 * arrives, so a thread that never wakes costs nothing).
 *
 * Determinism: weight rows are always handed to the tile kernel in fixed blocks of MM_ROW_BLOCK
 * rows (aligned at multiples of it within the matrix), each with all the tokens of the product,
 * whatever the thread count; threads only decide which blocks they run. So every output element
 * comes from the same kernel call on every run, and a MoE expert's products are bit-identical to
 * strata_matmul on that expert's matrix with its tokens.
 */
#include "kernels.h"
#include "pool.h"
#include "qdot.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MM_PAUSE() _mm_pause()
#else
#define MM_PAUSE() ((void)0)
#endif

/* Rows per tile call: a multiple of every kernel's row group, small enough that decode (T = 1)
 * with a 512-row expert still gives every thread work. */
#define MM_ROW_BLOCK 16
/* Work (weight bytes times tokens, or bytes of activations rounded) worth handing to one more
 * thread: ~5 us at a core's decode rate, about what waking a worker costs. Smaller jobs run on
 * fewer threads; that changes no result, only who computes it. */
#define MM_MIN_PART (64 * 1024)
/* Work items per thread and phase: enough that a thread the OS delays leaves little to wait for. */
#define MM_ITEMS_PER_THREAD 8
/* Scratch sub-buffers start on cache-line boundaries. */
#define MM_ALIGN 64

/* ---- size arithmetic: every product of caller-supplied numbers is checked ---- */

static int mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static int add_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_add_overflow(a, b, out); }

static int64_t align_up(int64_t n) { return (n + MM_ALIGN - 1) / MM_ALIGN * MM_ALIGN; }


/* a * b saturated at INT64_MAX (for work estimates only). */
static int64_t mul_sat(int64_t a, int64_t b) { int64_t r; return mul_ok(a, b, &r) ? r : INT64_MAX; }

/* Bytes of one packed row of `row_len` values, or -1 on overflow. */
static int64_t packed_row_bytes(const strata_format_info *f, int64_t row_len) {
    int64_t b;
    return mul_ok(row_len / f->block_elems, f->block_bytes, &b) ? b : -1;
}

/* Kernels and format of `type` for `impl`, with row_len checked against the block size. */
static int find_kernels(int type, int impl, int64_t row_len, strata_qdot_kernels *k, const strata_format_info **f) {
    int resolved, st = strata_resolve_impl(impl, &resolved);
    if (st != STRATA_OK) return st;
    *f = strata_format_find(type);
    if (!*f) return STRATA_E_TYPE;
    st = strata_qdot_find(type, resolved, k);
    if (st != STRATA_OK) return st;
    if (row_len < 0) return STRATA_E_ARG;
    if (row_len % (*f)->block_elems) return STRATA_E_BLOCK;
    return STRATA_OK;
}

/* Bytes of one activation row (K values) for kernels k; -1 on overflow. */
static int64_t act_row_bytes(const strata_qdot_kernels *k, int64_t row_len) {
    if (k->act == STRATA_ACT_F32) {
        int64_t b;
        return mul_ok(row_len, 4, &b) ? b : -1;
    }
    return strata_qact_row_bytes(k->act, row_len);
}

/* The next unclaimed item of a phase. */
static inline int64_t claim(atomic_llong *next) { return atomic_fetch_add_explicit(next, 1, memory_order_relaxed); }

/* Count one finished item; release: its outputs are visible to whoever sees the count. */
static inline void finish(atomic_llong *done) { atomic_fetch_add_explicit(done, 1, memory_order_release); }

/* Wait until `n` items of a phase are finished (acquire: their outputs are visible). */
static void wait_done(atomic_llong *done, int64_t n) {
    for (int i = 1; atomic_load_explicit(done, memory_order_acquire) < n; i++) {
        if (i % 256 == 0) sched_yield();  /* on a busy machine, let the thread we wait for run */
        MM_PAUSE();
    }
}

/* Threads worth using for `work` (weight bytes times tokens): 1 below 2 * MM_MIN_PART. */
static int64_t participants(strata_pool *pool, int64_t work) {
    const int64_t fit = work / MM_MIN_PART, n = strata_pool_threads(pool);
    return fit < 2 ? 1 : fit < n ? fit : n;
}

/* Round (or copy, for float kernels) one row of K values into activation format. Every write of
 * activations tells the tiles first (strata_qdot_new_acts): a prefill tile that re-lays them keeps
 * its layout only until then. */
static void act_row(const strata_qdot_kernels *k, const float *x, uint8_t *a, int64_t row_len) {
    strata_qdot_new_acts();
    if (k->qact) k->qact(x, a, row_len);
    else memcpy(a, x, (size_t)row_len * sizeof(float));
}

/* Weight rows [r0, r1) (r0 a multiple of MM_ROW_BLOCK) times n_tok activation rows:
 * y[t * y_stride + r - r0] for each row r. One tile call per fixed block of rows. Rows [r1, ahead)
 * are the ones this thread works through next: the decode kernels fetch them early. */
static void tile_rows(const strata_qdot_kernels *k, int64_t row_len, const uint8_t *w, int64_t w_row_bytes,
                      int64_t r0, int64_t r1, int64_t ahead, const uint8_t *a, int64_t a_row_bytes,
                      int64_t n_tok, float *y, int64_t y_stride) {
    const strata_qdot_tile_fn tile = strata_qdot_tile_for(k, n_tok);
    strata_qdot_ahead_end = w + ahead * w_row_bytes;
    for (int64_t r = r0; r < r1; r += MM_ROW_BLOCK) {
        const int64_t n = r1 - r < MM_ROW_BLOCK ? r1 - r : MM_ROW_BLOCK;
        tile(row_len, w + r * w_row_bytes, w_row_bytes, n, a, a_row_bytes, n_tok, y + (r - r0), y_stride);
    }
}

/* ======================================================================================
 * strata_matmul
 * ====================================================================================== */

#define MM_MAX_SPANS 64

typedef struct {
    const strata_qdot_kernels *k;
    const uint8_t *w;
    int64_t w_row_bytes, n_rows, row_len;
    const float *x;
    uint8_t *act;
    int64_t a_row_bytes, n_tokens;
    float *y;
    int64_t n_spans;
    atomic_llong next_tok, done_tok;
    /* Row blocks [span_end[s - 1], span_end[s]) form span s; next[s] is its next unclaimed block. */
    int64_t span_end[MM_MAX_SPANS];
    atomic_llong next[MM_MAX_SPANS];
} matmul_job;

/* One row block of a span: the thread runs on through the rest of the span, so the kernels fetch
 * ahead up to the span's end. */
static void matmul_block(const matmul_job *j, int64_t b, int64_t span_end) {
    const int64_t r0 = b * MM_ROW_BLOCK, r1 = r0 + MM_ROW_BLOCK < j->n_rows ? r0 + MM_ROW_BLOCK : j->n_rows;
    const int64_t ahead = span_end * MM_ROW_BLOCK < j->n_rows ? span_end * MM_ROW_BLOCK : j->n_rows;
    tile_rows(j->k, j->row_len, j->w, j->w_row_bytes, r0, r1, ahead, j->act, j->a_row_bytes, j->n_tokens,
              j->y + r0, j->n_rows);
}

/* Every thread: round the tokens (items: tokens), then the row blocks (MM_ROW_BLOCK rows each).
 * Participant p works through span p in order (one long run of rows, which streams from memory
 * faster than blocks scattered over the matrix), then takes what is left of the others' spans. */
static void matmul_run(void *ctx, int64_t first, int64_t count) {
    matmul_job *j = ctx;
    (void)count;
    if (j->k->act != STRATA_ACT_F32) {
        for (int64_t t; (t = claim(&j->next_tok)) < j->n_tokens; finish(&j->done_tok))
            act_row(j->k, j->x + t * j->row_len, j->act + t * j->a_row_bytes, j->row_len);
        wait_done(&j->done_tok, j->n_tokens);
    }
    for (int64_t i = 0; i < j->n_spans; i++) {
        const int64_t s = (first + i) % j->n_spans;
        for (int64_t b; (b = claim(&j->next[s])) < j->span_end[s];) matmul_block(j, b, j->span_end[s]);
    }
}

int strata_matmul_scratch_bytes(int ggml_type, int64_t n_tokens, int64_t row_len, int64_t *bytes) {
    if (!bytes || n_tokens < 0) return STRATA_E_ARG;
    *bytes = 0;
    strata_qdot_kernels k;
    const strata_format_info *f;
    int st = find_kernels(ggml_type, STRATA_IMPL_SCALAR, row_len, &k, &f);
    if (st != STRATA_OK) return st;
    if (k.act == STRATA_ACT_F32) return STRATA_OK;
    const int64_t rb = act_row_bytes(&k, row_len);
    if (rb < 0 || !mul_ok(rb, n_tokens, bytes)) return STRATA_E_SIZE;
    return STRATA_OK;
}

int strata_matmul(strata_pool *pool, int ggml_type, const void *w, int64_t w_bytes, int64_t n_rows,
                  int64_t row_len, const float *x, int64_t x_bytes, int64_t n_tokens, float *y,
                  int64_t y_bytes, void *scratch, int64_t scratch_bytes, int impl) {
    if (n_rows < 0 || n_tokens < 0 || w_bytes < 0 || x_bytes < 0 || y_bytes < 0 || scratch_bytes < 0)
        return STRATA_E_ARG;
    strata_qdot_kernels k;
    const strata_format_info *f;
    int st = find_kernels(ggml_type, impl, row_len, &k, &f);
    if (st != STRATA_OK) return st;

    int64_t w_need, x_need, y_need, s_need = 0;
    const int64_t w_row_bytes = packed_row_bytes(f, row_len), a_row_bytes = act_row_bytes(&k, row_len);
    if (w_row_bytes < 0 || a_row_bytes < 0 || !mul_ok(w_row_bytes, n_rows, &w_need) ||
        !mul_ok(n_tokens, row_len, &x_need) || !mul_ok(x_need, 4, &x_need) ||
        !mul_ok(n_tokens, n_rows, &y_need) || !mul_ok(y_need, 4, &y_need) ||
        (k.act != STRATA_ACT_F32 && !mul_ok(a_row_bytes, n_tokens, &s_need)))
        return STRATA_E_SIZE;
    if ((w_need && !w) || (x_need && !x) || (y_need && !y) || (s_need && !scratch)) return STRATA_E_ARG;
    if (((uintptr_t)x | (uintptr_t)y | (uintptr_t)scratch) % 4) return STRATA_E_ARG;
    if (w_bytes < w_need || x_bytes < x_need || y_bytes < y_need || scratch_bytes < s_need) return STRATA_E_SIZE;
    if (y_need == 0) return STRATA_OK;
    if (row_len == 0) {
        memset(y, 0, (size_t)y_need);
        return STRATA_OK;
    }

    matmul_job job = {.k = &k, .w = w, .w_row_bytes = w_row_bytes, .n_rows = n_rows, .row_len = row_len, .x = x,
                      .act = k.act == STRATA_ACT_F32 ? (uint8_t *)(uintptr_t)x : scratch,
                      .a_row_bytes = a_row_bytes, .n_tokens = n_tokens, .y = y};
    atomic_init(&job.next_tok, 0);
    atomic_init(&job.done_tok, 0);
    int64_t n_part = participants(pool, mul_sat(mul_sat(n_rows, w_row_bytes), n_tokens));
    if (n_part > MM_MAX_SPANS) n_part = MM_MAX_SPANS;
    const int64_t n_blocks = (n_rows + MM_ROW_BLOCK - 1) / MM_ROW_BLOCK;
    job.n_spans = n_part;
    for (int64_t s = 0; s < n_part; s++) {
        atomic_init(&job.next[s], s == 0 ? 0 : job.span_end[s - 1]);
        job.span_end[s] = n_blocks * (s + 1) / n_part;
    }
    strata_pool_run(n_part > 1 ? pool : NULL, n_part, 1, matmul_run, &job);
    return STRATA_OK;
}

/* ======================================================================================
 * strata_matmul_heads: one product per head, every head in one pool job
 * ====================================================================================== */

typedef struct {
    const strata_qdot_kernels *k;
    const uint8_t *w;
    int64_t w_row_bytes, n_rows, row_len, n_heads, n_tokens, a_row_bytes, n_blocks;
    const float *x;
    int64_t x_tok, x_head, y_tok, y_head;
    uint8_t *act;
    float *y;
    atomic_llong next_act, done_act, next_item;
} heads_job;

/* Every thread: round each (head, token) row into its head's activation rows, then the items
 * (head, row block) -- a head's blocks in a row, so a thread streams through one matrix. */
static void heads_run(void *ctx, int64_t first, int64_t count) {
    heads_job *j = ctx;
    (void)first, (void)count;
    const int64_t n_rows_act = j->n_heads * j->n_tokens;
    for (int64_t i; (i = claim(&j->next_act)) < n_rows_act; finish(&j->done_act)) {
        const int64_t h = i / j->n_tokens, t = i % j->n_tokens;
        act_row(j->k, j->x + t * j->x_tok + h * j->x_head, j->act + i * j->a_row_bytes, j->row_len);
    }
    wait_done(&j->done_act, n_rows_act);
    for (int64_t i; (i = claim(&j->next_item)) < j->n_heads * j->n_blocks;) {
        const int64_t h = i / j->n_blocks, r0 = (i % j->n_blocks) * MM_ROW_BLOCK;
        const int64_t r1 = r0 + MM_ROW_BLOCK < j->n_rows ? r0 + MM_ROW_BLOCK : j->n_rows;
        tile_rows(j->k, j->row_len, j->w + h * j->n_rows * j->w_row_bytes, j->w_row_bytes, r0, r1, r1,
                  j->act + h * j->n_tokens * j->a_row_bytes, j->a_row_bytes, j->n_tokens, j->y + h * j->y_head + r0,
                  j->y_tok);
    }
}

int strata_matmul_heads_scratch_bytes(int ggml_type, int64_t n_heads, int64_t n_tokens, int64_t row_len,
                                      int64_t *bytes) {
    if (!bytes || n_heads < 0 || n_tokens < 0) return STRATA_E_ARG;
    *bytes = 0;
    strata_qdot_kernels k;
    const strata_format_info *f;
    int st = find_kernels(ggml_type, STRATA_IMPL_SCALAR, row_len, &k, &f);
    if (st != STRATA_OK) return st;
    const int64_t rb = act_row_bytes(&k, row_len);
    int64_t n;
    if (rb < 0 || !mul_ok(n_heads, n_tokens, &n) || !mul_ok(rb, n, bytes)) return STRATA_E_SIZE;
    return STRATA_OK;
}

/* The last float index + 1 that rows (t, h) of `width` floats at base + t * tok + h * head reach. */
static int strided_end(int64_t n_tokens, int64_t tok, int64_t n_heads, int64_t head, int64_t width, int64_t *end) {
    int64_t a, b;
    if (tok < 0 || head < 0 || !mul_ok(n_tokens - 1, tok, &a) || !mul_ok(n_heads - 1, head, &b) ||
        !add_ok(a, b, end) || !add_ok(*end, width, end) || !mul_ok(*end, 4, end))
        return STRATA_E_SIZE;
    return STRATA_OK;
}

int strata_matmul_heads(strata_pool *pool, int ggml_type, const void *w, int64_t w_bytes, int64_t n_heads,
                        int64_t n_rows, int64_t row_len, const float *x, int64_t x_bytes, int64_t x_tok,
                        int64_t x_head, int64_t n_tokens, float *y, int64_t y_bytes, int64_t y_tok, int64_t y_head,
                        void *scratch, int64_t scratch_bytes, int impl) {
    if (n_heads < 0 || n_rows < 0 || row_len < 1 || n_tokens < 0 || w_bytes < 0 || x_bytes < 0 || y_bytes < 0 ||
        scratch_bytes < 0)
        return STRATA_E_ARG;
    strata_qdot_kernels k;
    const strata_format_info *f;
    int st = find_kernels(ggml_type, impl, row_len, &k, &f);
    if (st != STRATA_OK) return st;
    if (n_heads == 0 || n_rows == 0 || n_tokens == 0) return STRATA_OK;
    int64_t w_need, x_end, y_end, s_need;
    const int64_t w_row_bytes = packed_row_bytes(f, row_len), a_row_bytes = act_row_bytes(&k, row_len);
    if (w_row_bytes < 0 || a_row_bytes < 0 || !mul_ok(w_row_bytes, n_rows, &w_need) ||
        !mul_ok(w_need, n_heads, &w_need) || !mul_ok(a_row_bytes, n_heads, &s_need) ||
        !mul_ok(s_need, n_tokens, &s_need) ||
        strided_end(n_tokens, x_tok, n_heads, x_head, row_len, &x_end) ||
        strided_end(n_tokens, y_tok, n_heads, y_head, n_rows, &y_end))
        return STRATA_E_SIZE;
    if (!w || !x || !y || !scratch || ((uintptr_t)x | (uintptr_t)y | (uintptr_t)scratch) % 4) return STRATA_E_ARG;
    if (w_bytes < w_need || x_bytes < x_end || y_bytes < y_end || scratch_bytes < s_need) return STRATA_E_SIZE;
    heads_job job = {.k = &k, .w = w, .w_row_bytes = w_row_bytes, .n_rows = n_rows, .row_len = row_len,
                     .n_heads = n_heads, .n_tokens = n_tokens, .a_row_bytes = a_row_bytes,
                     .n_blocks = (n_rows + MM_ROW_BLOCK - 1) / MM_ROW_BLOCK, .x = x, .x_tok = x_tok, .x_head = x_head,
                     .y_tok = y_tok, .y_head = y_head, .act = scratch, .y = y};
    atomic_init(&job.next_act, 0);
    atomic_init(&job.done_act, 0);
    atomic_init(&job.next_item, 0);
    const int64_t n_part = participants(pool, mul_sat(w_need, n_tokens));
    strata_pool_run(n_part > 1 ? pool : NULL, n_part, 1, heads_run, &job);
    return STRATA_OK;
}

/* ======================================================================================
 * strata_moe_swiglu
 *
 * Assignments in use are u = a - a_first for a in [assign_offsets[0], assign_offsets[n_experts]).
 * Scratch (each part MM_ALIGN-aligned), A = assignments in use, T = tokens:
 *   head   int64[T]       first assignment of each token (-1: none); next int64[A] chains the rest
 *   busy   int64[A]       experts of the call that own assignments (indices j), in order
 *   done   atomic_int[A]  finished ff row blocks of each busy expert
 *   xg     A gate activation rows; xu: A up activation rows (xg itself when the formats agree)
 *   h      float[A, F]    gate result, then silu(gate) * up
 *   tmp    float[A, max(F, D)]  up result in phase B, down result in phase C
 *   hq     A down activation rows of h (h itself for float down weights)
 *
 * Phases (of one pool job; items claimed one at a time, each phase waits for the last one's items):
 *   A  per token: round x[t] once, copy it to each of its assignments' rows of xg (and xu).
 *   B  per (busy expert, ff row block): gate and up rows for the expert's tokens, then
 *      h = silu(gate) * up; the thread finishing an expert's last block rounds that expert's h
 *      rows into hq (before counting its own item done, so phase C sees every hq).
 *   C  per embedding row block: down rows for every busy expert, then for those columns
 *      out[token] += weight * down, assignment by assignment in ascending order.
 * ====================================================================================== */

typedef struct {
    strata_qdot_kernels k;
    const strata_format_info *f;
    const strata_moe_part *part;
    int64_t row_bytes, mat_bytes, a_row_bytes;
} moe_matrix;

typedef struct {
    moe_matrix gate, up, down;
    int64_t n_tokens, n_embd, n_ff, n_busy, a_first, n_used;
    int64_t ff_chunk, n_ff_items, d_chunk, n_d_items;  /* rows per phase B / C item (MM_ROW_BLOCK multiples) */
    const float *x;
    const int32_t *expert_index, *token_ids;
    const int64_t *offsets;
    const float *weights;
    float *out;
    float *rows;  /* strata_moe_glu's rows: down results by assignment, no sum (NULL: sum into out) */
    const strata_moe_act *act;  /* NULL: plain SwiGLU */
    int64_t *head, *next, *busy;
    atomic_int *done;
    uint8_t *xg, *xu, *hq;
    float *h, *tmp;
    atomic_llong next_tok, done_tok, next_item, done_item, next_block;
} moe_job;

static int moe_matrix_init(moe_matrix *m, const strata_moe_part *part, int impl, int64_t n_rows, int64_t row_len) {
    if (!part) return STRATA_E_ARG;
    int st = find_kernels(part->type, impl, row_len, &m->k, &m->f);
    if (st != STRATA_OK) return st;
    m->part = part;
    m->row_bytes = packed_row_bytes(m->f, row_len);
    m->a_row_bytes = act_row_bytes(&m->k, row_len);
    if (m->row_bytes < 0 || m->a_row_bytes < 0 || !mul_ok(m->row_bytes, n_rows, &m->mat_bytes)) return STRATA_E_SIZE;
    if (part->bytes < 0 || part->stride < 0) return STRATA_E_ARG;
    if (!part->base && part->bytes) return STRATA_E_ARG;
    return STRATA_OK;
}

/* Start of expert e's matrix, or NULL when e lies outside the part's region. */
static const uint8_t *moe_matrix_at(const moe_matrix *m, int64_t e) {
    const strata_moe_part *p = m->part;
    int64_t start, end;
    if (e < 0 || !p->base || !mul_ok(e, p->stride, &start) || !add_ok(start, m->mat_bytes, &end) || end > p->bytes)
        return NULL;
    return p->base + start;
}

/* Scratch layout; every offset relative to the MM_ALIGN-aligned start. */
typedef struct { int64_t head, next, busy, done, xg, xu, h, tmp, hq, total; } moe_layout;

static int moe_plan(const moe_matrix *g, const moe_matrix *u, const moe_matrix *d, int64_t n_tokens, int64_t n_assign,
                    int64_t n_embd, int64_t n_ff, moe_layout *L) {
    const int64_t wide = n_ff > n_embd ? n_ff : n_embd;
    const int64_t sizes[9][2] = {
        {n_tokens, 8}, {n_assign, 8}, {n_assign, 8}, {n_assign, (int64_t)sizeof(atomic_int)},
        {n_assign, g->a_row_bytes}, {n_assign, u->k.act == g->k.act ? 0 : u->a_row_bytes},
        {n_assign, n_ff * 4}, {n_assign, wide * 4}, {n_assign, d->k.act == STRATA_ACT_F32 ? 0 : d->a_row_bytes}};
    int64_t *offs[9] = {&L->head, &L->next, &L->busy, &L->done, &L->xg, &L->xu, &L->h, &L->tmp, &L->hq};
    int64_t at = 0;
    for (int i = 0; i < 9; i++) {
        int64_t n;
        if (sizes[i][1] < 0 || !mul_ok(sizes[i][0], sizes[i][1], &n) || n > INT64_MAX / 2 || !add_ok(at, align_up(n), &at))
            return STRATA_E_SIZE;
        *offs[i] = at - align_up(n);
    }
    if (!add_ok(at, MM_ALIGN, &L->total)) return STRATA_E_SIZE;  /* slack for aligning the start */
    return STRATA_OK;
}

static int moe_matrices(int impl, int64_t n_embd, int64_t n_ff,
                        const strata_moe_part *gp, const strata_moe_part *up_, const strata_moe_part *dp,
                        moe_matrix *g, moe_matrix *u, moe_matrix *d) {
    if (n_embd <= 0 || n_ff <= 0 || n_embd > INT64_MAX / 8 || n_ff > INT64_MAX / 8) return STRATA_E_ARG;
    int st = moe_matrix_init(g, gp, impl, n_ff, n_embd);
    if (st == STRATA_OK) st = moe_matrix_init(u, up_, impl, n_ff, n_embd);
    if (st == STRATA_OK) st = moe_matrix_init(d, dp, impl, n_embd, n_ff);
    return st;
}

int strata_moe_scratch_bytes(int gate_type, int up_type, int down_type, int64_t n_tokens, int64_t n_assign,
                             int64_t n_embd, int64_t n_ff, int64_t *bytes) {
    if (!bytes || n_tokens < 0 || n_assign < 0) return STRATA_E_ARG;
    *bytes = 0;
    const strata_moe_part gp = {.type = gate_type}, up = {.type = up_type}, dp = {.type = down_type};
    moe_matrix g, u, d;
    int st = moe_matrices(STRATA_IMPL_SCALAR, n_embd, n_ff, &gp, &up, &dp, &g, &u, &d);
    if (st != STRATA_OK) return st;
    moe_layout L;
    st = moe_plan(&g, &u, &d, n_tokens, n_assign, n_embd, n_ff, &L);
    if (st == STRATA_OK) *bytes = L.total;
    return st;
}

/* Phase A: one token. */
static void moe_gather(const moe_job *J, int64_t t) {
    const int share = J->xu == J->xg;
    const int64_t u0 = J->head[t];
    if (u0 < 0) return;
    const float *x = J->x + t * J->n_embd;
    if (J->act && J->act->input_scaled) {  /* each assignment's own input x * w, in tmp's row (free until phase B) */
        const int64_t D = J->n_embd;
        for (int64_t u = u0; u >= 0; u = J->next[u]) {
            float *xs = J->tmp + u * D;
            const float w = J->weights[J->a_first + u];
            for (int64_t i = 0; i < D; i++) xs[i] = x[i] * w;
            act_row(&J->gate.k, xs, J->xg + u * J->gate.a_row_bytes, D);
            if (!share) act_row(&J->up.k, xs, J->xu + u * J->up.a_row_bytes, D);
        }
        return;
    }
    uint8_t *g0 = J->xg + u0 * J->gate.a_row_bytes, *p0 = J->xu + u0 * J->up.a_row_bytes;
    act_row(&J->gate.k, x, g0, J->n_embd);
    if (!share) act_row(&J->up.k, x, p0, J->n_embd);
    for (int64_t u = J->next[u0]; u >= 0; u = J->next[u]) {
        memcpy(J->xg + u * J->gate.a_row_bytes, g0, (size_t)J->gate.a_row_bytes);
        if (!share) memcpy(J->xu + u * J->up.a_row_bytes, p0, (size_t)J->up.a_row_bytes);
    }
}

/* silu(g) * u, with the sigmoid in double so a float64 numpy reference rounds the same way. */
static float silu_mul(float g, float u) {
    const double s = (double)g / (1.0 + exp(-(double)g));
    return (float)s * u;
}

/* gpt-oss's clamped SwiGLU of one gate and up value (biases added): sigmoid in double, as silu_mul. */
static float oai_mul(float g, float u, float alpha, float limit) {
    g = g < limit ? g : limit;
    u = u < -limit ? -limit : u > limit ? limit : u;
    const double s = (double)g / (1.0 + exp(-(double)alpha * (double)g));
    return (float)s * (u + 1.0f);
}

/* Phase B: one (busy expert, chunk of ff rows) item. */
static void moe_gate_up_item(moe_job *J, int64_t item) {
    /* Expert-major: experts finish (and round their h) one after another, not all at the end. */
    const int64_t i = item / J->n_ff_items, b = item % J->n_ff_items;
    const int64_t j = J->busy[i], e = J->expert_index[j];
    const int64_t u0 = J->offsets[j] - J->a_first, n_tok = J->offsets[j + 1] - J->offsets[j];
    const int64_t r0 = b * J->ff_chunk, r1 = r0 + J->ff_chunk < J->n_ff ? r0 + J->ff_chunk : J->n_ff;
    const int64_t F = J->n_ff;
    float *h = J->h + u0 * F + r0, *up = J->tmp + u0 * F + r0;
    tile_rows(&J->gate.k, J->n_embd, moe_matrix_at(&J->gate, e), J->gate.row_bytes, r0, r1, r1,
              J->xg + u0 * J->gate.a_row_bytes, J->gate.a_row_bytes, n_tok, h, F);
    tile_rows(&J->up.k, J->n_embd, moe_matrix_at(&J->up, e), J->up.row_bytes, r0, r1, r1,
              J->xu + u0 * J->up.a_row_bytes, J->up.a_row_bytes, n_tok, up, F);
    const strata_moe_act *act = J->act;
    const int64_t id = act ? act->expert_ids[j] : 0;
    const float *bg = act && act->b_gate ? act->b_gate + id * F + r0 : NULL;
    const float *bu = act && act->b_up ? act->b_up + id * F + r0 : NULL;
    if (!bg && !bu && !(act && act->clamped)) {  /* plain SwiGLU */
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < r1 - r0; r++) h[t * F + r] = silu_mul(h[t * F + r], up[t * F + r]);
    } else {
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < r1 - r0; r++) {
                const float g = h[t * F + r] + (bg ? bg[r] : 0.0f), u = up[t * F + r] + (bu ? bu[r] : 0.0f);
                h[t * F + r] = act->clamped ? oai_mul(g, u, act->alpha, act->limit) : silu_mul(g, u);
            }
    }
    /* acq_rel: the last finisher sees every other block's h of this expert. */
    if (atomic_fetch_add_explicit(&J->done[i], 1, memory_order_acq_rel) == J->n_ff_items - 1 && J->hq != (uint8_t *)J->h)
        for (int64_t t = 0; t < n_tok; t++)
            act_row(&J->down.k, J->h + (u0 + t) * F, J->hq + (u0 + t) * J->down.a_row_bytes, F);
}

/* Phase C: one chunk of embedding rows (output columns). */
static void moe_down(const moe_job *J, int64_t block) {
    const int64_t D = J->n_embd;
    const int64_t r0 = block * J->d_chunk, r1 = r0 + J->d_chunk < D ? r0 + J->d_chunk : D;
    for (int64_t i = 0; i < J->n_busy; i++) {
        const int64_t j = J->busy[i];
        const int64_t u0 = J->offsets[j] - J->a_first, n_tok = J->offsets[j + 1] - J->offsets[j];
        float *y = J->rows ? J->rows + (J->a_first + u0) * D + r0 : J->tmp + u0 * D + r0;
        tile_rows(&J->down.k, J->n_ff, moe_matrix_at(&J->down, J->expert_index[j]), J->down.row_bytes, r0, r1, r1,
                  J->hq + u0 * J->down.a_row_bytes, J->down.a_row_bytes, n_tok, y, D);
        if (J->act && J->act->b_down) {
            const float *bd = J->act->b_down + (int64_t)J->act->expert_ids[j] * D + r0;
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t r = 0; r < r1 - r0; r++) y[t * D + r] += bd[r];
        }
    }
    if (J->rows) return;
    const int64_t a_end = J->a_first + J->n_used;
    const int scaled = J->act && J->act->input_scaled;  /* the weight went into the input */
    for (int64_t a = J->a_first; a < a_end; a++) {
        const float w = scaled ? 1.0f : J->weights[a];
        float *o = J->out + (int64_t)J->token_ids[a] * D;
        const float *dn = J->tmp + (a - J->a_first) * D;
        for (int64_t r = r0; r < r1; r++) o[r] += w * dn[r];
    }
}

/* Every thread: the three phases in turn. */
static void moe_run(void *ctx, int64_t first, int64_t count) {
    moe_job *J = ctx;
    (void)first, (void)count;
    for (int64_t t; (t = claim(&J->next_tok)) < J->n_tokens; finish(&J->done_tok)) moe_gather(J, t);
    wait_done(&J->done_tok, J->n_tokens);
    const int64_t n_items = J->n_busy * J->n_ff_items;
    for (int64_t i; (i = claim(&J->next_item)) < n_items; finish(&J->done_item)) moe_gate_up_item(J, i);
    wait_done(&J->done_item, n_items);
    for (int64_t b; (b = claim(&J->next_block)) < J->n_d_items;) moe_down(J, b);
}

/* Check offsets, expert indices and token ids; fill head/next/busy. */
static int moe_index(moe_job *J, int64_t n_experts) {
    const int64_t *off = J->offsets;
    for (int64_t j = 0; j < n_experts; j++) {
        if (off[j + 1] < off[j]) return STRATA_E_ARG;
        if (off[j + 1] == off[j]) continue;
        const int64_t e = J->expert_index[j];
        if (e < 0 && J->rows) continue;  /* skipped: computed by another call */
        if (e < 0) return STRATA_E_ARG;
        if (!moe_matrix_at(&J->gate, e) || !moe_matrix_at(&J->up, e) || !moe_matrix_at(&J->down, e))
            return STRATA_E_SIZE;
        if (J->act && (J->act->expert_ids[j] < 0 || J->act->expert_ids[j] >= J->act->n_ids)) return STRATA_E_SIZE;
        J->busy[J->n_busy] = j;
        atomic_init(&J->done[J->n_busy], 0);
        J->n_busy++;
    }
    for (int64_t t = 0; t < J->n_tokens; t++) J->head[t] = -1;
    for (int64_t a = J->a_first + J->n_used - 1; a >= J->a_first; a--) {
        const int32_t t = J->token_ids[a];
        if (t < 0 || t >= J->n_tokens) return STRATA_E_ARG;
        J->next[a - J->a_first] = J->head[t];
        J->head[t] = a - J->a_first;
    }
    return STRATA_OK;
}

/* strata_moe_swiglu and strata_moe_glu (rows NULL: the sum into out; out NULL: rows by assignment). */
static int moe_swiglu(strata_pool *pool, const float *x, int64_t x_bytes, int64_t n_tokens, int64_t n_embd,
                      int64_t n_ff, const strata_moe_part *gate, const strata_moe_part *up,
                      const strata_moe_part *down, int64_t n_experts, const int32_t *expert_index,
                      const int64_t *assign_offsets, const int32_t *token_ids, const float *weights,
                      int64_t n_assign, const strata_moe_act *act, float *out, int64_t out_bytes, float *rows,
                      int64_t rows_bytes, void *scratch, int64_t scratch_bytes, int impl) {
    if (n_tokens < 0 || n_experts < 0 || n_assign < 0 || x_bytes < 0 || out_bytes < 0 || rows_bytes < 0 ||
        scratch_bytes < 0 || !assign_offsets || (n_experts && !expert_index))
        return STRATA_E_ARG;
    if (!gate || !up || !down) return STRATA_E_ARG;
    if ((uintptr_t)assign_offsets % 8 || ((uintptr_t)expert_index | (uintptr_t)token_ids | (uintptr_t)weights) % 4)
        return STRATA_E_ARG;
    moe_job J = {.n_tokens = n_tokens, .n_embd = n_embd, .n_ff = n_ff, .x = x, .expert_index = expert_index,
                 .token_ids = token_ids, .offsets = assign_offsets, .weights = weights, .out = out, .rows = rows,
                 .act = act};
    if (act && (act->n_ids < 0 || (n_experts && !act->expert_ids) || ((uintptr_t)act->expert_ids | (uintptr_t)act->b_gate |
                (uintptr_t)act->b_up | (uintptr_t)act->b_down) % 4 || (act->clamped != 0 && act->clamped != 1) ||
                (act->input_scaled != 0 && act->input_scaled != 1) ||
                (act->clamped && (!(act->limit > 0.0f) || !isfinite(act->alpha)))))
        return STRATA_E_ARG;
    int st = moe_matrices(impl, n_embd, n_ff, gate, up, down, &J.gate, &J.up, &J.down);
    if (st != STRATA_OK) return st;

    int64_t xy_need;
    if (!mul_ok(n_tokens, n_embd, &xy_need) || !mul_ok(xy_need, 4, &xy_need)) return STRATA_E_SIZE;
    if (xy_need && (!x || (!out && !rows))) return STRATA_E_ARG;
    if (((uintptr_t)x | (uintptr_t)out | (uintptr_t)rows) % 4) return STRATA_E_ARG;
    if (x_bytes < xy_need || (!rows && out_bytes < xy_need)) return STRATA_E_SIZE;
    int64_t rows_need;
    if (rows && (!mul_ok(n_assign, n_embd, &rows_need) || !mul_ok(rows_need, 4, &rows_need) || rows_bytes < rows_need))
        return STRATA_E_SIZE;
    if (assign_offsets[0] < 0 || assign_offsets[n_experts] > n_assign || assign_offsets[n_experts] < assign_offsets[0])
        return STRATA_E_ARG;
    J.a_first = assign_offsets[0];
    J.n_used = assign_offsets[n_experts] - J.a_first;
    if (J.n_used == 0) return STRATA_OK;
    if (!token_ids || !weights) return STRATA_E_ARG;

    moe_layout L;
    st = moe_plan(&J.gate, &J.up, &J.down, n_tokens, J.n_used, n_embd, n_ff, &L);
    if (st != STRATA_OK) return st;
    if (!scratch || scratch_bytes < L.total) return !scratch ? STRATA_E_ARG : STRATA_E_SIZE;
    uint8_t *s = (uint8_t *)(((uintptr_t)scratch + MM_ALIGN - 1) / MM_ALIGN * MM_ALIGN);
    J.head = (int64_t *)(s + L.head);
    J.next = (int64_t *)(s + L.next);
    J.busy = (int64_t *)(s + L.busy);
    J.done = (atomic_int *)(s + L.done);
    J.xg = s + L.xg;
    J.xu = J.up.k.act == J.gate.k.act ? J.xg : s + L.xu;
    J.h = (float *)(s + L.h);
    J.tmp = (float *)(s + L.tmp);
    J.hq = J.down.k.act == STRATA_ACT_F32 ? (uint8_t *)J.h : s + L.hq;
    st = moe_index(&J, n_experts);
    if (st != STRATA_OK) return st;
    if (J.n_busy == 0) return STRATA_OK;  /* every expert skipped */

    atomic_init(&J.next_tok, 0);
    atomic_init(&J.done_tok, 0);
    atomic_init(&J.next_item, 0);
    atomic_init(&J.done_item, 0);
    atomic_init(&J.next_block, 0);
    /* Work estimate: weight bytes times the tokens that use them. */
    const int64_t per_use = mul_sat(n_ff, J.gate.row_bytes + J.up.row_bytes) + mul_sat(n_embd, J.down.row_bytes);
    const int64_t n_part = participants(pool, mul_sat(per_use, J.n_used));
    /* Items: about MM_ITEMS_PER_THREAD per thread in each phase, each as long a run of rows as that
     * allows (short runs over many matrices stream from memory slower than long ones). */
    const int64_t ff_blocks = (n_ff + MM_ROW_BLOCK - 1) / MM_ROW_BLOCK, d_blocks = (n_embd + MM_ROW_BLOCK - 1) / MM_ROW_BLOCK;
    const int64_t want = MM_ITEMS_PER_THREAD * n_part;
    const int64_t per_expert = (want + J.n_busy - 1) / J.n_busy;
    J.ff_chunk = MM_ROW_BLOCK * ((ff_blocks + per_expert - 1) / per_expert);
    J.n_ff_items = (n_ff + J.ff_chunk - 1) / J.ff_chunk;
    J.d_chunk = MM_ROW_BLOCK * ((d_blocks + want - 1) / want);
    J.n_d_items = (n_embd + J.d_chunk - 1) / J.d_chunk;
    strata_pool_run(n_part > 1 ? pool : NULL, n_part, 1, moe_run, &J);
    return STRATA_OK;
}

int strata_moe_swiglu(strata_pool *pool, const float *x, int64_t x_bytes, int64_t n_tokens, int64_t n_embd,
                      int64_t n_ff, const strata_moe_part *gate, const strata_moe_part *up,
                      const strata_moe_part *down, int64_t n_experts, const int32_t *expert_index,
                      const int64_t *assign_offsets, const int32_t *token_ids, const float *weights,
                      int64_t n_assign, float *out, int64_t out_bytes, void *scratch, int64_t scratch_bytes,
                      int impl) {
    return moe_swiglu(pool, x, x_bytes, n_tokens, n_embd, n_ff, gate, up, down, n_experts, expert_index,
                      assign_offsets, token_ids, weights, n_assign, NULL, out, out_bytes, NULL, 0, scratch,
                      scratch_bytes, impl);
}

int strata_moe_glu(strata_pool *pool, const float *x, int64_t x_bytes, int64_t n_tokens, int64_t n_embd,
                   int64_t n_ff, const strata_moe_part *gate, const strata_moe_part *up,
                   const strata_moe_part *down, int64_t n_experts, const int32_t *expert_index,
                   const int64_t *assign_offsets, const int32_t *token_ids, const float *weights,
                   int64_t n_assign, const strata_moe_act *act, float *out, int64_t out_bytes, float *rows,
                   int64_t rows_bytes, void *scratch, int64_t scratch_bytes, int impl) {
    if (!out == !rows) return STRATA_E_ARG;  /* exactly one: the sum, or the rows */
    return moe_swiglu(pool, x, x_bytes, n_tokens, n_embd, n_ff, gate, up, down, n_experts, expert_index,
                      assign_offsets, token_ids, weights, n_assign, act, out, out_bytes, rows, rows_bytes, scratch,
                      scratch_bytes, impl);
}

int strata_moe_reduce(const float *rows, int64_t rows_bytes, const int32_t *token_ids, const float *weights,
                      int64_t a_first, int64_t n_used, int64_t n_assign, int64_t n_tokens, int64_t n_embd,
                      float *out, int64_t out_bytes) {
    int64_t rows_need, out_need, a_end;
    if (a_first < 0 || n_used < 0 || n_assign < 0 || n_tokens < 0 || n_embd < 0 || rows_bytes < 0 || out_bytes < 0 ||
        !add_ok(a_first, n_used, &a_end) || a_end > n_assign)
        return STRATA_E_ARG;
    if (n_used == 0) return STRATA_OK;
    if (!rows || !token_ids || !out || ((uintptr_t)rows | (uintptr_t)out | (uintptr_t)token_ids |
                                                     (uintptr_t)weights) % 4)
        return STRATA_E_ARG;
    if (!mul_ok(n_assign, n_embd, &rows_need) || !mul_ok(rows_need, 4, &rows_need) || rows_bytes < rows_need ||
        !mul_ok(n_tokens, n_embd, &out_need) || !mul_ok(out_need, 4, &out_need) || out_bytes < out_need)
        return STRATA_E_SIZE;
    for (int64_t a = a_first; a < a_end; a++)
        if (token_ids[a] < 0 || token_ids[a] >= n_tokens) return STRATA_E_ARG;
    for (int64_t a = a_first; a < a_end; a++) {  /* the arithmetic of moe_down's sum, in its order */
        const float w = weights ? weights[a] : 1.0f;
        float *o = out + (int64_t)token_ids[a] * n_embd;
        const float *dn = rows + a * n_embd;
        for (int64_t r = 0; r < n_embd; r++) o[r] += w * dn[r];
    }
    return STRATA_OK;
}
