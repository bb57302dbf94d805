/* Batched CPU kernels (4+ activation rows): decode batches, mixed steps and prefill chunks.
 * Compiled into the same library as cpu_kernels.c (see cpu_kernels.py).
 *
 * Tiled blocks: a GGUF Q4_1 / Q8_0 matrix [N, K] repacked once at load so that 16 output rows sit side
 * by side: tile n16 (rows 16*n16 .. +15), group g (32 columns) holds, for Q4_1, 8 chunks of 32 bytes, chunk c
 * covering columns 4c..4c+3: byte 2i = q[i][4c] | q[i][4c+2] << 4, byte 2i+1 = q[i][4c+1] | q[i][4c+3] << 4;
 * for Q8_0, 16 chunks of 32 bytes, chunk c: byte 2i = q[i][2c], byte 2i+1 = q[i][2c+1]. The scales d (and
 * offsets m) follow as [N/16, G, 16] float32. Widened to int16, each 32-bit lane of a chunk is one output
 * row's pair of weights, so one vpdpwssd (AVX512-VNNI; two vpmaddwd on AVX2) with a broadcast pair of int16 activations does 32
 * multiply-adds for 16 outputs, and the group's scaling is one FMA per 16 outputs and activation row.
 *
 * Activations are quantized per row and group of 32 to int16 (x ~ sx * x16, |error| <= sx / 2 = 1.5e-5 of
 * the group's largest |x|), the same scheme as the 1-3 row kernel; the Q4_1 offsets m enter through the
 * groups' float sums. The kernels are written over cpu_simd16.h's 16-lane vectors: one zmm register on the AVX-512
 * tier (vpdpwssd), two ymm registers on the AVX2 tier (vpmaddwd + vpaddd: the same integer sums). On neither tier
 * `tiled_available()` is 0 and callers keep the float32 kernels. */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "cpu_simd16.h"

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

#if defined(TIER_AVX512) || defined(TIER_AVX2)

int tiled_available(void) { return 1; }

/* Group r (32 values at x + 32 r) -> x16, sx[r], xsum[r] (cpu_step.h). */
AI void quantize_group16(const float *x, int64_t r, int16_t *x16, float *sx, float *xsum) {
    quantize_x16(x + r * 32, 32, x16 + r * 32, sx + r, xsum + r);
}

/* x [T, K] -> x16 [T, K] int16, sx and xsum [T, K / 32] (scale and float sum of each group). */
static void quantize_rows16(const float *x, int64_t T, int64_t K, int16_t *x16, float *sx, float *xsum,
                            int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (T * K >= 65536)
    for (int64_t r = 0; r < T * (K / 32); r++) quantize_group16(x, r, x16, sx, xsum);
}

#ifdef TIER_AVX2
/* The same on AVX2, the tile taken as two halves of 8 output rows (one ymm register of int32 sums each), so TT
 * (<= 4) rows of sums and accumulators stay within the 16 ymm registers; each half widens only its own bytes. */
AI __m256i pair8(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

AI void tiled_rows(int is_q8, const int16_t *x16, const float *sx, const float *xsum, int64_t K, int64_t t0,
                   const uint8_t *qt, const float *dt, const float *mt, int64_t n16, int64_t N, float *out,
                   const int TT) {
    const int64_t G = K / 32;
    const __m256i mask = _mm256_set1_epi16(0x0F);
    for (int half = 0; half < 2; half++) {
        __m256 acc[4];
        for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            __m256i s[4];
            for (int t = 0; t < TT; t++) s[t] = _mm256_setzero_si256();
            const int16_t *xg = x16 + t0 * K + g * 32;
            if (is_q8) {
                const uint8_t *b = qt + (n16 * G + g) * 512 + 16 * half;
                for (int c = 0; c < 16; c++) {
                    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 32 * c)));
                    for (int t = 0; t < TT; t++)
                        s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(w, pair8(xg + t * K + 2 * c)));
                }
            } else {
                const uint8_t *b = qt + (n16 * G + g) * 256 + 16 * half;
                for (int c = 0; c < 8; c++) {
                    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + 32 * c)));
                    const __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_srli_epi16(v, 4);
                    for (int t = 0; t < TT; t++)
                        s[t] = _mm256_add_epi32(s[t], _mm256_add_epi32(_mm256_madd_epi16(lo, pair8(xg + t * K + 4 * c)),
                                                                       _mm256_madd_epi16(hi, pair8(xg + t * K + 4 * c + 2))));
                }
            }
            const __m256 dv = _mm256_loadu_ps(dt + (n16 * G + g) * TILE + 8 * half);
            for (int t = 0; t < TT; t++)
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(dv, _mm256_set1_ps(sx[(t0 + t) * G + g])),
                                         acc[t]);
            if (!is_q8) {
                const __m256 mv = _mm256_loadu_ps(mt + (n16 * G + g) * TILE + 8 * half);
                for (int t = 0; t < TT; t++) acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xsum[(t0 + t) * G + g]), acc[t]);
            }
        }
        for (int t = 0; t < TT; t++) _mm256_storeu_ps(out + (t0 + t) * N + 8 * half, acc[t]);
    }
}
#define TILED_ROWS_MAX 4
#else
/* 16 output rows (tile n16) times TT activation rows t0..: out[t * N ..  t * N + 15] written (out: the tile's
 * first column, N: the row stride). */
AI void tiled_rows(int is_q8, const int16_t *x16, const float *sx, const float *xsum, int64_t K, int64_t t0,
                   const uint8_t *qt, const float *dt, const float *mt, int64_t n16, int64_t N, float *out,
                   const int TT) {
    const int64_t G = K / 32;
    f16v acc[8]; /* TT <= 8: fixed sizes keep them in registers (a VLA lives on the stack) */
    for (int t = 0; t < TT; t++) acc[t] = f16_zero();
    for (int64_t g = 0; g < G; g++) {
        i16v s[8];
        for (int t = 0; t < TT; t++) s[t] = i16_zero();
        const int16_t *xg = x16 + t0 * K + g * 32;
        if (is_q8) {
            const uint8_t *b = qt + (n16 * G + g) * 512;
            for (int c = 0; c < 16; c++) {
                const w32v w = w32_from_i8(b + 32 * c);
                for (int t = 0; t < TT; t++) s[t] = i16_dot_pair(s[t], w, xg + t * K + 2 * c);
            }
        } else {
            const uint8_t *b = qt + (n16 * G + g) * 256;
            for (int c = 0; c < 8; c++) {
                const w32v v = w32_from_u8(b + 32 * c), lo = w32_low_nibbles(v), hi = w32_high_nibbles(v);
                for (int t = 0; t < TT; t++) {
                    s[t] = i16_dot_pair(s[t], lo, xg + t * K + 4 * c);
                    s[t] = i16_dot_pair(s[t], hi, xg + t * K + 4 * c + 2);
                }
            }
        }
        const f16v dv = f16_load(dt + (n16 * G + g) * TILE);
        for (int t = 0; t < TT; t++) {
            const int64_t r = (t0 + t) * G + g;
            acc[t] = f16_fmadd(f16_from_i32(s[t]), f16_mul(dv, f16_set1(sx[r])), acc[t]);
        }
        if (!is_q8) {
            const f16v mv = f16_load(mt + (n16 * G + g) * TILE);
            for (int t = 0; t < TT; t++) acc[t] = f16_fmadd(mv, f16_set1(xsum[(t0 + t) * G + g]), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) f16_store(out + (t0 + t) * N, acc[t]);
}

#define TILED_ROWS_MAX 8
#endif

AI void tiled_tile(int is_q8, const int16_t *x16, const float *sx, const float *xsum, int64_t T, int64_t K,
                   const uint8_t *qt, const float *dt, const float *mt, int64_t n16, int64_t N, float *out) {
    int64_t t = 0;
#if TILED_ROWS_MAX == 8
    for (; t + 8 <= T; t += 8) tiled_rows(is_q8, x16, sx, xsum, K, t, qt, dt, mt, n16, N, out, 8);
#else
    for (; t + 4 <= T; t += 4) tiled_rows(is_q8, x16, sx, xsum, K, t, qt, dt, mt, n16, N, out, 4);
#endif
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

/* ---- LoRA (Punica's BGMV) on tiles: the shrink u = x · Aᵀ of every adapter row first, then each matmul tile adds
 * its rows' expand u · Bᵀ while it is hot (llama_decode_batch per op, tiled_matmul_lora per prefill linear). */

/* One linear's resident LoRA adapters (lora/punica.py's `LoRALayer`), stacked over slots and stored as float16: each
 * slot's rank (columns in use) in ranks, and the non-zero blocks of its Bᵀ (B transposed, alpha / r folded in; one
 * block per shard of a packed linear) in blocks [slots, nb, 4]: first column, end column, first output, end output
 * (unused: all 0); a NULL: no adapter on this linear. */
typedef struct {
    const uint16_t *a;     /* [slots, R, K] */
    const uint16_t *tiles; /* Bᵀ per slot in [N / 16, RS, 16]: per 16 outputs the rank rows of the block reaching
                              them, packed at the slot's rank (tile n16 at n16 * rank * 16) */
    const int32_t *ranks, *blocks;
    int64_t R, nb, RS;
} lora_t;

/* From the 7 fields Python writes per linear (a, tiles, ranks, R, blocks, nb, RS: models/cpu_decode.py). */
static lora_t lora_from(const int64_t *e) {
    return (lora_t){(const uint16_t *)e[0], (const uint16_t *)e[1], (const int32_t *)e[2], (const int32_t *)e[4], e[3],
                    e[5], e[6]};
}

#ifdef TIER_AVX2
#define LORA_RUN 4 /* rows of one slot the shrink and the expand take at once: 16 ymm registers hold 8 f16v sums */
#else
#define LORA_RUN 8 /* 32 zmm registers: 16 sums (each chunk of A or Bᵀ widened once for 8 rows) */
#endif

/* u[j, r .. r + RA - 1] (row stride R) = rows r .. of A (float16, [rank, K]) · x[j] for the n (<= LORA_RUN) rows
 * x [n, K]: each A chunk widened once for the n rows, RA * n (<= 16) independent sums, ended by one transposing add
 * tree when there are 8 or more of them (`f16_sum16`: ~3 instructions a sum instead of ~8). */
AI void shrink_block(const uint16_t *a, const float *x, int64_t K, int64_t r, float *u, int64_t R, const int n,
                     const int RA) {
    f16v acc[4][8];
    for (int i = 0; i < RA; i++)
        for (int j = 0; j < n; j++) acc[i][j] = f16_zero();
    for (int64_t k = 0; k < K; k += 16) {
        f16v w[4];
        for (int i = 0; i < RA; i++) w[i] = f16_load_half(a + (r + i) * K + k);
        for (int j = 0; j < n; j++) {
            const f16v xv = f16_load(x + j * K + k);
            for (int i = 0; i < RA; i++) acc[i][j] = f16_fmadd(w[i], xv, acc[i][j]);
        }
    }
    if (RA * n < 8) {
        for (int i = 0; i < RA; i++)
            for (int j = 0; j < n; j++) u[j * R + r + i] = f16_reduce_add(acc[i][j]);
        return;
    }
    f16v p[16];
    float sums[16];
    for (int q = 0; q < 16; q++) p[q] = q < RA * n ? acc[q / n][q % n] : f16_zero();
    f16_store(sums, f16_sum16(p));
    for (int i = 0; i < RA; i++)
        for (int j = 0; j < n; j++) u[j * R + r + i] = sums[i * n + j];
}

/* u [n, R] = x [n, K] · A[:rank]ᵀ: 4 rows of A at a time for 1-2 rows of x (and 3-4 on AVX-512), 2 for more (the
 * sums stay in registers). */
AI void shrink_rows(const uint16_t *a, const float *x, int64_t K, int64_t rank, float *u, int64_t R, const int n) {
    const int RA = 4 * n <= 2 * LORA_RUN ? 4 : 2;
    int64_t r = 0;
    for (; r + RA <= rank; r += RA) shrink_block(a, x, K, r, u, R, n, RA);
    for (; r < rank; r++) shrink_block(a, x, K, r, u, R, n, 1);
}

/* u [n, ldu] = x [n, K] · A[slot][:rank]ᵀ for n (1..LORA_RUN) rows of one slot. */
static void lora_shrink(const lora_t *lora, int32_t slot, const float *x, int64_t K, float *u, int64_t ldu, int64_t n) {
    const int64_t rank = lora->ranks[slot];
    const uint16_t *a = lora->a + slot * lora->R * K;
    for (int64_t i = 0; i < rank * K; i += 32) /* all of A's rows requested at once (read 2-4 at a time, each a short */
        _mm_prefetch((const char *)(a + i), _MM_HINT_T0); /* stream): what `prefetch_shrink` did not bring, or lost */
    switch (n) { /* a constant n: the sums' arrays unrolled into registers */
    case 1: shrink_rows(a, x, K, rank, u, ldu, 1); break;
    case 2: shrink_rows(a, x, K, rank, u, ldu, 2); break;
    case 3: shrink_rows(a, x, K, rank, u, ldu, 3); break;
#if LORA_RUN == 8
    case 4: shrink_rows(a, x, K, rank, u, ldu, 4); break;
    case 5: shrink_rows(a, x, K, rank, u, ldu, 5); break;
    case 6: shrink_rows(a, x, K, rank, u, ldu, 6); break;
    case 7: shrink_rows(a, x, K, rank, u, ldu, 7); break;
    default: shrink_rows(a, x, K, rank, u, ldu, 8);
#else
    default: shrink_rows(a, x, K, rank, u, ldu, 4);
#endif
    }
}

/* The shrink of a prefill's rows, SHRINK_ROWS rows of one slot at a time: u [n, 16 C] = x [n, K] · at (A[slot]ᵀ
 * widened, [K, RP] float32; columns c0 ..), each sum a vector of 16 ranks, so no horizontal sums (the dot products of
 * `shrink_rows` end in one per rank and row, and re-read A for every 4 rows): a broadcast of x[t][k] feeds C FMAs.
 * ~1.3x `shrink_rows`' rate at rank 16, ~1.9x at 32 and 48 (AVX-512). */
AI void shrink_cols(const float *at, int64_t RP, const float *x, int64_t K, float *u, int64_t ldu, const int n,
                    const int C) {
    f16v acc[8][3];
    for (int j = 0; j < n; j++)
        for (int c = 0; c < C; c++) acc[j][c] = f16_zero();
    for (int64_t k = 0; k < K; k++) {
        f16v w[3];
        for (int c = 0; c < C; c++) w[c] = f16_load(at + k * RP + 16 * c);
        for (int j = 0; j < n; j++) {
            const f16v xv = f16_set1(x[j * K + k]);
            for (int c = 0; c < C; c++) acc[j][c] = f16_fmadd(xv, w[c], acc[j][c]);
        }
    }
    for (int j = 0; j < n; j++)
        for (int c = 0; c < C; c++) f16_store(u + j * ldu + 16 * c, acc[j][c]);
}

#define SHRINK_ROWS 8
#ifdef TIER_AVX2 /* 16 ymm registers: 4 rows x 1 vector (2 ymm each) of sums at a time */
AI void shrink_group(const float *at, int64_t RP, const float *x, int64_t K, float *u, int64_t ldu) {
    for (int64_t c = 0; c < RP; c += 16)
        for (int h = 0; h < SHRINK_ROWS; h += 4) shrink_cols(at + c, RP, x + h * K, K, u + h * ldu + c, ldu, 4, 1);
}
#else /* 32 zmm registers: 8 rows x up to 3 vectors of sums */
AI void shrink_group(const float *at, int64_t RP, const float *x, int64_t K, float *u, int64_t ldu) {
    for (int64_t c = 0; c < RP; c += 48) {
        if (RP - c >= 48) shrink_cols(at + c, RP, x, K, u + c, ldu, SHRINK_ROWS, 3);
        else if (RP - c == 32) shrink_cols(at + c, RP, x, K, u + c, ldu, SHRINK_ROWS, 2);
        else shrink_cols(at + c, RP, x, K, u + c, ldu, SHRINK_ROWS, 1);
    }
}
#endif

/* at [K, RP] = A[:rank]ᵀ widened, columns rank .. RP - 1 zeros; rows k0 .. k1 - 1. */
static void transpose_a(const uint16_t *a, int64_t rank, int64_t K, int64_t k0, int64_t k1, float *at, int64_t RP) {
    for (int64_t k = k0; k < k1; k++)
        for (int64_t r = 0; r < RP; r++) at[k * RP + r] = r < rank ? _cvtsh_ss(a[r * K + k]) : 0.0f;
}

/* out rows [n, 16] (row stride ld) += u [n, R] (its columns from c0 on) · w [rank, 16] (float16) for n (<= LORA_RUN)
 * rows: the sums over even and odd rank rows in registers of their own, so the FMAs run as 2 n chains; each row of w
 * widened once for the n rows (u[j][r] enters as an FMA's broadcast memory operand). */
AI void expand_rows(const uint16_t *w, int64_t rank, const float *u, int64_t R, int64_t c0, float *out, int64_t ld,
                    const int n) {
    f16v even[8], odd[8];
    for (int j = 0; j < n; j++) even[j] = f16_load(out + j * ld), odd[j] = f16_zero();
    int64_t r = 0;
    for (; r + 2 <= rank; r += 2) {
        const f16v w0 = f16_load_half(w + r * TILE), w1 = f16_load_half(w + (r + 1) * TILE);
        for (int j = 0; j < n; j++) {
            even[j] = f16_fmadd(f16_set1(u[j * R + c0 + r]), w0, even[j]);
            odd[j] = f16_fmadd(f16_set1(u[j * R + c0 + r + 1]), w1, odd[j]);
        }
    }
    if (r < rank)
        for (int j = 0; j < n; j++) even[j] = f16_fmadd(f16_set1(u[j * R + c0 + r]), f16_load_half(w + r * TILE), even[j]);
    for (int j = 0; j < n; j++) f16_store(out + j * ld, f16_add(even[j], odd[j]));
}

/* expand_rows for a constant n (1..LORA_RUN): the sums stay in registers. */
AI void expand_run(const uint16_t *w, int64_t rank, const float *u, int64_t ldu, int64_t c0, float *out, int64_t ld,
                   int64_t n) {
    switch (n) {
    case 1: expand_rows(w, rank, u, ldu, c0, out, ld, 1); break;
    case 2: expand_rows(w, rank, u, ldu, c0, out, ld, 2); break;
    case 3: expand_rows(w, rank, u, ldu, c0, out, ld, 3); break;
#if LORA_RUN == 8
    case 4: expand_rows(w, rank, u, ldu, c0, out, ld, 4); break;
    case 5: expand_rows(w, rank, u, ldu, c0, out, ld, 5); break;
    case 6: expand_rows(w, rank, u, ldu, c0, out, ld, 6); break;
    case 7: expand_rows(w, rank, u, ldu, c0, out, ld, 7); break;
    default: expand_rows(w, rank, u, ldu, c0, out, ld, 8);
#else
    default: expand_rows(w, rank, u, ldu, c0, out, ld, 4);
#endif
    }
}

#ifdef TIER_AVX2
#define EXPAND_TILES 1 /* 16 ymm registers: one tile at a time */
#else
#define EXPAND_TILES 4
/* out rows [n, 64] (row stride ld) += u [n, ldu] (columns c0 ..) · w for 4 adjacent tiles (tile i's [rank, 16] at
 * w + i * rank * 16, float16): each broadcast of u[j][r] feeds 4 FMAs (on Zen 4 a broadcast takes an FP pipe slot as
 * an FMA does: one per FMA, as per tile, halves the FMA rate). 16 sums in registers. */
AI void expand_rows4(const uint16_t *w, int64_t rank, const float *u, int64_t ldu, int64_t c0, float *out, int64_t ld,
                     const int n) {
    f16v acc[4][4];
    for (int j = 0; j < n; j++)
        for (int i = 0; i < 4; i++) acc[j][i] = f16_load(out + j * ld + i * TILE);
    for (int64_t r = 0; r < rank; r++) {
        f16v wv[4];
        for (int i = 0; i < 4; i++) wv[i] = f16_load_half(w + (i * rank + r) * TILE);
        for (int j = 0; j < n; j++) {
            const f16v uv = f16_set1(u[j * ldu + c0 + r]);
            for (int i = 0; i < 4; i++) acc[j][i] = f16_fmadd(uv, wv[i], acc[j][i]);
        }
    }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < 4; i++) f16_store(out + j * ld + i * TILE, acc[j][i]);
}
#endif

/* LoRA expand into `nt` (<= EXPAND_TILES) adjacent tiles from n16, rows t0 .. t1 - 1: out[t * ld .. + 16 nt - 1] +=
 * u[t] · Bᵀ[slot] (its columns 16 n16 ..) for those with an adapter (slots[t] >= 0), over the blocks of Bᵀ that reach
 * the tiles (the rest of a block-diagonal Bᵀ is zeros), read from the tile-major copy: a slot's tiles packed at its
 * rank, tile n16's block rows at n16 * rank * 16. Up to 4 adjacent rows of one slot (the runner orders rows by slot) at
 * a time: each row of the block loaded once for them. A block covering all EXPAND_TILES tiles takes `expand_rows4`,
 * others each tile it reaches. out: tile n16's first column of row 0; u [T, ldu]; N the linear's outputs. */
static void lora_expand_tiles(const lora_t *lora, const int32_t *slots, const float *u, int64_t ldu, int64_t N,
                              int64_t t0, int64_t t1, int64_t n16, int64_t nt, float *out, int64_t ld) {
    const int64_t n0 = n16 * TILE, n1 = (n16 + nt) * TILE, NT = N / TILE;
    for (int64_t t = t0, n; t < t1; t += n) {
        const int32_t slot = slots[t];
        for (n = 1; n < LORA_RUN && t + n < t1 && slots[t + n] == slot;) n++;
        if (slot < 0) continue;
        for (int64_t b = 0; b < lora->nb; b++) {
            const int32_t *blk = lora->blocks + (slot * lora->nb + b) * 4;
            if (blk[2] >= n1 || blk[3] <= n0) continue;
            const int64_t rank = blk[1] - blk[0];
            const uint16_t *w = lora->tiles + slot * NT * lora->RS * TILE + n16 * rank * TILE;
#if EXPAND_TILES == 4
            if (nt == 4 && blk[2] <= n0 && blk[3] >= n1) {
                for (int64_t j = t, m; j < t + n; j += m) { /* 4 rows at a time: 16 sums */
                    m = t + n - j < 4 ? t + n - j : 4;
                    switch (m) {
                    case 1: expand_rows4(w, rank, u + j * ldu, ldu, blk[0], out + j * ld, ld, 1); break;
                    case 2: expand_rows4(w, rank, u + j * ldu, ldu, blk[0], out + j * ld, ld, 2); break;
                    case 3: expand_rows4(w, rank, u + j * ldu, ldu, blk[0], out + j * ld, ld, 3); break;
                    default: expand_rows4(w, rank, u + j * ldu, ldu, blk[0], out + j * ld, ld, 4);
                    }
                }
                continue;
            }
#endif
            for (int64_t i = 0; i < nt; i++)
                if (blk[2] < n0 + (i + 1) * TILE && blk[3] > n0 + i * TILE)
                    expand_run(w + i * rank * TILE, rank, u + t * ldu, ldu, blk[0], out + t * ld + i * TILE, ld, n);
        }
    }
}

/* Rows are taken ROW_BLOCK at a time so one block's int16 activations stay in L2 across the weight tiles. */
#define ROW_BLOCK 64

/* The adapters of a matmul's rows (tiled_matmul_lora): each row's slot (-1: none) and the shrink u [T, ldu]. */
typedef struct {
    lora_t lora;
    const int32_t *slots;
    const float *u;
    int64_t ldu;
} row_lora_t;

static void tiled_matmul_q(int is_q8, const int16_t *x16, const float *sx, const float *xsum, int64_t T, int64_t K,
                           const uint8_t *qt, const float *dt, const float *mt, int64_t N, float *out,
                           const row_lora_t *lora, int num_threads) {
    /* pieces of a row block and `per` tiles: with adapters EXPAND_TILES, whose expand shares its broadcasts */
    const int64_t per = lora != NULL ? EXPAND_TILES : 1, groups = (N / TILE + per - 1) / per;
    const int64_t blocks = (T + ROW_BLOCK - 1) / ROW_BLOCK, G = K / 32;
    /* in 8 pieces per thread, taken dynamically: a descheduled thread holds up one piece, not half the work */
    const int64_t piece = blocks * groups / (8 * num_threads) > 1 ? blocks * groups / (8 * num_threads) : 1;
#pragma omp parallel for collapse(2) schedule(dynamic, piece) num_threads(num_threads)
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t t0 = b * ROW_BLOCK, rows = T - t0 < ROW_BLOCK ? T - t0 : ROW_BLOCK;
            const int64_t n16 = g * per, nt = N / TILE - n16 < per ? N / TILE - n16 : per;
            for (int64_t i = n16; i < n16 + nt; i++) {
                if (is_q8)
                    tiled_tile(1, x16 + t0 * K, sx + t0 * G, xsum + t0 * G, rows, K, qt, dt, mt, i, N, out + t0 * N + i * TILE);
                else
                    tiled_tile(0, x16 + t0 * K, sx + t0 * G, xsum + t0 * G, rows, K, qt, dt, mt, i, N, out + t0 * N + i * TILE);
            }
            if (lora != NULL) /* while the block's outputs of these tiles are in L1 */
                lora_expand_tiles(&lora->lora, lora->slots, lora->u, lora->ldu, N, t0, t0 + rows, n16, nt,
                                  out + n16 * TILE, N);
        }
}

/* out [T, N] = x [T, K] @ W.T for W as tiled blocks (mt NULL: Q8_0). N a multiple of 16, K of 32. */
void tiled_matmul(const float *x, int64_t T, int64_t K, const uint8_t *qt, const float *dt, const float *mt, int64_t N,
                  float *out, int num_threads) {
    static __thread void *buf; /* reused: a fresh large allocation per call costs page faults */
    static __thread size_t cap;
    const int64_t G = K / 32, x16_bytes = ((T * K * 2 + 63) / 64) * 64;
    int16_t *x16 = step_scratch(x16_bytes + sizeof(float) * T * G * 2, &buf, &cap);
    if (x16 == NULL) abort();
    float *sx = (float *)((char *)x16 + x16_bytes), *xsum = sx + T * G;
    quantize_rows16(x, T, K, x16, sx, xsum, num_threads);
    tiled_matmul_q(mt == NULL, x16, sx, xsum, T, K, qt, dt, mt, N, out, NULL, num_threads);
}

/* Group g's rows (SHRINK_ROWS of them from SHRINK_ROWS g): its slot when all have the same one (>= 0), else -1. */
static int32_t group_slot(const int32_t *slots, int64_t T, int64_t g) {
    const int64_t t0 = g * SHRINK_ROWS;
    if (t0 + SHRINK_ROWS > T) return -1;
    for (int64_t t = t0 + 1; t < t0 + SHRINK_ROWS; t++)
        if (slots[t] != slots[t0]) return -1;
    return slots[t0];
}

/* u [T, ldu] = each row's x · A[slot]ᵀ (rows without adapter: untouched). Groups of SHRINK_ROWS rows of one slot take
 * `shrink_group` on the slot's A transposed and widened once for the call (at: per slot, at_of[slot] its offset in
 * floats, or -1: no full group); the other rows `lora_shrink`, up to 4 rows of one slot at a time. */
static void shrink_all(const lora_t *lora, const int32_t *slots, int64_t T, const float *x, int64_t K, float *u,
                       int64_t ldu, float *at, const int64_t *at_of, const int32_t *listed, int64_t nlisted,
                       int num_threads) {
    const int64_t groups = (T + SHRINK_ROWS - 1) / SHRINK_ROWS;
#pragma omp parallel num_threads(num_threads) if (T >= 16)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < nlisted * K; i++) { /* one k of a slot's A per iteration */
            const int32_t slot = listed[i / K];
            const int64_t rank = lora->ranks[slot], RP = (rank + 15) / 16 * 16;
            transpose_a(lora->a + slot * lora->R * K, rank, K, i % K, i % K + 1, at + at_of[slot], RP);
        }
#pragma omp for schedule(dynamic, 2)
        for (int64_t g = 0; g < groups; g++) {
            const int32_t slot = group_slot(slots, T, g);
            const int64_t t0 = g * SHRINK_ROWS;
            if (slot >= 0 && lora->ranks[slot] > 0) {
                const int64_t RP = (lora->ranks[slot] + 15) / 16 * 16;
                shrink_group(at + at_of[slot], RP, x + t0 * K, K, u + t0 * ldu, ldu);
                continue;
            }
            for (int64_t t = t0, n; t < t0 + SHRINK_ROWS && t < T; t += n) {
                for (n = 1; n < 4 && t + n < t0 + SHRINK_ROWS && t + n < T && slots[t + n] == slots[t];) n++;
                if (slots[t] >= 0) lora_shrink(lora, slots[t], x + t * K, K, u + t * ldu, ldu, n);
            }
        }
    }
}

/* tiled_matmul plus the LoRA of each row's adapter (Punica's SGMV fused into the matmul, as llama_decode_batch does
 * per op): out[t] = x[t] @ W.T + (x[t] · A[slot]ᵀ) · Bᵀ[slot] for slot = row_slots[t] >= 0. lora_w: the linear's
 * 7 fields (`lora_from`). The shrink u of every row first (`shrink_all`), then each (row block, tile) piece of the
 * matmul adds its rows' expand right after computing them, while they are in L1, instead of another pass over out. */
void tiled_matmul_lora(const float *x, int64_t T, int64_t K, const uint8_t *qt, const float *dt, const float *mt,
                       int64_t N, float *out, const int64_t *lora_w, const int32_t *row_slots, int num_threads) {
    static __thread void *buf, *slot_buf;
    static __thread size_t cap, slot_cap;
    const lora_t lora = lora_from(lora_w);
    /* u's rows padded to whole vectors of 16 ranks (shrink_group writes a slot's rank rounded up: zeros past it) */
    const int64_t G = K / 32, ldu = (lora.R + 15) / 16 * 16, groups = (T + SHRINK_ROWS - 1) / SHRINK_ROWS;
    int32_t slots = 0;
    for (int64_t t = 0; t < T; t++) slots = row_slots[t] >= slots ? row_slots[t] + 1 : slots;
    int64_t *at_of = step_scratch(sizeof(int64_t) * slots + sizeof(int32_t) * slots, &slot_buf, &slot_cap);
    if (slots > 0 && at_of == NULL) abort();
    int32_t *listed = (int32_t *)(at_of + slots), nlisted = 0;
    int64_t at_floats = 0;
    for (int32_t s = 0; s < slots; s++) at_of[s] = -1;
    for (int64_t g = 0, slot; g < groups; g++)
        if ((slot = group_slot(row_slots, T, g)) >= 0 && at_of[slot] < 0 && lora.ranks[slot] > 0) {
            at_of[slot] = at_floats;
            at_floats += K * ((lora.ranks[slot] + 15) / 16 * 16);
            listed[nlisted++] = (int32_t)slot;
        }
    const int64_t x16_bytes = (T * K * 2 + 63) / 64 * 64, u_bytes = T * ldu * 4, at_bytes = at_floats * 4;
    char *p = step_scratch(x16_bytes + u_bytes + at_bytes + sizeof(float) * T * G * 2, &buf, &cap);
    if (p == NULL) abort();
    int16_t *x16 = (int16_t *)p;
    float *u = (float *)(p + x16_bytes), *at = (float *)(p + x16_bytes + u_bytes);
    float *sx = (float *)(p + x16_bytes + u_bytes + at_bytes), *xsum = sx + T * G;
    quantize_rows16(x, T, K, x16, sx, xsum, num_threads);
    shrink_all(&lora, row_slots, T, x, K, u, ldu, at, at_of, listed, nlisted, num_threads);
    const row_lora_t rows = {lora, row_slots, u, ldu};
    tiled_matmul_q(mt == NULL, x16, sx, xsum, T, K, qt, dt, mt, N, out, &rows, num_threads);
}

/* silu(a) * b, 16 lanes: the sigmoid from exp(-|a|), so nothing overflows. */
AI f16v silu_mul16(f16v a, f16v b) {
    const f16v e = f16_exp_neg(f16_sub(f16_zero(), f16_abs(a)));
    const f16v inv = f16_div(f16_set1(1.0f), f16_add(f16_set1(1.0f), e));
    return f16_mul(f16_mul(a, f16_mul_where_negative(inv, a, e)), b);
}

/* out[t, i] = silu(x[t, i]) * x[t, I + i] for x [T, 2I], out [T, I]; rows split over threads, 16 lanes at a
 * time (sigmoid from exp(-|a|), so nothing overflows); I a multiple of 16. */
void silu_mul_rows(const float *x, int64_t T, int64_t I, float *out, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (T * I >= 16384)
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < I; i += 16)
            f16_store(out + t * I + i, silu_mul16(f16_load(x + t * 2 * I + i), f16_load(x + t * 2 * I + I + i)));
}

/* One sequence's query heads of one KV head (`group` of them, <= 8) over its paged cache: all scores first,
 * then a plain softmax and the weighted sum of values; each key and value row is read once for the group.
 * `at[j]`: key j's offset in the caches. The rows are requested towards L2 up front (the reads are bound by
 * memory latency: one task's rows, ~150 KB at 300 keys, are far from each other's blocks), the next keys to L1. */
typedef struct { /* the key and value rows of one task: row j at k + at[j], v + at[j] */
    const float *k, *v;
    const int64_t *at;
    int64_t len;
} kv_rows_t;

/* Prefetch rows [from, to) of `r` towards L2. */
AI void prefetch_rows(kv_rows_t r, int64_t from, int64_t to, const int DV) {
    for (int64_t u = from; u < to && u < r.len; u++)
        for (int i = 0; i < DV; i++) {
            _mm_prefetch((const char *)(r.k + r.at[u] + 16 * i), _MM_HINT_T1);
            _mm_prefetch((const char *)(r.v + r.at[u] + 16 * i), _MM_HINT_T1);
        }
}

/* out[h] = sum_j p[h][j] v_j for G (<= 4) heads, p [G, len] (row stride len); the accumulators in registers. */
AI void weigh_values(const float *p, int64_t len, const float *v_cache, const int64_t *at, float *out, const int G,
                     const int DV) {
    f16v acc[4][8];
    for (int h = 0; h < G; h++)
        for (int i = 0; i < DV; i++) acc[h][i] = f16_zero();
    for (int64_t j = 0; j < len; j++) {
        const float *v = v_cache + at[j];
        if (j + 16 < len)
            for (int i = 0; i < DV; i++) _mm_prefetch((const char *)(v_cache + at[j + 16] + 16 * i), _MM_HINT_T0);
        f16v vv[8];
        for (int i = 0; i < DV; i++) vv[i] = f16_load(v + 16 * i);
        for (int h = 0; h < G; h++) {
            const f16v w = f16_set1(p[h * len + j]);
            for (int i = 0; i < DV; i++) acc[h][i] = f16_fmadd(w, vv[i], acc[h][i]);
        }
    }
    for (int h = 0; h < G; h++)
        for (int i = 0; i < DV; i++) f16_store(out + h * DV * 16 + 16 * i, acc[h][i]);
}

AI void attend_group(const float *q, const float *k_cache, const float *v_cache, const int64_t *at, int64_t len,
                     float scale, int group, float *scores, float *out, kv_rows_t next, const int DV) {
    const int64_t D = DV * 16;
    int64_t j = 0;
    prefetch_rows((kv_rows_t){k_cache, v_cache, at, len}, 0, 32, DV); /* the rest came with the previous task */
    for (; j + 16 <= len; j += 16) {
        const float *k[16];
        for (int u = 0; u < 16; u++) {
            k[u] = k_cache + at[j + u];
            if (j + 32 + u < len) /* two iterations ahead */
                for (int i = 0; i < DV; i++) _mm_prefetch((const char *)(k_cache + at[j + 32 + u] + 16 * i), _MM_HINT_T0);
        }
        prefetch_rows(next, j * next.len / len, (j + 16) * next.len / len + (j + 32 > len ? next.len : 0), DV);
        for (int h = 0; h < group; h++) {
            f16v qv[8], part[16]; /* DV <= 8 */
            for (int i = 0; i < DV; i++) qv[i] = f16_load(q + h * D + 16 * i);
            for (int u = 0; u < 16; u++) {
                part[u] = f16_mul(qv[0], f16_load(k[u]));
                for (int i = 1; i < DV; i++) part[u] = f16_fmadd(qv[i], f16_load(k[u] + 16 * i), part[u]);
            }
            f16_store(scores + h * len + j, f16_mul(f16_sum16(part), f16_set1(scale)));
        }
    }
    if (len < 32) prefetch_rows(next, 0, next.len, DV);
    for (; j < len; j++) {
        const float *k = k_cache + at[j];
        for (int h = 0; h < group; h++) {
            f16v s = f16_mul(f16_load(k), f16_load(q + h * D));
            for (int i = 1; i < DV; i++) s = f16_fmadd(f16_load(k + 16 * i), f16_load(q + h * D + 16 * i), s);
            scores[h * len + j] = f16_reduce_add(s) * scale;
        }
    }
    for (int h = 0; h < group; h++) {
        float *sc = scores + h * len, mx = -INFINITY, sum = 0.0f;
        for (j = 0; j < len; j++) mx = sc[j] > mx ? sc[j] : mx;
        const f16v vmx = f16_set1(mx);
        f16v vsum = f16_zero();
        j = 0;
        for (; j + 16 <= len; j += 16) {
            const f16v e = f16_exp_neg(f16_sub(f16_load(sc + j), vmx));
            f16_store(sc + j, e);
            vsum = f16_add(vsum, e);
        }
        sum = f16_reduce_add(vsum);
        for (; j < len; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        const float inv = 1.0f / sum;
        for (j = 0; j < len; j++) sc[j] *= inv;
    }
    const int per = DV == 4 ? 4 : 2; /* heads a pass: their accumulators and a value row fit in registers */
    for (int h = 0; h < group; h += per) {
        const float *sc = scores + h * len;
        float *o = out + h * D;
        switch (group - h < per ? group - h : per) {
        case 1: weigh_values(sc, len, v_cache, at, o, 1, DV); break;
        case 2: weigh_values(sc, len, v_cache, at, o, 2, DV); break;
        case 3: weigh_values(sc, len, v_cache, at, o, 3, DV); break;
        default: weigh_values(sc, len, v_cache, at, o, 4, DV); break;
        }
    }
}

typedef struct { /* the paged caches and the rows' tables */
    const float *k_cache, *v_cache;
    const int32_t *block_tables, *context_lens;
    int64_t B, nh, nkv, D, block_size, W;
    float scale;
} paged_t;

/* Task t's rows (t = b * nkv + kvh; len 0 past the last task) with their offsets written to `at`. */
static kv_rows_t task_rows(const paged_t *c, int64_t t, int64_t *at) {
    if (t >= c->B * c->nkv) return (kv_rows_t){c->k_cache, c->v_cache, at, 0};
    const int64_t b = t / c->nkv, kvh = t % c->nkv, len = c->context_lens[b], token_stride = c->nkv * c->D;
    for (int64_t j = 0, blk = 0; j < len; blk++)
        for (int64_t u = 0; u < c->block_size && j < len; u++, j++)
            at[j] = (c->block_tables[b * c->W + blk] * c->block_size + u) * token_stride;
    return (kv_rows_t){c->k_cache + kvh * c->D, c->v_cache + kvh * c->D, at, len};
}

/* Task t: the `group` query heads at q ([group, D], rotated) of row t / nkv over KV head t % nkv into out; the
 * rows of task t + 1 (most often the same thread's next) are requested towards L2 meanwhile. */
static void attend_task(const paged_t *c, int64_t t, const float *q, float *out) {
    const int group = (int)(c->nh / c->nkv);
    const int64_t len = c->context_lens[t / c->nkv], next_len = t + 1 < c->B * c->nkv ? c->context_lens[(t + 1) / c->nkv] : 0;
    int64_t *at = malloc(sizeof(int64_t) * (len + next_len) + sizeof(float) * group * (len + 16));
    if (at == NULL) abort();
    const kv_rows_t rows = task_rows(c, t, at), next = task_rows(c, t + 1, at + len);
    float *scores = (float *)(at + len + next_len);
    if (c->D == 64)
        attend_group(q, rows.k, rows.v, rows.at, len, c->scale, group, scores, out, next, 4);
    else
        attend_group(q, rows.k, rows.v, rows.at, len, c->scale, group, scores, out, next, 8);
    free(at);
}

/* Decode attention for B one-token rows: q rows at q + b * q_stride ([nh, D]); out [B, nh * D].
 * Caches [num_blocks, block_size, nkv, D]; D 64 or 128; nh / nkv <= 8. */
static void attention_batch(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                            const int32_t *block_tables, const int32_t *context_lens, float scale, int64_t B,
                            int64_t nh, int64_t nkv, int64_t D, int64_t block_size, int64_t W, float *out,
                            int num_threads) {
    const paged_t c = {k_cache, v_cache, block_tables, context_lens, B, nh, nkv, D, block_size, W, scale};
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t t = 0; t < B * nkv; t++)
        attend_task(&c, t, q + (t / nkv) * q_stride + (t % nkv) * (nh / nkv) * D, out + t * (nh / nkv) * D);
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

/* ---- llama_decode_batch: one OpenMP parallel region per decode step -------------------------------------------
 * The scheme of llama_decode_rows (cpu_decode.c, `step_run_op`): each op (a layer's qkv, attention, o, gate_up
 * and down) is cut into chunks split evenly over the threads; a thread done with its share takes over the
 * unfinished chunks of a thread that is late (not yet in the op, or descheduled in it), so no op ends in a barrier.
 * The serial pieces (residual add + RMSNorm, int16 rounding of a matmul's input, rotary and the cache write of the
 * step's keys and values) are done by every thread for itself (the same bytes), and each op writes a buffer of its
 * own layer. Chunks: a matmul's tile of 16 output rows for every activation row (gate_up: a gate tile with its up
 * tile, silu * up fused); the attention's (row, KV head) pairs. */

#define BATCH_MAX_CHUNKS 1024 /* per op: N / 16 tiles, T * nkv attention pairs (cpu_decode.py checks) */
#define OPS_PER_LAYER 9       /* per layer: each linear's LoRA shrink and matmul, and the attention */

typedef struct { /* what every thread reads */
    int64_t L, T, H, nh, nkv, D, I, W, block_size;
    float eps, scale;
    const int64_t *positions, *slots, *w;
    const int32_t *block_tables, *context_lens;
    const float *cos_sin;
    float *qkv, *attn, *o, *act, *down; /* per layer: [T, QKV], [T, Q], [T, H], [T, I], [T, H] */
    const int32_t *lora_slots;               /* each row's adapter slot (-1: none), or NULL: no row has one */
    const int64_t *lora_w;                   /* per layer and linear (qkv, o, gate_up, down): a, tiles, ranks, R,
                                                blocks, nb, RS (`lora_t`) */
    float *lora_u;                           /* [L, 4, T, R]: each linear's shrink (x · Aᵀ), a buffer per linear: a
                                                thread late in an op still reads its u while others shrink the next */
    int64_t lora_R;                          /* the largest R of the linears: lora_u's row stride per linear */
    int32_t *flags, gen;
    int nt;
    int64_t *progress;
} batch_step_t;

typedef struct { /* one op as a thread sees it: the int16 input rows are the thread's own */
    const batch_step_t *s;
    const int16_t *x16;
    const float *sx, *xsum, *bias;
    const int64_t *p; /* the linear's tiled (qt, dt, mt) */
    int64_t K, N;
    float *out;
    int64_t layer;
    const float *x; /* the float input rows [T, K] (the LoRA shrink's) */
    lora_t lora;
    float *u; /* [T, R]: this linear's LoRA shrink */
} batch_op_t;

/* The rows of row t's shrink group, or 0 when t does not start one: a run of rows of one slot (the runner puts them
 * side by side) is cut into ceil(run / LORA_RUN) groups of equal size (16 rows of one adapter: 2 of 8, one per thread
 * of 2), each taken by the chunk of its first row, so its slot's A is read once per group. */
static int64_t shrink_group_rows(const int32_t *slots, int64_t T, int64_t t) {
    const int32_t slot = slots[t];
    if (slot < 0) return 0;
    int64_t first = t, end = t + 1;
    while (first > 0 && slots[first - 1] == slot) first--;
    while (end < T && slots[end] == slot) end++;
    const int64_t groups = (end - first + LORA_RUN - 1) / LORA_RUN, size = (end - first + groups - 1) / groups;
    if ((t - first) % size) return 0;
    return end - t < size ? end - t : size;
}

/* LoRA shrink of row t's group (`shrink_group_rows`): u[t, :rank] = A[slot] · x[t]. A row without adapter, or not the
 * first of its group, leaves its chunk empty. */
static void lora_shrink_chunk(const void *arg, int64_t t) {
    const batch_op_t *op = arg;
    const int64_t n = shrink_group_rows(op->s->lora_slots, op->s->T, t);
    if (n > 0)
        lora_shrink(&op->lora, op->s->lora_slots[t], op->x + t * op->K, op->K, op->u + t * op->lora.R, op->lora.R, n);
}

/* Requests towards L2 the A rows of the shrink groups that thread `tid` of `nt` owns in a shrink op of K columns
 * (its even share of the T chunks), issued an op ahead: between two LoRA ops the base weights stream through the
 * caches, and the shrink, reading 2-4 rows of A at a time, each a short stream, took them from memory at ~2/3 its
 * rate from L3 (bench/lora.py's one adapter, SmolLM2, one thread). */
static void prefetch_shrink(const lora_t *lora, const int32_t *slots, int64_t T, int64_t K, int tid, int nt) {
    if (lora->a == NULL) return;
    for (int64_t t = T * tid / nt; t < T * (tid + 1) / nt; t++) {
        if (shrink_group_rows(slots, T, t) == 0) continue;
        const char *a = (const char *)(lora->a + slots[t] * lora->R * K);
        for (int64_t b = 0; b < lora->ranks[slots[t]] * K * 2; b += 64) _mm_prefetch(a + b, _MM_HINT_T1);
    }
}

/* The LoRA expand of every row into tile n16 (out [T, ld]: the tile's first column), when the linear has adapters. */
static void lora_expand_tile(const batch_op_t *op, int64_t n16, float *out, int64_t ld) {
    if (op->lora.a != NULL) lora_expand_tiles(&op->lora, op->s->lora_slots, op->u, op->lora.R, op->N, 0, op->s->T, n16, 1, out, ld);
}

/* The 16 output rows of tile n16 for every activation row into out [T, ld] (out: the tile's first column). */
static void tile_rows(const batch_op_t *op, int64_t n16, float *out, int64_t ld) {
    const int64_t T = op->s->T, G = op->K / 32;
    for (int64_t t0 = 0; t0 < T; t0 += ROW_BLOCK) {
        const int64_t rows = T - t0 < ROW_BLOCK ? T - t0 : ROW_BLOCK;
        tiled_tile(0, op->x16 + t0 * op->K, op->sx + t0 * G, op->xsum + t0 * G, rows, op->K, (const uint8_t *)op->p[0],
                   (const float *)op->p[1], (const float *)op->p[2], n16, ld, out + t0 * ld);
    }
}

/* A thread's own [T, 32] tile buffer: a chunk computes there and writes its outputs once, so a chunk that a
 * helper redoes while its owner still runs it (`step_run_op`) writes the same bytes, never adds twice. */
static float *own_tiles(int64_t T) {
    static __thread void *buf;
    static __thread size_t cap;
    float *tiles = step_scratch(sizeof(float) * T * 2 * TILE, &buf, &cap);
    if (tiles == NULL) abort();
    return tiles;
}

static void matmul_tile_chunk(const void *arg, int64_t i) {
    const batch_op_t *op = arg;
    const int64_t T = op->s->T;
    if (op->lora.a == NULL && op->bias == NULL) {
        tile_rows(op, i, op->out + i * TILE, op->N);
        return;
    }
    float *tile = own_tiles(T);
    tile_rows(op, i, tile, TILE);
    lora_expand_tile(op, i, tile, TILE);
    for (int64_t t = 0; t < T; t++) {
        f16v v = f16_load(tile + t * TILE);
        if (op->bias) v = f16_add(v, f16_load(op->bias + i * TILE));
        f16_store(op->out + t * op->N + i * TILE, v);
    }
}

/* gate_up tiles i (gate) and I / 16 + i (up), then act [T, I] columns 16 i .. 16 i + 15. */
static void gate_up_tile_chunk(const void *arg, int64_t i) {
    const batch_op_t *op = arg;
    const int64_t I = op->N / 2, T = op->s->T;
    float *gate = own_tiles(T), *up = gate + T * TILE;
    tile_rows(op, i, gate, TILE);
    tile_rows(op, I / TILE + i, up, TILE);
    lora_expand_tile(op, i, gate, TILE);
    lora_expand_tile(op, I / TILE + i, up, TILE);
    float *act = op->s->act + op->layer * T * I;
    for (int64_t t = 0; t < T; t++)
        f16_store(act + t * I + i * TILE, silu_mul16(f16_load(gate + t * TILE), f16_load(up + t * TILE)));
}

AI void rotate_head(const float *x, const float *cs, int64_t D, float *out) { /* NEOX rotary of one head */
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        out[i] = x[i] * cs[i] - x[half + i] * cs[half + i];
        out[half + i] = x[half + i] * cs[i] + x[i] * cs[half + i];
    }
}

/* Attention pair i = (row b, KV head kvh): the group's queries rotated here, keys and values from the cache
 * (the step's own already written by every thread before the op). */
static void attention_pair_chunk(const void *arg, int64_t i) {
    const batch_op_t *op = arg;
    const batch_step_t *s = op->s;
    const int64_t *p = s->w + op->layer * 17, b = i / s->nkv, kvh = i % s->nkv, D = s->D;
    const int64_t QKV = (s->nh + 2 * s->nkv) * D;
    const int group = (int)(s->nh / s->nkv);
    float q[8 * 128];
    for (int h = 0; h < group; h++)
        rotate_head(s->qkv + op->layer * s->T * QKV + b * QKV + (kvh * group + h) * D, s->cos_sin + s->positions[b] * D,
                    D, q + h * D);
    const paged_t c = {(const float *)p[15], (const float *)p[16], s->block_tables, s->context_lens, s->T, s->nh,
                       s->nkv, D, s->block_size, s->W, s->scale};
    attend_task(&c, i, q, op->out + i * group * D);
}

/* The step's keys (rotated) and values into the layer's cache. */
static void write_cache(const batch_step_t *s, int64_t l) {
    const int64_t *p = s->w + l * 17, D = s->D, Q = s->nh * D, KV = s->nkv * D, QKV = Q + 2 * KV;
    float *k_cache = (float *)p[15], *v_cache = (float *)p[16];
    for (int64_t t = 0; t < s->T; t++) {
        if (s->slots[t] < 0) continue;
        const float *row = s->qkv + l * s->T * QKV + t * QKV, *cs = s->cos_sin + s->positions[t] * D;
        for (int64_t kvh = 0; kvh < s->nkv; kvh++) rotate_head(row + Q + kvh * D, cs, D, k_cache + s->slots[t] * KV + kvh * D);
        memcpy(v_cache + s->slots[t] * KV, row + Q + KV, KV * sizeof(float));
    }
}

AI void batch_run(const batch_step_t *s, int64_t k, int64_t chunks, chunk_fn fn, const batch_op_t *op) {
    step_run_op(k, s->flags + k * BATCH_MAX_CHUNKS, s->gen, chunks, fn, op, omp_get_thread_num(), s->nt, s->progress);
}

/* Linear j (0 qkv, 1 o, 2 gate_up, 3 down) of layer l's adapters; a NULL without rows or adapters. */
static lora_t lora_of(const batch_step_t *s, int64_t l, int j) {
    if (s->lora_slots == NULL) return (lora_t){NULL, NULL, NULL, NULL, 0, 0, 0};
    return lora_from(s->lora_w + (l * 4 + j) * 7);
}

/* prefetch_shrink of the linear after linear j of layer l (none after the last layer's down). */
static void prefetch_next_shrink(const batch_step_t *s, int64_t l, int j) {
    const int64_t l2 = j == 3 ? l + 1 : l;
    const int j2 = (j + 1) % 4;
    if (s->lora_slots == NULL || l2 >= s->L) return;
    const lora_t next = lora_of(s, l2, j2);
    const int64_t K = j2 == 1 ? s->nh * s->D : j2 == 3 ? s->I : s->H;
    prefetch_shrink(&next, s->lora_slots, s->T, K, omp_get_thread_num(), s->nt);
}

/* One thread's walk through the step; `LINEAR(k, x, K, i, j, N, out)`: with adapters, op k - 1 (the shrink of
 * every row) first; then x [T, K] rounded to int16 in the thread's own buffers, and op k's chunks over the tiles
 * of linear i (pointers p[i..i+2]), each tile's LoRA expand added. */
static void batch_step(const batch_step_t *s, own_t *own, const float *embeddings, float *hidden,
                       const float *final_norm) {
    const int64_t T = s->T, H = s->H, Q = s->nh * s->D, QKV = Q + 2 * s->nkv * s->D, I = s->I;
#define LINEAR(k, x, K_, i, j, N_, out_, fn, bias_)                                                                 \
    do {                                                                                                           \
        const lora_t lora = lora_of(s, l, j);                                                                      \
        float *u = s->lora_u + (l * 4 + (j)) * T * s->lora_R;                                                      \
        if (lora.a != NULL) {                                                                                      \
            const batch_op_t shrink = {s, NULL, NULL, NULL, NULL, NULL, K_, 0, NULL, l, x, lora, u};               \
            batch_run(s, (k) - 1, T, lora_shrink_chunk, &shrink);                                                  \
        }                                                                                                          \
        for (int64_t r = 0; r < T * ((K_) / 32); r++) quantize_group16(x, r, own->x16, own->sx, own->xsum);        \
        const batch_op_t op = {s, own->x16, own->sx, own->xsum, bias_, p + (i), K_, N_, out_, l, x, lora, u};      \
        prefetch_next_shrink(s, l, j); /* while this op's matmul runs */                                           \
        batch_run(s, k, (N_) / TILE / ((fn) == gate_up_tile_chunk ? 2 : 1), fn, &op);                              \
    } while (0)
    memcpy(own->residual, embeddings, sizeof(float) * T * H);
    for (int64_t l = 0; l < s->L; l++) {
        const int64_t *p = s->w + l * 17, k = OPS_PER_LAYER * l;
        float *qkv = s->qkv + l * T * QKV, *attn = s->attn + l * T * Q, *o = s->o + l * T * H;
        add_rms_norm(l ? s->down + (l - 1) * T * H : own->residual, l ? own->residual : NULL, (const float *)p[13],
                     s->eps, T, H, own->h, own->residual);
        LINEAR(k + 1, own->h, H, 0, 0, QKV, qkv, matmul_tile_chunk, (const float *)p[3]);
        write_cache(s, l);
        const batch_op_t pairs = {s, NULL, NULL, NULL, NULL, NULL, 0, 0, attn, l};
        batch_run(s, k + 2, T * s->nkv, attention_pair_chunk, &pairs);
        LINEAR(k + 4, attn, Q, 4, 1, H, o, matmul_tile_chunk, NULL);
        add_rms_norm(o, own->residual, (const float *)p[14], s->eps, T, H, own->h, own->residual);
        LINEAR(k + 6, own->h, H, 7, 2, 2 * I, NULL, gate_up_tile_chunk, NULL); /* into act */
        LINEAR(k + 8, s->act + l * T * I, I, 10, 3, H, s->down + l * T * H, matmul_tile_chunk, NULL);
    }
#undef LINEAR
    add_rms_norm(s->down + (s->L - 1) * T * H, own->residual, final_norm, s->eps, T, H, own->h, own->residual);
    if (omp_get_thread_num() == 0) memcpy(hidden, own->h, sizeof(float) * T * H);
}

int decode_batch_serves(int64_t T, int64_t H, int64_t nh, int64_t nkv, int64_t D, int64_t I) {
    const int64_t QKV = (nh + 2 * nkv) * D;
    return attention_batch_serves(nh, nkv, D) && T * nkv <= BATCH_MAX_CHUNKS && H % TILE == 0 && QKV % TILE == 0 &&
           I % TILE == 0 && 2 * I / TILE <= 2 * BATCH_MAX_CHUNKS && QKV / TILE <= BATCH_MAX_CHUNKS &&
           H / TILE <= BATCH_MAX_CHUNKS && H % 32 == 0 && I % 32 == 0 && (nh * D) % 32 == 0;
}

/* The decoder stack of a decode step of 4+ one-token rows (`decode_batch_serves`): the 17 pointers per layer are
 * those of llama_decode (cpu_kernels.c) with each linear's (qs, d, m) replaced by its tiled (qt, dt, mt).
 * hidden [T, H]: the token embeddings in, the final-norm output out. LoRA: lora_slots [T] each row's adapter
 * slot (-1: none) and lora_w [L, 4, 7] each linear's stacked adapters (a, tiles, ranks, R, blocks, nb, RS; `lora_t`), or
 * both NULL. */
void llama_decode_batch(int64_t L, int64_t T, float *hidden, const int64_t *positions, const int64_t *slots,
                        const int32_t *block_tables, const int32_t *context_lens, int64_t W, int64_t H, int64_t nh,
                        int64_t nkv, int64_t D, int64_t I, float eps, const float *cos_sin, int64_t block_size,
                        const int64_t *w, const float *final_norm, float scale, const int32_t *lora_slots,
                        const int64_t *lora_w, int num_threads) {
    static __thread void *shared_buf, *lora_buf;
    static __thread size_t shared_cap, lora_cap;
    const int64_t Q = nh * D, QKV = Q + 2 * nkv * D, ops = OPS_PER_LAYER * L;
    const int64_t per_layer = T * (QKV + Q + H + I + H);
    float *buf = step_scratch(sizeof(float) * (L * per_layer + T * H), &shared_buf, &shared_cap);
    int64_t R = 1;
    for (int64_t e = 0; lora_slots != NULL && e < L * 4; e++) R = lora_w[e * 7 + 3] > R ? lora_w[e * 7 + 3] : R;
    float *lora_u = step_scratch(sizeof(float) * L * 4 * T * R, &lora_buf, &lora_cap);
    if (buf == NULL || lora_u == NULL) abort();
    /* A thread may start late (descheduled) after thread 0 wrote the output into `hidden`: all read this copy. */
    const float *embeddings = memcpy(buf + L * per_layer, hidden, sizeof(float) * T * H);
    int32_t *flags;
    int64_t *progress;
    const int32_t gen = step_begin(ops * BATCH_MAX_CHUNKS, num_threads, &flags, &progress);
    batch_step_t s = {L, T, H, nh, nkv, D, I, W, block_size, eps, scale, positions, slots, w, block_tables,
                      context_lens, cos_sin, buf, buf + L * T * QKV, buf + L * T * (QKV + Q),
                      buf + L * T * (QKV + Q + H), buf + L * T * (QKV + Q + H + I), lora_slots, lora_w, lora_u,
                      R, flags, gen, num_threads, progress};
    const int64_t K = I > H ? (I > Q ? I : Q) : (H > Q ? H : Q);
#pragma omp parallel num_threads(num_threads)
    {
        own_t own = step_own(T, H, K);
        batch_step(&s, &own, embeddings, hidden, final_norm);
    }
}

#else

int tiled_available(void) { return 0; }

void tiled_matmul(const float *x, int64_t T, int64_t K, const uint8_t *qt, const float *dt, const float *mt, int64_t N,
                  float *out, int num_threads) {
    (void)x, (void)T, (void)K, (void)qt, (void)dt, (void)mt, (void)N, (void)out, (void)num_threads;
    abort(); /* callers check tiled_available() first */
}

void tiled_matmul_lora(const float *x, int64_t T, int64_t K, const uint8_t *qt, const float *dt, const float *mt,
                       int64_t N, float *out, const int64_t *lora_w, const int32_t *row_slots, int num_threads) {
    abort(); /* callers check tiled_available() first */
}

int attention_batch_serves(int64_t nh, int64_t nkv, int64_t D) {
    (void)nh, (void)nkv, (void)D;
    return 0;
}

int decode_batch_serves(int64_t T, int64_t H, int64_t nh, int64_t nkv, int64_t D, int64_t I) {
    (void)T, (void)H, (void)nh, (void)nkv, (void)D, (void)I;
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
                        const int64_t *w, const float *final_norm, float scale, const int32_t *lora_slots,
                        const int64_t *lora_w, int num_threads) {
    abort(); /* callers check tiled_available() first */
}

#endif
