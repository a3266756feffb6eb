/*
 * Internal interface between the dispatcher (dequant.c) and the kernels
 * (dequant_ref.c: portable scalar reference of every format; dequant_avx2.c: AVX2 twins).
 *
 * Every block kernel has the same signature: it reads `n_blocks` consecutive packed blocks from
 * `src` and writes n_blocks * block_elems float32 values to `dst`. A `_avx2` kernel must give
 * bit-identical output to its `_ref` twin, and both must equal gguf.quants.dequantize, so the
 * order of float operations follows gguf-py's (no fused multiply-add where it multiplies then adds;
 * the build passes -ffp-contract=off).
 *
 * Block layouts (ggml's; little-endian; `half` is IEEE binary16 stored as uint16_t):
 *   Q4_0  32 elems, 18 B: half d; u8 qs[16]            x = d * ((q & 15) - 8), low nibbles first
 *   Q4_1  32 elems, 20 B: half d, m; u8 qs[16]         x = d * q + m
 *   Q5_0  32 elems, 22 B: half d; u8 qh[4]; u8 qs[16]  x = d * (q5 - 16)
 *   Q5_1  32 elems, 24 B: half d, m; u8 qh[4]; qs[16]  x = d * q5 + m
 *   Q8_0  32 elems, 34 B: half d; i8 qs[32]            x = d * q
 *   Q2_K 256 elems, 84 B: u8 scales[16]; u8 qs[64]; half d, dmin
 *   Q3_K 256 elems,110 B: u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d
 *   Q4_K 256 elems,144 B: half d, dmin; u8 scales[12]; u8 qs[128]
 *   Q5_K 256 elems,176 B: half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *   Q6_K 256 elems,210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d
 *   MXFP4 32 elems, 17 B: u8 e (E8M0 shared exponent); u8 qs[16] (E2M1 codes, low nibbles first)
 */
#ifndef STRATA_KERNELS_H
#define STRATA_KERNELS_H
#include <stdint.h>
#include <string.h>

#define STRATA_QK 32
#define STRATA_QK_K 256
#define STRATA_K_SCALE_SIZE 12

/* Packed: blocks sit at any byte offset of the caller's buffer (Q8_0 is 34 bytes, MXFP4 17). */
#define STRATA_PACKED __attribute__((packed))

typedef struct STRATA_PACKED { uint16_t d; uint8_t qs[16]; } strata_block_q4_0;
typedef struct STRATA_PACKED { uint16_t d, m; uint8_t qs[16]; } strata_block_q4_1;
typedef struct STRATA_PACKED { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } strata_block_q5_0;
typedef struct STRATA_PACKED { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } strata_block_q5_1;
typedef struct STRATA_PACKED { uint16_t d; int8_t qs[32]; } strata_block_q8_0;
typedef struct STRATA_PACKED { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } strata_block_q2_k;
typedef struct STRATA_PACKED { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } strata_block_q3_k;
typedef struct STRATA_PACKED { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } strata_block_q4_k;
typedef struct STRATA_PACKED { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } strata_block_q5_k;
typedef struct STRATA_PACKED { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } strata_block_q6_k;
typedef struct STRATA_PACKED { uint8_t e; uint8_t qs[16]; } strata_block_mxfp4;

_Static_assert(sizeof(strata_block_q4_0) == 18, "Q4_0 block size");
_Static_assert(sizeof(strata_block_q4_1) == 20, "Q4_1 block size");
_Static_assert(sizeof(strata_block_q5_0) == 22, "Q5_0 block size");
_Static_assert(sizeof(strata_block_q5_1) == 24, "Q5_1 block size");
_Static_assert(sizeof(strata_block_q8_0) == 34, "Q8_0 block size");
_Static_assert(sizeof(strata_block_q2_k) == 84, "Q2_K block size");
_Static_assert(sizeof(strata_block_q3_k) == 110, "Q3_K block size");
_Static_assert(sizeof(strata_block_q4_k) == 144, "Q4_K block size");
_Static_assert(sizeof(strata_block_q5_k) == 176, "Q5_K block size");
_Static_assert(sizeof(strata_block_q6_k) == 210, "Q6_K block size");
_Static_assert(sizeof(strata_block_mxfp4) == 17, "MXFP4 block size");

/* ggml type ids (gguf.GGMLQuantizationType). */
enum {
    STRATA_T_F32 = 0, STRATA_T_F16 = 1, STRATA_T_Q4_0 = 2, STRATA_T_Q4_1 = 3,
    STRATA_T_Q5_0 = 6, STRATA_T_Q5_1 = 7, STRATA_T_Q8_0 = 8,
    STRATA_T_Q2_K = 10, STRATA_T_Q3_K = 11, STRATA_T_Q4_K = 12, STRATA_T_Q5_K = 13,
    STRATA_T_Q6_K = 14, STRATA_T_BF16 = 30, STRATA_T_MXFP4 = 39
};

typedef void (*strata_block_fn)(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks);
typedef void (*strata_convert_fn)(const float *restrict src, void *restrict dst, int64_t n);

/* Run fn(ctx, first_row, n_rows) over rows [0, n_rows) split across up to n_threads threads
 * (parallel.c). */
typedef void (*strata_rows_fn)(void *ctx, int64_t first_row, int64_t n_rows);
void strata_parallel_rows(int64_t n_rows, int n_threads, strata_rows_fn fn, void *ctx);

/* Resolve STRATA_IMPL_AUTO and check the asked-for implementation runs on this CPU (dequant.c). */
int strata_resolve_impl(int impl, int *resolved);

/* Exact binary16 -> binary32 (all values, subnormals, inf and NaN). */
float strata_fp16_to_fp32(uint16_t h);

#define STRATA_DECLARE_FORMAT(name) \
    void strata_dequant_##name##_ref(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks); \
    void strata_dequant_##name##_avx2(const uint8_t *restrict src, float *restrict dst, int64_t n_blocks);

STRATA_DECLARE_FORMAT(f32)
STRATA_DECLARE_FORMAT(f16)
STRATA_DECLARE_FORMAT(bf16)
STRATA_DECLARE_FORMAT(q4_0)
STRATA_DECLARE_FORMAT(q4_1)
STRATA_DECLARE_FORMAT(q5_0)
STRATA_DECLARE_FORMAT(q5_1)
STRATA_DECLARE_FORMAT(q8_0)
STRATA_DECLARE_FORMAT(q2_k)
STRATA_DECLARE_FORMAT(q3_k)
STRATA_DECLARE_FORMAT(q4_k)
STRATA_DECLARE_FORMAT(q5_k)
STRATA_DECLARE_FORMAT(q6_k)
STRATA_DECLARE_FORMAT(mxfp4)

/* float32 -> float16 / bfloat16, round to nearest even, NaN kept NaN (torch's conversions). */
void strata_convert_f16_ref(const float *restrict src, void *restrict dst, int64_t n);
void strata_convert_bf16_ref(const float *restrict src, void *restrict dst, int64_t n);
void strata_convert_f16_avx2(const float *restrict src, void *restrict dst, int64_t n);
void strata_convert_bf16_avx2(const float *restrict src, void *restrict dst, int64_t n);

#endif
