// The step's scalars as the kernels take them (step_api.h: Coefs, AdanIterCoefs), formed once per
// call from the Python-side configuration. Included by the bindings (csrc/gms_step.cpp) and the C++
// benchmarks, not by the per-target kernels: these run once per step, in the baseline ISA.
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "step_api.h"

namespace gms {

constexpr double kAdanBeta1 = 0.9, kAdanBeta2 = 0.92, kAdanBeta3 = 0.92, kAdanEps = 1e-8;

// ------------------------------------------------------------------------------------------
// Step coefficients (step_api.h: Coefs), formed like the reference forms them.
inline Coefs make_coefs(double a, double s, double c1, double c2, double lam2, bool rng, double c, double h) {
    Coefs k{};
    k.a_t = a;
    k.sigma_t = s;
    k.c1 = c1;
    k.c2 = c2;
    k.lam2 = lam2;
    k.has_range = rng;
    k.center = c;
    k.half = h;
    k.unit_range = rng && c == 0.0 && h == 1.0;
    const double r = s / a;
    k.r_sq = r * r;
    k.two_sigma = 2 * s;
    k.sigma_sq = std::pow(s, 2.0);
    k.a_sq = std::pow(a, 2.0);
    k.three_sigma = 3 * s;
    k.three_sigma_sq = 3 * k.sigma_sq;
    k.sigma_cube = std::pow(s, 3.0);
    k.a_cube = std::pow(a, 3.0);
    k.h_sq = std::pow(h, 2.0);
    k.h_cube = std::pow(h, 3.0);
    k.c_c = c * c;
    k.two_c = 2 * c;
    k.three_c = 3 * c;
    k.three_c_c = k.three_c * c;
    k.c_cube = std::pow(c, 3.0);
    k.two_c_h = k.two_c * h;
    k.h_h = h * h;
    k.three_c_c_h = k.three_c_c * h;
    k.three_c_h_h = k.three_c * h * h;
    k.c2_sq = std::pow(c2, 2.0);
    k.c2_cube = std::pow(c2, 3.0);
    k.three_lam2 = 3 * lam2;
    k.inv_a = 1.0 / a;
    k.inv_a_sq = 1.0 / k.a_sq;
    k.inv_a_cube = 1.0 / k.a_cube;
    k.inv_half = 1.0 / h;
    k.inv_h_sq = 1.0 / k.h_sq;
    k.inv_h_cube = 1.0 / k.h_cube;
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
