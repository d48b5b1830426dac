"""How fast this CPU can multiply, by instruction and by kernel (the Benchmarks page, "The arithmetic ceiling").

Prints, at one thread and at --threads, the rate of:

* a loop of FMA instructions on registers only (12 independent 8-float accumulators, no loads): the peak
  the floating-point units reach when nothing else is asked of them;
* a 6-row x 16-output register tile over 256 values of k that stay in the L1 cache, the tile the C
  matmul of appendix 92 uses (float32 and float16 weights): the peak of a matmul's inner loop, loads
  and broadcasts included, without any cache miss;
* the integer tile llama.cpp's kind of kernel would use: 3 rows x 16 outputs, 4-bit weights (as GGUF Q4_1
  stores them) times int8 activations, scales applied per block of 32, in L1;
* integer loops on registers only: int8 x uint8 products (`vpmaddubsw`, then `vpmaddwd` to widen and an
  add), and int16 x int16 products (`vpmaddwd` and an add). One multiply-add counts as 2 operations;
* the matmuls of a 512-token prefill chunk of the default model's shape (576 -> 1536 and 1536 -> 576):
  PyTorch's float32 `torch.mm`, Helios's C float16-weight matmul (`matmul_f16`), and an integer kernel
  written for this measurement: activations quantised to int16 per row, multiplied by the 4-bit integers
  of GGUF Q4_1 weights (exact: a weight is d q + m per block of 32) with `vpmaddwd`, the block scales
  applied once per block. The max error column is relative to the largest output of a float64 product of the same weights.

Usage:

    python scripts/ceilings.py [--threads 2] [--repeat 5] [--rounds 3]
"""
import argparse
import ctypes
import os
import statistics
import time

import torch
from tqdm.auto import tqdm

from helios.kernels.build import build_library, kernel_cache_dir
from helios.kernels.matmul import matmul_kernel, weight_panels

SOURCE = r"""
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 12 chains of a = a b + c on registers; the empty asm makes b and every a look new at every step, so nothing is
   hoisted or folded. */
float fma_registers(int64_t iters, int threads) {
    float sink = 0;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
               a9 = a0, a10 = a0, a11 = a0, b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
        for (int64_t n = 0; n < iters; n++) {
            __asm__ volatile("" : "+x"(b), "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                             "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
            a0 = _mm256_fmadd_ps(a0, b, c); a1 = _mm256_fmadd_ps(a1, b, c); a2 = _mm256_fmadd_ps(a2, b, c);
            a3 = _mm256_fmadd_ps(a3, b, c); a4 = _mm256_fmadd_ps(a4, b, c); a5 = _mm256_fmadd_ps(a5, b, c);
            a6 = _mm256_fmadd_ps(a6, b, c); a7 = _mm256_fmadd_ps(a7, b, c); a8 = _mm256_fmadd_ps(a8, b, c);
            a9 = _mm256_fmadd_ps(a9, b, c); a10 = _mm256_fmadd_ps(a10, b, c); a11 = _mm256_fmadd_ps(a11, b, c);
        }
        sink = a0[0] + a1[1] + a2[2] + a3[3] + a4[4] + a5[5] + a6[6] + a7[7] + a8[0] + a9[1] + a10[2] + a11[3];
    }
    return sink;
}

/* 8 chains of acc += widen(w x) on registers: int8 x uint8 (maddubs, madd with ones) or int16 x int16 (madd). The
   empty asm statements keep every accumulator a register carried from step to step, so nothing can be folded. */
#define KEEP __asm__ volatile("" : "+x"(w), "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6), "+x"(c7))
int32_t int_registers(int64_t iters, int threads, int bits) {
    int32_t sink = 0;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        __m256i w = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1), c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0,
                c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
        const __m256i x0 = _mm256_set1_epi8(1), x1 = _mm256_set1_epi8(2), x2 = _mm256_set1_epi8(3), x3 = _mm256_set1_epi8(4),
                      x4 = _mm256_set1_epi8(5), x5 = _mm256_set1_epi8(6), x6 = _mm256_set1_epi8(7), x7 = _mm256_set1_epi8(8);
#define I8(i, x) c##i = _mm256_add_epi32(c##i, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
#define I16(i, x) c##i = _mm256_add_epi32(c##i, _mm256_madd_epi16(w, x));
        if (bits == 8)
            for (int64_t n = 0; n < iters; n++) { KEEP; I8(0, x0) I8(1, x1) I8(2, x2) I8(3, x3) I8(4, x4) I8(5, x5) I8(6, x6) I8(7, x7) }
        else
            for (int64_t n = 0; n < iters; n++) { KEEP; I16(0, x0) I16(1, x1) I16(2, x2) I16(3, x3) I16(4, x4) I16(5, x5) I16(6, x6) I16(7, x7) }
        const __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                           _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
        sink = _mm256_extract_epi32(s, 0);
    }
    return sink;
}

/* The 6 x 16 tile of matmul_f16 over K = 256: x packed [K, 6], weights [K, 16] (float16 when half), all in L1. */
#define TK 256
#define ACC(i) __m256 a##i##0 = _mm256_setzero_ps(), a##i##1 = a##i##0;
#define STEP(i) { const __m256 b = _mm256_broadcast_ss(xk + i); a##i##0 = _mm256_fmadd_ps(b, w0, a##i##0); \
                  a##i##1 = _mm256_fmadd_ps(b, w1, a##i##1); }
#define TOTAL(i) + lanes(a##i##0) + lanes(a##i##1)
static inline float lanes(__m256 v) { return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]; }  /* all used */

static float tile(const float *x, const void *w, int half) {
    ACC(0) ACC(1) ACC(2) ACC(3) ACC(4) ACC(5)
    for (int64_t k = 0; k < TK; k++) {
        const float *xk = x + k * 6;
        __m256 w0, w1;
        if (half) {
            w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k * 16)));
            w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k * 16 + 8)));
        } else {
            w0 = _mm256_loadu_ps((const float *)w + k * 16); w1 = _mm256_loadu_ps((const float *)w + k * 16 + 8);
        }
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5)
    }
    return 0 TOTAL(0) TOTAL(1) TOTAL(2) TOTAL(3) TOTAL(4) TOTAL(5);
}

float tile_in_l1(int64_t reps, int threads, int half) {
    float sink = 0;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        float x[TK * 6] __attribute__((aligned(32))), wf[TK * 16] __attribute__((aligned(32)));
        uint16_t wh[TK * 16] __attribute__((aligned(32)));
        for (int i = 0; i < TK * 6; i++) x[i] = 1e-3f * (i % 7);
        for (int i = 0; i < TK * 16; i++) { wf[i] = 1e-3f * (i % 5); wh[i] = 0x1400; }  /* 0x1400: ~1e-3 in float16 */
        for (int64_t r = 0; r < reps; r++) {
            sink += tile(x, half ? (const void *)wh : (const void *)wf, half);
            __asm__ volatile("" : : "r"(x), "r"(wf), "r"(wh) : "memory");  /* the arrays may have changed */
        }
    }
    return sink;
}

/* llama.cpp's kind of integer tile: 3 rows x 16 outputs over 8 blocks of 32 k in L1. Weights are 4-bit integers
   (uint8 0..15, four k of one output side by side), activations int8; vpmaddubsw multiplies and adds pairs,
   vpmaddwd with ones adds pairs again, so each int32 lane gathers 4 k. Per block: its int32 sums to float, times
   the weight scale d and the row's activation scale, plus the weight minimum m times the row's block sum. */
#define IR 3
#define NB 8
static float int8_tile(const int8_t *x, const uint8_t *w, const float *d, const float *m, const float *xs, const float *xsum) {
    __m256 f[IR][2];
    for (int i = 0; i < IR; i++) f[i][0] = f[i][1] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < NB; b++) {
        __m256i acc[IR][2];
        for (int i = 0; i < IR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + (b * 8 + s) * 64));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + (b * 8 + s) * 64 + 32));
            for (int i = 0; i < IR; i++) {
                int32_t four;
                memcpy(&four, x + (i * NB + b) * 32 + 4 * s, sizeof four);
                const __m256i a = _mm256_set1_epi32(four);
                acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(w0, a), ones));
                acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(w1, a), ones));
            }
        }
        const __m256 d0 = _mm256_loadu_ps(d + b * 16), d1 = _mm256_loadu_ps(d + b * 16 + 8);
        const __m256 m0 = _mm256_loadu_ps(m + b * 16), m1 = _mm256_loadu_ps(m + b * 16 + 8);
        for (int i = 0; i < IR; i++) {
            const __m256 s = _mm256_set1_ps(xs[i * NB + b]), t = _mm256_set1_ps(xsum[i * NB + b]);
            f[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][0]), _mm256_mul_ps(d0, s), _mm256_fmadd_ps(m0, t, f[i][0]));
            f[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][1]), _mm256_mul_ps(d1, s), _mm256_fmadd_ps(m1, t, f[i][1]));
        }
    }
    float total = 0;
    for (int i = 0; i < IR; i++) total += lanes(f[i][0]) + lanes(f[i][1]);
    return total;
}

float int8_tile_in_l1(int64_t reps, int threads) {
    float sink = 0;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        int8_t x[IR * NB * 32];
        uint8_t w[NB * 8 * 64];
        float d[NB * 16], m[NB * 16], xs[IR * NB], xsum[IR * NB];
        for (int i = 0; i < IR * NB * 32; i++) x[i] = (int8_t)(i % 200 - 100);
        for (int i = 0; i < NB * 8 * 64; i++) w[i] = i % 16;
        for (int i = 0; i < NB * 16; i++) { d[i] = 0.01f; m[i] = -0.1f; }
        for (int i = 0; i < IR * NB; i++) { xs[i] = 0.01f; xsum[i] = 1.f; }
        for (int64_t r = 0; r < reps; r++) {
            sink += int8_tile(x, w, d, m, xs, xsum);
            __asm__ volatile("" : : "r"(x), "r"(w), "r"(d), "r"(m), "r"(xs), "r"(xsum) : "memory");
        }
    }
    return sink;
}

/* y [M, N] = x [M, K] times Q4_1 weights [N, K], in integers. wq: [N / 16, K / 2, 16, 2] int16 (q in 0..15, two
   k side by side for vpmaddwd), d and m: [N / 16, K / 32, 16] float (w = d q + m per block of 32). Each row of x
   is quantised to int16 with its own scale; the min term m sum(x) uses the float sums of x per block. */
#define QR 3
static void qtile(int R, const int16_t *xq, const float *xb, int64_t K, const int16_t *wq, const float *d, const float *m,
                  const float *scale, float *y, int64_t ldy) {
    __m256 f[QR][2];
    for (int i = 0; i < R; i++) f[i][0] = f[i][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 32; b++) {
        __m256i acc[QR][2];
        for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
        const int16_t *wb = wq + b * 32 * 16;
        for (int p = 0; p < 16; p++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wb + p * 32));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wb + p * 32 + 16));
            for (int i = 0; i < R; i++) {
                int32_t pair;
                memcpy(&pair, xq + i * K + b * 32 + 2 * p, sizeof pair);
                const __m256i a = _mm256_set1_epi32(pair);
                acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(w0, a));
                acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(w1, a));
            }
        }
        const __m256 d0 = _mm256_loadu_ps(d + b * 16), d1 = _mm256_loadu_ps(d + b * 16 + 8);
        const __m256 m0 = _mm256_loadu_ps(m + b * 16), m1 = _mm256_loadu_ps(m + b * 16 + 8);
        for (int i = 0; i < R; i++) {
            const __m256 s = _mm256_set1_ps(xb[i * (K / 32) + b]);
            f[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][0]), d0, _mm256_fmadd_ps(m0, s, f[i][0]));
            f[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][1]), d1, _mm256_fmadd_ps(m1, s, f[i][1]));
        }
    }
    for (int i = 0; i < R; i++) {
        const __m256 s = _mm256_set1_ps(scale[i]);
        _mm256_storeu_ps(y + i * ldy, _mm256_mul_ps(f[i][0], s));
        _mm256_storeu_ps(y + i * ldy + 8, _mm256_mul_ps(f[i][1], s));
    }
}

int matmul_q4_i16(const float *x, int64_t M, int64_t K, const int16_t *wq, const float *d, const float *m, int64_t N,
                  float *y, int threads) {
    if (K % 32 || N % 16) return 1;
    const int64_t nb = K / 32, panels = N / 16;
    int16_t *xq = malloc(sizeof(int16_t) * M * K);
    float *xb = malloc(sizeof(float) * M * nb), *scale = malloc(sizeof(float) * M);
    if (!xq || !xb || !scale) { free(xq); free(xb); free(scale); return 1; }
    #pragma omp parallel for num_threads(threads)
    for (int64_t i = 0; i < M; i++) {      /* scale = max |x| / 32767; xq = round(x / scale); xb = block sums / scale */
        float top = 0;
        for (int64_t k = 0; k < K; k++) top = fmaxf(top, fabsf(x[i * K + k]));
        const float s = top > 0 ? top / 32767.f : 1.f;
        scale[i] = s;
        for (int64_t b = 0; b < nb; b++) {
            float sum = 0;
            for (int k = 0; k < 32; k++) {
                const float v = x[i * K + b * 32 + k];
                sum += v;
                xq[i * K + b * 32 + k] = (int16_t)lrintf(v / s);
            }
            xb[i * nb + b] = sum / s;
        }
    }
    for (int64_t m0 = 0; m0 < M; m0 += 192) {
        const int64_t rows = M - m0 < 192 ? M - m0 : 192;
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t p = 0; p < panels; p++)
            for (int64_t i = 0; i < rows; i += QR)
                qtile(rows - i < QR ? (int)(rows - i) : QR, xq + (m0 + i) * K, xb + (m0 + i) * nb, K, wq + p * K * 16,
                      d + p * nb * 16, m + p * nb * 16, scale + m0 + i, y + (m0 + i) * N + p * 16, N);
    }
    free(xq); free(xb); free(scale);
    return 0;
}
"""


def load_library():
    folder = kernel_cache_dir() / "ceilings"  # the measurement's own C, built like Helios's kernels
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ceilings.c").write_text(SOURCE)
    lib = ctypes.CDLL(str(build_library(("ceilings.c",), require_openmp=True, folder=folder)))
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.fma_registers.argtypes, lib.fma_registers.restype = [i64, i32], ctypes.c_float
    lib.int_registers.argtypes, lib.int_registers.restype = [i64, i32, i32], ctypes.c_int32
    lib.tile_in_l1.argtypes, lib.tile_in_l1.restype = [i64, i32, i32], ctypes.c_float
    lib.int8_tile_in_l1.argtypes, lib.int8_tile_in_l1.restype = [i64, i32], ctypes.c_float
    lib.matmul_q4_i16.argtypes, lib.matmul_q4_i16.restype = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, i32], ctypes.c_int
    return lib


def median_s(fn, repeat: int) -> float:
    "Median wall time of fn() over repeat calls, after one warm-up call."
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def q4_1_weights(n: int, k: int, generator: torch.Generator):
    "Random Q4_1-like weights: (w [n, k] float32 exactly d q + m, and the int16/float layout matmul_q4_i16 reads)."
    q = torch.randint(0, 16, (n, k), generator=generator)
    d = (torch.rand(n, k // 32, generator=generator) * 0.02).half().float()  # GGUF keeps d and m in float16
    m = (-torch.rand(n, k // 32, generator=generator) * 0.15).half().float()
    w = d.repeat_interleave(32, 1) * q + m.repeat_interleave(32, 1)
    wq = q.to(torch.int16).view(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous()
    blocks = lambda t: t.view(n // 16, 16, k // 32).transpose(1, 2).contiguous()
    return w, (wq, blocks(d), blocks(m))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="timed calls per measurement (their median is taken)")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the whole table (the machine is shared)")
    args = ap.parse_args()
    lib, matmul_f16 = load_library(), matmul_kernel()
    iters, reps = 20_000_000, 20_000
    # (label, run(threads), operations of one call at t threads)
    rows = [("FMA on registers (GFLOP/s)", lambda t: lib.fma_registers(iters, t), lambda t: t * iters * 12 * 8 * 2),
            ("6 x 16 tile in L1, float32 weights (GFLOP/s)", lambda t: lib.tile_in_l1(reps, t, 0), lambda t: t * reps * 2 * 6 * 16 * 256),
            ("6 x 16 tile in L1, float16 weights (GFLOP/s)", lambda t: lib.tile_in_l1(reps, t, 1), lambda t: t * reps * 2 * 6 * 16 * 256),
            ("3 x 16 tile in L1, int8 x 4-bit, blocks of 32 (GOP/s)", lambda t: lib.int8_tile_in_l1(reps, t),
             lambda t: t * reps * 2 * 3 * 16 * 8 * 32),
            ("int8 x uint8 on registers, maddubs (GOP/s)", lambda t: lib.int_registers(iters, t, 8), lambda t: t * iters * 8 * 32 * 2),
            ("int16 x int16 on registers, madd (GOP/s)", lambda t: lib.int_registers(iters, t, 16), lambda t: t * iters * 8 * 16 * 2)]
    errors = {}
    g = torch.Generator().manual_seed(0)
    for m, k, n in [(512, 576, 1536), (512, 1536, 576)]:
        x = torch.randn(m, k, generator=g)
        x[:, 7] *= 20  # one large channel, as real activations have: it sets each row's int16 scale
        w, (wq, d, mins) = q4_1_weights(n, k, g)
        exact = x.double() @ w.double().T
        panels, wt, y = weight_panels(w), w.T.contiguous(), torch.empty(m, n)
        def f16(t, x=x, m=m, k=k, n=n, panels=panels, y=y): matmul_f16(x.data_ptr(), m, k, panels.data_ptr(), n, y.data_ptr(), t)
        def q4(t, x=x, m=m, k=k, n=n, wq=wq, d=d, mins=mins, y=y):
            if lib.matmul_q4_i16(x.data_ptr(), m, k, wq.data_ptr(), d.data_ptr(), mins.data_ptr(), n, y.data_ptr(), t):
                raise MemoryError("matmul_q4_i16 could not allocate")
        def mm(t, x=x, wt=wt, y=y):
            torch.set_num_threads(t)
            torch.mm(x, wt, out=y)
        for name, run in [("torch.mm, float32", mm), ("Helios matmul_f16", f16), ("int16 x Q4_1 kernel", q4)]:
            run(args.threads)
            label = f"{name}, {m} x {k} -> {n} (GFLOP/s)"
            errors[label] = ((y.double() - exact).abs().max() / exact.abs().max()).item()
            rows.append((label, run, lambda t, flops=2 * m * k * n: flops))
    rates = {name: ([], []) for name, _, _ in rows}
    loads = [os.getloadavg()[0]]
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for name, run, ops in rows:
            for column, t in zip(rates[name], (1, args.threads)):
                column.append(ops(t) / median_s(lambda: run(t), args.repeat) / 1e9)  # the loops' work is per thread
        loads.append(os.getloadavg()[0])
    torch.set_num_threads(args.threads)
    cell = lambda v: f"{statistics.median(v):.0f} ({max(v):.0f})"
    print(f"\n{args.rounds} rounds, load average {min(loads):.2f}-{max(loads):.2f}; each cell: median over rounds (best)\n")
    print(f"| measured | 1 thread | {args.threads} threads | max error |\n|---|---|---|---|")
    for name, _, _ in rows:
        error = f"{errors[name]:.1e}" if name in errors else ""
        print(f"| {name} | {cell(rates[name][0])} | {cell(rates[name][1])} | {error} |")


if __name__ == "__main__":
    main()
