/* y = x W^T with W kept in GGUF's Q8_0 blocks, as llama.cpp multiplies them: each activation row is quantized to
   int8 per block of 32 (scale max|x| / 127, rounded to nearest, ties away from zero), and each block's product is an
   integer dot product of 32 int8 pairs, scaled by the weight's float16 scale times the activation's float32 scale.
   Three variants, one per build: AVX512-VNNI (VPDPBUSD, two blocks a step, built with -DQ8_VNNI), AVX2 (VPMADDUBSW)
   and portable C. A row's outputs never depend on the other rows: each (row, output) pair adds its blocks in the
   same order with the same instructions whether the row is multiplied alone or among others, so a request batched
   with others gets the bits it gets alone. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__) || defined(Q8_VNNI)
#include <immintrin.h>
#endif

#include "kernels.h"
#include "quantize.h"

#define QK 32                 /* values per block */
#define BLOCK_BYTES (2 + QK)  /* a Q8_0 block: float16 scale d, then 32 int8 values */

/* A float16 as a float32, exactly (subnormals too), without F16C. */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float value;
    if (exponent == 0) value = ldexpf((float)mantissa, -24);                                   /* zero, subnormal */
    else if (exponent == 31) { uint32_t bits = 0x7f800000 | (mantissa << 13); memcpy(&value, &bits, 4); }  /* inf, nan */
    else { uint32_t bits = ((exponent + 112) << 23) | (mantissa << 13); memcpy(&value, &bits, 4); }
    uint32_t bits;
    memcpy(&bits, &value, 4);
    bits |= sign;
    memcpy(&value, &bits, 4);
    return value;
}

static inline float block_scale(const uint8_t *block) {  /* F16C's conversion where the build has it: the same value */
    uint16_t h;
    memcpy(&h, block, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return half_to_float(h);
#endif
}

/* xq [M, nb * 32] int8 and xd [M, nb] float32 = x [M, K] quantized per block (zeros past K). The same bytes in
   every variant (quantize.h's AVX-512 blocks, or this loop), so every variant multiplies the same integers. */
void quantize_rows_q8(const float *x, int64_t M, int64_t K, int8_t *xq, float *xd, int threads) {
    const int64_t nb = (K + QK - 1) / QK;
    #pragma omp parallel for num_threads(M * K >= 65536 ? threads : 1) schedule(static)
    for (int64_t i = 0; i < M; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + i * K + b * QK;
            const int n = K - b * QK < QK ? (int)(K - b * QK) : QK;
#if defined(__AVX512F__)
            if (n == QK) {
                xd[i * nb + b] = quantize_block_512(v, QK, 0, xq + i * nb * QK + b * QK, NULL);
                continue;
            }
#endif
            float amax = 0.f;
            for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(v[j]));
            const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
            int8_t *q = xq + i * nb * QK + b * QK;
            for (int j = 0; j < QK; j++) q[j] = j < n ? (int8_t)roundf(v[j] * id) : 0;
            xd[i * nb + b] = d;
        }
}

#if defined(Q8_VNNI)
#define SCALE_LANES 8  /* each block scale of x, eight times: the lanes of one block in a 512-bit pair */
/* Block b alone (the last of an odd count), in the low 8 lanes; the high 8 are zero. */
static inline __m512 last_products(const uint8_t *w, const int8_t *x) {
    const __m256i wq = _mm256_loadu_si256((const __m256i *)(w + 2)), xv = _mm256_loadu_si256((const __m256i *)x);
    const __m256i xs = _mm256_mask_sub_epi8(xv, _mm256_movepi8_mask(wq), _mm256_setzero_si256(), xv);
    const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq), xs);
    return _mm512_cvtepi32_ps(_mm512_zextsi256_si512(sums));
}

/* y[r][o] for R rows of xq against O consecutive weight rows from w: per pair of blocks, R x O products, each scaled
   and added to its own 16 float sums; the 16 lanes are added at the end, in _mm512_reduce_add_ps's fixed order. Every
   (row, output) runs the same instructions whatever R and O are. xs holds each row's block scales eight times over
   (SCALE_LANES), so a pair's 16 lanes of scales are one load. */
#define ROWS_Q8(R, O)                                                                                           \
static void rows_q8_##R##_##O(const int8_t *xq, const float *xs, int64_t nb, const uint8_t *w, float *y, int64_t ldy) { \
    __m512 acc[R][O];                                                                                          \
    for (int r = 0; r < R; r++) for (int o = 0; o < O; o++) acc[r][o] = _mm512_setzero_ps();                   \
    int64_t b = 0;                                                                                             \
    for (; b + 1 < nb; b += 2) {                                                                               \
        __m512 dw[O]; __m512i wabs[O]; __mmask64 negative[O];                                                  \
        for (int o = 0; o < O; o++) {                                                                          \
            const uint8_t *wb = w + (o * nb + b) * BLOCK_BYTES;                                                \
            dw[o] = _mm512_insertf32x8(_mm512_set1_ps(block_scale(wb)), _mm256_set1_ps(block_scale(wb + BLOCK_BYTES)), 1); \
            const __m512i wq = _mm512_inserti64x4(                                                             \
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(wb + 2))),                         \
                _mm256_loadu_si256((const __m256i *)(wb + BLOCK_BYTES + 2)), 1);                               \
            wabs[o] = _mm512_abs_epi8(wq);                                                                     \
            negative[o] = _mm512_movepi8_mask(wq);                                                             \
        }                                                                                                      \
        for (int r = 0; r < R; r++) {                                                                          \
            const __m512i xv = _mm512_loadu_si512(xq + r * nb * QK + b * QK);                                  \
            const __m512 dx = _mm512_loadu_ps(xs + (r * nb + b) * SCALE_LANES);                                \
            for (int o = 0; o < O; o++) {                                                                      \
                const __m512i xsigned = _mm512_mask_sub_epi8(xv, negative[o], _mm512_setzero_si512(), xv);     \
                const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wabs[o], xsigned)); \
                acc[r][o] = _mm512_fmadd_ps(_mm512_mul_ps(dw[o], dx), dot, acc[r][o]);                          \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    if (b < nb)                                                                                                \
        for (int o = 0; o < O; o++) {                                                                          \
            const uint8_t *wb = w + (o * nb + b) * BLOCK_BYTES;                                                \
            const float d0 = block_scale(wb);                                                                  \
            for (int r = 0; r < R; r++)                                                                        \
                acc[r][o] = _mm512_fmadd_ps(_mm512_set1_ps(d0 * xs[(r * nb + b) * SCALE_LANES]),               \
                                            last_products(wb, xq + r * nb * QK + b * QK), acc[r][o]);          \
        }                                                                                                      \
    for (int r = 0; r < R; r++) for (int o = 0; o < O; o++) y[r * ldy + o] = _mm512_reduce_add_ps(acc[r][o]);  \
}
ROWS_Q8(1, 1) ROWS_Q8(4, 1) ROWS_Q8(8, 1) ROWS_Q8(1, 2) ROWS_Q8(4, 2) ROWS_Q8(8, 2)
/* Outputs a step: two where each row's load and scales serve both (many rows: the arithmetic is the cost), one
   where the weights' reading is (few rows): two weight rows read in turns come from memory at a third of the rate
   of one. A 151,936 x 2,048 product (330 MB) on Zen 4, 2 threads: at 1 row 20.7 ms in pairs, 6.2 one by one; at 4
   rows 25.3 and 12.3; at 8 rows 36.2 both; at 16 rows 54.6 and 65.8. */
#define PAIRED_ROWS 8
#define OUTPUTS(M) ((M) >= PAIRED_ROWS ? 2 : 1)

const char *matmul_q8_0_isa(void) { return "AVX512-VNNI"; }
#elif defined(__AVX2__)
#define SCALE_LANES 1
/* 8 int32 lanes of block b's products: |w| as unsigned bytes, w's sign moved onto x, pairs by VPMADDUBSW (at most
   2 x 128 x 127, no saturation), then pairs of pairs by VPMADDWD. */
static inline __m256 block_products(const uint8_t *w, const int8_t *x) {
    const __m256i wq = _mm256_loadu_si256((const __m256i *)(w + 2)), xv = _mm256_loadu_si256((const __m256i *)x);
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xv, wq));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static inline float sum8(__m256 v) {  /* the 8 lanes, in a fixed order */
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

#define ROWS_Q8(R)                                                                                              \
static void rows_q8_##R##_1(const int8_t *xq, const float *xd, int64_t nb, const uint8_t *w, float *y, int64_t ldy) { \
    __m256 acc[R];                                                                                             \
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                                  \
    for (int64_t b = 0; b < nb; b++) {                                                                         \
        const uint8_t *wb = w + b * BLOCK_BYTES;                                                               \
        const float dw = block_scale(wb);                                                                      \
        for (int r = 0; r < R; r++)                                                                            \
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[r * nb + b]), block_products(wb, xq + r * nb * QK + b * QK), acc[r]); \
    }                                                                                                          \
    for (int r = 0; r < R; r++) y[r * ldy] = sum8(acc[r]);                                                     \
}
ROWS_Q8(1) ROWS_Q8(4) ROWS_Q8(8)
#define OUTPUTS(M) 1

const char *matmul_q8_0_isa(void) { return "AVX2"; }
#else
#define SCALE_LANES 1
/* Portable C: each block's integer dot product, scaled and added in block order. */
#define ROWS_Q8(R)                                                                                              \
static void rows_q8_##R##_1(const int8_t *xq, const float *xd, int64_t nb, const uint8_t *w, float *y, int64_t ldy) { \
    for (int r = 0; r < R; r++) {                                                                              \
        float acc = 0.f;                                                                                       \
        for (int64_t b = 0; b < nb; b++) {                                                                     \
            const uint8_t *wb = w + b * BLOCK_BYTES;                                                           \
            const int8_t *wq = (const int8_t *)(wb + 2), *xb = xq + r * nb * QK + b * QK;                     \
            int32_t dot = 0;                                                                                   \
            for (int j = 0; j < QK; j++) dot += (int32_t)wq[j] * xb[j];                                        \
            acc += block_scale(wb) * xd[r * nb + b] * (float)dot;                                              \
        }                                                                                                      \
        y[r * ldy] = acc;                                                                                      \
    }                                                                                                          \
}
ROWS_Q8(1) ROWS_Q8(4) ROWS_Q8(8)
#define OUTPUTS(M) 1

const char *matmul_q8_0_isa(void) { return "generic"; }
#endif

/* y [M, N] = x [M, K] times the transpose of W [N, K] in Q8_0 blocks (N rows of ceil(K / 32) blocks of 34 bytes,
   as a GGUF file holds them). Threads split the outputs (two at a time in the AVX512-VNNI variant from PAIRED_ROWS
   rows on); each runs its rows eight at a time, then four, then one, with the same per-row instructions. The
   signature of matmul_f16, so that a decoder layer (decoder_layer.c) can be handed it. */
#define RUN_ROWS(O) do {                                                                                           \
    for (; i + 8 <= M; i += 8) rows_q8_8_##O(xq + i * nb * QK, xs + i * nb * SCALE_LANES, nb, wn, y + i * N + n, N); \
    for (; i + 4 <= M; i += 4) rows_q8_4_##O(xq + i * nb * QK, xs + i * nb * SCALE_LANES, nb, wn, y + i * N + n, N); \
    for (; i < M; i++) rows_q8_1_##O(xq + i * nb * QK, xs + i * nb * SCALE_LANES, nb, wn, y + i * N + n, N);          \
} while (0)

void matmul_q8_0(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    const int64_t nb = (K + QK - 1) / QK;
    int8_t *xq = malloc((size_t)(M * nb * QK) + 64);
    float *xd = malloc(sizeof(float) * (M * nb + 1)), *xs = malloc(sizeof(float) * (M * nb * SCALE_LANES + 1));
    if (!xq || !xd || !xs) {  /* a few MB at most: without them no product can be given, and a wrong one must not be */
        fprintf(stderr, "helios matmul_q8_0: no memory for %lld bytes of activations\n", (long long)(M * nb * (QK + 36)));
        abort();
    }
    quantize_rows_q8(x, M, K, xq, xd, threads);
    for (int64_t i = 0; i < M * nb; i++)
        for (int l = 0; l < SCALE_LANES; l++) xs[i * SCALE_LANES + l] = xd[i];
    const int64_t outputs = OUTPUTS(M);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < (N + outputs - 1) / outputs; p++) {
        const int64_t n = outputs * p;
        const uint8_t *wn = w + n * nb * BLOCK_BYTES;
        int64_t i = 0;
#if defined(Q8_VNNI)
        if (outputs == 2 && n + 1 < N) { RUN_ROWS(2); continue; }
#endif
        RUN_ROWS(1);
    }
    free(xq);
    free(xd);
    free(xs);
}
