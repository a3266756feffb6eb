/*
 * AVX-512 decode tiles of IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, IQ3_XXS and IQ3_S by planes: the grid
 * looked up in registers (IQ1's: gathered), one value position of 64 grid rows at a time, against activations
 * laid out to match (interface: qdot.h; the formats' integer formulation: qdot_iq.c; block layouts:
 * common.h; grids: iq_tables.h). IQ2_XXS is described here, IQ2_XS and IQ2_S (the same layout and
 * values, larger grids, a weight per 16 values) at pair_weights, IQ1_S and IQ1_M (their codes
 * gathered) at iq1_gather, IQ3_XXS and IQ3_S (rows of 4 values, 3-bit codes) where their tiles begin below.
 *
 * The gather tile (qdot_iq_vbmi.c) fetches each grid row's 8 values with VPGATHERQQ, and decode is
 * bound by those gathers and the shuffles around them. Here nothing is put back in value order:
 *   - Activations are re-laid once per thread and set of activations (strata_qdot_relaid, its
 *     PLANES layout): per pair of blocks and value position j (0-7 within a grid row), 64 bytes,
 *     lane 8 c + 4 s + l holding the value at position j of row l (0-3) of chunk c (0-7, 32 values)
 *     of block s of the pair. Four lanes in a row are one chunk of one block, so VPDPBUSD's dword
 *     sums are the chunks' sums, and each chunk has one weight.
 *   - The weights need no shuffle for that order: lane 8 c + l of a block's 64 qs bytes is row l's
 *     grid index (c's 4 index bytes, then its aux dword), and the pair's indices are block 0's qs
 *     with block 1's merged in by a masked load 4 bytes back. The two blocks' aux dwords, put side by
 *     side the other way (block 0's loaded 4 bytes on), give their ksigns fields to the same lanes
 *     by one VPMULTISHIFTQB, their parity bit by one GF2P8AFFINEQB, and their weights by a shift.
 *   - The grid's values are 8, 25 and 43, so a row position is a 2-bit code (0, 1, 2): 8 XOR 17 b0
 *     XOR 35 b1 over GF(2) (25 = 8 ^ 17, 43 = 8 ^ 35). Two tables of 256 bytes give each grid row's
 *     codes for positions 0-3 and 4-7 (one VPERMT2B per 128 rows, a blend on the index's top bit),
 *     and one GF2P8AFFINEQB per position turns a code byte into that position's magnitudes.
 *   - Per position: VPTESTMB of the sign bytes, a masked subtract that negates those activations,
 *     VPDPBUSD of the magnitudes (<= 43) with them into the chunks' dwords (8 positions: < 2^18).
 * Per pair: the chunk sums times (2 ls + 1) (VPMULLD), converted and added with one FMA scaled by
 * each block's wd * ad, times 0.125 at the end: the scalar tile's integer sums, so the result equals
 * it up to the order of the float additions.
 *
 * On the Intel machine (Xeon with AVX-512 VBMI/GFNI) this beat the gather tile (qdot_iq_vbmi.c) for
 * every grid i-quant at 1-7 tokens, IQ2_S the least (its 1024 rows take 16 VPERMT2B a pair), IQ1_S
 * and IQ1_M against the same gathers with less around them; and it beat the other look-ups tried: a
 * position per code byte directly (two VPERMT2B per position), codes mapped by VPSHUFB, signs by
 * GF2P8AFFINEQB masks. VPERMT2B takes two cycles of the shuffle port there
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU").
 *
 * IQ1_S's, IQ1_M's and IQ2_S's decode calls (1-3 tokens) take another tile where gathers are fast:
 * their grid rows gathered as bytes (IQ1's with the delta added), against activations re-laid by rows
 * (rows_row, below: faster than the planes tile at 1 token); their 4-7 tokens come here.
 *
 * Rows one at a time, up to 8 tokens per pass over a row (decode calls, and the tokens a prefill's
 * VNNI groups leave over: strata_qdot_few_tokens). The ISA is enabled for this translation unit
 * only; qdot.c hands the tiles out only after the CPU was seen to have AVX-512 VBMI and GFNI.
 */
#include "iq_tables.h"
#include "qdot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <stddef.h>
#include <string.h>

/* The code tables, made when the library loads (before the ISA is enabled: see qdot_iq_vbmi.c):
 * byte r of codes[h] holds grid row r's positions 4 h .. 4 h + 3 as 2-bit codes (value 8: 0, 25: 1,
 * 43: 2), position 4 h + q in bits 2 q and 2 q + 1. */
static uint8_t codes[2][256] __attribute__((aligned(64)));
/* the same for IQ2_XS's 512 grid rows and IQ2_S's 1024 (the same three values) */
static uint8_t codes_xs[2][512] __attribute__((aligned(64)));
static uint8_t codes_s[2][1024] __attribute__((aligned(64)));
/* IQ1_S: grid row r's 8 values g (-1, 0, 1) as 2-bit codes g + 1, value j in bits 2 j, 2 j + 1 (two
 * more entries: a dword gathered at row 2047 reads past it) */
static uint16_t codes1[2048 + 2] __attribute__((aligned(64)));
/* Per position q of a code byte: GF2P8AFFINEQB's matrix for 8 ^ 17 b0 ^ 35 b1 (b0, b1: its bits) */
static uint64_t to_value[4][8] __attribute__((aligned(64)));
/* ... and for 8 times the code (IQ1_S: bits 2 q, 2 q + 1 to bits 3, 4) */
static uint64_t times_8[4][8] __attribute__((aligned(64)));
/* Constants of the tiles' inner loops kept in memory, whole vectors, so that the compiler takes them
 * as operands from memory (a load) rather than broadcasting them from general registers (the
 * shuffle port) when it runs out of vector registers: bit j in every byte; IQ3's sign bits j and
 * j + 4 of the odd rows' bytes (VPTESTMB). */
static uint8_t bit_at[8][64] __attribute__((aligned(64)));
static uint16_t bits4_at[4][32] __attribute__((aligned(64)));
/* VPMULTISHIFTQB over the pair's aux dwords (block 0's in the low dword of each qword, block 1's in the
 * high): the ksigns fields of block 0 to bytes 0-3 of each qword, block 1's to bytes 4-7 */
static uint8_t sign_at[64] __attribute__((aligned(64)));
/* VPERMT2B over a pair's IQ2_XS qs: lane 8 c + 4 s + l from row 4 c + l's u16 of block s, its low
 * byte ([0]) or high byte ([1]) */
static uint8_t u16_at[2][64] __attribute__((aligned(64)));
/* IQ2_S: VPERMB of the pair's qh bytes (block 0's, then block 1's) to lane 8 c + 4 s + l: qh_s[c]; the
 * bit of the lane's row that holds its index bit 8 (bit 9 is the next) */
static uint8_t qh_lane[64] __attribute__((aligned(64))), qh_bit[64] __attribute__((aligned(64)));
/* The weights of IQ2_XS, IQ2_S (nibble_at) and IQ1_M (iq1m_wt_at) (pair_weights): VPMULTISHIFTQB's bit
 * offset for the low byte of word 4 c + 2 s + k, group 2 c + k's field shifted up one (mod 64). IQ2's
 * field is nibble k of scale byte c; IQ1_M's, 3 bits at 16 (g / 4) + 3 (g % 4) of its 8 scale bytes. */
static uint8_t nibble_at[64] __attribute__((aligned(64))), iq1m_wt_at[64] __attribute__((aligned(64)));
/* IQ1: VPERMT2B of two gathers' dwords (16 rows each) to their low bytes, then their second bytes
 * (iq1_code_at); IQ1_S: VPERMW of the pair's qh words (block 0's 8, then block 1's) to both words of
 * dword 2 c + s: qh_s[c] (iq1_chunk_at); VPERMT2D of the two blocks' bsums, a pair of int16 a dword,
 * to dword 2 c + s: the two bsums of chunk c of block s (iq1_sum_at, below) */
static uint8_t iq1_code_at[64] __attribute__((aligned(64)));
static uint16_t iq1_chunk_at[32] __attribute__((aligned(64)));
/* VPERMB of two blocks' 32 row bytes (pair_bytes) to lane 8 c + 4 s + l: byte 4 c + l of block s */
static uint8_t pair_at[64] __attribute__((aligned(64)));
/* IQ1's high index bits (iq1_high): VPERMB of the pair's qh words (block 0's 8, then block 1's) to
 * qword c: word c of block 0, then of block 1; VPMULTISHIFTQB's offset for lane 8 c + 4 s + l: row
 * 4 c + l's field in that qword (IQ1_S: 3 bits a row, IQ1_M: a nibble); per gather g, VPERMT2B's
 * bytes of its 16 dword indices: row 16 g + i's index byte, then its high bits (bytes 2, 3: zeroed) */
static uint8_t iq1_words_at[64] __attribute__((aligned(64))), iq1s_high_at[64] __attribute__((aligned(64))),
    iq1m_high_at[64] __attribute__((aligned(64))), iq1_index_at[4][64] __attribute__((aligned(64)));
static int32_t iq1_sum_at[16] __attribute__((aligned(64)));
/* IQ1 by rows (iq1_rows_unpack; the activations' layout at relay_rows): row r of IQ1's grid with the delta's sign
 * s as a twelfth index bit, r | s << 11, holds its 8 values 8 g + 9 + delta (delta -1 where s, else +1)
 * as bytes (32 KiB). A block's qs and qh bytes (loaded together; IQ1_M's scales after them) go by
 * VPERMB (iq1s_p_at) to qword c: chunk c's 4 index bytes, its 2 qh bytes, two zeros; VPMULTISHIFTQB at
 * iq1s_row_at (IQ1_M: iq1m_row_at) makes word l of qword c row 4 c + l's index: byte 2 l its index
 * byte, byte 2 l + 1 qh's bits 3 l .. (IQ1_M: its nibble l, the delta's sign in bit 3); IQ1_S's at
 * iq1s_top_at takes qh's bits 11 .. to the even bytes (2 ls + 1 after a mask) and 12 .. to the odd
 * ones (the delta's sign in bit 3, that is index bit 11); VPSHUFB at rows_word_at[l] puts word l of
 * each qword alone in it (a VPGATHERQQ index; words 0 and 3 by an AND and a shift instead, word_of). IQ1_M's weights of 16 values 2 c + h go to the low
 * byte of both dwords of qword c, shifted up one (iq1m_wt2_at[h]), out of its 8 scale bytes. */
static uint64_t iq1_grid_d[4096] __attribute__((aligned(64)));
static uint8_t iq1s_p_at[64] __attribute__((aligned(64))), iq1s_row_at[64] __attribute__((aligned(64))),
    iq1s_top_at[64] __attribute__((aligned(64))), rows_word_at[4][64] __attribute__((aligned(64)));
static uint8_t iq1m_row_at[64] __attribute__((aligned(64))), iq1m_wt2_at[2][64] __attribute__((aligned(64)));
/* IQ2_S by rows (iq2s_rows_unpack): VPERMT2B of its qs and signs (64 bytes) and its qh and scales (16)
 * to qword c: chunk c's 4 index bytes and its qh byte; VPMULTISHIFTQB's offsets to word l: its index
 * byte, then qh's bits 2 l ..; bit i % 8 in byte i (bit_pattern: the sign bits' matrix, see
 * iq2s_rows_unpack); the weights of 16 values 2 c + h, nibble 2 c + h shifted up one */
static uint8_t bit_pattern[64] __attribute__((aligned(64)));
static uint8_t iq2s_p_at[64] __attribute__((aligned(64))), iq2s_row_at[64] __attribute__((aligned(64))),
    iq2s_wt_at[2][64] __attribute__((aligned(64)));
/* IQ3_XXS: byte r of codes3[h] holds grid row r's positions 2 h (bits 0-2) and 2 h + 1 (bits 4-6) as
 * 3-bit codes, the rank of the value in IQ3_VALUES (bits 3 and 7 clear: a VPSHUFB reads the low
 * nibble as it is, and the high one shifted down by VPSRLW without a mask) */
static uint8_t codes3[2][256] __attribute__((aligned(64)));
static const uint8_t IQ3_VALUES[16] = {4, 12, 20, 28, 36, 44, 52, 62, 4, 12, 20, 28, 36, 44, 52, 62};   /* twice: VPSHUFB's 16 */
/* IQ3_S: the same for its 512 grid rows; its values are 2 c + 1, which GF2P8AFFINEQB makes */
static uint8_t codes3s[2][512] __attribute__((aligned(64)));
static uint64_t odd_value[2];   /* GF2P8AFFINEQB's matrix: 2 c (c: bits 4 f .. 4 f + 2), plus 1 as its constant */

/* codes of an IQ2 grid's rows: positions 4 h .. 4 h + 3 of row r in out[h][r] (see codes) */
static void make_codes2(const uint8_t (*grid)[8], int n_rows, uint8_t *out0, uint8_t *out1) {
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < n_rows; r++) {
            int v = 0;
            for (int q = 0; q < 4; q++) {
                const int g = grid[r][4 * h + q];
                v |= (g == 8 ? 0 : g == 25 ? 1 : 2) << (2 * q);
            }
            (h ? out1 : out0)[r] = (uint8_t)v;
        }
}

__attribute__((constructor)) static void make_planes_tables(void) {
    make_codes2(strata_iq2xxs_grid, 256, codes[0], codes[1]);
    make_codes2(strata_iq2xs_grid, 512, codes_xs[0], codes_xs[1]);
    make_codes2(strata_iq2s_grid, 1024, codes_s[0], codes_s[1]);
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < 256; r++) {
            int v = 0;
            for (int f = 0; f < 2; f++) {
                int c = 0;
                while (c < 7 && IQ3_VALUES[c] != strata_iq3xxs_grid[r][2 * h + f]) c++;
                v |= c << (4 * f);
            }
            codes3[h][r] = (uint8_t)v;
        }
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < 512; r++)
            codes3s[h][r] = (uint8_t)((strata_iq3s_grid[r][2 * h] / 2) | (strata_iq3s_grid[r][2 * h + 1] / 2) << 4);
    for (int f = 0; f < 2; f++) {
        uint64_t m = 0;
        for (int i = 1; i < 4; i++) m |= (uint64_t)(1u << (4 * f + i - 1)) << (8 * (7 - i));
        odd_value[f] = m;
    }
    for (int r = 0; r < 2048; r++) {
        int v = 0;
        for (int j = 0; j < 8; j++) v |= (strata_iq1s_grid[r][j] + 1) << (2 * j);
        codes1[r] = (uint16_t)v;
    }
    for (int i = 0; i < 64; i++) {
        const int c = i / 8, sb = i / 4 % 2, g = i / 16, d = i % 16;
        pair_at[i] = (uint8_t)(32 * sb + 4 * c + i % 4);
        iq1_code_at[i] = (uint8_t)((i % 32 < 16 ? 0 : 64) + 4 * (i % 16) + i / 32);
        iq1_index_at[g][4 * d] = (uint8_t)(16 * g + d);
        iq1_index_at[g][4 * d + 1] = (uint8_t)(64 + 16 * g + d);
        iq1_words_at[i] = (uint8_t)(i % 8 < 4 ? 2 * (8 * (i % 4 / 2) + i / 8) + i % 2 : 0);
        iq1s_high_at[i] = (uint8_t)(16 * sb + 3 * (i % 4));
        iq1m_high_at[i] = (uint8_t)(16 * sb + 4 * (i % 4));
    }
    for (int r = 0; r < 4096; r++) {
        uint64_t v = 0;
        for (int j = 0; j < 8; j++) v |= (uint64_t)(uint8_t)(8 * strata_iq1s_grid[r % 2048][j] + 9 + (r < 2048 ? 1 : -1)) << (8 * j);
        iq1_grid_d[r] = v;
    }
    for (int i = 0; i < 64; i++) {
        const int c = i / 8, b = i % 8;
        iq1s_p_at[i] = (uint8_t)(b < 4 ? 4 * c + b : b == 4 ? 32 + 2 * c : 33 + 2 * c);
        iq1s_row_at[i] = (uint8_t)(b % 2 == 0 ? 8 * (b / 2) : 32 + 3 * (b / 2));
        iq1s_top_at[i] = (uint8_t)(b % 2 == 0 ? 32 + 11 : 32 + 12);
        for (int l = 0; l < 4; l++) rows_word_at[l][i] = (uint8_t)(b < 2 ? 8 * (i / 8 % 2) + 2 * l + b : 0x80);
        iq1m_row_at[i] = (uint8_t)(b % 2 == 0 ? 8 * (b / 2) : 32 + 4 * (b / 2));
        for (int h = 0; h < 2; h++) {
            const int g = 2 * c + h;   /* the group of 16 values */
            iq1m_wt2_at[h][i] = (uint8_t)((16 * (g / 4) + 3 * (g % 4) + 63) % 64);
        }
        iq2s_p_at[i] = (uint8_t)(b < 4 ? 4 * c + b : 64 + c);
        iq2s_row_at[i] = (uint8_t)(b % 2 == 0 ? 8 * (b / 2) : 32 + 2 * (b / 2));
        for (int h = 0; h < 2; h++) iq2s_wt_at[h][i] = (uint8_t)((4 * (2 * c + h) + 63) % 64);
    }
    for (int d = 0; d < 16; d++) {
        iq1_chunk_at[2 * d] = iq1_chunk_at[2 * d + 1] = (uint16_t)(8 * (d % 2) + d / 2);
        iq1_sum_at[d] = 16 * (d % 2) + d / 2;
    }
    for (int q = 0; q < 4; q++)
        for (int i = 0; i < 8; i++)
            times_8[q][i] = (uint64_t)(1u << (2 * q)) << (8 * (7 - 3)) | (uint64_t)(1u << (2 * q + 1)) << (8 * (7 - 4));
    for (int q = 0; q < 4; q++) {   /* output bit i: the parity of row (7 - i) AND the input */
        uint64_t m = 0;
        for (int i = 0; i < 8; i++)
            m |= (uint64_t)((((17 >> i) & 1) << (2 * q)) | (((35 >> i) & 1) << (2 * q + 1))) << (8 * (7 - i));
        for (int i = 0; i < 8; i++) to_value[q][i] = m;
    }
    for (int i = 0; i < 64; i++) {
        const int c = i / 8, sb = i / 4 % 2, l = i % 4;
        u16_at[0][i] = (uint8_t)(64 * sb + 8 * c + 2 * l);
        u16_at[1][i] = (uint8_t)(64 * sb + 8 * c + 2 * l + 1);
        qh_lane[i] = (uint8_t)(8 * sb + c);
        qh_bit[i] = (uint8_t)(1 << (2 * l));
    }
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 8; j++) bit_at[j][i] = (uint8_t)(1 << j);
    for (int i = 0; i < 64; i++) bit_pattern[i] = (uint8_t)(1 << (i % 8));
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 32; i++) bits4_at[j][i] = (uint16_t)((1 << j) | (1 << (j + 4)) << 8);
    for (int i = 0; i < 64; i++) {
        const int g = 2 * (i / 8) + i / 2 % 2;   /* the group of word i / 2 */
        nibble_at[i] = (uint8_t)((4 * g + 63) % 64);
        iq1m_wt_at[i] = (uint8_t)((16 * (g / 4) + 3 * (g % 4) + 63) % 64);
    }
    for (int i = 0; i < 64; i++) {
        const int b = i % 8;
        sign_at[i] = (uint8_t)(b < 4 ? 7 * b : 32 + 7 * (b - 4));
    }
}

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
/* (Byte and word constants in these tiles are written as dword ones: GCC loads those from memory,
 * where it makes byte ones in a general register and broadcasts them on the shuffle port.) */
#define MAX_TOK 8                 /* tokens per pass over a row (a prefill's leftovers: up to 7) */
/* Bytes ahead fetched into the rows to come. These tiles read a row's block scales 16 blocks at a
 * time (group_scales), which touches the next 1-2 KiB of a row of 4096 values at once: 1024 bytes
 * ahead left those waiting on DRAM at every row's start. From DRAM, 3072 read as fast as 4096 and
 * faster than 1024 or 2048 (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
#define PF_AHEAD 3072
#include "qdot_prefetch.h"

#define PAIR_BYTES 512            /* one token's re-laid activations of a pair of blocks */
#define KEEP7_PARITY 0x010204081020407Fll   /* GF2P8AFFINEQB: bits 0-6 kept, bit 7 their parity */
#define SHIFT1_PARITY 0x02040810204080FEll  /* bits 1-7 to 0-6, bit 7 their parity (IQ2_XS's ksigns) */

/* 128-bit lane i of u[0] .. u[3], in that order, stored at x + i * stride (a 4 x 4 transpose). */
INLINE void lanes_4x4(const __m512i u[4], int8_t *x, int stride) {
    const __m512i t0 = _mm512_shuffle_i64x2(u[0], u[1], 0x44), t1 = _mm512_shuffle_i64x2(u[0], u[1], 0xEE);
    const __m512i t2 = _mm512_shuffle_i64x2(u[2], u[3], 0x44), t3 = _mm512_shuffle_i64x2(u[2], u[3], 0xEE);
    _mm512_store_si512((void *)x, _mm512_shuffle_i64x2(t0, t2, 0x88));
    _mm512_store_si512((void *)(x + stride), _mm512_shuffle_i64x2(t0, t2, 0xDD));
    _mm512_store_si512((void *)(x + 2 * stride), _mm512_shuffle_i64x2(t1, t3, 0x88));
    _mm512_store_si512((void *)(x + 3 * stride), _mm512_shuffle_i64x2(t1, t3, 0xDD));
}

/* One token's activations of blocks 2 p and 2 p + 1 (the second absent past the row's end: zeros)
 * into the PLANES layout at x: per position j, 64 bytes, lane 8 c + 4 s + l from q[32 c + 8 l + j]
 * of block s. A byte shuffle puts each 64 bytes (chunks 2 m, 2 m + 1) in position order, an
 * interleave of dwords merges the two blocks, and a 4 x 4 transpose of 128-bit lanes gathers the
 * four quarters of each position. */
INLINE void relay_pair(const strata_block_act_q8k *b0, const strata_block_act_q8k *b1, __m512i order, int8_t *x) {
    __m512i lo[4], hi[4];
    for (int m = 0; m < 4; m++) {
        const __m512i p0 = _mm512_permutexvar_epi8(order, _mm512_loadu_si512((const void *)(b0->q + 64 * m)));
        const __m512i p1 = b1 ? _mm512_permutexvar_epi8(order, _mm512_loadu_si512((const void *)(b1->q + 64 * m)))
                              : _mm512_setzero_si512();
        lo[m] = _mm512_unpacklo_epi32(p0, p1);   /* 128-bit lane i: position 2 i, chunks 2 m, 2 m + 1 */
        hi[m] = _mm512_unpackhi_epi32(p0, p1);   /* position 2 i + 1 */
    }
    lanes_4x4(lo, x, 128);        /* positions 0, 2, 4, 6 */
    lanes_4x4(hi, x + 64, 128);   /* 1, 3, 5, 7 */
}

/* n_tok tokens' activations (arb bytes apart) into the PLANES layout, token t at x + t * tok_bytes. */
static void relay(const uint8_t *a, int64_t arb, int64_t n_tok, int64_t nb, int8_t *x, int64_t tok_bytes) {
    uint8_t order_b[64];
    for (int i = 0; i < 64; i++) order_b[i] = (uint8_t)(32 * (i / 4 % 2) + 8 * (i % 4) + i / 8);   /* 8 j + 4 c' + l */
    const __m512i order = _mm512_loadu_si512((const void *)order_b);
    for (int64_t t = 0; t < n_tok; t++) {
        const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb);
        for (int64_t p = 0; 2 * p < nb; p++)
            relay_pair(ab + 2 * p, 2 * p + 1 < nb ? ab + 2 * p + 1 : NULL, order, x + t * tok_bytes + p * PAIR_BYTES);
    }
}

enum { IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, IQ3_XXS, IQ3_S };

/* One table's code bytes of 64 rows out of 256 at c: idx's low 7 bits pick within 128 rows, `upper`
 * (its bit 7) the half. Larger grids blend such look-ups on their higher index bits. */
INLINE __m512i look_up(const uint8_t *c, __m512i idx, __mmask64 upper) {
    return _mm512_mask_blend_epi8(
        upper, _mm512_permutex2var_epi8(_mm512_load_si512((const void *)c), idx, _mm512_load_si512((const void *)(c + 64))),
        _mm512_permutex2var_epi8(_mm512_load_si512((const void *)(c + 128)), idx, _mm512_load_si512((const void *)(c + 192))));
}

/* IQ2_XS and IQ2_S: rows as IQ2_XXS's (the same activations), grids of 512 and 1024 rows looked up as
 * 256-row quarters blended on the index's bits 8 (and 9: IQ2_S's qh, tested per lane). IQ2_XS's u16 per
 * row gives the index's low bytes and its high bytes to lanes by one VPERMT2B each; the high byte's bits
 * 1-7 are the ksigns field, which one GF2P8AFFINEQB shifts down and gives its parity bit. IQ2_S stores
 * index bytes and sign bytes per row. A weight per 16 values (2 rows): VPMADDUBSW pairs the lanes of
 * one weight, VPDPWSSD weighs them.
 *
 * IQ2_XS's and IQ2_S's weights, a nibble per 16 values (group g, nibble g of 8 scale bytes), of a
 * pair of blocks as int16 (2 ls + 1): word 4 c + 2 s + k for group 2 c + k of block s, so that the
 * words VPMADDUBSW makes of lanes 8 c + 4 s + l (rows 4 c + l) meet their group's weight (IQ1_M's
 * 3-bit weights per 16 values alike). pair_weights makes them from the 8 scale bytes of each block:
 * VPMULTISHIFTQB takes each word's field, shifted up one, out of the block's 8 bytes broadcast (at:
 * nibble_at, iq1m_wt_at), and one VPTERNLOGQ keeps the field's bits (mask: 0x1E for a nibble, 0x0E for
 * 3 bits) and sets bit 0. Faster than unpacking the fields by 128-bit unpacks and widening for IQ2_XS
 * and IQ2_S decode at 1 token, the same from 2
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
INLINE __m512i pair_weights(const uint8_t *s0, const uint8_t *s1, const uint8_t *field_at, short mask) {
    const __m512i at = _mm512_load_si512((const void *)field_at);
    __m512i v = _mm512_maskz_multishift_epi64_epi8(0x0505050505050505ull, at, _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)s0)));
    v = _mm512_mask_multishift_epi64_epi8(v, 0x5050505050505050ull, at, _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)s1)));
    return _mm512_ternarylogic_epi64(v, _mm512_set1_epi32(mask * 0x10001), _mm512_set1_epi32(0x10001), 0xEA);   /* (v & mask) | 1 */
}

/* A byte per row of a pair of blocks (32 each at r0, r1: IQ2_S's index and sign bytes, IQ1's index
 * bytes) in lane order: lane 8 c + 4 s + l holds byte 4 c + l of block s. */
INLINE __m512i pair_bytes(const uint8_t *r0, const uint8_t *r1) {
    return _mm512_permutexvar_epi8(_mm512_load_si512((const void *)pair_at), _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r0)), _mm256_loadu_si256((const __m256i *)r1), 1));
}

/* IQ1's high index bits of a pair's 64 rows, lane order (bits 0-2 of each lane; above them the rest of
 * the row's field: IQ1_M's delta sign in bit 3), from the two blocks' qh (8 u16 each, a field per row
 * at `at`: iq1s_high_at or iq1m_high_at): one VPERMB puts each chunk's two words in one qword, one
 * VPMULTISHIFTQB takes each row's field to its lane. */
INLINE __m512i iq1_high(const uint8_t *qh0, const uint8_t *qh1, const uint8_t *at) {
    const __m512i qh = _mm512_castsi256_si512(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qh0)), _mm_loadu_si128((const __m128i *)qh1), 1));
    return _mm512_multishift_epi64_epi8(_mm512_load_si512((const void *)at),
                                        _mm512_permutexvar_epi8(_mm512_load_si512((const void *)iq1_words_at), qh));
}

/* IQ1's code bytes of a pair's 64 rows: index low bytes qs and high bits high (bits 0-2; lane order).
 * Per 16 lanes g one VPERMT2B lays the dword indices (low byte, high bits, zeros) for VPGATHERDD. */
INLINE void iq1_gather(__m512i qs, __m512i high, __m512i code[2]) {
    __m512i rows[4];
    high = _mm512_and_si512(high, _mm512_set1_epi32(0x07070707));
    for (int g = 0; g < 4; g++) {
        const __m512i idx = _mm512_maskz_permutex2var_epi8(0x3333333333333333ull, qs,
                                                           _mm512_load_si512((const void *)iq1_index_at[g]), high);
        rows[g] = _mm512_i32gather_epi32(idx, (const void *)codes1, 2);
    }
    const __m512i at = _mm512_load_si512((const void *)iq1_code_at);
    const __m512i u = _mm512_permutex2var_epi8(rows[0], at, rows[1]), v = _mm512_permutex2var_epi8(rows[2], at, rows[3]);
    code[0] = _mm512_shuffle_i64x2(u, v, 0x44);   /* values 0-3 of lanes 0-31, then of 32-63 */
    code[1] = _mm512_shuffle_i64x2(u, v, 0xEE);   /* values 4-7 */
}

/* IQ1_M: as IQ1_S, but a nibble per row in qh (bits 0-2: its index bits 8-10, bit 3: its delta's
 * sign) and a 3-bit ls per 16 values. Row r's value plus 9, 8 (g + 1) + 1 + delta in {8 c, 8 c + 2},
 * goes in as an unsigned byte (dv: 1 + delta per lane), 9 * bsums * weight is taken off per 16 values,
 * and VPMADDUBSW and VPDPWSSD weigh pairs of rows (wts: int16, as pair_weights orders them). */
INLINE void iq1m_unpack(const uint8_t *p0, const uint8_t *p1, __m512i code[2], __m512i *wts, __m512i *dv) {
    const strata_block_iq1_m *b0 = (const strata_block_iq1_m *)p0, *b1 = (const strata_block_iq1_m *)p1;
    const __m512i qs = pair_bytes(b0->qs, b1->qs);
    const __m512i high = iq1_high(b0->qh, b1->qh, iq1m_high_at);
    iq1_gather(qs, high, code);
    const __mmask64 neg = _mm512_test_epi8_mask(high, _mm512_set1_epi32(0x08080808));   /* the nibble's bit 3 */
    *dv = _mm512_maskz_mov_epi8(~neg, _mm512_set1_epi32(0x02020202));
    *wts = pair_weights(b0->scales, b1->scales, iq1m_wt_at, 0x0E);
}

/* IQ1_S: rows of 8 values as IQ2's, 2048 grid rows, each 32 values' weight and delta in their qh
 * u16. Its grid is too large to look up in registers (32 VPERMT2B a pair): each row's 8 codes (16
 * bits, value g + 1) come from a table of them by VPGATHERDD, 16 rows a gather, and two byte permutes
 * make the two code bytes of 64 rows. With w = 8 g + delta, a chunk of 32 values sums to
 * 8 sum (g + 1) a + (delta - 8) sum a: the codes times 8 against the activations as they are, and the
 * sums of the activations from their bsums: one VPMADDWD of the pair's bsums (iq1_bsums) with delta - 8
 * in both words of each dword, where a VPMADDWD summed them and a VPMULLD (two operations) weighed
 * them (faster at 1 token, bit-equal). code: the pair's code bytes; wts: 2 ls + 1, per dword 2 c + s; delta. */
INLINE void iq1_unpack(const uint8_t *p0, const uint8_t *p1, __m512i code[2], __m512i *wts, __m512i *delta) {
    const strata_block_iq1_s *b0 = (const strata_block_iq1_s *)p0, *b1 = (const strata_block_iq1_s *)p1;
    const __m512i qs = pair_bytes(b0->qs, b1->qs);
    const __m512i qh = _mm512_castsi256_si512(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b0->qh)), _mm_loadu_si128((const __m128i *)b1->qh), 1));
    iq1_gather(qs, iq1_high(b0->qh, b1->qh, iq1s_high_at), code);
    const __m512i e = _mm512_permutexvar_epi16(_mm512_load_si512((const void *)iq1_chunk_at), qh);   /* the u16 in both words */
    *wts = _mm512_add_epi32(_mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(e, 12), _mm512_set1_epi32(7)), 1),
                            _mm512_set1_epi32(1));
    *delta = _mm512_sub_epi16(_mm512_set1_epi32((int)0xFFF9FFF9), _mm512_slli_epi16(_mm512_srli_epi16(e, 15), 1));   /* +-1, minus 8 */
}

/* The bsums (sums of 16 activations) of a pair of blocks (the second absent: zeros) as int16, word
 * 4 c + 2 s + k for bsum 2 c + k of block s (pair_weights' order). */
INLINE __m512i iq1_bsums(const strata_block_act_q8k *ab, int has1) {
    const __m256i s0 = _mm256_loadu_si256((const __m256i *)ab[0].bsums);
    const __m256i s1 = has1 ? _mm256_loadu_si256((const __m256i *)ab[1].bsums) : _mm256_setzero_si256();
    return _mm512_permutex2var_epi32(_mm512_zextsi256_si512(s0), _mm512_load_si512((const void *)iq1_sum_at),
                                     _mm512_zextsi256_si512(s1));
}

/* What a pair of blocks gives the dot products of every token: its code bytes, signs, weights,
 * IQ1's delta terms (the blocks' scales come 16 blocks at a time: group_scales). */
struct pair_unpacked {
    __m512i code[2], sg, wts, delta, dv;
};

INLINE void unpack_pair(int fmt, const uint8_t *p0, const uint8_t *p1, struct pair_unpacked *u) {
    u->sg = u->delta = u->dv = _mm512_setzero_si512();
    if (fmt == IQ1_S) {
        iq1_unpack(p0, p1, u->code, &u->wts, &u->delta);
    } else if (fmt == IQ1_M) {
        iq1m_unpack(p0, p1, u->code, &u->wts, &u->dv);
        u->delta = _mm512_mullo_epi16(u->wts, _mm512_set1_epi32((int)0xFFF7FFF7));   /* 9 * bsums * weight off per 16 values */
    } else if (fmt == IQ2_XXS) {
        /* chunk c's 4 index bytes (block 0's, then block 1's) in qword c, and its aux dwords (block 0's
         * in dword 2 c, block 1's in 2 c + 1): each block's qs loaded, and the other's merged in by a
         * masked load 4 bytes off (no dword it skips is read), where a shift and a blend made each */
        const __m512i q0 = _mm512_loadu_si512((const void *)(p0 + 2)), q1 = _mm512_loadu_si512((const void *)(p1 + 2));
        const __m512i idx = _mm512_mask_loadu_epi32(q0, 0xAAAA, (const void *)(p1 - 2));
        const __mmask64 upper = _mm512_movepi8_mask(idx);   /* grid rows 128-255 */
        /* the aux dwords' ksigns fields to the rows' lanes, and their weights 2 ls + 1 (ls: the top
         * nibble, taken shifted up one) */
        const __m512i aux = _mm512_mask_loadu_epi32(q1, 0x5555, (const void *)(p0 + 6));
        u->sg = _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(_mm512_load_si512((const void *)sign_at), aux),
                                              _mm512_set1_epi64(KEEP7_PARITY), 0);
        for (int h = 0; h < 2; h++) u->code[h] = look_up(codes[h], idx, upper);
        u->wts = _mm512_ternarylogic_epi32(_mm512_srli_epi32(aux, 27), _mm512_set1_epi32(0x1E), _mm512_set1_epi32(1), 0xEA);
    } else if (fmt == IQ2_XS) {   /* a u16 per row: index bits 0-8, ksigns 9-15 */
        const __m512i q0 = _mm512_loadu_si512((const void *)(p0 + 2)), q1 = _mm512_loadu_si512((const void *)(p1 + 2));
        const __m512i idx = _mm512_permutex2var_epi8(q0, _mm512_load_si512((const void *)u16_at[0]), q1);
        const __m512i hi = _mm512_permutex2var_epi8(q0, _mm512_load_si512((const void *)u16_at[1]), q1);
        const __mmask64 upper = _mm512_movepi8_mask(idx), ninth = _mm512_test_epi8_mask(hi, _mm512_set1_epi32(0x01010101));
        u->sg = _mm512_gf2p8affine_epi64_epi8(hi, _mm512_set1_epi64(SHIFT1_PARITY), 0);
        for (int h = 0; h < 2; h++)
            u->code[h] = _mm512_mask_blend_epi8(ninth, look_up(codes_xs[h], idx, upper), look_up(codes_xs[h] + 256, idx, upper));
        u->wts = pair_weights(((const strata_block_iq2_xs *)p0)->scales, ((const strata_block_iq2_xs *)p1)->scales, nibble_at, 0x1E);
    } else {   /* IQ2_S: index bytes, sign bytes, 2 high index bits per row in qh */
        const strata_block_iq2_s *b0 = (const strata_block_iq2_s *)p0, *b1 = (const strata_block_iq2_s *)p1;
        const __m512i idx = pair_bytes(b0->qs, b1->qs);
        u->sg = pair_bytes(b0->signs, b1->signs);
        const __m512i qh_bits = _mm512_load_si512((const void *)qh_bit);
        const __m512i qh = _mm512_permutexvar_epi8(_mm512_load_si512((const void *)qh_lane), _mm512_castsi128_si512(
            _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)b0->qh), _mm_loadl_epi64((const __m128i *)b1->qh))));
        const __mmask64 upper = _mm512_movepi8_mask(idx), b8 = _mm512_test_epi8_mask(qh, qh_bits),
                        b9 = _mm512_test_epi8_mask(qh, _mm512_add_epi8(qh_bits, qh_bits));
        for (int h = 0; h < 2; h++) {
            const uint8_t *c = codes_s[h];
            u->code[h] = _mm512_mask_blend_epi8(b9, _mm512_mask_blend_epi8(b8, look_up(c, idx, upper), look_up(c + 256, idx, upper)),
                                                _mm512_mask_blend_epi8(b8, look_up(c + 512, idx, upper), look_up(c + 768, idx, upper)));
        }
        u->wts = pair_weights(b0->scales, b1->scales, nibble_at, 0x1E);
    }
}

/* The scales d of blocks b0 .. b0 + 15 of a row (past its nb blocks: 0) as floats, by masked
 * VPGATHERDD: IQ2's and IQ1_S's d are their blocks' first two bytes; IQ1_M keeps its d in the top
 * nibbles of its four scale words, which two gathers and three bitwise selects put together. The
 * tiles take them once per 16 blocks, times the tokens' a.d (planes_rows lays those out per call, in
 * the thread's re-laid buffer), and each pair or block loads its two or one from those products
 * (planes_row): faster than converting each block's d and broadcasting d * a.d per pair at 1 token
 * (IQ1_M the most), the same bits (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
INLINE __m512 group_scales(int fmt, const uint8_t *w, int64_t bs, int64_t nb, int64_t b0) {
    const int n = nb - b0 < 16 ? (int)(nb - b0) : 16;
    const __mmask16 valid = (__mmask16)((1u << n) - 1);
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32((int)bs));
    const uint8_t *base = w + b0 * bs;
    __m512i raw;
    if (fmt == IQ1_M) {   /* words sc0 .. sc3: d = sc0 >> 12 | sc1 >> 8 & 0xF0 | sc2 >> 4 & 0xF00 | sc3 & 0xF000 */
        const int64_t sc = offsetof(strata_block_iq1_m, scales);
        const __m512i s01 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, at, (const void *)(base + sc), 1);
        const __m512i s23 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, at, (const void *)(base + sc + 4), 1);
        const __m512i lo = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0x0F), _mm512_srli_epi32(s01, 12), _mm512_srli_epi32(s01, 24), 0xCA);
        const __m512i hi = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0x0F00), _mm512_srli_epi32(s23, 4), _mm512_srli_epi32(s23, 16), 0xCA);
        raw = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0xFF), lo, hi, 0xCA);
    } else {
        raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, at, (const void *)base, 1);
    }
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
}

/* At every 16th block b of a row: d * a.d of blocks b .. b + 15 for each of nt tokens (a.d at ad, a
 * token's ad_stride apart), in wdad[t]; the tiles take a block's or a pair's from there. */
INLINE void scales_every_16(int fmt, const uint8_t *w, int64_t bs, int64_t nb, int64_t b, int nt, const float *ad,
                            int64_t ad_stride, float (*wdad)[16]) {
    if (b % 16) return;
    const __m512 wd = group_scales(fmt, w, bs, nb, b);
    for (int t = 0; t < nt; t++) _mm512_store_ps(wdad[t], _mm512_mul_ps(wd, _mm512_loadu_ps(ad + t * ad_stride + b)));
}

/* Block b of a row at w, for the tiles that take a block at a time: its scales (scales_every_16) and
 * the bytes ahead fetched */
INLINE const uint8_t *block_start(int fmt, const uint8_t *w, int64_t bs, int64_t nb, int64_t b, int nt, const float *ad,
                                  int64_t ad_stride, float (*wdad)[16], const uint8_t *ahead_end) {
    const uint8_t *p = w + b * bs;
    scales_every_16(fmt, w, bs, nb, b, nt, ad, ad_stride, wdad);
    fetch_block_ahead(p, bs, ahead_end);
    return p;
}

/* One weight row (nb blocks at w) against nt <= MAX_TOK tokens: y[t * ys]. IQ1's pairs are unpacked
 * one pair ahead of their products, so that the next pair's gathers are issued before this pair's
 * VPDPBUSD and their latency overlaps them (a gain at 1 token); the IQ2 formats, whose look-ups are in
 * registers, gained nothing that way and unpack each pair where it is used
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
INLINE void planes_row(int fmt, int64_t nb, const uint8_t *w, const uint8_t *a, int64_t arb, const float *ad,
                       int64_t ad_stride, const int8_t *x, int64_t tok_bytes, int nt, float *y, int64_t ys,
                       const uint8_t *ahead_end) {
    const int64_t bs = fmt == IQ2_XXS ? (int64_t)sizeof(strata_block_iq2_xxs)
                     : fmt == IQ2_XS ? (int64_t)sizeof(strata_block_iq2_xs)
                     : fmt == IQ1_S ? (int64_t)sizeof(strata_block_iq1_s)
                     : fmt == IQ1_M ? (int64_t)sizeof(strata_block_iq1_m) : (int64_t)sizeof(strata_block_iq2_s);
    __m512 acc[MAX_TOK];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const int ahead = fmt == IQ1_S || fmt == IQ1_M;
    struct pair_unpacked cur, next;
    /* d * a.d of 16 blocks (8 pairs) per token, each pair's two broadcast from memory (a load, not a
     * VPERMPS on the shuffle port: faster at 1 token, bit-equal) */
    float wdad[MAX_TOK][16] __attribute__((aligned(64)));
    if (ahead) unpack_pair(fmt, w, nb > 1 ? w + bs : w, &cur);
    for (int64_t p = 0; 2 * p < nb; p++) {
        const int has1 = 2 * p + 1 < nb;
        const int64_t q = ahead ? p + 1 : p;   /* the pair unpacked now; a lone last block pairs with itself, weighted 0 */
        scales_every_16(fmt, w, bs, nb, 2 * p, nt, ad, ad_stride, wdad);
        if (2 * q < nb) {
            const uint8_t *q0 = w + 2 * q * bs;
            fetch_block_ahead(q0, 2 * bs, ahead_end);
            unpack_pair(fmt, q0, 2 * q + 1 < nb ? q0 + bs : q0, ahead ? &next : &cur);
        }
        for (int t = 0; t < nt; t++) {
            const int8_t *xp = x + t * tok_bytes + p * PAIR_BYTES;
            __m512i isum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                if (fmt == IQ1_S || fmt == IQ1_M) {   /* 8 (g + 1) (+ 1 + delta) against the activations as they are */
                    const __m512i m8 = _mm512_gf2p8affine_epi64_epi8(cur.code[j / 4], _mm512_load_si512((const void *)times_8[j % 4]), 0);
                    const __m512i av = _mm512_load_si512((const void *)(xp + 64 * j));
                    if (fmt == IQ1_S) isum[j & 1] = _mm512_dpbusd_epi32(isum[j & 1], m8, av);
                    else isum[j & 1] = _mm512_dpwssd_epi32(isum[j & 1], _mm512_maddubs_epi16(_mm512_or_si512(m8, cur.dv), av), cur.wts);
                    continue;
                }
                const __m512i mag = _mm512_gf2p8affine_epi64_epi8(cur.code[j / 4], _mm512_load_si512((const void *)to_value[j % 4]), 8);
                const __mmask64 neg = _mm512_test_epi8_mask(cur.sg, _mm512_load_si512((const void *)bit_at[j]));
                const __m512i av = _mm512_load_si512((const void *)(xp + 64 * j));
                const __m512i sa = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
                if (fmt == IQ2_XXS) isum[j & 1] = _mm512_dpbusd_epi32(isum[j & 1], mag, sa);
                else isum[j & 1] = _mm512_dpwssd_epi32(isum[j & 1], _mm512_maddubs_epi16(mag, sa), cur.wts);   /* weighted here */
            }
            const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + 2 * p;
            /* block 0's d * a.d in the even dwords, block 1's in the odd */
            const __m512 scale = _mm512_castsi512_ps(_mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)&wdad[t][2 * (p % 8)])));
            __m512i sum = _mm512_add_epi32(isum[0], isum[1]);
            if (fmt == IQ1_S || fmt == IQ1_M) sum = _mm512_add_epi32(sum, _mm512_madd_epi16(iq1_bsums(ab, has1), cur.delta));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fmt == IQ2_XXS || fmt == IQ1_S ? _mm512_mullo_epi32(sum, cur.wts) : sum),
                                     scale, acc[t]);
        }
        if (ahead) cur = next;
    }
    for (int t = 0; t < nt; t++) y[t * ys] = 0.125f * _mm512_reduce_add_ps(acc[t]);
}

/* ---- IQ1_S, IQ1_M and IQ2_S by rows: decode calls (1-3 tokens) ----
 * Each grid row's 8 values are gathered as bytes, already values (IQ1: plus 9, with the delta added;
 * IQ2_S: its magnitudes, whose signs negate the activations as in planes_row), so nothing is
 * unpacked per position: per block, 4 VPGATHERQQ, each of one row of all 8 chunks (row l of
 * chunk c in qword c), and per token 4 VPDPBUSD against the activations re-laid to match (the ROWS
 * layout, relay_rows: per block, vector l lane 8 c + j holding value 32 c + 8 l + j), into dwords 2 c,
 * 2 c + 1 that sum chunk c's rows 0-1 (isum[0]) and 2-3 (isum[1]). They start from the 9 taken off:
 * -9 times the sums of those 16 values (the bsums), laid out after the vectors, so that one weight
 * per dword is left: 2 ls + 1 as floats, chunk c's (IQ1_S, one per 32 values) or its two groups' of
 * 16 (IQ1_M, IQ2_S), times the block's d * a.d, into one FMA (IQ1_M, IQ2_S: two). IQ2_S has no 9 to
 * take off: its 4 sign masks a block (from one GF2P8AFFINEQB, a VPMOVB2M or VPTESTMB each) negate the activations. The
 * integers are the scalar tile's per 16 values; the float terms are added in another order.
 *
 * Against the planes tile (planes_row) on the Intel machine: faster for IQ1_S, IQ1_M and IQ2_S at 1-3
 * tokens (IQ2_S's planes tile looks its 1024 grid rows up by 16 VPERMT2B a pair), slower from 4-5;
 * IQ2_XS (8 VPERMT2B) was slower by rows and keeps planes. The gathers bind it: with its gathers
 * replaced by an add the tile ran much faster, and a block's index unpacking and its 4 gathers alone
 * take about the tile's time. So decode calls come here and a prefill's 4-7 leftover tokens go to
 * planes_row, whose per-token work is the smaller. Tried on the way: each row in value order (VPERMW
 * of the weights per gather), VPMADDUBSW and VPDPWSSD with int16 weights, the next block's gathers
 * issued before these products, the constants in registers
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
#define ROWS_BLOCK 448   /* one token's re-laid activations of a block */

/* n_tok tokens' activations (arb bytes apart) into the ROWS layout, block b of token t at x + (t nb +
 * b) ROWS_BLOCK: vectors l = 0-3 (lane 8 c + j: value 32 c + 8 l + j, by two VPERMT2Q and a blend each),
 * then three vectors of int32, dword 2 c (odd dwords 0) -9 times the sum of chunk c's 32 values (at
 * 256), of its first 16 (320), of its second 16 (384). */
static void relay_rows(const uint8_t *a, int64_t arb, int64_t n_tok, int64_t nb, int8_t *x) {
    __m512i at[4];   /* vector l: qword 4 c + l of the block's 32 (c < 4: of its first two vectors, else its others) */
    for (int l = 0; l < 4; l++) at[l] = _mm512_setr_epi64(l, 4 + l, 8 + l, 12 + l, l, 4 + l, 8 + l, 12 + l);
    for (int64_t t = 0; t < n_tok; t++) {
        const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb);
        for (int64_t b = 0; b < nb; b++) {
            int8_t *o = x + (t * nb + b) * ROWS_BLOCK;
            __m512i q[4];
            for (int m = 0; m < 4; m++) q[m] = _mm512_loadu_si512((const void *)(ab[b].q + 64 * m));
            for (int l = 0; l < 4; l++)
                _mm512_store_si512((void *)(o + 64 * l), _mm512_mask_blend_epi64(0xF0, _mm512_permutex2var_epi64(q[0], at[l], q[1]),
                                                                                 _mm512_permutex2var_epi64(q[2], at[l], q[3])));
            const __m512i sums = _mm512_mullo_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)ab[b].bsums)),
                                                    _mm512_set1_epi32(-9));
            const __m512i first = _mm512_maskz_mov_epi32(0x5555, sums), second = _mm512_srli_epi64(sums, 32);
            _mm512_store_si512((void *)(o + 256), _mm512_add_epi32(first, second));
            _mm512_store_si512((void *)(o + 320), first);
            _mm512_store_si512((void *)(o + 384), second);
        }
    }
}

/* The unpacking's constants, loaded once per row */
struct rows_consts {
    __m512i p_at, row_at, top_at, word_at[4], wt_at[2], sign_bit[4], bits;
};

INLINE void rows_consts_load(int fmt, struct rows_consts *k) {
    k->p_at = _mm512_load_si512((const void *)(fmt == IQ2_S ? iq2s_p_at : iq1s_p_at));
    k->row_at = _mm512_load_si512((const void *)(fmt == IQ1_S ? iq1s_row_at : fmt == IQ1_M ? iq1m_row_at : iq2s_row_at));
    k->top_at = _mm512_load_si512((const void *)iq1s_top_at);
    for (int l = 0; l < 4; l++) k->word_at[l] = _mm512_load_si512((const void *)rows_word_at[l]);
    for (int h = 0; h < 2; h++) k->wt_at[h] = _mm512_load_si512((const void *)(fmt == IQ2_S ? iq2s_wt_at[h] : iq1m_wt2_at[h]));
    for (int l = 0; l < 4; l++) k->sign_bit[l] = _mm512_set1_epi8((char)(0x80 >> l));
    k->bits = _mm512_load_si512((const void *)bit_pattern);
}

/* Word l of each qword of idx alone in it (a VPGATHERQQ index): a VPSHUFB for the middle words, an AND
 * and a shift for the first and the last (off the shuffle port, which the rest of the unpacking
 * keeps busy) */
INLINE __m512i word_of(const struct rows_consts *k, __m512i idx, int l) {
    if (l == 0) return _mm512_and_si512(idx, _mm512_set1_epi64(0xFFFF));
    if (l == 3) return _mm512_srli_epi64(idx, 48);
    return _mm512_shuffle_epi8(idx, k->word_at[l]);
}

/* A block's 4 gathers (g[l]: row l of every chunk) and its weights as floats (wf[h]: dwords 2 c, 2 c + 1
 * the weight of rows 4 c + 2 h, 4 c + 2 h + 1; IQ1_S's are one per chunk, wf[1] unused) */
INLINE void iq1_rows_unpack(int fmt, const struct rows_consts *k, const uint8_t *p, __m512i g[4], __m512 wf[2]) {
    /* qs: bytes 0-31; qh: 32-47 (IQ1_M: its scales at 48-55); then qword c: chunk c's 4 index bytes and 2 qh bytes */
    const __m512i raw = fmt == IQ1_S ? _mm512_maskz_loadu_epi8(0xFFFFFFFFFFFFull, p + 2) : _mm512_maskz_loadu_epi8(0xFFFFFFFFFFFFFFull, p);
    const __m512i q = _mm512_maskz_permutexvar_epi8(0x3F3F3F3F3F3F3F3Full, k->p_at, raw);
    __m512i idx;   /* word l of qword c: row 4 c + l's index (bits 0-10) and the sign of its delta (bit 11) */
    if (fmt == IQ1_S) {   /* the delta's sign is qh's bit 15, a chunk's */
        const __m512i top = _mm512_multishift_epi64_epi8(k->top_at, q);
        idx = _mm512_ternarylogic_epi32(_mm512_multishift_epi64_epi8(k->row_at, q), top, _mm512_set1_epi32(0x07FF07FF), 0xE4);
        wf[0] = wf[1] = _mm512_cvtepi32_ps(_mm512_ternarylogic_epi32(top, _mm512_set1_epi32(0x0E), _mm512_set1_epi32(1), 0xEA));
    } else {   /* a nibble per row: bit 3 the delta's sign */
        idx = _mm512_and_si512(_mm512_multishift_epi64_epi8(k->row_at, q), _mm512_set1_epi32(0x0FFF0FFF));
        const __m512i sc = _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(p + 48)));
        for (int h = 0; h < 2; h++)
            wf[h] = _mm512_cvtepi32_ps(_mm512_ternarylogic_epi32(_mm512_multishift_epi64_epi8(k->wt_at[h], sc), _mm512_set1_epi32(0x0E),
                                                                 _mm512_set1_epi32(1), 0xEA));
    }
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) g[l] = _mm512_i64gather_epi64(word_of(k, idx, l), (const void *)iq1_grid_d, 8);
}

/* IQ2_S's block: its 4 gathers (g[l], as IQ1's: row l of every chunk, the magnitudes 8, 25, 43),
 * the rows' sign bits as masks of the activations to negate (neg[l]: bit 8 c + j, value j of row 4 c +
 * l), and its weights as floats (wf[h], as IQ1_M's: 16 values 2 c + h) */
INLINE void iq2s_rows_unpack(const struct rows_consts *k, const uint8_t *p, __m512i g[4], __mmask64 neg[4], __m512 wf[2]) {
    const __m512i a = _mm512_loadu_si512((const void *)(p + 2));   /* qs, then signs */
    const __m512i b = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 66)));   /* qh, then scales */
    const __m512i q = _mm512_maskz_permutex2var_epi8(0x1F1F1F1F1F1F1F1Full, a, k->p_at, b);
    const __m512i idx = _mm512_and_si512(_mm512_multishift_epi64_epi8(k->row_at, q), _mm512_set1_epi32(0x03FF03FF));
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) g[l] = _mm512_i64gather_epi64(word_of(k, idx, l), (const void *)strata_iq2s_grid, 8);
    /* qword c: the sign bytes of rows 4 c .. 4 c + 3 in its bytes 0-3, as a bit matrix; GF2P8AFFINEQB of
     * bit j (byte j of each qword) against it puts bit j of row 4 c + l's sign byte in bit 7 - l of
     * byte 8 c + j, so that one VPMOVB2M or VPTESTMB a row makes its mask. Against spreading each
     * row's sign byte over its qword by a VPSHUFB and testing it (8 operations on the shuffle port):
     * faster at 1-3 tokens, bit-equal (figures: benchmarks/RESULTS.md, "Kernel choice per CPU") */
    const __m512i sg = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(p + 34)));
    const __m512i t = _mm512_gf2p8affine_epi64_epi8(k->bits, sg, 0);
    neg[0] = _mm512_movepi8_mask(t);
#pragma GCC unroll 3
    for (int l = 1; l < 4; l++) neg[l] = _mm512_test_epi8_mask(t, k->sign_bit[l]);
    const __m512i sc = _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(p + 74)));
    for (int h = 0; h < 2; h++)
        wf[h] = _mm512_cvtepi32_ps(_mm512_ternarylogic_epi32(_mm512_multishift_epi64_epi8(k->wt_at[h], sc), _mm512_set1_epi32(0x1E),
                                                             _mm512_set1_epi32(1), 0xEA));
}

INLINE void rows_row(int fmt, int64_t nb, const uint8_t *w, const float *ad, int64_t ad_stride, const int8_t *x,
                     int64_t tok_bytes, int nt, float *y, int64_t ys, const uint8_t *ahead_end) {
    const int64_t bs = fmt == IQ1_S ? (int64_t)sizeof(strata_block_iq1_s) : fmt == IQ1_M ? (int64_t)sizeof(strata_block_iq1_m)
                     : (int64_t)sizeof(strata_block_iq2_s);
    struct rows_consts kc;
    rows_consts_load(fmt, &kc);
    __m512 acc[MAX_TOK];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    float wdad[MAX_TOK][16] __attribute__((aligned(64)));   /* d * a.d of 16 blocks per token */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = block_start(fmt, w, bs, nb, b, nt, ad, ad_stride, wdad, ahead_end);
        __m512i g[4];
        __m512 wf[2];
        __mmask64 neg[4];
        if (fmt == IQ2_S) iq2s_rows_unpack(&kc, p, g, neg, wf);
        else iq1_rows_unpack(fmt, &kc, p, g, wf);
        for (int t = 0; t < nt; t++) {
            const int8_t *xb = x + t * tok_bytes + b * ROWS_BLOCK;
            /* rows 0, 1 of each chunk, then rows 2, 3, from IQ1's bias (IQ1_S: the chunk's, all in the
             * first; IQ1_M: its two groups' of 16); IQ2_S's signs negate the activations */
            __m512i isum[2] = {fmt == IQ2_S ? _mm512_setzero_si512() : _mm512_load_si512((const void *)(xb + (fmt == IQ1_S ? 256 : 320))),
                               fmt == IQ1_M ? _mm512_load_si512((const void *)(xb + 384)) : _mm512_setzero_si512()};
            for (int l = 0; l < 4; l++) {
                __m512i av = _mm512_load_si512((const void *)(xb + 64 * l));
                if (fmt == IQ2_S) av = _mm512_mask_sub_epi8(av, neg[l], _mm512_setzero_si512(), av);
                isum[l / 2] = _mm512_dpbusd_epi32(isum[l / 2], g[l], av);
            }
            const __m512 s = _mm512_set1_ps(wdad[t][b % 16]);
            if (fmt == IQ1_S) acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(isum[0], isum[1])), _mm512_mul_ps(wf[0], s), acc[t]);
            else acc[t] = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[1]), wf[1], _mm512_mul_ps(_mm512_cvtepi32_ps(isum[0]), wf[0])), s, acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[t * ys] = 0.125f * _mm512_reduce_add_ps(acc[t]);
}

/* ---- IQ3_XXS and IQ3_S: rows of 4 values, 64 rows a block ----
 * Activations (the PLANES4 layout): per block and position j (0-3), 64 bytes, lane r holding value
 * 4 r + j. Lanes 4 q .. 4 q + 3 are 16 values of chunk q / 2, so VPDPBUSD's dwords each have one
 * weight. Row r's grid index is qs[r] as it is; its signs are bits 4 (r % 2) .. 4 (r % 2) + 3 of the
 * ksigns byte of field r / 2 (chunk r / 8's aux, field (r % 8) / 2), which VPERMB copies to lanes r
 * and VPTESTMB reads with a bit per lane parity. Values 4 .. 52 and 62: 3-bit codes (two to a byte
 * of codes3) turned into values by VPSHUFB. IQ3_S: 512 grid rows (the ninth index bit of row r is
 * bit r of qh: a mask that picks between two halves' look-ups), signs stored in the same nibbles,
 * and values 2 c + 1, which GF2P8AFFINEQB makes from the codes (off the shuffle port). */

#define BLOCK_BYTES4 256   /* one token's re-laid activations of a block */

static void relay4(const uint8_t *a, int64_t arb, int64_t n_tok, int64_t nb, int8_t *x) {
    uint8_t order_b[64];
    for (int i = 0; i < 64; i++) order_b[i] = (uint8_t)(4 * (i % 16) + i / 16);   /* 16 j + r: q[4 r + j] */
    const __m512i order = _mm512_loadu_si512((const void *)order_b);
    for (int64_t t = 0; t < n_tok; t++) {
        const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb);
        for (int64_t b = 0; b < nb; b++) {
            __m512i u[4];
            for (int m = 0; m < 4; m++)
                u[m] = _mm512_permutexvar_epi8(order, _mm512_loadu_si512((const void *)(ab[b].q + 64 * m)));
            lanes_4x4(u, x + (t * nb + b) * BLOCK_BYTES4, 64);
        }
    }
}


INLINE void planes4_row(int fmt, int64_t nb, const uint8_t *w, const float *ad, int64_t ad_stride, const int8_t *x,
                        int64_t tok_bytes, int nt, float *y, int64_t ys, const uint8_t *ahead_end) {
    const int64_t bs = fmt == IQ3_XXS ? (int64_t)sizeof(strata_block_iq3_xxs) : (int64_t)sizeof(strata_block_iq3_s);
    const __m512i field_at = _mm512_set1_epi64(0x352E2720150E0700ll);   /* bits 0, 7, 14, 21, 32, 39, 46, 53 */
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)IQ3_VALUES));
    const __m512i chunk_of = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    /* IQ3_S: VPMULTISHIFTQB's offset for the low byte of dwords 2 i, 2 i + 1 (qword i): 4 i - 1, mod 64 */
    const __m512i iq3s_wt_at = _mm512_setr_epi64(0x3f0000003fll, 0x300000003ll, 0x700000007ll, 0xb0000000bll, 0xf0000000fll, 0x1300000013ll, 0x1700000017ll, 0x1b0000001bll);
    uint8_t dup_b[64];
    for (int i = 0; i < 64; i++) dup_b[i] = (uint8_t)(i / 2);
    const __m512i dup = _mm512_loadu_si512((const void *)dup_b);
    __m512 acc[MAX_TOK];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    float wdad[MAX_TOK][16] __attribute__((aligned(64)));   /* d * a.d of 16 blocks per token */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = block_start(fmt, w, bs, nb, b, nt, ad, ad_stride, wdad, ahead_end);
        const __m512i idx = _mm512_loadu_si512((const void *)(p + 2));
        const __mmask64 upper = _mm512_movepi8_mask(idx);
        __m512i sg, wts, mag[4];
        if (fmt == IQ3_XXS) {
            const __m512i aux = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)((const strata_block_iq3_xxs *)p)->aux));
            sg = _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(field_at, aux), _mm512_set1_epi64(KEEP7_PARITY), 0);
            wts = _mm512_srli_epi32(_mm512_permutexvar_epi32(chunk_of, aux), 28);
            const __m512i c0 = look_up(codes3[0], idx, upper), c1 = look_up(codes3[1], idx, upper);
            mag[0] = _mm512_shuffle_epi8(lut, c0);
            mag[1] = _mm512_shuffle_epi8(lut, _mm512_srli_epi16(c0, 4));
            mag[2] = _mm512_shuffle_epi8(lut, c1);
            mag[3] = _mm512_shuffle_epi8(lut, _mm512_srli_epi16(c1, 4));
        } else {   /* row r's ninth index bit: bit r of qh; signs stored, bit 4 r + j; a nibble ls per chunk */
            const strata_block_iq3_s *q = (const strata_block_iq3_s *)p;
            const __mmask64 ninth = _load_mask64((__mmask64 *)(uintptr_t)q->qh);
            sg = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)q->signs));
            uint32_t s4;
            memcpy(&s4, q->scales, 4);
            /* dword 2 i, 2 i + 1: 2 ls + 1 of chunk i (nibble i, taken shifted up one: bits 4 i - 1 ..) */
            wts = _mm512_ternarylogic_epi32(_mm512_maskz_multishift_epi64_epi8(0x1111111111111111ull, iq3s_wt_at,
                                                                                _mm512_set1_epi64((long long)s4)),
                                            _mm512_set1_epi32(0x1E), _mm512_set1_epi32(1), 0xEA);
            __m512i c[2];
            for (int h = 0; h < 2; h++)
                c[h] = _mm512_mask_blend_epi8(ninth, look_up(codes3s[h], idx, upper), look_up(codes3s[h] + 256, idx, upper));
            for (int j = 0; j < 4; j++)
                mag[j] = _mm512_gf2p8affine_epi64_epi8(c[j / 2], _mm512_set1_epi64((long long)odd_value[j % 2]), 1);
        }
        sg = _mm512_permutexvar_epi8(dup, sg);   /* lane r: the sign byte of rows r & ~1, r | 1 */
        if (fmt == IQ3_XXS) wts = _mm512_add_epi32(_mm512_slli_epi32(wts, 1), _mm512_set1_epi32(1));
        for (int t = 0; t < nt; t++) {
            const int8_t *xp = x + t * tok_bytes + b * BLOCK_BYTES4;
            __m512i isum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {   /* even rows' sign bit j, odd rows' j + 4 */
                const __mmask64 neg = _mm512_test_epi8_mask(sg, _mm512_load_si512((const void *)bits4_at[j]));
                const __m512i av = _mm512_load_si512((const void *)(xp + 64 * j));
                isum[j & 1] = _mm512_dpbusd_epi32(isum[j & 1], mag[j], _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av));
            }
            /* IQ3_S's dword sums (16 values <= 15 times |a| <= 128) fit 16 bits: VPMADDWD with the weight
             * in the low word weighs them, where IQ3_XXS's (values <= 62) take VPMULLD */
            const __m512i sum = _mm512_add_epi32(isum[0], isum[1]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fmt == IQ3_S ? _mm512_madd_epi16(sum, wts) : _mm512_mullo_epi32(sum, wts)),
                                     _mm512_set1_ps(wdad[t][b % 16]), acc[t]);
        }
    }
    const float factor = fmt == IQ3_XXS ? 0.25f : 1.0f;
    for (int t = 0; t < nt; t++) y[t * ys] = factor * _mm512_reduce_add_ps(acc[t]);
}

/* The driver of every planes tile: the activations re-laid (once per thread and set of them) in the
 * layout of the format's rows, then rows one at a time with up to MAX_TOK tokens. */
INLINE void planes_rows(int fmt, int type, strata_qdot_tile_fn otherwise, int64_t k, const uint8_t *w, int64_t wrb,
                        int64_t n_rows, const uint8_t *a, int64_t arb, int64_t n_tok, float *y, int64_t ys) {
    const int four = fmt == IQ3_XXS || fmt == IQ3_S;   /* rows of 4 values: the PLANES4 layout */
    /* IQ1's and IQ2_S's decode calls by rows (rows_row; IQ2_S's only where gathers are fast, as
     * IQ1's planes tiles are handed out), their 4-7 tokens by planes (planes_row) */
    const int rows = (fmt == IQ1_S || fmt == IQ1_M || (fmt == IQ2_S && strata_cpu_has(STRATA_CPU_FAST_GATHERS))) && n_tok < STRATA_QDOT_DECODE_TOKENS;
    const int64_t nb = k / STRATA_QK_K, tok_bytes = rows ? nb * ROWS_BLOCK : four ? nb * BLOCK_BYTES4 : (nb + 1) / 2 * PAIR_BYTES;
    if (nb == 0 || n_tok == 0) {
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < n_rows; r++) y[t * ys + r] = 0.0f;
        return;
    }
    /* the re-laid activations, then room for MAX_TOK tokens' block scales a.d (ad_stride a token,
     * zeros past nb: a whole group of 16 for group_scales), in the thread's buffer */
    const int64_t ad_stride = (nb + 15) / 16 * 16;
    const size_t x_bytes = (size_t)(n_tok * tok_bytes);   /* a multiple of 256 */
    int valid = 0;
    int8_t *x = (int8_t *)strata_qdot_relaid(a, n_tok, k, arb, x_bytes + (size_t)(MAX_TOK * ad_stride) * sizeof(float),
                                             rows ? STRATA_RELAID_ROWS : four ? STRATA_RELAID_PLANES4 : STRATA_RELAID_PLANES, &valid);
    if (!x) {   /* no memory for the layout: the gather tile or the AVX2 build does it */
        strata_qdot_gathers(type, otherwise)(k, w, wrb, n_rows, a, arb, n_tok, y, ys);
        return;
    }
    if (!valid) {
        if (rows) relay_rows(a, arb, n_tok, nb, x);
        else if (four) relay4(a, arb, n_tok, nb, x);
        else relay(a, arb, n_tok, nb, x, tok_bytes);
    }
    const uint8_t *ahead_end = strata_qdot_ahead();   /* once per call: a call per row (and a VZEROUPPER) cost time */
    float *ad = (float *)(x + x_bytes);   /* MAX_TOK tokens' a.d at a time */
    for (int64_t t = 0; t < n_tok; t += MAX_TOK) {
        const int nt = n_tok - t < MAX_TOK ? (int)(n_tok - t) : MAX_TOK;
        const uint8_t *at = a + t * arb;
        const int8_t *xt = x + t * tok_bytes;
        for (int u = 0; u < nt; u++)
            for (int64_t b = 0; b < ad_stride; b++)
                ad[u * ad_stride + b] = b < nb ? ((const strata_block_act_q8k *)(at + u * arb))[b].d : 0.0f;
        for (int64_t r = 0; r < n_rows; r++) {
            float *yr = y + t * ys + r;
            if (rows && nt == 1) rows_row(fmt, nb, w + r * wrb, ad, ad_stride, xt, tok_bytes, 1, yr, ys, ahead_end);
            else if (rows) rows_row(fmt, nb, w + r * wrb, ad, ad_stride, xt, tok_bytes, nt, yr, ys, ahead_end);
            else if (four && nt == 1) planes4_row(fmt, nb, w + r * wrb, ad, ad_stride, xt, tok_bytes, 1, yr, ys, ahead_end);
            else if (four) planes4_row(fmt, nb, w + r * wrb, ad, ad_stride, xt, tok_bytes, nt, yr, ys, ahead_end);
            else if (nt == 1) planes_row(fmt, nb, w + r * wrb, at, arb, ad, ad_stride, xt, tok_bytes, 1, yr, ys, ahead_end);
            else planes_row(fmt, nb, w + r * wrb, at, arb, ad, ad_stride, xt, tok_bytes, nt, yr, ys, ahead_end);
        }
    }
}

#define DEFINE_PLANES(name, fmt, T)                                                                        \
    void strata_qdot_##name##_planes(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,      \
                                     const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, \
                                     int64_t ys) {                                                          \
        planes_rows(fmt, STRATA_T_##T, strata_qdot_##name##_evex, k, w, wrb, n_rows, a, arb, n_tok, y, ys); \
    }
#else /* not x86: the names exist so the library links; qdot.c never hands them out */
#define DEFINE_PLANES(name, fmt, T)                                                                        \
    void strata_qdot_##name##_planes(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,      \
                                     const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, \
                                     int64_t ys) {                                                          \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                  \
    }
#endif

DEFINE_PLANES(iq2_xxs, IQ2_XXS, IQ2_XXS)
DEFINE_PLANES(iq2_xs, IQ2_XS, IQ2_XS)
DEFINE_PLANES(iq2_s, IQ2_S, IQ2_S)
DEFINE_PLANES(iq1_s, IQ1_S, IQ1_S)
DEFINE_PLANES(iq1_m, IQ1_M, IQ1_M)
DEFINE_PLANES(iq3_xxs, IQ3_XXS, IQ3_XXS)
DEFINE_PLANES(iq3_s, IQ3_S, IQ3_S)

