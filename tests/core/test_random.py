import math

import pytest
import torch

from gms_kernels.core import random as rng


def _words(c, k):
    t = lambda v: torch.tensor([v], dtype=torch.int64)
    return [int(w) for w in rng.philox4x32(t(c), t(c), t(c), t(c), t(k), t(k))]


def test_philox_known_answers():
    assert _words(0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert _words(0xFFFFFFFF, 0xFFFFFFFF) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def test_uint_to_uniform_matches_tritons_rule():
    x = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1], dtype=torch.int64)
    u = rng.uint_to_uniform(x)
    scale = torch.tensor(4.6566127342e-10, dtype=torch.float32)
    # bitcast to int32, v -> -v - 1 when negative, times 2^-31 in float32
    expected = torch.tensor([0, 1, 2**31 - 1, 2**31 - 1, 0], dtype=torch.float32) * scale
    assert torch.equal(u, expected)
    assert float(u.max()) < 1.0 + 1e-7 and float(u.min()) >= 0.0


def test_streams_are_uniform_and_normal():
    seed = torch.full((200_000,), 1234, dtype=torch.int64)
    offs = torch.arange(200_000, dtype=torch.int64)
    u = rng.uniform(seed, offs).double()
    z = rng.normal(seed, offs).double()
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    assert abs(float(z.mean())) < 0.01 and abs(float(z.var()) - 1) < 0.01
    assert abs(float((z**3).mean())) < 0.03 and abs(float((z**4).mean()) - 3) < 0.05


def test_normals_come_four_to_a_philox_call():
    # indices 4g .. 4g+3 are (r cos, r sin) of words (0, 1) and of words (2, 3) of the call at index g
    first_call, calls, t = 2**37 + 5, 50, 9
    index = torch.arange(4 * first_call, 4 * (first_call + calls), dtype=torch.int64)
    seed = torch.full_like(index, 2**40 + 3)
    z = rng.normal(seed, rng.counter(rng.STREAM_INITIAL, t, index)).double().view(calls, 4)
    call_counter = rng.counter(rng.STREAM_INITIAL, t, torch.arange(first_call, first_call + calls))
    assert torch.equal(rng.normal_group(rng.counter(rng.STREAM_INITIAL, t, index))[::4], call_counter)
    words = rng.randint4x(seed[::4], call_counter)
    for pair in (0, 1):
        u1 = rng.uint_to_uniform(words[2 * pair]).double().clamp_min(1e-7)
        theta = 2 * math.pi * rng.uint_to_uniform(words[2 * pair + 1]).double()
        radius = (-2 * u1.log()).sqrt()
        # (float32 against float64 formulas: theta's rounding moves z by up to ~4e-6)
        torch.testing.assert_close(z[:, 2 * pair], radius * theta.cos(), rtol=0, atol=1e-5)
        torch.testing.assert_close(z[:, 2 * pair + 1], radius * theta.sin(), rtol=0, atol=1e-5)


def test_sample_noise_addresses_are_batch_independent():
    a = rng.SampleNoise.create(99, 5)
    b = rng.SampleNoise.create(99, 2, first_index=3)
    torch.testing.assert_close(a.normal(0, 7, (2, 3))[3:], b.normal(0, 7, (2, 3)), rtol=0, atol=0)
    torch.testing.assert_close(a.uniform(1, 7)[3:], b.uniform(1, 7), rtol=0, atol=0)
    assert not torch.equal(a.normal(0, 7, (2, 3)), a.normal(0, 8, (2, 3)))  # another t, other numbers
    assert not torch.equal(a.uniform(1, 7, (2, 3)).flatten(), a.normal(1, 7, (2, 3)).flatten())


def test_sample_noise_draws_on_the_device_it_is_asked_for():
    """Streams for a device tensor are computed there (no host draw and copy per step); on the host
    the argument changes nothing. ('meta' runs every operation without data.)"""
    src = rng.SampleNoise.create(7, 3, first_index=5)
    assert torch.equal(src.normal(0, 9, (2, 5), "cpu"), src.normal(0, 9, (2, 5)))
    assert torch.equal(src.uniform(1, 9, (), "cpu"), src.uniform(1, 9))
    for z in (src.normal(0, 9, (2, 5), "meta"), src.uniform(1, 9, (2, 5), "meta")):
        assert z.device.type == "meta" and z.shape == (3, 2, 5) and z.dtype == torch.float32


def test_sample_noise_copies_to_a_device_once():
    """A sampling loop reuses one SampleNoise: its (seeds, indices) go to the device once."""
    src = rng.SampleNoise.create(7, 3, first_index=5)
    assert src.on(torch.device("cpu")) == (src.seeds, src.indices)
    first = src.on(torch.device("meta"))
    assert first[0].device.type == "meta" and first[0].shape == (3,) and first[1].dtype == torch.int64
    again = src.on(torch.device("meta"))
    assert again[0] is first[0] and again[1] is first[1]
    src.check_capacity(2**40 // 8)
    with pytest.raises(ValueError, match="random-number counter"):
        src.check_capacity(2**40 // 8 + 1)


def test_a_draw_on_a_device_copies_nothing_from_the_host_but_the_seeds_once(monkeypatch):
    """A host value made into a device tensor is a copy that waits for the device (a host sync on CUDA): once
    the seeds are there, a draw makes no such copy (its constants are 0-dim CPU tensors, scalars on any
    device). On an H200 (2026-11-27) the x_T draw of every gk.sample made three syncs this way."""
    src = rng.SampleNoise.create(7, 3)
    src.on(torch.device("meta"))
    copies = []
    real_tensor, real_to = torch.tensor, torch.Tensor.to

    def tensor(*args, **kwargs):
        copies.append(("torch.tensor", kwargs.get("device")))
        return real_tensor(*args, **kwargs)

    def to(self, *args, **kwargs):
        out = real_to(self, *args, **kwargs)
        if out.device != self.device:
            copies.append(("Tensor.to", out.device))
        return out

    monkeypatch.setattr(torch, "tensor", tensor)
    monkeypatch.setattr(torch.Tensor, "to", to)
    src.normal(0, 9, (2, 5), "meta")
    src.uniform(1, 9, (2, 5), "meta")
    assert not [c for c in copies if c[1] is not None and torch.device(c[1]).type != "cpu"], copies


def test_draw_seed_draws_from_a_generator_on_its_own_device():
    """gk.step / gk.sample / GMSScheduler accept a torch.Generator on any device (the CUDA one on a GPU run)."""
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        reference = torch.Generator(device=device).manual_seed(5)
        expected = [int(torch.randint(0, 2**62, (1,), generator=reference, dtype=torch.int64, device=device))
                    for _ in range(2)]
        generator = torch.Generator(device=device).manual_seed(5)
        assert [rng.draw_seed(generator), rng.draw_seed(generator)] == expected
        noise = rng.SampleNoise.create(torch.Generator(device=device).manual_seed(5), 3)
        assert noise.seeds.tolist() == [expected[0]] * 3
