/*
 * Stand-alone check of the AVX-512 quantized matrix kernels against the scalar ones, through the
 * public entry points of strata.h only: for a machine with AVX-512 but without this project's
 * Python environment. test_qdot_tiles.py runs the same comparison from Python for every tile where
 * the package is built; this program is built with every C file below native/, each folder on the
 * include path (test_qdot_special.py builds and runs it):
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -pthread -ffp-contract=off $(find native -type d -printf '-I%p ') \
 *       $(find native -name '*.c') tests/native/qdot_avx512_check.c -o qdot_avx512_check -lm
 *
 * Prints one line per case and exits 0 when every case passes, 1 when one fails, 77 (skip) when
 * the CPU has no AVX-512. Checks: activation blocks byte-identical; outputs within
 * 1e-5 * sum |w| |x| (the float sums differ only in order; a wrong index gives O(1) errors).
 */
#include "strata.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T_F16 = 1, T_Q4_0 = 2, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30, T_MXFP4 = 39 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float uniform(void) { return (float)(rnd() & 0xffffff) / 16777216.0f; }
static float gauss(void) {
    float s = 0;
    for (int i = 0; i < 6; i++) s += uniform();
    return s - 3.0f;
}

static uint16_t to_half(float f) {
    uint16_t h;
    strata_convert_f32(&f, &h, 1, STRATA_OUT_F16, STRATA_IMPL_SCALAR);
    return h;
}

/* Random packed weights whose scales are `scale` (in half) times a random factor in [0.5, 1). */
static void fill_weights(int type, uint8_t *w, int64_t n_blocks, int64_t block_bytes, float scale) {
    for (int64_t i = 0; i < n_blocks * block_bytes; i++) w[i] = (uint8_t)rnd();
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *p = w + b * block_bytes;
        uint16_t d = to_half(scale * (0.5f + 0.5f * uniform())), dmin = to_half(scale * 0.5f * uniform());
        switch (type) {
        case T_Q4_0: case T_Q8_0: memcpy(p, &d, 2); break;
        case T_Q4_K: case T_Q5_K: memcpy(p, &d, 2); memcpy(p + 2, &dmin, 2); break;
        case T_Q6_K: memcpy(p + 208, &d, 2); break;
        case T_MXFP4: { int e = 127 + (int)lrintf(log2f(scale)) + (int)(rnd() % 3) - 1;
                        p[0] = (uint8_t)(e < 0 ? 0 : e > 255 ? 255 : e); break; }
        case T_F16: case T_BF16: {
            float f = fminf(fmaxf(scale * gauss(), -6e4f), 6e4f);   /* finite in F16 */
            uint16_t h;
            strata_convert_f32(&f, &h, 1, type == T_F16 ? STRATA_OUT_F16 : STRATA_OUT_BF16, STRATA_IMPL_SCALAR);
            memcpy(p, &h, 2);
            break;
        }
        }
    }
}

static int run_case(int type, const char *name, int64_t n_rows, int64_t k, int64_t n_tok, float w_scale,
                    float x_scale, int zero_x) {
    int64_t be, bb;
    if (strata_dequant_block_size(type, &be, &bb)) return 1;
    const int64_t nb = n_rows * (k / be), w_bytes = nb * bb;
    uint8_t *w = malloc((size_t)w_bytes + 1);
    float *x = malloc((size_t)(n_tok * k) * 4), *wf = malloc((size_t)(n_rows * k) * 4);
    float *y_ref = malloc((size_t)(n_tok * n_rows) * 4 + 4), *y_vec = malloc((size_t)(n_tok * n_rows) * 4 + 4);
    fill_weights(type, w, nb, bb, w_scale);
    for (int64_t i = 0; i < n_tok * k; i++) x[i] = zero_x && i < k ? 0.0f : x_scale * gauss();
    if (n_tok > 1) x[k + 3] = 40.0f * x_scale;   /* one outlier */
    int64_t s_bytes = 0;
    strata_qdot_scratch_bytes(type, n_tok, k, &s_bytes);
    if (s_bytes == 0) s_bytes = n_tok * k * 4;   /* float weights: the "activations" are a copy of x */
    uint8_t *s_ref = malloc((size_t)s_bytes + 4), *s_vec = malloc((size_t)s_bytes + 4);
    int st = strata_qdot_quantize_act(type, x, n_tok * k * 4, n_tok, k, s_ref, s_bytes, STRATA_IMPL_SCALAR);
    st |= strata_qdot_quantize_act(type, x, n_tok * k * 4, n_tok, k, s_vec, s_bytes, STRATA_IMPL_AVX512);
    int act_same = memcmp(s_ref, s_vec, (size_t)s_bytes) == 0;
    st |= strata_qdot_rows(type, w, w_bytes, n_rows, k, x, n_tok * k * 4, n_tok, y_ref, n_tok * n_rows * 4,
                           s_ref, s_bytes, STRATA_IMPL_SCALAR);
    st |= strata_qdot_rows(type, w, w_bytes, n_rows, k, x, n_tok * k * 4, n_tok, y_vec, n_tok * n_rows * 4,
                           s_vec, s_bytes, STRATA_IMPL_AVX512);
    st |= strata_dequant(type, w, w_bytes, wf, n_rows * k * 4, STRATA_OUT_F32, n_rows, k, 1, STRATA_IMPL_SCALAR);
    double worst = 0;
    int bad = 0;
    for (int64_t t = 0; t < n_tok && !st; t++)
        for (int64_t r = 0; r < n_rows; r++) {
            double mag = 0;
            for (int64_t i = 0; i < k; i++) mag += fabs((double)wf[r * k + i] * x[t * k + i]);
            const double err = fabs((double)y_vec[t * n_rows + r] - y_ref[t * n_rows + r]);
            const double rel = mag > 0 ? err / mag : err;
            if (!(rel <= 1e-5) && !(err == 0)) bad++;
            if (rel > worst || rel != rel) worst = rel;
        }
    const int ok = !st && act_same && !bad;
    printf("%s %-6s rows=%-3lld k=%-5lld T=%-3lld wscale=%-8g xscale=%-8g act_equal=%d worst_rel=%.3g bad=%d st=%d\n",
           ok ? "PASS" : "FAIL", name, (long long)n_rows, (long long)k, (long long)n_tok, w_scale, x_scale,
           act_same, worst, bad, st);
    free(w); free(x); free(wf); free(y_ref); free(y_vec); free(s_ref); free(s_vec);
    return !ok;
}

int main(void) {
    if (!strata_cpu_has_avx512()) {
        printf("SKIP: this CPU (or its OS) has no AVX-512 F/BW/VL/VNNI\n");
        return 77;
    }
    static const struct { int type; const char *name; int64_t k[3]; } F[] = {
        {T_Q4_0, "Q4_0", {32, 96, 4096}}, {T_Q8_0, "Q8_0", {32, 160, 2048}},
        {T_MXFP4, "MXFP4", {32, 224, 2048}}, {T_Q4_K, "Q4_K", {256, 768, 4096}},
        {T_Q5_K, "Q5_K", {256, 512, 2048}}, {T_Q6_K, "Q6_K", {256, 1280, 4096}},
        {T_F16, "F16", {1, 45, 1040}}, {T_BF16, "BF16", {7, 64, 1027}},
    };
    static const int64_t toks[] = {1, 2, 7, 64};
    static const float scales[][2] = {{0.02f, 1.0f}, {6e-8f, 1e-20f}, {3e4f, 1e8f}, {1.0f, 1e-38f}, {3e-38f, 1e12f}};
    int fails = 0, cases = 0;
    for (size_t f = 0; f < sizeof F / sizeof F[0]; f++)
        for (int ki = 0; ki < 3; ki++)
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
                for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
                    if (F[f].k[ki] >= 2048 && toks[ti] == 64 && si) continue;   /* keep the run short */
                    fails += run_case(F[f].type, F[f].name, ki == 2 ? 5 : 13, F[f].k[ki], toks[ti],
                                      scales[si][0], scales[si][1], ti == 2);
                    cases++;
                }
    /* The environment overrides: both vector families reachable through AUTO. */
    printf("impl_default=%d (3: avx512)\n", strata_impl_default());
    printf("%s: %d of %d cases failed\n", fails ? "FAIL" : "PASS", fails, cases);
    return fails ? 1 : 0;
}
