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

/* Which kernel family to run. AUTO picks the widest family the CPU runs: AVX512, else AVX2, else
 * SCALAR. STRATA_KERNEL=scalar makes AUTO pick SCALAR, STRATA_KERNEL=avx2 makes it stop at AVX2
 * (strata_kernel_cap; native/kernels/cpu.c reads the variable once per process). Dequantization and
 * quantization have no AVX-512 kernels: asked for AVX512, they run their AVX2 kernels. */
enum strata_impl {
    STRATA_IMPL_AUTO = 0,
    STRATA_IMPL_SCALAR = 1,
    STRATA_IMPL_AVX2 = 2,
    STRATA_IMPL_AVX512 = 3
};

/* 1 when this CPU can run the AVX2 kernels (AVX2, FMA and F16C, with OS support for YMM state). */
int strata_cpu_has_avx2(void);

/* 1 when this CPU can run the AVX-512 kernels: the AVX2 set plus AVX-512 F, BW, VL and VNNI, with
 * OS support for the opmask and ZMM state. */
int strata_cpu_has_avx512(void);

/* 1 when this CPU also has AVX-512 VBMI and GFNI (needed with strata_cpu_fast_gathers by the grid
 * i-quants' AVX-512 decode tiles, native/kernels/avx512/qdot_iq_vbmi.c). */
int strata_cpu_has_avx512_vbmi(void);

/* 1 when this CPU's gathers run at the load ports' rate (the kernel reports it not affected by Gather
 * Data Sampling, and it does not split 512-bit operations): the grid i-quants' AVX-512 decode tiles
 * gather their grid rows (native/kernels/avx512/qdot_iq_vbmi.c). */
int strata_cpu_fast_gathers(void);

/* 1 when the grid i-quants' AVX2 kernels fetch IQ2_S's, IQ3_XXS's, IQ3_S's, IQ1_S's and IQ1_M's grid
 * rows by ymm gathers: an Intel CPU not affected by Gather Data Sampling (benchmarks/RESULTS.md, "Kernel
 * choice per CPU"). STRATA_KERNEL's +ymm_gathers/-ymm_gathers override the choice, not this detection. */
int strata_cpu_fast_ymm_gathers(void);

/* 1 when this CPU has AVX-VNNI (VEX-encoded VPDPBUSD on ymm) beside AVX2: the AVX2 kernel table then
 * decodes TQ1_0 with its tile (native/kernels/avx2/qdot_tq1_avxvnni.c) and runs the grid i-quants'
 * tiles built with it (qdot_iq_avxvnni.c), unless STRATA_KERNEL says -avx_vnni. */
int strata_cpu_avx_vnni(void);

/* 1 when this CPU executes 512-bit operations as two 256-bit halves (AMD family 19h, Zen 4): the
 * kernel table then prefers some AVX2 tiles for prefill and decode there (native/kernels/qdot.c). */
int strata_cpu_splits_512(void);

/* The implementation AUTO resolves to in this process (STRATA_IMPL_SCALAR, _AVX2 or _AVX512). */
int strata_impl_default(void);

/* 1 when `impl` has a vector kernel for `ggml_type` (formats without one fall back to scalar);
 * AVX512 answers as AVX2, whose dequantization kernels it runs. */
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

/* 1 when strata_quantize produces `ggml_type` (Q8_0, Q2_K, Q4_K, Q6_K). */
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

/* ---- Quantized matrix kernels, test entry points (qdot.c) ----
 *
 * y[T, N] = x[T, K] @ W[N, K]^T computed straight from W's packed GGML blocks, single-threaded:
 * each x row is first rounded to 8-bit activation blocks (32 values for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/
 * MXFP4, 256 for Q2_K..Q6_K; d = max|x| / 127, q = round-to-nearest-even(x / d)), then every weight
 * block is multiplied with its activation block in integer arithmetic and scaled once. F32, F16
 * and BF16 weights are multiplied with the float32 rows as they are. These entry points exist for
 * tests and measurements; the engine uses the pooled strata_matmul.
 */

/* A CPU as the kernel choice sees it: vendor (0 other, 1 Intel, 2 AMD), family (base plus extended:
 * 6 for Intel's cores, 0x19 for Zen 3 and 4, 0x1A for Zen 5), features (bits in the order of
 * strata/quant_table.py CPU_FEATURES), and the tile kinds STRATA_KERNEL asks for (prefer: +kind)
 * and rules out (exclude: -kind), bits in the order of its TILE_KINDS. */
typedef struct {
    int vendor;
    int family;
    uint32_t features;
    uint32_t prefer, exclude;
} strata_cpu_desc;

/* This process's CPU description: detected once, with STRATA_KERNEL applied (native/kernels/cpu.c);
 * STRATA_E_ARG (with the description filled in) when STRATA_KERNEL holds a word it does not know. */
int strata_cpu_describe(strata_cpu_desc *out);

/* The widest family STRATA_KERNEL lets AUTO resolve to (STRATA_IMPL_SCALAR, _AVX2, _AVX512), or 0
 * where it names none. */
int strata_kernel_cap(void);

/* The tile kind (an index of TILE_KINDS) a call of family `impl` (AUTO resolved in this process)
 * runs for `ggml_type` and `n_tokens` tokens (fewer than 4: decode) on CPU `cpu` (NULL: this one),
 * by the table of quant types; -1 for a type without tiles or a family `cpu` cannot run. */
int strata_qdot_select(int ggml_type, int impl, const strata_cpu_desc *cpu, int64_t n_tokens);

/* strata_qdot_rows with one tile named by its kind instead of the table's choice, whatever the
 * phase: STRATA_E_TYPE when the table names no such tile for the type, STRATA_E_IMPL when this CPU
 * cannot run it. For tests that hold every tile to its scalar twin. */
int strata_qdot_tile_rows(int ggml_type, int kind, const void *w, int64_t w_bytes, int64_t n_rows, int64_t row_len,
                          const float *x, int64_t x_bytes, int64_t n_tokens, float *y, int64_t y_bytes,
                          void *scratch, int64_t scratch_bytes);

/* Bytes of scratch strata_qdot_rows needs for `n_tokens` rows of `row_len` (0 for F32/F16/BF16). */
int strata_qdot_scratch_bytes(int ggml_type, int64_t n_tokens, int64_t row_len, int64_t *bytes);

/*
 * y (n_tokens x n_rows float32, row-major) = x (n_tokens x row_len float32) times the transpose of
 * w (n_rows rows of row_len elements in the packed form of ggml_type, back to back). Every buffer
 * is given with its size in bytes and is checked: STRATA_E_SIZE rather than a read or write past
 * one; STRATA_E_BLOCK when row_len is not a multiple of the block size; STRATA_E_ARG for a negative
 * count, a NULL buffer that must hold bytes, or x, y, scratch not 4-byte aligned. `scratch` holds
 * the rounded activations (strata_qdot_scratch_bytes). x must be finite.
 */
int strata_qdot_rows(int ggml_type, const void *w, int64_t w_bytes, int64_t n_rows, int64_t row_len,
                     const float *x, int64_t x_bytes, int64_t n_tokens, float *y, int64_t y_bytes,
                     void *scratch, int64_t scratch_bytes, int impl);

/* The rounded activation rows strata_qdot_rows computes for ggml_type (n_tokens rows of
 * strata_qdot_scratch_bytes / n_tokens bytes each; a plain copy of x for F32/F16/BF16 weights),
 * written to `act`. For tests of the activation quantizers. */
int strata_qdot_quantize_act(int ggml_type, const float *x, int64_t x_bytes, int64_t n_tokens, int64_t row_len,
                             void *act, int64_t act_bytes, int impl);

/* ---- Pager (pager.c): asynchronous reads of file ranges into caller buffers ----
 *
 * A pager opens one file (or the parts of a split model, as one address space: part i's byte 0 at
 * offset bases[i]) read-only and runs a pool of worker threads that serve read requests:
 * submit returns a ticket at once, wait (or poll) collects it. A request is split into chunks of
 * `chunk_bytes`, claimed by the workers in turn, so one large slab keeps several reads in flight.
 * Reads use pread on an O_DIRECT descriptor when the file system allows it (probed at open) and
 * the destination is aligned: the enclosing aligned range is read into dst and the result's
 * `data_offset` says where the first requested byte landed. Other reads use buffered pread, or a
 * copy from a read-only mapping (STRATA_PAGER_FALLBACK_MMAP). Every range is checked against the
 * part it lies in (a range crossing into the gap after a part or into another part is refused)
 * and the destination size at submit.
 *
 * Lifetime: the caller keeps dst alive until the request is collected or the pager is closed.
 * strata_pager_close cancels queued chunks, finishes those being read and joins the workers;
 * afterwards every call but get_info/get_stats/free returns STRATA_E_CLOSED. strata_pager_free
 * closes if needed and releases the pager; no other call may run on it then.
 */

/* Status codes of the pager; strata_pager_status_string describes these and every strata_status. */
enum strata_pager_status {
    STRATA_E_IO = 16,        /* a read failed or the file ended early: the result has the errno */
    STRATA_E_CLOSED = 17,    /* the pager is closed, or was closed before the request finished */
    STRATA_E_TICKET = 18,    /* not a pending ticket of this pager (unknown or already collected) */
    STRATA_E_TIMEOUT = 19,   /* the request is still in flight when the wait's timeout expired */
    STRATA_E_BUSY = 20,      /* every request slot holds an uncollected request */
    STRATA_E_OPEN = 21,      /* the file cannot be opened or examined: errno in *os_errno */
    STRATA_E_DIRECT = 22     /* O_DIRECT was required but this file system refuses it */
};

enum strata_pager_flags {
    STRATA_PAGER_DIRECT_OFF = 1,       /* never use O_DIRECT */
    STRATA_PAGER_DIRECT_REQUIRED = 2,  /* fail at open with STRATA_E_DIRECT if O_DIRECT is refused */
    STRATA_PAGER_FALLBACK_MMAP = 4     /* non-direct reads copy from a read-only mapping, not pread */
};

typedef struct strata_pager strata_pager;

typedef struct {
    int64_t file_size;      /* one file: its size; parts: the last part's base + size */
    int64_t align;          /* O_DIRECT alignment of offsets, lengths and buffers; 0 when not direct */
    int64_t chunk_bytes;    /* largest single read (a multiple of align when direct) */
    int32_t n_threads;
    int32_t direct;         /* 1 when aligned requests are read with O_DIRECT */
    int32_t mmap;           /* 1 when non-direct reads copy from a mapping */
    int32_t max_requests;   /* uncollected requests the pager holds at most */
    int32_t n_parts;        /* files opened: 1, or the parts of a split model */
} strata_pager_info;

typedef struct {
    int64_t base;           /* offset of the part's byte 0 */
    int64_t size;           /* its file size at open */
    int32_t direct;         /* 1 when its aligned requests are read with O_DIRECT */
} strata_pager_part;

typedef struct {
    int64_t data_offset;    /* byte of dst where the first requested byte landed */
    int64_t nbytes;         /* bytes requested */
    int64_t error_offset;   /* STRATA_E_IO: file offset where the failing read started */
    int32_t os_errno;       /* STRATA_E_IO: errno of the failing read; 0 when the file ended early */
    int32_t direct;         /* 1 when the request was read with O_DIRECT */
} strata_pager_result;

typedef struct {
    int64_t submitted;      /* requests accepted by submit */
    int64_t completed;      /* requests finished (read, failed or cancelled) */
    int64_t failed;         /* finished with an I/O error */
    int64_t direct;         /* finished requests read with O_DIRECT */
    int64_t chunks;         /* reads issued (one per chunk) */
    int64_t bytes_requested;/* payload bytes of finished requests */
    int64_t bytes_read;     /* bytes read from the file, alignment slack included */
    int64_t read_ns;        /* time workers spent inside reads, summed over workers */
    int64_t busy_ns;        /* wall time with at least one request in flight */
    int64_t in_flight;      /* requests submitted and not yet finished */
} strata_pager_stats;

/* Open `path` read-only with `n_threads` workers (1..256) and reads of at most `chunk_bytes`
 * (0: 1 MiB; rounded up to the O_DIRECT alignment). On STRATA_E_OPEN, *os_errno says why. */
int strata_pager_open(const char *path, int n_threads, int64_t chunk_bytes, int flags,
                      strata_pager **pager, int *os_errno);

/* Open `n_parts` files (1..65535) as one address space: paths[i] at offset bases[i], bases
 * ascending, each part ending at or before the next one's base (else STRATA_E_ARG). Bases that are
 * multiples of 1 MiB keep O_DIRECT usable in every part. On failure *bad_part names the part
 * (-1: none in particular); on STRATA_E_OPEN *os_errno says why. */
int strata_pager_open_parts(const char *const *paths, const int64_t *bases, int32_t n_parts, int n_threads,
                            int64_t chunk_bytes, int flags, strata_pager **pager, int *os_errno, int32_t *bad_part);

int strata_pager_get_info(strata_pager *pager, strata_pager_info *info);

/* Base, size and read mode of part `index` (0..n_parts-1). */
int strata_pager_get_part(strata_pager *pager, int32_t index, strata_pager_part *part);

/* Queue a read of file bytes [file_offset, file_offset + nbytes) into `dst` (dst_bytes long);
 * returns at once with *ticket (> 0). STRATA_E_SIZE when the range passes the end of the part it
 * starts in (or lies in no part) or dst cannot hold nbytes; STRATA_E_BUSY when max_requests are uncollected. */
int strata_pager_submit(strata_pager *pager, int64_t file_offset, int64_t nbytes,
                        void *dst, int64_t dst_bytes, int64_t *ticket);

/* *done = 1 when the request has finished (collect it with wait); the ticket stays valid. */
int strata_pager_poll(strata_pager *pager, int64_t ticket, int *done);

/* Wait up to `timeout_ns` (< 0: forever) for the request, then collect it: fills *result and
 * returns its status (STRATA_OK, STRATA_E_IO, STRATA_E_CLOSED); the ticket is then spent.
 * STRATA_E_TIMEOUT leaves the request pending. */
int strata_pager_wait(strata_pager *pager, int64_t ticket, int64_t timeout_ns, strata_pager_result *result);

int strata_pager_get_stats(strata_pager *pager, strata_pager_stats *stats);

/* Run the workers on the CPUs of NUMA node `node` (best effort); a no-op on one node. */
int strata_pager_bind_node(strata_pager *pager, int node);

int strata_pager_close(strata_pager *pager);
void strata_pager_free(strata_pager *pager);

/* A static English description of a pager status or any strata_status. */
const char *strata_pager_status_string(int status);

/* NUMA nodes of this machine (1 where /sys reports none), and the node holding the page at addr. */
int strata_numa_count_nodes(int *n_nodes);
int strata_numa_locate(const void *addr, int *node);

/* ---- Guard (guard.c): reads of a mapped file cut short under a running model ----
 *
 * A page of a file mapping past the file's end raises SIGBUS when touched, which would kill the
 * process. A range added here is guarded: such a fault inside it maps anonymous zero pages from
 * the faulting page to the range's end, counts one fault for the range and lets the faulting
 * thread (any thread, C or Python) go on reading zeros; the caller checks the count after its
 * work and refuses the results. Faults outside every range go to the SIGBUS handler installed
 * before the guard's (the default: the process dies of it). The handler is installed by the first
 * add, and again by a later add if another one has replaced it. Ranges: read-only mappings, the
 * base a page boundary; remove a range before unmapping it. At most 4096 ranges at once.
 */

/* Guard [base, base + nbytes) (a whole read-only mapping); *id names it to faults and remove.
 * STRATA_E_NOMEM when 4096 ranges are guarded already. */
int strata_guard_add(const void *base, int64_t nbytes, int32_t *id);

/* Stop guarding range `id` (before unmapping it). */
int strata_guard_remove(int32_t id);

/* Faults the guard turned into zero pages in range `id` since it was added, and the offset from
 * its base where those pages start (its nbytes when none): from there on it reads zeros, even if
 * the file grows back. */
int strata_guard_faults(int32_t id, int64_t *faults, int64_t *zeroed_from);

/* ---- Compute pool and packed-weight matrix products (pool.c, matmul.c) ----
 *
 * A compute pool is a set of persistent worker threads; the thread that calls a compute function
 * takes part as thread 0. Workers spin briefly after a job, then sleep, so an idle pool uses no
 * CPU. One job runs at a time per pool: concurrent calls on one pool serialize. Results never
 * depend on the thread count (work is split into fixed row blocks; sums run in a fixed order).
 * Every compute function accepts pool NULL (the calling thread only).
 */

typedef struct strata_pool strata_pool;

/* A pool of `n_threads` threads in all (1..256; n_threads - 1 workers are started). */
int strata_pool_create(int n_threads, strata_pool **pool);
int strata_pool_threads(strata_pool *pool);
/* Join the workers and release the pool; no call may be running on it. NULL is a no-op. */
void strata_pool_free(strata_pool *pool);

/* Scratch bytes strata_matmul needs for `n_tokens` activation rows of `row_len` values
 * (0 for F32/F16/BF16 weights, which read the float rows directly). */
int strata_matmul_scratch_bytes(int ggml_type, int64_t n_tokens, int64_t row_len, int64_t *bytes);

/*
 * y[T, N] = x[T, K] @ W[N, K]^T with W (`n_rows` = N rows of `row_len` = K values) packed in
 * `ggml_type` at `w`, x and y float32 row-major. The T activation rows are first rounded into the
 * weight format's 8-bit activation blocks (in `scratch`), then output rows are split across the
 * pool's threads. K must be a multiple of the type's block size. `impl`: enum strata_impl.
 */
int strata_matmul(strata_pool *pool, int ggml_type, const void *w, int64_t w_bytes, int64_t n_rows,
                  int64_t row_len, const float *x, int64_t x_bytes, int64_t n_tokens, float *y,
                  int64_t y_bytes, void *scratch, int64_t scratch_bytes, int impl);

/*
 * One product per head: for h < n_heads and t < n_tokens, the n_rows floats at
 * y + t * y_tok + h * y_head = W_h @ (the row_len floats at x + t * x_tok + h * x_head), where W_h is
 * rows [h n_rows, (h + 1) n_rows) of w (packed in `ggml_type`). Every head in one pool job; each
 * head's products are strata_matmul's on its rows, bit for bit. x_bytes and y_bytes bound the
 * strided rows; scratch: strata_matmul_heads_scratch_bytes (the rounded rows of every head).
 */
int strata_matmul_heads(strata_pool *pool, int ggml_type, const void *w, int64_t w_bytes, int64_t n_heads,
                        int64_t n_rows, int64_t row_len, const float *x, int64_t x_bytes, int64_t x_tok,
                        int64_t x_head, int64_t n_tokens, float *y, int64_t y_bytes, int64_t y_tok, int64_t y_head,
                        void *scratch, int64_t scratch_bytes, int impl);
int strata_matmul_heads_scratch_bytes(int ggml_type, int64_t n_heads, int64_t n_tokens, int64_t row_len,
                                      int64_t *bytes);

/* One expert matrix family: expert e's matrix starts at base + e * stride and must end inside
 * [base, base + bytes). Serves a packed slot pool (stride = slot bytes) and a 3-D expert tensor of
 * a mapped file (stride = one expert's slab bytes). `type` is its ggml type. */
typedef struct {
    const uint8_t *base;
    int64_t bytes;
    int64_t stride;
    int32_t type;
} strata_moe_part;

/* Scratch bytes strata_moe_swiglu needs for up to `n_tokens` tokens and `n_assign` assignments. */
int strata_moe_scratch_bytes(int gate_type, int up_type, int down_type, int64_t n_tokens, int64_t n_assign,
                             int64_t n_embd, int64_t n_ff, int64_t *bytes);

/*
 * A SwiGLU MoE layer in one call: for each of the `n_experts` experts of this call (e =
 * expert_index[j]; gate and up are [n_ff, n_embd], down is [n_embd, n_ff]) and each of its
 * assignments a in [assign_offsets[j], assign_offsets[j + 1]) (token token_ids[a], router weight
 * weights[a]):
 *     out[token, :] += weights[a] * down_e @ (silu(gate_e @ x[token]) * (up_e @ x[token]))
 * x is [n_tokens, n_embd] float32, out likewise; assign_offsets has n_experts + 1 entries,
 * non-decreasing, within [0, n_assign]. The terms are added into out one by one in ascending
 * assignment order, whatever the thread count, so calls over consecutive chunks of experts give
 * the bytes of one call over all of them. Each token is rounded to activation blocks once per call.
 * Every expert index is checked against its part's region, every token id against n_tokens.
 */
int strata_moe_swiglu(strata_pool *pool, const float *x, int64_t x_bytes, int64_t n_tokens, int64_t n_embd,
                      int64_t n_ff, const strata_moe_part *gate, const strata_moe_part *up,
                      const strata_moe_part *down, int64_t n_experts, const int32_t *expert_index,
                      const int64_t *assign_offsets, const int32_t *token_ids, const float *weights,
                      int64_t n_assign, float *out, int64_t out_bytes, void *scratch, int64_t scratch_bytes,
                      int impl);

/*
 * An expert function other than plain SwiGLU for strata_moe_glu. clamped: gpt-oss's clamped
 * SwiGLU with per-expert biases. For expert j of the call, with id = expert_ids[j] (its row of the
 * bias tables):
 *     g = min(gate_e @ x + b_gate[id], limit),  u = clamp(up_e @ x + b_up[id], -limit, limit)
 *     y = down_e @ ((u + 1) * g * sigmoid(alpha * g)) + b_down[id]
 * A NULL bias table adds nothing. b_gate and b_up are [n_ids, n_ff], b_down [n_ids, n_embd].
 * Not clamped: SwiGLU (the biases, if any, added as above). input_scaled (Llama 4): the router's
 * weight of each assignment multiplies the expert's input, x[token] * weights[a] (rounded to float,
 * then to activation blocks per assignment), and the expert's output is added with weight 1.
 */
typedef struct {
    const float *b_gate, *b_up, *b_down;
    int64_t n_ids;
    const int32_t *expert_ids;
    float alpha, limit;
    int32_t clamped, input_scaled;
} strata_moe_act;

/*
 * strata_moe_swiglu with the expert function `act` (NULL: plain SwiGLU, the same bytes), into out
 * (rows NULL), or without the sum (out NULL): each computed assignment's unweighted vector (its
 * weight applied where `act` scales the input) goes to rows[a, :] (rows is [n_assign, n_embd]
 * float32) and out is not touched. An expert index below 0 skips that expert (its rows are left as
 * they were), so the experts of a call can be computed in two calls: those in memory first, the
 * others once they have been read; strata_moe_reduce then adds the rows into out in ascending
 * assignment order, the same bytes as one call. Every id of an expert that owns assignments is
 * checked against n_ids.
 */
int strata_moe_glu(strata_pool *pool, const float *x, int64_t x_bytes, int64_t n_tokens, int64_t n_embd,
                   int64_t n_ff, const strata_moe_part *gate, const strata_moe_part *up,
                   const strata_moe_part *down, int64_t n_experts, const int32_t *expert_index,
                   const int64_t *assign_offsets, const int32_t *token_ids, const float *weights,
                   int64_t n_assign, const strata_moe_act *act, float *out, int64_t out_bytes, float *rows,
                   int64_t rows_bytes, void *scratch, int64_t scratch_bytes, int impl);

/* out[token_ids[a], :] += weights[a] * rows[a, :] for a in [a_first, a_first + n_used), in that
 * order (rows [n_assign, n_embd], out [n_tokens, n_embd], float32). NULL weights: each weight 1
 * (input-scaled experts' rows). */
int strata_moe_reduce(const float *rows, int64_t rows_bytes, const int32_t *token_ids, const float *weights,
                      int64_t a_first, int64_t n_used, int64_t n_assign, int64_t n_tokens, int64_t n_embd,
                      float *out, int64_t out_bytes);

/* ==== Decoder glue (glue.c): the float32 steps between the matrix products of a decode step ====
 *
 * RMSNorm, RoPE, KV-cache writes, decode attention, the router's top-k and the grouping of
 * (token, expert) assignments, each one call on the calling thread. Strides and lengths count
 * float (or index) elements, not bytes; a "stride" is the distance between consecutive tokens'
 * rows, so a column slice of a wider matrix (q, k, v split from one product) is passed as is.
 * Every dimension, stride and index is checked before the first write: STRATA_E_ARG for a NULL
 * pointer, a negative count or a bad enum value, STRATA_E_SIZE for a stride narrower than its
 * row or an index (slot, position, expert id) out of range.
 */

/* out[t, g*n + i] = weight[i] * (x[t, g*n + i] * r), r = 1/sqrt(mean_i x[t, g*n + i]^2 + eps), for
 * n_groups groups of n features per token (1 group: a full-width norm; H groups of hd: Qwen3's
 * per-head q/k norm). The mean is summed in double; r is rounded to float. out may be x. A NULL
 * weight is no weight (Llama 4's L2 q/k norm): out = x * r, the bytes of a weight of ones. */
int strata_glue_rmsnorm(const float *x, int64_t x_stride, int64_t n_tokens, int64_t n_groups, int64_t n,
                        const float *weight, float eps, float *out, int64_t out_stride);

/* Rotate x[T, H, hd] in place (token t's heads start at x + t * x_stride) by cos/sin [T, R/2]
 * (contiguous): features (i, i + R/2) when neox, (2i, 2i + 1) otherwise, become
 * (x1 cos - x2 sin, x2 cos + x1 sin); features R..hd-1 are left alone. R even, R <= hd. */
int strata_glue_rope(float *x, int64_t x_stride, int64_t n_tokens, int64_t n_head, int64_t head_dim,
                     const float *cos_t, const float *sin_t, int64_t rope_dim, int neox);

/* x[t, g, :] *= softplus(gate[t, g]) for T tokens of G groups of `width` values (x contiguous
 * [T, G * width], gate [T, G]): Laguna's attention output gate, per head (G = H, width = hd) or per
 * element (G = H hd, width 1). softplus(z) = log1pf(expf(z)), z itself above 20 (torch's threshold). */
int strata_glue_gate_softplus(float *x, int64_t x_len, const float *gate, int64_t gate_len, int64_t n_tokens,
                              int64_t n_groups, int64_t width);

/* k_cache[slots[t], g, positions[t], :] = k[t, g, :] (and v alike) for caches [S, Hkv, C, hd]
 * (contiguous) and k, v rows [Hkv, hd] at k + t * k_stride, v + t * v_stride. */
int strata_glue_kv_write(const float *k, int64_t k_stride, const float *v, int64_t v_stride, int64_t n_tokens,
                         int64_t n_head_kv, int64_t head_dim, float *k_cache, float *v_cache, int64_t n_slots,
                         int64_t n_cache_ctx, const int64_t *slots, const int64_t *positions);

/* strata_glue_kv_write into caches of ggml type `kv_type`: rows of hd values are F32, F16 or BF16
 * (round to nearest even, as torch converts) or Q8_0 (hd / 32 blocks of 34 bytes, half d and
 * i8 qs[32], rounded as gguf-py's Q8_0 byte for byte: llama.cpp's --cache-type-k/v q8_0), so
 * caches are [S, Hkv, C, row bytes]. STRATA_E_TYPE for another type, STRATA_E_BLOCK for Q8_0
 * with hd not a multiple of 32. */
int strata_glue_kv_write_typed(int32_t kv_type, const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                               int64_t n_tokens, int64_t n_head_kv, int64_t head_dim, void *k_cache, void *v_cache,
                               int64_t n_slots, int64_t n_cache_ctx, const int64_t *slots, const int64_t *positions,
                               int impl);

/* Grouped-query decode attention over a paged cache: caches [N, Hkv, P, hd] (contiguous; N =
 * n_blocks blocks of P = block_size positions); sequence b's position j lives in block
 * block_table[b * table_stride + j / P] at offset j % P. For sequence b and head h (kv head
 * g = h / (H / Hkv)), out[b, h*hd:(h+1)*hd] = softmax_j(scale * q[b, h] . k[b, g, j]) @ v[b, g, j]
 * over positions j < n_ctx[b] (1 <= n_ctx[b] <= table_stride * P; every block entry read is checked
 * to lie in [0, N) first). A contiguous cache [S, Hkv, C, hd] is the case P = C, table = slots,
 * table_stride = 1. Softmax in float32, max subtracted; past 256 positions the passes are joined by
 * online rescaling. `impl` (enum strata_impl): scalar or AVX2 (AVX-512 runs AVX2); they agree to
 * float rounding, not bit for bit. */
int strata_glue_attn_decode(const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head, int64_t n_head_kv,
                            int64_t head_dim, const float *k_cache, const float *v_cache, int64_t n_blocks,
                            int64_t block_size, const int64_t *block_table, int64_t table_stride,
                            const int64_t *n_ctx, float scale, float *out, int64_t out_stride, int impl);

/* strata_glue_attn_decode with gpt-oss's two additions: `window` > 0 attends only the last
 * `window` positions (j >= n_ctx[b] - window; 0: all), and `sinks` [n_head] (or NULL) joins each
 * head's softmax with one more logit, sinks[h], whose value row is zero. The blocks checked are
 * those of every position below n_ctx[b], read or not. */
int strata_glue_attn_decode_sinks(const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head,
                                  int64_t n_head_kv, int64_t head_dim, const float *k_cache, const float *v_cache,
                                  int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                                  int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                                  int64_t window, float *out, int64_t out_stride, int impl);

/* strata_glue_attn_decode_sinks over caches of ggml type `kv_type` (rows as
 * strata_glue_kv_write_typed writes them). A row not in F32 is converted to float32 as it is
 * read (the dequantization kernels), a run of rows at a time, then scored and summed by the same
 * kernels in the same order as F32 rows holding the converted values, so the result equals F32
 * attention over the dequantized cache bit for bit (head_dim <= 1024 for such caches). */
int strata_glue_attn_decode_typed(int32_t kv_type, const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head,
                                  int64_t n_head_kv, int64_t head_dim, const void *k_cache, const void *v_cache,
                                  int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                                  int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                                  int64_t window, float *out, int64_t out_stride, int impl);

/* strata_glue_attn_decode_typed on `pool` (NULL: the calling thread) when the work is large
 * enough: (sequence, head) pairs spread over the threads, or, for sequences with fewer kv heads
 * than threads, their positions (attn.c's pieces, merged in position order as the serial call
 * merges them), so the bytes are the serial call's. `chunk` > 0 (Llama 4's local layers; window 0): each query
 * attends within its own chunk, positions chunk * floor((n_ctx - 1) / chunk) .. n_ctx - 1, the
 * bytes of a window of (n_ctx - 1) % chunk + 1. The fused decode step's attention. */
int strata_attn_decode_pooled(strata_pool *pool, int32_t kv_type, const float *q, int64_t q_stride, int64_t n_seq,
                              int64_t n_head, int64_t n_head_kv, int64_t head_dim, const void *k_cache,
                              const void *v_cache, int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                              int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                              int64_t window, int64_t chunk, float *out, int64_t out_stride, int impl);

/* y[t, r] = x[t] . w[r] for x [T, n] (token t at x + t * x_stride), w [n_rows, n] and y
 * [T, n_rows] contiguous: float32 products for small matrices kept in F32, the router's logits.
 * Sums in a different order from torch's F.linear: equal within float rounding, not bit for bit.
 * `impl` (enum strata_impl): scalar or AVX2 (AVX-512 runs AVX2). */
int strata_glue_matvec(const float *x, int64_t x_stride, int64_t n_tokens, int64_t n, const float *w, int64_t n_rows,
                       float *y, int impl);

/* strata_glue_matvec with its rows (in whole groups of 4) spread over `pool` (NULL: the calling
 * thread) when the product is large enough: the same bytes. The fused step's router. */
int strata_matvec_pooled(strata_pool *pool, const float *x, int64_t x_stride, int64_t n_tokens, int64_t n,
                         const float *w, int64_t n_rows, float *y, int impl);

enum strata_gating {
    STRATA_GATING_SOFTMAX = 0,
    STRATA_GATING_SIGMOID = 1,
    STRATA_GATING_SOFTMAX_WEIGHT = 2  /* the k largest logits, then a softmax over those k (gpt-oss) */
};

/* Router on logits [T, E] (contiguous, E <= 4096): probabilities (softmax over E, or sigmoid), the
 * k largest per token in descending order (equal probabilities: lower expert id first) into
 * expert_ids [T, k], their probabilities into weights [T, k], divided by their sum when norm,
 * times scale when scale != 1. STRATA_GATING_SOFTMAX_WEIGHT ranks the logits themselves and
 * weighs the k chosen by a softmax over their logits. STRATA_E_ARG when NaN logits leave fewer
 * than k candidates. */
int strata_glue_route(const float *logits, int64_t n_tokens, int64_t n_experts, int64_t k, int gating, int norm,
                      float scale, int64_t *expert_ids, float *weights);

/* strata_glue_route with DeepSeek's additions: experts ranked by probability + selection_bias[e]
 * (NULL: none; the weights stay the probabilities), and with n_groups > 1 only the experts of the
 * n_groups_used groups (of n_experts / n_groups consecutive experts) with the best scores compete,
 * a group's score the sum of its group_top best ranks (equal scores: lower group first). */
int strata_glue_route_groups(const float *logits, int64_t n_tokens, int64_t n_experts, int64_t k, int gating,
                             int norm, float scale, const float *selection_bias, int64_t n_groups,
                             int64_t n_groups_used, int group_top, int64_t *expert_ids, float *weights);

/* The T*k assignments (expert_ids, weights [T, k]) sorted by expert, stably (tokens ascending
 * within an expert): used[0..n) the experts that own any (ascending), offsets[0..n] where used[j]
 * owns sorted entries offsets[j]..offsets[j+1]-1, token_ids and weights_sorted [T*k] the token
 * and weight of each sorted entry. used holds n_experts entries, offsets n_experts + 1 (its whole
 * length is scratch). STRATA_E_SIZE for an id outside [0, n_experts). */
/* The same grouping of only the assignments to experts e with owned[e] != 0 (owned [n_experts];
 * NULL: all): the groups, and their entries, that strata_glue_group gives those experts. */
int strata_glue_group_owned(const int64_t *expert_ids, const float *weights, int64_t n_tokens, int64_t k,
                            int64_t n_experts, const uint8_t *owned, int32_t *used, int64_t *offsets,
                            int32_t *token_ids, float *weights_sorted, int64_t *n_used);
int strata_glue_group(const int64_t *expert_ids, const float *weights, int64_t n_tokens, int64_t k,
                      int64_t n_experts, int32_t *used, int64_t *offsets, int32_t *token_ids,
                      float *weights_sorted, int64_t *n_used);

/* ==== Decode step: a layer's half and its router in one call, one step function per layer kind ==== */

/* What every layer kind's step struct begins with (its member `head`): the width, the two norms
 * (attn_norm before the layer's mixing half, ffn_norm after its residual; epsilon norm_eps) and
 * the router (NULL for a dense layer, else [n_experts, D] float32 picking n_used experts as
 * strata_glue_route_groups does; router_bias [n_experts] added to its logits; DeepSeek's selection
 * bias and expert groups; NULL / 0 when absent). The decode program reads a layer through it. */
typedef struct {
    int64_t n_embd;
    float norm_eps;
    const float *attn_norm, *ffn_norm;
    const float *router;
    int64_t n_experts, n_used;
    int32_t gating, norm_weights;
    float weights_scale;
    const float *router_bias, *selection_bias;
    int64_t n_groups, n_groups_used;
    int32_t group_top;
} strata_layer_head;

/* Where strata_decode_attn writes the grouping of its routing (strata_glue_group's outputs):
 * used [n_experts], offsets [n_experts + 1], token_ids and weights_sorted [n_seq * n_used]. */
typedef struct {
    int32_t *used;
    int64_t *offsets;
    int32_t *token_ids;
    float *weights_sorted;
    int64_t n_used;
    const uint8_t *owned;  /* [n_experts] or NULL: only assignments to experts with owned[e] != 0 are
                            * grouped (an expert-parallel rank's shard; strata_glue_group_owned) */
} strata_route_groups;

/* One decode step's batch and outputs, as every kind's step takes them: n_seq sequences (one new
 * token each), sequence b at positions[b]; an attention layer reads its cache blocks at
 * block_table[b * table_stride ...] (every entry read is checked to lie in [0, n_blocks)) and rope
 * cos/sin [n_seq, rope_dim / 2], a recurrent layer its state row slots[b] (NULL / 0 where a kind
 * reads none). x [n_seq, D] is updated in place; xn [n_seq, D] = ffn_norm(x); for an MoE layer the
 * router's choice goes to expert_ids (int64) and weights [n_seq, n_used] and, when `groups` is
 * given, its grouping by expert. scratch: at least the kind's scratch bytes for n_seq. */
typedef struct {
    int64_t n_seq;
    const int64_t *positions;
    const int64_t *block_table;
    int64_t table_stride;
    const int64_t *slots;
    const float *cos_t, *sin_t;
    float *x, *xn;
    int64_t *expert_ids;
    float *weights;
    strata_route_groups *groups;
    void *scratch;
    int64_t scratch_bytes;
    /* A second pair of rope tables [n_seq, R_alt / 2] (may be NULL), for the layers that ask
     * (strata_attn_layer.rope_alt): sliding-window layers that rotate otherwise (MiMo-V2's own base;
     * Laguna's own rotary features and base), R_alt the rope_dim of those layers. */
    const float *cos_alt, *sin_alt;
} strata_step_args;

/* A layer kind's decode step (`layer`: the head of the kind's struct) and its scratch bytes for
 * n_seq sequences. Each kind's step runs the per-call path's native functions in the same order,
 * so the results are those bytes. A kind's struct, step and scratch function live in its own
 * files (native/executor/<kind>.c and a header build.py reads as part of the cdef). */
typedef int (*strata_step_fn)(strata_pool *pool, const strata_layer_head *layer, const strata_step_args *args,
                              int impl);
typedef int (*strata_step_scratch_fn)(const strata_layer_head *layer, int64_t n_seq, int64_t *bytes);

/* ---- Attention, grouped-query and latent (step.c) ---- */

/* An attention layer (grouped-query or latent) as strata_decode_attn reads it. Matrices are packed in their ggml type (qkv:
 * q, k and v stacked by rows, [(H + 2 Hkv) hd, D]; o: [D, H hd]); norms, biases and the router are
 * float32. q_norm / k_norm: NULL when the model has none, else [hd] (per head) or [H hd] / [Hkv hd]
 * (full width). Caches [N, Hkv, P, hd]:
 * n_blocks blocks of block_size positions (the paged KV cache). */
typedef struct {
    strata_layer_head head;
    int64_t n_head, n_head_kv, head_dim, rope_dim;
    int32_t neox, qk_norm_per_head;
    float attn_scale;
    int32_t qkv_type, o_type;
    const void *wqkv, *wo;
    int64_t wqkv_bytes, wo_bytes;
    const float *bqkv, *q_norm, *k_norm;
    void *k_cache, *v_cache;  /* rows in kv_type (strata_glue_kv_write_typed) */
    int64_t n_blocks, block_size;
    int32_t kv_type;          /* ggml type of the caches: F32 (0), F16, BF16 or Q8_0 */
    /* gpt-oss (NULL / 0 when absent): sink logits [n_head] and a sliding window (decode attention
     * as strata_glue_attn_decode_sinks), the output projection's bias [D]. */
    const float *sinks;
    int64_t window;
    const float *bo;
    /* Latent attention (DeepSeek, kv_lora > 0): head_dim is the key width nope + rope_dim, the
     * cache one kv head of kv_lora + rope_dim per position (n_head_kv 1). The query comes from
     * wqkv = wq [H (nope + rope), D] or, with q_lora > 0, from wq_a [q_lora, D], q_a_norm [q_lora]
     * and wqkv = wq_b [H (nope + rope), q_lora]; wkv_a [kv_lora + rope, D] gives the latent (then
     * kv_a_norm [kv_lora]) and the rope key; k_b [H kv_lora, nope] and v_b [H v_dim, kv_lora]
     * (packed, a head's rows after another's; strata_matmul_heads) take queries into and values
     * out of the latent space; o is [D, H v_dim]. bqkv, q_norm, k_norm, sinks and window do not
     * apply. */
    int64_t kv_lora, q_lora, nope, v_dim;
    int32_t wq_a_type, wkv_a_type, k_b_type, v_b_type;
    const void *wq_a, *wkv_a, *k_b, *v_b;
    int64_t wq_a_bytes, wkv_a_bytes, k_b_bytes, v_b_bytes;
    const float *q_a_norm, *kv_a_norm;
    /* Gated attention (qwen3next, qwen35moe; 0: none): wqkv's query rows are [q_h | gate_h] per
     * head ([(2 H + 2 Hkv) hd, D]); the attention's output is multiplied by sigmoid(gate) before
     * wo (strata_attn_gate). Grouped-query attention without qkv bias only. */
    int32_t q_gate;
    /* Llama 4 (0 when absent; grouped-query attention only): chunk > 0 (a local layer) attends
     * within the query's chunk of `chunk` positions (positions chunk * floor(pos / chunk) .. pos);
     * qk_l2 normalises each head of q and k to unit RMS (no weight, epsilon qk_l2_eps) after RoPE;
     * temp_floor > 0 (a global NoPE layer, rope_dim 0) multiplies the queries by the temperature
     * (float)(log1p(floor((pos + 1) / temp_floor)) * temp_scale + 1), computed in double. */
    int64_t chunk;
    int32_t qk_l2;
    float qk_l2_eps;
    int64_t temp_floor;
    double temp_scale;
    /* V in a type of its own (NULL: v is in wqkv): wv [Hkv hd, D] of type v_type, and wqkv then
     * holds the query (and gate) and key rows only. Files quantized by llama.cpp's mixes (Q4_K_M,
     * IQ4_XS, ...) give attn_v more bits than attn_q and attn_k. Grouped-query attention only. */
    int32_t v_type;
    const void *wv;
    int64_t wv_bytes;
    /* An output gate of its own projection (Laguna; g_rows 0: none; grouped-query attention without
     * q_gate only): gate = attn_norm(x) @ wg^T, wg [g_rows, D] of type g_type; the attention's output
     * times softplus(gate) (strata_glue_gate_softplus) before wo, per head (g_rows = H, one value
     * over the head's hd features) or per element (g_rows = H hd). */
    int32_t g_type;
    const void *wg;
    int64_t wg_bytes, g_rows;
    /* MiMo-V2 (0 when absent; grouped-query attention only, no output gate of either kind): value
     * heads of head_dim_v < head_dim features (wqkv's or wv's value rows are Hkv head_dim_v, o is
     * [D, H head_dim_v]; the caches' value rows stay head_dim wide, zero past head_dim_v: the
     * decode attention reads one width) and v_scale != 0 multiplying the attention's output
     * (each head's first head_dim_v features) before o. rope_alt: the layer's rope tables are the
     * step's cos_alt / sin_alt (sliding-window layers with a RoPE of their own, in the decode
     * program; a step run on its own gets its layer's tables as both). */
    int64_t head_dim_v;
    float v_scale;
    int32_t rope_alt;
} strata_attn_layer;

/* The attention kinds' strata_step_scratch_fn and strata_step_fn: x += attention(attn_norm(x))
 * through the paged cache, then the FFN's input and routing. */
int strata_decode_attn_scratch_bytes(const strata_layer_head *layer, int64_t n_seq, int64_t *bytes);
int strata_decode_attn(strata_pool *pool, const strata_layer_head *layer, const strata_step_args *args, int impl);

/* ==== Decode program (program.c): a decode step through every layer in one call ==== */

/* One layer of the program: its kind's step and the head of its struct (caches or states bound),
 * for an MoE layer its expert parts (gate and up [n_ff, D], down [D, n_ff]) and its page table row:
 * expert e is the matrix at position slot_of[e] of the parts (-1: not in place). A dense layer (no
 * router) has its FFN as the shared expert (s_ff > 0, no gate) and no expert parts. */
typedef struct {
    strata_step_fn step;
    const strata_layer_head *layer;
    strata_moe_part gate, up, down;
    const int32_t *slot_of;
    int64_t n_ff;
    /* The shared expert, when s_ff > 0: one SwiGLU expert of s_ff rows (parts holding it at
     * position 0) added for every token, weighted by strata_shared_weights (s_gate_inp: NULL or [D]). */
    strata_moe_part s_gate, s_up, s_down;
    int64_t s_ff;
    const float *s_gate_inp;
    /* NULL: plain SwiGLU experts; else their function (strata_moe_glu), expert_ids ignored: the
     * layer's grouping gives each expert's id. */
    const strata_moe_act *act;
} strata_decode_layer;

/* The shared expert's weight per token: w[t] = sigmoid(x[t] . gate_inp) (x [n_tok, D] contiguous;
 * the dot product as strata_glue_matvec's, the sigmoid 1 / (1 + expf(-z)) in float), or 1 for
 * every token when gate_inp is NULL. */
int strata_shared_weights(const float *x, int64_t n_tok, int64_t n_embd, const float *gate_inp, float *w, int impl);

/* One decode step through n_layers layers (`args` as every step takes them; its expert_ids is
 * layer 0's, layer l's go to expert_ids + l * ids_stride ([n_seq, n_used] int64)): per layer, its
 * kind's step, the routed experts of the routing into routed [n_seq, D] (zeroed first) and
 * x += routed. weights, groups, expert_index [index_len >= n_experts] and routed are working
 * buffers. Runs layers first_layer.. in turn; *stopped_at = n_layers when all ran, or the layer
 * whose routing needs an expert not in place (slot_of -1): that layer's step and routing are done
 * (x, xn, its expert ids, weights and groups written), its experts are the caller's to add before
 * resuming at the next layer. A layer with a shared expert adds it into routed after the routed
 * experts (s_tokens int32 and s_weights float [n_seq]: working buffers, NULL when no layer has
 * one). layer_used [n_layers] receives each run layer's count of distinct experts; layer_ns
 * (NULL, or [n_layers, 2]) accumulates each layer's nanoseconds in its step and its experts. */
int strata_decode_layers(strata_pool *pool, const strata_decode_layer *layers, int64_t n_layers,
                         const strata_step_args *args, int64_t ids_stride, int32_t *expert_index, int64_t index_len,
                         float *routed, int64_t first_layer, int64_t *stopped_at, int64_t *layer_used,
                         int64_t *layer_ns, int32_t *s_tokens, float *s_weights, int impl);

#endif
