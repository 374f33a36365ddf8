// gms_kernels._C: the fused GMS step on CPU, torch-free (pybind11 + raw float buffers).
//
// This file holds the Python bindings, the checks of their arguments and the choice of target;
// the kernels are in csrc/step_target.cpp, written once over portable vectors (csrc/simd.h) and
// compiled once per target ISA by setup.py (x86-64: avx512, avx2, sse2; elsewhere: baseline).
// At import the best target that the CPU runs is chosen (GMS_KERNELS_CPU_TARGET, read by the
// Python launcher, or set_target() can ask for another one, e.g. to test or time the AVX2 code
// on an AVX-512 machine). See gms_kernels/kernels/__init__.py for the step's contract.
//
// x_t and the heads are N samples of D float32 each, consecutive samples `stride` elements apart
// (stride D: flat arrays; 3 D: heads sliced out of one [N, 3C, ...] model output), so that the
// launcher can pass views instead of copies. Outputs are flat [N * D].

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef GMS_TARGETS_X86
#include <cpuid.h>
#endif

#include "philox.h"
#include "step_api.h"
#include "step_config.h"

namespace py = pybind11;

// The compiled targets, best first (setup.py defines GMS_TARGETS_X86 when it built the three x86
// ones; otherwise there is one, `baseline`).
#ifdef GMS_TARGETS_X86
namespace gms {
namespace avx512 { extern const TargetOps ops; }
namespace avx2 { extern const TargetOps ops; }
namespace sse2 { extern const TargetOps ops; }
}  // namespace gms
#else
namespace gms {
namespace baseline { extern const TargetOps ops; }
}  // namespace gms
#endif

namespace gms {


// ------------------------------------------------------------------------------------------
// Targets: which were compiled, which this CPU runs, which is in use.
struct TargetEntry {
    const TargetOps* ops;
    const char* features;  // what the CPU must have (for messages)
    bool (*supported)();
};

#ifdef GMS_TARGETS_X86
// The CPU's features from CPUID, and whether the OS saves the vector registers they use (XGETBV).
// Read directly rather than through __builtin_cpu_supports, which depends on the compiler's runtime
// library: a Clang build linked against a compiler-rt without the CPU-model initialiser reports no
// feature at all, and the extension then ran the SSE2 code on an AVX-512 machine.
struct X86Features {
    bool avx2 = false, avx512 = false;
    X86Features() {
        unsigned a, b, c, d;
        if (!__get_cpuid(1, &a, &b, &c, &d)) return;
        const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28);
        if (!(osxsave && avx) || __get_cpuid_max(0, nullptr) < 7) return;
        unsigned xcr0_lo, xcr0_hi;
        __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
        const bool ymm_saved = (xcr0_lo & 0x6u) == 0x6u;      // XMM and YMM state
        const bool zmm_saved = (xcr0_lo & 0xE6u) == 0xE6u;    // and opmask, ZMM_Hi256, Hi16_ZMM
        __cpuid_count(7, 0, a, b, c, d);
        const bool avx2_bit = b & (1u << 5), bmi2 = b & (1u << 8);
        const bool f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
        avx2 = ymm_saved && avx2_bit && fma && bmi2;
        avx512 = avx2 && zmm_saved && f && dq && bw && vl;
    }
};
const X86Features& x86_features() {
    static const X86Features features;
    return features;
}
bool cpu_has_avx512() { return x86_features().avx512; }
bool cpu_has_avx2() { return x86_features().avx2; }
bool always() { return true; }
const TargetEntry kTargets[] = {{&avx512::ops, "AVX-512 F/DQ/VL/BW, AVX2, FMA", &cpu_has_avx512},
                                {&avx2::ops, "AVX2, FMA, BMI2", &cpu_has_avx2},
                                {&sse2::ops, "SSE2 (every x86-64)", &always}};
#else
bool always() { return true; }
const TargetEntry kTargets[] = {{&baseline::ops, "the compiler's default for this machine", &always}};
#endif
constexpr int kNumTargets = static_cast<int>(sizeof(kTargets) / sizeof(kTargets[0]));

int best_target() {
    for (int i = 0; i < kNumTargets; ++i)
        if (kTargets[i].supported()) return i;
    return kNumTargets - 1;
}

int g_target = best_target();  // (set at load, changed by set_target)

const TargetOps& ops() { return *kTargets[g_target].ops; }

void set_target(const std::string& name) {
    for (int i = 0; i < kNumTargets; ++i) {
        if (name != kTargets[i].ops->name) continue;
        if (!kTargets[i].supported())
            throw std::invalid_argument("this CPU cannot run the " + name + " target (it needs " + kTargets[i].features +
                                        ")");
        g_target = i;
        return;
    }
    std::string known;
    for (int i = 0; i < kNumTargets; ++i) known += std::string(i ? ", " : "") + kTargets[i].ops->name;
    throw std::invalid_argument("unknown CPU target '" + name + "'; this build has: " + known);
}

py::dict cpu_info() {
    py::dict d;
    d["target"] = ops().name;
    d["best"] = kTargets[best_target()].ops->name;
    py::list compiled, runnable;
    for (int i = 0; i < kNumTargets; ++i) {
        compiled.append(kTargets[i].ops->name);
        if (kTargets[i].supported()) runnable.append(kTargets[i].ops->name);
    }
    d["compiled"] = compiled;
    d["supported"] = runnable;
    d["vector_bits"] = ops().vector_bytes * 8;
    d["fma"] = ops().fma;
    return d;
}



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

// StepArgs without its buffers and noise, from the step's configuration (checked); the ADAN
// iteration constants go to `iters`, which must outlive the step.
StepArgs step_config(int64_t N, int64_t D, int mode, int64_t t, const std::vector<double>& scalars, bool has_range,
                     double var_cap, double w1, double var_floor, const std::vector<double>& lrs, double grad_scale,
                     bool per_pixel, bool adan_fp64, double fixed_var, double ddim_a_s, double ddim_eps_scale,
                     std::vector<AdanIterCoefs>& iters) {
    check_sizes(N, D);
    if (mode < kGaussian || mode > kDdim) throw std::invalid_argument("unknown mode " + std::to_string(mode));
    const Coefs coefs = coefs_from_scalars(scalars, has_range);
    const double half = coefs.half, sigma_t = coefs.sigma_t;
    if (has_range && !(half > 0.0)) throw std::invalid_argument("half must be positive with a data range");
    if ((mode == kFixed || mode == kDdim) && !(fixed_var >= 0.0 && fixed_var < HUGE_VAL))
        throw std::invalid_argument("fixed_var must be a finite variance >= 0");
    if (mode == kDdim && !(std::isfinite(ddim_a_s) && std::isfinite(ddim_eps_scale) && sigma_t != 0.0))
        throw std::invalid_argument("DDIM needs finite a_s and eps_scale and a nonzero sigma_t");
    (void)t;
    StepArgs A{};
    A.noise = NoiseSource{nullptr, nullptr, D, 0, per_pixel};
    A.mode = mode;
    A.coefs = coefs;
    A.var_cap = var_cap;
    A.w1 = w1;
    A.var_floor = var_floor;
    A.fixed_var = fixed_var;
    A.ddim_a_s = ddim_a_s;
    A.ddim_eps_scale = ddim_eps_scale;
    if (mode == kAdan) iters = adan_iteration_coefs(lrs, w1, grad_scale);
    A.adan = AdanConfig{w1, grad_scale, iters.data(), static_cast<int>(iters.size()), adan_fp64};
    return A;
}

// Runs the step over all N * D elements without the GIL; whether every input it read was finite
// (otherwise the output is incomplete).
bool run_step(const StepArgs& A, int64_t total, int num_threads) {
    if (total == 0) return true;
    py::gil_scoped_release release;
    return ops().run_step(A, total, num_threads);
}

bool fused_step_py(py::object x_t, py::object e1, py::object e2, py::object e3, py::object seeds, py::object indices,
                   py::object out, py::object mu1, py::object mu2, py::object s2, int64_t N, int64_t D, int mode,
                   int64_t t, std::vector<double> scalars, bool has_range, double var_cap, double w1,
                   double var_floor, std::vector<double> lrs, double grad_scale, bool per_pixel, int num_threads,
                   bool adan_fp64, int64_t x_stride,
                   int64_t e1_stride, int64_t e2_stride, int64_t e3_stride, double fixed_var, double ddim_a_s,
                   double ddim_eps_scale) {
    std::vector<AdanIterCoefs> iters;
    StepArgs A = step_config(N, D, mode, t, scalars, has_range, var_cap, w1, var_floor, lrs, grad_scale, per_pixel,
                             adan_fp64, fixed_var, ddim_a_s, ddim_eps_scale, iters);
    const int64_t total = N * D;
    std::vector<py::object> keep;
    A.x = sample_input(x_t, N, D, x_stride, "x_t", keep, true);
    A.e1 = sample_input(e1, N, D, e1_stride, "e1", keep, true);
    A.e2 = sample_input(e2, N, D, e2_stride, "e2", keep, mode == kGaussian || mode == kClosed || mode == kAdan);
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
                      int64_t t, std::vector<double> scalars, bool has_range, double var_cap, double w1,
                      double var_floor, std::vector<double> lrs, double grad_scale, bool per_pixel, int num_threads,
                      bool adan_fp64, double fixed_var, double ddim_a_s, double ddim_eps_scale) {
    std::vector<AdanIterCoefs> iters;
    StepArgs A = step_config(N, D, mode, t, scalars, has_range, var_cap, w1, var_floor, lrs, grad_scale, per_pixel,
                             adan_fp64, fixed_var, ddim_a_s, ddim_eps_scale, iters);
    const int64_t total = N * D;
    const bool need_e2 = mode == kGaussian || mode == kClosed || mode == kAdan, need_e3 = mode == kClosed || mode == kAdan;
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
    ops().run_mixture(A, total, num_threads);
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
    if (NORMAL) {  // (the chosen target's normals: the numbers its step draws)
        ops().normals(k.n, s, k.one_seed, o, r);
        return result;
    }
    for (int64_t i = 0; i < k.n; ++i) r[i] = philox_uniform(s[k.one_seed ? 0 : i], o[i]);
    return result;
}

py::tuple moments_py(py::object x_t, py::object e1, py::object e2, py::object e3, std::vector<double> scalars,
                     bool has_range) {
    std::vector<py::object> keep;
    FloatIn xa = FloatIn::ensure(x_t);
    if (!xa) throw std::invalid_argument("x_t must be convertible to a float32 array");
    const int64_t total = xa.size();
    const float* x = float_input(xa, total, "x_t", keep, true);
    const float* h1 = float_input(e1, total, "e1", keep, true);
    const float* h2 = float_input(e2, total, "e2", keep, false);
    const float* h3 = h2 ? float_input(e3, total, "e3", keep, false) : nullptr;
    const Coefs k = coefs_from_scalars(scalars, has_range);
    py::array_t<double> m1(total), var(total), m3(total);
    ops().moments(k, total, x, h1, h2, h3, m1.mutable_data(), var.mutable_data(), m3.mutable_data());
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
    d["block"] = kBlock;
    d["isa"] = ops().name;  // the target in use (cpu_info() says more)
    d["kernels"] = "portable";  // one vector source, compiled per target (csrc/step_target.cpp)
    py::list targets;
    for (int i = 0; i < kNumTargets; ++i) targets.append(kTargets[i].ops->name);
    d["targets"] = targets;
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
    m.attr("MODE_FIXED") = static_cast<int>(gms::kFixed);
    m.attr("MODE_DDIM") = static_cast<int>(gms::kDdim);
    m.attr("CLOSED_SKEW_KNEE") = gms::ops().skew_knee;  // fit.SKEW_KNEE (checked by the tests)
    // the entries of the step's scalar table (gms_kernels/kernels/scalars.py) that `scalars` holds, in order
    py::tuple names(gms::kNumCoefScalars);
    for (size_t i = 0; i < gms::kNumCoefScalars; ++i) names[i] = gms::kCoefScalars[i];
    m.attr("STEP_SCALARS") = names;
    m.def("fused_step", &gms::fused_step_py,
          "One fused GMS step over flattened float32 [N*D] buffers (see gms_kernels.kernels). "
          "e2/e3 may be None where the mode does not read them; mu1/mu2/s2 None skips writing them. "
          "x_stride/e1_stride/e2_stride/e3_stride: elements from one sample's start to the next in that "
          "input (default D: the flat array; e.g. 3 D for a head sliced out of a [N, 3C, ...] output, "
          "passed as the 1-D span from its first element); out/mu1/mu2/s2 are always flat [N*D]. "
          "Returns False when an input it read held a NaN or inf (the outputs are then incomplete).",
          "x_t"_a, "e1"_a, "e2"_a, "e3"_a, "seeds"_a, "indices"_a, "out"_a, "mu1"_a, "mu2"_a, "s2"_a, "N"_a,
          "D"_a, "mode"_a, "t"_a, "scalars"_a, "has_range"_a, "var_cap"_a, "w1"_a, "var_floor"_a, "lrs"_a,
          "grad_scale"_a, "per_pixel"_a,
          "num_threads"_a = 0, "adan_fp64"_a = false, "x_stride"_a = -1, "e1_stride"_a = -1, "e2_stride"_a = -1,
          "e3_stride"_a = -1, "fixed_var"_a = 0.0, "ddim_a_s"_a = 0.0, "ddim_eps_scale"_a = 0.0);
    m.def("fused_step_at", &gms::fused_step_at_py,
          "fused_step on raw addresses (0: not given) of buffers the caller owns and has checked: the launcher's "
          "fast path. Inputs are N samples of D float32, `stride` elements apart; outputs flat [N*D] float32; "
          "seeds and indices int64 [N].",
          "x_t"_a, "x_stride"_a, "e1"_a, "e1_stride"_a, "e2"_a, "e2_stride"_a, "e3"_a, "e3_stride"_a, "seeds"_a,
          "indices"_a, "out"_a, "mu1"_a, "mu2"_a, "s2"_a, "N"_a, "D"_a, "mode"_a, "t"_a, "scalars"_a,
          "has_range"_a, "var_cap"_a, "w1"_a, "var_floor"_a, "lrs"_a, "grad_scale"_a, "per_pixel"_a, "num_threads"_a, "adan_fp64"_a, "fixed_var"_a = 0.0, "ddim_a_s"_a = 0.0,
          "ddim_eps_scale"_a = 0.0);
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
          "e2"_a, "e3"_a, "scalars"_a, "has_range"_a);
    m.def("build_info", &gms::build_info, "How this extension was built (OpenMP, target in use, block size).");
    m.def("cpu_info", &gms::cpu_info,
          "The kernels' target in use, the best one this CPU runs, and those compiled and supported.");
    m.def("set_target", &gms::set_target,
          "Use the kernels compiled for this target (one of cpu_info()['supported']).", "name"_a);
}

