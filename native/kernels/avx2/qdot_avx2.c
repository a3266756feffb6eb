/*
 * AVX2 twins of the quantized matrix kernels in qdot_ref.c (interface: qdot.h).
 *
 * Activation quantizers: bit-identical to the scalar ones (the same max, the same IEEE division
 * x / d, the same round-to-nearest-even), so every family sees the same activation blocks.
 *
 * Tile kernels: the integer dot product of a weight block with an activation block is exact, as
 * in the scalar kernel, but it is kept in 8 int32 lanes that are converted to float and added
 * (fused multiply-add) into 8 float lanes, reduced once per output. The result therefore equals
 * the scalar one up to the rounding of a differently ordered float sum.
 *   Q8_0 (signed codes):             maddubs(|w|, sign(a, w)) then madd(., 1)
 *   Q4_0, Q5_0, MXFP4 (codes + bias): maddubs(w + bias, a) - maddubs(bias, a) then madd(., 1)
 *   Q4_1, Q5_1 (unsigned codes):       maddubs(w, a) then madd(., 1); the min adds m * s
 *   K-quants (codes + bias >= 0):      maddubs(w, a) then madd(., sub-block scale); the bias
 *                                      (Q3_K 4, Q6_K 32) and the mins come off through bsums
 * |w| <= 128 and |a| <= 127 keep maddubs' int16 pair sums below 2^15 (no saturation).
 *
 * Outputs are computed in tiles of NR weight rows x NT tokens: a weight block is unpacked once per
 * tile and used for its NT tokens, which stay in L1 across the row group (driver: DEFINE_DRIVER).
 *
 * The ISA is enabled for this translation unit only; qdot.c hands these kernels out only after the
 * CPU was seen to have AVX2, FMA and F16C.
 */
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#ifdef STRATA_QDOT_EVEX
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#include "qdot_avx2_common.h"


INLINE float half_scale(uint16_t h) { return _cvtsh_ss(h); }


INLINE int32_t hsum8_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* ---- Activation quantizers ---- */

/* One block of n (32 or 256) values: q = round_even(x / d), d = max|x| / 127. Returns d. */
INLINE float quantize_block(const float *restrict x, int8_t *restrict q, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax8 = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    if (d == 0.0f) {
        memset(q, 0, (size_t)n);
        return d;
    }
    const __m256 vd = _mm256_set1_ps(d), lim = _mm256_set1_ps(127.0f);  /* clamp: see qdot_ref.c */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int j = 0; j < n; j += 32) {
        __m256i i[4];
        for (int k = 0; k < 4; k++) {
            const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + j + 8 * k), vd),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            i[k] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim)));
        }
        /* packs work per 128-bit lane: the permute puts the 32 bytes back in order. */
        const __m256i p16a = _mm256_packs_epi32(i[0], i[1]), p16b = _mm256_packs_epi32(i[2], i[3]);
        const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), order);
        _mm256_storeu_si256((__m256i *)(q + j), p8);
    }
    return d;
}

/* Sums of 16 consecutive int8 in a 32-byte vector: lanes 0-3 hold partial sums of q[0..15],
 * lanes 4-7 of q[16..31]. */
INLINE __m256i sum4_i8(__m256i q) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
}

#ifndef STRATA_QDOT_EVEX   /* AVX-512 machines run their own quantizers (qdot_avx512.c) */
void strata_qact_q8_avx2(const float *restrict x, void *restrict out, int64_t k) {
    strata_block_act_q8 *a = out;
    for (int64_t b = 0; b < k / STRATA_QK; b++, x += STRATA_QK) {
        a[b].d = quantize_block(x, a[b].q, STRATA_QK);
        a[b].s = a[b].d * (float)hsum8_i32(sum4_i8(_mm256_loadu_si256((const __m256i *)a[b].q)));
    }
}

void strata_qact_q8k_avx2(const float *restrict x, void *restrict out, int64_t k) {
    strata_block_act_q8k *a = out;
    for (int64_t b = 0; b < k / STRATA_QK_K; b++, x += STRATA_QK_K) {
        a[b].d = quantize_block(x, a[b].q, STRATA_QK_K);
        for (int c = 0; c < 8; c++) {
            const __m256i s = sum4_i8(_mm256_loadu_si256((const __m256i *)(a[b].q + 32 * c)));
            const __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
            const __m128i h = _mm_hadd_epi32(lo, hi);          /* s0+s1, s2+s3, s4+s5, s6+s7 */
            const __m128i t = _mm_hadd_epi32(h, h);            /* sum of q[0..15], of q[16..31] */
            a[b].bsums[2 * c] = (int16_t)_mm_cvtsi128_si32(t);
            a[b].bsums[2 * c + 1] = (int16_t)_mm_extract_epi32(t, 1);
        }
    }
}
#endif


/* ---- Formats against STRATA_ACT_Q8: signed 8-bit codes, one scale per 32 ---- */

enum { FMT_Q8_0, FMT_Q4_0, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_MXFP4 };


/* Q5_0/Q5_1: bit j of the little-endian 32-bit qh as bit 4 of byte j. */
INLINE __m256i fifth_bits(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* Codes of one weight block of format `fmt` at p, its scale and min (Q4_1, Q5_1). Q8_0's codes are
 * signed; the others' unsigned with a bias (Q4_0 8, Q5_0 16, MXFP4 12 for 2 * E2M1 + 12, else 0),
 * taken off as bias * sum(a). */
INLINE __m256i q8_codes(int fmt, const uint8_t *p, float *d, float *m) {
    uint16_t h;
    switch (fmt) {
    case FMT_Q4_1:
    case FMT_Q5_1: {
        const strata_block_q4_1 *b4 = (const strata_block_q4_1 *)p;
        *d = half_scale(b4->d);
        *m = half_scale(b4->m);
        if (fmt == FMT_Q4_1) return nibbles32(b4->qs);
        const strata_block_q5_1 *b5 = (const strata_block_q5_1 *)p;
        return _mm256_or_si256(nibbles32(b5->qs), fifth_bits(b5->qh));
    }
    case FMT_Q5_0: {
        const strata_block_q5_0 *b5 = (const strata_block_q5_0 *)p;
        *d = half_scale(b5->d);
        return _mm256_or_si256(nibbles32(b5->qs), fifth_bits(b5->qh));
    }
    case FMT_Q8_0:
        memcpy(&h, p, 2);
        *d = half_scale(h);
        return _mm256_loadu_si256((const __m256i *)(p + 2));
    case FMT_Q4_0:
        memcpy(&h, p, 2);
        *d = half_scale(h);
        return nibbles32(p + 2);
    default: { /* FMT_MXFP4 */
        const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                               12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
        *d = strata_e8m0_half(p[0]);
        return _mm256_shuffle_epi8(table, nibbles32(p + 1));
    }
    }
}

INLINE int q8_bias(int fmt) { return fmt == FMT_Q4_0 ? 8 : fmt == FMT_Q5_0 ? 16 : fmt == FMT_MXFP4 ? 12 : 0; }
INLINE int q8_has_min(int fmt) { return fmt == FMT_Q4_1 || fmt == FMT_Q5_1; }

INLINE void q4_0_rows4(int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, float *y);
INLINE void q4_0_rows8(int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, float *y);
INLINE void q4_0_rows8_tok(int nt, int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, int64_t arb,
                           float *y, int64_t ys);

INLINE void q8_tile(int fmt, int64_t bs, int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb,
                    const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    if (fmt == FMT_Q4_0 && nr == 8 && nt == 1) {
        q4_0_rows8(k, w, wrb, a, y);  /* y: 8 consecutive rows of one token */
        return;
    }
    if (fmt == FMT_Q4_0 && nr == 8) {
        q4_0_rows8_tok(nt, k, w, wrb, a, arb, y, ys);  /* y: 8 consecutive rows of nt <= 4 tokens */
        return;
    }
    if (fmt == FMT_Q4_0 && nr == 4 && nt == 1) {
        q4_0_rows4(k, w, wrb, a, y);  /* y: 4 consecutive rows of one token */
        return;
    }
    const __m256i ones = _mm256_set1_epi16(1), bias = _mm256_set1_epi8((char)q8_bias(fmt));
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc[4][8];
    ZERO_ACC(acc)
    for (int64_t b = 0; b < k / STRATA_QK; b++) {
        if (nt < 4) fetch_next_tile(w, nr * wrb, b * nr * bs, nr * bs, ahead_end);
        for (int r = 0; r < nr; r++) {
            float wd, wm = 0.0f;
            const __m256i q = q8_codes(fmt, w + r * wrb + b * bs, &wd, &wm);
            const __m256i qa = fmt == FMT_Q8_0 ? _mm256_sign_epi8(q, q) : q;
            const __m256 m8 = _mm256_set1_ps(wm * 0.125f);  /* the min term, spread over 8 lanes (exact) */
            for (int t = 0; t < nt; t++) {
                const strata_block_act_q8 *ab = (const strata_block_act_q8 *)(a + t * arb) + b;
                const __m256i av = _mm256_loadu_si256((const __m256i *)ab->q);
                __m256i p16;
                if (fmt == FMT_Q8_0) p16 = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(av, q));
                else if (q8_bias(fmt)) p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(qa, av), _mm256_maddubs_epi16(bias, av));
                else p16 = _mm256_maddubs_epi16(qa, av);
                const __m256i p = _mm256_madd_epi16(p16, ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(wd * ab->d), acc[r][t]);
                if (q8_has_min(fmt)) acc[r][t] = _mm256_fmadd_ps(m8, _mm256_broadcast_ss(&ab->s), acc[r][t]);
            }
        }
    }
    store_tile(nr, nt, acc, y, ys);
}

/* Decode (one token) over 4 rows of Q4_0: the rows' integer block sums are folded into one vector
 * by horizontal adds (lanes r and r + 4: row r's sums over the low and high 16 codes), so the
 * conversion to float, the scale and the accumulation run once for 4 rows, with the 4 rows' fp16
 * scales converted together. The pair sums of (code - 8) in [-8, 7] times |a| <= 127 fold in int16
 * (16 products: |sum| <= 16256). (Q8_0's pair sums need int32, whose horizontal adds cost more here
 * than they save: it keeps the row-at-a-time tile.) ~11% faster than that tile for Q4_0. */
INLINE void q4_0_rows4(int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, float *y) {
    const __m256i ones = _mm256_set1_epi16(1), eight = _mm256_set1_epi8(8);
    const strata_block_act_q8 *ab = (const strata_block_act_q8 *)a;
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / STRATA_QK; b++) {
        const uint8_t *p = w + b * (int64_t)sizeof(strata_block_q4_0);
        fetch_next_tile(w, 4 * wrb, b * 4 * (int64_t)sizeof(strata_block_q4_0), 4 * (int64_t)sizeof(strata_block_q4_0), ahead_end);
        const __m256i av = _mm256_loadu_si256((const __m256i *)ab[b].q);
        const __m256i bias = _mm256_maddubs_epi16(eight, av);
        __m256i p16[4];
        for (int r = 0; r < 4; r++)
            p16[r] = _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles32(p + r * wrb + 2), av), bias);
        const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(p16[0], p16[1]), _mm256_hadd_epi16(p16[2], p16[3]));
        uint16_t h0, h1, h2, h3;
        memcpy(&h0, p, 2), memcpy(&h1, p + wrb, 2), memcpy(&h2, p + 2 * wrb, 2), memcpy(&h3, p + 3 * wrb, 2);
        const uint64_t hs = (uint64_t)h0 | (uint64_t)h1 << 16 | (uint64_t)h2 << 32 | (uint64_t)h3 << 48;
        const __m128 d4 = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)hs)), _mm_set1_ps(ab[b].d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(h, ones)), _mm256_set_m128(d4, d4), acc);
    }
    _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
}

/* Decode (one token) over 8 rows of Q4_0, two rows per vector: row r's 16 code bytes in the low
 * half, row r + 4's in the high half, so one AND gives both rows' low-nibble codes (against the
 * activation's first 16 values, broadcast to both halves) and a shift and AND their high-nibble
 * codes (against the last 16). The 8 code bias comes off in int16 (|sum| <= 2 * 3810 + 4064), the
 * three horizontal adds leave one int32 block sum per row in row order, and the 8 rows' fp16
 * scales convert in one instruction. About half the instructions per row block of q4_0_rows4. */
INLINE void q4_0_rows8(int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, float *y) {
    const __m256i ones = _mm256_set1_epi16(1), eight = _mm256_set1_epi8(8), low = _mm256_set1_epi8(15);
    const strata_block_act_q8 *ab = (const strata_block_act_q8 *)a;
    const int64_t w4 = 4 * wrb;
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / STRATA_QK; b++) {
        const uint8_t *p = w + b * (int64_t)sizeof(strata_block_q4_0);
        fetch_next_tile(w, 8 * wrb, b * 8 * (int64_t)sizeof(strata_block_q4_0), 8 * (int64_t)sizeof(strata_block_q4_0), ahead_end);
        const __m256i alo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ab[b].q));
        const __m256i ahi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(ab[b].q + 16)));
        const __m256i bias = _mm256_add_epi16(_mm256_maddubs_epi16(eight, alo), _mm256_maddubs_epi16(eight, ahi));
        __m256i s[4];
        for (int r = 0; r < 4; r++) {
            const __m256i q = _mm256_loadu2_m128i((const __m128i *)(p + r * wrb + w4 + 2), (const __m128i *)(p + r * wrb + 2));
            const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
            s[r] = _mm256_madd_epi16(_mm256_sub_epi16(s16, bias), ones);
        }
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        uint16_t hh[8];
        for (int r = 0; r < 8; r++) memcpy(&hh[r], p + r * wrb, 2);
        const __m256 d8 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hh)), _mm256_set1_ps(ab[b].d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), d8, acc);
    }
    _mm256_storeu_ps(y, acc);
}

/* Prefill over 8 rows of Q4_0 and nt <= 4 tokens: q4_0_rows8's arithmetic for each token, with the
 * 8 rows' codes unpacked and their scales converted once per block for all nt tokens, so each
 * (row, token, block) costs about two multiply-adds of codes and a share of the fold, and the float
 * conversion, scale and accumulation run once per 8 rows (the row-at-a-time tile does them per
 * row). Each token's result is q4_0_rows8's bytes. (One token keeps q4_0_rows8 itself: with its
 * single accumulator it decodes ~1.6x faster than this tile at nt = 1, measured by qdot_rate.) */
INLINE void q4_0_rows8_tok(int nt, int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, int64_t arb,
                           float *y, int64_t ys) {
    const __m256i ones = _mm256_set1_epi16(1), eight = _mm256_set1_epi8(8), low = _mm256_set1_epi8(15);
    const int64_t w4 = 4 * wrb;
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < k / STRATA_QK; b++) {
        const uint8_t *p = w + b * (int64_t)sizeof(strata_block_q4_0);
        if (nt < 4)  /* decode of a few tokens: the rows stream from memory, fetch ahead as rows8 does */
            fetch_next_tile(w, 8 * wrb, b * 8 * (int64_t)sizeof(strata_block_q4_0), 8 * (int64_t)sizeof(strata_block_q4_0), ahead_end);
        __m256i lo[4], hi[4];
        for (int r = 0; r < 4; r++) {
            const __m256i q = _mm256_loadu2_m128i((const __m128i *)(p + r * wrb + w4 + 2), (const __m128i *)(p + r * wrb + 2));
            lo[r] = _mm256_and_si256(q, low);
            hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        }
        uint16_t hh[8];
        for (int r = 0; r < 8; r++) memcpy(&hh[r], p + r * wrb, 2);
        const __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hh));
        for (int t = 0; t < nt; t++) {
            const strata_block_act_q8 *ab = (const strata_block_act_q8 *)(a + t * arb) + b;
            const __m256i alo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ab->q));
            const __m256i ahi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(ab->q + 16)));
            const __m256i bias = _mm256_add_epi16(_mm256_maddubs_epi16(eight, alo), _mm256_maddubs_epi16(eight, ahi));
            __m256i s[4];
            for (int r = 0; r < 4; r++) {
                const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], alo), _mm256_maddubs_epi16(hi[r], ahi));
                s[r] = _mm256_madd_epi16(_mm256_sub_epi16(s16, bias), ones);
            }
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(wd, _mm256_set1_ps(ab->d)), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * ys, acc[t]);
}

#define TILE_Q8_0(nr, nt, ...) q8_tile(FMT_Q8_0, sizeof(strata_block_q8_0), nr, nt, __VA_ARGS__)
#define TILE_Q4_0(nr, nt, ...) q8_tile(FMT_Q4_0, sizeof(strata_block_q4_0), nr, nt, __VA_ARGS__)
#define TILE_Q4_1(nr, nt, ...) q8_tile(FMT_Q4_1, sizeof(strata_block_q4_1), nr, nt, __VA_ARGS__)
#define TILE_Q5_0(nr, nt, ...) q8_tile(FMT_Q5_0, sizeof(strata_block_q5_0), nr, nt, __VA_ARGS__)
#define TILE_Q5_1(nr, nt, ...) q8_tile(FMT_Q5_1, sizeof(strata_block_q5_1), nr, nt, __VA_ARGS__)
#define TILE_MXFP4(nr, nt, ...) q8_tile(FMT_MXFP4, sizeof(strata_block_mxfp4), nr, nt, __VA_ARGS__)
DEFINE_DRIVER(q8_0, TILE_Q8_0, 1, 8, 4)
DEFINE_DRIVER(q4_0, TILE_Q4_0, 8, 4, 8)
DEFINE_DRIVER(q4_1, TILE_Q4_1, 1, 8, 4)
DEFINE_DRIVER(q5_0, TILE_Q5_0, 1, 8, 4)
DEFINE_DRIVER(q5_1, TILE_Q5_1, 1, 8, 4)
DEFINE_DRIVER(mxfp4, TILE_MXFP4, 1, 8, 4)

/* ---- K-quants against STRATA_ACT_Q8K ----
 *
 * A block is worked through in 8 chunks of 32 codes (unsigned, below 64). Calls of 1-3 tokens make
 * chunk c's codes and its int16 scale vector and use them at once for every token of the tile, so
 * nothing unpacked goes through memory; calls of 4 or more unpack windows of rows once and run every
 * token over them (k_unpack below). Per token the 8 chunks' madd results add up in int32; the bsums
 * then give the mins (Q2_K, Q4_K, Q5_K: a float term) or the code bias (Q3_K 4, Q6_K 32: an integer
 * term). */

enum { FMT_Q2_K, FMT_Q3_K, FMT_Q4_K, FMT_Q5_K, FMT_Q6_K };

/* Per block: scales, bsum weights (int16 mins of Q2_K/Q4_K/Q5_K, scales of Q3_K/Q6_K). */
typedef struct {
    __m256i sc_a, sc_b;     /* scale sources the chunks shuffle from */
    __m256i bs_w;
    float d, dmin;
} khead;


/* Q4_K/Q5_K scales and mins (layout: common.h): sc_a = the 8 int16 scales in both halves, bs_w =
 * the mins, each repeated for its two bsums. */
INLINE void k8_head(const uint8_t *s, khead *hd) {
    uint32_t w[4];
    strata_k_scale_min_words(s, w);
    const __m128i mins = _mm_set_epi32(0, 0, (int)w[3], (int)w[2]);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    hd->bs_w = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mins, dup));
    hd->sc_a = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)w[1], (int)w[0])));
}

/* Formats with 16 sub-blocks of 16 (Q2_K, Q3_K, Q6_K): from their 16 int16 scales, sc_a holds
 * scales 0-7 in both halves, sc_b 8-15; chunk c shuffles sub-block 2c's scale into its low half
 * and 2c + 1's into its high half. */
INLINE void k16_head(__m256i sc16, khead *hd) {
    hd->sc_a = _mm256_permute2x128_si256(sc16, sc16, 0x00);
    hd->sc_b = _mm256_permute2x128_si256(sc16, sc16, 0x11);
}

/* Q3_K's 16 six-bit scales (layout: dequant_ref.c), minus 32, as int16. */
INLINE __m256i q3_k_scales(const uint8_t *s) {
    uint32_t w[4];
    strata_q3_k_scale_words(s, w);
    const __m128i sc = _mm_sub_epi8(_mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3]), _mm_set1_epi8(32));
    return _mm256_cvtepi8_epi16(sc);
}

INLINE void k_head(int fmt, const uint8_t *p, khead *hd) {
    switch (fmt) {
    case FMT_Q2_K: {  /* scales[s]: scale in the low nibble, min in the high one */
        const strata_block_q2_k *b2 = (const strata_block_q2_k *)p;
        const __m128i sm = _mm_loadu_si128((const __m128i *)b2->scales), low4 = _mm_set1_epi8(15);
        hd->d = half_scale(b2->d);
        hd->dmin = half_scale(b2->dmin);
        hd->bs_w = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), low4));
        k16_head(_mm256_cvtepu8_epi16(_mm_and_si128(sm, low4)), hd);
        return;
    }
    case FMT_Q3_K: {
        const strata_block_q3_k *b3 = (const strata_block_q3_k *)p;
        hd->d = half_scale(b3->d);
        hd->bs_w = q3_k_scales(b3->scales);
        k16_head(hd->bs_w, hd);
        return;
    }
    case FMT_Q6_K: {
        const strata_block_q6_k *b6 = (const strata_block_q6_k *)p;
        hd->d = half_scale(b6->d);
        hd->bs_w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b6->scales));
        k16_head(hd->bs_w, hd);
        return;
    }
    default: {  /* Q4_K, Q5_K: d, dmin and the scales sit at the same offsets */
        const strata_block_q4_k *b4 = (const strata_block_q4_k *)p;
        hd->d = half_scale(b4->d);
        hd->dmin = half_scale(b4->dmin);
        k8_head(b4->scales, hd);
    }
    }
}

/* `x` shifted so that its bit `from` lands on bit `to` in every byte (bits that cross into a
 * neighbouring byte are to be masked off by the caller). */
INLINE __m256i move_bit(__m256i x, int from, int to) {
    return from < to ? _mm256_slli_epi16(x, to - from) : from > to ? _mm256_srli_epi16(x, from - to) : x;
}

/* Codes (32 unsigned bytes) and int16 scale vector of chunk c of the block at p. */
INLINE __m256i k_chunk(int fmt, const uint8_t *p, const khead *hd, int c, __m256i *sc) {
    const __m256i low4 = _mm256_set1_epi8(15);
    if (fmt == FMT_Q4_K || fmt == FMT_Q5_K) {
        const uint8_t *qs = fmt == FMT_Q4_K ? ((const strata_block_q4_k *)p)->qs : ((const strata_block_q5_k *)p)->qs;
        *sc = _mm256_shuffle_epi8(hd->sc_a, _mm256_set1_epi16((short)(2 * c | (2 * c + 1) << 8)));
        const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 2)));
        __m256i q = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(x, 4) : x, low4);
        if (fmt == FMT_Q5_K) {  /* bit 4: bit c of qh[l] */
            const __m256i qh = _mm256_loadu_si256((const __m256i *)((const strata_block_q5_k *)p)->qh);
            q = _mm256_or_si256(q, _mm256_and_si256(move_bit(qh, c, 4), _mm256_set1_epi8(0x10)));
        }
        return q;
    }
    const char m = (char)(2 * (2 * c % 8));
    const __m256i ctrl = _mm256_setr_epi8(m, m + 1, m, m + 1, m, m + 1, m, m + 1, m, m + 1, m, m + 1, m, m + 1, m, m + 1,
                                          m + 2, m + 3, m + 2, m + 3, m + 2, m + 3, m + 2, m + 3,
                                          m + 2, m + 3, m + 2, m + 3, m + 2, m + 3, m + 2, m + 3);
    *sc = _mm256_shuffle_epi8(c < 4 ? hd->sc_a : hd->sc_b, ctrl);
    const int h = c / 4, s = c % 4;
    if (fmt == FMT_Q6_K) {  /* chunk 4h + s: nibble s/2 of ql[64h + 32(s%2) + l], bits 2s of qh[32h + l] */
        const strata_block_q6_k *b6 = (const strata_block_q6_k *)p;
        const __m256i l = _mm256_loadu_si256((const __m256i *)(b6->ql + 64 * h + 32 * (s % 2)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b6->qh + 32 * h));
        const __m256i lo = _mm256_and_si256(s / 2 ? _mm256_srli_epi16(l, 4) : l, low4);
        return _mm256_or_si256(lo, _mm256_and_si256(move_bit(qh, 2 * s, 4), _mm256_set1_epi8(0x30)));
    }
    /* Q2_K, Q3_K: chunk 4h + s holds bits 2s, 2s+1 of qs[32h + l]; Q3_K adds 4 * (bit c of hmask[l]) */
    const uint8_t *qs = fmt == FMT_Q2_K ? ((const strata_block_q2_k *)p)->qs : ((const strata_block_q3_k *)p)->qs;
    const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
    __m256i q = _mm256_and_si256(_mm256_srli_epi16(x, 2 * s), _mm256_set1_epi8(3));
    if (fmt == FMT_Q3_K) {
        const __m256i hm = _mm256_loadu_si256((const __m256i *)((const strata_block_q3_k *)p)->hmask);
        q = _mm256_or_si256(q, _mm256_and_si256(move_bit(hm, c, 2), _mm256_set1_epi8(4)));
    }
    return q;
}

/* acc += the block's term, from the int32 lanes isum of sum_c madd(maddubs(codes, a), scales). */
INLINE __m256 k_finish(int fmt, const khead *hd, const strata_block_act_q8k *ab, __m256i isum, __m256 acc) {
    const __m256i bsw = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)ab->bsums), hd->bs_w);
    if (fmt == FMT_Q6_K || fmt == FMT_Q3_K) {  /* codes are q + 32 (q + 4): take 32 (4) * sum_s sc_s * bsum_s off */
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bsw, fmt == FMT_Q6_K ? 5 : 2));
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(hd->d * ab->d), acc);
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(hd->d * ab->d), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(bsw), _mm256_set1_ps(hd->dmin * ab->d), acc);
}

INLINE void k_tile(int fmt, int64_t bs, int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb,
                   const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    __m256 acc[4][8];
    ZERO_ACC(acc)
    for (int64_t b = 0; b < k / STRATA_QK_K; b++)
        for (int r = 0; r < nr; r++) {
            const uint8_t *p = w + r * wrb + b * bs;
            if (nt < 4) {
                _mm_prefetch((const char *)(p + PF_AHEAD), _MM_HINT_T0);
                _mm_prefetch((const char *)(p + PF_AHEAD + 64), _MM_HINT_T0);
            }
            khead hd;
            k_head(fmt, p, &hd);
            __m256i isum[8];
            for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                __m256i sc;
                const __m256i q = k_chunk(fmt, p, &hd, c, &sc);
                for (int t = 0; t < nt; t++) {
                    const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
                    const __m256i av = _mm256_loadu_si256((const __m256i *)(ab->q + 32 * c));
                    isum[t] = madd_acc(isum[t], _mm256_maddubs_epi16(q, av), sc);
                }
            }
            for (int t = 0; t < nt; t++)
                acc[r][t] = k_finish(fmt, &hd, (const strata_block_act_q8k *)(a + t * arb) + b, isum[t], acc[r][t]);
        }
    store_tile(nr, nt, acc, y, ys);
}

/* Prefill over unpacked rows (qdot_avx2_common.h): chunk c's codes as k_chunk makes them; bw is
 * Q3_K's and Q6_K's code bias (4, 32) times minus each sub-block's scale (an integer term, as
 * k_finish takes it off), or the mins of Q2_K, Q4_K and Q5_K (a float term times dmin). The same
 * integer and float operations as k_tile's per block, so the same result up to the windows' order
 * of addition. */
INLINE void k_unpack(int fmt, const uint8_t *p, urow_block *u) {
    khead hd;
    k_head(fmt, p, &hd);
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) u->q[c] = k_chunk(fmt, p, &hd, c, &u->sc[c]);
    const int bias = fmt == FMT_Q6_K ? 32 : fmt == FMT_Q3_K ? 4 : 0;
    u->bw = bias ? _mm256_mullo_epi16(hd.bs_w, _mm256_set1_epi16((short)-bias)) : hd.bs_w;
    u->d = hd.d;
    u->dmin = bias ? 0.0f : hd.dmin;
}

/* Calls of this many tokens or more (every prefill call) run over unpacked rows: against the 1 x 8
 * and 1 x 4 tiles (Intel machine, AVX2 build, one thread, 256 x 4096, benchmarks/ab_builds.py)
 * 1.02-1.31x at 4 tokens, 1.13-1.45x at 5, 1.06-1.27x at 8, 1.14-1.37x at 16, 1.19-1.44x at 64. */
#define K_UR_MIN_TOKENS 4

/* Decode (1-3 tokens) a row at a time with all its tokens (their unpacking is the larger cost, and
 * 4-row tiles spill); 4 tokens or more over unpacked rows. */
#define DEFINE_K_DRIVER(name, fmt, wtype)                                                                  \
    void QDOT_AVX2_NAME(name)(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,           \
                              const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y,    \
                              int64_t ys) {                                                                \
        const int64_t bs = (int64_t)sizeof(wtype);                                                         \
        if (n_tok >= K_UR_MIN_TOKENS) {                                                                    \
            urow_rows(fmt, fmt == FMT_Q3_K || fmt == FMT_Q6_K ? UR_BIAS_INT : UR_BIAS_MIN, k_unpack, bs,   \
                      k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                            \
            return;                                                                                        \
        }                                                                                                  \
        for (int64_t r = 0; r < n_rows; r++) {                                                             \
            if (n_tok == 1) k_tile(fmt, bs, 1, 1, k, w + r * wrb, wrb, a, arb, y + r, ys);                 \
            else if (n_tok == 2) k_tile(fmt, bs, 1, 2, k, w + r * wrb, wrb, a, arb, y + r, ys);            \
            else if (n_tok == 3) k_tile(fmt, bs, 1, 3, k, w + r * wrb, wrb, a, arb, y + r, ys);            \
        }                                                                                                  \
    }

DEFINE_K_DRIVER(q2_k, FMT_Q2_K, strata_block_q2_k)
DEFINE_K_DRIVER(q3_k, FMT_Q3_K, strata_block_q3_k)
DEFINE_K_DRIVER(q4_k, FMT_Q4_K, strata_block_q4_k)
DEFINE_K_DRIVER(q5_k, FMT_Q5_K, strata_block_q5_k)
DEFINE_K_DRIVER(q6_k, FMT_Q6_K, strata_block_q6_k)

/* ---- Float weights against float32 activation rows: 8 products per FMA, scalar tail ---- */

enum { FMT_F32, FMT_F16, FMT_BF16 };

INLINE __m256 f_load8(int fmt, const uint8_t *p) {
    switch (fmt) {
    case FMT_F32: return _mm256_loadu_ps((const float *)p);
    case FMT_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    default: return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    }
}

INLINE float f_load1(int fmt, const uint8_t *p) {
    uint16_t h;
    float f;
    switch (fmt) {
    case FMT_F32: memcpy(&f, p, 4); return f;
    case FMT_F16: memcpy(&h, p, 2); return strata_half_to_f32(h);
    default: memcpy(&h, p, 2); return strata_bits_to_f32((uint32_t)h << 16);
    }
}

INLINE void f_tile(int fmt, int64_t es, int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb,
                   const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    __m256 acc[4][8];
    ZERO_ACC(acc)
    const int64_t k8 = k & ~(int64_t)7;
    for (int64_t i = 0; i < k8; i += 8)
        for (int r = 0; r < nr; r++) {
            const __m256 wv = f_load8(fmt, w + r * wrb + i * es);
            for (int t = 0; t < nt; t++)
                acc[r][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps((const float *)(a + t * arb) + i), acc[r][t]);
        }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            float tail = 0.0f;
            const float *x = (const float *)(a + t * arb);
            for (int64_t i = k8; i < k; i++) tail += f_load1(fmt, w + r * wrb + i * es) * x[i];
            y[t * ys + r] = hsum8(acc[r][t]) + tail;
        }
}

#define TILE_F32(nr, nt, ...) f_tile(FMT_F32, 4, nr, nt, __VA_ARGS__)
#define TILE_F16(nr, nt, ...) f_tile(FMT_F16, 2, nr, nt, __VA_ARGS__)
#define TILE_BF16(nr, nt, ...) f_tile(FMT_BF16, 2, nr, nt, __VA_ARGS__)
DEFINE_DRIVER(f32, TILE_F32, 4, 2, 4)
DEFINE_DRIVER(f16, TILE_F16, 4, 2, 4)
DEFINE_DRIVER(bf16, TILE_BF16, 4, 2, 4)

#else /* not x86: the names exist so the library links; qdot.c never hands them out */

#ifndef STRATA_QDOT_EVEX
void strata_qact_q8_avx2(const float *restrict x, void *restrict a, int64_t k) { strata_qact_q8_ref(x, a, k); }
void strata_qact_q8k_avx2(const float *restrict x, void *restrict a, int64_t k) { strata_qact_q8k_ref(x, a, k); }
#endif
STRATA_AVX2_FALLBACK(f32) STRATA_AVX2_FALLBACK(f16) STRATA_AVX2_FALLBACK(bf16) STRATA_AVX2_FALLBACK(q4_0) STRATA_AVX2_FALLBACK(q4_1) STRATA_AVX2_FALLBACK(q5_0) STRATA_AVX2_FALLBACK(q5_1) STRATA_AVX2_FALLBACK(q8_0) STRATA_AVX2_FALLBACK(mxfp4)
STRATA_AVX2_FALLBACK(q2_k) STRATA_AVX2_FALLBACK(q3_k) STRATA_AVX2_FALLBACK(q4_k) STRATA_AVX2_FALLBACK(q5_k) STRATA_AVX2_FALLBACK(q6_k)
#endif
