/*
 * TQ1_0's decode (1-3 tokens) on AVX2 CPUs with AVX-VNNI (VEX-encoded VPDPBUSD on ymm: Intel's
 * Alder Lake, Raptor Lake and later client cores, whose AVX-512 is off), in place of the AVX2 tile
 * that makes each byte's five base-3 digits (qdot_iq4_avx2.c; interface: qdot.h; block layout:
 * common.h). The sums are those of the AVX-512 machines' TQ1_0 tile (qdot_iq4_avx2.c, EVEX build),
 * on 256-bit vectors:
 *
 * Digit p of a byte m is (3 m_p) >> 8 = (3 m_p - m_{p+1}) / 256, with m_p = 3^p m mod 256, so a
 * block's sum of activations times digits is (3 sum_p dot(a_p, m_p) - sum_p dot(a_p, m_{p+1})) / 256:
 * two VPDPBUSD per power and vector of the bytes as they are, two byte adds to the next power, no
 * digit made. A block's 52 code bytes are two vectors: qs[0..31] (value 32 p + j is digit p of
 * qs[j]: the activations as they lie, 32 at a time) and the 32 bytes that end with the block (qs[22
 * ..47], qh[0..3], d), whose activations are re-laid once per call and 16 blocks: zero against
 * qs[22..31] and d, value 160 + 16 p + j against qs[32 + j], value 240 + 4 p + j against qh[j] (p <
 * 4; qh holds four digits). Digits are q + 1 in {0, 1, 2}: the + 1 comes off with the block's sum
 * of the activations, 256 times it laid in lane 0 of the second sum's start. The block's exact
 * integer sum (256 times the scalar tile's, in every lane a multiple of 256) is scaled by d * a.d /
 * 256 and added in 8 float lanes, reduced once per output: the scalar result up to the order of a
 * float sum. Per block and token 10 VPDPBUSD against the AVX2 tile's 8 VPMADDUBSW, and 10 byte adds
 * a block against its ~50 instructions of digits; the same integer per block, and a token's result
 * does not depend on the call's token count (1-3; more go to the AVX2 tile: prefill).
 *
 * On the Intel machine (its cores are Raptor Cove, the P-cores of Raptor Lake), AVX2 family, faster
 * than the AVX2 tile at 1-3 tokens, in cache and from DRAM (against STRATA_KERNEL=-avx_vnni).
 * VPDPBUSD on ymm issues two a cycle there (as VPMADDUBSW). Tried, and no faster: pairs of blocks
 * whose second vectors share one (qs[32..47] of each, a half each) and whose qh bytes' four powers are
 * made at once in another, 32 VPDPBUSD a pair for 40
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU").
 *
 * The ISA is enabled for this translation unit only; qdot.c hands the tile out only after the CPU
 * was seen to have AVX2, FMA, F16C and AVX-VNNI (strata_cpu_avx_vnni).
 */
#include "qdot.h"

#include <stddef.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && STRATA_CC_AVX_VNNI
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include "qdot_avx2_common.h"   /* INLINE, hsum8 */

#define CHUNK 16   /* activation blocks re-laid at a time (4096 values) */
#define ROWS 16    /* rows per re-laid chunk */
#define TOK 3      /* tokens of a decode call, at most */
#define AHEAD 4096 /* bytes fetched ahead in the row */
#define TAIL 22    /* the second vector's offset in the block: its 32 bytes end with it */
#define SUMS_TOK 2 /* calls of up to this many tokens take the sums without digits */

/* One token's activations of a chunk: per block the second vector's per power (see above), the sum
 * of the block's activations times 256 and negated (lane 0), its scale and its activations as they
 * lie (the first vector's). */
typedef struct {
    __m256i b[CHUNK][5], sum256[CHUNK], neg[CHUNK];
    float d[CHUNK];
    const int8_t *q[CHUNK];
} acts;

INLINE void relay(const strata_block_act_q8k *ab, int nb, acts *out) {
    /* bytes 10-25 against qs[32..47], 26-29 against qh[0..3] (not for the fifth power) */
    const __m256i at = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1,
                                        -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0);
    const __m256i at_h = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, 0, 0);
    for (int b = 0; b < nb; b++) {
        const int8_t *q = ab[b].q;
        for (int p = 0; p < 5; p++) {   /* value 160 + 16 p + j at byte 10 + j, 240 + 4 p + j at 26 + j (both loads in the block) */
            const __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(q + 150 + 16 * p)), at);
            out->b[b][p] = p < 4 ? _mm256_or_si256(v, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(q + 214 + 4 * p)), at_h)) : v;
        }
        int sum = 0;
        for (int i = 0; i < 16; i++) sum += ab[b].bsums[i];
        out->sum256[b] = _mm256_zextsi128_si256(_mm_cvtsi32_si128(256 * sum));
        out->neg[b] = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-sum));
        out->d[b] = ab[b].d;
        out->q[b] = q;
    }
}

INLINE __m256i times3(__m256i v) { return _mm256_add_epi8(_mm256_add_epi8(v, v), v); }

/* The two code vectors of a block */
INLINE void block_bytes(const strata_block_tq1_0 *wb, __m256i m[2]) {
    m[0] = _mm256_loadu_si256((const __m256i *)wb->qs);
    m[1] = _mm256_loadu_si256((const __m256i *)((const uint8_t *)wb + TAIL));
}

/* 256 times the integer sums of ng blocks (wb[0] ...: blocks b ...) for nt <= SUMS_TOK tokens: three
 * times sum_p dot(a_p, m_p), less sum_p dot(a_p, m_{p+1}) and 256 times the activations' sum. Each
 * vector's two sums are chains of their own (5 VPDPBUSD; faster at 1 token than one chain for both
 * vectors), and at 1 token two blocks' chains interleave. */
INLINE void group_sums(int nt, int ng, const strata_block_tq1_0 *wb, const acts *a, int b, __m256i isum[2][TOK]) {
    __m256i m[2][2], cur[2][TOK][2], next[2][TOK][2];   /* per block, token and vector */
    for (int h = 0; h < ng; h++) {
        block_bytes(&wb[h], m[h]);
        for (int t = 0; t < nt; t++) {
            cur[h][t][0] = cur[h][t][1] = next[h][t][1] = _mm256_setzero_si256();
            next[h][t][0] = a[t].sum256[b + h];
        }
    }
    for (int p = 0; p < 5; p++)
        for (int h = 0; h < ng; h++) {
            const __m256i m3a = times3(m[h][0]), m3b = times3(m[h][1]);
            for (int t = 0; t < nt; t++) {
                const __m256i qa = _mm256_loadu_si256((const __m256i *)(a[t].q[b + h] + 32 * p));
                cur[h][t][0] = _mm256_dpbusd_avx_epi32(cur[h][t][0], m[h][0], qa);
                next[h][t][0] = _mm256_dpbusd_avx_epi32(next[h][t][0], m3a, qa);
                cur[h][t][1] = _mm256_dpbusd_avx_epi32(cur[h][t][1], m[h][1], a[t].b[b + h][p]);
                next[h][t][1] = _mm256_dpbusd_avx_epi32(next[h][t][1], m3b, a[t].b[b + h][p]);
            }
            m[h][0] = m3a;
            m[h][1] = m3b;
        }
    for (int h = 0; h < ng; h++)
        for (int t = 0; t < nt; t++) {
            const __m256i c = _mm256_add_epi32(cur[h][t][0], cur[h][t][1]);
            isum[h][t] = _mm256_sub_epi32(_mm256_add_epi32(_mm256_add_epi32(c, c), c), _mm256_add_epi32(next[h][t][0], next[h][t][1]));
        }
}

/* The same sums for nt > SUMS_TOK tokens with the digits made, 32 at a time (two compares of m_p ^
 * 0x80 with its thresholds and two subtracts, as qdot_iq4_avx2.c's tq1_digits; times 3 keeps the
 * flip: 3 * -128 = -128 mod 256), one VPDPBUSD a vector, power and token, the activations' sum taken
 * off at the start. Times 256, each lane is the lane of group_sums: a token's result is the same
 * bits either way. From 3 tokens faster than the sums without digits, at 2 slower
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
INLINE void digit_sums(int nt, const strata_block_tq1_0 *wb, const acts *a, int b, __m256i isum[TOK]) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), lo = _mm256_set1_epi8(-43), hi = _mm256_set1_epi8(42);
    __m256i m[2], acc[TOK][2];
    block_bytes(wb, m);
    for (int v = 0; v < 2; v++) m[v] = _mm256_xor_si256(m[v], flip);
    for (int t = 0; t < nt; t++) {
        acc[t][0] = a[t].neg[b];
        acc[t][1] = _mm256_setzero_si256();
    }
    for (int p = 0; p < 5; p++) {
        __m256i d[2];
        for (int v = 0; v < 2; v++)
            d[v] = _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), _mm256_cmpgt_epi8(m[v], lo)), _mm256_cmpgt_epi8(m[v], hi));
        for (int t = 0; t < nt; t++) {
            acc[t][0] = _mm256_dpbusd_avx_epi32(acc[t][0], d[0], _mm256_loadu_si256((const __m256i *)(a[t].q[b] + 32 * p)));
            acc[t][1] = _mm256_dpbusd_avx_epi32(acc[t][1], d[1], a[t].b[b][p]);
        }
        if (p < 4)
            for (int v = 0; v < 2; v++) m[v] = times3(m[v]);
    }
    for (int t = 0; t < nt; t++) isum[t] = _mm256_add_epi32(acc[t][0], acc[t][1]);
}

INLINE void rows(int nr, int nt, int nb, const uint8_t *w, int64_t wrb, const acts *a, __m256 acc[ROWS][TOK]) {
    const int group = nt == 1 ? 2 : 1;   /* blocks whose chains interleave (two tokens interleave theirs) */
    for (int r = 0; r < nr; r++) {
        const strata_block_tq1_0 *row = (const strata_block_tq1_0 *)(w + r * wrb);
        float wdad[TOK][CHUNK];   /* d * a.d (/ 256 for the sums without digits) per token and block */
        for (int b = 0; b < nb; b++) {
            const float wd = _cvtsh_ss(row[b].d) * (nt <= SUMS_TOK ? 1.0f / 256 : 1.0f);
            for (int t = 0; t < nt; t++) wdad[t][b] = wd * a[t].d[b];
        }
        __m256 s[TOK];
        for (int t = 0; t < nt; t++) s[t] = acc[r][t];
        for (int b = 0; b < nb; b += group) {
            const int ng = nb - b < group ? nb - b : group;
            for (int64_t o = 0; o < ng * (int64_t)sizeof(*row); o += 64)
                _mm_prefetch((const char *)(row + b) + AHEAD + o, _MM_HINT_T0);
            __m256i isum[2][TOK];
            if (nt > SUMS_TOK) digit_sums(nt, row + b, a, b, isum[0]);
            else if (ng == 2) group_sums(nt, 2, row + b, a, b, isum);
            else group_sums(nt, 1, row + b, a, b, isum);
            for (int h = 0; h < ng; h++)
                for (int t = 0; t < nt; t++)
                    s[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][t]), _mm256_broadcast_ss(&wdad[t][b + h]), s[t]);
        }
        for (int t = 0; t < nt; t++) acc[r][t] = s[t];
    }
}

void strata_qdot_tq1_0_avxvnni(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                               const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    if (n_tok > TOK) {   /* not a decode call: the AVX2 tile */
        strata_qdot_tq1_0_avx2(k, w, wrb, n_rows, a, arb, n_tok, y, ys);
        return;
    }
    if (n_tok < 1) return;
    const int64_t nb = k / STRATA_QK_K;
    const int nt = (int)n_tok;
    acts ac[TOK];
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        const int nr = (int)(n_rows - r0 < ROWS ? n_rows - r0 : ROWS);
        __m256 acc[ROWS][TOK];
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) acc[r][t] = _mm256_setzero_ps();
        for (int64_t c0 = 0; c0 < nb; c0 += CHUNK) {
            const int nc = (int)(nb - c0 < CHUNK ? nb - c0 : CHUNK);
            for (int t = 0; t < nt; t++) relay((const strata_block_act_q8k *)(a + t * arb) + c0, nc, &ac[t]);
            const uint8_t *wc = w + r0 * wrb + c0 * (int64_t)sizeof(strata_block_tq1_0);
            switch (nt) {   /* the token count a constant in each copy */
            case 1: rows(nr, 1, nc, wc, wrb, ac, acc); break;
            case 2: rows(nr, 2, nc, wc, wrb, ac, acc); break;
            default: rows(nr, 3, nc, wc, wrb, ac, acc); break;
            }
        }
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) y[t * ys + r0 + r] = hsum8(acc[r][t]);
    }
}

#else /* not x86, or a compiler without AVX-VNNI: the name exists so the library links; qdot.c never
       * hands it out (strata_cpu_avx_vnni() says 0) */

void strata_qdot_tq1_0_avxvnni(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                               const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    strata_qdot_tq1_0_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);
}
#endif
