/*
 * The attention half of a decoder layer for a decode step, in one call: what
 * strata/models/attention.py (forward_native), mla.py (forward_native) and the router in moe.py
 * do one native call at a time, composed here so a decode step crosses from Python into C twice
 * per layer (this call and the fused MoE call) instead of a dozen times.
 *
 *   xa = attn_norm(x)                        RMSNorm
 *   grouped-query attention:
 *     q|k|v = xa @ Wqkv^T (+ bias)           one packed product (strata_matmul)
 *     q, k = q_norm(q), k_norm(k)            per head or full width, when the model has them
 *     q, k = rope(q), rope(k)
 *     q, k = l2(q), l2(k); q *= temperature  Llama 4: unit RMS per head; global layers' query scale
 *     k_cache, v_cache <- k, v               at each sequence's position, through its block table
 *     a = attention(q, caches)               paged decode attention over positions 0..position
 *                                            (a sliding window, sink logits: gpt-oss; Llama 4's
 *                                            local layers: the query's chunk)
 *     a *= softplus(xa @ Wg^T)               Laguna: per head or per element
 *     a = a[:, :hd_v] * v_scale              MiMo-V2: values narrower than keys (cached padded
 *                                            to hd) and scaled
 *   latent attention (DeepSeek):
 *     q = xa @ Wq^T, or q_a_norm(xa @ Wq_a^T) @ Wq_b^T; q_rope = rope(q_rope)
 *     c|k_rope = xa @ Wkv_a^T; c = kv_a_norm(c); k_rope = rope(k_rope); cache <- c|k_rope
 *     query[h] = (k_b[h] @ q_nope[h]) | q_rope[h]       (strata_matmul_heads)
 *     a[h] = v_b[h] @ attention(query, latent rows)[h][:kv_lora]
 *   o = a @ Wo^T (+ bias)
 *   x += o                                   the residual, in place
 *   xn = ffn_norm(x)
 *   expert ids, weights = route(xn @ router^T (+ bias)); grouped by expert   (MoE layers)
 *
 * Each step is the same native function the per-call path uses (glue.c, matmul.c), so both give
 * the same bytes. Every dimension is checked here once against the buffers the layer describes;
 * the callees check their own again. No allocation: the intermediates live in the caller's
 * scratch (strata_decode_attn_scratch_bytes).
 *
 * A gated DeltaNet layer's half (strata_decode_deltanet; strata/models/deltanet.py) takes the
 * attention's place: xa = attn_norm(x); [q|k|v | z | b, a] = xa @ W_in^T (one packed product);
 * per sequence the conv step, beta and g, and the recurrence on its slot's states (deltanet.c);
 * o = rmsnorm(o) * ssm_norm * silu(z); x += o @ W_out^T; then the FFN's input and routing as above.
 */
#include "strata.h"
#include "deltanet.h"
#include "step.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define N_BUF 13
#define mul_ok step_mul_ok
#define add_ok step_add_ok
#define align_up step_align

/* Scratch layout for n_seq sequences: offsets from the aligned start. */
typedef struct { int64_t xa, qkv, att, o, n_ctx, blk, off, logits, qa, ckv, query, gate, act, total; } step_layout;

static int latent(const strata_attn_layer *L) { return L->kv_lora > 0; }

/* Per-sequence widths (floats) of the q|k|v product, the attention output before Wo and the
 * output projection's input row length. */
static void widths(const strata_attn_layer *L, int64_t *n_qkv, int64_t *n_att, int64_t *o_in) {
    const int64_t H = L->n_head, hd = L->head_dim;
    if (latent(L)) {
        *n_qkv = H * hd;                         /* q: nope + rope per head */
        *n_att = H * (L->kv_lora + L->rope_dim); /* the query in the latent space, then its attention */
        *o_in = H * L->v_dim;
    } else {
        const int64_t hv = L->head_dim_v ? L->head_dim_v : hd;
        *n_qkv = (H * (L->q_gate ? 2 : 1) + L->n_head_kv) * hd + L->n_head_kv * hv;
        *n_att = H * hd;
        *o_in = H * hv;
    }
}

static int step_plan(const strata_attn_layer *L, int64_t n_seq, step_layout *S) {
    const int64_t D = L->head.n_embd;
    int64_t n_qkv, n_att, o_in, act = 0, a;
    widths(L, &n_qkv, &n_att, &o_in);
    /* The products' activation rows: q|k|v (or q, q_b), o, for latent attention q_a and kv_a, and a
     * v of its own type. */
    const int32_t types[6] = {L->qkv_type, L->o_type, L->wq_a_type, L->wkv_a_type, L->v_type, L->g_type};
    const int64_t lens[6] = {latent(L) && L->q_lora ? L->q_lora : D, o_in, D, D, D, D};
    const int used[6] = {1, 1, latent(L) && L->q_lora, latent(L), L->wv != NULL, L->g_rows > 0};
    for (int i = 0; i < 6; i++) {
        if (!used[i]) continue;
        int st = strata_matmul_scratch_bytes(types[i], n_seq, lens[i], &a);
        if (st != STRATA_OK) return st;
        act = a > act ? a : act;
    }
    if (latent(L)) {  /* the per-head products with k_b (rows of nope) and v_b (rows of kv_lora) */
        int st = strata_matmul_heads_scratch_bytes(L->k_b_type, L->n_head, n_seq, L->nope, &a);
        if (st != STRATA_OK) return st;
        act = a > act ? a : act;
        st = strata_matmul_heads_scratch_bytes(L->v_b_type, L->n_head, n_seq, L->kv_lora, &a);
        if (st != STRATA_OK) return st;
        act = a > act ? a : act;
    }
    const int64_t lat = latent(L) ? L->kv_lora + L->rope_dim : 0;
    /* Per sequence, bytes: xa, qkv, att, o, n_ctx, the new token's block and offset, logits, q_a,
     * kv_a, the latent query, the output gate; then the activation rows of the products. */
    const int64_t per_seq[N_BUF - 1] = {D * 4, n_qkv * 4, n_att * 4, (D > o_in ? D : o_in) * 4, 8, 8, 8,
                                        (L->head.router ? L->head.n_experts : 0) * 4, (latent(L) ? L->q_lora : 0) * 4,
                                        lat * 4, (latent(L) ? n_att : 0) * 4,
                                        (L->q_gate ? n_att : L->g_rows) * 4};
    int64_t *offs[N_BUF] = {&S->xa, &S->qkv, &S->att, &S->o, &S->n_ctx, &S->blk, &S->off, &S->logits, &S->qa,
                            &S->ckv, &S->query, &S->gate, &S->act};
    int64_t at = 0;
    for (int i = 0; i < N_BUF; i++) {
        int64_t n = act;
        if (i < N_BUF - 1 && !mul_ok(per_seq[i], n_seq, &n)) return STRATA_E_SIZE;
        *offs[i] = at;
        if (n > INT64_MAX / 4 || !add_ok(at, align_up(n), &at)) return STRATA_E_SIZE;
    }
    if (!add_ok(at, STEP_ALIGN, &S->total)) return STRATA_E_SIZE;
    return STRATA_OK;
}

static int layer_ok(const strata_attn_layer *L) {
    int64_t hq, hkv, rows;
    if (!L || strata_step_head_ok(&L->head) != STRATA_OK || L->n_head < 1 || L->n_head_kv < 1 || L->head_dim < 1 || L->n_head % L->n_head_kv ||
        !mul_ok(L->n_head, L->head_dim, &hq) || !mul_ok(L->n_head_kv, L->head_dim, &hkv) ||
        !add_ok(hq, 2 * hkv, &rows) || L->rope_dim < 0 || L->rope_dim > L->head_dim || L->rope_dim % 2 ||
        !L->wqkv || !L->wo || L->window < 0 || L->kv_lora < 0 ||
        (L->q_gate && (L->kv_lora || L->bqkv || !add_ok(rows, hq, &rows))) ||
        L->chunk < 0 || (L->chunk && L->window) || (L->qk_l2 != 0 && L->qk_l2 != 1) || !(L->qk_l2_eps >= 0.0f) || L->temp_floor < 0 ||
        (L->temp_floor && !isfinite(L->temp_scale)) || ((L->chunk || L->qk_l2 || L->temp_floor) && L->kv_lora) ||
        (L->wv && (L->kv_lora || L->wv_bytes < 0)) || L->head_dim_v < 0 || L->head_dim_v > L->head_dim ||
        (L->head_dim_v && (L->kv_lora || L->q_gate || L->g_rows)) || !isfinite(L->v_scale) ||
        (L->rope_alt != 0 && L->rope_alt != 1) || L->g_rows < 0 ||
        (L->g_rows && (L->kv_lora || L->q_gate || !L->wg || L->wg_bytes < 0 || (L->g_rows != L->n_head && L->g_rows != hq))))
        return STRATA_E_ARG;
    if (latent(L)) {
        int64_t n;
        if (L->n_head_kv != 1 || L->q_lora < 0 || L->v_dim < 1 || L->nope != L->head_dim - L->rope_dim ||
            L->nope < 1 || !L->wkv_a || !L->kv_a_norm || !L->k_b || !L->v_b || L->k_b_bytes < 0 || L->v_b_bytes < 0 ||
            (L->q_lora && (!L->wq_a || !L->q_a_norm)) ||
            L->bqkv || L->q_norm || L->k_norm || L->sinks || L->window || !mul_ok(L->n_head, L->kv_lora + L->rope_dim, &n) ||
            !mul_ok(n, L->nope > L->v_dim ? L->nope : L->v_dim, &n))
            return STRATA_E_ARG;
    }
    return STRATA_OK;
}

int strata_decode_attn_scratch_bytes(const strata_layer_head *head, int64_t n_seq, int64_t *bytes) {
    if (!bytes || n_seq < 0) return STRATA_E_ARG;
    *bytes = 0;
    const strata_attn_layer *layer = (const strata_attn_layer *)head;  /* head is its first member */
    int st = layer_ok(layer);
    step_layout S;
    if (st == STRATA_OK) st = step_plan(layer, n_seq, &S);
    if (st == STRATA_OK) *bytes = S.total;
    return st;
}

/* Gated attention's query rows [q_0 | g_0 | q_1 | g_1 ...] of each product row: the gates into
 * gate [n_seq, H hd], the queries packed into the row's first H hd values. */
static void split_gates(float *qkv, int64_t n_qkv, int64_t n_seq, int64_t H, int64_t hd, float *gate) {
    for (int64_t b = 0; b < n_seq; b++) {
        float *row = qkv + b * n_qkv;
        for (int64_t h = 0; h < H; h++)
            memcpy(gate + (b * H + h) * hd, row + (2 * h + 1) * hd, (size_t)hd * sizeof(float));
        for (int64_t h = 1; h < H; h++)  /* head h moves from 2h hd to h hd: below every later head */
            memmove(row + h * hd, row + 2 * h * hd, (size_t)hd * sizeof(float));
    }
}

/* qkv [n_seq, n_qkv] = xa @ Wqkv^T: one product, or with V in a type of its own (L->wv) the q|k
 * product into qkv as [n_seq, n_qk] rows and V's into `spare` [n_seq, hkv] (the attention's output
 * buffer, free until the attention), then every row moved to its place, the last one first (a row's
 * new place starts at or after its old one and ends before the next row's new place). */
static int qkv_product(strata_pool *pool, const strata_attn_layer *L, int64_t n_seq, const float *xa, float *qkv,
                       int64_t n_qk, int64_t n_qkv, int64_t hkv, float *spare, void *act, int64_t act_bytes, int impl) {
    const int64_t D = L->head.n_embd;
    if (!L->wv)
        return strata_matmul(pool, L->qkv_type, L->wqkv, L->wqkv_bytes, n_qkv, D, xa, n_seq * D * 4, n_seq, qkv,
                             n_seq * n_qkv * 4, act, act_bytes, impl);
    int st = strata_matmul(pool, L->qkv_type, L->wqkv, L->wqkv_bytes, n_qk, D, xa, n_seq * D * 4, n_seq, qkv,
                           n_seq * n_qk * 4, act, act_bytes, impl);
    if (st == STRATA_OK)
        st = strata_matmul(pool, L->v_type, L->wv, L->wv_bytes, hkv, D, xa, n_seq * D * 4, n_seq, spare,
                           n_seq * hkv * 4, act, act_bytes, impl);
    if (st != STRATA_OK) return st;
    for (int64_t b = n_seq - 1; b >= 0; b--) {
        memmove(qkv + b * n_qkv, qkv + b * n_qk, (size_t)n_qk * 4);
        memcpy(qkv + b * n_qkv + n_qk, spare + b * hkv, (size_t)hkv * 4);
    }
    return STRATA_OK;
}

/* Grouped-query attention of the new tokens into att [n_seq, H hd]. */
static int gqa_half(strata_pool *pool, const strata_attn_layer *L, int64_t n_seq, const int64_t *block_table,
                    int64_t table_stride, const float *cos_t, const float *sin_t, const float *xa, float *qkv,
                    float *att, float *gate, const int64_t *n_ctx, const int64_t *blk, const int64_t *off,
                    void *act, int64_t act_bytes, int impl) {
    const int64_t H = L->n_head, Hkv = L->n_head_kv, hd = L->head_dim, hv = L->head_dim_v ? L->head_dim_v : hd;
    const int64_t hq = H * hd, hkv = Hkv * hd, n_q = L->q_gate ? 2 * hq : hq, n_qkv = n_q + hkv + Hkv * hv;
    int st = qkv_product(pool, L, n_seq, xa, qkv, n_q + hkv, n_qkv, Hkv * hv, att, act, act_bytes, impl);
    if (st == STRATA_OK && L->g_rows)  /* Laguna's output gate, from the same input */
        st = strata_matmul(pool, L->g_type, L->wg, L->wg_bytes, L->g_rows, L->head.n_embd, xa, n_seq * L->head.n_embd * 4,
                           n_seq, gate, n_seq * L->g_rows * 4, act, act_bytes, impl);
    if (st != STRATA_OK) return st;
    if (L->bqkv)
        for (int64_t b = 0; b < n_seq; b++)
            for (int64_t i = 0; i < n_qkv; i++) qkv[b * n_qkv + i] += L->bqkv[i];
    if (L->q_gate) split_gates(qkv, n_qkv, n_seq, H, hd, gate);
    float *q = qkv, *k = qkv + n_q, *v = qkv + n_q + hkv;
    if (L->q_norm) {
        const int per_head = L->qk_norm_per_head != 0;
        st = strata_glue_rmsnorm(q, n_qkv, n_seq, per_head ? H : 1, per_head ? hd : hq, L->q_norm, L->head.norm_eps, q, n_qkv);
        if (st == STRATA_OK && L->k_norm)
            st = strata_glue_rmsnorm(k, n_qkv, n_seq, per_head ? Hkv : 1, per_head ? hd : hkv, L->k_norm, L->head.norm_eps,
                                     k, n_qkv);
        if (st != STRATA_OK) return st;
    }
    if (L->rope_dim) {
        st = strata_glue_rope(q, n_qkv, n_seq, H, hd, cos_t, sin_t, L->rope_dim, L->neox);
        if (st == STRATA_OK) st = strata_glue_rope(k, n_qkv, n_seq, Hkv, hd, cos_t, sin_t, L->rope_dim, L->neox);
        if (st != STRATA_OK) return st;
    }
    if (L->qk_l2) {  /* Llama 4: unit RMS per head after RoPE, no weight */
        st = strata_glue_rmsnorm(q, n_qkv, n_seq, H, hd, NULL, L->qk_l2_eps, q, n_qkv);
        if (st == STRATA_OK) st = strata_glue_rmsnorm(k, n_qkv, n_seq, Hkv, hd, NULL, L->qk_l2_eps, k, n_qkv);
        if (st != STRATA_OK) return st;
    }
    for (int64_t b = 0; L->temp_floor && b < n_seq; b++) {  /* Llama 4's global layers: the query temperature */
        const double steps = floor((double)n_ctx[b] / (double)L->temp_floor);  /* n_ctx = position + 1 */
        const float t = (float)(log1p(steps) * L->temp_scale + 1.0);
        for (int64_t i = 0; i < hq; i++) q[b * n_qkv + i] *= t;
    }
    int64_t v_stride = n_qkv;
    if (hv != hd) {  /* narrower values: the cache's rows of hd, zero-padded, built in att (free until the attention) */
        for (int64_t r = 0; r < n_seq * Hkv; r++) {
            memcpy(att + r * hd, v + (r / Hkv) * n_qkv + (r % Hkv) * hv, (size_t)hv * sizeof(float));
            memset(att + r * hd + hv, 0, (size_t)(hd - hv) * sizeof(float));
        }
        v = att, v_stride = hkv;
    }
    /* A block is a "slot" of block_size positions to kv_write. */
    st = strata_glue_kv_write_typed(L->kv_type, k, n_qkv, v, v_stride, n_seq, Hkv, hd, L->k_cache, L->v_cache,
                                    L->n_blocks, L->block_size, blk, off, impl);
    if (st != STRATA_OK) return st;
    st = strata_attn_decode_pooled(pool, L->kv_type, q, n_qkv, n_seq, H, Hkv, hd, L->k_cache, L->v_cache, L->n_blocks,
                                   L->block_size, block_table, table_stride, n_ctx, L->attn_scale, L->sinks,
                                   L->window, L->chunk, att, hq, impl);
    if (st == STRATA_OK && L->q_gate) st = strata_attn_gate(att, n_seq * hq, gate, n_seq * hq, n_seq * hq);
    if (st == STRATA_OK && L->g_rows)
        st = strata_glue_gate_softplus(att, n_seq * hq, gate, n_seq * L->g_rows, n_seq, L->g_rows, hq / L->g_rows);
    if (st != STRATA_OK) return st;
    if (hv != hd)  /* each head's first hv features, packed: [n_seq, H hv] (a head moves down, never up) */
        for (int64_t r = 1; r < n_seq * H; r++) memmove(att + r * hv, att + r * hd, (size_t)hv * sizeof(float));
    if (L->v_scale != 0.0f && L->v_scale != 1.0f)
        for (int64_t i = 0; i < n_seq * H * hv; i++) att[i] *= L->v_scale;
    return STRATA_OK;
}

/* Latent attention of the new tokens into att [n_seq, H v_dim]. */
static int mla_half(strata_pool *pool, const strata_attn_layer *L, int64_t n_seq, const int64_t *block_table,
                    int64_t table_stride, const float *cos_t, const float *sin_t, const float *xa, float *q,
                    float *qa, float *ckv, float *query, float *lat_att, float *att,
                    const int64_t *n_ctx, const int64_t *blk, const int64_t *off, void *act, int64_t act_bytes,
                    const strata_step_args *a, strata_latent_attend_fn attend, int impl) {
    const int64_t D = L->head.n_embd, H = L->n_head, hd = L->head_dim, R = L->rope_dim, Lk = L->kv_lora;
    const int64_t n_q = H * hd, n_lat = Lk + R, Q = L->q_lora;
    int st;
    if (Q) {
        st = strata_matmul(pool, L->wq_a_type, L->wq_a, L->wq_a_bytes, Q, D, xa, n_seq * D * 4, n_seq, qa,
                           n_seq * Q * 4, act, act_bytes, impl);
        if (st == STRATA_OK) st = strata_glue_rmsnorm(qa, Q, n_seq, 1, Q, L->q_a_norm, L->head.norm_eps, qa, Q);
        if (st == STRATA_OK)
            st = strata_matmul(pool, L->qkv_type, L->wqkv, L->wqkv_bytes, n_q, Q, qa, n_seq * Q * 4, n_seq, q,
                               n_seq * n_q * 4, act, act_bytes, impl);
    } else {
        st = strata_matmul(pool, L->qkv_type, L->wqkv, L->wqkv_bytes, n_q, D, xa, n_seq * D * 4, n_seq, q,
                           n_seq * n_q * 4, act, act_bytes, impl);
    }
    if (st == STRATA_OK)
        st = strata_matmul(pool, L->wkv_a_type, L->wkv_a, L->wkv_a_bytes, n_lat, D, xa, n_seq * D * 4, n_seq, ckv,
                           n_seq * n_lat * 4, act, act_bytes, impl);
    if (st == STRATA_OK) st = strata_glue_rmsnorm(ckv, n_lat, n_seq, 1, Lk, L->kv_a_norm, L->head.norm_eps, ckv, n_lat);
    if (st == STRATA_OK && R) {  /* the rope features: the last R of each query head, of the latent row */
        st = strata_glue_rope(q + L->nope, n_q, n_seq, H, hd, cos_t, sin_t, R, L->neox);
        if (st == STRATA_OK) st = strata_glue_rope(ckv + Lk, n_lat, n_seq, 1, R, cos_t, sin_t, R, L->neox);
    }
    if (st == STRATA_OK)  /* the latent row [c | k_rope] is the position's one cache row */
        st = strata_glue_kv_write_typed(L->kv_type, ckv, n_lat, ckv, n_lat, n_seq, 1, n_lat, L->k_cache, L->k_cache,
                                        L->n_blocks, L->block_size, blk, off, impl);
    const int64_t fb = n_seq * 4;  /* bytes of one float per sequence */
    if (st == STRATA_OK)  /* query[t, h, :Lk] = k_b[h] @ q_nope[t, h]; then the rope features */
        st = strata_matmul_heads(pool, L->k_b_type, L->k_b, L->k_b_bytes, H, Lk, L->nope, q, fb * n_q, n_q, hd, n_seq,
                                 query, fb * H * n_lat, H * n_lat, n_lat, act, act_bytes, impl);
    if (st != STRATA_OK) return st;
    for (int64_t t = 0; t < n_seq; t++)
        for (int64_t h = 0; h < H; h++)
            memcpy(query + (t * H + h) * n_lat + Lk, q + t * n_q + h * hd + L->nope, (size_t)R * sizeof(float));
    if (attend)  /* a kind's own attention over the latent rows (sparse attention: dsa.c) */
        st = attend(pool, L, a, cos_t, sin_t, xa, qa, query, lat_att, blk, off, impl);
    else
        st = strata_attn_decode_pooled(pool, L->kv_type, query, H * n_lat, n_seq, H, 1, n_lat, L->k_cache, L->k_cache,
                                       L->n_blocks, L->block_size, block_table, table_stride, n_ctx, L->attn_scale,
                                       NULL, 0, 0, lat_att, H * n_lat, impl);
    if (st == STRATA_OK)  /* att[t, h] = v_b[h] @ the latent part of the attention's output */
        st = strata_matmul_heads(pool, L->v_b_type, L->v_b, L->v_b_bytes, H, L->v_dim, Lk, lat_att, fb * H * n_lat,
                                 H * n_lat, n_lat, n_seq, att, fb * H * L->v_dim, H * L->v_dim, L->v_dim, act,
                                 act_bytes, impl);
    return st;
}

/* The FFN's input xn = ffn_norm(x) and, for an MoE layer (router given), its routing and grouping. */
int strata_step_head_ok(const strata_layer_head *h) {
    if (!h || h->n_embd < 1 || !h->attn_norm || !h->ffn_norm ||
        (h->router && (h->n_experts < 1 || h->n_used < 1 || h->n_used > h->n_experts)))
        return STRATA_E_ARG;
    return STRATA_OK;
}

int strata_step_args_ok(const strata_layer_head *h, const strata_step_args *a, int64_t need) {
    if (!a || a->n_seq < 1 || !a->positions || !a->x || !a->xn || (h->router && (!a->expert_ids || !a->weights)))
        return STRATA_E_ARG;
    if (!a->scratch || a->scratch_bytes < need) return !a->scratch ? STRATA_E_ARG : STRATA_E_SIZE;
    return STRATA_OK;
}

int strata_step_ffn_input(strata_pool *pool, const strata_layer_head *h, const strata_step_args *a, float *logits,
                          int impl) {
    const int64_t n_seq = a->n_seq, D = h->n_embd, E = h->n_experts;
    int st = strata_glue_rmsnorm(a->x, D, n_seq, 1, D, h->ffn_norm, h->norm_eps, a->xn, D);
    if (st != STRATA_OK || !h->router) return st;
    st = strata_matvec_pooled(pool, a->xn, D, n_seq, D, h->router, E, logits, impl);
    if (st == STRATA_OK && h->router_bias)
        for (int64_t b = 0; b < n_seq; b++)
            for (int64_t e = 0; e < E; e++) logits[b * E + e] += h->router_bias[e];
    if (st == STRATA_OK)
        st = strata_glue_route_groups(logits, n_seq, E, h->n_used, h->gating, h->norm_weights != 0, h->weights_scale,
                                      h->selection_bias, h->n_groups, h->n_groups_used, h->group_top, a->expert_ids,
                                      a->weights);
    strata_route_groups *g = a->groups;
    if (st != STRATA_OK || !g) return st;
    return strata_glue_group_owned(a->expert_ids, a->weights, n_seq, h->n_used, E, g->owned, g->used, g->offsets,
                                   g->token_ids, g->weights_sorted, &g->n_used);
}

int strata_decode_attn(strata_pool *pool, const strata_layer_head *head, const strata_step_args *a, int impl) {
    return strata_step_attn(pool, head, a, NULL, impl);
}

int strata_step_attn(strata_pool *pool, const strata_layer_head *head, const strata_step_args *a,
                     strata_latent_attend_fn attend, int impl) {
    const strata_attn_layer *L = (const strata_attn_layer *)head;  /* head is its first member */
    int st = layer_ok(L);
    if (st != STRATA_OK) return st;
    if (!L->k_cache || (!latent(L) && !L->v_cache) || L->n_blocks < 1 || L->block_size < 1) return STRATA_E_ARG;
    if (!a || a->n_seq < 1) return STRATA_E_ARG;
    const int64_t n_seq = a->n_seq, table_stride = a->table_stride;
    const int64_t *block_table = a->block_table, *positions = a->positions;
    const float *cos_t = L->rope_alt ? a->cos_alt : a->cos_t, *sin_t = L->rope_alt ? a->sin_alt : a->sin_t;
    float *x = a->x;
    if (!block_table || table_stride < 1 || (L->rope_dim && (!cos_t || !sin_t))) return STRATA_E_ARG;
    step_layout S;
    st = step_plan(L, n_seq, &S);
    if (st == STRATA_OK) st = strata_step_args_ok(head, a, S.total);
    if (st != STRATA_OK) return st;
    uint8_t *s = step_scratch(a->scratch);

    const int64_t D = L->head.n_embd;
    int64_t n_qkv, n_att, o_in;
    widths(L, &n_qkv, &n_att, &o_in);
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
    st = strata_glue_rmsnorm(x, D, n_seq, 1, D, L->head.attn_norm, L->head.norm_eps, xa, D);
    if (st != STRATA_OK) return st;
    /* The output projection reads a_out and writes proj; for latent attention xa, spent by then,
     * takes the product (o holds max(D, H v_dim) floats per sequence). */
    float *a_out = latent(L) ? o : att, *proj = latent(L) ? xa : o;
    if (latent(L))
        st = mla_half(pool, L, n_seq, block_table, table_stride, cos_t, sin_t, xa, qkv, (float *)(s + S.qa),
                      (float *)(s + S.ckv), (float *)(s + S.query), att, a_out, n_ctx, blk,
                      off, act, act_bytes, a, attend, impl);
    else if (attend)
        return STRATA_E_ARG;  /* a kind's own attention replaces latent attention's only */
    else
        st = gqa_half(pool, L, n_seq, block_table, table_stride, cos_t, sin_t, xa, qkv, att, (float *)(s + S.gate),
                      n_ctx, blk, off, act, act_bytes, impl);
    if (st == STRATA_OK)
        st = strata_matmul(pool, L->o_type, L->wo, L->wo_bytes, D, o_in, a_out, n_seq * o_in * 4, n_seq, proj,
                           n_seq * D * 4, act, act_bytes, impl);
    if (st != STRATA_OK) return st;
    if (L->bo)
        for (int64_t b = 0; b < n_seq; b++)
            for (int64_t i = 0; i < D; i++) proj[b * D + i] += L->bo[i];
    for (int64_t i = 0; i < n_seq * D; i++) x[i] += proj[i];

    return strata_step_ffn_input(pool, head, a, logits, impl);
}
