/*
 * AVX2 twins of the K-quant scale searches in quantize.c: one sub-block per lane.
 *
 * The scalar searches are chains of dependent float sums over a sub-block, which neither the
 * compiler nor a hand-written kernel can reorder without changing the result. Sub-blocks are
 * independent, though, so eight of them run side by side, each lane doing exactly the scalar
 * code's operations in the scalar code's order (separate multiplies and adds, no FMA; selects
 * where the scalar code branches). The output equals the scalar search bit for bit.
 */
#pragma GCC target("avx2,fma")
#include "kernels.h"
#include "quantize.h"

#include <immintrin.h>

#define RNE_MAGIC 12582912.0f  /* 1.5 * 2^23: adding it rounds to an integer, ties to even */

/* round_clamp of quantize.c on eight lanes, as a float: clamp to [lo, hi] (NaN -> lo), round. */
static inline __m256 round_clamp8(__m256 v, __m256 lo, __m256 hi) {
    const __m256 magic = _mm256_set1_ps(RNE_MAGIC);
    v = _mm256_max_ps(v, lo);   /* (v > lo) ? v : lo, so NaN -> lo */
    v = _mm256_min_ps(v, hi);   /* (v < hi) ? v : hi */
    return _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
}

static inline __m256 sq(__m256 a) { return _mm256_mul_ps(a, a); }

/* xt[i] = value i of sub-blocks first .. first+7 (sub-block j starts at x + stride * j). */
static void transpose8(const float *restrict x, int stride, int n, int first, __m256 *restrict xt) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
    for (int i = 0; i < n; i++) xt[i] = _mm256_i32gather_ps(x + stride * first + i, idx, 4);
}

/* ---- fit_scale_min of quantize.c on 8 sub-blocks of n <= 32 values at a time ---- */

/* Lanes hold sub-blocks: xt[i], w[i] = value and weight i of each. Writes each lane's scale,
 * -min and codes (as floats, Lb[0..n)). */
static void fit_scale_min8(int n, float nmax, const __m256 *restrict xt, const __m256 *restrict w,
                           float rmin, float rdelta, int nstep,
                           __m256 *restrict scale_out, __m256 *restrict neg_min_out, __m256 *restrict Lb) {
    const __m256 zero = _mm256_setzero_ps(), vnmax = _mm256_set1_ps(nmax);
    __m256 Lk[32];
    __m256 lo = xt[0], hi = xt[0], sum_w = w[0], sum_x = _mm256_mul_ps(w[0], xt[0]);
    for (int i = 1; i < n; i++) {
        lo = _mm256_min_ps(xt[i], lo);  /* x < lo ? x : lo */
        hi = _mm256_max_ps(xt[i], hi);  /* x > hi ? x : hi */
        sum_w = _mm256_add_ps(sum_w, w[i]);
        sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(w[i], xt[i]));
    }
    lo = _mm256_blendv_ps(lo, zero, _mm256_cmp_ps(lo, zero, _CMP_GT_OQ));
    const __m256 flat = _mm256_cmp_ps(hi, lo, _CMP_EQ_OQ);
    const __m256 lo0 = lo;

    __m256 iscale = _mm256_div_ps(vnmax, _mm256_sub_ps(hi, lo));
    __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale), best = zero;
    for (int i = 0; i < n; i++) {
        Lb[i] = round_clamp8(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], lo)), zero, vnmax);
        const __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, Lb[i]), lo), xt[i]);
        best = _mm256_add_ps(best, _mm256_mul_ps(w[i], sq(diff)));
    }
    /* As in the scalar search, each accepted fit moves the offset `lo` that later candidates
     * (their grid and their codes) are measured from. */
    for (int k = 0; k <= nstep; k++) {
        iscale = _mm256_div_ps(_mm256_set1_ps(rmin + rdelta * k + nmax), _mm256_sub_ps(hi, lo));
        __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
        for (int i = 0; i < n; i++) {
            const __m256 l = round_clamp8(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], lo)), zero, vnmax);
            const __m256 wl = _mm256_mul_ps(w[i], l);
            Lk[i] = l;
            sum_l = _mm256_add_ps(sum_l, wl);
            sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, l));
            sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, xt[i]));
        }
        const __m256 det = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
        const __m256 ok = _mm256_cmp_ps(det, zero, _CMP_GT_OQ);
        __m256 s = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), det);
        __m256 m = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), det);
        const __m256 pos = _mm256_cmp_ps(m, zero, _CMP_GT_OQ);
        m = _mm256_blendv_ps(m, zero, pos);
        s = _mm256_blendv_ps(s, _mm256_div_ps(sum_xl, sum_l2), pos);
        __m256 err = zero;
        for (int i = 0; i < n; i++) {
            const __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(s, Lk[i]), m), xt[i]);
            err = _mm256_add_ps(err, _mm256_mul_ps(w[i], sq(diff)));
        }
        const __m256 better = _mm256_and_ps(ok, _mm256_cmp_ps(err, best, _CMP_LT_OQ));
        if (_mm256_testz_ps(better, better)) continue;
        for (int i = 0; i < n; i++) Lb[i] = _mm256_blendv_ps(Lb[i], Lk[i], better);
        best = _mm256_blendv_ps(best, err, better);
        scale = _mm256_blendv_ps(scale, s, better);
        lo = _mm256_blendv_ps(lo, m, better);
    }
    /* Flat sub-blocks (max == min after clamping): codes 0, scale 0, offset the value itself. */
    *scale_out = _mm256_blendv_ps(scale, zero, flat);
    *neg_min_out = _mm256_sub_ps(zero, _mm256_blendv_ps(lo, lo0, flat));
    for (int i = 0; i < n; i++) Lb[i] = _mm256_blendv_ps(Lb[i], zero, flat);
}

/* Codes of lanes (sub-blocks first .. first+7 of n values) back into value order. */
static void store_codes8(const __m256 *restrict Lb, int n, int first, uint8_t *restrict L) {
    float lanes[8] __attribute__((aligned(32)));
    for (int i = 0; i < n; i++) {
        _mm256_store_ps(lanes, Lb[i]);
        for (int j = 0; j < 8; j++) L[n * (first + j) + i] = (uint8_t)lanes[j];
    }
}

/* ---- Q4_K: fit_scale_min(32, 15, ..., rmin -1, rdelta 0.1, nstep 20) on 8 sub-blocks ---- */

void strata_quantize_q4_k_search_avx2(const float *restrict x, float *restrict scales, float *restrict mins,
                                      uint8_t *restrict L) {
    enum { N = 32 };
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 xt[N], w[N], Lb[N], scale, neg_min;
    transpose8(x, 32, N, 0, xt);

    /* Weights: rms + |x|. */
    __m256 sum_x2 = _mm256_setzero_ps();
    for (int i = 0; i < N; i++) sum_x2 = _mm256_add_ps(sum_x2, sq(xt[i]));
    const __m256 rms = _mm256_sqrt_ps(_mm256_div_ps(sum_x2, _mm256_set1_ps(32.0f)));
    for (int i = 0; i < N; i++) w[i] = _mm256_add_ps(rms, _mm256_and_ps(xt[i], absmask));

    fit_scale_min8(N, 15.0f, xt, w, -1.0f, 0.1f, 20, &scale, &neg_min, Lb);
    _mm256_storeu_ps(scales, scale);
    _mm256_storeu_ps(mins, neg_min);
    store_codes8(Lb, N, 0, L);
}

/* ---- Q2_K: fit_scale_min(16, 3, ..., rmin -0.5, rdelta 0.1, nstep 15) on 8 sub-blocks at a time ---- */

void strata_quantize_q2_k_search_avx2(const float *restrict x, float *restrict scales, float *restrict mins,
                                      uint8_t *restrict L) {
    enum { N = 16 };
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int first = 0; first < 16; first += 8) {
        __m256 xt[N], w[N], Lb[N], scale, neg_min;
        transpose8(x, 16, N, first, xt);
        for (int i = 0; i < N; i++) w[i] = _mm256_and_ps(xt[i], absmask);  /* weights |x| */
        fit_scale_min8(N, 3.0f, xt, w, -0.5f, 0.1f, 15, &scale, &neg_min, Lb);
        _mm256_storeu_ps(scales + first, scale);
        _mm256_storeu_ps(mins + first, neg_min);
        store_codes8(Lb, N, first, L);
    }
}

/* ---- Q6_K: fit_scale_sym(16, 32, ...) on 8 sub-blocks at a time ---- */

static void q6_k_search8(const float *restrict x, int first, float *restrict scales, int8_t *restrict L) {
    enum { N = 16 };
    const float nmax = 32.0f;
    const __m256 zero = _mm256_setzero_ps(), vlo = _mm256_set1_ps(-nmax), vhi = _mm256_set1_ps(nmax - 1);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 xt[N], w[N], Lb[N];
    transpose8(x, 16, N, first, xt);

    __m256 amax = zero, vmax = zero;
    for (int i = 0; i < N; i++) {
        const __m256 ax = _mm256_and_ps(xt[i], absmask);
        const __m256 gt = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
        amax = _mm256_blendv_ps(amax, ax, gt);
        vmax = _mm256_blendv_ps(vmax, xt[i], gt);
        w[i] = sq(xt[i]);
    }
    const __m256 tiny = _mm256_cmp_ps(amax, _mm256_set1_ps(1e-15f), _CMP_LT_OQ);

    __m256 iscale = _mm256_div_ps(_mm256_set1_ps(-nmax), vmax), sum_lx = zero, sum_l2 = zero;
    for (int i = 0; i < N; i++) {
        const __m256 l = round_clamp8(_mm256_mul_ps(iscale, xt[i]), vlo, vhi);
        Lb[i] = l;
        sum_lx = _mm256_add_ps(sum_lx, _mm256_mul_ps(_mm256_mul_ps(w[i], xt[i]), l));
        sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(_mm256_mul_ps(w[i], l), l));
    }
    __m256 scale = _mm256_blendv_ps(_mm256_div_ps(sum_lx, sum_l2), zero, _mm256_cmp_ps(sum_l2, zero, _CMP_EQ_OQ));
    __m256 best = _mm256_mul_ps(scale, sum_lx);
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        iscale = _mm256_div_ps(_mm256_set1_ps(-(nmax + 0.1f * k)), vmax);
        __m256 l[N];
        sum_lx = sum_l2 = zero;
        for (int i = 0; i < N; i++) {
            l[i] = round_clamp8(_mm256_mul_ps(iscale, xt[i]), vlo, vhi);
            sum_lx = _mm256_add_ps(sum_lx, _mm256_mul_ps(_mm256_mul_ps(w[i], xt[i]), l[i]));
            sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(_mm256_mul_ps(w[i], l[i]), l[i]));
        }
        const __m256 better = _mm256_and_ps(_mm256_cmp_ps(sum_l2, zero, _CMP_GT_OQ),
                                            _mm256_cmp_ps(_mm256_mul_ps(sum_lx, sum_lx), _mm256_mul_ps(best, sum_l2),
                                                          _CMP_GT_OQ));
        if (_mm256_testz_ps(better, better)) continue;
        for (int i = 0; i < N; i++) Lb[i] = _mm256_blendv_ps(Lb[i], l[i], better);
        const __m256 s = _mm256_div_ps(sum_lx, sum_l2);
        scale = _mm256_blendv_ps(scale, s, better);
        best = _mm256_blendv_ps(best, _mm256_mul_ps(s, sum_lx), better);
    }
    /* All-zero sub-blocks: scale 0 and codes 0 (the scalar code returns before any search). */
    _mm256_storeu_ps(scales + first, _mm256_blendv_ps(scale, zero, tiny));
    float lanes[8] __attribute__((aligned(32)));
    for (int i = 0; i < N; i++) {
        _mm256_store_ps(lanes, _mm256_blendv_ps(_mm256_add_ps(Lb[i], _mm256_set1_ps(nmax)), zero, tiny));
        for (int j = 0; j < 8; j++) L[16 * (first + j) + i] = (int8_t)lanes[j];
    }
}

void strata_quantize_q6_k_search_avx2(const float *restrict x, float *restrict scales, int8_t *restrict L) {
    q6_k_search8(x, 0, scales, L);
    q6_k_search8(x, 8, scales, L);
}
