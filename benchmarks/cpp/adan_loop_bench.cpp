// Cost of the C++ extension's ADAN block loop (csrc/gms_step.cpp, adan_iteration) on one thread,
// in nanoseconds and in cycles at the nominal clock per 16 elements (one 512-bit vector) per iteration.
//
//   g++ -O3 -march=native -mprefer-vector-width=512 -fno-math-errno -fopenmp -std=c++17 \
//       benchmarks/cpp/adan_loop_bench.cpp -o /tmp/adan_loop_bench && /tmp/adan_loop_bench 2.8
//
// (the argument: the nominal clock in GHz). Each block of kBlock elements is re-initialised every
// 25 iterations, as the fused step does, and the initialisation is not timed.
#define GMS_KERNELS_NO_PYTHON
#include "../../csrc/gms_step.cpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>

using namespace gms;

static void init_block(AdanBlock<float>& s, int n) {
    for (int i = 0; i < n; ++i) {  // plausible moments: M1 in [0, 0.1), Var 0.3, kappa3 of both signs
        s.M[i] = 0.1f * static_cast<float>(i) / static_cast<float>(n);
        s.M2[i] = 2 * s.M[i];
        s.M3x[i] = 3 * s.M[i];
        s.V[i] = 0.3f;
        s.K3[i] = 0.01f * static_cast<float>(i % 7 - 3);
        s.SV[i] = s.V[i];
        s.a[i] = 0.0f;
        s.b[i] = -1e-3f;
        s.be[i] = 0.998f;
        s.ma[i] = s.mb[i] = s.mbe[i] = s.va[i] = s.vb[i] = s.vbe[i] = 0.0f;
        s.na[i] = s.nb[i] = s.nbe[i] = s.ga[i] = s.gb[i] = s.gbe[i] = 0.0f;
    }
}

int main(int argc, char** argv) {
    const double ghz = argc > 1 ? std::atof(argv[1]) : 2.8;
    const int n = kBlock, fits = 4000, iters = 25;
    static AdanBlock<float> s;
    const AdanConsts consts{1.0 / 3.0, 2.0 / 3072.0};
    const std::vector<AdanIterCoefs> coefs = adan_iteration_coefs(std::vector<double>(iters, 0.06));
    double seconds = 0.0, checksum = 0.0;
    for (int f = 0; f < fits; ++f) {
        init_block(s, n);
        const auto t0 = std::chrono::steady_clock::now();
        adan_iteration<float, true>(s, n, consts, coefs[0]);
        for (int k = 1; k < iters; ++k) adan_iteration<float, false>(s, n, consts, coefs[k]);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        checksum += s.a[n / 2];
    }
    const double ns = seconds / (static_cast<double>(fits) * iters * n) * 1e9;
    std::printf("ADAN block loop: %.3f ns per element per iteration, %.1f cycles per 16 elements at %.2f GHz "
                "(checksum %g)\n", ns, ns * 16 * ghz, ghz, checksum);
    return 0;
}
