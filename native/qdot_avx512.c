/*
 * AVX-512 twins (F, BW, VL, VNNI) of the quantized matrix kernels of qdot_ref.c: the activation
 * quantizers and the tile kernels of Q4_0, Q8_0, MXFP4 (activation Q8), Q4_K, Q5_K, Q6_K
 * (activation Q8K), F16 and BF16 (activation F32). Interface, activation formats and the
 * tolerance contract: qdot.h. Block layouts: common.h.
 *
 * Integer parts are exact. VPDPBUSD multiplies unsigned bytes (its second operand) by signed
 * bytes (its third) and adds groups of four into int32 lanes. Every weight code is made unsigned
 * by an offset C (Q4_0: the stored nibble, C = 8; Q8_0: w + 128 via xor 0x80; MXFP4: the doubled
 * E2M1 value + 12) and C * sum(a), itself a VPDPBUSD of the bytes C with the activation, is
 * subtracted: sum((w + C) * a) - C * sum(a) = sum(w * a), every term inside int32. The K-quants
 * multiply codes and activations pairwise into int16 (VPMADDUBSW: at most 2 * 63 * 127, no
 * saturation) and weight those pairs by the sub-block scale with VPDPWSSD into int32 lanes. The
 * lanes of one block (or block pair) are then converted to float and scaled once per block, so
 * the float result differs from the scalar one only in the order the per-block terms are added.
 *
 * The activation quantizers repeat the scalar operations exactly (max, one division, rounding
 * to nearest even, exact integer sums), so their bytes are identical to qdot_ref.c's.
 *
 * The ISA is enabled for this translation unit only; strata_qdot_find hands these kernels out
 * only for STRATA_IMPL_AVX512, which strata_resolve_impl grants only when the CPU and the OS
 * support it (dequant.c).
 */
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

/* ---- shared helpers ---- */

/* a[0].q and a[1].q (two Q8 activation blocks) arranged as the nibble layout of two Q4_0/MXFP4
 * blocks: [a0 0..15, a1 0..15, a0 16..31, a1 16..31]. The int32 lanes of a product then belong
 * to block 0 in 128-bit lanes 0 and 2 and to block 1 in lanes 1 and 3 (mask PAIR_NIBBLE_HI). */
static inline __m512i act_pair_nibble_order(const strata_block_act_q8 *a) {
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a[0].q)),
                                         _mm256_loadu_si256((const __m256i *)a[1].q), 1);
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
}
#define PAIR_NIBBLE_HI ((__mmask16)0xf0f0)

/* a[0].q and a[1].q back to back: int32 lanes 0-7 are block 0, 8-15 block 1 (mask PAIR_FLAT_HI). */
static inline __m512i act_pair_flat(const strata_block_act_q8 *a) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a[0].q)),
                              _mm256_loadu_si256((const __m256i *)a[1].q), 1);
}
#define PAIR_FLAT_HI ((__mmask16)0xff00)

/* The 32 nibbles of two 16-byte code arrays as bytes: [lo(p0), lo(p1), hi(p0), hi(p1)]
 * (lo: low nibbles = elements 0..15 of a block, hi: elements 16..31). */
static inline __m512i nibbles_pair(const uint8_t *p0, const uint8_t *p1) {
    const __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                              _mm_loadu_si128((const __m128i *)p1), 1);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(x), _mm256_srli_epi16(x, 4), 1);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

/* The 32 nibbles of one 16-byte code array as bytes in element order (low nibbles first). */
static inline __m256i nibbles_one(const uint8_t *p) {
    const __m128i x = _mm_loadu_si128((const __m128i *)p);
    const __m256i z = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(z, _mm256_set1_epi8(0x0f));
}

/* sum(u * a) - c * sum(a) per group of four bytes: the exact integer dot of (u - c) with a. */
static inline __m512i dot_offset512(__m512i u, __m512i a, __m512i c) {
    const __m512i zero = _mm512_setzero_si512();
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, u, a), _mm512_dpbusd_epi32(zero, c, a));
}

static inline int dot_offset256(__m256i u, __m256i a, __m256i c) {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i s = _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, u, a), _mm256_dpbusd_epi32(zero, c, a));
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    const __m128i q = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 3, 0, 1))));
}

static inline float hsum256_ps(__m256 v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

/* acc + int32 lanes * scale of block 0 (lanes outside `hi`) or block 1 (lanes in `hi`). */
static inline __m512 add_scaled_pair(__m512 acc, __m512i sumi, __mmask16 hi, float s0, float s1) {
    const __m512 scale = _mm512_mask_blend_ps(hi, _mm512_set1_ps(s0), _mm512_set1_ps(s1));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), scale, acc);
}

/* Each tile kernel is a row loop around a token loop around one row-by-token dot (`DOT`): the
 * weight row stays in L1/L2 while every token reads it. */
#define STRATA_QDOT_TILE(name, DOT)                                                                     \
    void strata_qdot_##name##_avx512(int64_t k, const uint8_t *restrict w, int64_t w_row_bytes,        \
                                     int64_t n_rows, const uint8_t *restrict a, int64_t a_row_bytes,   \
                                     int64_t n_tok, float *restrict y, int64_t y_stride) {             \
        for (int64_t r = 0; r < n_rows; r++)                                                           \
            for (int64_t t = 0; t < n_tok; t++)                                                        \
                y[t * y_stride + r] = DOT(k, w + r * w_row_bytes, a + t * a_row_bytes);               \
    }

/* ---- Q4_0: x = d * (nibble - 8) ---- */

static inline float dot_q4_0(int64_t k, const uint8_t *wp, const uint8_t *ap) {
    const strata_block_q4_0 *w = (const strata_block_q4_0 *)wp;
    const strata_block_act_q8 *a = (const strata_block_act_q8 *)ap;
    const int64_t nb = k / STRATA_QK;
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const __m512i sumi = dot_offset512(nibbles_pair(w[b].qs, w[b + 1].qs), act_pair_nibble_order(a + b),
                                           _mm512_set1_epi8(8));
        acc = add_scaled_pair(acc, sumi, PAIR_NIBBLE_HI, strata_half_to_f32(w[b].d) * a[b].d,
                              strata_half_to_f32(w[b + 1].d) * a[b + 1].d);
    }
    float tail = 0.0f;
    if (b < nb) {
        const int sumi = dot_offset256(nibbles_one(w[b].qs), _mm256_loadu_si256((const __m256i *)a[b].q),
                                       _mm256_set1_epi8(8));
        tail = strata_half_to_f32(w[b].d) * a[b].d * (float)sumi;
    }
    return _mm512_reduce_add_ps(acc) + tail;
}

/* ---- Q8_0: x = d * q, q signed; made unsigned as q + 128 (xor 0x80) ---- */

static inline float dot_q8_0(int64_t k, const uint8_t *wp, const uint8_t *ap) {
    const strata_block_q8_0 *w = (const strata_block_q8_0 *)wp;
    const strata_block_act_q8 *a = (const strata_block_act_q8 *)ap;
    const int64_t nb = k / STRATA_QK;
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)w[b].qs)),
                                             _mm256_loadu_si256((const __m256i *)w[b + 1].qs), 1);
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        const __m512i sumi = dot_offset512(_mm512_xor_si512(q, bias), act_pair_flat(a + b), bias);
        acc = add_scaled_pair(acc, sumi, PAIR_FLAT_HI, strata_half_to_f32(w[b].d) * a[b].d,
                              strata_half_to_f32(w[b + 1].d) * a[b + 1].d);
    }
    float tail = 0.0f;
    if (b < nb) {
        const __m256i bias = _mm256_set1_epi8((char)0x80);
        const __m256i q = _mm256_loadu_si256((const __m256i *)w[b].qs);
        const int sumi = dot_offset256(_mm256_xor_si256(q, bias), _mm256_loadu_si256((const __m256i *)a[b].q), bias);
        tail = strata_half_to_f32(w[b].d) * a[b].d * (float)sumi;
    }
    return _mm512_reduce_add_ps(acc) + tail;
}

/* ---- MXFP4: x = 2^(e - 128) * doubled E2M1 value (dequant_ref.c); codes looked up as value + 12 ---- */

#define MXFP4_OFFSET 12   /* the doubled E2M1 values are -12..12 */

static inline float dot_mxfp4(int64_t k, const uint8_t *wp, const uint8_t *ap) {
    const strata_block_mxfp4 *w = (const strata_block_mxfp4 *)wp;
    const strata_block_act_q8 *a = (const strata_block_act_q8 *)ap;
    const int64_t nb = k / STRATA_QK;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)strata_e2m1_doubled),
                                                            _mm_set1_epi8(MXFP4_OFFSET)));
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const __m512i u = _mm512_shuffle_epi8(lut, nibbles_pair(w[b].qs, w[b + 1].qs));
        const __m512i sumi = dot_offset512(u, act_pair_nibble_order(a + b), _mm512_set1_epi8(MXFP4_OFFSET));
        acc = add_scaled_pair(acc, sumi, PAIR_NIBBLE_HI, strata_e8m0_half(w[b].e) * a[b].d,
                              strata_e8m0_half(w[b + 1].e) * a[b + 1].d);
    }
    float tail = 0.0f;
    if (b < nb) {
        const __m256i u = _mm256_shuffle_epi8(_mm512_castsi512_si256(lut), nibbles_one(w[b].qs));
        const int sumi = dot_offset256(u, _mm256_loadu_si256((const __m256i *)a[b].q), _mm256_set1_epi8(MXFP4_OFFSET));
        tail = strata_e8m0_half(w[b].e) * a[b].d * (float)sumi;
    }
    return _mm512_reduce_add_ps(acc) + tail;
}

/* ---- K-quants (activation Q8K) ---- */

/* Index vectors for VPERMW: int16 lane i takes scale lane idx[i]. */
static inline __m512i idx_by_32(int first) {   /* lanes 0-15: first, 16-31: first + 1 */
    return _mm512_mask_blend_epi16((__mmask32)0xffff0000u, _mm512_set1_epi16((short)first),
                                   _mm512_set1_epi16((short)(first + 1)));
}
static inline __m512i idx_by_16(int first) {   /* lanes 8g .. 8g+7: first + g, g = 0..3 */
    const long long r = 0x0001000100010001LL;       /* one int16 value in four lanes of a 64-bit lane */
    return _mm512_setr_epi64(first * r, first * r, (first + 1) * r, (first + 1) * r,
                             (first + 2) * r, (first + 2) * r, (first + 3) * r, (first + 3) * r);
}

/* Q4_K/Q5_K: the 8 six-bit scales and mins of a block as int16 lanes [sc0..sc7, mn0..mn7]
 * (bytes: common.h's strata_k_scale_min, done four at a time on little-endian words). */
static inline __m256i k_scales_mins(const uint8_t s[12]) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, mn_lo = u[1] & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
    return _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi));
}

/* mn[j] * (bsums[2j] + bsums[2j + 1]) in int32 lane j, from [sc0..sc7, mn0..mn7]. */
static inline __m256i k_min_terms(__m256i sm16, const int16_t *bsums) {
    const __m128i mn = _mm256_extracti128_si256(sm16, 1);                 /* mn0..mn7 as int16 */
    const __m256i mn_pairs = _mm256_cvtepu16_epi32(mn);                    /* one per int32 lane */
    const __m256i dup = _mm256_or_si256(mn_pairs, _mm256_slli_epi32(mn_pairs, 16));  /* mn in both halves */
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), dup);
}

/* Elements 64c .. 64c + 63 of a Q4_K/Q5_K block as bytes: the low nibbles of qs[32c .. 32c + 31]
 * then their high nibbles. */
static inline __m512i k_nibbles64(const uint8_t *qs) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)qs);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(x), _mm256_srli_epi16(x, 4), 1);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

/* Q4_K (fifth = 0) and Q5_K (fifth = 1): x = d * sc * q - dmin * mn per sub-block of 32. */
static inline float dot_k45(int64_t k, const uint8_t *wp, size_t w_block_bytes, int fifth,
                            const strata_block_act_q8k *a) {
    const int64_t nb = k / STRATA_QK_K;
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_min = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, wp += w_block_bytes) {
        /* Q4_K and Q5_K share the prefix half d, dmin; u8 scales[12]; Q5_K then has qh[32]. */
        const strata_block_q5_k *w = (const strata_block_q5_k *)wp;
        const uint8_t *qs = fifth ? w->qs : ((const strata_block_q4_k *)wp)->qs;
        const __m256i sm16 = k_scales_mins(w->scales);
        const __m512i sm512 = _mm512_zextsi256_si512(sm16);
        __m256i qh = fifth ? _mm256_loadu_si256((const __m256i *)w->qh) : _mm256_setzero_si256();
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m512i q = k_nibbles64(qs + 32 * c);
            if (fifth) {   /* bit 2c of qh[l] -> element 64c + l, bit 2c + 1 -> element 64c + 32 + l */
                const __m512i hb = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 1), 1);
                q = _mm512_or_si512(q, _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(1)), 4));
                qh = _mm256_srli_epi16(qh, 2);
            }
            const __m512i pairs = _mm512_maddubs_epi16(q, _mm512_loadu_si512(a[b].q + 64 * c));
            sumi = _mm512_dpwssd_epi32(sumi, pairs, _mm512_permutexvar_epi16(idx_by_32(2 * c), sm512));
        }
        const float da = a[b].d;
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(strata_half_to_f32(w->d) * da), acc);
        acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k_min_terms(sm16, a[b].bsums)),
                                  _mm256_set1_ps(strata_half_to_f32(w->dmin) * da), acc_min);
    }
    return _mm512_reduce_add_ps(acc) - hsum256_ps(acc_min);
}

static inline float dot_q4_k(int64_t k, const uint8_t *wp, const uint8_t *ap) {
    return dot_k45(k, wp, sizeof(strata_block_q4_k), 0, (const strata_block_act_q8k *)ap);
}

static inline float dot_q5_k(int64_t k, const uint8_t *wp, const uint8_t *ap) {
    return dot_k45(k, wp, sizeof(strata_block_q5_k), 1, (const strata_block_act_q8k *)ap);
}

/* ---- Q6_K: x = d * sc * (q6 - 32) per sub-block of 16; codes used as q6 (0..63), and
 * 32 * sum(sc * bsums) subtracted ---- */

static inline float dot_q6_k(int64_t k, const uint8_t *wp, const uint8_t *ap) {
    const strata_block_q6_k *w = (const strata_block_q6_k *)wp;
    const strata_block_act_q8k *a = (const strata_block_act_q8k *)ap;
    const int64_t nb = k / STRATA_QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(3);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[b].scales));
        const __m512i sc512 = _mm512_zextsi256_si512(sc16);
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(w[b].ql + 64 * h);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[b].qh + 32 * h));
            /* bytes 0-31: qh, 32-63: qh >> 2 (in 16-bit lanes; only the masked low bits are used) */
            const __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            /* elements 128h + 0..63: low nibbles of ql, bits 0-1 (0..31) and 2-3 (32..63) of qh */
            const __m512i q_lo = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                                 _mm512_slli_epi16(_mm512_and_si512(hz, m3), 4));
            /* elements 128h + 64..127: high nibbles of ql, bits 4-5 and 6-7 of qh */
            const __m512i q_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                 _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hz, 4), m3), 4));
            const __m512i p_lo = _mm512_maddubs_epi16(q_lo, _mm512_loadu_si512(a[b].q + 128 * h));
            const __m512i p_hi = _mm512_maddubs_epi16(q_hi, _mm512_loadu_si512(a[b].q + 128 * h + 64));
            sumi = _mm512_dpwssd_epi32(sumi, p_lo, _mm512_permutexvar_epi16(idx_by_16(8 * h), sc512));
            sumi = _mm512_dpwssd_epi32(sumi, p_hi, _mm512_permutexvar_epi16(idx_by_16(8 * h + 4), sc512));
        }
        /* 32 * sum over sub-blocks of sc * bsums, in 8 int32 lanes, taken off the first 8 lanes */
        const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[b].bsums), sc16);
        sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 5)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(strata_half_to_f32(w[b].d) * a[b].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* ---- F16 and BF16 weights (activation F32): widened exactly, multiplied and added in float ---- */

static inline __m512 load_f16(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

#define STRATA_DOT_HALF(name, LOAD)                                                                    \
    static inline float dot_##name(int64_t k, const uint8_t *wp, const uint8_t *ap) {                  \
        const uint16_t *w = (const uint16_t *)wp;                                                      \
        const float *x = (const float *)ap;                                                            \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                                 \
        int64_t i = 0;                                                                                 \
        for (; i + 32 <= k; i += 32) {                                                                 \
            acc0 = _mm512_fmadd_ps(LOAD(w + i, 0xffff), _mm512_loadu_ps(x + i), acc0);                 \
            acc1 = _mm512_fmadd_ps(LOAD(w + i + 16, 0xffff), _mm512_loadu_ps(x + i + 16), acc1);       \
        }                                                                                              \
        for (; i < k; i += 16) {                                                                       \
            const __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - i)) - 1u);   \
            acc0 = _mm512_fmadd_ps(LOAD(w + i, m), _mm512_maskz_loadu_ps(m, x + i), acc0);             \
        }                                                                                              \
        return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));                                        \
    }

STRATA_DOT_HALF(f16, load_f16)
STRATA_DOT_HALF(bf16, load_bf16)

STRATA_QDOT_TILE(q4_0, dot_q4_0)
STRATA_QDOT_TILE(q8_0, dot_q8_0)
STRATA_QDOT_TILE(mxfp4, dot_mxfp4)
STRATA_QDOT_TILE(q4_k, dot_q4_k)
STRATA_QDOT_TILE(q5_k, dot_q5_k)
STRATA_QDOT_TILE(q6_k, dot_q6_k)
STRATA_QDOT_TILE(f16, dot_f16)
STRATA_QDOT_TILE(bf16, dot_bf16)

/* ---- Activation quantizers ---- */

/* max |x| over n floats (n a multiple of 16); max is exact, so the order does not matter. */
static inline float amax16n(const float *x, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    return _mm512_reduce_max_ps(m);
}

/* round-to-nearest-even(x / d) for 16 floats, as the int8 the scalar code stores, sign-extended to
 * int32. |x / d| <= 127 but for a subnormal d, whose rounding can push it past 127: the scalar code's
 * (int8_t) cast then wraps, and so does this (sums are taken of the wrapped values, as there). */
static inline __m512i round16(const float *x, __m512 d) {
    const __m512i r = _mm512_cvt_roundps_epi32(_mm512_div_ps(_mm512_loadu_ps(x), d),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_srai_epi32(_mm512_slli_epi32(r, 24), 24);
}

void strata_qact_q8_avx512(const float *restrict x, void *restrict out, int64_t k) {
    strata_block_act_q8 *a = out;
    for (int64_t b = 0; b < k / STRATA_QK; b++, x += STRATA_QK) {
        const float d = amax16n(x, STRATA_QK) / 127.0f;
        if (d == 0.0f) {
            a[b].d = 0.0f;
            a[b].s = 0.0f;
            memset(a[b].q, 0, sizeof a[b].q);
            continue;
        }
        const __m512 dv = _mm512_set1_ps(d);
        const __m512i q0 = round16(x, dv), q1 = round16(x + 16, dv);
        _mm_storeu_si128((__m128i *)a[b].q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(a[b].q + 16), _mm512_cvtepi32_epi8(q1));
        a[b].d = d;
        a[b].s = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

void strata_qact_q8k_avx512(const float *restrict x, void *restrict out, int64_t k) {
    strata_block_act_q8k *a = out;
    for (int64_t b = 0; b < k / STRATA_QK_K; b++, x += STRATA_QK_K) {
        const float d = amax16n(x, STRATA_QK_K) / 127.0f;
        if (d == 0.0f) {
            memset(&a[b], 0, sizeof a[b]);
            continue;
        }
        const __m512 dv = _mm512_set1_ps(d);
        for (int g = 0; g < 16; g++) {   /* a group of 16 is one bsums entry */
            const __m512i q = round16(x + 16 * g, dv);
            _mm_storeu_si128((__m128i *)(a[b].q + 16 * g), _mm512_cvtepi32_epi8(q));
            a[b].bsums[g] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        a[b].d = d;
    }
}

#else /* not x86: the names exist so the library links; qdot.c hands them out only for AVX512,
       * which strata_resolve_impl refuses here */

void strata_qact_q8_avx512(const float *restrict x, void *restrict a, int64_t k) { strata_qact_q8_ref(x, a, k); }
void strata_qact_q8k_avx512(const float *restrict x, void *restrict a, int64_t k) { strata_qact_q8k_ref(x, a, k); }
#define FALLBACK(name)                                                                                     \
    void strata_qdot_##name##_avx512(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,    \
                                     const uint8_t *restrict a, int64_t arb, int64_t n_tok,                \
                                     float *restrict y, int64_t ys) {                                      \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                  \
    }
FALLBACK(f16) FALLBACK(bf16) FALLBACK(q4_0) FALLBACK(q8_0) FALLBACK(mxfp4) FALLBACK(q4_k) FALLBACK(q5_k) FALLBACK(q6_k)
#endif
