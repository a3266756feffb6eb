/*
 * Decoder glue: the small float32 steps between the matrix products of a CPU decode step
 * (RMSNorm, RoPE, KV-cache writes, decode attention, the router's logits and top-k, grouping of
 * (token, expert) assignments), each one native call instead of a dozen torch ops.
 *
 * Each function follows the torch formulation in strata/models (layers.py RMSNorm, rope.py
 * Rope.apply, attention.py attend_decode, moe.py Router.forward and RoutedExperts._packed_tokens);
 * the tests (tests/native/test_glue.py) hold them to it. This file does no allocation, starts no
 * threads and keeps no state; every dimension, stride and index is checked before any write.
 * Decode attention and the float32 matvec have AVX2 kernels (their dot products and exponentials
 * are the bulk of the work here), chosen per call from `impl` like the other kernels; the other
 * steps are a microsecond or two of scalar code that the compiler vectorises.
 */
#include "strata.h"
#include "kernels.h"
#include "quantize.h"
#include "pool.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GLUE_X86 1
#endif

/* Positions scored per pass of decode attention: scores live on the stack; a longer context
 * runs in passes joined by the usual online-softmax rescaling. */
#define GLUE_ATTN_CHUNK 256
/* Query heads of one kv head taken through the cache together (their scores on the stack). */
#define GLUE_ATTN_GROUP 8
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

/* ======================================================================================
 * KV cache: [S slots, Hkv, C positions, row], a row holding hd values in the cache's type:
 *   F32   hd floats;  F16, BF16  hd halves (round to nearest even, as torch converts);
 *   Q8_0  hd / 32 blocks of 34 bytes: half d; i8 qs[32]; x = d * q (llama.cpp's
 *         --cache-type-k/v q8_0; rounded as gguf-py's Q8_0, byte for byte).
 * ====================================================================================== */

typedef void (*kv_put_fn)(const float *restrict src, uint8_t *restrict dst, int64_t hd);

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

/* How rows of hd values are stored in a cache of `type`: bytes per row, the writer, and the
 * reader (NULL for F32, whose rows attention reads in place) with its blocks per row. */
typedef struct {
    int64_t row_bytes, row_blocks;
    kv_put_fn put;
    strata_block_fn to_f32;
} kv_format;

static int kv_format_for(int32_t type, int64_t hd, int impl, kv_format *f) {
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

/* Common checks of a cache shape; *head_bytes = C * row_bytes, *cache_bytes = S * Hkv * C * row_bytes. */
static int cache_shape(int64_t n_slots, int64_t n_head_kv, int64_t n_cache_ctx, int64_t row_bytes,
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
    if (st || (st = kv_format_for(kv_type, head_dim, impl, &f))) return st;
    if ((st = cache_shape(n_slots, n_head_kv, n_cache_ctx, f.row_bytes, &head_bytes, &cache_bytes))) return st;
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
 * Decode attention: one query row per sequence against its cached keys 0..n_ctx-1
 * ====================================================================================== */

/* Rows converted to float32 per call (a cache not in F32) live on the stack: this many floats,
 * so head_dim <= GLUE_KV_BUF / 4 for such caches. */
#define GLUE_KV_BUF 4096

/* One query head's view of the paged cache: position j's key row is at byte
 * k + table[j / block] * block_bytes + (j % block) * row_bytes (and its value row alike), where k
 * and v point at this kv head's rows in block 0. Every table entry below n_ctx was checked by the
 * caller. A cache not in F32 is read `cap` rows at a time through to_f32 into a stack buffer. */
typedef struct {
    const float *q;           /* [hd] */
    const uint8_t *k, *v;     /* block 0 of this query's kv head */
    const int64_t *table;     /* [ceil(n_ctx / block)] blocks of the sequence */
    float *out;               /* [hd] */
    int64_t n_ctx, hd, block, block_bytes, row_bytes;
    float scale;
    int64_t start;            /* first position attended (a sliding window's start; else 0) */
    const float *sink;        /* this head's sink logit (one more softmax column, no value), or NULL */
    strata_block_fn to_f32;   /* NULL: F32 rows, read in place */
    int64_t row_blocks, cap;  /* to_f32's blocks per row; rows per conversion (a multiple of 4 when >= 4) */
} attn_head;

/* Fold the sink logit into a head's running softmax (max m, sum l, unnormalised out). */
static inline void fold_sink(const attn_head *a, float *m, float *l, float *out) {
    if (!a->sink) return;
    const float sk = *a->sink;
    if (sk > *m) {
        const float f = expf(*m - sk);
        *l *= f;
        for (int64_t i = 0; i < a->hd; i++) out[i] *= f;
        *m = sk;
    }
    *l += expf(sk - *m);
}

/* Rows j..j+n-1 of a head lie in one block when they do not cross a multiple of `block`; a
 * converted cache takes at most `cap` of them at once. */
static inline int64_t run_len(const attn_head *a, int64_t j, int64_t end) {
    const int64_t left = a->block - j % a->block;
    const int64_t n = end - j < left ? end - j : left;
    return a->to_f32 && n > a->cap ? a->cap : n;
}

static inline int64_t row_at(const attn_head *a, int64_t j) {
    return a->table[j / a->block] * a->block_bytes + (j % a->block) * a->row_bytes;
}

/* Rows j..j+n-1 (one run) of `base` (a->k or a->v) as float32: in place, or converted into buf. */
static inline const float *rows_f32(const attn_head *a, const uint8_t *base, int64_t j, int64_t n, float *buf) {
    const uint8_t *p = base + row_at(a, j);
    if (!a->to_f32) return (const float *)p;
    a->to_f32(p, buf, n * a->row_blocks);
    return buf;
}

/* Eight partial sums (lane i % 8), so the compiler can vectorise without reassociating. */
static float dot_ref(const float *a, const float *b, int64_t n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += a[i + l] * b[i + l];
    for (; i < n; i++) lane[0] += a[i] * b[i];
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

/* Softmax(scale q.k_j) weighted sum of v_j. Scores are taken GLUE_ATTN_CHUNK positions at a
 * time; after the first pass, a larger running maximum rescales the sum and the output so far
 * (one pass, the plain max-subtracted softmax, up to GLUE_ATTN_CHUNK positions). */
static void attn_head_ref(const attn_head *a) {
    /* Locals, not a->...: with -fno-strict-aliasing a store to out[i] could change *a, which
     * would keep the compiler from vectorising the loops. */
    const float *restrict q = a->q;
    float *restrict out = a->out;
    const int64_t n_ctx = a->n_ctx, hd = a->hd;
    float s[GLUE_ATTN_CHUNK], buf[GLUE_KV_BUF];
    float m = -INFINITY, l = 0.0f;
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t j0 = a->start; j0 < n_ctx; j0 += GLUE_ATTN_CHUNK) {
        const int64_t nj = n_ctx - j0 < GLUE_ATTN_CHUNK ? n_ctx - j0 : GLUE_ATTN_CHUNK;
        float cm = -INFINITY;
        for (int64_t j = j0, n; j < j0 + nj; j += n) {
            n = run_len(a, j, j0 + nj);
            const float *k = rows_f32(a, a->k, j, n, buf);
            for (int64_t r = 0; r < n; r++) {
                const float sj = dot_ref(q, k + r * hd, hd) * a->scale;
                s[j - j0 + r] = sj;
                cm = sj > cm ? sj : cm;
            }
        }
        if (cm > m) {
            if (l > 0.0f) {
                const float f = expf(m - cm);
                l *= f;
                for (int64_t i = 0; i < hd; i++) out[i] *= f;
            }
            m = cm;
        }
        for (int64_t j = j0, n; j < j0 + nj; j += n) {
            n = run_len(a, j, j0 + nj);
            const float *v = rows_f32(a, a->v, j, n, buf);
            for (int64_t r = 0; r < n; r++) {
                const float p = expf(s[j - j0 + r] - m);
                const float *restrict vr = v + r * hd;
                l += p;
                for (int64_t i = 0; i < hd; i++) out[i] += p * vr[i];
            }
        }
    }
    fold_sink(a, &m, &l, out);
    const float inv = 1.0f / l;
    for (int64_t i = 0; i < hd; i++) out[i] *= inv;
}

#ifdef GLUE_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x <= 0 (Cephes' expf: x = n ln2 + r, a degree-5 polynomial in r, times 2^n), within
 * 2 ulp; inputs below -87.3 give about 1e-38 instead of a subnormal or 0. */
static inline __m256 exp256_nonpos(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float d = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) d += a[i] * b[i];
    return d;
}

/* out[i] *= f */
static void scale_avx2(float *out, float f, int64_t n) {
    const __m256 fv = _mm256_set1_ps(f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(fv, _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] *= f;
}

/* s[j] = scale * q . k[j] for n key rows of hd. Four rows at a time share each load of q, and their
 * four horizontal sums are done together. */
static void scores_avx2(const float *q, const float *k, int64_t n, int64_t hd, float scale, float *s) {
    const int64_t hd8 = hd & ~(int64_t)7;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + j * hd, *k1 = k0 + hd, *k2 = k1 + hd, *k3 = k2 + hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int64_t i = 0; i < hd8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
        }
        /* hadd twice: lane r of each 128-bit half holds half of row r's sum. */
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 d = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        if (hd8 < hd) {
            float t[4] = {0, 0, 0, 0};
            for (int64_t i = hd8; i < hd; i++) {
                t[0] += q[i] * k0[i]; t[1] += q[i] * k1[i]; t[2] += q[i] * k2[i]; t[3] += q[i] * k3[i];
            }
            d = _mm_add_ps(d, _mm_loadu_ps(t));
        }
        _mm_storeu_ps(s + j, _mm_mul_ps(d, _mm_set1_ps(scale)));
    }
    for (; j < n; j++) s[j] = dot_avx2(q, k + j * hd, hd) * scale;
}

/* out[i] += sum_j p[j] v[j][i] for n value rows of hd: 64 columns at a time stay in registers
 * while every row streams past. */
static void weighted_sum_avx2(const float *p, const float *v, int64_t n, int64_t hd, float *out) {
    int64_t c = 0;
    for (; c + 64 <= hd; c += 64) {
        __m256 acc[8];
        for (int r = 0; r < 8; r++) acc[r] = _mm256_loadu_ps(out + c + 8 * r);
        for (int64_t j = 0; j < n; j++) {
            const __m256 pj = _mm256_set1_ps(p[j]);
            const float *vr = v + j * hd + c;
            for (int r = 0; r < 8; r++) acc[r] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8 * r), acc[r]);
        }
        for (int r = 0; r < 8; r++) _mm256_storeu_ps(out + c + 8 * r, acc[r]);
    }
    for (; c + 8 <= hd; c += 8) {
        __m256 acc = _mm256_loadu_ps(out + c);
        for (int64_t j = 0; j < n; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * hd + c), acc);
        _mm256_storeu_ps(out + c, acc);
    }
    for (; c < hd; c++) {
        float acc = out[c];
        for (int64_t j = 0; j < n; j++) acc += p[j] * v[j * hd + c];
        out[c] = acc;
    }
}

/* Heads a..a+G-1 (consecutive query heads of one sequence reading the same kv head: q, out and
 * sink step by one head) in one pass over their rows, so each run of keys and values is read (and
 * converted) once for the group and stays in L1 for the others. Each head's sums are the one-head
 * kernel's, in the same order: the bytes do not depend on how heads are grouped. */
static void attn_heads_avx2(const attn_head *a, int64_t G) {
    float s[GLUE_ATTN_GROUP][GLUE_ATTN_CHUNK], buf[GLUE_KV_BUF], m[GLUE_ATTN_GROUP], l[GLUE_ATTN_GROUP];
    const int64_t hd = a->hd;
    for (int64_t g = 0; g < G; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
        memset(a->out + g * hd, 0, (size_t)hd * sizeof(float));
    }
    for (int64_t j0 = a->start; j0 < a->n_ctx; j0 += GLUE_ATTN_CHUNK) {
        const int64_t nj = a->n_ctx - j0 < GLUE_ATTN_CHUNK ? a->n_ctx - j0 : GLUE_ATTN_CHUNK;
        /* Runs of rows inside one block; with blocks of a multiple of 4 positions that divide the
         * chunk, the runs group rows four by four as one contiguous region would. */
        for (int64_t j = j0, n; j < j0 + nj; j += n) {
            n = run_len(a, j, j0 + nj);
            const float *k = rows_f32(a, a->k, j, n, buf);
            for (int64_t g = 0; g < G; g++) scores_avx2(a->q + g * hd, k, n, hd, a->scale, s[g] + (j - j0));
        }
        for (int64_t g = 0; g < G; g++) {
            float cm = -INFINITY, *sg = s[g];
            for (int64_t j = 0; j < nj; j++) cm = sg[j] > cm ? sg[j] : cm;
            if (cm > m[g]) {
                if (l[g] > 0.0f) {
                    const float f = expf(m[g] - cm);
                    l[g] *= f;
                    scale_avx2(a->out + g * hd, f, hd);
                }
                m[g] = cm;
            }
            int64_t j = 0;
            __m256 lv = _mm256_setzero_ps();
            for (; j + 8 <= nj; j += 8) {
                const __m256 p = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(sg + j), _mm256_set1_ps(m[g])));
                _mm256_storeu_ps(sg + j, p);
                lv = _mm256_add_ps(lv, p);
            }
            l[g] += hsum256(lv);
            for (; j < nj; j++) {
                sg[j] = expf(sg[j] - m[g]);
                l[g] += sg[j];
            }
        }
        for (int64_t j = j0, n; j < j0 + nj; j += n) {  /* the same sums in the same order, run by run */
            n = run_len(a, j, j0 + nj);
            const float *v = rows_f32(a, a->v, j, n, buf);
            for (int64_t g = 0; g < G; g++) weighted_sum_avx2(s[g] + (j - j0), v, n, hd, a->out + g * hd);
        }
    }
    for (int64_t g = 0; g < G; g++) {
        attn_head h = *a;
        h.out += g * hd, h.sink = a->sink ? a->sink + g : NULL;
        fold_sink(&h, &m[g], &l[g], h.out);
        scale_avx2(h.out, 1.0f / l[g], hd);
    }
}

#pragma GCC pop_options
#endif

int strata_glue_attn_decode(const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head, int64_t n_head_kv,
                            int64_t head_dim, const float *k_cache, const float *v_cache, int64_t n_blocks,
                            int64_t block_size, const int64_t *block_table, int64_t table_stride,
                            const int64_t *n_ctx, float scale, float *out, int64_t out_stride, int impl) {
    return strata_glue_attn_decode_typed(STRATA_T_F32, q, q_stride, n_seq, n_head, n_head_kv, head_dim, k_cache,
                                         v_cache, n_blocks, block_size, block_table, table_stride, n_ctx, scale, NULL,
                                         0, out, out_stride, impl);
}

int strata_glue_attn_decode_sinks(const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head,
                                  int64_t n_head_kv, int64_t head_dim, const float *k_cache, const float *v_cache,
                                  int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                                  int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                                  int64_t window, float *out, int64_t out_stride, int impl) {
    return strata_glue_attn_decode_typed(STRATA_T_F32, q, q_stride, n_seq, n_head, n_head_kv, head_dim, k_cache,
                                         v_cache, n_blocks, block_size, block_table, table_stride, n_ctx, scale, sinks,
                                         window, out, out_stride, impl);
}

/* The reference kernel one head at a time. */
static void attn_heads_ref(const attn_head *a, int64_t G) {
    for (int64_t g = 0; g < G; g++) {
        attn_head h = *a;
        h.q += g * a->hd, h.out += g * a->hd, h.sink = a->sink ? a->sink + g : NULL;
        attn_head_ref(&h);
    }
}

/* One decode attention's heads as pool items (item b * n_head + h: sequence b, head h). A range of
 * items runs its heads that share a kv head together, up to GLUE_ATTN_GROUP at once. */
typedef struct {
    void (*heads_fn)(const attn_head *, int64_t);
    const float *q, *sinks;
    const uint8_t *kc, *vc;
    const int64_t *block_table, *n_ctx;
    float *out;
    int64_t q_stride, out_stride, table_stride, n_head, group, head_dim, block_size, block_bytes, window, chunk, cap;
    kv_format f;
    float scale;
} attn_job;

static void attn_items(void *ctx, int64_t first, int64_t count) {
    const attn_job *J = ctx;
    for (int64_t i = first, G; i < first + count; i += G) {
        const int64_t b = i / J->n_head, h = i % J->n_head, n = J->n_ctx[b];
        const int64_t end = (h / J->group + 1) * J->group, left = first + count - i;  /* this kv head's last + 1 */
        G = end - h < left ? end - h : left;
        G = G < GLUE_ATTN_GROUP ? G : GLUE_ATTN_GROUP;
        const int64_t at = (h / J->group) * J->block_size * J->f.row_bytes;  /* the kv head's rows in a block */
        const int64_t start = J->chunk ? (n - 1) / J->chunk * J->chunk : J->window && n > J->window ? n - J->window : 0;
        const attn_head a = {J->q + b * J->q_stride + h * J->head_dim, J->kc + at, J->vc + at,
                             J->block_table + b * J->table_stride, J->out + b * J->out_stride + h * J->head_dim, n,
                             J->head_dim, J->block_size, J->block_bytes, J->f.row_bytes, J->scale, start,
                             J->sinks ? J->sinks + h : NULL,
                             J->f.to_f32, J->f.row_blocks, J->cap};
        J->heads_fn(&a, G);
    }
}

int strata_attn_decode_pooled(strata_pool *pool, int32_t kv_type, const float *q, int64_t q_stride, int64_t n_seq,
                              int64_t n_head, int64_t n_head_kv, int64_t head_dim, const void *k_cache,
                              const void *v_cache, int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                              int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                              int64_t window, int64_t chunk, float *out, int64_t out_stride, int impl) {
    int64_t block_bytes, cache_bytes, width, last, max_ctx;
    kv_format f;
    int st = strata_resolve_impl(impl, &impl);
    if (st || (st = kv_format_for(kv_type, head_dim, impl, &f))) return st;
    if (f.to_f32 && head_dim > GLUE_KV_BUF / 4) return STRATA_E_SIZE;
    if ((st = cache_shape(n_blocks, n_head_kv, block_size, f.row_bytes, &block_bytes, &cache_bytes))) return st;
    block_bytes *= n_head_kv;  /* cache_shape gave one head's P rows */
    if (n_seq < 0 || n_head < 1 || n_head % n_head_kv || table_stride < 1 || !isfinite(scale) || window < 0 ||
        chunk < 0 || (window && chunk))
        return STRATA_E_ARG;
    if (n_seq == 0) return STRATA_OK;
    if (!q || !k_cache || !v_cache || !block_table || !n_ctx || !out) return STRATA_E_ARG;
    if (!mul_ok(n_head, head_dim, &width) || q_stride < width || out_stride < width ||
        !mul_ok(n_seq - 1, q_stride > out_stride ? q_stride : out_stride, &last) ||
        !mul_ok(n_seq, table_stride, &last) || !mul_ok(table_stride, block_size, &max_ctx))
        return STRATA_E_SIZE;
    int64_t positions = 0;  /* positions read over all sequences: the work */
    for (int64_t b = 0; b < n_seq; b++) {  /* every length and every block read, before any work */
        if (n_ctx[b] < 1 || n_ctx[b] > max_ctx) return STRATA_E_SIZE;
        const int64_t *table = block_table + b * table_stride;
        for (int64_t i = 0; i < (n_ctx[b] + block_size - 1) / block_size; i++)
            if (table[i] < 0 || table[i] >= n_blocks) return STRATA_E_SIZE;
        positions += chunk ? (n_ctx[b] - 1) % chunk + 1 : window && n_ctx[b] > window ? window : n_ctx[b];
    }
    attn_job J = {.heads_fn = attn_heads_ref, .q = q, .sinks = sinks, .kc = (const uint8_t *)k_cache,
                  .vc = (const uint8_t *)v_cache, .block_table = block_table, .n_ctx = n_ctx, .out = out,
                  .q_stride = q_stride, .out_stride = out_stride, .table_stride = table_stride, .n_head = n_head,
                  .group = n_head / n_head_kv, .head_dim = head_dim, .block_size = block_size,
                  .block_bytes = block_bytes, .window = window, .chunk = chunk, .f = f, .scale = scale};
#ifdef GLUE_X86
    if (impl != STRATA_IMPL_SCALAR) J.heads_fn = attn_heads_avx2;  /* AVX-512 runs the AVX2 kernel */
#endif
    /* Rows per conversion: a multiple of 4, so the AVX2 scores group rows as over float32 rows. */
    J.cap = GLUE_KV_BUF / head_dim >= 4 ? GLUE_KV_BUF / head_dim / 4 * 4 : GLUE_KV_BUF / head_dim;
    /* Each head is computed whole by one thread, so the bytes do not depend on the split; the pool
     * only where the work outweighs waking it (256 K position-features over every head). */
    const int64_t items = n_seq * n_head;
    int64_t work;
    const int pooled = pool && items > 1 && mul_ok(positions, width, &work) && work >= (1 << 18);
    strata_pool_run(pooled ? pool : NULL, items, 1, attn_items, &J);
    return STRATA_OK;
}

int strata_glue_attn_decode_typed(int32_t kv_type, const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head,
                                  int64_t n_head_kv, int64_t head_dim, const void *k_cache, const void *v_cache,
                                  int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                                  int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                                  int64_t window, float *out, int64_t out_stride, int impl) {
    return strata_attn_decode_pooled(NULL, kv_type, q, q_stride, n_seq, n_head, n_head_kv, head_dim, k_cache, v_cache,
                                     n_blocks, block_size, block_table, table_stride, n_ctx, scale, sinks, window, 0,
                                     out, out_stride, impl);
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
    for (int64_t a = 0; a < n_assign; a++) offsets[expert_ids[a] + 1]++;
    for (int64_t e = 0; e < n_experts; e++) offsets[e + 1] += offsets[e];
    for (int64_t a = 0; a < n_assign; a++) {
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
    offsets[n] = n_assign;
    *n_used = n;
    return STRATA_OK;
}
