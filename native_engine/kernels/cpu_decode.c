/* llama_decode_rows: the whole Llama decoder stack of a decode step of 1-3 one-token rows and the LM head, in one
 * call (more rows: llama_decode in cpu_kernels.c).
 *
 * Weights: every linear as Q4_1 blocks of 32 (packed nibbles qs [N, K / 2], byte j = weight j low, j + 16 high)
 * with float16 scales d16, m16 [N, K / 32] (as the GGUF stores them: 20 bytes per block instead of 24 with
 * float32 scales); the LM head as Q8_0 blocks (int8 [V, H], float16 d [V, H / 32]). Activations are rounded to
 * int16 per group of 32 (x ~ sx[g] * x16, |error| <= sx[g] / 2: 1.5e-5 of the group's largest |x|) and
 * multiplied with the integer weights by vpdpwssd (AVX512-VNNI), one float scaling per group; everything else
 * (norms, rotary, attention, silu) is float32.
 *
 * Threads: ONE OpenMP parallel region per step, no barrier inside it. Each matmul (and the attention) is cut
 * into chunks, split evenly over the threads; a thread done with its share waits until every chunk is marked
 * finished, and computes any unfinished one itself when its thread has not reached the op yet, or after
 * ~38 us (its thread was descheduled: on a shared machine that is common, and with a barrier per op it
 * stalls everybody for a time slice). Every small serial piece (residual add, norm, int16 rounding of a matmul's input) is done by each
 * thread for itself on its own copy, and every op writes a buffer of its own layer, so a late thread holds
 * nobody up and catches up when it runs again. The attention reads the current
 * token's key and value from the step's qkv rows, not from the cache, so the cache write (one chunk) needs no
 * ordering either. A verify row of speculative decoding is 1 + k consecutive rows of one sequence (`verify`:
 * each row's index in it): row j reads the keys and values of rows j - 1 .. 0 of its group from their qkv
 * rows as well, never from the cache being written. The maths is that of LlamaModel.forward (the f32 kernels of cpu_kernels.c), up to the int16
 * rounding of matmul inputs and summation order. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "cpu_step.h"

#define AI static inline __attribute__((always_inline))
#define MAX_GROUPS 512 /* K <= 16384 (cpu_decode.py checks) */

/* ---- claiming work ------------------------------------------------------------------------------ */

AI void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

AI uint64_t ticks(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#else
    static __thread uint64_t n;
    return n += 64;
#endif
}

#define HELP_TICKS 100000 /* ~30 us: far longer than a chunk takes, far shorter than a scheduler time slice */
#define MAX_CHUNKS 1024

/* Runs every chunk of op k on thread `tid` of `nt`: first its own share (chunks split evenly, no atomics), then
 * it waits for the others' chunks and computes any unfinished one itself, last chunk first (the owner goes
 * forward): at once when the owner has not reached op k yet (descheduled, or not yet woken at the start of the
 * step), else after HELP_TICKS (the owner was descheduled in the middle of its share). A chunk's result depends
 * only on the op's inputs, so a chunk computed twice writes the same values; `flags[i] == gen` marks chunk i
 * finished in this step; progress[t * 16] is the op thread t is in. */
void step_run_op(int64_t k, int32_t *flags, int32_t gen, int64_t chunks, chunk_fn fn, const void *op, int tid,
                 int nt, int64_t *progress) { /* also llama_decode_batch's (cpu_batch.c) */
    __atomic_store_n(&progress[tid * 16], k, __ATOMIC_RELAXED);
    for (int64_t i = chunks * tid / nt, end = chunks * (tid + 1) / nt; i < end; i++) {
        if (__atomic_load_n(&flags[i], __ATOMIC_RELAXED) == gen) continue; /* done by a helper */
        fn(op, i);
        __atomic_store_n(&flags[i], gen, __ATOMIC_RELEASE);
    }
    const uint64_t start = ticks();
    for (int64_t i = chunks - 1; i >= 0;) {
        if (__atomic_load_n(&flags[i], __ATOMIC_ACQUIRE) == gen) {
            i--;
            continue;
        }
        int owner = nt - 1;
        while (owner > 0 && chunks * owner / nt > i) owner--;
        if (__atomic_load_n(&progress[owner * 16], __ATOMIC_RELAXED) >= k && ticks() - start < HELP_TICKS) {
            cpu_relax();
            continue;
        }
        fn(op, i);
        __atomic_store_n(&flags[i], gen, __ATOMIC_RELEASE);
    }
}

/* A per-thread buffer of at least `bytes`, reused across calls (thread-local: engines may run in several threads). */
void *step_scratch(size_t bytes, void **buf, size_t *cap) {
    if (*cap < bytes) {
        free(*buf);
        *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        *cap = *buf ? bytes : 0;
    }
    return *buf;
}

/* The claiming state of a step of `flag_count` chunks and `nt` threads: the chunk flags, each thread's progress (a
 * cache line apart, all -1) and the step's generation. Kept per caller thread (engines may run in several threads):
 * a flag equal to an older generation is a chunk of an earlier step, so the flags are only cleared when new. */
int32_t step_begin(int64_t flag_count, int nt, int32_t **flags, int64_t **progress) {
    static __thread void *flag_buf, *progress_buf;
    static __thread size_t flag_cap, progress_cap;
    static __thread int32_t gen;
    const size_t had = flag_cap;
    *flags = step_scratch(sizeof(int32_t) * flag_count, &flag_buf, &flag_cap);
    *progress = step_scratch(sizeof(int64_t) * 16 * nt, &progress_buf, &progress_cap);
    if (*flags == NULL || *progress == NULL) abort();
    for (int t = 0; t < nt; t++) (*progress)[t * 16] = -1;
    if (flag_cap != had || ++gen == INT32_MAX) { /* a new flags buffer (or generations used up): start over */
        memset(*flags, 0, flag_cap);
        gen = 1;
    }
    return gen;
}

/* The calling thread's own buffers for a step of T rows of width H whose matmul inputs are at most K wide. */
own_t step_own(int64_t T, int64_t H, int64_t K) {
    static __thread void *own_buf;
    static __thread size_t own_cap;
    char *b = step_scratch(sizeof(float) * T * (2 * H + 2 * K / 32) + sizeof(int16_t) * T * K + 256, &own_buf, &own_cap);
    if (b == NULL) abort();
    own_t own = {(float *)b, (float *)b + T * H, (float *)b + 2 * T * H, (float *)b + 2 * T * H + T * K / 32, NULL};
    own.x16 = (int16_t *)(((uintptr_t)(own.xsum + T * K / 32) + 63) & ~(uintptr_t)63);
    return own;
}

/* ---- small float32 pieces ----------------------------------------------------------------------- */

AI float half_to_float(uint16_t h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    float v = exp == 0 ? ldexpf((float)man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexpf((float)(man | 1024), (int)exp - 25);
    union { float f; uint32_t u; } r = {v};
    r.u |= sign;
    return r.f;
#endif
}

/* residual += x (x NULL: residual stays); out = rms_norm(residual) * weight. [T, H]. */
static void add_norm(float *residual, const float *x, const float *weight, float eps, int64_t T, int64_t H,
                     float *out) {
    for (int64_t t = 0; t < T; t++) {
        float *r = residual + t * H, *o = out + t * H, ss = 0.0f;
        if (x != NULL)
            for (int64_t i = 0; i < H; i++) r[i] += x[t * H + i];
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < H; i++) ss += r[i] * r[i];
        const float rstd = 1.0f / sqrtf(ss / (float)H + eps);
        for (int64_t i = 0; i < H; i++) o[i] = r[i] * rstd * weight[i];
    }
}

/* NEOX rotary of one head (D floats) into out. */
AI void rotate(const float *x, const float *cs, int64_t D, float *out) {
    const int64_t half = D / 2;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        out[i] = x[i] * cs[i] - x[half + i] * cs[half + i];
        out[half + i] = x[half + i] * cs[i] + x[i] * cs[half + i];
    }
}

#ifdef TIER_AVX2
/* 8 float16 scales from p (n < 8: the first n, the rest 0) times 8 floats from sx. */
AI __m256 scales8(const uint16_t *p, const float *sx, int64_t n) {
    if (n >= 8) return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_loadu_ps(sx));
    uint16_t h[8] = {0};
    float f[8] = {0};
    memcpy(h, p, n * sizeof(uint16_t));
    memcpy(f, sx, n * sizeof(float));
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)), _mm256_loadu_ps(f));
}

/* sum over 32 weights of w * x for int16 weights (lo: weights 0..15, hi: 16..31) and int16 activations. */
AI __m256i dot32(__m256i lo, __m256i hi, const int16_t *x) {
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)x)),
                            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 16))));
}
#endif

/* An activation row rounded to int16 (one per token row). */
typedef struct {
    const int16_t *x16;
    const float *sx, *xsum;
} qrow_t;

/* ---- matmul rows --------------------------------------------------------------------------------- */

/* out[n] for n in [n0, n1) (n1 - n0 even) = Q4_1 row n . x, x one int16 row of K = 32 G values. */
static void q4_1_rows(qrow_t x, int64_t G, const uint8_t *qs, const uint16_t *d16, const uint16_t *m16, int64_t n0,
                      int64_t n1, float *out) {
#if defined(TIER_AVX512)
    const __m512i shifts = _mm512_mask_set1_epi16(_mm512_setzero_si512(), 0xFFFF0000u, 4); /* lanes 16..31: high nibbles */
    const __m512i mask = _mm512_set1_epi16(0x0F);
    float sd0[MAX_GROUPS], sd1[MAX_GROUPS];
    for (int64_t n = n0; n < n1; n += 2) {
        const uint8_t *q0 = qs + n * G * 16, *q1 = q0 + G * 16;
        const uint16_t *d0 = d16 + n * G, *d1 = d0 + G, *m0 = m16 + n * G, *m1 = m0 + G;
        __m512 off0 = _mm512_setzero_ps(), off1 = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; g += 16) { /* per-group scales d * sx and the offsets sum m * xsum, 16 at a time */
            const __mmask16 k = G - g >= 16 ? 0xFFFF : (__mmask16)((1u << (G - g)) - 1);
            const __m512 sx = _mm512_maskz_loadu_ps(k, x.sx + g), xs = _mm512_maskz_loadu_ps(k, x.xsum + g);
            _mm512_mask_storeu_ps(sd0 + g, k, _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, d0 + g)), sx));
            _mm512_mask_storeu_ps(sd1 + g, k, _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, d1 + g)), sx));
            off0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, m0 + g)), xs, off0);
            off1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, m1 + g)), xs, off1);
        }
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            const __m512i xv = _mm512_load_si512((const void *)(x.x16 + g * 32));
            const __m512i b0 = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q0 + g * 16))));
            const __m512i b1 = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q1 + g * 16))));
            const __m512i w0 = _mm512_and_si512(_mm512_srlv_epi16(b0, shifts), mask);
            const __m512i w1 = _mm512_and_si512(_mm512_srlv_epi16(b1, shifts), mask);
            const __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w0, xv);
            const __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w1, xv);
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(sd0[g]), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(sd1[g]), acc1);
        }
        out[n - n0] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, off0));
        out[n - n0 + 1] = _mm512_reduce_add_ps(_mm512_add_ps(acc1, off1));
    }
#elif defined(TIER_AVX2)
    const __m256i mask = _mm256_set1_epi16(0x0F);
    float sd0[MAX_GROUPS + 8], sd1[MAX_GROUPS + 8]; /* stored 8 at a time */
    for (int64_t n = n0; n < n1; n += 2) {
        const uint8_t *q0 = qs + n * G * 16, *q1 = q0 + G * 16;
        const uint16_t *d0 = d16 + n * G, *d1 = d0 + G, *m0 = m16 + n * G, *m1 = m0 + G;
        __m256 off0 = _mm256_setzero_ps(), off1 = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; g += 8) { /* per-group scales d * sx and the offsets sum m * xsum, 8 at a time */
            _mm256_storeu_ps(sd0 + g, scales8(d0 + g, x.sx + g, G - g));
            _mm256_storeu_ps(sd1 + g, scales8(d1 + g, x.sx + g, G - g));
            off0 = _mm256_add_ps(off0, scales8(m0 + g, x.xsum + g, G - g));
            off1 = _mm256_add_ps(off1, scales8(m1 + g, x.xsum + g, G - g));
        }
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            const __m256i b0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q0 + g * 16)));
            const __m256i b1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q1 + g * 16)));
            const __m256i s0 = dot32(_mm256_and_si256(b0, mask), _mm256_srli_epi16(b0, 4), x.x16 + g * 32);
            const __m256i s1 = dot32(_mm256_and_si256(b1, mask), _mm256_srli_epi16(b1, 4), x.x16 + g * 32);
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(sd0[g]), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(sd1[g]), acc1);
        }
        out[n - n0] = hsum8(_mm256_add_ps(acc0, off0));
        out[n - n0 + 1] = hsum8(_mm256_add_ps(acc1, off1));
    }
#else
    for (int64_t n = n0; n < n1; n++) {
        float s = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *b = qs + n * G * 16 + g * 16;
            int32_t dot = 0;
            for (int j = 0; j < 16; j++) dot += (b[j] & 15) * x.x16[g * 32 + j] + (b[j] >> 4) * x.x16[g * 32 + 16 + j];
            s += half_to_float(d16[n * G + g]) * x.sx[g] * (float)dot + half_to_float(m16[n * G + g]) * x.xsum[g];
        }
        out[n - n0] = s;
    }
#endif
}

/* The same for Q8_0 rows (w = d * q8, no offsets). */
static void q8_0_rows(qrow_t x, int64_t G, const int8_t *qs, const uint16_t *d16, int64_t n0, int64_t n1,
                      float *out) {
#if defined(TIER_AVX512)
    float sd0[MAX_GROUPS], sd1[MAX_GROUPS];
    for (int64_t n = n0; n < n1; n += 2) {
        const int8_t *q0 = qs + n * G * 32, *q1 = q0 + G * 32;
        const uint16_t *d0 = d16 + n * G, *d1 = d0 + G;
        for (int64_t g = 0; g < G; g += 16) {
            const __mmask16 k = G - g >= 16 ? 0xFFFF : (__mmask16)((1u << (G - g)) - 1);
            const __m512 sx = _mm512_maskz_loadu_ps(k, x.sx + g);
            _mm512_mask_storeu_ps(sd0 + g, k, _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, d0 + g)), sx));
            _mm512_mask_storeu_ps(sd1 + g, k, _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, d1 + g)), sx));
        }
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            const __m512i xv = _mm512_load_si512((const void *)(x.x16 + g * 32));
            const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q0 + g * 32)));
            const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q1 + g * 32)));
            const __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w0, xv);
            const __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w1, xv);
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(sd0[g]), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(sd1[g]), acc1);
        }
        out[n - n0] = _mm512_reduce_add_ps(acc0);
        out[n - n0 + 1] = _mm512_reduce_add_ps(acc1);
    }
#elif defined(TIER_AVX2)
    float sd0[MAX_GROUPS + 8], sd1[MAX_GROUPS + 8]; /* stored 8 at a time */
    for (int64_t n = n0; n < n1; n += 2) {
        const int8_t *q0 = qs + n * G * 32, *q1 = q0 + G * 32;
        const uint16_t *d0 = d16 + n * G, *d1 = d0 + G;
        for (int64_t g = 0; g < G; g += 8) {
            _mm256_storeu_ps(sd0 + g, scales8(d0 + g, x.sx + g, G - g));
            _mm256_storeu_ps(sd1 + g, scales8(d1 + g, x.sx + g, G - g));
        }
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            const int8_t *w0 = q0 + g * 32, *w1 = q1 + g * 32;
            const __m256i s0 = dot32(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w0)),
                                     _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w0 + 16))), x.x16 + g * 32);
            const __m256i s1 = dot32(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w1)),
                                     _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w1 + 16))), x.x16 + g * 32);
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(sd0[g]), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(sd1[g]), acc1);
        }
        out[n - n0] = hsum8(acc0);
        out[n - n0 + 1] = hsum8(acc1);
    }
#else
    for (int64_t n = n0; n < n1; n++) {
        float s = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            int32_t dot = 0;
            for (int j = 0; j < 32; j++) dot += qs[n * G * 32 + g * 32 + j] * x.x16[g * 32 + j];
            s += half_to_float(d16[n * G + g]) * x.sx[g] * (float)dot;
        }
        out[n - n0] = s;
    }
#endif
}

/* ---- the step ----------------------------------------------------------------------------------- */

typedef struct { /* one Q4_1 linear */
    const uint8_t *qs;
    const uint16_t *d16, *m16;
} q4_t;

typedef struct { /* what every thread reads */
    int64_t L, T, H, nh, nkv, D, I, W, block_size, V;
    float eps, scale;
    const int64_t *positions, *slots, *w;
    const int32_t *block_tables, *context_lens, *verify; /* verify: NULL, or each row's index in its verify row */
    const float *cos_sin, *final_norm;
    const int8_t *head_qs;
    const uint16_t *head_d16;
    const float *embeddings; /* the step's input rows, copied before the threads start: `hidden` is the output */
    float *hidden, *logits;
    /* per layer: qkv [T, Q + 2 KV], attn [T, Q], o [T, H], act [T, I], down [T, H] */
    float *qkv, *attn, *o, *act, *down;
    int32_t *flags; /* MAX_CHUNKS per op: 5 per layer (qkv, attention, o, gate_up, down) + the head */
    int32_t gen;
    int nt;
    int64_t *progress; /* the op each thread is in, one cache line each */
} step_t;

typedef struct { /* one op as a thread sees it */
    const step_t *s;
    const qrow_t *x;
    int64_t K, N, rows; /* input width, output rows (gate_up: I), rows per chunk */
    q4_t w;
    const float *bias;
    float *out;
    int64_t layer;
} op_t;

AI q4_t linear(const step_t *s, int64_t l, int i) {
    const int64_t *p = s->w + l * 17 + i;
    return (q4_t){(const uint8_t *)p[0], (const uint16_t *)p[1], (const uint16_t *)p[2]};
}

/* Rows [T, K] -> int16 rows in the thread's buffers. */
static void quantize_rows(const float *x, int64_t T, int64_t K, own_t *own, qrow_t *rows) {
    for (int64_t t = 0; t < T; t++) {
        quantize_x16(x + t * K, K, own->x16 + t * K, own->sx + t * (K / 32), own->xsum + t * (K / 32));
        rows[t] = (qrow_t){own->x16 + t * K, own->sx + t * (K / 32), own->xsum + t * (K / 32)};
    }
}

#define ROWS_PER_CHUNK 32

/* out [T, N] = x [T, K] @ w.T (+ bias), rows [n0, n1) of chunk i. */
static void matmul_chunk(const void *arg, int64_t i) {
    const op_t *op = arg;
    const int64_t n0 = i * op->rows, n1 = n0 + op->rows < op->N ? n0 + op->rows : op->N;
    float tmp[ROWS_PER_CHUNK];
    for (int64_t t = 0; t < op->s->T; t++) {
        q4_1_rows(op->x[t], op->K / 32, op->w.qs, op->w.d16, op->w.m16, n0, n1, tmp);
        for (int64_t n = n0; n < n1; n++) op->out[t * op->N + n] = tmp[n - n0] + (op->bias ? op->bias[n] : 0.0f);
    }
}

/* act [T, I] = silu(gate) * up; gate_up rows [0, I) are gate, [I, 2I) up; a chunk takes matching rows of both. */
static void gate_up_chunk(const void *arg, int64_t i) {
    const op_t *op = arg;
    const int64_t I = op->N, n0 = i * op->rows, n1 = n0 + op->rows < I ? n0 + op->rows : I;
    float gate[ROWS_PER_CHUNK], up[ROWS_PER_CHUNK];
    for (int64_t t = 0; t < op->s->T; t++) {
        q4_1_rows(op->x[t], op->K / 32, op->w.qs, op->w.d16, op->w.m16, n0, n1, gate);
        q4_1_rows(op->x[t], op->K / 32, op->w.qs, op->w.d16, op->w.m16, I + n0, I + n1, up);
        for (int64_t n = n0; n < n1; n++) {
            const float a = gate[n - n0];
            op->out[t * I + n] = a / (1.0f + expf(-a)) * up[n - n0];
        }
    }
}

/* LM head rows [n0, n1) of chunk i into logits [T, V]. */
static void head_chunk(const void *arg, int64_t i) {
    const op_t *op = arg;
    const int64_t n0 = i * op->rows, n1 = n0 + op->rows < op->N ? n0 + op->rows : op->N;
    for (int64_t t = 0; t < op->s->T; t++)
        q8_0_rows(op->x[t], op->K / 32, op->s->head_qs, op->s->head_d16, n0, n1, op->out + t * op->N + n0);
}

/* One (row, head) of the attention: the head's query (rotated) over cached positions 0 .. len - 2 - j and the
 * step's own keys and values at len - 1 - j .. len - 1 (j: the row's index in its verify row, else 0), read
 * from the qkv rows t - j .. t; online softmax a cache block at a time. */
static void attend(const step_t *s, const float *k_cache, const float *v_cache, const float *qkv_row, int64_t t,
                   int64_t h, float *out) {
    const int64_t D = s->D, Q = s->nh * D, KV = s->nkv * D, QKV = Q + 2 * KV, kvh = h / (s->nh / s->nkv);
    const int64_t token_stride = KV, block_stride = s->block_size * KV, len = s->context_lens[t];
    const int64_t j_own = s->verify ? s->verify[t] : 0, first_own = len - 1 - j_own;
    const float *cs = s->cos_sin + s->positions[t] * D;
    float q[256], k_own[4][256], acc[256], scores[256], m = -INFINITY, l = 0.0f;
    rotate(qkv_row + h * D, cs, D, q);
    for (int64_t d = 0; d <= j_own; d++) /* k_own[d]: the key at position first_own + d, row t - j_own + d */
        rotate(qkv_row - (j_own - d) * QKV + Q + kvh * D, s->cos_sin + s->positions[t - j_own + d] * D, D, k_own[d]);
    for (int64_t i = 0; i < D; i++) acc[i] = 0.0f;
    for (int64_t start = 0; start < len; start += s->block_size) {
        const int64_t block = s->block_tables[t * s->W + start / s->block_size];
        const int64_t n = len - start < s->block_size ? len - start : s->block_size;
        const float *kb = k_cache + block * block_stride + kvh * D, *vb = v_cache + block * block_stride + kvh * D;
        float chunk_max = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            const float *k = start + j >= first_own ? k_own[start + j - first_own] : kb + j * token_stride;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < D; i++) dot += q[i] * k[i];
            scores[j] = dot * s->scale;
            chunk_max = scores[j] > chunk_max ? scores[j] : chunk_max;
        }
        const float m_new = chunk_max > m ? chunk_max : m, alpha = expf(m - m_new);
        l *= alpha;
        for (int64_t i = 0; i < D; i++) acc[i] *= alpha;
        for (int64_t j = 0; j < n; j++) {
            const int64_t own = start + j - first_own;
            const float p = expf(scores[j] - m_new);
            const float *v = own >= 0 ? qkv_row - (j_own - own) * QKV + Q + KV + kvh * D : vb + j * token_stride;
            l += p;
#pragma omp simd
            for (int64_t i = 0; i < D; i++) acc[i] += p * v[i];
        }
        m = m_new;
    }
    for (int64_t i = 0; i < D; i++) out[i] = l > 0.0f ? acc[i] / l : 0.0f;
}

/* Chunks 0 .. T nh - 1: one (row, head) each, from the layer's qkv rows (op->bias) into op->out; chunk T nh:
 * the step's keys (rotated) and values into the cache. */
static void attention_chunk(const void *arg, int64_t i) {
    const op_t *op = arg;
    const step_t *s = op->s;
    const int64_t *p = s->w + op->layer * 17;
    float *k_cache = (float *)p[15], *v_cache = (float *)p[16];
    const int64_t D = s->D, Q = s->nh * D, KV = s->nkv * D, QKV = Q + 2 * KV;
    if (i < s->T * s->nh) {
        const int64_t t = i / s->nh, h = i % s->nh;
        attend(s, k_cache, v_cache, op->bias + t * QKV, t, h, op->out + t * Q + h * D);
        return;
    }
    for (int64_t t = 0; t < s->T; t++) {
        if (s->slots[t] < 0) continue;
        const float *row = op->bias + t * QKV, *cs = s->cos_sin + s->positions[t] * D;
        for (int64_t kvh = 0; kvh < s->nkv; kvh++) rotate(row + Q + kvh * D, cs, D, k_cache + s->slots[t] * KV + kvh * D);
        memcpy(v_cache + s->slots[t] * KV, row + Q + KV, KV * sizeof(float));
    }
}

AI int64_t chunks_of(int64_t n, int64_t per) { return (n + per - 1) / per; }

AI void run(const step_t *s, int64_t k, chunk_fn fn, const op_t *op) {
    step_run_op(k, s->flags + k * MAX_CHUNKS, s->gen, fn == attention_chunk ? s->T * s->nh + 1 : chunks_of(op->N, op->rows),
           fn, op, omp_get_thread_num(), s->nt, s->progress);
}

static void run_step(const step_t *s, own_t *own) {
    const int64_t T = s->T, H = s->H, Q = s->nh * s->D, QKV = Q + 2 * s->nkv * s->D, I = s->I;
    qrow_t rows[4];
    memcpy(own->residual, s->embeddings, sizeof(float) * T * H);
    for (int64_t l = 0; l < s->L; l++) {
        const int64_t *p = s->w + l * 17;
        float *qkv = s->qkv + l * T * QKV, *attn = s->attn + l * T * Q, *o = s->o + l * T * H;
        float *act = s->act + l * T * I, *down = s->down + l * T * H;
        add_norm(own->residual, l ? s->down + (l - 1) * T * H : NULL, (const float *)p[13], s->eps, T, H, own->h);
        quantize_rows(own->h, T, H, own, rows);
        run(s, 5 * l, matmul_chunk, &(op_t){s, rows, H, QKV, ROWS_PER_CHUNK, linear(s, l, 0), (const float *)p[3], qkv, l});
        run(s, 5 * l + 1, attention_chunk, &(op_t){s, NULL, 0, 0, 0, {0}, qkv, attn, l});
        quantize_rows(attn, T, Q, own, rows);
        run(s, 5 * l + 2, matmul_chunk, &(op_t){s, rows, Q, H, ROWS_PER_CHUNK, linear(s, l, 4), NULL, o, l});
        add_norm(own->residual, o, (const float *)p[14], s->eps, T, H, own->h);
        quantize_rows(own->h, T, H, own, rows);
        run(s, 5 * l + 3, gate_up_chunk, &(op_t){s, rows, H, I, ROWS_PER_CHUNK, linear(s, l, 7), NULL, act, l});
        quantize_rows(act, T, I, own, rows);
        run(s, 5 * l + 4, matmul_chunk, &(op_t){s, rows, I, H, ROWS_PER_CHUNK, linear(s, l, 10), NULL, down, l});
    }
    add_norm(own->residual, s->down + (s->L - 1) * T * H, s->final_norm, s->eps, T, H, own->h);
    if (omp_get_thread_num() == 0) memcpy(s->hidden, own->h, sizeof(float) * T * H);
    if (s->logits == NULL) return;
    quantize_rows(own->h, T, H, own, rows);
    const int64_t per = s->V / MAX_CHUNKS + 1 > 256 ? (s->V / MAX_CHUNKS + 2) & ~(int64_t)1 : 256;
    run(s, 5 * s->L, head_chunk, &(op_t){s, rows, H, s->V, per, {0}, NULL, s->logits, 0});
}

/* 1 <= T <= 4 one-token rows (decode only). hidden [T, H]: the token embeddings in, the final-norm output out;
 * logits [T, V] (or NULL: no head); verify: NULL, or each row's index in its verify row (at most 3). Per layer, `w` holds 17 pointers: qkv (qs, d16, m16, bias or 0), o (qs, d16,
 * m16), gate_up (qs, d16, m16), down (qs, d16, m16), input norm, post-attention norm, k cache, v cache (the
 * caches [num_blocks, block_size, nkv, D] float32). Needs N even for every matrix, H, nh * D, I <= 16384 and
 * N <= 32 * MAX_CHUNKS for the linears (cpu_decode.py checks). */
void llama_decode_rows(int64_t L, int64_t T, float *hidden, const int64_t *positions, const int64_t *slots,
                       const int32_t *block_tables, const int32_t *context_lens, int64_t W, int64_t H, int64_t nh,
                       int64_t nkv, int64_t D, int64_t I, float eps, const float *cos_sin, int64_t block_size,
                       const int64_t *w, const float *final_norm, float scale, const int8_t *head_qs,
                       const uint16_t *head_d16, int64_t V, float *logits, const int32_t *verify, int num_threads) {
    static __thread void *shared_buf;
    static __thread size_t shared_cap;
    const int64_t Q = nh * D, QKV = Q + 2 * nkv * D, ops = 5 * L + 1;
    float *buf = step_scratch(sizeof(float) * T * (L * (QKV + Q + H + I + H) + H), &shared_buf, &shared_cap);
    if (buf == NULL) abort();
    /* A thread may start late (descheduled) after thread 0 wrote the output into `hidden`: all read this copy. */
    float *embeddings = memcpy(buf + L * T * (QKV + Q + H + I + H), hidden, sizeof(float) * T * H);
    int32_t *flags;
    int64_t *progress;
    const int32_t gen = step_begin(ops * MAX_CHUNKS, num_threads, &flags, &progress);
    step_t s = {L, T, H, nh, nkv, D, I, W, block_size, V, eps, scale, positions, slots, w, block_tables,
                context_lens, verify, cos_sin, final_norm, head_qs, head_d16, embeddings, hidden, head_qs ? logits : NULL,
                buf, buf + L * T * QKV, buf + L * T * (QKV + Q), buf + L * T * (QKV + Q + H),
                buf + L * T * (QKV + Q + H + I), flags, gen, num_threads, progress};
    const int64_t K = I > H ? (I > Q ? I : Q) : (H > Q ? H : Q);
#pragma omp parallel num_threads(num_threads)
    {
        own_t own = step_own(T, H, K);
        run_step(&s, &own);
    }
}

/* out [T, N] = x [T, K] @ W.T through the decode step's own matmul rows (x rounded to int16 per group of 32, float16
 * scales; m16 NULL: Q8_0 blocks): how the load-time check (layers/kernel_check.py) proves them on this CPU. N even. */
void decode_rows_matmul(const float *x, int64_t T, int64_t K, const uint8_t *qs, const uint16_t *d16,
                        const uint16_t *m16, int64_t N, float *out) {
    const int64_t G = K / 32;
    int16_t *x16 = aligned_alloc(64, (sizeof(int16_t) * K + 63) / 64 * 64);
    float *sx = malloc(sizeof(float) * 2 * G);
    if (x16 == NULL || sx == NULL) abort();
    for (int64_t t = 0; t < T; t++) {
        quantize_x16(x + t * K, K, x16, sx, sx + G);
        const qrow_t row = {x16, sx, sx + G};
        if (m16 != NULL) q4_1_rows(row, G, qs, d16, m16, 0, N, out + t * N);
        else q8_0_rows(row, G, (const int8_t *)qs, d16, 0, N, out + t * N);
    }
    free(x16);
    free(sx);
}
