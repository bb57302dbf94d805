/* One decode step in one OpenMP parallel region, shared by llama_decode_rows (cpu_decode.c, 1-3 rows) and
 * llama_decode_batch (cpu_batch.c, 4+ rows): how threads claim an op's chunks, the step's claiming state, and
 * each thread's own buffers. Defined in cpu_decode.c. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* The instruction-set tier the kernels are compiled for (`-march` from INFER_CPU_MARCH, cpu_kernels.py):
 * TIER_AVX512: AVX512-F/BW/VL/VNNI (int16 dot products by vpdpwssd, 16 lanes);
 * TIER_AVX2: AVX2 + FMA + F16C, x86-64-v3 (int16 dot products by vpmaddwd, 8 lanes);
 * neither: plain C loops (x86-64 baseline, other architectures), correct and slow. */
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TIER_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TIER_AVX2 1
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> /* on every x86 tier: F16C's _cvtsh_ss without it is an undefined symbol at load */
#endif
#include <math.h>

#define SI static inline __attribute__((always_inline))

typedef void (*chunk_fn)(const void *op, int64_t i);

typedef struct { /* a thread's own copies: residual and normed rows [T, H], int16 matmul input [T, K] + scales */
    float *residual, *h, *sx, *xsum;
    int16_t *x16;
} own_t;

void step_run_op(int64_t k, int32_t *flags, int32_t gen, int64_t chunks, chunk_fn fn, const void *op, int tid,
                 int nt, int64_t *progress);
void *step_scratch(size_t bytes, void **buf, size_t *cap);
int32_t step_begin(int64_t flag_count, int nt, int32_t **flags, int64_t **progress);
own_t step_own(int64_t T, int64_t H, int64_t K);

/* ---- activations as int16 per group of 32, the same bytes on every tier ---- */

#ifdef TIER_AVX2
SI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

SI float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* 16 floats (already scaled into int16 range) -> 16 int16, rounded to nearest even as lrintf does. */
SI void store_x16(int16_t *out, __m256 lo, __m256 hi) {
    const __m256i packed = _mm256_packs_epi32(_mm256_cvtps_epi32(lo), _mm256_cvtps_epi32(hi)); /* lanes interleaved */
    _mm256_storeu_si256((__m256i *)out, _mm256_permute4x64_epi64(packed, 0xD8));
}

#endif

/* x [K] -> per group of 32: int16 values (round to nearest even), scale and float sum. */
SI void quantize_x16(const float *x, int64_t K, int16_t *x16, float *sx, float *xsum) {
    for (int64_t g = 0; g < K / 32; g++) {
        const float *xg = x + g * 32;
#if defined(__AVX512F__)
        const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        const __m512 vinv = _mm512_set1_ps(inv);
        _mm256_storeu_si256((__m256i *)(x16 + g * 32), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(a, vinv))));
        _mm256_storeu_si256((__m256i *)(x16 + g * 32 + 16), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(b, vinv))));
        xsum[g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
#elif defined(TIER_AVX2)
        const __m256 sign = _mm256_set1_ps(-0.0f);
        const __m256 a0 = _mm256_loadu_ps(xg), a1 = _mm256_loadu_ps(xg + 8), a2 = _mm256_loadu_ps(xg + 16),
                     a3 = _mm256_loadu_ps(xg + 24);
        const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a0), _mm256_andnot_ps(sign, a1)),
                                               _mm256_max_ps(_mm256_andnot_ps(sign, a2), _mm256_andnot_ps(sign, a3))));
        const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        const __m256 vinv = _mm256_set1_ps(inv);
        store_x16(x16 + g * 32, _mm256_mul_ps(a0, vinv), _mm256_mul_ps(a1, vinv));
        store_x16(x16 + g * 32 + 16, _mm256_mul_ps(a2, vinv), _mm256_mul_ps(a3, vinv));
        xsum[g] = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#else
        float amax = 0.0f, sum = 0.0f;
        for (int j = 0; j < 32; j++) {
            sum += xg[j];
            amax = fabsf(xg[j]) > amax ? fabsf(xg[j]) : amax;
        }
        const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        for (int j = 0; j < 32; j++) x16[g * 32 + j] = (int16_t)lrintf(xg[j] * inv);
        xsum[g] = sum;
#endif
        sx[g] = amax / 32767.0f;
    }
}
