/* Q8_0 whose fp16 conversion reads a table that an init function fills (as ggml's CPU backend needs
 * ggml_cpu_init()): without kernel_init() the scale is stored as 0 and every non-zero block is wrong.
 * Build: cc -O2 -shared -fPIC -ffp-contract=off needs_init.c -o libneeds_init.so -lm */
#include <stdint.h>
#include "fp16.h"

static float scale_of_d[1];  /* 0 until kernel_init() */

void kernel_init(void) { scale_of_d[0] = 1.0f; }

void quantize_row_q8_0_ref(const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    for (int64_t i = 0; i < k / 32; i++) {
        const float *xb = x + i * 32;
        uint8_t *yb = y + i * 34;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = amax > fabsf(xb[j]) ? amax : fabsf(xb[j]);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_fp16(yb, d * scale_of_d[0]);
        for (int j = 0; j < 32; j++) yb[2 + j] = (uint8_t)(int8_t)roundf(xb[j] * id);
    }
}
