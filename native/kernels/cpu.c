/*
 * The CPU as the kernel choice sees it (strata_cpu_desc): vendor, family and features, detected once
 * per process, and the one override of the choice, STRATA_KERNEL, read at the same time:
 *
 *   STRATA_KERNEL="word word ..."  (words apart by spaces or commas)
 *     scalar | avx2 | avx512  the widest family AUTO resolves to (strata_kernel_cap)
 *     +KIND                   tiles of that kind first wherever the CPU runs them, whatever the
 *                             table's conditions say (a tile kind of strata/quant_table.py:
 *                             +avx512 runs AVX-512's own tiles where the table picks the AVX2 build,
 *                             +planes, +vbmi, +kz ... where 512-bit operations are split)
 *     -KIND                   never tiles of that kind (-planes, -vbmi, -kz,-kzgfni,-zmm, -avxvnni)
 *     +fast_gathers, -fast_gathers, +ymm_gathers, -ymm_gathers
 *                             the measured gather choices, as if the CPU said so
 *     -vbmi_gfni, -avx_vnni   as if the CPU lacked the extension (its tiles are not taken)
 *
 * For tests and measurement; a word it does not know makes strata_cpu_describe say STRATA_E_ARG.
 */
#include "strata.h"
#include "qdot.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { VENDOR_OTHER = 0, VENDOR_INTEL = 1, VENDOR_AMD = 2 };

static strata_cpu_desc here;
static int cap, bad_word;
static pthread_once_t here_once = PTHREAD_ONCE_INIT;
static atomic_int here_ready;

#if defined(__x86_64__) || defined(__i386__)
static void cpuid(unsigned leaf, unsigned r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(0));
}
#endif

/* Vendor and family (base, plus extended where base is 0xF) from CPUID leaves 0 and 1. */
static void vendor_family(int *vendor, int *family) {
    *vendor = VENDOR_OTHER;
    *family = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned r[4];
    char v[12];
    cpuid(0, r);
    memcpy(v, &r[1], 4);   /* EBX, EDX, ECX */
    memcpy(v + 4, &r[3], 4);
    memcpy(v + 8, &r[2], 4);
    *vendor = memcmp(v, "GenuineIntel", 12) == 0 ? VENDOR_INTEL : memcmp(v, "AuthenticAMD", 12) == 0 ? VENDOR_AMD
                                                                                                    : VENDOR_OTHER;
    cpuid(1, r);
    const unsigned base = (r[0] >> 8) & 0xfu, ext = (r[0] >> 20) & 0xffu;
    *family = (int)(base + (base == 0xfu ? ext : 0u));
#endif
}

/* Index of `name` (n bytes) among the tile kinds, or -1. */
static int kind_named(const char *name, size_t n) {
    for (int k = 0; k < STRATA_TILE_KINDS; k++)
        if (strlen(strata_tile_kinds[k].name) == n && memcmp(strata_tile_kinds[k].name, name, n) == 0) return k;
    return -1;
}

static int word_is(const char *w, size_t n, const char *name) { return strlen(name) == n && memcmp(w, name, n) == 0; }

/* One word of STRATA_KERNEL applied to `d`; 0 when it is not one of the words above. */
static int apply_word(strata_cpu_desc *d, const char *w, size_t n) {
    static const struct { const char *name; int impl; } CAPS[] = {
        {"scalar", STRATA_IMPL_SCALAR}, {"avx2", STRATA_IMPL_AVX2}, {"avx512", STRATA_IMPL_AVX512}};
    static const struct { const char *name; uint32_t bit; int plus; } FEATURES[] = {
        {"fast_gathers", STRATA_CPU_FAST_GATHERS, 1}, {"ymm_gathers", STRATA_CPU_YMM_GATHERS, 1},
        {"vbmi_gfni", STRATA_CPU_VBMI_GFNI, 0}, {"avx_vnni", STRATA_CPU_AVX_VNNI, 0}};
    for (size_t i = 0; i < sizeof(CAPS) / sizeof(CAPS[0]); i++)
        if (word_is(w, n, CAPS[i].name)) return cap = CAPS[i].impl, 1;
    if (n < 2 || (w[0] != '+' && w[0] != '-')) return 0;
    const int plus = w[0] == '+';
    const int kind = kind_named(w + 1, n - 1);
    if (kind >= 0) {
        *(plus ? &d->prefer : &d->exclude) |= 1u << kind;
        return 1;
    }
    for (size_t i = 0; i < sizeof(FEATURES) / sizeof(FEATURES[0]); i++)
        if (word_is(w + 1, n - 1, FEATURES[i].name) && (FEATURES[i].plus || !plus)) {
            d->features = plus ? d->features | FEATURES[i].bit : d->features & ~FEATURES[i].bit;
            return 1;
        }
    return 0;
}

static void detect(void) {
    vendor_family(&here.vendor, &here.family);
    here.features = (strata_cpu_has_avx2() ? STRATA_CPU_AVX2 : 0) | (strata_cpu_has_avx512() ? STRATA_CPU_AVX512 : 0) |
                    (strata_cpu_has_avx512_vbmi() ? STRATA_CPU_VBMI_GFNI : 0) | (strata_cpu_avx_vnni() ? STRATA_CPU_AVX_VNNI : 0) |
                    (strata_cpu_fast_gathers() ? STRATA_CPU_FAST_GATHERS : 0) |
                    (strata_cpu_fast_ymm_gathers() ? STRATA_CPU_YMM_GATHERS : 0);
    const char *v = getenv("STRATA_KERNEL");
    while (v && *v) {
        const size_t skip = strspn(v, ", \t"), n = strcspn(v + skip, ", \t");
        if (n && !apply_word(&here, v + skip, n)) bad_word = 1;
        v += skip + n;
    }
    atomic_store_explicit(&here_ready, 1, memory_order_release);
}

const strata_cpu_desc *strata_cpu_here(void) {
    if (!atomic_load_explicit(&here_ready, memory_order_acquire)) pthread_once(&here_once, detect);
    return &here;
}

int strata_cpu_has(uint32_t bit) { return (strata_cpu_here()->features & bit) != 0; }

int strata_cpu_describe(strata_cpu_desc *out) {
    if (!out) return STRATA_E_ARG;
    *out = *strata_cpu_here();
    return bad_word ? STRATA_E_ARG : STRATA_OK;
}

int strata_kernel_cap(void) {
    strata_cpu_here();
    return cap;
}
