/*
 * AVX2 twins of the grid i-quant kernels in qdot_iq.c (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S, IQ1_M; interface: qdot.h; the integer formulation of each format: qdot_iq.c's header;
 * block layouts: common.h; grids and sign tables: iq_tables.h).
 *
 * A weight block is worked through in 8 chunks of 32 values. Each chunk becomes three vectors,
 * made once and used for every token of the tile:
 *   q   the 32 grid magnitudes (unsigned bytes): the chunk's 8-byte (IQ2, IQ1) or 4-byte (IQ3) grid
 *       rows gathered by scalar loads and 64-bit (32-bit) inserts;
 *   s   the 32 signs as bytes for VPSIGNB (positive or negative), spread from 4 bytes of sign bits (sign_bits): the block's
 *       own (IQ2_S, IQ3_S), or, for the formats that store 7-bit ksigns indices (IQ2_XXS, IQ2_XS,
 *       IQ3_XXS), bits made for the whole block at once by vector arithmetic (iq_signs);
 *   sc  the sub-block weights 2 ls + 1 as int16 (low 128 bits: values 0-15, high: 16-31), picked
 *       by one shuffle from a vector of the block's weights made once per block (pick_weight).
 * Grid indices whose high bits lie elsewhere in the block (IQ2_S, IQ3_S, IQ1_S, IQ1_M) are put
 * together for the whole block by vector first (put_indices), so each costs one load in the chunk.
 * Per token: isum += madd(maddubs(q, sign(a, s)), sc). IQ1_S/IQ1_M's values 8 g +- 1 go in plus 9,
 * as q = 8 g + 9 +- 1 in [0, 18] from a grid times 8 plus 9 (strata_iq1_grid_u), with no signs, and
 * each block's isum starts at -9 * sum_j bsums_j * weight_j (iq1_bias): one VPMADDWD per token and
 * block in place of a VPSIGNB per token and chunk. IQ1_S's delta is one per chunk, so the decode
 * tile leaves it out of the values (q = 8 g + 9) and puts it in the bias, (delta - 9) * bsums *
 * weight, where a byte broadcast per chunk made it; IQ1_M's weights are picked from a block vector
 * (weights_iq1_m) where each chunk built its own from the scales. Each of these was faster on the
 * Intel machine, and together they took IQ1_S and IQ1_M past llama.cpp's AVX2 vec_dot (figures:
 * benchmarks/RESULTS.md, "Kernel choice per CPU"). maddubs' int16 pair sums stay
 * below 2 * 62 * 128 < 2^15 (no saturation), and the int32 lanes are exact, so each block's
 * integer sum equals the scalar one; the block's lanes are converted to float and added with one
 * FMA into 8 float lanes scaled by (d * ad) * factor exactly as qdot_iq.c forms it, and reduced
 * once per output: the result equals the scalar one up to the order of the float additions.
 *
 * Tiles: calls of 1-4 tokens take one weight row at a time with all their tokens (the gathers are
 * the cost, and rows share nothing); decode (1-3 tokens) fetches ahead into the rows to come, never
 * past strata_qdot_ahead_end. Calls of 5 tokens or more (prefill) unpack a window of blocks of 4
 * rows once into biased signed bytes and run every token over it ("Prefill over unpacked rows").
 * Decode is bound by the instructions that build a chunk (~4-5 per cycle), not by memory: on Zen 3
 * the vector signs, per-block weights and indices made every type's block faster. Tried and slower
 * there: AVX2 gathers of the grid rows and ksigns masks, and IQ2_XS's 9-bit indices stored per block
 * (its indices are one shift and mask each from a register already). On Intel cores not slowed by
 * the Gather Data Sampling mitigation the rows of IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M come by ymm
 * gathers instead (qdot_iq_chunks.h, gathers_for; the CPU description's ymm_gathers, cpu.c), IQ3_S
 * gaining the most (8 rows a gather where the scalar path inserts 6 dwords); IQ2_XXS and IQ2_XS,
 * slower gathered, keep their scalar loads. The ksigns sign bits are made per block (iq_signs)
 * instead of per chunk: faster for IQ2_XS, the same for IQ2_XXS and IQ3_XXS (figures:
 * benchmarks/RESULTS.md, "Kernel choice per CPU").
 *
 * The ISA is enabled for this translation unit only; qdot.c hands these kernels out only after the
 * CPU was seen to have AVX2, FMA and F16C. Built three times: as itself (names _avx2), for AVX-512
 * machines (qdot_iq_avx2_evex.c: masks for the ksigns formats' signs, VPDPWSSD on ymm) and for AVX2
 * CPUs with AVX-VNNI (qdot_iq_avxvnni.c: VEX VPDPWSSD in madd_acc). These tiles are bound by their
 * vector instructions (a block of IQ2_XXS at 1 token is ~130 on the three vector ports, ~58 cycles
 * here), so the one saved per chunk and token shows: the AVX-VNNI build is faster at every token
 * count on the Intel machine (the table's avxvnni kind). Tried there and not kept, both slower: the
 * grid rows as 8 nibbles in a dword, two chunks' rows by one VPGATHERDD (a ymm gather of 8 dwords
 * fetches as fast per row as a zmm one, one of 4 qwords slower) and spread by an unpack and a VPSHUFB,
 * as it adds vector instructions where the loads were not the limit; two accumulators per token. The
 * rows by broadcast loads and blends (rows8) gained only once the signs' shuffles were cut
 * (set_block_signs) (figures: benchmarks/RESULTS.md, "Kernel choice per CPU").
 */
#include "iq_tables.h"
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#ifdef STRATA_QDOT_EVEX
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#elif defined(STRATA_QDOT_AVXVNNI)
#pragma GCC target("avx2,fma,f16c,avxvnni")
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#include "qdot_avx2_common.h"


#include "qdot_iq_chunks.h"

/* One weight row (k values at w) against nt <= 4 tokens: y[t * ys]. */
INLINE void iq_tile(int fmt, int gathers, int64_t bs, int nt, int64_t k, const uint8_t *w, const uint8_t *a, int64_t arb,
                    float *y, int64_t ys) {
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / STRATA_QK_K; b++) {
        const uint8_t *p = w + b * bs;
        if (nt < 4) fetch_block_ahead(p, bs, ahead_end);
        iq_head h;
        iq_head_of(fmt, p, 1, gathers, &h);
        __m256i isum[4];
        if (is_iq1(fmt)) {   /* their magnitudes are the values + 9: 9 * bsums * weight off */
            const __m256i bias = iq1_bias(fmt, p, h.wv);
            for (int t = 0; t < nt; t++)
                isum[t] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)((const strata_block_act_q8k *)(a + t * arb) + b)->bsums),
                                            bias);
        } else {
            for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            chunk ch;
            iq_chunk(fmt, p, c, &h, &ch);
            for (int t = 0; t < nt; t++) {
                const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
                const __m256i av = apply_signs(fmt, &ch, _mm256_loadu_si256((const __m256i *)(ab->q + 32 * c)));
                isum[t] = madd_acc(isum[t], _mm256_maddubs_epi16(ch.q, av), ch.sc);
            }
        }
        const float wd = iq_d(fmt, p);
        for (int t = 0; t < nt; t++) {
            const float ad = ((const strata_block_act_q8k *)(a + t * arb) + b)->d;
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(wd * ad * iq_factor(fmt)), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[t * ys] = hsum8(acc[t]);
}

/* ---- Prefill over unpacked rows (qdot_avx2_common.h) ----
 *
 * A chunk's codes are its signed values plus UR_BIAS (|w| <= 62, so w + 64 lies in [2, 126]); bw is
 * -64 times each sub-block's weight. On the Intel machine, against the tiles above, slower at 4
 * tokens (so calls of 4 keep them) and faster from 5, the more so the more tokens
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
#define UR_BIAS 64
#define UR_MIN_TOKENS 5

/* The weights of chunk c's two halves (int16 lanes 0-7: values 0-15; 8-15: values 16-31) as a pair
 * of int16 (first half low) in every dword of the 128-bit lane that holds dword c (c < 4: the low). */
INLINE __m256i weight_pair(__m256i sc, int c) {
    const __m256i swapped = _mm256_permute4x64_epi64(sc, 0x4E);
    return c < 4 ? _mm256_blend_epi16(sc, swapped, 0xAA) : _mm256_blend_epi16(swapped, sc, 0xAA);
}

INLINE void unpack_urow(int fmt, const uint8_t *p, urow_block *u) {
    iq_head h;
    iq_head_of(fmt, p, 0, strata_cpu_has(STRATA_CPU_YMM_GATHERS), &h);
    __m256i pair[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        chunk ch;
        iq_chunk(fmt, p, c, &h, &ch);
        u->q[c] = _mm256_add_epi8(signed_values(fmt, &ch), _mm256_set1_epi8(UR_BIAS));
        u->sc[c] = ch.sc;
        pair[c] = weight_pair(ch.sc, c);
    }
    __m256i cw = _mm256_blend_epi32(pair[0], pair[1], 0x02);   /* dword c: chunk c's pair */
    cw = _mm256_blend_epi32(cw, pair[2], 0x04);
    cw = _mm256_blend_epi32(cw, pair[3], 0x08);
    cw = _mm256_blend_epi32(cw, pair[4], 0x10);
    cw = _mm256_blend_epi32(cw, pair[5], 0x20);
    cw = _mm256_blend_epi32(cw, pair[6], 0x40);
    cw = _mm256_blend_epi32(cw, pair[7], 0x80);
    u->bw = _mm256_mullo_epi16(cw, _mm256_set1_epi16(-UR_BIAS));
    u->d = iq_d(fmt, p) * iq_factor(fmt);   /* the factor is a power of two: (d * f) * ad = d * ad * f */
    u->dmin = 0.0f;
}

/* Row w against n_tok <= 4 tokens, the token count (and `gathers`, where a caller passes a literal) a
 * constant of each tile. */
INLINE void iq_tile_tokens(int fmt, int gathers, int64_t bs, int64_t n_tok, int64_t k, const uint8_t *w,
                           const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    if (n_tok == 4) iq_tile(fmt, gathers, bs, 4, k, w, a, arb, y, ys);
    else if (n_tok == 3) iq_tile(fmt, gathers, bs, 3, k, w, a, arb, y, ys);
    else if (n_tok == 2) iq_tile(fmt, gathers, bs, 2, k, w, a, arb, y, ys);
    else if (n_tok == 1) iq_tile(fmt, gathers, bs, 1, k, w, a, arb, y, ys);
}

/* Calls of UR_MIN_TOKENS tokens or more over unpacked rows; fewer rows one at a time, decode (1-3
 * tokens) all tokens at once, 4 tokens in one pass. */
INLINE void iq_rows(int fmt, int64_t bs, int64_t k, const uint8_t *w, int64_t wrb, int64_t n_rows,
                    const uint8_t *a, int64_t arb, int64_t n_tok, float *y, int64_t ys) {
    if (n_tok >= UR_MIN_TOKENS) {
        urow_rows(fmt, UR_BIAS_INT, unpack_urow, bs, k, w, wrb, n_rows, a, arb, n_tok, y, ys);
        return;
    }
    /* the gathers a constant of each tile; IQ1_S's calls of 4 tokens keep the scalar loads (slower
     * gathered, where 1-3 tokens gained; benchmarks/RESULTS.md, "Kernel choice per CPU") */
    const int gathers = gathers_for(fmt, strata_cpu_has(STRATA_CPU_YMM_GATHERS)) && !(fmt == FMT_IQ1_S && n_tok == 4);
    for (int64_t r = 0; r < n_rows; r++) {
        if (gathers) iq_tile_tokens(fmt, 1, bs, n_tok, k, w + r * wrb, a, arb, y + r, ys);
        else iq_tile_tokens(fmt, 0, bs, n_tok, k, w + r * wrb, a, arb, y + r, ys);
    }
}

#define DEFINE_IQ_DRIVER(name, fmt, wtype)                                                                 \
    void QDOT_AVX2_NAME(name)(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,           \
                                   const uint8_t *restrict a, int64_t arb, int64_t n_tok,                  \
                                   float *restrict y, int64_t ys) {                                        \
        iq_rows(fmt, (int64_t)sizeof(wtype), k, w, wrb, n_rows, a, arb, n_tok, y, ys);                     \
    }

DEFINE_IQ_DRIVER(iq2_xxs, FMT_IQ2_XXS, strata_block_iq2_xxs)
DEFINE_IQ_DRIVER(iq2_xs, FMT_IQ2_XS, strata_block_iq2_xs)
DEFINE_IQ_DRIVER(iq2_s, FMT_IQ2_S, strata_block_iq2_s)
DEFINE_IQ_DRIVER(iq3_xxs, FMT_IQ3_XXS, strata_block_iq3_xxs)
DEFINE_IQ_DRIVER(iq3_s, FMT_IQ3_S, strata_block_iq3_s)
DEFINE_IQ_DRIVER(iq1_s, FMT_IQ1_S, strata_block_iq1_s)
DEFINE_IQ_DRIVER(iq1_m, FMT_IQ1_M, strata_block_iq1_m)

#else /* not x86: the names exist so the library links; qdot.c never hands them out */

STRATA_AVX2_FALLBACK(iq2_xxs) STRATA_AVX2_FALLBACK(iq2_xs) STRATA_AVX2_FALLBACK(iq2_s) STRATA_AVX2_FALLBACK(iq3_xxs) STRATA_AVX2_FALLBACK(iq3_s) STRATA_AVX2_FALLBACK(iq1_s) STRATA_AVX2_FALLBACK(iq1_m)
#endif
