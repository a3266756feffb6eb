/*
 * Facts every part of the native runtime shares: GGML block layouts and type ids, the format table
 * (block sizes), exact binary16 conversions, the K-quant 6-bit scale unpacking and the few scale and
 * code decoders the i-quant, ternary and NVFP4 kernels share (dequant_iq.c, qdot_iq.c). Internal: not
 * part of the cdef (strata.h is). Kernels include this instead of defining their own copies.
 *
 * Block layouts (ggml's; little-endian; `half` is IEEE binary16 stored as uint16_t):
 *   Q4_0  32 elems, 18 B: half d; u8 qs[16]            x = d * ((q & 15) - 8), low nibbles first
 *   Q4_1  32 elems, 20 B: half d, m; u8 qs[16]         x = d * q + m
 *   Q5_0  32 elems, 22 B: half d; u8 qh[4]; u8 qs[16]  x = d * (q5 - 16)
 *   Q5_1  32 elems, 24 B: half d, m; u8 qh[4]; qs[16]  x = d * q5 + m
 *   Q8_0  32 elems, 34 B: half d; i8 qs[32]            x = d * q
 *   Q2_K 256 elems, 84 B: u8 scales[16]; u8 qs[64]; half d, dmin
 *   Q3_K 256 elems,110 B: u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d
 *   Q4_K 256 elems,144 B: half d, dmin; u8 scales[12]; u8 qs[128]
 *   Q5_K 256 elems,176 B: half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *   Q6_K 256 elems,210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d
 *   MXFP4 32 elems, 17 B: u8 e (E8M0 shared exponent); u8 qs[16] (E2M1 codes, low nibbles first)
 *
 * i-quants, ternary and NVFP4 (grids and code books: iq_tables.h; "db" is the scale of a sub-block,
 * "grid" an entry of the format's lattice, "s" a sign of +-1):
 *   IQ2_XXS 256, 66 B: half d; u8 qs[64] = 8 x (u32 grid bytes, u32 aux)     32 per aux:
 *                     aux bits 0-27: four 7-bit ksigns indices, bits 28-31 ls; db = d * (0.5 + ls) / 4
 *   IQ2_XS  256, 74 B: half d; u16 qs[32] (9-bit grid index | 7-bit ksigns index); u8 scales[8]
 *                     (a 4-bit ls per 16 values, low nibble first); db = d * (0.5 + ls) / 4
 *   IQ2_S   256, 82 B: half d; u8 qs[32] (grid index low 8 bits); u8 signs[32] (a bit per value);
 *                     u8 qh[8] (2 high index bits per qs); u8 scales[8] (as IQ2_XS)
 *   IQ3_XXS 256, 98 B: half d; u8 qs[64] (grid index per 4 values); u32 aux[8] as IQ2_XXS;
 *                     db = d * (0.5 + ls) / 2
 *   IQ3_S   256,110 B: half d; u8 qs[64]; u8 qh[8] (9th index bit per qs); u8 signs[32]; u8 scales[4]
 *                     (a 4-bit ls per 32 values); db = d * (1 + 2 * ls)
 *   IQ1_S   256, 50 B: half d; u8 qs[32]; u16 qh[8]: per 32 values bits 0-11 the 3 high index bits
 *                     of 4 qs, bits 12-14 ls, bit 15 the delta's sign; x = d * (2 ls + 1) * (grid +- 1/8)
 *   IQ1_M   256, 56 B: u8 qs[32]; u8 qh[16] (per nibble: 3 high index bits, delta sign); u16 sc[4]:
 *                     3-bit ls per 16 values in bits 0-11, the half d in their top nibbles (sc[0] lowest)
 *   IQ4_NL   32, 18 B: half d; u8 qs[16]                x = d * kvalues_iq4nl[q], low nibbles first
 *   IQ4_XS  256,136 B: half d; u16 scales_h; u8 scales_l[4]; u8 qs[128]: 6-bit ls per 32 values
 *                     (low 4 bits in scales_l nibbles, high 2 in scales_h); x = d * (ls - 32) * kvalues
 *   TQ1_0   256, 54 B: u8 qs[48]; u8 qh[4]; half d: base-3 digits, q = digit - 1; digit p of byte b is
 *                     ((b * 3^p mod 256) * 3) >> 8; element 32p + j <- qs[j] (j < 32, p < 5),
 *                     160 + 16p + j <- qs[32 + j] (j < 16), 240 + 4p + j <- qh[j] (p < 4); x = d * q
 *   TQ2_0   256, 66 B: u8 qs[64]; half d: element 128c + 32p + l = ((qs[32c + l] >> 2p) & 3) - 1; x = d * q
 *   NVFP4    64, 36 B: u8 d[4] (UE4M3 scale per 16 values); u8 qs[32] (E2M1 codes, per 16 values
 *                     8 bytes: low nibbles then high ones); x = ue4m3(d) / 2 * 2 * e2m1(q)
 */
#ifndef STRATA_COMMON_H
#define STRATA_COMMON_H
#include <stdint.h>
#include <string.h>
#include <time.h>

/* 1 where this compiler knows AVX-VNNI (#pragma GCC target("avxvnni"): GCC 11, clang 12). An older one
 * builds the library without the AVX-VNNI tiles (qdot_tq1_avxvnni.c, qdot_iq_avxvnni.c) and
 * strata_cpu_avx_vnni() says 0 wherever it runs. -DSTRATA_CC_AVX_VNNI=0 builds that way on any. */
#ifndef STRATA_CC_AVX_VNNI
#if defined(__clang__)
#define STRATA_CC_AVX_VNNI (__clang_major__ >= 12)
#elif defined(__GNUC__)
#define STRATA_CC_AVX_VNNI (__GNUC__ >= 11)
#else
#define STRATA_CC_AVX_VNNI 0
#endif
#endif

#define STRATA_QK 32
#define STRATA_QK_K 256
#define STRATA_K_SCALE_SIZE 12

/* Packed: blocks sit at any byte offset of the caller's buffer (Q8_0 is 34 bytes, MXFP4 17). */
#define STRATA_PACKED __attribute__((packed))

/* Type ids, block structs with their size checks, the format table's rows (STRATA_QUANT_TYPES):
 * generated from the table of quant types, strata/quant_table.py. */
#include "quant_types.h"


/* IQ4_XS: sub-block k's (32 values) signed scale, ls - 32 with ls 4 bits from scales_l and 2 from scales_h. */
static inline int strata_iq4_xs_scale(const strata_block_iq4_xs *b, int k) {
    return (((b->scales_l[k / 2] >> (4 * (k % 2))) & 15) | ((b->scales_h >> (2 * k)) & 3) << 4) - 32;
}

/* Q3_K: sub-block s's (16 values) signed scale, sc - 32: the low 4 bits of sc are nibble s / 8 of
 * scales[s % 8], the high 2 bits are bits 2 (s / 4) of scales[8 + s % 4]. */
static inline int strata_q3_k_scale(const uint8_t scales[12], int s) {
    return (((scales[s % 8] >> (4 * (s / 8))) & 0xf) | ((scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
}


#define STRATA_QK_NVFP4 64

/* ---- Format table (format.c): one row per GGML type the runtime knows ---- */

typedef struct {
    int type;
    int64_t block_elems, block_bytes;
} strata_format_info;

/* The row of `type`, or NULL when the runtime does not know it. */
const strata_format_info *strata_format_find(int type);

/* ---- binary16 <-> binary32 ---- */

static inline float strata_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t strata_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
/* Little-endian fields at any alignment (the block formats are packed). */
static inline uint16_t strata_u16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t strata_u32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t strata_u64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Exact: every binary16 value is a binary32 value. NaN payloads are kept as they are (not quieted),
 * as numpy's float16 -> float32 cast does (F16C's vcvtph2ps would quiet signalling NaNs).
 * Static inline: an exported function can be interposed in a -fPIC build, so calls to it are
 * neither inlined nor vectorised. */
static inline float strata_half_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;  /* em: exponent, mantissa */
    const uint32_t special = 0x7f800000u | em << 13;                        /* inf, NaN */
    const uint32_t normal = (em << 13) + 0x38000000u;                       /* rebias 15 -> 127 */
    const uint32_t subnormal = strata_f32_to_bits((float)(int32_t)em * 0x1p-24f);  /* em * 2^-24, exact */
    /* Select with masks, not `?:`: GCC (trapping math) will not vectorise a loop with a branch
     * around the float multiply, and this runs once per element in the F16 kernel. */
    const uint32_t is_sub = 0u - (uint32_t)(em < 0x0400u), is_special = 0u - (uint32_t)(em >= 0x7c00u);
    const uint32_t finite = (subnormal & is_sub) | (normal & ~is_sub);
    return strata_bits_to_f32(sign | (special & is_special) | (finite & ~is_special));
}

/* binary32 -> binary16, round to nearest even; overflow gives inf, NaN stays NaN. */
static inline uint16_t strata_f32_to_half(float f) {
    const uint32_t x = strata_f32_to_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;          /* NaN */
    if (ax >= 0x477ff000u) return sign | 0x7c00u;         /* >= 65520 rounds to 2^16: inf */
    if (ax >= 0x38800000u) {                               /* normal half (>= 2^-14) */
        uint32_t r = ax - 0x38000000u;                     /* exponent bias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);                    /* 23 -> 10 mantissa bits, ties to even */
        return sign | (uint16_t)(r >> 13);
    }
    if (ax < 0x33000000u) return sign;                     /* < 2^-25: zero (2^-25 ties to zero) */
    /* Subnormal half: value in units of 2^-24 is mantissa >> (126 - exponent). */
    const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t s = 126u - e, q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    return sign | (uint16_t)(q + (rem > half || (rem == half && (q & 1u))));
}

/* NVFP4's UE4M3 scale halved (the E2M1 values are stored doubled), as gguf-py's ue4m3_to_fp32:
 * 0x00 and 0x7f give 0, otherwise bit 7 is ignored (0xff reads as 240, as in gguf-py). Exact in float32. */
static inline float strata_ue4m3_half(uint8_t x) {
    if (x == 0 || x == 0x7f) return 0.0f;
    const int e = (x >> 3) & 15, m = x & 7;
    const float raw = e == 0 ? (float)m * 0x1p-9f
                             : (1.0f + (float)m / 8.0f) * strata_bits_to_f32((uint32_t)(e - 7 + 127) << 23);
    return raw * 0.5f;
}

/* IQ1_M's half d, spread over the top nibbles of its four little-endian u16 scale words. */
static inline uint16_t strata_iq1_m_half(const uint8_t scales[8]) {
    uint16_t sc[4];
    for (int m = 0; m < 4; m++) sc[m] = (uint16_t)(scales[2 * m] | scales[2 * m + 1] << 8);
    return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
}

/* Base-3 digit p (< 5) of a TQ1_0 byte, minus 1: ((byte * 3^p mod 256) * 3) >> 8, as ggml. */
static inline int strata_tq1_digit(uint8_t byte, int p) {
    static const uint8_t POW3[5] = {1, 3, 9, 27, 81};
    return (((uint8_t)(byte * POW3[p]) * 3) >> 8) - 1;
}

/*
 * Q4_K/Q5_K 6-bit scales and mins of the 8 sub-blocks, packed in 12 bytes
 * (sc: scale bits, mn: min bits; j = sub-block):
 *   bytes 0-3:  sc[j] low 6 bits | sc[j+4] bits 4-5 in bits 6-7       (j < 4)
 *   bytes 4-7:  mn[j] low 6 bits | mn[j+4] bits 4-5 in bits 6-7
 *   bytes 8-11: sc[j+4] bits 0-3 in the low nibble, mn[j+4] bits 0-3 in the high nibble
 */
static inline void strata_k_scale_min(int j, const uint8_t s[12], uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = s[j] & 0x3f;
        *mn = s[j + 4] & 0x3f;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

/* The same for four sub-blocks at a time, a byte each in little-endian words: w[0] the scales of
 * sub-blocks 0-3, w[1] of 4-7, w[2] the mins of 0-3, w[3] of 4-7 (the SIMD kernels' start). */
static inline void strata_k_scale_min_words(const uint8_t s[12], uint32_t w[4]) {
    const uint32_t a = strata_u32(s), b = strata_u32(s + 4), c = strata_u32(s + 8);
    w[0] = a & 0x3f3f3f3fu;
    w[1] = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    w[2] = b & 0x3f3f3f3fu;
    w[3] = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
}

/* Q3_K's 16 six-bit scales before the - 32 (strata_q3_k_scale), a byte each in little-endian words:
 * w[i] holds sub-blocks 4 i .. 4 i + 3. */
static inline void strata_q3_k_scale_words(const uint8_t s[12], uint32_t w[4]) {
    const uint32_t a0 = strata_u32(s), a1 = strata_u32(s + 4), t = strata_u32(s + 8);
    w[0] = (a0 & 0x0f0f0f0fu) | (t & 0x03030303u) << 4;
    w[1] = (a1 & 0x0f0f0f0fu) | ((t >> 2) & 0x03030303u) << 4;
    w[2] = ((a0 >> 4) & 0x0f0f0f0fu) | ((t >> 4) & 0x03030303u) << 4;
    w[3] = ((a1 >> 4) & 0x0f0f0f0fu) | ((t >> 6) & 0x03030303u) << 4;
}

/* ---- time ---- */

/* Monotonic clock in nanoseconds (pool spin deadlines, pager busy time and read timings). */
static inline int64_t strata_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
