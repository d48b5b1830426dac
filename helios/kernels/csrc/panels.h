/* The matmuls that keep weights in panels of 16 outputs (matmul_bf16.c, matmul_int8.c) and multiply blocks of 16 rows:
   how many of a panel's outputs, and of a block's rows, exist. */
#ifndef HELIOS_PANELS_H
#define HELIOS_PANELS_H

#include <stdint.h>

/* Outputs of panel p that exist among N: 16, fewer in the last panel, 0 past it. */
static inline int panel_outputs(int64_t N, int64_t p) {
    const int64_t left = N - p * 16;
    return left <= 0 ? 0 : left < 16 ? (int)left : 16;
}

/* Rows of the block of 16 from row r that exist among M: 16, fewer in the last block, 0 past it. */
static inline int block_rows(int64_t M, int64_t r) { return panel_outputs(M, r / 16); }

#endif
