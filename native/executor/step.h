/* What every layer kind's decode step shares (step.c): the scratch's alignment, the checks of the
 * head and the arguments, and the FFN's input (norm, router, grouping). Internal to native/: a
 * kind's step (step.c's attention, deltanet.c's gated DeltaNet, ...) includes it. */
#ifndef STRATA_STEP_H
#define STRATA_STEP_H

#include "strata.h"

#include <stdint.h>

#define STEP_ALIGN 64

static inline int step_mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline int step_add_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline int64_t step_align(int64_t n) { return (n + STEP_ALIGN - 1) / STEP_ALIGN * STEP_ALIGN; }
/* The aligned start of a step's scratch (a kind's scratch bytes include STEP_ALIGN for it). */
static inline uint8_t *step_scratch(void *scratch) {
    return (uint8_t *)(((uintptr_t)scratch + STEP_ALIGN - 1) / STEP_ALIGN * STEP_ALIGN);
}

/* The head's own fields are sound: a width, both norms, and a router that picks 1..n_experts. */
int strata_step_head_ok(const strata_layer_head *h);
/* What every step reads of `a` is there: sequences, positions, x, xn, and for an MoE layer the
 * routing's outputs; scratch of at least `need` bytes. */
int strata_step_args_ok(const strata_layer_head *h, const strata_step_args *a, int64_t need);
/* xn = ffn_norm(x); for an MoE layer the router's logits (into `logits`, [n_seq, n_experts]),
 * its choice into expert_ids and weights and, when a->groups is given, its grouping. */
int strata_step_ffn_input(strata_pool *pool, const strata_layer_head *h, const strata_step_args *a, float *logits,
                          int impl);

/* Latent attention's attention over the cache rows, a kind's own (sparse attention, dsa.c), called
 * by strata_step_attn in place of dense decode attention once the query and the new latent row are
 * made: query [n_seq, H, kv_lora + rope] into lat_att [n_seq, H, kv_lora + rope] (the first kv_lora
 * of each head read), xa = attn_norm(x) and qa = q_a_norm(xa @ Wq_a^T) [n_seq, q_lora] as the step
 * made them, blk / off each new token's cache block and offset (checked). */
typedef int (*strata_latent_attend_fn)(strata_pool *pool, const strata_attn_layer *L, const strata_step_args *a,
                                       const float *cos_t, const float *sin_t, const float *xa, const float *qa,
                                       const float *query, float *lat_att, const int64_t *blk, const int64_t *off,
                                       int impl);
/* strata_decode_attn with latent attention's attention given by `attend` (NULL: the dense one);
 * its scratch is strata_decode_attn_scratch_bytes', at the start of a->scratch. */
int strata_step_attn(strata_pool *pool, const strata_layer_head *head, const strata_step_args *a,
                     strata_latent_attend_fn attend, int impl);

#endif
