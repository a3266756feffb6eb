/*
 * Tables with a row per quant type: arrays of structs whose first member is `int type` (a
 * STRATA_T_* id), e.g. {STRATA_T_Q4_K, scalar kernel, AVX2 kernel}. A type's row is found by a
 * scan: the tables hold a few dozen rows and are read once per call, not per block.
 */
#ifndef STRATA_TYPE_ROWS_H
#define STRATA_TYPE_ROWS_H
#include <stddef.h>

/* The row of `rows` ([n_rows], row_bytes apart) whose leading int is `type`, or NULL. */
static inline const void *strata_type_row_in(const void *rows, size_t n_rows, size_t row_bytes, int type) {
    for (size_t i = 0; i < n_rows; i++) {
        const char *row = (const char *)rows + i * row_bytes;
        if (*(const int *)row == type) return row;
    }
    return NULL;
}

/* The row of the array `table` (not a pointer: its length is taken from sizeof) for `type`, or NULL,
 * as a pointer to the table's row type. */
#define STRATA_TYPE_ROW(table, type)                                                                    \
    ((const __typeof__((table)[0]) *)strata_type_row_in((table), sizeof(table) / sizeof((table)[0]), \
                                                        sizeof((table)[0]), (type)))

#endif
