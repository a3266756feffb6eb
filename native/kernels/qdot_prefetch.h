/*
 * Decode prefetch shared by the AVX2 and AVX-512 tile kernels. Decode tiles read their rows block
 * by block, all rows in step, so a tile of nr rows streams through nr * row bytes at once. Each
 * step fetches the matching `step` bytes of the next tile (`tile` bytes on, the tile's footprint):
 * a lookahead of one tile, long enough to hide DRAM latency and short enough not to run far past
 * the rows this thread works on (ahead_end: strata_qdot_ahead_end, set by the caller). Included
 * after <immintrin.h> and the INLINE macro (and PF_AHEAD, for fetch_block_ahead), inside the x86
 * part of a kernel file.
 */
#ifndef STRATA_QDOT_PREFETCH_H
#define STRATA_QDOT_PREFETCH_H

INLINE void fetch_next_tile(const uint8_t *w, int64_t tile, int64_t at, int64_t step, const uint8_t *ahead_end) {
    const uint8_t *pf = w + tile + at;
    if (pf >= ahead_end) return;
    for (int64_t o = 0; o < step; o += 64) _mm_prefetch((const char *)pf + o, _MM_HINT_T0);
}

#ifdef PF_AHEAD
/* The one-row decode tiles (the grid i-quants'): every cache line of the block of `bs` bytes at p,
 * PF_AHEAD bytes on (the including file's distance), unless that lies past this thread's rows. */
INLINE void fetch_block_ahead(const uint8_t *p, int64_t bs, const uint8_t *ahead_end) {
    const uint8_t *pf = p + PF_AHEAD;
    if (pf + bs > ahead_end) return;
    for (int64_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)pf + o, _MM_HINT_T0);
    _mm_prefetch((const char *)pf + bs - 1, _MM_HINT_T0);
}
#endif

#endif
