// What the bindings (csrc/gms_step.cpp, compiled once) and the kernels (csrc/step_target.cpp,
// compiled once per target ISA) share: plain structures and one table of entry points per target.
// Nothing here has code of its own, so that no inline function is compiled with two targets'
// flags (the linker would keep one of the copies for both).
#pragma once

#include <cstdint>

namespace gms {

// The fused step's modes (gms_kernels/kernels/__init__.py: MODE_*).
enum Mode : int { kGaussian = 0, kClosed = 1, kAdan = 2, kDenoise = 3, kFixed = 4, kDdim = 5 };

// The fit's numbers, shared with the Python reference and defined here once for C++
// (tests/core/test_fit.py reads these lines and checks them against gms_kernels/core/fit.py).
// ADAN (fit.fit_adan): the betas and eps of the optimizer, the initial beta, the gap between the
// initial means mu1 = M1 and mu2 = M1 - gap, and the interval beta is kept in.
constexpr double kAdanBeta1 = 0.9, kAdanBeta2 = 0.92, kAdanBeta3 = 0.92, kAdanEps = 1e-8;
constexpr double kAdanInitBeta = 0.998, kAdanInitGap = 1e-3;
constexpr double kAdanBetaLo = 0.1, kAdanBetaHi = 1.2;
// fit.SKEW_KNEE: below this standardized skewness |kappa3| / Var^1.5 the closed fit's delta is the
// straight line through 0 that meets the cube root there (see fit.fit_closed)
constexpr double kSkewKnee = 1e-2;
// gms_kernels.kernels.ADAN_FP32_LIMITS: where the float32 ADAN loop is used (elsewhere float64)
constexpr double kAdanFp32M1Max = 0x1p10, kAdanFp32VarMin = 0x1p-60, kAdanFp32VarMax = 0x1p20, kAdanFp32K3Max = 0x1p30;

#ifndef GMS_BLOCK
#define GMS_BLOCK 256
#endif
constexpr int kBlock = GMS_BLOCK;  // elements per block: the ADAN state (21 arrays) is 22 KiB in float32

// Step coefficients, with every Python-side scalar product precomputed the way the reference
// forms it (e.g. `3 * sigma_t**2 * x` multiplies x by the Python float 3 * sigma_t**2); filled from the
// table of gms_kernels/kernels/scalars.py by coefs_from_scalars (csrc/step_config.h).
struct Coefs {
    double a_t, sigma_t, c1, c2, lam2;
    bool has_range;
    double center, half;
    bool unit_range;  // the range [-1, 1]: center 0 and half-width 1 (see moments_vec)
    // x0_moments
    double r_sq, two_sigma, sigma_sq, a_sq, three_sigma, three_sigma_sq, sigma_cube, a_cube;
    // clamp_x0_moments
    double h_sq, h_cube, c_c, two_c, three_c, three_c_c, c_cube, two_c_h, h_h, three_c_c_h, three_c_h_h;
    // transition moments
    double c2_sq, c2_cube, three_lam2;
    // reciprocals of the divisors (for div_exact)
    double inv_a, inv_a_sq, inv_a_cube, inv_half, inv_h_sq, inv_h_cube;
};

// The constants of ADAN iteration k (see adan_iteration_coefs in csrc/gms_step.cpp).
struct AdanIterCoefs {
    double rho, sigma, eps_a, eps_b, eps_be;  // eps_*: eps/(c sm) for mu1, mu2 and beta
};

struct AdanConfig {
    double w1, grad_scale;
    const AdanIterCoefs* iters;  // one per iteration
    int n_iters;
    bool fp64;  // run every block in double precision (slower; for checks)
};

// An input of N samples of D float32 each, sample i starting at p + i * stride (stride = D: the
// flat contiguous array; 3 D: one head of a [N, 3C, ...] model output sliced along channels).
struct SampleInput {
    const float* p;
    int64_t stride;
};

// Random numbers of the flattened [N * D] array (see draw_block).
struct NoiseSource {
    const int64_t* seeds;
    const int64_t* indices;
    int64_t D;
    uint64_t t;
    bool per_pixel;
};

struct StepArgs {
    SampleInput x, e1, e2, e3;
    float *out, *mu1, *mu2, *s2;
    NoiseSource noise;
    int mode;
    Coefs coefs;
    double var_cap, w1, var_floor;
    double fixed_var;  // kFixed, kDdim: the variance of every element's noise
    double ddim_a_s, ddim_eps_scale;  // kDdim: x_s = a_s x0 + eps_scale eps (+ noise), M1 being x0
    AdanConfig adan;
};

struct MixArgs {
    const float *mu1, *mu2, *s2;
    float* out;
    NoiseSource noise;
    double w1;
};

// The entry points of one compiled target.
struct TargetOps {
    const char* name;
    int vector_bytes;
    bool fma;
    double skew_knee;  // the closed fit's knee (fit.SKEW_KNEE, checked by the tests)
    // the step over all N * D elements (OpenMP threads, no GIL); false when an input it read was
    // not finite (the outputs are then incomplete)
    bool (*run_step)(const StepArgs& A, int64_t total, int num_threads);
    void (*run_mixture)(const MixArgs& A, int64_t total, int num_threads);
    // (M1, Var, M3) in float64 of `total` flat elements (e2/e3 and var/m3 null: not computed)
    void (*moments)(const Coefs& k, int64_t total, const float* x, const float* e1, const float* e2,
                    const float* e3, double* m1, double* var, double* m3);
    // normals of (seed, offset) pairs: one seed (seeds[0]) or one per offset
    void (*normals)(int64_t n, const uint64_t* seeds, bool one_seed, const uint64_t* offsets, float* out);
};

}  // namespace gms
