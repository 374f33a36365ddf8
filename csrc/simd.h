// The portable vector layer of the fused step: GCC/Clang vector extensions whose width is the
// target's (GMS_VBYTES: 64 for AVX-512, 32 for AVX2, 16 for SSE2 and NEON), so that the kernels
// are written once over whole vectors and each target's translation unit compiles them to its
// own instructions (csrc/step_target.cpp, included once per target by setup.py's build).
//
// Kernels use only the types and helpers below: elementwise operators, comparisons (lane masks),
// select, min / max, conversions, whole-vector loads and stores. The few operations the vector
// extensions cannot spell efficiently get a per-ISA form here, each beside a generic one that
// gives the same result (to the documented accuracy):
//   fma, sqrt  the instructions (lane loops are left unvectorised in functions without contraction);
//   vmax, vmin maxpd / minpd on x86 (the same select, one instruction);
//   any        whether a comparison holds in some lane;
//   mul_wide   32 x 32 -> 64-bit products of the low words of 64-bit lanes (Philox);
//   sqrt_pos   a square root of s >= 0 (the draw's standard deviation);
//   widen, widen_int, widen_u32, low_words, pack_low_words
//              half-width <-> full-width conversions and the Philox word packing, one instruction each on
//              AVX-512 and AVX2 (GCC 12 splits the generic forms there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#ifndef GMS_VBYTES
#define GMS_VBYTES 16
#endif

#if defined(__x86_64__) || defined(__i386__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#if defined(__GNUC__)
#define GMS_VINLINE inline __attribute__((always_inline))
#else
#define GMS_VINLINE inline
#endif

#ifndef GMS_TARGET_NS
#error "simd.h belongs to a target translation unit: define GMS_TARGET_NS (see csrc/step_target.cpp)"
#endif

// (inside the target's namespace: the inline functions of two targets never meet at link time)
namespace gms {
namespace GMS_TARGET_NS {
namespace simd {

constexpr int kBytes = GMS_VBYTES;
constexpr int kF = kBytes / 4;  // float32 lanes per vector
constexpr int kD = kBytes / 8;  // float64 lanes per vector

typedef float VF __attribute__((vector_size(kBytes)));
typedef int32_t VI __attribute__((vector_size(kBytes)));
typedef uint32_t VU __attribute__((vector_size(kBytes)));
typedef double VD __attribute__((vector_size(kBytes)));
typedef int64_t VL __attribute__((vector_size(kBytes)));
typedef uint64_t VQ __attribute__((vector_size(kBytes)));
// half-width vectors: kD float32 / int32 / uint32 lanes, the partners of VD / VQ in conversions
typedef float VFh __attribute__((vector_size(kBytes / 2)));
typedef int32_t VIh __attribute__((vector_size(kBytes / 2)));
typedef uint32_t VUh __attribute__((vector_size(kBytes / 2)));

template <typename V>
GMS_VINLINE V load(const void* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
template <typename V>
GMS_VINLINE void store(void* p, V v) {
    std::memcpy(p, &v, sizeof v);
}
// the type of one lane of vector type V
template <typename V>
using Lane = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<V>()[0])>>;
// x in every lane: x - 0 (an identity the compiler folds into a broadcast; V{} + x would be an
// addition it must keep, since -0 + 0 = +0). x is converted to the lane type first: Clang refuses to
// mix a scalar with a vector of another type of the same width (unsigned long long against uint64_t
// lanes, which are unsigned long on LP64 Linux), where GCC converts silently.
template <typename V, typename S>
GMS_VINLINE V splat(S x) {
    return static_cast<Lane<V>>(x) - V{};
}
// the bits of v as another vector type of the same size
template <typename To, typename From>
GMS_VINLINE To bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit casts keep the size");
    return (To)v;
}

// m ? a : b lane by lane (m: a comparison's result, all ones or zero per lane)
template <typename M, typename V>
GMS_VINLINE V select(M m, V a, V b) {
    return m ? a : b;
}
// max(v, lo) as (v > lo ? v : lo) and min likewise: a NaN v gives lo (resp. hi). x86's maxpd /
// minpd compute exactly that (the compiler may not use them for the select: it would need
// -ffinite-math-only), so they are used there.
template <typename V>
GMS_VINLINE V vmax(V v, V lo) {
    return v > lo ? v : lo;
}
template <typename V>
GMS_VINLINE V vmin(V v, V hi) {
    return v < hi ? v : hi;
}
// maxpd / minpd and maxps / minps of one vector width (PFX: the intrinsics' prefix; D, F: the double and
// float vector types)
#define GMS_X86_MIN_MAX(PFX, D, F)                                                                           \
    template <>                                                                                              \
    GMS_VINLINE VD vmax(VD v, VD lo) { return bits<VD>(PFX##_max_pd(bits<D>(v), bits<D>(lo))); }             \
    template <>                                                                                              \
    GMS_VINLINE VD vmin(VD v, VD hi) { return bits<VD>(PFX##_min_pd(bits<D>(v), bits<D>(hi))); }             \
    template <>                                                                                              \
    GMS_VINLINE VF vmax(VF v, VF lo) { return bits<VF>(PFX##_max_ps(bits<F>(v), bits<F>(lo))); }             \
    template <>                                                                                              \
    GMS_VINLINE VF vmin(VF v, VF hi) { return bits<VF>(PFX##_min_ps(bits<F>(v), bits<F>(hi))); }
#if GMS_VBYTES == 64 && defined(__AVX512F__)
GMS_X86_MIN_MAX(_mm512, __m512d, __m512)
#elif GMS_VBYTES == 32 && defined(__AVX__)
GMS_X86_MIN_MAX(_mm256, __m256d, __m256)
#elif GMS_VBYTES == 16 && defined(__SSE2__)
GMS_X86_MIN_MAX(_mm, __m128d, __m128)
#endif
#undef GMS_X86_MIN_MAX
template <typename V>
GMS_VINLINE V clamp(V v, V lo, V hi) {
    return vmin(vmax(v, lo), hi);
}
GMS_VINLINE VD vabs(VD v) { return bits<VD>(bits<VQ>(v) & splat<VQ>(0x7FFFFFFFFFFFFFFFull)); }
GMS_VINLINE VD sign_bit(VD v) { return bits<VD>(bits<VQ>(v) & splat<VQ>(0x8000000000000000ull)); }
GMS_VINLINE VD vor(VD a, VD b) { return bits<VD>(bits<VQ>(a) | bits<VQ>(b)); }
GMS_VINLINE VD vxor(VD a, VD b) { return bits<VD>(bits<VQ>(a) ^ bits<VQ>(b)); }
// whether any lane of a comparison's result is set (a mask test on x86: the lane loop of the generic
// form becomes one extraction per lane there). any() takes the mask of a float64 or float32 comparison
// whatever integer type the compiler gives it (GCC: int64_t / int32_t lanes; Clang: long long lanes
// for doubles, which match neither overload exactly).
GMS_VINLINE bool any_of_64(VL m) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return _mm512_test_epi64_mask(bits<__m512i>(m), bits<__m512i>(m)) != 0;
#elif GMS_VBYTES == 32 && defined(__AVX__)
    return _mm256_movemask_pd(bits<__m256d>(m)) != 0;
#elif GMS_VBYTES == 16 && defined(__SSE2__)
    return _mm_movemask_pd(bits<__m128d>(m)) != 0;
#else
    bool r = false;
    for (int i = 0; i < kD; ++i) r |= m[i] != 0;
    return r;
#endif
}
GMS_VINLINE bool any_of_32(VI m) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return _mm512_test_epi32_mask(bits<__m512i>(m), bits<__m512i>(m)) != 0;
#elif GMS_VBYTES == 32 && defined(__AVX__)
    return _mm256_movemask_ps(bits<__m256>(m)) != 0;
#elif GMS_VBYTES == 16 && defined(__SSE2__)
    return _mm_movemask_ps(bits<__m128>(m)) != 0;
#else
    bool r = false;
    for (int i = 0; i < kF; ++i) r |= m[i] != 0;
    return r;
#endif
}
template <typename M>
GMS_VINLINE bool any(M m) {
    static_assert(sizeof(M) == kBytes, "a whole vector's mask");
    if constexpr (sizeof(Lane<M>) == 8) {
        return any_of_64(bits<VL>(m));
    } else {
        static_assert(sizeof(Lane<M>) == 4, "float64 or float32 lanes");
        return any_of_32(bits<VI>(m));
    }
}

// Conversions between half-width (kD lanes of 32 bits) and full-width vectors. GCC 12 lowers the
// widening ones, and the truncation to the low words, of a whole AVX-512 or AVX2 half in two
// halves and an insert (four instructions instead of one: 9% of the sn-ddpm step on Zen 4), so
// those targets name the one instruction; the results are the same (the conversions are exact).
GMS_VINLINE VD widen(VFh v) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VD>(_mm512_cvtps_pd(bits<__m256>(v)));
#elif GMS_VBYTES == 32 && defined(__AVX__)
    return bits<VD>(_mm256_cvtps_pd(bits<__m128>(v)));
#else
    return __builtin_convertvector(v, VD);
#endif
}
GMS_VINLINE VFh narrow(VD v) { return __builtin_convertvector(v, VFh); }
GMS_VINLINE VD widen_int(VIh v) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VD>(_mm512_cvtepi32_pd(bits<__m256i>(v)));
#elif GMS_VBYTES == 32 && defined(__AVX__)
    return bits<VD>(_mm256_cvtepi32_pd(bits<__m128i>(v)));
#else
    return __builtin_convertvector(v, VD);
#endif
}
GMS_VINLINE VQ widen_u32(VUh v) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VQ>(_mm512_cvtepu32_epi64(bits<__m256i>(v)));
#elif GMS_VBYTES == 32 && defined(__AVX2__)
    return bits<VQ>(_mm256_cvtepu32_epi64(bits<__m128i>(v)));
#else
    return __builtin_convertvector(v, VQ);
#endif
}
GMS_VINLINE VUh low_words(VQ v) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VUh>(_mm512_cvtepi64_epi32(bits<__m512i>(v)));
#elif GMS_VBYTES == 32 && defined(__AVX2__)
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    return bits<VUh>(_mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bits<__m256i>(v), even)));
#else
    return __builtin_convertvector(v, VUh);
#endif
}

// fused multiply-add where the target has it, else a * b + c; sqrt. The instructions themselves on
// x86 and ARM: written as lane loops, they are vectorised in most functions but not in those
// compiled without fp contraction (GMS_NO_FMA_FN), where GCC 12 runs them lane by lane.
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__aarch64__)
#define GMS_VEC_FMA 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && GMS_VBYTES == 16
#include <arm_neon.h>
#define GMS_NEON 1
#endif
GMS_VINLINE VD fma(VD a, VD b, VD c) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VD>(_mm512_fmadd_pd(bits<__m512d>(a), bits<__m512d>(b), bits<__m512d>(c)));
#elif GMS_VBYTES == 32 && defined(__FMA__)
    return bits<VD>(_mm256_fmadd_pd(bits<__m256d>(a), bits<__m256d>(b), bits<__m256d>(c)));
#elif GMS_VBYTES == 16 && defined(__FMA__)
    return bits<VD>(_mm_fmadd_pd(bits<__m128d>(a), bits<__m128d>(b), bits<__m128d>(c)));
#elif defined(GMS_NEON)
    return bits<VD>(vfmaq_f64(bits<float64x2_t>(c), bits<float64x2_t>(a), bits<float64x2_t>(b)));
#elif defined(GMS_VEC_FMA)
    VD r;
    for (int i = 0; i < kD; ++i) r[i] = __builtin_fma(a[i], b[i], c[i]);
    return r;
#else
    return a * b + c;
#endif
}
GMS_VINLINE VF fma(VF a, VF b, VF c) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VF>(_mm512_fmadd_ps(bits<__m512>(a), bits<__m512>(b), bits<__m512>(c)));
#elif GMS_VBYTES == 32 && defined(__FMA__)
    return bits<VF>(_mm256_fmadd_ps(bits<__m256>(a), bits<__m256>(b), bits<__m256>(c)));
#elif GMS_VBYTES == 16 && defined(__FMA__)
    return bits<VF>(_mm_fmadd_ps(bits<__m128>(a), bits<__m128>(b), bits<__m128>(c)));
#elif defined(GMS_NEON)
    return bits<VF>(vfmaq_f32(bits<float32x4_t>(c), bits<float32x4_t>(a), bits<float32x4_t>(b)));
#elif defined(GMS_VEC_FMA)
    VF r;
    for (int i = 0; i < kF; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
#else
    return a * b + c;
#endif
}

GMS_VINLINE VD sqrt(VD v) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VD>(_mm512_sqrt_pd(bits<__m512d>(v)));
#elif GMS_VBYTES == 32 && defined(__AVX__)
    return bits<VD>(_mm256_sqrt_pd(bits<__m256d>(v)));
#elif GMS_VBYTES == 16 && defined(__SSE2__)
    return bits<VD>(_mm_sqrt_pd(bits<__m128d>(v)));
#elif defined(GMS_NEON)
    return bits<VD>(vsqrtq_f64(bits<float64x2_t>(v)));
#else
    VD r;
    for (int i = 0; i < kD; ++i) r[i] = __builtin_sqrt(v[i]);
    return r;
#endif
}
GMS_VINLINE VF sqrt(VF v) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VF>(_mm512_sqrt_ps(bits<__m512>(v)));
#elif GMS_VBYTES == 32 && defined(__AVX__)
    return bits<VF>(_mm256_sqrt_ps(bits<__m256>(v)));
#elif GMS_VBYTES == 16 && defined(__SSE2__)
    return bits<VF>(_mm_sqrt_ps(bits<__m128>(v)));
#elif defined(GMS_NEON)
    return bits<VF>(vsqrtq_f32(bits<float32x4_t>(v)));
#else
    VF r;
    for (int i = 0; i < kF; ++i) r[i] = __builtin_sqrtf(v[i]);
    return r;
#endif
}

// The low 32 bits of each 64-bit lane of a and b multiplied to a 64-bit product (pmuludq).
GMS_VINLINE VQ mul_wide(VQ a, VQ b) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VQ>(_mm512_mul_epu32(bits<__m512i>(a), bits<__m512i>(b)));
#elif GMS_VBYTES == 32 && defined(__AVX2__)
    return bits<VQ>(_mm256_mul_epu32(bits<__m256i>(a), bits<__m256i>(b)));
#elif GMS_VBYTES == 16 && defined(__SSE2__)
    return bits<VQ>(_mm_mul_epu32(bits<__m128i>(a), bits<__m128i>(b)));
#else
    const VQ low = splat<VQ>(0xFFFFFFFFull);
    return (a & low) * (b & low);
#endif
}

template <size_t... I>
GMS_VINLINE VQ hi_down_impl(VQ v, std::index_sequence<I...>) {
    const VU u = bits<VU>(v);
    return bits<VQ>(VU(__builtin_shufflevector(u, u, static_cast<int>(I | 1)...)));
}
// the high word of each 64-bit lane copied into its low word (a dword shuffle: on x86 it runs on
// another port than the multiplies and shifts)
GMS_VINLINE VQ hi_down(VQ v) { return hi_down_impl(v, std::make_index_sequence<kF>()); }

// Each 64-bit lane: lo's low word below hi's low word, (lo & 0xFFFFFFFF) | (hi << 32). GCC 12 spells the
// generic form as unpack and shuffle instructions on AVX-512 and AVX2, on the shuffle port hi_down also
// needs; there a shift and a dword blend.
GMS_VINLINE VQ pack_low_words(VQ lo, VQ hi) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    return bits<VQ>(_mm512_mask_blend_epi32(0xAAAA, bits<__m512i>(lo), _mm512_slli_epi64(bits<__m512i>(hi), 32)));
#elif GMS_VBYTES == 32 && defined(__AVX2__)
    return bits<VQ>(_mm256_blend_epi32(bits<__m256i>(lo), _mm256_slli_epi64(bits<__m256i>(hi), 32), 0xAA));
#else
    return (lo & splat<VQ>(0xFFFFFFFFull)) | (hi << 32);
#endif
}

// x / d for d > 0 finite, within 2 ulp. On Intel AVX-512 cores the 14-bit reciprocal estimate and
// one Newton step (the divider is busy with the square roots of the same loop); AMD's Zen 4
// (znver3/4 to GCC) divides fast and issues 512-bit FMAs at half rate, so there (and on every
// other target) the division itself.
#if GMS_VBYTES == 64 && defined(__AVX512F__) && !(defined(__znver3__) || defined(__znver4__) || \
    defined(__znver5__) || defined(__tune_znver3__) || defined(__tune_znver4__) || defined(__tune_znver5__))
#define GMS_RCP_DIVISION 1
#endif
GMS_VINLINE VF div_fast(VF x, VF d) {
#ifdef GMS_RCP_DIVISION
    const VF r = bits<VF>(_mm512_rcp14_ps(bits<__m512>(d)));
    return x * fma(r, fma(-d, r, splat<VF>(1.0f)), r);
#else
    return x / d;
#endif
}

// sqrt(s) for s >= 0, +inf or NaN (returned as they are). AVX-512: s r with r from vrsqrt14pd
// and two Newton steps (a few ulp: vsqrtpd is slow and poorly pipelined on 512-bit vectors);
// elsewhere the square root itself.
GMS_VINLINE VD sqrt_pos(VD s) {
#if GMS_VBYTES == 64 && defined(__AVX512F__)
    const VD one = splat<VD>(1.0), half = splat<VD>(0.5);
    VD r = bits<VD>(_mm512_rsqrt14_pd(bits<__m512d>(s)));
    VD q = s * r;
    VD h = fma(-q, r, one) * half;
    r = fma(r, h, r);
    q = fma(q, h, q);
    h = fma(-q, r, one) * half;
    const auto regular = (s > splat<VD>(0.0)) & (s < splat<VD>(__builtin_inf()));
    return select(regular, fma(q, h, q), s);
#else
    return sqrt(s);
#endif
}

}  // namespace simd
}  // namespace GMS_TARGET_NS
}  // namespace gms
