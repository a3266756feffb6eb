/* Gated DeltaNet's per-token recurrence and short causal convolution for the CPU path (see
 * deltanet.h); the torch version in strata/models/deltanet.py is the reference. Scalar C: the
 * state of one head is dk x dv floats, swept twice per token, and auto-vectorises at -O3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"
#include "deltanet.h"
#include "step.h"

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

/* ---- The decode step of a gated DeltaNet layer (a strata_step_fn; see deltanet.h) ---- */

#define mul_ok step_mul_ok
#define add_ok step_add_ok
#define align_up step_align


typedef struct { int64_t xa, proj, mixed, ba, gates, o, og, out, logits, act, total; } dn_layout;

/* The layer's sizes, checked: C channels of q|k|v, n_in rows of W_in, val = Hv dv. */
static int dn_layer_ok(const strata_deltanet_layer *L, int64_t *C, int64_t *n_in, int64_t *val) {
    int64_t key, t, conv, ssm;
    if (!L || strata_step_head_ok(&L->head) != STRATA_OK || L->n_k_heads < 1 || L->n_v_heads < 1 || L->head_k_dim < 1 || L->head_v_dim < 1 ||
        L->n_v_heads % L->n_k_heads || L->conv_kernel < 2 || L->n_slots < 0 ||
        !L->w_in || !L->w_out || !L->conv || !L->dt || !L->ssm_a || !L->ssm_norm || L->w_in_bytes < 0 || L->w_out_bytes < 0 || !(L->ssm_eps >= 0.0f))
        return STRATA_E_ARG;
    if (!mul_ok(L->n_k_heads, L->head_k_dim, &key) || !mul_ok(L->n_v_heads, L->head_v_dim, val) ||
        !mul_ok(key, 2, &t) || !add_ok(t, *val, C) || !add_ok(*C, *val, &t) || !add_ok(t, 2 * L->n_v_heads, n_in) ||
        !mul_ok(L->conv_kernel - 1, *C, &conv) || !mul_ok(conv, L->n_slots, &conv) ||
        !mul_ok(*val, L->head_k_dim, &ssm) || !mul_ok(ssm, L->n_slots, &ssm))
        return STRATA_E_SIZE;
    return STRATA_OK;
}

static int dn_plan(const strata_deltanet_layer *L, int64_t n_seq, int64_t C, int64_t n_in, int64_t val,
                   dn_layout *S) {
    const int64_t D = L->head.n_embd, Hv = L->n_v_heads;
    int64_t act, a;
    int st = strata_matmul_scratch_bytes(L->in_type, n_seq, D, &act);
    if (st == STRATA_OK) st = strata_matmul_scratch_bytes(L->out_type, n_seq, val, &a);
    if (st != STRATA_OK) return st;
    act = a > act ? a : act;
    /* Per sequence, floats: xa, the product, the conv output, b|a, beta|g, o, the gated o, the
     * output projection, the router's logits; then the products' activation rows. */
    const int64_t per_seq[9] = {D, n_in, C, 2 * Hv, 2 * Hv, val, val, D, L->head.router ? L->head.n_experts : 0};
    int64_t *offs[10] = {&S->xa, &S->proj, &S->mixed, &S->ba, &S->gates, &S->o, &S->og, &S->out, &S->logits,
                         &S->act};
    int64_t at = 0;
    for (int i = 0; i < 10; i++) {
        int64_t n = act;
        if (i < 9 && (!mul_ok(per_seq[i], n_seq, &n) || !mul_ok(n, 4, &n))) return STRATA_E_SIZE;
        *offs[i] = at;
        if (!add_ok(at, align_up(n), &at)) return STRATA_E_SIZE;
    }
    return add_ok(at, STEP_ALIGN, &S->total) ? STRATA_OK : STRATA_E_SIZE;
}

int strata_decode_deltanet_scratch_bytes(const strata_layer_head *head, int64_t n_seq, int64_t *bytes) {
    if (!bytes || n_seq < 0) return STRATA_E_ARG;
    *bytes = 0;
    const strata_deltanet_layer *layer = (const strata_deltanet_layer *)head;  /* head is its first member */
    int64_t C, n_in, val;
    dn_layout S;
    int st = dn_layer_ok(layer, &C, &n_in, &val);
    if (st == STRATA_OK) st = dn_plan(layer, n_seq, C, n_in, val, &S);
    if (st == STRATA_OK) *bytes = S.total;
    return st;
}

/* b and a [Hv] of one product row's last 2 Hv values (per key head its r betas, then its r alphas,
 * or all betas then all alphas). */
static void dn_split_ba(const strata_deltanet_layer *L, const float *row, float *b, float *a) {
    const int64_t Hv = L->n_v_heads, r = Hv / L->n_k_heads;
    if (!L->ba_per_key_head) {
        memcpy(b, row, (size_t)Hv * sizeof(float));
        memcpy(a, row + Hv, (size_t)Hv * sizeof(float));
        return;
    }
    for (int64_t kh = 0; kh < L->n_k_heads; kh++)
        for (int64_t j = 0; j < r; j++) {
            b[kh * r + j] = row[kh * 2 * r + j];
            a[kh * r + j] = row[kh * 2 * r + r + j];
        }
}

/* One sequence's conv step, gates and recurrence on its slot's states: o [Hv dv]. */
static int dn_recur_one(const strata_deltanet_layer *L, int64_t C, int64_t val, int64_t slot, int64_t position,
                        const float *row, float *mixed, float *ba, float *gates, float *o) {
    const int64_t Hv = L->n_v_heads, conv_len = (L->conv_kernel - 1) * C, ssm_len = val * L->head_k_dim;
    float *cs = L->conv_state + slot * conv_len, *ss = L->ssm_state + slot * ssm_len;
    if (position == 0) {  /* a sequence's first token starts from zeros (strata/models/deltanet.py) */
        memset(cs, 0, (size_t)conv_len * sizeof(float));
        memset(ss, 0, (size_t)ssm_len * sizeof(float));
    }
    int st = strata_deltanet_conv(row, C, 1, C, L->conv_kernel, L->conv, C * L->conv_kernel, cs, conv_len, mixed, C);
    if (st != STRATA_OK) return st;
    dn_split_ba(L, row + C + val, ba, ba + Hv);
    st = strata_deltanet_gates(ba, ba + Hv, Hv, 1, Hv, L->dt, L->ssm_a, Hv, gates, gates + Hv, Hv);
    if (st != STRATA_OK) return st;
    return strata_deltanet_recur(mixed, C, gates + Hv, gates, Hv, 1, L->n_k_heads, Hv, L->head_k_dim,
                                 L->head_v_dim, L->tiled, ss, ssm_len, o, val);
}

int strata_decode_deltanet(strata_pool *pool, const strata_layer_head *head, const strata_step_args *a, int impl) {
    const strata_deltanet_layer *L = (const strata_deltanet_layer *)head;  /* head is its first member */
    int64_t C, n_in, val;
    int st = dn_layer_ok(L, &C, &n_in, &val);
    if (st != STRATA_OK) return st;
    if (!a || a->n_seq < 1 || !a->slots || !L->conv_state || !L->ssm_state || L->n_slots < 1) return STRATA_E_ARG;
    const int64_t n_seq = a->n_seq, *slots = a->slots, *positions = a->positions;
    float *x = a->x;
    dn_layout S;
    st = dn_plan(L, n_seq, C, n_in, val, &S);
    if (st == STRATA_OK) st = strata_step_args_ok(head, a, S.total);
    if (st != STRATA_OK) return st;
    for (int64_t b = 0; b < n_seq; b++) {  /* every slot in range and taken once, before the first write */
        if (slots[b] < 0 || slots[b] >= L->n_slots || positions[b] < 0) return STRATA_E_SIZE;
        for (int64_t j = 0; j < b; j++)
            if (slots[j] == slots[b]) return STRATA_E_ARG;
    }
    uint8_t *s = step_scratch(a->scratch);
    const int64_t D = L->head.n_embd;
    float *xa = (float *)(s + S.xa), *proj = (float *)(s + S.proj), *o = (float *)(s + S.o);
    float *og = (float *)(s + S.og), *out = (float *)(s + S.out);
    void *act = s + S.act;
    const int64_t act_bytes = S.total - STEP_ALIGN - S.act;

    st = strata_glue_rmsnorm(x, D, n_seq, 1, D, L->head.attn_norm, L->head.norm_eps, xa, D);
    if (st == STRATA_OK)
        st = strata_matmul(pool, L->in_type, L->w_in, L->w_in_bytes, n_in, D, xa, n_seq * D * 4, n_seq, proj,
                           n_seq * n_in * 4, act, act_bytes, impl);
    for (int64_t b = 0; b < n_seq && st == STRATA_OK; b++)
        st = dn_recur_one(L, C, val, slots[b], positions[b], proj + b * n_in, (float *)(s + S.mixed),
                          (float *)(s + S.ba), (float *)(s + S.gates), o + b * val);
    if (st == STRATA_OK)
        st = strata_deltanet_norm_gate(o, n_seq * val, n_seq, L->n_v_heads, L->head_v_dim, proj + C, n_in,
                                       (n_seq - 1) * n_in + val, L->ssm_norm, L->head_v_dim, L->ssm_eps, og,
                                       n_seq * val);
    if (st == STRATA_OK)
        st = strata_matmul(pool, L->out_type, L->w_out, L->w_out_bytes, D, val, og, n_seq * val * 4, n_seq, out,
                           n_seq * D * 4, act, act_bytes, impl);
    if (st != STRATA_OK) return st;
    for (int64_t i = 0; i < n_seq * D; i++) x[i] += out[i];
    return strata_step_ffn_input(pool, head, a, (float *)(s + S.logits), impl);
}
