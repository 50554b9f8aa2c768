/* The other ggml KV-cache types, written from the C reference spec (docs/formats.md; SPEC-ggml-extra of the
 * C reference set): f16 and bf16 (ggml's row converters), q4_1, q5_0, q5_1, iq4_nl, mxfp4, nvfp4.
 * Build: cc -O2 -shared -fPIC -ffp-contract=off ggml_extra.c -o libggml_extra.so -lm
 * Broken variant: -DFP4_TIES_EVEN (mxfp4/nvfp4 exact ties to the even mantissa).
 * f16/bf16 keep ggml's names (ggml_fp32_to_fp16_row, ...): check them with --quantize / --dequantize. */
#include <float.h>
#include <stdint.h>
#include "fp16.h"

#define QK 32

/* ggml_compute_fp16_to_fp32: builds normal values with a float multiply, which quiets a signalling NaN */
static float fp16_to_fp32_ggml(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const float normalized = fp32_from_bits((two_w >> 4) + (UINT32_C(0xE0) << 23)) * 0x1.0p-112f;
    const float denormalized = fp32_from_bits((two_w >> 17) | (UINT32_C(126) << 23)) - 0.5f;
    const uint32_t result = sign | (two_w < (UINT32_C(1) << 27) ? fp32_to_bits(denormalized) : fp32_to_bits(normalized));
    return fp32_from_bits(result);
}

void ggml_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fp32_to_fp16(x[i]);
}
void ggml_fp16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fp16_to_fp32_ggml(x[i]);
}
void ggml_fp32_to_bf16_row_ref(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const uint32_t u = fp32_to_bits(x[i]);
        y[i] = (u & 0x7FFFFFFF) > 0x7F800000 ? (uint16_t)((u >> 16) | 64) : (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    }
}
void ggml_bf16_to_fp32_row(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fp32_from_bits((uint32_t)x[i] << 16);
}

/* ---- q4_1 / q5_1: min and (max - min) / levels ---------------------------------------------------- */
static void min_max(const float *x, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < QK; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

void quantize_row_q4_1_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    for (int64_t i = 0; i < k / QK; i++) {
        const float *xb = x + i * QK;
        uint8_t *yb = y + i * 20;
        float min, max;
        min_max(xb, &min, &max);
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_fp16(yb, d);
        put_fp16(yb + 2, min);
        for (int j = 0; j < QK / 2; j++) {
            const float x0 = (xb[j] - min) * id, x1 = (xb[j + 16] - min) * id;
            const int8_t t0 = (int8_t)(x0 + 0.5f), t1 = (int8_t)(x1 + 0.5f);
            yb[4 + j] = (uint8_t)((t0 < 15 ? t0 : 15) | ((t1 < 15 ? t1 : 15) << 4));
        }
    }
}
void dequantize_row_q4_1(const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const uint8_t *xb = x + i * 20;
        const float d = get_fp16(xb), m = get_fp16(xb + 2);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j] = (float)(xb[4 + j] & 15) * d + m;
            y[i * QK + j + 16] = (float)(xb[4 + j] >> 4) * d + m;
        }
    }
}

static void put_u32(uint8_t *p, uint32_t v) { for (int b = 0; b < 4; b++) p[b] = (uint8_t)(v >> (8 * b)); }
static uint32_t get_u32(const uint8_t *p) { return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24); }

void quantize_row_q5_0_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    for (int64_t i = 0; i < k / QK; i++) {
        const float *xb = x + i * QK;
        uint8_t *yb = y + i * 22;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_fp16(yb, d);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const float x0 = xb[j] * id, x1 = xb[j + 16] * id;
            const int8_t t0 = (int8_t)(x0 + 16.5f), t1 = (int8_t)(x1 + 16.5f);
            const uint8_t c0 = (uint8_t)(t0 < 31 ? t0 : 31), c1 = (uint8_t)(t1 < 31 ? t1 : 31);
            yb[6 + j] = (uint8_t)((c0 & 15) | ((c1 & 15) << 4));
            qh |= (uint32_t)((c0 >> 4) & 1) << j;
            qh |= (uint32_t)((c1 >> 4) & 1) << (j + 16);
        }
        put_u32(yb + 2, qh);
    }
}
void dequantize_row_q5_0(const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const uint8_t *xb = x + i * 22;
        const float d = get_fp16(xb);
        const uint32_t qh = get_u32(xb + 2);
        for (int j = 0; j < QK / 2; j++) {
            const int c0 = (xb[6 + j] & 15) | (int)(((qh >> j) & 1) << 4);
            const int c1 = (xb[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[i * QK + j] = (float)(c0 - 16) * d;
            y[i * QK + j + 16] = (float)(c1 - 16) * d;
        }
    }
}

void quantize_row_q5_1_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    for (int64_t i = 0; i < k / QK; i++) {
        const float *xb = x + i * QK;
        uint8_t *yb = y + i * 24;
        float min, max;
        min_max(xb, &min, &max);
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_fp16(yb, d);
        put_fp16(yb + 2, min);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const float x0 = (xb[j] - min) * id, x1 = (xb[j + 16] - min) * id;
            const uint8_t c0 = (uint8_t)(x0 + 0.5f), c1 = (uint8_t)(x1 + 0.5f);
            yb[8 + j] = (uint8_t)((c0 & 15) | ((c1 & 15) << 4));
            qh |= (uint32_t)((c0 >> 4) & 1) << j;
            qh |= (uint32_t)((c1 >> 4) & 1) << (j + 16);
        }
        put_u32(yb + 4, qh);
    }
}
void dequantize_row_q5_1(const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const uint8_t *xb = x + i * 24;
        const float d = get_fp16(xb), m = get_fp16(xb + 2);
        const uint32_t qh = get_u32(xb + 4);
        for (int j = 0; j < QK / 2; j++) {
            const int c0 = (xb[8 + j] & 15) | (int)(((qh >> j) & 1) << 4);
            const int c1 = (xb[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[i * QK + j] = (float)c0 * d + m;
            y[i * QK + j + 16] = (float)c1 * d + m;
        }
    }
}

/* ---- iq4_nl: a non-uniform table, least-squares scale; tiny blocks repeat the row's last indices ----- */
static const int8_t KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static int best_index_int8(int n, const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int ml = 0, mu = n - 1;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav;
        else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

void quantize_row_iq4_nl_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    uint8_t L[QK];
    memset(L, 8, sizeof L); /* the conformance vectors' choice for C's uninitialised array */
    for (int64_t i = 0; i < k / QK; i++) {
        const float *xb = x + i * QK;
        uint8_t *yb = y + i * 18;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        float d = 0.0f;
        if (amax >= 1e-15f) {
            const float d0 = max / -127.0f, id = 1.0f / d0;
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < QK; j++) {
                const float w = xb[j] * xb[j];
                const int l = best_index_int8(16, KV_IQ4NL, id * xb[j]);
                L[j] = (uint8_t)l;
                const float q = (float)KV_IQ4NL[l];
                sumqx += (w * q) * xb[j];
                sumq2 += (w * q) * q;
            }
            d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
        }
        put_fp16(yb, d);
        for (int j = 0; j < QK / 2; j++) yb[2 + j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}
void dequantize_row_iq4_nl(const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const uint8_t *xb = x + i * 18;
        const float d = get_fp16(xb);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j] = d * (float)KV_IQ4NL[xb[2 + j] & 15];
            y[i * QK + j + 16] = d * (float)KV_IQ4NL[xb[2 + j] >> 4];
        }
    }
}

/* ---- mxfp4 / nvfp4: doubled E2M1 values, E8M0 or UE4M3 scales ----------------------------------------- */
static const int8_t KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static int best_index_fp4(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)KV_MXFP4[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)KV_MXFP4[i] * d - x);
#ifdef FP4_TIES_EVEN  /* broken variant: an exact tie goes to the even E2M1 mantissa (the spec keeps the first index) */
        if (err < best_err || (err == best_err && (i % 8) % 2 == 0 && (best % 8) % 2 == 1)) {
#else
        if (err < best_err) {
#endif
            best = i;
            best_err = err;
        }
    }
    return best;
}

static float e8m0_half(uint8_t e) {
    return fp32_from_bits(e < 2 ? (e == 0 ? 0x00200000u : 0x00400000u) : ((uint32_t)(e - 1) << 23));
}

void quantize_row_mxfp4_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    for (int64_t i = 0; i < k / QK; i++) {
        const float *xb = x + i * QK;
        uint8_t *yb = y + i * 17;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(xb[j])) amax = fabsf(xb[j]);
        const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = e8m0_half(e);
        yb[0] = e;
        for (int j = 0; j < QK / 2; j++)
            yb[1 + j] = (uint8_t)(best_index_fp4(xb[j], d) | (best_index_fp4(xb[j + 16], d) << 4));
    }
}
void dequantize_row_mxfp4(const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const uint8_t *xb = x + i * 17;
        const float d = e8m0_half(xb[0]);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j] = (float)KV_MXFP4[xb[1 + j] & 15] * d;
            y[i * QK + j + 16] = (float)KV_MXFP4[xb[1 + j] >> 4] * d;
        }
    }
}

static float ue4m3_to_fp32_half(uint8_t u) {
    if (u == 0x00 || u == 0x7F) return 0.0f;
    const int E = (u >> 3) & 15, M = u & 7;
    const float raw = E == 0 ? (float)M * 0x1.0p-9f : (1.0f + (float)M / 8.0f) * ldexpf(1.0f, E - 7);
    return raw * 0.5f;
}

static uint8_t fp32_to_ue4m3(float s) {
    if (!(s > 0.0f)) return 0;
    if (s > 448.0f) s = 448.0f;
    const uint32_t bits = fp32_to_bits(s);
    const int fe = (int)((bits >> 23) & 255) - 127, fm = (int)((bits >> 20) & 7);
    int ue = fe + 7;
    if (ue <= 0) {
        int M = (int)(s * 512.0f + 0.5f);
        if (M > 7) M = 7;
        return M >= 1 ? (uint8_t)M : 0;
    }
    if (ue >= 15) return 0x7E;
    int M = fm + (int)((bits >> 19) & 1);
    if (M > 7) {
        M = 0;
        if (++ue >= 15) return 0x7E;
    }
    return (uint8_t)((ue << 3) | M);
}

void quantize_row_nvfp4_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    for (int64_t i = 0; i < k / 64; i++) {
        uint8_t *yb = y + i * 36;
        for (int s = 0; s < 4; s++) {
            const float *xb = x + i * 64 + 16 * s;
            float amax = 0.0f;
            for (int j = 0; j < 16; j++)
                if (amax < fabsf(xb[j])) amax = fabsf(xb[j]);
            const uint8_t u = fp32_to_ue4m3(amax / 6.0f);
            const float dd = ue4m3_to_fp32_half(u);
            yb[s] = u;
            for (int j = 0; j < 8; j++)
                yb[4 + 8 * s + j] = (uint8_t)(best_index_fp4(xb[j], dd) | (best_index_fp4(xb[j + 8], dd) << 4));
        }
    }
}
void dequantize_row_nvfp4(const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    for (int64_t i = 0; i < k / 64; i++) {
        const uint8_t *xb = x + i * 36;
        for (int s = 0; s < 4; s++) {
            const float dd = ue4m3_to_fp32_half(xb[s]);
            for (int j = 0; j < 8; j++) {
                y[i * 64 + 16 * s + j] = (float)KV_MXFP4[xb[4 + 8 * s + j] & 15] * dd;
                y[i * 64 + 16 * s + j + 8] = (float)KV_MXFP4[xb[4 + 8 * s + j] >> 4] * dd;
            }
        }
    }
}
