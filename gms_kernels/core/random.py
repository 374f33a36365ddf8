"""Counter-based random numbers shared by every backend.

Philox4x32-10 exactly as Triton implements it (triton/language/random.py), written with int64 torch ops, so
that the torch reference, the C++ extension and the Triton kernel draw bit-identical integers and uniforms.

Every random number of a sampling run is addressed by (seed, stream, t, index):
``offset = stream << 56 | t << 40 | index`` is the 64-bit Philox counter of a uniform and the
seed is the key; normals come four to a Philox call (the counter of index // 4, see ``normal``).
``index`` is the *global* sample index (times the per-sample size, plus the element), so sample i
gets the same numbers whatever batch it is drawn in.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .devices import as_tensor_on, generator_device, to_device_async

_MASK32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_UNIFORM_SCALE = 4.6566127342e-10  # 2^-31, as Triton writes it
_MIN_U1 = 1.0e-7  # Box-Muller's u1 is clamped here (tl.randn's bound): |z| <= 5.68
_TWO_PI = 6.283185307179586
# the two as float32 scalars that multiply a tensor on any device: 0-dim CPU tensors (a CUDA copy would cost a
# host sync per draw, and the CPU keeps them off a non-CPU default device), made once
_UNIFORM_SCALE_32 = torch.tensor(_UNIFORM_SCALE, dtype=torch.float32, device="cpu")
_TWO_PI_32 = torch.tensor(_TWO_PI, dtype=torch.float32, device="cpu")
_GROUP_SHIFT = 2  # normals come four to a Philox call (see ``normal``): index >> 2 picks the call
# Bumped whenever the numbers drawn for a given (seed, stream, t, index) change, so that caches of
# sampled results can tell (2: normals four to a Philox call; 1: one, tl.randn's).
STREAM_VERSION = 2

# streams (top byte of the 64-bit counter)
STREAM_STEP_NOISE = 0   # Gaussian noise of a step
STREAM_COMPONENT = 1    # uniform that chooses the mixture component
STREAM_INITIAL = 2      # x_T
STREAM_SECOND_NOISE = 3  # a step's second Gaussian (SEEDS-2's second half-interval)
STREAM_ADAPTIVE = 4     # the adaptive GGF sampler's noise; its "t" field counts that sample's attempts
STREAM_BROWNIAN = 5     # GGF's Brownian path (noise="brownian"); its counters address tree nodes (normal_at_nodes)
STREAM_THIRD_NOISE = 6  # a step's third Gaussian (SEEDS-3's last interval)
_T_SHIFT, _STREAM_SHIFT = 40, 56
MAX_INDEX = 1 << _T_SHIFT
NODE_LOW_BITS = 8  # normal_at_nodes: a node's low bits extend the element index, the rest fill the t field
MAX_NODE = 1 << (_STREAM_SHIFT - _T_SHIFT + NODE_LOW_BITS)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of the 64-bit product of constant a and uint32 values b."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    lo_part = a_lo * b  # < 2^48, exact in int64
    hi = (a_hi * b + (lo_part >> 16)) >> 16
    lo = (a * b) & _MASK32  # wraps in int64, the low word is still right
    return hi, lo


def philox4x32(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
               k0: torch.Tensor, k1: torch.Tensor, rounds: int = 10) -> tuple[torch.Tensor, ...]:
    """Philox4x32 on int64 tensors holding uint32 values (Triton's round order)."""
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def randint2x(seed: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First two Philox words for key = seed (uint64) and counter = (offset lo, offset hi, 0, 0)."""
    return randint4x(seed, offset)[:2]


def randint4x(seed: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four Philox words for key = seed (uint64) and counter = (offset lo, offset hi, 0, 0)."""
    offset = as_tensor_on(offset, torch.int64)
    seed = as_tensor_on(seed, torch.int64, offset.device)
    zero = torch.zeros_like(offset)
    return philox4x32(offset & _MASK32, (offset >> 32) & _MASK32, zero, zero,
                      seed & _MASK32, (seed >> 32) & _MASK32)


def uint_to_uniform(x: torch.Tensor) -> torch.Tensor:
    """Triton's uint32 -> float32 in [0, 1): bitcast to int32, fold negatives, scale by 2^-31."""
    v = torch.where(x >= 2**31, x - 2**32, x)
    v = torch.where(v < 0, -v - 1, v)
    return v.to(torch.float32) * _UNIFORM_SCALE_32


def uniform(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """tl.rand(seed, offset): float32 uniform from the first Philox word."""
    return uint_to_uniform(randint2x(seed, offset)[0])


def normal_group(offset: torch.Tensor) -> torch.Tensor:
    """The Philox counter that holds the normal of `offset`: its index divided by 4.

    The stream and time bits stay where ``counter`` puts them, so groups of different streams or
    times never share a counter.
    """
    offset = as_tensor_on(offset, torch.int64)
    return (offset & ~(MAX_INDEX - 1)) | ((offset & (MAX_INDEX - 1)) >> _GROUP_SHIFT)


def normal(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """float32 N(0, 1) at (seed, offset): Box-Muller on all four words of one Philox call.

    The four consecutive indices 4g .. 4g+3 share the Philox call of counter ``normal_group``:
    words (0, 1) give the pair (r cos theta, r sin theta) of indices 4g and 4g+1, words (2, 3) that
    of 4g+2 and 4g+3, with u1 = max(uniform(first word), 1e-7), u2 = uniform(second word),
    r = sqrt(-2 ln u1), theta = 2 pi u2 (the float32 operations of ``tl.randn``, which keeps only
    the cosine of words 0 and 1). One Philox call and one logarithm per two normals instead of one
    each: the random numbers are a large part of a fused step's cost on CPU.
    """
    offset = as_tensor_on(offset, torch.int64)
    words = randint4x(seed, normal_group(offset))
    second_pair = ((offset >> 1) & 1).bool()
    w_u1 = torch.where(second_pair, words[2], words[0])
    w_u2 = torch.where(second_pair, words[3], words[1])
    u1 = uint_to_uniform(w_u1).clamp_min(_MIN_U1)
    theta = _TWO_PI_32 * uint_to_uniform(w_u2)
    radius = torch.sqrt(-2.0 * torch.log(u1))
    return radius * torch.where((offset & 1).bool(), torch.sin(theta), torch.cos(theta))


def counter(stream: int, t: int, index: torch.Tensor) -> torch.Tensor:
    """The 64-bit Philox counter of (stream, time index, global element index)."""
    return (stream << _STREAM_SHIFT) | (int(t) << _T_SHIFT) | index


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A 62-bit seed from a torch generator on any device (or torch's global RNG)."""
    device = generator_device(generator)
    return int(torch.randint(0, 2**62, (1,), generator=generator, dtype=torch.int64, device=device))


GeneratorLike = int | torch.Generator | Sequence[int | torch.Generator] | None


def check_seed(value: object, name: str = "generator") -> int:
    """An int seed in [0, 2^63) (numpy integers too), refused otherwise with a message naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int seed in [0, 2^63), a torch.Generator, None, or a list of those "
                        f"(one per sample), got {type(value).__name__} {value!r}")
    if not 0 <= value < 2**63:
        raise ValueError(f"{name}: seeds must lie in [0, 2^63), got {value}")
    return int(value)


def check_first_index(value: object) -> int:
    """The global index of a batch's first sample: a non-negative integer (sample i then draws the numbers of
    index first_index + i)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"first_index must be a non-negative integer (the global index of the batch's first "
                         f"sample), got {value!r}")
    return int(value)


def fixed_seeds(generator: GeneratorLike, draw_global: bool = False) -> GeneratorLike:
    """``generator`` with every torch.Generator replaced by one seed drawn from it (:func:`draw_seed`), so
    that several calls that should share keys get the same ones; ints pass through, and None (torch's
    global RNG) too, unless ``draw_global`` draws its seed now."""
    if generator is None:
        return draw_seed(None) if draw_global else None
    if isinstance(generator, (list, tuple)):
        return [draw_seed(g) if isinstance(g, torch.Generator) else g for g in generator]
    return draw_seed(generator) if isinstance(generator, torch.Generator) else generator


@dataclass
class SampleNoise:
    """Per-sample addressable randomness for one batch.

    ``seeds[i]`` keys sample i and ``indices[i]`` is its global index; both are int64 [N].
    """

    seeds: torch.Tensor
    indices: torch.Tensor
    _on_device: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _fits: set = field(default_factory=set, init=False, repr=False, compare=False)  # per_sample values checked

    @classmethod
    def create(cls, generator: GeneratorLike, batch: int, first_index: int = 0) -> "SampleNoise":
        """From an int seed, a torch.Generator, None (torch's global RNG) or one of those per sample."""
        if isinstance(generator, (list, tuple)):
            if len(generator) != batch:
                raise ValueError(f"got {len(generator)} generators for a batch of {batch}: pass one per sample")
            seeds = [draw_seed(g) if isinstance(g, torch.Generator) else check_seed(g, f"generator[{i}]")
                     for i, g in enumerate(generator)]
            # each sample has its own key, so its own index 0 keeps it independent of its position
            return cls(as_tensor_on(seeds, torch.int64), torch.zeros(batch, dtype=torch.int64, device="cpu"))
        if generator is None or isinstance(generator, torch.Generator):
            seed = draw_seed(generator)
        else:
            seed = check_seed(generator, "generator")
        first_index = check_first_index(first_index)
        indices = torch.arange(first_index, first_index + batch, dtype=torch.int64, device="cpu")
        return cls(torch.full((batch,), seed, dtype=torch.int64, device="cpu"), indices)

    def __len__(self) -> int:
        return self.seeds.numel()

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(seeds, indices) on ``device``, copied once (without waiting for the device's queue) and kept."""
        if self.seeds.device == device:
            return self.seeds, self.indices
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = tuple(to_device_async(torch.stack([self.seeds, self.indices]), device))
        return self._on_device[key]

    def check_capacity(self, per_sample: int) -> None:
        """Every element's counter fits (see :func:`check_counter_range`); checked once per size, since
        a sampling loop asks at every step."""
        if per_sample not in self._fits:
            check_counter_range(self.indices, per_sample)
            self._fits.add(per_sample)

    def _element_offsets(self, stream: int, t: int, per_sample: int,
                         device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_capacity(per_sample)
        device = self.seeds.device if device is None else torch.device(device)
        seeds, indices = self.on(device)
        index = indices[:, None] * per_sample + torch.arange(per_sample, dtype=torch.int64, device=device)
        return seeds[:, None].expand_as(index), counter(stream, t, index)

    def normal(self, stream: int, t: int, shape: Sequence[int],
               device: torch.device | str | None = None) -> torch.Tensor:
        """float32 N(0, 1) of shape [N, *shape], computed on ``device`` (default: where the seeds are;
        on a GPU the integers and uniforms are the same, the normals within float rounding)."""
        per_sample = _numel(shape)
        seeds, offsets = self._element_offsets(stream, t, per_sample, device)
        return normal(seeds, offsets).reshape(len(self), *shape)

    def normal_per_sample(self, stream: int, ts: torch.Tensor, shape: Sequence[int],
                          device: torch.device | str | None = None) -> torch.Tensor:
        """Like :meth:`normal`, but sample i draws at its own time field ``ts[i]`` (int [N], each in
        [0, 2^16)): an adaptive sampler addresses noise by each sample's own attempt count, so that a
        sample's numbers do not depend on how the others progress."""
        ts = as_tensor_on(ts, torch.int64).reshape(-1).cpu()
        if ts.numel() != len(self) or (ts < 0).any() or (ts >= 1 << (_STREAM_SHIFT - _T_SHIFT)).any():
            raise ValueError(f"need one time field in [0, 2^16) per sample ({len(self)}), got {ts.tolist()[:8]}")
        per_sample = _numel(shape)
        seeds, offsets = self._element_offsets(stream, 0, per_sample, device)
        offsets = offsets | (ts.to(offsets.device)[:, None] << _T_SHIFT)
        return normal(seeds, offsets).reshape(len(self), *shape)

    def normal_at_nodes(self, stream: int, nodes: torch.Tensor, shape: Sequence[int],
                        device: torch.device | str | None = None) -> torch.Tensor:
        """float64 N(0, 1) of shape [N, *shape] where sample i draws at its own node ``nodes[i]`` (int [N], each in
        [0, 2^24)): the numbers of a tree that a sampler walks down (GGF's Brownian path). The node's low
        NODE_LOW_BITS bits extend each element's index, its high bits fill the t field, so the sample indices
        must fit 2^40 / (elements * 2^NODE_LOW_BITS)."""
        nodes = as_tensor_on(nodes, torch.int64).reshape(-1).cpu()
        if nodes.numel() != len(self) or (nodes.numel() and (int(nodes.min()) < 0 or int(nodes.max()) >= MAX_NODE)):
            raise ValueError(f"need one node in [0, 2^24) per sample ({len(self)}), got {nodes.tolist()[:8]}")
        per_sample = _numel(shape)
        self.check_capacity(per_sample << NODE_LOW_BITS)
        device = self.seeds.device if device is None else torch.device(device)
        seeds, indices = self.on(device)
        nodes = nodes.to(device)
        element = indices[:, None] * per_sample + torch.arange(per_sample, dtype=torch.int64, device=device)
        low = (nodes & ((1 << NODE_LOW_BITS) - 1))[:, None]
        offsets = counter(stream, 0, (element << NODE_LOW_BITS) | low) | ((nodes >> NODE_LOW_BITS)[:, None] << _T_SHIFT)
        return normal(seeds[:, None].expand_as(offsets), offsets).reshape(len(self), *shape).to(torch.float64)

    def uniform(self, stream: int, t: int, shape: Sequence[int] = (),
                device: torch.device | str | None = None) -> torch.Tensor:
        """float32 U[0, 1) of shape [N, *shape], computed on ``device``; shape () gives one number per sample."""
        per_sample = _numel(shape)
        seeds, offsets = self._element_offsets(stream, t, per_sample, device)
        return uniform(seeds, offsets).reshape(len(self), *shape)


def check_counter_range(indices: torch.Tensor, per_sample: int) -> None:
    """Sample indices in [0, 2^40 / per_sample): each element's index * per_sample + j must fit the
    counter's 40 bits (a host tensor: on a device the check would cost a sync)."""
    if indices.numel() and (int(indices.min()) < 0 or (int(indices.max()) + 1) * per_sample > MAX_INDEX):
        raise ValueError("sample indices must lie in [0, 2^40 / elements per sample) for the random-number counter")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
