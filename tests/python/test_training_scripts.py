"""The training scripts' head options (python/train_digits_model.py, python/train_patches_model.py) and the tag that
keeps each kind of head run in checkpoints of its own (studies.head_training)."""
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))  # the studies are not installed
from studies.head_training import head_run_tag  # noqa: E402


@pytest.mark.parametrize("script", ["train_digits_model.py", "train_patches_model.py"])
def test_training_scripts_take_the_head_options(script):
    out = subprocess.run([sys.executable, str(ROOT / "python" / script), "--help"], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert "--head-loss {uniform,normalized,rms}" in " ".join(out.split())
    assert "--head-scale" in out


def test_head_run_tags_keep_the_checkpoint_names():
    """Unchanged for the shipped kind of run, one tag per head and loss."""
    tags = {(h, w): head_run_tag(Namespace(head=h, head_loss=w))
            for h in ("conv", "res_conv") for w in ("uniform", "normalized", "rms")}
    assert tags[("conv", "uniform")] == "" and tags[("res_conv", "uniform")] == "_res_conv"
    assert tags[("conv", "rms")] == "_rms" and tags[("res_conv", "normalized")] == "_res_conv_normalized"
    assert len(set(tags.values())) == len(tags)


def test_scaled_runs_get_checkpoint_names_of_their_own():
    kinds = [(h, w, s) for h in ("conv", "res_conv") for w in ("uniform", "normalized", "rms") for s in (False, True)]
    tags = {k: head_run_tag(Namespace(head=k[0], head_loss=k[1], head_scale=k[2])) for k in kinds}
    assert len(set(tags.values())) == len(tags)
    assert tags[("conv", "uniform", False)] == "" and tags[("conv", "normalized", True)] == "_normalized_scaled"
    assert head_run_tag(Namespace(head="conv", head_loss="rms")) == "_rms"  # (callers without the option)
