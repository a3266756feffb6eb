/*
 * AVX-512 VNNI decode tiles (1-3 tokens) of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and TQ2_0
 * against STRATA_ACT_Q8K. Interface and tolerance contract: qdot.h; the formats' integer
 * formulation: qdot_ref.c (K-quants) and qdot_iq.c (TQ2_0). Prefill stays on qdot_iq_vnni.c's tiles
 * (Q2_K, Q3_K) and the AVX2 build.
 *
 * A block's codes are made 64 at a time in element order, vector j holding elements 64 j .. 64 j +
 * 63, so they meet the activations as they lie (no re-layout). The code bytes of those elements sit
 * in one 32-byte run of the block (broadcast to both halves of a zmm) or one 64-byte run (Q6_K's
 * low bits), each half of the vector taking its own bits:
 *   Q2_K, Q3_K, TQ2_0  element 128 h + 32 s + l: bits 2 s, 2 s + 1 of qs[32 h + l]; Q3_K's third
 *                      bit: bit 4 h + s of hmask[l]
 *   Q4_K, Q5_K         element 64 j + l (l < 32): the low nibble of qs[32 j + l], 64 j + 32 + l
 *                      the high one; Q5_K's fifth bit: bit 2 j (2 j + 1) of qh[l]
 *   Q6_K               element 128 h + 64 v + m: nibble v of ql[64 h + m], and above it bits
 *                      4 v + 2 (m / 32), + 1 of qh[32 h + m % 32]
 * Per half one GF2P8AFFINEQB (its matrix per quadword) moves a code's bits to the bottom of its byte
 * and clears the rest (the build without GFNI: a per-quadword shift and an AND). A code with bits
 * from two bytes (Q3_K, Q5_K, Q6_K) takes one select (VPTERNLOGQ) first: the high bits' bytes are
 * moved once per block (one more affine step) so that each chunk's high bits lie clear of its low
 * bits, and the select puts both in one byte (the build without GFNI adds them with masked adds or
 * shifts, ANDs and ORs).
 *
 * VPDPBUSD of codes (unsigned) and activations leaves each 16 values' sum in four int32 lanes: a
 * 128-bit lane is a 16-value sub-block (Q2_K, Q3_K, Q6_K) or half of a 32-value one (Q4_K, Q5_K).
 * Those sums are below 2^15 (codes below 64, four products of at most 127), so two VPACKSSDW put the
 * four vectors' lanes in int16 and one VPMADDWD and one VPDPWSSD multiply them by their sub-blocks'
 * scales, laid out to match once per block. A code bias (Q3_K's 4, Q6_K's 32) comes off with the
 * activations' sums of 16 in the same int32 lanes (one more VPDPWSSD); the mins (Q2_K, Q4_K, Q5_K)
 * are a second float term (dmin), as qdot_ref.c forms them. TQ2_0 has no sub-block scales: its four
 * VPDPBUSD chain into one sum, which starts at minus the activations' sum (its codes are value + 1).
 *
 * Per block and token the sums convert to float once and add into 16 lanes (d * a.d), summed at
 * the row's end: the same integers as the scalar tile, up to the order of the float additions.
 * One row at a time with all its tokens, fetching PF_AHEAD bytes ahead into the thread's rows.
 * The ISA is enabled for this translation unit only; qdot.c hands these tiles out only for
 * STRATA_IMPL_AVX512.
 */
#include "qdot.h"

/* Two builds: this file (names _kz: shifts and ANDs) and qdot_kquant_zmm_gfni.c (KZ_GFNI defined,
 * names _kzgfni: the codes made by GF2P8AFFINEQB), which qdot.c takes where the CPU has GFNI. */
#ifdef KZ_GFNI
#define KZ_NAME(name) strata_qdot_##name##_kzgfni
#else
#define KZ_NAME(name) strata_qdot_##name##_kz
#endif

#if defined(__x86_64__) || defined(__i386__)
#ifdef KZ_GFNI
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,gfni,avx2,fma,f16c")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define PF_AHEAD 3072
#include "qdot_prefetch.h"

enum { KZ_Q2_K, KZ_Q3_K, KZ_Q4_K, KZ_Q5_K, KZ_Q6_K, KZ_TQ2_0 };

INLINE int64_t kz_block_bytes(int fmt) {
    switch (fmt) {
    case KZ_Q2_K: return sizeof(strata_block_q2_k);
    case KZ_Q3_K: return sizeof(strata_block_q3_k);
    case KZ_Q4_K: return sizeof(strata_block_q4_k);
    case KZ_Q5_K: return sizeof(strata_block_q5_k);
    case KZ_Q6_K: return sizeof(strata_block_q6_k);
    default: return sizeof(strata_block_tq2_0);
    }
}

/* Formats with mins (a dmin term), with a code bias (taken off with the bsums), with 32-value
 * sub-blocks. */
INLINE int kz_has_min(int fmt) { return fmt == KZ_Q2_K || fmt == KZ_Q4_K || fmt == KZ_Q5_K; }
INLINE int kz_bias(int fmt) { return fmt == KZ_Q3_K ? 4 : fmt == KZ_Q6_K ? 32 : 0; }
INLINE int kz_sub32(int fmt) { return fmt == KZ_Q4_K || fmt == KZ_Q5_K; }

/* One block made ready for its tokens. */
typedef struct {
    __m512i q[4];          /* codes, elements 64 j .. 64 j + 63 */
    __m512i s01, s23;      /* int16 scales matching the packed sums (see kz_isum) */
    __m256i bw;            /* int16 weights of the activations' 16 sums: the mins (Q4_K, Q5_K: each
                            * twice), -bias * scale (Q3_K, Q6_K), -1 (TQ2_0) */
    __m128 dd;             /* d (with mins: d, dmin) */
} kz_block;

/* Q3_K's 16 six-bit scales minus 32, as int16 (moved to the vector as two 64-bit words: 1.04x the
 * decode at 1 token against four 32-bit ones). */
INLINE __m256i q3_k_scales16(const uint8_t *s) {
    uint32_t w[4];
    strata_q3_k_scale_words(s, w);
    const __m128i v = _mm_set_epi64x((long long)((uint64_t)w[3] << 32 | w[2]), (long long)((uint64_t)w[1] << 32 | w[0]));
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(v, _mm_set1_epi8(32)));
}

/* Q4_K's and Q5_K's 8 six-bit scales (bytes 0-7) and mins (bytes 8-15). */
INLINE __m128i k4_scales_mins(const uint8_t *s) {
    uint32_t w[4];
    strata_k_scale_min_words(s, w);
    return _mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
}

/* A GF2P8AFFINEQB matrix (one quadword) that moves input bit from[i] of every byte to output bit i
 * (from[i] < 0: the output bit is 0): output bit i is the parity of matrix byte 7 - i and the input. */
INLINE long long gf_bits(int f0, int f1, int f2, int f3, int f4, int f5) {
    const int from[6] = {f0, f1, f2, f3, f4, f5};
    uint64_t m = 0;
    for (int i = 0; i < 6; i++)
        if (from[i] >= 0) m |= (uint64_t)1 << (8 * (7 - i) + from[i]);
    return (long long)m;
}

/* The matrix that moves input bit c to bit to[c], for all 8 bits. */
INLINE long long gf_move(const int to[8]) {
    uint64_t m = 0;
    for (int c = 0; c < 8; c++) m |= (uint64_t)1 << (8 * (7 - to[c]) + c);
    return (long long)m;
}

/* The same quadword in the low four quadwords (a zmm's low half), another in the high four. */
INLINE __m512i halves(long long lo, long long hi) { return _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo); }
INLINE __m512i bcast32(const uint8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }

/* Chunk c (32 values) of Q3_K and Q5_K takes hmask's (qh's) bit c; its low bits are qs bits 2 (c % 4),
 * 2 (c % 4) + 1 (Q3_K) or nibble c % 2 (Q5_K). The high bit is moved to this bit, clear of them. */
#define Q3_HBIT(c) ((2 * ((c) % 4) + 2 + (c) / 4) % 8)
#define Q5_HBIT(c) ((c) % 2 ? (c) / 2 : 4 + (c) / 2)

/* Word m of 128-bit lane L of the packed sums (kz_isum) belongs to the sub-block whose scale is word
 * WORD(L, m) of the 16 scales (first vector pair; the second adds `next`). 16-value sub-blocks
 * (vector j's lane L is sub-block 4 j + L): L + 4 (m / 4), next 8. 32-value ones (lane L is half of
 * sub-block 2 j + L / 2): L / 2 + 2 (m / 4), next 4. */
#define SCALE_WORDS(W, base)                                                                             \
    _mm512_set_epi16(base + W(3, 4), base + W(3, 4), base + W(3, 4), base + W(3, 4), base + W(3, 0),     \
                     base + W(3, 0), base + W(3, 0), base + W(3, 0), base + W(2, 4), base + W(2, 4),     \
                     base + W(2, 4), base + W(2, 4), base + W(2, 0), base + W(2, 0), base + W(2, 0),     \
                     base + W(2, 0), base + W(1, 4), base + W(1, 4), base + W(1, 4), base + W(1, 4),     \
                     base + W(1, 0), base + W(1, 0), base + W(1, 0), base + W(1, 0), base + W(0, 4),     \
                     base + W(0, 4), base + W(0, 4), base + W(0, 4), base + W(0, 0), base + W(0, 0),     \
                     base + W(0, 0), base + W(0, 0))
#define WORD16(L, m) ((L) + 4 * ((m) / 4))
#define WORD32(L, m) ((L) / 2 + 2 * ((m) / 4))

/* Vector j's codes of the 2-bit formats (Q2_K, Q3_K, TQ2_0): chunks c0 = 2 j (low half) and c1 =
 * 2 j + 1 (high half) of qs half j / 2; Q3_K's hmask bits, moved (GFNI) or as they are, in hm. */
INLINE __m512i codes2(int fmt, const uint8_t *qs, __m512i hm, int j) {
    const int c0 = 2 * j, c1 = 2 * j + 1, s0 = 2 * (c0 % 4), s1 = 2 * (c1 % 4);
    const __m512i x = bcast32(qs + 32 * (j / 2));
#ifdef KZ_GFNI
    if (fmt == KZ_Q3_K) {  /* qs's bits where the chunk has them, hmask's moved bits elsewhere */
        const __m512i both = _mm512_ternarylogic_epi64(
            x, hm, halves((long long)(0x0303030303030303ull << s0), (long long)(0x0303030303030303ull << s1)), 0xe4);
        return _mm512_gf2p8affine_epi64_epi8(both, halves(gf_bits(s0, s0 + 1, Q3_HBIT(c0), -1, -1, -1),
                                                          gf_bits(s1, s1 + 1, Q3_HBIT(c1), -1, -1, -1)), 0);
    }
    return _mm512_gf2p8affine_epi64_epi8(x, halves(gf_bits(s0, s0 + 1, -1, -1, -1, -1), gf_bits(s1, s1 + 1, -1, -1, -1, -1)), 0);
#else
    __m512i q = _mm512_and_si512(_mm512_srlv_epi64(x, halves(s0, s1)), _mm512_set1_epi8(3));
    if (fmt == KZ_Q3_K) {  /* + 4 where hmask's bit c is set */
        const __m512i bit = halves((long long)(0x0101010101010101ull << c0), (long long)(0x0101010101010101ull << c1));
        q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hm, bit), q, _mm512_set1_epi8(4));
    }
    return q;
#endif
}

/* Vector j's codes of Q4_K and Q5_K: the low (high) nibbles of qs[32 j ..] in the low (high) half;
 * Q5_K's qh bits 2 j, 2 j + 1, moved (GFNI) or as they are, in hm. */
INLINE __m512i codes4(int fmt, const uint8_t *qs, __m512i hm, int j) {
    const int c0 = 2 * j, c1 = 2 * j + 1;
    const __m512i x = bcast32(qs + 32 * j);
#ifdef KZ_GFNI
    if (fmt == KZ_Q5_K) {
        const __m512i both = _mm512_ternarylogic_epi64(x, hm, halves(0x0f0f0f0f0f0f0f0fll, (long long)0xf0f0f0f0f0f0f0f0ull), 0xe4);
        return _mm512_gf2p8affine_epi64_epi8(both, halves(gf_bits(0, 1, 2, 3, Q5_HBIT(c0), -1),
                                                          gf_bits(4, 5, 6, 7, Q5_HBIT(c1), -1)), 0);
    }
    return _mm512_gf2p8affine_epi64_epi8(x, halves(gf_bits(0, 1, 2, 3, -1, -1), gf_bits(4, 5, 6, 7, -1, -1)), 0);
#else
    __m512i q = _mm512_and_si512(_mm512_srlv_epi64(x, halves(0, 4)), _mm512_set1_epi8(15));
    if (fmt == KZ_Q5_K) {  /* + 16 where qh's bit c is set */
        const __m512i bit = halves((long long)(0x0101010101010101ull << c0), (long long)(0x0101010101010101ull << c1));
        q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hm, bit), q, _mm512_set1_epi8(16));
    }
    return q;
#endif
}

/* Vector 2 h + v of Q6_K: nibble v of ql[64 h ..] (a full zmm), with qh[32 h ..] (broadcast;
 * GFNI: its nibbles swapped) giving bits 4 v, 4 v + 1 (low half) and 4 v + 2, 4 v + 3 (high half). */
INLINE __m512i codes6(__m512i ql, __m512i qh, int v) {
#ifdef KZ_GFNI
    const long long nib = v ? (long long)0xf0f0f0f0f0f0f0f0ull : 0x0f0f0f0f0f0f0f0fll;
    const __m512i both = _mm512_ternarylogic_epi64(ql, qh, _mm512_set1_epi64(nib), 0xe4);
    /* the swapped qh bit of qh bit b is (b + 4) % 8 */
    const int l0 = (4 * v + 4) % 8, l1 = (4 * v + 6) % 8, n = 4 * v;
    return _mm512_gf2p8affine_epi64_epi8(both, halves(gf_bits(n, n + 1, n + 2, n + 3, l0, l0 + 1),
                                                      gf_bits(n, n + 1, n + 2, n + 3, l1, l1 + 1)), 0);
#else
    const __m512i lo = _mm512_and_si512(v ? _mm512_srli_epi16(ql, 4) : ql, _mm512_set1_epi8(15));
    const __m512i up = v ? _mm512_srlv_epi64(qh, halves(0, 2)) : _mm512_sllv_epi64(qh, halves(4, 2));
    return _mm512_or_si512(lo, _mm512_and_si512(up, _mm512_set1_epi8(0x30)));
#endif
}

INLINE void kz_unpack(int fmt, const uint8_t *p, kz_block *kb) {
    __m256i sc16;
    switch (fmt) {
    case KZ_TQ2_0: {
        const strata_block_tq2_0 *b = (const strata_block_tq2_0 *)p;
        for (int j = 0; j < 4; j++) kb->q[j] = codes2(fmt, b->qs, _mm512_setzero_si512(), j);
        kb->dd = _mm_cvtph_ps(_mm_cvtsi32_si128(strata_u16(p + offsetof(strata_block_tq2_0, d))));
        kb->bw = _mm256_set1_epi16(-1);
        return;
    }
    case KZ_Q2_K: {  /* scales[s]: scale in the low nibble, min in the high one */
        const strata_block_q2_k *b = (const strata_block_q2_k *)p;
        for (int j = 0; j < 4; j++) kb->q[j] = codes2(fmt, b->qs, _mm512_setzero_si512(), j);
        const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        sc16 = _mm256_and_si256(sm, _mm256_set1_epi16(15));
        kb->bw = _mm256_srli_epi16(sm, 4);
        kb->dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)strata_u32(p + offsetof(strata_block_q2_k, d))));   /* d, dmin */
        break;
    }
    case KZ_Q3_K: {  /* codes are the value + 4 */
        const strata_block_q3_k *b = (const strata_block_q3_k *)p;
        __m512i hm = bcast32(b->hmask);
#ifdef KZ_GFNI
        const int to[8] = {Q3_HBIT(0), Q3_HBIT(1), Q3_HBIT(2), Q3_HBIT(3), Q3_HBIT(4), Q3_HBIT(5), Q3_HBIT(6), Q3_HBIT(7)};
        hm = _mm512_gf2p8affine_epi64_epi8(hm, _mm512_set1_epi64(gf_move(to)), 0);
#endif
        for (int j = 0; j < 4; j++) kb->q[j] = codes2(fmt, b->qs, hm, j);
        sc16 = q3_k_scales16(b->scales);
        kb->dd = _mm_cvtph_ps(_mm_cvtsi32_si128(b->d));
        break;
    }
    case KZ_Q4_K:
    case KZ_Q5_K: {  /* d, dmin and the scales at the same offsets */
        const strata_block_q4_k *b4 = (const strata_block_q4_k *)p;
        const uint8_t *qs = fmt == KZ_Q4_K ? b4->qs : ((const strata_block_q5_k *)p)->qs;
        __m512i hm = _mm512_setzero_si512();
        if (fmt == KZ_Q5_K) {
            hm = bcast32(((const strata_block_q5_k *)p)->qh);
#ifdef KZ_GFNI
            const int to[8] = {Q5_HBIT(0), Q5_HBIT(1), Q5_HBIT(2), Q5_HBIT(3), Q5_HBIT(4), Q5_HBIT(5), Q5_HBIT(6), Q5_HBIT(7)};
            hm = _mm512_gf2p8affine_epi64_epi8(hm, _mm512_set1_epi64(gf_move(to)), 0);
#endif
        }
        for (int j = 0; j < 4; j++) kb->q[j] = codes4(fmt, qs, hm, j);
        const __m128i sm = k4_scales_mins(b4->scales);
        sc16 = _mm256_cvtepu8_epi16(sm);   /* words 0-7 the scales (8-15, the mins, unused) */
        kb->bw = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
        kb->dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)strata_u32(p)));
        break;
    }
    default: {  /* Q6_K: codes are the value + 32 */
        const strata_block_q6_k *b = (const strata_block_q6_k *)p;
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
            __m512i qh = bcast32(b->qh + 32 * h);
#ifdef KZ_GFNI
            qh = _mm512_gf2p8affine_epi64_epi8(qh, _mm512_set1_epi64(gf_move((const int[8]){4, 5, 6, 7, 0, 1, 2, 3})), 0);
#endif
            kb->q[2 * h] = codes6(ql, qh, 0);
            kb->q[2 * h + 1] = codes6(ql, qh, 1);
        }
        sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        kb->dd = _mm_cvtph_ps(_mm_cvtsi32_si128(b->d));
    }
    }
    if (kz_bias(fmt)) kb->bw = _mm256_mullo_epi16(sc16, _mm256_set1_epi16((short)-kz_bias(fmt)));
    const __m512i wide = _mm512_castsi256_si512(sc16);   /* the indices stay below 16 */
    if (kz_sub32(fmt)) {
        kb->s01 = _mm512_permutexvar_epi16(SCALE_WORDS(WORD32, 0), wide);
        kb->s23 = _mm512_permutexvar_epi16(SCALE_WORDS(WORD32, 4), wide);
    } else {
        kb->s01 = _mm512_permutexvar_epi16(SCALE_WORDS(WORD16, 0), wide);
        kb->s23 = _mm512_permutexvar_epi16(SCALE_WORDS(WORD16, 8), wide);
    }
}

/* The block's integer sums for one activation block, in 16 int32 lanes (their total is the scalar
 * tile's isum; the mins' term apart). */
INLINE __m512i kz_isum(int fmt, const kz_block *kb, const strata_block_act_q8k *ab) {
    const __m512i bsums = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)ab->bsums));
    const __m512i zero = _mm512_setzero_si512();
    if (fmt == KZ_TQ2_0) {
        __m512i s = _mm512_dpwssd_epi32(zero, bsums, _mm512_zextsi256_si512(kb->bw));
        for (int j = 0; j < 4; j++) s = _mm512_dpbusd_epi32(s, kb->q[j], _mm512_loadu_si512(ab->q + 64 * j));
        return s;
    }
    __m512i dj[4];
    for (int j = 0; j < 4; j++) dj[j] = _mm512_dpbusd_epi32(zero, kb->q[j], _mm512_loadu_si512(ab->q + 64 * j));
    __m512i s = _mm512_madd_epi16(_mm512_packs_epi32(dj[0], dj[1]), kb->s01);
    s = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(dj[2], dj[3]), kb->s23);
    if (kz_bias(fmt)) s = _mm512_dpwssd_epi32(s, bsums, _mm512_zextsi256_si512(kb->bw));
    return s;
}

/* One row x nt (1-3) tokens over the whole row: y[t * ys]. */
INLINE void kz_row(int fmt, int nt, int64_t k, const uint8_t *w, const uint8_t *a, int64_t arb, float *y,
                   int64_t ys, const uint8_t *ahead_end) {
    const int64_t bs = kz_block_bytes(fmt);
    __m512 acc[3] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m256 accm[3] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < k / STRATA_QK_K; b++) {
        const uint8_t *p = w + b * bs;
        fetch_block_ahead(p, bs, ahead_end);
        kz_block kb;
        kz_unpack(fmt, p, &kb);
        for (int t = 0; t < nt; t++) {
            const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
            const __m512i s = kz_isum(fmt, &kb, ab);
            const __m128 f = _mm_mul_ps(kb.dd, _mm_set1_ps(ab->d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_broadcastss_ps(f), acc[t]);
            if (kz_has_min(fmt)) {
                const __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)ab->bsums), kb.bw);
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_broadcastss_ps(_mm_movehdup_ps(f)), accm[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        float v = _mm512_reduce_add_ps(acc[t]);
        if (kz_has_min(fmt)) v -= _mm512_reduce_add_ps(_mm512_zextps256_ps512(accm[t]));
        y[t * ys] = v;
    }
}

/* Decode calls (1-3 tokens) row by row; more tokens (leftovers of a prefill tile) go to the AVX2
 * build, which unpacks a block once for all of them. */
#define DEFINE_KZ_DECODE(name, FMT)                                                                       \
    void KZ_NAME(name)(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,                 \
                       const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) { \
        if (n_tok >= STRATA_QDOT_DECODE_TOKENS) {                                                         \
            strata_qdot_##name##_evex(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                           \
            return;                                                                                       \
        }                                                                                                 \
        if (n_tok <= 0) return;                                                                           \
        const uint8_t *ahead_end = strata_qdot_ahead();                                                   \
        for (int64_t r = 0; r < n_rows; r++) {                                                            \
            if (n_tok == 1) kz_row(FMT, 1, k, w + r * wrb, a, arb, y + r, ys, ahead_end);                 \
            else if (n_tok == 2) kz_row(FMT, 2, k, w + r * wrb, a, arb, y + r, ys, ahead_end);            \
            else kz_row(FMT, 3, k, w + r * wrb, a, arb, y + r, ys, ahead_end);                            \
        }                                                                                                 \
    }

#else /* not x86: the names exist so the library links; qdot.c hands them out only for AVX512 */

#define DEFINE_KZ_DECODE(name, FMT)                                                                       \
    void KZ_NAME(name)(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,                 \
                       const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) { \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                \
    }
#endif

DEFINE_KZ_DECODE(q2_k, KZ_Q2_K)
DEFINE_KZ_DECODE(q3_k, KZ_Q3_K)
DEFINE_KZ_DECODE(q4_k, KZ_Q4_K)
DEFINE_KZ_DECODE(q5_k, KZ_Q5_K)
DEFINE_KZ_DECODE(q6_k, KZ_Q6_K)
DEFINE_KZ_DECODE(tq2_0, KZ_TQ2_0)
