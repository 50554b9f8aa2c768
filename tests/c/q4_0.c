/* Q4_0 (docs/formats.md): 32 values -> fp16 d = max/-8 (max: the signed value of largest magnitude,
 * the first on a tie) + 32 4-bit codes min(15, trunc(x*id + 8.5)), byte j = q[j] | q[j+16] << 4; 18 bytes.
 * Build: cc -O2 -shared -fPIC -ffp-contract=off q4_0.c -o libq4_0.so -lm
 * Broken variants for the tests: -DSWAP_NIBBLES (byte j = q[j+16] | q[j] << 4, in both directions);
 * -DSIGN_FROM_FIRST (max starts at x[0], so an all-zero block takes the sign of its scale from x[0]: d = -0 / -8 = +0
 * where the spec stores -0); -DNEGATE_BIG (blocks with amax > 64 get the scale's sign flipped; with -DSWAP_NIBBLES a
 * kernel with two independent bugs). */
#include <stdint.h>
#include "fp16.h"

#define QK4_0 32

void quantize_row_q4_0_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK4_0;
        uint8_t *yb = y + i * 18;
#ifdef SIGN_FROM_FIRST
        float amax = fabsf(xb[0]), max = xb[0];
#else
        float amax = 0.0f, max = 0.0f;
#endif
        for (int j = 0; j < QK4_0; j++) {
            const float v = xb[j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
#ifdef NEGATE_BIG  /* a second, independent bug: blocks with amax > 64 store the scale's sign flipped */
        const float d = amax > 64.0f ? max / 8.0f : max / -8.0f;
#else
        const float d = max / -8.0f;
#endif
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_fp16(yb, d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = xb[j] * id;
            const float x1 = xb[j + QK4_0 / 2] * id;
            const int8_t t0 = (int8_t)(x0 + 8.5f), t1 = (int8_t)(x1 + 8.5f);
            const uint8_t q0 = (uint8_t)(t0 < 15 ? t0 : 15), q1 = (uint8_t)(t1 < 15 ? t1 : 15);
#ifdef SWAP_NIBBLES
            yb[2 + j] = (uint8_t)(q1 | (q0 << 4));
#else
            yb[2 + j] = (uint8_t)(q0 | (q1 << 4));
#endif
        }
    }
}

void dequantize_row_q4_0(const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *xb = x + i * 18;
        const float d = get_fp16(xb);
        for (int j = 0; j < QK4_0 / 2; j++) {
#ifdef SWAP_NIBBLES
            const int v0 = (xb[2 + j] >> 4) - 8, v1 = (xb[2 + j] & 0x0F) - 8;
#else
            const int v0 = (xb[2 + j] & 0x0F) - 8, v1 = (xb[2 + j] >> 4) - 8;
#endif
            y[i * QK4_0 + j] = (float)v0 * d;
            y[i * QK4_0 + j + QK4_0 / 2] = (float)v1 * d;
        }
    }
}
