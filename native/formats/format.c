/*
 * The format table: block sizes of every GGML type the runtime reads, one row per type of the table
 * of quant types (strata/quant_table.py, through quant_types.h). The dequantizer, the quantizer and
 * the matrix kernels look sizes up here; each keeps only its own kernel pointers beside the type id.
 */
#include "common.h"

#include <stddef.h>

#define FORMAT_ROW(T, name, elems, bytes, act) {STRATA_T_##T, elems, bytes},
static const strata_format_info FORMATS[] = {STRATA_QUANT_TYPES(FORMAT_ROW)};
#undef FORMAT_ROW

const strata_format_info *strata_format_find(int type) {
    for (size_t i = 0; i < sizeof(FORMATS) / sizeof(FORMATS[0]); i++)
        if (FORMATS[i].type == type) return &FORMATS[i];
    return NULL;
}
