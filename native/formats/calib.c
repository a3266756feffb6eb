/*
 * Calibrated quantization: importance-weighted block search (imatrix, Hessian diagonal) and the
 * grid access GPTQ's column-by-column quantization needs (see calib.h for the grid convention).
 *
 * Block layouts are those of common.h:
 *   Q8_0  32 elems, 34 B: half d; i8 qs[32]                     x = d * q
 *   Q4_K 256 elems,144 B: half d, dmin; u8 scales[12]; qs[128]  x = d*sc_j * q - dmin*m_j (8 sub-blocks of 32)
 *   Q6_K 256 elems,210 B: u8 ql[128]; qh[64]; i8 scales[16]; half d   x = d*sc_j * (q - 32) (16 of 16)
 *
 * The weighted search is ours, not a copy of llama.cpp's: each element weighs
 * imp_i * sqrt(sigma2 + x_i^2) (importance times a magnitude term, so large weights are kept
 * accurately even where importances are flat), each sub-block's scale (and min) is a weighted
 * least-squares fit over a sweep of grids, and each stored 6/8-bit sub-block scale is then tried at
 * its rounded value +-1 against the block's real (half and integer rounded) grid. The
 * round-to-nearest block (strata_quantize) is always a candidate and the lowest error
 * sum imp_i (x_i - deq_i)^2 wins, so importance weighting never does worse than rounding on the measure it optimises.
 *
 * Must not: change the bytes of strata_quantize (tests hold those to llama.cpp and gguf-py).
 */
#include "strata.h"
#include "calib.h"
#include "kernels.h"

#include <math.h>
#include <string.h>

static inline int rclamp(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v > (float)hi) return hi;
    return (int)lrintf(v);
}

int strata_calib_code_max(int t) {
    return t == STRATA_T_Q8_0 ? 255 : t == STRATA_T_Q4_K ? 15 : t == STRATA_T_Q6_K ? 63 : -1;
}

/* ---- grids: decode and encode codes of one block ---- */

static void grid_q8_0(const uint8_t *b, float *step, float *zero, int *code) {
    strata_block_q8_0 blk;
    memcpy(&blk, b, sizeof blk);
    const float d = strata_half_to_f32(blk.d);
    for (int i = 0; i < STRATA_QK; i++) {
        step[i] = d;
        zero[i] = -128.0f * d;
        if (code) code[i] = blk.qs[i] + 128;
    }
}

static void grid_q4_k(const uint8_t *b, float *step, float *zero, int *code) {
    strata_block_q4_k blk;
    memcpy(&blk, b, sizeof blk);
    const float d = strata_half_to_f32(blk.d), dmin = strata_half_to_f32(blk.dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t ls, lm;
        strata_k_scale_min(j, blk.scales, &ls, &lm);
        for (int i = 0; i < 32; i++) {
            step[32 * j + i] = d * ls;
            zero[32 * j + i] = -(dmin * lm);
        }
    }
    if (!code) return;
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 32; i++) {
            code[64 * c + i] = blk.qs[32 * c + i] & 0xf;
            code[64 * c + 32 + i] = blk.qs[32 * c + i] >> 4;
        }
}

static void grid_q6_k(const uint8_t *b, float *step, float *zero, int *code) {
    strata_block_q6_k blk;
    memcpy(&blk, b, sizeof blk);
    const float d = strata_half_to_f32(blk.d);
    for (int j = 0; j < 16; j++)
        for (int i = 0; i < 16; i++) {
            step[16 * j + i] = d * blk.scales[j];
            zero[16 * j + i] = -32.0f * (d * blk.scales[j]);
        }
    if (!code) return;
    for (int c = 0; c < 2; c++) {
        const uint8_t *ql = blk.ql + 64 * c, *qh = blk.qh + 32 * c;
        int *l = code + 128 * c;
        for (int i = 0; i < 32; i++) {
            l[i] = (ql[i] & 0xf) | (((qh[i] >> 0) & 3) << 4);
            l[i + 32] = (ql[i + 32] & 0xf) | (((qh[i] >> 2) & 3) << 4);
            l[i + 64] = (ql[i] >> 4) | (((qh[i] >> 4) & 3) << 4);
            l[i + 96] = (ql[i + 32] >> 4) | (((qh[i] >> 6) & 3) << 4);
        }
    }
}

static void codes_q8_0(uint8_t *b, const int *code) {
    strata_block_q8_0 blk;
    memcpy(&blk, b, sizeof blk);
    for (int i = 0; i < STRATA_QK; i++) blk.qs[i] = (int8_t)(code[i] - 128);
    memcpy(b, &blk, sizeof blk);
}

static void codes_q4_k(uint8_t *b, const int *code) {
    strata_block_q4_k blk;
    memcpy(&blk, b, sizeof blk);
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 32; i++)
            blk.qs[32 * c + i] = (uint8_t)(code[64 * c + i] | (code[64 * c + 32 + i] << 4));
    memcpy(b, &blk, sizeof blk);
}

static void codes_q6_k(uint8_t *b, const int *code) {
    strata_block_q6_k blk;
    memcpy(&blk, b, sizeof blk);
    for (int c = 0; c < 2; c++) {
        const int *l = code + 128 * c;
        uint8_t *ql = blk.ql + 64 * c, *qh = blk.qh + 32 * c;
        for (int i = 0; i < 32; i++) {
            ql[i] = (uint8_t)((l[i] & 0xf) | ((l[i + 64] & 0xf) << 4));
            ql[i + 32] = (uint8_t)((l[i + 32] & 0xf) | ((l[i + 96] & 0xf) << 4));
            qh[i] = (uint8_t)((l[i] >> 4) | ((l[i + 32] >> 4) << 2) | ((l[i + 64] >> 4) << 4) | ((l[i + 96] >> 4) << 6));
        }
    }
    memcpy(b, &blk, sizeof blk);
}

typedef void (*grid_fn)(const uint8_t *, float *, float *, int *);
typedef void (*codes_fn)(uint8_t *, const int *);

static int grid_of(int t, grid_fn *g, codes_fn *c) {
    switch (t) {
    case STRATA_T_Q8_0: *g = grid_q8_0; *c = codes_q8_0; return 0;
    case STRATA_T_Q4_K: *g = grid_q4_k; *c = codes_q4_k; return 0;
    case STRATA_T_Q6_K: *g = grid_q6_k; *c = codes_q6_k; return 0;
    default: return STRATA_E_TYPE;
    }
}

/* Weighted squared error of a packed block against x. */
static double block_error(grid_fn g, const uint8_t *b, const float *x, const float *w, int n) {
    float step[256], zero[256];
    int code[256];
    g(b, step, zero, code);
    double e = 0;
    for (int i = 0; i < n; i++) {
        const double diff = (double)zero[i] + (double)step[i] * code[i] - x[i];
        e += w[i] * diff * diff;
    }
    return e;
}

/* Error of the elements [lo, hi) of a block for codes re-rounded to the grid (step, zero). */
static double range_error(const float *x, const float *w, int lo, int hi, float step, float zero, int cmax,
                          int *code) {
    double e = 0;
    for (int i = lo; i < hi; i++) {
        const int q = step > 0 ? rclamp((x[i] - zero) / step, 0, cmax) : 0;
        if (code) code[i] = q;
        const double diff = (double)zero + (double)step * q - x[i];
        e += w[i] * diff * diff;
    }
    return e;
}

/* ---- weighted searches ---- */

/* Per-element weights: importance times sqrt(sigma2 + x^2), sigma2 = 2 * mean(x^2) of the block. */
static void element_weights(const float *x, const float *imp, int n, float *w) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    const float sigma2 = (float)(2.0 * s / n);
    for (int i = 0; i < n; i++) w[i] = imp[i] * sqrtf(sigma2 + x[i] * x[i]);
}

/* Weighted asymmetric fit x ~ s*q + m (q in 0..nmax, m <= 0): sweep of grids, least squares each. */
static void fit_asym(const float *x, const float *w, int n, int nmax, float *s_out, float *negmin_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) { lo = fminf(lo, x[i]); hi = fmaxf(hi, x[i]); }
    if (lo > 0) lo = 0;
    if (hi <= lo) { *s_out = 0; *negmin_out = -lo; return; }
    double best = INFINITY;
    float bs = (hi - lo) / nmax, bm = lo;
    for (int k = -10; k <= 20; k++) {
        const float iscale = (nmax + 0.1f * k) / (hi - lo);
        double sw = 0, sl = 0, sl2 = 0, sx = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            const int l = rclamp(iscale * (x[i] - lo), 0, nmax);
            sw += w[i]; sl += w[i] * l; sl2 += w[i] * l * l; sx += w[i] * x[i]; sxl += w[i] * l * x[i];
        }
        const double det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        double s = (sw * sxl - sx * sl) / det, m = (sl2 * sx - sl * sxl) / det;
        if (m > 0) { m = 0; s = sxl / sl2; }
        if (!(s > 0)) continue;
        const double e = range_error(x, w, 0, n, (float)s, (float)m, nmax, NULL);
        if (e < best) { best = e; bs = (float)s; bm = (float)m; }
    }
    *s_out = bs;
    *negmin_out = -bm;
}

static void pack_scale_min(uint8_t *sc, int j, int ls, int lm) {
    if (j < 4) {
        sc[j] = (uint8_t)((sc[j] & 0xc0) | ls);
        sc[j + 4] = (uint8_t)((sc[j + 4] & 0xc0) | lm);
    } else {
        sc[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
        sc[j - 4] = (uint8_t)((sc[j - 4] & 0x3f) | ((ls >> 4) << 6));
        sc[j] = (uint8_t)((sc[j] & 0x3f) | ((lm >> 4) << 6));
    }
}

static void weighted_q4_k(const float *x, const float *w, uint8_t *out) {
    float s[8], m[8], max_s = 0, max_m = 0;
    for (int j = 0; j < 8; j++) {
        fit_asym(x + 32 * j, w + 32 * j, 32, 15, &s[j], &m[j]);
        max_s = fmaxf(max_s, s[j]);
        max_m = fmaxf(max_m, m[j]);
    }
    strata_block_q4_k blk;
    memset(&blk, 0, sizeof blk);
    blk.d = strata_f32_to_half(max_s / 63.0f);
    blk.dmin = strata_f32_to_half(max_m / 63.0f);
    const float d = strata_half_to_f32(blk.d), dmin = strata_half_to_f32(blk.dmin);
    int code[256];
    for (int j = 0; j < 8; j++) {
        const int ls0 = d > 0 ? rclamp(s[j] / d, 0, 63) : 0, lm0 = dmin > 0 ? rclamp(m[j] / dmin, 0, 63) : 0;
        double best = INFINITY;
        int bls = ls0, blm = lm0;
        for (int a = -1; a <= 1; a++)
            for (int b = -1; b <= 1; b++) {
                const int ls = ls0 + a, lm = lm0 + b;
                if (ls < 0 || ls > 63 || lm < 0 || lm > 63) continue;
                const double e = range_error(x, w, 32 * j, 32 * j + 32, d * ls, -(dmin * lm), 15, NULL);
                if (e < best) { best = e; bls = ls; blm = lm; }
            }
        pack_scale_min(blk.scales, j, bls, blm);
        range_error(x, w, 32 * j, 32 * j + 32, d * bls, -(dmin * blm), 15, code);
    }
    memcpy(out, &blk, sizeof blk);
    codes_q4_k(out, code);
}

/* Weighted symmetric fit x ~ s*(code - nmax): sweep of grids around max|x|, least squares each. */
static float fit_sym(const float *x, const float *w, int n, int nmax) {
    float amax = 0, vmax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); vmax = x[i]; }
    if (amax < 1e-15f) return 0;
    double best = INFINITY;
    float bs = -vmax / nmax;
    for (int k = -12; k <= 12; k++) {
        const float iscale = -(nmax + 0.1f * k) / vmax;
        double sxl = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = rclamp(iscale * x[i], -nmax, nmax - 1);
            sxl += w[i] * x[i] * l; sl2 += w[i] * l * l;
        }
        if (!(sl2 > 0)) continue;
        const float sc = (float)(sxl / sl2);
        const double e = range_error(x, w, 0, n, fabsf(sc), -nmax * fabsf(sc), 2 * nmax - 1, NULL);
        if (e < best) { best = e; bs = sc; }
    }
    return bs;
}

static void weighted_q6_k(const float *x, const float *w, uint8_t *out) {
    float s[16], max_abs = 0, max_s = 0;
    for (int j = 0; j < 16; j++) {
        s[j] = fabsf(fit_sym(x + 16 * j, w + 16 * j, 16, 32));  /* codes are symmetric around 32 */
        if (s[j] > max_abs) { max_abs = s[j]; max_s = s[j]; }
    }
    strata_block_q6_k blk;
    memset(&blk, 0, sizeof blk);
    int code[256];
    for (int i = 0; i < 256; i++) code[i] = 32;
    if (max_abs >= 1e-15f) {
        blk.d = strata_f32_to_half(max_s / 127.0f);
        const float d = strata_half_to_f32(blk.d);
        for (int j = 0; j < 16; j++) {
            const int l0 = d > 0 ? rclamp(s[j] / d, 0, 127) : 0;
            double best = INFINITY;
            int bl = l0;
            for (int a = -1; a <= 1; a++) {
                const int l = l0 + a;
                if (l < 0 || l > 127) continue;
                const double e = range_error(x, w, 16 * j, 16 * j + 16, d * l, -32.0f * (d * l), 63, NULL);
                if (e < best) { best = e; bl = l; }
            }
            blk.scales[j] = (int8_t)bl;
            range_error(x, w, 16 * j, 16 * j + 16, d * bl, -32.0f * (d * bl), 63, code);
        }
    }
    memcpy(out, &blk, sizeof blk);
    codes_q6_k(out, code);
}

static void weighted_q8_0(const float *x, const float *w, uint8_t *out) {
    float amax = 0;
    for (int i = 0; i < STRATA_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
    strata_block_q8_0 blk;
    memset(&blk, 0, sizeof blk);
    int code[STRATA_QK];
    for (int i = 0; i < STRATA_QK; i++) code[i] = 128;
    double best = INFINITY;
    for (int k = -4; amax > 0 && k <= 8; k++) {
        const float d = strata_half_to_f32(strata_f32_to_half(amax / (127.0f - 0.25f * k)));
        int c[STRATA_QK];
        const double e = range_error(x, w, 0, STRATA_QK, d, -128.0f * d, 255, c);
        if (e < best) {
            best = e;
            blk.d = strata_f32_to_half(d);
            memcpy(code, c, sizeof c);
        }
    }
    memcpy(out, &blk, sizeof blk);
    codes_q8_0(out, code);
}

/* ---- entry points ---- */

typedef struct {
    int type;
    const float *src, *imp;
    uint8_t *dst;
    int64_t row_len, block_elems, block_bytes;
    void (*search)(const float *, const float *, uint8_t *);
    grid_fn grid;
} calib_job;

static void calib_rows(void *ctx, int64_t first, int64_t n_rows) {
    const calib_job *j = ctx;
    const int n = (int)j->block_elems;
    float w[256];
    uint8_t cand[256];
    for (int64_t r = first; r < first + n_rows; r++)
        for (int64_t c = 0; c < j->row_len; c += n) {
            const float *x = j->src + r * j->row_len + c;
            uint8_t *y = j->dst + (r * j->row_len + c) / n * j->block_bytes;
            const float *imp = j->imp + c;
            /* Candidates: round-to-nearest, the search weighted by importance x magnitude, and by
             * importance alone; the lowest importance-weighted error stays. */
            strata_quantize(j->type, x, n * (int64_t)sizeof(float), y, j->block_bytes, 1, n, 1, STRATA_IMPL_AUTO);
            double best = block_error(j->grid, y, x, imp, n);
            element_weights(x, imp, n, w);
            for (int k = 0; k < 2; k++) {
                j->search(x, k ? imp : w, cand);
                const double e = block_error(j->grid, cand, x, imp, n);
                if (e < best) {
                    best = e;
                    memcpy(y, cand, (size_t)j->block_bytes);
                }
            }
        }
}

int strata_calib_quantize(int t, const float *src, int64_t src_bytes, const float *imp, int64_t imp_len,
                          void *dst, int64_t dst_bytes, int64_t n_rows, int64_t row_len, int n_threads) {
    grid_fn g;
    codes_fn c;
    if (grid_of(t, &g, &c)) return STRATA_E_TYPE;
    if (!src || !imp || !dst || n_rows < 0 || row_len < 0 || n_threads < 1) return STRATA_E_ARG;
    const strata_format_info *f = strata_format_find(t);
    if (row_len % f->block_elems) return STRATA_E_BLOCK;
    if (imp_len < row_len) return STRATA_E_SIZE;
    for (int64_t i = 0; i < row_len; i++)
        if (!(imp[i] >= 0) || isinf(imp[i])) return STRATA_E_ARG;
    const int64_t per_row = row_len / f->block_elems;
    if (n_rows && per_row > INT64_MAX / n_rows) return STRATA_E_SIZE;
    if (n_rows * row_len > src_bytes / (int64_t)sizeof(float)) return STRATA_E_SIZE;
    if (n_rows * per_row > dst_bytes / f->block_bytes) return STRATA_E_SIZE;
    calib_job job = {.type = t, .src = src, .imp = imp, .dst = dst, .row_len = row_len,
                     .block_elems = f->block_elems, .block_bytes = f->block_bytes, .grid = g,
                     .search = t == STRATA_T_Q8_0 ? weighted_q8_0 : t == STRATA_T_Q4_K ? weighted_q4_k : weighted_q6_k};
    strata_parallel_rows(n_rows, n_threads, calib_rows, &job);
    return STRATA_OK;
}

int strata_calib_grid(int t, const void *blocks, int64_t blocks_bytes, int64_t n_blocks, float *step, float *zero,
                      int64_t out_len) {
    grid_fn g;
    codes_fn c;
    if (grid_of(t, &g, &c)) return STRATA_E_TYPE;
    if (!blocks || !step || !zero || n_blocks < 0) return STRATA_E_ARG;
    const strata_format_info *f = strata_format_find(t);
    if (n_blocks > blocks_bytes / f->block_bytes || n_blocks > out_len / f->block_elems) return STRATA_E_SIZE;
    for (int64_t b = 0; b < n_blocks; b++)
        g((const uint8_t *)blocks + b * f->block_bytes, step + b * f->block_elems, zero + b * f->block_elems, NULL);
    return STRATA_OK;
}

int strata_calib_set_codes(int t, const float *codes, int64_t codes_len, void *blocks, int64_t blocks_bytes,
                           int64_t n_blocks) {
    grid_fn g;
    codes_fn c;
    if (grid_of(t, &g, &c)) return STRATA_E_TYPE;
    if (!blocks || !codes || n_blocks < 0) return STRATA_E_ARG;
    const strata_format_info *f = strata_format_find(t);
    if (n_blocks > blocks_bytes / f->block_bytes || n_blocks > codes_len / f->block_elems) return STRATA_E_SIZE;
    const int cmax = strata_calib_code_max(t);
    int code[256];
    for (int64_t b = 0; b < n_blocks; b++) {
        for (int64_t i = 0; i < f->block_elems; i++) code[i] = rclamp(codes[b * f->block_elems + i], 0, cmax);
        c((uint8_t *)blocks + b * f->block_bytes, code);
    }
    return STRATA_OK;
}

typedef struct {
    float *W;
    int64_t B, ldw;
    const float *U, *step, *zero;
    int cmax;
    float *codes, *err;
} gptq_job;

static void gptq_rows(void *ctx, int64_t first, int64_t n_rows) {
    const gptq_job *g = ctx;
    const int64_t B = g->B;
    for (int64_t r = first; r < first + n_rows; r++) {
        float *w = g->W + r * g->ldw;
        const float *s = g->step + r * B, *z = g->zero + r * B;
        for (int64_t j = 0; j < B; j++) {
            const int c = s[j] != 0.0f ? rclamp((w[j] - z[j]) / s[j], 0, g->cmax) : 0;
            const float e = (w[j] - (z[j] + s[j] * c)) / g->U[j * B + j];
            const float *u = g->U + j * B;
            for (int64_t k = j + 1; k < B; k++) w[k] -= e * u[k];
            g->codes[r * B + j] = (float)c;
            g->err[r * B + j] = e;
        }
    }
}

int strata_calib_gptq_block(float *W, int64_t n_rows, int64_t B, int64_t ldw, const float *U, const float *step,
                            const float *zero, int cmax, float *codes, float *err, int n_threads) {
    if (!W || !U || !step || !zero || !codes || !err || n_rows < 0 || B < 0 || ldw < B || cmax < 1 || n_threads < 1)
        return STRATA_E_ARG;
    for (int64_t j = 0; j < B; j++)
        if (!(U[j * B + j] != 0.0f)) return STRATA_E_ARG;
    gptq_job job = {.W = W, .B = B, .ldw = ldw, .U = U, .step = step, .zero = zero, .cmax = cmax,
                    .codes = codes, .err = err};
    strata_parallel_rows(n_rows, n_threads, gptq_rows, &job);
    return STRATA_OK;
}
