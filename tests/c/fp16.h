/* fp16 <-> fp32 for the test kernels (docs/formats.md: IEEE binary16, little-endian,
 * float32 -> fp16 rounds to nearest even with subnormals, overflowing to Inf at 65520).
 * The conversion is ggml's software routine (ggml-impl.h, from the FP16 library). */
#ifndef TBQ_TEST_FP16_H
#define TBQ_TEST_FP16_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float fp32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t fp32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

static inline uint16_t fp32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = fp32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = fp32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = fp32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

/* Exact widening; NaN keeps its payload. */
static inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    if (exp == 0x1F) return fp32_from_bits(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        float v = (float)mant * 0x1.0p-24f; /* exact: mant < 2^10 */
        return sign ? -v : v;
    }
    return fp32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline void put_fp16(uint8_t *p, float v) { uint16_t h = fp32_to_fp16(v); p[0] = (uint8_t)h; p[1] = (uint8_t)(h >> 8); }
static inline float get_fp16(const uint8_t *p) { return fp16_to_fp32((uint16_t)(p[0] | (p[1] << 8))); }
#endif
