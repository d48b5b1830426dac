/* The rest of a decoder layer but its matmuls: the norms with their residual adds, QK-norm and RoPE with the K/V
   write into the pages, and SiLU-and-multiply. */
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "pages.h"
#include "shape.h"
#include "vectors.h"

static inline float sum_squares(const float *x, int64_t dim) {
    f8 acc = {0};
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) { const f8 v = *(const f8 *)(x + i); acc += v * v; }
    float total = sums4(acc, acc, acc, acc)[0];
    for (; i < dim; i++) total += x[i] * x[i];
    return total;
}

/* normed[r] = y[r] / rms(y[r]) * weight for rows r of [rows, dim], where y = x + residual (also written to sum)
   when residual is given, else y = x. */
void rms_norm(const float *x, const float *residual, const float *weight, float *sum, float *normed, int64_t rows,
              int64_t dim, float eps, int threads) {
    #pragma omp parallel for num_threads(rows * dim >= PARALLEL_MIN ? threads : 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *y = x + r * dim;
        if (residual) {
            for (int64_t i = 0; i < dim; i++) sum[r * dim + i] = x[r * dim + i] + residual[r * dim + i];
            y = sum + r * dim;
        }
        const float scale = 1.f / sqrtf(sum_squares(y, dim) / dim + eps);
        for (int64_t i = 0; i < dim; i++) normed[r * dim + i] = y[i] * scale * weight[i];
    }
}

/* One head: RMSNorm by weight (QK-norm, when weight is given), then the rotation of pairs (i, i + HEAD_DIM/2) by
   the angles in cos/sin [HEAD_DIM/2]. */
static inline void norm_rotate(const float *x, const float *weight, float eps, const float *cos, const float *sin,
                               float *out) {
    float y[HEAD_DIM];
    const float scale = weight ? 1.f / sqrtf(sum_squares(x, HEAD_DIM) / HEAD_DIM + eps) : 1.f;
    for (int i = 0; i < HEAD_DIM; i++) y[i] = weight ? x[i] * scale * weight[i] : x[i];
    for (int i = 0; i < HEAD_DIM / 2; i++) {
        out[i] = y[i] * cos[i] - y[i + HEAD_DIM / 2] * sin[i];
        out[i + HEAD_DIM / 2] = y[i + HEAD_DIM / 2] * cos[i] + y[i] * sin[i];
    }
}

/* For tokens t < n of qkv [n, ld] (HEADS query heads, then KV_HEADS key heads, then KV_HEADS value heads):
   QK-norm where q_norm/k_norm are given, RoPE by cos/sin [n, HEAD_DIM/2]; the query to q_out [n, HEADS, HEAD_DIM],
   the key and value to slot slots[t] of one layer's k_pages and v_pages. */
void rope_store(const float *qkv, int64_t ld, int64_t n, const float *cos, const float *sin, const float *q_norm,
                const float *k_norm, float eps, float *q_out, kv_t *k_pages, kv_t *v_pages, const int64_t *slots,
                int threads) {
    #pragma omp parallel for num_threads(n * ld >= PARALLEL_MIN ? threads : 1)
    for (int64_t t = 0; t < n; t++) {
        const float *q = qkv + t * ld, *k = q + HEADS * HEAD_DIM, *v = k + TOKEN;
        const float *c = cos + t * (HEAD_DIM / 2), *s = sin + t * (HEAD_DIM / 2);
        float key[TOKEN];
        for (int h = 0; h < HEADS; h++) norm_rotate(q + h * HEAD_DIM, q_norm, eps, c, s, q_out + (t * HEADS + h) * HEAD_DIM);
        for (int h = 0; h < KV_HEADS; h++) norm_rotate(k + h * HEAD_DIM, k_norm, eps, c, s, key + h * HEAD_DIM);
        store_kv(k_pages + slots[t] * TOKEN, key, TOKEN);
        store_kv(v_pages + slots[t] * TOKEN, v, TOKEN);
    }
}

/* out[r] = silu(gate) * up for rows r of gate_up [rows, 2 inter] = [gate | up], where silu(g) = g / (1 + e^-g),
   computed as g / (1 + e^-g) for g >= 0 and g e^g / (1 + e^g) for g < 0, so that exp8 only sees -|g|. */
void silu_mul(const float *gate_up, int64_t rows, int64_t inter, float *out, int threads) {
    #pragma omp parallel for num_threads(rows * inter >= PARALLEL_MIN ? threads : 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) {
            const f8 x = *(const f8 *)(g + i);
            const i8 negative = x < 0;
            const f8 e = exp8((f8)((i8)x | INT32_MIN));                        /* e^-|x|: set the sign bit */
            const f8 top = (f8)(((i8)x & ~negative) | ((i8)(x * e) & negative)); /* x, or x e^x where x < 0 */
            *(f8 *)(o + i) = top / (1.f + e) * *(const f8 *)(u + i);
        }
        for (; i < inter; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
    }
}
