/*
 * AVX-512 VNNI decode tile (1-3 tokens) of NVFP4 against STRATA_ACT_Q8 (two activation blocks per
 * 64-value weight block). Interface and tolerance contract: qdot.h; the format's integer
 * formulation: qdot_iq.c. Prefill stays on the AVX2 build.
 *
 * A block's 32 code bytes hold sub-block s (16 values) in bytes 8 s .. 8 s + 7, low nibbles values
 * 0-7, high nibbles 8-15. Broadcast to both halves of a zmm, a per-quadword shift (0, 4) and an AND
 * give the low nibbles in the low half and the high nibbles in the high one, and a VPSHUFB in the
 * doubled E2M1 values plus 12 makes them unsigned. The activations are re-laid once per call and
 * thread to match (strata_qdot_relaid: per block, byte 8 s + i of the low half a[16 s + i], of the
 * high half a[16 s + 8 + i]; then -12 times each dword's four activations, where its VPDPBUSD
 * starts; then 128 times the activation block's d per dword), so one VPDPBUSD leaves sub-block s's
 * sum in dwords 2 s, 2 s + 1, 2 s + 8, 2 s + 9. The four UE4M3 scales go to those dwords as binary16
 * (the byte's low 7 bits shifted up 7: the same number times 2^-8, 0x7f read as 0, as
 * qdot_iq4_avx2.c's nvfp4_scales), one VCVTPH2PS, and times the re-laid 128 * a.d they are
 * strata_ue4m3_half(d_s) * a.d exactly, the scalar tile's factor; one FMA per block and token adds
 * the sums into 16 lanes, summed at the row's end.
 *
 * The ISA is enabled for this translation unit only; qdot.c hands the tile out only for
 * STRATA_IMPL_AVX512.
 */
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define PF_AHEAD 2048
#include "qdot_prefetch.h"

#define FP4_BLOCK 192   /* re-laid bytes of a weight block and token: codes' order, starts, factors */

static void fp4_relay(const uint8_t *a, int64_t arb, int64_t n_tok, int64_t nb, uint8_t *out) {
    for (int64_t t = 0; t < n_tok; t++) {
        const strata_block_act_q8 *ab = (const strata_block_act_q8 *)(a + t * arb);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (t * nb + b) * FP4_BLOCK;
            int8_t q[64];
            memcpy(q, ab[2 * b].q, 32);
            memcpy(q + 32, ab[2 * b + 1].q, 32);
            for (int s = 0; s < 4; s++) {
                memcpy(o + 8 * s, q + 16 * s, 8);
                memcpy(o + 32 + 8 * s, q + 16 * s + 8, 8);
            }
            int32_t start[16];
            float f[16];
            for (int l = 0; l < 16; l++) {
                const int8_t *x = (const int8_t *)o + 4 * l;
                start[l] = -12 * (x[0] + x[1] + x[2] + x[3]);
                f[l] = 128.0f * ab[2 * b + (l % 8) / 4].d;   /* dword l: sub-block (l % 8) / 2 */
            }
            memcpy(o + 64, start, sizeof start);
            memcpy(o + 128, f, sizeof f);
        }
    }
}

/* One row x nt (1-3) tokens: y[t * ys]. */
INLINE void fp4_row(int nt, int64_t nb, const uint8_t *w, const uint8_t *x, int64_t tok_bytes, float *y, int64_t ys,
                    const uint8_t *ahead_end) {
    const int64_t bs = sizeof(strata_block_nvfp4);
    /* 2 * E2M1 + 12: qdot.h's strata_e2m1_doubled, biased to be unsigned */
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0), low4 = _mm512_set1_epi8(15);
    /* word l of both halves: scale byte (l % 8) / 2, zero-extended */
    const __m256i dup = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1));
    const __m256i low7 = _mm256_set1_epi16(0x7f);
    __m512 acc[3] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const strata_block_nvfp4 *wb = (const strata_block_nvfp4 *)(w + b * bs);
        fetch_block_ahead((const uint8_t *)wb, bs, ahead_end);
        const __m512i c = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)wb->qs));
        const __m512i v = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srlv_epi64(c, shift), low4));
        const __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)strata_u32(wb->d)), dup);
        const __m256i h7 = _mm256_maskz_slli_epi16(_mm256_cmpneq_epi16_mask(h, low7), _mm256_and_si256(h, low7), 7);   /* 0x7f: 0 */
        const __m512 sc = _mm512_cvtph_ps(h7);
        for (int t = 0; t < nt; t++) {
            const uint8_t *xb = x + t * tok_bytes + b * FP4_BLOCK;
            const __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(xb + 64), v, _mm512_load_si512(xb));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, _mm512_load_ps((const float *)(xb + 128))),
                                     acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[t * ys] = _mm512_reduce_add_ps(acc[t]);
}

/* Decode calls (1-3 tokens); more tokens and a thread without memory for the layout go to the AVX2
 * build. */
void strata_qdot_nvfp4_zmm(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                           const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    const int64_t nb = k / STRATA_QK_NVFP4, tok_bytes = nb * FP4_BLOCK;
    const uint8_t *x = strata_qdot_decode_relaid(strata_qdot_nvfp4_evex, fp4_relay, STRATA_RELAID_NVFP4, nb, tok_bytes,
                                                 k, w, wrb, n_rows, a, arb, n_tok, y, ys);
    if (!x) return;
    const uint8_t *ahead_end = strata_qdot_ahead();
    for (int64_t r = 0; r < n_rows; r++) {
        if (n_tok == 1) fp4_row(1, nb, w + r * wrb, x, tok_bytes, y + r, ys, ahead_end);
        else if (n_tok == 2) fp4_row(2, nb, w + r * wrb, x, tok_bytes, y + r, ys, ahead_end);
        else fp4_row(3, nb, w + r * wrb, x, tok_bytes, y + r, ys, ahead_end);
    }
}

#else /* not x86: the name exists so the library links; qdot.c hands it out only for AVX512 */

void strata_qdot_nvfp4_zmm(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                           const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    strata_qdot_nvfp4_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);
}
#endif
