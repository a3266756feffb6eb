/*
 * AVX-512 VBMI decode tiles of the grid i-quants IQ3_XXS and IQ3_S (interface: qdot.h; the formats'
 * integer formulation: qdot_iq.c; block layouts: common.h; grids: iq_tables.h).
 *
 * The AVX2 tiles (qdot_iq_avx2.c) build a chunk of 32 values from its grid rows by scalar loads
 * and inserts, and decode, which has one token to share a chunk with, is bound by that, not by
 * memory; IQ3's rows hold 4 values, so a chunk takes 8 rows. Here the grids stay in registers.
 * Every row of these grids is made of 8 levels, so a row is a code of 3 bits per value, 12 bits,
 * and the code table is two byte tables (its low and high bytes) of 256 entries (IQ3_XXS, 4 zmm)
 * or 512 (IQ3_S, 8 zmm). Per block of 256 values:
 *   - one load of the block's 64 index bytes is the index vector: VPERMI2B looks up 64 indices in
 *     128 entries, and blends by the index's bit 7 (and IQ3_S's bit 8, stored apart in qh, which
 *     is a mask as it lies) give all 64 low (high) code bytes;
 *   - per 64 values: VPERMT2B puts each two rows' code bytes in a qword, VPMULTISHIFTQB moves value
 *     j's code to the low bits of byte j, and VPERMB through a 64-entry table of levels (indexed by
 *     the low 6 bits, the code's and whatever lies above them) gives the magnitudes;
 *   - signs: IQ3_S's are stored as bits; IQ3_XXS's 7-bit ksigns indices are moved to bytes by
 *     VPMULTISHIFTQB and given their eighth bit, the parity of the seven (the ksigns table's rule),
 *     by one GF2P8AFFINEQB; each 64 values' sign bits are a mask (KMOVQ from memory) that a masked
 *     subtract applies to the activations;
 *   - the 4-bit sub-block scales become (2 ls + 1) * 0x10001, a dword per 32 values kept on the
 *     stack, and two dword broadcasts from there (one masked) put each 64 values' two weights over
 *     their int16 lanes.
 * Per token and 64 values: VPMADDUBSW (magnitudes <= 62 against |a| <= 127: pair sums < 2^15) and
 * VPDPWSSD with the weights, into one int32 accumulator per block: the block's integer sum is the
 * scalar one, converted per lane and added with one FMA scaled by (wd * ad) * factor as qdot_iq.c
 * forms it, so the result equals the scalar tile's up to the order of the float additions. The
 * byte permutes all need one port (port 5 on Intel cores); broadcasts and multiplies keep off it.
 *
 * Measured on the Intel machine (one thread, in cache, the tile against the AVX2 build's in one
 * process, ns per block): IQ3_XXS 20-22 against 24-43, IQ3_S 24-29 against 36-47. IQ2_XXS and
 * IQ2_XS (rows of 8 values: a chunk is only 4 rows, which the AVX2 build gathers cheaply) ran the
 * same way at 0.8-1.2x of their AVX2 build and stay there.
 *
 * Rows one at a time, every token of the call per block (these serve calls of fewer than
 * STRATA_QDOT_DECODE_TOKENS tokens; any count works), the rows to come fetched ahead as the AVX2
 * tiles do. The ISA is enabled for this translation unit only; qdot.c hands these tiles out only
 * after the CPU was seen to have AVX-512 VBMI and GFNI (strata_cpu_has_avx512_vbmi).
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

enum { IQ3_XXS, IQ3_S, N_FMT };

/* The code tables: low and high bytes of each grid row's code (value j's level index at bits
 * 3 j), and the levels (entry i: level i % 8, 64 entries for VPERMB). Made once when the library
 * loads, from iq_tables.h's grids. */
typedef struct {
    uint8_t lo[512], hi[512], levels[64];
} code_table;
static code_table codes[N_FMT] __attribute__((aligned(64)));

/* Codes of `n` grid rows of 4 values; the levels are the grid's 8 distinct values, ascending. */
static void make_codes(code_table *t, const uint8_t (*grid)[4], int n) {
    uint8_t lv[8];
    int n_lv = 0;
    for (int i = 0; i < 4 * n; i++) {
        int j = 0;
        while (j < n_lv && lv[j] != grid[i / 4][i % 4]) j++;
        if (j == n_lv && n_lv < 8) lv[n_lv++] = grid[i / 4][i % 4];
    }
    for (int a = 1; a < n_lv; a++)
        for (int b = a; b > 0 && lv[b - 1] > lv[b]; b--) {
            const uint8_t s = lv[b];
            lv[b] = lv[b - 1];
            lv[b - 1] = s;
        }
    for (int r = 0; r < n; r++) {
        unsigned code = 0;
        for (int j = 0; j < 4; j++) {
            int c = 0;
            while (c < n_lv - 1 && lv[c] != grid[r][j]) c++;
            code |= (unsigned)c << (3 * j);
        }
        t->lo[r] = (uint8_t)code;
        t->hi[r] = (uint8_t)(code >> 8);
    }
    for (int i = 0; i < 64; i++) t->levels[i] = i % 8 < n_lv ? lv[i % 8] : 0;
}

__attribute__((constructor)) static void make_tables(void) {
    make_codes(&codes[IQ3_XXS], strata_iq3xxs_grid, 256);
    make_codes(&codes[IQ3_S], strata_iq3s_grid, 512);
}

INLINE __m512i bytes64(const void *b) { return _mm512_loadu_si512(b); }

/* A byte table of 512 entries (the first 4 zmm enough for 256), looked up by 64 indices at once:
 * bits 0-6 of each index byte, bit 7 from `b7`, bit 8 from `b8` (where `wide`). */
INLINE __m512i lookup(const __m512i *t, int wide, __m512i idx, __mmask64 b7, __mmask64 b8) {
    const __m512i low = _mm512_mask_blend_epi8(b7, _mm512_permutex2var_epi8(t[0], idx, t[1]),
                                               _mm512_permutex2var_epi8(t[2], idx, t[3]));
    if (!wide) return low;
    const __m512i high = _mm512_mask_blend_epi8(b7, _mm512_permutex2var_epi8(t[4], idx, t[5]),
                                                _mm512_permutex2var_epi8(t[6], idx, t[7]));
    return _mm512_mask_blend_epi8(b8, low, high);
}

/* A format's constants: code tables, levels and the control vectors named in the header. Values
 * 64 z .. 64 z + 63 are rows 16 z .. 16 z + 15, two to a qword (bytes lo0 hi0 lo1 hi1). */
typedef struct {
    __m512i lo[8], hi[8], levels;
    __m512i place[4];   /* VPERMT2B: code bytes of 64 values' rows into their qwords */
    __m512i shift;      /* VPMULTISHIFTQB: value j's code to byte j's low bits */
    __m512i sign_at;    /* VPMULTISHIFTQB: IQ3_XXS's ksigns fields to bytes (two aux dwords a qword) */
} consts;

static void make_consts(int fmt, consts *k) {
    uint8_t place[4][64], shift[64], sign_at[64];
    for (int z = 0; z < 4; z++)
        for (int i = 0; i < 64; i++)   /* low byte from lo, high from hi */
            place[z][i] = (uint8_t)((16 * z + 2 * (i / 8) + (i % 8 >= 2)) | (i % 2 ? 64 : 0));
    for (int i = 0; i < 64; i++) {
        const int j = i % 8;
        shift[i] = (uint8_t)(j < 4 ? 3 * j : 16 + 3 * (j - 4));
        sign_at[i] = (uint8_t)(32 * (j / 4) + 7 * (j % 4));
    }
    const code_table *t = &codes[fmt];
    for (int i = 0; i < 8; i++) {
        k->lo[i] = bytes64(t->lo + 64 * i);
        k->hi[i] = bytes64(t->hi + 64 * i);
    }
    k->levels = bytes64(t->levels);
    for (int z = 0; z < 4; z++) k->place[z] = bytes64(place[z]);
    k->shift = bytes64(shift);
    k->sign_at = bytes64(sign_at);
}

/* Every cache line of the block PF_AHEAD bytes on, unless that lies past this thread's rows. */
INLINE void fetch_ahead(const uint8_t *p, int64_t bs, const uint8_t *ahead_end) {
    const uint8_t *pf = p + PF_AHEAD;
    if (pf + bs > ahead_end) return;
    for (int64_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)pf + o, _MM_HINT_T0);
    _mm_prefetch((const char *)pf + bs - 1, _MM_HINT_T0);
}

/* GF2P8AFFINEQB's matrix for bits 0-6 kept and bit 7 = their parity (row i in byte 7 - i). */
#define KEEP7_PARITY 0x010204081020407Fll

/* A block's 64 values z: magnitudes (mag), int16 sub-block weights (w), and the sign bits of all
 * 256 values (sg, value 8 g + j negative where bit j of byte g is set). */
typedef struct {
    __m512i mag[4], w[4];
    uint8_t sg[64] __attribute__((aligned(64)));
    uint32_t sc[16] __attribute__((aligned(64)));
} unpacked;

INLINE void unpack(int fmt, const consts *k, const uint8_t *p, unpacked *u) {
    const __m512i idx = bytes64(p + 2);   /* both formats' 64 index bytes follow d */
    __mmask64 b8 = 0;
    __m512i ls;   /* a dword per 32 values: its ls in the low bits, 0 above */
    if (fmt == IQ3_XXS) {
        const __m512i aux = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)((const strata_block_iq3_xxs *)p)->aux));
        _mm512_store_si512((void *)u->sg, _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(k->sign_at, aux),
                                                                        _mm512_set1_epi64(KEEP7_PARITY), 0));
        ls = _mm512_srli_epi32(aux, 28);
    } else {   /* IQ3_S: stored sign bits, the 9th index bits in qh, a nibble per 32 values */
        const strata_block_iq3_s *b = (const strata_block_iq3_s *)p;
        b8 = _load_mask64((__mmask64 *)(uintptr_t)b->qh);
        _mm512_store_si512((void *)u->sg, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)b->signs)));
        uint32_t s4;
        memcpy(&s4, b->scales, 4);
        ls = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)s4),
                                                _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0)),
                              _mm512_set1_epi32(15));
    }
    const __mmask64 b7 = _mm512_movepi8_mask(idx);
    const int wide = fmt == IQ3_S;
    const __m512i lo = lookup(k->lo, wide, idx, b7, b8), hi = lookup(k->hi, wide, idx, b7, b8);
    /* (2 ls + 1) * 0x10001: the weight in both int16 halves of its dword */
    _mm512_store_si512((void *)u->sc, _mm512_add_epi32(_mm512_mullo_epi32(ls, _mm512_set1_epi32(0x20002)),
                                                       _mm512_set1_epi32(0x10001)));
#pragma GCC unroll 4
    for (int z = 0; z < 4; z++) {
        const __m512i code = _mm512_permutex2var_epi8(lo, k->place[z], hi);
        u->mag[z] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(k->shift, code), k->levels);
        u->w[z] = _mm512_mask_mov_epi32(_mm512_set1_epi32((int)u->sc[2 * z]), 0xFF00, _mm512_set1_epi32((int)u->sc[2 * z + 1]));
    }
}

/* One weight row (k values at w) against nt <= MAX_TOK tokens: y[t * ys]. */
INLINE void vbmi_tile(int fmt, const consts *kc, int64_t bs, float factor, int nt, int64_t k, const uint8_t *w,
                      const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    const uint8_t *ahead_end = strata_qdot_ahead();   /* not the thread-local itself: qdot_avx2_common.h */
    __m512 acc[MAX_TOK];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / STRATA_QK_K; b++) {
        const uint8_t *p = w + b * bs;
        fetch_ahead(p, bs, ahead_end);
        unpacked u;
        unpack(fmt, kc, p, &u);
        const float wd = _cvtsh_ss((uint16_t)(p[0] | p[1] << 8));
        for (int t = 0; t < nt; t++) {
            const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
            __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int z = 0; z < 4; z++) {   /* the mask loaded from memory (KMOVQ k, m64), not moved from a GPR */
                const __mmask64 neg = _load_mask64((__mmask64 *)(u.sg + 8 * z));
                const __m512i av = _mm512_loadu_si512((const void *)(ab->q + 64 * z));
                const __m512i sa = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(u.mag[z], sa), u.w[z]);
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(wd * ab->d * factor), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[t * ys] = _mm512_reduce_add_ps(acc[t]);
}

INLINE void vbmi_rows(int fmt, int64_t bs, float factor, int64_t k, const uint8_t *w, int64_t wrb, int64_t n_rows,
                      const uint8_t *a, int64_t arb, int64_t n_tok, float *y, int64_t ys) {
    consts kc;
    make_consts(fmt, &kc);
    for (int64_t t = 0; t < n_tok; t += MAX_TOK) {
        const int nt = n_tok - t < MAX_TOK ? (int)(n_tok - t) : MAX_TOK;
        for (int64_t r = 0; r < n_rows; r++) {
            const uint8_t *wr = w + r * wrb;
            if (nt == 1) vbmi_tile(fmt, &kc, bs, factor, 1, k, wr, a + t * arb, arb, y + t * ys + r, ys);
            else vbmi_tile(fmt, &kc, bs, factor, nt, k, wr, a + t * arb, arb, y + t * ys + r, ys);
        }
    }
}

#define DEFINE_VBMI(name, fmt, wtype, factor)                                                                 \
    void strata_qdot_##name##_vbmi(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,        \
                                   const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, \
                                   int64_t ys) {                                                            \
        vbmi_rows(fmt, (int64_t)sizeof(wtype), factor, k, w, wrb, n_rows, a, arb, n_tok, y, ys);            \
    }
#else /* not x86: the names exist so the library links; qdot.c never hands them out */
#define DEFINE_VBMI(name, fmt, wtype, factor)                                                                 \
    void strata_qdot_##name##_vbmi(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,        \
                                   const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, \
                                   int64_t ys) {                                                            \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                  \
    }
#endif

DEFINE_VBMI(iq3_xxs, IQ3_XXS, strata_block_iq3_xxs, 0.25f)
DEFINE_VBMI(iq3_s, IQ3_S, strata_block_iq3_s, 1.0f)
