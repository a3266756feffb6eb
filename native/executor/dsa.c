/*
 * Sparse latent attention (DeepSeek-V3.2, GLM-5): the lightning indexer of decode tokens, latent
 * attention over the positions it keeps, and the layer's decode step (dsa.h). The executor's
 * per-call decode path (strata/models/executor/dsa.py) calls strata_dsa_select and
 * strata_dsa_attend; the step calls the same two inside latent attention's step (step.c's
 * strata_step_attn), so both give the same bytes.
 */
#include "strata.h"
#include "kernels.h"
#include "pool.h"
#include "glue_simd.h"
#include "dsa.h"
#include "step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define INDEX_DIM_MAX 1024  /* the indexer's head width at most (a key row converts on the stack) */

static int indexer_ok(const strata_dsa_indexer *ix) {
    int64_t n;
    if (!ix || ix->n_embd < 1 || ix->q_lora < 1 || ix->n_head < 1 || ix->head_dim < 2 || ix->top_k < 1 ||
        (ix->head_dim & (ix->head_dim - 1)) || ix->head_dim > INDEX_DIM_MAX || ix->rope_dim < 0 || ix->rope_dim > ix->head_dim || ix->rope_dim % 2 ||
        !ix->q_b || !ix->k || !ix->k_norm || !ix->k_norm_b || !ix->proj || ix->q_b_bytes < 0 || ix->k_bytes < 0 ||
        !(ix->norm_eps >= 0.0f) || !step_mul_ok(ix->n_head, ix->head_dim, &n))
        return STRATA_E_ARG;
    return STRATA_OK;
}

/* Offsets of the indexer's scratch for n_seq tokens, from the aligned start. */
typedef struct { int64_t qi, ki, wt, row, hs, blk, off, act, total; } select_layout;

static int select_plan(const strata_dsa_indexer *ix, int64_t n_seq, select_layout *S) {
    int64_t a, b, act;
    const int64_t Hi = ix->n_head, Di = ix->head_dim;
    int st = strata_matmul_scratch_bytes(ix->q_b_type, n_seq, ix->q_lora, &a);
    if (st == STRATA_OK) st = strata_matmul_scratch_bytes(ix->k_type, n_seq, ix->n_embd, &b);
    if (st != STRATA_OK) return st;
    act = a > b ? a : b;
    const int64_t per_seq[7] = {Hi * Di * 4, Di * 4, Hi * 4, Di * 4, ix->top_k * 4, 8, 8};
    int64_t *offs[8] = {&S->qi, &S->ki, &S->wt, &S->row, &S->hs, &S->blk, &S->off, &S->act};
    int64_t at = 0;
    for (int i = 0; i < 8; i++) {
        int64_t n = act;
        if (i < 7 && !step_mul_ok(per_seq[i], n_seq, &n)) return STRATA_E_SIZE;
        *offs[i] = at;
        if (n > INT64_MAX / 4 || !step_add_ok(at, step_align(n), &at)) return STRATA_E_SIZE;
    }
    if (!step_add_ok(at, STEP_ALIGN, &S->total)) return STRATA_E_SIZE;
    return STRATA_OK;
}

int strata_dsa_select_scratch_bytes(const strata_dsa_indexer *ix, int64_t n_seq, int64_t *bytes) {
    if (!bytes || n_seq < 0) return STRATA_E_ARG;
    *bytes = 0;
    select_layout S;
    int st = indexer_ok(ix);
    if (st == STRATA_OK) st = select_plan(ix, n_seq, &S);
    if (st == STRATA_OK) *bytes = S.total;
    return st;
}

/* The orthonormal Walsh-Hadamard transform of x [n] in place (n a power of two). */
static void hadamard(float *x, int64_t n) {
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const float s = (float)(1.0 / sqrt((double)n));
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* The scores of the sequences that see more than top_k positions, in chunks of SCORE_CHUNK
 * positions as pool items (each score is one function of its row: the same bytes however split),
 * then each sequence's choice (a pool item per sequence). */
#define SCORE_CHUNK 64

typedef struct {
    const strata_dsa_indexer *ix;
    const float *qi, *wt;
    float *hs, *scores;
    const int64_t *positions, *block_table, *first_chunk, *first_score;
    int64_t n_seq, table_stride, block_size, block_bytes, row_bytes, row_blocks;
    const uint8_t *cache;
    strata_block_fn to_f32;
    int64_t *keep, *n_keep;
} select_job;

/* sum_h wt[h] relu(q[h] . k) over Hi heads of Di (eight partial sums per dot product) */
static float index_score(const float *q, const float *wt, const float *k, int64_t Hi, int64_t Di) {
    float score = 0.0f;
    for (int64_t h = 0; h < Hi; h++) {
        const float *qh = q + h * Di;
        float acc[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= Di; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += qh[i + j] * k[i + j];
        for (; i < Di; i++) acc[0] += qh[i] * k[i];
        const float d = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        score += wt[h] * (d > 0.0f ? d : 0.0f);
    }
    return score;
}

static void score_items(void *ctx, int64_t first, int64_t count) {
    const select_job *J = (const select_job *)ctx;
    const int64_t Hi = J->ix->n_head, Di = J->ix->head_dim;
    float row[INDEX_DIM_MAX];
    int64_t b = 0;
    for (int64_t item = first; item < first + count; item++) {
        while (J->first_chunk[b + 1] <= item) b++;  /* the sequence the chunk belongs to */
        const int64_t n_ctx = J->positions[b] + 1, s0 = (item - J->first_chunk[b]) * SCORE_CHUNK;
        const int64_t s1 = s0 + SCORE_CHUNK < n_ctx ? s0 + SCORE_CHUNK : n_ctx;
        const float *q = J->qi + b * Hi * Di, *wt = J->wt + b * Hi;
        const int64_t *table = J->block_table + b * J->table_stride;
        float *out = J->scores + J->first_score[b];
        for (int64_t s = s0; s < s1; s++) {
            const uint8_t *p = J->cache + table[s / J->block_size] * J->block_bytes + (s % J->block_size) * J->row_bytes;
            const float *k = (const float *)p;
            if (J->to_f32) {
                J->to_f32(p, row, J->row_blocks);
                k = row;
            }
            out[s] = index_score(q, wt, k, Hi, Di);
        }
    }
}

/* a ranks below b: a lower score, or an equal one at a later position */
static inline int worse(float sa, int64_t pa, float sb, int64_t pb) { return sa < sb || (sa == sb && pa > pb); }

static void sift_down(float *hs, int64_t *hp, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(hs[l], hp[l], hs[m], hp[m])) m = l;
        if (r < n && worse(hs[r], hp[r], hs[m], hp[m])) m = r;
        if (m == i) return;
        const float s = hs[i]; hs[i] = hs[m]; hs[m] = s;
        const int64_t p = hp[i]; hp[i] = hp[m]; hp[m] = p;
        i = m;
    }
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void choose_items(void *ctx, int64_t first, int64_t count) {
    const select_job *J = (const select_job *)ctx;
    const int64_t K = J->ix->top_k;
    for (int64_t b = first; b < first + count; b++) {
        const int64_t n_ctx = J->positions[b] + 1;
        int64_t *keep = J->keep + b * K;
        if (n_ctx <= K) {  /* every position fits: all kept, no scores */
            for (int64_t s = 0; s < n_ctx; s++) keep[s] = s;
            J->n_keep[b] = n_ctx;
            continue;
        }
        const float *score = J->scores + J->first_score[b];
        float *hs = J->hs + b * K;
        for (int64_t s = 0; s < K; s++) hs[s] = score[s], keep[s] = s;
        for (int64_t i = K / 2 - 1; i >= 0; i--) sift_down(hs, keep, K, i);  /* the worst kept at the root */
        for (int64_t s = K; s < n_ctx; s++)
            if (worse(hs[0], keep[0], score[s], s)) {
                hs[0] = score[s], keep[0] = s;
                sift_down(hs, keep, K, 0);
            }
        qsort(keep, (size_t)K, sizeof(int64_t), cmp_i64);
        J->n_keep[b] = K;
    }
}

int strata_dsa_select(strata_pool *pool, const strata_dsa_indexer *ix, int64_t n_seq, const float *xa, const float *qa,
                      const int64_t *positions, const float *cos_t, const float *sin_t, int32_t kv_type,
                      void *index_cache, int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                      int64_t table_stride, int64_t *keep, int64_t *n_keep, void *scratch, int64_t scratch_bytes,
                      int impl) {
    select_layout S;
    int st = indexer_ok(ix);
    if (st == STRATA_OK) st = select_plan(ix, n_seq, &S);
    if (st != STRATA_OK) return st;
    if (n_seq < 1 || !xa || !qa || !positions || !index_cache || !block_table || !keep || !n_keep || !scratch ||
        n_blocks < 1 || block_size < 1 || table_stride < 1 || (ix->rope_dim && (!cos_t || !sin_t)))
        return STRATA_E_ARG;
    if (scratch_bytes < S.total) return STRATA_E_SIZE;
    if ((st = strata_resolve_impl(impl, &impl))) return st;
    kv_format f;
    if ((st = strata_kv_format(kv_type, ix->head_dim, impl, &f))) return st;
    const int64_t D = ix->n_embd, Q = ix->q_lora, Hi = ix->n_head, Di = ix->head_dim;
    uint8_t *s = step_scratch(scratch);
    float *qi = (float *)(s + S.qi), *ki = (float *)(s + S.ki), *wt = (float *)(s + S.wt);
    int64_t *blk = (int64_t *)(s + S.blk), *off = (int64_t *)(s + S.off);
    void *act = s + S.act;
    const int64_t act_bytes = S.total - STEP_ALIGN - S.act;
    int64_t max_ctx;
    if (!step_mul_ok(table_stride, block_size, &max_ctx)) return STRATA_E_SIZE;
    for (int64_t b = 0; b < n_seq; b++) {  /* every block read or written, before the first write */
        if (positions[b] < 0 || positions[b] >= max_ctx) return STRATA_E_SIZE;
        const int64_t *table = block_table + b * table_stride;
        for (int64_t i = 0; i <= positions[b] / block_size; i++)
            if (table[i] < 0 || table[i] >= n_blocks) return STRATA_E_SIZE;
        blk[b] = table[positions[b] / block_size];
        off[b] = positions[b] % block_size;
    }
    /* the keys: layernorm(xa @ Wk^T), rope, Hd, rounded to f16, into the cache */
    st = strata_matmul(pool, ix->k_type, ix->k, ix->k_bytes, Di, D, xa, n_seq * D * 4, n_seq, ki, n_seq * Di * 4, act,
                       act_bytes, impl);
    if (st != STRATA_OK) return st;
    for (int64_t b = 0; b < n_seq; b++) {
        float *k = ki + b * Di;
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < Di; i++) mean += k[i];
        mean /= (double)Di;
        for (int64_t i = 0; i < Di; i++) var += ((double)k[i] - mean) * ((double)k[i] - mean);
        const double inv = 1.0 / sqrt(var / (double)Di + (double)ix->norm_eps);
        for (int64_t i = 0; i < Di; i++) k[i] = (float)(((double)k[i] - mean) * inv) * ix->k_norm[i] + ix->k_norm_b[i];
    }
    if (ix->rope_dim && (st = strata_glue_rope(ki, Di, n_seq, 1, Di, cos_t, sin_t, ix->rope_dim, ix->neox))) return st;
    uint16_t *half = (uint16_t *)(s + S.row);  /* the row buffer, free until the scores */
    for (int64_t b = 0; b < n_seq; b++) {
        hadamard(ki + b * Di, Di);
        strata_convert_f16_ref(ki + b * Di, half, Di);  /* f16: llama.cpp's indexer cache */
        strata_dequant_f16_ref((const uint8_t *)half, ki + b * Di, Di);
    }
    st = strata_glue_kv_write_typed(kv_type, ki, Di, ki, Di, n_seq, 1, Di, index_cache, index_cache, n_blocks,
                                    block_size, blk, off, impl);
    if (st != STRATA_OK) return st;
    /* the queries and the heads' weights */
    st = strata_matmul(pool, ix->q_b_type, ix->q_b, ix->q_b_bytes, Hi * Di, Q, qa, n_seq * Q * 4, n_seq, qi,
                       n_seq * Hi * Di * 4, act, act_bytes, impl);
    if (st == STRATA_OK && ix->rope_dim)
        st = strata_glue_rope(qi, Hi * Di, n_seq, Hi, Di, cos_t, sin_t, ix->rope_dim, ix->neox);
    if (st == STRATA_OK) st = strata_matvec_pooled(pool, xa, D, n_seq, D, ix->proj, Hi, wt, impl);
    if (st != STRATA_OK) return st;
    const float w_scale = (float)sqrt((double)(Di * Hi));
    for (int64_t b = 0; b < n_seq; b++) {
        for (int64_t h = 0; h < Hi; h++) hadamard(qi + (b * Hi + h) * Di, Di);
        for (int64_t h = 0; h < Hi; h++) wt[b * Hi + h] /= w_scale;
    }
    /* where each scored sequence's chunks and scores start (past top_k positions only) */
    int64_t *first = malloc((size_t)(2 * n_seq + 1) * sizeof(int64_t)), n_scores = 0;
    if (!first) return STRATA_E_NOMEM;
    int64_t *first_score = first + n_seq + 1;
    first[0] = 0;
    for (int64_t b = 0; b < n_seq; b++) {
        const int64_t n_ctx = positions[b] + 1, scored = n_ctx > ix->top_k;
        first_score[b] = n_scores;
        n_scores += scored ? n_ctx : 0;
        first[b + 1] = first[b] + (scored ? (n_ctx + SCORE_CHUNK - 1) / SCORE_CHUNK : 0);
    }
    float *scores = n_scores ? malloc((size_t)n_scores * sizeof(float)) : NULL;
    if (n_scores && !scores) {
        free(first);
        return STRATA_E_NOMEM;
    }
    select_job J = {.ix = ix, .qi = qi, .wt = wt, .hs = (float *)(s + S.hs), .scores = scores, .positions = positions,
                    .block_table = block_table, .first_chunk = first, .first_score = first_score, .n_seq = n_seq,
                    .table_stride = table_stride, .block_size = block_size, .block_bytes = block_size * f.row_bytes,
                    .row_bytes = f.row_bytes, .row_blocks = f.row_blocks, .cache = (const uint8_t *)index_cache,
                    .to_f32 = f.to_f32, .keep = keep, .n_keep = n_keep};
    if (first[n_seq])
        strata_pool_run(first[n_seq] > 1 ? pool : NULL, first[n_seq], 1, score_items, &J);
    strata_pool_run(n_seq > 1 ? pool : NULL, n_seq, 1, choose_items, &J);
    free(scores);
    free(first);
    return STRATA_OK;
}

int strata_dsa_attend_scratch_bytes(int64_t n_seq, int64_t top_k, int64_t row_len, int64_t *bytes) {
    int64_t rows, n;  /* gathered rows at most float32's; a block index per sequence */
    if (!bytes || n_seq < 0 || top_k < 1 || row_len < 1) return STRATA_E_ARG;
    *bytes = 0;
    if (!step_mul_ok(n_seq, top_k, &rows) || !step_mul_ok(rows, row_len * 4, &n) || n > INT64_MAX / 4 ||
        !step_add_ok(step_align(n), step_align(n_seq * 8) + STEP_ALIGN, bytes))
        return STRATA_E_SIZE;
    return STRATA_OK;
}

int strata_dsa_attend(strata_pool *pool, int32_t kv_type, const float *query, int64_t n_seq, int64_t n_head,
                      int64_t row_len, const void *cache, int64_t n_blocks, int64_t block_size,
                      const int64_t *block_table, int64_t table_stride, const int64_t *keep, const int64_t *n_keep,
                      int64_t top_k, float scale, float *out, void *scratch, int64_t scratch_bytes, int impl) {
    int64_t need, max_ctx;
    int st = strata_dsa_attend_scratch_bytes(n_seq, top_k, row_len, &need);
    if (st != STRATA_OK) return st;
    if (n_seq < 1 || n_head < 1 || !query || !cache || !block_table || !keep || !n_keep || !out || !scratch ||
        n_blocks < 1 || block_size < 1 || table_stride < 1)
        return STRATA_E_ARG;
    if (scratch_bytes < need || !step_mul_ok(table_stride, block_size, &max_ctx)) return STRATA_E_SIZE;
    if ((st = strata_resolve_impl(impl, &impl))) return st;
    kv_format f;
    if ((st = strata_kv_format(kv_type, row_len, impl, &f))) return st;
    uint8_t *s = step_scratch(scratch), *rows = s;
    int64_t *table = (int64_t *)(s + step_align(n_seq * top_k * row_len * 4));
    const uint8_t *c = (const uint8_t *)cache;
    for (int64_t b = 0; b < n_seq; b++) {  /* sequence b's kept rows: block b of the gathered cache */
        const int64_t n = n_keep[b], *kb = keep + b * top_k, *tb = block_table + b * table_stride;
        if (n < 1 || n > top_k) return STRATA_E_SIZE;
        for (int64_t i = 0; i < n; i++) {
            const int64_t p = kb[i];
            if (p < 0 || p >= max_ctx || tb[p / block_size] < 0 || tb[p / block_size] >= n_blocks) return STRATA_E_SIZE;
            memcpy(rows + (b * top_k + i) * f.row_bytes,
                   c + tb[p / block_size] * block_size * f.row_bytes + (p % block_size) * f.row_bytes,
                   (size_t)f.row_bytes);
        }
        table[b] = b;
    }
    return strata_attn_decode_pooled(pool, kv_type, query, n_head * row_len, n_seq, n_head, 1, row_len, rows, rows,
                                     n_seq, top_k, table, 1, n_keep, scale, NULL, 0, 0, out, n_head * row_len, impl);
}

/* ---- the layer's step ---- */

static int layer_extra(const strata_dsa_layer *D, int64_t n_seq, int64_t *sel, int64_t *att) {
    const strata_attn_layer *L = &D->attn;
    *sel = 0;
    if (D->idx.q_b) {
        int st = strata_dsa_select_scratch_bytes(&D->idx, n_seq, sel);
        if (st != STRATA_OK) return st;
    }
    return strata_dsa_attend_scratch_bytes(n_seq, D->idx.top_k, L->kv_lora + L->rope_dim, att);
}

int strata_decode_dsa_scratch_bytes(const strata_layer_head *head, int64_t n_seq, int64_t *bytes) {
    int64_t base, sel, att;
    if (!bytes) return STRATA_E_ARG;
    *bytes = 0;
    const strata_dsa_layer *D = (const strata_dsa_layer *)head;  /* head: the first member of attn, its first */
    int st = strata_decode_attn_scratch_bytes(head, n_seq, &base);
    if (st == STRATA_OK && (D->attn.kv_lora < 1 || D->attn.q_lora < 1)) st = STRATA_E_ARG;
    if (st == STRATA_OK) st = layer_extra(D, n_seq, &sel, &att);
    if (st == STRATA_OK && (!step_add_ok(base, sel > att ? sel : att, bytes))) st = STRATA_E_SIZE;
    return st;
}

/* The layer's attention over the latent rows: the indexer (a full layer), then the kept rows.
 * Its scratch follows latent attention's (whose own bytes come first in a->scratch). */
static int dsa_attend(strata_pool *pool, const strata_attn_layer *L, const strata_step_args *a, const float *cos_t,
                      const float *sin_t, const float *xa, const float *qa, const float *query, float *lat_att,
                      const int64_t *blk, const int64_t *off, int impl) {
    (void)blk, (void)off;
    const strata_dsa_layer *D = (const strata_dsa_layer *)L;  /* attn is its first member */
    int64_t base, sel, att;
    const int64_t n_seq = a->n_seq;
    int st = strata_decode_attn_scratch_bytes(&L->head, n_seq, &base);
    if (st == STRATA_OK) st = layer_extra(D, n_seq, &sel, &att);
    if (st != STRATA_OK) return st;
    uint8_t *extra = (uint8_t *)a->scratch + base;
    const int64_t left = a->scratch_bytes - base;
    if (D->idx.q_b)
        st = strata_dsa_select(pool, &D->idx, n_seq, xa, qa, a->positions, cos_t, sin_t, L->kv_type, L->v_cache,
                               L->n_blocks, L->block_size, a->block_table, a->table_stride, D->keep, D->n_keep, extra,
                               left, impl);
    if (st != STRATA_OK) return st;
    return strata_dsa_attend(pool, L->kv_type, query, n_seq, L->n_head, L->kv_lora + L->rope_dim, L->k_cache,
                             L->n_blocks, L->block_size, a->block_table, a->table_stride, D->keep, D->n_keep,
                             D->idx.top_k, L->attn_scale, lat_att, extra, left, impl);
}

int strata_decode_dsa(strata_pool *pool, const strata_layer_head *head, const strata_step_args *a, int impl) {
    const strata_dsa_layer *D = (const strata_dsa_layer *)head;
    int64_t need;
    int st = strata_decode_dsa_scratch_bytes(head, a ? a->n_seq : 0, &need);
    if (st != STRATA_OK) return st;
    if (!a || a->n_seq < 1 || !D->keep || !D->n_keep || !D->attn.v_cache || D->idx.top_k < 1) return STRATA_E_ARG;
    if (a->n_seq > D->keep_rows || !a->scratch || a->scratch_bytes < need) return STRATA_E_SIZE;
    return strata_step_attn(pool, head, a, dsa_attend, impl);
}
