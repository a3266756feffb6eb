/*
 * AVX-512 (F, BW, VL, VNNI) tile kernels of the 4- and 5-bit formats of one scale per 32 values
 * against STRATA_ACT_Q8: Q4_0, Q4_1, Q5_0, Q5_1, MXFP4 and IQ4_NL, in tiles of 8 rows (the file's
 * row layout as it is).
 * Interface and tolerance contract: qdot.h; the activation quantizers and the other formats:
 * qdot_avx512.c. The ISA is enabled for this translation unit only; strata_qdot_find hands these
 * kernels out only for STRATA_IMPL_AVX512.
 */
#include "qdot.h"
#include <stddef.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
#include "qdot_prefetch.h"
#include "iq_tables.h"

#define MXFP4_OFFSET 12   /* the doubled E2M1 values are -12..12 */

INLINE float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ---- Nibble formats (Q4_0, MXFP4, IQ4_NL) over 8 rows at a time, 256-bit VNNI ----
 *
 * A block is a scale and 16 bytes of 4-bit codes (low nibbles: elements 0-15). Two rows per ymm:
 * row r's 16 code bytes in the low half, row r + 4's in the high half, so one AND gives both rows'
 * low-nibble codes (against the activation's first 16 values, broadcast to both halves) and a
 * shift and AND their high-nibble codes (against the last 16); MXFP4 and IQ4_NL then look their
 * values up (VPSHUFB) in a table already offset by C, so every code is unsigned (Q4_0: the nibble,
 * C = 8; MXFP4: the doubled E2M1 value + 12; IQ4_NL: the code-book value + 128). Each int32 lane
 * starts at -C * (its four activation bytes, both halves), computed once per block and token, so
 * two VPDPBUSD leave sum(value * a) over the lane's bytes exactly; three horizontal adds put one
 * block sum per row in row order, and the 8 rows' scales convert together. 256-bit vectors: on
 * Zen 4 a zmm operation costs two ymm ones, and the 8-row tile has no use for more lanes. Decode
 * fetches the next tile ahead (qdot_prefetch.h), as the AVX2 tiles do.
 *
 * Q5_0 and Q5_1 add 16 to a code where its bit of qh is set (bit j for element j: one masked add per
 * vector, its mask the two rows' 16 bits put together), Q5_0 with C = 16; Q4_1 and Q5_1 (C = 0) add
 * their min m times the activation block's s = a.d * sum(a) in one more FMA per block and token, as
 * qdot_ref.c forms d * a.d * dot + m * s. */

enum { NIB_Q4_0, NIB_MXFP4, NIB_IQ4_NL, NIB_Q4_1, NIB_Q5_0, NIB_Q5_1 };

INLINE int64_t nib_block_bytes(int fmt) {
    switch (fmt) {
    case NIB_MXFP4: return sizeof(strata_block_mxfp4);
    case NIB_Q4_1: return sizeof(strata_block_q4_1);
    case NIB_Q5_0: return sizeof(strata_block_q5_0);
    case NIB_Q5_1: return sizeof(strata_block_q5_1);
    default: return sizeof(strata_block_q4_0);
    }
}

/* Offsets in the block of the codes, of qh (the 5-bit formats) and of the min (0: none). */
INLINE int nib_qs_at(int fmt) {
    switch (fmt) {
    case NIB_MXFP4: return 1;
    case NIB_Q4_1: return offsetof(strata_block_q4_1, qs);
    case NIB_Q5_0: return offsetof(strata_block_q5_0, qs);
    case NIB_Q5_1: return offsetof(strata_block_q5_1, qs);
    default: return 2;
    }
}
INLINE int nib_qh_at(int fmt) {
    return fmt == NIB_Q5_0 ? (int)offsetof(strata_block_q5_0, qh) : fmt == NIB_Q5_1 ? (int)offsetof(strata_block_q5_1, qh) : 0;
}
INLINE int nib_m_at(int fmt) {
    return fmt == NIB_Q4_1 ? (int)offsetof(strata_block_q4_1, m) : fmt == NIB_Q5_1 ? (int)offsetof(strata_block_q5_1, m) : 0;
}

/* The half at p in each of 8 rows (wrb bytes apart), as floats. */
INLINE __m256 halves8(const uint8_t *p, int64_t wrb) {
    uint16_t h[8];
    for (int r = 0; r < 8; r++) memcpy(&h[r], p + r * wrb, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                          (short)h[6], (short)h[7]));
}

/* The 8 rows' block scales (MXFP4's halved: its values are doubled). */
INLINE __m256 nib_scales8(int fmt, const uint8_t *p, int64_t wrb) {
    if (fmt == NIB_MXFP4) {   /* strata_e8m0_half on 8 lanes: 2^(e - 128), subnormal below e = 2 */
        const __m256i e = _mm256_setr_epi32(p[0], p[wrb], p[2 * wrb], p[3 * wrb], p[4 * wrb], p[5 * wrb], p[6 * wrb],
                                            p[7 * wrb]);
        const __m256i one = _mm256_set1_epi32(1), normal = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
        const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        return _mm256_castsi256_ps(_mm256_mask_blend_epi32(_mm256_cmplt_epu32_mask(e, _mm256_set1_epi32(2)), normal, sub));
    }
    return halves8(p, wrb);
}

/* The value table + C of a format, in both 128-bit halves (unused for Q4_0). */
INLINE __m256i nib_table(int fmt) {
    const int8_t *values = fmt == NIB_MXFP4 ? strata_e2m1_doubled : strata_kvalues_iq4nl;
    const __m128i c = _mm_set1_epi8((char)(fmt == NIB_MXFP4 ? MXFP4_OFFSET : 128));
    return _mm256_broadcastsi128_si256(_mm_add_epi8(_mm_loadu_si128((const __m128i *)values), c));
}

INLINE int nib_offset(int fmt) {
    switch (fmt) {
    case NIB_Q4_0: return 8;
    case NIB_MXFP4: return MXFP4_OFFSET;
    case NIB_IQ4_NL: return 128;
    case NIB_Q5_0: return 16;
    default: return 0;   /* Q4_1, Q5_1: unsigned codes, a min */
    }
}
INLINE int nib_looked_up(int fmt) { return fmt == NIB_MXFP4 || fmt == NIB_IQ4_NL; }

/* The rows' unsigned codes of one block, low and high elements, two rows per vector (see above). */
INLINE void nib_codes8(int fmt, const uint8_t *p, int64_t wrb, __m256i lo[4], __m256i hi[4]) {
    const __m256i low = _mm256_set1_epi8(15);
    const int at = nib_qs_at(fmt), qh_at = nib_qh_at(fmt);
    for (int r = 0; r < 4; r++) {
        const __m256i q = _mm256_loadu2_m128i((const __m128i *)(p + (r + 4) * wrb + at), (const __m128i *)(p + r * wrb + at));
        lo[r] = _mm256_and_si256(q, low);
        hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        if (nib_looked_up(fmt)) {
            lo[r] = _mm256_shuffle_epi8(nib_table(fmt), lo[r]);
            hi[r] = _mm256_shuffle_epi8(nib_table(fmt), hi[r]);
        }
        if (qh_at) {  /* bit j of a row's qh: element j (low nibbles: j < 16) */
            const uint32_t h0 = strata_u32(p + r * wrb + qh_at), h4 = strata_u32(p + (r + 4) * wrb + qh_at);
            const __m256i sixteen = _mm256_set1_epi8(16);
            lo[r] = _mm256_mask_add_epi8(lo[r], (__mmask32)((h0 & 0xffffu) | h4 << 16), lo[r], sixteen);
            hi[r] = _mm256_mask_add_epi8(hi[r], (__mmask32)(h0 >> 16 | (h4 & 0xffff0000u)), hi[r], sixteen);
        }
    }
}

/* sum(value * a) of one block for the 8 rows, in row order, from their unsigned codes. */
INLINE __m256i nib_dot8(int fmt, const __m256i lo[4], const __m256i hi[4], const strata_block_act_q8 *ab) {
    const __m256i alo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ab->q));
    const __m256i ahi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(ab->q + 16)));
    const __m256i c = _mm256_set1_epi8((char)nib_offset(fmt)), zero = _mm256_setzero_si256();
    const __m256i start = nib_offset(fmt) ? _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(zero, c, alo), c, ahi))
                                          : zero;
    __m256i s[4];
    for (int r = 0; r < 4; r++) s[r] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(start, lo[r], alo), hi[r], ahi);
    return _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
}

/* 8 rows x nt (1..4) tokens over the whole row: y[t * ys + r]. */
INLINE void nib_rows8(int fmt, int nt, int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, int64_t arb,
                      float *y, int64_t ys) {
    const int64_t bs = nib_block_bytes(fmt);
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < k / STRATA_QK; b++) {
        const uint8_t *p = w + b * bs;
        if (nt < 4) fetch_next_tile(w, 8 * wrb, b * 8 * bs, 8 * bs, ahead_end);
        __m256i lo[4], hi[4];
        nib_codes8(fmt, p, wrb, lo, hi);
        const __m256 wd = nib_scales8(fmt, p, wrb);
        const __m256 wm = nib_m_at(fmt) ? halves8(p + nib_m_at(fmt), wrb) : _mm256_setzero_ps();
        for (int t = 0; t < nt; t++) {
            const strata_block_act_q8 *ab = (const strata_block_act_q8 *)(a + t * arb) + b;
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(nib_dot8(fmt, lo, hi, ab)), _mm256_mul_ps(wd, _mm256_set1_ps(ab->d)),
                                     acc[t]);
            if (nib_m_at(fmt)) acc[t] = _mm256_fmadd_ps(wm, _mm256_set1_ps(ab->s), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * ys, acc[t]);
}

/* One row x nt tokens: the rows left over by the 8-row tiles (the 8-row tile's arithmetic on a
 * single row, in the low lanes). */
INLINE void nib_row1(int fmt, int nt, int64_t k, const uint8_t *w, const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    const int64_t bs = nib_block_bytes(fmt);
    const int at = nib_qs_at(fmt), qh_at = nib_qh_at(fmt), m_at = nib_m_at(fmt);
    const __m256i low = _mm256_set1_epi8(15), c = _mm256_set1_epi8((char)nib_offset(fmt)), zero = _mm256_setzero_si256();
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < k / STRATA_QK; b++) {
        const uint8_t *p = w + b * bs;
        const __m128i q = _mm_loadu_si128((const __m128i *)(p + at));
        __m256i u = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), low);
        if (nib_looked_up(fmt)) u = _mm256_shuffle_epi8(nib_table(fmt), u);
        if (qh_at) u = _mm256_mask_add_epi8(u, (__mmask32)strata_u32(p + qh_at), u, _mm256_set1_epi8(16));   /* bit j: element j */
        const float wd = fmt == NIB_MXFP4 ? strata_e8m0_half(p[0]) : half_at(p);
        for (int t = 0; t < nt; t++) {
            const strata_block_act_q8 *ab = (const strata_block_act_q8 *)(a + t * arb) + b;
            const __m256i av = _mm256_loadu_si256((const __m256i *)ab->q);
            const __m256i start = nib_offset(fmt) ? _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, c, av)) : zero;
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(start, u, av)), _mm256_set1_ps(wd * ab->d), acc[t]);
            if (m_at) acc[t] = _mm256_add_ps(acc[t], _mm256_setr_ps(half_at(p + m_at) * ab->s, 0, 0, 0, 0, 0, 0, 0));
        }
    }
    for (int t = 0; t < nt; t++) {
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        y[t * ys] = _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
    }
}

/* A nibble format's driver: 8-row tiles of up to 4 tokens, then the rows left over one by one. */
#define DEFINE_NIB_DRIVER(name, FMT)                                                                              \
    void strata_qdot_##name##_avx512(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,           \
                                     const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y,    \
                                     int64_t ys) {                                                                \
        int64_t r = 0;                                                                                            \
        for (; r + 8 <= n_rows; r += 8)                                                                           \
            for (int64_t t = 0; t < n_tok; t += 4)                                                                \
                nib_rows8(FMT, n_tok - t < 4 ? (int)(n_tok - t) : 4, k, w + r * wrb, wrb, a + t * arb, arb,       \
                          y + t * ys + r, ys);                                                                    \
        for (; r < n_rows; r++)                                                                                   \
            for (int64_t t = 0; t < n_tok; t += 4)                                                                \
                nib_row1(FMT, n_tok - t < 4 ? (int)(n_tok - t) : 4, k, w + r * wrb, a + t * arb, arb, y + t * ys + r, ys); \
    }
DEFINE_NIB_DRIVER(q4_0, NIB_Q4_0)
DEFINE_NIB_DRIVER(mxfp4, NIB_MXFP4)
DEFINE_NIB_DRIVER(iq4_nl, NIB_IQ4_NL)
DEFINE_NIB_DRIVER(q4_1, NIB_Q4_1)
DEFINE_NIB_DRIVER(q5_0, NIB_Q5_0)
DEFINE_NIB_DRIVER(q5_1, NIB_Q5_1)

#else /* not x86: the names exist so the library links; qdot.c hands them out only for AVX512,
       * which strata_resolve_impl refuses here */

STRATA_AVX512_FALLBACK(q4_0) STRATA_AVX512_FALLBACK(mxfp4) STRATA_AVX512_FALLBACK(iq4_nl)
STRATA_AVX512_FALLBACK(q4_1) STRATA_AVX512_FALLBACK(q5_0) STRATA_AVX512_FALLBACK(q5_1)
#endif
