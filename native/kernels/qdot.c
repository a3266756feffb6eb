/*
 * Quantized matrix kernels: the choice of a tile (strata_qdot_select: the table of quant types'
 * rows, qdot_table.c, generated from strata/quant_table.py, read against the CPU description of
 * cpu.c) and the single-threaded test entry points of strata.h (strata_qdot_rows and its helpers).
 * The tiles live in qdot_ref.c, qdot_iq.c, avx2/ and avx512/; the pooled public matmul and the fused
 * MoE call are built on strata_qdot_find elsewhere. This file is compiled without ISA extensions;
 * it allocates only the per-thread buffer of re-laid activations.
 */
#include "strata.h"
#include "kernels.h"
#include "qdot.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- The choice of a tile ---- */

/* Activation quantizers per STRATA_ACT_* (F32 needs none) and family (scalar, AVX2, AVX-512). */
static const strata_qact_fn QACT[2][3] = {
    [STRATA_ACT_Q8] = {strata_qact_q8_ref, strata_qact_q8_avx2, strata_qact_q8_avx512},
    [STRATA_ACT_Q8K] = {strata_qact_q8k_ref, strata_qact_q8k_avx2, strata_qact_q8k_avx512},
};

/* What a family's calls need of the CPU (index: STRATA_IMPL_* - 1). */
static const uint32_t FAMILY_NEEDS[3] = {0, STRATA_CPU_AVX2, STRATA_CPU_AVX2 | STRATA_CPU_AVX512};

static const strata_qdot_row *row_of(int type) {
    for (int i = 0; i < strata_qdot_table_rows; i++)
        if (strata_qdot_table[i].type == type) return &strata_qdot_table[i];
    return NULL;
}

/* The STRATA_WHEN_* conditions that hold on `cpu`: 512-bit operations whole (all but AMD family
 * 19h, Zen 4, which splits them in two halves), fast gathers, AMD family 1Ah (Zen 5). */
static uint32_t conditions(const strata_cpu_desc *cpu) {
    const int amd = cpu->vendor == 2;
    return (amd && cpu->family == 0x19 ? 0u : STRATA_WHEN_WHOLE_512) |
           (cpu->features & STRATA_CPU_FAST_GATHERS ? STRATA_WHEN_FAST_GATHERS : 0u) |
           (amd && cpu->family == 0x1A ? STRATA_WHEN_ZEN5 : 0u);
}

/* The first tile of a row's list that `cpu` runs and STRATA_KERNEL does not rule out: of a kind it
 * prefers if any, else the first whose conditions hold; -1 when none. */
static int first_of(const strata_qdot_row *row, int family, int phase, const strata_cpu_desc *cpu, uint32_t holds) {
    for (int prefer = 1; prefer >= 0; prefer--)
        for (int i = 0; i < row->list[family][phase].n; i++) {
            const strata_qdot_choice c = row->list[family][phase].c[i];
            const uint32_t bit = 1u << c.kind;
            if ((cpu->exclude & bit) || (strata_tile_kinds[c.kind].needs & ~cpu->features) || !row->tile[c.kind]) continue;
            if (prefer ? (cpu->prefer & bit) != 0 : (c.when & ~holds) == 0) return c.kind;
        }
    return -1;
}

/* The tile kind of a call of `family` (0 scalar, 1 AVX2, 2 AVX-512) and `n_tokens` tokens: from the
 * family's list, else (all ruled out) the family below's, down to the scalar twin. */
static int choose(const strata_qdot_row *row, int family, const strata_cpu_desc *cpu, int64_t n_tokens) {
    const int phase = n_tokens < STRATA_QDOT_DECODE_TOKENS ? STRATA_PHASE_DECODE : STRATA_PHASE_PREFILL;
    const uint32_t holds = conditions(cpu);
    for (int f = family; f > 0; f--) {
        const int kind = first_of(row, f, phase, cpu, holds);
        if (kind >= 0) return kind;
    }
    return STRATA_TILE_REF;
}

int strata_qdot_select(int ggml_type, int impl, const strata_cpu_desc *cpu, int64_t n_tokens) {
    const strata_qdot_row *row = row_of(ggml_type);
    if (!cpu) cpu = strata_cpu_here();
    if (impl == STRATA_IMPL_AUTO) impl = strata_impl_default();
    if (!row || impl < STRATA_IMPL_SCALAR || impl > STRATA_IMPL_AVX512 || (FAMILY_NEEDS[impl - 1] & ~cpu->features))
        return -1;
    return choose(row, impl - 1, cpu, n_tokens);
}

int strata_qdot_find(int weight_type, int impl, strata_qdot_kernels *out) {
    if (impl < STRATA_IMPL_SCALAR || impl > STRATA_IMPL_AVX512 || !out) return STRATA_E_ARG;
    const strata_qdot_row *row = row_of(weight_type);
    const strata_format_info *f = strata_format_find(weight_type);
    if (!row || !f) return STRATA_E_TYPE;
    const strata_cpu_desc *cpu = strata_cpu_here();
    const int tile = choose(row, impl - 1, cpu, STRATA_QDOT_DECODE_TOKENS), decode = choose(row, impl - 1, cpu, 1);
    out->weight_type = weight_type;
    out->act = row->act;
    out->block_elems = f->block_elems;
    out->tile = row->tile[tile];
    out->decode = row->tile[decode];
    out->tile_family = strata_tile_kinds[tile].family;
    out->decode_family = strata_tile_kinds[decode].family;
    out->qact = row->act == STRATA_ACT_F32 ? NULL : QACT[row->act][impl - 1];
    return STRATA_OK;
}

strata_qdot_tile_fn strata_qdot_few_tokens(int type, strata_qdot_tile_fn otherwise) {
    const strata_qdot_row *row = row_of(type);
    const int kind = row ? choose(row, STRATA_IMPL_AVX512 - 1, strata_cpu_here(), 1) : STRATA_TILE_REF;
    return strata_tile_kinds[kind].few_tokens ? row->tile[kind] : otherwise;
}

strata_qdot_tile_fn strata_qdot_gathers(int type, strata_qdot_tile_fn otherwise) {
    const strata_qdot_row *row = row_of(type);
    strata_cpu_desc cpu = *strata_cpu_here();
    cpu.exclude |= 1u << STRATA_TILE_PLANES;
    return row && choose(row, STRATA_IMPL_AVX512 - 1, &cpu, 1) == STRATA_TILE_VBMI ? row->tile[STRATA_TILE_VBMI] : otherwise;
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

/* One call of strata_qdot_rows with kernels `k` (after plan's checks of the shape). */
static int rows_with(const strata_qdot_kernels *k, int ggml_type, const void *w, int64_t w_bytes, int64_t w_row,
                     int64_t a_row, int64_t n_rows, int64_t row_len, const float *x, int64_t x_bytes, int64_t n_tokens,
                     float *y, int64_t y_bytes, void *scratch, int64_t scratch_bytes) {
    int64_t w_need, x_need, y_need, s_need;
    int st = strata_qdot_scratch_bytes(ggml_type, n_tokens, row_len, &s_need);
    if (st != STRATA_OK) return st;
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
    if (k->act != STRATA_ACT_F32) {
        strata_qdot_new_acts();
        for (int64_t t = 0; t < n_tokens; t++) k->qact(x + t * row_len, (uint8_t *)scratch + t * a_row, row_len);
        a = scratch;
    }
    strata_qdot_ahead_end = (const uint8_t *)w + n_rows * w_row;
    strata_qdot_tile_for(k, n_tokens)(row_len, w, w_row, n_rows, a, a_row, n_tokens, y, n_rows);
    return STRATA_OK;
}

int strata_qdot_rows(int ggml_type, const void *w, int64_t w_bytes, int64_t n_rows, int64_t row_len,
                     const float *x, int64_t x_bytes, int64_t n_tokens, float *y, int64_t y_bytes,
                     void *scratch, int64_t scratch_bytes, int impl) {
    strata_qdot_kernels k;
    int64_t w_row, a_row;
    const int st = plan(ggml_type, impl, n_rows, row_len, n_tokens, &k, &w_row, &a_row);
    if (st != STRATA_OK) return st;
    return rows_with(&k, ggml_type, w, w_bytes, w_row, a_row, n_rows, row_len, x, x_bytes, n_tokens, y, y_bytes,
                     scratch, scratch_bytes);
}

int strata_qdot_tile_rows(int ggml_type, int kind, const void *w, int64_t w_bytes, int64_t n_rows, int64_t row_len,
                          const float *x, int64_t x_bytes, int64_t n_tokens, float *y, int64_t y_bytes,
                          void *scratch, int64_t scratch_bytes) {
    strata_qdot_kernels k;
    int64_t w_row, a_row;
    const strata_qdot_row *row = row_of(ggml_type);
    if (kind < 0 || kind >= STRATA_TILE_KINDS) return STRATA_E_ARG;
    if (!row || !row->tile[kind]) return STRATA_E_TYPE;
    if (strata_tile_kinds[kind].needs & ~strata_cpu_here()->features) return STRATA_E_IMPL;
    const int st = plan(ggml_type, strata_tile_kinds[kind].family, n_rows, row_len, n_tokens, &k, &w_row, &a_row);
    if (st != STRATA_OK) return st;
    k.tile = k.decode = row->tile[kind];
    return rows_with(&k, ggml_type, w, w_bytes, w_row, a_row, n_rows, row_len, x, x_bytes, n_tokens, y, y_bytes,
                     scratch, scratch_bytes);
}
