/*
 * Strata native runtime: public C interface.
 *
 * This header is also the cffi cdef (build.py strips the preprocessor lines), so it holds only
 * declarations cffi understands: no macros with values, no inline code.
 *
 * Conventions: every entry point returns a status (STRATA_OK == 0 on success); sizes are int64_t
 * and counted in bytes unless the name says otherwise; outputs go through pointers.
 */
#ifndef STRATA_H
#define STRATA_H
#include <stdint.h>

enum strata_status {
    STRATA_OK = 0,
    STRATA_E_ARG = 1,        /* a null pointer, a negative count, an unknown enum value */
    STRATA_E_TYPE = 2,       /* ggml type this runtime cannot dequantize */
    STRATA_E_SIZE = 3,       /* a buffer too small for the rows asked for */
    STRATA_E_BLOCK = 4,      /* row length not a multiple of the type's block size */
    STRATA_E_NOMEM = 5,
    STRATA_E_THREAD = 6,     /* a worker thread could not be started */
    STRATA_E_IMPL = 7        /* the asked-for implementation is not available on this CPU */
};

/* Output element type of dequantization. */
enum strata_out {
    STRATA_OUT_F32 = 0,
    STRATA_OUT_F16 = 1,
    STRATA_OUT_BF16 = 2
};

/* Which kernel family to run. AUTO picks AVX2 when the CPU has AVX2+FMA+F16C and the
 * environment variable STRATA_FORCE_SCALAR is not set to a non-empty value other than "0". */
enum strata_impl {
    STRATA_IMPL_AUTO = 0,
    STRATA_IMPL_SCALAR = 1,
    STRATA_IMPL_AVX2 = 2
};

/* 1 when this CPU can run the AVX2 kernels (AVX2, FMA and F16C, with OS support for YMM state). */
int strata_cpu_has_avx2(void);

/* The implementation AUTO resolves to in this process (STRATA_IMPL_SCALAR or STRATA_IMPL_AVX2). */
int strata_impl_default(void);

/* 1 when `impl` has an AVX2 kernel for `ggml_type` (formats without one fall back to scalar). */
int strata_dequant_has_kernel(int ggml_type, int impl);

/* Elements and bytes of one block of `ggml_type`; STRATA_E_TYPE if not supported. */
int strata_dequant_block_size(int ggml_type, int64_t *block_elems, int64_t *block_bytes);

/*
 * Dequantize `n_rows` rows of `row_len` elements each, stored contiguously in `src` in the
 * packed form of `ggml_type`, into `dst` as `out` elements (row-major, contiguous).
 * `src_bytes` and `dst_bytes` are the sizes of the caller's buffers; the call fails with
 * STRATA_E_SIZE rather than read or write past either. Rows are split across `n_threads`
 * threads (1 runs on the calling thread).
 */
int strata_dequant(int ggml_type, const void *src, int64_t src_bytes,
                   void *dst, int64_t dst_bytes, int out,
                   int64_t n_rows, int64_t row_len, int n_threads, int impl);

/* Convert `n` float32 values to float16 / bfloat16 with round-to-nearest-even (as torch does). */
int strata_convert_f32(const float *src, void *dst, int64_t n, int out, int impl);

/* A static English description of a status code. */
const char *strata_status_string(int status);

/* ---- Quantization (quantize.c): float32 rows into packed GGML blocks ---- */

/* 1 when strata_quantize produces `ggml_type` (Q8_0, Q4_K, Q6_K). */
int strata_quantize_has_type(int ggml_type);

/*
 * Quantize `n_rows` rows of `row_len` float32 values each, stored contiguously in `src`, into the
 * packed form of `ggml_type` in `dst` (rows back to back). `src_bytes` and `dst_bytes` are the
 * sizes of the caller's buffers; the call fails with STRATA_E_SIZE rather than read or write past
 * either, and with STRATA_E_BLOCK when `row_len` is not a multiple of the type's block size.
 * Rows are split across `n_threads` threads (1 runs on the calling thread). Q8_0 output is
 * byte-identical to gguf-py's quantizer; Q4_K and Q6_K follow llama.cpp's reference search.
 * `impl` (enum strata_impl) picks the scalar or AVX2 search; both give identical bytes.
 */
int strata_quantize(int ggml_type, const float *src, int64_t src_bytes, void *dst, int64_t dst_bytes,
                    int64_t n_rows, int64_t row_len, int n_threads, int impl);

#endif
