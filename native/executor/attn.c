/*
 * Decode attention: one query row per sequence against its cached keys and values, read in place
 * from the paged cache (strata/models/attention.py attend_decode is the torch formulation; tests in
 * tests/native/test_glue.py and test_kv_types.py hold this to it).
 *
 * The positions a query attends are cut into pieces (piece_len: about 16 per sequence, 32 to 256
 * positions each, a function of the attended length alone). A piece's softmax is computed on its
 * own (its maximum m, its sum l, its unnormalised output o); the pieces are then merged in
 * position order. That one order is what every caller gets: the serial call merges each piece as
 * it is computed; on a pool, a sequence with few kv heads spreads its pieces over the threads
 * (each piece's partial in a buffer), then merges them in the same order. So the bytes depend on
 * neither the threads, nor the batch, nor how heads are grouped. Query heads that share a kv head
 * go through a piece together (up to ATTN_GROUP), so each run of keys and values is read, and
 * converted when the cache is not F32, once per group.
 * The only allocation is the pooled split's buffer of partials; without it the call runs serially.
 */
#include "strata.h"
#include "kernels.h"
#include "pool.h"
#include "glue_simd.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Positions a piece holds at most (its scores live on the stack). */
#define ATTN_PIECE_MAX 256
/* Query heads of one kv head taken through a piece together. */
#define ATTN_GROUP 8
/* Floats of the serial merge's piece outputs on the stack (ATTN_GROUP heads of up to 1024). */
#define ATTN_O_FLOATS 8192
/* Rows converted to float32 per run (a cache not in F32) live on the stack: this many floats,
 * so head_dim <= ATTN_KV_BUF / 4 for such caches. */
#define ATTN_KV_BUF 4096

static int mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }

/* Positions per piece when a query attends n: about n / 16, a multiple of 16, within 32..256. */
static int64_t piece_len(int64_t n) {
    const int64_t p = ((n + 15) / 16 + 15) / 16 * 16;
    return p < 32 ? 32 : p > ATTN_PIECE_MAX ? ATTN_PIECE_MAX : p;
}

/* One query head's view of the paged cache: position j's key row is at byte
 * k + table[j / block] * block_bytes + (j % block) * row_bytes (and its value row alike), where k
 * and v point at this kv head's rows in block 0. Every table entry below n_ctx was checked by the
 * caller. A cache not in F32 is read `cap` rows at a time through to_f32 into a stack buffer.
 * Heads a..a+G-1 of one group are q + g * hd, out + g * hd and sink + g. */
typedef struct {
    const float *q;           /* [hd] */
    const uint8_t *k, *v;     /* block 0 of this query's kv head */
    const int64_t *table;     /* [ceil(n_ctx / block)] blocks of the sequence */
    float *out;               /* [hd] */
    int64_t n_ctx, hd, block, block_bytes, row_bytes;
    float scale;
    int64_t start;            /* first position attended (a sliding window's or chunk's start; else 0) */
    const float *sink;        /* this head's sink logit (one more softmax column, no value), or NULL */
    strata_block_fn to_f32;   /* NULL: F32 rows, read in place */
    int64_t row_blocks, cap;  /* to_f32's blocks per row; rows per conversion (a multiple of 4 when >= 4) */
} attn_head;

/* Rows j..j+n-1 of a head lie in one block when they do not cross a multiple of `block`; a
 * converted cache takes at most `cap` of them at once. */
static inline int64_t run_len(const attn_head *a, int64_t j, int64_t end) {
    const int64_t left = a->block - j % a->block;
    const int64_t n = end - j < left ? end - j : left;
    return a->to_f32 && n > a->cap ? a->cap : n;
}

/* Rows j..j+n-1 (one run) of `base` (a->k or a->v) as float32: in place, or converted into buf. */
static inline const float *rows_f32(const attn_head *a, const uint8_t *base, int64_t j, int64_t n, float *buf) {
    const uint8_t *p = base + a->table[j / a->block] * a->block_bytes + (j % a->block) * a->row_bytes;
    if (!a->to_f32) return (const float *)p;
    a->to_f32(p, buf, n * a->row_blocks);
    return buf;
}

/* A piece's three kernels, reference or AVX2: scores s[j] = scale q . k[j] for n key rows; the
 * softmax numerators in place, s[j] = e^(s[j] - max), returning their sum and the max; and
 * out += sum_j p[j] v[j] over n value rows. */
typedef struct {
    void (*scores)(const float *q, const float *k, int64_t n, int64_t hd, float scale, float *s);
    float (*exp_sum)(float *s, int64_t n, float *max);
    void (*weighted_sum)(const float *p, const float *v, int64_t n, int64_t hd, float *out);
} attn_ops;

static void scores_ref(const float *q, const float *k, int64_t n, int64_t hd, float scale, float *s) {
    for (int64_t r = 0; r < n; r++) s[r] = dot_ref(q, k + r * hd, hd) * scale;
}

static float exp_sum_ref(float *s, int64_t n, float *max) {
    float cm = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < n; j++) cm = s[j] > cm ? s[j] : cm;
    for (int64_t j = 0; j < n; j++) sum += s[j] = expf(s[j] - cm);
    *max = cm;
    return sum;
}

static void weighted_sum_ref(const float *p, const float *restrict v, int64_t n, int64_t hd, float *restrict out) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < hd; i++) out[i] += p[r] * v[r * hd + i];
}

static const attn_ops OPS_REF = {scores_ref, exp_sum_ref, weighted_sum_ref};

/* Positions [j0, j0 + nj) of heads a..a+G-1 into m[g], l[g] and o + g * os. Runs of rows inside
 * one block, each read (and converted) once for the G heads; with blocks of a multiple of 4
 * positions, the AVX2 scores group rows four by four as one contiguous region would. */
static void run_piece(const attn_ops *ops, const attn_head *a, int64_t G, int64_t j0, int64_t nj, float *m,
                      float *l, float *o, int64_t os) {
    float s[ATTN_GROUP][ATTN_PIECE_MAX], buf[ATTN_KV_BUF];
    const int64_t hd = a->hd;
    for (int64_t j = j0, n; j < j0 + nj; j += n) {
        n = run_len(a, j, j0 + nj);
        const float *k = rows_f32(a, a->k, j, n, buf);
        for (int64_t g = 0; g < G; g++) ops->scores(a->q + g * hd, k, n, hd, a->scale, s[g] + (j - j0));
    }
    for (int64_t g = 0; g < G; g++) {
        l[g] = ops->exp_sum(s[g], nj, &m[g]);
        memset(o + g * os, 0, (size_t)hd * sizeof(float));
    }
    for (int64_t j = j0, n; j < j0 + nj; j += n) {
        n = run_len(a, j, j0 + nj);
        const float *v = rows_f32(a, a->v, j, n, buf);
        for (int64_t g = 0; g < G; g++) ops->weighted_sum(s[g] + (j - j0), v, n, hd, o + g * os);
    }
}

#ifdef GLUE_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")

/* e^x for x <= 0 (Cephes' expf: x = n ln2 + r, a degree-5 polynomial in r, times 2^n), within
 * 2 ulp; inputs below -87.3 give about 1e-38 instead of a subnormal or 0. */
static inline __m256 exp256_nonpos(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* out[i] += sum_j p[j] v[j][i] for n value rows of hd: 64 columns at a time stay in registers
 * while every row streams past. */
static void weighted_sum_avx2(const float *p, const float *v, int64_t n, int64_t hd, float *out) {
    int64_t c = 0;
    for (; c + 64 <= hd; c += 64) {
        __m256 acc[8];
        for (int r = 0; r < 8; r++) acc[r] = _mm256_loadu_ps(out + c + 8 * r);
        for (int64_t j = 0; j < n; j++) {
            const __m256 pj = _mm256_set1_ps(p[j]);
            const float *vr = v + j * hd + c;
            for (int r = 0; r < 8; r++) acc[r] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8 * r), acc[r]);
        }
        for (int r = 0; r < 8; r++) _mm256_storeu_ps(out + c + 8 * r, acc[r]);
    }
    for (; c + 8 <= hd; c += 8) {
        __m256 acc = _mm256_loadu_ps(out + c);
        for (int64_t j = 0; j < n; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * hd + c), acc);
        _mm256_storeu_ps(out + c, acc);
    }
    for (; c < hd; c++) {
        float acc = out[c];
        for (int64_t j = 0; j < n; j++) acc += p[j] * v[j * hd + c];
        out[c] = acc;
    }
}

static float exp_sum_avx2(float *s, int64_t n, float *max) {
    float cm = -INFINITY;
    for (int64_t j = 0; j < n; j++) cm = s[j] > cm ? s[j] : cm;
    int64_t j = 0;
    __m256 lv = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        const __m256 p = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(cm)));
        _mm256_storeu_ps(s + j, p);
        lv = _mm256_add_ps(lv, p);
    }
    float sum = hsum256(lv);
    for (; j < n; j++) sum += s[j] = expf(s[j] - cm);
    *max = cm;
    return sum;
}

static const attn_ops OPS_AVX2 = {scores_avx2, exp_sum_avx2, weighted_sum_avx2};

#pragma GCC pop_options
#endif

/* Fold a piece (m, l, o) into a head's running (M, L, O); the first piece is taken as it is. One
 * function for the serial and the pooled merge, so both round alike (the build keeps a * b + c
 * unfused). */
static void merge_piece(float *M, float *L, float *O, float m, float l, const float *o, int64_t hd, int first) {
    if (first) {
        *M = m, *L = l;
        if (O != o) memcpy(O, o, (size_t)hd * sizeof(float));
        return;
    }
    const float Mn = m > *M ? m : *M, fa = expf(*M - Mn), fb = expf(m - Mn);
    *L = *L * fa + l * fb;
    for (int64_t i = 0; i < hd; i++) O[i] = O[i] * fa + o[i] * fb;
    *M = Mn;
}

/* A head's output from its merged (M, L, O): the sink's column joins the softmax, then O / L. */
static void finish_head(const float *sink, float M, float L, float *O, int64_t hd) {
    if (sink) {
        const float sk = *sink;
        if (sk > M) {
            const float f = expf(M - sk);
            L *= f;
            for (int64_t i = 0; i < hd; i++) O[i] *= f;
            M = sk;
        }
        L += expf(sk - M);
    }
    const float inv = 1.0f / L;
    for (int64_t i = 0; i < hd; i++) O[i] *= inv;
}

/* One decode attention's job: the cache, the queries, the kernel, and (pooled split) the partials. */
typedef struct {
    const attn_ops *ops;
    const float *q, *sinks;
    const uint8_t *kc, *vc;
    const int64_t *block_table, *n_ctx;
    float *out;
    int64_t q_stride, out_stride, table_stride, n_head, n_head_kv, group, head_dim, block_size, block_bytes, window,
        chunk, cap, row_bytes, row_blocks;
    strata_block_fn to_f32;
    float scale;
    /* The split: sequence b's pieces of kv head h are items first_item[b] + h * pieces(b) + c, each
     * holding group * (hd + 2) floats of partials (m, l, then o per head) at part + item * part_floats. */
    const int64_t *first_item;
    float *part;
    int64_t part_floats;
} attn_job;

static int64_t attn_start(const attn_job *J, int64_t n) {
    return J->chunk ? (n - 1) / J->chunk * J->chunk : J->window && n > J->window ? n - J->window : 0;
}

/* Heads h..h+G-1 (one kv head) of sequence b, as a kernel sees them. */
static attn_head head_view(const attn_job *J, int64_t b, int64_t h) {
    const int64_t n = J->n_ctx[b], at = (h / J->group) * J->block_size * J->row_bytes;
    return (attn_head){J->q + b * J->q_stride + h * J->head_dim, J->kc + at, J->vc + at,
                       J->block_table + b * J->table_stride, J->out + b * J->out_stride + h * J->head_dim, n,
                       J->head_dim, J->block_size, J->block_bytes, J->row_bytes, J->scale, attn_start(J, n),
                       J->sinks ? J->sinks + h : NULL, J->to_f32, J->row_blocks, J->cap};
}

/* Serial items (b * n_head + h): a range runs its heads that share a kv head together, piece by
 * piece, merging each piece as it comes. */
static void attn_items(void *ctx, int64_t first, int64_t count) {
    const attn_job *J = ctx;
    const int64_t hd = J->head_dim, most = ATTN_O_FLOATS / hd < ATTN_GROUP ? ATTN_O_FLOATS / hd : ATTN_GROUP;
    float o[ATTN_O_FLOATS], m[ATTN_GROUP], l[ATTN_GROUP], M[ATTN_GROUP], L[ATTN_GROUP];
    for (int64_t i = first, G; i < first + count; i += G) {
        const int64_t b = i / J->n_head, h = i % J->n_head;
        const int64_t end = (h / J->group + 1) * J->group, left = first + count - i;  /* this kv head's last + 1 */
        G = end - h < left ? end - h : left;
        G = G < most ? G : most;
        const attn_head a = head_view(J, b, h);
        const int64_t P = piece_len(a.n_ctx - a.start);
        for (int64_t j0 = a.start; j0 < a.n_ctx; j0 += P) {
            const int first_piece = j0 == a.start;
            float *dst = first_piece ? a.out : o;  /* the first piece straight into the output */
            run_piece(J->ops, &a, G, j0, a.n_ctx - j0 < P ? a.n_ctx - j0 : P, m, l, dst, hd);
            for (int64_t g = 0; g < G; g++)
                merge_piece(&M[g], &L[g], a.out + g * hd, m[g], l[g], dst + g * hd, hd, first_piece);
        }
        for (int64_t g = 0; g < G; g++) finish_head(a.sink ? a.sink + g : NULL, M[g], L[g], a.out + g * hd, hd);
    }
}

static int64_t seq_pieces(const attn_job *J, int64_t b) {
    const int64_t n = J->n_ctx[b], att = n - attn_start(J, n);
    return (att + piece_len(att) - 1) / piece_len(att);
}

/* Split items: one (sequence, kv head, piece) each, its partials into the buffer. */
static void piece_items(void *ctx, int64_t first, int64_t count) {
    const attn_job *J = ctx;
    const int64_t hd = J->head_dim;
    for (int64_t i = first; i < first + count; i++) {
        int64_t b = 0;
        while (J->first_item[b + 1] <= i) b++;
        const int64_t np = seq_pieces(J, b), kh = (i - J->first_item[b]) / np, c = (i - J->first_item[b]) % np;
        const attn_head a = head_view(J, b, kh * J->group);
        const int64_t P = piece_len(a.n_ctx - a.start), j0 = a.start + c * P, nj = a.n_ctx - j0 < P ? a.n_ctx - j0 : P;
        float *part = J->part + i * J->part_floats;  /* m [group], l [group], o [group, hd] */
        for (int64_t g = 0; g < J->group; g += ATTN_GROUP) {
            const int64_t G = J->group - g < ATTN_GROUP ? J->group - g : ATTN_GROUP;
            attn_head sub = a;
            sub.q += g * hd;
            run_piece(J->ops, &sub, G, j0, nj, part + g, part + J->group + g, part + 2 * J->group + g * hd, hd);
        }
    }
}

/* Merge items (b * n_head + h): the head's pieces in position order, then its output. */
static void merge_items(void *ctx, int64_t first, int64_t count) {
    const attn_job *J = ctx;
    const int64_t hd = J->head_dim;
    for (int64_t i = first; i < first + count; i++) {
        const int64_t b = i / J->n_head, h = i % J->n_head, kh = h / J->group, g = h % J->group, np = seq_pieces(J, b);
        float *O = J->out + b * J->out_stride + h * hd, M = 0.0f, L = 0.0f;
        for (int64_t c = 0; c < np; c++) {
            const float *part = J->part + (J->first_item[b] + kh * np + c) * J->part_floats;
            merge_piece(&M, &L, O, part[g], part[J->group + g], part + 2 * J->group + g * hd, hd, c == 0);
        }
        finish_head(J->sinks ? J->sinks + h : NULL, M, L, O, hd);
    }
}

/* Spread each sequence's pieces over the pool (partials in a buffer, then merged) when its kv heads
 * alone would leave threads idle and the partials are small beside the cache they summarise (at
 * most 1/8 of the values read: not so for latent attention's 128 heads of 576 on one latent row);
 * 0 when it does not pay or the buffer cannot be had. */
static int attn_split(strata_pool *pool, attn_job *J, int64_t n_seq, int64_t positions) {
    const int64_t threads = strata_pool_threads(pool);
    if (threads < 2 || n_seq * J->n_head_kv >= 2 * threads) return 0;
    int64_t *first_item = malloc((size_t)(n_seq + 1) * sizeof(int64_t));
    if (!first_item) return 0;
    first_item[0] = 0;
    for (int64_t b = 0; b < n_seq; b++) first_item[b + 1] = first_item[b] + J->n_head_kv * seq_pieces(J, b);
    const int64_t items = first_item[n_seq];
    int64_t floats, values;
    J->part_floats = J->group * (J->head_dim + 2);
    float *part = NULL;
    int split = 0;
    if (items > n_seq * J->n_head_kv && mul_ok(items, J->part_floats, &floats) &&
        mul_ok(positions, J->n_head_kv * J->head_dim, &values) && floats <= values / 8)
        part = malloc((size_t)floats * sizeof(float));
    if (part) {
        split = 1;
        J->first_item = first_item, J->part = part;
        strata_pool_run(pool, items, 1, piece_items, J);
        strata_pool_run(pool, n_seq * J->n_head, 1, merge_items, J);
    }
    free(first_item);
    free(part);
    return split;
}

int strata_attn_decode_pooled(strata_pool *pool, int32_t kv_type, const float *q, int64_t q_stride, int64_t n_seq,
                              int64_t n_head, int64_t n_head_kv, int64_t head_dim, const void *k_cache,
                              const void *v_cache, int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                              int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                              int64_t window, int64_t chunk, float *out, int64_t out_stride, int impl) {
    int64_t block_bytes, cache_bytes, width, last, max_ctx;
    kv_format f;
    int st = strata_resolve_impl(impl, &impl);
    if (st || (st = strata_kv_format(kv_type, head_dim, impl, &f))) return st;
    if ((f.to_f32 && head_dim > ATTN_KV_BUF / 4) || head_dim > ATTN_O_FLOATS) return STRATA_E_SIZE;
    if ((st = strata_kv_cache_shape(n_blocks, n_head_kv, block_size, f.row_bytes, &block_bytes, &cache_bytes)))
        return st;
    block_bytes *= n_head_kv;  /* the shape gave one head's P rows */
    if (n_seq < 0 || n_head < 1 || n_head % n_head_kv || table_stride < 1 || !isfinite(scale) || window < 0 ||
        chunk < 0 || (window && chunk))
        return STRATA_E_ARG;
    if (n_seq == 0) return STRATA_OK;
    if (!q || !k_cache || !v_cache || !block_table || !n_ctx || !out) return STRATA_E_ARG;
    if (!mul_ok(n_head, head_dim, &width) || q_stride < width || out_stride < width ||
        !mul_ok(n_seq - 1, q_stride > out_stride ? q_stride : out_stride, &last) ||
        !mul_ok(n_seq, table_stride, &last) || !mul_ok(table_stride, block_size, &max_ctx))
        return STRATA_E_SIZE;
    int64_t positions = 0;  /* positions read over all sequences: the work */
    for (int64_t b = 0; b < n_seq; b++) {  /* every length and every block read, before any work */
        if (n_ctx[b] < 1 || n_ctx[b] > max_ctx) return STRATA_E_SIZE;
        const int64_t *table = block_table + b * table_stride;
        for (int64_t i = 0; i < (n_ctx[b] + block_size - 1) / block_size; i++)
            if (table[i] < 0 || table[i] >= n_blocks) return STRATA_E_SIZE;
        positions += chunk ? (n_ctx[b] - 1) % chunk + 1 : window && n_ctx[b] > window ? window : n_ctx[b];
    }
    attn_job J = {.ops = &OPS_REF, .q = q, .sinks = sinks, .kc = (const uint8_t *)k_cache,
                  .vc = (const uint8_t *)v_cache, .block_table = block_table, .n_ctx = n_ctx, .out = out,
                  .q_stride = q_stride, .out_stride = out_stride, .table_stride = table_stride, .n_head = n_head,
                  .n_head_kv = n_head_kv, .group = n_head / n_head_kv, .head_dim = head_dim,
                  .block_size = block_size, .block_bytes = block_bytes, .window = window, .chunk = chunk,
                  .row_bytes = f.row_bytes, .row_blocks = f.row_blocks, .to_f32 = f.to_f32, .scale = scale};
#ifdef GLUE_X86
    if (impl != STRATA_IMPL_SCALAR) J.ops = &OPS_AVX2;  /* AVX-512 runs the AVX2 kernels */
#endif
    /* Rows per conversion: a multiple of 4, so the AVX2 scores group rows as over float32 rows. */
    J.cap = ATTN_KV_BUF / head_dim >= 4 ? ATTN_KV_BUF / head_dim / 4 * 4 : ATTN_KV_BUF / head_dim;
    /* The pool only where the work outweighs waking it (256 K position-features over every head). */
    int64_t work;
    const int pooled = pool && mul_ok(positions, width, &work) && work >= (1 << 18);
    if (pooled && attn_split(pool, &J, n_seq, positions)) return STRATA_OK;
    strata_pool_run(pooled && n_seq * n_head > 1 ? pool : NULL, n_seq * n_head, 1, attn_items, &J);
    return STRATA_OK;
}

int strata_glue_attn_decode_typed(int32_t kv_type, const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head,
                                  int64_t n_head_kv, int64_t head_dim, const void *k_cache, const void *v_cache,
                                  int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                                  int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                                  int64_t window, float *out, int64_t out_stride, int impl) {
    return strata_attn_decode_pooled(NULL, kv_type, q, q_stride, n_seq, n_head, n_head_kv, head_dim, k_cache, v_cache,
                                     n_blocks, block_size, block_table, table_stride, n_ctx, scale, sinks, window, 0,
                                     out, out_stride, impl);
}

int strata_glue_attn_decode(const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head, int64_t n_head_kv,
                            int64_t head_dim, const float *k_cache, const float *v_cache, int64_t n_blocks,
                            int64_t block_size, const int64_t *block_table, int64_t table_stride,
                            const int64_t *n_ctx, float scale, float *out, int64_t out_stride, int impl) {
    return strata_glue_attn_decode_typed(STRATA_T_F32, q, q_stride, n_seq, n_head, n_head_kv, head_dim, k_cache,
                                         v_cache, n_blocks, block_size, block_table, table_stride, n_ctx, scale, NULL,
                                         0, out, out_stride, impl);
}

int strata_glue_attn_decode_sinks(const float *q, int64_t q_stride, int64_t n_seq, int64_t n_head,
                                  int64_t n_head_kv, int64_t head_dim, const float *k_cache, const float *v_cache,
                                  int64_t n_blocks, int64_t block_size, const int64_t *block_table,
                                  int64_t table_stride, const int64_t *n_ctx, float scale, const float *sinks,
                                  int64_t window, float *out, int64_t out_stride, int impl) {
    return strata_glue_attn_decode_typed(STRATA_T_F32, q, q_stride, n_seq, n_head, n_head_kv, head_dim, k_cache,
                                         v_cache, n_blocks, block_size, block_table, table_stride, n_ctx, scale, sinks,
                                         window, out, out_stride, impl);
}
