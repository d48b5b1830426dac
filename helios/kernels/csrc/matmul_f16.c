/* y = x W^T with W stored as float16 panels and every product and sum in float32. Built once per machine: it
   has no model-shape constants. */
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "kernels.h"
#include "vectors.h"

#define PANEL 16      /* outputs per panel: two 8-float vectors */
#define ROW_BLOCK 192 /* activation rows per pass over the weights */

/* 8 float16 weights as float32 */
static inline f8 load_half8(const uint16_t *p) {
#ifdef __F16C__
    return (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    typedef _Float16 h8 __attribute__((vector_size(16), aligned(2)));
    h8 h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, f8);
#endif
}

/* y[i, 0:n] = sum over k of x[i, k] panel[k, 0:n] for rows i < R, n <= PANEL outputs of one panel; the
   same step of the next panel is prefetched. */
#define TILE(R)                                                                                          \
static void tile_##R(const float *x, int64_t K, const uint16_t *panel, float *y, int64_t ldy, int n) {  \
    f8 acc[R][2];                                                                                        \
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = (f8){0};                                         \
    for (int64_t k = 0; k < K; k++) {                                                                    \
        __builtin_prefetch(panel + (K + k) * PANEL);                                                     \
        const f8 w0 = load_half8(panel + k * PANEL), w1 = load_half8(panel + k * PANEL + 8);             \
        for (int i = 0; i < R; i++) {                                                                    \
            const float a = x[i * K + k];                                                                \
            acc[i][0] += a * w0;                                                                         \
            acc[i][1] += a * w1;                                                                         \
        }                                                                                                \
    }                                                                                                    \
    for (int i = 0; i < R; i++)                                                                          \
        if (n == PANEL) memcpy(y + i * ldy, acc[i], sizeof acc[i]);                                      \
        else for (int j = 0; j < n; j++) y[i * ldy + j] = acc[i][j / 8][j % 8];                          \
}
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)

/* Rows [0, rows) of x against one panel, six at a time. */
static void panel_rows(const float *x, int64_t rows, int64_t K, const uint16_t *panel, float *y, int64_t ldy, int n) {
    int64_t i = 0;
    for (; i + 6 <= rows; i += 6) tile_6(x + i * K, K, panel, y + i * ldy, ldy, n);
    const float *xi = x + i * K;
    float *yi = y + i * ldy;
    switch (rows - i) {
        case 5: tile_5(xi, K, panel, yi, ldy, n); break;
        case 4: tile_4(xi, K, panel, yi, ldy, n); break;
        case 3: tile_3(xi, K, panel, yi, ldy, n); break;
        case 2: tile_2(xi, K, panel, yi, ldy, n); break;
        case 1: tile_1(xi, K, panel, yi, ldy, n); break;
    }
}

/* y [M, N] = x [M, K] times the transpose of the weight [N, K], stored as panels [ceil(N / PANEL), K, PANEL] of
   float16 (rows past N are zero). */
void matmul_f16(const float *x, int64_t M, int64_t K, const uint16_t *panels, int64_t N, float *y, int threads) {
    const int64_t count = (N + PANEL - 1) / PANEL;
    for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
        const int64_t rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t p = 0; p < count; p++) {
            const int n = N - p * PANEL < PANEL ? (int)(N - p * PANEL) : PANEL;
            panel_rows(x + m0 * K, rows, K, panels + p * K * PANEL, y + m0 * N + p * PANEL, N, n);
        }
    }
}
