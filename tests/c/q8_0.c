/* Q8_0 (docs/formats.md): 32 values -> fp16 d = amax/127 + 32 int8 codes roundf(x * (1/d)), 34 bytes.
 * Build: cc -O2 -shared -fPIC -ffp-contract=off q8_0.c -o libq8_0.so -lm
 * Broken variants for the tests: -DROUND_HALF_EVEN (rintf instead of roundf), -DUNWRITTEN (the last code
 * byte of every block is never written), -DOVERRUN (writes one byte past the end of the row), -DZERO_BLOCK_GARBAGE (an
 * all-zero block gets codes 0x80, as ggml's SIMD q8_0 writes -128 where 1/d overflows: d = 0 decodes them to zeros). */
#include <stdint.h>
#include "fp16.h"

#define QK8_0 32

void quantize_row_q8_0_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK8_0;
        uint8_t *yb = y + i * 34;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            const float v = fabsf(xb[j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_fp16(yb, d);
#ifdef UNWRITTEN
        for (int j = 0; j < QK8_0 - 1; j++) {
#else
        for (int j = 0; j < QK8_0; j++) {
#endif
            const float v = xb[j] * id;
#ifdef ROUND_HALF_EVEN
            yb[2 + j] = (uint8_t)(int8_t)rintf(v);
#else
            yb[2 + j] = (uint8_t)(int8_t)roundf(v);
#endif
#ifdef ZERO_BLOCK_GARBAGE
            if (amax == 0.0f) yb[2 + j] = 0x80;
#endif
        }
    }
#ifdef OVERRUN
    if (nb) y[nb * 34] = 0;
#endif
}

void dequantize_row_q8_0(const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *xb = x + i * 34;
        const float d = get_fp16(xb);
        for (int j = 0; j < QK8_0; j++) y[i * QK8_0 + j] = (float)(int8_t)xb[2 + j] * d;
    }
}
