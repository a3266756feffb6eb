/*
 * AVX-512 VNNI decode tile (1-3 tokens) of IQ4_XS against STRATA_ACT_Q8K. Interface and tolerance
 * contract: qdot.h; the format's integer formulation: qdot_iq.c. Prefill stays on qdot_iq_vnni.c's
 * tile.
 *
 * A block's 128 code bytes are two zmm loads, each four 32-value sub-blocks: lane i of a load holds
 * sub-block 4 h + i's codes, low nibbles its values 0-15 and high nibbles 16-31. An AND (and a shift
 * and an AND) and a VPSHUFB in the code book plus 128 make 64 unsigned values; two VPDPBUSD take
 * them against activations re-laid once per call and thread to match (strata_qdot_relaid: per block
 * and half, the sub-blocks' first 16 values, their last 16, then each sub-block's -128 times its
 * 32 activations' sum in the first dword of its lane, where the VPDPBUSD chain starts). Each lane
 * then holds four partial sums of its sub-block, exact integers; they convert to float and take the
 * sub-block's scale (ls - 32) * d * a.d in one FMA per 64 values, into 16 lanes summed at the row's
 * end: the scalar tile's integers, the float terms added in another order.
 *
 * The ISA is enabled for this translation unit only; qdot.c hands the tile out only for
 * STRATA_IMPL_AVX512.
 */
#include "iq_tables.h"
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")
#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define PF_AHEAD 3072
#include "qdot_prefetch.h"

#define XS_HALF 192                 /* re-laid bytes of half a block: low values, high values, starts */
#define XS_BLOCK (2 * XS_HALF)

/* Token t's activations re-laid, nb blocks of XS_BLOCK bytes (see the file's comment). */
static void xs_relay(const uint8_t *a, int64_t arb, int64_t n_tok, int64_t nb, uint8_t *out) {
    for (int64_t t = 0; t < n_tok; t++) {
        const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (t * nb + b) * XS_BLOCK;
            for (int h = 0; h < 2; h++, o += XS_HALF) {
                int32_t start[16] = {0};
                for (int i = 0; i < 4; i++) {
                    const int j = 4 * h + i;
                    memcpy(o + 16 * i, ab[b].q + 32 * j, 16);
                    memcpy(o + 64 + 16 * i, ab[b].q + 32 * j + 16, 16);
                    start[4 * i] = -128 * (ab[b].bsums[2 * j] + ab[b].bsums[2 * j + 1]);
                }
                memcpy(o + 128, start, sizeof start);
            }
        }
    }
}

/* One row x nt (1-3) tokens: y[t * ys]. x: the re-laid activations, tok_bytes a token. */
INLINE void xs_row(int nt, int64_t nb, const uint8_t *w, const uint8_t *a, int64_t arb, const uint8_t *x,
                   int64_t tok_bytes, float *y, int64_t ys, const uint8_t *ahead_end) {
    const int64_t bs = sizeof(strata_block_iq4_xs);
    const __m512i table = _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)strata_kvalues_iq4nl),
                                                              _mm_set1_epi8((char)128)));
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i lane0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i lane1 = _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    __m512 acc[3] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const strata_block_iq4_xs *wb = (const strata_block_iq4_xs *)(w + b * bs);
        fetch_block_ahead((const uint8_t *)wb, bs, ahead_end);
        /* the 8 scales ls: nibble j of scales_l below bits 2 j, 2 j + 1 of scales_h, one per byte */
        uint32_t sl;
        memcpy(&sl, wb->scales_l, 4);
        const uint64_t ls = _pdep_u64(sl, 0x0f0f0f0f0f0f0f0full) | _pdep_u64(wb->scales_h, 0x3030303030303030ull);
        const __m256 sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ls)),
                                                                            _mm256_set1_epi32(32))),
                                        _mm256_set1_ps(_cvtsh_ss(wb->d)));
        const __m512 f[2] = {_mm512_permutexvar_ps(lane0, _mm512_castps256_ps512(sc)),
                             _mm512_permutexvar_ps(lane1, _mm512_castps256_ps512(sc))};
        __m512i lo[2], hi[2];
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_loadu_si512(wb->qs + 64 * h);
            lo[h] = _mm512_shuffle_epi8(table, _mm512_and_si512(q, low4));
            hi[h] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(q, 4), low4));
        }
        for (int t = 0; t < nt; t++) {
            const uint8_t *xb = x + t * tok_bytes + b * XS_BLOCK;
            const __m512 ad = _mm512_set1_ps(((const strata_block_act_q8k *)(a + t * arb))[b].d);
            for (int h = 0; h < 2; h++) {
                const uint8_t *xh = xb + h * XS_HALF;
                __m512i s = _mm512_load_si512(xh + 128);
                s = _mm512_dpbusd_epi32(s, lo[h], _mm512_load_si512(xh));
                s = _mm512_dpbusd_epi32(s, hi[h], _mm512_load_si512(xh + 64));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(f[h], ad), acc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) y[t * ys] = _mm512_reduce_add_ps(acc[t]);
}

/* Decode calls (1-3 tokens); 4 tokens and more (leftovers of a prefill tile) and a thread without
 * memory for the layout go to the AVX2 build. */
void strata_qdot_iq4_xs_zmm(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                            const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    const int64_t nb = k / STRATA_QK_K, tok_bytes = nb * XS_BLOCK;
    const uint8_t *x = strata_qdot_decode_relaid(strata_qdot_iq4_xs_evex, xs_relay, STRATA_RELAID_IQ4_XS, nb, tok_bytes,
                                                 k, w, wrb, n_rows, a, arb, n_tok, y, ys);
    if (!x) return;
    const uint8_t *ahead_end = strata_qdot_ahead();
    for (int64_t r = 0; r < n_rows; r++) {
        if (n_tok == 1) xs_row(1, nb, w + r * wrb, a, arb, x, tok_bytes, y + r, ys, ahead_end);
        else if (n_tok == 2) xs_row(2, nb, w + r * wrb, a, arb, x, tok_bytes, y + r, ys, ahead_end);
        else xs_row(3, nb, w + r * wrb, a, arb, x, tok_bytes, y + r, ys, ahead_end);
    }
}

#else /* not x86: the name exists so the library links; qdot.c hands it out only for AVX512 */

void strata_qdot_iq4_xs_zmm(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                            const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    strata_qdot_iq4_xs_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);
}
#endif
