/* PLACEHOLDER: scalar reference kernels (to be written). */
#include "kernels.h"

float strata_fp16_to_fp32(uint16_t h) { (void)h; return 0.0f; }

void strata_dequant_f32_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_f16_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_bf16_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q4_0_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q4_1_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q5_0_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q5_1_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q8_0_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q2_k_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q3_k_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q4_k_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q5_k_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_q6_k_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_dequant_mxfp4_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { (void)src; (void)dst; (void)n_blocks; }
void strata_convert_f16_ref(const float *restrict src, void *restrict dst, int64_t n) { (void)src; (void)dst; (void)n; }
void strata_convert_bf16_ref(const float *restrict src, void *restrict dst, int64_t n) { (void)src; (void)dst; (void)n; }
