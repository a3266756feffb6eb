/* Gated DeltaNet's per-token recurrence and short causal convolution for the CPU path (see
 * deltanet.h); the torch version in strata/models/deltanet.py is the reference. Scalar C: the
 * state of one head is dk x dv floats, swept twice per token, and auto-vectorises at -O3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"
#include "deltanet.h"

#define L2_EPS 1e-6f  /* transformers' l2norm (the FLA kernels') */

static float silu(float x) { return x / (1.0f + expf(-x)); }

int strata_deltanet_conv(const float *x, int64_t x_len, int64_t n, int64_t C, int64_t K, const float *w, int64_t w_len,
                         float *state, int64_t state_len, float *out, int64_t out_len) {
    if (!x || !w || !state || !out || n < 1 || C < 1 || K < 2) return STRATA_E_ARG;
    if (x_len < n * C || w_len < C * K || state_len < (K - 1) * C || out_len < n * C) return STRATA_E_SIZE;
    const int64_t rows = K - 1 + n;
    float *window = malloc((size_t)(rows * C) * sizeof(float));  /* [K-1+n, C] */
    if (!window) return STRATA_E_NOMEM;
    memcpy(window, state, (size_t)((K - 1) * C) * sizeof(float));
    memcpy(window + (K - 1) * C, x, (size_t)(n * C) * sizeof(float));
    for (int64_t t = 0; t < n; t++) {
        for (int64_t c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++) acc += w[c * K + j] * window[(t + j) * C + c];
            out[t * C + c] = silu(acc);
        }
    }
    memcpy(state, window + n * C, (size_t)((K - 1) * C) * sizeof(float));
    free(window);
    return STRATA_OK;
}

static void l2_scaled(const float *x, int64_t d, float scale, float *y) {
    float ss = 0.0f;
    for (int64_t i = 0; i < d; i++) ss += x[i] * x[i];
    const float r = scale / sqrtf(ss + L2_EPS);
    for (int64_t i = 0; i < d; i++) y[i] = x[i] * r;
}

/* One token of one value head: S [dk, dv] decays, takes the delta update, and is read by q. */
static void delta_step(float *S, const float *q, const float *k, const float *v, float decay, float beta,
                       int64_t dk, int64_t dv, float *d, float *o) {
    for (int64_t j = 0; j < dv; j++) d[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        float *row = S + i * dv;
        for (int64_t j = 0; j < dv; j++) { row[j] *= decay; d[j] += row[j] * k[i]; }
    }
    for (int64_t j = 0; j < dv; j++) { d[j] = (v[j] - d[j]) * beta; o[j] = 0.0f; }
    for (int64_t i = 0; i < dk; i++) {
        float *row = S + i * dv;
        for (int64_t j = 0; j < dv; j++) { row[j] += k[i] * d[j]; o[j] += row[j] * q[i]; }
    }
}

int strata_deltanet_recur(const float *mixed, int64_t mixed_len, const float *g, const float *beta, int64_t gb_len,
                          int64_t n, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, int tiled, float *state,
                          int64_t state_len, float *out, int64_t out_len) {
    if (!mixed || !g || !beta || !state || !out || n < 1 || Hk < 1 || Hv < 1 || dk < 1 || dv < 1 || Hv % Hk)
        return STRATA_E_ARG;
    const int64_t key = Hk * dk, C = 2 * key + Hv * dv, r = Hv / Hk;
    if (mixed_len < n * C || gb_len < n * Hv || state_len < Hv * dk * dv || out_len < n * Hv * dv)
        return STRATA_E_SIZE;
    float *buf = malloc((size_t)(2 * key + dv) * sizeof(float));  /* q and k of every key head, delta */
    if (!buf) return STRATA_E_NOMEM;
    float *q = buf, *k = buf + key, *d = buf + 2 * key;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int64_t t = 0; t < n; t++) {
        const float *m = mixed + t * C;
        for (int64_t h = 0; h < Hk; h++) {
            l2_scaled(m + h * dk, dk, scale, q + h * dk);
            l2_scaled(m + key + h * dk, dk, 1.0f, k + h * dk);
        }
        for (int64_t h = 0; h < Hv; h++) {
            const int64_t kh = tiled ? h % Hk : h / r;
            delta_step(state + h * dk * dv, q + kh * dk, k + kh * dk, m + 2 * key + h * dv, expf(g[t * Hv + h]),
                       beta[t * Hv + h], dk, dv, d, out + (t * Hv + h) * dv);
        }
    }
    free(buf);
    return STRATA_OK;
}

int strata_deltanet_gates(const float *b, const float *a, int64_t ab_len, int64_t n, int64_t Hv, const float *dt,
                          const float *A, int64_t head_len, float *beta, float *g, int64_t out_len) {
    if (!b || !a || !dt || !A || !beta || !g || n < 1 || Hv < 1) return STRATA_E_ARG;
    if (ab_len < n * Hv || head_len < Hv || out_len < n * Hv) return STRATA_E_SIZE;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t h = 0; h < Hv; h++) {
            const int64_t i = t * Hv + h;
            const float v = a[i] + dt[h];
            /* torch's softplus (beta 1, threshold 20): linear above the threshold */
            const float sp = v > 20.0f ? v : log1pf(expf(v));
            g[i] = sp * A[h];
            beta[i] = 1.0f / (1.0f + expf(-b[i]));
        }
    }
    return STRATA_OK;
}

int strata_deltanet_norm_gate(const float *o, int64_t o_len, int64_t n, int64_t Hv, int64_t dv, const float *z,
                              int64_t z_stride, int64_t z_len, const float *norm, int64_t norm_len, float eps,
                              float *out, int64_t out_len) {
    if (!o || !z || !norm || !out || n < 1 || Hv < 1 || dv < 1 || z_stride < Hv * dv) return STRATA_E_ARG;
    if (o_len < n * Hv * dv || z_len < (n - 1) * z_stride + Hv * dv || norm_len < dv || out_len < n * Hv * dv)
        return STRATA_E_SIZE;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t h = 0; h < Hv; h++) {
            const float *x = o + (t * Hv + h) * dv, *zz = z + t * z_stride + h * dv;
            float *y = out + (t * Hv + h) * dv;
            double ss = 0.0;  /* summed in double, as strata_glue_rmsnorm */
            for (int64_t j = 0; j < dv; j++) ss += (double)x[j] * x[j];
            const float r = (float)(1.0 / sqrt(ss / (double)dv + (double)eps));
            for (int64_t j = 0; j < dv; j++) y[j] = x[j] * r * norm[j] * silu(zz[j]);
        }
    }
    return STRATA_OK;
}

int strata_attn_gate(float *x, int64_t x_len, const float *gate, int64_t gate_len, int64_t n) {
    if (!x || !gate || n < 0) return STRATA_E_ARG;
    if (x_len < n || gate_len < n) return STRATA_E_SIZE;
    for (int64_t i = 0; i < n; i++) x[i] *= 1.0f / (1.0f + expf(-gate[i]));
    return STRATA_OK;
}
