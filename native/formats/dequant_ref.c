/*
 * Portable scalar reference kernels: the definition of every block format in plain C.
 *
 * Each kernel reproduces gguf-py's numpy arithmetic (gguf.quants, v0.19) operation for operation,
 * in float32: the products gguf-py forms first (d * sc, dmin * m) are formed first here too, and
 * nothing is fused (the build passes -ffp-contract=off). Results are therefore bit-identical to
 * gguf.quants.dequantize, NaN payloads and signed zeros included. The AVX2 twins in
 * dequant_avx2.c are held to these kernels bit for bit.
 *
 * Element order inside a block follows ggml: where a byte holds two 4-bit codes, a run of low
 * nibbles comes first, then the run of high nibbles of the same bytes.
 */
#include "kernels.h"

/* ---- Shared pieces ---- */

/* q[j] = qs[j] & 15, q[n + j] = qs[j] >> 4 for j < n: low nibbles first, as ggml packs them. */
static inline void unpack_nibbles(const uint8_t *qs, int n, uint8_t *q) {
    for (int j = 0; j < n; j++) {
        q[j] = qs[j] & 15;
        q[n + j] = qs[j] >> 4;
    }
}

/* Q5_0/Q5_1: bit j of the little-endian 32-bit qh is bit 4 of element j. */
static inline void add_fifth_bits(const uint8_t qh[4], uint8_t q[32]) {
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int j = 0; j < 32; j++) q[j] |= ((h >> j) & 1u) << 4;
}

/* y[j] = d * q[j] + m. When both the product and m are NaN, numpy's vector loop returns the
 * product's NaN; a plain `+` lets the compiler commute the operands and pick either payload. With
 * one NaN operand the sum is that NaN whatever the order, so only a NaN m takes the careful loop
 * (a per-element test would stop the common loop from vectorising). */
static inline void scale_add_min(float d, float m, const uint8_t q[32], float *y) {
    if (m == m) {
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j] + m;
        return;
    }
    for (int j = 0; j < 32; j++) {
        const float x = d * (float)q[j];
        y[j] = x != x ? x : x + m;
    }
}

/* ---- F32, F16, BF16 (one element per "block") ---- */

void strata_dequant_f32_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    memcpy(dst, src, (size_t)n_blocks * 4);
}

void strata_dequant_f16_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    for (int64_t i = 0; i < n_blocks; i++) {
        uint16_t h;  /* little-endian, at any alignment */
        memcpy(&h, src + 2 * i, 2);
        dst[i] = strata_half_to_f32(h);
    }
}

/* BF16: the upper half of a float32; the bits move unchanged (NaN payloads too). */
void strata_dequant_bf16_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) {
    for (int64_t i = 0; i < n_blocks; i++)
        dst[i] = strata_bits_to_f32((uint32_t)src[2 * i] << 16 | (uint32_t)src[2 * i + 1] << 24);
}

/* ---- Q4_0: 32 elems, 18 B = half d; u8 qs[16].  x[j] = d * (q[j] - 8), q = 4-bit code ---- */

static void block_q4_0(const strata_block_q4_0 *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    uint8_t q[32];
    unpack_nibbles(b->qs, 16, q);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(q[j] - 8);
}

/* ---- Q4_1: 32 elems, 20 B = half d, m; u8 qs[16].  x[j] = (d * q[j]) + m ---- */

static void block_q4_1(const strata_block_q4_1 *b, float *y) {
    const float d = strata_half_to_f32(b->d), m = strata_half_to_f32(b->m);
    uint8_t q[32];
    unpack_nibbles(b->qs, 16, q);
    scale_add_min(d, m, q, y);
}

/* ---- Q5_0: 32 elems, 22 B = half d; u8 qh[4]; u8 qs[16].  x[j] = d * (q5[j] - 16),
 *      q5 = 4-bit code | bit j of qh << 4 ---- */

static void block_q5_0(const strata_block_q5_0 *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    uint8_t q[32];
    unpack_nibbles(b->qs, 16, q);
    add_fifth_bits(b->qh, q);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(q[j] - 16);
}

/* ---- Q5_1: 32 elems, 24 B = half d, m; u8 qh[4]; u8 qs[16].  x[j] = (d * q5[j]) + m ---- */

static void block_q5_1(const strata_block_q5_1 *b, float *y) {
    const float d = strata_half_to_f32(b->d), m = strata_half_to_f32(b->m);
    uint8_t q[32];
    unpack_nibbles(b->qs, 16, q);
    add_fifth_bits(b->qh, q);
    scale_add_min(d, m, q, y);
}

/* ---- Q8_0: 32 elems, 34 B = half d; i8 qs[32].  x[j] = q[j] * d ---- */

static void block_q8_0(const strata_block_q8_0 *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int j = 0; j < 32; j++) y[j] = (float)b->qs[j] * d;
}

/* ---- Q2_K: 256 elems, 84 B = u8 scales[16]; u8 qs[64]; half d, dmin.
 *      16 sub-blocks of 16; scales[s] = sc (low nibble) | mn (high nibble).
 *      x = (d * sc) * q - (dmin * mn), q = 2 bits: element i sits in qs[32 * (i / 128) + i % 32]
 *      at bit 2 * ((i / 32) % 4) ---- */

/* Sub-block s (elements 16s .. 16s+15) of Q2_K/Q3_K: its 16 bytes of qs and the bit shift. */
static inline const uint8_t *k_2bit_bytes(const uint8_t *qs, int s) { return qs + 32 * (s / 8) + 16 * (s % 2); }
static inline int k_2bit_shift(int s) { return 2 * ((s / 2) % 4); }

static void block_q2_k(const strata_block_q2_k *b, float *y) {
    const float d = strata_half_to_f32(b->d), dmin = strata_half_to_f32(b->dmin);
    for (int s = 0; s < 16; s++) {
        const float dl = d * (float)(b->scales[s] & 0xf), ml = dmin * (float)(b->scales[s] >> 4);
        const uint8_t *qs = k_2bit_bytes(b->qs, s);
        const int shift = k_2bit_shift(s);
        for (int l = 0; l < 16; l++) y[16 * s + l] = dl * (float)((qs[l] >> shift) & 3) - ml;
    }
}

/* ---- Q3_K: 256 elems, 110 B = u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d.
 *      16 sub-blocks of 16 with 6-bit scales sc (stored + 32): low 4 bits of sc[s] are nibble
 *      (s / 8) of scales[s % 8], high 2 bits are bits 2 * (s / 4) of scales[8 + s % 4].
 *      x = (d * (sc - 32)) * (q2 - 4 * !h), q2 as in Q2_K, h = bit (i / 32) of hmask[i % 32] ---- */

static void block_q3_k(const strata_block_q3_k *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int s = 0; s < 16; s++) {
        const float dl = d * (float)strata_q3_k_scale(b->scales, s);
        const uint8_t *qs = k_2bit_bytes(b->qs, s), *hm = b->hmask + 16 * (s % 2);
        const int shift = k_2bit_shift(s), hbit = s / 2;
        for (int l = 0; l < 16; l++) {
            const int q2 = (qs[l] >> shift) & 3, h = (hm[l] >> hbit) & 1;
            y[16 * s + l] = dl * (float)(q2 - ((h ^ 1) << 2));
        }
    }
}

/* ---- Q4_K: 256 elems, 144 B = half d, dmin; u8 scales[12]; u8 qs[128].
 *      8 sub-blocks of 32 (get_scale_min). Each 32 bytes of qs hold two sub-blocks: low nibbles,
 *      then high nibbles.  x = (d * sc) * q - (dmin * mn) ---- */

/* Q4_K's and Q5_K's codes q[256] to values: 8 sub-blocks of 32, each with its 6-bit scale and min. */
static void k_scale_min_values(const uint8_t *scales, uint16_t d_half, uint16_t dmin_half, const uint8_t *q,
                               float *y) {
    const float d = strata_half_to_f32(d_half), dmin = strata_half_to_f32(dmin_half);
    for (int sub = 0; sub < 8; sub++) {
        uint8_t sc, mn;
        strata_k_scale_min(sub, scales, &sc, &mn);
        const float d1 = d * (float)sc, m1 = dmin * (float)mn;
        for (int i = 32 * sub; i < 32 * sub + 32; i++) y[i] = d1 * (float)q[i] - m1;
    }
}

static void block_q4_k(const strata_block_q4_k *b, float *y) {
    uint8_t q[256];
    for (int c = 0; c < 4; c++) unpack_nibbles(b->qs + 32 * c, 32, q + 64 * c);
    k_scale_min_values(b->scales, b->d, b->dmin, q, y);
}

/* ---- Q5_K: 256 elems, 176 B = half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128].
 *      As Q4_K, with bit 4 of element i = bit (i / 32) of qh[i % 32].
 *      x = (d * sc) * q5 - (dmin * mn) ---- */

static void block_q5_k(const strata_block_q5_k *b, float *y) {
    uint8_t q[256];
    for (int c = 0; c < 4; c++) unpack_nibbles(b->qs + 32 * c, 32, q + 64 * c);
    for (int bit = 0; bit < 8; bit++)
        for (int l = 0; l < 32; l++) q[32 * bit + l] |= ((b->qh[l] >> bit) & 1) << 4;
    k_scale_min_values(b->scales, b->d, b->dmin, q, y);
}

/* ---- Q6_K: 256 elems, 210 B = u8 ql[128]; u8 qh[64]; i8 scales[16]; half d.
 *      Two halves of 128; in half h, element k: low 4 bits = nibble (k / 64) of ql[64h + k % 64],
 *      high 2 bits = bits 2 * (k / 32) of qh[32h + k % 32].  16 sub-blocks of 16 with int8 scales.
 *      x = (d * sc) * (q6 - 32) ---- */

static void block_q6_k(const strata_block_q6_k *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    uint8_t q[256];
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {  /* elements 128h + 32s .. +31 */
            const uint8_t *ql = b->ql + 64 * h + 32 * (s % 2), *qh = b->qh + 32 * h;
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * s + l] = ((ql[l] >> (4 * (s / 2))) & 0xf) | ((qh[l] >> (2 * s)) & 3) << 4;
        }
    for (int sub = 0; sub < 16; sub++) {
        const float d1 = d * (float)b->scales[sub];
        for (int i = 16 * sub; i < 16 * sub + 16; i++) y[i] = d1 * (float)(q[i] - 32);
    }
}

/* ---- MXFP4: 32 elems, 17 B = u8 e (E8M0); u8 qs[16] (E2M1 codes, low nibbles first).
 *      x = half_scale(e) * 2 * e2m1(q): the E2M1 values are stored doubled (integers), and the
 *      scale halved, 2^(e - 128), which for e < 2 is the float32 subnormal 2^-128 or 2^-127. e = 255
 *      (NaN in the OCP spec) gives 2^127, as in ggml and gguf-py. ---- */

static const int8_t E2M1_DOUBLED[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float e8m0_half(uint8_t e) {
    return strata_bits_to_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

static void block_mxfp4(const strata_block_mxfp4 *b, float *y) {
    const float d = e8m0_half(b->e);
    uint8_t q[32];
    unpack_nibbles(b->qs, 16, q);
    for (int j = 0; j < 32; j++) y[j] = d * (float)E2M1_DOUBLED[q[j]];
}

/* ---- Block loops (STRATA_DEFINE_REF: kernels.h) ---- */

STRATA_DEFINE_REF(q4_0, STRATA_QK)
STRATA_DEFINE_REF(q4_1, STRATA_QK)
STRATA_DEFINE_REF(q5_0, STRATA_QK)
STRATA_DEFINE_REF(q5_1, STRATA_QK)
STRATA_DEFINE_REF(q8_0, STRATA_QK)
STRATA_DEFINE_REF(q2_k, STRATA_QK_K)
STRATA_DEFINE_REF(q3_k, STRATA_QK_K)
STRATA_DEFINE_REF(q4_k, STRATA_QK_K)
STRATA_DEFINE_REF(q5_k, STRATA_QK_K)
STRATA_DEFINE_REF(q6_k, STRATA_QK_K)
STRATA_DEFINE_REF(mxfp4, STRATA_QK)

/* ---- float32 -> float16 / bfloat16, as torch's CPU conversions (x86, AVX2 build) ---- */

/* Round-to-nearest-even of float32 bits `ax` (sign cleared, finite, below half's normal range)
 * into a binary16 subnormal, or the smallest normal when it rounds up to it. */
static uint16_t f16_subnormal(uint32_t ax) {
    const uint32_t e = ax >> 23;
    if (e < 102) return 0;                                   /* below 2^-25: rounds to zero */
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;         /* value = m * 2^(e - 150) */
    const uint32_t shift = 126 - e;                          /* units of 2^-24: m >> shift; 14..24 */
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return (uint16_t)(q + (rem > half || (rem == half && (q & 1))));
}

/* Output conversion (torch's contract, unlike common.h's strata_f32_to_half, which gives every
 * NaN the one quiet pattern gguf-py's quantizer stores):
 * NaN becomes a quiet NaN keeping sign and the top 9 payload bits (what F16C's vcvtps2ph,
 * and so torch, produce); at or past 65520 rounds to inf. */
static uint16_t fp32_to_fp16_torch(float f) {
    const uint32_t x = strata_f32_to_bits(f), ax = x & 0x7fffffffu;
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    if (ax > 0x7f800000u) return sign | 0x7e00u | ((ax >> 13) & 0x3ffu);
    if (ax >= 0x477ff000u) return sign | 0x7c00u;
    if (ax < 0x38800000u) return sign | f16_subnormal(ax);  /* below 2^-14 */
    const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);      /* round to nearest even at bit 13 */
    return sign | (uint16_t)((r - 0x38000000u) >> 13);       /* rebias 127 -> 15 */
}

/* Every NaN becomes 0xffff (torch's vectorised float -> bfloat16 cast, whatever the sign and
 * payload); other values round to nearest even, overflowing to inf. */
static uint16_t fp32_to_bf16(float f) {
    const uint32_t x = strata_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0xffffu;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

void strata_convert_f16_ref(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *out = dst;
    for (int64_t i = 0; i < n; i++) out[i] = fp32_to_fp16_torch(src[i]);
}

void strata_convert_bf16_ref(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *out = dst;
    for (int64_t i = 0; i < n; i++) out[i] = fp32_to_bf16(src[i]);
}
