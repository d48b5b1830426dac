/* Vectors of 8 and 4 floats, and the few operations on them that every kernel shares. GCC and Clang vector
   extensions, not intrinsics: the same source becomes AVX2 and FMA code on x86 (built with -mavx2 -mfma) and
   NEON code on ARM. The one exception is load_half8, which uses F16C's conversion where the build has it. */
#ifndef HELIOS_VECTORS_H
#define HELIOS_VECTORS_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

typedef float f8 __attribute__((vector_size(32), aligned(4)));   /* 8 floats, loaded from any address */
typedef float f4 __attribute__((vector_size(16), aligned(4)));
typedef int32_t i8 __attribute__((vector_size(32), aligned(4)));

#if defined(__clang__) || __GNUC__ >= 12                 /* lanes of a and b, picked by index (b's from 8) */
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else                                                    /* GCC before 12 spells it differently */
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (i8){__VA_ARGS__})
#endif

/* 8 float16 values as float32: F16C's conversion on x86, a vector conversion elsewhere */
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

/* [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7] */
static inline f8 pair_sums(f8 a, f8 b) {
    return SHUFFLE(a, b, 0, 2, 8, 10, 4, 6, 12, 14) + SHUFFLE(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}

/* [sum(a), sum(b), sum(c), sum(d)] */
static inline f4 sums4(f8 a, f8 b, f8 c, f8 d) {
    const f8 x = pair_sums(pair_sums(a, b), pair_sums(c, d));
    return (f4){x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]};
}

/* e^x for x <= 0, eight at a time: x = n ln2 + r with |r| <= ln2/2, e^x = 2^n e^r, e^r by its Taylor series to
   r^7 (relative error below 1e-7); below -87, where float32 runs out of normal numbers, the result is 0. */
static inline f8 exp8(f8 x) {
    const i8 tiny = x < -87.f;
    x = (f8)((i8)x & ~tiny) - (f8)(tiny & (i8)((f8){0} + 87.f));
    const i8 n = __builtin_convertvector(x * 1.44269504f - 0.5f, i8);   /* round(x / ln2), as x <= 0 */
    const f8 nf = __builtin_convertvector(n, f8);
    const f8 r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;           /* ln2 in two parts: n ln2 is exact */
    const f8 p = 1.f + r * (1.f + r * (1.f / 2 + r * (1.f / 6 + r * (1.f / 24 + r * (1.f / 120 + r * (1.f / 720 + r * (1.f / 5040)))))));
    return (f8)(((i8)p + (n << 23)) & ~tiny);                             /* times 2^n: add n to the exponent */
}

#endif
