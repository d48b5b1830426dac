/* What a kernel on AMX tiles needs before its first tile instruction: the process's permission to use the tile
   registers (Linux grants it only when asked), and the 64 bytes LDTILECFG reads. Included by the matmuls built
   with AMX (matmul_bf16.c, matmul_int8.c). */
#ifndef HELIOS_AMX_H
#define HELIOS_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* 0 once Linux has given this process the AMX registers' state, -1 if it refuses. */
static inline int amx_request(void) {
    unsigned long features = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) return -1;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &features)) return -1;
    return features & (1ul << XFEATURE_XTILEDATA) ? 0 : -1;
}

struct tile_config {  /* the 64 bytes LDTILECFG reads */
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};

/* Tiles 0-7, each 16 rows of 64 bytes: the layout both matmuls use (0-3 sums, 4-5 activations, 6-7 weights). */
static inline void configure_tiles(void) {
    struct tile_config config = {.palette = 1};
    for (int t = 0; t < 8; t++) config.bytes_per_row[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
}

#endif
