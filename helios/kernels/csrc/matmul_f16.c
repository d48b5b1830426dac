/* y = x W^T with W stored as float16 panels and every product and sum in float32. Built once per machine: it
   has no model-shape constants. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "kernels.h"
#include "vectors.h"

#define PANEL 16      /* outputs per panel: two 8-float vectors */
#define ROW_BLOCK 192 /* activation rows per pass over the weights */

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

#ifdef __AVX512F__
/* The AVX-512 variant: one 16-float register holds a whole panel's outputs, and 32 registers leave room for
   R rows of two neighbouring panels at once (2R accumulators), so every x[i, k] read feeds two FMAs. */
typedef float f16v __attribute__((vector_size(64), aligned(4)));

static inline f16v load_half16(const uint16_t *p) { return (f16v)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* y[i, 0:n0] and y[i, PANEL:PANEL + n1] for rows i < R from panels a and b (b = NULL: a alone, n1 = 0). */
#define TILE512(R)                                                                                        \
static void tile512_##R(const float *x, int64_t K, const uint16_t *a, const uint16_t *b, float *y, int64_t ldy, \
                        int n0, int n1) {                                                                 \
    f16v acc[R][2];                                                                                       \
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = (f16v){0};                                        \
    if (b) for (int64_t k = 0; k < K; k++) {                                                              \
        __builtin_prefetch(a + (2 * K + k) * PANEL);  /* the same step of the next pair */                \
        __builtin_prefetch(b + (2 * K + k) * PANEL);                                                      \
        const f16v w0 = load_half16(a + k * PANEL), w1 = load_half16(b + k * PANEL);                      \
        for (int i = 0; i < R; i++) {                                                                     \
            const float v = x[i * K + k];                                                                 \
            acc[i][0] += v * w0;                                                                          \
            acc[i][1] += v * w1;                                                                          \
        }                                                                                                 \
    } else for (int64_t k = 0; k < K; k++) {                                                              \
        const f16v w0 = load_half16(a + k * PANEL);                                                       \
        for (int i = 0; i < R; i++) acc[i][0] += x[i * K + k] * w0;                                       \
    }                                                                                                     \
    for (int i = 0; i < R; i++) {                                                                         \
        if (n0 == PANEL) memcpy(y + i * ldy, &acc[i][0], sizeof acc[i][0]);                               \
        else for (int j = 0; j < n0; j++) y[i * ldy + j] = acc[i][0][j];                                  \
        for (int j = 0; j < n1; j++) y[i * ldy + PANEL + j] = acc[i][1][j];                               \
    }                                                                                                     \
}
TILE512(1) TILE512(2) TILE512(3) TILE512(4) TILE512(6) TILE512(8) TILE512(12)

/* tile512_12 on rows packed step-major (xp[k * 12 + i], pack_rows): one sequential stream of activations in
   place of twelve rows K floats apart, which is what lets a prefill chunk run at the FMA rate. */
static void tile512_packed(const float *xp, int64_t K, const uint16_t *a, const uint16_t *b, float *y, int64_t ldy,
                           int n0, int n1) {
    f16v acc[12][2];
    for (int i = 0; i < 12; i++) acc[i][0] = acc[i][1] = (f16v){0};
    const uint16_t *bb = b ? b : a;                      /* a alone: b's sums are computed and never written */
    for (int64_t k = 0; k < K; k++) {
        __builtin_prefetch(a + (2 * K + k) * PANEL);
        __builtin_prefetch(bb + (2 * K + k) * PANEL);
        const f16v w0 = load_half16(a + k * PANEL), w1 = load_half16(bb + k * PANEL);
        const float *v = xp + k * 12;
        for (int i = 0; i < 12; i++) {
            acc[i][0] += v[i] * w0;
            acc[i][1] += v[i] * w1;
        }
    }
    for (int i = 0; i < 12; i++) {
        if (n0 == PANEL) memcpy(y + i * ldy, &acc[i][0], sizeof acc[i][0]);
        else for (int j = 0; j < n0; j++) y[i * ldy + j] = acc[i][0][j];
        for (int j = 0; j < n1; j++) y[i * ldy + PANEL + j] = acc[i][1][j];
    }
}

/* xp[t][k][i] = x[12 t + i, k]: the first 12 * tiles rows of x, twelve at a time, step-major. */
static void pack_rows(const float *x, int64_t tiles, int64_t K, float *xp, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++)
        for (int i = 0; i < 12; i++)
            for (int64_t k = 0; k < K; k++) xp[(t * K + k) * 12 + i] = x[(t * 12 + i) * K + k];
}

/* Rows [0, rows) of x against panels a and b: twelve at a time from the packed rows xp (NULL: from x), the rest
   in tiles of 8, 6, 4, 3, 2, 1. */
static void panel_pair_rows(const float *x, const float *xp, int64_t rows, int64_t K, const uint16_t *a,
                            const uint16_t *b, float *y, int64_t ldy, int n0, int n1) {
    int64_t i = 0;
    for (; i + 12 <= rows; i += 12)
        if (xp) tile512_packed(xp + i * K, K, a, b, y + i * ldy, ldy, n0, n1);
        else tile512_12(x + i * K, K, a, b, y + i * ldy, ldy, n0, n1);
    while (i < rows) {
        const int64_t left = rows - i;
        const int r = left >= 8 ? 8 : left >= 6 ? 6 : left >= 4 ? 4 : left == 3 ? 3 : left == 2 ? 2 : 1;
        const float *xi = x + i * K;
        float *yi = y + i * ldy;
        switch (r) {
            case 8: tile512_8(xi, K, a, b, yi, ldy, n0, n1); break;
            case 6: tile512_6(xi, K, a, b, yi, ldy, n0, n1); break;
            case 4: tile512_4(xi, K, a, b, yi, ldy, n0, n1); break;
            case 3: tile512_3(xi, K, a, b, yi, ldy, n0, n1); break;
            case 2: tile512_2(xi, K, a, b, yi, ldy, n0, n1); break;
            default: tile512_1(xi, K, a, b, yi, ldy, n0, n1); break;
        }
        i += r;
    }
}

/* As matmul_f16 below, in pairs of panels (the last one alone when their count is odd). */
void matmul_f16(const float *x, int64_t M, int64_t K, const uint16_t *panels, int64_t N, float *y, int threads) {
    const int64_t count = (N + PANEL - 1) / PANEL, pairs = (count + 1) / 2;
    float *xp = M >= 24 ? malloc(sizeof(float) * ROW_BLOCK * K) : NULL;  /* no memory: the unpacked tiles */
    for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
        const int64_t rows = M - m0 < ROW_BLOCK ? M - m0 : ROW_BLOCK;
        if (xp) pack_rows(x + m0 * K, rows / 12, K, xp, threads);
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t q = 0; q < pairs; q++) {
            const int64_t p = 2 * q;
            const int n0 = N - p * PANEL < PANEL ? (int)(N - p * PANEL) : PANEL;
            const int n1 = p + 1 >= count ? 0 : N - (p + 1) * PANEL < PANEL ? (int)(N - (p + 1) * PANEL) : PANEL;
            panel_pair_rows(x + m0 * K, xp, rows, K, panels + p * K * PANEL, n1 ? panels + (p + 1) * K * PANEL : NULL,
                            y + m0 * N + p * PANEL, N, n0, n1);
        }
    }
    free(xp);
}

/* The variant's name, for the start-up line. */
const char *matmul_f16_isa(void) { return "AVX-512"; }
#else
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

const char *matmul_f16_isa(void) {
#if defined(__AVX2__)
    return "AVX2";
#else
    return "generic";
#endif
}
#endif
