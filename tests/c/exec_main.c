/* A `tbq check --exec` program: `kernel OP IN OUT` reads IN (raw little-endian float32 for OP = quantize,
 * encoded bytes for OP = dequantize), runs the row function linked into it on the whole file as one row,
 * and writes OUT. Build it with one kernel, e.g.
 *     cc -O2 -ffp-contract=off -DFMT=q8_0 -DTYPE_SIZE=34 -DBLOCK=32 exec_main.c q8_0.c -o kernel -lm
 * and check it with: tbq check --format q8_0 --exec "./kernel {op} {in} {out}" */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAT3(a, b, c) a##b##c
#define QUANT(f) CAT3(quantize_row_, f, _ref)
#define DEQUANT(f) CAT3(dequantize_row_, f, )
void QUANT(FMT)(const float *x, void *y, int64_t k);
void DEQUANT(FMT)(const void *x, float *y, int64_t k);

static void *read_all(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(3); }
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(*n ? *n : 1);
    if (fread(buf, 1, *n, f) != (size_t)*n) { fprintf(stderr, "%s: short read\n", path); exit(3); }
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s quantize|dequantize IN OUT\n", argv[0]); return 2; }
    long n;
    void *in = read_all(argv[2], &n);
    long out_bytes;
    void *out;
    if (strcmp(argv[1], "quantize") == 0) {
        const int64_t k = n / 4;
        out_bytes = k / BLOCK * TYPE_SIZE;
        out = malloc(out_bytes ? out_bytes : 1);
        QUANT(FMT)((const float *)in, out, k);
    } else if (strcmp(argv[1], "dequantize") == 0) {
        const int64_t k = n / TYPE_SIZE * BLOCK;
        out_bytes = k * 4;
        out = malloc(out_bytes ? out_bytes : 1);
        DEQUANT(FMT)(in, (float *)out, k);
    } else {
        fprintf(stderr, "unknown operation %s\n", argv[1]);
        return 2;
    }
    FILE *f = fopen(argv[3], "wb");
    if (!f || fwrite(out, 1, out_bytes, f) != (size_t)out_bytes) { perror(argv[3]); return 3; }
    fclose(f);
    return 0;
}
