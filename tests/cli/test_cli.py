"""The training subcommands end to end on tiny settings, and their outputs feeding sampling."""
import pytest
import torch

import gms_kernels as gk
from gms_kernels.cli import main


def test_train_backbone_then_heads_then_sample(tmp_path):
    data = gk.data.digits("all")[0][:64]
    torch.save(data, tmp_path / "d.pt")
    small = ["--data", str(tmp_path / "d.pt"), "--steps", "3", "--batch-size", "8", "--quiet"]
    assert main(["train-backbone", *small, "--ch", "32", "--ch-mult", "1", "--attn", "--num-res-blocks", "1",
                 "--out", str(tmp_path / "bb.pt")]) == 0
    assert main(["train-heads", *small, "--model", str(tmp_path / "bb.pt"), "--out", str(tmp_path / "mn.pt"),
                 "--checkpoint", str(tmp_path / "ck.pt")]) == 0
    assert (tmp_path / "ck.pt").exists()
    net = gk.models.load(tmp_path / "mn.pt")
    x = gk.sample(net, shape=(2, 1, 8, 8), steps=2, generator=0, progress=False)
    assert x.shape == (2, 1, 8, 8) and torch.isfinite(x).all()


def test_train_heads_takes_the_head_loss_weighting_and_output_scale(tmp_path, capsys, small_scale_estimate):
    """--head-loss reaches gk.train_heads (its weighted losses are logged as wmse_e*), --head-scale saves the
    heads' per-t output scale with the model; an unknown loss is refused by the parser."""
    data = gk.data.digits("all")[0][:32]
    torch.save(data, tmp_path / "d.pt")
    small = ["--data", str(tmp_path / "d.pt"), "--steps", "2", "--batch-size", "8", "--quiet"]
    assert main(["train-backbone", *small, "--ch", "32", "--ch-mult", "1", "--attn", "--num-res-blocks", "1",
                 "--out", str(tmp_path / "bb.pt")]) == 0
    capsys.readouterr()
    assert main(["train-heads", *small, "--model", str(tmp_path / "bb.pt"), "--out", str(tmp_path / "mn.pt"),
                 "--targets", "central", "--head-loss", "rms"]) == 0
    assert "wmse_e2" in capsys.readouterr().out
    assert gk.models.load(tmp_path / "mn.pt").output_scale is None
    assert main(["train-heads", *small, "--model", str(tmp_path / "bb.pt"), "--out", str(tmp_path / "ms.pt"),
                 "--targets", "central", "--head-loss", "normalized", "--head-scale"]) == 0
    scaled = gk.models.load(tmp_path / "ms.pt")  # (--head-scale: the per-t table travels with the model file)
    assert scaled.output_scale is not None and scaled.output_scale.shape == (2, scaled.schedule.T)
    with pytest.raises(SystemExit) as exc:
        main(["train-heads", *small, "--model", str(tmp_path / "bb.pt"), "--head-loss", "cubic"])
    assert exc.value.code == 2 and "invalid choice: 'cubic'" in capsys.readouterr().err
