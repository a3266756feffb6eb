/*
 * Pieces shared by the AVX2 tile kernels (qdot_avx2.c, qdot_iq_avx2.c, qdot_iq4_avx2.c): the tile
 * driver, horizontal sums, tile stores, decode prefetch and the link-time fallbacks for CPUs
 * other than x86. A kernel file enables the ISA (#pragma GCC target("avx2,fma,f16c")) before
 * including this header, so these inline helpers are compiled for it too.
 */
#ifndef STRATA_QDOT_AVX2_COMMON_H
#define STRATA_QDOT_AVX2_COMMON_H
#include "qdot.h"

/* The AVX2 sources are compiled twice: as themselves (names _avx2) and, with STRATA_QDOT_EVEX
 * defined (qdot_*_evex.c), for AVX-512 machines (names _evex): AVX-512 F/BW/VL/VNNI enabled, so
 * the compiler has 32 vector registers and EVEX encodings, and the few spots written for it use
 * 256-bit VNNI. The grid i-quants' (qdot_iq_avx2.c) a third time, with STRATA_QDOT_AVXVNNI defined
 * (qdot_iq_avxvnni.c), for AVX2 CPUs with AVX-VNNI (names _avxvnni): madd_acc is VEX-encoded VPDPWSSD.
 * The integer sums are exact in every build, so all give the same bytes. */
#ifdef STRATA_QDOT_EVEX
#define QDOT_AVX2_NAME(name) strata_qdot_##name##_evex
/* gcc may load a thread-local's offset straight into a vector register where AVX-512 is on, a form
 * the linker cannot relax when the library is linked into an executable: read it through qdot.c. */
#define strata_qdot_ahead_end (strata_qdot_ahead())
#elif defined(STRATA_QDOT_AVXVNNI)
#define QDOT_AVX2_NAME(name) strata_qdot_##name##_avxvnni
#else
#define QDOT_AVX2_NAME(name) strata_qdot_##name##_avx2
#endif

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc + madd(p16, w16): int16 pairs multiplied and added into int32 lanes. One VPDPWSSD in the
 * build for AVX-512 machines; the same integers either way (no saturation in either). */
INLINE __m256i madd_acc(__m256i acc, __m256i p16, __m256i w16) {
#ifdef STRATA_QDOT_EVEX
    return _mm256_dpwssd_epi32(acc, p16, w16);
#elif defined(STRATA_QDOT_AVXVNNI)
    return _mm256_dpwssd_avx_epi32(acc, p16, w16);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, w16));
#endif
}

INLINE uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 16 bytes of nibbles -> 32 bytes of codes, low nibbles first (ggml's order). The broadcast load
 * and the per-half variable shift keep this off the shuffle port. */
INLINE __m256i nibbles32(const uint8_t *qs) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(15));
}

/* ---- Tile driver shared by every format ----
 *
 * TILE(nr, nt, k, w, wrb, a, arb, y, ys) computes an nr x nt tile over the whole row. With 4 tokens
 * or more the driver walks GR rows x GT tokens at a time (1 x 8 for quantized weights: their
 * activation rows are small and the unpacking is shared by 8 tokens; 4 x 2 for float weights,
 * whose float32 activation rows would not stay in L1 for 8 tokens); with fewer (decode) DR rows one token at
 * a time (DR = 4: independent accumulators for the short Q8 blocks; where GR = DR, the row group's
 * tile over all of them: Q4_0's 8 rows unpacked once for 2 or 3 tokens), or, for DR = 1, one row with
 * all its tokens (IQ4_XS, TQ1_0, TQ2_0: their unpacking is the larger cost; the K-quants' decode does
 * the same, qdot_avx2.c). */
#define DEFINE_DRIVER(name, TILE, GR, GT, DR)                                                            \
    void QDOT_AVX2_NAME(name)(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,         \
                                   const uint8_t *restrict a, int64_t arb, int64_t n_tok,                \
                                   float *restrict y, int64_t ys) {                                      \
        int64_t r = 0;                                                                                   \
        if (n_tok < 4 && DR > 1) {                                                                       \
            for (; r + DR <= n_rows; r += DR)                                                            \
                if (GR == DR) TILE(DR, (int)n_tok, k, w + r * wrb, wrb, a, arb, y + r, ys);             \
                else for (int64_t t = 0; t < n_tok; t++) TILE(DR, 1, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys); \
            for (; DR > 4 && r + 4 <= n_rows; r += 4)                                                    \
                for (int64_t t = 0; t < n_tok; t++) TILE(4, 1, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys); \
        } else if (n_tok < 4) {                                                                          \
            for (; r < n_rows; r++) {                                                                    \
                if (n_tok == 1) TILE(1, 1, k, w + r * wrb, wrb, a, arb, y + r, ys);                      \
                else if (n_tok == 2) TILE(1, 2, k, w + r * wrb, wrb, a, arb, y + r, ys);                 \
                else if (n_tok == 3) TILE(1, 3, k, w + r * wrb, wrb, a, arb, y + r, ys);                 \
            }                                                                                            \
        }                                                                                                \
        for (; r + GR <= n_rows; r += GR) {                                                                \
            int64_t t = 0;                                                                               \
            for (; t + GT <= n_tok; t += GT) TILE(GR, GT, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys); \
            for (; GT > 4 && t + 4 <= n_tok; t += 4) TILE(GR, 4, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys); \
            for (; t < n_tok; t++) TILE(GR, 1, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys);       \
        }                                                                                                \
        for (; r < n_rows; r++) {                                                                        \
            int64_t t = 0;                                                                               \
            for (; t + GT <= n_tok; t += GT) TILE(1, GT, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys); \
            for (; t < n_tok; t++) TILE(1, 1, k, w + r * wrb, wrb, a + t * arb, arb, y + t * ys + r, ys);       \
        }                                                                                                \
    }


#define ZERO_ACC(acc) \
    for (int r_ = 0; r_ < 4; r_++) for (int t_ = 0; t_ < 8; t_++) acc[r_][t_] = _mm256_setzero_ps();

INLINE void store_tile(int nr, int nt, __m256 acc[4][8], float *y, int64_t ys) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) y[t * ys + r] = hsum8(acc[r][t]);
}

/* ---- Prefill over unpacked rows (formats against STRATA_ACT_Q8K) ----
 *
 * A tile that builds each chunk of 32 codes per group of tokens builds it again for every group. Here
 * a window of UR_BLOCKS blocks of UR_ROWS rows is unpacked once (by the format's `unpack`) into each
 * chunk's codes as unsigned bytes and its int16 sub-block weights, and every token of the call runs
 * over the window, one token by UR_ROWS rows at a time: per chunk one load of the token's 32
 * activations, then per row VPMADDUBSW, VPMADDWD and an add (codes <= 127 against |a| <= 128: int16
 * pair sums < 2^15). What the codes carry beside the values, per 16 codes, is taken off per block
 * and token with the activations' bsums by one more VPMADDWD with the block's bw: a bias of the codes
 * into the integer sum (UR_BIAS_INT: bw is minus the bias times each sub-block's weight), or the
 * mins times dmin from the float sum (UR_BIAS_MIN: bw the mins). Each block's integer sum is what the
 * format's scalar kernel forms; windows add their float sums to y one after another. */
#define UR_ROWS 4      /* rows per pass over a token's activations */
#define UR_BLOCKS 8    /* blocks per window: 4 rows of them unpacked take 18 KB (L1) */

enum { UR_BIAS_INT, UR_BIAS_MIN };

typedef struct {
    __m256i q[8], sc[8];   /* chunk c: its 32 codes as unsigned bytes; its int16 sub-block weights */
    __m256i bw;            /* int16 lane j: what the bsums of values 16 j .. 16 j + 15 are weighed by */
    float d, dmin;         /* the block's scales, as the format's kernel forms them */
} urow_block;

/* v, with the compiler kept from reassociating the sums that made it: left to itself, gcc holds
 * every chunk's product of a block apart and adds them as a tree at the end, spilling most of them
 * (1.2-1.3x slower here). */
INLINE __m256i in_order(__m256i v) {
    __asm__("" : "+x"(v));
    return v;
}

/* Rows u[r * UR_BLOCKS ..], r < NR, of a window of nb blocks (block b0 on) against one token's
 * activations a: its share of y[r], added to what y holds unless `first`. */
INLINE void urow_pass(int NR, int kind, const urow_block *u, int64_t nb, int64_t b0, const uint8_t *a, float *y,
                      int first) {
    __m256 acc[UR_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const strata_block_act_q8k *ab = (const strata_block_act_q8k *)a + b0 + b;
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)ab->bsums);
        __m256i isum[UR_ROWS];
        for (int r = 0; r < NR; r++)
            isum[r] = kind == UR_BIAS_INT ? _mm256_madd_epi16(bsums, u[r * UR_BLOCKS + b].bw) : _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const __m256i av = _mm256_loadu_si256((const __m256i *)(ab->q + 32 * c));
            for (int r = 0; r < NR; r++) {
                const urow_block *ub = &u[r * UR_BLOCKS + b];
                isum[r] = in_order(madd_acc(isum[r], _mm256_maddubs_epi16(ub->q[c], av), ub->sc[c]));
            }
        }
        for (int r = 0; r < NR; r++) {
            const urow_block *ub = &u[r * UR_BLOCKS + b];
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(ub->d * ab->d), acc[r]);
            if (kind == UR_BIAS_MIN)
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bsums, ub->bw)),
                                          _mm256_set1_ps(ub->dmin * ab->d), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) y[r] = (first ? 0.0f : y[r]) + hsum8(acc[r]);
}

/* Rows UR_ROWS at a time (then the last 1-3), each window of blocks unpacked once for every token. */
INLINE void urow_rows(int fmt, int kind, void (*unpack)(int fmt, const uint8_t *p, urow_block *u), int64_t bs,
                      int64_t k, const uint8_t *w, int64_t wrb, int64_t n_rows, const uint8_t *a, int64_t arb,
                      int64_t n_tok, float *y, int64_t ys) {
    urow_block u[UR_ROWS * UR_BLOCKS];
    const int64_t n_blocks = k / STRATA_QK_K;
    for (int64_t r = 0; r < n_rows; r += UR_ROWS) {
        const int nr = n_rows - r < UR_ROWS ? (int)(n_rows - r) : UR_ROWS;
        for (int64_t b0 = 0; b0 < n_blocks; b0 += UR_BLOCKS) {
            const int64_t nb = n_blocks - b0 < UR_BLOCKS ? n_blocks - b0 : UR_BLOCKS;
            for (int i = 0; i < nr; i++)
                for (int64_t b = 0; b < nb; b++) unpack(fmt, w + (r + i) * wrb + (b0 + b) * bs, &u[i * UR_BLOCKS + b]);
            for (int64_t t = 0; t < n_tok; t++) {
                const uint8_t *at = a + t * arb;
                float *yt = y + t * ys + r;
                if (nr == 4) urow_pass(4, kind, u, nb, b0, at, yt, b0 == 0);
                else if (nr == 3) urow_pass(3, kind, u, nb, b0, at, yt, b0 == 0);
                else if (nr == 2) urow_pass(2, kind, u, nb, b0, at, yt, b0 == 0);
                else urow_pass(1, kind, u, nb, b0, at, yt, b0 == 0);
            }
        }
    }
}

/* Decode (fewer than 4 tokens) is bound by reading the weights: fetch this far ahead of each row's
 * current block (into the next rows' bytes near a row's end), past where the hardware prefetcher
 * has ramped up on a new stream. */
#ifndef PF_AHEAD
#define PF_AHEAD 2048
#endif

#include "qdot_prefetch.h"

#endif /* x86 */

/* On other CPUs the AVX2 names exist so the library links; qdot.c never hands them out. */
#define STRATA_AVX2_FALLBACK(name)                                                                                     \
    void QDOT_AVX2_NAME(name)(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,           \
                                   const uint8_t *restrict a, int64_t arb, int64_t n_tok,                  \
                                   float *restrict y, int64_t ys) {                                        \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                  \
    }

#endif
