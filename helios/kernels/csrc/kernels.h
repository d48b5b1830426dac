/* What the kernels export to Python (through ctypes) and to each other: their signatures, and the two structs a
   decoder layer is handed. Python mirrors each struct with a ctypes.Structure (helios/kernels/abi.py); at load it
   compares that Structure's size and field offsets with helios_sizeof_<struct> and helios_offsetof_<struct>. */
#ifndef HELIOS_KERNELS_H
#define HELIOS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* The pool's element: float32, or float16 in a library built with -DKV_HALF (pages.h converts on load and store). */
#ifdef KV_HALF
typedef uint16_t kv_t;
#else
typedef float kv_t;
#endif

/* decode_attention.c */
int paged_decode_attention(const float *q, const kv_t *k_pages, const kv_t *v_pages, const int64_t *page_tables,
                           int64_t table_stride, const int64_t *context_lens, float *out, int64_t rows,
                           int64_t page_size, float scale, int threads);

/* layer_ops.c */
void rms_norm(const float *x, const float *residual, const float *weight, float *sum, float *normed, int64_t rows,
              int64_t dim, float eps, int threads);
void rope_store(const float *qkv, int64_t ld, int64_t n, const float *cos, const float *sin, const float *q_norm,
                const float *k_norm, float eps, float *q_out, kv_t *k_pages, kv_t *v_pages, const int64_t *slots,
                int threads);
void silu_mul(const float *gate_up, int64_t rows, int64_t inter, float *out, int threads);

/* matmul_f16.c, a library of its own. The matmul a layer is handed has its signature: y [M, N] = x [M, K] times
   the weight in panels. */
typedef void (*matmul_fn)(const float *x, int64_t M, int64_t K, const uint16_t *panels, int64_t N, float *y,
                          int threads);
void matmul_f16(const float *x, int64_t M, int64_t K, const uint16_t *panels, int64_t N, float *y, int threads);
/* matmul_bf16.c, a library of its own: bfloat16 weights and products, float32 sums (AMX or AVX512-BF16) */
void matmul_bf16(const float *x, int64_t M, int64_t K, const uint16_t *panels, int64_t N, float *y, int threads);
/* matmul_q8_0.c, a library of its own: weights in GGUF's Q8_0 blocks, activations quantized per block, integer dot
   products (AVX512-VNNI, AVX2 or portable C); handed to a layer in place of a matmul_fn (its bytes for panels) */
void matmul_q8_0(const float *x, int64_t M, int64_t K, const uint8_t *blocks, int64_t N, float *y, int threads);
void quantize_rows_q8(const float *x, int64_t M, int64_t K, int8_t *xq, float *xd, int threads);
/* matmul_int8.c, a library of its own: weights int8 per output row, activations int8 per row, int32 sums (AMX,
   AVX512-VNNI or portable C); handed to a layer in place of a matmul_fn (its packed bytes for panels) */
void matmul_int8(const float *x, int64_t M, int64_t K, const uint8_t *packed, int64_t N, float *y, int threads);

/* decoder_layer.c */
struct layer_weights {                    /* one decoder layer, set once */
    const float *input_norm, *post_norm;  /* [hidden] */
    const float *q_norm, *k_norm;         /* [HEAD_DIM] QK-norm weights, or NULL */
    float eps, qk_eps;
    const uint16_t *qkv, *o, *gate_up, *down;  /* panels */
    const float *qkv_bias;                /* [QKV], or NULL */
    int64_t hidden, inter, layer;         /* layer: its index in the KV pool */
    matmul_fn matmul;                     /* the matmul of its panels */
};

struct tick {                             /* one packed forward, set once per tick */
    int64_t n;                            /* packed tokens */
    const float *cos, *sin;               /* [n, HEAD_DIM / 2] */
    const int64_t *slots;                 /* [n] where each token's k and v go */
    const int64_t *tables, *lens;         /* [n, table_stride], [n]: each token's page table and context */
    int64_t table_stride, page_size;
    kv_t *k_pages, *v_pages;              /* the pool: [layers, pages, page_size, KV_HEADS, HEAD_DIM] */
    int64_t layer_elements;               /* elements per layer of the pool */
    float *scratch;                       /* n x (2 hidden + QKV + 2 HEADS HEAD_DIM + 3 inter) floats */
    float scale;                          /* 1 / sqrt(HEAD_DIM) */
    int threads;
    double *clocks;                       /* seconds spent in [matmuls, attention], added to */
};

int decoder_layer(const struct layer_weights *w, const struct tick *t, const float *x, float *out,
                  const int64_t *rows, int64_t m);
void release_threads(void);  /* the engine has no work: the calling thread's OpenMP workers end */

/* The layout of each struct, for the check at load: its size, and the offset of its i-th field (-1 past the last). */
size_t helios_sizeof_layer_weights(void);
int64_t helios_offsetof_layer_weights(int64_t field);
size_t helios_sizeof_tick(void);
int64_t helios_offsetof_tick(int64_t field);

#endif
