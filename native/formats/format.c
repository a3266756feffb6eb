/*
 * The format table: block sizes of every GGML type the runtime reads, in one place. The
 * dequantizer, the quantizer and the matrix kernels look sizes up here; each keeps only its own
 * kernel pointers beside the type id.
 */
#include "common.h"

#include <stddef.h>

static const strata_format_info FORMATS[] = {
    {STRATA_T_F32, 1, 4},
    {STRATA_T_F16, 1, 2},
    {STRATA_T_BF16, 1, 2},
    {STRATA_T_Q4_0, STRATA_QK, sizeof(strata_block_q4_0)},
    {STRATA_T_Q4_1, STRATA_QK, sizeof(strata_block_q4_1)},
    {STRATA_T_Q5_0, STRATA_QK, sizeof(strata_block_q5_0)},
    {STRATA_T_Q5_1, STRATA_QK, sizeof(strata_block_q5_1)},
    {STRATA_T_Q8_0, STRATA_QK, sizeof(strata_block_q8_0)},
    {STRATA_T_Q2_K, STRATA_QK_K, sizeof(strata_block_q2_k)},
    {STRATA_T_Q3_K, STRATA_QK_K, sizeof(strata_block_q3_k)},
    {STRATA_T_Q4_K, STRATA_QK_K, sizeof(strata_block_q4_k)},
    {STRATA_T_Q5_K, STRATA_QK_K, sizeof(strata_block_q5_k)},
    {STRATA_T_Q6_K, STRATA_QK_K, sizeof(strata_block_q6_k)},
    {STRATA_T_MXFP4, STRATA_QK, sizeof(strata_block_mxfp4)},
    {STRATA_T_IQ2_XXS, STRATA_QK_K, sizeof(strata_block_iq2_xxs)},
    {STRATA_T_IQ2_XS, STRATA_QK_K, sizeof(strata_block_iq2_xs)},
    {STRATA_T_IQ2_S, STRATA_QK_K, sizeof(strata_block_iq2_s)},
    {STRATA_T_IQ3_XXS, STRATA_QK_K, sizeof(strata_block_iq3_xxs)},
    {STRATA_T_IQ3_S, STRATA_QK_K, sizeof(strata_block_iq3_s)},
    {STRATA_T_IQ1_S, STRATA_QK_K, sizeof(strata_block_iq1_s)},
    {STRATA_T_IQ1_M, STRATA_QK_K, sizeof(strata_block_iq1_m)},
    {STRATA_T_IQ4_NL, STRATA_QK, sizeof(strata_block_iq4_nl)},
    {STRATA_T_IQ4_XS, STRATA_QK_K, sizeof(strata_block_iq4_xs)},
    {STRATA_T_TQ1_0, STRATA_QK_K, sizeof(strata_block_tq1_0)},
    {STRATA_T_TQ2_0, STRATA_QK_K, sizeof(strata_block_tq2_0)},
    {STRATA_T_NVFP4, STRATA_QK_NVFP4, sizeof(strata_block_nvfp4)},
};

const strata_format_info *strata_format_find(int type) {
    for (size_t i = 0; i < sizeof(FORMATS) / sizeof(FORMATS[0]); i++)
        if (FORMATS[i].type == type) return &FORMATS[i];
    return NULL;
}
