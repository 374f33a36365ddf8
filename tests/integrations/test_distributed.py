"""Sharded sampling: batch/world-size independence, atomic shards, resume, torchrun with gloo."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import gms_kernels as gk
from gms_kernels.integrations import distributed

SAMPLE_ARGS = ["--steps", "4", "--quiet"]


def test_shards_equal_one_batch_and_resume_repairs_missing_or_broken_ones(tmp_path, paper_oracle):
    kw = dict(steps=4, solver="gms", data_range=None)
    paths = distributed.sample_shards(paper_oracle, tmp_path, 10, (1,), shard_size=4, batch_size=3, seed=5,
                                      progress=False, **kw)
    assert [p.name for p in paths] == ["shard_000000.pt", "shard_000001.pt", "shard_000002.pt"]
    images = distributed.load_shards(tmp_path)
    ref = gk.sample(paper_oracle, shape=(10, 1), generator=5, progress=False, **kw)
    torch.testing.assert_close(images, ref, rtol=0, atol=0)

    paths[0].unlink()
    paths[2].write_bytes(b"partial")
    with pytest.raises(ValueError, match="2 shard\\(s\\) missing or incomplete.*rerun"):
        distributed.load_shards(tmp_path)
    before = paths[1].stat().st_mtime_ns
    distributed.sample_shards(paper_oracle, tmp_path, 10, (1,), shard_size=4, batch_size=3, seed=5,
                              progress=False, **kw)
    assert paths[1].stat().st_mtime_ns == before  # complete shards are skipped
    torch.testing.assert_close(distributed.load_shards(tmp_path), ref, rtol=0, atol=0)


def test_a_different_run_in_the_same_directory_is_refused(tmp_path, paper_oracle):
    distributed.sample_shards(paper_oracle, tmp_path, 4, (1,), shard_size=4, progress=False, steps=2)
    with pytest.raises(ValueError, match="shards of another run"):
        distributed.sample_shards(paper_oracle, tmp_path, 4, (1,), shard_size=4, progress=False, steps=3)


def _torchrun(out, nproc, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "gms_kernels", "sample", "--num-samples", "24", "--shard-size", "3", "--batch-size", "2",
           "--out", str(out), *SAMPLE_ARGS, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return cmd, env


def test_torchrun_two_processes_match_one_process_and_resume_after_kill(tmp_path):
    single = tmp_path / "single"
    cmd, env = _torchrun(single, 1)
    subprocess.run(cmd, env=env, check=True, timeout=300, capture_output=True)
    ref = distributed.load_shards(single)
    assert ref.shape == (24, 1, 8, 8)

    multi = tmp_path / "multi"
    cmd, env = _torchrun(multi, 2)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and not list(multi.glob("shard_*.pt")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # kill both workers and the launcher mid-run
    proc.wait()
    written = len(list(multi.glob("shard_*.pt")))
    assert 1 <= written <= 8
    subprocess.run(cmd, env=env, check=True, timeout=300, capture_output=True)
    assert sorted(p.name for p in multi.glob("shard_*")) == [f"shard_{k:06d}.pt" for k in range(8)]
    torch.testing.assert_close(distributed.load_shards(multi), ref, rtol=0, atol=0)  # nothing lost or doubled


def test_cli_sample_passes_the_fit_options(tmp_path):
    """`sample --fit adan --fit-iters N --adan-precision P` reaches gk.sample: the shards equal a
    direct run with those options."""
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "gms_kernels", "sample", "--num-samples", "4", "--shard-size", "4",
           "--batch-size", "4", "--out", str(out), "--steps", "2", "--quiet", "--fit", "adan", "--fit-iters", "3",
           "--adan-precision", "float64"]
    # (run from tmp_path: `-m` puts the working directory first on the path, and the source tree
    # there, without the built extension, would shadow the installed package this test imports)
    subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True, timeout=300, capture_output=True,
                   cwd=tmp_path)
    from gms_kernels.models.embedded import DIGITS_SHAPE, default_model

    direct = tmp_path / "direct"
    distributed.sample_shards(default_model(), direct, 4, DIGITS_SHAPE, shard_size=4, batch_size=4, progress=False,
                              steps=2, fit="adan", fit_iters=3, adan_precision="float64")
    assert torch.equal(distributed.load_shards(out), distributed.load_shards(direct))
    bad = subprocess.run(cmd[:-1] + ["fp16"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode != 0 and "invalid choice: 'fp16'" in bad.stderr
