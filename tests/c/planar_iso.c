/* PLANAR3_0, ISO3_0, PLANAR4_0, ISO4_0 (docs/formats.md; SPEC-planar-iso of the C reference set): a fixed
 * rotation (64 Givens rotations or 32 quaternion left-multiplications) + nearest-centroid codebook + fp16
 * corrected norm. Build: cc -O2 -shared -fPIC -ffp-contract=off -I<dir of planar_iso_tables.h> planar_iso.c -lm
 * planar_iso_tables.h defines PI_CENTROIDS3[8], PI_CENTROIDS4[16], GIVENS_COS[64], GIVENS_SIN[64],
 * QUAT_W[32], QUAT_X[32], QUAT_Y[32], QUAT_Z[32]: the tables of tbq.get_format("planar3_0").tables() etc.
 * Variant for the tests: -DFMA_DECODE (the decoder's rotation lines as fused multiply-adds, as a native
 * -ffp-contract=fast build does): legitimately different, within the formats' decode_tolerance. */
#include <stdint.h>
#include "fp16.h"
#include "planar_iso_tables.h"

#define QK 128

#ifdef FMA_DECODE
#define MAC(a, b, c) fmaf(a, b, c) /* a*b + c, one rounding */
#else
#define MAC(a, b, c) ((a) * (b) + (c))
#endif

static void rotate(const float *u, float *r, int iso) {
    if (!iso) {
        for (int p = 0; p < 64; p++) {
            const float c = GIVENS_COS[p], s = GIVENS_SIN[p], u0 = u[2 * p], u1 = u[2 * p + 1];
            r[2 * p] = c * u0 - s * u1;
            r[2 * p + 1] = s * u0 + c * u1;
        }
        return;
    }
    for (int g = 0; g < 32; g++) {
        const float w = QUAT_W[g], x = QUAT_X[g], y = QUAT_Y[g], z = QUAT_Z[g];
        const float *v = u + 4 * g;
        float *o = r + 4 * g;
        o[0] = ((w * v[0] - x * v[1]) - y * v[2]) - z * v[3];
        o[1] = ((w * v[1] + x * v[0]) + y * v[3]) - z * v[2];
        o[2] = ((w * v[2] - x * v[3]) + y * v[0]) + z * v[1];
        o[3] = ((w * v[3] + x * v[2]) - y * v[1]) + z * v[0];
    }
}

static void unrotate(const float *v, float *f, int iso) {
    if (!iso) {
        for (int p = 0; p < 64; p++) {
            const float c = GIVENS_COS[p], s = GIVENS_SIN[p], q0 = v[2 * p], q1 = v[2 * p + 1];
            f[2 * p] = MAC(c, q0, s * q1);
            f[2 * p + 1] = MAC(-s, q0, c * q1);
        }
        return;
    }
    for (int g = 0; g < 32; g++) {
        const float w = QUAT_W[g], x = QUAT_X[g], y = QUAT_Y[g], z = QUAT_Z[g];
        const float *q = v + 4 * g;
        float *o = f + 4 * g;
        o[0] = MAC(z, q[3], MAC(y, q[2], MAC(x, q[1], w * q[0])));
        o[1] = MAC(z, q[2], MAC(-y, q[3], MAC(-x, q[0], w * q[1])));
        o[2] = MAC(-z, q[1], MAC(-y, q[0], MAC(x, q[3], w * q[2])));
        o[3] = MAC(-z, q[0], MAC(y, q[1], MAC(-x, q[2], w * q[3])));
    }
}

static void encode_block(const float *x, uint8_t *y, int bits, int iso) {
    const float *C = bits == 3 ? PI_CENTROIDS3 : PI_CENTROIDS4;
    const int n = 1 << bits;
    float u[QK], r[QK];
    int idx[QK];
    float sq = 0.0f;
    for (int j = 0; j < QK; j++) sq += x[j] * x[j];
    const float norm = sqrtf(sq);
    const float inv = norm > 1e-10f ? 1.0f / norm : 0.0f;
    for (int j = 0; j < QK; j++) u[j] = x[j] * inv;
    rotate(u, r, iso);
    float rsq = 0.0f;
    for (int j = 0; j < QK; j++) {
        int best = 0;
        float be = fabsf(r[j] - C[0]);
        for (int i = 1; i < n; i++) {
            const float e = fabsf(r[j] - C[i]);
            if (e < be) {
                best = i;
                be = e;
            }
        }
        idx[j] = best;
        rsq += C[best] * C[best];
    }
    const float recon = sqrtf(rsq);
    put_fp16(y, recon > 1e-10f ? norm / recon : norm);
    uint8_t *q = y + 2;
    if (bits == 4) {
        for (int j = 0; j < QK / 2; j++) q[j] = (uint8_t)(idx[2 * j] | (idx[2 * j + 1] << 4));
        return;
    }
    memset(q, 0, 48);
    for (int j = 0; j < QK; j++) {
        q[j / 4] |= (uint8_t)((idx[j] & 3) << (2 * (j % 4)));
        q[32 + j / 8] |= (uint8_t)(((idx[j] >> 2) & 1) << (j % 8));
    }
}

static void decode_block(const uint8_t *x, float *y, int bits, int iso) {
    const float *C = bits == 3 ? PI_CENTROIDS3 : PI_CENTROIDS4;
    const float D = get_fp16(x);
    const uint8_t *q = x + 2;
    float v[QK], f[QK];
    for (int j = 0; j < QK; j++) {
        int i;
        if (bits == 4) i = (q[j / 2] >> (4 * (j & 1))) & 15;
        else i = ((q[j / 4] >> (2 * (j % 4))) & 3) | (((q[32 + j / 8] >> (j % 8)) & 1) << 2);
        v[j] = C[i];
    }
    unrotate(v, f, iso);
    for (int j = 0; j < QK; j++) y[j] = f[j] * D;
}

#define ROWS(name, bits, iso, ts)                                                                          \
    void quantize_row_##name##_ref(const float *x, void *y, int64_t k) {                                   \
        for (int64_t i = 0; i < k / QK; i++) encode_block(x + i * QK, (uint8_t *)y + i * ts, bits, iso);   \
    }                                                                                                       \
    void dequantize_row_##name(const void *x, float *y, int64_t k) {                                       \
        for (int64_t i = 0; i < k / QK; i++) decode_block((const uint8_t *)x + i * ts, y + i * QK, bits, iso); \
    }
ROWS(planar3_0, 3, 0, 50)
ROWS(iso3_0, 3, 1, 50)
ROWS(planar4_0, 4, 0, 66)
ROWS(iso4_0, 4, 1, 66)
