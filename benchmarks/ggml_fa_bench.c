// ggml's CPU flash attention (ggml_flash_attn_ext) over a quantized KV cache: the anchor of
// benchmarks/bench_attention.py, built against a ggml build at benchmark time. The decode case is
// ../shared/ggml/fa_bench.c's (the harness behind issue 22's table: the same data, the same graph);
// this adds several query tokens with a causal mask (a prefill step) and prints every timing.
//
//   ./ggml_fa_bench TOKENS TYPE THREADS N_QUERY CAUSAL REPS
// prints one line: "ms <t1> <t2> ..." (REPS timed computes after one warm-up), 8 KV heads,
// 32 query heads, head_dim 128, scale 1/sqrt(128).
#include "ggml.h"
#include "ggml-cpu.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: %s TOKENS TYPE THREADS N_QUERY CAUSAL REPS\n", argv[0]); return 2; }
    int T = atoi(argv[1]), th = atoi(argv[3]), nq = atoi(argv[4]), causal = atoi(argv[5]), reps = atoi(argv[6]);
    const char *tn = argv[2];
    int ty = -1;
    for (int i = 0; i < GGML_TYPE_COUNT; i++) { const char *n = ggml_type_name((enum ggml_type)i); if (n && !strcmp(n, tn)) ty = i; }
    if (ty < 0) { fprintf(stderr, "unknown type %s\n", tn); return 2; }
    int D = 128, HKV = 8, H = 32;
    ggml_cpu_init();
    size_t mem = (size_t)T * HKV * D * 4 * 3 + (size_t)T * nq * 2 + (size_t)nq * H * D * 8 + ((size_t)256 << 20);
    struct ggml_init_params ip = {mem, NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, nq, H, 1);
    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, (enum ggml_type)ty, D, T, HKV, 1);
    struct ggml_tensor *v = ggml_new_tensor_4d(ctx, (enum ggml_type)ty, D, T, HKV, 1);
    float *tmp = malloc(sizeof(float) * (size_t)T * HKV * D);
    srand(3);
    for (size_t i = 0; i < (size_t)T * HKV * D; i++) tmp[i] = ((rand() / (float)RAND_MAX) - 0.5f) * 3.4f;
    if (ty == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(tmp, (ggml_fp16_t *)k->data, (int64_t)T * HKV * D);
        ggml_fp32_to_fp16_row(tmp, (ggml_fp16_t *)v->data, (int64_t)T * HKV * D);
    } else {
        ggml_quantize_chunk((enum ggml_type)ty, tmp, k->data, 0, (int64_t)T * HKV, D, NULL);
        ggml_quantize_chunk((enum ggml_type)ty, tmp, v->data, 0, (int64_t)T * HKV, D, NULL);
    }
    free(tmp);
    for (int i = 0; i < nq * H * D; i++) ((float *)q->data)[i] = ((rand() / (float)RAND_MAX) - 0.5f) * 3.4f;
    struct ggml_tensor *mask = NULL;
    if (causal) {  // query token i is the cache's token T - nq + i: it sees tokens 0 .. T - nq + i
        mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, T, nq, 1, 1);
        ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
        for (int i = 0; i < nq; i++)
            for (int t = 0; t < T; t++) ((ggml_fp16_t *)mask->data)[(size_t)i * T + t] = t <= T - nq + i ? zero : ninf;
    }
    struct ggml_tensor *o = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf(D), 0.0f, 0.0f);
    struct ggml_cgraph *g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, o);
    ggml_graph_compute_with_ctx(ctx, g, th);
    printf("ms");
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        ggml_graph_compute_with_ctx(ctx, g, th);
        printf(" %.4f", (now() - t0) * 1e3);
    }
    printf("\n");
    return 0;
}
