/*
 * AVX-512 twins (F, BW, VL, VNNI) of the quantized matrix kernels of qdot_ref.c: the activation
 * quantizers and the tile kernels of Q8_0 (activation Q8), Q4_K, Q5_K, Q6_K (activation Q8K), F16
 * and BF16 (activation F32); the 4-bit formats of one scale per 32 (Q4_0, MXFP4, IQ4_NL) are in
 * qdot_nib_avx512.c. Interface, activation formats and the tolerance contract: qdot.h. Block
 * layouts: common.h.
 *
 * Integer parts are exact. VPDPBUSD multiplies unsigned bytes (its second operand) by signed
 * bytes (its third) and adds groups of four into int32 lanes. Q8_0's codes are made unsigned by an
 * offset C = 128 (w + 128 via xor 0x80) and C * sum(a), itself a VPDPBUSD of the bytes C with the
 * activation, is subtracted: sum((w + C) * a) - C * sum(a) = sum(w * a), every term inside int32.
 * The K-quants multiply codes and activations pairwise into int16 (VPMADDUBSW: at most 2 * 63 * 127, no
 * saturation) and weight those pairs by the sub-block scale with VPDPWSSD into int32 lanes. The
 * lanes of one block (or block pair) are then converted to float and scaled once per block, so
 * the float result differs from the scalar one only in the order the per-block terms are added.
 *
 * The activation quantizers repeat the scalar operations exactly (max, one division, rounding
 * to nearest even, the clamp to +-127, exact integer sums), so their bytes are identical to
 * qdot_ref.c's.
 *
 * Outputs are computed in tiles of rows x tokens (DEFINE_DRIVER): a weight block is unpacked once
 * per tile and used for each of its tokens; each output keeps a 16-lane float accumulator that is
 * reduced once at the end.
 *
 * The ISA is enabled for this translation unit only; strata_qdot_find hands these kernels out
 * only for STRATA_IMPL_AVX512, which strata_resolve_impl grants only when the CPU and the OS
 * support it (dequant.c).
 */
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* ---- shared helpers ---- */

INLINE float half_scale(uint16_t h) { return _cvtsh_ss(h); }

/* The 32 bytes at p in the low half of a zmm, zeros above (a block without a partner). */
INLINE __m512i low_half(__m256i v) { return _mm512_zextsi256_si512(v); }

/* a[0].q and a[1].q back to back: int32 lanes 0-7 are block 0, 8-15 block 1 (mask PAIR_FLAT_HI). */
INLINE __m512i act_pair_flat(const strata_block_act_q8 *a) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a[0].q)),
                              _mm256_loadu_si256((const __m256i *)a[1].q), 1);
}
#define PAIR_FLAT_HI ((__mmask16)0xff00)

/* Tiles of nr weight rows x nt tokens: the accumulators of one output each, reduced at the end. */
#define ZERO_ACC(acc) \
    for (int r_ = 0; r_ < 4; r_++) for (int t_ = 0; t_ < 4; t_++) acc[r_][t_] = _mm512_setzero_ps();

/* Decode (fewer than 4 tokens) is bound by reading the weights: fetch this far ahead of each row's
 * current block, as the AVX2 kernels do (qdot_avx2.c). */
#define PF_AHEAD 2048

INLINE void store_tile(int nr, int nt, __m512 acc[4][4], float *y, int64_t ys) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) y[t * ys + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* TILE(nr, nt, k, w, wrb, a, arb, y, ys) computes an nr x nt tile over the whole row. Decode
 * (fewer than 4 tokens) runs 4-row tiles token by token; prefill 2 x 4 tiles, so each unpacked
 * weight block serves 4 tokens. */
#define DEFINE_DRIVER(name, TILE)                                                                        \
    void strata_qdot_##name##_avx512(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,  \
                                     const uint8_t *restrict a, int64_t arb, int64_t n_tok,              \
                                     float *restrict y, int64_t ys) {                                    \
        int64_t r = 0;                                                                                   \
        if (n_tok < 4)                                                                                   \
            for (; r + 4 <= n_rows; r += 4)                                                              \
                for (int64_t t = 0; t < n_tok; t++)                                                      \
                    TILE(4, 1, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys);               \
        for (; r + 2 <= n_rows; r += 2) {                                                                \
            int64_t t = 0;                                                                               \
            for (; t + 4 <= n_tok; t += 4) TILE(2, 4, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys); \
            for (; t < n_tok; t++) TILE(2, 1, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys);       \
        }                                                                                                \
        for (; r < n_rows; r++) {                                                                        \
            int64_t t = 0;                                                                               \
            for (; t + 4 <= n_tok; t += 4) TILE(1, 4, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys); \
            for (; t < n_tok; t++) TILE(1, 1, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys);       \
        }                                                                                                \
    }

/* ---- Q8_0 against STRATA_ACT_Q8, two blocks per zmm ---- */

INLINE float q8_0_scale(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_scale(h);
}

/* Codes + 128 of the blocks at p0 and p1, in the order of act_pair_flat. */
INLINE __m512i q8_codes_pair(const uint8_t *p0, const uint8_t *p1) {
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 2))),
                                         _mm256_loadu_si256((const __m256i *)(p1 + 2)), 1);
    return _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80));
}

/* Codes + 128 of one block at p in element order, in the low half (zeros above). */
INLINE __m512i q8_codes_one(const uint8_t *p) {
    return low_half(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_epi8((char)0x80)));
}

/* One step of a Q8_0 tile over blocks b (and b + 1 when pair): per token, the activation bytes,
 * 128 * sum(a) per int32 lane and the activation scales; per row, the codes and weight scales;
 * then sum((w + 128) * a) - 128 * sum(a) = sum(w * a), exactly, converted and scaled once. */
INLINE void q8_step(int pair, int nr, int nt, int64_t b, const uint8_t *w, int64_t wrb, const uint8_t *a,
                    int64_t arb, __m512 acc[4][4]) {
    const int64_t bs = (int64_t)sizeof(strata_block_q8_0);
    const __m512i zero = _mm512_setzero_si512(), c = _mm512_set1_epi8((char)0x80);
    __m512i av[4], corr[4];
    __m512 ad[4];
    for (int t = 0; t < nt; t++) {
        const strata_block_act_q8 *ab = (const strata_block_act_q8 *)(a + t * arb) + b;
        if (pair) {
            av[t] = act_pair_flat(ab);
            ad[t] = _mm512_mask_blend_ps(PAIR_FLAT_HI, _mm512_set1_ps(ab[0].d), _mm512_set1_ps(ab[1].d));
        } else {
            av[t] = low_half(_mm256_loadu_si256((const __m256i *)ab->q));
            ad[t] = _mm512_set1_ps(ab->d);
        }
        corr[t] = _mm512_dpbusd_epi32(zero, c, av[t]);
    }
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * wrb + b * bs;
        if (nt < 4) {
            _mm_prefetch((const char *)(p + PF_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + PF_AHEAD + 64), _MM_HINT_T0);
        }
        const __m512i u = pair ? q8_codes_pair(p, p + bs) : q8_codes_one(p);
        const __m512 wd = pair ? _mm512_mask_blend_ps(PAIR_FLAT_HI, _mm512_set1_ps(q8_0_scale(p)),
                                                      _mm512_set1_ps(q8_0_scale(p + bs)))
                               : _mm512_set1_ps(q8_0_scale(p));
        for (int t = 0; t < nt; t++) {
            const __m512i sumi = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, u, av[t]), corr[t]);
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(wd, ad[t]), acc[r][t]);
        }
    }
}

INLINE void q8_0_tile(int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, int64_t arb,
                      float *y, int64_t ys) {
    __m512 acc[4][4];
    ZERO_ACC(acc)
    const int64_t nb = k / STRATA_QK;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) q8_step(1, nr, nt, b, w, wrb, a, arb, acc);
    if (b < nb) q8_step(0, nr, nt, b, w, wrb, a, arb, acc);
    store_tile(nr, nt, acc, y, ys);
}

#define TILE_Q8_0(nr, nt, ...) q8_0_tile(nr, nt, __VA_ARGS__)
DEFINE_DRIVER(q8_0, TILE_Q8_0)

/* ---- K-quants against STRATA_ACT_Q8K: one block (256) per step, 64 codes per zmm ---- */

enum { FMT_Q4_K, FMT_Q5_K, FMT_Q6_K };

/* Index vectors for VPERMW: int16 lane i takes scale lane idx[i]. */
INLINE __m512i idx_by_32(int first) {   /* lanes 0-15: first, 16-31: first + 1 */
    return _mm512_mask_blend_epi16((__mmask32)0xffff0000u, _mm512_set1_epi16((short)first),
                                   _mm512_set1_epi16((short)(first + 1)));
}
INLINE __m512i idx_by_16(int first) {   /* lanes 8g .. 8g+7: first + g, g = 0..3 */
    const long long r = 0x0001000100010001LL;       /* one int16 value in four lanes of a 64-bit lane */
    return _mm512_setr_epi64(first * r, first * r, (first + 1) * r, (first + 1) * r,
                             (first + 2) * r, (first + 2) * r, (first + 3) * r, (first + 3) * r);
}

/* One weight block unpacked for its tokens: 4 zmm of 64 unsigned codes (elements 64c..64c+63),
 * the int16 scale of every code pair for VPDPWSSD, and the int16 weights of the 16 bsums
 * (mins for Q4_K/Q5_K, scales for Q6_K). */
typedef struct {
    __m512i q[4], sc[4];
    __m256i bs_w;
    float d, dmin;
} kblock;

/* Q4_K/Q5_K: the 8 six-bit scales and mins (common.h's strata_k_scale_min_words). */
INLINE void k_scales_mins(const uint8_t s[12], kblock *kb) {
    uint32_t w[4];
    strata_k_scale_min_words(s, w);
    /* int16 lanes [sc0..sc7, mn0..mn7] */
    const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3]));
    const __m512i sm512 = _mm512_zextsi256_si512(sm16);
    for (int c = 0; c < 4; c++) kb->sc[c] = _mm512_permutexvar_epi16(idx_by_32(2 * c), sm512);
    /* mn[j] for bsums 2j and 2j + 1 */
    const __m256i mn32 = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(sm16, 1));
    kb->bs_w = _mm256_or_si256(mn32, _mm256_slli_epi32(mn32, 16));
}

INLINE void k_unpack(int fmt, const uint8_t *p, kblock *kb) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (fmt == FMT_Q4_K || fmt == FMT_Q5_K) {
        /* Q4_K and Q5_K share the prefix half d, dmin; u8 scales[12]; Q5_K then has qh[32]. */
        const strata_block_q4_k *b4 = (const strata_block_q4_k *)p;
        const strata_block_q5_k *b5 = (const strata_block_q5_k *)p;
        const uint8_t *qs = fmt == FMT_Q4_K ? b4->qs : b5->qs;
        kb->d = half_scale(b4->d);
        kb->dmin = half_scale(b4->dmin);
        k_scales_mins(b4->scales, kb);
        __m256i qh = fmt == FMT_Q5_K ? _mm256_loadu_si256((const __m256i *)b5->qh) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            /* elements 64c..64c+31: low nibbles of qs[32c..32c+31]; 64c+32..64c+63: high nibbles */
            const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            kb->q[c] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(x), _mm256_srli_epi16(x, 4), 1), m4);
            if (fmt == FMT_Q5_K) {   /* bit 2c of qh[l] -> element 64c + l, bit 2c + 1 -> 64c + 32 + l */
                const __m512i hb = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 1), 1);
                kb->q[c] = _mm512_or_si512(kb->q[c], _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(1)), 4));
                qh = _mm256_srli_epi16(qh, 2);
            }
        }
        return;
    }
    /* Q6_K: codes q6 = q + 32 (0..63); the -32 is taken off as 32 * sum(sc * bsums). */
    const strata_block_q6_k *b6 = (const strata_block_q6_k *)p;
    const __m512i m3 = _mm512_set1_epi8(3);
    kb->d = half_scale(b6->d);
    kb->dmin = 0.0f;
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b6->scales));
    const __m512i sc512 = _mm512_zextsi256_si512(sc16);
    kb->bs_w = sc16;
    for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512(b6->ql + 64 * h);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b6->qh + 32 * h));
        /* bytes 0-31: qh, 32-63: qh >> 2 (16-bit shifts; only the masked low bits are used) */
        const __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        /* elements 128h + 0..63: low nibbles of ql, bits 0-1 (0..31) and 2-3 (32..63) of qh */
        kb->q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(hz, m3), 4));
        /* elements 128h + 64..127: high nibbles of ql, bits 4-5 and 6-7 of qh */
        kb->q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hz, 4), m3), 4));
        kb->sc[2 * h] = _mm512_permutexvar_epi16(idx_by_16(8 * h), sc512);
        kb->sc[2 * h + 1] = _mm512_permutexvar_epi16(idx_by_16(8 * h + 4), sc512);
    }
}

/* acc + one block's terms: (wd * ad) * sum_c sc * (q . a) and, Q4_K/Q5_K,
 * -(dmin * ad) * sum mn * bsums, Q6_K, -(wd * ad) * 32 * sum sc * bsums. */
INLINE __m512 k_block_dot(int fmt, const kblock *kb, const strata_block_act_q8k *ab, __m512 acc) {
    __m512i sumi = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        const __m512i pairs = _mm512_maddubs_epi16(kb->q[c], _mm512_loadu_si512(ab->q + 64 * c));
        sumi = _mm512_dpwssd_epi32(sumi, pairs, kb->sc[c]);
    }
    const __m256i bterm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)ab->bsums), kb->bs_w);
    const float d = kb->d * ab->d;
    if (fmt == FMT_Q6_K) {
        sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(_mm256_slli_epi32(bterm, 5)));
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(d), acc);
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(d), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(bterm)), _mm512_set1_ps(-(kb->dmin * ab->d)), acc);
}

INLINE void k_tile(int fmt, int64_t bs, int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb,
                   const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    __m512 acc[4][4];
    ZERO_ACC(acc)
    for (int64_t b = 0; b < k / STRATA_QK_K; b++)
        for (int r = 0; r < nr; r++) {
            kblock kb;
            if (nt < 4) {
                _mm_prefetch((const char *)(w + r * wrb + b * bs + PF_AHEAD), _MM_HINT_T0);
                _mm_prefetch((const char *)(w + r * wrb + b * bs + PF_AHEAD + 64), _MM_HINT_T0);
            }
            k_unpack(fmt, w + r * wrb + b * bs, &kb);
            for (int t = 0; t < nt; t++)
                acc[r][t] = k_block_dot(fmt, &kb, (const strata_block_act_q8k *)(a + t * arb) + b, acc[r][t]);
        }
    store_tile(nr, nt, acc, y, ys);
}

#define TILE_Q4_K(nr, nt, ...) k_tile(FMT_Q4_K, sizeof(strata_block_q4_k), nr, nt, __VA_ARGS__)
#define TILE_Q5_K(nr, nt, ...) k_tile(FMT_Q5_K, sizeof(strata_block_q5_k), nr, nt, __VA_ARGS__)
#define TILE_Q6_K(nr, nt, ...) k_tile(FMT_Q6_K, sizeof(strata_block_q6_k), nr, nt, __VA_ARGS__)
DEFINE_DRIVER(q4_k, TILE_Q4_K)
DEFINE_DRIVER(q5_k, TILE_Q5_K)
DEFINE_DRIVER(q6_k, TILE_Q6_K)

/* ---- F16 and BF16 weights (activation F32): widened exactly, multiplied and added in float ---- */

enum { FMT_F16, FMT_BF16 };

/* 16 weights (fewer under mask m) at p as float32. */
INLINE __m512 f_load(int fmt, const uint8_t *p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (fmt == FMT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE void f_tile(int fmt, int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb,
                   const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    __m512 acc[4][4];
    ZERO_ACC(acc)
    for (int64_t i = 0; i < k; i += 16) {
        const __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - i)) - 1u);
        __m512 x[4];
        for (int t = 0; t < nt; t++) x[t] = _mm512_maskz_loadu_ps(m, (const float *)(a + t * arb) + i);
        for (int r = 0; r < nr; r++) {
            const __m512 wv = f_load(fmt, w + r * wrb + 2 * i, m);
            for (int t = 0; t < nt; t++) acc[r][t] = _mm512_fmadd_ps(wv, x[t], acc[r][t]);
        }
    }
    store_tile(nr, nt, acc, y, ys);
}

#define TILE_F16(nr, nt, ...) f_tile(FMT_F16, nr, nt, __VA_ARGS__)
#define TILE_BF16(nr, nt, ...) f_tile(FMT_BF16, nr, nt, __VA_ARGS__)
DEFINE_DRIVER(f16, TILE_F16)
DEFINE_DRIVER(bf16, TILE_BF16)

/* ---- Activation quantizers ---- */

/* max |x| over n floats (n a multiple of 16); max is exact, so the order does not matter. */
INLINE float amax16n(const float *x, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    return _mm512_reduce_max_ps(m);
}

/* round-to-nearest-even(x / d) for 16 floats, clamped to [-127, 127] as int32, as the scalar code
 * does (|x / d| passes 127 only for a subnormal d, and stays below 191). */
INLINE __m512i round16(const float *x, __m512 d) {
    const __m512i r = _mm512_cvt_roundps_epi32(_mm512_div_ps(_mm512_loadu_ps(x), d),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_max_epi32(_mm512_min_epi32(r, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
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
FALLBACK(f16) FALLBACK(bf16) FALLBACK(q8_0) FALLBACK(q4_k) FALLBACK(q5_k) FALLBACK(q6_k)
#endif
