/* Kernels that die the way a build for another CPU does: SIGILL (an AVX-512 instruction on an AVX2 machine) or
 * SIGSEGV. tbq check must report them in one line (exit 2) rather than die with them.
 * Build: cc -O2 -shared -fPIC crash.c -o libcrash.so */
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

void init_ok(void) {}

void init_ill(void) { raise(SIGILL); }

void quantize_row_q8_0_ref(const float *x, void *y, int64_t k) {
    (void)x;
    (void)k;
    memset(y, 0, 34);
    raise(SIGILL);
}

void dequantize_row_q8_0(const void *x, float *y, int64_t k) {
    (void)x;
    (void)y;
    (void)k;
    raise(SIGSEGV);
}

void ggml_vec_dot_q8_0_q8_0(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc) {
    (void)n, (void)bs, (void)x, (void)bx, (void)y, (void)by, (void)nrc;
    *s = 0.0f;
    raise(SIGILL);
}
