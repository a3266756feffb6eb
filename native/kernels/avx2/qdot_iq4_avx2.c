/*
 * AVX2 twins of the scalar tile kernels of IQ4_NL, IQ4_XS, TQ2_0, TQ1_0 and NVFP4 (qdot_iq.c;
 * interface: qdot.h; block layouts: common.h). As in qdot_avx2.c, the integer dot product of a
 * weight (sub-)block with the activation block is exact, kept in 8 int32 lanes that are converted
 * to float and added (fused multiply-add) into 8 float lanes, reduced once per output: the result
 * equals the scalar one up to the rounding of a differently ordered float sum.
 *   IQ4_NL, IQ4_XS  code book values (signed, in [-127, 113]) by a byte shuffle of the nibbles,
 *                   then maddubs(|w|, sign(a, w)): |pair sums| <= 2 * 127 * 127 < 2^15; IQ4_XS's
 *                   sub-block scales ls - 32 come in through madd (|lane| <= 2^21)
 *   TQ2_0, TQ1_0    digits q + 1 in {0, 1, 2}: maddubs(digit, a) added in int16 over the whole block
 *                   (|lane| <= 8 * 2 * 2 * 127), minus the activation's bsums (sum a: the + 1), then
 *                   madd(., 1)
 *   NVFP4           doubled E2M1 values plus 12 (in [0, 24]) by a byte shuffle: maddubs(code, a) less
 *                   maddubs(12, a), in int16 per 16-value sub-block (|lane| <= 4 * 12 * 127), then a
 *                   float scale per sub-block (the UE4M3 scale read as a binary16, see nvfp4_scales)
 *
 * Tiles and driver as in qdot_avx2.c (shared pieces: qdot_avx2_common.h): decode (fewer than
 * 4 tokens) runs 8 rows x 1 token for IQ4_NL (iq4_nl_rows8; 4 rows for what is left) and 4 rows x 1
 * token for NVFP4, fetching the next tile ahead, and 1 row x all tokens for the 256-value formats,
 * fetching PF_AHEAD bytes ahead in the row; prefill runs 1 row x 8 tokens, so a block is unpacked
 * once for 8 tokens (NVFP4: 4 rows x 4 tokens, which also shares its rearranged activations between
 * 4 rows, faster than 1 x 8). TQ1_0 decode is bound by its digit arithmetic (~100 instructions per
 * 54-byte block), not by memory; the EVEX build adds a 512-bit TQ1_0 tile (below) that AVX-512
 * machines decode with (~60 per block, faster on the Intel machine;
 * figures: benchmarks/RESULTS.md, "Kernel choice per CPU").
 *
 * The ISA is enabled for this translation unit only; qdot.c hands these kernels out only after the
 * CPU was seen to have AVX2, FMA and F16C.
 */
#include "iq_tables.h"
#include "qdot.h"

#include <stddef.h>

#if defined(__x86_64__) || defined(__i386__)
#ifdef STRATA_QDOT_EVEX
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#include "qdot_avx2_common.h"


/* The binary16 scale stored at p. */
INLINE float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}


/* A 16-entry signed byte table in both 128-bit halves (for _mm256_shuffle_epi8). */
INLINE __m256i table16(const int8_t *t) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t)); }


/* The cache lines of the block of `bs` bytes `ahead` bytes past p. */
INLINE void fetch_ahead_by(const uint8_t *p, int64_t bs, int64_t ahead) {
    for (int64_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)(p + ahead + o), _MM_HINT_T0);
}
INLINE void fetch_ahead(const uint8_t *p, int64_t bs) { fetch_ahead_by(p, bs, PF_AHEAD); }

/* ---- IQ4_NL against STRATA_ACT_Q8 ---- */

/* The 8 binary16 scales at p, p + stride, ..., p + 7 stride as floats (row order). */
INLINE __m256 halves8(const uint8_t *p, int64_t stride) {
    uint64_t lo = 0, hi = 0;
    for (int r = 0; r < 4; r++) {
        uint16_t a, b;
        memcpy(&a, p + r * stride, 2);
        memcpy(&b, p + (r + 4) * stride, 2);
        lo |= (uint64_t)a << 16 * r;
        hi |= (uint64_t)b << 16 * r;
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

/* Decode (one token) over 8 rows, two rows per vector as qdot_avx2.c's q4_0_rows8: row r's 16 code
 * bytes in the low half, row r + 4's in the high half, so one AND and one shift-and-AND give both
 * rows' low- and high-nibble codes, against the activation's first and last 16 values broadcast to
 * both halves (the code book shuffle works per half). The signed products need int32 pair sums
 * (madd); three horizontal adds fold them into one block sum per row, in row order, and the 8 rows'
 * scales convert in one instruction: one conversion, multiply and add per block for 8 rows. */
INLINE void iq4_nl_rows8(int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, float *y) {
    const int64_t bs = sizeof(strata_block_iq4_nl), w4 = 4 * wrb;
    const __m256i table = table16(strata_kvalues_iq4nl), ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(15);
    const strata_block_act_q8 *ab = (const strata_block_act_q8 *)a;
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / STRATA_QK; b++) {
        const uint8_t *p = w + b * bs;
        fetch_next_tile(w, 8 * wrb, b * 8 * bs, 8 * bs, ahead_end);
        const __m256i alo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ab[b].q));
        const __m256i ahi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(ab[b].q + 16)));
        __m256i s[4];
        for (int r = 0; r < 4; r++) {
            const __m256i q = _mm256_loadu2_m128i((const __m128i *)(p + r * wrb + w4 + 2), (const __m128i *)(p + r * wrb + 2));
            const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
            const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
            const __m256i plo = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(alo, lo));
            const __m256i phi = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(ahi, hi));
            s[r] = _mm256_add_epi32(_mm256_madd_epi16(plo, ones), _mm256_madd_epi16(phi, ones));
        }
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        const __m256 d8 = _mm256_mul_ps(halves8(p, wrb), _mm256_set1_ps(ab[b].d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), d8, acc);
    }
    _mm256_storeu_ps(y, acc);
}

INLINE void iq4_nl_tile(int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, int64_t arb,
                        float *y, int64_t ys) {
    if (nr == 8 && nt == 1) {
        iq4_nl_rows8(k, w, wrb, a, y);  /* y: 8 consecutive rows of one token */
        return;
    }
    const int64_t bs = sizeof(strata_block_iq4_nl);
    const __m256i table = table16(strata_kvalues_iq4nl), ones = _mm256_set1_epi16(1);
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc[4][8];
    ZERO_ACC(acc)
    for (int64_t b = 0; b < k / STRATA_QK; b++) {
        if (nt < 4) fetch_next_tile(w, nr * wrb, b * nr * bs, nr * bs, ahead_end);
        for (int r = 0; r < nr; r++) {
            const uint8_t *p = w + r * wrb + b * bs;
            const __m256i q = _mm256_shuffle_epi8(table, nibbles32(p + 2));
            const __m256i qa = _mm256_sign_epi8(q, q);
            const float wd = half_at(p);
            for (int t = 0; t < nt; t++) {
                const strata_block_act_q8 *ab = (const strata_block_act_q8 *)(a + t * arb) + b;
                const __m256i av = _mm256_loadu_si256((const __m256i *)ab->q);
                const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(av, q)), ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(wd * ab->d), acc[r][t]);
            }
        }
    }
    store_tile(nr, nt, acc, y, ys);
}

#define TILE_IQ4_NL(nr, nt, ...) iq4_nl_tile(nr, nt, __VA_ARGS__)
DEFINE_DRIVER(iq4_nl, TILE_IQ4_NL, 1, 8, 8)

/* ---- NVFP4 against STRATA_ACT_Q8 (two activation blocks per 64-value weight block) ----
 *
 * The 32 code bytes hold sub-block s (16 values) in bytes 8s..8s+7, low nibbles values 0-7, high
 * nibbles 8-15. The bytes' low nibbles (one AND) line up with lo = [a0 0-7, a0 16-23 | a1 0-7,
 * a1 16-23] and their high nibbles with hi = [a0 8-15, a0 24-31 | a1 8-15, a1 24-31] (a0, a1: the two
 * activation blocks), so the activations are rearranged once per block and token instead of the
 * codes once per row; madd then leaves sub-block s's sum in int32 lanes 2s and 2s + 1. */

typedef struct {
    __m256i lo, hi, bias;   /* rearranged activation codes; maddubs(12, lo) + maddubs(12, hi) */
    __m256 d;               /* [d0 x 4, d1 x 4] */
} nvfp4_act;

INLINE void nvfp4_act_load(const strata_block_act_q8 *ab, nvfp4_act *x) {
    const __m256i p = _mm256_loadu2_m128i((const __m128i *)ab[1].q, (const __m128i *)ab[0].q);
    const __m256i q = _mm256_loadu2_m128i((const __m128i *)(ab[1].q + 16), (const __m128i *)(ab[0].q + 16));
    const __m256i twelve = _mm256_set1_epi8(12);
    x->lo = _mm256_unpacklo_epi64(p, q);
    x->hi = _mm256_unpackhi_epi64(p, q);
    x->bias = _mm256_add_epi16(_mm256_maddubs_epi16(twelve, x->lo), _mm256_maddubs_epi16(twelve, x->hi));
    x->d = _mm256_set_m128(_mm_set1_ps(ab[1].d), _mm_set1_ps(ab[0].d));
}

/* The four sub-block scales of a block, each twice: [s0, s0, s1, s1, s2, s2, s3, s3]. A UE4M3 byte
 * x (bit 7 ignored) shifted left by 7 is the binary16 number of the same exponent field and leading
 * mantissa bits with the exponent bias 15 instead of 7, subnormals included, so its value times
 * 2^8 / 2 (the stored E2M1 codes are doubled) is strata_ue4m3_half(x) exactly; the byte 0x7f (and
 * only it: 0xff is 240, as in gguf-py) reads as 0. */
INLINE __m256 nvfp4_scales(const uint8_t *d) {
    const __m128i dup = _mm_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1);
    const __m128i x = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)load_u32(d)), dup);
    const __m128i nan = _mm_cmpeq_epi16(x, _mm_set1_epi16(0x7f));
    const __m128i h = _mm_slli_epi16(_mm_andnot_si128(nan, _mm_and_si128(x, _mm_set1_epi16(0x7f))), 7);
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(128.0f));
}

INLINE void nvfp4_tile(int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, int64_t arb,
                       float *y, int64_t ys) {
    const int64_t bs = sizeof(strata_block_nvfp4);
    /* 2 * E2M1 + 12: the table of qdot.h's strata_e2m1_doubled, biased to be unsigned */
    const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                           12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const uint8_t *ahead_end = strata_qdot_ahead_end;
    __m256 acc[4][8];
    ZERO_ACC(acc)
    for (int64_t b = 0; b < k / STRATA_QK_NVFP4; b++) {
        if (nt < 4) fetch_next_tile(w, nr * wrb, b * nr * bs, nr * bs, ahead_end);
        nvfp4_act x[8];
        for (int t = 0; t < nt; t++) nvfp4_act_load((const strata_block_act_q8 *)(a + t * arb) + 2 * b, &x[t]);
        for (int r = 0; r < nr; r++) {
            const strata_block_nvfp4 *wb = (const strata_block_nvfp4 *)(w + r * wrb + b * bs);
            const __m256i c = _mm256_loadu_si256((const __m256i *)wb->qs);
            const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(c, low4));
            const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(c, 4), low4));
            const __m256 sc = nvfp4_scales(wb->d);
            for (int t = 0; t < nt; t++) {
                const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x[t].lo), _mm256_maddubs_epi16(hi, x[t].hi));
                const __m256i s = _mm256_madd_epi16(_mm256_sub_epi16(p16, x[t].bias), ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sc, x[t].d), acc[r][t]);
            }
        }
    }
    store_tile(nr, nt, acc, y, ys);
}

#define TILE_NVFP4(nr, nt, ...) nvfp4_tile(nr, nt, __VA_ARGS__)
DEFINE_DRIVER(nvfp4, TILE_NVFP4, 4, 4, 4)

/* ---- IQ4_XS against STRATA_ACT_Q8K ---- */

/* The 8 sub-block scales ls - 32 as int16, in both 128-bit halves: ls_j is nibble j of the 32-bit
 * scales_l with bits 2j, 2j + 1 of scales_h above it. */
INLINE __m256i iq4_xs_scales(const strata_block_iq4_xs *b) {
    const __m256i l = _mm256_srlv_epi32(_mm256_set1_epi32((int)load_u32(b->scales_l)),
                                        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32((int)b->scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    const __m256i ls = _mm256_or_si256(_mm256_and_si256(l, _mm256_set1_epi32(15)),
                                       _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(3)), 4));
    const __m256i m = _mm256_sub_epi32(ls, _mm256_set1_epi32(32));
    return _mm256_broadcastsi128_si256(_mm_packs_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1)));
}

INLINE void iq4_xs_tile(int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a, int64_t arb,
                        float *y, int64_t ys) {
    const int64_t bs = sizeof(strata_block_iq4_xs);
    const __m256i table = table16(strata_kvalues_iq4nl);
    __m256 acc[4][8];
    ZERO_ACC(acc)
    for (int64_t b = 0; b < k / STRATA_QK_K; b++)
        for (int r = 0; r < nr; r++) {
            const strata_block_iq4_xs *wb = (const strata_block_iq4_xs *)(w + r * wrb + b * bs);
            if (nt < 4) fetch_ahead((const uint8_t *)wb, bs);
            const __m256i scales = iq4_xs_scales(wb);
            __m256i isum[8];
            for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {  /* sub-block j: values 32j..32j+31 */
                const __m256i q = _mm256_shuffle_epi8(table, nibbles32(wb->qs + 16 * j));
                const __m256i qa = _mm256_sign_epi8(q, q);
                const __m256i sc = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(2 * j | (2 * j + 1) << 8)));
                for (int t = 0; t < nt; t++) {
                    const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
                    const __m256i av = _mm256_loadu_si256((const __m256i *)(ab->q + 32 * j));
                    isum[t] = madd_acc(isum[t], _mm256_maddubs_epi16(qa, _mm256_sign_epi8(av, q)), sc);
                }
            }
            const float wd = half_at((const uint8_t *)wb + offsetof(strata_block_iq4_xs, d));
            for (int t = 0; t < nt; t++) {
                const strata_block_act_q8k *ab = (const strata_block_act_q8k *)(a + t * arb) + b;
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(wd * ab->d), acc[r][t]);
            }
        }
    store_tile(nr, nt, acc, y, ys);
}

#define TILE_IQ4_XS(nr, nt, ...) iq4_xs_tile(nr, nt, __VA_ARGS__)
DEFINE_DRIVER(iq4_xs, TILE_IQ4_XS, 1, 8, 1)

/* ---- TQ2_0, TQ1_0 against STRATA_ACT_Q8K ----
 *
 * A block's 256 digits (q + 1) are made once into 8 vectors (values 32g..32g+31 in vector g), then
 * each token of the tile runs through them: 8 maddubs added in int16, the bsums taken off (the + 1),
 * one madd. The digit vectors and one token's sum stay in registers. */

/* acc += d * a.d * (sum digit * a - sum a) for one token's activation block. */
INLINE __m256 tq_token(const __m256i dig[8], const strata_block_act_q8k *ab, float wd, __m256 acc) {
    __m256i s16 = _mm256_sub_epi16(_mm256_maddubs_epi16(dig[0], _mm256_loadu_si256((const __m256i *)ab->q)),
                                   _mm256_loadu_si256((const __m256i *)ab->bsums));
    for (int g = 1; g < 8; g++)
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(dig[g], _mm256_loadu_si256((const __m256i *)(ab->q + 32 * g))));
    const __m256i s = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(wd * ab->d), acc);
}

/* TQ2_0: values 128c + 32p + l are bits 2p, 2p + 1 of qs[32c + l]. */
INLINE void tq2_0_digits(const strata_block_tq2_0 *wb, __m256i dig[8]) {
    const __m256i three = _mm256_set1_epi8(3);
    for (int c = 0; c < 2; c++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(wb->qs + 32 * c));
        for (int p = 0; p < 4; p++) dig[4 * c + p] = _mm256_and_si256(_mm256_srli_epi16(x, 2 * p), three);
    }
}

/* TQ1_0's base-3 digit p of byte v is (3 m) >> 8 with m = v * 3^p mod 256, i.e. (m >= 86) + (m >= 171).
 * The kernel carries m ^ 0x80 (= m - 128 as a signed byte) from power to power: multiplying it by 3
 * or 9 mod 256 keeps the offset (3 * -128 = 9 * -128 = -128 mod 256), and the two thresholds become
 * signed compares. */
INLINE __m256i times3(__m256i v) { return _mm256_add_epi8(_mm256_add_epi8(v, v), v); }
INLINE __m256i times9(__m256i v) {  /* 8v + v; the mask drops the bits the 16-bit shift carries over */
    return _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16(v, 3), _mm256_set1_epi8((char)0xf8)), v);
}

/* The thresholds sit in registers the compiler cannot see into: seen as constants, GCC turns
 * 0 - (m > -43) into m >= -42, which AVX2 does in two instructions (min, equal). */
typedef struct { __m256i lo, hi; } tq1_limits;

INLINE tq1_limits tq1_limits_make(void) {
    tq1_limits k = {_mm256_set1_epi8(-43), _mm256_set1_epi8(42)};
    __asm__("" : "+x"(k.lo), "+x"(k.hi));
    return k;
}

INLINE __m256i tq1_digits(__m256i m, tq1_limits k) {
    const __m256i c = _mm256_add_epi8(_mm256_cmpgt_epi8(m, k.lo), _mm256_cmpgt_epi8(m, k.hi));
    return _mm256_sub_epi8(_mm256_setzero_si256(), c);
}

/* m ^ 0x80 of the 16 bytes [qh * 1, qh * 3, qh * 9, qh * 27] (4 bytes each): 16-bit products, low bytes. */
INLINE __m128i tq1_qh_powers(const uint8_t *qh) {
    const __m256i q16 = _mm256_cvtepu8_epi16(_mm_set1_epi32((int)load_u32(qh)));
    const __m256i p = _mm256_and_si256(_mm256_mullo_epi16(q16, _mm256_setr_epi16(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27)),
                                       _mm256_set1_epi16(0xff));
    const __m128i b = _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    return _mm_xor_si128(b, _mm_set1_epi8((char)0x80));
}

INLINE void tq1_0_digits(const strata_block_tq1_0 *wb, __m256i dig[8]) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const tq1_limits k = tq1_limits_make();
    /* values 32p + j: digit p of qs[j] */
    __m256i m = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)wb->qs), flip);
    for (int p = 0; p < 5; p++, m = times3(m)) dig[p] = tq1_digits(m, k);
    /* values 160 + 16p + j: digit p of qs[32 + j], two powers per vector */
    const __m256i v = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(wb->qs + 32))), flip);
    const __m256i m01 = _mm256_blend_epi32(v, times3(v), 0xf0), m23 = times9(m01);
    dig[5] = tq1_digits(m01, k);
    dig[6] = tq1_digits(m23, k);
    /* values 224 + j: digit 4 of qs[32 + j]; values 240 + 4p + j: digit p of qh[j] */
    dig[7] = tq1_digits(_mm256_inserti128_si256(times9(m23), tq1_qh_powers(wb->qh), 1), k);
}

/* One tile of a TQ format: DIGITS(block, dig) makes the digit vectors. */
#define TQ_TILE(name, block_t, DIGITS)                                                                         \
    INLINE void name##_tile(int nr, int nt, int64_t k, const uint8_t *w, int64_t wrb, const uint8_t *a,        \
                            int64_t arb, float *y, int64_t ys) {                                               \
        __m256 acc[4][8];                                                                                      \
        ZERO_ACC(acc)                                                                                          \
        for (int64_t b = 0; b < k / STRATA_QK_K; b++)                                                          \
            for (int r = 0; r < nr; r++) {                                                                     \
                const block_t *wb = (const block_t *)(w + r * wrb) + b;                                        \
                if (nt < 4) fetch_ahead((const uint8_t *)wb, sizeof(block_t));                                 \
                __m256i dig[8];                                                                                \
                DIGITS(wb, dig);                                                                               \
                const float wd = half_at((const uint8_t *)wb + offsetof(block_t, d));                          \
                for (int t = 0; t < nt; t++)                                                                   \
                    acc[r][t] = tq_token(dig, (const strata_block_act_q8k *)(a + t * arb) + b, wd, acc[r][t]); \
            }                                                                                                  \
        store_tile(nr, nt, acc, y, ys);                                                                        \
    }

TQ_TILE(tq2_0, strata_block_tq2_0, tq2_0_digits)
TQ_TILE(tq1_0, strata_block_tq1_0, tq1_0_digits)

#define TILE_TQ2_0(nr, nt, ...) tq2_0_tile(nr, nt, __VA_ARGS__)
DEFINE_DRIVER(tq2_0, TILE_TQ2_0, 1, 8, 1)
#define TILE_TQ1_0(nr, nt, ...) tq1_0_tile(nr, nt, __VA_ARGS__)
DEFINE_DRIVER(tq1_0, TILE_TQ1_0, 1, 8, 1)

#ifdef STRATA_QDOT_EVEX
/* ---- TQ1_0 on 512-bit vectors: the AVX-512 machines' own tile (their decode) ----
 *
 * One zmm holds a block's bytes: qs[0..47] in bytes 0-47 and qh[0..3] in bytes 48-51 (one masked
 * load: they lie together in the block). Its powers m_p = 3^p m mod 256, p = 0..4, hold digit p
 * of every byte: in vector p, of qs[j] (values 32 p + j) in bytes 0-31, of qs[32 + j] (values
 * 160 + 16 p + j) in bytes 32-47 and, for p < 4, of qh[j] (values 240 + 4 p + j) in bytes 48-51.
 * The activations are re-laid once per call and 16 rows to match, zero in the bytes no value owns.
 *
 * A digit is never made. Digit p of a byte is (3 m_p) >> 8 = (3 m_p - m_{p+1}) / 256, since m_{p+1}
 * is 3 m_p mod 256: so the block's sum of activations times digits is
 *     (3 sum_p dot(a_p, m_p) - sum_p dot(a_p, m_{p+1})) / 256,
 * exact in every dword lane (each byte's term is 256 times an integer), two VPDPBUSD per power of
 * the bytes as they are and two adds to the next power. Digits are q + 1 in {0, 1, 2}; the + 1
 * comes off with the block's sum of the activations, 256 times it laid in lane 0 of the second
 * sum's start value. The block's exact integer sum is scaled by d * a.d and added in 16 float
 * lanes, reduced once per output: the scalar result up to the order of a float sum.
 * Faster than the tile that made digits for every token count at 1-3 tokens, in cache and from
 * DRAM (the qh bytes loaded with qs, not multiplied out). The 10 VPDPBUSD and 10 byte adds a block
 * issue two a cycle, but each of the two sums is a chain of 5 VPDPBUSD (25 cycles of latency), and a
 * block at a time the scheduler did not hold enough blocks to hide it: TQ1_GROUP blocks' chains are
 * interleaved (tq1_group_sums); two blocks gained, four a little more, eight spill at 2 tokens
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU").
 *
 * From 3 tokens the VPDPBUSD (two a power and token) outweigh the digits: there the digits are
 * made, 64 at a time (two compares to masks of m_p ^ 0x80, two masked moves), one VPDPBUSD a power
 * and token. Both give the same integer in every lane, so a token's result does not depend on the
 * call's token count. */
#define TQ1_CHUNK 16   /* activation blocks re-laid at a time (4096 values) */
#define TQ1_TOK 4      /* tokens per pass over the rows */
#define TQ1_ROWS 16    /* rows per re-laid chunk */
#define TQ1_SUMS_TOK 2 /* calls of up to this many tokens take the digit sums without digits */
#define TQ1_BYTES 0x000fffffffffffffULL   /* the 52 bytes of qs and qh */
/* Decode fetches this far ahead, past the AVX2 tiles' PF_AHEAD: from DRAM 2048 was slower and 3072
 * less steady, 4096 to 8192 about the same (figures: benchmarks/RESULTS.md, "Kernel choice per CPU") */
#define TQ1_AHEAD 4096
#define TQ1_GROUP 4   /* blocks whose sums are made together (calls of up to TQ1_SUMS_TOK tokens) */

typedef struct {
    __m512i a[TQ1_CHUNK][5];    /* the five re-laid vectors of each block */
    __m512i neg[TQ1_CHUNK];     /* -(sum of the block's activations) in lane 0 */
    __m512i sum256[TQ1_CHUNK];  /* 256 times that sum, in lane 0 */
    float d[TQ1_CHUNK];
} tq1_acts;

INLINE void tq1_relay(const strata_block_act_q8k *ab, int nb, tq1_acts *out) {
    for (int b = 0; b < nb; b++) {
        const int8_t *q = ab[b].q;
        for (int p = 0; p < 5; p++) {
            __m512i v = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(q + 32 * p)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(q + 160 + 16 * p)), 2);
            if (p < 4) v = _mm512_inserti32x4(v, _mm_cvtsi32_si128((int)load_u32((const uint8_t *)q + 240 + 4 * p)), 3);
            out->a[b][p] = v;
        }
        const int sum = _mm512_reduce_add_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)ab[b].bsums)));
        out->neg[b] = _mm512_zextsi128_si512(_mm_cvtsi32_si128(-sum));
        out->sum256[b] = _mm512_zextsi128_si512(_mm_cvtsi32_si128(256 * sum));
        out->d[b] = ab[b].d;
    }
}

/* Digits (3 m) >> 8 of the bytes m ^ 0x80 (see tq1_digits): 1 above -43, 2 above 42. */
INLINE __m512i tq1_digits512(__m512i m) {
    const __mmask64 k1 = _mm512_cmpgt_epi8_mask(m, _mm512_set1_epi8(-43));
    const __mmask64 k2 = _mm512_cmpgt_epi8_mask(m, _mm512_set1_epi8(42));
    return _mm512_mask_mov_epi8(_mm512_maskz_mov_epi8(k1, _mm512_set1_epi8(1)), k2, _mm512_set1_epi8(2));
}

INLINE __m512i times3_512(__m512i v) { return _mm512_add_epi8(_mm512_add_epi8(v, v), v); }

/* The integer sums of ng <= TQ1_GROUP blocks (wb[0] ...: blocks b ...) for nt <= TQ1_SUMS_TOK tokens,
 * without digits: sum_p dot(a_p, m_p) three times, less sum_p dot(a_p, m_{p+1}) + 256 sum(a) (the
 * activations' sum comes off with it), 256 times the sum (the 1 / 256 is in the block's scale). The
 * blocks' VPDPBUSD chains are interleaved. */
INLINE void tq1_group_sums(int nt, int ng, const strata_block_tq1_0 *wb, const tq1_acts *acts, int b,
                           __m512i isum[TQ1_GROUP][TQ1_TOK]) {
    __m512i m[TQ1_GROUP], cur[TQ1_GROUP][TQ1_TOK], next[TQ1_GROUP][TQ1_TOK];
    for (int h = 0; h < ng; h++) {
        m[h] = _mm512_maskz_loadu_epi8(TQ1_BYTES, wb[h].qs);
        for (int t = 0; t < nt; t++) {
            cur[h][t] = _mm512_setzero_si512();
            next[h][t] = acts[t].sum256[b + h];
        }
    }
    for (int p = 0; p < 5; p++)
        for (int h = 0; h < ng; h++) {
            const __m512i m3 = times3_512(m[h]);
            for (int t = 0; t < nt; t++) {
                cur[h][t] = _mm512_dpbusd_epi32(cur[h][t], m[h], acts[t].a[b + h][p]);
                next[h][t] = _mm512_dpbusd_epi32(next[h][t], m3, acts[t].a[b + h][p]);
            }
            m[h] = m3;
        }
    for (int h = 0; h < ng; h++)
        for (int t = 0; t < nt; t++)
            isum[h][t] = _mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(cur[h][t], cur[h][t]), cur[h][t]), next[h][t]);
}

/* A block's integer sums for nt > TQ1_SUMS_TOK tokens: digits times activations, less the
 * activations' sum. */
INLINE void tq1_digit_sums(int nt, const strata_block_tq1_0 *wb, const tq1_acts *acts, int b, __m512i isum[TQ1_TOK]) {
    __m512i m = _mm512_xor_si512(_mm512_maskz_loadu_epi8(TQ1_BYTES, wb->qs), _mm512_set1_epi8((char)0x80));
    __m512i odd[TQ1_TOK];   /* even and odd powers: two VPDPBUSD chains */
    for (int t = 0; t < nt; t++) {
        isum[t] = acts[t].neg[b];
        odd[t] = _mm512_setzero_si512();
    }
    for (int p = 0; p < 5; p++) {
        const __m512i dig = tq1_digits512(m);
        for (int t = 0; t < nt; t++) {
            if (p & 1) odd[t] = _mm512_dpbusd_epi32(odd[t], dig, acts[t].a[b][p]);
            else isum[t] = _mm512_dpbusd_epi32(isum[t], dig, acts[t].a[b][p]);
        }
        if (p < 4) m = times3_512(m);
    }
    for (int t = 0; t < nt; t++) isum[t] = _mm512_add_epi32(isum[t], odd[t]);
}

/* The scales d of a row's nb <= TQ1_CHUNK blocks at w (past nb: 0) as floats: one masked VPGATHERDD
 * of the dword that ends with each block's d (its last two bytes: the dword it starts would reach
 * past the last block), shifted down and converted. */
INLINE __m512 tq1_scales(const uint8_t *w, int nb) {
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32((int)sizeof(strata_block_tq1_0)));
    const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), (__mmask16)((1u << nb) - 1), at,
                                                    (const void *)(w + offsetof(strata_block_tq1_0, d) - 2), 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16)));
}

INLINE void tq1_rows512(int nr, int nt, int nb, const uint8_t *w, int64_t wrb, const tq1_acts *acts,
                        __m512 acc[TQ1_ROWS][TQ1_TOK]) {
    for (int r = 0; r < nr; r++) {
        __m512 s[TQ1_TOK];   /* the row's sums in registers, not stored at every block */
        /* d * a.d of the row's blocks per token (times 1 / 256 where the sums are 256 times theirs),
         * stored, and each block's broadcast from memory in its FMA (a load, not a shuffle): faster
         * than VPERMPS of them in registers and a shift of each block's sum, which was faster than
         * converting and broadcasting each block's d; bit-equal (benchmarks/RESULTS.md, "Kernel
         * choice per CPU") */
        float wdad[TQ1_TOK][TQ1_CHUNK] __attribute__((aligned(64)));
        const __m512 wd = _mm512_mul_ps(tq1_scales(w + r * wrb, nb), _mm512_set1_ps(nt <= TQ1_SUMS_TOK ? 1.0f / 256 : 1.0f));
        for (int t = 0; t < nt; t++) {
            s[t] = acc[r][t];
            _mm512_store_ps(wdad[t], _mm512_mul_ps(wd, _mm512_maskz_loadu_ps((__mmask16)((1u << nb) - 1), acts[t].d)));
        }
        int b = 0;
        if (nt <= TQ1_SUMS_TOK)
            for (; b + TQ1_GROUP - 1 < nb; b += TQ1_GROUP) {
                const strata_block_tq1_0 *wb = (const strata_block_tq1_0 *)(w + r * wrb) + b;
                fetch_ahead_by((const uint8_t *)wb, TQ1_GROUP * sizeof(*wb), TQ1_AHEAD);
                __m512i isum[TQ1_GROUP][TQ1_TOK];
                tq1_group_sums(nt, TQ1_GROUP, wb, acts, b, isum);
                for (int h = 0; h < TQ1_GROUP; h++)
                    for (int t = 0; t < nt; t++)
                        s[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[h][t]), _mm512_set1_ps(wdad[t][b + h]), s[t]);
            }
        for (; b < nb; b++) {
            const strata_block_tq1_0 *wb = (const strata_block_tq1_0 *)(w + r * wrb) + b;
            if (nt < 4) fetch_ahead_by((const uint8_t *)wb, sizeof(*wb), TQ1_AHEAD);
            __m512i isum[TQ1_GROUP][TQ1_TOK];
            if (nt <= TQ1_SUMS_TOK) tq1_group_sums(nt, 1, wb, acts, b, isum);
            else tq1_digit_sums(nt, wb, acts, b, isum[0]);
            for (int t = 0; t < nt; t++)
                s[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[0][t]), _mm512_set1_ps(wdad[t][b]), s[t]);
        }
        for (int t = 0; t < nt; t++) acc[r][t] = s[t];
    }
}

void strata_qdot_tq1_0_avx512(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,
                              const uint8_t *restrict a, int64_t arb, int64_t n_tok, float *restrict y, int64_t ys) {
    const int64_t nb = k / STRATA_QK_K;
    tq1_acts acts[TQ1_TOK];
    for (int64_t t0 = 0; t0 < n_tok; t0 += TQ1_TOK) {
        const int nt = (int)(n_tok - t0 < TQ1_TOK ? n_tok - t0 : TQ1_TOK);
        for (int64_t r0 = 0; r0 < n_rows; r0 += TQ1_ROWS) {
            const int nr = (int)(n_rows - r0 < TQ1_ROWS ? n_rows - r0 : TQ1_ROWS);
            __m512 acc[TQ1_ROWS][TQ1_TOK];
            for (int r = 0; r < nr; r++)
                for (int t = 0; t < nt; t++) acc[r][t] = _mm512_setzero_ps();
            for (int64_t c0 = 0; c0 < nb; c0 += TQ1_CHUNK) {
                const int nc = (int)(nb - c0 < TQ1_CHUNK ? nb - c0 : TQ1_CHUNK);
                for (int t = 0; t < nt; t++)
                    tq1_relay((const strata_block_act_q8k *)(a + (t0 + t) * arb) + c0, nc, &acts[t]);
                const uint8_t *wc = w + r0 * wrb + c0 * (int64_t)sizeof(strata_block_tq1_0);
                switch (nt) {   /* the token count a constant in each copy */
                case 1: tq1_rows512(nr, 1, nc, wc, wrb, acts, acc); break;
                case 2: tq1_rows512(nr, 2, nc, wc, wrb, acts, acc); break;
                case 3: tq1_rows512(nr, 3, nc, wc, wrb, acts, acc); break;
                default: tq1_rows512(nr, 4, nc, wc, wrb, acts, acc); break;
                }
            }
            for (int r = 0; r < nr; r++)
                for (int t = 0; t < nt; t++) y[(t0 + t) * ys + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}
#endif

#else /* not x86: the names exist so the library links; qdot.c never hands them out */

STRATA_AVX2_FALLBACK(iq4_nl) STRATA_AVX2_FALLBACK(nvfp4) STRATA_AVX2_FALLBACK(iq4_xs) STRATA_AVX2_FALLBACK(tq2_0) STRATA_AVX2_FALLBACK(tq1_0)
#ifdef STRATA_QDOT_EVEX
STRATA_AVX512_FALLBACK(tq1_0)
#endif
#endif
