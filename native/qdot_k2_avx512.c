/*
 * AVX-512 VNNI decode tiles (1-3 tokens) of the formats whose codes are 2-bit planes of one 64-byte
 * array: Q2_K, Q3_K (plus a high bit from hmask) and TQ2_0, against STRATA_ACT_Q8K. Interface and
 * tolerance contract: qdot.h; the formats' integer formulation: qdot_ref.c (Q2_K, Q3_K) and
 * qdot_iq.c (TQ2_0). Prefill stays on qdot_iq_vnni.c's tiles (Q2_K, Q3_K) and the AVX2 build.
 *
 * Element 128 h + 32 s + l of a block is bits 2 s, 2 s + 1 of qs[32 h + l] (Q3_K's third bit: bit
 * h * 4 + s of hmask[l]). With half h of qs broadcast to both halves of a zmm, one per-quadword
 * shift (0 and 2, or 4 and 6) and an AND give 64 codes in element order: vector j holds elements
 * 64 j .. 64 j + 63, so it meets the activations as they lie (no re-layout), and each 128-bit lane
 * of it is one 16-value sub-block (4 j + lane). VPDPBUSD of codes (unsigned) and activations leaves
 * each sub-block's sum in the four int32 lanes of its 128-bit lane.
 *
 * Q2_K, Q3_K: two VPACKSSDW put the four vectors' lanes in int16 (the sums are below 2^12: codes
 * below 8, four products of at most 127) so that one VPMADDWD and one VPDPWSSD multiply them by
 * their sub-blocks' scales, laid out to match once per block. The code bias (Q3_K's 4) comes off
 * with the activations' sums of 16 in the same int32 lanes (one more VPDPWSSD); Q2_K's mins are a
 * second float term (dmin), as qdot_ref.c forms it. TQ2_0 has no sub-block scales: the four
 * VPDPBUSD chain into one sum, which starts at minus the activations' sum (its codes are value + 1).
 *
 * Per block and token the sums convert to float once and add into 16 lanes (d * a.d), summed at
 * the row's end: the same integers as the scalar tile, up to the order of the float additions.
 * One row at a time with all its tokens, fetching PF_AHEAD bytes ahead into the thread's rows.
 * The ISA is enabled for this translation unit only; qdot.c hands these tiles out only for
 * STRATA_IMPL_AVX512.
 */
#include "qdot.h"

/* Two builds: this file (names _k2: shifts and ANDs) and qdot_k2_gfni.c (K2_GFNI defined, names
 * _k2gfni: the codes made by GF2P8AFFINEQB, one operation for a shift and an AND), which qdot.c
 * takes where the CPU has GFNI. */
#ifdef K2_GFNI
#define K2_NAME(name) strata_qdot_##name##_k2gfni
#else
#define K2_NAME(name) strata_qdot_##name##_k2
#endif

#if defined(__x86_64__) || defined(__i386__)
#ifdef K2_GFNI
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,gfni,avx2,fma,f16c")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif
#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define PF_AHEAD 3072
#include "qdot_prefetch.h"

enum { K2_Q2_K, K2_Q3_K, K2_TQ2_0 };

INLINE int64_t k2_block_bytes(int fmt) {
    return fmt == K2_Q2_K ? (int64_t)sizeof(strata_block_q2_k)
         : fmt == K2_Q3_K ? (int64_t)sizeof(strata_block_q3_k) : (int64_t)sizeof(strata_block_tq2_0);
}

INLINE const uint8_t *k2_qs(int fmt, const uint8_t *p) {
    return fmt == K2_Q2_K ? ((const strata_block_q2_k *)p)->qs
         : fmt == K2_Q3_K ? ((const strata_block_q3_k *)p)->qs : ((const strata_block_tq2_0 *)p)->qs;
}

INLINE uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

INLINE uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One block made ready for its tokens. */
typedef struct {
    __m512i q[4];          /* codes, elements 64 j .. 64 j + 63 */
    __m512i s01, s23;      /* Q2_K, Q3_K: int16 scales matching the packed sums (see k2_isum) */
    __m256i bw;            /* int16 weights of the activations' 16 sums: Q2_K's mins, Q3_K's -4 * scale,
                            * TQ2_0's -1 */
    __m128 dd;             /* d (Q2_K: d, dmin) */
} k2_block;

/* Q3_K's 16 six-bit scales minus 32 (layout: common.h's strata_q3_k_scale), as int16: scales 0-7
 * take the low nibbles of bytes 0-7, 8-15 their high nibbles; two bits of bytes 8-11 each complete
 * them (bits 0-1 for 0-3, 2-3 for 4-7, 4-5 for 8-11, 6-7 for 12-15). Made in two 64-bit words. */
INLINE __m256i q3_k_scales16(const uint8_t *s) {
    uint64_t a;
    memcpy(&a, s, 8);
    const uint64_t t = u32_at(s + 8), m2 = 0x03030303u, m4 = 0x0f0f0f0f0f0f0f0full;
    const uint64_t lo = (a & m4) | ((t & m2) | ((t >> 2) & m2) << 32) << 4;
    const uint64_t hi = ((a >> 4) & m4) | (((t >> 4) & m2) | ((t >> 6) & m2) << 32) << 4;
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_set_epi64x((long long)hi, (long long)lo), _mm_set1_epi8(32)));
}

/* A GF2P8AFFINEQB matrix (one quadword) that moves input bit from[i] of every byte to output bit i
 * (from[i] < 0: the output bit is 0): output bit i is the parity of matrix byte 7 - i and the input. */
INLINE long long gf_bits(int f0, int f1, int f2) {
    const int from[3] = {f0, f1, f2};
    uint64_t m = 0;
    for (int i = 0; i < 3; i++)
        if (from[i] >= 0) m |= (uint64_t)1 << (8 * (7 - i) + from[i]);
    return (long long)m;
}

/* Chunk c's hmask bit goes to this bit of the byte, clear of the chunk's qs bits 2 (c % 4), 2 (c % 4) + 1. */
#define K2_HBIT(c) ((2 * ((c) % 4) + 2 + (c) / 4) % 8)

/* The same matrix in the low four quadwords (a zmm's low half), another in the high four. */
INLINE __m512i gf_halves(long long lo, long long hi) { return _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo); }

/* Word m of 128-bit lane i of the packed sums (k2_isum) belongs to sub-block i + 4 (m / 4) of the
 * first vector pair, i + 8 + 4 (m / 4) of the second: the scales' word indices in that order. */
#define K2_SCALE_WORDS(base)                                                                          \
    _mm512_set_epi16(base + 7, base + 7, base + 7, base + 7, base + 3, base + 3, base + 3, base + 3,   \
                     base + 6, base + 6, base + 6, base + 6, base + 2, base + 2, base + 2, base + 2,   \
                     base + 5, base + 5, base + 5, base + 5, base + 1, base + 1, base + 1, base + 1,   \
                     base + 4, base + 4, base + 4, base + 4, base + 0, base + 0, base + 0, base + 0)

/* GF2P8AFFINEQB's matrix moving hmask bit c to bit K2_HBIT(c) of every byte. */
INLINE long long gf_hbits(void) {
    uint64_t m = 0;
    for (int c = 0; c < 8; c++) m |= (uint64_t)1 << (8 * (7 - K2_HBIT(c)) + c);
    return (long long)m;
}

/* Bits 2 (c % 4), 2 (c % 4) + 1 of every byte: chunk c's qs bits. */
INLINE long long qs_bits(int c) { return (long long)(0x0303030303030303ull << 2 * (c % 4)); }

INLINE void k2_unpack(int fmt, const uint8_t *p, k2_block *kb) {
    const uint8_t *qs = k2_qs(fmt, p);
    __m512i hm = _mm512_setzero_si512();
    if (fmt == K2_Q3_K) {
        hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const strata_block_q3_k *)p)->hmask));
#ifdef K2_GFNI
        hm = _mm512_gf2p8affine_epi64_epi8(hm, _mm512_set1_epi64(gf_hbits()), 0);
#endif
    }
    for (int j = 0; j < 4; j++) {  /* vector j: chunks c = 2 j (low half) and 2 j + 1 (high half) */
        const int c0 = 2 * j, c1 = 2 * j + 1;
        const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2))));
#ifdef K2_GFNI
        if (fmt == K2_Q3_K) {  /* qs's bits where the chunk has them, hmask's moved bits elsewhere */
            const __m512i both = _mm512_ternarylogic_epi64(x, hm, gf_halves(qs_bits(c0), qs_bits(c1)), 0xe4);
            kb->q[j] = _mm512_gf2p8affine_epi64_epi8(
                both, gf_halves(gf_bits(2 * (c0 % 4), 2 * (c0 % 4) + 1, K2_HBIT(c0)),
                                gf_bits(2 * (c1 % 4), 2 * (c1 % 4) + 1, K2_HBIT(c1))), 0);
        } else {
            kb->q[j] = _mm512_gf2p8affine_epi64_epi8(
                x, gf_halves(gf_bits(2 * (c0 % 4), 2 * (c0 % 4) + 1, -1), gf_bits(2 * (c1 % 4), 2 * (c1 % 4) + 1, -1)), 0);
        }
#else
        const __m512i shift = gf_halves(2 * (c0 % 4), 2 * (c1 % 4));
        kb->q[j] = _mm512_and_si512(_mm512_srlv_epi64(x, shift), _mm512_set1_epi8(3));
        if (fmt == K2_Q3_K) {  /* + 4 where hmask's bit c is set */
            const __m512i bit = gf_halves((long long)(0x0101010101010101ull << c0), (long long)(0x0101010101010101ull << c1));
            kb->q[j] = _mm512_mask_add_epi8(kb->q[j], _mm512_test_epi8_mask(hm, bit), kb->q[j], _mm512_set1_epi8(4));
        }
#endif
    }
    if (fmt == K2_TQ2_0) {
        kb->dd = _mm_cvtph_ps(_mm_cvtsi32_si128(u16_at(p + offsetof(strata_block_tq2_0, d))));
        kb->bw = _mm256_set1_epi16(-1);
        return;
    }
    __m256i sc16;
    if (fmt == K2_Q2_K) {  /* scales[s]: scale in the low nibble, min in the high one */
        const strata_block_q2_k *b = (const strata_block_q2_k *)p;
        const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        sc16 = _mm256_and_si256(sm, _mm256_set1_epi16(15));
        kb->bw = _mm256_srli_epi16(sm, 4);
        kb->dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)u32_at(p + offsetof(strata_block_q2_k, d))));   /* d, dmin */
    } else {  /* Q3_K: codes are the value + 4 */
        const strata_block_q3_k *b = (const strata_block_q3_k *)p;
        sc16 = q3_k_scales16(b->scales);
        kb->bw = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), sc16), 2);
        kb->dd = _mm_cvtph_ps(_mm_cvtsi32_si128(b->d));
    }
    const __m512i wide = _mm512_castsi256_si512(sc16);   /* the indices stay below 16 */
    kb->s01 = _mm512_permutexvar_epi16(K2_SCALE_WORDS(0), wide);
    kb->s23 = _mm512_permutexvar_epi16(K2_SCALE_WORDS(8), wide);
}

/* The block's integer sums for one activation block, in 16 int32 lanes (their total is the scalar
 * tile's isum; Q2_K's mins term apart). */
INLINE __m512i k2_isum(int fmt, const k2_block *kb, const strata_block_act_q8k *ab) {
    const __m512i bsums = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)ab->bsums));
    const __m512i zero = _mm512_setzero_si512();
    if (fmt == K2_TQ2_0) {
        __m512i s = _mm512_dpwssd_epi32(zero, bsums, _mm512_zextsi256_si512(kb->bw));
        for (int j = 0; j < 4; j++) s = _mm512_dpbusd_epi32(s, kb->q[j], _mm512_loadu_si512(ab->q + 64 * j));
        return s;
    }
    __m512i dj[4];
    for (int j = 0; j < 4; j++) dj[j] = _mm512_dpbusd_epi32(zero, kb->q[j], _mm512_loadu_si512(ab->q + 64 * j));
    __m512i s = _mm512_madd_epi16(_mm512_packs_epi32(dj[0], dj[1]), kb->s01);
    s = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(dj[2], dj[3]), kb->s23);
    if (fmt == K2_Q3_K) s = _mm512_dpwssd_epi32(s, bsums, _mm512_zextsi256_si512(kb->bw));
    return s;
}

/* One row x nt (1-3) tokens over the whole row: y[t * ys]. */
INLINE void k2_row(int fmt, int nt, int64_t k, const uint8_t *w, const uint8_t *a, int64_t arb, float *y,
                   int64_t ys, const uint8_t *ahead_end) {
    const int64_t bs = k2_block_bytes(fmt);
    __m512 acc[3] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m256 accm[3] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < k / STRATA_QK_K; b++) {
        const uint8_t *p = w + b * bs;
        fetch_block_ahead(p, bs, ahead_end);
        k2_block kb;
        k2_unpack(fmt, p, &kb);
        for (int t = 0; t < nt; t++) {
            const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
            const __m512i s = k2_isum(fmt, &kb, ab);
            const __m128 f = _mm_mul_ps(kb.dd, _mm_set1_ps(ab->d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_broadcastss_ps(f), acc[t]);
            if (fmt == K2_Q2_K) {
                const __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)ab->bsums), kb.bw);
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_broadcastss_ps(_mm_movehdup_ps(f)), accm[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        float v = _mm512_reduce_add_ps(acc[t]);
        if (fmt == K2_Q2_K) v -= _mm512_reduce_add_ps(_mm512_zextps256_ps512(accm[t]));
        y[t * ys] = v;
    }
}

/* Decode calls (1-3 tokens) row by row; more tokens (leftovers of a prefill tile) go to the AVX2
 * build, which unpacks a block once for all of them. */
#define DEFINE_K2_DECODE(name, FMT)                                                                      \
    void K2_NAME(name)(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,      \
                                 const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, \
                                 int64_t ys) {                                                           \
        if (n_tok >= STRATA_QDOT_DECODE_TOKENS) {                                                        \
            strata_qdot_##name##_evex(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                          \
            return;                                                                                      \
        }                                                                                                \
        const uint8_t *ahead_end = strata_qdot_ahead();                                                  \
        for (int64_t r = 0; r < n_rows; r++) {                                                           \
            if (n_tok == 1) k2_row(FMT, 1, k, w + r * wrb, a, arb, y + r, ys, ahead_end);                \
            else if (n_tok == 2) k2_row(FMT, 2, k, w + r * wrb, a, arb, y + r, ys, ahead_end);           \
            else k2_row(FMT, 3, k, w + r * wrb, a, arb, y + r, ys, ahead_end);                           \
        }                                                                                                \
    }
DEFINE_K2_DECODE(q2_k, K2_Q2_K)
DEFINE_K2_DECODE(q3_k, K2_Q3_K)
DEFINE_K2_DECODE(tq2_0, K2_TQ2_0)

#else /* not x86: the names exist so the library links; qdot.c hands them out only for AVX512 */

#define K2_FALLBACK(name)                                                                                \
    void K2_NAME(name)(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,      \
                                 const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, \
                                 int64_t ys) {                                                           \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                               \
    }
K2_FALLBACK(q2_k) K2_FALLBACK(q3_k) K2_FALLBACK(tq2_0)
#endif
