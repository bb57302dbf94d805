/* Vectors of 16 float32 lanes (f16v) and of 16 int32 lanes (i16v) for the batched kernels (cpu_batch.c), on
 * the two SIMD tiers of cpu_step.h: one zmm register on TIER_AVX512, a pair of ymm registers (lanes 0-7, 8-15)
 * on TIER_AVX2. The batched kernels are written once over these; every function is inlined, so on AVX-512 each
 * is the one instruction it was before this header. Lane u of a tiled weight chunk is output row u (cpu_batch.c). */
#pragma once

#include "cpu_step.h"

#define V16 static inline __attribute__((always_inline))

#if defined(TIER_AVX512)

typedef __m512 f16v;
typedef __m512i i16v;   /* 16 int32 lanes */
typedef __m512i w32v;   /* 32 int16 lanes: lane pair (2u, 2u + 1) belongs to int32 lane u */

V16 f16v f16_zero(void) { return _mm512_setzero_ps(); }
V16 f16v f16_load(const float *p) { return _mm512_loadu_ps(p); }
V16 f16v f16_load_half(const uint16_t *p) { /* 16 float16 values, widened */
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
V16 void f16_store(float *p, f16v v) { _mm512_storeu_ps(p, v); }
V16 f16v f16_set1(float x) { return _mm512_set1_ps(x); }
V16 f16v f16_add(f16v a, f16v b) { return _mm512_add_ps(a, b); }
V16 f16v f16_sub(f16v a, f16v b) { return _mm512_sub_ps(a, b); }
V16 f16v f16_mul(f16v a, f16v b) { return _mm512_mul_ps(a, b); }
V16 f16v f16_div(f16v a, f16v b) { return _mm512_div_ps(a, b); }
V16 f16v f16_fmadd(f16v a, f16v b, f16v c) { return _mm512_fmadd_ps(a, b, c); }
V16 f16v f16_abs(f16v a) { return _mm512_abs_ps(a); }
V16 float f16_reduce_add(f16v a) { return _mm512_reduce_add_ps(a); }
V16 f16v f16_from_i32(i16v a) { return _mm512_cvtepi32_ps(a); }
/* a where a >= 0, else a * b (the sigmoid of a negative input from that of its absolute value) */
V16 f16v f16_mul_where_negative(f16v v, f16v a, f16v b) {
    return _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ), v, b);
}

/* exp(x) for x <= 0 (softmax weights): 2^n * p(r), |relative error| ~ 2e-7; lanes below -87 give 0. */
V16 f16v f16_exp_neg(f16v x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_max_ps(x, lo);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* The 16 horizontal sums of p[0..15], lane u = sum of p[u]: a transposing add tree (46 shuffles and adds
 * instead of 16 separate reductions). */
V16 f16v f16_sum16(const f16v *p) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)  /* chunks 0, 1: key 2i; chunks 2, 3: key 2i + 1 (8 partial lanes each) */
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)  /* chunk c: key 4i + c (4 partial lanes) */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)  /* chunk c: keys 8i + c (lanes 0, 2) and 8i + 4 + c (lanes 1, 3) */
        c[i] = _mm512_add_ps(_mm512_unpacklo_ps(b[2 * i], b[2 * i + 1]), _mm512_unpackhi_ps(b[2 * i], b[2 * i + 1]));
    /* chunk c: keys c, 8 + c, 4 + c, 12 + c */
    const __m512 r = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 13, 9, 5, 1, 14, 10, 6, 2, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(order, r);
}

V16 i16v i16_zero(void) { return _mm512_setzero_si512(); }
V16 w32v w32_from_u8(const uint8_t *p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p)); }
V16 w32v w32_from_i8(const uint8_t *p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)); }
V16 w32v w32_low_nibbles(w32v v) { return _mm512_and_si512(v, _mm512_set1_epi16(0x0F)); }
V16 w32v w32_high_nibbles(w32v v) { return _mm512_srli_epi16(v, 4); }
/* acc[u] += w[2u] * x[0] + w[2u + 1] * x[1] */
V16 i16v i16_dot_pair(i16v acc, w32v w, const int16_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(v));
}

#elif defined(TIER_AVX2)

typedef struct { __m256 lo, hi; } f16v;
typedef struct { __m256i lo, hi; } i16v;
typedef struct { __m256i lo, hi; } w32v; /* lo: int32 lanes 0-7's pairs, hi: 8-15's */

V16 f16v f16_zero(void) { return (f16v){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
V16 f16v f16_load(const float *p) { return (f16v){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
V16 f16v f16_load_half(const uint16_t *p) { /* 16 float16 values (F16C) */
    return (f16v){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                  _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
V16 void f16_store(float *p, f16v v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
V16 f16v f16_set1(float x) { return (f16v){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
V16 f16v f16_add(f16v a, f16v b) { return (f16v){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
V16 f16v f16_sub(f16v a, f16v b) { return (f16v){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
V16 f16v f16_mul(f16v a, f16v b) { return (f16v){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
V16 f16v f16_div(f16v a, f16v b) { return (f16v){_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
V16 f16v f16_fmadd(f16v a, f16v b, f16v c) {
    return (f16v){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
V16 f16v f16_abs(f16v a) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return (f16v){_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
}
V16 float f16_reduce_add(f16v a) { return hsum8(_mm256_add_ps(a.lo, a.hi)); }
V16 f16v f16_from_i32(i16v a) { return (f16v){_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
V16 __m256 mul_where_negative8(__m256 v, __m256 a, __m256 b) {
    return _mm256_blendv_ps(v, _mm256_mul_ps(v, b), _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_LT_OQ));
}
V16 f16v f16_mul_where_negative(f16v v, f16v a, f16v b) {
    return (f16v){mul_where_negative8(v.lo, a.lo, b.lo), mul_where_negative8(v.hi, a.hi, b.hi)};
}

/* exp(x) for x <= 0, the AVX-512 tier's polynomial; 2^n built in the exponent bits (n >= -126: normal). */
V16 __m256 exp_neg8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                                                _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(keep, _mm256_mul_ps(p, scale));
}
V16 f16v f16_exp_neg(f16v x) { return (f16v){exp_neg8(x.lo), exp_neg8(x.hi)}; }

/* lane u = the sum of s[u]'s 8 lanes, u < 8 */
V16 __m256 sum8x8(const __m256 *s) {
    const __m256 t0 = _mm256_hadd_ps(s[0], s[1]), t1 = _mm256_hadd_ps(s[2], s[3]);
    const __m256 t2 = _mm256_hadd_ps(s[4], s[5]), t3 = _mm256_hadd_ps(s[6], s[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3); /* halves: sums of s0..3 / s4..7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
V16 f16v f16_sum16(const f16v *p) {
    __m256 s[16];
    for (int u = 0; u < 16; u++) s[u] = _mm256_add_ps(p[u].lo, p[u].hi);
    return (f16v){sum8x8(s), sum8x8(s + 8)};
}

V16 i16v i16_zero(void) { return (i16v){_mm256_setzero_si256(), _mm256_setzero_si256()}; }
V16 w32v w32_from_u8(const uint8_t *p) {
    return (w32v){_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)),
                  _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)))};
}
V16 w32v w32_from_i8(const uint8_t *p) {
    return (w32v){_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)),
                  _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)))};
}
V16 w32v w32_low_nibbles(w32v v) {
    const __m256i mask = _mm256_set1_epi16(0x0F);
    return (w32v){_mm256_and_si256(v.lo, mask), _mm256_and_si256(v.hi, mask)};
}
V16 w32v w32_high_nibbles(w32v v) { return (w32v){_mm256_srli_epi16(v.lo, 4), _mm256_srli_epi16(v.hi, 4)}; }
V16 i16v i16_dot_pair(i16v acc, w32v w, const int16_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    const __m256i pair = _mm256_set1_epi32(v);
    return (i16v){_mm256_add_epi32(acc.lo, _mm256_madd_epi16(w.lo, pair)),
                  _mm256_add_epi32(acc.hi, _mm256_madd_epi16(w.hi, pair))};
}

#endif
