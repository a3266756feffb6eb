/*
 * Internal: the float32 dot products that decode attention (attn.c) and the router's product
 * (glue.c) share, and the KV cache's row formats (written by glue.c's kv_write, read by attn.c).
 * Each dot product has a portable reference and an AVX2 form; neither is bit-identical to the
 * other, and each always sums in the same order, so a result never depends on threads or batch.
 */
#ifndef STRATA_GLUE_SIMD_H
#define STRATA_GLUE_SIMD_H
#include "strata.h"
#include "kernels.h"

#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GLUE_X86 1
#endif

/* How rows of hd values are stored in a cache of `type`: bytes per row, the writer, and the
 * reader (NULL for F32, whose rows attention reads in place) with its blocks per row. */
typedef void (*kv_put_fn)(const float *restrict src, uint8_t *restrict dst, int64_t hd);
typedef struct {
    int64_t row_bytes, row_blocks;
    kv_put_fn put;
    strata_block_fn to_f32;
} kv_format;

/* The format of `type` for rows of hd values under `impl` (resolved): STRATA_E_TYPE for a type a
 * cache cannot hold, STRATA_E_BLOCK for Q8_0 rows off its blocks (glue.c). */
int strata_kv_format(int32_t type, int64_t hd, int impl, kv_format *f);

/* Common checks of a cache shape; *head_bytes = C * row_bytes, *cache_bytes = S * Hkv * C * row_bytes
 * (glue.c). */
int strata_kv_cache_shape(int64_t n_slots, int64_t n_head_kv, int64_t n_cache_ctx, int64_t row_bytes,
                          int64_t *head_bytes, int64_t *cache_bytes);

/* Eight partial sums (lane i % 8), so the compiler can vectorise without reassociating. */
static inline float dot_ref(const float *a, const float *b, int64_t n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += a[i + l] * b[i + l];
    for (; i < n; i++) lane[0] += a[i] * b[i];
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
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

static inline float dot_avx2(const float *a, const float *b, int64_t n) {
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

/* s[j] = scale * q . k[j] for n key rows of hd. Four rows at a time share each load of q, and their
 * four horizontal sums are done together. */
static inline void scores_avx2(const float *q, const float *k, int64_t n, int64_t hd, float scale, float *s) {
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

#pragma GCC pop_options
#endif

#endif
