/*
 * Portable scalar reference of the quantized matrix kernels (interface: qdot.h): the activation
 * quantizers and one tile kernel per weight format. These define the arithmetic; the AVX2 and
 * AVX-512 twins must give bit-identical activation blocks and the same float result up to the
 * order of the float additions.
 *
 * Per block (block layouts: common.h), with a the activation block (ad its scale):
 *   Q4_0  (wd * ad) * sum (q - 8) * aq                       Q5_0 with q5 - 16, Q8_0 with q
 *   Q4_1  (wd * ad) * sum q * aq + wm * as                   Q5_1 with q5 (as = ad * sum aq)
 *   MXFP4 (e8m0_half(e) * ad) * sum 2 * e2m1(q) * aq
 *   Q2_K  (wd * ad) * sum_s sc_s * isum_s - (dmin * ad) * sum_s mn_s * bsum_s   (16 of 16)
 *   Q3_K  (wd * ad) * sum_s (sc_s - 32) * isum_s, q3 = q2 - 4 * !h                (16 of 16)
 *   Q4_K  (wd * ad) * sum_j sc_j * isum_j - (dmin * ad) * sum_j mn_j * bsum_j    (8 of 32)
 *   Q5_K  as Q4_K with q5;   Q6_K (wd * ad) * sum_s sc_s * (isum_s - 32 * bsum_s)  (16 of 16)
 *   F32/F16/BF16: float products w * x added in order.
 * The integer sums are exact (far inside int32); block terms are added to one float in block
 * order. The build passes -ffp-contract=off, so nothing here is fused.
 */
#include "qdot.h"

/* ---- Activation quantizers ---- */

/* Round to nearest, ties to even, for |v| < 2^22, then clamp to [-127, 127]: adding 1.5 * 2^23
 * leaves no fraction bits, so the float addition itself rounds (default mode). |x / d| exceeds
 * 127 only when d = max|x| / 127 is a float32 subnormal that rounded down (by < 1/2 ulp, so
 * |x / d| < 191); there the clamp keeps the sign and the AVX2 packs' saturation out of it. */
static inline int8_t round_even_clamp(float v) {
    float r = (v + 0x1.8p23f) - 0x1.8p23f;
    r = r > 127.0f ? 127.0f : r;
    r = r < -127.0f ? -127.0f : r;
    return (int8_t)r;
}

/* d = max|x| / 127, q = round_even(x / d); the division (not x * (1/d)) keeps a subnormal d
 * usable. Returns d; q = 0 and d = 0 for an all-zero block. x must be finite. */
static float quantize_block(const float *restrict x, int8_t *restrict q, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        const float ax = x[j] < 0 ? -x[j] : x[j];
        amax = ax > amax ? ax : amax;
    }
    const float d = amax / 127.0f;
    for (int j = 0; j < n; j++) q[j] = d == 0.0f ? 0 : round_even_clamp(x[j] / d);
    return d;
}

void strata_qact_q8_ref(const float *restrict x, void *restrict out, int64_t k) {
    strata_block_act_q8 *a = out;
    for (int64_t b = 0; b < k / STRATA_QK; b++, x += STRATA_QK) {
        a[b].d = quantize_block(x, a[b].q, STRATA_QK);
        int32_t sum = 0;
        for (int j = 0; j < STRATA_QK; j++) sum += a[b].q[j];
        a[b].s = a[b].d * (float)sum;
    }
}

void strata_qact_q8k_ref(const float *restrict x, void *restrict out, int64_t k) {
    strata_block_act_q8k *a = out;
    for (int64_t b = 0; b < k / STRATA_QK_K; b++, x += STRATA_QK_K) {
        a[b].d = quantize_block(x, a[b].q, STRATA_QK_K);
        for (int s = 0; s < 16; s++) {
            int32_t sum = 0;
            for (int j = 0; j < 16; j++) sum += a[b].q[16 * s + j];
            a[b].bsums[s] = (int16_t)sum;
        }
    }
}

/* ---- Shared pieces of the dot products ---- */

static inline void unpack_nibbles(const uint8_t *qs, int n, uint8_t *q) {
    for (int j = 0; j < n; j++) {
        q[j] = qs[j] & 15;
        q[n + j] = qs[j] >> 4;
    }
}

static inline uint32_t load_u32le(const uint8_t p[4]) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline int32_t dot32(const int8_t *w, const int8_t *a, int n) {
    int32_t s = 0;
    for (int j = 0; j < n; j++) s += (int32_t)w[j] * (int32_t)a[j];
    return s;
}

/* ---- Formats against STRATA_ACT_Q8: one block term each ---- */

static float block_q4_0(const uint8_t *wb, const strata_block_act_q8 *a) {
    const strata_block_q4_0 *b = (const strata_block_q4_0 *)wb;
    uint8_t u[32];
    int8_t q[32];
    unpack_nibbles(b->qs, 16, u);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)(u[j] - 8);
    return (strata_half_to_f32(b->d) * a->d) * (float)dot32(q, a->q, 32);
}

static float block_q4_1(const uint8_t *wb, const strata_block_act_q8 *a) {
    const strata_block_q4_1 *b = (const strata_block_q4_1 *)wb;
    uint8_t u[32];
    int8_t q[32];
    unpack_nibbles(b->qs, 16, u);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)u[j];
    return (strata_half_to_f32(b->d) * a->d) * (float)dot32(q, a->q, 32) + strata_half_to_f32(b->m) * a->s;
}

static void q5_codes(const uint8_t qs[16], const uint8_t qh[4], int bias, int8_t q[32]) {
    uint8_t u[32];
    unpack_nibbles(qs, 16, u);
    const uint32_t h = load_u32le(qh);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)((u[j] | ((h >> j) & 1u) << 4) - bias);
}

static float block_q5_0(const uint8_t *wb, const strata_block_act_q8 *a) {
    const strata_block_q5_0 *b = (const strata_block_q5_0 *)wb;
    int8_t q[32];
    q5_codes(b->qs, b->qh, 16, q);
    return (strata_half_to_f32(b->d) * a->d) * (float)dot32(q, a->q, 32);
}

static float block_q5_1(const uint8_t *wb, const strata_block_act_q8 *a) {
    const strata_block_q5_1 *b = (const strata_block_q5_1 *)wb;
    int8_t q[32];
    q5_codes(b->qs, b->qh, 0, q);
    return (strata_half_to_f32(b->d) * a->d) * (float)dot32(q, a->q, 32) + strata_half_to_f32(b->m) * a->s;
}

static float block_q8_0(const uint8_t *wb, const strata_block_act_q8 *a) {
    const strata_block_q8_0 *b = (const strata_block_q8_0 *)wb;
    return (strata_half_to_f32(b->d) * a->d) * (float)dot32(b->qs, a->q, 32);
}

static float block_mxfp4(const uint8_t *wb, const strata_block_act_q8 *a) {
    const strata_block_mxfp4 *b = (const strata_block_mxfp4 *)wb;
    uint8_t u[32];
    int8_t q[32];
    unpack_nibbles(b->qs, 16, u);
    for (int j = 0; j < 32; j++) q[j] = strata_e2m1_doubled[u[j]];
    return (strata_e8m0_half(b->e) * a->d) * (float)dot32(q, a->q, 32);
}

/* ---- Formats against STRATA_ACT_Q8K ---- */

/* Q2_K/Q3_K: the 2-bit codes of sub-block s (16 elements), as in dequant_ref.c. */
static inline void k_2bit_codes(const uint8_t *qs, int s, int8_t q[16]) {
    const uint8_t *p = qs + 32 * (s / 8) + 16 * (s % 2);
    const int shift = 2 * ((s / 2) % 4);
    for (int l = 0; l < 16; l++) q[l] = (int8_t)((p[l] >> shift) & 3);
}

static float block_q2_k(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_q2_k *b = (const strata_block_q2_k *)wb;
    int32_t isum = 0, msum = 0;
    for (int s = 0; s < 16; s++) {
        int8_t q[16];
        k_2bit_codes(b->qs, s, q);
        isum += (b->scales[s] & 0xf) * dot32(q, a->q + 16 * s, 16);
        msum += (b->scales[s] >> 4) * a->bsums[s];
    }
    const float d = strata_half_to_f32(b->d) * a->d, dmin = strata_half_to_f32(b->dmin) * a->d;
    return d * (float)isum - dmin * (float)msum;
}

static float block_q3_k(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_q3_k *b = (const strata_block_q3_k *)wb;
    int32_t isum = 0;
    for (int s = 0; s < 16; s++) {
        int8_t q[16];
        k_2bit_codes(b->qs, s, q);
        const uint8_t *hm = b->hmask + 16 * (s % 2);
        for (int l = 0; l < 16; l++) q[l] = (int8_t)(q[l] - ((((hm[l] >> (s / 2)) & 1) ^ 1) << 2));
        isum += strata_q3_k_scale(b->scales, s) * dot32(q, a->q + 16 * s, 16);
    }
    return (strata_half_to_f32(b->d) * a->d) * (float)isum;
}

/* Q4_K/Q5_K: codes q[256] (sub-block j = elements 32j..32j+31) with 6-bit scales and mins. */
static float k_scale_min_sum(uint16_t hd, uint16_t hdmin, const uint8_t scales[12], const int8_t q[256],
                             const strata_block_act_q8k *a) {
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        strata_k_scale_min(j, scales, &sc, &mn);
        isum += sc * dot32(q + 32 * j, a->q + 32 * j, 32);
        msum += mn * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    const float d = strata_half_to_f32(hd) * a->d, dmin = strata_half_to_f32(hdmin) * a->d;
    return d * (float)isum - dmin * (float)msum;
}

static float block_q4_k(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_q4_k *b = (const strata_block_q4_k *)wb;
    uint8_t u[256];
    int8_t q[256];
    for (int c = 0; c < 4; c++) unpack_nibbles(b->qs + 32 * c, 32, u + 64 * c);
    for (int i = 0; i < 256; i++) q[i] = (int8_t)u[i];
    return k_scale_min_sum(b->d, b->dmin, b->scales, q, a);
}

static float block_q5_k(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_q5_k *b = (const strata_block_q5_k *)wb;
    uint8_t u[256];
    int8_t q[256];
    for (int c = 0; c < 4; c++) unpack_nibbles(b->qs + 32 * c, 32, u + 64 * c);
    for (int i = 0; i < 256; i++) q[i] = (int8_t)(u[i] | ((b->qh[i % 32] >> (i / 32)) & 1) << 4);
    return k_scale_min_sum(b->d, b->dmin, b->scales, q, a);
}

static float block_q6_k(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_q6_k *b = (const strata_block_q6_k *)wb;
    int8_t q[256];
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {
            const uint8_t *ql = b->ql + 64 * h + 32 * (s % 2), *qh = b->qh + 32 * h;
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * s + l] = (int8_t)(((ql[l] >> (4 * (s / 2))) & 0xf) | ((qh[l] >> (2 * s)) & 3) << 4);
        }
    int32_t isum = 0;
    for (int s = 0; s < 16; s++) isum += b->scales[s] * (dot32(q + 16 * s, a->q + 16 * s, 16) - 32 * a->bsums[s]);
    return (strata_half_to_f32(b->d) * a->d) * (float)isum;
}

/* ---- Tile loops ---- */

#define STRATA_DEFINE_QTILE(name, wtype, act_t, elems) STRATA_DEFINE_QTILE_PER(name, wtype, act_t, elems, 1)

STRATA_DEFINE_QTILE(q4_0, strata_block_q4_0, strata_block_act_q8, STRATA_QK)
STRATA_DEFINE_QTILE(q4_1, strata_block_q4_1, strata_block_act_q8, STRATA_QK)
STRATA_DEFINE_QTILE(q5_0, strata_block_q5_0, strata_block_act_q8, STRATA_QK)
STRATA_DEFINE_QTILE(q5_1, strata_block_q5_1, strata_block_act_q8, STRATA_QK)
STRATA_DEFINE_QTILE(q8_0, strata_block_q8_0, strata_block_act_q8, STRATA_QK)
STRATA_DEFINE_QTILE(mxfp4, strata_block_mxfp4, strata_block_act_q8, STRATA_QK)
STRATA_DEFINE_QTILE(q2_k, strata_block_q2_k, strata_block_act_q8k, STRATA_QK_K)
STRATA_DEFINE_QTILE(q3_k, strata_block_q3_k, strata_block_act_q8k, STRATA_QK_K)
STRATA_DEFINE_QTILE(q4_k, strata_block_q4_k, strata_block_act_q8k, STRATA_QK_K)
STRATA_DEFINE_QTILE(q5_k, strata_block_q5_k, strata_block_act_q8k, STRATA_QK_K)
STRATA_DEFINE_QTILE(q6_k, strata_block_q6_k, strata_block_act_q8k, STRATA_QK_K)

/* ---- Float weights against the float32 activation row ---- */

static inline float f16_at(const uint8_t *p, int64_t i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return strata_half_to_f32(h);
}
static inline float bf16_at(const uint8_t *p, int64_t i) {
    return strata_bits_to_f32((uint32_t)p[2 * i] << 16 | (uint32_t)p[2 * i + 1] << 24);
}
static inline float f32_at(const uint8_t *p, int64_t i) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

#define STRATA_DEFINE_FTILE(name)                                                                         \
    void strata_qdot_##name##_ref(int64_t k, const uint8_t *restrict w, int64_t w_row_bytes, int64_t n_rows, \
                                  const uint8_t *restrict a, int64_t a_row_bytes, int64_t n_tok,            \
                                  float *restrict y, int64_t y_stride) {                                    \
        for (int64_t r = 0; r < n_rows; r++)                                                                \
            for (int64_t t = 0; t < n_tok; t++) {                                                           \
                const uint8_t *wr = w + r * w_row_bytes, *ar = a + t * a_row_bytes;                         \
                float sum = 0.0f;                                                                           \
                for (int64_t i = 0; i < k; i++) sum += name##_at(wr, i) * f32_at(ar, i);                    \
                y[t * y_stride + r] = sum;                                                                  \
            }                                                                                               \
    }

STRATA_DEFINE_FTILE(f32)
STRATA_DEFINE_FTILE(f16)
STRATA_DEFINE_FTILE(bf16)
