/* y = x W^T with W stored as bfloat16, x rounded to bfloat16, each product exact and the sums in float32: an
   opt-in accuracy mode (the `c-bf16` matmul) for CPUs with bfloat16 dot products. Two variants, one per build:
   AMX tiles (TDPBF16PS, 16 x 16 outputs a step) where the CPU has them, built with -DBF16_AMX; else AVX512-BF16
   (VDPBF16PS, 16 outputs a step). A row's outputs never depend on the other rows: every output adds its products
   over k in the same order, 32 at a time, however many rows are multiplied, so a request batched with others
   gets the bits it gets alone. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "panels.h"
#ifdef BF16_AMX
#include "amx.h"
#endif

#define PANEL 16  /* outputs per panel */
#define KSTEP 32  /* k per step: 16 pairs, a tile's row of 64 bytes */

/* The weight W [N, K] as panels [ceil(N / PANEL)][Kp / 2][PANEL][2] of bfloat16, Kp = K rounded up to KSTEP (the
   pad is zeros): panel p, pair j holds W[16 p + c, 2 j] and W[16 p + c, 2 j + 1] for its 16 outputs c. One pair row
   is one 64-byte vector for VDPBF16PS, and 16 of them one tile for TDPBF16PS ("VNNI layout"). */
static inline int64_t padded_k(int64_t K) { return (K + KSTEP - 1) / KSTEP * KSTEP; }

/* xb [rows, Kp] = x [M, K] rounded to bfloat16 (to nearest, ties to even), zeros past K and past M. */
static void to_bf16(const float *x, int64_t M, int64_t K, int64_t rows, uint16_t *xb, int threads) {
    const int64_t Kp = padded_k(K);
    #pragma omp parallel for num_threads(M * K >= 65536 ? threads : 1) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        uint16_t *out = xb + i * Kp;
        const int64_t filled = i < M ? K : 0;
        for (int64_t k = 0; k < filled; k += 16) {
            const __mmask16 live = K - k >= 16 ? 0xffff : (__mmask16)((1u << (K - k)) - 1);
            const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(live, x + i * K + k));
            _mm256_mask_storeu_epi16(out + k, live, (__m256i)h);
        }
        memset(out + filled, 0, sizeof(uint16_t) * (Kp - filled));
    }
}

#ifdef BF16_AMX
/* Linux hands a process the AMX registers' state only when asked (amx.h): 0 once it has them, -1 if it refuses. */
int matmul_bf16_init(void) { return amx_request(); }

/* Tiles 0-3: sums C[r][c] (16 x 16 floats); 4-5: activations A[r] (16 rows x 32 bfloat16); 6-7: weights B[c]
   (16 pairs x 16 outputs x 2); amx.h's configure_tiles gives each 16 rows of 64 bytes. */

/* Copy the first `rows` x `cols` floats of a [16, 16] block to y (row stride ldy). */
static void copy_block(const float *block, int rows, int cols, float *y, int64_t ldy) {
    for (int i = 0; i < rows; i++) memcpy(y + i * ldy, block + i * PANEL, sizeof(float) * cols);
}

/* Write sums tile T (rows r0.., outputs c0..) to y: straight when the block is whole, else through a buffer. */
#define STORE(T, y, ldy, rows, cols) do {                                              \
    if ((rows) == 16 && (cols) == PANEL) _tile_stored(T, y, (ldy) * sizeof(float));      \
    else { float block[16 * PANEL]; _tile_stored(T, block, PANEL * sizeof(float));       \
           copy_block(block, rows, cols, y, ldy); }                                      \
} while (0)

/* y for 16 or 32 rows of xb (two_rows) by one or two panels (two_panels): the products of every step of 32 k,
   in order, added to 2-4 sums tiles. The tile numbers are constants, so each shape is spelled out. */
static void tile_block(const uint16_t *xb, int64_t Kp, const uint16_t *a, const uint16_t *b, int two_rows,
                       int two_panels, float *y, int64_t ldy, int rows0, int rows1, int cols0, int cols1) {
    const size_t x_stride = Kp * sizeof(uint16_t), w_stride = PANEL * 2 * sizeof(uint16_t);
    const uint16_t *x1 = xb + 16 * Kp;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    if (two_rows && two_panels)
        for (int64_t k = 0; k < Kp; k += KSTEP) {
            _tile_loadd(4, xb + k, x_stride); _tile_loadd(5, x1 + k, x_stride);
            _tile_loadd(6, a + k * PANEL, w_stride); _tile_loadd(7, b + k * PANEL, w_stride);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
    else if (two_rows)
        for (int64_t k = 0; k < Kp; k += KSTEP) {
            _tile_loadd(4, xb + k, x_stride); _tile_loadd(5, x1 + k, x_stride); _tile_loadd(6, a + k * PANEL, w_stride);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(2, 5, 6);
        }
    else if (two_panels)
        for (int64_t k = 0; k < Kp; k += KSTEP) {
            _tile_loadd(4, xb + k, x_stride); _tile_loadd(6, a + k * PANEL, w_stride); _tile_loadd(7, b + k * PANEL, w_stride);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        }
    else
        for (int64_t k = 0; k < Kp; k += KSTEP) {
            _tile_loadd(4, xb + k, x_stride); _tile_loadd(6, a + k * PANEL, w_stride);
            _tile_dpbf16ps(0, 4, 6);
        }
    STORE(0, y, ldy, rows0, cols0);
    if (two_panels) STORE(1, y + PANEL, ldy, rows0, cols1);
    if (two_rows) STORE(2, y + 16 * ldy, ldy, rows1, cols0);
    if (two_rows && two_panels) STORE(3, y + 16 * ldy + PANEL, ldy, rows1, cols1);
}

/* Each thread takes pairs of panels and runs every row block past them (the pair's weights stay in cache while
   the rows stream by); rows go 32 at a time, the last 16 (or fewer, as zeros) alone. */
static void multiply(const uint16_t *xb, int64_t M, int64_t Kp, const uint16_t *panels, int64_t N, float *y,
                     int threads) {
    const int64_t count = (N + PANEL - 1) / PANEL, pairs = (count + 1) / 2;
    #pragma omp parallel num_threads(threads)
    {
        configure_tiles();
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < pairs; q++) {
            const int64_t p = 2 * q;
            const int two_panels = p + 1 < count, cols0 = panel_outputs(N, p), cols1 = panel_outputs(N, p + 1);
            const uint16_t *a = panels + p * Kp * PANEL, *b = a + Kp * PANEL;
            for (int64_t m0 = 0; m0 < M; m0 += 32) {
                const int rows0 = block_rows(M, m0), rows1 = block_rows(M, m0 + 16);
                tile_block(xb + m0 * Kp, Kp, a, b, rows1 > 0, two_panels, y + m0 * N + p * PANEL, N, rows0, rows1,
                           cols0, cols1);
            }
        }
        _tile_release();
    }
}

const char *matmul_bf16_isa(void) { return "AMX"; }
#else
int matmul_bf16_init(void) { return 0; }


/* y[i, 0:cols0] and y[i, PANEL:PANEL + cols1] for rows i < R of xb from panels a and b (b = NULL: a alone): for
   each pair of k, every row's two bfloat16 broadcast against the pair row of each panel. */
#define TILE_BF16(R)                                                                                         \
static void tile_bf16_##R(const uint16_t *xb, int64_t Kp, const uint16_t *a, const uint16_t *b, float *y,      \
                          int64_t ldy, int cols0, int cols1) {                                                \
    __m512 acc[R][2];                                                                                          \
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();                                  \
    const uint16_t *bb = b ? b : a;  /* a alone: b's sums are computed and never written */                  \
    for (int64_t j = 0; j < Kp / 2; j++) {                                                                    \
        __builtin_prefetch(a + (2 * Kp + 2 * j) * PANEL);  /* the same pair of the next pair of panels */     \
        __builtin_prefetch(bb + (2 * Kp + 2 * j) * PANEL);                                                    \
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(a + 2 * j * PANEL);                                 \
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(bb + 2 * j * PANEL);                                 \
        for (int i = 0; i < R; i++) {                                                                         \
            int32_t pair;                                                                                      \
            memcpy(&pair, xb + i * Kp + 2 * j, sizeof pair);                                                  \
            const __m512bh v = (__m512bh)_mm512_set1_epi32(pair);                                             \
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], v, w0);                                                   \
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], v, w1);                                                   \
        }                                                                                                      \
    }                                                                                                          \
    for (int i = 0; i < R; i++) {                                                                             \
        float block[2 * PANEL];                                                                                \
        _mm512_storeu_ps(block, acc[i][0]); _mm512_storeu_ps(block + PANEL, acc[i][1]);                      \
        memcpy(y + i * ldy, block, sizeof(float) * cols0);                                                    \
        memcpy(y + i * ldy + PANEL, block + PANEL, sizeof(float) * cols1);                                    \
    }                                                                                                          \
}
TILE_BF16(1) TILE_BF16(2) TILE_BF16(4) TILE_BF16(8) TILE_BF16(12)

static void multiply(const uint16_t *xb, int64_t M, int64_t Kp, const uint16_t *panels, int64_t N, float *y,
                     int threads) {
    const int64_t count = (N + PANEL - 1) / PANEL, pairs = (count + 1) / 2;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t q = 0; q < pairs; q++) {
        const int64_t p = 2 * q;
        const int cols0 = panel_outputs(N, p), cols1 = panel_outputs(N, p + 1);
        const uint16_t *a = panels + p * Kp * PANEL, *b = cols1 ? a + Kp * PANEL : NULL;
        for (int64_t i = 0; i < M;) {
            const int64_t left = M - i;
            const int r = left >= 12 ? 12 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
            const uint16_t *xi = xb + i * Kp;
            float *yi = y + i * N + p * PANEL;
            switch (r) {
                case 12: tile_bf16_12(xi, Kp, a, b, yi, N, cols0, cols1); break;
                case 8: tile_bf16_8(xi, Kp, a, b, yi, N, cols0, cols1); break;
                case 4: tile_bf16_4(xi, Kp, a, b, yi, N, cols0, cols1); break;
                case 2: tile_bf16_2(xi, Kp, a, b, yi, N, cols0, cols1); break;
                default: tile_bf16_1(xi, Kp, a, b, yi, N, cols0, cols1); break;
            }
            i += r;
        }
    }
}

const char *matmul_bf16_isa(void) { return "AVX512-BF16"; }
#endif

/* y [M, N] = x [M, K] times the transpose of the weight [N, K] held as bfloat16 panels (above). The signature of
   matmul_f16, so that a decoder layer (decoder_layer.c) can be handed either. */
void matmul_bf16(const float *x, int64_t M, int64_t K, const uint16_t *panels, int64_t N, float *y, int threads) {
    if (M == 0) return;
    const int64_t Kp = padded_k(K), rows = (M + 15) / 16 * 16;  /* whole tiles of rows: the pad is zeros */
    uint16_t *xb = malloc(sizeof(uint16_t) * rows * Kp);
    if (!xb) {  /* a few MB at most: without them no product can be given, and a wrong one must not be */
        fprintf(stderr, "helios matmul_bf16: no memory for %lld bytes of activations\n", (long long)(rows * Kp * 2));
        abort();
    }
    to_bf16(x, M, K, rows, xb, threads);
    multiply(xb, M, Kp, panels, N, y, threads);
    free(xb);
}
