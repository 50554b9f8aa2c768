/* A fused attention kernel over q8_0 K and V caches, as a program for `tbq check --attention --exec`
 * (docs/checking-kernels.md, section 4): online softmax token by token in float32, the query kept in float32,
 * the values decoded to float32 and accumulated in float32 (declare nothing: that is the default).
 *
 *   cc -O2 attention_q8_0.c -o attention -lm
 *   tbq check --attention --k-type q8_0 --v-type q8_0 \
 *       --exec "./attention {q} {k} {v} {mask} {sinks} {out} {n_query} {n_head} {n_head_kv} {n_tokens} {head_dim} {scale}"
 *
 * Planted defects for the test suite: -DSCALE_1_OVER_D (the scores scaled by 1/head_dim), -DGQA_MODULO (query
 * head h reads KV head h % n_head_kv), -DNAN_ALL_MASKED (no guard for a row whose every token is masked). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fp16.h"

static void *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(len > 0 ? (size_t)len : 1);
    if (len > 0 && fread(p, 1, (size_t)len, f) != (size_t)len) { perror(path); exit(2); }
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* one q8_0 row of D values (D / 32 blocks of 34 bytes: fp16 d, 32 int8 codes) -> float32 */
static void q8_0_row(const uint8_t *row, int D, float *out) {
    for (int b = 0; b < D / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        const float d = get_fp16(blk);
        for (int j = 0; j < 32; j++) out[32 * b + j] = (float)(int8_t)blk[2 + j] * d;
    }
}

int main(int argc, char **argv) {
    if (argc != 13) {
        fprintf(stderr, "usage: %s Q K V MASK SINKS OUT N_QUERY N_HEAD N_HEAD_KV N_TOKENS HEAD_DIM SCALE\n", argv[0]);
        return 2;
    }
    size_t nq_b, nk_b, nv_b, nm_b, ns_b;
    const float *q = slurp(argv[1], &nq_b);
    const uint8_t *k = slurp(argv[2], &nk_b), *v = slurp(argv[3], &nv_b);
    const float *mask = slurp(argv[4], &nm_b), *sinks = slurp(argv[5], &ns_b);
    const int NQ = atoi(argv[7]), H = atoi(argv[8]), G = atoi(argv[9]), T = atoi(argv[10]), D = atoi(argv[11]);
    float scale = strtof(argv[12], NULL);
#ifdef SCALE_1_OVER_D
    scale = 1.0f / (float)D;
#endif
    const size_t row = (size_t)D / 32 * 34;
    if (nk_b != (size_t)T * G * row || nv_b != nk_b || nq_b != (size_t)NQ * H * D * 4 || nm_b != (size_t)NQ * T * 4) {
        fprintf(stderr, "file sizes do not match the shape\n");
        return 2;
    }
    float *out = calloc((size_t)NQ * H * D, sizeof(float)), *kr = malloc(D * sizeof(float)), *vr = malloc(D * sizeof(float));
    for (int i = 0; i < NQ; i++) {
        for (int h = 0; h < H; h++) {
#ifdef GQA_MODULO
            const int g = h % G;
#else
            const int g = h / (H / G);
#endif
            const float *qh = q + ((size_t)i * H + h) * D;
            float *acc = out + ((size_t)i * H + h) * D;
            float M = -INFINITY, S = 0.0f;
            for (int t = 0; t < T; t++) {
                const float m = mask[(size_t)i * T + t];
                if (m == -INFINITY) continue;
                q8_0_row(k + ((size_t)t * G + g) * row, D, kr);
                float s = 0.0f;
                for (int j = 0; j < D; j++) s += qh[j] * kr[j];
                s = s * scale + m;
                const float Mn = s > M ? s : M;
                const float ms = expf(M - Mn), vs = expf(s - Mn);
                q8_0_row(v + ((size_t)t * G + g) * row, D, vr);
                for (int j = 0; j < D; j++) acc[j] = acc[j] * ms + vs * vr[j];
                S = S * ms + vs;
                M = Mn;
            }
            if (ns_b) {  /* a sink logit: in the denominator, no value */
                const float sk = sinks[h], Mn = sk > M ? sk : M, ms = expf(M - Mn);
                for (int j = 0; j < D; j++) acc[j] *= ms;
                S = S * ms + expf(sk - Mn);
            }
#ifdef NAN_ALL_MASKED
            const float inv = 1.0f / S;
            for (int j = 0; j < D; j++) acc[j] = S == 0.0f ? NAN : acc[j] * inv;
#else
            const float inv = S == 0.0f ? 0.0f : 1.0f / S;
            for (int j = 0; j < D; j++) acc[j] *= inv;
#endif
        }
    }
    FILE *f = fopen(argv[6], "wb");
    if (!f || fwrite(out, sizeof(float), (size_t)NQ * H * D, f) != (size_t)NQ * H * D) { perror(argv[6]); return 2; }
    fclose(f);
    return 0;
}
