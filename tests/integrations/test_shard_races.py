"""Runs sharing one output folder: identical `sample` commands racing on it all succeed with the shards a
single run writes; a run with other settings is refused while the folder is in use.

GMS_SHARD_RACES sets how many races the subprocess test runs (default 1, 10-20 s on two busy cores;
e.g. 50 for a soak)."""
import json
import os
import subprocess
import sys
import time

import pytest

from gms_kernels.integrations import distributed
from gms_kernels.cli import main
from gms_kernels.models.embedded import default_model
from gms_kernels.core.files import FileLock, write_atomically

RACES = int(os.environ.get("GMS_SHARD_RACES", "1"))
RACERS = 2
# many one-sample shards at one step: the writes, where runs sharing a folder can collide, are much of the time
SAMPLE = ["sample", "--num-samples", "48", "--shard-size", "1", "--batch-size", "1", "--steps", "1", "--quiet"]

# A `sample` command that starts only when all racers are ready (imports done), so that their shard
# loops overlap rather than follow each other.
_RACER = """
import sys, time
from pathlib import Path
import gms_kernels.integrations.distributed, gms_kernels.models.embedded, gms_kernels.core.images
from gms_kernels.cli import main
gate, me, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(gate / me).touch()
while len(list(gate.iterdir())) < n:
    time.sleep(0.001)
sys.exit(main(sys.argv[4:]))
"""


def _files(folder):
    """Every shard file (temporary ones too) by name, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("shard_*"))}


def test_identical_sample_commands_racing_on_one_folder_all_succeed(tmp_path):
    """Every racer exits 0, and the folder ends with the shards (byte for byte) and grid of a single run."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    single = tmp_path / "single"
    assert main([*SAMPLE, "--out", str(single)]) == 0  # (in this process: one thread, as the racers)
    expected = _files(single)
    assert sorted(expected) == [f"shard_{k:06d}.pt" for k in range(48)]
    started = time.perf_counter()
    for race in range(RACES):
        out, gate = tmp_path / f"out{race}", tmp_path / f"gate{race}"
        gate.mkdir()
        racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(gate), str(i), str(RACERS), *SAMPLE,
                                    "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=tmp_path)  # (not the checkout's uncompiled source tree)
                  for i in range(RACERS)]
        for racer in racers:
            _, err = racer.communicate(timeout=300)
            assert racer.returncode == 0, f"race {race + 1} of {RACES}: {err}"
        got = _files(out)
        assert sorted(got) == sorted(expected), f"race {race + 1}: {sorted(set(got) ^ set(expected))}"
        assert got == expected, f"race {race + 1}: shards differ from a single run's"
        assert (out / "samples.png").read_bytes() == (single / "samples.png").read_bytes()
    print(f"{RACES} race(s) of {RACERS} processes: {time.perf_counter() - started:.1f} s")


def test_temporary_names_are_unique_and_a_failed_write_leaves_none(tmp_path):
    names = []
    for _ in range(2):
        write_atomically(tmp_path / "a.pt", lambda tmp: (names.append(tmp.name), tmp.write_text("x")))
    assert names[0] != names[1] and all(f"-{os.getpid()}-" in n and n.startswith("a.pt.tmp") for n in names)
    assert "." not in names[0][len("a.pt."):]  # (torch.save names its archive after the text before the last dot)

    def fail(tmp):
        tmp.write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(tmp_path / "a.pt", fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt"] and (tmp_path / "a.pt").read_text() == "x"


def test_a_run_with_other_settings_is_refused_while_another_is_active(tmp_path):
    """Even before the active run's first shard; once it has ended (its lock released, no shard written)
    its manifest binds nobody."""
    model = default_model()
    active = distributed.claim(tmp_path, {"another": "run"})
    try:
        with pytest.raises(ValueError, match="another run with other settings is writing to"):
            distributed.sample_shards(model, tmp_path, 2, (1, 8, 8), steps=2, progress=False)
    finally:
        active.release()
    distributed.sample_shards(model, tmp_path, 2, (1, 8, 8), steps=2, progress=False)
    meta = json.loads((tmp_path / "manifest.json").read_text())
    assert meta["options"] == {"steps": 2}

    joined = distributed.claim(tmp_path, meta)  # (the same settings join an active run)
    try:
        distributed.sample_shards(model, tmp_path, 2, (1, 8, 8), steps=2, progress=False)
        with pytest.raises(ValueError, match="shards of another run"):
            distributed.sample_shards(model, tmp_path, 2, (1, 8, 8), steps=3, progress=False)
    finally:
        joined.release()


def test_temporary_files_are_removed_only_when_no_run_is_active(tmp_path):
    """A temporary file is a killed run's leftover only if no run is active: else it may be a live write."""
    meta = {"a": 1}
    distributed.claim(tmp_path, meta).release()
    leftover = tmp_path / "shard_000000.pt.tmp0-123-abcd"
    leftover.write_bytes(b"partial")
    other = FileLock(tmp_path / ".active")
    assert other.acquire(shared=True)
    try:
        distributed.claim(tmp_path, meta).release()
        assert leftover.exists()
    finally:
        other.release()
    distributed.claim(tmp_path, meta).release()
    assert not leftover.exists()
