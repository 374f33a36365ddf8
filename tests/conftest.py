import pytest
import torch

import gms_kernels as gk


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests use small tensors: one intra-op thread is faster, and far faster on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def small_schedule():
    return gk.Schedule.linear(100, 1e-3, 0.2)


@pytest.fixture
def paper_oracle():
    return gk.GaussianMixtureOracle([0.4, 0.6], [[-0.4], [0.3]], [0.12, 0.05], gk.Schedule.linear())


def image_oracle(schedule, shape=(3, 5, 7), seed=0):
    """A 3-component mixture over odd-shaped 'images' in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    means = torch.rand(3, *shape, generator=g, dtype=torch.float64) * 1.4 - 0.7
    stds = torch.rand(3, *shape, generator=g, dtype=torch.float64) * 0.1 + 0.05
    return gk.GaussianMixtureOracle([0.2, 0.3, 0.5], means, stds, schedule)


@pytest.fixture
def host_reads(monkeypatch):
    """A list that collects (method, calling function) for every read of tensor data on the host
    (item, tolist, bool, int, float, numpy, cpu): on a GPU each such read waits for the device's
    queue. The launchers' counter-range check, which only host tensors take, is not counted."""
    import sys

    reads = []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_name
            if caller != "check_counter_range":
                reads.append((_name, caller))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads
