/* fp32 -> bf16 row conversion shaped like a SIMD kernel: a 16-wide body and a scalar tail. The tail is right;
 * the body flushes subnormal inputs to zero (as an AVX512-BF16 conversion does), so one value alone (the tail)
 * passes and only a row of at least 16 values shows the bug.
 * Build: cc -O2 -shared -fPIC simd_tail.c -o libsimd_tail.so -lm */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x7FFFFFFF) > 0x7F800000 ? (uint16_t)((u >> 16) | 64) : (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

void ggml_fp32_to_bf16_row_ref(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int j = 0; j < 16; j++) {
            float v = x[i + j];
            if (v != 0.0f && fabsf(v) < FLT_MIN) v = copysignf(0.0f, v);  /* the body's flush to zero */
            y[i + j] = bf16(v);
        }
    }
    for (; i < n; i++) y[i] = bf16(x[i]);
}
