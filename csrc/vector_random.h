// The Philox streams and normals of csrc/philox.h on whole vectors (csrc/simd.h), written once for
// every target: included by csrc/step_target.cpp inside its target namespace.
//
// Philox: each 64-bit lane keeps one 32-bit word in its low half (the high halves hold junk that
// never reaches a low half: only the fresh products' high words are brought down, by hi_down), so
// that the 32 x 32 -> 64-bit products are single instructions (mul_wide). Integers and uniforms
// are bit-identical to the scalar forms on every target.
//
// Normals (Box-Muller, random.normal): u1 = max(u1, 1e-7f), theta = 2 pi u2, then log(u1),
// cos(theta) and sin(theta) in float32 with short polynomials (log_core, sincos_core: about one
// ulp each), sqrt(-2 log u1) and the products, as the torch reference forms them. Against the
// exact Box-Muller of the same u1 and theta they are within 3.3 float32 ulps (mean 0.47; the
// double-precision polynomials used before gave 2.3 and 0.43 where |z| > 0.1, at twice the
// instructions), and they agree with torch's normals to about 3.4e-7. Targets with FMA (avx512,
// avx2, NEON) draw bit-identical normals; SSE2, which rounds each product, differs in the last bit
// of about 3% of them.
#pragma once

#include "philox.h"
#include "simd.h"

namespace gms {
namespace GMS_TARGET_NS {
using namespace simd;

// two float vectors interleaved lane by lane: the low halves' lanes (zip_low) or the high halves' (zip_high)
template <size_t... I>
GMS_VINLINE VF zip_low_impl(VF a, VF b, std::index_sequence<I...>) {  // a0 b0 a1 b1 ...
    return __builtin_shufflevector(a, b, static_cast<int>(I % 2 ? kF + I / 2 : I / 2)...);
}
template <size_t... I>
GMS_VINLINE VF zip_high_impl(VF a, VF b, std::index_sequence<I...>) {  // a(kF/2) b(kF/2) ...
    return __builtin_shufflevector(a, b, static_cast<int>(I % 2 ? kF + kF / 2 + I / 2 : kF / 2 + I / 2)...);
}
GMS_VINLINE VF zip_low(VF a, VF b) { return zip_low_impl(a, b, std::make_index_sequence<kF>()); }
GMS_VINLINE VF zip_high(VF a, VF b) { return zip_high_impl(a, b, std::make_index_sequence<kF>()); }

inline int imin(int a, int b) { return a < b ? a : b; }

// The round keys of one seed, broadcast.
struct PhiloxKeys {
    VQ k0[kPhiloxRounds], k1[kPhiloxRounds];
    explicit PhiloxKeys(uint64_t seed) {
        uint32_t r0 = static_cast<uint32_t>(seed), r1 = static_cast<uint32_t>(seed >> 32);
        for (int r = 0; r < kPhiloxRounds; ++r, r0 += kPhiloxKeyA, r1 += kPhiloxKeyB) {
            k0[r] = splat<VQ>(uint64_t(r0));
            k1[r] = splat<VQ>(uint64_t(r1));
        }
    }
};

GMS_VINLINE VQ lane_index() {
    VQ v;
    for (int l = 0; l < kD; ++l) v[l] = static_cast<uint64_t>(l);
    return v;
}

// Philox4x32-10 of W vectors of kD consecutive counters head | (first + kD j + lane), one key. The
// first round starts from c2 = c3 = 0 (its B product is 0: c0 <- c1 ^ k0, c1 <- 0); of the last
// round only words 0 and 1 are formed unless ALL_WORDS. The W vectors go through the rounds
// together, so that their dependency chains (~70 cycles each) overlap.
template <int W, bool ALL_WORDS>
GMS_VINLINE void philox_rounds_run(const PhiloxKeys& keys, uint64_t head, uint64_t first, VQ* c0, VQ* c1, VQ* c2,
                                   VQ* c3) {
    const VQ ma = splat<VQ>(uint64_t(kPhiloxMulA)), mb = splat<VQ>(uint64_t(kPhiloxMulB));
    const VQ iota = lane_index();
    VQ pa[W], pb[W];
    for (int j = 0; j < W; ++j) {
        const VQ lo_word = (splat<VQ>(first + static_cast<uint64_t>(kD * j)) + iota) | splat<VQ>(head);
        pa[j] = mul_wide(lo_word, ma);
        c0[j] = hi_down(lo_word) ^ keys.k0[0];
        c1[j] = splat<VQ>(uint64_t(0));
        c2[j] = hi_down(pa[j]) ^ keys.k1[0];
        c3[j] = pa[j];
    }
    for (int r = 1; r < kPhiloxRounds; ++r) {
        const bool last = r == kPhiloxRounds - 1;
        for (int j = 0; j < W; ++j) {
            pb[j] = mul_wide(c2[j], mb);
            if (ALL_WORDS || !last) pa[j] = mul_wide(c0[j], ma);
        }
        for (int j = 0; j < W; ++j) {
            c0[j] = hi_down(pb[j]) ^ c1[j] ^ keys.k0[r];
            c1[j] = pb[j];
            if (ALL_WORDS || !last) {
                c2[j] = hi_down(pa[j]) ^ c3[j] ^ keys.k1[r];
                c3[j] = pa[j];
            }
        }
    }
}

// Words 0 and 1 for one key (seed) and the n consecutive counters head | (first + m), m < n.
inline void philox_run(int n, uint64_t seed, uint64_t head, uint64_t first, uint32_t* __restrict w0,
                       uint32_t* __restrict w1) {
    const PhiloxKeys keys(seed);
    int i = 0;
    const auto run = [&](auto w_const, int at) {
        constexpr int W = decltype(w_const)::value;
        VQ c0[W], c1[W], c2[W], c3[W];
        philox_rounds_run<W, false>(keys, head, first + static_cast<uint64_t>(at), c0, c1, c2, c3);
        for (int j = 0; j < W; ++j) {
            store(w0 + at + kD * j, low_words(c0[j]));
            store(w1 + at + kD * j, low_words(c1[j]));
        }
    };
    for (; i + 4 * kD <= n; i += 4 * kD) run(std::integral_constant<int, 4>(), i);
    for (; i + kD <= n; i += kD) run(std::integral_constant<int, 1>(), i);
    for (; i < n; ++i) {
        const uint64_t off = head | (first + static_cast<uint64_t>(i));
        uint32_t c0 = static_cast<uint32_t>(off), c1 = static_cast<uint32_t>(off >> 32), c2 = 0, c3 = 0;
        philox4x32_10(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
        w0[i] = c0;
        w1[i] = c1;
    }
}

// The words of the Box-Muller pairs of n consecutive counters head | (g0 + m), m < n, one key:
// pair 2m takes words 0 and 1 of counter m, pair 2m + 1 words 2 and 3 (random.normal); A gets
// each pair's u1 word, B its u2 word.
inline void philox_pairs_run(int n, uint64_t seed, uint64_t head, uint64_t g0, uint32_t* __restrict A,
                             uint32_t* __restrict B) {
    const PhiloxKeys keys(seed);
    int i = 0;
    const auto run = [&](auto w_const, int at) {
        constexpr int W = decltype(w_const)::value;
        VQ c0[W], c1[W], c2[W], c3[W];
        philox_rounds_run<W, true>(keys, head, g0 + static_cast<uint64_t>(at), c0, c1, c2, c3);
        for (int j = 0; j < W; ++j) {  // 64-bit lanes (word 0 | word 2 << 32) store as the pairs (w0, w2)
            store(A + 2 * (at + kD * j), pack_low_words(c0[j], c2[j]));
            store(B + 2 * (at + kD * j), pack_low_words(c1[j], c3[j]));
        }
    };
    for (; i + 4 * kD <= n; i += 4 * kD) run(std::integral_constant<int, 4>(), i);
    for (; i + kD <= n; i += kD) run(std::integral_constant<int, 1>(), i);
    for (; i < n; ++i) {
        const uint64_t off = head | (g0 + static_cast<uint64_t>(i));
        uint32_t c0 = static_cast<uint32_t>(off), c1 = static_cast<uint32_t>(off >> 32), c2 = 0, c3 = 0;
        philox4x32_10(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
        A[2 * i] = c0;
        B[2 * i] = c1;
        A[2 * i + 1] = c2;
        B[2 * i + 1] = c3;
    }
}

// Philox4x32-10 of n counters (lo[i], hi[i], 0, 0) with keys (k0[i], k1[i]); writes words 0 and 1,
// and words 2 and 3 where w2 and w3 are given.
inline void philox_block(int n, const uint32_t* __restrict lo, const uint32_t* __restrict hi,
                         const uint32_t* __restrict k0, const uint32_t* __restrict k1, uint32_t* __restrict w0,
                         uint32_t* __restrict w1, uint32_t* __restrict w2 = nullptr,
                         uint32_t* __restrict w3 = nullptr) {
    const VQ ma = splat<VQ>(uint64_t(kPhiloxMulA)), mb = splat<VQ>(uint64_t(kPhiloxMulB));
    const VQ ka = splat<VQ>(uint64_t(kPhiloxKeyA)), kb = splat<VQ>(uint64_t(kPhiloxKeyB));
    int i = 0;
    for (; i + kD <= n; i += kD) {
        VQ c0 = widen_u32(load<VUh>(lo + i)), c1 = widen_u32(load<VUh>(hi + i));
        VQ key0 = widen_u32(load<VUh>(k0 + i)), key1 = widen_u32(load<VUh>(k1 + i));
        VQ c2 = splat<VQ>(uint64_t(0)), c3 = c2;
        for (int r = 0; r < kPhiloxRounds; ++r) {
            const VQ pb = mul_wide(c2, mb), pa = mul_wide(c0, ma);
            c0 = hi_down(pb) ^ c1 ^ key0;
            c2 = hi_down(pa) ^ c3 ^ key1;
            c1 = pb;
            c3 = pa;
            key0 += ka;  // (carries into the high halves are junk there)
            key1 += kb;
        }
        store(w0 + i, low_words(c0));
        store(w1 + i, low_words(c1));
        if (w2 != nullptr) {
            store(w2 + i, low_words(c2));
            store(w3 + i, low_words(c3));
        }
    }
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

// Triton's uint32 -> float32 uniform (bit-identical to uint_to_uniform)
GMS_VINLINE VF uniform_of(VU w) {
    const VI v = bits<VI>(w);
    return __builtin_convertvector(v ^ (v >> 31), VF) * kUniformScale;  // (~v where negative)
}

// log(m 2^e) for m in [sqrt(1/2), sqrt(2)), in float32: e ln 2 + 2 atanh(s) with s = (m - 1)/(m + 1)
// (|s| < 0.1716; m - 1 is exact), the odd series to s^9 (truncation < 2.1e-9 relative) and ln 2 in
// two parts (e ln2_hi is exact for |e| < 2^8). About one float32 ulp.
template <int K>
GMS_VINLINE void log_core(const VF* m, const VF* e, VF* out) {
    const VF one = splat<VF>(1.0f);
    VF s[K], s2[K], p[K];
    for (int j = 0; j < K; ++j) {
        s[j] = (m[j] - one) / (m[j] + one);
        s2[j] = s[j] * s[j];
        p[j] = splat<VF>(2.0f / 9.0f);
    }
    static const float coef[] = {2.0f / 7.0f, 2.0f / 5.0f, 2.0f / 3.0f};
    for (float cf : coef)
        for (int j = 0; j < K; ++j) p[j] = fma(p[j], s2[j], splat<VF>(cf));
    const VF ln2_hi = splat<VF>(0x1.62e4p-1f), ln2_lo = splat<VF>(0x1.7f7d1cp-20f);
    for (int j = 0; j < K; ++j) {
        const VF atanh2 = fma(s[j] * s2[j], p[j], s[j] + s[j]);
        out[j] = fma(e[j], ln2_hi, fma(e[j], ln2_lo, atanh2));
    }
}

// cos(theta) and sin(theta) for theta in [0, 2 pi], in float32: theta = q pi/2 + r with q the
// nearest quadrant (0..4) and |r| <= pi/4 (pi/2 in three parts of 21 bits or less, so that q times
// each is exact: Cody and Waite), the Taylor series of cos r to r^10 and of sin r to r^9
// (truncation < 2.5e-9 relative), then the quadrant's swap and signs. About one float32 ulp.
template <int K>
GMS_VINLINE void sincos_core(const VF* theta, VF* cos_out, VF* sin_out) {
    const VF pio2_hi = splat<VF>(0x1.921fbp+0f), pio2_mid = splat<VF>(0x1.5110bp-22f),
             pio2_lo = splat<VF>(0x1.184698p-44f);
    VF r[K], r2[K], c[K], s[K];
    VI q[K];
    for (int j = 0; j < K; ++j) {
        q[j] = __builtin_convertvector(fma(theta[j], splat<VF>(0x1.45f306p-1f), splat<VF>(0.5f)), VI);  // (theta >= 0)
        const VF qf = __builtin_convertvector(q[j], VF);
        r[j] = fma(-qf, pio2_lo, fma(-qf, pio2_mid, fma(-qf, pio2_hi, theta[j])));
        r2[j] = r[j] * r[j];
        c[j] = splat<VF>(-1.0f / 3628800.0f);  // -1/10!
        s[j] = splat<VF>(1.0f / 362880.0f);    // 1/9!
    }
    static const float cos_coef[] = {1.0f / 40320.0f, -1.0f / 720.0f, 1.0f / 24.0f, -0.5f, 1.0f};
    static const float sin_coef[] = {-1.0f / 5040.0f, 1.0f / 120.0f, -1.0f / 6.0f};
    for (float cf : cos_coef)
        for (int j = 0; j < K; ++j) c[j] = fma(c[j], r2[j], splat<VF>(cf));
    for (float cf : sin_coef)
        for (int j = 0; j < K; ++j) s[j] = fma(s[j], r2[j], splat<VF>(cf));
    for (int j = 0; j < K; ++j) {
        s[j] = fma(s[j] * r2[j], r[j], r[j]);
        // quadrant q: (sin, cos) = (s, c), (c, -s), (-s, -c), (-c, s)
        const VI odd = (q[j] & 1) != 0;
        const VF sin_abs = select(odd, c[j], s[j]), cos_abs = select(odd, s[j], c[j]);
        const VU sin_sign = bits<VU>((q[j] & 2) << 30), cos_sign = bits<VU>(((q[j] + 1) & 2) << 30);
        sin_out[j] = bits<VF>(bits<VU>(sin_abs) ^ sin_sign);
        cos_out[j] = bits<VF>(bits<VU>(cos_abs) ^ cos_sign);
    }
}

// The 2 kF normals of each of W vectors of kF pairs of words (a: u1 words, b: u2 words),
// interleaved (r cos, r sin) per pair into lo[w] (pairs 0 .. kF/2 - 1) and hi[w].
template <int W>
GMS_VINLINE void box_muller(const VU* a, const VU* b, VF* lo, VF* hi) {
    VF m[W], ef[W], theta[W];
    for (int w = 0; w < W; ++w) {
        const VF u1 = vmax(uniform_of(a[w]), splat<VF>(kMinU1));
        theta[w] = splat<VF>(kTwoPi) * uniform_of(b[w]);
        // u1 = m 2^e with m in [sqrt(1/2), sqrt(2))
        const VU ubits = bits<VU>(u1);
        VU mbits = (ubits & 0x007FFFFFu) | 0x3F800000u;
        const VI big = bits<VI>(mbits > 0x3FB504F3u);  // (-1 where m > sqrt(2): m / 2, e + 1)
        const VI e = bits<VI>(ubits >> 23) - 127 - big;
        mbits -= bits<VU>(big) & (1u << 23);
        m[w] = bits<VF>(mbits);
        ef[w] = __builtin_convertvector(e, VF);  // (exact: |e| < 2^8)
    }
    VF lg[W], cs[W], sn[W];
    log_core<W>(m, ef, lg);
    sincos_core<W>(theta, cs, sn);
    for (int w = 0; w < W; ++w) {
        const VF radius = sqrt(splat<VF>(-2.0f) * lg[w]);
        const VF r_cos = radius * cs[w], r_sin = radius * sn[w];
        lo[w] = zip_low(r_cos, r_sin);
        hi[w] = zip_high(r_cos, r_sin);
    }
}

// The 2 n normals of n pairs of words (u1 words A, u2 words B): z[2 p] = r cos(theta) and
// z[2 p + 1] = r sin(theta) of pair p. A partial last vector is computed on zero-padded copies, so
// that a normal never depends on its position in the block (or on the block's length).
inline void normal_pairs(int n, const uint32_t* __restrict A, const uint32_t* __restrict B, float* __restrict z) {
    int i = 0;
    for (; i + 2 * kF <= n; i += 2 * kF) {  // (two vectors per iteration: their chains overlap)
        const VU a[2] = {load<VU>(A + i), load<VU>(A + i + kF)}, b[2] = {load<VU>(B + i), load<VU>(B + i + kF)};
        VF lo[2], hi[2];
        box_muller<2>(a, b, lo, hi);
        for (int w = 0; w < 2; ++w) {
            store(z + 2 * i + 2 * kF * w, lo[w]);
            store(z + 2 * i + 2 * kF * w + kF, hi[w]);
        }
    }
    for (; i < n; i += kF) {
        const int left = imin(kF, n - i);
        alignas(64) uint32_t a[kF] = {}, b[kF] = {};
        alignas(64) float out[2 * kF];
        std::memcpy(a, A + i, sizeof(uint32_t) * static_cast<size_t>(left));
        std::memcpy(b, B + i, sizeof(uint32_t) * static_cast<size_t>(left));
        const VU av = load<VU>(a), bv = load<VU>(b);
        VF lo, hi;
        box_muller<1>(&av, &bv, &lo, &hi);
        store(out, lo);
        store(out + kF, hi);
        std::memcpy(z + 2 * i, out, sizeof(float) * static_cast<size_t>(2 * left));
    }
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
        const int calls = imin(kChunk, (skip + (n - done) + 3) >> 2);
        philox_pairs_run(calls, seed, head, g, A, B);
        normal_pairs(2 * calls, A, B, all);
        const int take = imin(4 * calls - skip, n - done);
        std::memcpy(z + done, all + skip, sizeof(float) * static_cast<size_t>(take));
        done += take;
        g += static_cast<uint64_t>(calls);
        skip = 0;
    }
}

// Uniforms of n words.
inline void uniforms_block(int n, const uint32_t* __restrict w, float* __restrict u) {
    int i = 0;
    for (; i + kF <= n; i += kF) store(u + i, uniform_of(load<VU>(w + i)));
    for (; i < n; ++i) u[i] = uint_to_uniform(w[i]);
}

// The normal of counter `offset` (the same number as normals_run draws).
inline float philox_normal(uint64_t seed, uint64_t offset) {
    const uint64_t g = normal_group(offset);
    uint32_t c0 = static_cast<uint32_t>(g), c1 = static_cast<uint32_t>(g >> 32), c2 = 0, c3 = 0;
    philox4x32_10(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const bool second_pair = (offset >> 1) & 1;
    const uint32_t a = second_pair ? c2 : c0, b = second_pair ? c3 : c1;
    float z[2];
    normal_pairs(1, &a, &b, z);
    return z[offset & 1];
}

}  // namespace GMS_TARGET_NS
}  // namespace gms
