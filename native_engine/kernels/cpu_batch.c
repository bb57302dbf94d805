/* Batched CPU kernels (4+ activation rows): decode batches, mixed steps and prefill chunks.
 * Compiled into the same library as cpu_kernels.c (see cpu_kernels.py).
 *
 * Tiled blocks: a GGUF Q4_1 / Q8_0 matrix [N, K] repacked once at load so that 16 output rows sit side
 * by side: tile n16 (rows 16*n16 .. +15), group g (32 columns) holds, for Q4_1, 8 chunks of 32 bytes, chunk c
 * covering columns 4c..4c+3: byte 2i = q[i][4c] | q[i][4c+2] << 4, byte 2i+1 = q[i][4c+1] | q[i][4c+3] << 4;
 * for Q8_0, 16 chunks of 32 bytes, chunk c: byte 2i = q[i][2c], byte 2i+1 = q[i][2c+1]. The scales d (and
 * offsets m) follow as [N/16, G, 16] float32. Widened to int16, each 32-bit lane of a chunk is one output
 * row's pair of weights, so one vpdpwssd (AVX512-VNNI) with a broadcast pair of int16 activations does 32
 * multiply-adds for 16 outputs, and the group's scaling is one FMA per 16 outputs and activation row.
 *
 * Activations are quantized per row and group of 32 to int16 (x ~ sx * x16, |error| <= sx / 2 = 1.5e-5 of
 * the group's largest |x|), the same scheme as the 1-3 row kernel; the Q4_1 offsets m enter through the
 * groups' float sums. Without AVX512-VNNI `tiled_available()` is 0 and callers keep the float32 kernels. */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define AI static inline __attribute__((always_inline))
#define TILE 16

/* Repack [N, K] blocks (Q4_1: qs [N, K/2] GGUF nibbles with d, m; Q8_0: qs [N, K] int8 with d, m NULL)
 * into the tiled layout above: qt [N * K / 2] (Q4_1) or [N * K] (Q8_0) bytes, dt and mt [N * K / 32]. */
void tile_blocks(const uint8_t *qs, const float *d, const float *m, int64_t N, int64_t K, uint8_t *qt, float *dt,
                 float *mt) {
    const int64_t G = K / 32;
    for (int64_t t = 0; t < N / TILE; t++) {
        for (int64_t g = 0; g < G; g++) {
            for (int i = 0; i < TILE; i++) {
                const int64_t n = t * TILE + i, at = (t * G + g) * TILE + i;
                dt[at] = d[n * G + g];
                if (m != NULL) mt[at] = m[n * G + g];
            }
            if (m == NULL) {
                uint8_t *o = qt + (t * G + g) * 512;
                for (int c = 0; c < 16; c++)
                    for (int i = 0; i < TILE; i++) {
                        const uint8_t *b = qs + (t * TILE + i) * K + g * 32;
                        o[c * 32 + 2 * i] = b[2 * c];
                        o[c * 32 + 2 * i + 1] = b[2 * c + 1];
                    }
            } else {
                uint8_t *o = qt + (t * G + g) * 256;
                for (int i = 0; i < TILE; i++) {
                    const uint8_t *b = qs + (t * TILE + i) * (K / 2) + g * 16;
                    uint8_t q[32];
                    for (int j = 0; j < 16; j++) {
                        q[j] = b[j] & 15;
                        q[j + 16] = b[j] >> 4;
                    }
                    for (int c = 0; c < 8; c++) {
                        o[c * 32 + 2 * i] = q[4 * c] | (q[4 * c + 2] << 4);
                        o[c * 32 + 2 * i + 1] = q[4 * c + 1] | (q[4 * c + 3] << 4);
                    }
                }
            }
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)

int tiled_available(void) { return 1; }

/* x [T, K] -> x16 [T, K] int16, sx and xsum [T, K / 32] (scale and float sum of each group). */
static void quantize_rows16(const float *x, int64_t T, int64_t K, int16_t *x16, float *sx, float *xsum,
                            int num_threads) {
    const int64_t G = K / 32;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (T * K >= 65536)
    for (int64_t r = 0; r < T * G; r++) {
        const float *xg = x + r * 32;
        __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        __m512 vi = _mm512_set1_ps(inv);
        __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vi)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vi));
        _mm256_storeu_si256((__m256i *)(x16 + r * 32), _mm512_cvtsepi32_epi16(qa));
        _mm256_storeu_si256((__m256i *)(x16 + r * 32 + 16), _mm512_cvtsepi32_epi16(qb));
        sx[r] = amax / 32767.0f;
        xsum[r] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    }
}

AI __m512i pair(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* 16 output rows (tile n16) times TT activation rows t0..; out[t, 16 * n16 ..] written. */
AI void tiled_rows(int is_q8, const int16_t *x16, const float *sx, const float *xsum, int64_t K, int64_t t0,
                   const uint8_t *qt, const float *dt, const float *mt, int64_t n16, int64_t N, float *out,
                   const int TT) {
    const int64_t G = K / 32;
    const __m512i mask = _mm512_set1_epi16(0x0F);
    __m512 acc[TT];
    for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m512i s[TT];
        for (int t = 0; t < TT; t++) s[t] = _mm512_setzero_si512();
        const int16_t *xg = x16 + t0 * K + g * 32;
        if (is_q8) {
            const uint8_t *b = qt + (n16 * G + g) * 512;
            for (int c = 0; c < 16; c++) {
                __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b + 32 * c)));
                for (int t = 0; t < TT; t++) s[t] = _mm512_dpwssd_epi32(s[t], w, pair(xg + t * K + 2 * c));
            }
        } else {
            const uint8_t *b = qt + (n16 * G + g) * 256;
            for (int c = 0; c < 8; c++) {
                __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 32 * c)));
                __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_srli_epi16(v, 4);
                for (int t = 0; t < TT; t++) {
                    s[t] = _mm512_dpwssd_epi32(s[t], lo, pair(xg + t * K + 4 * c));
                    s[t] = _mm512_dpwssd_epi32(s[t], hi, pair(xg + t * K + 4 * c + 2));
                }
            }
        }
        const __m512 dv = _mm512_loadu_ps(dt + (n16 * G + g) * TILE);
        for (int t = 0; t < TT; t++) {
            const int64_t r = (t0 + t) * G + g;
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dv, _mm512_set1_ps(sx[r])), acc[t]);
        }
        if (!is_q8) {
            const __m512 mv = _mm512_loadu_ps(mt + (n16 * G + g) * TILE);
            for (int t = 0; t < TT; t++) acc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsum[(t0 + t) * G + g]), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) _mm512_storeu_ps(out + (t0 + t) * N + n16 * TILE, acc[t]);
}

AI void tiled_tile(int is_q8, const int16_t *x16, const float *sx, const float *xsum, int64_t T, int64_t K,
                   const uint8_t *qt, const float *dt, const float *mt, int64_t n16, int64_t N, float *out) {
    int64_t t = 0;
    for (; t + 8 <= T; t += 8) tiled_rows(is_q8, x16, sx, xsum, K, t, qt, dt, mt, n16, N, out, 8);
    if (t + 4 <= T) {
        tiled_rows(is_q8, x16, sx, xsum, K, t, qt, dt, mt, n16, N, out, 4);
        t += 4;
    }
    if (t + 2 <= T) {
        tiled_rows(is_q8, x16, sx, xsum, K, t, qt, dt, mt, n16, N, out, 2);
        t += 2;
    }
    if (t < T) tiled_rows(is_q8, x16, sx, xsum, K, t, qt, dt, mt, n16, N, out, 1);
}

/* Rows are taken ROW_BLOCK at a time so one block's int16 activations stay in L2 across the weight tiles. */
#define ROW_BLOCK 64

static void tiled_matmul_q(int is_q8, const int16_t *x16, const float *sx, const float *xsum, int64_t T, int64_t K,
                           const uint8_t *qt, const float *dt, const float *mt, int64_t N, float *out,
                           int num_threads) {
    const int64_t tiles = N / TILE, blocks = (T + ROW_BLOCK - 1) / ROW_BLOCK, G = K / 32;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t n16 = 0; n16 < tiles; n16++) {
            const int64_t t0 = b * ROW_BLOCK, rows = T - t0 < ROW_BLOCK ? T - t0 : ROW_BLOCK;
            if (is_q8)
                tiled_tile(1, x16 + t0 * K, sx + t0 * G, xsum + t0 * G, rows, K, qt, dt, mt, n16, N, out + t0 * N);
            else
                tiled_tile(0, x16 + t0 * K, sx + t0 * G, xsum + t0 * G, rows, K, qt, dt, mt, n16, N, out + t0 * N);
        }
}

/* out [T, N] = x [T, K] @ W.T for W as tiled blocks (mt NULL: Q8_0). N a multiple of 16, K of 32. */
void tiled_matmul(const float *x, int64_t T, int64_t K, const uint8_t *qt, const float *dt, const float *mt, int64_t N,
                  float *out, int num_threads) {
    static __thread void *buf = NULL; /* reused: a fresh large allocation per call costs page faults */
    static __thread int64_t buf_bytes = 0;
    const int64_t G = K / 32, x16_bytes = ((T * K * 2 + 63) / 64) * 64, bytes = x16_bytes + sizeof(float) * T * G * 2;
    if (bytes > buf_bytes) {
        free(buf);
        buf = aligned_alloc(64, ((bytes + 63) / 64) * 64);
        buf_bytes = ((bytes + 63) / 64) * 64;
    }
    int16_t *x16 = buf;
    float *sx = (float *)((char *)buf + x16_bytes), *xsum = sx + T * G;
    quantize_rows16(x, T, K, x16, sx, xsum, num_threads);
    tiled_matmul_q(mt == NULL, x16, sx, xsum, T, K, qt, dt, mt, N, out, num_threads);
}

/* exp(x) for x <= 0 (softmax weights): 2^n * p(r), |relative error| ~ 2e-7; lanes below -87 give 0. */
AI __m512 exp_neg(__m512 x) {
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

/* out[t, i] = silu(x[t, i]) * x[t, I + i] for x [T, 2I], out [T, I]; rows split over threads, 16 lanes at a
 * time (sigmoid from exp(-|a|), so nothing overflows); I a multiple of 16. */
void silu_mul_rows(const float *x, int64_t T, int64_t I, float *out, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (T * I >= 16384)
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < I; i += 16) {
            const __m512 a = _mm512_loadu_ps(x + t * 2 * I + i), b = _mm512_loadu_ps(x + t * 2 * I + I + i);
            const __m512 e = exp_neg(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(a)));
            const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
            const __mmask16 neg = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ);
            const __m512 sig = _mm512_mask_mul_ps(inv, neg, inv, e);
            _mm512_storeu_ps(out + t * I + i, _mm512_mul_ps(_mm512_mul_ps(a, sig), b));
        }
}

/* The 16 horizontal sums of p[0..15], lane u = sum of p[u]: a transposing add tree (46 shuffles and adds
 * instead of 16 separate reductions). */
AI __m512 sum16(const __m512 *p) {
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

/* One sequence's query heads of one KV head (`group` of them, <= 8) over its paged cache: all scores first,
 * then a plain softmax and the weighted sum of values; each key and value row is read once for the group. */
AI void attend_group(const float *q, const float *k_cache, const float *v_cache, const int64_t *at, int64_t len,
                     float scale, int group, float *scores, float *out, const int DV) {
    const int64_t D = DV * 16;
    int64_t j = 0;
    for (int64_t u = 0; u < len; u++) /* every key and value row of the task towards L2 at once */
        for (int i = 0; i < DV; i++) {
            _mm_prefetch((const char *)(k_cache + at[u] + 16 * i), _MM_HINT_T1);
            _mm_prefetch((const char *)(v_cache + at[u] + 16 * i), _MM_HINT_T1);
        }
    for (; j + 16 <= len; j += 16) {
        const float *k[16];
        for (int u = 0; u < 16; u++) {
            k[u] = k_cache + at[j + u];
            if (j + 32 + u < len) /* L2 -> L1, two iterations ahead */
                for (int i = 0; i < DV; i++) _mm_prefetch((const char *)(k_cache + at[j + 32 + u] + 16 * i), _MM_HINT_T0);
        }
        for (int h = 0; h < group; h++) {
            __m512 qv[DV], part[16];
            for (int i = 0; i < DV; i++) qv[i] = _mm512_loadu_ps(q + h * D + 16 * i);
            for (int u = 0; u < 16; u++) {
                part[u] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k[u]));
                for (int i = 1; i < DV; i++) part[u] = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(k[u] + 16 * i), part[u]);
            }
            _mm512_storeu_ps(scores + h * len + j, _mm512_mul_ps(sum16(part), _mm512_set1_ps(scale)));
        }
    }
    for (; j < len; j++) {
        const float *k = k_cache + at[j];
        for (int h = 0; h < group; h++) {
            __m512 s = _mm512_mul_ps(_mm512_loadu_ps(k), _mm512_loadu_ps(q + h * D));
            for (int i = 1; i < DV; i++) s = _mm512_fmadd_ps(_mm512_loadu_ps(k + 16 * i), _mm512_loadu_ps(q + h * D + 16 * i), s);
            scores[h * len + j] = _mm512_reduce_add_ps(s) * scale;
        }
    }
    for (int h = 0; h < group; h++) {
        float *sc = scores + h * len, mx = -INFINITY, sum = 0.0f;
        for (j = 0; j < len; j++) mx = sc[j] > mx ? sc[j] : mx;
        const __m512 vmx = _mm512_set1_ps(mx);
        __m512 vsum = _mm512_setzero_ps();
        j = 0;
        for (; j + 16 <= len; j += 16) {
            __m512 e = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(sc + j), vmx));
            _mm512_storeu_ps(sc + j, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        sum = _mm512_reduce_add_ps(vsum);
        for (; j < len; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        const float inv = 1.0f / sum;
        for (j = 0; j < len; j++) sc[j] *= inv;
    }
    __m512 acc[8][DV];
    for (int h = 0; h < group; h++)
        for (int i = 0; i < DV; i++) acc[h][i] = _mm512_setzero_ps();
    for (j = 0; j < len; j++) {
        const float *v = v_cache + at[j];
        if (j + 16 < len)
            for (int i = 0; i < DV; i++) _mm_prefetch((const char *)(v_cache + at[j + 16] + 16 * i), _MM_HINT_T0);
        __m512 vv[DV];
        for (int i = 0; i < DV; i++) vv[i] = _mm512_loadu_ps(v + 16 * i);
        for (int h = 0; h < group; h++) {
            const __m512 p = _mm512_set1_ps(scores[h * len + j]);
            for (int i = 0; i < DV; i++) acc[h][i] = _mm512_fmadd_ps(p, vv[i], acc[h][i]);
        }
    }
    for (int h = 0; h < group; h++)
        for (int i = 0; i < DV; i++) _mm512_storeu_ps(out + h * D + 16 * i, acc[h][i]);
}

/* Decode attention for B one-token rows: q rows at q + b * q_stride ([nh, D]); out [B, nh * D].
 * Caches [num_blocks, block_size, nkv, D]; D 64 or 128; nh / nkv <= 8. */
static void attention_batch(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                            const int32_t *block_tables, const int32_t *context_lens, float scale, int64_t B,
                            int64_t nh, int64_t nkv, int64_t D, int64_t block_size, int64_t W, float *out,
                            int num_threads) {
    const int group = (int)(nh / nkv);
    const int64_t token_stride = nkv * D, block_stride = block_size * token_stride;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t b = 0; b < B; b++)
        for (int64_t kvh = 0; kvh < nkv; kvh++) {
            const int64_t len = context_lens[b];
            int64_t *at = malloc(sizeof(int64_t) * len + sizeof(float) * group * (len + 16)); /* key offsets */
            float *scores = (float *)(at + len);
            for (int64_t j = 0, i = 0; j < len; i++)
                for (int64_t u = 0; u < block_size && j < len; u++, j++)
                    at[j] = block_tables[b * W + i] * block_stride + u * token_stride;
            const float *qh = q + b * q_stride + kvh * group * D;
            float *oh = out + b * nh * D + kvh * group * D;
            const float *kc = k_cache + kvh * D, *vc = v_cache + kvh * D;
            if (D == 64)
                attend_group(qh, kc, vc, at, len, scale, group, scores, oh, 4);
            else
                attend_group(qh, kc, vc, at, len, scale, group, scores, oh, 8);
            free(at);
        }
}

int attention_batch_serves(int64_t nh, int64_t nkv, int64_t D) {
    return (D == 64 || D == 128) && nh % nkv == 0 && nh / nkv <= 8;
}

/* attention_batch on contiguous queries [B, nh, D] (for tests and callers outside llama_decode_batch). */
void paged_attention_batch(const float *q, const float *k_cache, const float *v_cache, const int32_t *block_tables,
                           const int32_t *context_lens, float scale, int64_t B, int64_t nh, int64_t nkv, int64_t D,
                           int64_t block_size, int64_t W, float *out, int num_threads) {
    attention_batch(q, nh * D, k_cache, v_cache, block_tables, context_lens, scale, B, nh, nkv, D, block_size, W, out,
                    num_threads);
}

void add_rms_norm(const float *x, const float *residual, const float *weight, float eps, int64_t T, int64_t H,
                  float *out, float *residual_out);
void rotary_neox(float *x, int64_t T, int64_t row_stride, int64_t heads, int64_t D, const int64_t *positions,
                 const float *cos_sin);
void cache_write(const float *key, const float *value, int64_t T, int64_t key_stride, int64_t value_stride,
                 int64_t width, const int64_t *slots, float *k_cache, float *v_cache);
void silu_and_mul(const float *x, int64_t T, int64_t I, float *out);

/* The same decoder stack as llama_decode (cpu_kernels.c), for batches of 4+ one-token rows: the 17 pointers
 * per layer are those of llama_decode with each linear's (qs, d, m) replaced by its tiled (qt, dt, mt). */
void llama_decode_batch(int64_t L, int64_t T, float *hidden, const int64_t *positions, const int64_t *slots,
                        const int32_t *block_tables, const int32_t *context_lens, int64_t W, int64_t H, int64_t nh,
                        int64_t nkv, int64_t D, int64_t I, float eps, const float *cos_sin, int64_t block_size,
                        const int64_t *w, const float *final_norm, float scale, int num_threads) {
    const int64_t Q = nh * D, KV = nkv * D, QKV = Q + 2 * KV, KMAX = I > H ? (I > Q ? I : Q) : (H > Q ? H : Q);
    float *buf = malloc(sizeof(float) * T * (2 * H + QKV + Q + 3 * I + 2 * (KMAX / 32)));
    float *residual = buf, *h = residual + T * H, *qkv = h + T * H, *attn = qkv + T * QKV, *gu = attn + T * Q,
          *act = gu + T * 2 * I, *sx = act + T * I, *xsum = sx + T * (KMAX / 32);
    int16_t *x16 = aligned_alloc(64, ((T * KMAX * 2 + 63) / 64) * 64);
#define MATMUL(x, K, i, N, out)                                                                                   \
    do {                                                                                                         \
        quantize_rows16(x, T, K, x16, sx, xsum, num_threads);                                                    \
        tiled_matmul_q(0, x16, sx, xsum, T, K, (const uint8_t *)p[i], (const float *)p[(i) + 1],                 \
                       (const float *)p[(i) + 2], N, out, num_threads);                                          \
    } while (0)
    for (int64_t l = 0; l < L; l++) {
        const int64_t *p = w + l * 17;
        const float *in_norm = (const float *)p[13], *post_norm = (const float *)p[14];
        float *k_cache = (float *)p[15], *v_cache = (float *)p[16];
        if (l == 0) {
            memcpy(residual, hidden, sizeof(float) * T * H);
            add_rms_norm(hidden, NULL, in_norm, eps, T, H, h, NULL);
        } else {
            add_rms_norm(hidden, residual, in_norm, eps, T, H, h, residual);
        }
        MATMUL(h, H, 0, QKV, qkv);
        if (p[3])
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < QKV; i++) qkv[t * QKV + i] += ((const float *)p[3])[i];
        rotary_neox(qkv, T, QKV, nh, D, positions, cos_sin);
        rotary_neox(qkv + Q, T, QKV, nkv, D, positions, cos_sin);
        cache_write(qkv + Q, qkv + Q + KV, T, QKV, QKV, KV, slots, k_cache, v_cache);
        attention_batch(qkv, QKV, k_cache, v_cache, block_tables, context_lens, scale, T, nh, nkv, D, block_size, W,
                        attn, num_threads);
        MATMUL(attn, Q, 4, H, hidden);
        add_rms_norm(hidden, residual, post_norm, eps, T, H, h, residual);
        MATMUL(h, H, 7, 2 * I, gu);
        if (I % 16 == 0)
            silu_mul_rows(gu, T, I, act, num_threads);
        else
            silu_and_mul(gu, T, I, act);
        MATMUL(act, I, 10, H, hidden);
    }
#undef MATMUL
    add_rms_norm(hidden, residual, final_norm, eps, T, H, h, residual);
    memcpy(hidden, h, sizeof(float) * T * H);
    free(x16);
    free(buf);
}

#else

int tiled_available(void) { return 0; }

void tiled_matmul(const float *x, int64_t T, int64_t K, const uint8_t *qt, const float *dt, const float *mt, int64_t N,
                  float *out, int num_threads) {
    (void)x, (void)T, (void)K, (void)qt, (void)dt, (void)mt, (void)N, (void)out, (void)num_threads;
    abort(); /* callers check tiled_available() first */
}

int attention_batch_serves(int64_t nh, int64_t nkv, int64_t D) {
    (void)nh, (void)nkv, (void)D;
    return 0;
}

void paged_attention_batch(const float *q, const float *k_cache, const float *v_cache, const int32_t *block_tables,
                           const int32_t *context_lens, float scale, int64_t B, int64_t nh, int64_t nkv, int64_t D,
                           int64_t block_size, int64_t W, float *out, int num_threads) {
    abort(); /* callers check tiled_available() first */
}

void silu_mul_rows(const float *x, int64_t T, int64_t I, float *out, int num_threads) {
    abort(); /* callers check tiled_available() first */
}

void llama_decode_batch(int64_t L, int64_t T, float *hidden, const int64_t *positions, const int64_t *slots,
                        const int32_t *block_tables, const int32_t *context_lens, int64_t W, int64_t H, int64_t nh,
                        int64_t nkv, int64_t D, int64_t I, float eps, const float *cos_sin, int64_t block_size,
                        const int64_t *w, const float *final_norm, float scale, int num_threads) {
    abort(); /* callers check tiled_available() first */
}

#endif
