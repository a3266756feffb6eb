/* ---- Same-host exchange of expert-parallel partial sums (exchange.c) ----
 *
 * Read by build.py as part of the cdef (after strata.h). Ranks of one expert-parallel group that
 * run on one machine share a segment (a file in /dev/shm each maps) instead of sending their
 * MoE layers' partial sums through the group's sockets. Layout: a header line per rank (int64
 * sequence number, int64 process id, on their own 64-byte line), then two buffers of `world`
 * slots of `slot_floats` floats each (call `seq` uses buffer seq & 1, so a rank one call ahead
 * never writes what a peer may still be reading).
 *
 * strata_exchange_bytes: the segment's size for `world` ranks and slots of `slot_floats`.
 * strata_exchange_init: this rank's header line: sequence 0, its process id.
 * strata_exchange_sum: this rank's partial [n floats] into its slot of call `seq` (1, 2, ... the
 *     same on every rank), its sequence published (release), then every rank's awaited (acquire)
 *     and out = slot 0 + slot 1 + ... added in rank order, float by float: the bytes of an
 *     all-gather followed by the same additions. Waiting spins briefly, then yields, then sleeps
 *     in steps of 50 us (ranks that share a core do not starve each other). A peer whose process
 *     has ended (gone, or a zombie) is noticed within ~20 ms: STRATA_E_CLOSED, *late = its rank;
 *     a peer not there within timeout_s: STRATA_E_TIMEOUT, *late = the first rank still missing.
 *     STRATA_E_ARG for a bad rank, world or seq; STRATA_E_SIZE for n beyond a slot or a segment
 *     shorter than its layout.
 */
int64_t strata_exchange_bytes(int world, int64_t slot_floats);
int strata_exchange_init(uint8_t *seg, int64_t seg_len, int world, int rank, int64_t slot_floats, int64_t pid);
int strata_exchange_sum(uint8_t *seg, int64_t seg_len, int world, int rank, int64_t slot_floats, int64_t seq,
                        const float *partial, int64_t n, float *out, double timeout_s, int *late);
