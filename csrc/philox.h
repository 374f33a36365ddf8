// Counter-based random numbers of gms_kernels, torch-free and header-only.
//
// Philox4x32-10 in the round order Triton uses, so that the C++ extension, the torch reference
// (gms_kernels/core/random.py) and the Triton kernel draw bit-identical integers and uniforms:
//   key     = (seed & 0xffffffff, seed >> 32)            (the seed read as uint64)
//   counter = (offset & 0xffffffff, offset >> 32, 0, 0)  (the offset read as uint64)
//   round   : pB = 0xCD9E8D57 * c2, pA = 0xD2511F53 * c0 (64-bit products)
//             (c0, c1, c2, c3) <- (hi(pB) ^ c1 ^ k0, lo(pB), hi(pA) ^ c3 ^ k1, lo(pA))
//             k0 += 0x9E3779B9, k1 += 0xBB67AE85
// uniform : bitcast word 0 to int32 v, v <- ~v (= -v - 1) when negative, float(v) * 4.6566127342e-10f
// normal  : four per Philox call (random.normal): the normal of counter `offset` reads the call of
//           counter normal_group(offset) (index bits divided by 4); index 4g + 2h + k takes the
//           Box-Muller pair of words (2h, 2h + 1) and its cosine (k = 0) or sine (k = 1):
//           u1 = max(u1, 1e-7f), theta = 6.2831855f * u2, z = sqrtf(-2 log(u1)) * cos or sin(theta).
//
// This header holds the scalar forms (the Python helpers' known-answer functions and the
// per-sample uniforms); the vector forms that the kernels use, including the normals' log, cos and
// sin, are in csrc/vector_random.h. Every function here has internal linkage (static): the
// header is compiled into each target's translation unit with that target's flags, and a shared
// inline copy could otherwise be taken from a wider target's object at link time.
#pragma once

#include <cstdint>
#include <cstring>

namespace gms {

constexpr uint32_t kPhiloxMulA = 0xD2511F53u;
constexpr uint32_t kPhiloxMulB = 0xCD9E8D57u;
constexpr uint32_t kPhiloxKeyA = 0x9E3779B9u;
constexpr uint32_t kPhiloxKeyB = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

// The literals are converted from double, exactly as the torch reference builds them.
static const float kUniformScale = static_cast<float>(4.6566127342e-10);
static const float kTwoPi = static_cast<float>(6.283185307179586);
static const float kMinU1 = static_cast<float>(1.0e-7);

// Philox4x32-10 on one counter; c[] is replaced by the four output words.
static inline void philox4x32_10(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0, uint32_t k1) {
#pragma GCC unroll 10
    for (int r = 0; r < kPhiloxRounds; ++r) {
        const uint64_t pb = static_cast<uint64_t>(kPhiloxMulB) * c2;
        const uint64_t pa = static_cast<uint64_t>(kPhiloxMulA) * c0;
        const uint32_t n0 = static_cast<uint32_t>(pb >> 32) ^ c1 ^ k0;
        const uint32_t n2 = static_cast<uint32_t>(pa >> 32) ^ c3 ^ k1;
        c1 = static_cast<uint32_t>(pb);
        c3 = static_cast<uint32_t>(pa);
        c0 = n0;
        c2 = n2;
        k0 += kPhiloxKeyA;
        k1 += kPhiloxKeyB;
    }
}

// The first two words for key = seed and counter = (offset lo, offset hi, 0, 0) (tl.rand reads
// the first).
static inline void philox_two_words(uint64_t seed, uint64_t offset, uint32_t& w0, uint32_t& w1) {
    uint32_t c0 = static_cast<uint32_t>(offset), c1 = static_cast<uint32_t>(offset >> 32), c2 = 0, c3 = 0;
    philox4x32_10(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    w0 = c0;
    w1 = c1;
}

// Triton's uint32 -> float32 in [0, 1).
static inline float uint_to_uniform(uint32_t x) {
    int32_t v = static_cast<int32_t>(x);
    v = v < 0 ? ~v : v;  // ~v == -v - 1 without overflow at INT32_MIN
    return static_cast<float>(v) * kUniformScale;
}

static inline float philox_uniform(uint64_t seed, uint64_t offset) {
    uint32_t w0, w1;
    philox_two_words(seed, offset, w0, w1);
    return uint_to_uniform(w0);
}

// The Philox counter whose words hold the normal of counter `offset` (random.normal_group): the
// index bits (the low 40) divided by 4, the stream and time bits kept.
static inline uint64_t normal_group(uint64_t offset) {
    constexpr uint64_t index_bits = (uint64_t(1) << 40) - 1;
    return (offset & ~index_bits) | ((offset & index_bits) >> 2);
}

// The 64-bit counter of (stream, time index, global element index), as random.counter builds it.
static inline uint64_t philox_counter(uint64_t stream, uint64_t t, uint64_t index) {
    return (stream << 56) | (t << 40) | index;
}

}  // namespace gms
