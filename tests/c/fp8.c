/* FP8 E4M3 / E5M2 with a per-tensor scale (vLLM's fp8 KV cache), written from docs/formats.md ("FP8_E4M3 / FP8_E5M2").
 * Build: cc -O2 -shared -fPIC -ffp-contract=off fp8.c -o libfp8.so
 * ggml-style row signatures (quantize_row_fp8_e4m3_ref, dequantize_row_fp8_e4m3, ...). The row signature has no
 * scale, so the scale is a compile-time constant: -DFP8_SCALE=0.0173f (default 1.0f). -DFP8_SATURATE=1 (the default) stores the
 * largest finite value on overflow (__NV_SATFINITE, vLLM; what tbq check compares with);
 * -DFP8_SATURATE=0: the non-saturating result (E4M3 NaN, E5M2 +-inf), which is what tbq's reference stores with on_overflow="inf". */
#include <stdint.h>
#include <string.h>

#ifndef FP8_SCALE
#define FP8_SCALE 1.0f
#endif
#ifndef FP8_SATURATE
#define FP8_SATURATE 1
#endif

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* round to nearest even onto the grid: m mantissa bits, exponent bias, overflow at |v| bits >= over */
static uint8_t to_fp8(float v, int m, int bias, uint32_t max_code, uint32_t nosat_code, uint32_t over) {
    const uint32_t u = bits(v), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    uint32_t code;
    if (a >= over) {
        code = FP8_SATURATE ? max_code : nosat_code;
    } else if (a < ((uint32_t)(128 - bias) << 23)) {  /* below the smallest normal: the float add rounds to the step */
        const uint32_t k = (uint32_t)(127 + 23 + 1 - bias - m) << 23;
        code = bits(from_bits(a) + from_bits(k)) - k;
    } else {
        const int shift = 23 - m;
        code = ((a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) >> shift) - ((uint32_t)(127 - bias) << m);
    }
    return (uint8_t)(code | sign);
}

static float from_fp8(uint8_t q, int m, int bias, int has_inf) {
    const int e = (q >> m) & ((1 << (7 - m)) - 1), mant = q & ((1 << m) - 1), top = (1 << (7 - m)) - 1;
    float mag;
    if ((has_inf && e == top && mant) || (!has_inf && (q & 0x7F) == 0x7F)) return from_bits(0x7FFFFFFFu);
    if (has_inf && e == top) mag = 1.0f / 0.0f;
    else if (e == 0) mag = (float)mant * from_bits((uint32_t)(127 + 1 - bias - m) << 23);
    else mag = (1.0f + (float)mant / (float)(1 << m)) * from_bits((uint32_t)(127 + e - bias) << 23);
    return ((q & 0x80) ? -mag : mag) * FP8_SCALE;
}

void quantize_row_fp8_e4m3_ref(const float *x, void *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((uint8_t *)y)[i] = to_fp8(x[i] / FP8_SCALE, 3, 7, 0x7E, 0x7F, 0x43E80001u);
}
void dequantize_row_fp8_e4m3(const void *q, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = from_fp8(((const uint8_t *)q)[i], 3, 7, 0);
}
void quantize_row_fp8_e5m2_ref(const float *x, void *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((uint8_t *)y)[i] = to_fp8(x[i] / FP8_SCALE, 2, 15, 0x7B, 0x7C, 0x47700000u);
}
void dequantize_row_fp8_e5m2(const void *q, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = from_fp8(((const uint8_t *)q)[i], 2, 15, 1);
}
