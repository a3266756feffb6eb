/*
 * Quantized matrix kernels: the lookup table (weight format -> activation format and the kernels of
 * each family) and the single-threaded test entry points of strata.h (strata_qdot_rows and its
 * helpers). The kernels live in qdot_ref.c, qdot_avx2.c (and qdot_avx512.c); the pooled public
 * matmul and the fused MoE call are built on strata_qdot_find elsewhere. This file is compiled
 * without ISA extensions; it allocates only the per-thread buffer of re-laid activations.
 */
#include "strata.h"
#include "kernels.h"
#include "qdot.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Column of the kernel tables: scalar, AVX2, AVX-512. */
enum { COL_REF = 0, COL_AVX2 = 1, COL_AVX512 = 2, N_COLS = 3 };

typedef struct {
    int type, act;
    strata_qdot_tile_fn tile[N_COLS];   /* NULL: the family has no kernel of its own for the format */
    int avx2_on_avx512;   /* AVX2_DECODE | AVX2_PREFILL | AVX2_*_SPLIT: phases an AVX-512 call runs with the AVX2 tile */
    strata_qdot_tile_fn evex;   /* the AVX2 tile built for AVX-512 machines (qdot_avx2_common.h) */
} qdot_row;

/* Where an AVX-512 call runs the AVX2 tile, by measurement: AMD EPYC (Zen 4, AVX-512 VNNI/BF16),
 * 2 threads, `STRATA_AVX512_OWN_TILES=1 python benchmarks/qdot_rate.py --impls avx2 avx512
 * --alternate 3`, GB/s of weights, AVX2 vs AVX-512 tile, two runs where they were close:
 *            decode from DRAM               prefill (64 tokens)
 *   Q8_0     35.4 vs 23.9                   77.5 vs 89.1                 -> AVX2 decode
 *   Q4_K     34.1 vs 15.9                   61.6 vs 58.5, 62.1 vs 54.3   -> AVX2 both (prefill:
 *   Q5_K     31.3 vs 15.8                   59.1 vs 54.1, 68.2 vs 57.1   ->   on a split datapath)
 *   Q6_K     36.5 vs 11.0                   61.4 vs 95.6                 -> AVX2 decode
 * Q4_1, Q5_0 and Q5_1 joined Q4_0's 8-row tiles later (qdot_nib_avx512.c): on the Intel machine
 * 1.45-1.82x the AVX2 build at 1 token, 2.3-3.5x at 2-3, 1.8-1.9x at 8 and 64 (benchmarks/ab_builds.py,
 * one thread, 256 x 4096); two threads from DRAM 77-84% of the bare read against 43-51%; unmeasured
 * on Zen 4.
 * AVX-512's own kept: Q4_0 (decode 26.8 vs 23.6, prefill 64.6 vs 50.6), MXFP4 (decode 26.1 vs
 * 25.4, in cache 28.8 vs 20.0, prefill 65.8 vs 36.6), IQ4_NL (25.7 vs 21.7, 53.7 vs 34.5), F16 and
 * BF16 (decode 37.6 vs 26.0 and 32.1 vs 24.9; prefill 0.82x and 0.95x of AVX2's, but decode is most
 * of what float matrices do). Decode reads the weights once, so its rate is the
 * memory's, and the AVX2 tiles' fetch of the next tile ahead holds more of it than the zmm tiles'
 * per-row prefetch. STRATA_AVX512_OWN_TILES=1 ignores this column (for measuring it). The K-quants'
 * decode has since gone to zmm decode tiles of another make (ZMM_DECODE below) where 512-bit
 * operations are whole; the AVX2 build keeps it where they are split, and this column says so. */
#define AVX2_DECODE 1
#define AVX2_PREFILL 2
/* Prefill of Q4_K and Q5_K: the AVX2 tile everywhere since it runs over unpacked rows
 * (qdot_avx2_common.h). Before, it ran only where 512-bit operations are split in two halves (Zen
 * 4: Q4_K 50.6 vs 54.0, Q5_K 56.5 vs 64.9 GB/s, AVX-512 vs AVX2, 2 threads, prefill x64), the zmm
 * tiles being faster on the Intel Xeon (Q4_K 27.2 vs 18.5, Q5_K 28.2 vs 23.6). On that Intel
 * machine the AVX2 build over unpacked rows then took Q4_K to 75.0 GB/s against the zmm tile's 63.1,
 * Q5_K to 91.4 against 66.8 (`python benchmarks/qdot_rate.py --impls avx2 avx512 --alternate 3`,
 * table before and after); the old table against the new in one process (`benchmarks/ab_builds.py
 * --impl avx512`, one thread, 256 x 4096) at 5 / 8 / 16 / 64 tokens: Q4_K 1.10 / 1.05 / 1.15 /
 * 1.20x, Q5_K 1.29 / 1.14 / 1.27 / 1.38x. Q6_K's AVX2 build over unpacked rows was 1.01-1.17x its zmm
 * tile there, but on Zen 4 that tile prefilled at 1.56x the AVX2 build before the change (above),
 * more than the change gained on Intel (1.3-1.45x): it stays on the zmm tile, unmeasured on Zen 4. */
/* Decode runs the AVX2 tile only where 512-bit operations are split: TQ1_0's digits in zmm
 * registers decoded from DRAM at 10.3 vs 12.1 GB/s (in cache 9.2 vs 10.1) on that Zen 4, where the
 * Intel machine ran them 1.06x the AVX2 build (qdot_iq4_avx2.c). Its tile now takes the digit sums
 * without digits at 1-2 tokens, 1.49x the digits at 1 token on Intel (14.5 against 11.1 GB/s for
 * the AVX2 build, two threads from DRAM); unmeasured on Zen 4, which keeps the AVX2 build. */
#define AVX2_DECODE_SPLIT (AVX2_DECODE << 2)   /* a *_SPLIT flag is its phase's bit, two places up */

_Thread_local const uint8_t *strata_qdot_ahead_end;

const uint8_t *strata_qdot_ahead(void) { return strata_qdot_ahead_end; }

/* The calling thread's buffers of activations re-laid for a tile, one per layout (STRATA_RELAID_*:
 * the VNNI prefill tiles', qdot_iq_vnni.c, and the planes decode tile's, qdot_iq_planes.c), with
 * what each holds: made from `a` (n_tok tokens of k values, arb bytes apart) while the activation
 * serial was `serial`. Every write of activations anywhere bumps the one process-wide serial
 * (strata_qdot_new_acts), so a layout is reused only while no activations have changed since it
 * was made: gate and up of an expert, and every row block a thread takes of them, re-lay once.
 * Thread-locals are kept here, not in the AVX-512 files (see strata_qdot_ahead). */
static _Thread_local struct {
    uint8_t *buf;
    size_t cap;
    uint64_t serial;
    const uint8_t *a;
    int64_t n_tok, k, arb;
} relaid[STRATA_RELAID_LAYOUTS];
static atomic_uint_fast64_t act_serial = 1;

/* Frees a thread's buffers when the thread exits (pool workers come and go with their pools). */
static pthread_key_t relaid_key[STRATA_RELAID_LAYOUTS];
static pthread_once_t relaid_once = PTHREAD_ONCE_INIT;
static int relaid_key_ok;

static void relaid_key_make(void) {
    relaid_key_ok = 1;
    for (int l = 0; l < STRATA_RELAID_LAYOUTS; l++) relaid_key_ok &= pthread_key_create(&relaid_key[l], free) == 0;
}

void strata_qdot_new_acts(void) { atomic_fetch_add(&act_serial, 1); }

uint8_t *strata_qdot_relaid(const uint8_t *a, int64_t n_tok, int64_t k, int64_t arb, size_t bytes, int layout,
                            int *valid) {
    const uint64_t serial = atomic_load(&act_serial);   /* read before the activations are */
    *valid = 0;
    if (layout < 0 || layout >= STRATA_RELAID_LAYOUTS) return NULL;
    __typeof__(relaid[0]) *r = &relaid[layout];
    if (r->serial == serial && r->a == a && r->n_tok == n_tok && r->k == k && r->arb == arb && r->cap >= bytes) {
        *valid = 1;
        return r->buf;
    }
    if (r->cap < bytes) {
        void *p = NULL;
        pthread_once(&relaid_once, relaid_key_make);
        if (!relaid_key_ok || posix_memalign(&p, 64, bytes) != 0) return NULL;
        if (pthread_setspecific(relaid_key[layout], p) != 0) {
            free(p);
            return NULL;
        }
        free(r->buf);
        r->buf = p;
        r->cap = bytes;
    }
    r->serial = serial;
    r->a = a;
    r->n_tok = n_tok;
    r->k = k;
    r->arb = arb;
    return r->buf;
}

/* One row: type, activation format, kernel name, whether AVX-512 has a tile of its own (OWN or
 * NONE), the phases an AVX-512 call runs with the AVX2 tile. */
#define OWN(name) strata_qdot_##name##_avx512
#define NONE(name) NULL
#define ROW(T, ACT, name, avx512, on_avx2)                                                                   \
    {STRATA_T_##T, STRATA_ACT_##ACT, {strata_qdot_##name##_ref, strata_qdot_##name##_avx2, avx512(name)},   \
     on_avx2, strata_qdot_##name##_evex}

static const qdot_row TILES[] = {
    ROW(F32, F32, f32, NONE, 0),
    ROW(F16, F32, f16, OWN, 0),
    ROW(BF16, F32, bf16, OWN, 0),
    ROW(Q4_0, Q8, q4_0, OWN, 0),
    ROW(Q4_1, Q8, q4_1, OWN, 0),
    ROW(Q5_0, Q8, q5_0, OWN, 0),
    ROW(Q5_1, Q8, q5_1, OWN, 0),
    ROW(Q8_0, Q8, q8_0, OWN, AVX2_DECODE),
    ROW(MXFP4, Q8, mxfp4, OWN, 0),
    ROW(Q2_K, Q8K, q2_k, OWN, AVX2_DECODE),   /* prefill: qdot_iq_vnni.c's tiles; decode: ZMM_DECODE below */
    ROW(Q3_K, Q8K, q3_k, OWN, AVX2_DECODE),
    ROW(Q4_K, Q8K, q4_k, OWN, AVX2_DECODE | AVX2_PREFILL),
    ROW(Q5_K, Q8K, q5_k, OWN, AVX2_DECODE | AVX2_PREFILL),
    ROW(Q6_K, Q8K, q6_k, OWN, AVX2_DECODE),
    /* i-quants, ternary formats, NVFP4: scalar tiles in qdot_iq.c, AVX2 in qdot_iq_avx2.c (grid
     * i-quants) and qdot_iq4_avx2.c (code-book and ternary formats, NVFP4); AVX-512 machines run
     * their AVX-512 builds (qdot_*_evex.c), IQ4_NL its own 8-row tiles (qdot_nib_avx512.c), the
     * grid i-quants', IQ4_XS's (and Q2_K's, Q3_K's) prefill VNNI tiles over unpacked bytes
     * (qdot_iq_vnni.c; decode stays on the AVX2 build, which reads each block once and has no
     * tokens to share it with). The VNNI tiles prefill faster where 512-bit operations are split
     * too: on Zen 4 (2 threads, x64, GB/s, AVX2 build vs VNNI tile, `STRATA_VBMI=1
     * STRATA_AVX512_OWN_TILES=1 python benchmarks/qdot_rate.py --impls avx2 avx512 --alternate 3`)
     * IQ2_XXS 19.3 vs 61.4, IQ2_XS 21.3 vs 58.7, IQ2_S 23.8 vs 70.0, IQ3_XXS 28.9 vs 96.6, IQ3_S
     * 30.5 vs 101.0, IQ1_S 13.7 vs 47.7, IQ1_M 15.2 vs 43.8, IQ4_XS 51.1 vs 144.7, Q2_K 36.2 vs
     * 62.7, Q3_K 43.7 vs 104.4 (an earlier guess from llama.cpp's tiled path had kept the AVX2 build
     * there). The grid i-quants (IQ1_S to IQ3_S) decode with gather tiles of their own where the
     * CPU has VBMI, GFNI and fast gathers (VBMI_DECODE); on that Zen 4 the gathers lost: DRAM
     * 0.73-0.94x the AVX2 build (IQ1_M 1.06x), so strata_cpu_fast_gathers says no there. */
    ROW(IQ2_XXS, Q8K, iq2_xxs, OWN, AVX2_DECODE),
    ROW(IQ2_XS, Q8K, iq2_xs, OWN, AVX2_DECODE),
    ROW(IQ2_S, Q8K, iq2_s, OWN, AVX2_DECODE),
    ROW(IQ3_XXS, Q8K, iq3_xxs, OWN, AVX2_DECODE),
    ROW(IQ3_S, Q8K, iq3_s, OWN, AVX2_DECODE),
    ROW(IQ1_S, Q8K, iq1_s, OWN, AVX2_DECODE),
    ROW(IQ1_M, Q8K, iq1_m, OWN, AVX2_DECODE),
    ROW(IQ4_XS, Q8K, iq4_xs, OWN, AVX2_DECODE),   /* decode: ZMM_DECODE below */
    ROW(TQ1_0, Q8K, tq1_0, OWN, AVX2_PREFILL | AVX2_DECODE_SPLIT),   /* decode: 512-bit digits, qdot_iq4_avx2.c's EVEX build */
    ROW(TQ2_0, Q8K, tq2_0, NONE, 0),   /* decode: ZMM_DECODE below */
    ROW(IQ4_NL, Q8, iq4_nl, OWN, 0),
    ROW(NVFP4, Q8, nvfp4, NONE, 0),   /* decode: ZMM_DECODE below */
};

/* Decode tiles of the grid i-quants on AVX-512 machines with VBMI, GFNI and fast gathers
 * (qdot_iq_vbmi.c: each 64 values' grid rows in one gather), taken in place of the AVX2 build's
 * decode for STRATA_IMPL_AVX512, unless STRATA_VBMI=0 (for measuring). */
static const struct {
    int type;
    strata_qdot_tile_fn decode;
} VBMI_DECODE[] = {
    {STRATA_T_IQ2_XXS, strata_qdot_iq2_xxs_vbmi},
    {STRATA_T_IQ2_XS, strata_qdot_iq2_xs_vbmi},
    {STRATA_T_IQ2_S, strata_qdot_iq2_s_vbmi},
    {STRATA_T_IQ1_S, strata_qdot_iq1_s_vbmi},
    {STRATA_T_IQ1_M, strata_qdot_iq1_m_vbmi},
    {STRATA_T_IQ3_XXS, strata_qdot_iq3_xxs_vbmi},
    {STRATA_T_IQ3_S, strata_qdot_iq3_s_vbmi},
};

/* Decode tiles by planes (qdot_iq_planes.c: the grid looked up in registers against re-laid
 * activations), taken in place of the gather tile and the AVX2 build for STRATA_IMPL_AVX512 where
 * the CPU has VBMI and GFNI and does not split 512-bit operations (unmeasured on Zen 4, where
 * VPERMT2B is split too), unless STRATA_PLANES=0; STRATA_PLANES=1 takes them wherever the CPU has
 * VBMI and GFNI (both for measuring); IQ1_S's and IQ1_M's gather their codes, so they also need
 * fast gathers (or STRATA_PLANES=1). On the Intel machine, against the gather tiles, 1-7 tokens
 * (one thread, qdot_rows over 1024 x 4096): IQ2_XXS 1.29-1.74x, IQ2_XS 1.21-1.42x, IQ2_S 1.01-1.22x,
 * IQ1_S 1.32-1.50x, IQ1_M 1.05-1.37x, IQ3_XXS 1.43-1.63x, IQ3_S 1.17-1.33x; two threads from DRAM
 * (benchmarks/qdot_rate.py), decode at 52-56%, 44-45%, 38-40%, 29-30%, 28-29%, 58-59% and 56-57% of
 * the bare read, from 30%, 39%, 38-39%, 21-22%, 26%, 41% and 40-41% (benchmarks/RESULTS.md). */
static const struct {
    int type;
    strata_qdot_tile_fn decode;
    int gathers;   /* the tile gathers (IQ1's codes): only where gathers are fast, as qdot_iq_vbmi.c's */
} PLANES_DECODE[] = {
    {STRATA_T_IQ2_XXS, strata_qdot_iq2_xxs_planes, 0},
    {STRATA_T_IQ3_XXS, strata_qdot_iq3_xxs_planes, 0},
    {STRATA_T_IQ3_S, strata_qdot_iq3_s_planes, 0},
    {STRATA_T_IQ2_XS, strata_qdot_iq2_xs_planes, 0},
    {STRATA_T_IQ2_S, strata_qdot_iq2_s_planes, 0},
    {STRATA_T_IQ1_S, strata_qdot_iq1_s_planes, 1},
    {STRATA_T_IQ1_M, strata_qdot_iq1_m_planes, 1},
};

/* Activation quantizers per STRATA_ACT_* (F32 needs none). */
static const strata_qact_fn QACT[2][N_COLS] = {
    [STRATA_ACT_Q8] = {strata_qact_q8_ref, strata_qact_q8_avx2, strata_qact_q8_avx512},
    [STRATA_ACT_Q8K] = {strata_qact_q8k_ref, strata_qact_q8k_avx2, strata_qact_q8k_avx512},
};

/* The first non-NULL entry from column `col` down to the scalar one. */
static void *pick(void *const *cols, int col) {
    for (int c = col; c >= 0; c--)
        if (cols[c]) return cols[c];
    return NULL;
}

static const int COL_IMPL[N_COLS] = {STRATA_IMPL_SCALAR, STRATA_IMPL_AVX2, STRATA_IMPL_AVX512};

/* The family (STRATA_IMPL_*) of the kernel pick hands out for `row` from column `col` down. */
static int family_of(const qdot_row *row, int col) {
    while (col > 0 && !row->tile[col]) col--;
    return COL_IMPL[col];
}

/* The kernel of one phase for column `col` and its family: an AVX-512 call runs the AVX2 source
 * (its build for AVX-512 machines, row->evex: the same bytes) where the format has no AVX-512 tile
 * of its own or the table says the AVX2 tile is faster for the phase (`avx2`). */
static void phase_kernel(const qdot_row *row, int col, int avx2, strata_qdot_tile_fn *fn, int *family) {
    if (col == COL_AVX512 && row->evex && (avx2 || !row->tile[COL_AVX512])) {
        *fn = row->evex;
        *family = STRATA_IMPL_AVX2;
        return;
    }
    *fn = (strata_qdot_tile_fn)pick((void *const *)row->tile, col);
    *family = family_of(row, col);
}

/* STRATA_AVX512_OWN_TILES set (not "" or "0"): AVX-512 calls run AVX-512's own tiles everywhere. */
static int own_tiles(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *v = getenv("STRATA_AVX512_OWN_TILES");
        cached = v && *v && strcmp(v, "0") != 0;
    }
    return cached;
}

/* The VBMI decode tile of `type` where this CPU and the environment allow it, else NULL.
 * STRATA_VBMI=0 turns the tiles off, STRATA_VBMI=1 on wherever the CPU has VBMI and GFNI, even with
 * gathers strata_cpu_fast_gathers calls slow (both for measuring). */
static strata_qdot_tile_fn vbmi_decode(int type) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("STRATA_VBMI");
        const int forced = v && strcmp(v, "1") == 0, off = v && strcmp(v, "0") == 0;
        on = strata_cpu_has_avx512_vbmi() && (forced || strata_cpu_fast_gathers()) && !off;
    }
    for (size_t i = 0; on && i < sizeof(VBMI_DECODE) / sizeof(VBMI_DECODE[0]); i++)
        if (VBMI_DECODE[i].type == type) return VBMI_DECODE[i].decode;
    return NULL;
}

/* The planes decode tile of `type` where this CPU and the environment allow it, else NULL. */
static strata_qdot_tile_fn planes_decode(int type) {
    static int on = -1, gathers = 0;
    if (on < 0) {
        const char *v = getenv("STRATA_PLANES");
        const int forced = v && strcmp(v, "1") == 0, off = v && strcmp(v, "0") == 0;
        gathers = forced || strata_cpu_fast_gathers();
        on = strata_cpu_has_avx512_vbmi() && (forced || !strata_cpu_splits_512()) && !off;
    }
    for (size_t i = 0; on && i < sizeof(PLANES_DECODE) / sizeof(PLANES_DECODE[0]); i++)
        if (PLANES_DECODE[i].type == type) return PLANES_DECODE[i].gathers && !gathers ? NULL : PLANES_DECODE[i].decode;
    return NULL;
}

strata_qdot_tile_fn strata_qdot_gathers(int type, strata_qdot_tile_fn otherwise) {
    const strata_qdot_tile_fn gather = vbmi_decode(type);
    return gather ? gather : otherwise;
}

/* zmm decode tiles of formats whose decode had run the AVX2 build: the K-quants and TQ2_0
 * (qdot_kquant_zmm.c: 64 codes at a time in element order, VPDPBUSD against the activations as they
 * lie, sub-block scales on the sums packed to int16; its GFNI build where the CPU has VBMI and GFNI)
 * IQ4_XS (qdot_iq4_xs_avx512.c: 64 values a VPSHUFB against activations re-laid per call) and NVFP4
 * (qdot_nvfp4_avx512.c: a block a zmm, likewise),
 * taken in place of the AVX2 build's decode for STRATA_IMPL_AVX512 where the CPU does not split
 * 512-bit operations (unmeasured on Zen 4). STRATA_ZMM_DECODE=0 turns them off, =1 on wherever the
 * CPU has AVX-512, =plain takes the builds without GFNI (all for measuring and testing). On the
 * Intel machine, two threads from DRAM, share of the bare read, the AVX2 build's decode against
 * these (`benchmarks/qdot_rate.py`, two runs alternating with STRATA_ZMM_DECODE=0): Q2_K 49-52% ->
 * 66-80%, Q3_K 52-56% -> 67-77%, Q4_K 65% -> 81-89%, Q5_K 63-67% -> 85-92%, Q6_K 68-69% -> 97-104%,
 * TQ2_0 61-63% -> 74-88%, IQ4_XS 53-59% -> 89-92%, NVFP4 50-56% -> 62-63% (benchmarks/RESULTS.md). */
static const struct {
    int type;
    strata_qdot_tile_fn plain, gfni;
} ZMM_DECODE[] = {
    {STRATA_T_Q2_K, strata_qdot_q2_k_kz, strata_qdot_q2_k_kzgfni},
    {STRATA_T_Q3_K, strata_qdot_q3_k_kz, strata_qdot_q3_k_kzgfni},
    {STRATA_T_Q4_K, strata_qdot_q4_k_kz, strata_qdot_q4_k_kzgfni},
    {STRATA_T_Q5_K, strata_qdot_q5_k_kz, strata_qdot_q5_k_kzgfni},
    {STRATA_T_Q6_K, strata_qdot_q6_k_kz, strata_qdot_q6_k_kzgfni},
    {STRATA_T_TQ2_0, strata_qdot_tq2_0_kz, strata_qdot_tq2_0_kzgfni},
    {STRATA_T_IQ4_XS, strata_qdot_iq4_xs_zmm, strata_qdot_iq4_xs_zmm},
    {STRATA_T_NVFP4, strata_qdot_nvfp4_zmm, strata_qdot_nvfp4_zmm},
};

static strata_qdot_tile_fn zmm_decode(int type) {
    static int on = -1, gfni = 0;
    if (on < 0) {
        const char *v = getenv("STRATA_ZMM_DECODE");
        const int plain = v && strcmp(v, "plain") == 0;
        const int forced = v && (strcmp(v, "1") == 0 || plain), off = v && strcmp(v, "0") == 0;
        gfni = strata_cpu_has_avx512_vbmi() && !plain;
        on = (forced || !strata_cpu_splits_512()) && !off;
    }
    for (size_t i = 0; on && i < sizeof(ZMM_DECODE) / sizeof(ZMM_DECODE[0]); i++)
        if (ZMM_DECODE[i].type == type) return gfni ? ZMM_DECODE[i].gfni : ZMM_DECODE[i].plain;
    return NULL;
}

strata_qdot_tile_fn strata_qdot_few_tokens(int type, strata_qdot_tile_fn otherwise) {
    const strata_qdot_tile_fn planes = planes_decode(type), zmm = zmm_decode(type);
    return planes ? planes : zmm ? zmm : strata_qdot_gathers(type, otherwise);
}

/* Tiles of the AVX2 family on CPUs with AVX-VNNI (strata_cpu_avx_vnni; STRATA_AVX_VNNI=0 turns them
 * off), taken in place of the AVX2 tiles for STRATA_IMPL_AVX2 (decode: calls of fewer than
 * STRATA_QDOT_DECODE_TOKENS tokens; tile: the others; NULL: the AVX2 tile's). Measured on the Intel
 * machine, whose cores are Raptor Cove, the P-cores of Raptor Lake:
 *   - TQ1_0's decode: the digit sums without digits, two threads from DRAM at 61-62% of the bare read
 *     against the AVX2 tile's 43-44% (qdot_tq1_avxvnni.c);
 *   - the grid i-quants: qdot_iq_avx2.c built with AVX-VNNI (qdot_iq_avxvnni.c), one VPDPWSSD where a
 *     chunk's products took a VPMADDWD and an add; one thread, in cache, 256 x 4096, against the AVX2
 *     build (benchmarks/ab_builds.py --impl avx2): 1.04-1.07x at 1 token, 1.01-1.10x at 2, 1.05-1.17x
 *     at 3, 1.04-1.15x at 4, 1.02-1.07x at 5-8, 1.04-1.10x at 64, bit-equal; from DRAM on two threads
 *     1.01-1.09x (benchmarks/RESULTS.md). */
typedef struct {
    int type;
    strata_qdot_tile_fn decode, tile;
} avxvnni_row;

static const avxvnni_row AVXVNNI_TILES[] = {
    {STRATA_T_TQ1_0, strata_qdot_tq1_0_avxvnni, NULL},
    {STRATA_T_IQ2_XXS, strata_qdot_iq2_xxs_avxvnni, strata_qdot_iq2_xxs_avxvnni},
    {STRATA_T_IQ2_XS, strata_qdot_iq2_xs_avxvnni, strata_qdot_iq2_xs_avxvnni},
    {STRATA_T_IQ2_S, strata_qdot_iq2_s_avxvnni, strata_qdot_iq2_s_avxvnni},
    {STRATA_T_IQ3_XXS, strata_qdot_iq3_xxs_avxvnni, strata_qdot_iq3_xxs_avxvnni},
    {STRATA_T_IQ3_S, strata_qdot_iq3_s_avxvnni, strata_qdot_iq3_s_avxvnni},
    {STRATA_T_IQ1_S, strata_qdot_iq1_s_avxvnni, strata_qdot_iq1_s_avxvnni},
    {STRATA_T_IQ1_M, strata_qdot_iq1_m_avxvnni, strata_qdot_iq1_m_avxvnni},
};

/* The AVX-VNNI row of a type, or NULL (no such row, or the CPU lacks AVX-VNNI) */
static const avxvnni_row *avx_vnni_tiles(int type) {
    for (size_t i = 0; strata_cpu_avx_vnni() && i < sizeof(AVXVNNI_TILES) / sizeof(AVXVNNI_TILES[0]); i++)
        if (AVXVNNI_TILES[i].type == type) return &AVXVNNI_TILES[i];
    return NULL;
}

int strata_qdot_find(int weight_type, int impl, strata_qdot_kernels *out) {
    int col;
    if (impl == STRATA_IMPL_SCALAR) col = COL_REF;
    else if (impl == STRATA_IMPL_AVX2) col = COL_AVX2;
    else if (impl == STRATA_IMPL_AVX512) col = COL_AVX512;
    else return STRATA_E_ARG;
    if (!out) return STRATA_E_ARG;
    const strata_format_info *f = strata_format_find(weight_type);
    for (size_t i = 0; f && i < sizeof(TILES) / sizeof(TILES[0]); i++) {
        const qdot_row *row = &TILES[i];
        if (row->type != weight_type) continue;
        out->weight_type = weight_type;
        out->act = row->act;
        out->block_elems = f->block_elems;
        int on_avx2 = col == COL_AVX512 && !own_tiles() ? row->avx2_on_avx512 : 0;
        if (strata_cpu_splits_512()) on_avx2 |= on_avx2 >> 2;   /* the *_SPLIT phases join in */
        phase_kernel(row, col, on_avx2 & AVX2_PREFILL, &out->tile, &out->tile_family);
        phase_kernel(row, col, on_avx2 & AVX2_DECODE, &out->decode, &out->decode_family);
        const strata_qdot_tile_fn own = col == COL_AVX512 ? strata_qdot_few_tokens(weight_type, NULL) : NULL;
        if (own) {   /* a planes or gather decode tile */
            out->decode = own;
            out->decode_family = STRATA_IMPL_AVX512;
        }
        const avxvnni_row *vnni = col == COL_AVX2 ? avx_vnni_tiles(weight_type) : NULL;
        if (vnni && vnni->decode) out->decode = vnni->decode;   /* the AVX2 family still */
        if (vnni && vnni->tile) out->tile = vnni->tile;
        out->qact = row->act == STRATA_ACT_F32 ? NULL : (strata_qact_fn)pick((void *const *)QACT[row->act], col);
        return STRATA_OK;
    }
    return STRATA_E_TYPE;
}

int strata_qdot_has_kernel(int ggml_type, int impl) {
    const int col = impl == STRATA_IMPL_SCALAR ? COL_REF : impl == STRATA_IMPL_AVX2 ? COL_AVX2
                  : impl == STRATA_IMPL_AVX512 ? COL_AVX512 : -1;
    for (size_t i = 0; col >= 0 && i < sizeof(TILES) / sizeof(TILES[0]); i++)
        if (TILES[i].type == ggml_type) return TILES[i].tile[col] != NULL;
    return 0;
}

int strata_qdot_kernel_family(int ggml_type, int impl, int decode) {
    strata_qdot_kernels k;
    if (strata_qdot_find(ggml_type, impl, &k) != STRATA_OK) return -1;
    return decode ? k.decode_family : k.tile_family;
}

int strata_qdot_avx_vnni_tile(int ggml_type, int impl, int decode) {
    strata_qdot_kernels k;
    if (strata_qdot_find(ggml_type, impl, &k) != STRATA_OK) return -1;
    const avxvnni_row *row = impl == STRATA_IMPL_AVX2 ? avx_vnni_tiles(ggml_type) : NULL;
    const strata_qdot_tile_fn fn = decode ? k.decode : k.tile;
    return row && fn && (fn == row->decode || fn == row->tile);
}

int64_t strata_qact_row_bytes(int act, int64_t k) {
    switch (act) {
    case STRATA_ACT_Q8: return k / STRATA_QK * (int64_t)sizeof(strata_block_act_q8);
    case STRATA_ACT_Q8K: return k / STRATA_QK_K * (int64_t)sizeof(strata_block_act_q8k);
    case STRATA_ACT_F32: return k * 4;
    default: return -1;
    }
}

/* ---- Test entry points (strata.h) ---- */

/* a * b into *out; 0 on int64 overflow. */
static int mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }

/* Kernels, weight row bytes and activation row bytes of one call, after every check of the shape. */
static int plan(int ggml_type, int impl, int64_t n_rows, int64_t row_len, int64_t n_tokens,
                strata_qdot_kernels *k, int64_t *w_row_bytes, int64_t *a_row_bytes) {
    int resolved, st = strata_resolve_impl(impl, &resolved);
    if (st != STRATA_OK) return st;
    if ((st = strata_qdot_find(ggml_type, resolved, k)) != STRATA_OK) return st;
    if (n_rows < 0 || row_len < 0 || n_tokens < 0) return STRATA_E_ARG;
    if (row_len % k->block_elems) return STRATA_E_BLOCK;
    if (row_len > INT64_MAX / 4) return STRATA_E_SIZE;
    const strata_format_info *f = strata_format_find(ggml_type);
    if (!mul_ok(row_len / f->block_elems, f->block_bytes, w_row_bytes)) return STRATA_E_SIZE;
    *a_row_bytes = strata_qact_row_bytes(k->act, row_len);
    return STRATA_OK;
}

int strata_qdot_scratch_bytes(int ggml_type, int64_t n_tokens, int64_t row_len, int64_t *bytes) {
    strata_qdot_kernels k;
    int64_t w_row, a_row;
    if (!bytes) return STRATA_E_ARG;
    int st = plan(ggml_type, STRATA_IMPL_SCALAR, 0, row_len, n_tokens, &k, &w_row, &a_row);
    if (st != STRATA_OK) return st;
    if (k.act == STRATA_ACT_F32) a_row = 0;  /* the float rows are used as they are */
    return mul_ok(n_tokens, a_row, bytes) ? STRATA_OK : STRATA_E_SIZE;
}

int strata_qdot_quantize_act(int ggml_type, const float *x, int64_t x_bytes, int64_t n_tokens, int64_t row_len,
                             void *act, int64_t act_bytes, int impl) {
    strata_qdot_kernels k;
    int64_t w_row, a_row, x_need, a_need;
    int st = plan(ggml_type, impl, 0, row_len, n_tokens, &k, &w_row, &a_row);
    if (st != STRATA_OK) return st;
    if (!mul_ok(n_tokens, row_len * 4, &x_need) || !mul_ok(n_tokens, a_row, &a_need)) return STRATA_E_SIZE;
    if (x_bytes < x_need || act_bytes < a_need) return STRATA_E_SIZE;
    if ((x_need && !x) || (a_need && !act) || ((uintptr_t)act & 3) || ((uintptr_t)x & 3)) return STRATA_E_ARG;
    for (int64_t t = 0; t < n_tokens; t++) {
        if (k.act == STRATA_ACT_F32) memcpy((uint8_t *)act + t * a_row, x + t * row_len, (size_t)a_row);
        else k.qact(x + t * row_len, (uint8_t *)act + t * a_row, row_len);
    }
    return STRATA_OK;
}

int strata_qdot_rows(int ggml_type, const void *w, int64_t w_bytes, int64_t n_rows, int64_t row_len,
                     const float *x, int64_t x_bytes, int64_t n_tokens, float *y, int64_t y_bytes,
                     void *scratch, int64_t scratch_bytes, int impl) {
    strata_qdot_kernels k;
    int64_t w_row, a_row, w_need, x_need, y_need, s_need;
    int st = plan(ggml_type, impl, n_rows, row_len, n_tokens, &k, &w_row, &a_row);
    if (st != STRATA_OK) return st;
    if ((st = strata_qdot_scratch_bytes(ggml_type, n_tokens, row_len, &s_need)) != STRATA_OK) return st;
    if (n_rows > INT64_MAX / 4 || !mul_ok(n_rows, w_row, &w_need) || !mul_ok(n_tokens, row_len * 4, &x_need) ||
        !mul_ok(n_tokens, n_rows * 4, &y_need))
        return STRATA_E_SIZE;
    if (w_bytes < w_need || x_bytes < x_need || y_bytes < y_need || scratch_bytes < s_need) return STRATA_E_SIZE;
    if ((w_need && !w) || (x_need && !x) || (y_need && !y) || (s_need && !scratch)) return STRATA_E_ARG;
    if (((uintptr_t)x & 3) || ((uintptr_t)y & 3) || ((uintptr_t)scratch & 3)) return STRATA_E_ARG;
    if (y_need == 0) return STRATA_OK;
    if (row_len == 0) {
        memset(y, 0, (size_t)y_need);
        return STRATA_OK;
    }
    const uint8_t *a = (const uint8_t *)x;
    if (k.act != STRATA_ACT_F32) {
        strata_qdot_new_acts();
        for (int64_t t = 0; t < n_tokens; t++) k.qact(x + t * row_len, (uint8_t *)scratch + t * a_row, row_len);
        a = scratch;
    }
    strata_qdot_ahead_end = (const uint8_t *)w + n_rows * w_row;
    strata_qdot_tile_for(&k, n_tokens)(row_len, w, w_row, n_rows, a, a_row, n_tokens, y, n_rows);
    return STRATA_OK;
}
