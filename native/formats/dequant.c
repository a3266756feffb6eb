/*
 * Dequantization dispatcher: format table, CPU detection, row splitting across threads, and the
 * float32 -> float16/bfloat16 output stage. The kernels themselves live in dequant_ref.c and
 * dequant_avx2.c; this file is compiled without any ISA extension so it runs on every x86-64.
 */
#include "strata.h"
#include "kernels.h"
#include "type_rows.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* Kernels per type; block sizes come from the format table (format.c). */
typedef struct {
    int type;
    strata_block_fn ref, avx2;      /* avx2 may be NULL: the format then runs its scalar kernel */
} strata_dequant_kernels;

/* One row per type of the table of quant types (strata/quant_table.py, through quant_types.h). */
static const strata_dequant_kernels KERNELS[] = {STRATA_DEQUANT_ROWS};

/* ---- CPU detection: the only process-wide state, computed once. ---- */

static int cpu_avx2 = -1, cpu_avx512 = -1, cpu_vbmi = -1;

#if defined(__x86_64__) || defined(__i386__)
static void cpuid(unsigned leaf, unsigned subleaf, unsigned r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
}

/* XCR0: which register state the OS saves and restores (only valid when CPUID.1:ECX.OSXSAVE). */
static unsigned xcr0_low(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return lo;
}
#else
/* Not an x86 CPU: CPUID and XCR0 read as zeros, so every feature below reads as absent. */
static void cpuid(unsigned leaf, unsigned subleaf, unsigned r[4]) {
    (void)leaf, (void)subleaf;
    r[0] = r[1] = r[2] = r[3] = 0;
}

static unsigned xcr0_low(void) { return 0; }
#endif

static int detect_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0;
#endif
    /* F16C and OS-enabled YMM state: CPUID.1:ECX bit 29 (F16C), bit 27 (OSXSAVE), XCR0 bits 1-2. */
    unsigned r[4];
    cpuid(1, 0, r);
    if (!(r[2] & (1u << 29)) || !(r[2] & (1u << 27))) return 0;
    return (xcr0_low() & 6u) == 6u;
}

/* Read CPUID directly rather than trust __builtin_cpu_supports: GCC 12 does not check that the
 * OS saves ZMM state before reporting AVX-512 features. */
static int detect_avx512(void) {
    if (!strata_cpu_has_avx2()) return 0;       /* the AVX-512 family falls back to AVX2 kernels */
    unsigned r[4];
    cpuid(0, 0, r);
    if (r[0] < 7) return 0;
    cpuid(7, 0, r);
    const unsigned ebx_need = 1u << 16 | 1u << 30 | 1u << 31;    /* AVX512F, AVX512BW, AVX512VL */
    if ((r[1] & ebx_need) != ebx_need || !(r[2] & (1u << 11))) return 0;   /* ECX 11: AVX512_VNNI */
    /* XCR0 bits 1-2 (SSE, AVX) and 5-7 (opmask, upper halves of ZMM0-15, ZMM16-31). OSXSAVE was
     * checked by detect_avx2. */
    return (xcr0_low() & 0xe6u) == 0xe6u;
}

/* AVX-512 VBMI and GFNI (CPUID.7.0:ECX bits 1 and 8) on top of the AVX-512 set: byte permutes across
 * the whole zmm, VPMULTISHIFTQB and GF2P8AFFINEQB (Ice Lake and later Intel cores, Zen 4). */
static int detect_vbmi(void) {
    if (!strata_cpu_has_avx512()) return 0;
    unsigned r[4];
    cpuid(7, 0, r);
    return (r[2] & 0x102u) == 0x102u;
}

int strata_cpu_has_avx2(void) {
    if (cpu_avx2 < 0) cpu_avx2 = detect_avx2();
    return cpu_avx2;
}

int strata_cpu_has_avx512(void) {
    if (cpu_avx512 < 0) cpu_avx512 = detect_avx512();
    return cpu_avx512;
}

int strata_cpu_has_avx512_vbmi(void) {
    if (cpu_vbmi < 0) cpu_vbmi = detect_vbmi();
    return cpu_vbmi;
}

/* 1 when the kernel reports this CPU not affected by Gather Data Sampling (no sysfs entry: 0). */
static int gds_not_affected(void) {
    int ok = 0;
    FILE *f = fopen("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling", "r");
    if (f) {
        char line[64] = {0};
        ok = fgets(line, sizeof line, f) && strncmp(line, "Not affected", 12) == 0;
        fclose(f);
    }
    return ok;
}

/* 1 when CPUID's vendor string is `id` (12 characters, "GenuineIntel", "AuthenticAMD"). */
static int cpu_vendor_is(const char *id) {
    unsigned r[4];
    cpuid(0, 0, r);
    char v[12];
    memcpy(v, &r[1], 4);   /* EBX, EDX, ECX */
    memcpy(v + 4, &r[3], 4);
    memcpy(v + 8, &r[2], 4);
    return memcmp(v, id, 12) == 0;
}

/* Gathers run at the load ports' rate: not a CPU whose microcode mitigates Gather Data Sampling
 * (Intel cores up to Ice Lake and Tiger Lake, where that makes a gather several times slower), as
 * the kernel reports it, and not one that splits 512-bit operations (Zen 4: there the gather tiles
 * decoded slower than the AVX2 build; benchmarks/RESULTS.md, "Kernel choice per CPU"). */
int strata_cpu_fast_gathers(void) {
    static int cached = -1;
    if (cached < 0) cached = gds_not_affected() && !strata_cpu_splits_512();
    return cached;
}

/* The grid i-quants' AVX2 chunks fetch rows by ymm gathers (native/kernels/avx2/qdot_iq_chunks.h,
 * gather_rows8) on an Intel CPU whose kernel reports it not affected by Gather Data Sampling: there,
 * on a Raptor Cove core, they won for the types whose indices take unpacking (IQ2_XXS and IQ2_XS keep
 * their scalar loads); on Zen 3 gathered rows lost, so AMD CPUs keep the scalar loads until measured
 * otherwise (benchmarks/RESULTS.md, "Kernel choice per CPU"). STRATA_KERNEL=+ymm_gathers|-ymm_gathers
 * overrides the choice (native/kernels/cpu.c), not this detection. */
int strata_cpu_fast_ymm_gathers(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    return cached = cpu_vendor_is("GenuineIntel") && gds_not_affected();
}

/* AVX-VNNI: VEX-encoded VPDPBUSD on xmm and ymm (CPUID.(7,1):EAX bit 4; Intel's Alder Lake and later
 * client cores, Sapphire Rapids and later Xeons, Zen 5), on top of AVX2. STRATA_KERNEL=-avx_vnni
 * takes its tiles off (an AVX2 CPU without it, for measuring and testing; native/kernels/cpu.c). */
int strata_cpu_avx_vnni(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    cached = 0;
#if (defined(__x86_64__) || defined(__i386__)) && STRATA_CC_AVX_VNNI   /* else no tiles were built */
    if (!strata_cpu_has_avx2()) return cached;
    unsigned r[4];
    cpuid(0, 0, r);
    if (r[0] < 7) return cached;
    cpuid(7, 1, r);
    cached = (r[0] >> 4) & 1u;
#endif
    return cached;
}

int strata_cpu_splits_512(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    unsigned r[4];
    cpuid(1, 0, r);
    const unsigned base = (r[0] >> 8) & 0xfu, ext = (r[0] >> 20) & 0xffu;
    cached = cpu_vendor_is("AuthenticAMD") && base + (base == 0xfu ? ext : 0u) == 0x19u;
    return cached;
}

int strata_impl_default(void) {
    const int cap = strata_kernel_cap();   /* STRATA_KERNEL=scalar|avx2 (native/kernels/cpu.c) */
    if (cap == STRATA_IMPL_SCALAR) return STRATA_IMPL_SCALAR;
    if (cap != STRATA_IMPL_AVX2 && strata_cpu_has_avx512()) return STRATA_IMPL_AVX512;
    return strata_cpu_has_avx2() ? STRATA_IMPL_AVX2 : STRATA_IMPL_SCALAR;
}

int strata_resolve_impl(int impl, int *resolved) {
    if (impl == STRATA_IMPL_AUTO) impl = strata_impl_default();
    if (impl == STRATA_IMPL_AVX2 && !strata_cpu_has_avx2()) return STRATA_E_IMPL;
    if (impl == STRATA_IMPL_AVX512 && !strata_cpu_has_avx512()) return STRATA_E_IMPL;
    if (impl != STRATA_IMPL_SCALAR && impl != STRATA_IMPL_AVX2 && impl != STRATA_IMPL_AVX512) return STRATA_E_ARG;
    *resolved = impl;
    return STRATA_OK;
}

int strata_dequant_has_kernel(int ggml_type, int impl) {
    const strata_dequant_kernels *k = STRATA_TYPE_ROW(KERNELS, ggml_type);
    if (!k) return 0;
    return impl == STRATA_IMPL_AVX2 || impl == STRATA_IMPL_AVX512 ? k->avx2 != NULL : 1;
}

int strata_dequant_block_size(int ggml_type, int64_t *block_elems, int64_t *block_bytes) {
    const strata_format_info *f = STRATA_TYPE_ROW(KERNELS, ggml_type) ? strata_format_find(ggml_type) : NULL;
    if (!f) return STRATA_E_TYPE;
    if (!block_elems || !block_bytes) return STRATA_E_ARG;
    *block_elems = f->block_elems;
    *block_bytes = f->block_bytes;
    return STRATA_OK;
}

/* ---- Work splitting ---- */

/* Float scratch for float16/bfloat16 output: a multiple of every block size (256). */
#define STRATA_CHUNK_ELEMS 4096

typedef struct {
    strata_block_fn kernel;
    strata_convert_fn convert;       /* NULL for float32 output */
    const uint8_t *src;
    uint8_t *dst;
    int64_t block_elems, block_bytes, out_elem_bytes, blocks_per_row;
} strata_job;

static void run_rows(void *ctx, int64_t first_row, int64_t n_rows) {
    const strata_job *j = ctx;
    const int64_t first_block = first_row * j->blocks_per_row, n_blocks = n_rows * j->blocks_per_row;
    const uint8_t *src = j->src + first_block * j->block_bytes;
    uint8_t *dst = j->dst + first_block * j->block_elems * j->out_elem_bytes;
    if (!j->convert) {
        j->kernel(src, (float *)dst, n_blocks);
        return;
    }
    float scratch[STRATA_CHUNK_ELEMS] __attribute__((aligned(32)));
    const int64_t chunk_blocks = STRATA_CHUNK_ELEMS / j->block_elems;
    for (int64_t b = 0; b < n_blocks; b += chunk_blocks) {
        int64_t nb = n_blocks - b < chunk_blocks ? n_blocks - b : chunk_blocks;
        j->kernel(src + b * j->block_bytes, scratch, nb);
        j->convert(scratch, dst + b * j->block_elems * j->out_elem_bytes, nb * j->block_elems);
    }
}

int strata_dequant(int ggml_type, const void *src, int64_t src_bytes,
                   void *dst, int64_t dst_bytes, int out,
                   int64_t n_rows, int64_t row_len, int n_threads, int impl) {
    const strata_dequant_kernels *k = STRATA_TYPE_ROW(KERNELS, ggml_type);
    const strata_format_info *f = strata_format_find(ggml_type);
    if (!k || !f) return STRATA_E_TYPE;
    if (n_rows < 0 || row_len < 0 || src_bytes < 0 || dst_bytes < 0 || n_threads < 1)
        return STRATA_E_ARG;
    /* An empty tensor may have a null data pointer (torch does this): nothing to read or write. */
    if (n_rows == 0 || row_len == 0) return row_len % f->block_elems ? STRATA_E_BLOCK : STRATA_OK;
    if (!src || !dst) return STRATA_E_ARG;
    int st = strata_resolve_impl(impl, &impl);
    if (st) return st;
    if (row_len % f->block_elems) return STRATA_E_BLOCK;

    int64_t out_elem_bytes;
    strata_convert_fn convert;
    const int avx2 = impl == STRATA_IMPL_AVX2 || impl == STRATA_IMPL_AVX512;  /* no AVX-512 kernels here */
    switch (out) {
    case STRATA_OUT_F32: out_elem_bytes = 4; convert = NULL; break;
    case STRATA_OUT_F16: out_elem_bytes = 2; convert = avx2 ? strata_convert_f16_avx2 : strata_convert_f16_ref; break;
    case STRATA_OUT_BF16: out_elem_bytes = 2; convert = avx2 ? strata_convert_bf16_avx2 : strata_convert_bf16_ref; break;
    default: return STRATA_E_ARG;
    }

    /* Overflow-safe size checks: every product below is bounded by the buffer sizes. */
    const int64_t blocks_per_row = row_len / f->block_elems;
    if (n_rows && blocks_per_row > INT64_MAX / n_rows) return STRATA_E_SIZE;
    const int64_t n_blocks = n_rows * blocks_per_row;
    if (n_blocks > src_bytes / f->block_bytes) return STRATA_E_SIZE;
    if (n_blocks > dst_bytes / (f->block_elems * out_elem_bytes)) return STRATA_E_SIZE;

    strata_job job = {
        .kernel = avx2 && k->avx2 ? k->avx2 : k->ref, .convert = convert,
        .src = (const uint8_t *)src, .dst = (uint8_t *)dst,
        .block_elems = f->block_elems, .block_bytes = f->block_bytes, .out_elem_bytes = out_elem_bytes,
        .blocks_per_row = blocks_per_row,
    };
    strata_parallel_rows(n_rows, n_threads, run_rows, &job);
    return STRATA_OK;
}

int strata_convert_f32(const float *src, void *dst, int64_t n, int out, int impl) {
    if (n < 0) return STRATA_E_ARG;
    if (n == 0) return STRATA_OK;
    if (!src || !dst) return STRATA_E_ARG;
    int st = strata_resolve_impl(impl, &impl);
    if (st) return st;
    const int avx2 = impl == STRATA_IMPL_AVX2 || impl == STRATA_IMPL_AVX512;  /* no AVX-512 kernels here */
    switch (out) {
    case STRATA_OUT_F16: (avx2 ? strata_convert_f16_avx2 : strata_convert_f16_ref)(src, dst, n); return STRATA_OK;
    case STRATA_OUT_BF16: (avx2 ? strata_convert_bf16_avx2 : strata_convert_bf16_ref)(src, dst, n); return STRATA_OK;
    case STRATA_OUT_F32: memmove(dst, src, (size_t)n * 4); return STRATA_OK;
    default: return STRATA_E_ARG;
    }
}

const char *strata_status_string(int status) {
    switch (status) {
    case STRATA_OK: return "ok";
    case STRATA_E_ARG: return "invalid argument";
    case STRATA_E_TYPE: return "unsupported ggml type";
    case STRATA_E_SIZE: return "buffer too small for the requested rows";
    case STRATA_E_BLOCK: return "row length is not a multiple of the block size";
    case STRATA_E_NOMEM: return "out of memory";
    case STRATA_E_THREAD: return "could not start a worker thread";
    case STRATA_E_IMPL: return "implementation not available on this CPU";
    default: return "unknown status";
    }
}
