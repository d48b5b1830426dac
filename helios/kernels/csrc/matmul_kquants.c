/* y = x W^T with W kept in GGUF's Q4_K, Q5_K, Q6_K, Q5_0, Q4_0 or Q4_1 blocks, as llama.cpp multiplies them: each
   activation row is quantized to int8 (scale max|x| / 127, rounded to nearest, ties away from zero) per block of the
   weight's type (256 for the K types, with the sum of every 16 values beside, as llama.cpp's Q8_K; 32 for the others),
   and each block's product is a sum of integer dot products of unsigned weight codes (0..15, 0..31 or 0..63) and
   signed activations, each sub-block's scaled by its integer sub-block scale; the codes' offsets and mins come in
   through the activation sums. A block's integer products are exact in every variant. The vector variants then keep
   8 (or 16) float lanes per row across the weight row: each super-block's int32 lanes are scaled by its float scales
   into them, and they are added once, at the end, in a fixed order; portable C scales each block's whole sum.
   Variants, one per build: AVX512-VNNI (VPMADDUBSW then VPDPWSSD, built with -DQ8_VNNI; the K types in 512-bit steps),
   AVX2 (VPMADDUBSW then VPMADDWD) and portable C. A weight block is unpacked once for up to 8 rows, and each row's
   sums run the same instructions whatever the other rows are, so a request batched with others gets the bits it gets
   alone. */
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

#define QK_K 256            /* values per K-type super-block */
#define Q4_K_BYTES 144      /* float16 d, float16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit codes */
#define Q5_K_BYTES 176      /* Q4_K's, with 32 bytes of fifth bits between the scales and the low 4 bits */
#define Q6_K_BYTES 210      /* 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, float16 d */
#define QK5 32              /* values per Q5_0 block */
#define Q5_0_BYTES 22       /* float16 d, 32 high bits, 16 bytes of low 4 bits */
#define Q4_0_BYTES 18       /* float16 d, 16 bytes of 4-bit codes */
#define Q4_1_BYTES 20       /* float16 d, float16 m, 16 bytes of 4-bit codes */

static inline float fp16(const uint8_t *p) {  /* a little-endian float16 as a float32, exactly */
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    uint32_t bits;
    float value;
    if (exponent == 0) { value = ldexpf((float)mantissa, -24); memcpy(&bits, &value, 4); }
    else if (exponent == 31) bits = 0x7f800000 | (mantissa << 13);
    else bits = ((exponent + 112) << 23) | (mantissa << 13);
    bits |= sign;
    memcpy(&value, &bits, 4);
    return value;
#endif
}

/* xq [M, nb * bs] int8, xd [M, nb] float32 and xs [M, nb * bs / 16] int16 (the sum of every 16 codes) = x [M, K]
   quantized per block of bs values (zeros past K); with swap, each block of 256 stores its 32-value chunks in the
   order 0, 2, 1, 3, 4, 6, 5, 7 (KQ_ORDER below), and the sums follow the stored order. For one swap, the same bytes in
   every variant: this loop, or quantize.h's 16 values at a time with AVX-512. */
void quantize_rows_k(const float *x, int64_t M, int64_t K, int64_t bs, int8_t *xq, float *xd, int16_t *xs,
                     int threads, int swap) {
    const int64_t nb = (K + bs - 1) / bs;
    #pragma omp parallel for num_threads(M * K >= 65536 ? threads : 1) schedule(static)
    for (int64_t i = 0; i < M; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + i * K + b * bs;
            const int64_t n = K - b * bs < bs ? K - b * bs : bs;
#if defined(__AVX512F__)
            if (n == bs && bs % 32 == 0) {
                xd[i * nb + b] = quantize_block_512(v, bs, swap, xq + (i * nb + b) * bs, xs + (i * nb + b) * (bs / 16));
                continue;
            }
#endif
            float amax = 0.f;
            for (int64_t j = 0; j < n; j++) amax = fmaxf(amax, fabsf(v[j]));
            const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
            int8_t *q = xq + (i * nb + b) * bs;
            for (int64_t j = 0; j < bs; j++) q[kq_place(j, swap)] = j < n ? (int8_t)roundf(v[j] * id) : 0;
            for (int64_t g = 0; g < bs / 16; g++) {
                int sum = 0;
                for (int j = 0; j < 16; j++) sum += q[g * 16 + j];
                xs[(i * nb + b) * (bs / 16) + g] = (int16_t)sum;
            }
            xd[i * nb + b] = d;
        }
}

/* Q4_K's 6-bit scale and min of sub-block j (0..7) from its 12 packed bytes. */
static inline void q4_k_scale_min(const uint8_t *s, int j, int *scale, int *min) {
    if (j < 4) { *scale = s[j] & 63; *min = s[j + 4] & 63; }
    else { *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4); *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
}

/* All 8 scales then all 8 mins of a Q4_K block as 16 bytes, with four bytes to a word at a time: the 12 bytes hold
   scales 0..3 and mins 0..3 in their low 6 bits (bytes 0..3 and 4..7), and the low and high nibbles of bytes 8..11
   are scales 4..7 and mins 4..7, whose top 2 bits are the top bits of bytes 0..3 and 4..7. */
static inline void q4_k_scales_mins(const uint8_t *s, uint8_t out[16]) {
    uint32_t a, b, c, v[4];
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    v[0] = a & 0x3f3f3f3f;
    v[1] = (c & 0x0f0f0f0f) | (((a >> 6) & 0x03030303) << 4);
    v[2] = b & 0x3f3f3f3f;
    v[3] = ((c >> 4) & 0x0f0f0f0f) | (((b >> 6) & 0x03030303) << 4);
    memcpy(out, v, 16);
}

#if defined(__AVX2__)
/* The integer products of one 32-byte group: VPMADDUBSW (codes at most 63, so no pair saturates), then each pair of
   pairs times the sub-block scales sc (16 int16 lanes) into acc: VPDPWSSD with VNNI, VPMADDWD and VPADDD without. */
static inline __m256i dot_scaled(__m256i acc, __m256i codes, const int8_t *x, __m256i sc) {
    const __m256i pairs = _mm256_maddubs_epi16(codes, _mm256_loadu_si256((const __m256i *)x));
#if defined(Q8_VNNI)
    return _mm256_dpwssd_epi32(acc, pairs, sc);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, sc));
#endif
}

static inline float sum8(__m256 v) {  /* the 8 lanes, in a fixed order */
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}
#endif

#define ROWS 8  /* rows a weight block is unpacked for: each unpacked block serves up to 8 rows */

#if defined(Q8_VNNI)
/* The AVX512-VNNI variant works a super-block in four 64-value steps of 512 bits. A 64-byte load of Q6_K's low bits
   holds 64 values in order. Q4_K's and Q5_K's hold sub-blocks 0 and 2 in the low nibbles and 1 and 3 in the high ones
   (4 and 6, 5 and 7 in the second), so their activations are quantized in that order (KQ_ORDER: the 32-value chunks 1
   and 2, and 5 and 6, trade places), and each step's activations are one load too. */
#define KQ_ORDER 1

static inline __m256i half_sum(__m512i v) {  /* 16 int32 lanes to 8: lane i + lane i + 8, exact */
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

static inline float sum16(__m512 v) {  /* the 16 lanes, in a fixed order: the two halves, then sum8 */
    return sum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* Int16 lanes 0..15 of KQ_STEP_CHUNKS[k]: the sub-block of step k's low 256 bits, lanes 16..31: of its high 256 bits
   (step 0: sub-blocks 0 and 2, step 1: 1 and 3, ...). They pick the two sub-blocks' scales, and as sub-block j's fifth
   bits are bits j of qh, they are also the shifts that bring those bits down. */
#define S16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v
static const int16_t KQ_STEP_CHUNKS[4][32] = {{S16(0), S16(2)}, {S16(1), S16(3)}, {S16(4), S16(6)}, {S16(5), S16(7)}};
#undef S16
/* int16 lane g of the mins vector: the min (8 + j of the 16 scale and min words) of the sub-block j the activation sum g
   (of 16 values, in KQ_ORDER) belongs to */
static const int16_t KQ_MIN_PICK[16] = {8, 8, 10, 10, 9, 9, 11, 11, 12, 12, 14, 14, 13, 13, 15, 15};

/* rows_k_min in 512-bit steps: per super-block, the codes of step k are one AND (and shift) of 64 bytes (Q5_K: OR
   their fifth bits), and a row's product of that step is one VPMADDUBSW and one VPDPWSSD on 64 activations; the mins
   come in through one VPMADDWD of the 16 activation sums with each one's min. */
static inline __attribute__((always_inline)) void rows_k_min_512_body(const uint8_t *w, const int8_t *xq,
                                                                       const float *xd, const int16_t *xs, int64_t nb,
                                                                       int R, float *y, int64_t ldy, int five) {
    __m512 acc[ROWS];  /* per row: 16 float lanes of d d_x isc */
    __m256 accm[ROWS];  /* and 8 of dmin d_x imin */
    for (int r = 0; r < R; r++) { acc[r] = _mm512_setzero_ps(); accm[r] = _mm256_setzero_ps(); }
    const __m512i low4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
    __m512i chunk[4];
    for (int k = 0; k < 4; k++) chunk[k] = _mm512_loadu_si512(KQ_STEP_CHUNKS[k]);
    const __m256i pick_min = _mm256_loadu_si256((const __m256i *)KQ_MIN_PICK);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * (five ? Q5_K_BYTES : Q4_K_BYTES), *qh = wb + 16, *qs = wb + (five ? 48 : 16);
        const float d = fp16(wb), dmin = fp16(wb + 2);
        uint8_t sm[16];  /* the 8 scales, then the 8 mins, as bytes */
        q4_k_scales_mins(wb + 4, sm);
        const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm));
        const __m512i sm512 = _mm512_castsi256_si512(sm16);
        const __m256i mins = _mm256_permutexvar_epi16(pick_min, sm16);
        __m512i codes[4], scale[4];
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_loadu_si512(qs + 64 * h);
            codes[2 * h] = _mm512_and_si512(q, low4);
            codes[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
        }
        if (five) {
            const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
            for (int k = 0; k < 4; k++)
                codes[k] = _mm512_or_si512(codes[k],
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hb, chunk[k]), one), 4));
        }
        for (int k = 0; k < 4; k++) scale[k] = _mm512_permutexvar_epi16(chunk[k], sm512);
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq + (r * nb + b) * QK_K;
            __m512i sum = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++)
                sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(codes[k], _mm512_loadu_si512(x + 64 * k)), scale[k]);
            const __m256i imin = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xs + (r * nb + b) * 16)), mins);
            const float dx = xd[r * nb + b];
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * dx), _mm512_cvtepi32_ps(sum), acc[r]);
            accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(imin), accm[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * ldy] = sum16(acc[r]) - sum8(accm[r]);
}

#define S8(v) v, v, v, v, v, v, v, v
static const int16_t Q6_STEP_SCALES[4][32] = {{S8(0), S8(1), S8(2), S8(3)}, {S8(4), S8(5), S8(6), S8(7)},
                                             {S8(8), S8(9), S8(10), S8(11)}, {S8(12), S8(13), S8(14), S8(15)}};
static const int16_t Q6_STEP_SHIFTS[2][32] = {{S8(0), S8(0), S8(2), S8(2)}, {S8(4), S8(4), S8(6), S8(6)}};
#undef S8

/* rows_q6_k's 512-bit body: step k holds values 64k..64k+63, the low bits of ql[64h..64h+63] (h = k / 2; their high
   nibbles for odd k), each under 2 bits of qh[32h + l]: bits 4 (k % 2) and 4 (k % 2) + 1 in the low 256-bit half,
   the next two in the high half. */
static inline __attribute__((always_inline)) void rows_q6_k_512_body(const uint8_t *w, const int8_t *xq,
                                                                      const float *xd, const int16_t *xs, int64_t nb,
                                                                      int R, float *y, int64_t ldy) {
    __m256 acc[ROWS];  /* per row: 8 float lanes of d d_x isum, added at the end */
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(0x03);
    __m512i pick[4], shift[2];  /* scale 4k + i / 8 to int16 lane i; the qh shifts of the even and odd steps */
    for (int k = 0; k < 4; k++) pick[k] = _mm512_loadu_si512(Q6_STEP_SCALES[k]);
    for (int k = 0; k < 2; k++) shift[k] = _mm512_loadu_si512(Q6_STEP_SHIFTS[k]);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * Q6_K_BYTES, *ql = wb, *qh = wb + 128;
        const float d = fp16(wb + 208);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 192)));
        const __m512i sc512 = _mm512_castsi256_si512(sc16);
        __m512i codes[4], scale[4];
        for (int h = 0; h < 2; h++) {
            const __m512i l = _mm512_loadu_si512(ql + 64 * h);
            const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qh + 32 * h)));
            codes[2 * h] = _mm512_or_si512(_mm512_and_si512(l, low4),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hb, shift[0]), low2), 4));
            codes[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                                               _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hb, shift[1]), low2), 4));
        }
        for (int k = 0; k < 4; k++) scale[k] = _mm512_permutexvar_epi16(pick[k], sc512);
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq + (r * nb + b) * QK_K;
            __m512i sum = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++)
                sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(codes[k], _mm512_loadu_si512(x + 64 * k)), scale[k]);
            const __m256i offset = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xs + (r * nb + b) * 16)), sc16);
            const __m256i isum = _mm256_sub_epi32(half_sum(sum), _mm256_slli_epi32(offset, 5));  /* exact */
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd[r * nb + b]), _mm256_cvtepi32_ps(isum), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * ldy] = sum8(acc[r]);
}

/* One row is the decode step's case: with R a constant 1 its sums stay in registers. */
static void rows_q4_k(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs, int64_t nb, int R,
                      float *y, int64_t ldy) {
    if (R == 1) rows_k_min_512_body(w, xq, xd, xs, nb, 1, y, ldy, 0);
    else rows_k_min_512_body(w, xq, xd, xs, nb, R, y, ldy, 0);
}

static void rows_q5_k(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs, int64_t nb, int R,
                      float *y, int64_t ldy) {
    if (R == 1) rows_k_min_512_body(w, xq, xd, xs, nb, 1, y, ldy, 1);
    else rows_k_min_512_body(w, xq, xd, xs, nb, R, y, ldy, 1);
}

static void rows_q6_k(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs, int64_t nb, int R,
                      float *y, int64_t ldy) {
    if (R == 1) rows_q6_k_512_body(w, xq, xd, xs, nb, 1, y, ldy);
    else rows_q6_k_512_body(w, xq, xd, xs, nb, R, y, ldy);
}
#else
#define KQ_ORDER 0
#endif

enum k_min_kind { Q4_K_KIND, Q5_K_KIND };

/* Q4_K and Q5_K (Q4_K's layout with a fifth bit per code, 32 bytes of them between the scales and the low 4 bits):
   rows [0, R) of xq times one weight row w of nb super-blocks, into y[r * ldy]. Per super-block: the 8 sub-block scales
   and mins unpacked and the codes (0..15, or 0..31 with the fifth bits) split into 8 groups of 32 once; then, per row,
   isc = sum_j scale_j (codes . x)_j and imin = sum_j min_j sum(x)_j exactly (in 8 int32 lanes in the vector variants),
   and acc += d_x (d isc - dmin imin) (lane by lane; y the lanes' sum).
   Always inlined, so each type gets its own copy with `kind` a constant (called twice, it would otherwise stay one).
   The AVX2 and portable variants; AVX512-VNNI's is rows_k_min_512_body above. */
static inline __attribute__((always_inline)) void rows_k_min(const uint8_t *w, const int8_t *xq, const float *xd,
                                                              const int16_t *xs, int64_t nb, int R, float *y,
                                                              int64_t ldy, enum k_min_kind kind) {
    const int five = kind == Q5_K_KIND;
#if defined(__AVX2__)
    __m256 acc[ROWS], accm[ROWS];  /* per row: 8 float lanes of d d_x isc, and of dmin d_x imin, added at the end */
    for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
#else
    float acc[ROWS] = {0};
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * (five ? Q5_K_BYTES : Q4_K_BYTES), *qh = wb + 16, *qs = wb + (five ? 48 : 16);
        const float d = fp16(wb), dmin = fp16(wb + 2);
#if defined(__AVX2__)
        uint8_t sm[16];  /* the 8 scales, then the 8 mins, as bytes */
        q4_k_scales_mins(wb + 4, sm);
        __m256i codes[8], scale[8];
        for (int c = 0; c < 4; c++) {  /* 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high */
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            codes[2 * c] = _mm256_and_si256(q, low4);
            codes[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        }
        if (five) {  /* value 32 j + l's fifth bit is bit j of qh[l]: moved to bit 4 of its byte */
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qh), one = _mm256_set1_epi8(1);
            for (int j = 0; j < 8; j++)
                codes[j] = _mm256_or_si256(codes[j],
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, j), one), 4));
        }
        const __m128i both = _mm_loadu_si128((const __m128i *)sm);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(both));  /* scales 0..7 in each half */
        for (int j = 0; j < 8; j++) scale[j] = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
        const __m256i min32 = _mm256_cvtepu8_epi32(_mm_srli_si128(both, 8));  /* mins 0..7, one per int32 lane */
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq + (r * nb + b) * QK_K;
            __m256i sum = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) sum = dot_scaled(sum, codes[j], x + 32 * j, scale[j]);
            /* lane j: sub-block j's activation sum (its two sums of 16) times its min, exact */
            const __m256i sums = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xs + (r * nb + b) * 16)), ones);
            const float dx = xd[r * nb + b];
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sum), acc[r]);
            accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(_mm256_mullo_epi32(sums, min32)),
                                      accm[r]);
        }
#else
        int sc[8], mn[8];
        for (int j = 0; j < 8; j++) q4_k_scale_min(wb + 4, j, &sc[j], &mn[j]);
        uint8_t codes[QK_K];
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                codes[64 * c + l] = qs[32 * c + l] & 0x0f;
                codes[64 * c + 32 + l] = qs[32 * c + l] >> 4;
            }
        if (five)
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < 32; l++) codes[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq + (r * nb + b) * QK_K;
            const int16_t *s = xs + (r * nb + b) * 16;
            int32_t isc = 0, imin = 0;
            for (int j = 0; j < 8; j++) {
                int32_t dot = 0;
                for (int l = 32 * j; l < 32 * j + 32; l++) dot += codes[l] * x[l];
                isc += sc[j] * dot;
                imin += mn[j] * (s[2 * j] + s[2 * j + 1]);
            }
            acc[r] += xd[r * nb + b] * (d * (float)isc - dmin * (float)imin);
        }
#endif
    }
#if defined(__AVX2__)
    for (int r = 0; r < R; r++) y[r * ldy] = sum8(acc[r]) - sum8(accm[r]);
#else
    for (int r = 0; r < R; r++) y[r * ldy] = acc[r];
#endif
}

#if !defined(Q8_VNNI)  /* AVX512-VNNI's rows_q4_k, rows_q5_k and rows_q6_k are above */
static void rows_q4_k(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs, int64_t nb, int R,
                      float *y, int64_t ldy) { rows_k_min(w, xq, xd, xs, nb, R, y, ldy, Q4_K_KIND); }

static void rows_q5_k(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs, int64_t nb, int R,
                      float *y, int64_t ldy) { rows_k_min(w, xq, xd, xs, nb, R, y, ldy, Q5_K_KIND); }
#endif

/* Q6_K: per super-block, the 6-bit codes (0..63) put together in value order once; then, per row,
   isum = sum_j scale_j ((codes . x)_j - 32 sum(x)_j) over its 16 parts of 16, exactly, and acc += d_x d isum (in 8
   lanes in the vector variants, as for Q4_K). The AVX2 and portable variants. */
#if !defined(Q8_VNNI)
static void rows_q6_k(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs, int64_t nb, int R,
                      float *y, int64_t ldy) {
#if defined(__AVX2__)
    __m256 acc[ROWS];  /* per row: 8 float lanes of d d_x isum, added at the end */
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    __m256i pick[4];  /* shuffles that spread scale 2m over the low half and scale 2m + 1 over the high one */
    for (int m = 0; m < 4; m++)
        pick[m] = _mm256_set_m128i(_mm_set1_epi16((short)((4 * m + 2) | (4 * m + 3) << 8)),
                                   _mm_set1_epi16((short)((4 * m) | (4 * m + 1) << 8)));
#else
    float acc[ROWS] = {0};
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * Q6_K_BYTES, *ql = wb, *qh = wb + 128;
        const int8_t *sc = (const int8_t *)(wb + 192);
        const float d = fp16(wb + 208);
#if defined(__AVX2__)
        const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
        __m256i codes[8], scale[8];
        for (int h = 0; h < 2; h++) {  /* 128 values: low nibbles of ql[0..63] then high; 2 bits of qh[0..31] each */
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            const __m256i low[4] = {_mm256_and_si256(l0, low4), _mm256_and_si256(l1, low4),
                                    _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                    _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4)};
            for (int k = 0; k < 4; k++)
                codes[4 * h + k] = _mm256_or_si256(low[k], _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), low2), 4));
        }
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const __m256i first = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8));  /* scales 0..7 in each half */
        const __m256i second = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8)));  /* 8..15 */
        for (int k = 0; k < 8; k++) scale[k] = _mm256_shuffle_epi8(k < 4 ? first : second, pick[k % 4]);
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq + (r * nb + b) * QK_K;
            __m256i sum = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) sum = dot_scaled(sum, codes[k], x + 32 * k, scale[k]);
            const __m256i offset = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xs + (r * nb + b) * 16)), sc16);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd[r * nb + b]),
                                     _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, _mm256_slli_epi32(offset, 5))), acc[r]);
        }
#else
        uint8_t codes[QK_K];
        for (int v = 0; v < QK_K; v++) {
            const int h = v / 128, part = (v % 128) / 32, l = v % 32;  /* which ql half, 2-bit field, byte */
            const uint8_t low = ql[64 * h + 32 * (part & 1) + l];
            codes[v] = ((part < 2 ? low : low >> 4) & 0x0f) | (((qh[32 * h + l] >> (2 * part)) & 3) << 4);
        }
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq + (r * nb + b) * QK_K;
            const int16_t *s = xs + (r * nb + b) * 16;
            int32_t isum = 0;
            for (int j = 0; j < 16; j++) {
                int32_t dot = 0;
                for (int l = 16 * j; l < 16 * j + 16; l++) dot += codes[l] * x[l];
                isum += sc[j] * (dot - 32 * s[j]);
            }
            acc[r] += xd[r * nb + b] * (d * (float)isum);
        }
#endif
    }
#if defined(__AVX2__)
    for (int r = 0; r < R; r++) y[r * ldy] = sum8(acc[r]);
#else
    for (int r = 0; r < R; r++) y[r * ldy] = acc[r];
#endif
}
#endif

/* The blocks of 32: Q4_0 (w = d (q - 8), 4-bit codes), Q4_1 (w = d q + m) and Q5_0 (w = d (q - 16), a fifth bit per
   code). Per block, the codes (0..31) once; then, per row, the block's integer products (codes - offset) . x, exact in
   each lane, scaled by d d_x and added in float (Q4_1's m d_x sum(x) beside them). The vector variants keep 8 float
   lanes a row and add them at the end in a fixed order (a sum per 32 values would cost more than the products);
   portable C adds per block. */
enum small_kind { Q4_0_KIND, Q4_1_KIND, Q5_0_KIND };
static const int SMALL_BYTES[] = {Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES}, SMALL_OFFSET[] = {8, 0, 16};

static inline void rows_small(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs, int64_t nb,
                              int R, float *y, int64_t ldy, enum small_kind kind) {
    const int offset = SMALL_OFFSET[kind];
    float mins[ROWS] = {0};  /* Q4_1: sum of m d_x sum(x) over the blocks */
#if defined(__AVX2__)
    __m256 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const __m256i off8 = _mm256_set1_epi8((char)offset), ones = _mm256_set1_epi16(1);
#else
    float acc[ROWS] = {0};
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * SMALL_BYTES[kind], *qs = wb + (kind == Q4_0_KIND ? 2 : kind == Q4_1_KIND ? 4 : 6);
        const float d = fp16(wb), m = kind == Q4_1_KIND ? fp16(wb + 2) : 0.f;
        uint32_t qh = 0;
        if (kind == Q5_0_KIND) memcpy(&qh, wb + 2, 4);
        for (int r = 0; r < R; r++)
            if (kind == Q4_1_KIND) mins[r] += m * xd[r * nb + b] * (float)(xs[(r * nb + b) * 2] + xs[(r * nb + b) * 2 + 1]);
#if defined(__AVX2__)
        const __m128i q = _mm_loadu_si128((const __m128i *)qs);
        __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
        if (kind == Q5_0_KIND) {  /* value j's fifth bit is bit j of qh: byte j gets byte j / 8 of qh, tests bit j % 8 */
            const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
            const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
            codes = _mm256_or_si256(codes, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                                                            _mm256_set1_epi8(0x10)));
        }
        for (int r = 0; r < R; r++) {  /* (q - offset) x = q x - offset x, each pair at most 2 · 31 · 127 */
            const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (r * nb + b) * QK5));
            const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(codes, x), _mm256_maddubs_epi16(off8, x));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd[r * nb + b]), _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)),
                                     acc[r]);
        }
#else
        uint8_t codes[QK5];
        for (int j = 0; j < 16; j++) {
            codes[j] = (qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
            codes[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        }
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq + (r * nb + b) * QK5;
            const int16_t *s = xs + (r * nb + b) * 2;
            int32_t dot = 0;
            for (int j = 0; j < QK5; j++) dot += codes[j] * x[j];
            acc[r] += xd[r * nb + b] * (d * (float)(dot - offset * (s[0] + s[1])));
        }
#endif
    }
#if defined(__AVX2__)
    for (int r = 0; r < R; r++) y[r * ldy] = sum8(acc[r]) + mins[r];
#else
    for (int r = 0; r < R; r++) y[r * ldy] = acc[r] + mins[r];
#endif
}

#define ROWS_SMALL(name, kind)                                                                                         \
static void name(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs, int64_t nb, int R, float *y, \
                 int64_t ldy) { rows_small(w, xq, xd, xs, nb, R, y, ldy, kind); }
ROWS_SMALL(rows_q4_0, Q4_0_KIND) ROWS_SMALL(rows_q4_1, Q4_1_KIND) ROWS_SMALL(rows_q5_0, Q5_0_KIND)

typedef void (*rows_dot)(const uint8_t *, const int8_t *, const float *, const int16_t *, int64_t, int, float *, int64_t);

/* y [M, N] = x [M, K] times the transpose of W [N, K] in blocks of bs values and block_bytes bytes (N rows of
   K / bs blocks, as a GGUF file holds them). Threads split the outputs; each unpacks a weight block once for up to
   ROWS rows. A row's sums do not depend on how many rows share the unpacking. */
static void matmul_blocks(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads,
                          int64_t bs, int64_t block_bytes, rows_dot dot, int swap, const char *name) {
    const int64_t nb = K / bs, groups = bs / 16;
    int8_t *xq = malloc((size_t)(M * nb * bs) + 64);
    float *xd = malloc(sizeof(float) * (M * nb + 1));
    int16_t *xs = malloc(sizeof(int16_t) * (M * nb * groups + 16));
    if (!xq || !xd || !xs) {  /* a few MB at most: without them no product can be given, and a wrong one must not be */
        fprintf(stderr, "helios %s: no memory for the activations of %lld rows\n", name, (long long)M);
        abort();
    }
    quantize_rows_k(x, M, K, bs, xq, xd, xs, threads, swap);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < M; i += ROWS)
            dot(w + n * nb * block_bytes, xq + i * nb * bs, xd + i * nb, xs + i * nb * groups, nb,
                M - i < ROWS ? (int)(M - i) : ROWS, y + i * N + n, N);
    free(xq);
    free(xd);
    free(xs);
}

/* The signature of matmul_f16: K a multiple of the block size (GGUF stores no other). */
void matmul_q4_k(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    matmul_blocks(x, M, K, w, N, y, threads, QK_K, Q4_K_BYTES, rows_q4_k, KQ_ORDER, "matmul_q4_k");
}

void matmul_q5_k(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    matmul_blocks(x, M, K, w, N, y, threads, QK_K, Q5_K_BYTES, rows_q5_k, KQ_ORDER, "matmul_q5_k");
}

void matmul_q6_k(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    matmul_blocks(x, M, K, w, N, y, threads, QK_K, Q6_K_BYTES, rows_q6_k, 0, "matmul_q6_k");
}

void matmul_q5_0(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    matmul_blocks(x, M, K, w, N, y, threads, QK5, Q5_0_BYTES, rows_q5_0, 0, "matmul_q5_0");
}

void matmul_q4_0(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    matmul_blocks(x, M, K, w, N, y, threads, QK5, Q4_0_BYTES, rows_q4_0, 0, "matmul_q4_0");
}

void matmul_q4_1(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    matmul_blocks(x, M, K, w, N, y, threads, QK5, Q4_1_BYTES, rows_q4_1, 0, "matmul_q4_1");
}

const char *matmul_kquants_isa(void) {
#if defined(Q8_VNNI)
    return "AVX512-VNNI";
#elif defined(__AVX2__)
    return "AVX2";
#else
    return "generic";
#endif
}
