// Counter-based random numbers of gms_kernels (reference-notes 5), torch-free and header-only.
//
// Philox4x32-10 in the round order Triton uses, so that the C++ extension, the torch reference
// (gms_kernels/random.py) and the Triton kernel draw bit-identical integers and uniforms:
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
// The log, cos and sin of the normals are evaluated here in double precision and rounded once to
// float32 (so they agree with correctly rounded logf/cosf/sinf), with straight-line code that the
// compiler can vectorise: no libm call is left in the per-element loops. With AVX-512 the normals
// of a block are drawn by hand-written vector code (normal_pairs, 32 pairs per iteration) that
// uses shorter polynomials (log to ~4e-9 relative, cos and sin to ~7e-10 absolute, still before
// the one rounding to float32): the integers and uniforms are bit-identical, the normals agree
// with the scalar form to 2 float32 ulp (to ~1e-9 absolute where |z| is tiny) and with torch to
// about 2.4e-7.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__GNUC__) && !defined(__clang__)
// (GCC 12 reports the deliberately undefined pass-through operands inside the AVX-512 intrinsics
// as "may be used uninitialized" wherever they are inlined)
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
#define GMS_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define GMS_ALWAYS_INLINE inline
#endif

// The hand-vectorised paths need AVX-512 F/DQ/VL and FMA (Skylake-SP and later); everything
// else takes the portable loops. GMS_NO_AVX512 forces the portable loops (for checks).
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__FMA__) && \
    !defined(GMS_NO_AVX512)
#define GMS_AVX512 1
#endif

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

inline float bits_to_float(uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}

inline uint32_t float_to_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
}

// Philox4x32-10 on one counter; c[] is replaced by the four output words.
inline void philox4x32_10(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0, uint32_t k1) {
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

// Philox4x32-10 of n counters (lo[i], hi[i], 0, 0) with keys (k0[i], k1[i]); writes words 0 and 1,
// and words 2 and 3 where w2 and w3 are given.
// Compilers widen 32x32->64 products to full 64-bit multiplies (slow, several uops), so with
// AVX-512 / AVX2 the rounds are spelled out with the 32x32->64 instruction (vpmuludq) on 64-bit
// lanes; each lane keeps its 32-bit word in the low half (the high halves hold junk that never
// reaches a low half: shifts only move high to low for the fresh products). Same results.
inline void philox_block(int n, const uint32_t* __restrict lo, const uint32_t* __restrict hi,
                         const uint32_t* __restrict k0, const uint32_t* __restrict k1, uint32_t* __restrict w0,
                         uint32_t* __restrict w1, uint32_t* __restrict w2 = nullptr,
                         uint32_t* __restrict w3 = nullptr) {
    int i = 0;
#if defined(__AVX512F__)
    {
        const __m512i ma = _mm512_set1_epi64(kPhiloxMulA), mb = _mm512_set1_epi64(kPhiloxMulB);
        const __m512i ka = _mm512_set1_epi64(kPhiloxKeyA), kb = _mm512_set1_epi64(kPhiloxKeyB);
        for (; i + 8 <= n; i += 8) {
            __m512i c0 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + i)));
            __m512i c1 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + i)));
            __m512i key0 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k0 + i)));
            __m512i key1 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k1 + i)));
            __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
            for (int r = 0; r < kPhiloxRounds; ++r) {
                const __m512i pb = _mm512_mul_epu32(c2, mb);
                const __m512i pa = _mm512_mul_epu32(c0, ma);
                c0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pb, 32), c1, key0, 0x96);  // xor of three
                c2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(pa, 32), c3, key1, 0x96);
                c1 = pb;
                c3 = pa;
                key0 = _mm512_add_epi32(key0, ka);
                key1 = _mm512_add_epi32(key1, kb);
            }
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(w0 + i), _mm512_cvtepi64_epi32(c0));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(w1 + i), _mm512_cvtepi64_epi32(c1));
            if (w2 != nullptr) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(w2 + i), _mm512_cvtepi64_epi32(c2));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(w3 + i), _mm512_cvtepi64_epi32(c3));
            }
        }
    }
#elif defined(__AVX2__)
    {
        const __m256i ma = _mm256_set1_epi64x(kPhiloxMulA), mb = _mm256_set1_epi64x(kPhiloxMulB);
        const __m256i ka = _mm256_set1_epi64x(kPhiloxKeyA), kb = _mm256_set1_epi64x(kPhiloxKeyB);
        const __m256i pick_low = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        for (; i + 4 <= n; i += 4) {
            __m256i c0 = _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + i)));
            __m256i c1 = _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + i)));
            __m256i key0 = _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k0 + i)));
            __m256i key1 = _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k1 + i)));
            __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
            for (int r = 0; r < kPhiloxRounds; ++r) {
                const __m256i pb = _mm256_mul_epu32(c2, mb);
                const __m256i pa = _mm256_mul_epu32(c0, ma);
                c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pb, 32), c1), key0);
                c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pa, 32), c3), key1);
                c1 = pb;
                c3 = pa;
                key0 = _mm256_add_epi32(key0, ka);
                key1 = _mm256_add_epi32(key1, kb);
            }
            _mm_storeu_si128(reinterpret_cast<__m128i*>(w0 + i),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(c0, pick_low)));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(w1 + i),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(c1, pick_low)));
            if (w2 != nullptr) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(w2 + i),
                                 _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(c2, pick_low)));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(w3 + i),
                                 _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(c3, pick_low)));
            }
        }
    }
#endif
    for (; i < n; ++i) {
        uint32_t c0 = lo[i], c1 = hi[i], c2 = 0, c3 = 0;
        philox4x32_10(c0, c1, c2, c3, k0[i], k1[i]);
        w0[i] = c0;
        w1[i] = c1;
        if (w2 != nullptr) {
            w2[i] = c2;
            w3[i] = c3;
        }
    }
}

#if defined(__AVX512F__)
// the high dword of each 64-bit lane copied into its low dword (vpshufd)
inline __m512i hi_down(__m512i v) { return _mm512_shuffle_epi32(v, _MM_PERM_DDBB); }

// The round keys of one seed, broadcast to 64-bit lanes.
struct PhiloxKeys512 {
    __m512i k0[kPhiloxRounds], k1[kPhiloxRounds];
    explicit PhiloxKeys512(uint64_t seed) {
        uint32_t r0 = static_cast<uint32_t>(seed), r1 = static_cast<uint32_t>(seed >> 32);
        for (int r = 0; r < kPhiloxRounds; ++r, r0 += kPhiloxKeyA, r1 += kPhiloxKeyB) {
            k0[r] = _mm512_set1_epi64(r0);
            k1[r] = _mm512_set1_epi64(r1);
        }
    }
};

// Philox4x32-10 of W vectors of 8 consecutive counters head | (first + 8 j + lane), one key.
// Each 64-bit lane keeps its 32-bit word in the low half (the high halves hold junk that never
// reaches a low half: only the fresh products' high words are brought down). The first round
// starts from c2 = c3 = 0 (its B product is 0, so c0 <- c1 ^ k0 and c1 <- 0); of the last round
// only words 0 and 1 are computed unless ALL_WORDS. The high word of a product is brought down
// with a dword shuffle (hi_down) rather than a shift: multiplies and shifts share one execution
// port on these cores, shuffles use another. The W vectors go through the rounds together, so
// that their dependency chains (~70 cycles each) overlap.
template <int W, bool ALL_WORDS>
GMS_ALWAYS_INLINE void philox_rounds_run(const PhiloxKeys512& keys, uint64_t head, uint64_t first, __m512i* c0,
                                         __m512i* c1, __m512i* c2, __m512i* c3) {
    const __m512i ma = _mm512_set1_epi64(kPhiloxMulA), mb = _mm512_set1_epi64(kPhiloxMulB);
    const __m512i iota = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    __m512i pa[W], pb[W];
    for (int j = 0; j < W; ++j) {
        const __m512i idx = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first + 8 * j)), iota);
        const __m512i lo_word = _mm512_or_si512(idx, _mm512_set1_epi64(static_cast<long long>(head)));
        pa[j] = _mm512_mul_epu32(lo_word, ma);
        c0[j] = _mm512_xor_si512(hi_down(lo_word), keys.k0[0]);
        c1[j] = _mm512_setzero_si512();
        c2[j] = _mm512_xor_si512(hi_down(pa[j]), keys.k1[0]);
        c3[j] = pa[j];
    }
    for (int r = 1; r < kPhiloxRounds; ++r) {
        const bool last = r == kPhiloxRounds - 1;
        for (int j = 0; j < W; ++j) {
            pb[j] = _mm512_mul_epu32(c2[j], mb);
            if (ALL_WORDS || !last) pa[j] = _mm512_mul_epu32(c0[j], ma);
        }
        for (int j = 0; j < W; ++j) {
            c0[j] = _mm512_ternarylogic_epi64(hi_down(pb[j]), c1[j], keys.k0[r], 0x96);  // xor of three
            c1[j] = pb[j];
            if (ALL_WORDS || !last) {
                c2[j] = _mm512_ternarylogic_epi64(hi_down(pa[j]), c3[j], keys.k1[r], 0x96);
                c3[j] = pa[j];
            }
        }
    }
}
#endif

// Words 0 and 1 for one key (seed) and the n consecutive counters head | (first + m), m < n
// (the counters of one sample's elements): no per-element key or counter arrays to fill.
inline void philox_run(int n, uint64_t seed, uint64_t head, uint64_t first, uint32_t* __restrict w0,
                       uint32_t* __restrict w1) {
    const uint32_t s0 = static_cast<uint32_t>(seed), s1 = static_cast<uint32_t>(seed >> 32);
    int i = 0;
#if defined(__AVX512F__)
    {
        const PhiloxKeys512 keys(seed);
        auto run = [&](auto w_const, int at) {
            constexpr int W = decltype(w_const)::value;
            __m512i c0[W], c1[W], c2[W], c3[W];
            philox_rounds_run<W, false>(keys, head, first + at, c0, c1, c2, c3);
            for (int j = 0; j < W; ++j) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(w0 + at + 8 * j), _mm512_cvtepi64_epi32(c0[j]));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(w1 + at + 8 * j), _mm512_cvtepi64_epi32(c1[j]));
            }
        };
        for (; i + 32 <= n; i += 32) run(std::integral_constant<int, 4>(), i);
        for (; i + 8 <= n; i += 8) run(std::integral_constant<int, 1>(), i);
    }
#elif defined(__AVX2__)
    {
        const __m256i ma = _mm256_set1_epi64x(kPhiloxMulA), mb = _mm256_set1_epi64x(kPhiloxMulB);
        const __m256i iota = _mm256_setr_epi64x(0, 1, 2, 3);
        const __m256i vhead = _mm256_set1_epi64x(static_cast<long long>(head));
        const __m256i pick_low = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        __m256i round_k0[kPhiloxRounds], round_k1[kPhiloxRounds];
        uint32_t r0 = s0, r1 = s1;
        for (int r = 0; r < kPhiloxRounds; ++r, r0 += kPhiloxKeyA, r1 += kPhiloxKeyB) {
            round_k0[r] = _mm256_set1_epi64x(r0);
            round_k1[r] = _mm256_set1_epi64x(r1);
        }
        for (; i + 4 <= n; i += 4) {
            const __m256i idx = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first + i)), iota);
            __m256i c0 = _mm256_or_si256(idx, vhead);
            __m256i c1 = _mm256_srli_epi64(c0, 32);
            __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
            for (int r = 0; r < kPhiloxRounds; ++r) {
                const __m256i pb = _mm256_mul_epu32(c2, mb);
                const __m256i pa = _mm256_mul_epu32(c0, ma);
                c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pb, 32), c1), round_k0[r]);
                c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pa, 32), c3), round_k1[r]);
                c1 = pb;
                c3 = pa;
            }
            _mm_storeu_si128(reinterpret_cast<__m128i*>(w0 + i),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(c0, pick_low)));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(w1 + i),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(c1, pick_low)));
        }
    }
#endif
    for (; i < n; ++i) {
        const uint64_t off = head | (first + static_cast<uint64_t>(i));
        uint32_t c0 = static_cast<uint32_t>(off), c1 = static_cast<uint32_t>(off >> 32), c2 = 0, c3 = 0;
        philox4x32_10(c0, c1, c2, c3, s0, s1);
        w0[i] = c0;
        w1[i] = c1;
    }
}

// The words of the Box-Muller pairs of n consecutive counters head | (g0 + m), m < n, one key:
// pair 2m takes words 0 and 1 of counter m, pair 2m + 1 words 2 and 3 (random.normal); A gets
// each pair's u1 word, B its u2 word. (Without AVX-512 the scalar rounds run: one call per
// four normals.)
inline void philox_pairs_run(int n, uint64_t seed, uint64_t head, uint64_t g0, uint32_t* __restrict A,
                             uint32_t* __restrict B) {
    int i = 0;
#if defined(__AVX512F__)
    {
        const PhiloxKeys512 keys(seed);
        const __m512i low = _mm512_set1_epi64(0xFFFFFFFFll);
        auto run = [&](auto w_const, int at) {
            constexpr int W = decltype(w_const)::value;
            __m512i c0[W], c1[W], c2[W], c3[W];
            philox_rounds_run<W, true>(keys, head, g0 + at, c0, c1, c2, c3);
            for (int j = 0; j < W; ++j) {  // 64-bit lanes (word 0 | word 2 << 32) store as the pairs (w0, w2)
                const __m512i a = _mm512_ternarylogic_epi64(c0[j], low, _mm512_slli_epi64(c2[j], 32), 0xEA);
                const __m512i b = _mm512_ternarylogic_epi64(c1[j], low, _mm512_slli_epi64(c3[j], 32), 0xEA);
                _mm512_storeu_si512(A + 2 * (at + 8 * j), a);
                _mm512_storeu_si512(B + 2 * (at + 8 * j), b);
            }
        };
        for (; i + 32 <= n; i += 32) run(std::integral_constant<int, 4>(), i);
        for (; i + 8 <= n; i += 8) run(std::integral_constant<int, 1>(), i);
    }
#endif
    const uint32_t s0 = static_cast<uint32_t>(seed), s1 = static_cast<uint32_t>(seed >> 32);
    for (; i < n; ++i) {
        const uint64_t off = head | (g0 + static_cast<uint64_t>(i));
        uint32_t c0 = static_cast<uint32_t>(off), c1 = static_cast<uint32_t>(off >> 32), c2 = 0, c3 = 0;
        philox4x32_10(c0, c1, c2, c3, s0, s1);
        A[2 * i] = c0;
        B[2 * i] = c1;
        A[2 * i + 1] = c2;
        B[2 * i + 1] = c3;
    }
}

// The first two words for key = seed and counter = (offset lo, offset hi, 0, 0) (tl.rand reads
// the first).
inline void philox_two_words(uint64_t seed, uint64_t offset, uint32_t& w0, uint32_t& w1) {
    uint32_t c0 = static_cast<uint32_t>(offset), c1 = static_cast<uint32_t>(offset >> 32), c2 = 0, c3 = 0;
    philox4x32_10(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    w0 = c0;
    w1 = c1;
}

// Triton's uint32 -> float32 in [0, 1).
inline float uint_to_uniform(uint32_t x) {
    int32_t v = static_cast<int32_t>(x);
    v = v < 0 ? ~v : v;  // ~v == -v - 1 without overflow at INT32_MIN
    return static_cast<float>(v) * kUniformScale;
}

// Natural log of a positive, normal float, computed in double and rounded once.
// x = m 2^e with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m - 1)/(m + 1), |s| < 0.1716,
// whose odd series to s^17 leaves a relative error below 1e-15.
inline float log_positive(float x) {
    // Selects are written as integer arithmetic: the compiler would otherwise turn them into
    // branches (duplicating the code after them), which blocks vectorisation.
    const uint32_t bits = float_to_bits(x);
    const uint32_t mbits = (bits & 0x007FFFFFu) | 0x3F800000u;  // m in [1, 2)
    const uint32_t big = mbits > 0x3FB504F3u ? 1u : 0u;         // m > sqrt(2): use m/2, e + 1
    const int32_t e = static_cast<int32_t>(bits >> 23) - 127 + static_cast<int32_t>(big);
    const double md = bits_to_float(mbits - (big << 23));
    // s = (m - 1)/(m + 1) without a double division: a float reciprocal (2^-24) refined by one
    // Newton step in double (error ~2^-48, far below what the float result can show)
    const double den = md + 1.0;
    double inv = 1.0f / static_cast<float>(den);
    inv = inv + inv * (1.0 - den * inv);
    const double s = (md - 1.0) * inv;
    const double s2 = s * s;
    double p = 2.0 / 17.0;
    p = p * s2 + 2.0 / 15.0;
    p = p * s2 + 2.0 / 13.0;
    p = p * s2 + 2.0 / 11.0;
    p = p * s2 + 2.0 / 9.0;
    p = p * s2 + 2.0 / 7.0;
    p = p * s2 + 2.0 / 5.0;
    p = p * s2 + 2.0 / 3.0;
    p = p * s2 + 2.0;
    const double ln2 = 0.69314718055994530942;
    return static_cast<float>(static_cast<double>(e) * ln2 + s * p);
}

// A float theta in [0, 2 pi] as x = theta - pi in [-pi, pi] and z = |x| folded into [0, pi/2]
// (far: z = pi - |x|). pi is split in two parts so that x and pi - |x| keep their absolute
// accuracy. Then cos(theta) = -cos(x) = (far ? cos z : -cos z) and
// sin(theta) = -sin(x) = (x < 0 ? sin z : -sin z).
struct FoldedAngle {
    double x, z;
    bool far;
};
inline FoldedAngle fold_angle(float theta) {
    const double pi_hi = 3.141592653589793116, pi_lo = 1.2246467991473532e-16;  // pi = hi + lo
    const double x = (static_cast<double>(theta) - pi_hi) - pi_lo;
    const double y = x < 0.0 ? -x : x;
    const bool far = y > 1.5707963267948966;
    return {x, far ? (pi_hi - y) + pi_lo : y, far};
}

// v rounded to float, its sign flipped where `flip` (on the bits: see log_positive).
inline float with_sign_flip(double v, bool flip) {
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    b ^= static_cast<uint64_t>(flip ? 1 : 0) << 63;
    std::memcpy(&v, &b, sizeof v);
    return static_cast<float>(v);
}

// c[0] z2^(N-1) + ... + c[N-1] by Horner's rule.
template <size_t N>
inline double horner(double z2, const double (&c)[N]) {
    double p = c[0];
    for (size_t i = 1; i < N; ++i) p = p * z2 + c[i];
    return p;
}

// cos and sin of a float theta in [0, 2 pi], each computed in double and rounded once: even and
// odd Taylor polynomials on [0, pi/2] (cos to z^22, sin to z^21: errors below 2e-17).
inline float cos_small(float theta) {
    static const double taylor[] = {-1.0 / 1124000727777607680000.0, 1.0 / 2432902008176640000.0,
                                    -1.0 / 6402373705728000.0,       1.0 / 20922789888000.0,
                                    -1.0 / 87178291200.0,            1.0 / 479001600.0,
                                    -1.0 / 3628800.0,                1.0 / 40320.0,
                                    -1.0 / 720.0,                    1.0 / 24.0,
                                    -0.5,                            1.0};  // -1/22!, 1/20!, ..., 1
    const FoldedAngle a = fold_angle(theta);
    return with_sign_flip(horner(a.z * a.z, taylor), !a.far);
}

inline float sin_small(float theta) {
    static const double taylor[] = {1.0 / 51090942171709440000.0, -1.0 / 121645100408832000.0,
                                    1.0 / 355687428096000.0,      -1.0 / 1307674368000.0,
                                    1.0 / 6227020800.0,           -1.0 / 39916800.0,
                                    1.0 / 362880.0,               -1.0 / 5040.0,
                                    1.0 / 120.0,                  -1.0 / 6.0};  // 1/21!, ..., -1/3!
    const FoldedAngle a = fold_angle(theta);
    const double z2 = a.z * a.z;
    return with_sign_flip((horner(z2, taylor) * z2) * a.z + a.z, !(a.x < 0.0));
}

// The two normals of one Box-Muller pair of words (random.normal): u1 = max(u1, 1e-7f),
// theta = 2 pi u2 in [0, 2 pi), r = sqrtf(-2 log u1); z[0] = r cos(theta), z[1] = r sin(theta).
inline void box_muller_pair(uint32_t w0, uint32_t w1, float* z) {
    // u1 = max(u1, 1e-7f); both are non-negative, so their bit patterns order like the values
    const uint32_t u1_bits = float_to_bits(uint_to_uniform(w0)), min_bits = float_to_bits(kMinU1);
    const float u1 = bits_to_float(u1_bits > min_bits ? u1_bits : min_bits);
    const float u2 = uint_to_uniform(w1);
    const float theta = kTwoPi * u2;
    const float radius = __builtin_sqrtf(-2.0f * log_positive(u1));
    z[0] = radius * cos_small(theta);
    z[1] = radius * sin_small(theta);
}

#ifdef GMS_AVX512
// ------------------------------------------------------------------------------------------
// Box-Muller on 16 pairs per vector. The uniforms are formed exactly as uint_to_uniform does
// (integer ops, one int -> float conversion, one float multiply); log(u1), cos(theta) and
// sin(theta) are evaluated in double on two halves of 8 lanes and rounded once to float32, then
// sqrt and the products are the same float32 operations as box_muller_pair.

// The helpers work on K independent vectors at once, statement by statement, so that their
// dependency chains (the polynomials) interleave in the instruction stream.

// log(m 2^e) for m in [sqrt(1/2), sqrt(2)) given as double: 2 atanh(s) + e ln 2 with
// s = (m - 1)/(m + 1) (|s| < 0.1716), its reciprocal from vrcp14pd and one Newton step (2^-28)
// and the odd series to s^11 (relative truncation error < 6e-11): ~1e-8 of a float32 ulp.
template <int K>
GMS_ALWAYS_INLINE void log_core(const __m512d* m, const __m512d* e, __m256* out) {
    const __m512d one = _mm512_set1_pd(1.0);
    __m512d num[K], den[K], inv[K], s[K], s2[K], p[K];
    for (int j = 0; j < K; ++j) {
        den[j] = _mm512_add_pd(m[j], one);
        num[j] = _mm512_sub_pd(m[j], one);
        inv[j] = _mm512_rcp14_pd(den[j]);
    }
    for (int j = 0; j < K; ++j) inv[j] = _mm512_fmadd_pd(inv[j], _mm512_fnmadd_pd(den[j], inv[j], one), inv[j]);
    for (int j = 0; j < K; ++j) {
        s[j] = _mm512_mul_pd(num[j], inv[j]);
        s2[j] = _mm512_mul_pd(s[j], s[j]);
        p[j] = _mm512_set1_pd(2.0 / 11.0);
    }
    static const double coef[] = {2.0 / 9.0, 2.0 / 7.0, 2.0 / 5.0, 2.0 / 3.0, 2.0};
    for (double cf : coef)
        for (int j = 0; j < K; ++j) p[j] = _mm512_fmadd_pd(p[j], s2[j], _mm512_set1_pd(cf));
    for (int j = 0; j < K; ++j)
        out[j] = _mm512_cvtpd_ps(_mm512_fmadd_pd(e[j], _mm512_set1_pd(0.69314718055994530942), _mm512_mul_pd(s[j], p[j])));
}

// cos(theta) and sin(theta) for theta in [0, 2 pi] (see fold_angle): with
// x = theta - pi, y = |x| and z = y (y <= pi/2) or pi - y, one even Taylor polynomial to z^14
// (truncation < 7e-11 absolute) and one odd one to z^13 (< 7e-10), and sign flips.
template <int K>
GMS_ALWAYS_INLINE void sincos_core(const __m512d* theta, __m256* cos_out, __m256* sin_out) {
    const __m512d pi_hi = _mm512_set1_pd(3.141592653589793116), pi_lo = _mm512_set1_pd(1.2246467991473532e-16);
    __m512d z[K], z2[K], c[K], s[K];
    __mmask8 far[K], x_nonneg[K];
    for (int j = 0; j < K; ++j) {
        const __m512d x = _mm512_sub_pd(_mm512_sub_pd(theta[j], pi_hi), pi_lo);
        x_nonneg[j] = _mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_GE_OQ);
        const __m512d y = _mm512_abs_pd(x);
        far[j] = _mm512_cmp_pd_mask(y, _mm512_set1_pd(1.5707963267948966), _CMP_GT_OQ);
        z[j] = _mm512_mask_blend_pd(far[j], y, _mm512_add_pd(_mm512_sub_pd(pi_hi, y), pi_lo));
        z2[j] = _mm512_mul_pd(z[j], z[j]);
        c[j] = _mm512_set1_pd(-1.0 / 87178291200.0);  // -1/14!
        s[j] = _mm512_set1_pd(1.0 / 6227020800.0);    // 1/13!
    }
    static const double cos_coef[] = {1.0 / 479001600.0, -1.0 / 3628800.0, 1.0 / 40320.0, -1.0 / 720.0,
                                      1.0 / 24.0,        -0.5,               1.0};
    static const double sin_coef[] = {-1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0};
    for (double cf : cos_coef)
        for (int j = 0; j < K; ++j) c[j] = _mm512_fmadd_pd(c[j], z2[j], _mm512_set1_pd(cf));
    for (double cf : sin_coef)
        for (int j = 0; j < K; ++j) s[j] = _mm512_fmadd_pd(s[j], z2[j], _mm512_set1_pd(cf));
    for (int j = 0; j < K; ++j) {
        s[j] = _mm512_fmadd_pd(_mm512_mul_pd(s[j], z2[j]), z[j], z[j]);
        // cos(theta) = -cos z unless far; sin(theta) = -sin z where x >= 0
        cos_out[j] = _mm512_cvtpd_ps(_mm512_mask_xor_pd(c[j], static_cast<__mmask8>(~far[j]), c[j], _mm512_set1_pd(-0.0)));
        sin_out[j] = _mm512_cvtpd_ps(_mm512_mask_xor_pd(s[j], x_nonneg[j], s[j], _mm512_set1_pd(-0.0)));
    }
}

// Triton's uint32 -> float32 uniform on 16 lanes (bit-identical to uint_to_uniform)
inline __m512 uniform16(__m512i w) {
    const __m512i v = _mm512_xor_si512(w, _mm512_srai_epi32(w, 31));  // ~v where negative
    return _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(kUniformScale));
}

inline __m512 join8(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }

// The 2 W x 16 normals of W x 16 pairs: out[2 j] and out[2 j + 1] interleave (r cos, r sin) of
// the pairs of w0[j], w1[j].
template <int W>
GMS_ALWAYS_INLINE void box_muller_pairs_w(const __m512i* w0, const __m512i* w1, __m512* out) {
    __m512d md[2 * W], ed[2 * W], td[2 * W];
    __m256 lg[2 * W], cs[2 * W], sn[2 * W];
    for (int j = 0; j < W; ++j) {
        const __m512 u1 = _mm512_max_ps(uniform16(w0[j]), _mm512_set1_ps(kMinU1));
        const __m512 theta = _mm512_mul_ps(_mm512_set1_ps(kTwoPi), uniform16(w1[j]));
        // u1 = m 2^e with m in [sqrt(1/2), sqrt(2)) (as log_positive splits it)
        const __m512i bits = _mm512_castps_si512(u1);
        __m512i mbits = _mm512_ternarylogic_epi32(bits, _mm512_set1_epi32(0x007FFFFF), _mm512_set1_epi32(0x3F800000),
                                                  0xEA);  // (bits & mask) | one
        const __mmask16 big = _mm512_cmpgt_epu32_mask(mbits, _mm512_set1_epi32(0x3FB504F3));
        __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(127));
        e = _mm512_mask_add_epi32(e, big, e, _mm512_set1_epi32(1));
        mbits = _mm512_mask_sub_epi32(mbits, big, mbits, _mm512_set1_epi32(1 << 23));
        const __m512 m = _mm512_castsi512_ps(mbits);
        md[2 * j] = _mm512_cvtps_pd(_mm512_castps512_ps256(m));
        md[2 * j + 1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(m, 1));
        ed[2 * j] = _mm512_cvtepi32_pd(_mm512_castsi512_si256(e));
        ed[2 * j + 1] = _mm512_cvtepi32_pd(_mm512_extracti32x8_epi32(e, 1));
        td[2 * j] = _mm512_cvtps_pd(_mm512_castps512_ps256(theta));
        td[2 * j + 1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(theta, 1));
    }
    log_core<2 * W>(md, ed, lg);
    sincos_core<2 * W>(td, cs, sn);
    const __m512i first8 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i last8 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int j = 0; j < W; ++j) {
        const __m512 radius = _mm512_sqrt_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0f), join8(lg[2 * j], lg[2 * j + 1])));
        const __m512 r_cos = _mm512_mul_ps(radius, join8(cs[2 * j], cs[2 * j + 1]));
        const __m512 r_sin = _mm512_mul_ps(radius, join8(sn[2 * j], sn[2 * j + 1]));
        out[2 * j] = _mm512_permutex2var_ps(r_cos, first8, r_sin);
        out[2 * j + 1] = _mm512_permutex2var_ps(r_cos, last8, r_sin);
    }
}

inline __mmask16 tail_mask16(int left) {
    return left >= 16 ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1u);
}
#endif  // GMS_AVX512

// The 2 n normals of n pairs of words (u1 words A, u2 words B): z[2 p] = r cos(theta) and
// z[2 p + 1] = r sin(theta) of pair p. The AVX-512 path treats a partial last vector with masks,
// so that a normal never depends on its position in the block (or on the block's length).
inline void normal_pairs(int n, const uint32_t* __restrict A, const uint32_t* __restrict B, float* __restrict z) {
#ifdef GMS_AVX512
    constexpr int W = 2;
    for (int i = 0; i < n; i += 16 * W) {
        __m512i a[W], b[W];
        __m512 r[2 * W];
        for (int j = 0; j < W; ++j) {
            const __mmask16 m = tail_mask16(n - i - 16 * j);  // (0 past the end: computed on zeros, not stored)
            a[j] = _mm512_maskz_loadu_epi32(m, A + i + 16 * j);
            b[j] = _mm512_maskz_loadu_epi32(m, B + i + 16 * j);
        }
        box_muller_pairs_w<W>(a, b, r);
        for (int q = 0; q < 2 * W; ++q) _mm512_mask_storeu_ps(z + 2 * i + 16 * q, tail_mask16(2 * (n - i) - 16 * q), r[q]);
    }
#else
    for (int p = 0; p < n; ++p) box_muller_pair(A[p], B[p], z + 2 * p);
#endif
}

// The Philox counter whose words hold the normal of counter `offset` (random.normal_group): the
// index bits (the low 40) divided by 4, the stream and time bits kept.
inline uint64_t normal_group(uint64_t offset) {
    constexpr uint64_t index_bits = (uint64_t(1) << 40) - 1;
    return (offset & ~index_bits) | ((offset & index_bits) >> 2);
}

// The normals of the n consecutive counters head | (first + m), m < n, for one key: four to a
// Philox call (philox_pairs_run), in chunks of kChunk calls.
inline void normals_run(int n, uint64_t seed, uint64_t head, uint64_t first, float* __restrict z) {
    constexpr int kChunk = 64;
    alignas(64) uint32_t A[2 * kChunk], B[2 * kChunk];
    alignas(64) float all[4 * kChunk];
    uint64_t g = first >> 2;
    int skip = static_cast<int>(first & 3), done = 0;  // (the first call's normals before `first`)
    while (done < n) {
        const int calls = std::min(kChunk, (skip + (n - done) + 3) >> 2);
        philox_pairs_run(calls, seed, head, g, A, B);
        normal_pairs(2 * calls, A, B, all);
        const int take = std::min(4 * calls - skip, n - done);
        std::memcpy(z + done, all + skip, sizeof(float) * static_cast<size_t>(take));
        done += take;
        g += static_cast<uint64_t>(calls);
        skip = 0;
    }
}

// Uniforms of n words.
inline void uniforms_block(int n, const uint32_t* __restrict w, float* __restrict u) {
#ifdef GMS_AVX512
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask16(n - i);
        _mm512_mask_storeu_ps(u + i, m, uniform16(_mm512_maskz_loadu_epi32(m, w + i)));
    }
#else
    for (int i = 0; i < n; ++i) u[i] = uint_to_uniform(w[i]);
#endif
}

// Convenience scalar forms (tests, small helpers).
inline float philox_uniform(uint64_t seed, uint64_t offset) {
    uint32_t w0, w1;
    philox_two_words(seed, offset, w0, w1);
    return uint_to_uniform(w0);
}

inline float philox_normal(uint64_t seed, uint64_t offset) {  // (the same number as normals_run)
    const uint64_t g = normal_group(offset);
    uint32_t c0 = static_cast<uint32_t>(g), c1 = static_cast<uint32_t>(g >> 32), c2 = 0, c3 = 0;
    philox4x32_10(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const bool second_pair = (offset >> 1) & 1;
    const uint32_t a = second_pair ? c2 : c0, b = second_pair ? c3 : c1;
    float z[2];
    normal_pairs(1, &a, &b, z);
    return z[offset & 1];
}

// The 64-bit counter of (stream, time index, global element index), as random.counter builds it.
inline uint64_t philox_counter(uint64_t stream, uint64_t t, uint64_t index) {
    return (stream << 56) | (t << 40) | index;
}

}  // namespace gms
