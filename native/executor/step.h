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

#endif
