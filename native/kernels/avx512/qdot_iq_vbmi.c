/*
 * AVX-512 decode tiles of the grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S)
 * by gathers (interface: qdot.h; the formats' integer formulation: qdot_iq.c; block layouts:
 * common.h; grids: iq_tables.h).
 *
 * The AVX2 tiles (qdot_iq_avx2.c) build a chunk of 32 values from its grid rows by scalar loads
 * and inserts, and decode, which has one token to share a chunk with, is bound by those inserts
 * (the shuffle port), not by memory. Here each 64 values' grid rows come in one VPGATHERQQ (8 rows
 * of 8 values, IQ1 and IQ2) or VPGATHERDD (16 rows of 4 values, IQ3) of their indices, whose loads
 * keep off that port. Per block of 256 values:
 *   - row indices: IQ2_XS's u16s and the others' index bytes zero-extended from memory (IQ2_XS masked
 *     to 9 bits; IQ3_S's 9th bits, stored apart in qh, added under a 16-bit mask loaded from qh;
 *     IQ2_S's and IQ1's high bits shifted into place from qh); IQ2_XXS's index bytes, which share
 *     their qwords with the aux words, picked by one VPERMB;
 *   - IQ1's rows come from its grid times 8 plus 9, and each row's delta (+-1) is added: w + 9 in
 *     [0, 18] multiplies the activations as an unsigned byte, with no signs, and 9 * (the sum of
 *     the activations: their bsums) * weight is taken off per 16 values (unpack_iq1);
 *   - signs: IQ2_S's and IQ3_S's are stored as bits; the 7-bit ksigns indices of the others are
 *     moved to bytes (VPMULTISHIFTQB, or a shift of IQ2_XS's u16s) and given their eighth bit, the
 *     parity of the seven (the ksigns table's rule), by one GF2P8AFFINEQB, then put in row order
 *     (IQ2: VPERMB);
 *     each 64 values' sign bits are a mask (KMOVQ from memory) that a masked subtract applies to
 *     the activations;
 *   - the 4-bit sub-block scales become (2 ls + 1) * 0x10001, a dword per sub-block on the stack,
 *     spread over each 64 values' int16 lanes by two dword broadcasts (one masked; one weight per
 *     32 values) or a VPERMD (IQ2_XS, IQ2_S, IQ1_M: one per 16).
 * Per token and 64 values: VPMADDUBSW (magnitudes <= 62 against |a| <= 127: pair sums < 2^15) and
 * VPDPWSSD with the weights, into one int32 accumulator per block: the block's integer sum is the
 * scalar one, converted per lane and added with one FMA scaled by (wd * ad) * factor as qdot_iq.c
 * forms it, so the result equals the scalar tile's up to the order of the float additions.
 *
 * Measured on the Intel machine (Xeon with AVX-512 VBMI/GFNI, AMX; one thread, in cache, against
 * the AVX2 build's tiles in the same process, ns per block): IQ2_XXS 17.1-18.3 vs 20.8-23.5, IQ2_XS
 * 15.1-16.5 vs 19.8-19.9, IQ2_S 19.0-20.0 vs 28.4-30.6, IQ3_XXS 19.4-20.4 vs 25-29, IQ3_S 21-23 vs
 * 39-44, IQ1_S 24.6 vs 31.5, IQ1_M 22.0 vs 48.5; IQ1 as unsigned w + 9 (no signs to apply per
 * token) then took 0.89-0.91 of the time of IQ1 as |w| and signs (benchmarks/ab_builds.py, decode,
 * 300 calls each, alternating; outputs differ only in the order of float additions). An earlier
 * version looked the grids up in registers instead (code tables of 2-3 bits per value, VPERMI2B,
 * VPMULTISHIFTQB and a levels VPERMB; git history of this file): IQ3 at 21.5 and 26 ns, IQ2 no faster than the AVX2 build
 * (the permutes all need the one shuffle port). Gathers are slow where the microcode mitigates
 * Gather Data Sampling (Intel cores up to Ice Lake and Tiger Lake) and lose on Zen 4 (qdot.c), so
 * qdot.c takes these tiles only where strata_cpu_fast_gathers says so.
 *
 * Rows one at a time, every token of the call per block (these serve calls of fewer than
 * STRATA_QDOT_DECODE_TOKENS tokens; any count works), the rows to come fetched ahead as the AVX2
 * tiles do. The ISA is enabled for this translation unit only; qdot.c hands these tiles out only
 * after the CPU was seen to have AVX-512 VBMI and GFNI (strata_cpu_has_avx512_vbmi).
 */
#include "iq_tables.h"
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <string.h>

/* The tables below are made by constructors, which run when the library loads, on every CPU: they
 * come before the ISA is enabled, so the compiler keeps them to the baseline instruction set
 * (tests/native/test_load_baseline.py checks every function the library runs at load). */

/* IQ1's grid times 8, plus 9 (values 1, 9, 17), made once when the library loads: a row gathered
 * from it plus the row's delta (+-1) is IQ1's integer value 8 g +- 1 (qdot_iq.c) plus 9, in
 * [0, 18]: an unsigned byte, multiplied with the activations as they are; 9 * the sum of the
 * activations (their bsums) is taken off per block. */
uint8_t strata_iq1_grid_u[2048][8] __attribute__((aligned(64)));   /* qdot.h: the AVX2 tiles read it too */

__attribute__((constructor)) static void make_iq1_grid_u(void) {
    for (int r = 0; r < 2048; r++)
        for (int j = 0; j < 8; j++) strata_iq1_grid_u[r][j] = (uint8_t)(8 * strata_iq1s_grid[r][j] + 9);
}

/* The control vectors' bytes, made once when the library loads ([0]: IQ2_XXS's, [1]: the others'). */
static struct {
    uint8_t sign_at[2][64], pack[2][64], scale_at[64], rowsel[4][64], iq1m_at[64];
    int32_t spread[4][16];
} ctl __attribute__((aligned(64)));

__attribute__((constructor)) static void make_ctl(void) {
    for (int z = 0; z < 4; z++) {
        for (int i = 0; i < 64; i++) {
            const int row = 8 * z + i / 8;   /* IQ2_XXS: index byte 8 (row / 4) + row % 4 */
            ctl.rowsel[z][i] = (uint8_t)(8 * (row / 4) + row % 4);
        }
        for (int l = 0; l < 16; l++) ctl.spread[z][l] = 4 * z + l / 4;
    }
    for (int i = 0; i < 64; i++) {
        const int j = i % 8;
        ctl.sign_at[0][i] = (uint8_t)(32 + 7 * (j % 4));
        ctl.sign_at[1][i] = (uint8_t)(32 * (j / 4) + 7 * (j % 4));
        ctl.pack[0][i] = (uint8_t)(8 * (i / 4 % 8) + i % 4);
        ctl.pack[1][i] = (uint8_t)(2 * (i % 32));
        ctl.scale_at[i] = (uint8_t)(8 * (i / 8) + 4 * (j / 4));   /* dword 2 q: nibble 2 q; 2 q + 1: 2 q + 1 */
        const int sub = 2 * (i / 8) + j / 4;   /* IQ1_M: sub-block sub's 3 bits at 16 (sub / 4) + 3 (sub % 4) */
        ctl.iq1m_at[i] = (uint8_t)(16 * (sub / 4) + 3 * (sub % 4));
    }
}

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
#define MAX_TOK 8                 /* tokens per pass over a row */
#define PF_AHEAD 1024             /* bytes ahead fetched into the rows to come */
#include "qdot_prefetch.h"

enum { IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M };

INLINE __m512i bytes64(const void *b) { return _mm512_loadu_si512(b); }

/* A format's control vectors (named in the header). */
typedef struct {
    __m512i sign_at;    /* VPMULTISHIFTQB: the ksigns fields to bytes (IQ2_XXS: one aux dword in the
                           high half of each qword; IQ3_XXS: two aux dwords a qword) */
    __m512i pack;       /* VPERMB: IQ2's sign bytes in row order */
    __m512i scale_at;   /* VPMULTISHIFTQB: IQ2_XS's 16 scale nibbles to the low bytes of 16 dwords */
    __m512i spread[4];  /* VPERMD: IQ2_XS's 64 values' four weights over their int32 lanes */
    __m512i rowsel[4];  /* VPERMB: IQ2_XXS's 8 row indices of 64 values, one to a qword */
    __m512i iq1m_at;    /* VPMULTISHIFTQB: IQ1_M's 16 3-bit scales to the low bytes of 16 dwords */
} consts;

/* A call's control vectors: loads of the bytes made at load time (a tile call may cover only a
 * few dozen blocks, so nothing is computed per call). */
static void make_consts(int fmt, consts *k) {
    const int v = fmt != IQ2_XXS;
    for (int z = 0; z < 4; z++) {
        k->rowsel[z] = bytes64(ctl.rowsel[z]);
        k->spread[z] = bytes64(ctl.spread[z]);
    }
    k->sign_at = bytes64(ctl.sign_at[v]);
    k->pack = bytes64(ctl.pack[v]);
    k->scale_at = bytes64(ctl.scale_at);
    k->iq1m_at = bytes64(ctl.iq1m_at);
}

/* GF2P8AFFINEQB's matrix for bits 0-6 kept and bit 7 = their parity (row i in byte 7 - i). */
#define KEEP7_PARITY 0x010204081020407Fll

INLINE __m512i ksigns(__m512i fields) {
    return _mm512_gf2p8affine_epi64_epi8(fields, _mm512_set1_epi64(KEEP7_PARITY), 0);
}

/* (2 ls + 1) * 0x10001 per dword: the weight in both int16 halves (ls in the dword's low bits). */
INLINE __m512i odd_weights(__m512i ls) {
    return _mm512_add_epi32(_mm512_mullo_epi32(ls, _mm512_set1_epi32(0x20002)), _mm512_set1_epi32(0x10001));
}

/* A block's 64 values z: magnitudes (mag), int16 sub-block weights (w), and the sign bits of all
 * 256 values (sg, value 8 g + j negative where bit j of byte g is set). */
typedef struct {
    __m512i mag[4], w[4];
    __m256i corr;   /* IQ1: -9 * the weight of each 16 values, int16 (mag is w + 9, no signs) */
    uint8_t sg[64] __attribute__((aligned(64)));
    uint32_t sc[16] __attribute__((aligned(64)));
} unpacked;

/* The weights of 64 values z where one serves 32 values: dwords `st` (2 z) and `st` (2 z + 1). */
INLINE __m512i two_weights(const unpacked *u, int st, int z) {
    return _mm512_mask_mov_epi32(_mm512_set1_epi32((int)u->sc[st * 2 * z]), 0xFF00,
                                 _mm512_set1_epi32((int)u->sc[st * (2 * z + 1)]));
}

/* IQ2_XXS, IQ2_XS, IQ2_S: a grid row is 8 values, a qword: 64 values are one VPGATHERQQ of 8 rows. */
INLINE void unpack_iq2(int fmt, const consts *k, const uint8_t *p, unpacked *u) {
    const __m512i qs = bytes64(p + 2);
    if (fmt == IQ2_XXS) {   /* 8 x (4 index bytes, u32 aux: 4 ksigns, ls in bits 28-31) */
        _mm512_store_si512((void *)u->sg, _mm512_permutexvar_epi8(k->pack, ksigns(_mm512_multishift_epi64_epi8(k->sign_at, qs))));
        _mm512_store_si512((void *)u->sc, _mm512_add_epi32(_mm512_mul_epu32(_mm512_srli_epi64(qs, 60), _mm512_set1_epi64(0x20002)),
                                                           _mm512_set1_epi32(0x10001)));   /* dword 2 c: chunk c */
    } else {   /* a nibble ls per 16 values; IQ2_XS: u16 per row, index bits 0-8, ksigns 9-15; IQ2_S: stored signs */
        if (fmt == IQ2_XS) _mm512_store_si512((void *)u->sg, _mm512_permutexvar_epi8(k->pack, ksigns(_mm512_srli_epi16(qs, 9))));
        else _mm512_store_si512((void *)u->sg, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)((const strata_block_iq2_s *)p)->signs)));
        uint64_t s8;
        memcpy(&s8, fmt == IQ2_XS ? ((const strata_block_iq2_xs *)p)->scales : ((const strata_block_iq2_s *)p)->scales, 8);
        _mm512_store_si512((void *)u->sc, odd_weights(_mm512_and_si512(
            _mm512_multishift_epi64_epi8(k->scale_at, _mm512_set1_epi64((long long)s8)), _mm512_set1_epi32(15))));
    }
    const __m512i wts = _mm512_load_si512((const void *)u->sc);
#pragma GCC unroll 4
    for (int z = 0; z < 4; z++) {
        if (fmt == IQ2_XXS) {
            const __m512i rows = _mm512_maskz_permutexvar_epi8(0x0101010101010101ull, k->rowsel[z], qs);
            u->mag[z] = _mm512_i64gather_epi64(rows, (const void *)strata_iq2xxs_grid, 8);
            u->w[z] = two_weights(u, 2, z);
        } else if (fmt == IQ2_XS) {
            const __m512i rows = _mm512_and_si512(_mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(p + 2 + 16 * z))),
                                                  _mm512_set1_epi64(511));
            u->mag[z] = _mm512_i64gather_epi64(rows, (const void *)strata_iq2xs_grid, 8);
            u->w[z] = _mm512_permutexvar_epi32(k->spread[z], wts);
        } else {   /* IQ2_S: row 4 c + l's bits 8-9 are bits 2 l, 2 l + 1 of qh[c] */
            const strata_block_iq2_s *b = (const strata_block_iq2_s *)p;
            uint16_t qh;
            memcpy(&qh, b->qh + 2 * z, 2);
            const __m512i high = _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64(qh), _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14)),
                                                  _mm512_set1_epi64(3));
            const __m512i rows = _mm512_or_si512(_mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * z))),
                                                 _mm512_slli_epi64(high, 8));
            u->mag[z] = _mm512_i64gather_epi64(rows, (const void *)strata_iq2s_grid, 8);
            u->w[z] = _mm512_permutexvar_epi32(k->spread[z], wts);
        }
    }
}

/* IQ3_XXS, IQ3_S: a grid row is 4 values, a dword: 64 values are one VPGATHERDD of 16 rows. */
INLINE void unpack_iq3(int fmt, const consts *k, const uint8_t *p, unpacked *u) {
    __m512i ls;   /* a dword per 32 values: its ls in the low bits, 0 above */
    if (fmt == IQ3_XXS) {   /* 64 index bytes, 8 u32 aux as IQ2_XXS's */
        const __m512i aux = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)((const strata_block_iq3_xxs *)p)->aux));
        _mm512_store_si512((void *)u->sg, ksigns(_mm512_multishift_epi64_epi8(k->sign_at, aux)));
        ls = _mm512_srli_epi32(aux, 28);
    } else {   /* 64 index bytes, their 9th bits in qh, stored sign bits, a nibble ls per 32 values */
        const strata_block_iq3_s *b = (const strata_block_iq3_s *)p;
        _mm512_store_si512((void *)u->sg, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)b->signs)));
        uint32_t s4;
        memcpy(&s4, b->scales, 4);
        ls = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)s4),
                                                _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0)),
                              _mm512_set1_epi32(15));
    }
    _mm512_store_si512((void *)u->sc, odd_weights(ls));
#pragma GCC unroll 4
    for (int z = 0; z < 4; z++) {
        __m512i rows = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 2 + 16 * z)));
        if (fmt == IQ3_S) {
            const __mmask16 ninth = _load_mask16((__mmask16 *)(uintptr_t)(((const strata_block_iq3_s *)p)->qh + 2 * z));
            rows = _mm512_mask_add_epi32(rows, ninth, rows, _mm512_set1_epi32(256));
            u->mag[z] = _mm512_i32gather_epi32(rows, (const void *)strata_iq3s_grid, 4);
        } else {
            u->mag[z] = _mm512_i32gather_epi32(rows, (const void *)strata_iq3xxs_grid, 4);
        }
        u->w[z] = two_weights(u, 1, z);
    }
}

/* IQ1_S, IQ1_M: rows of 8 values from the grid times 8 plus 9 (one VPGATHERQQ per 64 values), plus
 * each row's delta: w + 9 = 8 g + 9 +- 1 in [0, 18] goes in as an unsigned magnitude with no signs,
 * and corr takes 9 * (sum of a) * weight off per 16 values (the activations' bsums). Row r's index is
 * qs[r] and 3 high bits; IQ1_S keeps them in qh's u16 per 32 values (bits 3 l .. 3 l + 2 for row
 * 4 c + l), with ls in bits 12-14 and the delta's sign in bit 15; IQ1_M in a nibble per row (bit 3:
 * the delta's sign), its 3-bit scales one per 16 values in four u16 (whose top nibbles hold d). */
INLINE void unpack_iq1(int fmt, const consts *k, const uint8_t *p, unpacked *u) {
    const uint8_t *qs = fmt == IQ1_S ? ((const strata_block_iq1_s *)p)->qs : ((const strata_block_iq1_m *)p)->qs;
    __m512i wts;
    if (fmt == IQ1_S) {
        const __m512i qh = _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)((const strata_block_iq1_s *)p)->qh)));
        wts = odd_weights(_mm512_and_si512(_mm512_srli_epi32(qh, 12), _mm512_set1_epi32(7)));   /* dword c: chunk c */
        u->corr = _mm256_mullo_epi16(_mm512_castsi512_si256(wts), _mm256_set1_epi16(-9));   /* w_c twice per 32 values */
    } else {
        uint64_t sc;
        memcpy(&sc, ((const strata_block_iq1_m *)p)->scales, 8);
        wts = odd_weights(_mm512_and_si512(_mm512_multishift_epi64_epi8(k->iq1m_at, _mm512_set1_epi64((long long)sc)),
                                           _mm512_set1_epi32(7)));   /* dword k: 16 values k */
        u->corr = _mm256_mullo_epi16(_mm512_cvtepi32_epi16(wts), _mm256_set1_epi16(-9));
    }
    _mm512_store_si512((void *)u->sc, wts);
#pragma GCC unroll 4
    for (int z = 0; z < 4; z++) {
        uint32_t h;   /* IQ1_S: the u16s of chunks 2 z, 2 z + 1; IQ1_M: the nibbles of rows 8 z .. 8 z + 7 */
        memcpy(&h, (fmt == IQ1_S ? ((const strata_block_iq1_s *)p)->qh : ((const strata_block_iq1_m *)p)->qh) + 4 * z, 4);
        const __m512i hv = _mm512_set1_epi64(h);
        __m512i high;
        __mmask8 neg_delta;
        if (fmt == IQ1_S) {
            high = _mm512_srlv_epi64(hv, _mm512_setr_epi64(0, 3, 6, 9, 16, 19, 22, 25));
            neg_delta = _mm512_test_epi64_mask(hv, _mm512_setr_epi64(0x8000, 0x8000, 0x8000, 0x8000,
                                                                     0x80000000, 0x80000000, 0x80000000, 0x80000000));
        } else {
            high = _mm512_srlv_epi64(hv, _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28));
            neg_delta = _mm512_test_epi64_mask(high, _mm512_set1_epi64(8));
        }
        const __m512i rows = _mm512_or_si512(_mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(qs + 8 * z))),
                                             _mm512_slli_epi64(_mm512_and_si512(high, _mm512_set1_epi64(7)), 8));
        const __m512i delta = _mm512_mask_mov_epi64(_mm512_set1_epi8(1), neg_delta, _mm512_set1_epi8(-1));
        u->mag[z] = _mm512_add_epi8(_mm512_i64gather_epi64(rows, (const void *)strata_iq1_grid_u, 8), delta);
        u->w[z] = fmt == IQ1_S ? two_weights(u, 1, z) : _mm512_permutexvar_epi32(k->spread[z], wts);
    }
}

INLINE void unpack(int fmt, const consts *k, const uint8_t *p, unpacked *u) {
    if (fmt == IQ1_S || fmt == IQ1_M) {
        unpack_iq1(fmt, k, p, u);
        return;
    }
    if (fmt == IQ2_XXS || fmt == IQ2_XS || fmt == IQ2_S) unpack_iq2(fmt, k, p, u);
    else unpack_iq3(fmt, k, p, u);
}

/* One weight row (k values at w) against nt <= MAX_TOK tokens: y[t * ys]. */
INLINE void vbmi_tile(int fmt, const consts *kc, int64_t bs, float factor, int nt, int64_t k, const uint8_t *w,
                      const uint8_t *a, int64_t arb, float *y, int64_t ys) {
    const uint8_t *ahead_end = strata_qdot_ahead();   /* not the thread-local itself: qdot_avx2_common.h */
    const int iq1 = fmt == IQ1_S || fmt == IQ1_M;   /* unsigned magnitudes, no signs; the + 9 taken off */
    __m512 acc[MAX_TOK];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / STRATA_QK_K; b++) {
        const uint8_t *p = w + b * bs;
        fetch_block_ahead(p, bs, ahead_end);
        unpacked u;
        unpack(fmt, kc, p, &u);
        const float wd = _cvtsh_ss(fmt == IQ1_M ? strata_iq1_m_half(((const strata_block_iq1_m *)p)->scales)
                                                : (uint16_t)(p[0] | p[1] << 8));
        for (int t = 0; t < nt; t++) {
            const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
            __m512i isum = iq1 ? _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)ab->bsums), u.corr))
                               : _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int z = 0; z < 4; z++) {   /* the mask loaded from memory (KMOVQ k, m64), not moved from a GPR */
                const __m512i av = _mm512_loadu_si512((const void *)(ab->q + 64 * z));
                const __m512i sa = iq1 ? av : _mm512_mask_sub_epi8(av, _load_mask64((__mmask64 *)(u.sg + 8 * z)),
                                                                   _mm512_setzero_si512(), av);
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
DEFINE_VBMI(iq2_xxs, IQ2_XXS, strata_block_iq2_xxs, 0.125f)
DEFINE_VBMI(iq2_xs, IQ2_XS, strata_block_iq2_xs, 0.125f)
DEFINE_VBMI(iq2_s, IQ2_S, strata_block_iq2_s, 0.125f)
DEFINE_VBMI(iq1_s, IQ1_S, strata_block_iq1_s, 0.125f)
DEFINE_VBMI(iq1_m, IQ1_M, strata_block_iq1_m, 0.125f)
