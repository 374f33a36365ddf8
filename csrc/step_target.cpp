// The fused GMS step's kernels, written once over the vectors of csrc/simd.h and compiled once per
// target ISA (setup.py: avx512, avx2 and sse2 on x86-64, each with its own flags and
// GMS_TARGET_NS; `baseline` elsewhere); csrc/gms_step.cpp picks one at import by the CPU's features.
//
// One pass over memory per block of elements: moments (double) -> fit (closed form in double, or
// ADAN in float32) -> mixture sampling with the Philox streams of gms_kernels/core/random.py. The
// meaning of every number is defined by the torch reference (gms_kernels/solvers/ and
// gms_kernels/core/: moments.py, fit.py, mixture.py); see the contract in gms_kernels/kernels/__init__.py.
//
// Work is split into blocks of kBlock consecutive elements of the flattened [N * D] arrays; blocks
// are independent (OpenMP parallel for when available) and each keeps its working set (a few
// dozen arrays of kBlock numbers) in L1. Inputs are read completely (per block) before that
// block's outputs are written, so `out` may alias a flat `x_t` (an in-place step). A partial last
// vector is computed on zero-padded copies and only its own lanes are stored: an element goes
// through the same instructions wherever it sits in a block.

#ifndef GMS_TARGET_NS
#define GMS_TARGET_NS native
#endif

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "step_api.h"
#include "vector_random.h"

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

#if defined(_OPENMP) || defined(GMS_OPENMP_SIMD)
#define GMS_SIMD _Pragma("omp simd")
#else
#define GMS_SIMD
#endif

namespace gms {
namespace GMS_TARGET_NS {

static_assert(kBlock % 16 == 0, "blocks hold whole vectors of every target");

// x / d, correctly rounded (bit-identical to the division), from the precomputed reciprocal
// inv_d = 1/d: q = x inv_d is within an ulp, and one fma-exact residual step rounds it correctly
// (Markstein's theorem). Two fma and a multiply instead of a division, which is slow and poorly
// pipelined in vector units. Without hardware fma, a plain division.
GMS_VINLINE VD div_exact(VD x, VD d, VD inv_d) {
#ifdef GMS_VEC_FMA
    const VD q = x * inv_d;
    return fma(fma(-q, d, x), inv_d, q);
#else
    (void)inv_d;
    return x / d;
#endif
}
inline double div_exact(double x, double d, double inv_d) {
#ifdef GMS_VEC_FMA
    const double q = x * inv_d;
    return __builtin_fma(__builtin_fma(-q, d, x), inv_d, q);
#else
    (void)inv_d;
    return x / d;
#endif
}

// kD float32 values from p widened to double; `left` < kD reads only that many (the rest zero)
GMS_VINLINE VD load_widen(const float* p, int left) {
    if (left >= kD) return widen(load<VFh>(p));
    alignas(64) float tmp[kD] = {};
    std::memcpy(tmp, p, sizeof(float) * static_cast<size_t>(left));
    return widen(load<VFh>(tmp));
}
// v rounded to float32 into p, only the first `left` lanes when left < kD
GMS_VINLINE void store_narrow(float* p, VD v, int left) {
    if (left >= kD) {
        store(p, narrow(v));
        return;
    }
    alignas(64) float tmp[kD];
    store(tmp, narrow(v));
    std::memcpy(p, tmp, sizeof(float) * static_cast<size_t>(left));
}

// ------------------------------------------------------------------------------------------
// (M1, Var, M3) of q(x_s | x_t) for kD elements, as moments.transition_moments computes them:
// x0_moments -> clamp_x0_moments (with a range) -> first / second / third moments, Var clamped to
// [0, half^2] with a range. VAR needs e2; M3 needs e2 and e3.
//
// RANGE: 0 no data range, 1 a data range, 2 the range [-1, 1]. With center 0 and half-width 1 the
// affine maps of clamp_x0_moments are identities in IEEE arithmetic (x - 0 = x, x / 1 = x,
// 0 + 1 * y = y, 0 * y = +-0), except that an exact zero may come out as +0 instead of -0: the
// moments are the same numbers as the general form, without its ~35 operations per element.
template <bool HAS_VAR, bool HAS_M3, int RANGE>
GMS_NO_FMA_FN GMS_VINLINE void moments_vec(const Coefs& k, VD x, VD e1, VD e2, VD e3, VD& M1, VD& VAR, VD& M3) {
    GMS_NO_FMA_BEGIN
    const VD zero = splat<VD>(0.0), one = splat<VD>(1.0), minus_one = splat<VD>(-1.0);
    const VD xx = x * x;
    // x0_moments
    const VD mean = div_exact(x - k.sigma_t * e1, splat<VD>(k.a_t), splat<VD>(k.inv_a));
    VD var0 = zero, m2 = zero, m3 = zero;
    if (HAS_VAR) {
        var0 = k.r_sq * (e2 - e1 * e1);
        m2 = div_exact(xx - k.two_sigma * x * e1 + k.sigma_sq * e2, splat<VD>(k.a_sq), splat<VD>(k.inv_a_sq));
    }
    if (HAS_M3) {
        m3 = div_exact(xx * x - k.three_sigma * xx * e1 + k.three_sigma_sq * x * e2 - k.sigma_cube * e3,
                       splat<VD>(k.a_cube), splat<VD>(k.inv_a_cube));
    }
    // clamp_x0_moments
    VD mean_c = mean, var_c = var0, m2_c = m2, m3_c = m3;
    if (RANGE == 2) {
        const VD mean_y = clamp(mean, minus_one, one);
        mean_c = mean_y;
        if (HAS_VAR) {
            var_c = clamp(var0, zero, one);
            m2_c = clamp(m2, zero, one);
            if (HAS_M3) m3_c = clamp(select(vabs(m3) > vabs(mean_y), mean_y, m3), minus_one, one);
        }
    } else if (RANGE == 1) {
        const VD mean_y = clamp(div_exact(mean - k.center, splat<VD>(k.half), splat<VD>(k.inv_half)), minus_one, one);
        mean_c = k.center + k.half * mean_y;
        if (HAS_VAR) {
            var_c = clamp(div_exact(var0, splat<VD>(k.h_sq), splat<VD>(k.inv_h_sq)), zero, one) * k.h_sq;
            const VD m2_y =
                clamp(div_exact(m2 - k.two_c * mean + k.c_c, splat<VD>(k.h_sq), splat<VD>(k.inv_h_sq)), zero, one);
            m2_c = k.c_c + k.two_c_h * mean_y + k.h_h * m2_y;
            if (HAS_M3) {
                VD m3_y = div_exact(m3 - k.three_c * m2 + k.three_c_c * mean - k.c_cube, splat<VD>(k.h_cube),
                                    splat<VD>(k.inv_h_cube));
                m3_y = clamp(select(vabs(m3_y) > vabs(mean_y), mean_y, m3_y), minus_one, one);
                m3_c = k.c_cube + k.three_c_c_h * mean_y + k.three_c_h_h * m2_y + k.h_cube * m3_y;
            }
        }
    }
    const VD m1 = k.c1 * x + k.c2 * mean_c;
    M1 = m1;
    if (HAS_VAR) VAR = k.lam2 + k.c2_sq * var_c;
    if (HAS_M3) {
        const VD c1x = k.c1 * x;
        const VD c1x2 = c1x * c1x;
        const VD cube = c1x2 * c1x + 3.0 * c1x2 * k.c2 * mean_c + 3.0 * c1x * k.c2_sq * m2_c + k.c2_cube * m3_c;
        M3 = cube + k.three_lam2 * m1;
    }
}

// The moments of n <= kBlock elements into M1, VAR, M3 (whole vectors: lanes past n hold the
// moments of zeros).
template <bool HAS_VAR, bool HAS_M3, int RANGE>
GMS_NO_FMA_FN void moments_block(const Coefs& kref, int n, const float* __restrict x, const float* __restrict e1,
                                 const float* __restrict e2, const float* __restrict e3, double* __restrict M1,
                                 double* __restrict VAR, double* __restrict M3) {
    GMS_NO_FMA_BEGIN
    const Coefs k = kref;  // (a local copy: its fields stay in registers)
    const VD zero = splat<VD>(0.0);
    for (int i = 0; i < n; i += kD) {
        const int left = n - i;
        VD m1, var = zero, m3 = zero;
        moments_vec<HAS_VAR, HAS_M3, RANGE>(k, load_widen(x + i, left), load_widen(e1 + i, left),
                                            HAS_VAR ? load_widen(e2 + i, left) : zero,
                                            HAS_M3 ? load_widen(e3 + i, left) : zero, m1, var, m3);
        store(M1 + i, m1);
        if (HAS_VAR) store(VAR + i, var);
        if (HAS_M3) store(M3 + i, m3);
    }
}

template <bool HAS_VAR, bool HAS_M3>
void moments_range(const Coefs& k, int n, const float* x, const float* e1, const float* e2, const float* e3,
                   double* M1, double* VAR, double* M3) {
    if (k.unit_range)
        moments_block<HAS_VAR, HAS_M3, 2>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else if (k.has_range)
        moments_block<HAS_VAR, HAS_M3, 1>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else
        moments_block<HAS_VAR, HAS_M3, 0>(k, n, x, e1, e2, e3, M1, VAR, M3);
}

inline void moments_dispatch(const Coefs& k, int n, const float* x, const float* e1, const float* e2,
                             const float* e3, double* M1, double* VAR, double* M3) {
    if (e2 == nullptr)
        moments_range<false, false>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else if (e3 == nullptr)
        moments_range<true, false>(k, n, x, e1, e2, e3, M1, VAR, M3);
    else
        moments_range<true, true>(k, n, x, e1, e2, e3, M1, VAR, M3);
}

// ------------------------------------------------------------------------------------------
// The closed-form fit (fit.fit_closed) and the mixture draw.
//
// The helpers work on W independent vectors at once, statement by statement (GMS_EACH), so that
// the instruction stream interleaves W dependency chains: the cube root is a chain of ~15
// dependent operations, and one chain per loop iteration leaves the out-of-order window too few
// independent operations to keep the vector units busy.
#define GMS_EACH for (int j = 0; j < W; ++j)

// For v >= 0: a mask whose high-word 32-bit lanes are set where v is outside [2^LO, 2^HI) (0, inf
// and NaN included), from the bits: v's high word as a signed integer, shifted so that 2^HI's wraps
// round to the most negative, is below 2^LO's (shifted alike). Two integer operations instead of two
// comparisons and their union. The low words' lanes hold junk: test the mask with any_high_word.
template <int LO, int HI>
GMS_VINLINE VI outside_binades(VD v) {
    static_assert(-1022 <= LO && LO < HI && HI <= 1024, "normal binades");
    constexpr uint32_t lo_word = uint32_t(1023 + LO) << 20, hi_word = uint32_t(1023 + HI) << 20;
    constexpr uint32_t shift = 0x80000000u - hi_word;
    return bits<VI>(bits<VU>(v) + splat<VU>(shift)) < splat<VI>(static_cast<int32_t>(lo_word + shift));
}
GMS_VINLINE bool any_high_word(VI m) { return any(bits<VL>(bits<VQ>(m) & splat<VQ>(0xFFFFFFFF00000000ull))); }

// Cube root in double, division-free: y ~ |v|^(-1/3) from the exponent bits (relative error
// < 3.5%), three Newton steps y <- y (4 - a y^3)/3 (3.5e-2 -> 2.5e-3 -> 1.3e-5 -> 3e-10), then
// c = a y^2 and one Newton step for the cube root itself, c <- c - (c^3 - a) y^2 / 3, which
// leaves about one ulp. REGULAR: every |v| is in [2^-900, 2^1024), where no step under- or
// overflows; otherwise tiny inputs are scaled by 2^600 first, and 0, inf and NaN come out as they
// went in.
template <int W, bool REGULAR>
GMS_VINLINE void cbrt_w_impl(const VD* v, VD* out) {
    const VD zero = splat<VD>(0.0), third = splat<VD>(1.0 / 3.0), four_thirds = splat<VD>(4.0 / 3.0);
    VD a[W], y[W], a_third[W], c[W], y2[W];
    VL tiny[W];
    GMS_EACH {
        a[j] = vabs(v[j]);
        if (!REGULAR) {
            tiny[j] = a[j] < splat<VD>(0x1p-900);
            a[j] = select(tiny[j], a[j] * 0x1p600, a[j]);
        }
    }
    // high word of a^(-1/3): 0x553EF0FF - hi / 3, with hi / 3 = (hi * 0xAAAAAAAB) >> 33 for 32-bit hi
    GMS_EACH {
        const VQ hi = bits<VQ>(a[j]) >> 32;
        const VQ hi_third = mul_wide(hi, splat<VQ>(0xAAAAAAABull)) >> 33;
        y[j] = bits<VD>((splat<VQ>(0x553EF0FFull) - hi_third) << 32);
        a_third[j] = a[j] * third;
    }
    for (int it = 0; it < 3; ++it) GMS_EACH y[j] = y[j] * fma(-a_third[j], (y[j] * y[j]) * y[j], four_thirds);
    GMS_EACH {
        y2[j] = y[j] * y[j];
        c[j] = a[j] * y2[j];
    }
    GMS_EACH c[j] = fma(-fma(c[j] * c[j], c[j], -a[j]), y2[j] * third, c[j]);  // c - (c^3 - a) y^2 / 3
    GMS_EACH {
        if (!REGULAR) {
            c[j] = select(tiny[j], c[j] * 0x1p-200, c[j]);
            c[j] = select(a[j] == zero, zero, c[j]);
            c[j] = select(a[j] == splat<VD>(__builtin_inf()), a[j], c[j]);
        }
        out[j] = vor(c[j], sign_bit(v[j]));  // the sign of v
    }
}

// The cube roots of W vectors: the regular form where every lane allows it, else the general one
// (whose scaling and special cases cost the closed step ~2% on avx2). Inputs from finite heads are
// regular except an exact 0, where kappa3 cancels (0.4% of the closed fit's elements in a digits run).
template <int W>
GMS_VINLINE void cbrt_w(const VD* v, VD* out) {
    VI irregular = splat<VI>(0);
    GMS_EACH irregular |= outside_binades<-900, 1024>(vabs(v[j]));
    if (any_high_word(irregular))
        cbrt_w_impl<W, false>(v, out);
    else
        cbrt_w_impl<W, true>(v, out);
}

// fit.knee_delta2: (kSkewKnee / |w1 w2 (w2 - w1)|)^(2/3), formed like it (the same libm pow), and
// kept per thread for the last denominator (a pow per block of 256 elements cost the closed step ~4%)
inline double knee_delta2(double denom) {
    static thread_local double last_denom = 0.0, last_knee2 = 0.0;
    if (denom != last_denom) {
        last_knee2 = denom == 0.0 ? 0.0 : std::pow(kSkewKnee / std::fabs(denom), 2.0 / 3.0);
        last_denom = denom;
    }
    return last_knee2;
}

// kappa3 = M3 - 3 M1 Var - M1^3 and fit_closed, branch-free (a too-skewed lane is in most vectors
// of typical inputs). One square root serves both the floor branch and the draw:
// sq = sqrt(skewed ? Var : s2); a skewed element has s2 = var_floor Var, so its standard deviation
// is sq sqrt(var_floor) and its |delta| = sqrt((Var - floor) / (w1 w2)) is
// sq sqrt((1 - var_floor) / (w1 w2)) (equal in exact arithmetic; within a few ulp here).
struct ClosedConsts {
    double w1, w2, w12, denom, inv_denom, var_floor, sd_floor, delta_floor, knee2;
    ClosedConsts(double w1_, double var_floor_) : w1(w1_), w2(1.0 - w1_), var_floor(var_floor_) {
        w12 = w1 * w2;
        denom = w12 * (w2 - w1);
        inv_denom = 1.0 / denom;
        sd_floor = std::sqrt(var_floor);
        delta_floor = std::sqrt((1.0 - var_floor) / w12);
        knee2 = knee_delta2(denom);
    }
};

template <int W>
GMS_NO_FMA_FN GMS_VINLINE void closed_fit_w(const ClosedConsts& c, const VD* m1, const VD* var_in, const VD* m3,
                                            VD* p1, VD* p2, VD* ps, VD* sd) {
    GMS_NO_FMA_BEGIN
    const VD zero = splat<VD>(0.0);
    VD var[W], t[W], delta[W], s2[W], floor[W], sq[W], knee2[W], line[W];
    VL skewed[W], below[W];
    GMS_EACH {
        var[j] = vmax(var_in[j], zero);  // (fit_closed clamps Var at 0)
        const VD k3 = (m3[j] - (3.0 * m1[j]) * var[j]) - (m1[j] * m1[j]) * m1[j];
        t[j] = div_exact(k3, splat<VD>(c.denom), splat<VD>(c.inv_denom));
    }
    // the straight line below the knee, q / knee2 with knee2 = knee_delta^2 Var, divided before the
    // cube root (the divider works beside the cube root's multiplications)
    GMS_EACH {
        knee2[j] = c.knee2 * var[j];
        line[j] = t[j] / knee2[j];
    }
    cbrt_w<W>(t, delta);
    GMS_EACH {
        below[j] = delta[j] * delta[j] < knee2[j];  // (false for NaN)
        delta[j] = select(below[j], line[j], delta[j]);
    }
    GMS_EACH {
        s2[j] = var[j] - c.w12 * (delta[j] * delta[j]);
        floor[j] = c.var_floor * var[j];
        skewed[j] = s2[j] < floor[j];
        s2[j] = select(skewed[j], floor[j], s2[j]);
        t[j] = select(skewed[j], var[j], s2[j]);
    }
    GMS_EACH sq[j] = sqrt_pos(t[j]);
    GMS_EACH {
        // sign(delta) * max_delta (delta is not 0 where skewed: there s2 = Var - w1 w2 delta^2 < var_floor Var <= Var)
        delta[j] = select(skewed[j], vor(sq[j] * c.delta_floor, sign_bit(delta[j])), delta[j]);
        sd[j] = select(skewed[j], sq[j] * c.sd_floor, sq[j]);
        p1[j] = m1[j] + c.w2 * delta[j];
        p2[j] = m1[j] - c.w1 * delta[j];
        ps[j] = s2[j];
    }
}

// mixture draw of kD elements: (u < w1 ? mu1 : mu2) + sd z in double, rounded once
GMS_NO_FMA_FN GMS_VINLINE VD mix_vec(VD p1, VD p2, VD sd, VFh z, VFh u, float w1f) {
    GMS_NO_FMA_BEGIN
    // (compared in double, exactly as in float32: a float32 mask widened to 64-bit lanes costs GCC four instructions)
    const VL first = widen(u) < splat<VD>(static_cast<double>(w1f));
    return select(first, p1, p2) + sd * widen(z);
}

// The closed-form fit and the mixture draw of n elements whose moments are in M1, VAR, M3
// (double, L1-resident, whole vectors) and whose random numbers are in Z, U. W: 8 vectors per pass
// on every target. With AVX2's and SSE2's 16 registers some of the pass's values spill, and still
// 8 vectors ran 10-11% faster than 4 (2, 6, 12 and 16 slower than 8; AMD EPYC Zen 4, GCC 12,
// 2026-11-29): the longer pass gives the out-of-order core more independent chains to overlap.
template <int W = 8>
GMS_NO_FMA_FN inline void closed_fit_mix(const ClosedConsts& cs, int n, const double* __restrict M1,
                                         const double* __restrict VAR, const double* __restrict M3,
                                         const float* __restrict Z, const float* __restrict U, float* out,
                                         float* __restrict mu1, float* __restrict mu2, float* __restrict s2) {
    GMS_NO_FMA_BEGIN
    const float w1f = static_cast<float>(cs.w1);
    for (int i = 0; i < n; i += kD * W) {
        VD m1[W], var[W], m3[W], p1[W], p2[W], ps[W], sd[W];
        GMS_EACH {  // (past n: lanes of the block arrays' padding, computed and not stored)
            m1[j] = load<VD>(M1 + i + kD * j);
            var[j] = load<VD>(VAR + i + kD * j);
            m3[j] = load<VD>(M3 + i + kD * j);
        }
        closed_fit_w<W>(cs, m1, var, m3, p1, p2, ps, sd);
        GMS_EACH {
            const int e = i + kD * j, left = n - e;
            if (left <= 0) break;
            if (mu1 != nullptr) store_narrow(mu1 + e, p1[j], left);
            if (mu2 != nullptr) store_narrow(mu2 + e, p2[j], left);
            if (s2 != nullptr) store_narrow(s2 + e, ps[j], left);
            store_narrow(out + e, mix_vec(p1[j], p2[j], sd[j], load<VFh>(Z + e), load<VFh>(U + e), w1f), left);
        }
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
// ADAN (Xie et al. 2022, as the official GMS code runs it) is run on rescaled state, exactly equivalent in real arithmetic and
// cheaper: for a parameter with gradient g = c P (c = scale w1, scale w2 for mu1, mu2; c = 1 and
// P = g for beta) the loop keeps m' = m/((1-b1) c), v' = v/((1-b2) c), n' = n/((1-b3) c^2):
//   m' <- b1 m' + P,  v' <- b2 v' + dP,  n' <- b3 n' + (P + b2 dP)^2
//   p  <- p - (sm m' + sv v') / (sn sqrt(n') + eps/c)
// with sm = (1-b1) lr/(1-b1^k), sv = (1-b2) lr b2/(1-b2^k), sn = sqrt((1-b3)/(1-b3^k)).
//
// Flops per element per iteration (fma = 2; sqrt, div, min, max = 1 each), as the code below does them:
//   residuals: s2 1, w1 a / w2 b / r1 3, w1 a^2 / w2 b^2 2, q 3, cubic 4, r2 2, r3 7      = 22
//   gradients: t3 1, r1 + s2 t3 2, 2 r2 1, mu1 mu2 2, P(mu1) P(mu2) 8, g_beta 4         = 18
//   ADAN, per parameter: dP 1, m' 2, v' 2, u 2, n' 3, numerator m' + rho v' 2, sqrt 1,
//                        denominator 2, div 1, update 1 = 17, times 3                    = 51
//   beta clamp                                                                             =  2
//   total                                                                                  = 93
// (benchmarks/run_cpu.py counts the rest of the step the same way.)
// Memory is not the bound (21 arrays read and 15 written per iteration, all in L1).
//
// The formulas are written once, over a "pack" P of lanes: T itself in the float64 loop (which
// the compiler vectorises), or one float32 vector (VF) in the software-pipelined loop below. Each
// iteration has three stages per pack: adan_gradients (residuals and gradients) and
// adan_moment_step (the moment updates), FMA work, and adan_update (square roots and divisions:
// divider work).
//
// Each array is padded by 64 bytes so that the 21 streams do not all sit at the same offset
// modulo 4 KiB (which can make the CPU stall loads behind unrelated stores: "4K aliasing"); the
// padding also holds the lanes of a last partial vector (kept at benign zeros).
constexpr int kAdanLanes = 16;  // (a multiple of every target's float32 lanes)
constexpr int kAdanStride = (kBlock + kAdanLanes - 1) / kAdanLanes * kAdanLanes + 64 / 4;
static_assert(kAdanLanes % kF == 0, "ADAN blocks hold whole vectors");

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

// Loads, stores and broadcasts of a pack P of T lanes (P = T: one lane; P = VF: one vector).
template <typename P, typename T>
struct Lanes {
    static GMS_VINLINE P load(const T* p) { return *p; }
    static GMS_VINLINE void store(T* p, P v) { *p = v; }
    static GMS_VINLINE P splat(double x) { return static_cast<P>(x); }
};
template <>
struct Lanes<VF, float> {
    static GMS_VINLINE VF load(const float* p) { return simd::load<VF>(p); }
    static GMS_VINLINE void store(float* p, VF v) { simd::store(p, v); }
    static GMS_VINLINE VF splat(double x) { return simd::splat<VF>(static_cast<float>(x)); }
};
template <typename T>
GMS_VINLINE T pack_div(T x, T d) {
    return x / d;
}
GMS_VINLINE VF pack_div(VF x, VF d) { return div_fast(x, d); }
template <typename T>
GMS_VINLINE T pack_sqrt(T x) {
    return std::sqrt(x);
}
GMS_VINLINE VF pack_sqrt(VF x) { return simd::sqrt(x); }
template <typename T>
GMS_VINLINE T pack_clamp(T v, T lo, T hi) {
    return simd::clamp(v, lo, hi);
}

// The scalars of one iteration, broadcast to packs.
template <typename P>
struct AdanPacks {
    P w1, w2, b1, b2, b3, lo, hi, three, rho, sigma, eps_a, eps_b, eps_be;
};

template <typename P, typename T>
AdanPacks<P> adan_packs(const AdanConfig& c, const AdanIterCoefs& it) {
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
GMS_VINLINE AdanNumerator<P> adan_moments(T* m, T* v, T* n, T* g_prev, P g, const AdanPacks<P>& c) {
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

// The gradients (P for mu1 and mu2, the full gradient for beta) of one pack.
template <typename P>
struct AdanGradients {
    P a, b, be;
};

// Stage 1 for the lanes at i: residuals and gradients.
template <typename P, typename T>
GMS_VINLINE AdanGradients<P> adan_gradients(const AdanBlock<T>& s, int i, const AdanPacks<P>& c) {
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
    // gradients
    const P t3 = c.three * r3;
    const P c0 = r1 + s2 * t3, c1 = r2 + r2;
    const P mu1 = M + a, mu2 = M + b;
    return {c0 + mu1 * (c1 + mu1 * t3), c0 + mu2 * (c1 + mu2 * t3), L::load(s.SV + i) * (r2 + (M + r1) * t3)};
}

// Stage 2 for the lanes at i: the moment updates of the three parameters from their gradients g.
template <bool FIRST, typename P, typename T>
GMS_VINLINE AdanPending<P> adan_moment_step(AdanBlock<T>& s, int i, const AdanGradients<P>& g,
                                            const AdanPacks<P>& c) {
    return {adan_moments<FIRST>(s.ma + i, s.va + i, s.na + i, s.ga + i, g.a, c),
            adan_moments<FIRST>(s.mb + i, s.vb + i, s.nb + i, s.gb + i, g.b, c),
            adan_moments<FIRST>(s.mbe + i, s.vbe + i, s.nbe + i, s.gbe + i, g.be, c)};
}

// Where stage 3 of the float32 loop gets the numerators and n': carried from stage 2 in registers, or read
// back from the state arrays stage 2 wrote a pass earlier (the same values: bit-identical). Reading back
// frees six vector registers; with AVX2's 16 the carried values spilled to the stack, and reading back is
// 2% faster on avx2 and 1-2% on avx512, but 12% slower on sse2 (benchmarks/cpp/adan_loop_bench.cpp, one
// thread, three alternating runs, AMD EPYC Zen 4, 2026-11-29).
constexpr bool kAdanReadBack = GMS_VBYTES >= 32;

// Stage 2's output for the lanes at i, from the state arrays it wrote.
template <typename P, typename T>
GMS_VINLINE AdanPending<P> adan_read_back(const AdanBlock<T>& s, int i, const AdanPacks<P>& c) {
    using L = Lanes<P, T>;
    const auto numerator = [&](const T* m, const T* v, const T* n) -> AdanNumerator<P> {
        return {L::load(m + i) + c.rho * L::load(v + i), L::load(n + i)};
    };
    return {numerator(s.ma, s.va, s.na), numerator(s.mb, s.vb, s.nb), numerator(s.mbe, s.vbe, s.nbe)};
}

// Stage 3 for the lanes at i: p <- p - num / (sigma sqrt(n') + eps/(c sm)), beta clamped to [lo, hi].
template <typename P, typename T>
GMS_VINLINE void adan_update(AdanBlock<T>& s, int i, const AdanPending<P>& carried, const AdanPacks<P>& c) {
    using L = Lanes<P, T>;
    AdanPending<P> p = carried;
    if constexpr (kAdanReadBack && std::is_same<P, VF>::value) p = adan_read_back(s, i, c);
    L::store(s.a + i, L::load(s.a + i) - pack_div(p.a.num, pack_sqrt(p.a.n) * c.sigma + c.eps_a));
    L::store(s.b + i, L::load(s.b + i) - pack_div(p.b.num, pack_sqrt(p.b.n) * c.sigma + c.eps_b));
    const P be = L::load(s.be + i) - pack_div(p.be.num, pack_sqrt(p.be.n) * c.sigma + c.eps_be);
    L::store(s.be + i, pack_clamp(be, c.lo, c.hi));
}

// One float64 iteration over lanes [0, n), one lane at a time (the compiler vectorises the loop).
template <bool FIRST>
void adan_iteration(AdanBlock<double>& s, int n, const AdanPacks<double>& packs) {
    const AdanPacks<double> c = packs;  // (a local copy: the compiler need not reload it after each store)
    GMS_SIMD
    for (int i = 0; i < n; ++i) adan_update(s, i, adan_moment_step<FIRST>(s, i, adan_gradients(s, i, c), c), c);
}

// One float32 iteration over lanes [0, n) rounded up to kF (n > 0), software-pipelined in three
// stages: one pass of the loop computes the gradients of the lanes i, the moment updates of the
// lanes i - kF and the square roots, divisions and parameter updates of the lanes i - 2 kF. Each
// stage then starts from values computed a pass earlier, so the out-of-order core overlaps the
// divider with the FMA units and does not wait on one vector's whole chain (about 90 cycles from a
// parameter to its update). With AVX2's 16 registers the stages' live values spill, and still:
// two stages were ~5% faster than finishing each vector in turn (10.2-10.5 against 10.9-11.0
// cycles per element and iteration, one thread, 2026-11-27); three stages faster than two by 8-9%
// on avx2, 4-5% on avx512 and 5% on sse2 (the loop of benchmarks/cpp/adan_loop_bench.cpp, one
// thread, AMD EPYC Zen 4, 2026-11-29; four stages, the square roots apart from the divisions, were
// slower again).
// GCC's pre-register-allocation scheduling with register pressure (off by default on x86) for this loop on
// avx2, whose 16 registers it overfills: 3% faster there (the same with the flags for the whole file, which made
// the sn-ddpm step 4% slower); slower on avx512 and 6% slower on sse2 (benchmarks/cpp/adan_loop_bench.cpp and
// benchmarks/compare_build.py, AMD EPYC Zen 4, GCC 12, 2026-11-29). Bit-identical: it only reorders.
#if defined(__GNUC__) && !defined(__clang__) && GMS_VBYTES == 32
#define GMS_ADAN_SCHEDULE __attribute__((optimize("schedule-insns", "sched-pressure")))
#else
#define GMS_ADAN_SCHEDULE
#endif
template <bool FIRST>
GMS_ADAN_SCHEDULE void adan_iteration(AdanBlock<float>& s, int n, const AdanPacks<VF>& packs) {
    // (a local copy, as above: read through the reference, the constants were reloaded after the
    // state stores, which may alias them)
    const AdanPacks<VF> c = packs;
    AdanGradients<VF> grad = adan_gradients(s, 0, c);
    AdanPending<VF> pending = adan_moment_step<FIRST>(s, 0, grad, c);
    if (n <= kF) {
        adan_update(s, 0, pending, c);
        return;
    }
    grad = adan_gradients(s, kF, c);
    int i = 2 * kF;
    for (; i < n; i += kF) {
        const AdanGradients<VF> next_grad = adan_gradients(s, i, c);
        const AdanPending<VF> next = adan_moment_step<FIRST>(s, i - kF, grad, c);
        adan_update(s, i - 2 * kF, pending, c);
        pending = next;
        grad = next_grad;
    }
    const AdanPending<VF> last = adan_moment_step<FIRST>(s, i - kF, grad, c);
    adan_update(s, i - 2 * kF, pending, c);
    adan_update(s, i - kF, last, c);
}
template <typename T>
using AdanPack = typename std::conditional<std::is_same<T, float>::value, VF, T>::type;

// Runs the ADAN fit of cfg on one block of n > 0 elements (state s, n lanes; lanes up to the next
// multiple of kAdanLanes are padding, set to zeros, which the fit keeps at zero).
template <typename T>
void adan_run(AdanBlock<T>& s, int n, const AdanConfig& cfg) {
    using P = AdanPack<T>;
    for (int k = 0; k < cfg.n_iters; ++k) {
        const AdanPacks<P> c = adan_packs<P, T>(cfg, cfg.iters[k]);
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
    const T scale = static_cast<T>(cfg.grad_scale);
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

// Central third moment kappa3 = M3 - 3 M1 Var - M1^3 in the reference's order, without fma (ADAN
// uses the Var as it is).
GMS_NO_FMA_FN inline void kappa3_block(int n, const double* __restrict M1, const double* __restrict VAR,
                                       const double* M3, double* K3) {  // K3 may be M3
    GMS_NO_FMA_BEGIN
    for (int i = 0; i < n; i += kD) {
        const VD m1 = load<VD>(M1 + i);
        store(K3 + i, (load<VD>(M3 + i) - (3.0 * m1) * load<VD>(VAR + i)) - (m1 * m1) * m1);
    }
}

// Elements whose scale could overflow float32 in the gradient or its square (|g| ~ scale S^5
// with S the largest of |M1|, sqrt|Var|, cbrt|kappa3|), whose cubic terms (~Var^1.5) would fall
// below float32's normal numbers (tiny variances), or that are not finite, are fitted in double.
// The choice is made per element, so that an element's result never depends on its neighbours.
// The bounds are gms_kernels.kernels.ADAN_FP32_LIMITS (step_api.h; the Triton kernel uses the same).
inline bool adan_needs_double(double m1, double var, double k3) {
    const double av = std::fabs(var);
    const bool in_range = (std::fabs(m1) <= kAdanFp32M1Max) & (av >= kAdanFp32VarMin) & (av <= kAdanFp32VarMax) &
                          (std::fabs(k3) <= kAdanFp32K3Max);
    return !in_range;  // (NaN compares false: not in range)
}

inline void adan_fit(const AdanConfig& cfg, int n, const double* M1, const double* VAR, const double* M3,
                     double* K3, double* P1, double* P2, double* PS) {
    kappa3_block(n, M1, VAR, M3, K3);
    if (cfg.fp64 || !(cfg.grad_scale <= 2.0)) {
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
inline void draw_block(const NoiseSource& src, int64_t e0, int n, float* __restrict Z, float* __restrict U) {
    alignas(64) uint32_t u0[kBlock], u1[kBlock];
    const uint64_t head0 = philox_counter(0, src.t, 0), head1 = philox_counter(1, src.t, 0);
    const bool pixel_u = U != nullptr && src.per_pixel;
    int64_t i = e0 / src.D, j = e0 % src.D;
    if (src.D >= 16) {
        // long runs of one sample: one key and consecutive counters per run
        for (int e = 0; e < n;) {
            const int len = static_cast<int>(n - e < src.D - j ? n - e : src.D - j);
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
        // (w0, w1 zeroed only because GCC's -Wmaybe-uninitialized, on with Python's -Wall, cannot see that
        // philox_block writes the n words normal_pairs reads; this path serves samples of fewer than 16 elements)
        alignas(64) uint32_t w0[kBlock] = {}, w1[kBlock] = {}, w2[kBlock], w3[kBlock];
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
    if (pixel_u) uniforms_block(n, u0, U);
}

// x = (u < w1 ? mu1 : mu2) + sqrt(max(s2, 0)) z, in double, rounded once (mixture.sample_mixture).
GMS_NO_FMA_FN inline void mix_block(int n, const double* __restrict P1, const double* __restrict P2,
                                    const double* __restrict PS, const float* __restrict Z,
                                    const float* __restrict U, float w1f, float* __restrict out) {
    GMS_NO_FMA_BEGIN
    for (int e = 0; e < n; e += kD) {
        const VD ps = load<VD>(PS + e);
        const VD sd = sqrt_pos(select(ps > splat<VD>(0.0), ps, splat<VD>(0.0)));
        store_narrow(out + e, mix_vec(load<VD>(P1 + e), load<VD>(P2 + e), sd, load<VFh>(Z + e), load<VFh>(U + e), w1f),
                     n - e);
    }
}

// N(M1, v) with v per element (VAR clamped to [0, cap]) or one fixed variance: PS <- v,
// out <- M1 + sqrt(v) z in double, rounded once. Without Z (a zero variance), out <- M1.
GMS_NO_FMA_FN inline void gaussian_block(int n, const double* __restrict M1, const double* __restrict VAR,
                                         double cap, double fixed_var, const float* __restrict Z, double* __restrict PS,
                                         float* __restrict out) {
    GMS_NO_FMA_BEGIN
    const VD zero = splat<VD>(0.0);
    const VD fixed_sd = splat<VD>(fixed_var > 0.0 ? std::sqrt(fixed_var) : 0.0);
    for (int e = 0; e < n; e += kD) {
        VD v, sd;
        if (VAR != nullptr) {
            v = load<VD>(VAR + e);
            v = vmin(select(v > zero, v, zero), splat<VD>(cap));
            sd = simd::sqrt(v);
        } else {
            v = splat<VD>(fixed_var);
            sd = fixed_sd;
        }
        store(PS + e, v);
        const VD m1 = load<VD>(M1 + e);
        store_narrow(out + e, Z != nullptr ? m1 + sd * widen(load<VFh>(Z + e)) : m1, n - e);
    }
}

// DDIM (solvers.ddim_step) with M1 = E[x0|x_t] (the moments of t -> data): eps = (x - a_t x0) / sigma_t,
// out <- a_s x0 + eps_scale eps (+ sqrt(noise_var) z), in double in the reference's order, rounded once.
GMS_NO_FMA_FN inline void ddim_block(int n, const Coefs& k, const float* __restrict x, const double* __restrict X0,
                                     double a_s, double eps_scale, double noise_var, const float* __restrict Z,
                                     float* __restrict out) {
    GMS_NO_FMA_BEGIN
    const VD sd = splat<VD>(noise_var > 0.0 ? std::sqrt(noise_var) : 0.0);
    for (int e = 0; e < n; e += kD) {
        const VD x0 = load<VD>(X0 + e);
        const VD eps = div_exact(load_widen(x + e, n - e) - k.a_t * x0, splat<VD>(k.sigma_t), splat<VD>(1.0 / k.sigma_t));
        VD x_s = a_s * x0 + eps_scale * eps;
        if (Z != nullptr) x_s = x_s + sd * widen(load<VFh>(Z + e));
        store_narrow(out + e, x_s, n - e);
    }
}

inline void store_params(int n, const double* P1, const double* P2, const double* PS, float* mu1, float* mu2,
                         float* s2) {
    const double* src[3] = {P1, P2, PS};
    float* dst[3] = {mu1, mu2, s2};
    for (int p = 0; p < 3; ++p)
        if (dst[p] != nullptr)
            for (int e = 0; e < n; e += kD) store_narrow(dst[p] + e, load<VD>(src[p] + e), n - e);
}

// ------------------------------------------------------------------------------------------
// The n elements [e0, e0 + n) of the flattened [N * D] input as one contiguous run: a pointer into
// the input where they are (always with stride D, and otherwise while the run stays within one
// sample), else a copy gathered into `staging`.
inline const float* block_input(const SampleInput& in, int64_t D, int64_t e0, int n, float* staging) {
    if (in.p == nullptr) return nullptr;
    if (in.stride == D) return in.p + e0;
    int64_t i = e0 / D, j = e0 % D;
    if (j + n <= D) return in.p + i * in.stride + j;
    for (int e = 0; e < n; j = 0, ++i) {
        const int len = static_cast<int>(n - e < D - j ? n - e : D - j);
        std::memcpy(staging + e, in.p + i * in.stride + j, sizeof(float) * static_cast<size_t>(len));
        e += len;
    }
    return staging;
}

// Whether all n values are finite, from the exponent bits (integer work on whole vectors; the
// values are in L1 already, read next by the moments).
inline bool all_finite(const float* p, int n) {
    if (p == nullptr) return true;
    const VU exponent = splat<VU>(0x7f800000u);
    VU bad = splat<VU>(0u);
    int i = 0;
    for (; i + kF <= n; i += kF) bad |= bits<VU>((load<VU>(p + i) & exponent) == exponent);
    uint32_t tail = 0;
    for (; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, p + i, sizeof u);
        tail |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
    return !any(bits<VI>(bad)) && tail == 0;
}

// One block of the step; returns false (and writes nothing) when an input it reads is not finite.
bool fused_block(const StepArgs& A, int64_t e0, int n) {
    alignas(64) float SX[kBlock], S1[kBlock], S2[kBlock], S3[kBlock];  // (used by blocks that straddle samples)
    alignas(64) float Z[kBlock], U[kBlock];
    const bool need_var = A.mode == kGaussian || A.mode == kClosed || A.mode == kAdan;
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
    switch (A.mode) {
        case kClosed:  // kappa3, fit, float32 parameters and the draw in one loop
            draw_block(A.noise, e0, n, Z, U);
            closed_fit_mix(ClosedConsts(A.w1, A.var_floor), n, M1, VAR, M3, Z, U, out, mu1, mu2, s2);
            return true;
        case kDenoise:
            gaussian_block(n, M1, nullptr, 0.0, 0.0, nullptr, PS, out);
            store_params(n, M1, M1, PS, mu1, mu2, s2);
            return true;
        case kGaussian:
        case kFixed: {
            const bool fixed = A.mode == kFixed;
            const bool noise = !fixed || A.fixed_var > 0.0;  // (a deterministic step draws nothing)
            if (noise) draw_block(A.noise, e0, n, Z, nullptr);
            gaussian_block(n, M1, fixed ? nullptr : VAR, A.var_cap, A.fixed_var, noise ? Z : nullptr, PS, out);
            store_params(n, M1, M1, PS, mu1, mu2, s2);
            return true;
        }
        case kDdim: {
            const bool noise = A.fixed_var > 0.0;
            if (noise) draw_block(A.noise, e0, n, Z, nullptr);
            ddim_block(n, A.coefs, x, M1, A.ddim_a_s, A.ddim_eps_scale, A.fixed_var, noise ? Z : nullptr, out);
            for (int e = 0; e < n; e += kD) store(PS + e, splat<VD>(A.fixed_var));
            store_params(n, M1, M1, PS, mu1, mu2, s2);
            return true;
        }
        default:  // kAdan (M3 is overwritten by kappa3)
            adan_fit(A.adan, n, M1, VAR, M3, M3, P1, P2, PS);
            break;
    }
    draw_block(A.noise, e0, n, Z, U);
    mix_block(n, P1, P2, PS, Z, U, static_cast<float>(A.w1), out);
    store_params(n, P1, P2, PS, mu1, mu2, s2);
    return true;
}

void mixture_block(const MixArgs& A, int64_t e0, int n) {
    alignas(64) double P1[kBlock], P2[kBlock], PS[kBlock];
    alignas(64) float Z[kBlock], U[kBlock];
    for (int e = 0; e < n; ++e) {
        P1[e] = A.mu1[e0 + e];
        P2[e] = A.mu2[e0 + e];
        PS[e] = A.s2[e0 + e];
    }
    for (int e = n; e < (n + kD - 1) / kD * kD; ++e) P1[e] = P2[e] = PS[e] = 0.0;
    draw_block(A.noise, e0, n, Z, U);
    mix_block(n, P1, P2, PS, Z, U, static_cast<float>(A.w1), A.out + e0);
}

// Runs fn(e0, n) over the blocks of [0, total), in parallel when OpenMP is there and the work is
// large enough to pay for waking threads. Threads take chunks of kChunkBlocks blocks as they
// finish (dynamic), not fixed halves: on a shared machine one core can run slower than another
// for seconds at a time, and a static split would wait for the slower one. Blocks are independent
// and draw counter-based random numbers, so the split does not change any result.
#ifdef _OPENMP
constexpr int kChunkBlocks = 8;
#endif

template <typename Fn>
void for_blocks(int64_t total, int num_threads, int64_t min_parallel, const Fn& fn) {
    const int64_t nblocks = (total + kBlock - 1) / kBlock;
#ifdef _OPENMP
    const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, kChunkBlocks) num_threads(threads) if (threads > 1 && total >= min_parallel)
#endif
    for (int64_t blk = 0; blk < nblocks; ++blk) {
        const int64_t e0 = blk * kBlock;
        fn(e0, static_cast<int>(total - e0 < kBlock ? total - e0 : kBlock));
    }
    (void)num_threads;
    (void)min_parallel;
}

// ------------------------------------------------------------------------------------------
// The target's entry points (TargetOps).
bool run_step(const StepArgs& A, int64_t total, int num_threads) {
    if (total == 0) return true;
    // the ADAN fit is ~100x the work of the other modes per element
    const int64_t min_parallel = A.mode == kAdan && A.adan.n_iters > 0 ? 2 * kBlock : 16 * kBlock;
    std::atomic<bool> finite{true};
    for_blocks(total, num_threads, min_parallel, [&](int64_t e0, int n) {
        if (!fused_block(A, e0, n)) finite.store(false, std::memory_order_relaxed);
    });
    return finite.load();
}

void run_mixture(const MixArgs& A, int64_t total, int num_threads) {
    if (total == 0) return;
    for_blocks(total, num_threads, 16 * kBlock, [&](int64_t e0, int n) { mixture_block(A, e0, n); });
}

void moments(const Coefs& k, int64_t total, const float* x, const float* e1, const float* e2, const float* e3,
             double* m1, double* var, double* m3) {
    alignas(64) double M1[kBlock], VAR[kBlock], M3[kBlock];
    for (int64_t e0 = 0; e0 < total; e0 += kBlock) {
        const int n = static_cast<int>(total - e0 < kBlock ? total - e0 : kBlock);
        moments_dispatch(k, n, x + e0, e1 + e0, e2 ? e2 + e0 : nullptr, e3 ? e3 + e0 : nullptr, M1, VAR, M3);
        std::memcpy(m1 + e0, M1, sizeof(double) * static_cast<size_t>(n));
        if (e2) std::memcpy(var + e0, VAR, sizeof(double) * static_cast<size_t>(n));
        if (e3) std::memcpy(m3 + e0, M3, sizeof(double) * static_cast<size_t>(n));
    }
}

void normals(int64_t n, const uint64_t* seeds, bool one_seed, const uint64_t* offsets, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = philox_normal(seeds[one_seed ? 0 : i], offsets[i]);
}

#define GMS_STR2(x) #x
#define GMS_STR(x) GMS_STR2(x)
extern const TargetOps ops;
const TargetOps ops = {GMS_STR(GMS_TARGET_NS),
                       kBytes,
#ifdef GMS_VEC_FMA
                       true,
#else
                       false,
#endif
                       kSkewKnee,
                       &run_step,
                       &run_mixture,
                       &moments,
                       &normals};

}  // namespace GMS_TARGET_NS
}  // namespace gms
