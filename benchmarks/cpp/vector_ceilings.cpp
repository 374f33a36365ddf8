// Throughput of the vector instructions the ADAN loop is made of, on one thread: 256-bit FMA, square
// root, division and reciprocal estimate, and the same at 512 bits where the compiler targets AVX-512
// (-march=native on an AVX-512 host). Twelve independent chains per instruction, best of 5 runs;
// results in instructions per nanosecond.
//
//   g++ -O2 -march=native -std=c++17 benchmarks/cpp/vector_ceilings.cpp -o /tmp/vector_ceilings && /tmp/vector_ceilings
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#define GMS_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

constexpr long kLoops = 4000000;

// Runs `op` on 12 independent registers kLoops times; returns instructions per nanosecond.
template <typename V, typename Op>
double throughput(V start, Op op) {
    double best = 0.0;
    for (int run = 0; run < 5; ++run) {
#define GMS_DECL(j) V x##j = start;
        GMS_CHAINS(GMS_DECL)
        const auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < kLoops; ++i) {
#define GMS_OP(j) x##j = op(x##j);
            GMS_CHAINS(GMS_OP)
            // keep the twelve chains in registers and alive
            asm volatile("" : "+v"(x0), "+v"(x1), "+v"(x2), "+v"(x3), "+v"(x4), "+v"(x5), "+v"(x6), "+v"(x7),
                         "+v"(x8), "+v"(x9), "+v"(x10), "+v"(x11));
        }
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, 12.0 * kLoops / ns);
    }
    return best;
}

int main() {
    const __m256 one8 = _mm256_set1_ps(1.0000001f), tiny8 = _mm256_set1_ps(1e-7f);
    const double fma256 = throughput(_mm256_set1_ps(1.5f), [&](__m256 x) { return _mm256_fmadd_ps(x, one8, tiny8); });
    const double sqrt256 = throughput(_mm256_set1_ps(1.5f), [](__m256 x) { return _mm256_sqrt_ps(x); });
    const double div256 = throughput(_mm256_set1_ps(1.5f), [&](__m256 x) { return _mm256_div_ps(x, one8); });
    const double rcp256 = throughput(_mm256_set1_ps(1.5f), [](__m256 x) { return _mm256_rcp_ps(x); });
    std::printf("instructions per ns, one thread: vfmadd ymm %.2f, vsqrtps ymm %.3f, vdivps ymm %.3f, vrcpps ymm %.2f",
                fma256, sqrt256, div256, rcp256);
#ifdef __AVX512F__
    const __m512 one16 = _mm512_set1_ps(1.0000001f), tiny16 = _mm512_set1_ps(1e-7f);
    const double fma512 = throughput(_mm512_set1_ps(1.5f), [&](__m512 x) { return _mm512_fmadd_ps(x, one16, tiny16); });
    const double sqrt512 = throughput(_mm512_set1_ps(1.5f), [](__m512 x) { return _mm512_sqrt_ps(x); });
    const double div512 = throughput(_mm512_set1_ps(1.5f), [&](__m512 x) { return _mm512_div_ps(x, one16); });
    const double rcp512 = throughput(_mm512_set1_ps(1.5f), [](__m512 x) { return _mm512_rcp14_ps(x); });
    std::printf(", vfmadd zmm %.2f, vsqrtps zmm %.3f, vdivps zmm %.3f, vrcp14ps zmm %.2f", fma512, sqrt512, div512, rcp512);
#endif
    std::printf("\n");
    return 0;
}
