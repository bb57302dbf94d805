/* The instructions a prefill on this core could be built on beyond the tiled kernel's vpdpwssd
 * (bench/isa_peak.c): AVX-512 VNNI's 8-bit vpdpbusd and the AMX tile multiplies, registers and tiles only
 * (no loads in the loop, no unpacking, no scaling). Built and timed by bench/disagg_limits.py with
 * -march=native; each function returns a value so nothing is optimized away; MACs per round below. */
#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define R8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define DECL512(i) __m512i a##i = _mm512_setzero_si512(), w##i = _mm512_set1_epi8(i + 1);
#define DPBUSD(i) a##i = _mm512_dpbusd_epi32(a##i, w##i, x);
#define SUM512(i) s = _mm512_add_epi32(s, a##i);

/* uint8 x int8 (int8 activations): vpdpbusd zmm, 8 x 64 MACs a round */
int64_t peak_dpbusd(int64_t n) {
    __m512i x = _mm512_set1_epi8(5), s = _mm512_setzero_si512();
    R8(DECL512)
    for (int64_t k = 0; k < n; k++) {
        R8(DPBUSD)
        __asm__ volatile("" : "+v"(x));
    }
    R8(SUM512)
    return _mm512_reduce_add_epi32(s);
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

struct tile_config {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Linux hands a process the tile registers only when asked; 0 on success. */
int amx_request(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

static void tiles_16x64(void) {
    struct tile_config cfg = {0};
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* int8 x int8: tdpbssd, four 16x16 int32 tiles from two A and two B tiles, 4 x 16 x 16 x 64 MACs a round */
int64_t peak_tdpbssd(int64_t n) {
    static int8_t in[16 * 64];
    static int32_t out[16 * 16];
    for (int i = 0; i < 16 * 64; i++) in[i] = (int8_t)(i % 7);
    tiles_16x64();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, in, 64); _tile_loadd(5, in, 64); _tile_loadd(6, in, 64); _tile_loadd(7, in, 64);
    for (int64_t k = 0; k < n; k++) {
        _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}

/* bf16 x bf16 -> f32: tdpbf16ps, the same four tiles, 4 x 16 x 16 x 32 MACs a round */
int64_t peak_tdpbf16ps(int64_t n) {
    static uint16_t in[16 * 32];
    static float out[16 * 16];
    for (int i = 0; i < 16 * 32; i++) in[i] = 0x3f80;  /* 1.0 */
    tiles_16x64();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, in, 64); _tile_loadd(5, in, 64); _tile_loadd(6, in, 64); _tile_loadd(7, in, 64);
    for (int64_t k = 0; k < n; k++) {
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return (int64_t)out[0];
}
#endif
