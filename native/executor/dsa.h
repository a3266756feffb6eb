/* ---- Sparse latent attention (dsa.c): the lightning indexer and attention over its choice ----
 *
 * Read by build.py as part of the cdef (after strata.h). DeepSeek-V3.2 (`deepseek32`) and GLM-5
 * (`glm-dsa`), one new token per sequence (strata/models/dsa.py is the reference):
 *
 *   qi = rope(qa @ Wq_b^T).view(Hi, Di) @ Hd       qa [q_lora]: the query LoRA's normed latent
 *   ki = rope(layernorm(xa @ Wk^T)) @ Hd            [Di]; rounded to f16, written to the index cache
 *   wt = (proj @ xa) / sqrt(Di Hi)                  proj [Hi, D] float32
 *   score[s] = sum_h wt[h] relu(qi[h] . k_s)        every position s <= the token's own
 *   keep = the top_k best positions                 (all of them where the token sees <= top_k)
 *
 * RoPE turns the first rope_dim features of each head (NEOX pairs when neox, else adjacent ones);
 * Hd is the orthonormal Walsh-Hadamard transform (Di a power of two, at most 1024), done in place by
 * butterflies; the layer norm's mean and variance are summed in double. Equal scores: the lower
 * position first. keep [n_seq, top_k] lists each sequence's n_keep[b] kept positions, ascending.
 * The scores run over the pool in chunks of positions (each score one function of its key row, so
 * the bytes do not depend on the split; their buffer is allocated per call: STRATA_E_NOMEM).
 *
 * strata_dsa_select: the indexer of n_seq tokens (xa [n_seq, D], qa [n_seq, q_lora], rope tables
 * [n_seq, rope_dim / 2]): writes each token's key into index_cache (rows of Di in kv_type, the
 * layer's value slot) at its position through its block table, then keep and n_keep.
 * strata_dsa_attend: latent attention (one kv head of row_len = kv_lora + rope) of query
 * [n_seq, H, row_len] over the kept rows of `cache` only, into out [n_seq, H, row_len]: the kept
 * rows are gathered into the scratch as one block per sequence, attended there by
 * strata_attn_decode_pooled. Scratch: the functions' _scratch_bytes for n_seq.
 */
typedef struct {
    int64_t n_embd, q_lora, n_head, head_dim, top_k, rope_dim;
    int32_t neox;
    float norm_eps;
    int32_t q_b_type, k_type;
    const void *q_b, *k;              /* q_b [Hi Di, q_lora], k [Di, D], packed */
    int64_t q_b_bytes, k_bytes;
    const float *k_norm, *k_norm_b;   /* [Di] */
    const float *proj;                /* [Hi, D] */
} strata_dsa_indexer;

int strata_dsa_select_scratch_bytes(const strata_dsa_indexer *ix, int64_t n_seq, int64_t *bytes);
int strata_dsa_select(strata_pool *pool, const strata_dsa_indexer *ix, int64_t n_seq, const float *xa, const float *qa,
                      const int64_t *positions, const float *cos_t, const float *sin_t, int32_t kv_type,
                      void *index_cache, int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                      int64_t table_stride, int64_t *keep, int64_t *n_keep, void *scratch, int64_t scratch_bytes,
                      int impl);
int strata_dsa_attend_scratch_bytes(int64_t n_seq, int64_t top_k, int64_t row_len, int64_t *bytes);
int strata_dsa_attend(strata_pool *pool, int32_t kv_type, const float *query, int64_t n_seq, int64_t n_head,
                      int64_t row_len, const void *cache, int64_t n_blocks, int64_t block_size,
                      const int64_t *block_table, int64_t table_stride, const int64_t *keep, const int64_t *n_keep,
                      int64_t top_k, float scale, float *out, void *scratch, int64_t scratch_bytes, int impl);

/* ---- A sparse latent attention layer's decode step (dsa.c; a strata_step_fn) ----
 *
 * Latent attention's step (strata_decode_attn over `attn`, whose v_cache is the index cache) with
 * its attention over the positions the indexer keeps: a full layer (idx.q_b given) runs
 * strata_dsa_select into keep / n_keep; a shared one (GLM-5's, idx.q_b NULL) reads the keep /
 * n_keep its full layer wrote in the same step (its buffers). keep [keep_rows, idx.top_k],
 * n_keep [keep_rows]: at least n_seq rows. */
typedef struct {
    strata_attn_layer attn;
    strata_dsa_indexer idx;
    int64_t *keep, *n_keep;
    int64_t keep_rows;
} strata_dsa_layer;

int strata_decode_dsa_scratch_bytes(const strata_layer_head *layer, int64_t n_seq, int64_t *bytes);
int strata_decode_dsa(strata_pool *pool, const strata_layer_head *layer, const strata_step_args *args, int impl);
