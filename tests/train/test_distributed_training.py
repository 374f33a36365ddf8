"""Training under torchrun with DDP (gloo, 2 CPU processes) against the one-process run."""
import os
import runpy
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import gms_kernels as gk
from gms_kernels.cli import main
from gms_kernels.models import PytorchDDPMUNet

# (one xdist group: the tests share the runs fixture, a one-process and a torchrun training made once per worker)
pytestmark = [pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
              pytest.mark.xdist_group("distributed_training")]

# Run as a plain script (one process) or under torchrun (N processes): trains a MomentNet with conv
# heads on a tiny frozen UNet; writes each rank's weights and loss history into the folder argv[1].
SCRIPT = '''
import sys
from pathlib import Path

import torch

from gms_kernels.integrations import distributed
from gms_kernels.models import MomentNet, PytorchDDPMUNet
from gms_kernels.train.training import train_heads

out = Path(sys.argv[1])
started = distributed.init_from_env()
rank, world = distributed.world()
data = torch.rand(40, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1


def net(seed):
    torch.manual_seed(0)  # the frozen backbone, the same everywhere (it is not in the checkpoint)
    backbone = PytorchDDPMUNet(T=100, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0, in_channels=1)
    m = MomentNet(backbone, head="conv")  # no parameter whose gradient is pure rounding (a bias before a norm)
    if seed:  # another start on other ranks and runs: DDP starts every rank from rank 0's weights
        with torch.no_grad():
            for p in m.heads.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return m


def train(seed, steps, checkpoint, name=None):
    m = net(seed)
    res = train_heads(m, data, steps=steps, batch_size=8, lr=1e-3, ema_decay=0.5, seed=3, progress=False,
                      checkpoint=out / checkpoint, checkpoint_every=2)
    if name:
        torch.save({"state": m.state_dict(), "history": res.history}, out / f"{name}_rank{rank}.pt")


train(rank, 6, "straight.ckpt", "straight")
train(3 * rank, 3, "resumed.ckpt")  # 3 steps, then a model of other weights goes on to 6 from the checkpoint
train(5 + rank, 6, "resumed.ckpt", "resumed")
if world > 1:
    try:
        train_heads(net(0), data, steps=1, batch_size=7, progress=False)
    except ValueError as exc:
        (out / f"error_rank{rank}.txt").write_text(str(exc))
if started:
    torch.distributed.destroy_process_group()
'''


def _torchrun(nproc, *args, timeout=240):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args]
    res = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _assert_same(a, b, **tol):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], **tol, msg=lambda m, k=k: f"{k}: {m}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process (in this process) and two gloo processes (torchrun) running SCRIPT."""
    root = tmp_path_factory.mktemp("ddp_train")
    script = root / "train_script.py"
    script.write_text(SCRIPT)
    one, two = root / "one", root / "two"
    one.mkdir()
    two.mkdir()
    saved = sys.argv
    sys.argv = [str(script), str(one)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    _torchrun(2, str(script), str(two))
    return one, two


def test_two_processes_match_one_process_and_agree_on_every_rank(runs):
    one, two = runs
    ref, r0, r1 = (_load(p) for p in (one / "straight_rank0.pt", two / "straight_rank0.pt", two / "straight_rank1.pt"))
    _assert_same(r0["state"], r1["state"], rtol=0, atol=0)  # identical weights on both ranks
    assert r0["history"] == r1["history"]  # losses averaged over the ranks: the global-batch loss
    _assert_same(r0["state"], ref["state"], rtol=1e-5, atol=1e-6)  # same global batch, same gradients
    assert [h["step"] for h in r0["history"]] == list(range(1, 7))
    for a, b in zip(r0["history"], ref["history"]):
        assert a.keys() == b.keys() == {"step", "mse_e2", "mse_e3"}
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7)
    ckpt = _load(two / "straight.ckpt")  # written by rank 0, atomically, at the end
    assert ckpt["step"] == 6 and ckpt["history"] == r0["history"]
    for k, v in ckpt["ema"]["shadow"].items():  # the returned (unwrapped) module holds the EMA weights
        assert torch.equal(r0["state"][k], v) and not k.startswith("module.")
    assert not list(two.glob("*.tmp"))


def test_two_process_resume_from_checkpoint_equals_the_straight_run(runs):
    _, two = runs
    for rank in (0, 1):
        straight, resumed = _load(two / f"straight_rank{rank}.pt"), _load(two / f"resumed_rank{rank}.pt")
        _assert_same(resumed["state"], straight["state"], rtol=0, atol=0)
        assert resumed["history"] == straight["history"]


def test_global_batch_not_divisible_by_the_world_size_is_a_clear_error(runs):
    _, two = runs
    for rank in (0, 1):
        text = (two / f"error_rank{rank}.txt").read_text()
        assert "batch_size 7 is the global batch" in text and "a multiple of 2 (e.g. 8)" in text


def test_train_heads_command_under_torchrun_matches_one_process(tmp_path):
    torch.manual_seed(0)
    state = PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0, in_channels=1).state_dict()
    torch.save({"ema_model": state, "net_model": state, "step": 0}, tmp_path / "bb.pt")
    torch.save(torch.rand(24, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1, tmp_path / "d.pt")

    def args(name):
        return ["train-heads", "--data", str(tmp_path / "d.pt"), "--model", str(tmp_path / "bb.pt"), "--steps", "3",
                "--batch-size", "6", "--lr", "1e-3", "--ema", "0.5", "--quiet",
                "--checkpoint", str(tmp_path / f"{name}.ckpt"), "--out", str(tmp_path / f"{name}.pt")]

    assert main(args("one")) == 0
    res = _torchrun(2, "-m", "gms_kernels", *args("two"))
    assert res.stdout.count("wrote ") == 1  # rank 0 alone saves and prints
    assert not list(tmp_path.glob("*.tmp"))
    one, two = gk.models.load(tmp_path / "one.pt"), gk.models.load(tmp_path / "two.pt")
    _assert_same(two.state_dict(), one.state_dict(), rtol=1e-5, atol=1e-6)
    assert _load(tmp_path / "two.ckpt")["step"] == 3
