/* ggml's dot products q4_0 x q8_0 and q8_0 x q8_0 with ggml's vec_dot signature, written from docs/formats.md
 * (as ggml's _generic versions: per block the integer sum of code products, times fp16 dx times fp16 dy,
 * accumulated in float32). Broken variants: -DWRONG_PARTIAL (the q4_0 codes' offset 8 forgotten in the partial
 * sums, q8_0 x q8_0 drops the last product of each block) and -DDROP_TAIL (the last block is not added).
 * Build: cc -O2 -shared -fPIC vec_dot.c -o libvec_dot.so -lm */
#include <stddef.h>
#include <stdint.h>
#include "fp16.h"

void ggml_vec_dot_q4_0_q8_0(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc) {
    const uint8_t *x = (const uint8_t *)vx, *y = (const uint8_t *)vy;
    int nb = n / 32;
#ifdef DROP_TAIL
    nb -= 1;
#endif
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *xb = x + ib * 18, *yb = y + ib * 34;
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
#ifdef WRONG_PARTIAL
            const int v0 = xb[2 + j] & 0x0F, v1 = xb[2 + j] >> 4;
#else
            const int v0 = (xb[2 + j] & 0x0F) - 8, v1 = (xb[2 + j] >> 4) - 8;
#endif
            sumi += v0 * (int8_t)yb[2 + j] + v1 * (int8_t)yb[2 + j + 16];
        }
        sumf += sumi * get_fp16(xb) * get_fp16(yb);
    }
    *s = sumf;
}

void ggml_vec_dot_q8_0_q8_0(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc) {
    const uint8_t *x = (const uint8_t *)vx, *y = (const uint8_t *)vy;
    int nb = n / 32;
#ifdef DROP_TAIL
    nb -= 1;
#endif
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *xb = x + ib * 34, *yb = y + ib * 34;
        int sumi = 0;
#ifdef WRONG_PARTIAL
        for (int j = 0; j < 31; j++) sumi += (int8_t)xb[2 + j] * (int8_t)yb[2 + j];
#else
        for (int j = 0; j < 32; j++) sumi += (int8_t)xb[2 + j] * (int8_t)yb[2 + j];
#endif
        sumf += sumi * (get_fp16(xb) * get_fp16(yb));
    }
    *s = sumf;
}
