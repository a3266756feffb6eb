/* PLACEHOLDER: AVX2 kernels (to be written). */
#pragma GCC target("avx2,fma,f16c")
#include "kernels.h"
#include <immintrin.h>

void strata_dequant_f16_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_f16_ref(src, dst, n_blocks); }
void strata_dequant_bf16_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_bf16_ref(src, dst, n_blocks); }
void strata_dequant_q4_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q4_0_ref(src, dst, n_blocks); }
void strata_dequant_q8_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q8_0_ref(src, dst, n_blocks); }
void strata_dequant_q4_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q4_k_ref(src, dst, n_blocks); }
void strata_dequant_q5_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q5_k_ref(src, dst, n_blocks); }
void strata_dequant_q6_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_q6_k_ref(src, dst, n_blocks); }
void strata_dequant_mxfp4_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { strata_dequant_mxfp4_ref(src, dst, n_blocks); }
void strata_convert_f16_avx2(const float *restrict src, void *restrict dst, int64_t n) { strata_convert_f16_ref(src, dst, n); }
void strata_convert_bf16_avx2(const float *restrict src, void *restrict dst, int64_t n) { strata_convert_bf16_ref(src, dst, n); }
