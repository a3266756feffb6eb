/*
 * Internal interface between the dispatcher (dequant.c) and the kernels
 * (dequant_ref.c, dequant_iq.c: portable scalar reference of every format; dequant_avx2.c: AVX2 twins).
 *
 * Every block kernel has the same signature: it reads `n_blocks` consecutive packed blocks from
 * `src` and writes n_blocks * block_elems float32 values to `dst`. A `_avx2` kernel must give
 * bit-identical output to its `_ref` twin, and both must equal gguf.quants.dequantize, so the
 * order of float operations follows gguf-py's (no fused multiply-add where it multiplies then adds;
 * the build passes -ffp-contract=off).
 *
 * Block layouts, type ids and shared helpers: common.h.
 */
#ifndef STRATA_KERNELS_H
#define STRATA_KERNELS_H
#include "common.h"

typedef void (*strata_block_fn)(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks);
typedef void (*strata_convert_fn)(const float *restrict src, void *restrict dst, int64_t n);

/* Run fn(ctx, first_row, n_rows) over rows [0, n_rows) split across up to n_threads threads
 * (parallel.c). */
typedef void (*strata_rows_fn)(void *ctx, int64_t first_row, int64_t n_rows);
void strata_parallel_rows(int64_t n_rows, int n_threads, strata_rows_fn fn, void *ctx);

/* Resolve STRATA_IMPL_AUTO and check the asked-for implementation runs on this CPU (dequant.c). */
int strata_resolve_impl(int impl, int *resolved);

#define STRATA_DECLARE_REF(name) \
    void strata_dequant_##name##_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks);
#define STRATA_DECLARE_AVX2(name) \
    void strata_dequant_##name##_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks);

/* A scalar kernel from its one-block function `block_<name>(const strata_block_<name> *, float *)`
 * (dequant_ref.c, dequant_iq.c): `elems` values a block. */
#define STRATA_DEFINE_REF(name, elems)                                                               \
    void strata_dequant_##name##_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks) { \
        const strata_block_##name *b = (const strata_block_##name *)src;                            \
        for (int64_t i = 0; i < n_blocks; i++) block_##name(b + i, dst + i * (elems));              \
    }

STRATA_DECLARE_REF(f32)
STRATA_DECLARE_REF(f16)
STRATA_DECLARE_REF(bf16)
STRATA_DECLARE_REF(q4_0)
STRATA_DECLARE_REF(q4_1)
STRATA_DECLARE_REF(q5_0)
STRATA_DECLARE_REF(q5_1)
STRATA_DECLARE_REF(q8_0)
STRATA_DECLARE_REF(q2_k)
STRATA_DECLARE_REF(q3_k)
STRATA_DECLARE_REF(q4_k)
STRATA_DECLARE_REF(q5_k)
STRATA_DECLARE_REF(q6_k)
STRATA_DECLARE_REF(mxfp4)
/* dequant_iq.c: i-quants, ternary formats, NVFP4 (scalar only for now) */
STRATA_DECLARE_REF(iq2_xxs)
STRATA_DECLARE_REF(iq2_xs)
STRATA_DECLARE_REF(iq2_s)
STRATA_DECLARE_REF(iq3_xxs)
STRATA_DECLARE_REF(iq3_s)
STRATA_DECLARE_REF(iq1_s)
STRATA_DECLARE_REF(iq1_m)
STRATA_DECLARE_REF(iq4_nl)
STRATA_DECLARE_REF(iq4_xs)
STRATA_DECLARE_REF(tq1_0)
STRATA_DECLARE_REF(tq2_0)
STRATA_DECLARE_REF(nvfp4)

STRATA_DECLARE_AVX2(f16)
STRATA_DECLARE_AVX2(bf16)
STRATA_DECLARE_AVX2(q4_0)
STRATA_DECLARE_AVX2(q8_0)
STRATA_DECLARE_AVX2(q4_k)
STRATA_DECLARE_AVX2(q5_k)
STRATA_DECLARE_AVX2(q6_k)
STRATA_DECLARE_AVX2(mxfp4)

/* float32 -> float16 / bfloat16, round to nearest even, NaN kept NaN (torch's conversions). */
void strata_convert_f16_ref(const float *restrict src, void *restrict dst, int64_t n);
void strata_convert_bf16_ref(const float *restrict src, void *restrict dst, int64_t n);
void strata_convert_f16_avx2(const float *restrict src, void *restrict dst, int64_t n);
void strata_convert_bf16_avx2(const float *restrict src, void *restrict dst, int64_t n);

#endif
