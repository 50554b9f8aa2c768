/* TBQ4_0 and TBQ3_0 (docs/formats.md): randomized Hadamard rotation + scalar codebook + fp16 corrected norm.
 * Build: cc -O2 -shared -fPIC -ffp-contract=off -I<dir of tbq_tables.h> tbq.c -o libtbq.so -lm
 * tbq_tables.h defines TBQ4_CENTROIDS[16], TBQ4_THRESHOLDS[15], TBQ3_CENTROIDS[8], TBQ3_THRESHOLDS[7],
 * TBQ_SIGNS1[128], TBQ_SIGNS2[128] (floats +-1): the tables of `tbq golden`'s header or tbq.get_format(...).tables().
 *
 * Variants for the tests (each a bug or a legitimate difference):
 *   -DSHIFT_BUG      the fork's first 3-bit packer (docs/formats.md, "The 3-bit shift bug")
 *   -DFMA_SCALE      the corrected norm with fused multiply-adds: recon's sum and a Newton-refined division
 *   -DPAIRWISE_NORM  the norm's sum of squares as a pairwise tree instead of a sequential sum
 *   -DFLIP_SIGNS2=j  signs2[j] negated (both directions): a different sign table */
#include <stdint.h>
#include "fp16.h"
#include "tbq_tables.h"

#define QK 128
static const float HSCALE = 0x1.6a09e6p-4f; /* the float32 nearest 1/sqrt(128) */

static float sign2(int j) {
#ifdef FLIP_SIGNS2
    if (j == FLIP_SIGNS2) return -TBQ_SIGNS2[j];
#endif
    return TBQ_SIGNS2[j];
}

static void butterfly(float *v) {
    for (int h = 1; h < QK; h <<= 1)
        for (int i = 0; i < QK; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

static float sum_squares(const float *x) {
#ifdef PAIRWISE_NORM
    float t[QK];
    for (int j = 0; j < QK; j++) t[j] = x[j] * x[j];
    for (int w = QK / 2; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++) t[j] = t[j] + t[j + w];
    return t[0];
#else
    float s = 0.0f;
    for (int j = 0; j < QK; j++) s += x[j] * x[j];
    return s;
#endif
}

static float corrected_norm(float norm, const int *idx, const float *c, int bits) {
    float s = 0.0f;
    for (int j = 0; j < QK; j++) {
#ifdef FMA_SCALE
        s = fmaf(c[idx[j]], c[idx[j]], s);
#else
        s += c[idx[j]] * c[idx[j]];
#endif
    }
    float recon = sqrtf(s);
    if (bits == 3) recon = recon > 1e-10f ? recon : 1e-10f;
    else if (!(recon > 1e-10f)) return norm;
#ifdef FMA_SCALE
    const float r = 1.0f / recon, q = norm * r; /* a GPU-style division: reciprocal, then one Newton step */
    return fmaf(fmaf(-q, recon, norm), r, q);
#else
    return norm / recon;
#endif
}

static void encode_block(const float *x, uint8_t *y, int bits) {
    const float *c = bits == 4 ? TBQ4_CENTROIDS : TBQ3_CENTROIDS;
    const float *m = bits == 4 ? TBQ4_THRESHOLDS : TBQ3_THRESHOLDS;
    const int nm = bits == 4 ? 15 : 7;
    float v[QK];
    int idx[QK];
    float norm = sqrtf(sum_squares(x));
    if (bits == 4) {
        const float inv = norm > 1e-10f ? 1.0f / norm : 0.0f;
        for (int j = 0; j < QK; j++) v[j] = x[j] * inv * TBQ_SIGNS1[j];
    } else {
        norm = norm > 1e-10f ? norm : 1e-10f;
        for (int j = 0; j < QK; j++) v[j] = x[j] / norm * TBQ_SIGNS1[j];
    }
    butterfly(v);
    for (int j = 0; j < QK; j++) {
        const float r = v[j] * HSCALE * sign2(j);
        int q = 0;
        for (int t = 0; t < nm; t++) q += r >= m[t];
        idx[j] = q;
    }
    put_fp16(y, corrected_norm(norm, idx, c, bits));
    uint8_t *qs = y + 2;
    if (bits == 4) {
        for (int j = 0; j < QK / 2; j++) qs[j] = (uint8_t)(idx[2 * j] | (idx[2 * j + 1] << 4));
        return;
    }
    for (int g = 0; g < QK / 8; g++) {
        uint8_t *lane = qs + 3 * g;
#ifdef SHIFT_BUG
        lane[0] = lane[1] = lane[2] = 0;
        for (int t = 0; t < 8; t++) {
            const uint32_t q = (uint32_t)idx[8 * g + t];
            const int bit = 3 * t;
            lane[0] |= (uint8_t)(q << (bit < 8 ? bit : 0));
            /* the fork: qs[1] |= idx >> (8 - bit), a negative shift count (undefined in C); x86 masks the
             * count to 5 bits, which is what `& 31` spells out here: the result is 0 */
            if (bit >= 8) lane[1] |= (uint8_t)(q >> ((8 - bit) & 31));
        }
#else
        uint32_t L = 0;
        for (int t = 0; t < 8; t++) L |= (uint32_t)idx[8 * g + t] << (3 * t);
        lane[0] = (uint8_t)L;
        lane[1] = (uint8_t)(L >> 8);
        lane[2] = (uint8_t)(L >> 16);
#endif
    }
}

static void decode_block(const uint8_t *x, float *y, int bits) {
    const float *c = bits == 4 ? TBQ4_CENTROIDS : TBQ3_CENTROIDS;
    const float d = get_fp16(x);
    const uint8_t *qs = x + 2;
    float v[QK];
    for (int j = 0; j < QK; j++) {
        int q;
        if (bits == 4) q = (qs[j / 2] >> (4 * (j & 1))) & 15;
        else {
            const uint8_t *lane = qs + 3 * (j / 8);
            const uint32_t L = lane[0] | ((uint32_t)lane[1] << 8) | ((uint32_t)lane[2] << 16);
            q = (L >> (3 * (j % 8))) & 7;
        }
        v[j] = c[q] * sign2(j);
    }
    butterfly(v);
    for (int j = 0; j < QK; j++) y[j] = v[j] * HSCALE * TBQ_SIGNS1[j] * d;
}

void quantize_row_tbq4_0_ref(const float *x, void *y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) encode_block(x + i * QK, (uint8_t *)y + i * 66, 4);
}
void dequantize_row_tbq4_0(const void *x, float *y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) decode_block((const uint8_t *)x + i * 66, y + i * QK, 4);
}
void quantize_row_tbq3_0_ref(const float *x, void *y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) encode_block(x + i * QK, (uint8_t *)y + i * 50, 3);
}
void dequantize_row_tbq3_0(const void *x, float *y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) decode_block((const uint8_t *)x + i * 50, y + i * QK, 3);
}
