// The step's scalars as the kernels take them (step_api.h: Coefs, AdanIterCoefs), formed once per
// call from the Python-side configuration. Included by the bindings (csrc/gms_step.cpp) and the C++
// benchmarks, not by the per-target kernels: these run once per step, in the baseline ISA.
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "step_api.h"

namespace gms {

// ------------------------------------------------------------------------------------------
// Step coefficients (step_api.h: Coefs) from the step's scalar table, which gms_kernels/kernels/scalars.py
// forms on the host like the reference forms each product (step_scalars). The entries read, in the order
// they are passed: (name in the table, field of Coefs).
#define GMS_COEF_SCALARS(X)                                                                                    \
    X(a_t, a_t) X(sigma_t, sigma_t) X(c1, c1) X(c2, c2) X(lam2, lam2) X(c, center) X(h, half) X(rr, r_sq)       \
    X(two_sigma, two_sigma) X(sigma_sq, sigma_sq) X(a_sq, a_sq) X(three_sigma, three_sigma)                      \
    X(three_sigma_sq, three_sigma_sq) X(sigma_cu, sigma_cube) X(a_cu, a_cube) X(h_sq, h_sq) X(h_cu, h_cube)      \
    X(cc, c_c) X(two_c, two_c) X(three_c, three_c) X(three_c_c, three_c_c) X(c_cu, c_cube) X(two_c_h, two_c_h)   \
    X(hh, h_h) X(three_c_c_h, three_c_c_h) X(three_c_h_h, three_c_h_h) X(c2_sq, c2_sq) X(c2_cu, c2_cube)         \
    X(three_lam2, three_lam2) X(inv_a, inv_a) X(inv_a_sq, inv_a_sq) X(inv_a_cu, inv_a_cube) X(inv_h, inv_half)   \
    X(inv_h_sq, inv_h_sq) X(inv_h_cu, inv_h_cube)

#define GMS_SCALAR_NAME(name, field) #name,
constexpr const char* kCoefScalars[] = {GMS_COEF_SCALARS(GMS_SCALAR_NAME)};
#undef GMS_SCALAR_NAME
constexpr size_t kNumCoefScalars = sizeof(kCoefScalars) / sizeof(kCoefScalars[0]);

inline Coefs coefs_from_scalars(const std::vector<double>& scalars, bool has_range) {
    if (scalars.size() != kNumCoefScalars)
        throw std::invalid_argument("the step's scalar table has " + std::to_string(scalars.size()) +
                                    " entries, expected " + std::to_string(kNumCoefScalars) + " (STEP_SCALARS)");
    Coefs k{};
    size_t i = 0;
#define GMS_SCALAR_READ(name, field) k.field = scalars[i++];
    GMS_COEF_SCALARS(GMS_SCALAR_READ)
#undef GMS_SCALAR_READ
    k.has_range = has_range;
    k.unit_range = has_range && k.center == 0.0 && k.half == 1.0;
    return k;
}

// eps / c for a gradient scaled by c > 0, kept finite (a zero scale means no step: num / 1e30)
inline double adan_eps_over(double c) {
    const double e = kAdanEps / c;
    return static_cast<double>(static_cast<float>(e < 1e30 ? e : 1e30));
}

// The constants of each ADAN iteration. The step (sm m' + sv v') / (sn sqrt(n') + eps/c), with
// sm = (1-b1) lr/(1-b1^k), sv = (1-b2) lr b2/(1-b2^k), sn = sqrt((1-b3)/(1-b3^k)), is evaluated
// divided through by sm, as (m' + rho v') / (sigma sqrt(n') + eps/(c sm)) with rho = sv/sm and
// sigma = sn/sm: one multiplication fewer per parameter.
inline std::vector<AdanIterCoefs> adan_iteration_coefs(const std::vector<double>& lrs, double w1, double grad_scale) {
    // eps / (c sm), capped like adan_eps_over: 1e30 still means "no step", and the denominator
    // sigma sqrt(n') + eps' (sigma <= 1e11, sqrt(n') <= 2e19) stays finite in float32
    const double eps_a = adan_eps_over(grad_scale * w1), eps_b = adan_eps_over(grad_scale * (1.0 - w1));
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

}  // namespace gms
