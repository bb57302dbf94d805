/* The peak rate of the integer dot-product instructions the tiled kernels are built on, registers only (no
 * loads, no unpacking, no scaling): what no kernel of that instruction mix can beat on this core. Built and
 * timed by bench/cpu_tiers.py at each -march tier. Each function runs n rounds of 8 independent
 * accumulators and returns a lane so nothing is optimized away; MACs per round below. */
#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define R8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

#ifdef __AVX2__
#define DECL256(i) __m256i a##i = _mm256_setzero_si256(), w##i = _mm256_set1_epi16(i + 1);
#define MADDWD(i) a##i = _mm256_add_epi32(a##i, _mm256_madd_epi16(w##i, x));
#define MADDUBSW(i) a##i = _mm256_add_epi16(a##i, _mm256_maddubs_epi16(w##i, x));
#define SUM256(i) s = _mm256_add_epi32(s, a##i);

/* int16 x int16 (the AVX2 tier's tiled kernel): vpmaddwd + vpaddd, 8 x 16 MACs a round */
int64_t peak_maddwd(int64_t n) {
    __m256i x = _mm256_set1_epi16(5), s = _mm256_setzero_si256();
    R8(DECL256)
    for (int64_t k = 0; k < n; k++) {
        R8(MADDWD)
        __asm__ volatile("" : "+x"(x));
    }
    R8(SUM256)
    return _mm256_extract_epi32(s, 0);
}

/* uint8 x int8 (llama.cpp's AVX2 q4_1 x q8_1): vpmaddubsw + vpaddw, 8 x 32 MACs a round */
int64_t peak_maddubsw(int64_t n) {
    __m256i x = _mm256_set1_epi16(5), s = _mm256_setzero_si256();
    R8(DECL256)
    for (int64_t k = 0; k < n; k++) {
        R8(MADDUBSW)
        __asm__ volatile("" : "+x"(x));
    }
    R8(SUM256)
    return _mm256_extract_epi32(s, 0);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define DECL512(i) __m512i a##i = _mm512_setzero_si512(), w##i = _mm512_set1_epi16(i + 1);
#define DPWSSD(i) a##i = _mm512_dpwssd_epi32(a##i, w##i, x);
#define SUM512(i) s = _mm512_add_epi32(s, a##i);

/* int16 x int16 (the AVX-512 tier's tiled kernel): vpdpwssd zmm, 8 x 32 MACs a round */
int64_t peak_dpwssd(int64_t n) {
    __m512i x = _mm512_set1_epi16(5), s = _mm512_setzero_si512();
    R8(DECL512)
    for (int64_t k = 0; k < n; k++) {
        R8(DPWSSD)
        __asm__ volatile("" : "+v"(x));
    }
    R8(SUM512)
    return _mm512_reduce_add_epi32(s);
}
#endif
