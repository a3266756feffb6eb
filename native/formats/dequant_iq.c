/*
 * Scalar reference dequantization of the i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
 * IQ3_S, IQ4_NL, IQ4_XS), the ternary formats (TQ1_0, TQ2_0) and NVFP4. Same contract as
 * dequant_ref.c: gguf-py's numpy arithmetic (gguf.quants, v0.19) operation for operation in
 * float32, so results are bit-identical to gguf.quants.dequantize, NaN payloads included. In
 * particular numpy applies a sign as a multiplication by -1.0f after the grid product, which keeps
 * a NaN as it is; the compiler turns such a multiplication into a negation (flipping a NaN's sign
 * bit), so signs are applied by `signed_value`, which leaves NaNs alone.
 *
 * Block layouts: common.h. Grids, sign patterns and the IQ4_NL code book: iq_tables.h (generated
 * from gguf-py by gen_iq_tables.py). No AVX2 twins yet: the dispatcher runs these for every family.
 */
#include "iq_tables.h"
#include "kernels.h"

static inline uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint16_t load_u16le(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* v * -1.0f as numpy computes it when bit j of `signs` is set (NaN kept as it is), else v. */
static inline float signed_value(float v, uint8_t signs, int j) { return (signs >> j) & 1 && v == v ? -v : v; }

/* y[j] = (db * grid[j]) * sign_j for the 8 values of one grid entry. */
static inline void grid8_signed(float db, const uint8_t grid[8], uint8_t signs, float *y) {
    for (int j = 0; j < 8; j++) y[j] = signed_value(db * (float)grid[j], signs, j);
}

/* ---- IQ2_XXS: per 32 values, u32 of 4 grid indices and u32 aux (4 x 7-bit ksigns, 4-bit ls) ---- */

static void block_iq2_xxs(const strata_block_iq2_xxs *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int ib = 0; ib < 8; ib++, y += 32) {
        const uint8_t *idx = b->qs + 8 * ib;
        const uint32_t aux = load_u32le(b->qs + 8 * ib + 4);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++)
            grid8_signed(db, strata_iq2xxs_grid[idx[l]], strata_ksigns_iq2xs[(aux >> (7 * l)) & 127], y + 8 * l);
    }
}

/* ---- IQ2_XS: u16 per 8 values (9-bit grid index, 7-bit ksigns index), 4-bit ls per 16 ---- */

static void block_iq2_xs(const strata_block_iq2_xs *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int g = 0; g < 16; g++) {
        const float db = d * (0.5f + (float)((b->scales[g / 2] >> (4 * (g % 2))) & 15)) * 0.25f;
        for (int h = 0; h < 2; h++) {
            const uint16_t q = load_u16le(b->qs + 2 * (2 * g + h));
            grid8_signed(db, strata_iq2xs_grid[q & 511], strata_ksigns_iq2xs[q >> 9], y + 16 * g + 8 * h);
        }
    }
}

/* ---- IQ2_S: 10-bit grid index per 8 values (qs | 2 bits of qh), explicit sign bytes ---- */

static void block_iq2_s(const strata_block_iq2_s *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int i = 0; i < 32; i++) {
        const float db = d * (0.5f + (float)((b->scales[i / 4] >> (4 * ((i / 2) % 2))) & 15)) * 0.25f;
        const int idx = b->qs[i] | ((b->qh[i / 4] >> (2 * (i % 4))) & 3) << 8;
        grid8_signed(db, strata_iq2s_grid[idx], b->signs[i], y + 8 * i);
    }
}

/* ---- IQ3_XXS: a grid index per 4 values; per 32, u32 aux as IQ2_XXS with db = d * (0.5 + ls) / 2 ---- */

static void block_iq3_xxs(const strata_block_iq3_xxs *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t aux = load_u32le(b->aux + 4 * ib);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            const uint8_t signs = strata_ksigns_iq2xs[(aux >> (7 * l)) & 127];
            const uint8_t *g0 = strata_iq3xxs_grid[b->qs[8 * ib + 2 * l]], *g1 = strata_iq3xxs_grid[b->qs[8 * ib + 2 * l + 1]];
            float *o = y + 32 * ib + 8 * l;
            for (int j = 0; j < 4; j++) o[j] = signed_value(db * (float)g0[j], signs, j);
            for (int j = 0; j < 4; j++) o[4 + j] = signed_value(db * (float)g1[j], signs, 4 + j);
        }
    }
}

/* ---- IQ3_S: 9-bit grid index per 4 values (qs | a bit of qh), sign bits, db = d * (1 + 2 ls) ---- */

static void block_iq3_s(const strata_block_iq3_s *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int i = 0; i < 64; i++) {  /* grid entry i: values 4i .. 4i + 3 */
        const int e = 4 * i, ls = (b->scales[e / 64] >> (4 * ((e / 32) % 2))) & 15;
        const float db = d * (float)(1 + 2 * ls);
        const uint8_t *g = strata_iq3s_grid[b->qs[i] | ((b->qh[i / 8] >> (i % 8)) & 1) << 8];
        const uint8_t signs = b->signs[e / 8];
        for (int j = 0; j < 4; j++) y[e + j] = signed_value(db * (float)g[j], signs, e % 8 + j);
    }
}

/* ---- IQ1_S: per 32 values, u16 qh = 4 x 3 high index bits | ls << 12 | delta sign << 15 ---- */

#define STRATA_IQ1_DELTA 0.125f

static void iq1_group(float dl, const int8_t grid[8], float delta, float *y) {
    for (int j = 0; j < 8; j++) y[j] = dl * ((float)grid[j] + delta);
}

static void block_iq1_s(const strata_block_iq1_s *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int ib = 0; ib < 8; ib++) {
        const uint16_t qh = load_u16le(b->qh + 2 * ib);
        const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
        const float delta = qh & 0x8000 ? -STRATA_IQ1_DELTA : STRATA_IQ1_DELTA;
        for (int l = 0; l < 4; l++)
            iq1_group(dl, strata_iq1s_grid[b->qs[4 * ib + l] | ((qh >> (3 * l)) & 7) << 8], delta, y + 32 * ib + 8 * l);
    }
}

/* ---- IQ1_M: 3-bit scales per 16 values, the half d in the scale words' top nibbles ---- */

/* 3-bit scale k (16 values each) of IQ1_M. */
static inline int iq1_m_scale(const uint8_t scales[8], int k) {
    return (load_u16le(scales + 2 * (k / 4)) >> (3 * (k % 4))) & 7;
}

static void block_iq1_m(const strata_block_iq1_m *b, float *y) {
    const float d = strata_half_to_f32(strata_iq1_m_half(b->scales));
    for (int g = 0; g < 32; g++) {  /* groups of 8 values */
        const float dl = d * (float)(2 * iq1_m_scale(b->scales, g / 2) + 1);
        const int h = (b->qh[g / 2] >> (4 * (g % 2))) & 15;
        iq1_group(dl, strata_iq1s_grid[b->qs[g] | (h & 7) << 8], h & 8 ? -STRATA_IQ1_DELTA : STRATA_IQ1_DELTA, y + 8 * g);
    }
}

/* ---- IQ4_NL (32) and IQ4_XS (256, 6-bit scales per 32): non-linear 4-bit code book ---- */

static void block_iq4_nl(const strata_block_iq4_nl *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)strata_kvalues_iq4nl[b->qs[j] & 15];
        y[16 + j] = d * (float)strata_kvalues_iq4nl[b->qs[j] >> 4];
    }
}

static void block_iq4_xs(const strata_block_iq4_xs *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int k = 0; k < 8; k++, y += 32) {
        const int ls = strata_iq4_xs_scale(b, k);
        const float dl = d * (float)ls;
        const uint8_t *qs = b->qs + 16 * k;
        for (int j = 0; j < 16; j++) {
            y[j] = dl * (float)strata_kvalues_iq4nl[qs[j] & 15];
            y[16 + j] = dl * (float)strata_kvalues_iq4nl[qs[j] >> 4];
        }
    }
}

/* ---- TQ1_0 / TQ2_0: ternary values {-1, 0, 1} ---- */

static void block_tq1_0(const strata_block_tq1_0 *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int p = 0; p < 5; p++) {
        for (int j = 0; j < 32; j++) y[32 * p + j] = d * (float)strata_tq1_digit(b->qs[j], p);
        for (int j = 0; j < 16; j++) y[160 + 16 * p + j] = d * (float)strata_tq1_digit(b->qs[32 + j], p);
    }
    for (int p = 0; p < 4; p++)
        for (int j = 0; j < 4; j++) y[240 + 4 * p + j] = d * (float)strata_tq1_digit(b->qh[j], p);
}

static void block_tq2_0(const strata_block_tq2_0 *b, float *y) {
    const float d = strata_half_to_f32(b->d);
    for (int c = 0; c < 2; c++)
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++)
                y[128 * c + 32 * p + l] = d * (float)(((b->qs[32 * c + l] >> (2 * p)) & 3) - 1);
}

/* ---- NVFP4: UE4M3 scale per 16 values (halved, as the doubled E2M1 values need) ---- */

static const int8_t E2M1_DOUBLED[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void block_nvfp4(const strata_block_nvfp4 *b, float *y) {
    for (int s = 0; s < 4; s++, y += 16) {
        const float d = strata_ue4m3_half(b->d[s]);
        const uint8_t *qs = b->qs + 8 * s;
        for (int j = 0; j < 8; j++) {
            y[j] = d * (float)E2M1_DOUBLED[qs[j] & 15];
            y[8 + j] = d * (float)E2M1_DOUBLED[qs[j] >> 4];
        }
    }
}

/* ---- Block loops (STRATA_DEFINE_REF: kernels.h) ---- */

STRATA_DEFINE_REF(iq2_xxs, STRATA_QK_K)
STRATA_DEFINE_REF(iq2_xs, STRATA_QK_K)
STRATA_DEFINE_REF(iq2_s, STRATA_QK_K)
STRATA_DEFINE_REF(iq3_xxs, STRATA_QK_K)
STRATA_DEFINE_REF(iq3_s, STRATA_QK_K)
STRATA_DEFINE_REF(iq1_s, STRATA_QK_K)
STRATA_DEFINE_REF(iq1_m, STRATA_QK_K)
STRATA_DEFINE_REF(iq4_nl, STRATA_QK)
STRATA_DEFINE_REF(iq4_xs, STRATA_QK_K)
STRATA_DEFINE_REF(tq1_0, STRATA_QK_K)
STRATA_DEFINE_REF(tq2_0, STRATA_QK_K)
STRATA_DEFINE_REF(nvfp4, STRATA_QK_NVFP4)
