/* CPU kernels for the native engine's float32 path, called through ctypes (cpu_kernels.py).
 *
 * blocks matmul: out[t, n] = sum_k x[t, k] * w[n, k] for float32 activations x and a weight stored as GGUF blocks of 32:
 *   Q4_1: w = d * q + m, q in 0..15, 16 bytes per block (byte j: low nibble weight j, high nibble weight j + 16);
 *   Q8_0: w = d * q, q int8, 32 bytes per block.
 * d (and m) are float32 [N, K / 32]. 1-3 activation rows (decode) with AVX512-VNNI: x as int16 per group of 32
 * (error <= 1.5e-5 of the group's largest |x|) times the integer weights, one float scaling per group. Otherwise
 * each weight is dequantized to float32 in registers and multiplied with float32 activations, so the result
 * equals the dense float32 product up to summation order (cpu_kernels.py hands 32+ rows to BLAS instead).
 * Rows are split over OpenMP threads; `num_threads` comes from the caller (torch.get_num_threads()).
 * Built by cpu_kernels.py with -O3 -march=$INFER_CPU_MARCH (native by default) -fopenmp; the AVX-512 paths are
 * taken when the compiler targets them, AVX2 + FMA ones on x86-64-v3 (cpu_step.h's tiers), plain loops otherwise.
 *
 * add_rms_norm, paged_attention_decode, rotary_neox, cache_write, silu_and_mul: one call each where PyTorch runs
 * several small ops. llama_decode: the whole decoder stack of a decode step from these, in one call (1-3 rows:
 * llama_decode_rows in cpu_decode.c). */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_step.h"

#define AI static inline __attribute__((always_inline))

/* The SIMD path this build takes (cpu_kernels.tier()): 2 AVX-512, 1 AVX2, 0 plain C. */
int simd_tier(void) {
#if defined(TIER_AVX512)
    return 2;
#elif defined(TIER_AVX2)
    return 1;
#else
    return 0;
#endif
}

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
    __m512 acc[4][8];
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

#ifdef __AVX512VNNI__
/* One token, 2 rows at a time: x as int16 per group of 32 (x ~ sx[g] * x16, |error| <= sx[g] / 2, i.e. 1.5e-5
 * of the group's largest |x|), 32 nibble products per vpdpwssd; the Q4_1 offsets m come in through the
 * group sums xsum. Half the vector work of dequantizing to float32. */
AI void q4_1_row_vnni(const int16_t *x16, const float *sx, const float *xsum, int64_t G, const uint8_t *qs,
                      const float *d, const float *m, int64_t n, int64_t N, float *out) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    float off0 = 0.0f, off1 = 0.0f;
    const uint8_t *q0 = qs + n * G * 16, *q1 = q0 + G * 16;
    const float *d0 = d + n * G, *d1 = d0 + G, *m0 = m + n * G, *m1 = m0 + G;
    for (int64_t g = 0; g < G; g++) {
        __m512i xv = _mm512_loadu_si512((const void *)(x16 + g * 32));
        __m128i b0 = _mm_loadu_si128((const __m128i *)(q0 + g * 16)), b1 = _mm_loadu_si128((const __m128i *)(q1 + g * 16));
        __m512i w0 = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b0, 4), mask), _mm_and_si128(b0, mask)));
        __m512i w1 = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b1, 4), mask), _mm_and_si128(b1, mask)));
        __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w0, xv);
        __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w1, xv);
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(d0[g] * sx[g]), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(d1[g] * sx[g]), acc1);
        off0 += m0[g] * xsum[g];
        off1 += m1[g] * xsum[g];
    }
    out[n] = _mm512_reduce_add_ps(acc0) + off0;
    out[n + 1] = _mm512_reduce_add_ps(acc1) + off1;
}

/* The same for Q8_0 rows (w = d * q8, no offsets). */
AI void q8_0_row_vnni(const int16_t *x16, const float *sx, int64_t G, const int8_t *qs, const float *d, int64_t n,
                      float *out) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const int8_t *q0 = qs + n * G * 32, *q1 = q0 + G * 32;
    const float *d0 = d + n * G, *d1 = d0 + G;
    for (int64_t g = 0; g < G; g++) {
        __m512i xv = _mm512_loadu_si512((const void *)(x16 + g * 32));
        __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q0 + g * 32)));
        __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q1 + g * 32)));
        __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w0, xv);
        __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w1, xv);
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(d0[g] * sx[g]), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(d1[g] * sx[g]), acc1);
    }
    out[n] = _mm512_reduce_add_ps(acc0);
    out[n + 1] = _mm512_reduce_add_ps(acc1);
}

#define HAVE_VNNI 1
#endif

AI void rows(int is_q8, const float *x, int64_t T, int64_t K, const uint8_t *qs, const float *d, const float *m,
             int64_t n0, int64_t N, float *out) {
    /* 2 rows x 8 tokens, then 2 rows x 4 tokens, then 4 rows of one token. */
    int64_t t = 0;
    for (; t + 8 <= T; t += 8) {
        tile(is_q8, x, K, qs, d, m, n0, t, N, out, 2, 8);
        tile(is_q8, x, K, qs, d, m, n0 + 2, t, N, out, 2, 8);
    }
    for (; t + 4 <= T; t += 4) {
        tile(is_q8, x, K, qs, d, m, n0, t, N, out, 2, 4);
        tile(is_q8, x, K, qs, d, m, n0 + 2, t, N, out, 2, 4);
    }
    for (; t < T; t++) tile(is_q8, x, K, qs, d, m, n0, t, N, out, 4, 1);
}

#elif defined(TIER_AVX2)

/* A block's 32 weights as four vectors of 8 floats (weights 0-7, 8-15, 16-23, 24-31). */
AI void load_block8(int is_q8, const uint8_t *b, float d, float m, __m256 w[4]) {
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    if (is_q8) {
        for (int i = 0; i < 4; i++)
            w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 8 * i)))), vd);
        return;
    }
    const __m128i bytes = _mm_loadu_si128((const __m128i *)b), mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(bytes, mask), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; i++) w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i])), vd, vm);
}

/* R rows n0.. of the weight times TT activation rows t0..; accumulators stay in registers. */
AI void tile8(int is_q8, const float *x, int64_t K, const uint8_t *qs, const float *d, const float *m, int64_t n0,
              int64_t t0, int64_t N, float *out, const int R, const int TT) {
    const int64_t G = K / 32, row_bytes = is_q8 ? K : K / 2;
    __m256 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        for (int r = 0; r < R; r++) {
            const int64_t n = n0 + r;
            __m256 w[4];
            load_block8(is_q8, qs + n * row_bytes + g * (is_q8 ? 32 : 16), d[n * G + g], is_q8 ? 0.0f : m[n * G + g], w);
            for (int t = 0; t < TT; t++) {
                const float *xg = x + (t0 + t) * K + g * 32;
                for (int i = 0; i < 4; i++) acc[r][t] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xg + 8 * i), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) out[(t0 + t) * N + n0 + r] = hsum8(acc[r][t]);
}

AI void rows(int is_q8, const float *x, int64_t T, int64_t K, const uint8_t *qs, const float *d, const float *m,
             int64_t n0, int64_t N, float *out) {
    /* 2 rows x 4 tokens, then 4 rows of one token. */
    int64_t t = 0;
    for (; t + 4 <= T; t += 4) {
        tile8(is_q8, x, K, qs, d, m, n0, t, N, out, 2, 4);
        tile8(is_q8, x, K, qs, d, m, n0 + 2, t, N, out, 2, 4);
    }
    for (; t < T; t++) tile8(is_q8, x, K, qs, d, m, n0, t, N, out, 4, 1);
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
#ifdef HAVE_VNNI
    if (T < 4 && K <= 8192) {
        int16_t x16[8192] __attribute__((aligned(64)));
        float sx[256], xsum[256];
        for (int64_t t = 0; t < T; t++) {
            quantize_x16(x + t * K, K, x16, sx, xsum);
#pragma omp parallel for schedule(static) num_threads(num_threads)
            for (int64_t n0 = 0; n0 < N; n0 += 2) {
                if (is_q8) q8_0_row_vnni(x16, sx, K / 32, (const int8_t *)qs, d, n0, out + t * N);
                else q4_1_row_vnni(x16, sx, xsum, K / 32, qs, d, m, n0, N, out + t * N);
            }
        }
        return;
    }
#endif
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
static void attention_rows(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                           const int32_t *block_tables, const int32_t *context_lens, float scale, int64_t B,
                           int64_t nh, int64_t nkv, int64_t D, int64_t block_size, int64_t W, float *out,
                           int num_threads) {
    const int64_t group = nh / nkv, token_stride = nkv * D, block_stride = block_size * nkv * D;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < nh; h++) {
            const float *qh = q + b * q_stride + h * D;
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

void paged_attention_decode(const float *q, const float *k_cache, const float *v_cache, const int32_t *block_tables,
                            const int32_t *context_lens, float scale, int64_t B, int64_t nh, int64_t nkv, int64_t D,
                            int64_t block_size, int64_t W, float *out, int num_threads) {
    attention_rows(q, nh * D, k_cache, v_cache, block_tables, context_lens, scale, B, nh, nkv, D, block_size, W, out,
                   num_threads);
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

/* The whole Llama decoder stack for T one-token rows (decode only), float32, every linear Q4_1 blocks.
 * hidden [T, H]: the token embeddings in, the final-norm output out. Per layer, `w` holds 17 pointers:
 * qkv (qs, d, m, bias or 0), o (qs, d, m), gate_up (qs, d, m), down (qs, d, m), input norm, post-attention
 * norm, k cache, v cache. Same maths as LlamaModel.forward with the kernels above, one call per step. */
void llama_decode(int64_t L, int64_t T, float *hidden, const int64_t *positions, const int64_t *slots,
                  const int32_t *block_tables, const int32_t *context_lens, int64_t W, int64_t H, int64_t nh,
                  int64_t nkv, int64_t D, int64_t I, float eps, const float *cos_sin, int64_t block_size,
                  const int64_t *w, const float *final_norm, float scale, int num_threads) {
    const int64_t Q = nh * D, KV = nkv * D, QKV = Q + 2 * KV;
    float *buf = malloc(sizeof(float) * T * (2 * H + QKV + Q + 3 * I));
    float *residual = buf, *h = residual + T * H, *qkv = h + T * H, *attn = qkv + T * QKV, *gu = attn + T * Q,
          *act = gu + T * 2 * I;
    for (int64_t l = 0; l < L; l++) {
        const int64_t *p = w + l * 17;
#define F(i) ((const float *)p[i])
#define U(i) ((const uint8_t *)p[i])
        if (l == 0) {
            memcpy(residual, hidden, sizeof(float) * T * H);
            add_rms_norm(hidden, NULL, F(13), eps, T, H, h, NULL);
        } else {
            add_rms_norm(hidden, residual, F(13), eps, T, H, h, residual);
        }
        blocks_matmul(0, h, T, H, U(0), F(1), F(2), QKV, qkv, num_threads);
        if (p[3])
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < QKV; i++) qkv[t * QKV + i] += F(3)[i];
        rotary_neox(qkv, T, QKV, nh, D, positions, cos_sin);
        rotary_neox(qkv + Q, T, QKV, nkv, D, positions, cos_sin);
        cache_write(qkv + Q, qkv + Q + KV, T, QKV, QKV, KV, slots, (float *)p[15], (float *)p[16]);
        attention_rows(qkv, QKV, F(15), F(16), block_tables, context_lens, scale, T, nh, nkv, D, block_size, W, attn,
                       num_threads);
        blocks_matmul(0, attn, T, Q, U(4), F(5), F(6), H, hidden, num_threads);
        add_rms_norm(hidden, residual, F(14), eps, T, H, h, residual);
        blocks_matmul(0, h, T, H, U(7), F(8), F(9), 2 * I, gu, num_threads);
        silu_and_mul(gu, T, I, act);
        blocks_matmul(0, act, T, I, U(10), F(11), F(12), H, hidden, num_threads);
#undef F
#undef U
    }
    add_rms_norm(hidden, residual, final_norm, eps, T, H, h, residual);
    memcpy(hidden, h, sizeof(float) * T * H);
    free(buf);
}

/* Dense float32 rows [N, K] from Q4_1 (m given) or Q8_0 (m NULL) blocks, for large-batch matmuls (BLAS). */
void dequantize_blocks(const uint8_t *qs, const float *d, const float *m, int64_t N, int64_t K, float *out,
                       int num_threads) {
    const int64_t G = K / 32;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t g = 0; g < G; g++) {
            float *o = out + n * K + g * 32;
            const float dd = d[n * G + g];
            if (m == NULL) {
                const int8_t *b = (const int8_t *)qs + n * K + g * 32;
                for (int j = 0; j < 32; j++) o[j] = dd * (float)b[j];
            } else {
                const uint8_t *b = qs + n * (K / 2) + g * 16;
                const float mm = m[n * G + g];
                for (int j = 0; j < 16; j++) {
                    o[j] = dd * (float)(b[j] & 15) + mm;
                    o[j + 16] = dd * (float)(b[j] >> 4) + mm;
                }
            }
        }
    }
}
