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

STRATA_DECLARE_QTILE(f32, ref)
STRATA_DECLARE_QTILE(f16, ref)
STRATA_DECLARE_QTILE(bf16, ref)
STRATA_DECLARE_QTILE(q4_0, ref)
STRATA_DECLARE_QTILE(q4_1, ref)
STRATA_DECLARE_QTILE(q5_0, ref)
STRATA_DECLARE_QTILE(q5_1, ref)
STRATA_DECLARE_QTILE(q8_0, ref)
STRATA_DECLARE_QTILE(mxfp4, ref)
STRATA_DECLARE_QTILE(q2_k, ref)
STRATA_DECLARE_QTILE(q3_k, ref)
STRATA_DECLARE_QTILE(q4_k, ref)
STRATA_DECLARE_QTILE(q5_k, ref)
STRATA_DECLARE_QTILE(q6_k, ref)
/* qdot_iq.c: i-quants, ternary formats and NVFP4, the scalar tiles */
STRATA_DECLARE_QTILE(iq2_xxs, ref)
STRATA_DECLARE_QTILE(iq2_xs, ref)
STRATA_DECLARE_QTILE(iq2_s, ref)
STRATA_DECLARE_QTILE(iq3_xxs, ref)
STRATA_DECLARE_QTILE(iq3_s, ref)
STRATA_DECLARE_QTILE(iq1_s, ref)
STRATA_DECLARE_QTILE(iq1_m, ref)
STRATA_DECLARE_QTILE(iq4_nl, ref)
STRATA_DECLARE_QTILE(iq4_xs, ref)
STRATA_DECLARE_QTILE(tq1_0, ref)
STRATA_DECLARE_QTILE(tq2_0, ref)
STRATA_DECLARE_QTILE(nvfp4, ref)

STRATA_DECLARE_QTILE(f32, avx2)
STRATA_DECLARE_QTILE(f16, avx2)
STRATA_DECLARE_QTILE(bf16, avx2)
STRATA_DECLARE_QTILE(q4_0, avx2)
STRATA_DECLARE_QTILE(q4_1, avx2)
STRATA_DECLARE_QTILE(q5_0, avx2)
STRATA_DECLARE_QTILE(q5_1, avx2)
STRATA_DECLARE_QTILE(q8_0, avx2)
STRATA_DECLARE_QTILE(mxfp4, avx2)
STRATA_DECLARE_QTILE(q2_k, avx2)
STRATA_DECLARE_QTILE(q3_k, avx2)
STRATA_DECLARE_QTILE(q4_k, avx2)
STRATA_DECLARE_QTILE(q5_k, avx2)
STRATA_DECLARE_QTILE(q6_k, avx2)
/* qdot_iq_avx2.c: the grid i-quants */
STRATA_DECLARE_QTILE(iq2_xxs, avx2)
STRATA_DECLARE_QTILE(iq2_xs, avx2)
STRATA_DECLARE_QTILE(iq2_s, avx2)
STRATA_DECLARE_QTILE(iq3_xxs, avx2)
STRATA_DECLARE_QTILE(iq3_s, avx2)
STRATA_DECLARE_QTILE(iq1_s, avx2)
STRATA_DECLARE_QTILE(iq1_m, avx2)
/* qdot_iq4_avx2.c */
STRATA_DECLARE_QTILE(iq4_nl, avx2)
STRATA_DECLARE_QTILE(iq4_xs, avx2)
STRATA_DECLARE_QTILE(tq1_0, avx2)
STRATA_DECLARE_QTILE(tq2_0, avx2)
STRATA_DECLARE_QTILE(nvfp4, avx2)

/* qdot_tq1_avxvnni.c: TQ1_0's decode on AVX2 CPUs with AVX-VNNI */
STRATA_DECLARE_QTILE(tq1_0, avxvnni)
/* qdot_iq_avxvnni.c: the grid i-quants' AVX2 tiles built with AVX-VNNI */
STRATA_DECLARE_QTILE(iq2_xxs, avxvnni)
STRATA_DECLARE_QTILE(iq2_xs, avxvnni)
STRATA_DECLARE_QTILE(iq2_s, avxvnni)
STRATA_DECLARE_QTILE(iq3_xxs, avxvnni)
STRATA_DECLARE_QTILE(iq3_s, avxvnni)
STRATA_DECLARE_QTILE(iq1_s, avxvnni)
STRATA_DECLARE_QTILE(iq1_m, avxvnni)

/* qdot_*_evex.c: the AVX2 sources built for AVX-512 machines */
STRATA_DECLARE_QTILE(f32, evex)
STRATA_DECLARE_QTILE(f16, evex)
STRATA_DECLARE_QTILE(bf16, evex)
STRATA_DECLARE_QTILE(q4_0, evex)
STRATA_DECLARE_QTILE(q4_1, evex)
STRATA_DECLARE_QTILE(q5_0, evex)
STRATA_DECLARE_QTILE(q5_1, evex)
STRATA_DECLARE_QTILE(q8_0, evex)
STRATA_DECLARE_QTILE(mxfp4, evex)
STRATA_DECLARE_QTILE(q2_k, evex)
STRATA_DECLARE_QTILE(q3_k, evex)
STRATA_DECLARE_QTILE(q4_k, evex)
STRATA_DECLARE_QTILE(q5_k, evex)
STRATA_DECLARE_QTILE(q6_k, evex)
STRATA_DECLARE_QTILE(iq2_xxs, evex)
STRATA_DECLARE_QTILE(iq2_xs, evex)
STRATA_DECLARE_QTILE(iq2_s, evex)
STRATA_DECLARE_QTILE(iq3_xxs, evex)
STRATA_DECLARE_QTILE(iq3_s, evex)
STRATA_DECLARE_QTILE(iq1_s, evex)
STRATA_DECLARE_QTILE(iq1_m, evex)
STRATA_DECLARE_QTILE(iq4_nl, evex)
STRATA_DECLARE_QTILE(iq4_xs, evex)
STRATA_DECLARE_QTILE(tq1_0, evex)
STRATA_DECLARE_QTILE(tq2_0, evex)
STRATA_DECLARE_QTILE(nvfp4, evex)

STRATA_DECLARE_QTILE(f16, avx512)
STRATA_DECLARE_QTILE(bf16, avx512)
STRATA_DECLARE_QTILE(q4_0, avx512)
STRATA_DECLARE_QTILE(q8_0, avx512)
STRATA_DECLARE_QTILE(mxfp4, avx512)
STRATA_DECLARE_QTILE(iq4_nl, avx512)
STRATA_DECLARE_QTILE(q4_1, avx512)
STRATA_DECLARE_QTILE(q5_0, avx512)
STRATA_DECLARE_QTILE(q5_1, avx512)
STRATA_DECLARE_QTILE(q4_k, avx512)
STRATA_DECLARE_QTILE(q5_k, avx512)
STRATA_DECLARE_QTILE(q6_k, avx512)
/* Builds for CPUs other than x86: an AVX-512 kernel's name, running the scalar tile (qdot.c never
 * hands it out there: strata_resolve_impl refuses AVX512). */
#define STRATA_AVX512_FALLBACK(name)                                                                       \
    void strata_qdot_##name##_avx512(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,    \
                                     const uint8_t *restrict a, int64_t arb, int64_t n_tok,                \
                                     float *restrict y, int64_t ys) {                                      \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                  \
    }

/* The tile for calls (or a prefill tile's leftovers) of fewer than 8 tokens of `type` on an AVX-512
 * call: the planes tile where qdot.c hands those out (qdot_iq_planes.c), else the zmm decode
 * tile where it hands those out (qdot_kquant_zmm.c, qdot_iq4_xs_avx512.c, qdot_nvfp4_avx512.c; it passes
 * 4 tokens and more to the AVX2 build), else the gather tile where it hands those out (qdot_iq_vbmi.c:
 * strata_qdot_gathers), else `otherwise`. */
strata_qdot_tile_fn strata_qdot_few_tokens(int type, strata_qdot_tile_fn otherwise);
strata_qdot_tile_fn strata_qdot_gathers(int type, strata_qdot_tile_fn otherwise);

/* qdot_iq_vbmi.c: decode tiles of grid i-quants on AVX-512 VBMI machines */
STRATA_DECLARE_QTILE(iq3_xxs, vbmi)
STRATA_DECLARE_QTILE(iq2_xxs, vbmi)
STRATA_DECLARE_QTILE(iq2_xs, vbmi)
STRATA_DECLARE_QTILE(iq2_s, vbmi)
STRATA_DECLARE_QTILE(iq1_s, vbmi)
STRATA_DECLARE_QTILE(iq1_m, vbmi)
STRATA_DECLARE_QTILE(iq3_s, vbmi)

/* qdot_iq_planes.c: decode tiles by planes on AVX-512 VBMI machines */
STRATA_DECLARE_QTILE(iq2_xxs, planes)
STRATA_DECLARE_QTILE(iq3_xxs, planes)
STRATA_DECLARE_QTILE(iq3_s, planes)
STRATA_DECLARE_QTILE(iq2_xs, planes)
STRATA_DECLARE_QTILE(iq2_s, planes)
STRATA_DECLARE_QTILE(iq1_s, planes)
STRATA_DECLARE_QTILE(iq1_m, planes)

/* qdot_kquant_zmm.c: decode tiles of the K-quants and TQ2_0 on AVX-512 machines (qdot_kquant_zmm_gfni.c:
 * their build with GFNI) */
STRATA_DECLARE_QTILE(q2_k, kz)
STRATA_DECLARE_QTILE(q3_k, kz)
STRATA_DECLARE_QTILE(q4_k, kz)
STRATA_DECLARE_QTILE(q5_k, kz)
STRATA_DECLARE_QTILE(q6_k, kz)
STRATA_DECLARE_QTILE(tq2_0, kz)
STRATA_DECLARE_QTILE(q2_k, kzgfni)
STRATA_DECLARE_QTILE(q3_k, kzgfni)
STRATA_DECLARE_QTILE(q4_k, kzgfni)
STRATA_DECLARE_QTILE(q5_k, kzgfni)
STRATA_DECLARE_QTILE(q6_k, kzgfni)
STRATA_DECLARE_QTILE(tq2_0, kzgfni)
/* qdot_iq4_xs_avx512.c: IQ4_XS's decode tile on AVX-512 machines */
STRATA_DECLARE_QTILE(iq4_xs, zmm)
/* qdot_nvfp4_avx512.c: NVFP4's decode tile on AVX-512 machines */
STRATA_DECLARE_QTILE(nvfp4, zmm)

/* qdot_iq_vnni.c: the grid i-quants' and IQ4_XS's VNNI prefill tiles */
STRATA_DECLARE_QTILE(iq2_xxs, avx512)
STRATA_DECLARE_QTILE(iq2_xs, avx512)
STRATA_DECLARE_QTILE(iq2_s, avx512)
STRATA_DECLARE_QTILE(iq3_xxs, avx512)
STRATA_DECLARE_QTILE(iq3_s, avx512)
STRATA_DECLARE_QTILE(iq1_s, avx512)
STRATA_DECLARE_QTILE(iq1_m, avx512)
STRATA_DECLARE_QTILE(iq4_xs, avx512)
STRATA_DECLARE_QTILE(q2_k, avx512)
STRATA_DECLARE_QTILE(q3_k, avx512)

/* qdot_iq4_avx2_evex.c: TQ1_0 on 512-bit vectors */
STRATA_DECLARE_QTILE(tq1_0, avx512)

#endif
