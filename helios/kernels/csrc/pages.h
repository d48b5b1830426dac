/* Reading and writing the pool's elements (kv_t, kernels.h): float32 as it is, or float16 converted to and from
   float32 in registers (F16C on x86, a vector conversion elsewhere), so the arithmetic is float32 either way. */
#ifndef HELIOS_PAGES_H
#define HELIOS_PAGES_H

#include <string.h>
#if defined(KV_HALF) && defined(__F16C__)
#include <immintrin.h>
#endif

#include "kernels.h"
#include "vectors.h"

/* 8 elements of a page as float32 */
static inline f8 load_kv8(const kv_t *p) {
#ifndef KV_HALF
    return *(const f8 *)p;
#else
    return load_half8(p);
#endif
}

/* dst[0:n] = src[0:n], rounded to the page's element (float16: to nearest even); n a multiple of 8 */
static inline void store_kv(kv_t *dst, const float *src, int64_t n) {
#ifndef KV_HALF
    memcpy(dst, src, sizeof(float) * n);
#elif defined(__F16C__)
    for (int64_t i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#else
    for (int64_t i = 0; i < n; i++) { const _Float16 h = (_Float16)src[i]; memcpy(dst + i, &h, sizeof h); }
#endif
}

#endif
