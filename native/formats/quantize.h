/*
 * Internal interface between quantize.c (dispatcher, scalar searches, block packing) and
 * quantize_avx2.c (AVX2 twins of the searches). A twin runs one sub-block per vector lane with
 * the same float operations in the same order as its `_ref`, so the two give equal results
 * (the build passes -ffp-contract=off, so no multiply-add is fused in either).
 */
#ifndef STRATA_QUANTIZE_H
#define STRATA_QUANTIZE_H
#include <stdint.h>

/* Q4_K: 256 values -> per sub-block of 32: scale, -min, codes 0..15 (L in value order). */
typedef void (*strata_q4_k_search_fn)(const float *restrict x, float *restrict scales, float *restrict mins,
                                      uint8_t *restrict L);
/* Q2_K: 256 values -> per sub-block of 16: scale, -min, codes 0..3 (L in value order): the
 * same signature as Q4_K's. */
void strata_quantize_q2_k_search_ref(const float *restrict x, float *restrict scales, float *restrict mins,
                                     uint8_t *restrict L);
void strata_quantize_q2_k_search_avx2(const float *restrict x, float *restrict scales, float *restrict mins,
                                      uint8_t *restrict L);
/* Q6_K: 256 values -> per sub-block of 16: signed scale, codes + 32 (L in value order). */
typedef void (*strata_q6_k_search_fn)(const float *restrict x, float *restrict scales, int8_t *restrict L);

void strata_quantize_q4_k_search_ref(const float *restrict x, float *restrict scales, float *restrict mins,
                                     uint8_t *restrict L);
void strata_quantize_q4_k_search_avx2(const float *restrict x, float *restrict scales, float *restrict mins,
                                      uint8_t *restrict L);
void strata_quantize_q6_k_search_ref(const float *restrict x, float *restrict scales, int8_t *restrict L);
void strata_quantize_q6_k_search_avx2(const float *restrict x, float *restrict scales, int8_t *restrict L);

/* Q8_0: n_blocks blocks of 32 values (gguf-py's rounding, byte for byte); also the KV cache's
 * q8_0 rows (glue.c). */
void strata_quantize_q8_0_blocks(const float *restrict x, uint8_t *restrict dst, int64_t n_blocks);

#endif
