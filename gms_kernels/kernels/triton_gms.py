"""The fused GMS step as one Triton kernel (moments -> fit -> mixture sampling in one memory pass).

Contract: ``gms_kernels.kernels`` (``fused_step`` and :class:`FusedStepConfig`); the torch reference
(``solvers.gms_step`` / ``solver_step``) defines what is computed. Per element:

* x_t and the heads are read in their own dtypes (fp16/bf16/fp32/fp64) and upcast to fp64; a head
  sliced out of the concatenated model output is read in place (per-sample row stride);
* M1, Var, M3 and kappa3 are computed in fp64 with the operations of ``moments.py`` in the same
  order (only +, -, *, /, min/max/where) and FMA contraction off, so they are bit-identical to the
  reference wherever fp64 +-*/ are IEEE (the interpreter; CUDA too, untested);
* GAUSSIAN and CLOSED fit in fp32 on Var and kappa3 scaled by an exact power of two taken from
  Var's exponent: the fit then sees Var in [1, 4) whatever the magnitude of the moments, so
  kappa3 ~ Var^1.5 neither under- nor overflows fp32. The cube root is exp2(log2|q|/3) plus one
  Newton step (no libdevice); below the knee of ``fit.fit_closed`` (standardized skewness under
  ``SKEW_KNEE``) delta is linear in kappa3, as in the reference;
* ADAN runs the loop of ``fit.fit_adan`` on the offsets a = mu1 - M1, b = mu2 - M1 with the
  residuals written about M1 (the same function without cancelling M1^3-sized terms), in fp32 by
  default (``ADAN_FP64``; ``adan_precision`` per call). A block that holds an element outside
  ``ADAN_FP32_LIMITS`` also runs the fp64 loop, and that element takes its result;
* x_s = M1 + offset + sqrt(s2) z is assembled in fp64 and rounded once to x_t's dtype (via fp32
  for 16-bit outputs);
* the random numbers are Philox4x32-10 written out in the kernel: the same words as ``random.py``
  (and ``tl.randint``), the uniform exactly as ``tl.rand``, and the normals as ``random.normal``:
  Box-Muller on all four words of the call of counter index // 4 (each element runs that call and
  keeps its own word pair, and the cosine or the sine).

The kernel uses only builtins of ``triton.language`` and its own jit functions (no library functions
such as ``tl.zeros``, ``tl.max`` or ``tl.rand``), so CPU tensors run through the interpreter whatever
``TRITON_INTERPRET`` said when triton was imported (``_cpu_kernel`` rebinds the jit helpers).
"""
from __future__ import annotations

import functools
import math
import types

import torch

from ..core.fit import ADAN_BETA_BOUNDS, ADAN_BETAS, ADAN_EPS, ADAN_INIT_BETA, ADAN_INIT_GAP, MixtureParams
from ..core.devices import as_tensor_on, to_device_async
from ..core.random import STREAM_COMPONENT, STREAM_STEP_NOISE, check_counter_range, counter
from .config import (ADAN_FP32_LIMITS, MODE_ADAN, MODE_CLOSED, MODE_DDIM, MODE_DENOISE, MODE_FIXED, MODE_GAUSSIAN,
               FusedStepConfig, NonFiniteInput)
from .scalars import STEP_SCALARS, step_scalars

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None

MODE_DEBUG_RNG = -1  # internal: writes the raw Philox words, u and z (tests of the in-kernel streams)
_MODES = (MODE_GAUSSIAN, MODE_CLOSED, MODE_ADAN, MODE_DENOISE, MODE_FIXED, MODE_DDIM, MODE_DEBUG_RNG)
# the heads each mode reads: e1 alone for the steps whose variance is one number (FIXED, DDIM) or none
_HEADS_READ = {MODE_DENOISE: 1, MODE_FIXED: 1, MODE_DDIM: 1, MODE_GAUSSIAN: 2, MODE_DEBUG_RNG: 0}

# One config per mode (no autotuning: the interpreter cannot run several configs): (BLOCK, num_warps).
# The fits keep one element per thread; ptxas for sm_90a (triton 3.6, fp32 I/O, no spills): CLOSED 92
# registers, ADAN 124 (fp64 loop; 74 in fp32), GAUSSIAN 71, DENOISE 50. Two elements per thread would
# take CLOSED to 128 and ADAN-fp32 to 156. Swept on an H200 and an H100 (bench_gpu.py): no
# configuration beat these by more than 3%, about the spread between two timings of one. FIXED and DDIM
# (compile_offline, triton 3.8): 68 and 70 registers, launched like GAUSSIAN; not timed on a GPU yet.
GPU_CONFIGS = {MODE_GAUSSIAN: (512, 4), MODE_DENOISE: (512, 4), MODE_CLOSED: (256, 8), MODE_ADAN: (256, 8),
               MODE_FIXED: (512, 4), MODE_DDIM: (512, 4), MODE_DEBUG_RNG: (512, 4)}
INTERPRETER_BLOCK = 1024
# Register cap for ADAN's default fp32 mode (None: ptxas's choice). Its rarely taken fp64 branch
# takes the kernel from 64 registers to 128 (triton 3.8, compile_offline), so an SM holds 2 blocks
# of 256 threads instead of 3. A cap of 80 restores the 3 blocks but was 5-6% slower on an H100
# (benchmarks/gpu/sweep_registers.py, 2026-11-26: 80, 96, 128 and 64 all lost to no cap at both
# sizes and 25 and 70 iterations, rounds within 1%): 16 warps per SM already hide the loop's
# latency, and the cap spills values around the loops.
ADAN_FP32_MAXNREG: int | None = None
# FMA contraction off: the fp64 moments then round exactly like the torch reference (IEEE +-*/)
FP_FUSION = False
# ADAN's loop in fp64 or fp32 when the step's ``adan_precision`` option is None: fp32, like the C++
# kernel (elements outside ADAN_FP32_LIMITS are refitted in fp64). fit_adan is ill-conditioned, and
# from about 40 iterations on the fp32 trajectory parts from the fp64 reference's: at 70 the median
# element's mixture mean is off M1 by ~1e-3 sd instead of ~1e-4 sd, the worst equally in both
# (benchmarks/adan_precision.py measures it). fp64 follows the reference to its own sensitivity and is
# 2.1-2.3x slower on an H100 and an H200 (benchmarks/gpu/bench_gpu.py).
ADAN_FP64 = False

# Slots of the fp64 scalar table (scalars.py): S_<NAME> for each name of STEP_SCALARS, its position in the
# table (globals a kernel reads must be tl.constexpr)
_cx = tl.constexpr if triton is not None else (lambda v: v)
globals().update({f"S_{name.upper()}": _cx(i) for i, name in enumerate(STEP_SCALARS)})


def available() -> bool:
    """True when triton can be imported: CUDA tensors then run compiled, CPU tensors in the interpreter."""
    return triton is not None


def _adan_table(cfg: FusedStepConfig) -> list[float]:
    """Per iteration k (from 1), with f1 = lr/(1-b1^k), f2 = lr*b2/(1-b2^k) and c = sqrt(1-b3^k):
    rho = f2/f1, sigma = 1/(c f1) and eps/f1. fit_adan's update f1 m/d + f2 v/d with
    d = sqrt(n)/c + eps is then (m + rho v) / (sigma sqrt(n) + eps/f1): one fp64 division and one
    square root per parameter instead of three divisions (the GPU's slowest fp64 operations)."""
    b1, b2, b3 = ADAN_BETAS
    rows = []
    for k, lr in enumerate(cfg.lrs, start=1):
        f1, f2, c = lr / (1 - b1**k), lr * b2 / (1 - b2**k), math.sqrt(1 - b3**k)
        rows += [f2 / f1, 1.0 / (c * f1), ADAN_EPS / f1]
    return rows or [0.0]


# One entry per (step, fit, device): enough for a 1000-step trajectory, so that a long sampling loop
# run again finds every step's tables (an LRU smaller than the loop would miss at every step).
@functools.lru_cache(maxsize=1024)
def _device_tables(cfg: FusedStepConfig, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scalars, ADAN table, counter bases) on ``device``: one int64 buffer, copied without waiting
    for the device's queue and sliced into the three (the float64 tables travel as their bits).
    Each slice starts on a 16-byte boundary, as Triton's pointer specialisation expects."""
    parts = [torch.tensor(list(step_scalars(cfg).values()), dtype=torch.float64, device="cpu").view(torch.int64),
             torch.tensor(_adan_table(cfg), dtype=torch.float64, device="cpu").view(torch.int64),
             torch.tensor([counter(STREAM_STEP_NOISE, cfg.t, 0), counter(STREAM_COMPONENT, cfg.t, 0)],
                          dtype=torch.int64, device="cpu")]
    padded = [torch.nn.functional.pad(p, (0, p.numel() % 2)) for p in parts]
    both = to_device_async(torch.cat(padded), device)
    scal, adan, bases = torch.split(both, [p.numel() for p in padded])
    return (scal[:parts[0].numel()].view(torch.float64), adan[:parts[1].numel()].view(torch.float64),
            bases[:parts[2].numel()])


if triton is not None:
    # the ADAN settings as compile-time constants (read by the kernel as globals)
    ADAN_B1 = tl.constexpr(ADAN_BETAS[0])
    ADAN_B2 = tl.constexpr(ADAN_BETAS[1])
    ADAN_B3 = tl.constexpr(ADAN_BETAS[2])
    ADAN_GAP = tl.constexpr(ADAN_INIT_GAP)
    ADAN_BETA0 = tl.constexpr(ADAN_INIT_BETA)
    ADAN_BETA_LO = tl.constexpr(ADAN_BETA_BOUNDS[0])
    ADAN_BETA_HI = tl.constexpr(ADAN_BETA_BOUNDS[1])
    ADAN_FP32_M1_MAX = tl.constexpr(ADAN_FP32_LIMITS["m1_max"])
    ADAN_FP32_VAR_MIN = tl.constexpr(ADAN_FP32_LIMITS["var_min"])
    ADAN_FP32_VAR_MAX = tl.constexpr(ADAN_FP32_LIMITS["var_max"])
    ADAN_FP32_K3_MAX = tl.constexpr(ADAN_FP32_LIMITS["k3_max"])

    @triton.jit
    def _either(a, b):
        return a | b

    @triton.jit
    def _adan_loop(mf, vf, kap, SCAL, ADAN, ITERS: tl.constexpr, BLOCK: tl.constexpr, DT: tl.constexpr):
        """fit.fit_adan on the offsets a = mu1 - M1, b = mu2 - M1 and beta = s2 / Var, in dtype DT, from
        M1, Var and kappa3 (already in DT): the residuals are written about M1, so that no M1^3-sized
        terms cancel. Returns (a, b, beta)."""
        aw1 = tl.load(SCAL + S_W1).to(DT)
        w2 = tl.load(SCAL + S_W2).to(DT)
        gs = tl.load(SCAL + S_GRAD_SCALE).to(DT)
        zero = tl.full([BLOCK], 0.0, DT)
        a = zero
        b = tl.full([BLOCK], -ADAN_GAP, DT)
        beta = tl.full([BLOCK], ADAN_BETA0, DT)
        # the optimiser's state (m, v, n and the previous gradient per parameter) starts at zero
        ma, mb, mc, va, vb, vc, na, nb, nc, pa, pb, pc = zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero
        for k in range(ITERS):
            s2 = beta * vf
            cm1 = aw1 * a + w2 * b  # central moments of the mixture about M1
            cm2 = aw1 * (a * a) + w2 * (b * b) + s2
            cm3 = aw1 * (a * a * a + 3.0 * a * s2) + w2 * (b * b * b + 3.0 * b * s2)
            r1 = cm1  # = g1 - M1
            r2 = 2.0 * mf * cm1 + (cm2 - vf)  # = g2 - (M1^2 + Var)
            r3 = 3.0 * mf * mf * cm1 + 3.0 * mf * (cm2 - vf) + (cm3 - kap)  # = g3 - M3
            mu1 = mf + a
            mu2 = mf + b
            ga = gs * aw1 * (r1 + 2.0 * mu1 * r2 + 3.0 * (mu1 * mu1 + s2) * r3)
            gb = gs * w2 * (r1 + 2.0 * mu2 * r2 + 3.0 * (mu2 * mu2 + s2) * r3)
            gc = gs * vf * (r2 + 3.0 * (mf + cm1) * r3)
            rho = tl.load(ADAN + 3 * k).to(DT)
            sigma = tl.load(ADAN + 3 * k + 1).to(DT)
            eps_k = tl.load(ADAN + 3 * k + 2).to(DT)
            da = tl.where(k > 0, ga - pa, 0.0)
            db = tl.where(k > 0, gb - pb, 0.0)
            dc = tl.where(k > 0, gc - pc, 0.0)
            ma = ma * ADAN_B1 + ga * (1.0 - ADAN_B1)
            mb = mb * ADAN_B1 + gb * (1.0 - ADAN_B1)
            mc = mc * ADAN_B1 + gc * (1.0 - ADAN_B1)
            va = va * ADAN_B2 + da * (1.0 - ADAN_B2)
            vb = vb * ADAN_B2 + db * (1.0 - ADAN_B2)
            vc = vc * ADAN_B2 + dc * (1.0 - ADAN_B2)
            ta = ga + ADAN_B2 * da
            tb = gb + ADAN_B2 * db
            tc = gc + ADAN_B2 * dc
            na = na * ADAN_B3 + (ta * ta) * (1.0 - ADAN_B3)
            nb = nb * ADAN_B3 + (tb * tb) * (1.0 - ADAN_B3)
            nc = nc * ADAN_B3 + (tc * tc) * (1.0 - ADAN_B3)
            a = a - (ma + rho * va) / (tl.sqrt(na) * sigma + eps_k)  # (see _adan_table)
            b = b - (mb + rho * vb) / (tl.sqrt(nb) * sigma + eps_k)
            beta = beta - (mc + rho * vc) / (tl.sqrt(nc) * sigma + eps_k)
            beta = tl.minimum(tl.maximum(beta, ADAN_BETA_LO), ADAN_BETA_HI)
            pa = ga
            pb = gb
            pc = gc
        return a, b, beta

    @triton.jit
    def _gms_step_kernel(X, E1, E2, E3, SEEDS, IDX, OUT, MU1, MU2, S2, SCAL, ADAN, BASES, NONFINITE,
                         total, D, sx, se1, se2, se3,
                         MODE: tl.constexpr, NEED_VAR: tl.constexpr, NEED_M3: tl.constexpr,
                         HAS_RANGE: tl.constexpr, PER_PIXEL: tl.constexpr,
                         WRITE_PARAMS: tl.constexpr, ITERS: tl.constexpr, FIT_FP64: tl.constexpr,
                         OUT_FP64: tl.constexpr,
                         BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        e = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        mask = e < total
        i = e // D  # sample
        j = e - i * D  # element within the sample

        seed = tl.load(SEEDS + i, mask=mask, other=0)
        gidx = tl.load(IDX + i, mask=mask, other=0)

        # ---- random numbers: Philox4x32-10 keyed by the seed, counters (offset lo, offset hi, 0, 0)
        k0 = seed.to(tl.uint32)
        k1 = (seed >> 32).to(tl.uint32)
        elem = gidx * D + j
        off_z = tl.load(BASES) | (elem >> 2)  # random.normal: four normals to a Philox call
        if PER_PIXEL:
            off_u = tl.load(BASES + 1) | elem
        else:
            off_u = tl.load(BASES + 1) | gidx
        za = off_z.to(tl.uint32)
        zb = (off_z >> 32).to(tl.uint32)
        zc = za * 0
        zd = za * 0
        ua = off_u.to(tl.uint32)
        ub = (off_u >> 32).to(tl.uint32)
        uc = ua * 0
        ud = ua * 0
        for _r in tl.static_range(10):
            z_hi_b = tl.umulhi(zc, 0xCD9E8D57)
            z_hi_a = tl.umulhi(za, 0xD2511F53)
            u_hi_b = tl.umulhi(uc, 0xCD9E8D57)
            u_hi_a = tl.umulhi(ua, 0xD2511F53)
            z_lo_b = tl.mul(zc, 0xCD9E8D57, sanitize_overflow=False)
            z_lo_a = tl.mul(za, 0xD2511F53, sanitize_overflow=False)
            u_lo_b = tl.mul(uc, 0xCD9E8D57, sanitize_overflow=False)
            u_lo_a = tl.mul(ua, 0xD2511F53, sanitize_overflow=False)
            za, zb, zc, zd = z_hi_b ^ zb ^ k0, z_lo_b, z_hi_a ^ zd ^ k1, z_lo_a
            ua, ub, uc, ud = u_hi_b ^ ub ^ k0, u_lo_b, u_hi_a ^ ud ^ k1, u_lo_a
            k0 = tl.add(k0, 0x9E3779B9, sanitize_overflow=False)
            k1 = tl.add(k1, 0xBB67AE85, sanitize_overflow=False)
        # uint32 -> [0, 1): bitcast to int32, fold negatives, times 2^-31 (tl.rand's rule)
        v = ua.to(tl.int32, bitcast=True)
        u = tl.where(v < 0, ~v, v).to(tl.float32) * 4.6566127342e-10
        second_pair = ((elem >> 1) & 1) == 1  # words (2, 3) rather than (0, 1)
        v = tl.where(second_pair, zc, za).to(tl.int32, bitcast=True)
        u1 = tl.where(v < 0, ~v, v).to(tl.float32) * 4.6566127342e-10
        v = tl.where(second_pair, zd, zb).to(tl.int32, bitcast=True)
        u2 = tl.where(v < 0, ~v, v).to(tl.float32) * 4.6566127342e-10
        u1 = tl.maximum(1.0e-7, u1)
        theta = 6.283185307179586 * u2
        # Box-Muller: the cosine for even elements, the sine for odd ones
        z = tl.sqrt(-2.0 * tl.log(u1)) * tl.where((elem & 1) == 1, tl.sin(theta), tl.cos(theta))
        z64 = z.to(tl.float64)

        if MODE == -1:  # MODE_DEBUG_RNG
            tl.store(OUT + e, z, mask=mask)
            tl.store(MU1 + e, za.to(tl.float32, bitcast=True), mask=mask)
            tl.store(MU2 + e, zb.to(tl.float32, bitcast=True), mask=mask)
            tl.store(S2 + e, u, mask=mask)
        else:
            # ---- moments of q(x0|x_t) in fp64 (moments.x0_moments, same operations, same order)
            x = tl.load(X + i * sx + j, mask=mask, other=0.0).to(tl.float64)
            e1 = tl.load(E1 + i * se1 + j, mask=mask, other=0.0).to(tl.float64)
            finite = (tl.abs(x) < float("inf")) & (tl.abs(e1) < float("inf"))  # False for NaN too
            mean = (x - tl.load(SCAL + S_SIGMA_T) * e1) / tl.load(SCAL + S_A_T)
            if NEED_VAR:  # every mode but DENOISE
                e2 = tl.load(E2 + i * se2 + j, mask=mask, other=0.0).to(tl.float64)
                finite = finite & (tl.abs(e2) < float("inf"))
                var = tl.load(SCAL + S_RR) * (e2 - e1 * e1)
            if NEED_M3:  # CLOSED / ADAN
                e3 = tl.load(E3 + i * se3 + j, mask=mask, other=0.0).to(tl.float64)
                finite = finite & (tl.abs(e3) < float("inf"))
                xx = x * x
                m2 = xx - tl.load(SCAL + S_TWO_SIGMA) * x * e1 + tl.load(SCAL + S_SIGMA_SQ) * e2
                m2 = m2 / tl.load(SCAL + S_A_SQ)
                m3 = (xx * x - tl.load(SCAL + S_THREE_SIGMA) * xx * e1
                      + tl.load(SCAL + S_THREE_SIGMA_SQ) * x * e2 - tl.load(SCAL + S_SIGMA_CU) * e3)
                m3 = m3 / tl.load(SCAL + S_A_CU)
            # ---- clamps of the data normalised to [-1, 1] (moments.clamp_x0_moments)
            if HAS_RANGE:
                c = tl.load(SCAL + S_C)
                h = tl.load(SCAL + S_H)
                h_sq = tl.load(SCAL + S_H_SQ)
                mean_y = tl.minimum(tl.maximum((mean - c) / h, -1.0), 1.0)
                if NEED_VAR:
                    var = tl.minimum(tl.maximum(var / h_sq, 0.0), 1.0) * h_sq
                if NEED_M3:
                    cc = tl.load(SCAL + S_CC)
                    c_cu = tl.load(SCAL + S_C_CU)
                    h_cu = tl.load(SCAL + S_H_CU)
                    m2_y = (m2 - tl.load(SCAL + S_TWO_C) * mean + cc) / h_sq
                    m2_y = tl.minimum(tl.maximum(m2_y, 0.0), 1.0)
                    m3_y = (m3 - tl.load(SCAL + S_THREE_C) * m2 + tl.load(SCAL + S_THREE_C_C) * mean - c_cu) / h_cu
                    m3_y = tl.where(tl.abs(m3_y) > tl.abs(mean_y), mean_y, m3_y)
                    m3_y = tl.minimum(tl.maximum(m3_y, -1.0), 1.0)
                    m2 = cc + tl.load(SCAL + S_TWO_C_H) * mean_y + tl.load(SCAL + S_HH) * m2_y
                    m3 = (c_cu + tl.load(SCAL + S_THREE_C_C_H) * mean_y + tl.load(SCAL + S_THREE_C_H_H) * m2_y
                          + h_cu * m3_y)
                mean = c + h * mean_y
            # ---- moments of q(x_s|x_t) (moments.transition_moments)
            c1 = tl.load(SCAL + S_C1)
            c2 = tl.load(SCAL + S_C2)
            c2_sq = tl.load(SCAL + S_C2_SQ)
            m1 = c1 * x + c2 * mean
            if NEED_VAR:
                var = tl.load(SCAL + S_LAM2) + c2_sq * var  # (in [lam2, lam2 + c2^2 h^2] with a range)
            if NEED_M3:
                c1x = c1 * x
                c1x_sq = c1x * c1x
                m3 = (c1x_sq * c1x + 3 * c1x_sq * c2 * mean + 3 * c1x * c2_sq * m2
                      + tl.load(SCAL + S_C2_CU) * m3) + tl.load(SCAL + S_THREE_LAM2) * m1

            w1 = tl.load(SCAL + S_W1).to(tl.float32)
            off1 = tl.full([BLOCK], 0.0, tl.float64)  # mu1 - M1
            off2 = tl.full([BLOCK], 0.0, tl.float64)  # mu2 - M1
            sd = tl.full([BLOCK], 0.0, tl.float64)  # sqrt(s2)
            s2out = tl.full([BLOCK], 0.0, tl.float32)
            if MODE <= 1:  # GAUSSIAN (0) / CLOSED (1): fit on Var scaled by 2^(-2p)
                if MODE == 0:
                    vfit = tl.minimum(tl.maximum(var, 0.0), tl.load(SCAL + S_VAR_CAP))
                else:
                    vfit = tl.maximum(var, 0.0)
                    kappa3 = m3 - 3 * m1 * vfit - m1 * m1 * m1
                biased = (vfit.to(tl.int64, bitcast=True) >> 52) & 0x7FF
                p = tl.where((biased > 0) & (biased < 0x7FF), (biased - 1023) >> 1, 0)
                up = ((p + 1023) << 52).to(tl.float64, bitcast=True)  # 2^p
                down = ((1023 - p) << 52).to(tl.float64, bitcast=True)  # 2^-p
                vs = (vfit * down * down).to(tl.float32)  # in [1, 4) unless 0, denormal or inf
                if MODE == 0:
                    s2s = vs
                else:
                    ks = (kappa3 * down * down * down).to(tl.float32)
                    w2 = tl.load(SCAL + S_W2).to(tl.float32)
                    w1w2 = tl.load(SCAL + S_W1W2).to(tl.float32)
                    q = ks * tl.load(SCAL + S_INV_SKEW).to(tl.float32)
                    aq = tl.abs(q)
                    safe = tl.where(aq > 0.0, aq, 1.0)
                    y = tl.exp2(tl.log2(safe) * 0.3333333333333333)
                    ok = (aq > 0.0) & (y > 0.0) & (y < float("inf"))
                    ys = tl.where(ok, y, 1.0)
                    y = tl.where(ok, ys + (safe / (ys * ys) - ys) * 0.3333333333333333,
                                 tl.where(aq > 0.0, y, 0.0))  # one Newton step for y^3 = |q|
                    delta = tl.where(q < 0.0, -y, y)
                    # the knee of fit.fit_closed: q / knee_delta^2 where delta^2 < knee_delta^2 (the
                    # scaling by powers of two commutes with it: delta ~ 2^-p, Var ~ 2^-2p, q ~ 2^-3p)
                    knee2 = tl.load(SCAL + S_KNEE2).to(tl.float32) * vs
                    below = delta * delta < knee2  # (False for Var = 0 and for NaN)
                    delta = tl.where(below, q / tl.where(below, knee2, 1.0), delta)
                    s2s = vs - w1w2 * (delta * delta)
                    floor = tl.load(SCAL + S_VAR_FLOOR).to(tl.float32) * vs
                    too_skewed = s2s < floor
                    s2s = tl.where(too_skewed, floor, s2s)
                    max_delta = tl.sqrt(tl.maximum(vs - floor, 0.0) / w1w2)
                    signed_max = tl.where(delta < 0.0, -max_delta, tl.where(delta > 0.0, max_delta, 0.0))
                    delta = tl.where(too_skewed, signed_max, delta)
                    delta64 = delta.to(tl.float64) * up
                    off1 = w2.to(tl.float64) * delta64
                    off2 = -(w1.to(tl.float64) * delta64)
                sd = tl.sqrt(tl.maximum(s2s, 0.0)).to(tl.float64) * up
                s2out = (s2s.to(tl.float64) * up * up).to(tl.float32)
            if MODE == 2:  # ADAN (fit.fit_adan)
                kap = m3 - 3 * m1 * var - m1 * m1 * m1
                if FIT_FP64:
                    a, b, beta = _adan_loop(m1, var, kap, SCAL, ADAN, ITERS, BLOCK, tl.float64)
                else:
                    a, b, beta = _adan_loop(m1.to(tl.float32), var.to(tl.float32), kap.to(tl.float32),
                                            SCAL, ADAN, ITERS, BLOCK, tl.float32)
                    a = a.to(tl.float64)
                    b = b.to(tl.float64)
                    beta = beta.to(tl.float64)
                    # elements outside fp32's comfortable range (see ADAN_FP32_LIMITS) are refitted in
                    # fp64, each by itself as in the C++ kernel; a block runs the fp64 loop only when
                    # one of its elements needs it
                    av = tl.abs(var)
                    in_range = ((tl.abs(m1) <= ADAN_FP32_M1_MAX) & (av >= ADAN_FP32_VAR_MIN) & (av <= ADAN_FP32_VAR_MAX)
                                & (tl.abs(kap) <= ADAN_FP32_K3_MAX))
                    wide = mask & ~in_range  # (NaN is not in range)
                    if tl.reduce(wide.to(tl.int32), 0, _either) != 0:
                        a64, b64, beta64 = _adan_loop(m1, var, kap, SCAL, ADAN, ITERS, BLOCK, tl.float64)
                        a = tl.where(wide, a64, a)
                        b = tl.where(wide, b64, b)
                        beta = tl.where(wide, beta64, beta)
                # fp64 overflow (moments beyond ~1e30): fall back to the Gaussian N(M1, Var) rather than NaN
                fin = (tl.abs(a) < float("inf")) & (tl.abs(b) < float("inf")) & (tl.abs(beta) < float("inf"))
                a = tl.where(fin, a, 0.0)
                b = tl.where(fin, b, 0.0)
                beta = tl.where(fin, beta, 1.0)
                s2fit = tl.maximum(beta * var, 0.0)
                s2out = (beta * var).to(tl.float32)
                off1 = a
                off2 = b
                sd = tl.sqrt(s2fit)

            if MODE == 3:  # DENOISE
                xs = m1
            elif MODE == 0:  # GAUSSIAN
                xs = m1 + sd * z64
            elif MODE == 4:  # FIXED: N(M1, one variance) (ddpm, ddpm-large, analytic-dpm)
                xs = m1 + tl.load(SCAL + S_FIXED_SD) * z64
                s2out = s2out + tl.load(SCAL + S_FIXED_VAR).to(tl.float32)
            elif MODE == 5:  # DDIM (solvers.ddim_step), M1 = E[x0|x_t]: a_s x0 + eps_scale eps (+ noise)
                eps = (x - tl.load(SCAL + S_A_T) * m1) / tl.load(SCAL + S_SIGMA_T)
                xs = tl.load(SCAL + S_DDIM_A_S) * m1 + tl.load(SCAL + S_DDIM_EPS_SCALE) * eps
                xs = xs + tl.load(SCAL + S_FIXED_SD) * z64  # (+0 for eta = 0)
                s2out = s2out + tl.load(SCAL + S_FIXED_VAR).to(tl.float32)
            else:
                first = u < w1
                xs = m1 + tl.where(first, off1, off2) + sd * z64
            if OUT_FP64:
                tl.store(OUT + e, xs, mask=mask)
            else:
                tl.store(OUT + e, xs.to(tl.float32).to(OUT.dtype.element_ty), mask=mask)
            if WRITE_PARAMS:
                tl.store(MU1 + e, (m1 + off1).to(tl.float32), mask=mask)
                tl.store(MU2 + e, (m1 + off2).to(tl.float32), mask=mask)
                tl.store(S2 + e, s2out, mask=mask)
            # one flag for the whole launch, written only by the elements that read a NaN or inf
            # (no tl.max: library functions fail in the interpreter when triton was imported without it)
            tl.atomic_max(NONFINITE + e * 0, 1, mask=mask & ~finite, sem="relaxed")


def _is_interpreted(fn) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


@functools.lru_cache(maxsize=1)
def _cpu_kernel():
    """The kernel run by Triton's interpreter (for CPU tensors), whatever TRITON_INTERPRET was at import.
    Imported without it, the kernel's helpers are compiled-only jit functions, which the interpreter
    cannot call: the interpreted kernel then reads interpreted copies of them (its own globals)."""
    if _is_interpreted(_gms_step_kernel):
        return _gms_step_kernel
    from triton.runtime.interpreter import InterpretedFunction

    fn = _gms_step_kernel.fn
    env = dict(fn.__globals__, _adan_loop=InterpretedFunction(_adan_loop.fn))
    return InterpretedFunction(types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__))


def _launch_compiled(grid, *args, **kwargs) -> None:
    _gms_step_kernel[grid](*args, **kwargs)


def _launch_interpreted(grid, *args, **kwargs) -> None:
    """Run the kernel on CPU tensors in the interpreter, with triton's ``interpret`` knob on for the
    duration of the launch (parts of triton imported lazily at the first launch check it)."""
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "scope"):
        _cpu_kernel()[grid](*args, **kwargs)
        return
    with runtime.scope():
        runtime.interpret = True
        _cpu_kernel()[grid](*args, **kwargs)


def _gpu_launch_options(mode: int, fit_fp64: bool) -> tuple[int, dict]:
    """BLOCK and the compile options of a launch on the GPU (GPU_CONFIGS, ADAN_FP32_MAXNREG)."""
    block, warps = GPU_CONFIGS[mode]
    options = {"num_warps": warps}
    if mode == MODE_ADAN and not fit_fp64 and ADAN_FP32_MAXNREG is not None:
        options["maxnreg"] = ADAN_FP32_MAXNREG
    return block, options


def _new_output(shape, dtype, device) -> torch.Tensor:
    """Allocates every output (a hook for tests, which poison them)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _rows(t: torch.Tensor, like: torch.Tensor, d: int, name: str) -> tuple[torch.Tensor, int]:
    """``t`` as N rows of d contiguous elements: (tensor, row stride). Views whose rows are contiguous
    (e.g. one head sliced out of the concatenated model output) are read in place; others are copied."""
    if t.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(like.shape)} (like x_t)")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, x_t on {like.device}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            t = t.contiguous()
            break
        expected *= size
    return t, (t.stride(0) if t.shape[0] > 1 else d)


def fused_step(x_t: torch.Tensor, e1: torch.Tensor, e2: torch.Tensor | None, e3: torch.Tensor | None,
               seeds: torch.Tensor, indices: torch.Tensor, cfg: FusedStepConfig,
               return_params: bool = False, nonfinite_flag: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, MixtureParams | None]:
    """One fused GMS step (see ``gms_kernels.kernels``): x_s in x_t's dtype, and the fitted
    (mu1, mu2, s2) as fp32 tensors shaped like x_t when ``return_params``.

    The kernel flags a NaN or inf it reads in x_t or a head. Without ``nonfinite_flag`` the launcher
    reads its own flag and raises :class:`NonFiniteInput`, at the cost of one host sync; with one (an
    int32 tensor of one element on x_t's device) the kernel sets it to 1 and the caller reads it when
    it likes (no sync here, so a sampling loop keeps the device busy).

    GAUSSIAN, FIXED and DDIM steps return mu1 = mu2 = M1 and s2 = the variance drawn with (for DDIM,
    M1 is E[x0|x_t] and the variance that of its noise); DENOISE returns mu1 = mu2 = M1 and s2 = 0.
    """
    if triton is None:
        raise RuntimeError("the Triton backend needs triton: pip install triton")
    mode = cfg.mode
    if mode not in _MODES:
        raise ValueError(f"unknown fused-step mode {mode}")
    if x_t.dim() < 1:
        raise ValueError("x_t must be [N, ...] with a batch dimension")
    if not x_t.is_floating_point():
        raise ValueError(f"x_t must be a floating-point tensor, got {x_t.dtype}")
    needs = _HEADS_READ.get(mode, 3)
    heads = [e1, e2, e3]
    for k, h in enumerate(heads[:needs]):
        if h is None:
            raise ValueError(f"this fused step needs e{k + 1}, got None")
    if mode in (MODE_CLOSED, MODE_ADAN) and cfg.w1 == 0.5:
        raise ValueError("equal weights cannot match a third moment")

    device = x_t.device
    n = x_t.shape[0]
    total = x_t.numel()
    d = total // n if n else 0
    seeds, indices = as_tensor_on(seeds), as_tensor_on(indices)
    if seeds.numel() != n or indices.numel() != n:
        raise ValueError(f"seeds and indices must have one entry per sample ({n}), "
                         f"got {seeds.numel()} and {indices.numel()}")
    if total and indices.device.type == "cpu":  # (not checked on device tensors: it would sync)
        check_counter_range(indices, d)

    out = _new_output(x_t.shape, x_t.dtype, device)
    want = return_params or mode == MODE_DEBUG_RNG
    params = MixtureParams(*(_new_output(x_t.shape, torch.float32, device) for _ in range(3))) if want else None
    if total == 0:
        return out, params
    if seeds.device != device or indices.device != device:  # one host-to-device copy for both
        seeds, indices = to_device_async(torch.stack([seeds.reshape(-1).long(), indices.reshape(-1).long()]), device)
    if seeds.dtype != torch.int64 or indices.dtype != torch.int64 or not (seeds.is_contiguous() and indices.is_contiguous()):
        seeds, indices = seeds.reshape(-1).long().contiguous(), indices.reshape(-1).long().contiguous()
    x, sx = _rows(x_t, x_t, d, "x_t")
    rows = [_rows(h, x_t, d, f"e{k + 1}") if k < needs else (x, sx) for k, h in enumerate(heads)]  # (x: unread)
    scal, adan, bases = _device_tables(cfg, str(device))
    mu1, mu2, s2 = (params.mu1, params.mu2, params.s2) if want else (out, out, out)  # (out: never written)

    fit_fp64 = bool(ADAN_FP64 if cfg.adan_fp64 is None else cfg.adan_fp64)
    if device.type == "cpu":
        launch, block, options = _launch_interpreted, INTERPRETER_BLOCK, {"num_warps": 4}
    else:
        launch, (block, options) = _launch_compiled, _gpu_launch_options(mode, fit_fp64)
    nonfinite = torch.zeros(1, dtype=torch.int32, device=device) if nonfinite_flag is None else nonfinite_flag
    launch((triton.cdiv(total, block),),
           x, rows[0][0], rows[1][0], rows[2][0], seeds, indices, out, mu1, mu2, s2, scal, adan, bases, nonfinite,
           total, d, sx, rows[0][1], rows[1][1], rows[2][1],
           MODE=mode, NEED_VAR=needs >= 2, NEED_M3=needs >= 3, HAS_RANGE=bool(cfg.has_range),
           PER_PIXEL=bool(cfg.per_pixel), WRITE_PARAMS=bool(return_params),
           ITERS=len(cfg.lrs) if mode == MODE_ADAN else 0,
           FIT_FP64=fit_fp64, OUT_FP64=out.dtype == torch.float64, BLOCK=block, enable_fp_fusion=FP_FUSION,
           **options)
    if nonfinite_flag is None and mode != MODE_DEBUG_RNG and nonfinite.item():  # (the step's one host sync)
        raise NonFiniteInput("the fused step read a NaN or inf in x_t or a head")
    return out, params


def compile_offline(mode: int, fit_fp64: bool = False, iters: int = 25, arch: int = 90) -> dict[str, str]:
    """Compile the kernel for an NVIDIA GPU of compute capability ``arch`` without one (Triton's own
    ptxas), as ``fused_step`` launches it for fp32 tensors: {'ptx', 'sass', 'resources'}, the SASS
    from nvdisasm and cuobjdump's register and stack use. Needs triton imported without
    TRITON_INTERPRET."""
    import os
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _is_interpreted(_gms_step_kernel):
        raise RuntimeError("triton was imported with TRITON_INTERPRET=1: the kernel cannot be compiled")
    pointers = dict.fromkeys(["X", "E1", "E2", "E3", "OUT", "MU1", "MU2", "S2"], "*fp32")
    pointers.update(SEEDS="*i64", IDX="*i64", SCAL="*fp64", ADAN="*fp64", BASES="*i64", NONFINITE="*i32")
    block, options = _gpu_launch_options(mode, fit_fp64)
    needs = _HEADS_READ.get(mode, 3)
    constants = dict(MODE=mode, NEED_VAR=needs >= 2, NEED_M3=needs >= 3, HAS_RANGE=True, PER_PIXEL=False,
                     WRITE_PARAMS=True, ITERS=iters if mode == MODE_ADAN else 0, FIT_FP64=fit_fp64,
                     OUT_FP64=False, BLOCK=block)
    names = _gms_step_kernel.arg_names
    signature = {n: pointers.get(n, "constexpr" if n in constants else "i64") for n in names}
    source = ASTSource(fn=_gms_step_kernel, signature=signature,
                       constexprs={(names.index(n),): v for n, v in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options={"enable_fp_fusion": FP_FUSION, **options})
    tool = lambda name: os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        run = lambda *cmd: subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        usage = run(tool("cuobjdump"), "-res-usage", path)
        sass = run(tool("nvdisasm"), "-c", path)
    resources = " ".join(line.strip() for line in usage.splitlines() if "REG:" in line)
    return {"ptx": compiled.asm["ptx"], "sass": sass, "resources": resources}


def _draw_streams(seeds: torch.Tensor, indices: torch.Tensor, t: int, shape, per_pixel: bool,
                  device="cpu") -> dict[str, torch.Tensor]:
    """Test hook: the kernel's own random numbers for a batch of ``shape`` = (N, ...): words 0 and 1
    of each element's Philox call in the noise stream (that of its index // 4; as int64 holding
    uint32), z and the component uniform u."""
    x = torch.zeros(shape, dtype=torch.float32, device=device)
    cfg = FusedStepConfig(mode=MODE_DEBUG_RNG, t=t, a_t=1.0, sigma_t=0.0, c1=0.0, c2=1.0, lam2=0.0,
                          per_pixel=per_pixel)
    z, p = fused_step(x, x, None, None, seeds, indices, cfg)
    word = lambda f: f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return {"w0": word(p.mu1), "w1": word(p.mu2), "z": z, "u": p.s2}
