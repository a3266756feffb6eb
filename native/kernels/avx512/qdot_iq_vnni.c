/*
 * AVX-512 VNNI prefill tiles of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
 * IQ1_M), IQ4_XS, Q2_K and Q3_K against STRATA_ACT_Q8K. Interface: qdot.h; the formats' integer
 * formulation: qdot_iq.c (Q2_K, Q3_K: qdot_ref.c). Q2_K's mins add one more term per block: the
 * sum of its sub-block mins times the activations' block sums, subtracted with dmin as the scalar
 * tile does; Q2_K and Q3_K at 16 and 64 tokens ran well ahead of their AVX2 tiles on the Intel
 * machine (figures: benchmarks/RESULTS.md, "Kernel choice per CPU").
 *
 * The AVX2 tiles (qdot_iq_avx2.c) spend four or five instructions per 32 values and token once a
 * chunk is built (sign the activations, VPMADDUBSW, VPMADDWD, add). Here a weight block is unpacked
 * once into bytes, value + 128 (the chunk builders of qdot_iq_chunks.h give magnitudes and signs;
 * IQ1's 8 g + delta are made signed the same way), and VPDPBUSD multiplies four of one row's bytes,
 * broadcast, by the same four activation bytes of 16 tokens at once: the activations are re-laid
 * once per call and thread (strata_qdot_relaid) with the 16 tokens across the lanes, 4 bytes each.
 * The +128 comes off exactly with the activation blocks' sums of 16 (times 128, laid beside them),
 * so each 16-value sub-block's integer sum is the scalar one; sub-block weights multiply it, and
 * the block's integer total is scaled as qdot_iq.c scales it, ((wd * ad) * factor) * isum, and added
 * block after block with no fused multiply-add: the result equals the scalar tile's bit for bit.
 *
 * Tokens go 16 to a group; a last group of 8-15 runs padded (its empty lanes add 0; 9-15 where
 * 512-bit operations are split, pad_min), fewer left over go to the AVX2 tiles' AVX-512 build (the
 * grid i-quants' gather tiles where they run),
 * as do calls of fewer than 8 tokens. Q2_K and Q3_K,
 * whose AVX2 tiles build a chunk cheaply, pad only a last group of 12-15 (pad_min). Rows go 4 at a
 * time (four broadcasts per activation load), groups 8 at a time so that their re-laid
 * activations stay in L2 while a block of 4 rows passes over them.
 *
 * The ISA is enabled for this translation unit only; qdot.c hands these tiles out only for
 * STRATA_IMPL_AVX512 (prefill; decode runs the AVX2 tiles' AVX-512 build, or the decode tiles of
 * qdot_iq_planes.c, qdot_iq_vbmi.c and, for Q2_K, Q3_K and IQ4_XS, qdot_kquant_zmm.c and qdot_iq4_xs_avx512.c where qdot.c hands them
 * out).
 */
#include "iq_tables.h"
#include "qdot.h"
#include "strata.h"   /* strata_cpu_splits_512 */

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define STRATA_QDOT_EVEX 1
#include "qdot_avx2_common.h"
#include "qdot_iq_chunks.h"

#define GROUP 16                 /* tokens per zmm */
#define ROWS 4                   /* rows per pass over a group's activations */
#define GROUPS_PER_PASS 8        /* groups per pass over a block of rows */
#define RELAID_A 4096            /* a block's 64 quads x 16 tokens x 4 bytes */
#define RELAID_BLOCK (RELAID_A + 16 * GROUP * 4 + GROUP * 4)   /* + 128 x block sums, + scales */

/* r[j] <- column j of the 16 x 16 int32 matrix whose row i is r[i]: 4 x 4 blocks transposed
 * within each 128-bit lane (two unpack stages), then the lanes across the four vectors of each
 * column position (two lane shuffles). */
INLINE void transpose16_epi32(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {  /* r[4 i + c], lane L: rows 4 i .. 4 i + 3 of column 4 L + c */
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i ab_even = _mm512_shuffle_i32x4(r[c], r[4 + c], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i ab_odd = _mm512_shuffle_i32x4(r[c], r[4 + c], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i cd_even = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i cd_odd = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
        t[c] = _mm512_shuffle_i32x4(ab_even, cd_even, _MM_SHUFFLE(2, 0, 2, 0));       /* column c */
        t[4 + c] = _mm512_shuffle_i32x4(ab_odd, cd_odd, _MM_SHUFFLE(2, 0, 2, 0));     /* 4 + c */
        t[8 + c] = _mm512_shuffle_i32x4(ab_even, cd_even, _MM_SHUFFLE(3, 1, 3, 1));   /* 8 + c */
        t[12 + c] = _mm512_shuffle_i32x4(ab_odd, cd_odd, _MM_SHUFFLE(3, 1, 3, 1));    /* 12 + c */
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Tokens t0 .. t0 + nt - 1 (nt <= 16) of the activations at a, block by block, into the layout
 * above: quad j of token t at byte 64 j + 4 t; 128 x sum of sub-block s at int32 16 s + t; d at
 * float t. Lanes past nt hold zeros. Each 16 tokens x 16 quads (and the 16 x 16 block sums) is
 * one transpose of 16 vectors. */
static void relay_group(const uint8_t *a, int64_t arb, int nt, int64_t nb, uint8_t *dst) {
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *q = dst + b * RELAID_BLOCK;
        int32_t *bias = (int32_t *)(q + RELAID_A);
        float *d = (float *)(q + RELAID_A + 16 * GROUP * 4);
        const strata_block_act_q8k *ab[GROUP];
        for (int t = 0; t < nt; t++) ab[t] = (const strata_block_act_q8k *)(a + t * arb) + b;
        __m512i r[16];
        for (int c = 0; c < 4; c++) {
            for (int t = 0; t < GROUP; t++)
                r[t] = t < nt ? _mm512_loadu_si512((const void *)(ab[t]->q + 64 * c)) : _mm512_setzero_si512();
            transpose16_epi32(r);
            for (int j = 0; j < 16; j++) _mm512_store_si512((void *)(q + 64 * (16 * c + j)), r[j]);
        }
        for (int t = 0; t < GROUP; t++)
            r[t] = t < nt ? _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)ab[t]->bsums)), 7)
                          : _mm512_setzero_si512();
        transpose16_epi32(r);
        for (int s = 0; s < 16; s++) _mm512_store_si512((void *)(bias + GROUP * s), r[s]);
        for (int t = 0; t < GROUP; t++) d[t] = t < nt ? ab[t]->d : 0.0f;
    }
}

/* One block of up to 4 rows unpacked: bytes value + 128, sub-block weights per 16 values, wd. */
typedef struct {
    uint8_t u[ROWS][256] __attribute__((aligned(64)));
    int32_t sc[ROWS][16];
    int32_t mn[ROWS][16];   /* Q2_K's sub-block mins */
    float wd[ROWS], wmin[ROWS];
} unpacked;

/* IQ4_XS (a format of its own, not a grid: qdot_iq4_avx2.c has its AVX2 tiles): code-book values
 * looked up by nibble, an ls - 32 per 32 values, factor 1. */
#define FMT_IQ4_XS_VNNI 100

INLINE void unpack_iq4_xs(const uint8_t *p, unpacked *up, int r) {
    const strata_block_iq4_xs *b = (const strata_block_iq4_xs *)p;
    const __m256i book = _mm256_broadcastsi128_si256(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)strata_kvalues_iq4nl), _mm_set1_epi8((char)0x80)));  /* value + 128 */
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int ib = 0; ib < 8; ib += 2) {  /* sub-blocks ib, ib + 1: their 16 code bytes in the two lanes */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 16 * ib));
        const __m256i lo = _mm256_shuffle_epi8(book, _mm256_and_si256(v, low4));
        const __m256i hi = _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
        _mm256_store_si256((__m256i *)(up->u[r] + 32 * ib), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_store_si256((__m256i *)(up->u[r] + 32 * ib + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    for (int ib = 0; ib < 8; ib++) {
        const int ls = strata_iq4_xs_scale(b, ib);
        up->sc[r][2 * ib] = up->sc[r][2 * ib + 1] = ls;
    }
    up->wd[r] = _cvtsh_ss(b->d);
}

/* Q2_K and Q3_K (qdot_ref.c's formulas): element 128 h + 32 m + l of a block is bits 2 m, 2 m + 1
 * of qs[32 h + l]; sub-block s = 8 h + 2 m + l / 16. Q2_K's values are those codes (0-3) with a
 * scale and a min per sub-block, the mins' term subtracted with the block sums; Q3_K's are the
 * codes less 4 where bit 4 h + m of hmask[l] is clear, with a 6-bit scale - 32. */
#define FMT_Q2_K_VNNI 101
#define FMT_Q3_K_VNNI 102

INLINE void unpack_k2(const uint8_t *qs, const uint8_t *hmask, unpacked *up, int r) {
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hv = hmask ? _mm256_loadu_si256((const __m256i *)hmask) : _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        for (int m = 0; m < 4; m++) {
            __m256i u = _mm256_and_si256(_mm256_srli_epi16(v, 2 * m), three);
            if (hmask) {  /* q - 4 + 4 * bit, + 128 */
                const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(hv, 4 * h + m), one);
                u = _mm256_add_epi8(_mm256_add_epi8(u, _mm256_slli_epi16(bit, 2)), _mm256_set1_epi8(124));
            } else {
                u = _mm256_or_si256(u, _mm256_set1_epi8((char)0x80));
            }
            _mm256_store_si256((__m256i *)(up->u[r] + 128 * h + 32 * m), u);
        }
    }
}

INLINE void unpack_q2_k(const uint8_t *p, unpacked *up, int r) {
    const strata_block_q2_k *b = (const strata_block_q2_k *)p;
    unpack_k2(b->qs, NULL, up, r);
    for (int s = 0; s < 16; s++) {
        up->sc[r][s] = b->scales[s] & 0xf;
        up->mn[r][s] = b->scales[s] >> 4;
    }
    up->wd[r] = _cvtsh_ss(b->d);
    up->wmin[r] = _cvtsh_ss(b->dmin);
}

INLINE void unpack_q3_k(const uint8_t *p, unpacked *up, int r) {
    const strata_block_q3_k *b = (const strata_block_q3_k *)p;
    unpack_k2(b->qs, b->hmask, up, r);
    for (int s = 0; s < 16; s++) up->sc[r][s] = strata_q3_k_scale(b->scales, s);
    up->wd[r] = _cvtsh_ss(b->d);
}

INLINE void unpack_row(int fmt, const uint8_t *p, unpacked *up, int r) {
    if (fmt == FMT_IQ4_XS_VNNI) {
        unpack_iq4_xs(p, up, r);
        return;
    }
    if (fmt == FMT_Q2_K_VNNI) {
        unpack_q2_k(p, up, r);
        return;
    }
    if (fmt == FMT_Q3_K_VNNI) {
        unpack_q3_k(p, up, r);
        return;
    }
    iq_head h;
    iq_head_of(fmt, p, 0, strata_cpu_has(STRATA_CPU_YMM_GATHERS), &h);
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        chunk ch;
        iq_chunk(fmt, p, c, &h, &ch);
        const __m256i v = signed_values(fmt, &ch);
        _mm256_store_si256((__m256i *)(up->u[r] + 32 * c), _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)));
        if (fmt == FMT_IQ1_M) {   /* read from the scales: taken out of ch.sc, slower at 8-64 tokens */
            const unsigned sc = u16(((const strata_block_iq1_m *)p)->scales + 2 * (c / 2)) >> (6 * (c % 2));
            up->sc[r][2 * c] = (int32_t)(2 * (sc & 7) + 1);
            up->sc[r][2 * c + 1] = (int32_t)(2 * ((sc >> 3) & 7) + 1);
        } else {
            up->sc[r][2 * c] = _mm256_extract_epi16(ch.sc, 0);
            up->sc[r][2 * c + 1] = _mm256_extract_epi16(ch.sc, 8);
        }
    }
    up->wd[r] = iq_d(fmt, p);
}

/* out[r][g0 + h] += block b's products of the 4 unpacked rows with groups g0 .. g0 + NG - 1 (NG 1
 * or 2; two give 8 independent accumulators, so VPDPBUSD's latency does not set the pace, and each
 * broadcast serves 32 tokens). */
INLINE void block_groups_n(int fmt, int NG, const unpacked *up, const uint8_t *relaid, int64_t nb, int64_t b,
                           int g0, __m512 out[ROWS][GROUPS_PER_PASS]) {
    const int kq = fmt == FMT_Q2_K_VNNI || fmt == FMT_Q3_K_VNNI;
    const __m512 factor = _mm512_set1_ps(fmt == FMT_IQ4_XS_VNNI || kq ? 1.0f : iq_factor(fmt));
    /* 16-value sub-blocks per weight: 2 where both halves of a chunk share one (one multiply per 32) */
    const int per = fmt == FMT_IQ2_XS || fmt == FMT_IQ2_S || fmt == FMT_IQ1_M || kq ? 1 : 2;
    const uint8_t *q[2];
    for (int h = 0; h < NG; h++) q[h] = relaid + ((int64_t)(g0 + h) * nb + b) * RELAID_BLOCK;
    __m512i isum[2][ROWS];
    for (int h = 0; h < NG; h++)
        for (int r = 0; r < ROWS; r++) isum[h][r] = _mm512_setzero_si512();
    for (int s = 0; s < 16; s += per) {
        __m512i acc[2][ROWS];
        for (int h = 0; h < NG; h++)
            for (int r = 0; r < ROWS; r++) acc[h][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 4 * s; j < 4 * (s + per); j++) {
            __m512i av[2];
            for (int h = 0; h < NG; h++) av[h] = _mm512_load_si512((const void *)(q[h] + 64 * j));
            for (int r = 0; r < ROWS; r++) {
                int32_t w4;
                memcpy(&w4, up->u[r] + 4 * j, 4);
                const __m512i wb = _mm512_set1_epi32(w4);
                for (int h = 0; h < NG; h++) acc[h][r] = _mm512_dpbusd_epi32(acc[h][r], wb, av[h]);
            }
        }
        for (int h = 0; h < NG; h++) {
            const int32_t *bias = (const int32_t *)(q[h] + RELAID_A);
            __m512i bs = _mm512_load_si512((const void *)(bias + GROUP * s));
            if (per == 2) bs = _mm512_add_epi32(bs, _mm512_load_si512((const void *)(bias + GROUP * (s + 1))));
            for (int r = 0; r < ROWS; r++)
                isum[h][r] = _mm512_add_epi32(isum[h][r], _mm512_mullo_epi32(_mm512_sub_epi32(acc[h][r], bs),
                                                                             _mm512_set1_epi32(up->sc[r][s])));
        }
    }
    for (int h = 0; h < NG; h++) {
        const __m512 ad = _mm512_load_ps((const void *)(q[h] + RELAID_A + 16 * GROUP * 4));
        __m512i msum[ROWS];   /* Q2_K: sum_s mn_s * bsum_s, from the 128 x bsum laid beside the codes */
        if (fmt == FMT_Q2_K_VNNI) {
            const int32_t *bias = (const int32_t *)(q[h] + RELAID_A);
            for (int r = 0; r < ROWS; r++) msum[r] = _mm512_setzero_si512();
            for (int s = 0; s < 16; s++) {
                const __m512i bs = _mm512_load_si512((const void *)(bias + GROUP * s));
                for (int r = 0; r < ROWS; r++)
                    msum[r] = _mm512_add_epi32(msum[r], _mm512_mullo_epi32(bs, _mm512_set1_epi32(up->mn[r][s])));
            }
        }
        for (int r = 0; r < ROWS; r++) {
            const __m512 scale = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(up->wd[r]), ad), factor);
            __m512 term = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[h][r]), scale);
            if (fmt == FMT_Q2_K_VNNI)  /* d * isum - dmin * msum, as qdot_ref.c forms it */
                term = _mm512_sub_ps(term, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(msum[r], 7)),
                                                         _mm512_mul_ps(_mm512_set1_ps(up->wmin[r]), ad)));
            out[r][g0 + h] = _mm512_add_ps(out[r][g0 + h], term);
        }
    }
}

INLINE void block_groups(int fmt, const unpacked *up, const uint8_t *relaid, int64_t nb, int64_t b, int ng,
                         __m512 out[ROWS][GROUPS_PER_PASS]) {
    int g = 0;
    for (; g + 2 <= ng; g += 2) block_groups_n(fmt, 2, up, relaid, nb, b, g, out);
    if (g < ng) block_groups_n(fmt, 1, up, relaid, nb, b, g, out);
}

/* Rows [0, n_rows) against the n_groups groups re-laid at `relaid` (n_tok tokens in all). */
INLINE void vnni_rows(int fmt, int64_t bs, int64_t k, const uint8_t *w, int64_t wrb, int64_t n_rows,
                      const uint8_t *relaid, int64_t n_groups, int64_t n_tok, float *y, int64_t ys) {
    const int64_t nb = k / STRATA_QK_K;
    unpacked up;
    for (int64_t g0 = 0; g0 < n_groups; g0 += GROUPS_PER_PASS) {
        const int ng = (int)(n_groups - g0 < GROUPS_PER_PASS ? n_groups - g0 : GROUPS_PER_PASS);
        const uint8_t *rg = relaid + g0 * nb * RELAID_BLOCK;
        for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
            const int nr = (int)(n_rows - r0 < ROWS ? n_rows - r0 : ROWS);
            __m512 out[ROWS][GROUPS_PER_PASS];
            for (int r = 0; r < ROWS; r++)
                for (int g = 0; g < ng; g++) out[r][g] = _mm512_setzero_ps();
            for (int r = nr; r < ROWS; r++) {  /* rows past the end: weights 0, never stored */
                memset(up.u[r], 0x80, sizeof(up.u[r]));
                memset(up.sc[r], 0, sizeof(up.sc[r]));
                memset(up.mn[r], 0, sizeof(up.mn[r]));
                up.wd[r] = up.wmin[r] = 0.0f;
            }
            for (int64_t b = 0; b < nb; b++) {
                for (int r = 0; r < nr; r++) unpack_row(fmt, w + (r0 + r) * wrb + b * bs, &up, r);
                block_groups(fmt, &up, rg, nb, b, ng, out);
            }
            for (int r = 0; r < nr; r++)
                for (int g = 0; g < ng; g++) {
                    float v[GROUP] __attribute__((aligned(64)));
                    _mm512_store_ps(v, out[r][g]);
                    const int64_t t0 = (g0 + g) * GROUP;
                    for (int64_t t = t0; t < t0 + GROUP && t < n_tok; t++) y[t * ys + r0 + r] = v[t - t0];
                }
        }
    }
}

/* Fewest tokens of a last group worth running padded: on the Intel machine, 8 tokens padded to 16
 * took Q2_K and Q3_K longer than the AVX2 tile, where 16 tokens took less (break-even near 11). Where
 * 512-bit operations are split (Zen 4) the others' 8 tokens go to the AVX2 build too, whose 8-token
 * tile passes once over the weights: the padded group took longer there (IQ2_XXS about the same),
 * and 9 tokens (the AVX2 build passing twice) less (a prefill's experts see about 8 tokens each: 64
 * tokens, top-8 of 64 experts) (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
INLINE int pad_min(int fmt) {
    return fmt == FMT_Q2_K_VNNI || fmt == FMT_Q3_K_VNNI ? 12 : strata_cpu_splits_512() ? 9 : 8;
}

/* The tile: groups of 16 tokens by VNNI (a last group of pad_min-15 padded), the rest by `rest`. */
INLINE void iq_vnni(int fmt, int64_t bs, strata_qdot_tile_fn rest, int64_t k, const uint8_t *w, int64_t wrb,
                    int64_t n_rows, const uint8_t *a, int64_t arb, int64_t n_tok, float *y, int64_t ys) {
    const int64_t n_vnni = n_tok % GROUP >= pad_min(fmt) ? n_tok : n_tok - n_tok % GROUP;
    const int64_t n_groups = (n_vnni + GROUP - 1) / GROUP, nb = k / STRATA_QK_K;
    uint8_t *relaid = NULL;
    if (n_vnni > 0 && nb > 0) {
        int valid = 0;
        relaid = strata_qdot_relaid(a, n_vnni, k, arb, (size_t)(n_groups * nb * RELAID_BLOCK), STRATA_RELAID_VNNI, &valid);
        if (relaid && !valid)
            for (int64_t g = 0; g < n_groups; g++)
                relay_group(a + g * GROUP * arb, arb, (int)(n_vnni - g * GROUP < GROUP ? n_vnni - g * GROUP : GROUP),
                            nb, relaid + g * nb * RELAID_BLOCK);
    }
    if (!relaid) {  /* no tokens for it, or no memory for the layout: the AVX2 tiles do it all */
        rest(k, w, wrb, n_rows, a, arb, n_tok, y, ys);
        return;
    }
    vnni_rows(fmt, bs, k, w, wrb, n_rows, relaid, n_groups, n_vnni, y, ys);
    if (n_tok > n_vnni) rest(k, w, wrb, n_rows, a + n_vnni * arb, arb, n_tok - n_vnni, y + n_vnni * ys, ys);
}

/* The tokens VNNI does not take go to the AVX2 build, or, for the grid i-quants where their gather
 * tiles run, to those (qdot_iq_vbmi.c: one pass over the weights for up to 8 tokens, where the AVX2
 * build passes twice over them for 5-7; faster at 4 and 6 tokens on the Intel machine:
 * benchmarks/RESULTS.md, "Kernel choice per CPU"). */
#define DEFINE_VNNI_TILE(name, fmt, wtype, T)                                                              \
    void strata_qdot_##name##_avx512(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,    \
                                     const uint8_t *restrict a, int64_t arb, int64_t n_tok,                \
                                     float *restrict y, int64_t ys) {                                      \
        iq_vnni(fmt, (int64_t)sizeof(wtype), strata_qdot_few_tokens(T, strata_qdot_##name##_evex), k, w, wrb, \
                n_rows, a, arb, n_tok, y, ys);                                                             \
    }

DEFINE_VNNI_TILE(iq2_xxs, FMT_IQ2_XXS, strata_block_iq2_xxs, STRATA_T_IQ2_XXS)
DEFINE_VNNI_TILE(iq2_xs, FMT_IQ2_XS, strata_block_iq2_xs, STRATA_T_IQ2_XS)
DEFINE_VNNI_TILE(iq2_s, FMT_IQ2_S, strata_block_iq2_s, STRATA_T_IQ2_S)
DEFINE_VNNI_TILE(iq3_xxs, FMT_IQ3_XXS, strata_block_iq3_xxs, STRATA_T_IQ3_XXS)
DEFINE_VNNI_TILE(iq3_s, FMT_IQ3_S, strata_block_iq3_s, STRATA_T_IQ3_S)
DEFINE_VNNI_TILE(iq1_s, FMT_IQ1_S, strata_block_iq1_s, STRATA_T_IQ1_S)
DEFINE_VNNI_TILE(iq1_m, FMT_IQ1_M, strata_block_iq1_m, STRATA_T_IQ1_M)
DEFINE_VNNI_TILE(iq4_xs, FMT_IQ4_XS_VNNI, strata_block_iq4_xs, STRATA_T_IQ4_XS)
DEFINE_VNNI_TILE(q2_k, FMT_Q2_K_VNNI, strata_block_q2_k, STRATA_T_Q2_K)
DEFINE_VNNI_TILE(q3_k, FMT_Q3_K_VNNI, strata_block_q3_k, STRATA_T_Q3_K)

#else /* not x86: the names exist so the library links; qdot.c hands them out only for AVX512,
       * which strata_resolve_impl refuses here */

STRATA_AVX512_FALLBACK(iq2_xxs) STRATA_AVX512_FALLBACK(iq2_xs) STRATA_AVX512_FALLBACK(iq2_s) STRATA_AVX512_FALLBACK(iq3_xxs) STRATA_AVX512_FALLBACK(iq3_s) STRATA_AVX512_FALLBACK(iq1_s) STRATA_AVX512_FALLBACK(iq1_m) STRATA_AVX512_FALLBACK(iq4_xs)
STRATA_AVX512_FALLBACK(q2_k) STRATA_AVX512_FALLBACK(q3_k)
#endif
