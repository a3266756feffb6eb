/*
 * The attention half of a decoder layer for a decode step, in one call: what
 * strata/models/attention.py (forward_native) and the router in moe.py do one native call at a
 * time, composed here so a decode step crosses from Python into C twice per layer (this call and
 * the fused MoE call) instead of a dozen times.
 *
 *   xa = attn_norm(x)                        RMSNorm
 *   q|k|v = xa @ Wqkv^T (+ bias)             one packed product (strata_matmul)
 *   q, k = q_norm(q), k_norm(k)              per head or full width, when the model has them
 *   q, k = rope(q), rope(k)
 *   k_cache, v_cache <- k, v                 at each sequence's position, through its block table
 *   o = attention(q, caches) @ Wo^T (+ bias) paged decode attention over positions 0..position
 *                                            (a sliding window, sink logits: gpt-oss)
 *   x += o                                   the residual, in place
 *   xn = ffn_norm(x)
 *   expert ids, weights = route(xn @ router^T (+ bias)); grouped by expert   (MoE layers)
 *
 * Each step is the same native function the per-call path uses (glue.c, matmul.c), so both give
 * the same bytes. Every dimension is checked here once against the buffers the layer describes;
 * the callees check their own again. No allocation: the intermediates live in the caller's
 * scratch (strata_decode_attn_scratch_bytes).
 */
#include "strata.h"

#include <stdint.h>
#include <string.h>

#define STEP_ALIGN 64

static int mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static int add_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_add_overflow(a, b, out); }
static int64_t align_up(int64_t n) { return (n + STEP_ALIGN - 1) / STEP_ALIGN * STEP_ALIGN; }

/* Scratch layout for n_seq sequences: offsets from the aligned start. */
typedef struct { int64_t xa, qkv, att, o, n_ctx, blk, off, logits, act, total; } step_layout;

static int step_plan(const strata_attn_layer *L, int64_t n_seq, step_layout *S) {
    const int64_t D = L->n_embd, hq = L->n_head * L->head_dim, hkv = L->n_head_kv * L->head_dim;
    int64_t act_qkv, act_o;
    int st = strata_matmul_scratch_bytes(L->qkv_type, n_seq, D, &act_qkv);
    if (st == STRATA_OK) st = strata_matmul_scratch_bytes(L->o_type, n_seq, hq, &act_o);
    if (st != STRATA_OK) return st;
    /* Per sequence: xa, qkv, att, o, n_ctx, the new token's block and offset, logits (bytes); then
     * the activation rows of the products. */
    const int64_t per_seq[8] = {D * 4, (hq + 2 * hkv) * 4, hq * 4, D * 4, 8, 8, 8, (L->router ? L->n_experts : 0) * 4};
    int64_t *offs[9] = {&S->xa, &S->qkv, &S->att, &S->o, &S->n_ctx, &S->blk, &S->off, &S->logits, &S->act};
    int64_t at = 0;
    for (int i = 0; i < 9; i++) {
        int64_t n = act_qkv > act_o ? act_qkv : act_o;
        if (i < 8 && !mul_ok(per_seq[i], n_seq, &n)) return STRATA_E_SIZE;
        *offs[i] = at;
        if (n > INT64_MAX / 4 || !add_ok(at, align_up(n), &at)) return STRATA_E_SIZE;
    }
    if (!add_ok(at, STEP_ALIGN, &S->total)) return STRATA_E_SIZE;
    return STRATA_OK;
}

static int layer_ok(const strata_attn_layer *L) {
    int64_t hq, hkv, rows;
    if (!L || L->n_embd < 1 || L->n_head < 1 || L->n_head_kv < 1 || L->head_dim < 1 || L->n_head % L->n_head_kv ||
        !mul_ok(L->n_head, L->head_dim, &hq) || !mul_ok(L->n_head_kv, L->head_dim, &hkv) ||
        !add_ok(hq, 2 * hkv, &rows) || L->rope_dim < 0 || L->rope_dim > L->head_dim || L->rope_dim % 2 ||
        !L->attn_norm || !L->ffn_norm || !L->wqkv || !L->wo || L->window < 0 ||
        (L->router && (L->n_experts < 1 || L->n_used < 1 || L->n_used > L->n_experts)))
        return STRATA_E_ARG;
    return STRATA_OK;
}

int strata_decode_attn_scratch_bytes(const strata_attn_layer *layer, int64_t n_seq, int64_t *bytes) {
    if (!bytes || n_seq < 0) return STRATA_E_ARG;
    *bytes = 0;
    int st = layer_ok(layer);
    step_layout S;
    if (st == STRATA_OK) st = step_plan(layer, n_seq, &S);
    if (st == STRATA_OK) *bytes = S.total;
    return st;
}

int strata_decode_attn(strata_pool *pool, const strata_attn_layer *L, int64_t n_seq, const int64_t *block_table,
                       int64_t table_stride, const int64_t *positions, const float *cos_t, const float *sin_t, float *x,
                       float *xn, int64_t *expert_ids, float *weights, strata_route_groups *groups, void *scratch,
                       int64_t scratch_bytes, int impl) {
    int st = layer_ok(L);
    if (st != STRATA_OK) return st;
    if (!L->k_cache || !L->v_cache || L->n_blocks < 1 || L->block_size < 1) return STRATA_E_ARG;
    if (n_seq < 1 || !block_table || table_stride < 1 || !positions || !x || !xn || (L->rope_dim && (!cos_t || !sin_t)))
        return STRATA_E_ARG;
    if (L->router && (!expert_ids || !weights)) return STRATA_E_ARG;
    step_layout S;
    st = step_plan(L, n_seq, &S);
    if (st != STRATA_OK) return st;
    if (!scratch || scratch_bytes < S.total) return !scratch ? STRATA_E_ARG : STRATA_E_SIZE;
    uint8_t *s = (uint8_t *)(((uintptr_t)scratch + STEP_ALIGN - 1) / STEP_ALIGN * STEP_ALIGN);

    const int64_t D = L->n_embd, H = L->n_head, Hkv = L->n_head_kv, hd = L->head_dim;
    const int64_t hq = H * hd, hkv = Hkv * hd, n_qkv = hq + 2 * hkv;
    float *xa = (float *)(s + S.xa), *qkv = (float *)(s + S.qkv), *att = (float *)(s + S.att);
    float *o = (float *)(s + S.o), *logits = (float *)(s + S.logits);
    int64_t *n_ctx = (int64_t *)(s + S.n_ctx), *blk = (int64_t *)(s + S.blk), *off = (int64_t *)(s + S.off);
    void *act = s + S.act;
    const int64_t act_bytes = S.total - STEP_ALIGN - S.act;
    int64_t max_ctx, last;
    if (!mul_ok(table_stride, L->block_size, &max_ctx) || !mul_ok(n_seq, table_stride, &last)) return STRATA_E_SIZE;
    for (int64_t b = 0; b < n_seq; b++) {  /* every block the step reads or writes, before the first write */
        if (positions[b] < 0 || positions[b] >= max_ctx) return STRATA_E_SIZE;
        const int64_t *table = block_table + b * table_stride;
        for (int64_t i = 0; i <= positions[b] / L->block_size; i++)
            if (table[i] < 0 || table[i] >= L->n_blocks) return STRATA_E_SIZE;
        n_ctx[b] = positions[b] + 1;
        blk[b] = table[positions[b] / L->block_size];
        off[b] = positions[b] % L->block_size;
    }

    /* Attention. */
    st = strata_glue_rmsnorm(x, D, n_seq, 1, D, L->attn_norm, L->norm_eps, xa, D);
    if (st == STRATA_OK)
        st = strata_matmul(pool, L->qkv_type, L->wqkv, L->wqkv_bytes, n_qkv, D, xa, n_seq * D * 4, n_seq, qkv,
                           n_seq * n_qkv * 4, act, act_bytes, impl);
    if (st != STRATA_OK) return st;
    if (L->bqkv)
        for (int64_t b = 0; b < n_seq; b++)
            for (int64_t i = 0; i < n_qkv; i++) qkv[b * n_qkv + i] += L->bqkv[i];
    float *q = qkv, *k = qkv + hq, *v = qkv + hq + hkv;
    if (L->q_norm) {
        const int per_head = L->qk_norm_per_head != 0;
        st = strata_glue_rmsnorm(q, n_qkv, n_seq, per_head ? H : 1, per_head ? hd : hq, L->q_norm, L->norm_eps, q, n_qkv);
        if (st == STRATA_OK && L->k_norm)
            st = strata_glue_rmsnorm(k, n_qkv, n_seq, per_head ? Hkv : 1, per_head ? hd : hkv, L->k_norm, L->norm_eps,
                                     k, n_qkv);
        if (st != STRATA_OK) return st;
    }
    if (L->rope_dim) {
        st = strata_glue_rope(q, n_qkv, n_seq, H, hd, cos_t, sin_t, L->rope_dim, L->neox);
        if (st == STRATA_OK) st = strata_glue_rope(k, n_qkv, n_seq, Hkv, hd, cos_t, sin_t, L->rope_dim, L->neox);
        if (st != STRATA_OK) return st;
    }
    /* A block is a "slot" of block_size positions to kv_write. */
    st = strata_glue_kv_write(k, n_qkv, v, n_qkv, n_seq, Hkv, hd, L->k_cache, L->v_cache, L->n_blocks, L->block_size,
                              blk, off);
    if (st == STRATA_OK)
        st = strata_glue_attn_decode_sinks(q, n_qkv, n_seq, H, Hkv, hd, L->k_cache, L->v_cache, L->n_blocks,
                                           L->block_size, block_table, table_stride, n_ctx, L->attn_scale, L->sinks,
                                           L->window, att, hq, impl);
    if (st == STRATA_OK)
        st = strata_matmul(pool, L->o_type, L->wo, L->wo_bytes, D, hq, att, n_seq * hq * 4, n_seq, o, n_seq * D * 4,
                           act, act_bytes, impl);
    if (st != STRATA_OK) return st;
    if (L->bo)
        for (int64_t b = 0; b < n_seq; b++)
            for (int64_t i = 0; i < D; i++) o[b * D + i] += L->bo[i];
    for (int64_t i = 0; i < n_seq * D; i++) x[i] += o[i];

    /* The FFN's input and, for an MoE layer, its routing. */
    st = strata_glue_rmsnorm(x, D, n_seq, 1, D, L->ffn_norm, L->norm_eps, xn, D);
    if (st != STRATA_OK || !L->router) return st;
    st = strata_glue_matvec(xn, D, n_seq, D, L->router, L->n_experts, logits, impl);
    if (st == STRATA_OK && L->router_bias)
        for (int64_t b = 0; b < n_seq; b++)
            for (int64_t e = 0; e < L->n_experts; e++) logits[b * L->n_experts + e] += L->router_bias[e];
    if (st == STRATA_OK)
        st = strata_glue_route(logits, n_seq, L->n_experts, L->n_used, L->gating, L->norm_weights != 0,
                               L->weights_scale, expert_ids, weights);
    if (st != STRATA_OK || !groups) return st;
    return strata_glue_group(expert_ids, weights, n_seq, L->n_used, L->n_experts, groups->used, groups->offsets,
                             groups->token_ids, groups->weights_sorted, &groups->n_used);
}
