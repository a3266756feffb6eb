/* ---- Gated DeltaNet (deltanet.c): the short causal convolution and the gated delta rule ----
 *
 * Read by build.py as part of the cdef (after strata.h). float32 throughout, row-major; one
 * sequence per call. Sizes are checked against each buffer's length (in floats): STRATA_E_ARG for
 * null pointers or non-positive sizes, STRATA_E_SIZE for a buffer shorter than its shape.
 *
 * conv: out[t, c] = silu(sum_j w[c, j] * window[t + j, c]), window = [state (K-1 rows) | x (n rows)]
 *       of C channels; afterwards state holds the window's last K-1 rows.
 * recur: per token t and value head h (key head kh = h % Hk when tiled, else h / (Hv / Hk)):
 *       q = l2(mixed[t, q part of kh]) / sqrt(dk), k = l2(mixed[t, k part of kh]), v = mixed[t, v of h]
 *       S = exp(g[t, h]) S;  d = beta[t, h] (v - S^T k);  S += k d^T;  out[t, h] = S^T q
 *       with S [Hv, dk, dv] the state and l2(x) = x / sqrt(sum x^2 + 1e-6).
 * gates: beta[t, h] = sigmoid(b[t, h]), g[t, h] = softplus(a[t, h] + dt[h]) * A[h] (torch's
 *       softplus: linear above 20) for b, a [n, Hv] and dt, A [Hv].
 * norm_gate: out[t, h] = rmsnorm(o[t, h]) * norm * silu(z[t, h]) over the dv values of each head
 *       (o [n, Hv, dv]; z rows of Hv dv values z_stride apart; norm [dv]; mean of squares in double).
 * attn_gate: x[i] *= sigmoid(gate[i]) for n values: gated attention's output gate (qwen3next).
 */
int strata_deltanet_conv(const float *x, int64_t x_len, int64_t n, int64_t C, int64_t K, const float *w, int64_t w_len,
                         float *state, int64_t state_len, float *out, int64_t out_len);
int strata_deltanet_recur(const float *mixed, int64_t mixed_len, const float *g, const float *beta, int64_t gb_len,
                          int64_t n, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, int tiled, float *state,
                          int64_t state_len, float *out, int64_t out_len);
int strata_deltanet_gates(const float *b, const float *a, int64_t ab_len, int64_t n, int64_t Hv, const float *dt,
                          const float *A, int64_t head_len, float *beta, float *g, int64_t out_len);
int strata_deltanet_norm_gate(const float *o, int64_t o_len, int64_t n, int64_t Hv, int64_t dv, const float *z,
                              int64_t z_stride, int64_t z_len, const float *norm, int64_t norm_len, float eps,
                              float *out, int64_t out_len);
int strata_attn_gate(float *x, int64_t x_len, const float *gate, int64_t gate_len, int64_t n);

/* ---- A gated DeltaNet layer's decode step (deltanet.c; a strata_step_fn) ----
 *
 * qwen3next, qwen35moe: the layer's stacked input projection w_in [C + Hv dv + 2 Hv, D] (rows:
 * q|k|v of C = 2 Hk dk + Hv dv, the output gate z, then beta/alpha: per key head its r = Hv/Hk
 * betas then its r alphas when ba_per_key_head, else Hv betas then Hv alphas), conv [C, K], dt and
 * A [Hv], ssm_norm [dv] (eps ssm_eps), w_out [D, Hv dv]; the per-slot states conv_state
 * [n_slots, K-1, C] and ssm_state [n_slots, Hv, dk, dv] (float32). The step reads args->slots
 * (each sequence's state row, zeroed first where its position is 0), not the block table:
 * x += w_out (norm_gate(recur(conv(q|k|v)), z)) of attn_norm(x), then the FFN's input and routing. */
typedef struct {
    strata_layer_head head;
    int64_t n_k_heads, n_v_heads, head_k_dim, head_v_dim, conv_kernel;
    int32_t tiled, ba_per_key_head;
    float ssm_eps;
    int32_t in_type, out_type;
    const void *w_in, *w_out;
    int64_t w_in_bytes, w_out_bytes;
    const float *conv, *dt, *ssm_a, *ssm_norm;
    float *conv_state, *ssm_state;
    int64_t n_slots;
} strata_deltanet_layer;

int strata_decode_deltanet_scratch_bytes(const strata_layer_head *layer, int64_t n_seq, int64_t *bytes);
int strata_decode_deltanet(strata_pool *pool, const strata_layer_head *layer, const strata_step_args *args, int impl);
