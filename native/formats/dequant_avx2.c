/*
 * AVX2 twins of the scalar kernels in dequant_ref.c (layouts: kernels.h).
 *
 * Bit-exactness with gguf.quants (0.19) is the contract, so every kernel repeats numpy's float32
 * operations in numpy's order: a product numpy rounds and then adds to is _mm256_mul_ps followed
 * by _mm256_sub_ps, never a fused multiply-add (the build also passes -ffp-contract=off).
 * Integer -> float conversions here are of small integers and therefore exact. Scale halves are
 * widened with F16C; that quiets a signalling-NaN scale, which is harmless because numpy's
 * product with it is the same quiet NaN.
 *
 * The ISA is enabled for this translation unit only; the dispatcher (dequant.c) calls these
 * kernels only after it has seen AVX2, FMA and F16C on the CPU. Elsewhere the names fall back to
 * the scalar kernels so the library links on every CPU.
 */
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

/* ---- shared helpers ---- */

static inline float half_scale(uint16_t h) { return _cvtsh_ss(h); }

/* 8 consecutive bytes at p, zero-extended to 8 int32 lanes. */
static inline __m256i u8x8_to_i32(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* 8 int32 lanes (exact small integers) times a broadcast scale: numpy's `d * q`. */
static inline __m256 scaled(__m256 d, __m256i q) { return _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)); }

/* y[i] = d * q[i] for n int8 values (n a multiple of 8), 8 a vector. */
static inline void scaled_i8(__m256 d, const int8_t *restrict q, int n, float *restrict y) {
    for (int k = 0; k < n; k += 8)
        _mm256_storeu_ps(y + k, scaled(d, _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + k)))));
}

/* numpy's `d * q - m`: two roundings, in that order. */
static inline __m256 scaled_minus(__m256 d, __m256i q, __m256 m) {
    return _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m);
}

/*
 * K-quant 6-bit scales and mins (Q4_K, Q5_K), 12 bytes for 8 sub-blocks:
 *   bytes 0-3  sc[0..3] in bits 0-5, bits 6-7 = bits 4-5 of sc[4..7]
 *   bytes 4-7  m[0..3]  in bits 0-5, bits 6-7 = bits 4-5 of m[4..7]
 *   bytes 8-11 low nibble = bits 0-3 of sc[4..7], high nibble = bits 0-3 of m[4..7]
 * Unpacked four at a time by common.h's strata_k_scale_min_words.
 * Then ds[i] = d * sc[i] and dm[i] = dmin * m[i] (float32, one rounding each, as gguf-py).
 */
static inline void k_subblock_scales(const uint8_t *restrict s, uint16_t d, uint16_t dmin,
                                     float *restrict ds, float *restrict dm) {
    uint32_t w[4];
    strata_k_scale_min_words(s, w);
    const __m256i sc = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)w[1], (int)w[0]));
    const __m256i mn = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)w[3], (int)w[2]));
    _mm256_store_ps(ds, scaled(_mm256_set1_ps(half_scale(d)), sc));
    _mm256_store_ps(dm, scaled(_mm256_set1_ps(half_scale(dmin)), mn));
}

/* ---- Q8_0: half d; i8 qs[32].  x[i] = qs[i] * d ---- */

void strata_dequant_q8_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, src += sizeof(strata_block_q8_0), dst += STRATA_QK) {
        const strata_block_q8_0 *blk = (const strata_block_q8_0 *)src;
        scaled_i8(_mm256_set1_ps(half_scale(blk->d)), blk->qs, STRATA_QK, dst);
    }
}

/* ---- Q4_0: half d; u8 qs[16].  x[i] = d * ((qs[i] & 15) - 8), x[16+i] = d * ((qs[i] >> 4) - 8) ---- */

void strata_dequant_q4_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    const __m256i low4 = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
    for (int64_t b = 0; b < n_blocks; b++, src += sizeof(strata_block_q4_0), dst += STRATA_QK) {
        const strata_block_q4_0 *blk = (const strata_block_q4_0 *)src;
        const __m256 d = _mm256_set1_ps(half_scale(blk->d));
        for (int k = 0; k < 2; k++) {
            const __m256i q = u8x8_to_i32(blk->qs + 8 * k);
            const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(q, low4), eight);
            const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight);
            _mm256_storeu_ps(dst + 8 * k, scaled(d, lo));
            _mm256_storeu_ps(dst + 16 + 8 * k, scaled(d, hi));
        }
    }
}

/*
 * ---- Q4_K: half d, dmin; u8 scales[12]; u8 qs[128] ----
 * Sub-block s (32 elements) has scale ds[s] = d * sc[s] and offset dm[s] = dmin * m[s]; qs byte
 * 32j + l holds element l of sub-block 2j (low nibble) and of 2j+1 (high nibble).
 *   x[32s + l] = ds[s] * q - dm[s]
 *
 * ---- Q5_K: half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] ----
 * As Q4_K, with a fifth bit: element l of sub-block s takes bit s of qh[l] as its bit 4.
 *   x[32s + l] = ds[s] * (q4 | ((qh[l] >> s) & 1) << 4) - dm[s]
 */

/* Bit `s` of each lane of `qh`, moved to bit 4. */
static inline __m256i q5_high_bit(__m256i qh, int s) {
    return _mm256_and_si256(_mm256_srl_epi32(_mm256_slli_epi32(qh, 4), _mm_cvtsi32_si128(s)),
                            _mm256_set1_epi32(16));
}

/* One Q4_K block (`qh` NULL) or Q5_K block (`qh` its high bits): 8 sub-blocks of 32, two per
 * 32 bytes of qs. Inlined with a constant qh, each format gets its own loop. */
static inline void q45_k_block(const uint8_t *restrict scales, uint16_t d, uint16_t dmin,
                               const uint8_t *restrict qs, const uint8_t *restrict qh, float *restrict dst) {
    const __m256i low4 = _mm256_set1_epi32(15);
    float ds[8] __attribute__((aligned(32))), dm[8] __attribute__((aligned(32)));
    k_subblock_scales(scales, d, dmin, ds, dm);
    for (int j = 0; j < 4; j++) {
        const __m256 d0 = _mm256_broadcast_ss(&ds[2 * j]), m0 = _mm256_broadcast_ss(&dm[2 * j]);
        const __m256 d1 = _mm256_broadcast_ss(&ds[2 * j + 1]), m1 = _mm256_broadcast_ss(&dm[2 * j + 1]);
        float *out = dst + 64 * j;
        for (int k = 0; k < 4; k++) {
            const __m256i q = u8x8_to_i32(qs + 32 * j + 8 * k);
            __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_srli_epi32(q, 4);
            if (qh) {
                const __m256i h = u8x8_to_i32(qh + 8 * k);
                lo = _mm256_or_si256(lo, q5_high_bit(h, 2 * j));
                hi = _mm256_or_si256(hi, q5_high_bit(h, 2 * j + 1));
            }
            _mm256_storeu_ps(out + 8 * k, scaled_minus(d0, lo, m0));
            _mm256_storeu_ps(out + 32 + 8 * k, scaled_minus(d1, hi, m1));
        }
    }
}

void strata_dequant_q4_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, src += sizeof(strata_block_q4_k), dst += STRATA_QK_K) {
        const strata_block_q4_k *blk = (const strata_block_q4_k *)src;
        q45_k_block(blk->scales, blk->d, blk->dmin, blk->qs, NULL, dst);
    }
}

void strata_dequant_q5_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, src += sizeof(strata_block_q5_k), dst += STRATA_QK_K) {
        const strata_block_q5_k *blk = (const strata_block_q5_k *)src;
        q45_k_block(blk->scales, blk->d, blk->dmin, blk->qs, blk->qh, dst);
    }
}

/*
 * ---- Q6_K: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d ----
 * Two halves of 128 elements; in half h, element r = 32u + l (u = 0..3, l = 0..31) is
 *   q = ((ql[64h + l + 32(u & 1)] >> 4(u >> 1)) & 15) | ((qh[32h + l] >> 2u) & 3) << 4
 *   x[128h + r] = (d * scales[(128h + r) / 16]) * (q - 32)
 */

/* Two bits of qh at bit 2u, moved to bits 4-5. */
static inline __m256i q6_high_bits(__m256i qh, int u) {
    const __m256i q = u < 2 ? _mm256_slli_epi32(qh, 4 - 2 * u) : _mm256_srli_epi32(qh, 2 * u - 4);
    return _mm256_and_si256(q, _mm256_set1_epi32(0x30));
}

static inline void q6_k_half(const uint8_t *restrict ql, const uint8_t *restrict qh,
                             const float *restrict ds, float *restrict out) {
    const __m256i low4 = _mm256_set1_epi32(15), bias = _mm256_set1_epi32(32);
    for (int g = 0; g < 4; g++) {                     /* l = 8g .. 8g+7 */
        const __m256i a = u8x8_to_i32(ql + 8 * g), c = u8x8_to_i32(ql + 32 + 8 * g);
        const __m256i h = u8x8_to_i32(qh + 8 * g);
        const __m256i low[4] = {_mm256_and_si256(a, low4), _mm256_and_si256(c, low4),
                                _mm256_srli_epi32(a, 4), _mm256_srli_epi32(c, 4)};
        for (int u = 0; u < 4; u++) {
            const __m256i q = _mm256_sub_epi32(_mm256_or_si256(low[u], q6_high_bits(h, u)), bias);
            const int r = 32 * u + 8 * g;
            _mm256_storeu_ps(out + r, scaled(_mm256_broadcast_ss(&ds[r / 16]), q));
        }
    }
}

void strata_dequant_q6_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    float ds[16] __attribute__((aligned(32)));
    for (int64_t b = 0; b < n_blocks; b++, src += sizeof(strata_block_q6_k), dst += STRATA_QK_K) {
        const strata_block_q6_k *blk = (const strata_block_q6_k *)src;
        scaled_i8(_mm256_set1_ps(half_scale(blk->d)), blk->scales, 16, ds);    /* ds = d * scales */
        q6_k_half(blk->ql, blk->qh, ds, dst);
        q6_k_half(blk->ql + 64, blk->qh + 32, ds + 8, dst + 128);
    }
}

/*
 * ---- MXFP4: u8 e; u8 qs[16] ----
 * d = ggml_e8m0_to_fp32_half(e): the float32 with bits e < 2 ? 0x00200000 << e : (e - 1) << 23
 * (2^(e-128), subnormal for e < 2, finite for every byte). kv = E2M1 codes doubled.
 *   x[i] = d * kv[qs[i] & 15], x[16+i] = d * kv[qs[i] >> 4]
 */
static inline __m256 e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return _mm256_castsi256_ps(_mm256_set1_epi32((int)bits));
}

void strata_dequant_mxfp4_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    const __m128i kv = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i low4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < n_blocks; b++, src += sizeof(strata_block_mxfp4), dst += STRATA_QK) {
        const strata_block_mxfp4 *blk = (const strata_block_mxfp4 *)src;
        const __m256 d = e8m0_half(blk->e);
        const __m128i q = _mm_loadu_si128((const __m128i *)blk->qs);
        const __m128i v[2] = {_mm_shuffle_epi8(kv, _mm_and_si128(q, low4)),
                              _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), low4))};
        for (int k = 0; k < 2; k++) {               /* k = 0: low nibbles, x[0..15]; 1: x[16..31] */
            _mm256_storeu_ps(dst + 16 * k, scaled(d, _mm256_cvtepi8_epi32(v[k])));
            _mm256_storeu_ps(dst + 16 * k + 8, scaled(d, _mm256_cvtepi8_epi32(_mm_srli_si128(v[k], 8))));
        }
    }
}

/*
 * ---- F16 / BF16 tensors (block = 1 element) ----
 * Any tail shorter than a vector goes through the same vector code on a zero-padded copy, so the
 * whole output comes from one code path.
 */

/* F16C quiets a signalling NaN; numpy's conversion keeps it. Clear bit 22 again in the NaN lanes
 * of f whose half had its quiet bit (0x200) clear. */
static inline __m256 f16_keep_snan(__m128i h, __m256 f) {
    const __m256i h32 = _mm256_cvtepu16_epi32(h);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x7fff)),
                                           _mm256_set1_epi32(0x7c00));
    const __m256i quiet = _mm256_slli_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x200)), 13);
    const __m256i clear = _mm256_andnot_si256(quiet, _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000)));
    return _mm256_castsi256_ps(_mm256_andnot_si256(clear, _mm256_castps_si256(f)));
}

/* F16 -> F32, bit for bit as numpy (exact for every value; NaN payloads kept). */
static inline __m256 f16x8_to_f32(__m128i h) {
    const __m256 f = _mm256_cvtph_ps(h);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)) != 0, 0))
        return f16_keep_snan(h, f);
    return f;
}

void strata_dequant_f16_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    int64_t i = 0;
    for (; i + 8 <= n_blocks; i += 8)
        _mm256_storeu_ps(dst + i, f16x8_to_f32(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
    if (i < n_blocks) {
        uint8_t pad[16] = {0};
        float out[8];
        memcpy(pad, src + 2 * i, (size_t)(n_blocks - i) * 2);
        _mm256_storeu_ps(out, f16x8_to_f32(_mm_loadu_si128((const __m128i *)pad)));
        memcpy(dst + i, out, (size_t)(n_blocks - i) * 4);
    }
}

/* BF16 -> F32: the 16 bits become the high half of the float32 (gguf-py: int16 -> int32 << 16). */
static inline __m256 bf16x8_to_f32(const uint8_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

void strata_dequant_bf16_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    int64_t i = 0;
    for (; i + 8 <= n_blocks; i += 8) _mm256_storeu_ps(dst + i, bf16x8_to_f32(src + 2 * i));
    if (i < n_blocks) {
        uint8_t pad[16] = {0};
        float out[8];
        memcpy(pad, src + 2 * i, (size_t)(n_blocks - i) * 2);
        _mm256_storeu_ps(out, bf16x8_to_f32(pad));
        memcpy(dst + i, out, (size_t)(n_blocks - i) * 4);
    }
}

/*
 * ---- float32 -> float16: F16C, round to nearest even. Matches torch's .to(torch.float16)
 * bit for bit, NaNs included (sign kept, quiet bit set, top 9 payload bits kept). ----
 */
void strata_convert_f16_avx2(const float *restrict src, void *restrict dst, int64_t n) {
    uint8_t *out = (uint8_t *)dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + 2 * i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        float pad[8] = {0};
        uint8_t h[16];
        memcpy(pad, src + i, (size_t)(n - i) * 4);
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(_mm256_loadu_ps(pad), _MM_FROUND_TO_NEAREST_INT));
        memcpy(out + 2 * i, h, (size_t)(n - i) * 2);
    }
}

/*
 * ---- float32 -> bfloat16: round to nearest even in integer arithmetic,
 *   bf = (x + 0x7fff + ((x >> 16) & 1)) >> 16,
 * and every NaN becomes 0xffff, which is what torch's vectorised CPU conversion (AVX2 and AVX-512
 * builds) writes; no finite input can carry out of 32 bits. ----
 */
static inline __m256i bf16x8_round(__m256 x) {
    const __m256i v = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(v, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i ordered = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_ORD_Q));
    return _mm256_blendv_epi8(_mm256_set1_epi32(0xffff), r, ordered);
}

/* 16 floats -> 16 bfloat16 in order (packus works per 128-bit lane; the permute restores order). */
static inline __m256i bf16x16(const float *p) {
    const __m256i packed = _mm256_packus_epi32(bf16x8_round(_mm256_loadu_ps(p)), bf16x8_round(_mm256_loadu_ps(p + 8)));
    return _mm256_permute4x64_epi64(packed, 0xd8);
}

void strata_convert_bf16_avx2(const float *restrict src, void *restrict dst, int64_t n) {
    uint8_t *out = (uint8_t *)dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(out + 2 * i), bf16x16(src + i));
    if (i < n) {
        float pad[16] = {0};
        uint8_t h[32];
        memcpy(pad, src + i, (size_t)(n - i) * 4);
        _mm256_storeu_si256((__m256i *)h, bf16x16(pad));
        memcpy(out + 2 * i, h, (size_t)(n - i) * 2);
    }
}

#else /* not x86: the dispatcher never selects these; they exist so the library links. */

void strata_dequant_f16_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_f16_ref(src, dst, n_blocks); }
void strata_dequant_bf16_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_bf16_ref(src, dst, n_blocks); }
void strata_dequant_q4_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q4_0_ref(src, dst, n_blocks); }
void strata_dequant_q8_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q8_0_ref(src, dst, n_blocks); }
void strata_dequant_q4_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q4_k_ref(src, dst, n_blocks); }
void strata_dequant_q5_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q5_k_ref(src, dst, n_blocks); }
void strata_dequant_q6_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q6_k_ref(src, dst, n_blocks); }
void strata_dequant_mxfp4_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_mxfp4_ref(src, dst, n_blocks); }
void strata_convert_f16_avx2(const float *restrict src, void *restrict dst, int64_t n) { strata_convert_f16_ref(src, dst, n); }
void strata_convert_bf16_avx2(const float *restrict src, void *restrict dst, int64_t n) { strata_convert_bf16_ref(src, dst, n); }

#endif
