/*
 * The grid i-quants' chunk builders (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): a weight
 * block in 8 chunks of 32 values, each as grid magnitudes, sign bytes and sub-block weights
 * (qdot_iq_avx2.c's header says how). Shared by the AVX2 tiles (qdot_iq_avx2.c, built twice) and
 * the AVX-512 VNNI prefill tiles (qdot_iq_vnni.c). A file includes it after enabling AVX2 at least
 * (#pragma GCC target) and including qdot_avx2_common.h and iq_tables.h.
 */
#ifndef STRATA_QDOT_IQ_CHUNKS_H
#define STRATA_QDOT_IQ_CHUNKS_H

enum { FMT_IQ2_XXS, FMT_IQ2_XS, FMT_IQ2_S, FMT_IQ3_XXS, FMT_IQ3_S, FMT_IQ1_S, FMT_IQ1_M };

/* One chunk of 32 values: magnitudes, signs, int16 sub-block weights (see above). The signs are
 * bytes +1 / -1 for VPSIGNB; where AVX-512 BW is on, the formats of mask_signs keep them as a 32-bit
 * mask instead (bit j: value j negative) that a masked subtract applies, one instruction in place
 * of the five that spread bits to bytes. On the Intel machine that won for IQ2_XXS, IQ3_XXS, IQ2_XS
 * and IQ3_S decode and lost for IQ2_S, IQ1_S and IQ1_M, so those keep the bytes
 * (figures: benchmarks/RESULTS.md, "Kernel choice per CPU"). */
typedef struct {
    __m256i q, sc, s;
#ifdef STRATA_QDOT_EVEX
    __mmask32 neg;
#endif
} chunk;

INLINE int mask_signs(int fmt) {
#ifdef STRATA_QDOT_EVEX
    return fmt == FMT_IQ2_XXS || fmt == FMT_IQ2_XS || fmt == FMT_IQ3_XXS || fmt == FMT_IQ3_S;
#else
    (void)fmt;
    return 0;
#endif
}

INLINE uint64_t u64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
INLINE uint32_t u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
INLINE uint16_t u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}


/* Four 8-byte grid rows, r0 in the lowest bytes: r0 by a load, the others by broadcast loads (no
 * shuffle port) and blends (any vector port), where two VPINSRQ and a VINSERTI128 all took the shuffle
 * port (faster at 1-2 tokens for IQ2_XXS and IQ2_XS on the Intel machine, bit-equal). */
INLINE __m256i rows8(const void *r0, const void *r1, const void *r2, const void *r3) {
    __m256i v = _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)r0));
    v = _mm256_blend_epi32(v, _mm256_set1_epi64x((long long)u64(r1)), 0x0C);
    v = _mm256_blend_epi32(v, _mm256_set1_epi64x((long long)u64(r2)), 0x30);
    return _mm256_blend_epi32(v, _mm256_set1_epi64x((long long)u64(r3)), 0xC0);
}

/* The same rows by ymm gathers where they are fast (the CPU description's ymm_gathers, cpu.c; each format's choice
 * at gathers_for): four 8-byte rows by 16-bit indices (VPGATHERDQ), eight 4-byte rows by 16-bit or
 * 8-bit indices (VPGATHERDD). The same bytes as the scalar loads. */
INLINE __m256i gather_rows8(const void *grid, const uint16_t *ix) {
    return _mm256_i32gather_epi64((const long long *)grid, _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)ix)), 8);
}
INLINE __m256i gather_rows4_ix(const void *grid, const uint16_t *ix) {
    return _mm256_i32gather_epi32((const int *)grid, _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)ix)), 4);
}
INLINE __m256i gather_rows4_u8(const void *grid, const uint8_t *idx) {
    return _mm256_i32gather_epi32((const int *)grid, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)idx)), 4);
}

/* Eight 4-byte grid rows (IQ3), idx[0]'s in the lowest bytes; `hi` gives each index's 9th bit. Each
 * 128-bit half is a load and three dword inserts. */
INLINE __m128i rows4_half(const uint8_t (*grid)[4], const uint8_t *idx, unsigned hi) {
    __m128i v = _mm_cvtsi32_si128((int)u32(grid[idx[0] | (hi & 1) << 8]));
    v = _mm_insert_epi32(v, (int)u32(grid[idx[1] | ((hi >> 1) & 1) << 8]), 1);
    v = _mm_insert_epi32(v, (int)u32(grid[idx[2] | ((hi >> 2) & 1) << 8]), 2);
    return _mm_insert_epi32(v, (int)u32(grid[idx[3] | ((hi >> 3) & 1) << 8]), 3);
}
INLINE __m256i rows4(const uint8_t (*grid)[4], const uint8_t *idx, unsigned hi) {
    return _mm256_set_m128i(rows4_half(grid, idx + 4, hi >> 4), rows4_half(grid, idx, hi));
}

/* Eight 4-byte grid rows by 16-bit indices (IQ3_S). */
INLINE __m128i rows4_ix_half(const uint8_t (*grid)[4], const uint16_t *ix) {
    __m128i v = _mm_cvtsi32_si128((int)u32(grid[ix[0]]));
    v = _mm_insert_epi32(v, (int)u32(grid[ix[1]]), 1);
    v = _mm_insert_epi32(v, (int)u32(grid[ix[2]]), 2);
    return _mm_insert_epi32(v, (int)u32(grid[ix[3]]), 3);
}
INLINE __m256i rows4_ix(const uint8_t (*grid)[4], const uint16_t *ix) {
    return _mm256_set_m128i(rows4_ix_half(grid, ix + 4), rows4_ix_half(grid, ix));
}

/* Grid indices whose high bits lie apart from their low bytes (IQ2_S, IQ3_S, IQ1_S, IQ1_M) are put
 * together for the whole block first, 16 at a time, into 16-bit indices in `ix`: chunk j < n's low
 * bytes (qs + 16 j) widened, or-ed with high bits that one shuffle brings into each index's 16-bit
 * lane (`sel`: its byte or bytes of the 8 bytes at qh + step j, broadcast), one multiply by a power
 * of two moves to bit 8 (`mul`) and `mask` keeps. `sel` picks only chunk j's own bytes: the 8-byte
 * read may reach past qh into the block's next field, never past the block. The chunks then read
 * each index with one load instead of three or four scalar operations. */
INLINE void put_indices(uint16_t *ix, const uint8_t *qs, const uint8_t *qh, int n, int step,
                        __m256i sel, __m256i mul, short mask) {
    for (int j = 0; j < n; j++) {
        const __m256i src = _mm256_set1_epi64x((long long)u64(qh + step * j));
        const __m256i hi = _mm256_and_si256(_mm256_mullo_epi16(_mm256_shuffle_epi8(src, sel), mul),
                                            _mm256_set1_epi16(mask));
        const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16 * j)));
        _mm256_store_si256((__m256i *)(ix + 16 * j), _mm256_or_si256(lo, hi));
    }
}

/* IQ3_S: bit i % 8 of qh[i / 8] is index i's 9th bit (16 indices: qh bytes 2 j (low lane), 2 j + 1). */
INLINE void indices_iq3_s(const strata_block_iq3_s *b, uint16_t *ix) {
    put_indices(ix, b->qs, b->qh, 4, 2,
                _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1,
                                 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1),
                _mm256_setr_epi16(256, 128, 64, 32, 16, 8, 4, 2, 256, 128, 64, 32, 16, 8, 4, 2), 0x100);
}

/* IQ2_S: bits 2 l, 2 l + 1 of qh[c] are index 4 c + l's bits 8, 9 (16 indices: qh bytes 4 j .. 4 j + 3). */
INLINE void indices_iq2_s(const strata_block_iq2_s *b, uint16_t *ix) {
    put_indices(ix, b->qs, b->qh, 2, 4,
                _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1,
                                 2, -1, 2, -1, 2, -1, 2, -1, 3, -1, 3, -1, 3, -1, 3, -1),
                _mm256_setr_epi16(256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4), 0x300);
}

/* IQ1_S, IQ1_M: index 4 c + l's bits 8-10 are 3 bits of chunk c's u16 (16 indices: chunks 4 j .. 4 j + 3,
 * u16s 0-3 of the 8 bytes at qh + 8 j). Index 3's bits come from the u16's high byte (IQ1_S: bits
 * 9-11 of qh; IQ1_M: bits 12-14), the others' from the whole u16. */
INLINE void indices_iq1(const uint8_t *qs, const uint8_t *qh, __m256i mul, uint16_t *ix) {
    put_indices(ix, qs, qh, 2, 8,
                _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 1, -1, 2, 3, 2, 3, 2, 3, 3, -1,
                                 4, 5, 4, 5, 4, 5, 5, -1, 6, 7, 6, 7, 6, 7, 7, -1), mul, 0x700);
}

/* The block's 16-bit grid indices, for the formats that need them put together (see put_indices). */
INLINE void iq_indices(int fmt, const uint8_t *p, uint16_t *ix) {
    if (fmt == FMT_IQ3_S) indices_iq3_s((const strata_block_iq3_s *)p, ix);
    else if (fmt == FMT_IQ2_S) indices_iq2_s((const strata_block_iq2_s *)p, ix);
    else if (fmt == FMT_IQ1_S)
        indices_iq1(((const strata_block_iq1_s *)p)->qs, ((const strata_block_iq1_s *)p)->qh,
                    _mm256_setr_epi16(256, 32, 4, 128, 256, 32, 4, 128, 256, 32, 4, 128, 256, 32, 4, 128), ix);
    else if (fmt == FMT_IQ1_M)
        indices_iq1(((const strata_block_iq1_m *)p)->qs, ((const strata_block_iq1_m *)p)->qh,
                    _mm256_setr_epi16(256, 16, 1, 16, 256, 16, 1, 16, 256, 16, 1, 16, 256, 16, 1, 16), ix);
}

/* The 8 sign bits of 16 groups of 8 values from their 7-bit ksigns indices, one in the low byte of each
 * 16-bit lane of v (the high byte 0): the 8th sign is the parity of the 7 (ksigns has even parity),
 * read from a 16-entry table by one shuffle of the index's two nibbles xor-ed (bit 7 of that byte
 * is 0, so the shuffle never zeroes it; the high byte reads entry 0, which is 0). */
INLINE __m256i ksigns_parity(__m256i v) {
    const __m256i odd = _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
                                         0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
    return _mm256_or_si256(v, _mm256_shuffle_epi8(odd, _mm256_xor_si256(v, _mm256_srli_epi16(v, 4))));
}

/* 16 ksigns indices packed 4 to a u32 (bits 0-6, 7-13, 14-20, 21-27: IQ2_XXS's and IQ3_XXS's aux),
 * two u32s per 128-bit lane of v at the bytes `sel` names, spread one per 16-bit lane: each lane
 * gets the two bytes its field spans, shifted left by `mul` so the field starts at bit 8. */
INLINE __m256i ksigns_fields(__m256i v, __m256i sel) {
    const __m256i mul = _mm256_setr_epi16(256, 2, 4, 8, 256, 2, 4, 8, 256, 2, 4, 8, 256, 2, 4, 8);
    return _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, sel), mul), 8),
                            _mm256_set1_epi16(0x7F));
}

/* The block's 32 groups' sign bits (group g's in byte g, bit j: value j negative), made once per
 * block for the formats that store ksigns indices, so that a chunk's signs cost what IQ2_S's and
 * IQ3_S's stored sign bits do (sign_bits). packus puts two vectors' lanes in the order lo0 lo1 hi0
 * hi1. */
INLINE __m256i iq_signs(int fmt, const uint8_t *p, uint8_t *sg) {
    __m256i f0, f1;
    if (fmt == FMT_IQ2_XS) {  /* bits 9-15 of each u16 of qs */
        const uint8_t *qs = ((const strata_block_iq2_xs *)p)->qs;
        f0 = ksigns_parity(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qs), 9));
        f1 = ksigns_parity(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(qs + 32)), 9));
    } else if (fmt == FMT_IQ2_XXS) {  /* the u32 at bytes 4-7 of each chunk's 8 (chunks 0-3, 4-7) */
        const uint8_t *qs = ((const strata_block_iq2_xxs *)p)->qs;
        const __m256i sel = _mm256_setr_epi8(4, 5, 4, 5, 5, 6, 6, 7, 12, 13, 12, 13, 13, 14, 14, 15,
                                             4, 5, 4, 5, 5, 6, 6, 7, 12, 13, 12, 13, 13, 14, 14, 15);
        f0 = ksigns_parity(ksigns_fields(_mm256_loadu_si256((const __m256i *)qs), sel));
        f1 = ksigns_parity(ksigns_fields(_mm256_loadu_si256((const __m256i *)(qs + 32)), sel));
    } else if (fmt == FMT_IQ3_XXS) {  /* aux's u32s: chunks 0, 1 | 4, 5 first, then 2, 3 | 6, 7 */
        const __m256i v = _mm256_loadu_si256((const __m256i *)((const strata_block_iq3_xxs *)p)->aux);
        f0 = ksigns_parity(ksigns_fields(v, _mm256_setr_epi8(0, 1, 0, 1, 1, 2, 2, 3, 4, 5, 4, 5, 5, 6, 6, 7,
                                                             0, 1, 0, 1, 1, 2, 2, 3, 4, 5, 4, 5, 5, 6, 6, 7)));
        f1 = ksigns_parity(ksigns_fields(v, _mm256_setr_epi8(8, 9, 8, 9, 9, 10, 10, 11, 12, 13, 12, 13, 13, 14, 14, 15,
                                                             8, 9, 8, 9, 9, 10, 10, 11, 12, 13, 12, 13, 13, 14, 14, 15)));
        const __m256i bytes = _mm256_packus_epi16(f0, f1);  /* already 0-1 2-3 4-5 6-7 */
        _mm256_store_si256((__m256i *)sg, bytes);
        return bytes;
    } else {
        return _mm256_setzero_si256();
    }
    const __m256i v = _mm256_permute4x64_epi64(_mm256_packus_epi16(f0, f1), 0xD8);
    _mm256_store_si256((__m256i *)sg, v);
    return v;
}

/* Sign bytes for VPSIGNB from 32 sign bits, bytes `first` .. `first` + 3 of each 128-bit lane of v (bit j
 * set: value j negative): byte j is its bit plus 127, so 127 (positive) where the bit is clear and
 * 128-255 (negative) where it is set; one add where a compare and an OR made +1 and -1. */
INLINE __m256i sign_bytes(__m256i v, int first) {
    const __m256i at = _mm256_add_epi8(_mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
                                       _mm256_set1_epi8((char)first));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_add_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, at), bit), _mm256_set1_epi8(127));
}

/* The same from the 32 bits of a u32 */
INLINE __m256i sign_bits(uint32_t bits) { return sign_bytes(_mm256_set1_epi32((int)bits), 0); }

/* The chunk's signs from 32 sign bits (bit j set: value j negative). */
INLINE void set_signs(int fmt, chunk *ch, uint32_t bits) {
#ifdef STRATA_QDOT_EVEX
    if (mask_signs(fmt)) {
        ch->neg = (__mmask32)bits;
        return;
    }
#endif
    (void)fmt;
    ch->s = sign_bits(bits);
}

INLINE int is_iq1(int fmt) { return fmt == FMT_IQ1_S || fmt == FMT_IQ1_M; }

/* v with the chunk's signs applied (a byte of v that is -128 stays -128 either way). IQ1's chunks
 * have no signs: their magnitudes are the values plus 9 (iq1_values). */
INLINE __m256i apply_signs(int fmt, const chunk *ch, __m256i v) {
    if (is_iq1(fmt)) return v;
#ifdef STRATA_QDOT_EVEX
    if (mask_signs(fmt)) return _mm256_mask_sub_epi8(v, ch->neg, _mm256_setzero_si256(), v);
#endif
    return _mm256_sign_epi8(v, ch->s);
}

/* The chunk's 32 values as signed bytes. */
INLINE __m256i signed_values(int fmt, const chunk *ch) {
    return is_iq1(fmt) ? _mm256_sub_epi8(ch->q, _mm256_set1_epi8(9)) : apply_signs(fmt, ch, ch->q);
}

/* A block's sub-block weights, made once per block: 8 int16 per 128-bit lane (ls values in, 2 ls + 1
 * out). A chunk picks its weights with one in-lane shuffle (pick_weight): the int16 at `slot` of each
 * lane to all 8 of that lane. Formats with one ls per 32 values hold the same 8 in both lanes; those
 * with one per 16 values hold the first halves' in the low lane and the second halves' in the high. */
INLINE __m256i odd_weights(__m256i ls) { return _mm256_or_si256(_mm256_add_epi16(ls, ls), _mm256_set1_epi16(1)); }
INLINE __m256i pick_weight(__m256i w, int slot) { return _mm256_shuffle_epi8(w, _mm256_set1_epi16((short)(0x0100 * (2 * slot + 1) + 2 * slot))); }

/* IQ2_XXS: ls is the top nibble of byte 8 c + 7 of qs; chunk c lands in int16 slot (0 1 4 5 2 3 6 7)[c]. */
INLINE __m256i weights_iq2_xxs(const uint8_t *qs) {
    const __m256i lo = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)qs),
                                           _mm256_setr_epi8(7, -1, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                            7, -1, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i hi = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(qs + 32)),
                                           _mm256_setr_epi8(-1, -1, -1, -1, 7, -1, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                            -1, -1, -1, -1, 7, -1, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i both = _mm256_permute4x64_epi64(_mm256_or_si256(lo, hi), 0x88);  /* qwords 0 2 0 2 */
    return odd_weights(_mm256_srli_epi16(both, 4));
}
static const int slot_iq2_xxs[8] = {0, 1, 4, 5, 2, 3, 6, 7};

/* IQ3_XXS: ls is the top nibble of byte 4 c + 3 of aux; chunk c in slot c. */
INLINE __m256i weights_iq3_xxs(const uint8_t *aux) {
    const __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)aux),
                                          _mm256_setr_epi8(3, -1, 7, -1, 11, -1, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                           3, -1, 7, -1, 11, -1, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    return odd_weights(_mm256_srli_epi16(_mm256_permute4x64_epi64(v, 0x88), 4));
}

/* IQ2_XS, IQ2_S: byte c of scales holds chunk c's ls for values 0-15 (low nibble) and 16-31 (high). */
INLINE __m256i weights_nibble_pairs(const uint8_t *scales) {
    const __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x((long long)u64(scales)), _mm256_setr_epi64x(0, 0, 4, 4));
    return odd_weights(_mm256_and_si256(_mm256_unpacklo_epi8(v, _mm256_setzero_si256()), _mm256_set1_epi16(15)));
}

/* IQ3_S: nibble c % 2 of byte c / 2 of scales is chunk c's ls; chunk c in slot c. */
INLINE __m256i weights_iq3_s(const uint8_t *scales) {
    const __m256i v = _mm256_set1_epi32((int)u32(scales));
    const __m256i nib = _mm256_unpacklo_epi8(v, _mm256_srli_epi16(v, 4));  /* lo0 hi0 lo1 hi1 ... */
    return odd_weights(_mm256_and_si256(_mm256_unpacklo_epi8(nib, _mm256_setzero_si256()), _mm256_set1_epi16(15)));
}

/* IQ1_S: bits 12-14 of the chunk's u16 qh; chunk c in slot c. */
INLINE __m256i weights_iq1_s(const uint8_t *qh) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qh));
    return odd_weights(_mm256_and_si256(_mm256_srli_epi16(v, 12), _mm256_set1_epi16(7)));
}

/* IQ1_M: sub-block j's 3-bit ls is at bit 3 (j % 4) of the scales' u16 j / 4. Weights 2 ls + 1 in
 * int16 slots: `at` gives each slot its u16 (a shuffle of the 8 bytes in each lane), `mul` a power
 * of two that moves the slot's field to bits 13-15. */
INLINE __m256i weights_iq1_m_at(const uint8_t *scales, __m256i at, __m256i mul) {
    const __m256i u = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)u64(scales)), at);
    return odd_weights(_mm256_srli_epi16(_mm256_mullo_epi16(u, mul), 13));
}

/* IQ1_M's weight vector: chunk c's first half (j = 2 c) in int16 slot c of the low lane, its second
 * (2 c + 1) in slot c of the high. */
INLINE __m256i weights_iq1_m(const uint8_t *scales) {
    return weights_iq1_m_at(scales,
                            _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7,
                                             0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7),
                            _mm256_setr_epi16(8192, 128, 8192, 128, 8192, 128, 8192, 128,
                                              1024, 16, 1024, 16, 1024, 16, 1024, 16));
}

/* The block's weight vector. */
INLINE __m256i iq_weights(int fmt, const uint8_t *p) {
    switch (fmt) {
    case FMT_IQ2_XXS: return weights_iq2_xxs(((const strata_block_iq2_xxs *)p)->qs);
    case FMT_IQ3_XXS: return weights_iq3_xxs(((const strata_block_iq3_xxs *)p)->aux);
    case FMT_IQ2_XS: return weights_nibble_pairs(((const strata_block_iq2_xs *)p)->scales);
    case FMT_IQ2_S: return weights_nibble_pairs(((const strata_block_iq2_s *)p)->scales);
    case FMT_IQ3_S: return weights_iq3_s(((const strata_block_iq3_s *)p)->scales);
    case FMT_IQ1_S: return weights_iq1_s(((const strata_block_iq1_s *)p)->qh);
    case FMT_IQ1_M: return weights_iq1_m(((const strata_block_iq1_m *)p)->scales);
    default: return _mm256_setzero_si256();
    }
}

/* What the chunks of a block share, made once per block: its weight vector, 16-bit grid indices
 * and sign bits (for the formats that need them: iq_weights, iq_indices, iq_signs). */
typedef struct {
    __m256i wv;
    uint16_t ix[64] __attribute__((aligned(32)));
    uint8_t sg[32] __attribute__((aligned(32)));
    __m256i sg_half[2];  /* sg's chunks 0-3 (bytes 0-15), 4-7, each in both 128-bit lanes */
    __m256i qh;          /* IQ1_M: its 16 qh bytes (a u16 per chunk) in both 128-bit lanes */
    int delta_in_bias;   /* IQ1_S in the decode tile: the chunks leave their delta to the block's bias (iq1_bias) */
    int gathers;         /* the chunks' grid rows by ymm gathers (gathers_for) */
} iq_head;

/* Whether format fmt's chunks gather their grid rows where gathers are fast (`fast`: a constant in the
 * decode tile, the CPU description's ymm_gathers elsewhere): not IQ2_XXS's or IQ2_XS's, whose indices
 * are bytes or fields of a register already (slower gathered; benchmarks/RESULTS.md, "Kernel choice
 * per CPU"). */
INLINE int gathers_for(int fmt, int fast) {
    return fast && (fmt == FMT_IQ2_S || fmt == FMT_IQ3_XXS || fmt == FMT_IQ3_S || fmt == FMT_IQ1_S || fmt == FMT_IQ1_M);
}

INLINE void iq_head_of(int fmt, const uint8_t *p, int delta_in_bias, int fast_gathers, iq_head *h) {
    h->wv = iq_weights(fmt, p);
    h->gathers = gathers_for(fmt, fast_gathers);
    h->delta_in_bias = delta_in_bias && fmt == FMT_IQ1_S;
    iq_indices(fmt, p, h->ix);
    const __m256i sg = iq_signs(fmt, p, h->sg);
    if (fmt == FMT_IQ2_XXS || fmt == FMT_IQ2_XS || fmt == FMT_IQ3_XXS) {   /* the formats iq_signs makes bytes for */
        h->sg_half[0] = _mm256_permute2x128_si256(sg, sg, 0x00);
        h->sg_half[1] = _mm256_permute2x128_si256(sg, sg, 0x11);
    }
    if (fmt == FMT_IQ1_M) h->qh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const strata_block_iq1_m *)p)->qh));
}

/* The signs of chunk c of a ksigns format (IQ2_XXS, IQ2_XS, IQ3_XXS) from the block's sign bytes in
 * registers (iq_head's sg_half): one VPSHUFB spreads the chunk's 4 bytes over its 32 values, where
 * sign_bits would first take them out of the register and broadcast them (two more instructions,
 * both on the shuffle port). The same bytes as sign_bits. */
INLINE void set_block_signs(int fmt, chunk *ch, const iq_head *h, int c) {
#ifdef STRATA_QDOT_EVEX
    if (mask_signs(fmt)) {
        set_signs(fmt, ch, u32(h->sg + 4 * c));
        return;
    }
#endif
    ch->s = sign_bytes(h->sg_half[c / 4], 4 * (c % 4));
}

/* IQ1: the values 8 g + delta of grid rows g and delta bytes (+-1), plus 9, as unsigned bytes in
 * [0, 18] (rows of strata_iq1_grid_u are 8 g + 9): multiplied with the activations as they are, with
 * no signs to apply per token, and 9 * (the sum of the activations: their bsums) * the sub-block's
 * weight taken off per block (iq1_bias). */
INLINE void iq1_values(__m256i g9, __m256i delta, chunk *ch) { ch->q = _mm256_add_epi8(g9, delta); }

/* -9 times the weight of each 16 values of an IQ1 block (int16 lane j: values 16 j .. 16 j + 15, the
 * order of the activations' bsums): what madd with the bsums gives to take the + 9 off. IQ1_S has
 * a weight per 32 values, chunk c's in int16 slot c of both halves of wv (weights_iq1_s), and its
 * chunks' values leave their delta out (the decode tile's iq_head: delta_in_bias), so its factor is
 * delta - 9; IQ1_M one weight per 16, 3 bits each (weights_iq1_m_at, sub-block j in slot j). */
INLINE __m256i iq1_bias(int fmt, const uint8_t *p, __m256i wv) {
    if (fmt == FMT_IQ1_S) {   /* chunk c's weight times its delta - 9 (bit 15 of its u16: -10, else -8) */
        const __m256i neg = _mm256_srai_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const strata_block_iq1_s *)p)->qh)), 15);
        const __m256i f = _mm256_sub_epi16(_mm256_add_epi16(neg, neg), _mm256_set1_epi16(8));
        return _mm256_shuffle_epi8(_mm256_mullo_epi16(wv, f), _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7,
                                                                             8, 9, 8, 9, 10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15));
    }
    const __m256i w = weights_iq1_m_at(((const strata_block_iq1_m *)p)->scales,   /* sub-block j in slot j */
                                       _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                                        4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7),
                                       _mm256_setr_epi16(8192, 1024, 128, 16, 8192, 1024, 128, 16,
                                                         8192, 1024, 128, 16, 8192, 1024, 128, 16));
    return _mm256_mullo_epi16(w, _mm256_set1_epi16(-9));
}

/* Chunk c (values 32 c .. 32 c + 31) of the block at p. */
INLINE void iq_chunk(int fmt, const uint8_t *p, int c, const iq_head *h, chunk *ch) {
    const __m256i wv = h->wv;
    const uint16_t *ix = h->ix;
    const int gathers = h->gathers;
    switch (fmt) {
    case FMT_IQ2_XXS: {  /* 4 grid bytes, u32 aux: 4 x 7 sign bits, 4-bit ls */
        const uint8_t *idx = ((const strata_block_iq2_xxs *)p)->qs + 8 * c;
        ch->q = rows8(strata_iq2xxs_grid[idx[0]], strata_iq2xxs_grid[idx[1]], strata_iq2xxs_grid[idx[2]],
                      strata_iq2xxs_grid[idx[3]]);
        set_block_signs(fmt, ch, h, c);
        ch->sc = pick_weight(wv, slot_iq2_xxs[c]);
        return;
    }
    case FMT_IQ2_XS: {  /* u16: 9-bit grid index | 7-bit ksigns index; a 4-bit ls per 16 values */
        const strata_block_iq2_xs *b = (const strata_block_iq2_xs *)p;
        const uint64_t q = u64(b->qs + 8 * c);
        ch->q = rows8(strata_iq2xs_grid[q & 511], strata_iq2xs_grid[(q >> 16) & 511],
                      strata_iq2xs_grid[(q >> 32) & 511], strata_iq2xs_grid[(q >> 48) & 511]);
        set_block_signs(fmt, ch, h, c);
        ch->sc = pick_weight(wv, c);
        return;
    }
    case FMT_IQ2_S: {  /* 8 + 2 index bits, a sign bit per value, a 4-bit ls per 16 values */
        const strata_block_iq2_s *b = (const strata_block_iq2_s *)p;
        ix += 4 * c;
        ch->q = gathers ? gather_rows8(strata_iq2s_grid, ix)
                           : rows8(strata_iq2s_grid[ix[0]], strata_iq2s_grid[ix[1]], strata_iq2s_grid[ix[2]], strata_iq2s_grid[ix[3]]);
        set_signs(fmt, ch, u32(b->signs + 4 * c));
        ch->sc = pick_weight(wv, c);
        return;
    }
    case FMT_IQ3_XXS: {  /* 8 grid bytes (4 values each), aux as IQ2_XXS */
        const strata_block_iq3_xxs *b = (const strata_block_iq3_xxs *)p;
        ch->q = gathers ? gather_rows4_u8(strata_iq3xxs_grid, b->qs + 8 * c) : rows4(strata_iq3xxs_grid, b->qs + 8 * c, 0);
        set_block_signs(fmt, ch, h, c);
        ch->sc = pick_weight(wv, c);
        return;
    }
    case FMT_IQ3_S: {  /* 8 + 1 index bits, a sign bit per value, a 4-bit ls per 32 values */
        const strata_block_iq3_s *b = (const strata_block_iq3_s *)p;
        ch->q = gathers ? gather_rows4_ix(strata_iq3s_grid, ix + 8 * c) : rows4_ix(strata_iq3s_grid, ix + 8 * c);
        set_signs(fmt, ch, u32(b->signs + 4 * c));
        ch->sc = pick_weight(wv, c);
        return;
    }
    case FMT_IQ1_S: {  /* u16 qh: 4 x 3 high index bits, 3-bit ls, delta sign (bit 15) */
        const strata_block_iq1_s *b = (const strata_block_iq1_s *)p;
        const unsigned qh = u16(b->qh + 2 * c);
        ix += 4 * c;
        const __m256i g = gathers ? gather_rows8(strata_iq1_grid_u, ix)
                                     : rows8(strata_iq1_grid_u[ix[0]], strata_iq1_grid_u[ix[1]], strata_iq1_grid_u[ix[2]], strata_iq1_grid_u[ix[3]]);
        if (h->delta_in_bias) ch->q = g;
        else iq1_values(g, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1), ch);
        ch->sc = pick_weight(wv, c);
        return;
    }
    default: {  /* FMT_IQ1_M: a nibble per 8 values (3 high index bits, delta sign), 3-bit ls per 16 */
        ix += 4 * c;
        const __m256i g = gathers ? gather_rows8(strata_iq1_grid_u, ix)
                                     : rows8(strata_iq1_grid_u[ix[0]], strata_iq1_grid_u[ix[1]], strata_iq1_grid_u[ix[2]], strata_iq1_grid_u[ix[3]]);
        /* group l's delta sign is bit 4 l + 3 of the chunk's u16 (nibble l: group 4 c + l), spread from
         * the head's qh by one VPSHUFB to every 16-bit lane and tested in the lanes of the group's 8
         * bytes (a scalar load and a register broadcast before: a little faster, bit-equal) */
        const __m256i bit = _mm256_setr_epi16(8, 8, 8, 8, 0x80, 0x80, 0x80, 0x80, 0x800, 0x800, 0x800, 0x800,
                                              (short)0x8000, (short)0x8000, (short)0x8000, (short)0x8000);
        const __m256i u = pick_weight(h->qh, c);   /* the same in-lane spread of int16 slot c */
        const __m256i neg = _mm256_cmpeq_epi16(_mm256_and_si256(u, bit), bit);
        const __m256i delta = _mm256_or_si256(neg, _mm256_set1_epi8(1));
        iq1_values(g, delta, ch);
        ch->sc = pick_weight(wv, c);
        return;
    }
    }
}

/* The block's half d as float and the power of two its integer sum is scaled by (qdot_iq.c). */
INLINE float iq_d(int fmt, const uint8_t *p) {
    return _cvtsh_ss(fmt == FMT_IQ1_M ? strata_iq1_m_half(((const strata_block_iq1_m *)p)->scales) : u16(p));
}
INLINE float iq_factor(int fmt) { return fmt == FMT_IQ3_XXS ? 0.25f : fmt == FMT_IQ3_S ? 1.0f : 0.125f; }

#endif
