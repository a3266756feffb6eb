/*
 * Scalar reference tile kernels (interface: qdot.h) of the i-quants, the ternary formats and
 * NVFP4: each weight block's values as integers (grid entries times signs, code book values,
 * ternary digits) dotted with the 8-bit activation block, the integer sums weighted by the
 * (sub-)block scales' integer parts, then scaled once per block. With wd the block's half d,
 * ad the activation block's scale, isum_s the integer dot product of sub-block s:
 *   IQ2_XXS, IQ2_XS, IQ2_S  (wd * ad) / 8 * sum_s (2 ls_s + 1) * isum_s       db = d (0.5 + ls) / 4
 *   IQ3_XXS                 (wd * ad) / 4 * sum_s (2 ls_s + 1) * isum_s       db = d (0.5 + ls) / 2
 *   IQ3_S                   (wd * ad) * sum_s (2 ls_s + 1) * isum_s
 *   IQ1_S, IQ1_M            (wd * ad) / 8 * sum_s (2 ls_s + 1) * (8 isum_s +- asum_s), the grid
 *                           value plus or minus 1/8 taken as (8 g +- 1) / 8; asum: sum of the a codes
 *   IQ4_NL, IQ4_XS          (wd * ad) * sum_s sc_s * isum_s (IQ4_NL: one sub-block, sc = 1; IQ4_XS: ls - 32)
 *   TQ1_0, TQ2_0            (wd * ad) * isum, q in {-1, 0, 1}
 *   NVFP4                   sum_s (ue4m3_half(d_s) * ad_{s/2}) * isum_s over its four 16-value
 *                           sub-blocks (two 32-value activation blocks per 64-value weight block)
 * The integer sums stay far inside int32 (at most 256 * 127 * 62 * 31 for IQ3_XXS). The AVX2 twins
 * are in qdot_iq_avx2.c and qdot_iq4_avx2.c; AVX-512 has none of its own yet (qdot.c's table).
 * Block layouts: common.h; grids: iq_tables.h.
 */
#include "iq_tables.h"
#include "qdot.h"

static inline uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint16_t load_u16le(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* sum_j grid[j] * (+-a[j]) over n values, value j negative where bit j of `signs` is set. */
static inline int32_t signed_grid_dot(const uint8_t *grid, uint8_t signs, const int8_t *a, int n) {
    int32_t s = 0;
    for (int j = 0; j < n; j++) s += (signs >> j) & 1 ? -(int32_t)grid[j] * a[j] : (int32_t)grid[j] * a[j];
    return s;
}

static inline int32_t codes_dot(const int8_t *q, const int8_t *a, int n) {
    int32_t s = 0;
    for (int j = 0; j < n; j++) s += (int32_t)q[j] * a[j];
    return s;
}

/* ---- Against STRATA_ACT_Q8K (256 values) ---- */

static float block_iq2_xxs(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_iq2_xxs *b = (const strata_block_iq2_xxs *)wb;
    int32_t isum = 0;
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *idx = b->qs + 8 * ib;
        const uint32_t aux = load_u32le(b->qs + 8 * ib + 4);
        int32_t s = 0;
        for (int l = 0; l < 4; l++)
            s += signed_grid_dot(strata_iq2xxs_grid[idx[l]], strata_ksigns_iq2xs[(aux >> (7 * l)) & 127],
                                 a->q + 32 * ib + 8 * l, 8);
        isum += (int32_t)(2 * (aux >> 28) + 1) * s;
    }
    return (strata_half_to_f32(b->d) * a->d) * 0.125f * (float)isum;
}

static float block_iq2_xs(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_iq2_xs *b = (const strata_block_iq2_xs *)wb;
    int32_t isum = 0;
    for (int g = 0; g < 16; g++) {
        int32_t s = 0;
        for (int h = 0; h < 2; h++) {
            const uint16_t q = load_u16le(b->qs + 2 * (2 * g + h));
            s += signed_grid_dot(strata_iq2xs_grid[q & 511], strata_ksigns_iq2xs[q >> 9], a->q + 16 * g + 8 * h, 8);
        }
        isum += (2 * ((b->scales[g / 2] >> (4 * (g % 2))) & 15) + 1) * s;
    }
    return (strata_half_to_f32(b->d) * a->d) * 0.125f * (float)isum;
}

static float block_iq2_s(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_iq2_s *b = (const strata_block_iq2_s *)wb;
    int32_t isum = 0;
    for (int g = 0; g < 16; g++) {
        int32_t s = 0;
        for (int i = 2 * g; i < 2 * g + 2; i++) {
            const int idx = b->qs[i] | ((b->qh[i / 4] >> (2 * (i % 4))) & 3) << 8;
            s += signed_grid_dot(strata_iq2s_grid[idx], b->signs[i], a->q + 8 * i, 8);
        }
        isum += (2 * ((b->scales[g / 2] >> (4 * (g % 2))) & 15) + 1) * s;
    }
    return (strata_half_to_f32(b->d) * a->d) * 0.125f * (float)isum;
}

static float block_iq3_xxs(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_iq3_xxs *b = (const strata_block_iq3_xxs *)wb;
    int32_t isum = 0;
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t aux = load_u32le(b->aux + 4 * ib);
        int32_t s = 0;
        for (int l = 0; l < 4; l++) {
            const uint8_t signs = strata_ksigns_iq2xs[(aux >> (7 * l)) & 127];
            const int8_t *q = a->q + 32 * ib + 8 * l;
            s += signed_grid_dot(strata_iq3xxs_grid[b->qs[8 * ib + 2 * l]], signs, q, 4);
            s += signed_grid_dot(strata_iq3xxs_grid[b->qs[8 * ib + 2 * l + 1]], signs >> 4, q + 4, 4);
        }
        isum += (int32_t)(2 * (aux >> 28) + 1) * s;
    }
    return (strata_half_to_f32(b->d) * a->d) * 0.25f * (float)isum;
}

static float block_iq3_s(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_iq3_s *b = (const strata_block_iq3_s *)wb;
    int32_t isum = 0;
    for (int ib = 0; ib < 8; ib++) {  /* 32 values: grid entries 8 ib .. 8 ib + 7 */
        int32_t s = 0;
        for (int i = 8 * ib; i < 8 * ib + 8; i++) {
            const uint8_t *g = strata_iq3s_grid[b->qs[i] | ((b->qh[i / 8] >> (i % 8)) & 1) << 8];
            s += signed_grid_dot(g, b->signs[i / 2] >> (4 * (i % 2)), a->q + 4 * i, 4);
        }
        isum += (2 * ((b->scales[ib / 2] >> (4 * (ib % 2))) & 15) + 1) * s;
    }
    return (strata_half_to_f32(b->d) * a->d) * (float)isum;
}

/* 8 * (grid . a) + sign * (sum a) over the 8 values of an IQ1 grid entry: (8 g +- 1) . a. */
static inline int32_t iq1_group_dot(int idx, int negative_delta, const int8_t *a) {
    const int8_t *g = strata_iq1s_grid[idx];
    int32_t s = 0, asum = 0;
    for (int j = 0; j < 8; j++) {
        s += g[j] * a[j];
        asum += a[j];
    }
    return 8 * s + (negative_delta ? -asum : asum);
}

static float block_iq1_s(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_iq1_s *b = (const strata_block_iq1_s *)wb;
    int32_t isum = 0;
    for (int ib = 0; ib < 8; ib++) {
        const uint16_t qh = load_u16le(b->qh + 2 * ib);
        int32_t s = 0;
        for (int l = 0; l < 4; l++)
            s += iq1_group_dot(b->qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8, qh >> 15, a->q + 32 * ib + 8 * l);
        isum += (2 * ((qh >> 12) & 7) + 1) * s;
    }
    return (strata_half_to_f32(b->d) * a->d) * 0.125f * (float)isum;
}

static float block_iq1_m(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_iq1_m *b = (const strata_block_iq1_m *)wb;
    uint16_t sc[4];
    for (int m = 0; m < 4; m++) sc[m] = load_u16le(b->scales + 2 * m);
    const uint16_t hd = strata_iq1_m_half(b->scales);
    int32_t isum = 0;
    for (int k = 0; k < 16; k++) {  /* 16 values: groups 2k, 2k + 1 */
        int32_t s = 0;
        for (int g = 2 * k; g < 2 * k + 2; g++) {
            const int h = (b->qh[g / 2] >> (4 * (g % 2))) & 15;
            s += iq1_group_dot(b->qs[g] | (h & 7) << 8, h & 8, a->q + 8 * g);
        }
        isum += (2 * ((sc[k / 4] >> (3 * (k % 4))) & 7) + 1) * s;
    }
    return (strata_half_to_f32(hd) * a->d) * 0.125f * (float)isum;
}

/* 32 values of 4-bit IQ4 codes (16 bytes: low nibbles, then high ones) against a[32]. */
static inline int32_t iq4_dot32(const uint8_t qs[16], const int8_t *a) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++)
        s += strata_kvalues_iq4nl[qs[j] & 15] * a[j] + strata_kvalues_iq4nl[qs[j] >> 4] * a[16 + j];
    return s;
}

static float block_iq4_xs(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_iq4_xs *b = (const strata_block_iq4_xs *)wb;
    int32_t isum = 0;
    for (int k = 0; k < 8; k++) {
        const int ls = strata_iq4_xs_scale(b, k);
        isum += ls * iq4_dot32(b->qs + 16 * k, a->q + 32 * k);
    }
    return (strata_half_to_f32(b->d) * a->d) * (float)isum;
}

static float block_tq1_0(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_tq1_0 *b = (const strata_block_tq1_0 *)wb;
    int8_t q[256];
    for (int p = 0; p < 5; p++) {
        for (int j = 0; j < 32; j++) q[32 * p + j] = (int8_t)strata_tq1_digit(b->qs[j], p);
        for (int j = 0; j < 16; j++) q[160 + 16 * p + j] = (int8_t)strata_tq1_digit(b->qs[32 + j], p);
    }
    for (int p = 0; p < 4; p++)
        for (int j = 0; j < 4; j++) q[240 + 4 * p + j] = (int8_t)strata_tq1_digit(b->qh[j], p);
    return (strata_half_to_f32(b->d) * a->d) * (float)codes_dot(q, a->q, 256);
}

static float block_tq2_0(const uint8_t *wb, const strata_block_act_q8k *a) {
    const strata_block_tq2_0 *b = (const strata_block_tq2_0 *)wb;
    int8_t q[256];
    for (int c = 0; c < 2; c++)
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) q[128 * c + 32 * p + l] = (int8_t)(((b->qs[32 * c + l] >> (2 * p)) & 3) - 1);
    return (strata_half_to_f32(b->d) * a->d) * (float)codes_dot(q, a->q, 256);
}

/* ---- Against STRATA_ACT_Q8 (32 values) ---- */

static float block_iq4_nl(const uint8_t *wb, const strata_block_act_q8 *a) {
    const strata_block_iq4_nl *b = (const strata_block_iq4_nl *)wb;
    return (strata_half_to_f32(b->d) * a->d) * (float)iq4_dot32(b->qs, a->q);
}

/* a: the two activation blocks of the weight block's 64 values. */
static float block_nvfp4(const uint8_t *wb, const strata_block_act_q8 *a) {
    const strata_block_nvfp4 *b = (const strata_block_nvfp4 *)wb;
    float sum = 0.0f;
    for (int s = 0; s < 4; s++) {
        const uint8_t *qs = b->qs + 8 * s;
        const int8_t *aq = a[s / 2].q + 16 * (s % 2);
        int32_t isum = 0;
        for (int j = 0; j < 8; j++)
            isum += strata_e2m1_doubled[qs[j] & 15] * aq[j] + strata_e2m1_doubled[qs[j] >> 4] * aq[8 + j];
        sum += (strata_ue4m3_half(b->d[s]) * a[s / 2].d) * (float)isum;
    }
    return sum;
}

/* ---- Tile loops (STRATA_DEFINE_QTILE_PER, qdot.h): `per` activation blocks per weight block ---- */

STRATA_DEFINE_QTILE_PER(iq2_xxs, strata_block_iq2_xxs, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(iq2_xs, strata_block_iq2_xs, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(iq2_s, strata_block_iq2_s, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(iq3_xxs, strata_block_iq3_xxs, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(iq3_s, strata_block_iq3_s, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(iq1_s, strata_block_iq1_s, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(iq1_m, strata_block_iq1_m, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(iq4_xs, strata_block_iq4_xs, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(tq1_0, strata_block_tq1_0, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(tq2_0, strata_block_tq2_0, strata_block_act_q8k, STRATA_QK_K, 1)
STRATA_DEFINE_QTILE_PER(iq4_nl, strata_block_iq4_nl, strata_block_act_q8, STRATA_QK, 1)
STRATA_DEFINE_QTILE_PER(nvfp4, strata_block_nvfp4, strata_block_act_q8, STRATA_QK_NVFP4, 2)
