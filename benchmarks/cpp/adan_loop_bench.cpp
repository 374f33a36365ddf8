// Cost of the C++ extension's ADAN fit (csrc/step_target.cpp: adan_fit over blocks, as the fused
// step runs it) on one thread, for 307,200 elements of plausible moments and 25 iterations:
// milliseconds, and cycles at the nominal clock per vector of elements per iteration. Best of 20 rounds
// (this is a shared VM: single runs swing by 30%). Compiled for one target as setup.py compiles it:
//
//   g++ -O3 -march=x86-64-v4 -mprefer-vector-width=512 -DGMS_TARGET_NS=avx512 -DGMS_VBYTES=64 \
//       -fno-math-errno -fno-wrapv -fno-predictive-commoning -fopenmp -std=c++17 benchmarks/cpp/adan_loop_bench.cpp \
//       -o /tmp/b && /tmp/b 2.8
//   (AVX2: -march=x86-64-v3 -DGMS_TARGET_NS=avx2 -DGMS_VBYTES=32)
//
// (the argument: the nominal clock in GHz).
#include "../../csrc/step_config.h"
#include "../../csrc/step_target.cpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

using namespace gms;
using namespace gms::GMS_TARGET_NS;

int main(int argc, char** argv) {
    const double ghz = argc > 1 ? std::atof(argv[1]) : 2.8;
    const int total = 307200, iters = 25, rounds = 20;
    // moments like those of benchmarks/cases.py: M1 spread over the data range, Var 0.1-0.6,
    // kappa3 of both signs
    std::mt19937 gen(0);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::vector<double> M1(total), VAR(total), M3(total), K3(total), P1(total), P2(total), PS(total);
    for (int i = 0; i < total; ++i) {
        M1[i] = 0.5 * normal(gen);
        VAR[i] = 0.1 + 0.5 * uniform(gen);
        M3[i] = M1[i] * M1[i] * M1[i] + 3 * M1[i] * VAR[i] + 0.05 * normal(gen);
    }
    const double w1 = 1.0 / 3.0, grad_scale = 2.0 / 3072.0;
    const std::vector<AdanIterCoefs> coefs = adan_iteration_coefs(std::vector<double>(iters, 0.06), w1, grad_scale);
    const AdanConfig cfg{w1, grad_scale, coefs.data(), iters, false};
    double best = 1e30;
    for (int r = 0; r < rounds; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int e0 = 0; e0 < total; e0 += kBlock) {
            const int n = std::min(kBlock, total - e0);
            adan_fit(cfg, n, &M1[e0], &VAR[e0], &M3[e0], &K3[e0], &P1[e0], &P2[e0], &PS[e0]);
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    double checksum = 0.0;
    for (int i = 0; i < total; i += 997) checksum += P1[i] + P2[i] + PS[i];
    const int lanes = GMS_VBYTES / 4;  // float32 lanes per vector
    const double cycles = best * ghz * 1e9 / (static_cast<double>(total) / lanes * iters);
    std::printf("ADAN fit, %d elements, %d iterations, one thread: %.2f ms, %.1f cycles per %d elements per "
                "iteration at %.2f GHz (checksum %.9g)\n",
                total, iters, best * 1e3, cycles, lanes, ghz, checksum);
    return 0;
}
