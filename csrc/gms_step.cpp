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
// so that the compiler vectorises them; with AVX-512 the moments, the closed-form fit, the
// normals and the mixture draw are hand-vectorised instead (namespace v8, philox.h), each
// element read once from memory and its outputs written once.
//
// x_t and the heads are N samples of D float32 each, consecutive samples `stride` elements apart
// (stride D: flat arrays; 3 D: heads sliced out of one [N, 3C, ...] model output), so that the
// launcher can pass views instead of copies. Outputs are flat [N * D].
//
// Inputs are read completely (per block) before that block's outputs are written, so `out` may
// alias a flat `x_t` (an in-place step).

#ifndef GMS_KERNELS_NO_PYTHON  // (defined by C++-only benchmarks that include this file)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "philox.h"

#ifndef GMS_KERNELS_NO_PYTHON
namespace py = pybind11;
#endif

// The moment formulas are evaluated without fused multiply-adds, in the torch reference's order,
// so that M1, Var and M3 come out bit-identical to the float64 reference (kappa3 is a difference of
// nearly equal numbers, and the closed-form fit's delta is steep near kappa3 = 0, with a slope
// bounded by its knee: identical inputs keep rounding differences out of the way).
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

#if defined(__GNUC__)
#define GMS_INLINE inline __attribute__((always_inline))
#else
#define GMS_INLINE inline
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
// fit.SKEW_KNEE: below this standardized skewness |kappa3| / Var^1.5 the closed fit's delta is the
// straight line through 0 that meets the cube root there (see fit.fit_closed)
constexpr double kSkewKnee = 1e-2;

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
    bool unit_range;  // the range [-1, 1]: center 0 and half-width 1 (see moments8)
    // x0_moments
    double r_sq, two_sigma, sigma_sq, a_sq, three_sigma, three_sigma_sq, sigma_cube, a_cube;
    // clamp_x0_moments
    double h_sq, h_cube, c_c, two_c, three_c, three_c_c, c_cube, two_c_h, h_h, three_c_c_h, three_c_h_h;
    // transition moments
    double c2_sq, c2_cube, three_lam2;
    // reciprocals of the divisors (for div_exact)
    double inv_a, inv_a_sq, inv_a_cube, inv_half, inv_h_sq, inv_h_cube;

    Coefs(double a, double s, double c1_, double c2_, double lam2_, bool rng, double c, double h)
        : a_t(a), sigma_t(s), c1(c1_), c2(c2_), lam2(lam2_), has_range(rng), center(c), half(h),
          unit_range(rng && c == 0.0 && h == 1.0) {
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

#ifdef GMS_AVX512
// ------------------------------------------------------------------------------------------
// AVX-512 forms of the per-element work, 8 doubles per vector, written with intrinsics so that
// the clamps are single min/max instructions and the selects are mask blends (the compiler's
// own vectorisation of the loops above turns some of them into masked arithmetic and keeps
// twice the instructions). A partial last vector is processed with masked loads and stores, so
// every element goes through the same instructions wherever it sits in a block.
//
// The moments are the operations of moments_block in the same order, with the same exact
// divisions (div_exact), and the functions that contain them are compiled without fma
// contraction (intrinsics are ordinary arithmetic to the compiler and would otherwise be
// contracted): M1, Var and M3 stay bit-identical to the float64 reference.
namespace v8 {
using V = __m512d;
inline V bc(double x) { return _mm512_set1_pd(x); }
inline V add(V a, V b) { return _mm512_add_pd(a, b); }
inline V sub(V a, V b) { return _mm512_sub_pd(a, b); }
inline V mul(V a, V b) { return _mm512_mul_pd(a, b); }
inline V div_exact(V x, V d, V inv_d) {  // as gms::div_exact
    const V q = mul(x, inv_d);
    return _mm512_fmadd_pd(_mm512_fnmadd_pd(q, d, x), inv_d, q);
}
inline V clamp(V v, V lo, V hi) {  // clampd: max(v, lo) is (v > lo ? v : lo), min likewise
    return _mm512_min_pd(_mm512_max_pd(v, lo), hi);
}
inline __mmask8 tail_mask(int left) {
    return left >= 8 ? __mmask8(0xFF) : left <= 0 ? __mmask8(0) : __mmask8((1u << left) - 1u);
}
inline V load(const float* p, __mmask8 m) { return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p)); }
inline void store(float* p, __mmask8 m, V v) { _mm256_mask_storeu_ps(p, m, _mm512_cvtpd_ps(v)); }

// RANGE: 0 no data range, 1 a data range, 2 the range [-1, 1]. With center 0 and half-width 1
// the affine maps of clamp_x0_moments are identities in IEEE arithmetic (x - 0 = x, x / 1 = x,
// 0 + 1 * y = y, 0 * y = +-0), except that an exact zero may come out as +0 instead of -0 (and
// an infinite input may give a different result where 0 * inf is NaN): the moments are the same
// numbers as the general form, without its ~35 operations per element.
template <bool HAS_VAR, bool HAS_M3, int RANGE>
GMS_NO_FMA_FN GMS_INLINE void moments8(const Coefs& k, V x, V e1, V e2, V e3, V& M1, V& VAR, V& M3) {
    GMS_NO_FMA_BEGIN
    const V zero = _mm512_setzero_pd(), one = bc(1.0), minus_one = bc(-1.0);
    const V xx = mul(x, x);
    // x0_moments
    const V mean = div_exact(sub(x, mul(bc(k.sigma_t), e1)), bc(k.a_t), bc(k.inv_a));
    V var0 = zero, m2 = zero, m3 = zero;
    if (HAS_VAR) {
        var0 = mul(bc(k.r_sq), sub(e2, mul(e1, e1)));
        m2 = div_exact(add(sub(xx, mul(mul(bc(k.two_sigma), x), e1)), mul(bc(k.sigma_sq), e2)), bc(k.a_sq),
                       bc(k.inv_a_sq));
    }
    if (HAS_M3) {
        const V num = sub(add(sub(mul(xx, x), mul(mul(bc(k.three_sigma), xx), e1)), mul(mul(bc(k.three_sigma_sq), x), e2)),
                          mul(bc(k.sigma_cube), e3));
        m3 = div_exact(num, bc(k.a_cube), bc(k.inv_a_cube));
    }
    // clamp_x0_moments
    V mean_c = mean, var_c = var0, m2_c = m2, m3_c = m3;
    if (RANGE == 2) {
        const V mean_y = clamp(mean, minus_one, one);
        mean_c = mean_y;
        if (HAS_VAR) {
            var_c = clamp(var0, zero, one);
            m2_c = clamp(m2, zero, one);
            if (HAS_M3) {
                const __mmask8 wide = _mm512_cmp_pd_mask(_mm512_abs_pd(m3), _mm512_abs_pd(mean_y), _CMP_GT_OQ);
                m3_c = clamp(_mm512_mask_blend_pd(wide, m3, mean_y), minus_one, one);
            }
        }
    } else if (RANGE == 1) {
        const V mean_y = clamp(div_exact(sub(mean, bc(k.center)), bc(k.half), bc(k.inv_half)), minus_one, one);
        mean_c = add(bc(k.center), mul(bc(k.half), mean_y));
        if (HAS_VAR) {
            var_c = mul(clamp(div_exact(var0, bc(k.h_sq), bc(k.inv_h_sq)), zero, one), bc(k.h_sq));
            const V m2_y = clamp(div_exact(add(sub(m2, mul(bc(k.two_c), mean)), bc(k.c_c)), bc(k.h_sq), bc(k.inv_h_sq)),
                                 zero, one);
            m2_c = add(add(bc(k.c_c), mul(bc(k.two_c_h), mean_y)), mul(bc(k.h_h), m2_y));
            if (HAS_M3) {
                V m3_y = div_exact(sub(add(sub(m3, mul(bc(k.three_c), m2)), mul(bc(k.three_c_c), mean)), bc(k.c_cube)),
                                   bc(k.h_cube), bc(k.inv_h_cube));
                const __mmask8 wide = _mm512_cmp_pd_mask(_mm512_abs_pd(m3_y), _mm512_abs_pd(mean_y), _CMP_GT_OQ);
                m3_y = clamp(_mm512_mask_blend_pd(wide, m3_y, mean_y), minus_one, one);
                m3_c = add(add(add(bc(k.c_cube), mul(bc(k.three_c_c_h), mean_y)), mul(bc(k.three_c_h_h), m2_y)),
                           mul(bc(k.h_cube), m3_y));
            }
        }
    }
    const V m1 = add(mul(bc(k.c1), x), mul(bc(k.c2), mean_c));
    M1 = m1;
    if (HAS_VAR) {
        V var = add(bc(k.lam2), mul(bc(k.c2_sq), var_c));
        VAR = var;
    }
    if (HAS_M3) {
        const V three = bc(3.0);
        const V c1x = mul(bc(k.c1), x);
        const V c1x2 = mul(c1x, c1x);
        const V cube = add(add(add(mul(c1x2, c1x), mul(mul(mul(three, c1x2), bc(k.c2)), mean_c)),
                               mul(mul(mul(three, c1x), bc(k.c2_sq)), m2_c)),
                           mul(bc(k.c2_cube), m3_c));
        M3 = add(cube, mul(bc(k.three_lam2), m1));
    }
}

template <bool HAS_VAR, bool HAS_M3, int RANGE>
GMS_NO_FMA_FN void moments_block(const Coefs& k, int n, const float* __restrict x_in, const float* __restrict e1_in,
                                 const float* __restrict e2_in, const float* __restrict e3_in, double* __restrict M1,
                                 double* __restrict VAR, double* __restrict M3) {
    GMS_NO_FMA_BEGIN
    const V zero = _mm512_setzero_pd();
    for (int i = 0; i < n; i += 8) {
        const __mmask8 m = tail_mask(n - i);
        V m1, var = zero, m3 = zero;
        moments8<HAS_VAR, HAS_M3, RANGE>(k, load(x_in + i, m), load(e1_in + i, m),
                                         HAS_VAR ? load(e2_in + i, m) : zero, HAS_M3 ? load(e3_in + i, m) : zero, m1,
                                         var, m3);
        _mm512_mask_storeu_pd(M1 + i, m, m1);
        if (HAS_VAR) _mm512_mask_storeu_pd(VAR + i, m, var);
        if (HAS_M3) _mm512_mask_storeu_pd(M3 + i, m, m3);
    }
}

// The helpers below work on W independent vectors at once, statement by statement (GMS_EACH),
// so that the instruction stream interleaves W dependency chains: the cube root is a chain of
// ~15 dependent operations (4-cycle latency each), and one chain per loop iteration leaves the
// out-of-order window (its scheduler in particular) too few independent operations to keep
// both vector ports busy.
#define GMS_EACH for (int j = 0; j < W; ++j)

// cbrt_vec on W x 8 lanes (the same method, with fma, and three Newton steps for y instead of
// four: their errors are 3.5e-2 -> 2.5e-3 -> 1.3e-5 -> 3e-10, and the last step, on c, squares that)
template <int W>
GMS_INLINE void cbrt_w(const V* v, V* out) {
    const V zero = _mm512_setzero_pd(), third = bc(1.0 / 3.0), four_thirds = bc(4.0 / 3.0);
    V a[W], y[W], a_third[W], c[W], y2[W];
    __mmask8 tiny[W];
    GMS_EACH {
        a[j] = _mm512_abs_pd(v[j]);
        tiny[j] = _mm512_cmp_pd_mask(a[j], bc(0x1p-900), _CMP_LT_OQ);
        a[j] = _mm512_mask_mul_pd(a[j], tiny[j], a[j], bc(0x1p600));
    }
    // high word of a^(-1/3): 0x553EF0FF - hi / 3, with hi / 3 = (hi * 0xAAAAAAAB) >> 33 for 32-bit hi
    GMS_EACH {
        const __m512i hi = _mm512_srli_epi64(_mm512_castpd_si512(a[j]), 32);
        const __m512i hi_third = _mm512_srli_epi64(_mm512_mul_epu32(hi, _mm512_set1_epi64(0xAAAAAAABll)), 33);
        y[j] = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_sub_epi64(_mm512_set1_epi64(0x553EF0FFll), hi_third), 32));
        a_third[j] = mul(a[j], third);
    }
    for (int it = 0; it < 3; ++it) GMS_EACH y[j] = mul(y[j], _mm512_fnmadd_pd(a_third[j], mul(mul(y[j], y[j]), y[j]), four_thirds));
    GMS_EACH {
        y2[j] = mul(y[j], y[j]);
        c[j] = mul(a[j], y2[j]);
    }
    GMS_EACH c[j] = _mm512_fnmadd_pd(_mm512_fmsub_pd(mul(c[j], c[j]), c[j], a[j]), mul(y2[j], third), c[j]);  // c - (c^3 - a) y^2 / 3
    GMS_EACH {
        c[j] = _mm512_mask_mul_pd(c[j], tiny[j], c[j], bc(0x1p-200));
        c[j] = _mm512_mask_mov_pd(c[j], _mm512_cmp_pd_mask(a[j], zero, _CMP_EQ_OQ), zero);
        c[j] = _mm512_mask_mov_pd(c[j], _mm512_cmp_pd_mask(a[j], bc(HUGE_VAL), _CMP_EQ_OQ), a[j]);
        out[j] = _mm512_or_pd(c[j], _mm512_and_pd(v[j], bc(-0.0)));  // the sign of v
    }
}

// sqrt(s) for s >= 0 (or NaN) without vsqrtpd, which is slow and poorly pipelined on 512-bit
// vectors (one per ~14 cycles here): s r with r ~ 1/sqrt(s) from vrsqrt14pd (2^-14, any
// positive finite s, subnormals included) and Newton steps: ONE leaves ~2^-28 (enough for a
// value that is rounded to float32 after scaling a float32), two ~2^-54 (a few ulp at most).
// 0, +inf and NaN come back as they are.
template <int W, bool TWO_STEPS>
GMS_INLINE void sqrt_w(const V* s, V* out) {
    const V one = bc(1.0), half = bc(0.5);
    V r[W], q[W], h[W];
    GMS_EACH {
        r[j] = _mm512_rsqrt14_pd(s[j]);
        q[j] = mul(s[j], r[j]);                               // ~sqrt(s)
    }
    GMS_EACH h[j] = mul(_mm512_fnmadd_pd(q[j], r[j], one), half);  // (1 - s r^2) / 2
    if (TWO_STEPS) {
        GMS_EACH {
            r[j] = _mm512_fmadd_pd(r[j], h[j], r[j]);
            q[j] = _mm512_fmadd_pd(q[j], h[j], q[j]);
        }
        GMS_EACH h[j] = mul(_mm512_fnmadd_pd(q[j], r[j], one), half);
    }
    GMS_EACH {
        const __mmask8 regular = _mm512_cmp_pd_mask(s[j], _mm512_setzero_pd(), _CMP_GT_OQ) &
                                 _mm512_cmp_pd_mask(s[j], bc(HUGE_VAL), _CMP_LT_OQ);
        out[j] = _mm512_mask_blend_pd(regular, s[j], _mm512_fmadd_pd(q[j], h[j], q[j]));
    }
}

// mixture draw of 8 elements: (u < w1 ? mu1 : mu2) + sd z in double, rounded once
GMS_NO_FMA_FN GMS_INLINE __m256 mix8(V p1, V p2, V sd, __m256 z, __m256 u, __m256 w1f) {
    GMS_NO_FMA_BEGIN
    const __mmask8 first = _mm256_cmp_ps_mask(u, w1f, _CMP_LT_OQ);
    const V mu = _mm512_mask_blend_pd(first, p2, p1);
    return _mm512_cvtpd_ps(add(mu, mul(sd, _mm512_cvtps_pd(z))));
}
}  // namespace v8
#endif  // GMS_AVX512

template <bool HAS_VAR, bool HAS_M3>
void moments_dispatch_range(const Coefs& k, int n, const float* x, const float* e1, const float* e2, const float* e3,
                            double* M1, double* VAR, double* M3) {
#ifdef GMS_AVX512
    if (k.unit_range)
        v8::moments_block<HAS_VAR, HAS_M3, 2>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else if (k.has_range)
        v8::moments_block<HAS_VAR, HAS_M3, 1>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else
        v8::moments_block<HAS_VAR, HAS_M3, 0>(k, n, x, e1, e2, e3, M1, VAR, M3);
#else
    if (k.has_range)
        moments_block<HAS_VAR, HAS_M3, true>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else
        moments_block<HAS_VAR, HAS_M3, false>(k, n, x, e1, e2, e3, M1, VAR, M3);
#endif
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

// fit.knee_delta2: (kSkewKnee / |w1 w2 (w2 - w1)|)^(2/3), formed like it (the same libm pow), and
// kept per thread for the last denominator (ClosedConsts is made per block: a pow per block of
// 256 elements cost the closed step ~4%)
inline double knee_delta2(double denom) {
    static thread_local double last_denom = 0.0, last_knee2 = 0.0;
    if (denom != last_denom) {
        last_knee2 = denom == 0.0 ? 0.0 : std::pow(kSkewKnee / std::fabs(denom), 2.0 / 3.0);
        last_denom = denom;
    }
    return last_knee2;
}

// fit.fit_closed in double: (M1, Var, M3) match with the variance floor and the knee near zero
// skew. K3 holds kappa3 (from kappa3_block<true>). The two divisions of the reference are exact
// divisions (div_exact).
struct ClosedConsts {
    double w1, w2, w12, denom, inv_denom, inv_w12, var_floor, knee2;
    ClosedConsts(double w1_, double var_floor_) : w1(w1_), w2(1.0 - w1_), var_floor(var_floor_) {
        w12 = w1 * w2;
        denom = w12 * (w2 - w1);
        inv_denom = 1.0 / denom;
        inv_w12 = 1.0 / w12;
        knee2 = knee_delta2(denom);
    }
};

inline void closed_fit_block(int n, const double* __restrict M1, const double* __restrict VAR,
                             const double* __restrict K3, const ClosedConsts& c, double* __restrict P1,
                             double* __restrict P2, double* __restrict PS) {
    const double w1 = c.w1, w2 = c.w2, w12 = c.w12, denom = c.denom, inv_denom = c.inv_denom, inv_w12 = c.inv_w12;
    const double var_floor = c.var_floor;
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        const double m1 = M1[i];
        const double var = VAR[i] < 0.0 ? 0.0 : VAR[i];
        const double q = div_exact(K3[i], denom, inv_denom);
        double delta = cbrt_vec(q);
        // below the knee (|delta| < knee_delta, i.e. |kappa3| / Var^1.5 < kSkewKnee): q / knee_delta^2
        const double knee2 = c.knee2 * var;
        delta = delta * delta < knee2 ? q / knee2 : delta;  // (false for Var = 0 and for NaN)
        double s2 = var - w12 * (delta * delta);
        const double floor = var_floor * var;
        const bool too_skewed = s2 < floor;
        s2 = too_skewed ? floor : s2;
        const double room = var - floor;
        const double max_delta = std::sqrt(div_exact(room < 0.0 ? 0.0 : room, w12, inv_w12));
        const double sgn = delta > 0.0 ? 1.0 : (delta < 0.0 ? -1.0 : 0.0);
        delta = too_skewed ? sgn * max_delta : delta;
        P1[i] = m1 + w2 * delta;
        P2[i] = m1 - w1 * delta;
        PS[i] = s2;
    }
}

#ifdef GMS_AVX512
namespace v8 {
// kappa3_block<true> + closed_fit_block on W x 8 lanes, branch-free (a too-skewed lane is in
// most vectors of typical inputs). One square root serves both the floor branch and the draw:
// sq = sqrt(skewed ? Var : s2); a skewed element has s2 = var_floor Var, so its standard
// deviation is sq sqrt(var_floor) and its |delta| = sqrt((Var - floor) / (w1 w2)) is
// sq sqrt((1 - var_floor) / (w1 w2)) (equal in exact arithmetic; within a few ulp here).
struct ClosedVecConsts {
    V w1, w2, w12, denom, inv_denom, var_floor, sd_floor, delta_floor, knee2;
    explicit ClosedVecConsts(const ClosedConsts& c)
        : w1(bc(c.w1)), w2(bc(c.w2)), w12(bc(c.w12)), denom(bc(c.denom)), inv_denom(bc(c.inv_denom)),
          var_floor(bc(c.var_floor)), sd_floor(bc(std::sqrt(c.var_floor))),
          delta_floor(bc(std::sqrt((1.0 - c.var_floor) / c.w12))), knee2(bc(c.knee2)) {}
};

template <int W>
GMS_NO_FMA_FN GMS_INLINE void closed_fit_w(const ClosedVecConsts& c, const V* m1, const V* var_in, const V* m3, V* p1,
                                       V* p2, V* ps, V* sd) {
    GMS_NO_FMA_BEGIN
    const V zero = _mm512_setzero_pd();
    V var[W], t[W], delta[W], s2[W], floor[W], sq[W], knee2[W], line[W];
    __mmask8 skewed[W], below[W], tiny_knee = 0;
    GMS_EACH {
        var[j] = _mm512_max_pd(zero, var_in[j]);  // (var < 0 ? 0 : var), NaN kept
        const V k3 = sub(sub(m3[j], mul(mul(bc(3.0), m1[j]), var[j])), mul(mul(m1[j], m1[j]), m1[j]));
        t[j] = div_exact(k3, c.denom, c.inv_denom);
    }
    // the straight line below the knee (as closed_fit_block), q / knee2 with knee2 = knee_delta^2 Var,
    // formed before the cube root (it does not need it: the out-of-order core overlaps the two
    // chains) and without a division (vdivpd is slow and poorly pipelined, and early steps have
    // every lane below the knee): r ~ 1/knee2 from vrcp14pd and one Newton step (2^-14 -> 2^-28),
    // then y = q r and one residual step, y + (q - y knee2) r, which leaves ~2^-56 (about an ulp).
    GMS_EACH {
        knee2[j] = mul(c.knee2, var[j]);
        V r = _mm512_rcp14_pd(knee2[j]);
        r = mul(r, _mm512_fnmadd_pd(knee2[j], r, bc(2.0)));
        const V y = mul(t[j], r);
        line[j] = _mm512_fmadd_pd(_mm512_fnmadd_pd(y, knee2[j], t[j]), r, y);
    }
    cbrt_w<W>(t, delta);
    GMS_EACH {
        below[j] = _mm512_cmp_pd_mask(mul(delta[j], delta[j]), knee2[j], _CMP_LT_OQ);  // (false for NaN)
        delta[j] = _mm512_mask_mov_pd(delta[j], below[j], line[j]);
        tiny_knee |= _mm512_mask_cmp_pd_mask(below[j], knee2[j], bc(0x1p-1000), _CMP_LT_OQ);
    }
    if (tiny_knee) {  // knee2 under 2^-1000 (Var ~ 1e-301), whose reciprocal could overflow: divide
        GMS_EACH {
            const __mmask8 tiny = _mm512_mask_cmp_pd_mask(below[j], knee2[j], bc(0x1p-1000), _CMP_LT_OQ);
            delta[j] = _mm512_mask_div_pd(delta[j], tiny, t[j], knee2[j]);
        }
    }
    GMS_EACH {
        s2[j] = sub(var[j], mul(c.w12, mul(delta[j], delta[j])));
        floor[j] = mul(c.var_floor, var[j]);
        skewed[j] = _mm512_cmp_pd_mask(s2[j], floor[j], _CMP_LT_OQ);
        s2[j] = _mm512_mask_blend_pd(skewed[j], s2[j], floor[j]);
        t[j] = _mm512_mask_blend_pd(skewed[j], s2[j], var[j]);
    }
    sqrt_w<W, true>(t, sq);
    GMS_EACH {
        // sign(delta) * max_delta: the sign of delta, 0 where delta is 0
        const V signed_max = _mm512_or_pd(mul(sq[j], c.delta_floor), _mm512_and_pd(delta[j], bc(-0.0)));
        const __mmask8 nonzero = _mm512_cmp_pd_mask(delta[j], zero, _CMP_NEQ_OQ);
        delta[j] = _mm512_mask_mov_pd(delta[j], skewed[j], _mm512_maskz_mov_pd(nonzero, signed_max));
        sd[j] = _mm512_mask_mul_pd(sq[j], skewed[j], sq[j], c.sd_floor);
        p1[j] = add(m1[j], mul(c.w2, delta[j]));
        p2[j] = sub(m1[j], mul(c.w1, delta[j]));
        ps[j] = s2[j];
    }
}

// The closed-form fit and the mixture draw of n elements whose moments are in M1, VAR, M3
// (double, L1-resident) and whose random numbers are in Z, U. The moments are a separate loop:
// the cube root is a chain of ~15 dependent operations after the ~25 of the moments, and a loop
// body with both keeps too few vectors in flight in the out-of-order window.
template <int W = 8>
GMS_NO_FMA_FN inline void closed_fit_mix(const ClosedConsts& cs, int n, const double* __restrict M1,
                                         const double* __restrict VAR, const double* __restrict M3,
                                         const float* __restrict Z, const float* __restrict U, float* out,
                                         float* __restrict mu1, float* __restrict mu2, float* __restrict s2) {
    GMS_NO_FMA_BEGIN
    const ClosedVecConsts c(cs);
    const __m256 w1f = _mm256_set1_ps(static_cast<float>(cs.w1));
    for (int i = 0; i < n; i += 8 * W) {
        __mmask8 m[W];
        V m1[W], var[W], m3[W], p1[W], p2[W], ps[W], sd[W];
        GMS_EACH {
            m[j] = tail_mask(n - i - 8 * j);  // (0 past the end: the lane group is computed on zeros, not stored)
            m1[j] = _mm512_maskz_loadu_pd(m[j], M1 + i + 8 * j);
            var[j] = _mm512_maskz_loadu_pd(m[j], VAR + i + 8 * j);
            m3[j] = _mm512_maskz_loadu_pd(m[j], M3 + i + 8 * j);
        }
        closed_fit_w<W>(c, m1, var, m3, p1, p2, ps, sd);
        GMS_EACH {
            const int e = i + 8 * j;
            if (mu1 != nullptr) store(mu1 + e, m[j], p1[j]);
            if (mu2 != nullptr) store(mu2 + e, m[j], p2[j]);
            if (s2 != nullptr) store(s2 + e, m[j], ps[j]);
            const __m256 x_s = mix8(p1[j], p2[j], sd[j], _mm256_maskz_loadu_ps(m[j], Z + e),
                                    _mm256_maskz_loadu_ps(m[j], U + e), w1f);
            _mm256_mask_storeu_ps(out + e, m[j], x_s);
        }
    }
}
}  // namespace v8
#endif  // GMS_AVX512

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
// In AVX-512 instructions that is about 70 per 16 lanes: ~66 on the FMA units (the divisions are
// reciprocal estimates refined by a Newton step, below) and 3 square roots on the divider, which
// runs beside them. Memory is not the bound (21 arrays read and 15 written per iteration, all in
// L1). benchmarks/results/cpu.md measures both units' rates and how close the loop comes.
//
// The formulas are written once, over a "pack" P of lanes: T itself in the portable loop (which
// the compiler vectorises), or one AVX-512 register of 16 floats in the software-pipelined loop
// below. Each iteration has two stages per pack: adan_gradient_step (residuals, gradients and the
// moment updates: FMA work) and adan_update (square roots and divisions: divider work).
//
// Each array is padded by 64 bytes so that the 21 streams do not all sit at the same offset
// modulo 4 KiB (which can make the CPU stall loads behind unrelated stores: "4K aliasing"); the
// padding also holds the lanes of a last partial AVX-512 register (kept at benign zeros).
constexpr int kAdanLanes = 16;
constexpr int kAdanStride = (kBlock + kAdanLanes - 1) / kAdanLanes * kAdanLanes + 64 / 4;

template <typename T>
struct AdanBlock {
    alignas(64) T a[kAdanStride], b[kAdanStride], be[kAdanStride];     // parameters (a, b relative to M1)
    alignas(64) T ma[kAdanStride], mb[kAdanStride], mbe[kAdanStride];  // m'
    alignas(64) T va[kAdanStride], vb[kAdanStride], vbe[kAdanStride];  // v'
    alignas(64) T na[kAdanStride], nb[kAdanStride], nbe[kAdanStride];  // n'
    alignas(64) T ga[kAdanStride], gb[kAdanStride], gbe[kAdanStride];  // previous P
    alignas(64) T M[kAdanStride], M2[kAdanStride], M3x[kAdanStride];   // M1, 2 M1, 3 M1
    alignas(64) T V[kAdanStride], NK3[kAdanStride], SV[kAdanStride];   // Var, -kappa3, scale * Var
};

// The constants of iteration k, once per step. The step (sm m' + sv v') / (sn sqrt(n') + eps/c),
// with sm = (1-b1) lr/(1-b1^k), sv = (1-b2) lr b2/(1-b2^k), sn = sqrt((1-b3)/(1-b3^k)), is
// evaluated divided through by sm, as (m' + rho v') / (sigma sqrt(n') + eps/(c sm)) with
// rho = sv/sm and sigma = sn/sm: one multiplication fewer per parameter.
struct AdanIterCoefs {
    double rho, sigma, eps_a, eps_b, eps_be;  // eps_*: eps/(c sm) for mu1, mu2 and beta
};

struct AdanConsts {
    double w1, grad_scale;
};

// eps / c for a gradient scaled by c > 0, kept finite (a zero scale means no step: num / 1e30)
inline float adan_eps_over(double c) {
    const double e = kAdanEps / c;
    return static_cast<float>(e < 1e30 ? e : 1e30);
}

// Loads, stores and broadcasts of a pack P of T lanes (P = T: one lane).
template <typename P, typename T>
struct Lanes {
    static GMS_INLINE P load(const T* p) { return *p; }
    static GMS_INLINE void store(T* p, P v) { *p = v; }
    static GMS_INLINE P splat(double x) { return static_cast<P>(x); }
};
template <typename T>
GMS_INLINE T pack_div(T x, T d) {
    return x / d;
}
template <typename T>
GMS_INLINE T pack_sqrt(T x) {
    return std::sqrt(x);
}
template <typename T>
GMS_INLINE T pack_clamp(T v, T lo, T hi) {
    v = v > lo ? v : lo;  // (maxps / minps)
    return v < hi ? v : hi;
}
#ifdef GMS_AVX512
typedef float F16 __attribute__((vector_size(64)));  // = __m512, with GCC's and clang's arithmetic operators
template <>
struct Lanes<F16, float> {
    static GMS_INLINE F16 load(const float* p) { return _mm512_load_ps(p); }
    static GMS_INLINE void store(float* p, F16 v) { _mm512_store_ps(p, v); }
    static GMS_INLINE F16 splat(double x) { return _mm512_set1_ps(static_cast<float>(x)); }
};
GMS_INLINE F16 pack_sqrt(F16 x) { return _mm512_sqrt_ps(x); }
// x / d for d > 0 finite. On Intel cores, within an ulp or two: the 14-bit reciprocal estimate
// refined by one Newton step (relative error ~2^-27 before the last rounding). A division would
// occupy the divider, which the square roots keep busy already; this is FMA-unit work instead.
// AMD's Zen 4 (which GCC 12 calls znver3 with AVX-512) divides 16 floats in half the time of an
// Intel core and runs 512-bit FMAs at half the rate per instruction, so there the division itself
// is cheaper (ADAN loop ~5% faster, benchmarks/cpp/adan_loop_bench.cpp, 2026-11-26).
#if defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
#define GMS_TRUE_DIVISION 1
#endif
GMS_INLINE F16 pack_div(F16 x, F16 d) {
#ifdef GMS_TRUE_DIVISION
    return _mm512_div_ps(x, d);
#else
    const F16 r = _mm512_rcp14_ps(d);
    return x * _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
#endif
}
GMS_INLINE F16 pack_clamp(F16 v, F16 lo, F16 hi) { return _mm512_min_ps(_mm512_max_ps(v, lo), hi); }
#endif

// The scalars of one iteration, broadcast to packs.
template <typename P>
struct AdanPacks {
    P w1, w2, b1, b2, b3, lo, hi, three, rho, sigma, eps_a, eps_b, eps_be;
};

template <typename P, typename T>
AdanPacks<P> adan_packs(const AdanConsts& c, const AdanIterCoefs& it) {
    using L = Lanes<P, T>;
    return {L::splat(c.w1),        L::splat(1.0 - c.w1),  L::splat(kAdanBeta1), L::splat(kAdanBeta2),
            L::splat(kAdanBeta3),  L::splat(kAdanBetaLo), L::splat(kAdanBetaHi), L::splat(3.0),
            L::splat(it.rho),      L::splat(it.sigma),    L::splat(it.eps_a),    L::splat(it.eps_b),
            L::splat(it.eps_be)};
}

// What the first stage hands to the second, per parameter: the numerator m' + rho v' and n'.
template <typename P>
struct AdanNumerator {
    P num, n;
};
template <typename P>
struct AdanPending {
    AdanNumerator<P> a, b, be;
};

// m' <- b1 m' + g, v' <- b2 v' + dg, n' <- b3 n' + (g + b2 dg)^2 for one parameter (its state
// m, v, n and previous gradient g_prev updated in place). The state starts at zero: the first
// iteration (FIRST, dg = 0) reads none of it.
template <bool FIRST, typename P, typename T>
GMS_INLINE AdanNumerator<P> adan_moments(T* m, T* v, T* n, T* g_prev, P g, const AdanPacks<P>& c) {
    using L = Lanes<P, T>;
    P m_new, v_new, u, n_new;
    if (FIRST) {
        m_new = g;
        v_new = L::splat(0.0);
        u = g;
        n_new = u * u;
    } else {
        const P d = g - L::load(g_prev);
        m_new = c.b1 * L::load(m) + g;
        v_new = c.b2 * L::load(v) + d;
        u = g + c.b2 * d;
        n_new = c.b3 * L::load(n) + u * u;
    }
    L::store(m, m_new);
    L::store(v, v_new);
    L::store(n, n_new);
    L::store(g_prev, g);
    return {m_new + c.rho * v_new, n_new};
}

// Stage 1 for the lanes at i: residuals, gradients, moment updates.
template <bool FIRST, typename P, typename T>
GMS_INLINE AdanPending<P> adan_gradient_step(AdanBlock<T>& s, int i, const AdanPacks<P>& c) {
    using L = Lanes<P, T>;
    const P M = L::load(s.M + i), V = L::load(s.V + i);
    const P a = L::load(s.a + i), b = L::load(s.b + i), be = L::load(s.be + i);
    // residuals
    const P s2 = be * V;
    const P w1a = c.w1 * a, w2b = c.w2 * b;
    const P r1 = w1a + w2b;
    const P w1aa = w1a * a, w2bb = w2b * b;
    const P q = (w1aa + w2bb) + (s2 - V);
    const P cubic_k3 = w1aa * a + (w2bb * b + L::load(s.NK3 + i));  // w1 a^3 + w2 b^3 - kappa3
    const P r2 = L::load(s.M2 + i) * r1 + q;
    const P r3 = L::load(s.M3x + i) * (M * r1 + q) + (c.three * s2 * r1 + cubic_k3);
    // gradients (P for mu1 and mu2, the full gradient for beta)
    const P t3 = c.three * r3;
    const P c0 = r1 + s2 * t3, c1 = r2 + r2;
    const P mu1 = M + a, mu2 = M + b;
    const P g_a = c0 + mu1 * (c1 + mu1 * t3);
    const P g_b = c0 + mu2 * (c1 + mu2 * t3);
    const P g_be = L::load(s.SV + i) * (r2 + (M + r1) * t3);
    return {adan_moments<FIRST>(s.ma + i, s.va + i, s.na + i, s.ga + i, g_a, c),
            adan_moments<FIRST>(s.mb + i, s.vb + i, s.nb + i, s.gb + i, g_b, c),
            adan_moments<FIRST>(s.mbe + i, s.vbe + i, s.nbe + i, s.gbe + i, g_be, c)};
}

// Stage 2 for the lanes at i: p <- p - num / (sigma sqrt(n') + eps/(c sm)), beta clamped to [lo, hi].
template <typename P, typename T>
GMS_INLINE void adan_update(AdanBlock<T>& s, int i, const AdanPending<P>& p, const AdanPacks<P>& c) {
    using L = Lanes<P, T>;
    L::store(s.a + i, L::load(s.a + i) - pack_div(p.a.num, pack_sqrt(p.a.n) * c.sigma + c.eps_a));
    L::store(s.b + i, L::load(s.b + i) - pack_div(p.b.num, pack_sqrt(p.b.n) * c.sigma + c.eps_b));
    const P be = L::load(s.be + i) - pack_div(p.be.num, pack_sqrt(p.be.n) * c.sigma + c.eps_be);
    L::store(s.be + i, pack_clamp(be, c.lo, c.hi));
}

// One iteration over lanes [0, n), one lane at a time (the compiler vectorises the loop).
template <bool FIRST, typename T>
void adan_iteration(AdanBlock<T>& s, int n, const AdanPacks<T>& packs) {
    const AdanPacks<T> c = packs;  // (a local copy: the compiler need not reload it after each store)
    GMS_SIMD
    for (int i = 0; i < n; ++i) adan_update(s, i, adan_gradient_step<FIRST>(s, i, c), c);
}

#ifdef GMS_AVX512
// One iteration over lanes [0, n) rounded up to 16 (n > 0), software-pipelined: the square roots
// and divisions of the lanes i - 16 are issued after the FMA work of the lanes i, so that the
// out-of-order core runs the divider alongside the FMA unit instead of one after the other
// (measured ~17% faster than the portable loop, vectorised by GCC, on the moments of
// benchmarks/cases.py: benchmarks/cpp/adan_loop_bench.cpp with and without -DGMS_NO_AVX512).
template <bool FIRST>
void adan_iteration(AdanBlock<float>& s, int n, const AdanPacks<F16>& packs) {
    // (a local copy, as above: read through the reference, the constants were reloaded after the
    // state stores, which may alias them, and copied before each fma that overwrites its operand;
    // the loop was ~14% slower that way)
    const AdanPacks<F16> c = packs;
    AdanPending<F16> pending = adan_gradient_step<FIRST>(s, 0, c);
    int i = kAdanLanes;
    for (; i < n; i += kAdanLanes) {
        const AdanPending<F16> next = adan_gradient_step<FIRST>(s, i, c);
        adan_update(s, i - kAdanLanes, pending, c);
        pending = next;
    }
    adan_update(s, i - kAdanLanes, pending, c);
}
template <typename T>
using AdanPack = typename std::conditional<std::is_same<T, float>::value, F16, T>::type;
#else
template <typename T>
using AdanPack = T;
#endif

struct AdanConfig {
    AdanConsts consts;
    std::vector<AdanIterCoefs> iters;
    bool fp64 = false;  // run every block in double precision (slower; for checks)
};

inline std::vector<AdanIterCoefs> adan_iteration_coefs(const std::vector<double>& lrs, const AdanConsts& c) {
    // eps / (c sm), capped like adan_eps_over: 1e30 still means "no step", and the denominator
    // sigma sqrt(n') + eps' (sigma <= 1e11, sqrt(n') <= 2e19) stays finite in float32
    const double eps_a = adan_eps_over(c.grad_scale * c.w1), eps_b = adan_eps_over(c.grad_scale * (1.0 - c.w1));
    std::vector<AdanIterCoefs> out;
    for (size_t k = 1; k <= lrs.size(); ++k) {
        const double lr = lrs[k - 1], kk = static_cast<double>(k);
        // (fit.LR_RANGE; with sm >= 1e-11 every constant stays finite in float32)
        if (!(lr >= 1e-10 && lr <= 100.0)) throw std::invalid_argument("ADAN learning rates must lie in [1e-10, 100]");
        const double sm = (1 - kAdanBeta1) * lr / (1 - std::pow(kAdanBeta1, kk));
        const double sv = (1 - kAdanBeta2) * lr * kAdanBeta2 / (1 - std::pow(kAdanBeta2, kk));
        const double sn = std::sqrt((1 - kAdanBeta3) / (1 - std::pow(kAdanBeta3, kk)));
        const auto over_sm = [sm](double eps) { return std::min(eps / sm, 1e30); };
        out.push_back({sv / sm, sn / sm, over_sm(eps_a), over_sm(eps_b), over_sm(kAdanEps)});
    }
    return out;
}

// Runs the ADAN fit of cfg on one block of n > 0 elements (state s, n lanes; lanes up to the next
// multiple of 16 are padding, set to zeros, which the fit keeps at zero).
template <typename T>
void adan_run(AdanBlock<T>& s, int n, const AdanConfig& cfg) {
    using P = AdanPack<T>;
    for (size_t k = 0; k < cfg.iters.size(); ++k) {
        const AdanPacks<P> c = adan_packs<P, T>(cfg.consts, cfg.iters[k]);
        if (k == 0)
            adan_iteration<true>(s, n, c);
        else
            adan_iteration<false>(s, n, c);
    }
}

template <typename T>
void adan_fit_block(const AdanConfig& cfg, int n, const double* __restrict M1, const double* __restrict VAR,
                    const double* __restrict K3, double* __restrict P1, double* __restrict P2,
                    double* __restrict PS) {
    if (n <= 0) return;
    AdanBlock<T> s;
    const T scale = static_cast<T>(cfg.consts.grad_scale);
    GMS_SIMD
    for (int i = 0; i < n; ++i) {  // (m', v', n' and the previous gradient are written first)
        s.M[i] = static_cast<T>(M1[i]);
        s.V[i] = static_cast<T>(VAR[i]);
        s.NK3[i] = -static_cast<T>(K3[i]);
        s.b[i] = static_cast<T>((M1[i] - kAdanInitGap) - M1[i]);  // the reference's mu2 = M1 - 1e-3
    }
    const int padded = (n + kAdanLanes - 1) / kAdanLanes * kAdanLanes;
    for (int i = n; i < padded; ++i) s.M[i] = s.V[i] = s.NK3[i] = s.b[i] = T(0);
    GMS_SIMD
    for (int i = 0; i < padded; ++i) {
        s.M2[i] = s.M[i] + s.M[i];
        s.M3x[i] = T(3) * s.M[i];
        s.SV[i] = scale * s.V[i];
        s.a[i] = T(0);
        s.be[i] = static_cast<T>(kAdanInitBeta);
    }
    adan_run(s, n, cfg);
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        P1[i] = M1[i] + static_cast<double>(s.a[i]);
        P2[i] = M1[i] + static_cast<double>(s.b[i]);
        PS[i] = static_cast<double>(s.be[i]) * VAR[i];
    }
}

// Elements whose scale could overflow float32 in the gradient or its square (|g| ~ scale S^5
// with S the largest of |M1|, sqrt|Var|, cbrt|kappa3|), whose cubic terms (~Var^1.5) would fall
// below float32's normal numbers (tiny variances), or that are not finite, are fitted in double.
// The choice is made per element, so that an element's result never depends on its neighbours
// (a sample does not depend on the batch it is drawn in). The bounds are
// gms_kernels.kernels.ADAN_FP32_LIMITS (the Triton kernel uses the same). The lower bound on Var
// matters for Triton, which reads fp64 heads; from float32 heads this kernel's Var is 0 or above
// ~1e-12, and at Var = 0 both loops give the same result (measured: the lower bound set to 0 left
// every output bit unchanged).
constexpr double kAdanFp32M1Max = 1024.0, kAdanFp32VarMin = 0x1p-60, kAdanFp32VarMax = 1048576.0,
                 kAdanFp32K3Max = 1073741824.0;
inline bool adan_needs_double(double m1, double var, double k3) {
    const double av = std::fabs(var);
    const bool in_range = (std::fabs(m1) <= kAdanFp32M1Max) & (av >= kAdanFp32VarMin) & (av <= kAdanFp32VarMax) &
                          (std::fabs(k3) <= kAdanFp32K3Max);
    return !in_range;  // (NaN compares false: not in range)
}

inline void adan_fit(const AdanConfig& cfg, int n, const double* M1, const double* VAR, const double* M3,
                     double* K3, double* P1, double* P2, double* PS) {
    kappa3_block<false>(n, M1, VAR, M3, K3);  // the reference's Var, not clamped
    if (cfg.fp64 || !(cfg.consts.grad_scale <= 2.0)) {
        adan_fit_block<double>(cfg, n, M1, VAR, K3, P1, P2, PS);
        return;
    }
    int n_wide = 0;  // (counted branch-free first: almost always none)
    for (int i = 0; i < n; ++i) n_wide += adan_needs_double(M1[i], VAR[i], K3[i]);
    if (n_wide == n) {
        adan_fit_block<double>(cfg, n, M1, VAR, K3, P1, P2, PS);
        return;
    }
    adan_fit_block<float>(cfg, n, M1, VAR, K3, P1, P2, PS);
    if (n_wide == 0) return;
    // refit the wide elements in double (gathered, then scattered back)
    int wide[kBlock];
    alignas(64) double m1[kBlock] = {}, var[kBlock] = {}, k3[kBlock] = {}, p1[kBlock], p2[kBlock], ps[kBlock];
    n_wide = 0;
    for (int i = 0; i < n; ++i) {
        if (!adan_needs_double(M1[i], VAR[i], K3[i])) continue;
        wide[n_wide] = i;
        m1[n_wide] = M1[i];
        var[n_wide] = VAR[i];
        k3[n_wide] = K3[i];
        ++n_wide;
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
    alignas(64) uint32_t u0[kBlock], u1[kBlock];
    const uint64_t head0 = philox_counter(0, src.t, 0), head1 = philox_counter(1, src.t, 0);
    const bool pixel_u = U != nullptr && src.per_pixel;
    int64_t i = e0 / src.D, j = e0 % src.D;
    if (src.D >= 16) {
        // long runs of one sample: one key and consecutive counters per run
        for (int e = 0; e < n;) {
            const int len = static_cast<int>(std::min<int64_t>(n - e, src.D - j));
            const uint64_t seed = static_cast<uint64_t>(src.seeds[i]);
            const uint64_t first = static_cast<uint64_t>(src.indices[i]) * static_cast<uint64_t>(src.D) + j;
            normals_run(len, seed, head0, first, Z + e);
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
        // short samples: per-element keys and counters (each element runs the Philox call of its
        // group of four and keeps its own pair)
        alignas(64) uint64_t index[kBlock];
        alignas(64) uint32_t k0[kBlock], k1[kBlock], c0[kBlock], c1[kBlock];
        alignas(64) uint32_t w0[kBlock], w1[kBlock], w2[kBlock], w3[kBlock];
        alignas(64) float pairs[2 * kBlock];
        for (int e = 0; e < n; ++e) {
            const uint64_t seed = static_cast<uint64_t>(src.seeds[i]);
            index[e] = static_cast<uint64_t>(src.indices[i]) * static_cast<uint64_t>(src.D) + j;
            const uint64_t group = normal_group(head0 | index[e]);
            k0[e] = static_cast<uint32_t>(seed);
            k1[e] = static_cast<uint32_t>(seed >> 32);
            c0[e] = static_cast<uint32_t>(group);
            c1[e] = static_cast<uint32_t>(group >> 32);
            if (U != nullptr && !src.per_pixel)
                U[e] = philox_uniform(seed, philox_counter(1, src.t, static_cast<uint64_t>(src.indices[i])));
            if (++j == src.D) {
                j = 0;
                ++i;
            }
        }
        philox_block(n, c0, c1, k0, k1, w0, w1, w2, w3);
        for (int e = 0; e < n; ++e) {  // (w0, w1 <- the element's pair)
            const bool second_pair = (index[e] >> 1) & 1;
            w0[e] = second_pair ? w2[e] : w0[e];
            w1[e] = second_pair ? w3[e] : w1[e];
        }
        normal_pairs(n, w0, w1, pairs);
        for (int e = 0; e < n; ++e) Z[e] = pairs[2 * e + (index[e] & 1)];
        if (pixel_u) {
            for (int e = 0; e < n; ++e) {
                const uint64_t off = head1 | index[e];
                c0[e] = static_cast<uint32_t>(off);
                c1[e] = static_cast<uint32_t>(off >> 32);
            }
            philox_block(n, c0, c1, k0, k1, u0, u1);
        }
    }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // (masked vector loads read u0 only below n)
#endif
    if (pixel_u) uniforms_block(n, u0, U);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
}

// x = (u < w1 ? mu1 : mu2) + sqrt(max(s2, 0)) z, in double, rounded once (mixture.sample_mixture).
GMS_NO_FMA_FN inline void mix_block(int n, const double* __restrict P1, const double* __restrict P2,
                                    const double* __restrict PS, const float* __restrict Z,
                                    const float* __restrict U, float w1f, float* __restrict out) {
    GMS_NO_FMA_BEGIN
#ifdef GMS_AVX512
    const __m256 w1v = _mm256_set1_ps(w1f);
    for (int e = 0; e < n; e += 8) {
        const __mmask8 m = v8::tail_mask(n - e);
        v8::V ps = _mm512_max_pd(_mm512_maskz_loadu_pd(m, PS + e), _mm512_setzero_pd()), sd;  // (ps > 0 ? ps : 0)
        v8::sqrt_w<1, false>(&ps, &sd);
        const __m256 x_s = v8::mix8(_mm512_maskz_loadu_pd(m, P1 + e), _mm512_maskz_loadu_pd(m, P2 + e), sd,
                                    _mm256_maskz_loadu_ps(m, Z + e), _mm256_maskz_loadu_ps(m, U + e), w1v);
        _mm256_mask_storeu_ps(out + e, m, x_s);
    }
#else
    GMS_SIMD
    for (int e = 0; e < n; ++e) {
        const double mu = U[e] < w1f ? P1[e] : P2[e];
        const double s2 = PS[e] > 0.0 ? PS[e] : 0.0;
        out[e] = static_cast<float>(mu + std::sqrt(s2) * static_cast<double>(Z[e]));
    }
#endif
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
// An input of N samples of D float32 each, sample i starting at p + i * stride (stride = D: the
// flat contiguous array; 3 D: one head of a [N, 3C, ...] model output sliced along channels).
struct SampleInput {
    const float* p;
    int64_t stride;
};

// The n elements [e0, e0 + n) of the flattened [N * D] input as one contiguous run: a pointer into
// the input where they are (always with stride D, and otherwise while the run stays within one
// sample), else a copy gathered into `staging`.
inline const float* block_input(const SampleInput& in, int64_t D, int64_t e0, int n, float* staging) {
    if (in.p == nullptr) return nullptr;
    if (in.stride == D) return in.p + e0;
    int64_t i = e0 / D, j = e0 % D;
    if (j + n <= D) return in.p + i * in.stride + j;
    for (int e = 0; e < n; j = 0, ++i) {
        const int len = static_cast<int>(std::min<int64_t>(n - e, D - j));
        std::memcpy(staging + e, in.p + i * in.stride + j, sizeof(float) * static_cast<size_t>(len));
        e += len;
    }
    return staging;
}

struct StepArgs {
    SampleInput x, e1, e2, e3;
    float *out, *mu1, *mu2, *s2;
    NoiseSource noise;
    int mode;
    Coefs coefs;
    double var_cap, w1, var_floor;
    AdanConfig adan;
};

// Whether all n values are finite, from the exponent bits (integer work the compiler vectorises
// without reassociating floats; the values are in L1 already, read next by the moments).
inline bool all_finite(const float* p, int n) {
    if (p == nullptr) return true;
    uint32_t bad = 0;
    GMS_SIMD
    for (int i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, p + i, sizeof u);
        bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

// One block of the step; returns false (and writes nothing) when an input it reads is not finite.
bool fused_block(const StepArgs& A, int64_t e0, int n) {
    alignas(64) float SX[kBlock], S1[kBlock], S2[kBlock], S3[kBlock];  // (used by blocks that straddle samples)
    alignas(64) float Z[kBlock], U[kBlock];
    const bool need_var = A.mode != kDenoise;
    const bool need_m3 = A.mode == kClosed || A.mode == kAdan;
    const int64_t D = A.noise.D;
    const float* x = block_input(A.x, D, e0, n, SX);
    const float* e1 = block_input(A.e1, D, e0, n, S1);
    const float* e2 = need_var ? block_input(A.e2, D, e0, n, S2) : nullptr;
    const float* e3 = need_m3 ? block_input(A.e3, D, e0, n, S3) : nullptr;
    if (!(all_finite(x, n) && all_finite(e1, n) && all_finite(e2, n) && all_finite(e3, n))) return false;
    float* out = A.out + e0;
    float* mu1 = A.mu1 ? A.mu1 + e0 : nullptr;
    float* mu2 = A.mu2 ? A.mu2 + e0 : nullptr;
    float* s2 = A.s2 ? A.s2 + e0 : nullptr;
    alignas(64) double M1[kBlock], VAR[kBlock], M3[kBlock];
    alignas(64) double P1[kBlock], P2[kBlock], PS[kBlock];
    moments_dispatch(A.coefs, n, x, e1, e2, e3, M1, VAR, M3);
#ifdef GMS_AVX512
    if (A.mode == kClosed) {  // kappa3, fit, float32 parameters and the draw in one loop
        draw_block(A.noise, e0, n, Z, U);
        v8::closed_fit_mix(ClosedConsts(A.w1, A.var_floor), n, M1, VAR, M3, Z, U, out, mu1, mu2, s2);
        return true;
    }
#endif
    switch (A.mode) {
        case kDenoise: {
            for (int e = 0; e < n; ++e) {
                out[e] = static_cast<float>(M1[e]);
                PS[e] = 0.0;
            }
            store_params(n, M1, M1, PS, mu1, mu2, s2);
            return true;
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
            return true;
        }
        case kClosed:  // (M3 is overwritten by kappa3)
            kappa3_block<true>(n, M1, VAR, M3, M3);
            closed_fit_block(n, M1, VAR, M3, ClosedConsts(A.w1, A.var_floor), P1, P2, PS);
            break;
        default:  // kAdan (M3 is overwritten by kappa3)
            adan_fit(A.adan, n, M1, VAR, M3, M3, P1, P2, PS);
            break;
    }
    draw_block(A.noise, e0, n, Z, U);
    mix_block(n, P1, P2, PS, Z, U, static_cast<float>(A.w1), out);
    store_params(n, P1, P2, PS, mu1, mu2, s2);
    return true;
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
// large enough to pay for waking threads. Threads take chunks of kChunkBlocks blocks as they
// finish (dynamic), not fixed halves: on a shared machine one core can run slower than another
// for seconds at a time, and a static split would wait for the slower one (measured on the
// 2-vCPU VM: 10-20% off the median call of both fits in its slow phases, nothing lost in the
// fast ones). Blocks are independent and draw counter-based random numbers, so the split does
// not change any result.
constexpr int kChunkBlocks = 8;

template <typename Fn>
void for_blocks(int64_t total, int num_threads, int64_t min_parallel, const Fn& fn) {
    const int64_t nblocks = (total + kBlock - 1) / kBlock;
#ifdef _OPENMP
    const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, kChunkBlocks) num_threads(threads) if (threads > 1 && total >= min_parallel)
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

// An input of N samples of D elements, sample i at element i * stride of the array (stride < 0:
// D, the flat [N * D] array, whose size must then be N * D exactly).
SampleInput sample_input(const py::object& obj, int64_t N, int64_t D, int64_t stride, const char* name,
                         std::vector<py::object>& keep, bool required) {
    if (stride < 0 || stride == D) return {float_input(obj, N * D, name, keep, required), D};
    if (obj.is_none()) {
        if (required) throw std::invalid_argument(std::string(name) + " is required for this mode");
        return {nullptr, D};
    }
    if (N > 1 && stride > (INT64_MAX - D) / (N - 1))
        throw std::invalid_argument(std::string(name) + ": (N - 1) * stride + D overflows");
    const int64_t need = N > 0 && D > 0 ? (N - 1) * stride + D : 0;
    FloatIn arr = FloatIn::ensure(obj);
    if (!arr) throw std::invalid_argument(std::string(name) + " must be convertible to a float32 array");
    if (arr.size() < need)
        throw std::invalid_argument(std::string(name) + " has " + std::to_string(arr.size()) + " elements, fewer than the " +
                                    std::to_string(need) + " that N = " + std::to_string(N) + " samples of " +
                                    std::to_string(D) + " at a stride of " + std::to_string(stride) + " span");
    keep.push_back(arr);
    return {arr.data(), stride};
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

// The noise of a step whose seeds and indices (N each) are at `seeds` and `indices`.
NoiseSource noise_source(const int64_t* seeds, const int64_t* indices, int64_t N, int64_t D, int64_t t,
                         bool per_pixel) {
    if (t < 0 || t >= (1 << 16)) throw std::invalid_argument("t must lie in [0, 65536)");
    // every element index must fit below the time field of the counter (as SampleNoise checks)
    for (int64_t i = 0; i < N; ++i) {
        const int64_t idx = indices[i];
        if (idx < 0 || (D > 0 && idx >= (int64_t(1) << 40) / D))
            throw std::invalid_argument("sample indices must lie in [0, 2^40 / D) for the random-number counter");
    }
    return NoiseSource{seeds, indices, D, static_cast<uint64_t>(t), per_pixel};
}

NoiseSource make_noise(const py::object& seeds, const py::object& indices, int64_t N, int64_t D, int64_t t,
                       bool per_pixel, std::vector<py::object>& keep) {
    return noise_source(long_input(seeds, N, "seeds", keep), long_input(indices, N, "indices", keep), N, D, t,
                        per_pixel);
}

void check_sizes(int64_t N, int64_t D) {
    if (N < 0 || D < 0) throw std::invalid_argument("N and D must be non-negative");
    if (D > 0 && N > INT64_MAX / D) throw std::invalid_argument("N * D overflows");
}

// StepArgs without its buffers and noise, from the step's configuration (checked).
StepArgs step_config(int64_t N, int64_t D, int mode, int64_t t, double a_t, double sigma_t, double c1, double c2,
                     double lam2, bool has_range, double center, double half, double var_cap, double w1,
                     double var_floor, const std::vector<double>& lrs, double grad_scale, bool per_pixel,
                     bool adan_fp64) {
    check_sizes(N, D);
    if (mode < kGaussian || mode > kDenoise) throw std::invalid_argument("unknown mode " + std::to_string(mode));
    if (has_range && !(half > 0.0)) throw std::invalid_argument("half must be positive with a data range");
    StepArgs A{{}, {}, {}, {}, nullptr, nullptr, nullptr, nullptr, NoiseSource{nullptr, nullptr, D, 0, per_pixel},
               mode, Coefs(a_t, sigma_t, c1, c2, lam2, has_range, center, half), var_cap, w1, var_floor,
               AdanConfig{AdanConsts{w1, grad_scale}, {}}};
    if (mode == kAdan) A.adan.iters = adan_iteration_coefs(lrs, A.adan.consts);
    A.adan.fp64 = adan_fp64;
    return A;
}

// Runs the step over all N * D elements without the GIL; whether every input it read was finite
// (otherwise the output is incomplete).
bool run_step(const StepArgs& A, int64_t total, int num_threads) {
    if (total == 0) return true;
    py::gil_scoped_release release;
    // the ADAN fit is ~100x the work of the other modes per element
    const int64_t min_parallel = A.mode == kAdan && !A.adan.iters.empty() ? 2 * kBlock : 16 * kBlock;
    std::atomic<bool> finite{true};
    for_blocks(total, num_threads, min_parallel, [&](int64_t e0, int n) {
        if (!fused_block(A, e0, n)) finite.store(false, std::memory_order_relaxed);
    });
    return finite.load();
}

bool fused_step_py(py::object x_t, py::object e1, py::object e2, py::object e3, py::object seeds, py::object indices,
                   py::object out, py::object mu1, py::object mu2, py::object s2, int64_t N, int64_t D, int mode,
                   int64_t t, double a_t, double sigma_t, double c1, double c2, double lam2, bool has_range,
                   double center, double half, double var_cap, double w1, double var_floor, std::vector<double> lrs,
                   double grad_scale, bool per_pixel, int num_threads, bool adan_fp64, int64_t x_stride,
                   int64_t e1_stride, int64_t e2_stride, int64_t e3_stride) {
    StepArgs A = step_config(N, D, mode, t, a_t, sigma_t, c1, c2, lam2, has_range, center, half, var_cap, w1,
                             var_floor, lrs, grad_scale, per_pixel, adan_fp64);
    const int64_t total = N * D;
    std::vector<py::object> keep;
    A.x = sample_input(x_t, N, D, x_stride, "x_t", keep, true);
    A.e1 = sample_input(e1, N, D, e1_stride, "e1", keep, true);
    A.e2 = sample_input(e2, N, D, e2_stride, "e2", keep, mode != kDenoise);
    A.e3 = sample_input(e3, N, D, e3_stride, "e3", keep, mode == kClosed || mode == kAdan);
    A.out = float_output(out, total, "out", keep, true);
    A.mu1 = float_output(mu1, total, "mu1", keep, false);
    A.mu2 = float_output(mu2, total, "mu2", keep, false);
    A.s2 = float_output(s2, total, "s2", keep, false);
    A.noise = make_noise(seeds, indices, N, D, t, per_pixel, keep);
    return run_step(A, total, num_threads);
}

// fused_step on the addresses of buffers the caller owns and has checked (dtypes, sizes, spans,
// overlaps: gms_kernels/kernels/cpp.py does), skipping numpy's wrapping of each buffer on the
// per-step path. An address of 0 is a buffer not given.
bool fused_step_at_py(uintptr_t x_t, int64_t x_stride, uintptr_t e1, int64_t e1_stride, uintptr_t e2,
                      int64_t e2_stride, uintptr_t e3, int64_t e3_stride, uintptr_t seeds, uintptr_t indices,
                      uintptr_t out, uintptr_t mu1, uintptr_t mu2, uintptr_t s2, int64_t N, int64_t D, int mode,
                      int64_t t, double a_t, double sigma_t, double c1, double c2, double lam2, bool has_range,
                      double center, double half, double var_cap, double w1, double var_floor,
                      std::vector<double> lrs, double grad_scale, bool per_pixel, int num_threads, bool adan_fp64) {
    StepArgs A = step_config(N, D, mode, t, a_t, sigma_t, c1, c2, lam2, has_range, center, half, var_cap, w1,
                             var_floor, lrs, grad_scale, per_pixel, adan_fp64);
    const int64_t total = N * D;
    const bool need_e2 = mode != kDenoise, need_e3 = mode == kClosed || mode == kAdan;
    if (total > 0 && (!x_t || !e1 || !out || !seeds || !indices || (need_e2 && !e2) || (need_e3 && !e3)))
        throw std::invalid_argument("fused_step_at: a buffer this mode reads or writes is missing (address 0)");
    const auto in = [](uintptr_t a, int64_t stride) { return SampleInput{reinterpret_cast<const float*>(a), stride}; };
    const auto buf = [](uintptr_t a) { return reinterpret_cast<float*>(a); };
    A.x = in(x_t, x_stride);
    A.e1 = in(e1, e1_stride);
    A.e2 = in(need_e2 ? e2 : 0, e2_stride);
    A.e3 = in(need_e3 ? e3 : 0, e3_stride);
    A.out = buf(out);
    A.mu1 = buf(mu1);
    A.mu2 = buf(mu2);
    A.s2 = buf(s2);
    A.noise = noise_source(reinterpret_cast<const int64_t*>(seeds), reinterpret_cast<const int64_t*>(indices), N, D,
                           t, per_pixel);
    return run_step(A, total, num_threads);
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
#ifdef GMS_AVX512
    d["kernels"] = "avx512";  // the hand-vectorised moments, closed fit, normals and draw
#else
    d["kernels"] = "portable";
#endif
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
    m.attr("CLOSED_SKEW_KNEE") = gms::kSkewKnee;  // fit.SKEW_KNEE (checked by the tests)
    m.def("fused_step", &gms::fused_step_py,
          "One fused GMS step over flattened float32 [N*D] buffers (see gms_kernels.kernels). "
          "e2/e3 may be None where the mode does not read them; mu1/mu2/s2 None skips writing them. "
          "x_stride/e1_stride/e2_stride/e3_stride: elements from one sample's start to the next in that "
          "input (default D: the flat array; e.g. 3 D for a head sliced out of a [N, 3C, ...] output, "
          "passed as the 1-D span from its first element); out/mu1/mu2/s2 are always flat [N*D]. "
          "Returns False when an input it read held a NaN or inf (the outputs are then incomplete).",
          "x_t"_a, "e1"_a, "e2"_a, "e3"_a, "seeds"_a, "indices"_a, "out"_a, "mu1"_a, "mu2"_a, "s2"_a, "N"_a,
          "D"_a, "mode"_a, "t"_a, "a_t"_a, "sigma_t"_a, "c1"_a, "c2"_a, "lam2"_a, "has_range"_a, "center"_a,
          "half"_a, "var_cap"_a, "w1"_a, "var_floor"_a, "lrs"_a, "grad_scale"_a, "per_pixel"_a,
          "num_threads"_a = 0, "adan_fp64"_a = false, "x_stride"_a = -1, "e1_stride"_a = -1, "e2_stride"_a = -1,
          "e3_stride"_a = -1);
    m.def("fused_step_at", &gms::fused_step_at_py,
          "fused_step on raw addresses (0: not given) of buffers the caller owns and has checked: the launcher's "
          "fast path. Inputs are N samples of D float32, `stride` elements apart; outputs flat [N*D] float32; "
          "seeds and indices int64 [N].",
          "x_t"_a, "x_stride"_a, "e1"_a, "e1_stride"_a, "e2"_a, "e2_stride"_a, "e3"_a, "e3_stride"_a, "seeds"_a,
          "indices"_a, "out"_a, "mu1"_a, "mu2"_a, "s2"_a, "N"_a, "D"_a, "mode"_a, "t"_a, "a_t"_a, "sigma_t"_a,
          "c1"_a, "c2"_a, "lam2"_a, "has_range"_a, "center"_a, "half"_a, "var_cap"_a, "w1"_a, "var_floor"_a,
          "lrs"_a, "grad_scale"_a, "per_pixel"_a, "num_threads"_a, "adan_fp64"_a);
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
    m.def("normal", &gms::draw_py<true>,
          "random.normal: float32 normals, four to a Philox call (seeds: one or one per offset).", "seeds"_a,
          "offsets"_a);
    m.def("transition_moments", &gms::moments_py,
          "(M1, Var, M3) in float64 as the fused step computes them (Var/M3 None without e2/e3).", "x_t"_a, "e1"_a,
          "e2"_a, "e3"_a, "a_t"_a, "sigma_t"_a, "c1"_a, "c2"_a, "lam2"_a, "has_range"_a, "center"_a, "half"_a);
    m.def("build_info", &gms::build_info, "How this extension was built (OpenMP, vector ISA, block size).");
}
#endif  // GMS_KERNELS_NO_PYTHON
