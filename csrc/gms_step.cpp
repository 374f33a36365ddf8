// gms_kernels._C: the fused GMS step on CPU, torch-free (pybind11 + raw float buffers).
//
// One pass over memory per block of elements: moments (double) -> fit (closed form in double, or
// ADAN in float32 SoA) -> mixture sampling with the Philox streams of gms_kernels/random.py.
// The meaning of every number is defined by the torch reference (gms_kernels/solvers.py,
// moments.py, fit.py, mixture.py); see the contract in gms_kernels/kernels/__init__.py.
//
// Work is split into blocks of kBlock consecutive elements of the flattened [N * D] arrays; blocks
// are independent (OpenMP parallel for when available) and each keeps its working set (a few
// dozen arrays of kBlock numbers) in L1. Inner loops are branch-free over structure-of-arrays
// so that the compiler vectorises them.
//
// Inputs are read completely (per block) before that block's outputs are written, so `out` may
// alias `x_t` (an in-place step).

#ifndef GMS_KERNELS_NO_PYTHON  // (defined by C++-only benchmarks that include this file)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "philox.h"

#ifndef GMS_KERNELS_NO_PYTHON
namespace py = pybind11;
#endif

// The moment formulas are evaluated without fused multiply-adds, in the torch reference's order,
// so that M1, Var and M3 come out bit-identical to the float64 reference (the cube root of the
// closed-form fit is ill-conditioned near kappa3 = 0; identical inputs keep it out of the way).
#if defined(__clang__)
#define GMS_NO_FMA_BEGIN _Pragma("clang fp contract(off)")
#define GMS_NO_FMA_FN
#elif defined(__GNUC__)
#define GMS_NO_FMA_BEGIN
#define GMS_NO_FMA_FN __attribute__((optimize("fp-contract=off")))
#else
#define GMS_NO_FMA_BEGIN
#define GMS_NO_FMA_FN
#endif

#if defined(_OPENMP) || defined(GMS_OPENMP_SIMD)
#define GMS_SIMD _Pragma("omp simd")
#else
#define GMS_SIMD
#endif

namespace gms {

enum Mode : int { kGaussian = 0, kClosed = 1, kAdan = 2, kDenoise = 3 };

#ifndef GMS_BLOCK
#define GMS_BLOCK 256
#endif
constexpr int kBlock = GMS_BLOCK;  // elements per block: the ADAN state (21 arrays) is 22 KiB in float32

constexpr double kAdanBeta1 = 0.9, kAdanBeta2 = 0.92, kAdanBeta3 = 0.92, kAdanEps = 1e-8;
constexpr double kAdanInitBeta = 0.998, kAdanInitGap = 1e-3;
constexpr double kAdanBetaLo = 0.1, kAdanBetaHi = 1.2;

#if defined(__FMA__) || defined(__FP_FAST_FMA) || defined(__ARM_FEATURE_FMA)
#define GMS_HAS_FMA 1
#endif

// x / d, correctly rounded (bit-identical to the division), from the precomputed reciprocal
// inv_d = 1/d: q = x inv_d is within an ulp, and one fma-exact residual step rounds it correctly
// (Markstein's theorem). Two fma and a multiply instead of a division, which is slow and
// poorly pipelined in vector units. Without hardware fma, a plain division.
inline double div_exact(double x, double d, double inv_d) {
#ifdef GMS_HAS_FMA
    const double q = x * inv_d;
    return __builtin_fma(__builtin_fma(-q, d, x), inv_d, q);
#else
    (void)inv_d;
    return x / d;
#endif
}

// torch.clamp for finite v, written as max / min (a NaN v gives lo here, NaN in torch)
inline double clampd(double v, double lo, double hi) {
    v = v > lo ? v : lo;
    return v < hi ? v : hi;
}

// ------------------------------------------------------------------------------------------
// Step coefficients, with every Python-side scalar product precomputed the way the reference
// forms it (e.g. `3 * sigma_t**2 * x` multiplies x by the Python float 3 * sigma_t**2).
struct Coefs {
    double a_t, sigma_t, c1, c2, lam2;
    bool has_range;
    double center, half;
    // x0_moments
    double r_sq, two_sigma, sigma_sq, a_sq, three_sigma, three_sigma_sq, sigma_cube, a_cube;
    // clamp_x0_moments
    double h_sq, h_cube, c_c, two_c, three_c, three_c_c, c_cube, two_c_h, h_h, three_c_c_h, three_c_h_h;
    // transition moments
    double c2_sq, c2_cube, three_lam2;
    // reciprocals of the divisors (for div_exact)
    double inv_a, inv_a_sq, inv_a_cube, inv_half, inv_h_sq, inv_h_cube;

    Coefs(double a, double s, double c1_, double c2_, double lam2_, bool rng, double c, double h)
        : a_t(a), sigma_t(s), c1(c1_), c2(c2_), lam2(lam2_), has_range(rng), center(c), half(h) {
        const double r = s / a;
        r_sq = r * r;
        two_sigma = 2 * s;
        sigma_sq = std::pow(s, 2.0);
        a_sq = std::pow(a, 2.0);
        three_sigma = 3 * s;
        three_sigma_sq = 3 * sigma_sq;
        sigma_cube = std::pow(s, 3.0);
        a_cube = std::pow(a, 3.0);
        h_sq = std::pow(h, 2.0);
        h_cube = std::pow(h, 3.0);
        c_c = c * c;
        two_c = 2 * c;
        three_c = 3 * c;
        three_c_c = three_c * c;
        c_cube = std::pow(c, 3.0);
        two_c_h = two_c * h;
        h_h = h * h;
        three_c_c_h = three_c_c * h;
        three_c_h_h = three_c * h * h;
        c2_sq = std::pow(c2_, 2.0);
        c2_cube = std::pow(c2_, 3.0);
        three_lam2 = 3 * lam2_;
        inv_a = 1.0 / a;
        inv_a_sq = 1.0 / a_sq;
        inv_a_cube = 1.0 / a_cube;
        inv_half = 1.0 / h;
        inv_h_sq = 1.0 / h_sq;
        inv_h_cube = 1.0 / h_cube;
    }
};

// (M1, Var, M3) of q(x_s | x_t) for n elements, as moments.transition_moments computes them:
// x0_moments -> clamp_x0_moments (with a range) -> first / second / third moments, Var clamped
// to [0, half^2] with a range. VAR needs e2; M3 needs e2 and e3.
template <bool HAS_VAR, bool HAS_M3, bool RANGE>
GMS_NO_FMA_FN void moments_block(const Coefs& kref, int n, const float* __restrict x_in,
                                 const float* __restrict e1_in, const float* __restrict e2_in,
                                 const float* __restrict e3_in, double* __restrict M1, double* __restrict VAR,
                                 double* __restrict M3) {
    GMS_NO_FMA_BEGIN
    const Coefs k = kref;  // a local copy: its fields stay in registers
    // The inputs are widened first, so that the main loop works on doubles only (8 lanes per
    // 512-bit vector instead of 16 half-used ones, and far fewer live registers).
    alignas(64) double X[kBlock], E1[kBlock], E2[kBlock], E3[kBlock];
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        X[i] = x_in[i];
        E1[i] = e1_in[i];
        if (HAS_VAR) E2[i] = e2_in[i];
        if (HAS_M3) E3[i] = e3_in[i];
    }
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        const double x = X[i], e1 = E1[i];
        const double e2 = HAS_VAR ? E2[i] : 0.0;
        const double e3 = HAS_M3 ? E3[i] : 0.0;
        const double xx = x * x;
        // x0_moments
        const double mean = div_exact(x - k.sigma_t * e1, k.a_t, k.inv_a);
        double var0 = 0.0, m2 = 0.0, m3 = 0.0;
        if (HAS_VAR) {
            var0 = k.r_sq * (e2 - e1 * e1);
            m2 = div_exact(xx - k.two_sigma * x * e1 + k.sigma_sq * e2, k.a_sq, k.inv_a_sq);
        }
        if (HAS_M3) {
            m3 = div_exact(xx * x - k.three_sigma * xx * e1 + k.three_sigma_sq * x * e2 - k.sigma_cube * e3, k.a_cube,
                           k.inv_a_cube);
        }
        // clamp_x0_moments
        double mean_c = mean, var_c = var0, m2_c = m2, m3_c = m3;
        if (RANGE) {
            const double mean_y = clampd(div_exact(mean - k.center, k.half, k.inv_half), -1.0, 1.0);
            mean_c = k.center + k.half * mean_y;
            if (HAS_VAR) {
                var_c = clampd(div_exact(var0, k.h_sq, k.inv_h_sq), 0.0, 1.0) * k.h_sq;
                const double m2_y = clampd(div_exact(m2 - k.two_c * mean + k.c_c, k.h_sq, k.inv_h_sq), 0.0, 1.0);
                m2_c = k.c_c + k.two_c_h * mean_y + k.h_h * m2_y;
                if (HAS_M3) {
                    double m3_y = div_exact(m3 - k.three_c * m2 + k.three_c_c * mean - k.c_cube, k.h_cube, k.inv_h_cube);
                    m3_y = std::fabs(m3_y) > std::fabs(mean_y) ? mean_y : m3_y;
                    m3_y = clampd(m3_y, -1.0, 1.0);
                    m3_c = k.c_cube + k.three_c_c_h * mean_y + k.three_c_h_h * m2_y + k.h_cube * m3_y;
                }
            }
        }
        const double m1 = k.c1 * x + k.c2 * mean_c;
        M1[i] = m1;
        if (HAS_VAR) {
            double var = k.lam2 + k.c2_sq * var_c;
            if (RANGE) var = clampd(var, 0.0, k.h_sq);
            VAR[i] = var;
        }
        if (HAS_M3) {
            const double c1x = k.c1 * x;
            const double c1x2 = c1x * c1x;
            const double cube = c1x2 * c1x + 3 * c1x2 * k.c2 * mean_c + 3 * c1x * k.c2_sq * m2_c + k.c2_cube * m3_c;
            M3[i] = cube + k.three_lam2 * m1;
        }
    }
}

template <bool HAS_VAR, bool HAS_M3>
void moments_dispatch_range(const Coefs& k, int n, const float* x, const float* e1, const float* e2, const float* e3,
                            double* M1, double* VAR, double* M3) {
    if (k.has_range)
        moments_block<HAS_VAR, HAS_M3, true>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else
        moments_block<HAS_VAR, HAS_M3, false>(k, n, x, e1, e2, e3, M1, VAR, M3);
}

inline void moments_dispatch(const Coefs& k, int n, const float* x, const float* e1, const float* e2,
                             const float* e3, double* M1, double* VAR, double* M3) {
    if (e2 == nullptr)
        moments_dispatch_range<false, false>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else if (e3 == nullptr)
        moments_dispatch_range<true, false>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else
        moments_dispatch_range<true, true>(k, n, x, e1, e2, e3, M1, VAR, M3);
}

// ------------------------------------------------------------------------------------------
// Cube root in double, vectorisable and division-free: y ~ |v|^(-1/3) from the exponent bits
// (relative error < 3.5%), four Newton steps y <- y (4 - a y^3)/3 (quadratic: 3.5e-2 -> 1.2e-3
// -> 1.5e-6 -> 2e-12 -> rounding), then c = a y^2 and one Newton step for the cube root itself,
// c <- c - (c^3 - a) y^2 / 3, which leaves about one ulp. Tiny inputs are scaled by 2^600 first.
inline double cbrt_vec(double v) {
    double a = std::fabs(v);
    const bool tiny = a < 0x1p-900;
    a = tiny ? a * 0x1p600 : a;
    uint64_t bits;
    std::memcpy(&bits, &a, sizeof bits);
    // high word of a^(-1/3): 4/3 of the exponent bias minus a third of the high word
    const uint32_t hi = static_cast<uint32_t>(bits >> 32);
    const uint64_t guess_bits = static_cast<uint64_t>(0x553EF0FFu - hi / 3u) << 32;
    double y;
    std::memcpy(&y, &guess_bits, sizeof y);
    const double third = 1.0 / 3.0;
    for (int it = 0; it < 4; ++it) y = y * ((4.0 - a * (y * y * y)) * third);
    const double y2 = y * y;
    double c = a * y2;
    c = c - (c * c * c - a) * (y2 * third);
    c = tiny ? c * 0x1p-200 : c;
    c = a == 0.0 ? 0.0 : c;
    c = a == HUGE_VAL ? a : c;
    return v < 0.0 ? -c : c;
}

// Central third moment kappa3 = M3 - 3 M1 Var - M1^3 in the reference's order, without fma: it is
// a difference of nearly equal numbers, and the closed fit takes its cube root. The closed fit
// uses max(Var, 0) (fit_closed clamps it), ADAN the Var as it is.
template <bool CLAMP_VAR>
GMS_NO_FMA_FN void kappa3_block(int n, const double* __restrict M1, const double* __restrict VAR,
                                const double* M3, double* K3) {  // K3 may be M3
    GMS_NO_FMA_BEGIN
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        const double m1 = M1[i];
        const double var = CLAMP_VAR ? (VAR[i] < 0.0 ? 0.0 : VAR[i]) : VAR[i];
        K3[i] = M3[i] - 3 * m1 * var - m1 * m1 * m1;
    }
}

// fit.fit_closed in double: exact (M1, Var, M3) match with the variance floor. K3 holds kappa3
// (from kappa3_block<true>).
inline void closed_fit_block(int n, const double* __restrict M1, const double* __restrict VAR,
                             const double* __restrict K3, double w1, double var_floor, double* __restrict P1,
                             double* __restrict P2, double* __restrict PS) {
    const double w2 = 1.0 - w1;
    const double w12 = w1 * w2;
    const double inv_denom = 1.0 / (w12 * (w2 - w1)), inv_w12 = 1.0 / w12;
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        const double m1 = M1[i];
        const double var = VAR[i] < 0.0 ? 0.0 : VAR[i];
        double delta = cbrt_vec(K3[i] * inv_denom);
        double s2 = var - w12 * (delta * delta);
        const double floor = var_floor * var;
        const bool too_skewed = s2 < floor;
        s2 = too_skewed ? floor : s2;
        const double room = var - floor;
        const double max_delta = std::sqrt((room < 0.0 ? 0.0 : room) * inv_w12);
        const double sgn = delta > 0.0 ? 1.0 : (delta < 0.0 ? -1.0 : 0.0);
        delta = too_skewed ? sgn * max_delta : delta;
        P1[i] = m1 + w2 * delta;
        P2[i] = m1 - w1 * delta;
        PS[i] = s2;
    }
}

// ------------------------------------------------------------------------------------------
// ADAN fit (fit.fit_adan), written per element.
//
// Parameters are kept relative to M1: a = mu1 - M1, b = mu2 - M1 (and beta). With
// kappa3 = M3 - 3 M1 Var - M1^3 and w1 + w2 = 1 the raw-moment residuals of the reference are,
// exactly in real arithmetic,
//   r1 = w1 a + w2 b
//   q  = w1 a^2 + w2 b^2 + s2 - Var                 (central second-moment error)
//   r2 = 2 M1 r1 + q
//   r3 = 3 M1 (M1 r1 + q) + 3 s2 r1 + (w1 a^3 + w2 b^3) - kappa3
// which float32 evaluates without the cancellation of the raw form (errors relative to the
// spread of the mixture, not to M1^3). The reference's gradient, with t3 = 3 r3, is
//   g_mu1 = scale w1 P(mu1), g_mu2 = scale w2 P(mu2),  P(mu) = (r1 + s2 t3) + mu (2 r2 + mu t3)
//   g_beta = scale Var (r2 + (M1 + r1) t3).
//
// ADAN (reference-notes 2) is run on rescaled state, exactly equivalent in real arithmetic and
// cheaper: for a parameter with gradient g = c P (c = scale w1, scale w2 for mu1, mu2; c = 1 and
// P = g for beta) the loop keeps m' = m/((1-b1) c), v' = v/((1-b2) c), n' = n/((1-b3) c^2):
//   m' <- b1 m' + P,  v' <- b2 v' + dP,  n' <- b3 n' + (P + b2 dP)^2
//   p  <- p - (sm m' + sv v') / (sn sqrt(n') + eps/c)
// with sm = (1-b1) lr/(1-b1^k), sv = (1-b2) lr b2/(1-b2^k), sn = sqrt((1-b3)/(1-b3^k)).
//
// Flops per element per iteration (fma = 2; sqrt, div, min, max = 1 each):
//   residuals: s2 1, w1 a / w2 b / r1 3, w1 a^2 / w2 b^2 2, q 3, cubic 3, r2 2, r3 8      = 22
//   gradients: t3 1, r1 + s2 t3 2, 2 r2 1, mu1 mu2 2, P(mu1) P(mu2) 8, g_beta 4         = 18
//   ADAN, per parameter: dP 1, m' 2, v' 2, u 2, n' 3, sqrt 1, denominator 2,
//                        numerator 3, div 1, update 1 = 18, times 3                      = 54
//   beta clamp                                                                             =  2
//   total                                                                                  = 96
// That is about 70 vector instructions per lane-group with fma (3 sqrt and 3 div among them), and
// 21 arrays read plus 15 written per iteration (144 bytes per element, all in L1: the block's
// state is 15 arrays, its constants 6). Measured on the 2-core Xeon (AVX-512) this loop runs at
// ~0.5 ms per iteration per 307,200 elements on one core (~60 GFLOP/s).
// Each array is padded by 64 bytes so that the 21 streams do not all sit at the same offset
// modulo 4 KiB (which can make the CPU stall loads behind unrelated stores: "4K aliasing").
constexpr int kAdanStride = kBlock + 64 / 4;

template <typename T>
struct AdanBlock {
    alignas(64) T a[kAdanStride], b[kAdanStride], be[kAdanStride];     // parameters (a, b relative to M1)
    alignas(64) T ma[kAdanStride], mb[kAdanStride], mbe[kAdanStride];  // m'
    alignas(64) T va[kAdanStride], vb[kAdanStride], vbe[kAdanStride];  // v'
    alignas(64) T na[kAdanStride], nb[kAdanStride], nbe[kAdanStride];  // n'
    alignas(64) T ga[kAdanStride], gb[kAdanStride], gbe[kAdanStride];  // previous P
    alignas(64) T M[kAdanStride], M2[kAdanStride], M3x[kAdanStride];   // M1, 2 M1, 3 M1
    alignas(64) T V[kAdanStride], K3[kAdanStride], SV[kAdanStride];    // Var, kappa3, scale * Var
};

struct AdanIterCoefs {
    double sm, sv, sn;  // (1-b1) lr/(1-b1^k), (1-b2) lr b2/(1-b2^k), sqrt((1-b3)/(1-b3^k))
};

struct AdanConsts {
    double w1, grad_scale;
};

// eps / c for a gradient scaled by c > 0, kept finite (a zero scale means no step: num / 1e30)
inline float adan_eps_over(double c) {
    const double e = kAdanEps / c;
    return static_cast<float>(e < 1e30 ? e : 1e30);
}

template <typename T, bool FIRST>
void adan_iteration(AdanBlock<T>& s, int n, const AdanConsts& c, const AdanIterCoefs& it) {
    const T w1 = static_cast<T>(c.w1), w2 = static_cast<T>(1.0 - c.w1);
    const T b1 = static_cast<T>(kAdanBeta1), b2 = static_cast<T>(kAdanBeta2), b3 = static_cast<T>(kAdanBeta3);
    const T eps = static_cast<T>(kAdanEps);
    const T eps_a = static_cast<T>(adan_eps_over(c.grad_scale * c.w1));
    const T eps_b = static_cast<T>(adan_eps_over(c.grad_scale * (1.0 - c.w1)));
    const T lo = static_cast<T>(kAdanBetaLo), hi = static_cast<T>(kAdanBetaHi);
    const T sm = static_cast<T>(it.sm), sv = static_cast<T>(it.sv), sn = static_cast<T>(it.sn);
    T* __restrict pa = s.a;
    T* __restrict pb = s.b;
    T* __restrict pbe = s.be;
    T* __restrict ma = s.ma;
    T* __restrict mb = s.mb;
    T* __restrict mbe = s.mbe;
    T* __restrict va = s.va;
    T* __restrict vb = s.vb;
    T* __restrict vbe = s.vbe;
    T* __restrict na = s.na;
    T* __restrict nb = s.nb;
    T* __restrict nbe = s.nbe;
    T* __restrict gpa = s.ga;
    T* __restrict gpb = s.gb;
    T* __restrict gpbe = s.gbe;
    const T* __restrict Mv = s.M;
    const T* __restrict M2v = s.M2;
    const T* __restrict M3v = s.M3x;
    const T* __restrict Vv = s.V;
    const T* __restrict K3v = s.K3;
    const T* __restrict SVv = s.SV;
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        const T M = Mv[i], V = Vv[i];
        const T a = pa[i], b = pb[i], be = pbe[i];
        // residuals
        const T s2 = be * V;
        const T w1a = w1 * a, w2b = w2 * b;
        const T r1 = w1a + w2b;
        const T w1aa = w1a * a, w2bb = w2b * b;
        const T q = (w1aa + w2bb) + (s2 - V);
        const T cubic = w1aa * a + w2bb * b;
        const T r2 = M2v[i] * r1 + q;
        const T r3 = M3v[i] * (M * r1 + q) + (T(3) * s2 * r1 + (cubic - K3v[i]));
        // gradients (P for mu1 and mu2, the full gradient for beta)
        const T t3 = T(3) * r3;
        const T c0 = r1 + s2 * t3, c1 = r2 + r2;
        const T mu1 = M + a, mu2 = M + b;
        const T g_a = c0 + mu1 * (c1 + mu1 * t3);
        const T g_b = c0 + mu2 * (c1 + mu2 * t3);
        const T g_be = SVv[i] * (r2 + (M + r1) * t3);
        // ADAN on the rescaled state (d = 0 at k = 1)
        const T d_a = FIRST ? T(0) : g_a - gpa[i];
        const T d_b = FIRST ? T(0) : g_b - gpb[i];
        const T d_be = FIRST ? T(0) : g_be - gpbe[i];
        const T m_a = b1 * ma[i] + g_a, m_b = b1 * mb[i] + g_b, m_be = b1 * mbe[i] + g_be;
        const T v_a = b2 * va[i] + d_a, v_b = b2 * vb[i] + d_b, v_be = b2 * vbe[i] + d_be;
        const T u_a = g_a + b2 * d_a, u_b = g_b + b2 * d_b, u_be = g_be + b2 * d_be;
        const T n_a = b3 * na[i] + u_a * u_a;
        const T n_b = b3 * nb[i] + u_b * u_b;
        const T n_be = b3 * nbe[i] + u_be * u_be;
        const T step_a = (sm * m_a + sv * v_a) / (std::sqrt(n_a) * sn + eps_a);
        const T step_b = (sm * m_b + sv * v_b) / (std::sqrt(n_b) * sn + eps_b);
        const T step_be = (sm * m_be + sv * v_be) / (std::sqrt(n_be) * sn + eps);
        T new_be = be - step_be;
        new_be = new_be > lo ? new_be : lo;  // (maxps / minps)
        new_be = new_be < hi ? new_be : hi;
        pa[i] = a - step_a;
        pb[i] = b - step_b;
        pbe[i] = new_be;
        ma[i] = m_a;
        mb[i] = m_b;
        mbe[i] = m_be;
        va[i] = v_a;
        vb[i] = v_b;
        vbe[i] = v_be;
        na[i] = n_a;
        nb[i] = n_b;
        nbe[i] = n_be;
        gpa[i] = g_a;
        gpb[i] = g_b;
        gpbe[i] = g_be;
    }
}

struct AdanConfig {
    AdanConsts consts;
    std::vector<AdanIterCoefs> iters;
    bool fp64 = false;  // run every block in double precision (slower; for checks)
};

inline std::vector<AdanIterCoefs> adan_iteration_coefs(const std::vector<double>& lrs) {
    std::vector<AdanIterCoefs> out;
    for (size_t k = 1; k <= lrs.size(); ++k) {
        const double lr = lrs[k - 1], kk = static_cast<double>(k);
        out.push_back({(1 - kAdanBeta1) * lr / (1 - std::pow(kAdanBeta1, kk)),
                       (1 - kAdanBeta2) * lr * kAdanBeta2 / (1 - std::pow(kAdanBeta2, kk)),
                       std::sqrt((1 - kAdanBeta3) / (1 - std::pow(kAdanBeta3, kk)))});
    }
    return out;
}

template <typename T>
void adan_fit_block(const AdanConfig& cfg, int n, const double* __restrict M1, const double* __restrict VAR,
                    const double* __restrict K3, double* __restrict P1, double* __restrict P2,
                    double* __restrict PS) {
    AdanBlock<T> s;
    const T scale = static_cast<T>(cfg.consts.grad_scale);
    for (int i = 0; i < n; ++i) {
        s.M[i] = static_cast<T>(M1[i]);
        s.M2[i] = s.M[i] + s.M[i];
        s.M3x[i] = T(3) * s.M[i];
        s.V[i] = static_cast<T>(VAR[i]);
        s.K3[i] = static_cast<T>(K3[i]);
        s.SV[i] = scale * s.V[i];
        s.a[i] = T(0);
        s.b[i] = static_cast<T>((M1[i] - kAdanInitGap) - M1[i]);  // the reference's mu2 = M1 - 1e-3
        s.be[i] = static_cast<T>(kAdanInitBeta);
        s.ma[i] = s.mb[i] = s.mbe[i] = T(0);
        s.va[i] = s.vb[i] = s.vbe[i] = T(0);
        s.na[i] = s.nb[i] = s.nbe[i] = T(0);
        s.ga[i] = s.gb[i] = s.gbe[i] = T(0);
    }
    for (size_t k = 0; k < cfg.iters.size(); ++k) {
        if (k == 0)
            adan_iteration<T, true>(s, n, cfg.consts, cfg.iters[k]);
        else
            adan_iteration<T, false>(s, n, cfg.consts, cfg.iters[k]);
    }
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        P1[i] = M1[i] + static_cast<double>(s.a[i]);
        P2[i] = M1[i] + static_cast<double>(s.b[i]);
        PS[i] = static_cast<double>(s.be[i]) * VAR[i];
    }
}

// Elements whose scale could overflow float32 in the gradient or its square (|g| ~ scale S^5
// with S the largest of |M1|, sqrt|Var|, cbrt|kappa3|), or that are not finite, are fitted in
// double. The choice is made per element, so that an element's result never depends on its
// neighbours (a sample does not depend on the batch it is drawn in).
inline bool adan_needs_double(double m1, double var, double k3) {
    const bool small = std::fabs(m1) <= 1024.0 && std::fabs(var) <= 1048576.0 && std::fabs(k3) <= 1073741824.0;
    return !small;  // (NaN compares false: not small)
}

inline void adan_fit(const AdanConfig& cfg, int n, const double* M1, const double* VAR, const double* M3,
                     double* K3, double* P1, double* P2, double* PS) {
    kappa3_block<false>(n, M1, VAR, M3, K3);  // the reference's Var, not clamped
    if (cfg.fp64 || !(cfg.consts.grad_scale <= 2.0)) {
        adan_fit_block<double>(cfg, n, M1, VAR, K3, P1, P2, PS);
        return;
    }
    int wide[kBlock];
    int n_wide = 0;
    for (int i = 0; i < n; ++i)
        if (adan_needs_double(M1[i], VAR[i], K3[i])) wide[n_wide++] = i;
    if (n_wide == n) {
        adan_fit_block<double>(cfg, n, M1, VAR, K3, P1, P2, PS);
        return;
    }
    adan_fit_block<float>(cfg, n, M1, VAR, K3, P1, P2, PS);
    if (n_wide == 0) return;
    // refit the wide elements in double (gathered, then scattered back)
    alignas(64) double m1[kBlock], var[kBlock], k3[kBlock], p1[kBlock], p2[kBlock], ps[kBlock];
    for (int w = 0; w < n_wide; ++w) {
        m1[w] = M1[wide[w]];
        var[w] = VAR[wide[w]];
        k3[w] = K3[wide[w]];
    }
    adan_fit_block<double>(cfg, n_wide, m1, var, k3, p1, p2, ps);
    for (int w = 0; w < n_wide; ++w) {
        P1[wide[w]] = p1[w];
        P2[wide[w]] = p2[w];
        PS[wide[w]] = ps[w];
    }
}

// ------------------------------------------------------------------------------------------
// Random numbers of a block of consecutive elements [e0, e0 + n) of the flattened [N * D] array:
// Z: normal(seeds[i], counter(0, t, indices[i] * D + j)); U: uniform(seeds[i], counter(1, t, ...))
// per element (per_pixel) or once per sample (counter(1, t, indices[i])).
struct NoiseSource {
    const int64_t* seeds;
    const int64_t* indices;
    int64_t D;
    uint64_t t;
    bool per_pixel;
};

inline void draw_block(const NoiseSource& src, int64_t e0, int n, float* __restrict Z, float* __restrict U) {
    alignas(64) uint32_t w0[kBlock], w1[kBlock], u0[kBlock], u1[kBlock];
    const uint64_t head0 = philox_counter(0, src.t, 0), head1 = philox_counter(1, src.t, 0);
    const bool pixel_u = U != nullptr && src.per_pixel;
    int64_t i = e0 / src.D, j = e0 % src.D;
    if (src.D >= 16) {
        // long runs of one sample: one key and consecutive counters per run
        for (int e = 0; e < n;) {
            const int len = static_cast<int>(std::min<int64_t>(n - e, src.D - j));
            const uint64_t seed = static_cast<uint64_t>(src.seeds[i]);
            const uint64_t first = static_cast<uint64_t>(src.indices[i]) * static_cast<uint64_t>(src.D) + j;
            philox_run(len, seed, head0, first, w0 + e, w1 + e);
            if (pixel_u) philox_run(len, seed, head1, first, u0 + e, u1 + e);
            if (U != nullptr && !src.per_pixel) {
                const float u = philox_uniform(seed, philox_counter(1, src.t, static_cast<uint64_t>(src.indices[i])));
                for (int m = 0; m < len; ++m) U[e + m] = u;
            }
            e += len;
            j = 0;
            ++i;
        }
    } else {
        // short samples: per-element keys and counters
        alignas(64) uint32_t k0[kBlock], k1[kBlock], c0[kBlock], c1[kBlock];
        for (int e = 0; e < n; ++e) {
            const uint64_t seed = static_cast<uint64_t>(src.seeds[i]);
            const uint64_t off = head0 | (static_cast<uint64_t>(src.indices[i]) * static_cast<uint64_t>(src.D) + j);
            k0[e] = static_cast<uint32_t>(seed);
            k1[e] = static_cast<uint32_t>(seed >> 32);
            c0[e] = static_cast<uint32_t>(off);
            c1[e] = static_cast<uint32_t>(off >> 32);
            if (U != nullptr && !src.per_pixel)
                U[e] = philox_uniform(seed, philox_counter(1, src.t, static_cast<uint64_t>(src.indices[i])));
            if (++j == src.D) {
                j = 0;
                ++i;
            }
        }
        philox_block(n, c0, c1, k0, k1, w0, w1);
        if (pixel_u) {
            const uint32_t stream1 = 1u << 24;  // stream 1 in the top byte of the counter's high word
            for (int e = 0; e < n; ++e) c1[e] |= stream1;
            philox_block(n, c0, c1, k0, k1, u0, u1);
        }
    }
    GMS_SIMD
    for (int e = 0; e < n; ++e) Z[e] = box_muller(w0[e], w1[e]);
    if (pixel_u) {
        GMS_SIMD
        for (int e = 0; e < n; ++e) U[e] = uint_to_uniform(u0[e]);
    }
}

// x = (u < w1 ? mu1 : mu2) + sqrt(max(s2, 0)) z, in double, rounded once (mixture.sample_mixture).
inline void mix_block(int n, const double* __restrict P1, const double* __restrict P2, const double* __restrict PS,
                      const float* __restrict Z, const float* __restrict U, float w1f, float* __restrict out) {
    GMS_SIMD
    for (int e = 0; e < n; ++e) {
        const double mu = U[e] < w1f ? P1[e] : P2[e];
        const double s2 = PS[e] > 0.0 ? PS[e] : 0.0;
        out[e] = static_cast<float>(mu + std::sqrt(s2) * static_cast<double>(Z[e]));
    }
}

inline void store_params(int n, const double* P1, const double* P2, const double* PS, float* mu1, float* mu2,
                         float* s2) {
    if (mu1 != nullptr)
        for (int e = 0; e < n; ++e) mu1[e] = static_cast<float>(P1[e]);
    if (mu2 != nullptr)
        for (int e = 0; e < n; ++e) mu2[e] = static_cast<float>(P2[e]);
    if (s2 != nullptr)
        for (int e = 0; e < n; ++e) s2[e] = static_cast<float>(PS[e]);
}

// ------------------------------------------------------------------------------------------
struct StepArgs {
    const float *x, *e1, *e2, *e3;
    float *out, *mu1, *mu2, *s2;
    NoiseSource noise;
    int mode;
    Coefs coefs;
    double var_cap, w1, var_floor;
    AdanConfig adan;
};

void fused_block(const StepArgs& A, int64_t e0, int n) {
    alignas(64) double M1[kBlock], VAR[kBlock], M3[kBlock];
    alignas(64) double P1[kBlock], P2[kBlock], PS[kBlock];
    alignas(64) float Z[kBlock], U[kBlock];
    const bool need_var = A.mode != kDenoise;
    const bool need_m3 = A.mode == kClosed || A.mode == kAdan;
    moments_dispatch(A.coefs, n, A.x + e0, A.e1 + e0, need_var ? A.e2 + e0 : nullptr,
                     need_m3 ? A.e3 + e0 : nullptr, M1, VAR, M3);
    float* out = A.out + e0;
    float* mu1 = A.mu1 ? A.mu1 + e0 : nullptr;
    float* mu2 = A.mu2 ? A.mu2 + e0 : nullptr;
    float* s2 = A.s2 ? A.s2 + e0 : nullptr;
    switch (A.mode) {
        case kDenoise: {
            for (int e = 0; e < n; ++e) {
                out[e] = static_cast<float>(M1[e]);
                PS[e] = 0.0;
            }
            store_params(n, M1, M1, PS, mu1, mu2, s2);
            return;
        }
        case kGaussian: {
            draw_block(A.noise, e0, n, Z, nullptr);
            const double cap = A.var_cap;
            GMS_SIMD
            for (int e = 0; e < n; ++e) {
                double v = VAR[e] > 0.0 ? VAR[e] : 0.0;
                v = v < cap ? v : cap;
                PS[e] = v;
                out[e] = static_cast<float>(M1[e] + std::sqrt(v) * static_cast<double>(Z[e]));
            }
            store_params(n, M1, M1, PS, mu1, mu2, s2);
            return;
        }
        case kClosed:  // (M3 is overwritten by kappa3)
            kappa3_block<true>(n, M1, VAR, M3, M3);
            closed_fit_block(n, M1, VAR, M3, A.w1, A.var_floor, P1, P2, PS);
            break;
        default:  // kAdan (M3 is overwritten by kappa3)
            adan_fit(A.adan, n, M1, VAR, M3, M3, P1, P2, PS);
            break;
    }
    draw_block(A.noise, e0, n, Z, U);
    mix_block(n, P1, P2, PS, Z, U, static_cast<float>(A.w1), out);
    store_params(n, P1, P2, PS, mu1, mu2, s2);
}

struct MixArgs {
    const float *mu1, *mu2, *s2;
    float* out;
    NoiseSource noise;
    double w1;
};

void mixture_block(const MixArgs& A, int64_t e0, int n) {
    alignas(64) double P1[kBlock], P2[kBlock], PS[kBlock];
    alignas(64) float Z[kBlock], U[kBlock];
    for (int e = 0; e < n; ++e) {
        P1[e] = A.mu1[e0 + e];
        P2[e] = A.mu2[e0 + e];
        PS[e] = A.s2[e0 + e];
    }
    draw_block(A.noise, e0, n, Z, U);
    mix_block(n, P1, P2, PS, Z, U, static_cast<float>(A.w1), A.out + e0);
}

// Runs fn(e0, n) over the blocks of [0, total), in parallel when OpenMP is there and the work is
// large enough to pay for waking threads.
template <typename Fn>
void for_blocks(int64_t total, int num_threads, int64_t min_parallel, const Fn& fn) {
    const int64_t nblocks = (total + kBlock - 1) / kBlock;
#ifdef _OPENMP
    const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && total >= min_parallel)
#endif
    for (int64_t blk = 0; blk < nblocks; ++blk) {
        const int64_t e0 = blk * kBlock;
        fn(e0, static_cast<int>(std::min<int64_t>(kBlock, total - e0)));
    }
    (void)num_threads;
    (void)min_parallel;
}

}  // namespace gms

#ifndef GMS_KERNELS_NO_PYTHON
namespace gms {

// ------------------------------------------------------------------------------------------
// Buffer helpers (the caller's arrays must stay alive: they are kept in `keep`).
using FloatIn = py::array_t<float, py::array::c_style | py::array::forcecast>;
using LongIn = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using ULongIn = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

const float* float_input(const py::object& obj, int64_t n, const char* name, std::vector<py::object>& keep,
                         bool required) {
    if (obj.is_none()) {
        if (required) throw std::invalid_argument(std::string(name) + " is required for this mode");
        return nullptr;
    }
    FloatIn arr = FloatIn::ensure(obj);
    if (!arr) throw std::invalid_argument(std::string(name) + " must be convertible to a float32 array");
    if (arr.size() != n)
        throw std::invalid_argument(std::string(name) + " has " + std::to_string(arr.size()) +
                                    " elements, expected " + std::to_string(n));
    keep.push_back(arr);
    return arr.data();
}

const int64_t* long_input(const py::object& obj, int64_t n, const char* name, std::vector<py::object>& keep) {
    LongIn arr = LongIn::ensure(obj);
    if (!arr) throw std::invalid_argument(std::string(name) + " must be convertible to an int64 array");
    if (arr.size() != n)
        throw std::invalid_argument(std::string(name) + " has " + std::to_string(arr.size()) +
                                    " elements, expected " + std::to_string(n));
    keep.push_back(arr);
    return arr.data();
}

float* float_output(const py::object& obj, int64_t n, const char* name, std::vector<py::object>& keep,
                    bool required) {
    if (obj.is_none()) {
        if (required) throw std::invalid_argument(std::string(name) + " is required");
        return nullptr;
    }
    if (!py::isinstance<py::array>(obj))
        throw std::invalid_argument(std::string(name) + " must be a writable float32 numpy array");
    py::array arr = py::reinterpret_borrow<py::array>(obj);
    if (!arr.dtype().is(py::dtype::of<float>()))
        throw std::invalid_argument(std::string(name) + " must have dtype float32");
    if (!(arr.flags() & py::array::c_style))
        throw std::invalid_argument(std::string(name) + " must be C-contiguous");
    if (!arr.writeable()) throw std::invalid_argument(std::string(name) + " must be writable");
    if (arr.size() != n)
        throw std::invalid_argument(std::string(name) + " has " + std::to_string(arr.size()) +
                                    " elements, expected " + std::to_string(n));
    keep.push_back(arr);
    return static_cast<float*>(arr.mutable_data());
}

NoiseSource make_noise(const py::object& seeds, const py::object& indices, int64_t N, int64_t D, int64_t t,
                       bool per_pixel, std::vector<py::object>& keep) {
    if (t < 0 || t >= (1 << 16)) throw std::invalid_argument("t must lie in [0, 65536)");
    NoiseSource src;
    src.seeds = long_input(seeds, N, "seeds", keep);
    src.indices = long_input(indices, N, "indices", keep);
    // every element index must fit below the time field of the counter (as SampleNoise checks)
    for (int64_t i = 0; i < N; ++i) {
        const int64_t idx = src.indices[i];
        if (idx < 0 || (D > 0 && idx >= (int64_t(1) << 40) / D))
            throw std::invalid_argument("sample indices must lie in [0, 2^40 / D) for the random-number counter");
    }
    src.D = D;
    src.t = static_cast<uint64_t>(t);
    src.per_pixel = per_pixel;
    return src;
}

void check_sizes(int64_t N, int64_t D) {
    if (N < 0 || D < 0) throw std::invalid_argument("N and D must be non-negative");
    if (D > 0 && N > INT64_MAX / D) throw std::invalid_argument("N * D overflows");
}

void fused_step_py(py::object x_t, py::object e1, py::object e2, py::object e3, py::object seeds, py::object indices,
                   py::object out, py::object mu1, py::object mu2, py::object s2, int64_t N, int64_t D, int mode,
                   int64_t t, double a_t, double sigma_t, double c1, double c2, double lam2, bool has_range,
                   double center, double half, double var_cap, double w1, double var_floor, std::vector<double> lrs,
                   double grad_scale, bool per_pixel, int num_threads, bool adan_fp64) {
    check_sizes(N, D);
    if (mode < kGaussian || mode > kDenoise) throw std::invalid_argument("unknown mode " + std::to_string(mode));
    if (has_range && !(half > 0.0)) throw std::invalid_argument("half must be positive with a data range");
    const int64_t total = N * D;
    std::vector<py::object> keep;
    StepArgs A{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, NoiseSource{},
               mode, Coefs(a_t, sigma_t, c1, c2, lam2, has_range, center, half), var_cap, w1, var_floor,
               AdanConfig{AdanConsts{w1, grad_scale}, {}}};
    A.x = float_input(x_t, total, "x_t", keep, true);
    A.e1 = float_input(e1, total, "e1", keep, true);
    A.e2 = float_input(e2, total, "e2", keep, mode != kDenoise);
    A.e3 = float_input(e3, total, "e3", keep, mode == kClosed || mode == kAdan);
    A.out = float_output(out, total, "out", keep, true);
    A.mu1 = float_output(mu1, total, "mu1", keep, false);
    A.mu2 = float_output(mu2, total, "mu2", keep, false);
    A.s2 = float_output(s2, total, "s2", keep, false);
    A.noise = make_noise(seeds, indices, N, D, t, per_pixel, keep);
    if (mode == kAdan) A.adan.iters = adan_iteration_coefs(lrs);
    A.adan.fp64 = adan_fp64;
    if (total == 0) return;
    py::gil_scoped_release release;
    // the ADAN fit is ~100x the work of the other modes per element
    const int64_t min_parallel = mode == kAdan && !lrs.empty() ? 2 * kBlock : 16 * kBlock;
    for_blocks(total, num_threads, min_parallel, [&](int64_t e0, int n) { fused_block(A, e0, n); });
}

void sample_mixture_py(py::object mu1, py::object mu2, py::object s2, py::object out, py::object seeds,
                       py::object indices, int64_t N, int64_t D, double w1, int64_t t, bool per_pixel,
                       int num_threads) {
    check_sizes(N, D);
    const int64_t total = N * D;
    std::vector<py::object> keep;
    MixArgs A{};
    A.mu1 = float_input(mu1, total, "mu1", keep, true);
    A.mu2 = float_input(mu2, total, "mu2", keep, true);
    A.s2 = float_input(s2, total, "s2", keep, true);
    A.out = float_output(out, total, "out", keep, true);
    A.noise = make_noise(seeds, indices, N, D, t, per_pixel, keep);
    A.w1 = w1;
    if (total == 0) return;
    py::gil_scoped_release release;
    for_blocks(total, num_threads, 16 * kBlock, [&](int64_t e0, int n) { mixture_block(A, e0, n); });
}

// Seeds and offsets are read as uint64 (int64 arrays are reinterpreted, two's complement);
// `seeds` holds one seed or one per offset. Results have the shape of `offsets`.
struct KeyedOffsets {
    ULongIn seeds, offsets;
    int64_t n;
    bool one_seed;
};

KeyedOffsets keyed_offsets(const py::object& seeds, const py::object& offsets) {
    KeyedOffsets k{ULongIn::ensure(seeds), ULongIn::ensure(offsets), 0, false};
    if (!k.seeds || !k.offsets) throw std::invalid_argument("seeds and offsets must be integer arrays or scalars");
    k.n = k.offsets.size();
    k.one_seed = k.seeds.size() == 1;
    if (!k.one_seed && k.seeds.size() != k.n)
        throw std::invalid_argument("seeds must hold one seed or one per offset");
    return k;
}

std::vector<py::ssize_t> shape_of(const py::array& a) { return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()); }

py::array_t<uint32_t> philox_py(py::object seeds, py::object offsets) {
    KeyedOffsets k = keyed_offsets(seeds, offsets);
    std::vector<py::ssize_t> shape = shape_of(k.offsets);
    shape.push_back(4);
    py::array_t<uint32_t> result(shape);
    uint32_t* r = result.mutable_data();
    const uint64_t* s = k.seeds.data();
    const uint64_t* o = k.offsets.data();
    for (int64_t i = 0; i < k.n; ++i) {
        const uint64_t seed = s[k.one_seed ? 0 : i];
        uint32_t c0 = static_cast<uint32_t>(o[i]), c1 = static_cast<uint32_t>(o[i] >> 32), c2 = 0, c3 = 0;
        philox4x32_10(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
        r[4 * i] = c0;
        r[4 * i + 1] = c1;
        r[4 * i + 2] = c2;
        r[4 * i + 3] = c3;
    }
    return result;
}

py::array_t<uint32_t> philox_raw_py(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
    philox4x32_10(c0, c1, c2, c3, k0, k1);
    py::array_t<uint32_t> result(4);
    uint32_t* r = result.mutable_data();
    r[0] = c0;
    r[1] = c1;
    r[2] = c2;
    r[3] = c3;
    return result;
}

template <bool NORMAL>
py::array_t<float> draw_py(py::object seeds, py::object offsets) {
    KeyedOffsets k = keyed_offsets(seeds, offsets);
    py::array_t<float> result(shape_of(k.offsets));
    float* r = result.mutable_data();
    const uint64_t* s = k.seeds.data();
    const uint64_t* o = k.offsets.data();
    for (int64_t i = 0; i < k.n; ++i) {
        const uint64_t seed = s[k.one_seed ? 0 : i];
        r[i] = NORMAL ? philox_normal(seed, o[i]) : philox_uniform(seed, o[i]);
    }
    return result;
}

py::tuple moments_py(py::object x_t, py::object e1, py::object e2, py::object e3, double a_t, double sigma_t,
                     double c1, double c2, double lam2, bool has_range, double center, double half) {
    std::vector<py::object> keep;
    FloatIn xa = FloatIn::ensure(x_t);
    if (!xa) throw std::invalid_argument("x_t must be convertible to a float32 array");
    const int64_t total = xa.size();
    const float* x = float_input(xa, total, "x_t", keep, true);
    const float* h1 = float_input(e1, total, "e1", keep, true);
    const float* h2 = float_input(e2, total, "e2", keep, false);
    const float* h3 = h2 ? float_input(e3, total, "e3", keep, false) : nullptr;
    const Coefs k(a_t, sigma_t, c1, c2, lam2, has_range, center, half);
    py::array_t<double> m1(total), var(total), m3(total);
    double* pm1 = m1.mutable_data();
    double* pvar = var.mutable_data();
    double* pm3 = m3.mutable_data();
    for (int64_t e0 = 0; e0 < total; e0 += kBlock) {
        const int n = static_cast<int>(std::min<int64_t>(kBlock, total - e0));
        moments_dispatch(k, n, x + e0, h1 + e0, h2 ? h2 + e0 : nullptr, h3 ? h3 + e0 : nullptr, pm1 + e0,
                         pvar + e0, pm3 + e0);
    }
    return py::make_tuple(m1, h2 ? py::object(var) : py::none(), h3 ? py::object(m3) : py::none());
}

py::dict build_info() {
    py::dict d;
#ifdef _OPENMP
    d["openmp"] = true;
    d["max_threads"] = omp_get_max_threads();
#else
    d["openmp"] = false;
    d["max_threads"] = 1;
#endif
#if defined(__AVX512F__)
    d["isa"] = "avx512";
#elif defined(__AVX2__)
    d["isa"] = "avx2";
#elif defined(__SSE2__)
    d["isa"] = "sse2";
#else
    d["isa"] = "generic";
#endif
    d["block"] = kBlock;
    return d;
}

}  // namespace gms

PYBIND11_MODULE(_C, m) {
    using namespace pybind11::literals;
    m.doc() = "gms_kernels._C: fused Gaussian Mixture Solver step on CPU (torch-free, raw float32 buffers).";
    m.attr("MODE_GAUSSIAN") = static_cast<int>(gms::kGaussian);
    m.attr("MODE_CLOSED") = static_cast<int>(gms::kClosed);
    m.attr("MODE_ADAN") = static_cast<int>(gms::kAdan);
    m.attr("MODE_DENOISE") = static_cast<int>(gms::kDenoise);
    m.def("fused_step", &gms::fused_step_py,
          "One fused GMS step over flattened float32 [N*D] buffers (see gms_kernels.kernels). "
          "e2/e3 may be None where the mode does not read them; mu1/mu2/s2 None skips writing them.",
          "x_t"_a, "e1"_a, "e2"_a, "e3"_a, "seeds"_a, "indices"_a, "out"_a, "mu1"_a, "mu2"_a, "s2"_a, "N"_a,
          "D"_a, "mode"_a, "t"_a, "a_t"_a, "sigma_t"_a, "c1"_a, "c2"_a, "lam2"_a, "has_range"_a, "center"_a,
          "half"_a, "var_cap"_a, "w1"_a, "var_floor"_a, "lrs"_a, "grad_scale"_a, "per_pixel"_a,
          "num_threads"_a = 0, "adan_fp64"_a = false);
    m.def("sample_mixture", &gms::sample_mixture_py,
          "out = (u < w1 ? mu1 : mu2) + sqrt(max(s2, 0)) z with the Philox streams of step t.", "mu1"_a, "mu2"_a,
          "s2"_a, "out"_a, "seeds"_a, "indices"_a, "N"_a, "D"_a, "w1"_a, "t"_a, "per_pixel"_a,
          "num_threads"_a = 0);
    m.def("philox", &gms::philox_py,
          "Philox4x32-10 words for key = seed, counter = (offset lo, offset hi, 0, 0): uint32 [..., 4]. "
          "seeds: one seed or one per offset (uint64 / int64 bits).",
          "seeds"_a, "offsets"_a);
    m.def("philox_raw", &gms::philox_raw_py, "Philox4x32-10 of an explicit counter (c0..c3) and key (k0, k1).",
          "c0"_a, "c1"_a, "c2"_a, "c3"_a, "k0"_a, "k1"_a);
    m.def("uniform", &gms::draw_py<false>, "tl.rand: float32 uniforms (seeds: one or one per offset).", "seeds"_a,
          "offsets"_a);
    m.def("normal", &gms::draw_py<true>, "tl.randn: float32 normals (seeds: one or one per offset).", "seeds"_a,
          "offsets"_a);
    m.def("transition_moments", &gms::moments_py,
          "(M1, Var, M3) in float64 as the fused step computes them (Var/M3 None without e2/e3).", "x_t"_a, "e1"_a,
          "e2"_a, "e3"_a, "a_t"_a, "sigma_t"_a, "c1"_a, "c2"_a, "lam2"_a, "has_range"_a, "center"_a, "half"_a);
    m.def("build_info", &gms::build_info, "How this extension was built (OpenMP, vector ISA, block size).");
}
#endif  // GMS_KERNELS_NO_PYTHON
