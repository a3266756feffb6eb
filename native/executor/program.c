/*
 * A whole decode step through every layer in one call: for each layer, its kind's step (the
 * strata_step_fn in its strata_decode_layer: attention, gated DeltaNet, ...; the program knows no
 * kind, only the head every kind's struct begins with), the routed experts (strata_moe_glu:
 * SwiGLU, or the layer's expert function), the shared expert if the layer has one (a one-expert
 * strata_moe_swiglu call, every token, weighted by strata_shared_weights; a dense layer's FFN runs
 * as its "shared expert", weight 1) and the residual add, the
 * same calls in the same order as strata/runtime/step.py makes them from Python, so the results
 * are the same bytes. Crossing into C once per token instead of twice per layer is what removes
 * the interpreter from decode when every expert stays where it is (memory read in place, or a
 * slot pool that holds every expert and never moves them).
 *
 * Each layer's experts are addressed through `slot_of`, the layer's page table row: expert e is
 * the matrix at position slot_of[e] of the layer's parts. Every entry is checked against the
 * parts' regions before use (strata_moe_swiglu checks the regions again). A layer whose routing
 * needs an expert that is not in place (-1) ends the call after its attention half, so that the
 * caller brings the expert in through the memory, computes that layer's experts and resumes the
 * program at the next layer.
 * No allocation: intermediates live in the caller's buffers and scratch, sized for the largest
 * of every layer's step scratch and strata_moe_scratch_bytes.
 */
#include "strata.h"
#include "common.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* map_experts' answer for an expert that is not in place (never returned to the caller). */
#define NOT_IN_PLACE (-1)

static int mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }

/* A layer's width and router, from the head of its kind's struct. */
static int64_t layer_embd(const strata_decode_layer *L) { return L->layer->n_embd; }
static const float *layer_router(const strata_decode_layer *L) { return L->layer->router; }
static int64_t layer_experts(const strata_decode_layer *L) { return L->layer->n_experts; }
static int64_t layer_n_used(const strata_decode_layer *L) { return L->layer->n_used; }

/* The layer list agrees with itself and with the buffers' shapes. */
static int layers_ok(const strata_decode_layer *layers, int64_t n_layers, int64_t n_seq, int64_t ids_stride,
                     int64_t index_len) {
    if (!layers || n_layers < 1 || n_seq < 1) return STRATA_E_ARG;
    for (int64_t l = 0; l < n_layers; l++) {
        const strata_decode_layer *L = &layers[l];
        int64_t n_assign;
        if (!L->step || !L->layer || L->s_ff < 0 || !layers[0].layer || layer_embd(L) != layer_embd(&layers[0]))
            return STRATA_E_ARG;
        if (!layer_router(L)) {  /* a dense layer: its FFN is the "shared expert", every token, weight 1 */
            if (L->s_ff < 1 || L->s_gate_inp) return STRATA_E_ARG;
            continue;
        }
        if (!L->slot_of || L->n_ff < 1) return STRATA_E_ARG;
        if (layer_experts(L) > index_len || !mul_ok(n_seq, layer_n_used(L), &n_assign) || n_assign > ids_stride)
            return STRATA_E_SIZE;
    }
    return STRATA_OK;
}

/* Expert positions of the experts the grouping used, from the layer's page table row;
 * NOT_IN_PLACE when one is not in place. */
static int map_experts(const strata_decode_layer *L, const strata_route_groups *g, int32_t *index) {
    for (int64_t j = 0; j < g->n_used; j++) {
        const int32_t e = g->used[j];
        if (e < 0 || e >= layer_experts(L)) return STRATA_E_SIZE;
        const int32_t s = L->slot_of[e];
        if (s < 0) return NOT_IN_PLACE;  /* not in place yet */
        index[j] = s;
    }
    return STRATA_OK;
}

int strata_shared_weights(const float *x, int64_t n_tok, int64_t n_embd, const float *gate_inp, float *w, int impl) {
    if (!x || !w || n_tok < 0 || n_embd < 1) return STRATA_E_ARG;
    if (!gate_inp) {
        for (int64_t t = 0; t < n_tok; t++) w[t] = 1.0f;
        return STRATA_OK;
    }
    int st = strata_glue_matvec(x, n_embd, n_tok, n_embd, gate_inp, 1, w, impl);
    if (st != STRATA_OK) return st;
    for (int64_t t = 0; t < n_tok; t++) w[t] = 1.0f / (1.0f + expf(-w[t]));
    return STRATA_OK;
}

/* The layer's shared expert into routed: one expert at position 0 of its parts, every token. */
static int add_shared(strata_pool *pool, const strata_decode_layer *L, const float *xn, int64_t xy_bytes, int64_t n_seq,
                      int64_t D, float *routed, int32_t *s_tokens, float *s_weights, void *scratch,
                      int64_t scratch_bytes, int impl) {
    if (!s_tokens || !s_weights) return STRATA_E_ARG;
    int st = strata_shared_weights(xn, n_seq, D, L->s_gate_inp, s_weights, impl);
    if (st != STRATA_OK) return st;
    for (int64_t t = 0; t < n_seq; t++) s_tokens[t] = (int32_t)t;
    const int32_t index[1] = {0};
    const int64_t offsets[2] = {0, n_seq};
    return strata_moe_swiglu(pool, xn, xy_bytes, n_seq, D, L->s_ff, &L->s_gate, &L->s_up, &L->s_down, 1, index,
                             offsets, s_tokens, s_weights, n_seq, routed, xy_bytes, scratch, scratch_bytes, impl);
}

int strata_decode_layers(strata_pool *pool, const strata_decode_layer *layers, int64_t n_layers,
                         const strata_step_args *args, int64_t ids_stride, int32_t *expert_index, int64_t index_len,
                         float *routed, int64_t first_layer, int64_t *stopped_at, int64_t *layer_used,
                         int64_t *layer_ns, int32_t *s_tokens, float *s_weights, int impl) {
    if (!args) return STRATA_E_ARG;
    const int64_t n_seq = args->n_seq;
    int st = layers_ok(layers, n_layers, n_seq, ids_stride, index_len);
    if (st != STRATA_OK) return st;
    float *x = args->x, *xn = args->xn;
    void *scratch = args->scratch;
    const int64_t scratch_bytes = args->scratch_bytes;
    strata_route_groups *groups = args->groups;
    if (!x || !xn || !args->expert_ids || !args->weights || !groups || !expert_index || !routed || !stopped_at ||
        !layer_used || first_layer < 0 || first_layer > n_layers)
        return STRATA_E_ARG;
    strata_step_args a = *args;  /* each layer's expert ids in its own rows */
    const int64_t D = layer_embd(&layers[0]);
    int64_t xy_bytes;
    if (!mul_ok(n_seq, D, &xy_bytes) || !mul_ok(xy_bytes, 4, &xy_bytes)) return STRATA_E_SIZE;
    for (int64_t l = first_layer; l < n_layers; l++) {
        const strata_decode_layer *L = &layers[l];
        const int64_t t0 = layer_ns ? strata_now_ns() : 0;
        a.expert_ids = args->expert_ids + l * ids_stride;
        st = L->step(pool, L->layer, &a, impl);
        if (st != STRATA_OK) return st;
        const int64_t t1 = layer_ns ? strata_now_ns() : 0;
        const int moe = layer_router(L) != NULL;  /* else a dense layer: its FFN is the shared expert */
        layer_used[l] = moe ? groups->n_used : 0;
        if (moe) {
            st = map_experts(L, groups, expert_index);
            if (st == NOT_IN_PLACE) {  /* the caller brings the experts in and computes this layer's */
                if (layer_ns) layer_ns[2 * l] += t1 - t0;
                *stopped_at = l;
                return STRATA_OK;
            }
            if (st != STRATA_OK) return st;
        }
        memset(routed, 0, (size_t)xy_bytes);
        if (moe) {
            strata_moe_act act;
            if (L->act) {  /* the layer's expert function, with the ids of the experts the grouping used */
                act = *L->act;
                act.expert_ids = groups->used;
            }
            st = strata_moe_glu(pool, xn, xy_bytes, n_seq, D, L->n_ff, &L->gate, &L->up, &L->down, groups->n_used,
                                expert_index, groups->offsets, groups->token_ids, groups->weights_sorted,
                                n_seq * layer_n_used(L), L->act ? &act : NULL, routed, xy_bytes, NULL, 0, scratch,
                                scratch_bytes, impl);
        }
        if (st == STRATA_OK && L->s_ff > 0)
            st = add_shared(pool, L, xn, xy_bytes, n_seq, D, routed, s_tokens, s_weights, scratch, scratch_bytes, impl);
        if (st != STRATA_OK) return st;
        for (int64_t i = 0; i < n_seq * D; i++) x[i] += routed[i];
        if (layer_ns) {
            const int64_t t2 = strata_now_ns();
            layer_ns[2 * l] += t1 - t0;
            layer_ns[2 * l + 1] += t2 - t1;
        }
    }
    *stopped_at = n_layers;
    return STRATA_OK;
}
