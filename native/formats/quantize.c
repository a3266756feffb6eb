/*
 * Quantization of float32 rows into GGML block formats (the converter's hot loop).
 *
 *   Q8_0  32 elems, 34 B: half d; i8 qs[32]. d = max|x| / 127, q = roundf(x / d): the same float
 *         operations, in the same order, as gguf-py's numpy quantizer, so bytes are identical.
 *   Q4_K 256 elems, 144 B: half d, dmin; u8 scales[12]; u8 qs[128]. Eight sub-blocks of 32 share
 *         a 6-bit scale and a 6-bit min (x = d*sc*q - dmin*m, q in 0..15). The (scale, min) of each
 *         sub-block comes from a weighted least-squares search over a sweep of candidate inverse
 *         scales, the search llama.cpp's reference quantizer runs (its `make_qkx2_quants`).
 *   Q6_K 256 elems, 210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d. Sixteen sub-blocks of 16
 *         share a signed 8-bit scale (x = d*sc*q, q in -32..31); each sub-block's scale comes from
 *         a sweep around max|x|/32 that maximises the weighted fit (llama.cpp's `make_qx_quants`,
 *         weights x^2).
 *
 * The K-quant searches follow the published algorithm step by step (same candidates, same
 * rounding, same tie-breaking), so on ordinary data the blocks match llama.cpp's reference
 * quantizer byte for byte; the one deliberate difference is that out-of-range intermediate
 * values are clamped instead of wrapping.
 *
 * Rows are independent: they are split across threads, each thread quantizing whole rows.
 */
#include "strata.h"
#include "kernels.h"
#include "quantize.h"
#include "type_rows.h"

#include <math.h>
#include <string.h>

/* ---- Scalars ---- */

/* Below this a group is treated as all zeros (the K-quant reference uses the same threshold). */
#define STRATA_GROUP_EPS 1e-15f

/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5*2^23 leaves the rounded integer in
 * the low mantissa bits (the default FP rounding mode does the rounding). Clamped to [lo, hi]
 * first, so the result is always in range and NaN maps to lo. */
static inline int round_clamp(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v > (float)hi) return hi;
    return (int)(v + 12582912.0f) - 12582912;
}

/* ---- Q8_0 ---- */

void strata_quantize_q8_0_blocks(const float *restrict x, uint8_t *restrict dst, int64_t n_blocks) {
    strata_block_q8_0 *restrict y = (strata_block_q8_0 *)dst;
    for (int64_t b = 0; b < n_blocks; b++, x += STRATA_QK) {
        float amax = 0.0f;
        for (int i = 0; i < STRATA_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        strata_block_q8_0 blk;
        blk.d = strata_f32_to_half(d);
        for (int i = 0; i < STRATA_QK; i++) blk.qs[i] = (int8_t)roundf(x[i] * id);
        memcpy(&y[b], &blk, sizeof blk);
    }
}

/* ---- Q4_K ---- */

/*
 * Asymmetric 4-bit fit of one sub-block of n values: finds scale s >= 0 and offset m <= 0 so that
 * x ~ s*q + m with q in 0..nmax, minimising sum w*(s*q + m - x)^2. Starts from the min/max grid,
 * then for each candidate inverse scale (nmax + rmin + rdelta*k) / (max - min), k = 0..nstep,
 * rounds to that grid and solves the 2x2 weighted least-squares problem for (s, m); keeps the
 * best. Writes the chosen q to L and -m to *neg_min; returns s.
 */
static float fit_scale_min(int n, int nmax, const float *restrict x, const float *restrict w,
                           uint8_t *restrict L, float *restrict neg_min,
                           float rmin, float rdelta, int nstep) {
    uint8_t Lk[32];
    float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;                                    /* the offset only ever lowers values */
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *neg_min = -lo;
        return 0.0f;
    }
    float iscale = nmax / (hi - lo), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)round_clamp(iscale * (x[i] - lo), 0, nmax);
        const float diff = scale * L[i] + lo - x[i];
        best += w[i] * (diff * diff);
    }
    for (int k = 0; k <= nstep; k++) {
        iscale = (rmin + rdelta * k + nmax) / (hi - lo);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = round_clamp(iscale * (x[i] - lo), 0, nmax);
            Lk[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (!(det > 0)) continue;
        float s = (sum_w * sum_xl - sum_x * sum_l) / det;
        float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (m > 0) {                                       /* offset must not be positive */
            m = 0;
            s = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float diff = s * Lk[i] + m - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best) {
            memcpy(L, Lk, (size_t)n);
            best = err;
            scale = s;
            lo = m;
        }
    }
    *neg_min = -lo;
    return scale;
}

/* The largest of n sub-blocks' scales and mins, and the factors that put each one on 0..q_max
 * (q_max over the largest; 0 where that is 0). The block then stores d = max_scale / q_max and
 * dmin = max_min / q_max. */
typedef struct {
    float max_scale, max_min, inv_scale, inv_min;
} scale_min_range;

static scale_min_range range_of(int n, const float *restrict scales, const float *restrict mins, float q_max) {
    scale_min_range r = {0, 0, 0, 0};
    for (int j = 0; j < n; j++) {
        if (scales[j] > r.max_scale) r.max_scale = scales[j];
        if (mins[j] > r.max_min) r.max_min = mins[j];
    }
    r.inv_scale = r.max_scale > 0 ? q_max / r.max_scale : 0.0f;
    r.inv_min = r.max_min > 0 ? q_max / r.max_min : 0.0f;
    return r;
}

/* Q4_K and Q2_K blocks of n_blocks * 256 values: per block, the (scale, min) search of its
 * sub-blocks, then `finish` stores the block (block_bytes) from their scales, mins and codes. */
typedef void (*scale_min_finish_fn)(const float *restrict x, const float *restrict scales, const float *restrict mins,
                                    uint8_t *restrict L, void *restrict block);

static void quantize_scale_min_blocks(strata_q4_k_search_fn search, scale_min_finish_fn finish, int64_t block_bytes,
                                      const float *restrict x, uint8_t *restrict dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, x += STRATA_QK_K) {
        union { strata_block_q4_k q4_k; strata_block_q2_k q2_k; } blk;
        uint8_t L[STRATA_QK_K];
        float scales[16], mins[16];                        /* Q4_K's 8 sub-blocks, Q2_K's 16 */
        search(x, scales, mins, L);
        finish(x, scales, mins, L, &blk);
        memcpy(dst + b * block_bytes, &blk, (size_t)block_bytes);
    }
}

/* 6-bit scale j (0..7) and min into the 12-byte K-quant scale array: bytes 0-3 hold the scales
 * of sub-blocks 0-3, bytes 4-7 their mins; bytes 8-11 the low nibbles of sub-blocks 4-7's scale
 * and min, whose top two bits go into the top bits of bytes 0-7. `sc` must start zeroed. */
static void pack_scale_min_k4(uint8_t *restrict sc, int j, int ls, int lm) {
    if (j < 4) {
        sc[j] |= (uint8_t)ls;
        sc[j + 4] |= (uint8_t)lm;
    } else {
        sc[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
        sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
        sc[j] |= (uint8_t)((lm >> 4) << 6);
    }
}


/* The (scale, min) search of a Q4_K block's eight sub-blocks: writes each sub-block's scale,
 * -min and codes. The AVX2 twin (quantize_avx2.c) runs the eight searches in the eight lanes of
 * a vector, with the same float operations in the same order per lane, so its output is equal. */
void strata_quantize_q4_k_search_ref(const float *restrict x, float *restrict scales, float *restrict mins,
                                     uint8_t *restrict L) {
    float w[32];
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        /* Weights: each value counts by its magnitude plus the sub-block's RMS. */
        float sum_x2 = 0;
        for (int i = 0; i < 32; i++) sum_x2 += xs[i] * xs[i];
        const float rms = sqrtf(sum_x2 / 32);
        for (int i = 0; i < 32; i++) w[i] = rms + fabsf(xs[i]);
        scales[j] = fit_scale_min(32, 15, xs, w, L + 32 * j, &mins[j], -1.0f, 0.1f, 20);
    }
}

static void quantize_q4_k_finish(const float *restrict x, const float *restrict scales, const float *restrict mins,
                                 uint8_t *restrict L, void *restrict block) {
    strata_block_q4_k *y = block;
    const scale_min_range r = range_of(8, scales, mins, 63.0f);
    memset(y->scales, 0, sizeof y->scales);
    for (int j = 0; j < 8; j++)
        pack_scale_min_k4(y->scales, j, round_clamp(r.inv_scale * scales[j], 0, 63),
                          round_clamp(r.inv_min * mins[j], 0, 63));
    y->d = strata_f32_to_half(r.max_scale / 63.0f);
    y->dmin = strata_f32_to_half(r.max_min / 63.0f);

    /* Requantize against the scales as stored (6-bit and half rounding included). */
    const float d = strata_half_to_f32(y->d), dmin = strata_half_to_f32(y->dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t ls, lm;
        strata_k_scale_min(j, y->scales, &ls, &lm);
        const float ds = d * ls, dm = dmin * lm;
        if (ds == 0.0f) continue;                          /* keep the search's codes */
        for (int i = 0; i < 32; i++) L[32 * j + i] = (uint8_t)round_clamp((x[32 * j + i] + dm) / ds, 0, 15);
    }
    /* Each 64 values: 32 bytes, low nibbles the first 32 values, high nibbles the next 32. */
    for (int c = 0; c < STRATA_QK_K / 64; c++)
        for (int i = 0; i < 32; i++)
            y->qs[32 * c + i] = (uint8_t)(L[64 * c + i] | (L[64 * c + 32 + i] << 4));
}

static void quantize_q4_k_ref(const float *restrict x, uint8_t *restrict dst, int64_t n_blocks) {
    quantize_scale_min_blocks(strata_quantize_q4_k_search_ref, quantize_q4_k_finish, sizeof(strata_block_q4_k), x, dst, n_blocks);
}

static void quantize_q4_k_avx2(const float *restrict x, uint8_t *restrict dst, int64_t n_blocks) {
    quantize_scale_min_blocks(strata_quantize_q4_k_search_avx2, quantize_q4_k_finish, sizeof(strata_block_q4_k), x, dst, n_blocks);
}

/* ---- Q2_K ---- */

/*
 * Sixteen sub-blocks of 16 values, each fitted asymmetrically to 2-bit codes (x ~ s*q - m, q in
 * 0..3, weights |x| as in the K-quant reference); the sixteen scales and mins are then stored as
 * 4-bit multiples of the block's largest (d = max_scale / 15, dmin = max_min / 15) and the codes
 * requantized against the stored values. Layout: scales[j] = scale | min << 4; each 128 values
 * fill 32 bytes of qs, value 32*s + i in bits 2s..2s+1 of byte i.
 */
/* The (scale, min) search of a Q2_K block's sixteen sub-blocks (the AVX2 twin runs eight at a time). */
void strata_quantize_q2_k_search_ref(const float *restrict x, float *restrict scales, float *restrict mins,
                                     uint8_t *restrict L) {
    float w[16];
    for (int j = 0; j < 16; j++) {
        for (int i = 0; i < 16; i++) w[i] = fabsf(x[16 * j + i]);
        scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15);
    }
}

static void quantize_q2_k_finish(const float *restrict x, const float *restrict scales, const float *restrict mins,
                                 uint8_t *restrict L, void *restrict block) {
    strata_block_q2_k *y = block;
    const scale_min_range r = range_of(16, scales, mins, 15.0f);
    for (int j = 0; j < 16; j++)
        y->scales[j] = (uint8_t)(round_clamp(r.inv_scale * scales[j], 0, 15) |
                                 (round_clamp(r.inv_min * mins[j], 0, 15) << 4));
    y->d = strata_f32_to_half(r.max_scale / 15.0f);
    y->dmin = strata_f32_to_half(r.max_min / 15.0f);
    const float d = strata_half_to_f32(y->d), dmin = strata_half_to_f32(y->dmin);
    for (int j = 0; j < 16; j++) {
        const float ds = d * (y->scales[j] & 0xf), dm = dmin * (y->scales[j] >> 4);
        if (ds == 0.0f) continue;                          /* keep the search's codes */
        for (int i = 0; i < 16; i++) L[16 * j + i] = (uint8_t)round_clamp((x[16 * j + i] + dm) / ds, 0, 3);
    }
    for (int c = 0; c < STRATA_QK_K / 128; c++)
        for (int i = 0; i < 32; i++) {
            const uint8_t *l = L + 128 * c + i;
            y->qs[32 * c + i] = (uint8_t)(l[0] | (l[32] << 2) | (l[64] << 4) | (l[96] << 6));
        }
}

/* Q2_K's search has Q4_K's signature: both fit (scale, min) pairs per sub-block. */
static void quantize_q2_k_ref(const float *restrict x, uint8_t *restrict dst, int64_t n_blocks) {
    quantize_scale_min_blocks(strata_quantize_q2_k_search_ref, quantize_q2_k_finish, sizeof(strata_block_q2_k), x, dst, n_blocks);
}

static void quantize_q2_k_avx2(const float *restrict x, uint8_t *restrict dst, int64_t n_blocks) {
    quantize_scale_min_blocks(strata_quantize_q2_k_search_avx2, quantize_q2_k_finish, sizeof(strata_block_q2_k), x, dst, n_blocks);
}

/* ---- Q6_K ---- */

/*
 * Symmetric fit of one sub-block of n values to q in -nmax..nmax-1 with weights x^2: rounds on
 * the grid set by the largest-magnitude value (mapped to -nmax), and on 18 grids around it
 * ((nmax + 0.1*k) for k = -9..9), keeping the grid whose least-squares scale explains the most
 * weighted energy (max (sum w x l)^2 / sum w l^2). Writes q + nmax to L; returns the scale.
 */
static float fit_scale_sym(int n, int nmax, const float *restrict x, int8_t *restrict L) {
    float amax = 0, vmax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; vmax = x[i]; }
    }
    if (amax < STRATA_GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / vmax, sum_lx = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = round_clamp(iscale * x[i], -nmax, nmax - 1);
        const float w = x[i] * x[i];
        L[i] = (int8_t)(l + nmax);
        sum_lx += w * x[i] * l;
        sum_l2 += w * l * l;
    }
    float scale = sum_l2 ? sum_lx / sum_l2 : 0.0f, best = scale * sum_lx;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        iscale = -(nmax + 0.1f * k) / vmax;
        sum_lx = sum_l2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = round_clamp(iscale * x[i], -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sum_lx += w * x[i] * l;
            sum_l2 += w * l * l;
        }
        if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + round_clamp(iscale * x[i], -nmax, nmax - 1));
            scale = sum_lx / sum_l2;
            best = scale * sum_lx;
        }
    }
    return scale;
}

/* The scale search of a Q6_K block's sixteen sub-blocks (the AVX2 twin runs eight at a time). */
void strata_quantize_q6_k_search_ref(const float *restrict x, float *restrict scales, int8_t *restrict L) {
    for (int j = 0; j < 16; j++) scales[j] = fit_scale_sym(16, 32, x + 16 * j, L + 16 * j);
}

static void quantize_q6_k_finish(const float *restrict x, const float *restrict scales, int8_t *restrict L,
                                 strata_block_q6_k *restrict y) {
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; j++)
        if (fabsf(scales[j]) > max_abs) { max_abs = fabsf(scales[j]); max_scale = scales[j]; }
    memset(y, 0, sizeof *y);
    if (max_abs < STRATA_GROUP_EPS) return;                /* all-zero block: d = 0 */

    /* The largest-magnitude scale maps to -128 so its sign is absorbed into d. */
    const float iscale = -128.0f / max_scale;
    y->d = strata_f32_to_half(1 / iscale);
    for (int j = 0; j < 16; j++) y->scales[j] = (int8_t)round_clamp(iscale * scales[j], -128, 127);

    const float d = strata_half_to_f32(y->d);
    for (int j = 0; j < 16; j++) {
        const float ds = d * y->scales[j];
        if (ds == 0.0f) continue;
        for (int i = 0; i < 16; i++) L[16 * j + i] = (int8_t)(32 + round_clamp(x[16 * j + i] / ds, -32, 31));
    }
    /* Each 128 values: low nibbles in 64 bytes of ql (values i and i+64 share byte i, i+32 and
     * i+96 share byte 32+i), the 2 high bits of values i, i+32, i+64, i+96 in byte i of qh. */
    for (int c = 0; c < STRATA_QK_K / 128; c++) {
        const int8_t *l = L + 128 * c;
        uint8_t *ql = y->ql + 64 * c, *qh = y->qh + 32 * c;
        for (int i = 0; i < 32; i++) {
            ql[i] = (uint8_t)((l[i] & 0xf) | ((l[i + 64] & 0xf) << 4));
            ql[i + 32] = (uint8_t)((l[i + 32] & 0xf) | ((l[i + 96] & 0xf) << 4));
            qh[i] = (uint8_t)((l[i] >> 4) | ((l[i + 32] >> 4) << 2) | ((l[i + 64] >> 4) << 4) | ((l[i + 96] >> 4) << 6));
        }
    }
}

static void quantize_q6_k_with(strata_q6_k_search_fn search, const float *restrict x, uint8_t *restrict dst,
                               int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++, x += STRATA_QK_K) {
        strata_block_q6_k blk;
        int8_t L[STRATA_QK_K];
        float scales[16];
        search(x, scales, L);
        quantize_q6_k_finish(x, scales, L, &blk);
        memcpy(dst + b * (int64_t)sizeof blk, &blk, sizeof blk);
    }
}

static void quantize_q6_k_ref(const float *restrict x, uint8_t *restrict dst, int64_t n_blocks) {
    quantize_q6_k_with(strata_quantize_q6_k_search_ref, x, dst, n_blocks);
}

static void quantize_q6_k_avx2(const float *restrict x, uint8_t *restrict dst, int64_t n_blocks) {
    quantize_q6_k_with(strata_quantize_q6_k_search_avx2, x, dst, n_blocks);
}

/* ---- Dispatcher ---- */

typedef void (*strata_quant_fn)(const float *restrict src, uint8_t *restrict dst, int64_t n_blocks);

/* Quantizers per type; block sizes come from the format table (format.c). */
typedef struct {
    int type;
    strata_quant_fn ref, avx2;      /* avx2 may be NULL: the format then runs its scalar code */
} strata_quant_format;

static const strata_quant_format QUANT_FORMATS[] = {
    {STRATA_T_Q8_0, strata_quantize_q8_0_blocks, NULL},
    {STRATA_T_Q2_K, quantize_q2_k_ref, quantize_q2_k_avx2},
    {STRATA_T_Q4_K, quantize_q4_k_ref, quantize_q4_k_avx2},
    {STRATA_T_Q6_K, quantize_q6_k_ref, quantize_q6_k_avx2},
};

int strata_quantize_has_type(int ggml_type) { return STRATA_TYPE_ROW(QUANT_FORMATS, ggml_type) != NULL; }

typedef struct {
    strata_quant_fn fn;
    const float *src;
    uint8_t *dst;
    int64_t row_len, blocks_per_row, block_bytes;
} strata_quant_job;

static void quant_rows(void *ctx, int64_t first_row, int64_t n_rows) {
    const strata_quant_job *j = ctx;
    j->fn(j->src + first_row * j->row_len, j->dst + first_row * j->blocks_per_row * j->block_bytes,
          n_rows * j->blocks_per_row);
}

int strata_quantize(int ggml_type, const float *src, int64_t src_bytes, void *dst, int64_t dst_bytes,
                    int64_t n_rows, int64_t row_len, int n_threads, int impl) {
    const strata_quant_format *q = STRATA_TYPE_ROW(QUANT_FORMATS, ggml_type);
    if (!q) return STRATA_E_TYPE;
    const strata_format_info *f = strata_format_find(ggml_type);
    if (!src || !dst || n_rows < 0 || row_len < 0 || src_bytes < 0 || dst_bytes < 0 || n_threads < 1)
        return STRATA_E_ARG;
    const int st = strata_resolve_impl(impl, &impl);
    if (st) return st;
    /* No AVX-512 searches: that family runs the AVX2 ones. */
    const int avx2 = impl == STRATA_IMPL_AVX2 || impl == STRATA_IMPL_AVX512;
    const strata_quant_fn fn = avx2 && q->avx2 ? q->avx2 : q->ref;
    if (row_len % f->block_elems) return STRATA_E_BLOCK;

    /* Overflow-safe: every product is checked against a buffer size before it is formed. */
    const int64_t blocks_per_row = row_len / f->block_elems;
    if (n_rows && blocks_per_row > INT64_MAX / n_rows) return STRATA_E_SIZE;
    const int64_t n_blocks = n_rows * blocks_per_row;
    if (n_blocks > src_bytes / (f->block_elems * (int64_t)sizeof(float))) return STRATA_E_SIZE;
    if (n_blocks > dst_bytes / f->block_bytes) return STRATA_E_SIZE;
    if (n_blocks == 0) return STRATA_OK;

    strata_quant_job job = {.fn = fn, .src = src, .dst = dst, .row_len = row_len,
                             .blocks_per_row = blocks_per_row, .block_bytes = f->block_bytes};
    strata_parallel_rows(n_rows, n_threads, quant_rows, &job);
    return STRATA_OK;
}
