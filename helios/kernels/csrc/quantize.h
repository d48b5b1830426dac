/* Activations quantized per block to int8, 16 values at a time with AVX-512: the bytes the packed matmuls' portable
   loops make (quantize_rows_q8 in matmul_q8_0.c, quantize_rows_k in matmul_kquants.c), which call roundf value by
   value (x86 has no instruction for ties away from zero). */
#ifndef HELIOS_QUANTIZE_H
#define HELIOS_QUANTIZE_H

#include <stdint.h>

/* Where value j of a block of 256 is stored: with swap (the K-quant matmuls' KQ_ORDER), the 32-value chunks 1 and 2,
   and 5 and 6, trade places (chunk bits 0 and 1 both flip where they differ); without, at j. */
static inline int64_t kq_place(int64_t j, int swap) { return swap && (((j >> 5) ^ (j >> 6)) & 1) ? j ^ 96 : j; }

#if defined(__AVX512F__)
#include <immintrin.h>

/* A block of bs values (a multiple of 16, none past K) to q: the same max (a NaN passed over, as fmaxf does), d and
   1 / d as the loops, and roundf's rounding (ties away from zero) of y = v / d as truncation plus one where
   |y - trunc y| >= 1/2 (y - trunc y is exact). Each value goes to kq_place (with swap, bs is 256); s, unless NULL,
   gets the sum of every 16 stored values. Returns d. */
static inline float quantize_block_512(const float *v, int64_t bs, int swap, int8_t *q, int16_t *s) {
    __m512 m = _mm512_setzero_ps();
    for (int64_t j = 0; j < bs; j += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v + j)), m);
    const float d = _mm512_reduce_max_ps(m) / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    const __m512 scale = _mm512_set1_ps(id), half = _mm512_set1_ps(0.5f);
    const __m512i one = _mm512_castps_si512(_mm512_set1_ps(1.f)), sign = _mm512_set1_epi32((int)0x80000000);
    for (int64_t j = 0; j < bs; j += 16) {
        const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(v + j), scale);
        const __m512 t = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y, t)), half, _CMP_GE_OQ);
        const __m512 unit = _mm512_castsi512_ps(_mm512_or_si512(one, _mm512_and_si512(_mm512_castps_si512(y), sign)));
        const __m512i qi = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, unit));
        const int64_t at = kq_place(j, swap);
        _mm_storeu_si128((__m128i *)(q + at), _mm512_cvtepi32_epi8(qi));
        if (s) s[at / 16] = (int16_t)_mm512_reduce_add_epi32(qi);
    }
    return d;
}
#endif

#endif
