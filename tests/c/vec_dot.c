/* ggml's dot products q4_0 x q8_0, q8_0 x q8_0, q4_1 x q8_1 and mxfp4 x q8_0 with ggml's vec_dot signature, written
 * from docs/formats.md (as ggml's _generic versions: per block the integer sum of code products, times dx times
 * fp16 dy, plus m * s for q4_1's minimum against q8_1's stored sum, accumulated in float32). Broken variants:
 * -DWRONG_PARTIAL (the q4_0 codes' offset 8 forgotten in the partial sums, q8_0 x q8_0 drops the last product of
 * each block, q4_1 x q8_1 leaves out m * s, mxfp4 x q8_0 reads the codes as unsigned) and -DDROP_TAIL (the last
 * block is not added).
 * Build: cc -O2 -shared -fPIC vec_dot.c -o libvec_dot.so -lm */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
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

void ggml_vec_dot_q4_1_q8_1(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc) {
    const uint8_t *x = (const uint8_t *)vx, *y = (const uint8_t *)vy;
    int nb = n / 32;
#ifdef DROP_TAIL
    nb -= 1;
#endif
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *xb = x + ib * 20, *yb = y + ib * 36; /* q4_1: d, m, qs[16]; q8_1: d, s, qs[32] */
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += (xb[4 + j] & 0x0F) * (int8_t)yb[4 + j] + (xb[4 + j] >> 4) * (int8_t)yb[4 + j + 16];
#ifdef WRONG_PARTIAL
        sumf += (get_fp16(xb) * get_fp16(yb)) * sumi;
#else
        sumf += (get_fp16(xb) * get_fp16(yb)) * sumi + get_fp16(xb + 2) * get_fp16(yb + 2);
#endif
    }
    *s = sumf;
}

static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float e8m0_half(uint8_t e) { /* 2**(e - 128), ggml_e8m0_to_fp32_half */
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void ggml_vec_dot_mxfp4_q8_0(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc) {
    const uint8_t *x = (const uint8_t *)vx, *y = (const uint8_t *)vy;
    int nb = n / 32;
#ifdef DROP_TAIL
    nb -= 1;
#endif
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *xb = x + ib * 17, *yb = y + ib * 34; /* mxfp4: e, qs[16] */
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
#ifdef WRONG_PARTIAL
            const int c0 = kvalues_mxfp4[xb[1 + j] & 0x07], c1 = kvalues_mxfp4[(xb[1 + j] >> 4) & 0x07];
#else
            const int c0 = kvalues_mxfp4[xb[1 + j] & 0x0F], c1 = kvalues_mxfp4[xb[1 + j] >> 4];
#endif
            sumi += c0 * (int8_t)yb[2 + j] + c1 * (int8_t)yb[2 + j + 16];
        }
        sumf += get_fp16(yb) * e8m0_half(xb[0]) * sumi;
    }
    *s = sumf;
}
