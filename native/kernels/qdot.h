/*
 * Internal interface of the quantized matrix kernels: y[T, N] = x[T, K] @ W[N, K]^T with W in
 * its GGML block format (common.h), computed straight from the packed blocks.
 *
 * Activations are first rounded, row by row, to an 8-bit activation format (as llama.cpp does),
 * then each weight block is multiplied with the matching activation block in integer
 * arithmetic and scaled once per block:
 *
 *   STRATA_ACT_Q8    32 values, 40 B: float d; float s; i8 q[32]      x ~ d * q, s = d * sum(q)
 *                    for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL (s serves the formats with a
 *                    min), NVFP4 (two activation blocks per 64-value weight block)
 *   STRATA_ACT_Q8K  256 values, 292 B: float d; i8 q[256]; i16 bsums[16] (sum of each 16 q)
 *                    for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (bsums serve the mins and Q6_K's -32) and the
 *                    256-value i-quants and ternary formats
 *   STRATA_ACT_F32    the float32 row itself (4 B per value), for F32, F16, BF16 weights
 *
 * d = max|x| / 127 and q = round-to-nearest-even(x / d) (q = 0 for an all-zero block), computed as
 * an IEEE float32 division (not x * (1/d)) and clamped to [-127, 127] (which matters only when d
 * is a float32 subnormal that rounded down); Q8's s = d * (float)sum(q). x must be finite.
 *
 * Kernel families: `_ref` (portable C, the definition), `_avx2`, `_avx512` (F/BW/VL/VNNI,
 * BF16 where the CPU has it). A vector kernel gives the same float result as its `_ref` twin
 * when the weight block's integer dot products are exact (they are for every format: the sums
 * stay far inside int32), up to the order in which the per-block float terms are added; the
 * tests state the tolerance. Activation quantizers are bit-exact across families.
 *
 * The tile kernel computes n_rows x n_tok outputs: for r < n_rows, t < n_tok,
 *   y[t * y_stride + r] = sum over blocks of dot(W row r, activation row t)
 * W rows are w_row_bytes apart, activation rows a_row_bytes apart. Kernels walk the rows in
 * small groups and, for each group, all tokens, so a weight block is read from memory once per
 * group of tokens, not once per token.
 */
#ifndef STRATA_QDOT_H
#define STRATA_QDOT_H
#include "common.h"
#include "strata.h"

enum { STRATA_ACT_Q8 = 0, STRATA_ACT_Q8K = 1, STRATA_ACT_F32 = 2 };

typedef struct { float d, s; int8_t q[32]; } strata_block_act_q8;
typedef struct { float d; int8_t q[256]; int16_t bsums[16]; } strata_block_act_q8k;
_Static_assert(sizeof(strata_block_act_q8) == 40, "activation Q8 block size");
_Static_assert(sizeof(strata_block_act_q8k) == 292, "activation Q8K block size");

/* Round one row of k float32 values (k a multiple of the activation block) into `act` format. */
typedef void (*strata_qact_fn)(const float *restrict x, void *restrict a, int64_t k);

typedef void (*strata_qdot_tile_fn)(int64_t k, const uint8_t *restrict w, int64_t w_row_bytes, int64_t n_rows,
                                    const uint8_t *restrict a, int64_t a_row_bytes, int64_t n_tok,
                                    float *restrict y, int64_t y_stride);

/* End of the run of weight rows the calling thread is working through (set before tile calls):
 * the decode kernels fetch ahead into the rows to come, never past it. */
extern _Thread_local const uint8_t *strata_qdot_ahead_end;
const uint8_t *strata_qdot_ahead(void);   /* its value (for the AVX-512 builds of the AVX2 tiles) */

/* Activations handed to tile calls from now on may differ from before: called by whoever quantized
 * them, before the tile calls that read them. A tile that re-lays activations (qdot_iq_vnni.c,
 * qdot_iq_planes.c) keeps its layout per thread until then: strata_qdot_relaid gives the calling
 * thread's buffer for `layout` of at least `bytes` (64-byte aligned; NULL if it cannot be had) and
 * sets *valid when it already holds that layout of these activations. */
void strata_qdot_new_acts(void);

enum { STRATA_RELAID_VNNI, STRATA_RELAID_PLANES, STRATA_RELAID_PLANES4, STRATA_RELAID_ROWS, STRATA_RELAID_IQ4_XS,
       STRATA_RELAID_NVFP4, STRATA_RELAID_LAYOUTS };

uint8_t *strata_qdot_relaid(const uint8_t *a, int64_t n_tok, int64_t k, int64_t arb, size_t bytes, int layout,
                            int *valid);

/* IQ1's grid times 8, plus 9, made when the library loads on x86 (qdot_iq_vbmi.c): a row of it plus
 * the row's delta (+-1) is IQ1's integer value 8 g +- 1 plus 9, in [0, 18], an unsigned byte. */
extern uint8_t strata_iq1_grid_u[2048][8];

typedef struct {
    int weight_type;        /* ggml type id */
    int act;                /* STRATA_ACT_* */
    int64_t block_elems;    /* of the weight format (the activation block is 32, 256 or 1) */
    strata_qact_fn qact;    /* NULL for STRATA_ACT_F32 */
    strata_qdot_tile_fn tile;    /* STRATA_QDOT_DECODE_TOKENS tokens or more (prefill) */
    strata_qdot_tile_fn decode;  /* fewer tokens: tile, or the family below's where it is faster */
    int tile_family, decode_family;  /* STRATA_IMPL_* of the two */
} strata_qdot_kernels;

/* Calls of fewer tokens than this are decode: bound by reading the weights, they run the table's
 * decode kernel (strata_qdot_kernels.decode). */
#define STRATA_QDOT_DECODE_TOKENS 4

/* The re-laid activations of a decode tile that re-lays per call (qdot_iq4_xs_avx512.c,
 * qdot_nvfp4_avx512.c): the calling thread's buffer of tok_bytes a token in `layout`, made by `relay`
 * unless it already holds these activations. NULL when the call is done without it: no tokens (nothing
 * to do), 4 tokens or more, no blocks or no memory for the layout (`otherwise` did the call). */
typedef void (*strata_relay_fn)(const uint8_t *a, int64_t arb, int64_t n_tok, int64_t nb, uint8_t *out);
static inline uint8_t *strata_qdot_decode_relaid(strata_qdot_tile_fn otherwise, strata_relay_fn relay, int layout,
                                                 int64_t nb, int64_t tok_bytes, int64_t k, const uint8_t *w,
                                                 int64_t wrb, int64_t n_rows, const uint8_t *a, int64_t arb,
                                                 int64_t n_tok, float *y, int64_t ys) {
    if (n_tok <= 0) return NULL;
    int valid = 0;
    uint8_t *x = n_tok < STRATA_QDOT_DECODE_TOKENS && nb > 0
                   ? strata_qdot_relaid(a, n_tok, k, arb, (size_t)(n_tok * tok_bytes), layout, &valid)
                   : NULL;
    if (!x) otherwise(k, w, wrb, n_rows, a, arb, n_tok, y, ys);
    else if (!valid) relay(a, arb, n_tok, nb, x);
    return x;
}

/* The kernel of a call of n_tok tokens. */
static inline strata_qdot_tile_fn strata_qdot_tile_for(const strata_qdot_kernels *k, int64_t n_tok) {
    return n_tok < STRATA_QDOT_DECODE_TOKENS ? k->decode : k->tile;
}

/* Kernels for `weight_type` in family `impl` (a resolved STRATA_IMPL_*): a family without its own
 * kernel for a format gives the next family down (avx512 -> avx2 -> scalar). STRATA_E_TYPE when
 * the format has no kernel at all. */
int strata_qdot_find(int weight_type, int impl, strata_qdot_kernels *out);

/* Bytes of one activation row of k values in format `act`. */
int64_t strata_qact_row_bytes(int act, int64_t k);

/* ---- Kernels (qdot_ref.c, qdot_avx2.c, qdot_avx512.c) and shared pieces ---- */

/* MXFP4: E2M1 code -> twice its value (an integer), and the E8M0 scale halved, 2^(e - 128)
 * (float32 subnormals for e < 2), as in dequant_ref.c. */
static const int8_t strata_e2m1_doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static inline float strata_e8m0_half(uint8_t e) {
    return strata_bits_to_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

void strata_qact_q8_ref(const float *restrict x, void *restrict a, int64_t k);
void strata_qact_q8k_ref(const float *restrict x, void *restrict a, int64_t k);
void strata_qact_q8_avx2(const float *restrict x, void *restrict a, int64_t k);
void strata_qact_q8k_avx2(const float *restrict x, void *restrict a, int64_t k);
void strata_qact_q8_avx512(const float *restrict x, void *restrict a, int64_t k);
void strata_qact_q8k_avx512(const float *restrict x, void *restrict a, int64_t k);

/* The scalar tile loop: y[t, r] = sum over the row's weight blocks of block_<name>(weight block,
 * its `per` activation blocks), a file-local function of each scalar kernel file. */
#define STRATA_DEFINE_QTILE_PER(name, wtype, act_t, elems, per)                                              \
    void strata_qdot_##name##_ref(int64_t k, const uint8_t *restrict w, int64_t w_row_bytes, int64_t n_rows, \
                                  const uint8_t *restrict a, int64_t a_row_bytes, int64_t n_tok,            \
                                  float *restrict y, int64_t y_stride) {                                    \
        const int64_t nb = k / (elems);                                                                     \
        for (int64_t r = 0; r < n_rows; r++)                                                                \
            for (int64_t t = 0; t < n_tok; t++) {                                                           \
                const uint8_t *wr = w + r * w_row_bytes;                                                    \
                const act_t *ar = (const act_t *)(a + t * a_row_bytes);                                     \
                float sum = 0.0f;                                                                           \
                for (int64_t b = 0; b < nb; b++) sum += block_##name(wr + b * (int64_t)sizeof(wtype), ar + (per) * b); \
                y[t * y_stride + r] = sum;                                                                  \
            }                                                                                               \
    }

#define STRATA_DECLARE_QTILE(name, family)                                                                 \
    void strata_qdot_##name##_##family(int64_t k, const uint8_t *restrict w, int64_t w_row_bytes,            \
                                       int64_t n_rows, const uint8_t *restrict a, int64_t a_row_bytes,       \
                                       int64_t n_tok, float *restrict y, int64_t y_stride);

/* Every tile the table of quant types names, its tile kinds and the CPU bits its rows read. */
#include "qdot_table.h"

/* A CPU as the kernel choice sees it (strata.h's strata_cpu_desc): this process's, detected once,
 * with what STRATA_KERNEL asks applied (cpu.c). */
const strata_cpu_desc *strata_cpu_here(void);

/* 1 when this process's CPU description has feature `bit` (STRATA_CPU_*): what the kernels read
 * for the choices they make inside a tile (ymm or zmm gathers). */
int strata_cpu_has(uint32_t bit);

/* A tile kind: the family a call of it reports, the CPU bits it needs, whether it is a decode tile
 * that takes any call of fewer than 8 tokens (strata_qdot_few_tokens), its name (STRATA_KERNEL's). */
typedef struct {
    int family;
    uint32_t needs;
    int few_tokens;
    const char *name;
} strata_tile_kind;

/* One tile of a list: its kind and the STRATA_WHEN_* conditions that must all hold. */
typedef struct {
    uint8_t kind, when;
} strata_qdot_choice;

enum { STRATA_PHASE_DECODE = 0, STRATA_PHASE_PREFILL = 1, STRATA_QDOT_MAX_CHOICES = 6 };

/* A row of the kernel table (qdot_table.c, generated): a type's tiles by kind (NULL: none of the
 * kind), and per family (scalar, AVX2, AVX-512) and phase the tiles in order of choice. */
typedef struct {
    int type, act;
    strata_qdot_tile_fn tile[STRATA_TILE_KINDS];
    struct {
        int n;
        strata_qdot_choice c[STRATA_QDOT_MAX_CHOICES];
    } list[3][2];
} strata_qdot_row;

extern const strata_tile_kind strata_tile_kinds[STRATA_TILE_KINDS];
extern const strata_qdot_row strata_qdot_table[];
extern const int strata_qdot_table_rows;

/* Builds for CPUs other than x86: an AVX-512 kernel's name, running the scalar tile (qdot.c never
 * hands it out there: strata_resolve_impl refuses AVX512). */
#define STRATA_AVX512_FALLBACK(name)                                                                       \
    void strata_qdot_##name##_avx512(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,    \
                                     const uint8_t *restrict a, int64_t arb, int64_t n_tok,                \
                                     float *restrict y, int64_t ys) {                                      \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                  \
    }

/* The tile for calls (or a prefill tile's leftovers) of fewer than 8 tokens of `type` on an AVX-512
 * call: the decode tile the table picks for it where that is a tile of a few_tokens kind (planes,
 * zmm decode, gathers; the zmm decode tiles pass 4 tokens and more to the AVX2 build), else
 * `otherwise`. strata_qdot_gathers: the gather tile (qdot_iq_vbmi.c) where the table would pick it
 * with the planes tiles left out, else `otherwise`. */
strata_qdot_tile_fn strata_qdot_few_tokens(int type, strata_qdot_tile_fn otherwise);
strata_qdot_tile_fn strata_qdot_gathers(int type, strata_qdot_tile_fn otherwise);

#endif
