/* ---- Calibrated quantization (calib.c): importance-weighted block search and GPTQ's grid ----
 *
 * Read by build.py as part of the cdef (after strata.h). Types: Q8_0, Q4_K, Q6_K.
 *
 * A block's "grid": element i of a block decodes as zero[i] + step[i] * code[i] with an integer
 * code in 0..strata_calib_code_max(type): Q8_0 step d, zero -128 d (code = q + 128); Q4_K step
 * d*sc, zero -dmin*m (code = q); Q6_K step d*sc, zero -32 d*sc (code = q + 32).
 */

/* Largest code of `ggml_type`'s grid (255, 15, 63), or -1 when the type is not supported here. */
int strata_calib_code_max(int ggml_type);

/*
 * Quantize `n_rows` rows of `row_len` float32 values (`src`) into `ggml_type` blocks in `dst`,
 * choosing each block's scales (and mins) to minimise sum_i imp[i % row_len] * (x_i - deq_i)^2.
 * `imp` holds `row_len` non-negative importances (one per column). The candidates are the
 * round-to-nearest block of strata_quantize and a weighted search; the one with the smaller
 * weighted error is kept, so the weighted error is never above round-to-nearest's.
 */
int strata_calib_quantize(int ggml_type, const float *src, int64_t src_bytes, const float *imp, int64_t imp_len,
                          void *dst, int64_t dst_bytes, int64_t n_rows, int64_t row_len, int n_threads);

/* The grid of `n_blocks` packed blocks: per element, step and zero (n_blocks * block_elems each). */
int strata_calib_grid(int ggml_type, const void *blocks, int64_t blocks_bytes, int64_t n_blocks,
                      float *step, float *zero, int64_t out_len);

/* Write integer codes (given as floats, 0..code max; rounded and clamped) into `n_blocks` blocks,
 * keeping each block's scales: the packing step of GPTQ, which chose the codes itself. */
int strata_calib_set_codes(int ggml_type, const float *codes, int64_t codes_len, void *blocks, int64_t blocks_bytes,
                           int64_t n_blocks);

/*
 * GPTQ's inner loop over one block of B columns, row by row (rows are independent):
 * for j in 0..B-1: code = clamp(round((w_j - zero_j) / step_j), 0, cmax) (0 where step_j == 0),
 * e_j = (w_j - zero_j - step_j * code) / U[j][j], w_k -= e_j * U[j][k] for k > j.
 * W [n_rows, B] with row stride ldw (updated in place), U [B, B] row-major upper factor, step and
 * zero [n_rows, B]; writes codes and e [n_rows, B]. Rows are split across n_threads.
 */
int strata_calib_gptq_block(float *W, int64_t n_rows, int64_t B, int64_t ldw, const float *U, const float *step,
                            const float *zero, int cmax, float *codes, float *err, int n_threads);
