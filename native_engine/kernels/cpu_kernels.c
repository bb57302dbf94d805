/* CPU kernels for the native engine's float32 decode path, called through ctypes (cpu_kernels.py).
 *
 * blocks matmul: out[t, n] = sum_k x[t, k] * w[n, k] for float32 activations x and a weight stored as GGUF blocks of 32:
 *   Q4_1: w = d * q + m, q in 0..15, 16 bytes per block (byte j: low nibble weight j, high nibble weight j + 16);
 *   Q8_0: w = d * q, q int8, 32 bytes per block.
 * d (and m) are float32 [N, K / 32]. Each weight is dequantized to float32 in registers and multiplied with
 * float32 activations, so the result equals the dense float32 product up to summation order.
 * Rows are split over OpenMP threads; `num_threads` comes from the caller (torch.get_num_threads()).
 * Built by cpu_kernels.py with -O3 -march=native -fopenmp; the AVX-512 path is taken when the compiler
 * targets it, a plain loop otherwise.
 *
 * add_rms_norm and paged_attention_decode: one call each where PyTorch runs 5-15 small ops. */
#include <stdint.h>
#include <math.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define AI static inline __attribute__((always_inline))

#ifdef __AVX512F__

AI void load_q4_1(const uint8_t *qs, float d, float m, __m512 *lo, __m512 *hi) {
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m128i mask = _mm_set1_epi8(0x0F);
    __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
    *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask))), vd, vm);
    *hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask))), vd, vm);
}

AI void load_q8_0(const int8_t *qs, float d, __m512 *lo, __m512 *hi) {
    __m512 vd = _mm512_set1_ps(d);
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs))), vd);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16)))), vd);
}

/* R rows n0.. of the weight times TT activation rows t0..; accumulators stay in registers. */
AI void tile(int is_q8, const float *x, int64_t K, const uint8_t *qs, const float *d, const float *m,
             int64_t n0, int64_t t0, int64_t N, float *out, const int R, const int TT) {
    const int64_t G = K / 32, row_bytes = is_q8 ? K : K / 2;
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        for (int r = 0; r < R; r++) {
            int64_t n = n0 + r;
            __m512 lo, hi;
            if (is_q8) load_q8_0((const int8_t *)qs + n * row_bytes + g * 32, d[n * G + g], &lo, &hi);
            else load_q4_1(qs + n * row_bytes + g * 16, d[n * G + g], m[n * G + g], &lo, &hi);
            for (int t = 0; t < TT; t++) {
                const float *xg = x + (t0 + t) * K + g * 32;
                acc[r][t] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xg), acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xg + 16), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) out[(t0 + t) * N + n0 + r] = _mm512_reduce_add_ps(acc[r][t]);
}

AI void rows(int is_q8, const float *x, int64_t T, int64_t K, const uint8_t *qs, const float *d, const float *m,
             int64_t n0, int64_t N, float *out) {
    /* 4 rows of one token (M = 1: four independent chains), else 2 rows x 4 tokens, then leftovers. */
    int64_t t = 0;
    for (; t + 4 <= T; t += 4) {
        tile(is_q8, x, K, qs, d, m, n0, t, N, out, 2, 4);
        tile(is_q8, x, K, qs, d, m, n0 + 2, t, N, out, 2, 4);
    }
    for (; t < T; t++) tile(is_q8, x, K, qs, d, m, n0, t, N, out, 4, 1);
}

#else

static void rows(int is_q8, const float *x, int64_t T, int64_t K, const uint8_t *qs, const float *d, const float *m,
                 int64_t n0, int64_t N, float *out) {
    const int64_t G = K / 32, row_bytes = is_q8 ? K : K / 2;
    float w[32];
    for (int64_t n = n0; n < n0 + 4; n++) {
        for (int64_t t = 0; t < T; t++) out[t * N + n] = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *b = qs + n * row_bytes + g * (is_q8 ? 32 : 16);
            for (int j = 0; j < 32; j++)
                w[j] = is_q8 ? d[n * G + g] * (float)((const int8_t *)b)[j]
                             : d[n * G + g] * (float)((j < 16 ? b[j] : b[j - 16] >> 4) & 15) + m[n * G + g];
            for (int64_t t = 0; t < T; t++) {
                float s = 0.0f;
                for (int j = 0; j < 32; j++) s += w[j] * x[t * K + g * 32 + j];
                out[t * N + n] += s;
            }
        }
    }
}

#endif

/* N must be a multiple of 4 and K of 32; x [T, K] and out [T, N] row-major, contiguous. */
static void blocks_matmul(int is_q8, const float *x, int64_t T, int64_t K, const uint8_t *qs, const float *d,
                          const float *m, int64_t N, float *out, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t n0 = 0; n0 < N; n0 += 4) rows(is_q8, x, T, K, qs, d, m, n0, N, out);
}

void q4_1_matmul(const float *x, int64_t T, int64_t K, const uint8_t *qs, const float *d, const float *m, int64_t N,
                 float *out, int num_threads) {
    blocks_matmul(0, x, T, K, qs, d, m, N, out, num_threads);
}

void q8_0_matmul(const float *x, int64_t T, int64_t K, const int8_t *qs, const float *d, int64_t N, float *out,
                 int num_threads) {
    blocks_matmul(1, x, T, K, (const uint8_t *)qs, d, d, N, out, num_threads);
}

/* out = rms_norm(x + residual) * weight; residual_out = x + residual (residual may be NULL: plain norm).
 * All [T, H] float32 contiguous; out / residual_out may alias nothing else. */
void add_rms_norm(const float *x, const float *residual, const float *weight, float eps, int64_t T, int64_t H,
                  float *out, float *residual_out) {
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * H;
        float *o = out + t * H;
        if (residual != NULL) {
            const float *rr = residual + t * H;
            float *ro = residual_out + t * H;
            for (int64_t i = 0; i < H; i++) ro[i] = xr[i] + rr[i];
            xr = ro;
        }
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < H; i++) ss += xr[i] * xr[i];
        float rstd = 1.0f / sqrtf(ss / (float)H + eps);
        for (int64_t i = 0; i < H; i++) o[i] = xr[i] * rstd * weight[i];
    }
}

/* One query token per sequence attending over its paged cache.
 * q, out: [B, nh, D]; caches: [num_blocks, block_size, nkv, D]; block_tables [B, W] int32; context_lens [B] int32.
 * Scores are computed a cache block at a time with an online softmax (float32 throughout). */
void paged_attention_decode(const float *q, const float *k_cache, const float *v_cache, const int32_t *block_tables,
                            const int32_t *context_lens, float scale, int64_t B, int64_t nh, int64_t nkv, int64_t D,
                            int64_t block_size, int64_t W, float *out, int num_threads) {
    const int64_t group = nh / nkv, token_stride = nkv * D, block_stride = block_size * nkv * D;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < nh; h++) {
            const float *qh = q + (b * nh + h) * D;
            float *oh = out + (b * nh + h) * D;
            const int64_t kvh = h / group, len = context_lens[b];
            float acc[256], scores[256], m = -INFINITY, l = 0.0f;
            for (int64_t i = 0; i < D; i++) acc[i] = 0.0f;
            for (int64_t start = 0; start < len; start += block_size) {
                const int64_t block = block_tables[b * W + start / block_size];
                const int64_t n = len - start < block_size ? len - start : block_size;
                const float *kb = k_cache + block * block_stride + kvh * D;
                const float *vb = v_cache + block * block_stride + kvh * D;
                float chunk_max = -INFINITY;
                for (int64_t j = 0; j < n; j++) {
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int64_t i = 0; i < D; i++) s += qh[i] * kb[j * token_stride + i];
                    scores[j] = s * scale;
                    chunk_max = scores[j] > chunk_max ? scores[j] : chunk_max;
                }
                const float m_new = chunk_max > m ? chunk_max : m, alpha = expf(m - m_new);
                l *= alpha;
                for (int64_t i = 0; i < D; i++) acc[i] *= alpha;
                for (int64_t j = 0; j < n; j++) {
                    const float p = expf(scores[j] - m_new);
                    l += p;
                    for (int64_t i = 0; i < D; i++) acc[i] += p * vb[j * token_stride + i];
                }
                m = m_new;
            }
            for (int64_t i = 0; i < D; i++) oh[i] = l > 0.0f ? acc[i] / l : 0.0f;
        }
    }
}

/* Rotate-half (NEOX) rotary embedding in place on T rows of `heads` heads of D floats; row r starts at
 * x + r * row_stride. cos_sin: [max_pos, D], cos in the first half, sin in the second. */
void rotary_neox(float *x, int64_t T, int64_t row_stride, int64_t heads, int64_t D, const int64_t *positions,
                 const float *cos_sin) {
    const int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = cos_sin + positions[t] * D;
        for (int64_t h = 0; h < heads; h++) {
            float *x1 = x + t * row_stride + h * D, *x2 = x1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * cs[i] - b * cs[half + i];
                x2[i] = b * cs[i] + a * cs[half + i];
            }
        }
    }
}

/* Writes T rows of key and value ([row_stride]-strided, width = nkv * D) into cache slots; slot -1 = skip.
 * caches: [num_slots, nkv * D] contiguous. */
void cache_write(const float *key, const float *value, int64_t T, int64_t key_stride, int64_t value_stride,
                 int64_t width, const int64_t *slots, float *k_cache, float *v_cache) {
    for (int64_t t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        memcpy(k_cache + slots[t] * width, key + t * key_stride, width * sizeof(float));
        memcpy(v_cache + slots[t] * width, value + t * value_stride, width * sizeof(float));
    }
}

/* out[t, i] = silu(x[t, i]) * x[t, I + i]; x [T, 2I], out [T, I]. */
void silu_and_mul(const float *x, int64_t T, int64_t I, float *out) {
    for (int64_t t = 0; t < T; t++) {
        const float *a = x + t * 2 * I, *b = a + I;
        float *o = out + t * I;
        for (int64_t i = 0; i < I; i++) o[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
    }
}
