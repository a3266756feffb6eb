/*
 * Decoder glue: the small float32 steps between the matrix products of a CPU decode step
 * (RMSNorm, RoPE, KV-cache writes, the router's logits and top-k, grouping of (token, expert)
 * assignments), each one native call instead of a dozen torch ops; decode attention is attn.c's.
 *
 * Each function follows the torch formulation in strata/models (layers.py RMSNorm, rope.py
 * Rope.apply, attention.py attend_decode, moe.py Router.forward and RoutedExperts._packed_tokens);
 * the tests (tests/native/test_glue.py) hold them to it. This file does no allocation, starts no
 * threads and keeps no state; every dimension, stride and index is checked before any write.
 * The float32 matvec has an AVX2 kernel (glue_simd.h's dot products, shared with attention),
 * chosen per call from `impl` like the other kernels; the other steps are a microsecond or two of
 * scalar code that the compiler vectorises.
 */
#include "strata.h"
#include "kernels.h"
#include "quantize.h"
#include "pool.h"
#include "glue_simd.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Router probabilities live on the stack: at most this many experts. */
#define GLUE_MAX_EXPERTS 4096

static int mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }

/* ======================================================================================
 * RMSNorm
 * ====================================================================================== */

/* Sum of squares in double (each float square is exact in double), in 8 lanes then a fixed
 * reduction, so the result does not depend on how the compiler vectorises. */
static double sum_squares(const float *x, int64_t n) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += (double)x[i + l] * (double)x[i + l];
    for (; i < n; i++) lane[0] += (double)x[i] * (double)x[i];
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

int strata_glue_rmsnorm(const float *x, int64_t x_stride, int64_t n_tokens, int64_t n_groups, int64_t n,
                        const float *weight, float eps, float *out, int64_t out_stride) {
    int64_t width;
    if (n_tokens < 0 || n_groups < 0 || n < 1 || !mul_ok(n_groups, n, &width)) return STRATA_E_ARG;
    if (n_tokens == 0 || n_groups == 0) return STRATA_OK;
    if (!x || !out || !(eps >= 0.0f)) return STRATA_E_ARG;
    if (x_stride < width || out_stride < width) return STRATA_E_SIZE;
    int64_t last;
    if (!mul_ok(n_tokens - 1, x_stride > out_stride ? x_stride : out_stride, &last)) return STRATA_E_SIZE;
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t g = 0; g < n_groups; g++) {
            const float *xr = x + t * x_stride + g * n;
            float *o = out + t * out_stride + g * n;
            /* torch: weight * (x * rsqrt(mean(x^2) + eps)), each product rounded to float. */
            const float r = (float)(1.0 / sqrt(sum_squares(xr, n) / (double)n + (double)eps));
            if (weight)
                for (int64_t i = 0; i < n; i++) o[i] = weight[i] * (xr[i] * r);
            else  /* no weight: the bytes of a weight of ones */
                for (int64_t i = 0; i < n; i++) o[i] = xr[i] * r;
        }
    return STRATA_OK;
}

/* ======================================================================================
 * RoPE
 * ====================================================================================== */

int strata_glue_rope(float *x, int64_t x_stride, int64_t n_tokens, int64_t n_head, int64_t head_dim,
                     const float *cos_t, const float *sin_t, int64_t rope_dim, int neox) {
    int64_t width, last;
    if (n_tokens < 0 || n_head < 0 || head_dim < 1 || rope_dim < 0 || rope_dim > head_dim || rope_dim % 2 ||
        (neox != 0 && neox != 1) || !mul_ok(n_head, head_dim, &width))
        return STRATA_E_ARG;
    if (n_tokens == 0 || n_head == 0 || rope_dim == 0) return STRATA_OK;
    if (!x || !cos_t || !sin_t) return STRATA_E_ARG;
    if (x_stride < width || !mul_ok(n_tokens - 1, x_stride, &last)) return STRATA_E_SIZE;
    const int64_t half = rope_dim / 2;
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        for (int64_t h = 0; h < n_head; h++) {
            float *v = x + t * x_stride + h * head_dim;
            /* (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), products rounded before the sum as
             * torch's separate elementwise ops do (the build forbids contraction into FMA). */
            if (neox) {
                for (int64_t i = 0; i < half; i++) {
                    const float x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * c[i] - x2 * s[i];
                    v[i + half] = x2 * c[i] + x1 * s[i];
                }
            } else {
                for (int64_t i = 0; i < half; i++) {
                    const float x1 = v[2 * i], x2 = v[2 * i + 1];
                    v[2 * i] = x1 * c[i] - x2 * s[i];
                    v[2 * i + 1] = x2 * c[i] + x1 * s[i];
                }
            }
        }
    }
    return STRATA_OK;
}

int strata_glue_gate_softplus(float *x, int64_t x_len, const float *gate, int64_t gate_len, int64_t n_tokens,
                              int64_t n_groups, int64_t width) {
    int64_t n_gate, n_x;
    if (!x || !gate || n_tokens < 0 || n_groups < 0 || width < 1 || !mul_ok(n_tokens, n_groups, &n_gate) ||
        !mul_ok(n_gate, width, &n_x))
        return STRATA_E_ARG;
    if (x_len < n_x || gate_len < n_gate) return STRATA_E_SIZE;
    for (int64_t i = 0; i < n_gate; i++) {
        const float z = gate[i], s = z > 20.0f ? z : log1pf(expf(z));
        for (int64_t j = 0; j < width; j++) x[i * width + j] *= s;
    }
    return STRATA_OK;
}

/* ======================================================================================
 * KV cache: [S slots, Hkv, C positions, row], a row holding hd values in the cache's type:
 *   F32   hd floats;  F16, BF16  hd halves (round to nearest even, as torch converts);
 *   Q8_0  hd / 32 blocks of 34 bytes: half d; i8 qs[32]; x = d * q (llama.cpp's
 *         --cache-type-k/v q8_0; rounded as gguf-py's Q8_0, byte for byte).
 * ====================================================================================== */

static void put_f32(const float *restrict src, uint8_t *restrict dst, int64_t hd) {
    memcpy(dst, src, (size_t)hd * sizeof(float));
}
static void put_f16_ref(const float *restrict src, uint8_t *restrict dst, int64_t hd) {
    strata_convert_f16_ref(src, dst, hd);
}
static void put_bf16_ref(const float *restrict src, uint8_t *restrict dst, int64_t hd) {
    strata_convert_bf16_ref(src, dst, hd);
}
static void put_q8_0(const float *restrict src, uint8_t *restrict dst, int64_t hd) {
    strata_quantize_q8_0_blocks(src, dst, hd / STRATA_QK);
}
#ifdef GLUE_X86
static void put_f16_avx2(const float *restrict src, uint8_t *restrict dst, int64_t hd) {
    strata_convert_f16_avx2(src, dst, hd);
}
static void put_bf16_avx2(const float *restrict src, uint8_t *restrict dst, int64_t hd) {
    strata_convert_bf16_avx2(src, dst, hd);
}
#endif

int strata_kv_format(int32_t type, int64_t hd, int impl, kv_format *f) {
    const int avx2 = impl == STRATA_IMPL_AVX2 || impl == STRATA_IMPL_AVX512;
    if (hd < 1) return STRATA_E_ARG;
    switch (type) {
    case STRATA_T_F32: *f = (kv_format){hd * 4, hd, put_f32, NULL}; return STRATA_OK;
    case STRATA_T_F16:
        *f = (kv_format){hd * 2, hd, put_f16_ref, avx2 ? strata_dequant_f16_avx2 : strata_dequant_f16_ref};
        break;
    case STRATA_T_BF16:
        *f = (kv_format){hd * 2, hd, put_bf16_ref, avx2 ? strata_dequant_bf16_avx2 : strata_dequant_bf16_ref};
        break;
    case STRATA_T_Q8_0:
        if (hd % STRATA_QK) return STRATA_E_BLOCK;
        *f = (kv_format){hd / STRATA_QK * (int64_t)sizeof(strata_block_q8_0), hd / STRATA_QK, put_q8_0,
                         avx2 ? strata_dequant_q8_0_avx2 : strata_dequant_q8_0_ref};
        return STRATA_OK;
    default: return STRATA_E_TYPE;
    }
#ifdef GLUE_X86
    if (avx2) f->put = type == STRATA_T_F16 ? put_f16_avx2 : put_bf16_avx2;  /* equal to the _ref bit for bit */
#endif
    return STRATA_OK;
}

int strata_kv_cache_shape(int64_t n_slots, int64_t n_head_kv, int64_t n_cache_ctx, int64_t row_bytes,
                          int64_t *head_bytes, int64_t *cache_bytes) {
    int64_t a;
    if (n_slots < 1 || n_head_kv < 1 || n_cache_ctx < 1 || row_bytes < 1) return STRATA_E_ARG;
    if (!mul_ok(n_cache_ctx, row_bytes, head_bytes) || !mul_ok(*head_bytes, n_head_kv, &a) ||
        !mul_ok(a, n_slots, cache_bytes))
        return STRATA_E_SIZE;
    return STRATA_OK;
}

int strata_glue_kv_write(const float *k, int64_t k_stride, const float *v, int64_t v_stride, int64_t n_tokens,
                         int64_t n_head_kv, int64_t head_dim, float *k_cache, float *v_cache, int64_t n_slots,
                         int64_t n_cache_ctx, const int64_t *slots, const int64_t *positions) {
    return strata_glue_kv_write_typed(STRATA_T_F32, k, k_stride, v, v_stride, n_tokens, n_head_kv, head_dim, k_cache,
                                      v_cache, n_slots, n_cache_ctx, slots, positions, STRATA_IMPL_AUTO);
}

int strata_glue_kv_write_typed(int32_t kv_type, const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                               int64_t n_tokens, int64_t n_head_kv, int64_t head_dim, void *k_cache, void *v_cache,
                               int64_t n_slots, int64_t n_cache_ctx, const int64_t *slots, const int64_t *positions,
                               int impl) {
    int64_t head_bytes, cache_bytes, last;
    kv_format f;
    int st = strata_resolve_impl(impl, &impl);
    if (st || (st = strata_kv_format(kv_type, head_dim, impl, &f))) return st;
    if ((st = strata_kv_cache_shape(n_slots, n_head_kv, n_cache_ctx, f.row_bytes, &head_bytes, &cache_bytes))) return st;
    if (n_tokens < 0) return STRATA_E_ARG;
    if (n_tokens == 0) return STRATA_OK;
    if (!k || !v || !k_cache || !v_cache || !slots || !positions) return STRATA_E_ARG;
    const int64_t width = n_head_kv * head_dim;
    if (k_stride < width || v_stride < width || !mul_ok(n_tokens - 1, k_stride > v_stride ? k_stride : v_stride, &last))
        return STRATA_E_SIZE;
    for (int64_t t = 0; t < n_tokens; t++)  /* check every index before the first write */
        if (slots[t] < 0 || slots[t] >= n_slots || positions[t] < 0 || positions[t] >= n_cache_ctx)
            return STRATA_E_SIZE;
    uint8_t *kc = (uint8_t *)k_cache, *vc = (uint8_t *)v_cache;
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t g = 0; g < n_head_kv; g++) {
            const int64_t at = (slots[t] * n_head_kv + g) * head_bytes + positions[t] * f.row_bytes;
            f.put(k + t * k_stride + g * head_dim, kc + at, head_dim);
            f.put(v + t * v_stride + g * head_dim, vc + at, head_dim);
        }
    return STRATA_OK;
}


/* ======================================================================================
 * Small float32 products (the router's logits)
 * ====================================================================================== */

/* The rows of a float32 product as pool items: item i is rows [4 m i, 4 m (i + 1)) for every token
 * (whole groups of 4, as scores_avx2 takes them, so the bytes do not depend on the split). */
typedef struct {
    const float *x, *w;
    float *y;
    int64_t x_stride, n_tokens, n, n_rows, chunk;
    int impl;
} matvec_job;

static void matvec_items(void *ctx, int64_t first, int64_t count) {
    const matvec_job *J = ctx;
    for (int64_t i = first; i < first + count; i++) {
        const int64_t r0 = i * J->chunk, r1 = r0 + J->chunk < J->n_rows ? r0 + J->chunk : J->n_rows;
        for (int64_t t = 0; t < J->n_tokens; t++) {
            const float *xt = J->x + t * J->x_stride;
            float *yt = J->y + t * J->n_rows;
#ifdef GLUE_X86
            if (J->impl != STRATA_IMPL_SCALAR) {
                scores_avx2(xt, J->w + r0 * J->n, r1 - r0, J->n, 1.0f, yt + r0);
                continue;
            }
#endif
            for (int64_t r = r0; r < r1; r++) yt[r] = dot_ref(xt, J->w + r * J->n, J->n);
        }
    }
}

int strata_matvec_pooled(strata_pool *pool, const float *x, int64_t x_stride, int64_t n_tokens, int64_t n,
                         const float *w, int64_t n_rows, float *y, int impl) {
    int64_t last;
    if (n_tokens < 0 || n < 0 || n_rows < 0) return STRATA_E_ARG;
    int st = strata_resolve_impl(impl, &impl);
    if (st) return st;
    if (n_tokens == 0 || n_rows == 0) return STRATA_OK;
    if (!x || !y || (n && !w)) return STRATA_E_ARG;
    if (x_stride < n || !mul_ok(n_tokens - 1, x_stride, &last) || !mul_ok(n_rows, n, &last) ||
        !mul_ok(n_tokens, n_rows, &last))
        return STRATA_E_SIZE;
    /* The pool where the product's reads outweigh waking it (64 K weights): two items per thread;
     * else one item of every row. */
    const int64_t threads = pool && n_rows * n >= (1 << 16) ? strata_pool_threads(pool) : 1;
    const int64_t groups = (n_rows + 3) / 4, per = (groups + 2 * threads - 1) / (2 * threads);
    matvec_job J = {x, w, y, x_stride, n_tokens, n, n_rows, threads > 1 ? 4 * per : n_rows, impl};
    strata_pool_run(threads > 1 ? pool : NULL, (n_rows + J.chunk - 1) / J.chunk, 1, matvec_items, &J);
    return STRATA_OK;
}

int strata_glue_matvec(const float *x, int64_t x_stride, int64_t n_tokens, int64_t n, const float *w, int64_t n_rows,
                       float *y, int impl) {
    return strata_matvec_pooled(NULL, x, x_stride, n_tokens, n, w, n_rows, y, impl);
}

/* ======================================================================================
 * Router: probabilities, top-k, renormalisation
 * ====================================================================================== */

int strata_glue_route(const float *logits, int64_t n_tokens, int64_t n_experts, int64_t k, int gating, int norm,
                      float scale, int64_t *expert_ids, float *weights) {
    return strata_glue_route_groups(logits, n_tokens, n_experts, k, gating, norm, scale, NULL, 0, 0, 0, expert_ids,
                                    weights);
}

int strata_glue_route_groups(const float *logits, int64_t n_tokens, int64_t n_experts, int64_t k, int gating,
                             int norm, float scale, const float *selection_bias, int64_t n_groups,
                             int64_t n_groups_used, int group_top, int64_t *expert_ids, float *weights) {
    if (n_tokens < 0 || n_experts < 1 || n_experts > GLUE_MAX_EXPERTS || k < 1 || k > n_experts ||
        (gating != STRATA_GATING_SOFTMAX && gating != STRATA_GATING_SIGMOID &&
         gating != STRATA_GATING_SOFTMAX_WEIGHT) || (norm != 0 && norm != 1) || !isfinite(scale))
        return STRATA_E_ARG;
    const int grouped = n_groups > 1;
    if (grouped && (n_experts % n_groups || n_groups_used < 1 || n_groups_used >= n_groups || group_top < 1 ||
                    group_top > n_experts / n_groups || gating == STRATA_GATING_SOFTMAX_WEIGHT))
        return STRATA_E_ARG;
    if (n_tokens == 0) return STRATA_OK;
    if (!logits || !expert_ids || !weights) return STRATA_E_ARG;
    const int64_t per_group = grouped ? n_experts / n_groups : n_experts;
    float p[GLUE_MAX_EXPERTS], r[GLUE_MAX_EXPERTS], score[GLUE_MAX_EXPERTS];
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *lg = logits + t * n_experts;
        int64_t *ids = expert_ids + t * k;
        float *w = weights + t * k;
        if (gating == STRATA_GATING_SOFTMAX) {  /* torch: exp(x - max) * (1 / sum) */
            float mx = lg[0];
            for (int64_t e = 1; e < n_experts; e++) mx = lg[e] > mx ? lg[e] : mx;
            double sum = 0.0;
            for (int64_t e = 0; e < n_experts; e++) sum += (p[e] = expf(lg[e] - mx));
            const float inv = (float)(1.0 / sum);
            for (int64_t e = 0; e < n_experts; e++) p[e] *= inv;
        } else if (gating == STRATA_GATING_SIGMOID) {
            for (int64_t e = 0; e < n_experts; e++) p[e] = 1.0f / (1.0f + expf(-lg[e]));
        } else {
            for (int64_t e = 0; e < n_experts; e++) p[e] = lg[e];
        }
        /* What the experts are ranked by: the probabilities, plus the selection bias (DeepSeek-V3). */
        for (int64_t e = 0; e < n_experts; e++) r[e] = selection_bias ? p[e] + selection_bias[e] : p[e];
        if (grouped) {  /* keep the n_groups_used groups of the best scores (sum of their group_top best) */
            for (int64_t g = 0; g < n_groups; g++) {
                float best[GLUE_MAX_EXPERTS];  /* the group's group_top largest, descending */
                int64_t nb = 0;
                for (int64_t e = g * per_group; e < (g + 1) * per_group; e++) {
                    int64_t i;
                    if (r[e] != r[e]) continue;  /* NaN */
                    if (nb < group_top) i = nb++;
                    else if (r[e] > best[group_top - 1]) i = group_top - 1;
                    else continue;
                    for (; i > 0 && r[e] > best[i - 1]; i--) best[i] = best[i - 1];
                    best[i] = r[e];
                }
                float sc = 0.0f;
                for (int64_t i = 0; i < nb; i++) sc += best[i];
                score[g] = nb == group_top ? sc : NAN;
            }
            for (int64_t g = 0; g < n_groups; g++) {  /* groups ranked ahead: larger score, or equal and lower index */
                int64_t ahead = 0;
                for (int64_t h = 0; h < n_groups; h++)
                    ahead += score[h] > score[g] || (score[h] == score[g] && h < g) ||
                             (score[g] != score[g] && score[h] == score[h]);
                if (ahead >= n_groups_used)
                    for (int64_t e = g * per_group; e < (g + 1) * per_group; e++) r[e] = -INFINITY;
            }
        }
        /* Insertion into a descending list of k: a later expert enters only when strictly
         * larger, so equal values keep the lower expert id first. NaN and -inf (a dropped group)
         * never enter; any slot left over gets id -1. */
        float top[GLUE_MAX_EXPERTS];
        for (int64_t i = 0; i < k; i++) { top[i] = -INFINITY; ids[i] = -1; }
        for (int64_t e = 0; e < n_experts; e++) {
            if (!(r[e] > top[k - 1])) continue;
            int64_t i = k - 1;
            for (; i > 0 && r[e] > top[i - 1]; i--) { top[i] = top[i - 1]; ids[i] = ids[i - 1]; }
            top[i] = r[e];
            ids[i] = e;
        }
        if (ids[k - 1] < 0) return STRATA_E_ARG;  /* NaN logits: fewer than k finite choices */
        for (int64_t i = 0; i < k; i++) w[i] = p[ids[i]];  /* weighed by probability, not rank */
        if (gating == STRATA_GATING_SOFTMAX_WEIGHT) {  /* softmax over the k chosen (w[0] is their max) */
            const float mx = w[0];
            float sum = 0.0f;
            for (int64_t i = 0; i < k; i++) sum += (w[i] = expf(w[i] - mx));
            for (int64_t i = 0; i < k; i++) w[i] = w[i] / sum;
        }
        if (norm) {
            float sum = 0.0f;
            for (int64_t i = 0; i < k; i++) sum += w[i];
            for (int64_t i = 0; i < k; i++) w[i] = w[i] / sum;
        }
        if (scale != 1.0f)
            for (int64_t i = 0; i < k; i++) w[i] = w[i] * scale;
    }
    return STRATA_OK;
}

/* ======================================================================================
 * Grouping of (token, expert) assignments by expert
 * ====================================================================================== */

int strata_glue_group(const int64_t *expert_ids, const float *weights, int64_t n_tokens, int64_t k,
                      int64_t n_experts, int32_t *used, int64_t *offsets, int32_t *token_ids,
                      float *weights_sorted, int64_t *n_used) {
    return strata_glue_group_owned(expert_ids, weights, n_tokens, k, n_experts, NULL, used, offsets, token_ids,
                                   weights_sorted, n_used);
}

int strata_glue_group_owned(const int64_t *expert_ids, const float *weights, int64_t n_tokens, int64_t k,
                            int64_t n_experts, const uint8_t *owned, int32_t *used, int64_t *offsets,
                            int32_t *token_ids, float *weights_sorted, int64_t *n_used) {
    int64_t n_assign;
    if (n_tokens < 0 || k < 1 || n_experts < 1 || n_experts > INT32_MAX || !mul_ok(n_tokens, k, &n_assign) ||
        n_tokens > INT32_MAX)
        return STRATA_E_ARG;
    if (!used || !offsets || !n_used || (n_assign && (!expert_ids || !weights || !token_ids || !weights_sorted)))
        return STRATA_E_ARG;
    for (int64_t a = 0; a < n_assign; a++)
        if (expert_ids[a] < 0 || expert_ids[a] >= n_experts) return STRATA_E_SIZE;
    /* Counting sort, stable. offsets[e + 1] = count of e; the running sums make offsets[e] the
     * start of e, which the scatter advances to e's end (= the start of e + 1). */
    memset(offsets, 0, (size_t)(n_experts + 1) * sizeof(int64_t));
    for (int64_t a = 0; a < n_assign; a++) offsets[expert_ids[a] + 1] += !owned || owned[expert_ids[a]];
    for (int64_t e = 0; e < n_experts; e++) offsets[e + 1] += offsets[e];
    const int64_t n_kept = offsets[n_experts];
    for (int64_t a = 0; a < n_assign; a++) {
        if (owned && !owned[expert_ids[a]]) continue;
        const int64_t at = offsets[expert_ids[a]]++;
        token_ids[at] = (int32_t)(a / k);
        weights_sorted[at] = weights[a];
    }
    /* Now offsets[e] = end of e. Keep the experts that own assignments, in place: entry j is
     * written only after entries >= j were read. */
    int64_t n = 0, prev = 0;
    for (int64_t e = 0; e < n_experts; e++) {
        const int64_t end = offsets[e];
        if (end > prev) {
            used[n] = (int32_t)e;
            offsets[n++] = prev;
            prev = end;
        }
    }
    offsets[n] = n_kept;
    *n_used = n;
    return STRATA_OK;
}
