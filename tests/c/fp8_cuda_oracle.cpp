// NVIDIA's own host conversion (cuda_fp8.hpp of the CUDA toolkit) as an oracle for tbq's fp8_e4m3 / fp8_e5m2.
// Build (only where the header exists): g++ -O1 -ffp-contract=off -I<cuda>/include fp8_cuda_oracle.cpp -o oracle
// Reads: float32 scale s, uint32 n, then n float32 values x (stdin, little-endian). Writes (stdout), per format
// (E4M3 then E5M2): n saturating codes of x / s, n non-saturating codes, and the 256 decoded bytes
// float32(fp8 -> half) * s. This is what SPEC-fp8's vectors were made with (vLLM's cache kernels store the same).
#include <cstdint>
#include <cstdio>
#include <vector>
#include <cuda_fp8.h>

int main() {
    float s;
    uint32_t n;
    if (fread(&s, 4, 1, stdin) != 1 || fread(&n, 4, 1, stdin) != 1) return 1;
    std::vector<float> x(n);
    if (fread(x.data(), 4, n, stdin) != n) return 1;
    std::vector<uint8_t> q(n);
    const __nv_fp8_interpretation_t kinds[2] = {__NV_E4M3, __NV_E5M2};
    for (int k = 0; k < 2; k++) {
        for (int sat = 1; sat >= 0; sat--) {
            for (uint32_t i = 0; i < n; i++) {
                volatile float v = x[i] / s;  // one correctly rounded float32 division
                q[i] = __nv_cvt_float_to_fp8(v, sat ? __NV_SATFINITE : __NV_NOSAT, kinds[k]);
            }
            fwrite(q.data(), 1, n, stdout);
        }
        for (int b = 0; b < 256; b++) {
            __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, kinds[k]);
            float y = __half2float(__half(h)) * s;
            fwrite(&y, 4, 1, stdout);
        }
    }
    return 0;
}
