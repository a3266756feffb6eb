/*
 * AVX-512 VBMI decode tiles of the grid i-quants IQ2_XXS and IQ3_XXS (interface: qdot.h; the
 * formats' integer formulation: qdot_iq.c; block layouts: common.h; grids: iq_tables.h).
 *
 * The AVX2 tiles (qdot_iq_avx2.c) build a chunk of 32 values from its grid rows by scalar loads
 * and inserts, three or four shuffle-port instructions per 32 values, and decode, which has one
 * token to share a chunk with, is bound by that, not by memory (about a fifth of a bare read).
 * Here the grids stay in registers. Every grid row of these two formats is made of a few levels
 * (IQ2_XXS: 3 of 8 bits each, IQ3_XXS: 8), so a row is a code of 2 or 3 bits per value, 16 or 12
 * bits per row, and the code table is two byte tables of 256 entries (its low and high bytes),
 * four zmm each. Per block:
 *   - one load of the block's index bytes is the index vector: VPERMI2B looks up 64 indices in
 *     128 entries, two of them and a blend by the index's top bit give all 64 low (high) bytes;
 *   - per 64 values: VPERMT2B puts each row's two code bytes where its values go (one row per
 *     qword for IQ2_XXS, two for IQ3_XXS), VPMULTISHIFTQB moves value j's code to the low bits of
 *     byte j, and VPERMB through a 64-entry table of levels (indexed by the low 6 bits, the code's
 *     bits and whatever lies above them) gives the magnitudes;
 *   - the 7-bit ksigns indices are moved to bytes by VPMULTISHIFTQB and given their eighth bit,
 *     the parity of the seven (the ksigns table's rule), by one GF2P8AFFINEQB; each 64 values'
 *     sign bits become a mask that a masked subtract applies to the activations;
 *   - the 4-bit sub-block scales become (2 ls + 1) * 0x10001 by a shift and a multiply, one dword per
 *     sub-block kept on the stack, and two dword broadcasts from there (one masked) put each 64
 *     values' two weights over their int16 lanes.
 * Shifts, multiplies, broadcasts and GF2P8AFFINEQB keep off the port that the byte permutes all need
 * (port 5 on Intel cores), which bounds these tiles: 4 VPERMT2B of the lookups and, per 64 values,
 * a VPERMT2B, a VPMULTISHIFTQB and a VPERMB.
 * Per token and 64 values: VPMADDUBSW (magnitudes <= 62 against |a| <= 127: pair sums < 2^15) and
 * VPDPWSSD with the scales, into one int32 accumulator per block: the block's integer sum is the
 * scalar one, converted per lane and added with one FMA scaled by (wd * ad) * factor as qdot_iq.c
 * forms it, so the result equals the scalar tile's up to the order of the float additions.
 *
 * Rows one at a time, every token of the call per block (these serve calls of fewer than
 * STRATA_QDOT_DECODE_TOKENS tokens; any count works), the rows to come fetched ahead as the AVX2
 * tiles do. The ISA is enabled for this translation unit only; qdot.c hands these tiles out only
 * after the CPU was seen to have AVX-512 VBMI (strata_cpu_has_avx512_vbmi).
 */
#include "iq_tables.h"
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")
#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define MAX_TOK 8                 /* tokens per pass over a row */
#define PF_AHEAD 1024             /* bytes ahead fetched into the rows to come */

/* The code tables: low and high bytes of each grid row's code (value j's level index at bits
 * bits * j), and the levels (entry i: level i % n_levels, 64 entries for VPERMB). Made once when
 * the library loads, from iq_tables.h's grids. */
typedef struct {
    uint8_t lo[256], hi[256], levels[64];
} code_table;
static code_table iq2_xxs_codes __attribute__((aligned(64)));
static code_table iq3_xxs_codes __attribute__((aligned(64)));

/* Codes of `n` grid rows of `width` values each; the levels are the distinct values in order. */
static void make_codes(code_table *t, const uint8_t *grid, int n, int width, int bits) {
    uint8_t lv[8];
    int n_lv = 0;
    for (int i = 0; i < n * width; i++) {
        int j = 0;
        while (j < n_lv && lv[j] != grid[i]) j++;
        if (j == n_lv) lv[n_lv++] = grid[i];   /* the grids have 3 and 8 levels */
    }
    for (int a = 1; a < n_lv; a++)   /* ascending */
        for (int b = a; b > 0 && lv[b - 1] > lv[b]; b--) {
            const uint8_t s = lv[b];
            lv[b] = lv[b - 1];
            lv[b - 1] = s;
        }
    for (int r = 0; r < n; r++) {
        unsigned code = 0;
        for (int j = 0; j < width; j++) {
            int c = 0;
            while (lv[c] != grid[r * width + j]) c++;
            code |= (unsigned)c << (bits * j);
        }
        t->lo[r] = (uint8_t)code;
        t->hi[r] = (uint8_t)(code >> 8);
    }
    const int span = 1 << bits;
    for (int i = 0; i < 64; i++) t->levels[i] = i % span < n_lv ? lv[i % span] : 0;
}

__attribute__((constructor)) static void make_tables(void) {
    make_codes(&iq2_xxs_codes, &strata_iq2xxs_grid[0][0], 256, 8, 2);
    make_codes(&iq3_xxs_codes, &strata_iq3xxs_grid[0][0], 256, 4, 3);
}

/* A 256-entry byte table in four zmm, looked up by 64 byte indices at once. */
typedef struct {
    __m512i t[4];
} table256;

INLINE table256 load_table(const uint8_t *p) {
    table256 t;
    for (int i = 0; i < 4; i++) t.t[i] = _mm512_load_si512((const void *)(p + 64 * i));
    return t;
}

INLINE __m512i lookup256(const table256 *t, __m512i idx, __mmask64 top) {
    return _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(t->t[0], idx, t->t[1]),
                                  _mm512_permutex2var_epi8(t->t[2], idx, t->t[3]));
}

/* Constants of a format: the code tables and the control vectors named in the header. */
typedef struct {
    table256 lo, hi;
    __m512i levels;
    __m512i place[4];   /* VPERMT2B: code bytes of 64 values' rows into their qwords */
    __m512i shift;      /* VPMULTISHIFTQB: value j's code to byte j's low bits */
    __m512i sign_at;    /* VPMULTISHIFTQB: the ksigns fields to bytes */
    __m512i pack;       /* VPERMB: the sign bytes in value order (IQ2_XXS) */
} consts;

INLINE __m512i bytes64(const uint8_t *b) { return _mm512_loadu_si512((const void *)b); }

/* IQ2_XXS: qs holds per 32 values 4 grid indices (bytes 8 c .. 8 c + 3) and u32 aux (8 c + 4):
 * 4 x 7-bit ksigns, ls in bits 28-31. Values 64 z .. 64 z + 63 are rows 8 z .. 8 z + 7, chunks
 * 2 z and 2 z + 1. */
static void consts_iq2_xxs(consts *k) {
    uint8_t place[4][64], shift[64], sign_at[64], pack[64];
    for (int z = 0; z < 4; z++)
        for (int i = 0; i < 64; i++) {
            const int row = i / 8, pos = 16 * z + 8 * (row / 4) + row % 4;   /* the row's index byte */
            place[z][i] = (uint8_t)(pos | (i % 2 ? 64 : 0));                 /* lo, hi, lo, hi, ... */
        }
    for (int i = 0; i < 64; i++) {
        shift[i] = (uint8_t)(2 * (i % 8));
        sign_at[i] = (uint8_t)(32 + 7 * (i % 8 < 4 ? i % 8 : 0));
        pack[i] = (uint8_t)(8 * (i / 4 % 8) + i % 4);
    }
    k->lo = load_table(iq2_xxs_codes.lo);
    k->hi = load_table(iq2_xxs_codes.hi);
    k->levels = bytes64(iq2_xxs_codes.levels);
    for (int z = 0; z < 4; z++) {
        k->place[z] = bytes64(place[z]);
    }
    k->shift = bytes64(shift);
    k->sign_at = bytes64(sign_at);
    k->pack = bytes64(pack);
}

/* IQ3_XXS: qs holds a grid index per 4 values (64 bytes, in order), aux per 32 values a u32 as
 * IQ2_XXS's. Values 64 z .. 64 z + 63 are rows 16 z .. 16 z + 15, two to a qword. */
static void consts_iq3_xxs(consts *k) {
    uint8_t place[4][64], shift[64], sign_at[64];
    for (int z = 0; z < 4; z++)
        for (int i = 0; i < 64; i++) {
            const int row = 16 * z + 2 * (i / 8) + (i % 8 >= 2);
            place[z][i] = (uint8_t)(row | (i % 2 ? 64 : 0));   /* bytes: lo0 hi0 lo1 hi1, then unused */
        }
    for (int i = 0; i < 64; i++) {
        shift[i] = (uint8_t)(i % 8 < 4 ? 3 * (i % 8) : 16 + 3 * (i % 8 - 4));
        sign_at[i] = (uint8_t)(32 * (i % 8 / 4) + 7 * (i % 4));
    }
    k->lo = load_table(iq3_xxs_codes.lo);
    k->hi = load_table(iq3_xxs_codes.hi);
    k->levels = bytes64(iq3_xxs_codes.levels);
    for (int z = 0; z < 4; z++) {
        k->place[z] = bytes64(place[z]);
    }
    k->shift = bytes64(shift);
    k->sign_at = bytes64(sign_at);
    k->pack = _mm512_setzero_si512();
}

/* Every cache line of the block PF_AHEAD bytes on, unless that lies past this thread's rows. */
INLINE void fetch_ahead(const uint8_t *p, int64_t bs, const uint8_t *ahead_end) {
    const uint8_t *pf = p + PF_AHEAD;
    if (pf + bs > ahead_end) return;
    for (int64_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)pf + o, _MM_HINT_T0);
    _mm_prefetch((const char *)pf + bs - 1, _MM_HINT_T0);
}

INLINE float half_to_f32(uint16_t h) { return _cvtsh_ss(h); }

/* A block's 64 values z: magnitudes (mag) and int16 sub-block weights (w); the sign bits of all
 * 256 values (sg, value 8 g + j negative where bit j of byte g is set). */
typedef struct {
    __m512i mag[4], w[4];
    uint8_t sg[64] __attribute__((aligned(64)));
    uint32_t sc[16] __attribute__((aligned(64)));
} unpacked;

/* GF2P8AFFINEQB's matrix for bits 0-6 kept and bit 7 = their parity (row i in byte 7 - i). */
#define KEEP7_PARITY 0x010204081020407Fll

/* idx: the block's grid indices (one per byte, IQ2_XXS's aux bytes among them, looked up for
 * nothing); fields: the qwords that hold the ksigns fields; ls: each sub-block's ls in the low
 * bits of dword `st` c (the rest of the dword 0). */
INLINE void unpack(const consts *k, int iq2, __m512i idx, __m512i fields, __m512i ls, unpacked *u) {
    const __mmask64 top = _mm512_movepi8_mask(idx);
    const __m512i lo = lookup256(&k->lo, idx, top), hi = lookup256(&k->hi, idx, top);
    __m512i signs = _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(k->sign_at, fields),
                                                  _mm512_set1_epi64(KEEP7_PARITY), 0);
    if (iq2) signs = _mm512_permutexvar_epi8(k->pack, signs);
    _mm512_store_si512((void *)u->sg, signs);
    /* (2 ls + 1) * 0x10001: one multiply of the qword lanes (IQ2_XXS), of the dword lanes (IQ3_XXS) */
    const __m512i lsw = iq2 ? _mm512_mul_epu32(ls, _mm512_set1_epi64(0x20002)) : _mm512_mullo_epi32(ls, _mm512_set1_epi32(0x20002));
    _mm512_store_si512((void *)u->sc, _mm512_add_epi32(lsw, _mm512_set1_epi32(0x10001)));
    const int st = iq2 ? 2 : 1;
    for (int z = 0; z < 4; z++) {
        const __m512i codes = _mm512_permutex2var_epi8(lo, k->place[z], hi);
        u->mag[z] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(k->shift, codes), k->levels);
        u->w[z] = _mm512_mask_mov_epi32(_mm512_set1_epi32((int)u->sc[st * 2 * z]), 0xFF00,
                                        _mm512_set1_epi32((int)u->sc[st * (2 * z + 1)]));
    }
}

/* One weight row (k values at w) against nt <= MAX_TOK tokens: y[t * ys]. */
INLINE void vbmi_tile(const consts *kc, int iq2, int64_t bs, float factor, int nt, int64_t k, const uint8_t *w,
                      const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    const uint8_t *ahead_end = strata_qdot_ahead();   /* not the thread-local itself: qdot_avx2_common.h */
    __m512 acc[MAX_TOK];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / STRATA_QK_K; b++) {
        const uint8_t *p = w + b * bs;
        fetch_ahead(p, bs, ahead_end);
        unpacked u;
        const __m512i qs = _mm512_loadu_si512((const void *)(p + 2));
        const __m512i fields = iq2 ? qs : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 66)));
        const __m512i ls = iq2 ? _mm512_srli_epi64(qs, 60) : _mm512_srli_epi32(fields, 28);
        unpack(kc, iq2, qs, fields, ls, &u);
        const float wd = half_to_f32((uint16_t)(p[0] | p[1] << 8));
        for (int t = 0; t < nt; t++) {
            const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
            __m512i isum = _mm512_setzero_si512();
            for (int z = 0; z < 4; z++) {
                uint64_t bits;
                memcpy(&bits, u.sg + 8 * z, 8);
                const __m512i av = _mm512_loadu_si512((const void *)(ab->q + 64 * z));
                const __m512i sa = _mm512_mask_sub_epi8(av, _cvtu64_mask64(bits), _mm512_setzero_si512(), av);
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(u.mag[z], sa), u.w[z]);
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(wd * ab->d * factor), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[t * ys] = _mm512_reduce_add_ps(acc[t]);
}

INLINE void vbmi_rows(const consts *kc, int iq2, int64_t bs, float factor, int64_t k, const uint8_t *w, int64_t wrb,
                      int64_t n_rows, const uint8_t *a, int64_t arb, int64_t n_tok, float *y, int64_t ys) {
    for (int64_t t = 0; t < n_tok; t += MAX_TOK) {
        const int nt = n_tok - t < MAX_TOK ? (int)(n_tok - t) : MAX_TOK;
        for (int64_t r = 0; r < n_rows; r++) {
            const uint8_t *wr = w + r * wrb;
            if (nt == 1) vbmi_tile(kc, iq2, bs, factor, 1, k, wr, a + t * arb, arb, y + t * ys + r, ys);
            else vbmi_tile(kc, iq2, bs, factor, nt, k, wr, a + t * arb, arb, y + t * ys + r, ys);
        }
    }
}

void strata_qdot_iq2_xxs_vbmi(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                              const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    consts kc;
    consts_iq2_xxs(&kc);
    vbmi_rows(&kc, 1, (int64_t)sizeof(strata_block_iq2_xxs), 0.125f, k, w, wrb, n_rows, a, arb, n_tok, y, ys);
}

void strata_qdot_iq3_xxs_vbmi(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                              const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    consts kc;
    consts_iq3_xxs(&kc);
    vbmi_rows(&kc, 0, (int64_t)sizeof(strata_block_iq3_xxs), 0.25f, k, w, wrb, n_rows, a, arb, n_tok, y, ys);
}

#else /* not x86: the names exist so the library links; qdot.c never hands them out */

void strata_qdot_iq2_xxs_vbmi(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                              const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    (void)k, (void)w, (void)wrb, (void)n_rows, (void)a, (void)arb, (void)n_tok, (void)y, (void)ys;
}
void strata_qdot_iq3_xxs_vbmi(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                              const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    (void)k, (void)w, (void)wrb, (void)n_rows, (void)a, (void)arb, (void)n_tok, (void)y, (void)ys;
}
#endif
