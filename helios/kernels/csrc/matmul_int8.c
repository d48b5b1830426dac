/* y = x W^T with W quantized at load to int8, one scale per output row of W, and each row of x quantized to int8 on
   the fly with one scale of its own: the `c-int8` matmul, per-channel int8 weights with dynamic per-token int8
   activations (the scheme of vLLM's int8 W8A8 checkpoints). A row's scale is max|x| / 127 and its values
   x * (127 / max|x|) rounded to nearest, ties to even. Every product is an integer; each output's K products are
   summed exactly in int32 and scaled once, y = sum * (row scale * output scale) in float32 (exact while
   K * 127 * 127 fits int32: K < 133,000; the VNNI variant's sums of x + 128 may wrap past that, and its correction
   wraps alike). Variants, one per build: AMX tiles (TDPBSSD, 16 x 16 outputs a step, -DINT8_AMX), AVX512-VNNI
   (VPDPBUSD on x + 128, less 128 times the output's weight sum, -DINT8_VNNI), and portable C (built for AVX2 or for
   any CPU). An integer sum is the same in any order, so every variant gives the same bits, and a row's outputs never
   depend on the rows beside it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(INT8_AMX) || defined(INT8_VNNI)
#include <immintrin.h>
#endif

#include "kernels.h"
#include "panels.h"
#ifdef INT8_AMX
#include "amx.h"
#endif

#define PANEL 16  /* outputs per panel */
#define KSTEP 64  /* k per step: 16 quads, a tile's row of 64 bytes */

/* The packed weight, one buffer of bytes (int8_packed in Python writes it):
     panels [ceil(N / PANEL)][Kp / 4][PANEL][4] int8, Kp = K rounded up to KSTEP (pads are zeros): quad j of panel p
       holds W[16 p + c, 4 j .. 4 j + 3] for its 16 outputs c. A quad row is one 64-byte vector for VPDPBUSD, and 16
       of them one tile for TDPBSSD ("VNNI layout");
     then scales [ceil(N / PANEL) * PANEL] float32: output n's weights are its int8 values times scales[n];
     then sums [ceil(N / PANEL) * PANEL] int32: output n's int8 values summed (the VNNI variant's offset). */
static inline int64_t padded_k(int64_t K) { return (K + KSTEP - 1) / KSTEP * KSTEP; }

struct packed { const int8_t *panels; const float *scales; const int32_t *sums; };

static struct packed unpack(const uint8_t *bytes, int64_t N, int64_t Kp) {
    const int64_t outputs = (N + PANEL - 1) / PANEL * PANEL;
    const float *scales = (const float *)(bytes + outputs * Kp);
    return (struct packed){(const int8_t *)bytes, scales, (const int32_t *)(scales + outputs)};
}

/* xq [rows, Kp] int8 and xs [rows] float32 = x [M, K] quantized per row (above); zeros past K and past M. A row of
   zeros has scale 0; a row holding a NaN or an infinity has values 0 and scale NaN, so its outputs are NaN. */
static void quantize_rows_int8(const float *x, int64_t M, int64_t K, int64_t rows, int8_t *xq, float *xs, int threads) {
    const int64_t Kp = padded_k(K);
    #pragma omp parallel for num_threads(M * K >= 65536 ? threads : 1) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        int8_t *q = xq + i * Kp;
        const float *v = x + i * K;
        memset(q, 0, Kp);
        xs[i] = 0.f;
        if (i >= M) continue;
        float amax = 0.f;
        int finite = 1;
        int64_t k = 0;
#ifdef __AVX512F__
        __m512 m = _mm512_setzero_ps();
        __mmask16 wild = 0;  /* lanes that met a NaN or an infinity: |v| not below infinity */
        for (; k + 16 <= K; k += 16) {
            const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(v + k));
            wild |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ);
            m = _mm512_max_ps(m, a);
        }
        amax = _mm512_reduce_max_ps(m);
        finite = !wild;
#endif
        for (; k < K; k++) {
            finite &= isfinite(v[k]) != 0;
            amax = fmaxf(amax, fabsf(v[k]));
        }
        if (!finite) { xs[i] = NAN; continue; }
        if (amax == 0.f) continue;
        const float inv = 127.f / amax;
        k = 0;
#ifdef __AVX512F__
        for (; k + 16 <= K; k += 16)  /* the default rounding, to nearest even, as nearbyintf below */
            _mm_storeu_si128((__m128i *)(q + k), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(
                _mm512_loadu_ps(v + k), _mm512_set1_ps(inv)))));
#endif
        for (; k < K; k++) q[k] = (int8_t)nearbyintf(v[k] * inv);
        xs[i] = amax / 127.f;
    }
}

/* y[i, c] for rows i < rows and outputs c < cols of one panel, from its int32 sums (row stride PANEL). */
static void scale_block(const int32_t *sums, const float *xs, const float *ws, int rows, int cols, float *y,
                        int64_t ldy) {
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < cols; c++) y[i * ldy + c] = (float)sums[i * PANEL + c] * (xs[i] * ws[c]);
}

#ifdef INT8_AMX
/* Linux hands a process the AMX registers' state only when asked (amx.h): 0 once it has them, -1 if it refuses. */
int matmul_int8_init(void) { return amx_request(); }

/* Tiles 0-3: int32 sums (16 rows x 16 outputs); 4-5: activations (16 rows x 64 int8); 6-7: weights (16 quads x 16
   outputs x 4). Like matmul_bf16's tile_block, with 64 k a step and the sums scaled on the way out. */
#define STORE_SCALED(T, y, ldy, xs, ws, rows, cols) do {                                                 \
    int32_t block[16 * PANEL]; _tile_stored(T, block, PANEL * sizeof(int32_t));                          \
    scale_block(block, xs, ws, rows, cols, y, ldy);                                                      \
} while (0)

static void tile_block(const int8_t *xq, int64_t Kp, const int8_t *a, const int8_t *b, int two_rows,
                       int two_panels, const float *xs, const float *ws, float *y, int64_t ldy, int rows0, int rows1,
                       int cols0, int cols1) {
    const int8_t *x1 = xq + 16 * Kp;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    if (two_rows && two_panels)
        for (int64_t k = 0; k < Kp; k += KSTEP) {
            _tile_loadd(4, xq + k, Kp); _tile_loadd(5, x1 + k, Kp);
            _tile_loadd(6, a + k * PANEL, 64); _tile_loadd(7, b + k * PANEL, 64);
            _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
        }
    else if (two_rows)
        for (int64_t k = 0; k < Kp; k += KSTEP) {
            _tile_loadd(4, xq + k, Kp); _tile_loadd(5, x1 + k, Kp); _tile_loadd(6, a + k * PANEL, 64);
            _tile_dpbssd(0, 4, 6); _tile_dpbssd(2, 5, 6);
        }
    else if (two_panels)
        for (int64_t k = 0; k < Kp; k += KSTEP) {
            _tile_loadd(4, xq + k, Kp); _tile_loadd(6, a + k * PANEL, 64); _tile_loadd(7, b + k * PANEL, 64);
            _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7);
        }
    else
        for (int64_t k = 0; k < Kp; k += KSTEP) {
            _tile_loadd(4, xq + k, Kp); _tile_loadd(6, a + k * PANEL, 64);
            _tile_dpbssd(0, 4, 6);
        }
    STORE_SCALED(0, y, ldy, xs, ws, rows0, cols0);
    if (two_panels) STORE_SCALED(1, y + PANEL, ldy, xs, ws + PANEL, rows0, cols1);
    if (two_rows) STORE_SCALED(2, y + 16 * ldy, ldy, xs + 16, ws, rows1, cols0);
    if (two_rows && two_panels) STORE_SCALED(3, y + 16 * ldy + PANEL, ldy, xs + 16, ws + PANEL, rows1, cols1);
}

/* Each thread takes pairs of panels and runs every block of 32 rows past them, as matmul_bf16 does. */
static void multiply(const int8_t *xq, const float *xs, int64_t M, int64_t Kp, struct packed w, int64_t N, float *y,
                     int threads) {
    const int64_t count = (N + PANEL - 1) / PANEL, pairs = (count + 1) / 2;
    #pragma omp parallel num_threads(threads)
    {
        configure_tiles();
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < pairs; q++) {
            const int64_t p = 2 * q;
            const int two_panels = p + 1 < count, cols0 = panel_outputs(N, p), cols1 = panel_outputs(N, p + 1);
            const int8_t *a = w.panels + p * Kp * PANEL, *b = a + Kp * PANEL;
            for (int64_t m0 = 0; m0 < M; m0 += 32) {
                const int rows0 = block_rows(M, m0), rows1 = block_rows(M, m0 + 16);
                tile_block(xq + m0 * Kp, Kp, a, b, rows1 > 0, two_panels, xs + m0, w.scales + p * PANEL,
                           y + m0 * N + p * PANEL, N, rows0, rows1, cols0, cols1);
            }
        }
        _tile_release();
    }
}

const char *matmul_int8_isa(void) { return "AMX"; }
#elif defined(INT8_VNNI)
int matmul_int8_init(void) { return 0; }

/* Rows i < R of xq by panels a and b (b = NULL: a alone): for each quad of k, every row's four int8, moved to
   unsigned by adding 128 (a sign-bit flip), broadcast against the quad row of each panel; the 128 added is taken
   back once per output, 128 times its weights' sum. */
#define TILE_VNNI(R)                                                                                         \
static void tile_vnni_##R(const int8_t *xq, int64_t Kp, const int8_t *a, const int8_t *b, const float *xs,     \
                          const float *ws, const int32_t *wsum, float *y, int64_t ldy, int cols0, int cols1) {  \
    __m512i acc[R][2];                                                                                         \
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_si512();                              \
    const int8_t *bb = b ? b : a;  /* a alone: b's sums are computed and never written */                    \
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);                                                 \
    for (int64_t j = 0; j < Kp / 4; j++) {                                                                    \
        const __m512i w0 = _mm512_loadu_si512(a + 4 * j * PANEL), w1 = _mm512_loadu_si512(bb + 4 * j * PANEL); \
        for (int i = 0; i < R; i++) {                                                                         \
            int32_t quad;                                                                                      \
            memcpy(&quad, xq + i * Kp + 4 * j, sizeof quad);                                                  \
            const __m512i v = _mm512_xor_si512(_mm512_set1_epi32(quad), flip);                              \
            acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], v, w0);                                               \
            acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], v, w1);                                               \
        }                                                                                                      \
    }                                                                                                          \
    const __m512i off0 = _mm512_slli_epi32(_mm512_loadu_si512(wsum), 7);                                     \
    const __m512i off1 = b ? _mm512_slli_epi32(_mm512_loadu_si512(wsum + PANEL), 7) : off0;                  \
    for (int i = 0; i < R; i++) {                                                                             \
        int32_t block[2 * PANEL];                                                                              \
        _mm512_storeu_si512(block, _mm512_sub_epi32(acc[i][0], off0));                                       \
        _mm512_storeu_si512(block + PANEL, _mm512_sub_epi32(acc[i][1], off1));                               \
        scale_block(block, xs + i, ws, 1, cols0, y + i * ldy, ldy);                                          \
        scale_block(block + PANEL, xs + i, ws + PANEL, 1, cols1, y + i * ldy + PANEL, ldy);                  \
    }                                                                                                          \
}
TILE_VNNI(1) TILE_VNNI(2) TILE_VNNI(4) TILE_VNNI(8) TILE_VNNI(12)

static void multiply(const int8_t *xq, const float *xs, int64_t M, int64_t Kp, struct packed w, int64_t N, float *y,
                     int threads) {
    const int64_t count = (N + PANEL - 1) / PANEL, pairs = (count + 1) / 2;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t q = 0; q < pairs; q++) {
        const int64_t p = 2 * q;
        const int cols0 = panel_outputs(N, p), cols1 = panel_outputs(N, p + 1);
        const int8_t *a = w.panels + p * Kp * PANEL, *b = cols1 ? a + Kp * PANEL : NULL;
        const float *ws = w.scales + p * PANEL;
        const int32_t *wsum = w.sums + p * PANEL;
        for (int64_t i = 0; i < M;) {
            const int64_t left = M - i;
            const int r = left >= 12 ? 12 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
            const int8_t *xi = xq + i * Kp;
            float *yi = y + i * N + p * PANEL;
            switch (r) {
                case 12: tile_vnni_12(xi, Kp, a, b, xs + i, ws, wsum, yi, N, cols0, cols1); break;
                case 8: tile_vnni_8(xi, Kp, a, b, xs + i, ws, wsum, yi, N, cols0, cols1); break;
                case 4: tile_vnni_4(xi, Kp, a, b, xs + i, ws, wsum, yi, N, cols0, cols1); break;
                case 2: tile_vnni_2(xi, Kp, a, b, xs + i, ws, wsum, yi, N, cols0, cols1); break;
                default: tile_vnni_1(xi, Kp, a, b, xs + i, ws, wsum, yi, N, cols0, cols1); break;
            }
            i += r;
        }
    }
}

const char *matmul_int8_isa(void) { return "AVX512-VNNI"; }
#else
int matmul_int8_init(void) { return 0; }

/* Portable C: each row against one panel at a time, 16 int32 sums, the quad order of the packed layout. */
static void multiply(const int8_t *xq, const float *xs, int64_t M, int64_t Kp, struct packed w, int64_t N, float *y,
                     int threads) {
    const int64_t count = (N + PANEL - 1) / PANEL;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < count; p++) {
        const int cols = panel_outputs(N, p);
        const int8_t *panel = w.panels + p * Kp * PANEL;
        for (int64_t i = 0; i < M; i++) {
            int32_t sums[PANEL] = {0};
            const int8_t *xi = xq + i * Kp;
            for (int64_t j = 0; j < Kp / 4; j++)
                for (int c = 0; c < PANEL; c++)
                    for (int t = 0; t < 4; t++) sums[c] += (int32_t)xi[4 * j + t] * panel[(j * PANEL + c) * 4 + t];
            scale_block(sums, xs + i, w.scales + p * PANEL, 1, cols, y + i * N + p * PANEL, N);
        }
    }
}

const char *matmul_int8_isa(void) {
#ifdef __AVX2__
    return "AVX2";
#else
    return "generic";
#endif
}
#endif

/* y [M, N] = x [M, K] times the transpose of the weight packed as above. The signature of matmul_f16, so that a
   decoder layer (decoder_layer.c) can be handed it. */
void matmul_int8(const float *x, int64_t M, int64_t K, const uint8_t *packed, int64_t N, float *y, int threads) {
    if (M == 0) return;
    const int64_t Kp = padded_k(K), rows = (M + 15) / 16 * 16;  /* whole tiles of rows: the pad is zeros */
    int8_t *xq = malloc(rows * Kp + sizeof(float) * rows);
    if (!xq) {  /* a few MB at most: without them no product can be given, and a wrong one must not be */
        fprintf(stderr, "helios matmul_int8: no memory for %lld bytes of activations\n", (long long)(rows * Kp));
        abort();
    }
    float *xs = (float *)(xq + rows * Kp);  /* Kp is a multiple of 64: the scales are aligned */
    quantize_rows_int8(x, M, K, rows, xq, xs, threads);
    multiply(xq, xs, M, Kp, unpack(packed, N, Kp), N, y, threads);
    free(xq);
}
