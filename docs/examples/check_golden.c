/*
 * check_golden.c - an independent consumer of the `tbq golden` C headers.
 *
 * Written by hand from SPEC.md (not generated): its own fp16 conversion (bit
 * manipulation), its own Q8_0 / Q4_0 / TBQ4_0 / TBQ3_0 decoders and encoders,
 * its own Walsh-Hadamard butterfly. It checks, for every format:
 *
 *   1. decode: decoding the golden bytes gives the golden floats bit for bit;
 *   2. encode: encoding the golden inputs gives the golden bytes, using the
 *      fragility masks the way a kernel test should:
 *        - a code (Q8_0/Q4_0 code, TBQ index) must be equal, or differ by one
 *          where _fragile[] is set;
 *        - a block's fp16 scale must be equal, or the neighbouring fp16 value
 *          where _scale_fragile[] is set; for TBQ, when an index of the block
 *          legitimately differed, the scale is checked against the scale the
 *          reference would compute from *these* indices (_norm[] / recon).
 *
 * Build and run (DIR holds q8_0.h, q4_0.h, tbq4_0.h, tbq3_0.h from
 * `tbq golden --out DIR`):
 *
 *   gcc -std=c11 -O2 -ffp-contract=off -Wall -Wextra -Werror -I DIR \
 *       docs/examples/check_golden.c -o check_golden -lm
 *   ./check_golden --exact
 *
 * --exact additionally requires the encoder to be bit-exact everywhere (no
 * tolerated difference at all), which holds for this strict build.
 *
 * Built with -DCHECK_GOLDEN_KERNEL_ARITHMETIC the encoder computes like a
 * typical SIMD/GPU kernel instead: sums of squares in 8 interleaved partial
 * sums combined pairwise, Q8_0 codes from x / d instead of x * (1/d), Q4_0's
 * x * id + 8.5 as one fused multiply-add. It is then no longer bit-exact
 * with the sequential reference, and the fragility masks decide (run it
 * without --exact). Exit status 0 = pass.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q8_0.h"
#include "q4_0.h"
#include "tbq4_0.h"
#include "tbq3_0.h"

/* ------------------------------------------------------------------ fp16 */

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

/* IEEE binary16 -> float32, exact for every bit pattern. */
static float fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) /* Inf, NaN */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) /* normal: rebias 15 -> 127 */
        return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) /* signed zero */
        return bits_f32(sign);
    /* subnormal: mant * 2^-24; normalise */
    exp = 113u; /* float32 biased exponent of 2^-14 */
    while (!(mant & 0x400u)) {
        mant <<= 1;
        exp--;
    }
    return bits_f32(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
}

/* float32 -> IEEE binary16, round to nearest, ties to even. */
static uint16_t f32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t h, rem, half, shift, m;
    if (a >= 0x7f800000u) /* Inf, NaN */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) /* >= 65520: overflows to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: fp16 subnormal (or zero), units of 2^-24 */
        uint32_t e = a >> 23;
        if (e < 102u) /* below 2^-25: rounds to zero */
            return (uint16_t)sign;
        m = (a & 0x7fffffu) | 0x800000u; /* value = m * 2^(e - 150) */
        shift = 126u - e;                /* value / 2^-24 = m >> shift */
        h = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    a -= 0x38000000u; /* rebias the exponent 127 -> 15 */
    h = a >> 13;
    rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the correct result */
    return (uint16_t)(sign | h);
}

static int fp16_ordered(uint16_t h) { return (h & 0x8000u) ? -(int)(h & 0x7fffu) : (int)h; }

static uint16_t load_fp16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static void store_fp16(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)(h & 0xffu);
    p[1] = (uint8_t)(h >> 8);
}

/* ------------------------------------------------------------ rotation */

#define HADAMARD_SCALE 0x1.6a09e6p-4f /* float32 nearest 1/sqrt(128) */

/* In-place butterfly of SPEC.md, then one multiplication by the constant. */
static void hadamard128(float *v)
{
    int h, i, j;
    for (h = 1; h < 128; h *= 2)
        for (i = 0; i < 128; i += 2 * h)
            for (j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    for (j = 0; j < 128; j++)
        v[j] = v[j] * HADAMARD_SCALE;
}

/* R(x) = s2 * H(s1 * x) */
static void rotate(float *v, const int8_t *s1, const int8_t *s2)
{
    int j;
    for (j = 0; j < 128; j++)
        v[j] = v[j] * (float)s1[j];
    hadamard128(v);
    for (j = 0; j < 128; j++)
        v[j] = v[j] * (float)s2[j];
}

/* R^-1(y) = s1 * H(s2 * y) */
static void unrotate(float *v, const int8_t *s1, const int8_t *s2) { rotate(v, s2, s1); }

/* ------------------------------------------------------------ codecs */

/* Sum of squares of n values: sequential (the reference) or, with
 * CHECK_GOLDEN_KERNEL_ARITHMETIC, 8 interleaved lanes combined pairwise. */
static float sum_squares(const float *v, int n)
{
#ifdef CHECK_GOLDEN_KERNEL_ARITHMETIC
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j, w;
    for (j = 0; j < n; j++)
        lane[j % 8] += v[j] * v[j];
    for (w = 4; w >= 1; w /= 2)
        for (j = 0; j < w; j++)
            lane[j] += lane[j + w];
    return lane[0];
#else
    float sum = 0.0f;
    int j;
    for (j = 0; j < n; j++)
        sum += v[j] * v[j];
    return sum;
#endif
}

/* Codes of one block: Q8_0 int8 codes, Q4_0 nibbles, TBQ indices. */
typedef struct {
    int n;          /* values per block */
    int code[128];  /* per value */
    uint16_t d16;   /* fp16 scale bits */
} block_codes;

static void q8_0_decode(const uint8_t *b, float *y)
{
    float d = fp16_to_f32(load_fp16(b));
    int j;
    for (j = 0; j < 32; j++)
        y[j] = (float)(int8_t)b[2 + j] * d;
}

static void q8_0_codes(const uint8_t *b, block_codes *c)
{
    int j;
    c->n = 32;
    c->d16 = load_fp16(b);
    for (j = 0; j < 32; j++)
        c->code[j] = (int8_t)b[2 + j];
}

static void q8_0_encode(const float *x, uint8_t *b)
{
    float amax = 0.0f, d, id;
    int j;
    for (j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax)
            amax = fabsf(x[j]);
    d = amax / 127.0f;
    id = d != 0.0f ? 1.0f / d : 0.0f;
    store_fp16(b, f32_to_fp16(d));
    for (j = 0; j < 32; j++) {
#ifdef CHECK_GOLDEN_KERNEL_ARITHMETIC
        b[2 + j] = (uint8_t)(int8_t)roundf(d != 0.0f ? x[j] / d : 0.0f);
        (void)id;
#else
        b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id); /* the float32 d, not fp16(d) */
#endif
    }
}

static void q4_0_codes(const uint8_t *b, block_codes *c)
{
    int j;
    c->n = 32;
    c->d16 = load_fp16(b);
    for (j = 0; j < 16; j++) {
        c->code[j] = b[2 + j] & 0x0f;
        c->code[j + 16] = b[2 + j] >> 4;
    }
}

static void q4_0_decode(const uint8_t *b, float *y)
{
    block_codes c;
    float d = fp16_to_f32(load_fp16(b));
    int j;
    q4_0_codes(b, &c);
    for (j = 0; j < 32; j++)
        y[j] = (float)(c.code[j] - 8) * d;
}

static void q4_0_encode(const float *x, uint8_t *b)
{
    /* max: the signed value of largest magnitude, the first one on a tie,
     * found as ggml's quantize_row_q4_0_ref does: start from amax = max = +0
     * and replace only on a strictly larger |x|. A block of zeros (of either
     * sign) therefore keeps max = +0 and stores d = +0 / -8 = -0. */
    float amax = 0.0f, max = 0.0f, d, id;
    int q[32], j;
    for (j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    d = max / -8.0f;
    id = d != 0.0f ? 1.0f / d : 0.0f;
    for (j = 0; j < 32; j++) {
#ifdef CHECK_GOLDEN_KERNEL_ARITHMETIC
        float t = fmaf(x[j], id, 8.5f); /* one rounding */
#else
        float p = x[j] * id;
        float t = p + 8.5f; /* two roundings; contraction would fuse them */
#endif
        q[j] = (int)t;       /* truncation */
        if (q[j] > 15)
            q[j] = 15;
    }
    store_fp16(b, f32_to_fp16(d));
    for (j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

typedef struct {
    int bits;
    const float *centroids;
    const float *thresholds;
    const int8_t *s1, *s2;
} tbq_tables;

static void tbq_codes(const tbq_tables *t, const uint8_t *b, block_codes *c)
{
    int i, g, k;
    c->n = 128;
    c->d16 = load_fp16(b);
    if (t->bits == 4) {
        for (i = 0; i < 64; i++) {
            c->code[2 * i] = b[2 + i] & 0x0f;
            c->code[2 * i + 1] = b[2 + i] >> 4;
        }
    } else {
        for (g = 0; g < 16; g++) {
            uint32_t lane = (uint32_t)b[2 + 3 * g] | ((uint32_t)b[3 + 3 * g] << 8) | ((uint32_t)b[4 + 3 * g] << 16);
            for (k = 0; k < 8; k++)
                c->code[8 * g + k] = (int)((lane >> (3 * k)) & 7u);
        }
    }
}

static void tbq_decode(const tbq_tables *t, const uint8_t *b, float *y)
{
    block_codes c;
    float d = fp16_to_f32(load_fp16(b));
    int j;
    tbq_codes(t, b, &c);
    for (j = 0; j < 128; j++)
        y[j] = t->centroids[c.code[j]];
    unrotate(y, t->s1, t->s2);
    for (j = 0; j < 128; j++)
        y[j] = y[j] * d;
}

static float tbq_recon(const tbq_tables *t, const int *idx)
{
    float c[128];
    int j;
    for (j = 0; j < 128; j++)
        c[j] = t->centroids[idx[j]];
    return sqrtf(sum_squares(c, 128));
}

static float tbq_scale(const tbq_tables *t, float norm, const int *idx)
{
    float recon = tbq_recon(t, idx);
    if (t->bits == 4)
        return recon > 1e-10f ? norm / recon : norm;
    if (recon < 1e-10f)
        recon = 1e-10f;
    return norm / recon;
}

static void tbq_encode(const tbq_tables *t, const float *x, uint8_t *b)
{
    float u[128], norm;
    int idx[128], j, i, g, k;
    int levels = 1 << t->bits;
    norm = sqrtf(sum_squares(x, 128));
    if (t->bits == 4) {
        float inv = norm > 1e-10f ? 1.0f / norm : 0.0f;
        for (j = 0; j < 128; j++)
            u[j] = x[j] * inv;
    } else {
        if (norm < 1e-10f)
            norm = 1e-10f;
        for (j = 0; j < 128; j++)
            u[j] = x[j] / norm; /* a division, not a reciprocal */
    }
    rotate(u, t->s1, t->s2);
    for (j = 0; j < 128; j++) {
        for (i = 0; i < levels - 1 && !(u[j] < t->thresholds[i]); i++)
            ;
        idx[j] = i; /* first i with r < m_i, else levels - 1 */
    }
    store_fp16(b, f32_to_fp16(tbq_scale(t, norm, idx)));
    if (t->bits == 4) {
        for (i = 0; i < 64; i++)
            b[2 + i] = (uint8_t)(idx[2 * i] | (idx[2 * i + 1] << 4));
    } else {
        for (g = 0; g < 16; g++) {
            uint32_t lane = 0;
            for (k = 0; k < 8; k++)
                lane |= (uint32_t)idx[8 * g + k] << (3 * k);
            b[2 + 3 * g] = (uint8_t)(lane & 0xffu);
            b[3 + 3 * g] = (uint8_t)((lane >> 8) & 0xffu);
            b[4 + 3 * g] = (uint8_t)(lane >> 16);
        }
    }
}

/* ------------------------------------------------------------ checking */

typedef struct {
    const char *name;
    int blocks, block_size, type_size;
    const float *input, *decoded;
    const uint8_t *bytes, *fragile, *scale_fragile;
    const float *norm; /* TBQ only */
    const tbq_tables *tbq; /* NULL for Q8_0 / Q4_0 */
    void (*decode)(const uint8_t *, float *);
    void (*encode)(const float *, uint8_t *);
    void (*codes)(const uint8_t *, block_codes *);
} golden_format;

typedef struct {
    long decode_mismatch, code_exact, code_tolerated, scale_exact, scale_tolerated, failures;
} tally;

static void check_format(const golden_format *f, tally *t)
{
    int blk, j;
    float y[128];
    uint8_t ours[66];
    block_codes want, got;
    for (blk = 0; blk < f->blocks; blk++) {
        const uint8_t *gb = f->bytes + (size_t)blk * (size_t)f->type_size;
        const float *gx = f->input + (size_t)blk * (size_t)f->block_size;
        const float *gy = f->decoded + (size_t)blk * (size_t)f->block_size;
        const uint8_t *fr = f->fragile + (size_t)blk * (size_t)f->block_size;
        int index_differs = 0;

        /* 1. decode bit for bit */
        if (f->tbq)
            tbq_decode(f->tbq, gb, y);
        else
            f->decode(gb, y);
        for (j = 0; j < f->block_size; j++)
            if (f32_bits(y[j]) != f32_bits(gy[j])) {
                if (t->decode_mismatch < 5)
                    fprintf(stderr, "%s: block %d value %d decodes to %a, golden %a\n", f->name, blk, j, (double)y[j], (double)gy[j]);
                t->decode_mismatch++;
            }

        /* 2. encode, with the fragility masks */
        if (f->tbq) {
            tbq_encode(f->tbq, gx, ours);
            tbq_codes(f->tbq, gb, &want);
            tbq_codes(f->tbq, ours, &got);
        } else {
            f->encode(gx, ours);
            f->codes(gb, &want);
            f->codes(ours, &got);
        }
        for (j = 0; j < want.n; j++) {
            int diff = abs(got.code[j] - want.code[j]);
            if (diff == 0)
                t->code_exact++;
            else if (diff == 1 && fr[j]) {
                t->code_tolerated++;
                index_differs = 1;
            } else {
                if (t->failures < 5)
                    fprintf(stderr, "%s: block %d value %d: code %d, golden %d (fragile %d)\n", f->name, blk, j, got.code[j], want.code[j], fr[j]);
                t->failures++;
            }
        }
        if (got.d16 == want.d16)
            t->scale_exact++;
        else if (f->scale_fragile[blk] && abs(fp16_ordered(got.d16) - fp16_ordered(want.d16)) == 1)
            t->scale_tolerated++;
        else if (f->tbq && index_differs &&
                 abs(fp16_ordered(got.d16) - fp16_ordered(f32_to_fp16(tbq_scale(f->tbq, f->norm[blk], got.code)))) <= 1)
            t->scale_tolerated++; /* the scale follows the (legitimately) different indices */
        else {
            if (t->failures < 5)
                fprintf(stderr, "%s: block %d: fp16 scale 0x%04x, golden 0x%04x (fragile %d)\n", f->name, blk, got.d16, want.d16, f->scale_fragile[blk]);
            t->failures++;
        }
    }
}

int main(int argc, char **argv)
{
    static const tbq_tables t4 = {4, tbq_golden_tbq4_0_centroids, tbq_golden_tbq4_0_thresholds, tbq_golden_tbq4_0_signs1, tbq_golden_tbq4_0_signs2};
    static const tbq_tables t3 = {3, tbq_golden_tbq3_0_centroids, tbq_golden_tbq3_0_thresholds, tbq_golden_tbq3_0_signs1, tbq_golden_tbq3_0_signs2};
    const golden_format fmts[4] = {
        {"q8_0", TBQ_GOLDEN_Q8_0_BLOCKS, TBQ_GOLDEN_Q8_0_BLOCK_SIZE, TBQ_GOLDEN_Q8_0_TYPE_SIZE, tbq_golden_q8_0_input,
         tbq_golden_q8_0_decoded, tbq_golden_q8_0_bytes, tbq_golden_q8_0_fragile, tbq_golden_q8_0_scale_fragile, NULL, NULL,
         q8_0_decode, q8_0_encode, q8_0_codes},
        {"q4_0", TBQ_GOLDEN_Q4_0_BLOCKS, TBQ_GOLDEN_Q4_0_BLOCK_SIZE, TBQ_GOLDEN_Q4_0_TYPE_SIZE, tbq_golden_q4_0_input,
         tbq_golden_q4_0_decoded, tbq_golden_q4_0_bytes, tbq_golden_q4_0_fragile, tbq_golden_q4_0_scale_fragile, NULL, NULL,
         q4_0_decode, q4_0_encode, q4_0_codes},
        {"tbq4_0", TBQ_GOLDEN_TBQ4_0_BLOCKS, TBQ_GOLDEN_TBQ4_0_BLOCK_SIZE, TBQ_GOLDEN_TBQ4_0_TYPE_SIZE, tbq_golden_tbq4_0_input,
         tbq_golden_tbq4_0_decoded, tbq_golden_tbq4_0_bytes, tbq_golden_tbq4_0_fragile, tbq_golden_tbq4_0_scale_fragile,
         tbq_golden_tbq4_0_norm, &t4, NULL, NULL, NULL},
        {"tbq3_0", TBQ_GOLDEN_TBQ3_0_BLOCKS, TBQ_GOLDEN_TBQ3_0_BLOCK_SIZE, TBQ_GOLDEN_TBQ3_0_TYPE_SIZE, tbq_golden_tbq3_0_input,
         tbq_golden_tbq3_0_decoded, tbq_golden_tbq3_0_bytes, tbq_golden_tbq3_0_fragile, tbq_golden_tbq3_0_scale_fragile,
         tbq_golden_tbq3_0_norm, &t3, NULL, NULL, NULL},
    };
    int exact = argc > 1 && strcmp(argv[1], "--exact") == 0;
    int i, ok = 1;
    for (i = 0; i < 4; i++) {
        tally t = {0, 0, 0, 0, 0, 0};
        int pass;
        check_format(&fmts[i], &t);
        pass = t.decode_mismatch == 0 && t.failures == 0 && (!exact || (t.code_tolerated == 0 && t.scale_tolerated == 0));
        printf("%-6s blocks %5d  decode mismatches %ld  codes exact %ld tolerated %ld  scales exact %ld tolerated %ld  failures %ld  %s\n",
               fmts[i].name, fmts[i].blocks, t.decode_mismatch, t.code_exact, t.code_tolerated, t.scale_exact, t.scale_tolerated,
               t.failures, pass ? "PASS" : "FAIL");
        ok = ok && pass;
    }
    printf("%s\n", ok ? "ALL PASS" : "FAILED");
    return ok ? 0 : 1;
}
