import os
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

import gms_kernels as gk
from gms_kernels.train.training import EMA, train_backbone, train_heads


class TinyMomentNet(nn.Module):
    """A frozen MLP 'backbone' predicting eps plus trainable heads for eps^2 and eps^3 (1-D data)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(2, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU())
        self.eps = nn.Linear(32, 1)
        self.heads = nn.Linear(32, 2)
        for p in list(self.backbone.parameters()) + list(self.eps.parameters()):
            p.requires_grad_(False)

    def forward(self, x, t):
        h = self.backbone(torch.cat([x, t.float()[:, None] / 1000], 1))
        return torch.cat([self.eps(h), self.heads(h)], 1)


def _data(n=512):
    oracle = gk.GaussianMixtureOracle([0.4, 0.6], [[-0.4], [0.3]], [0.12, 0.05])
    return oracle.sample_data(n, torch.Generator().manual_seed(0)).float()


def _params(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_heads_learn_and_backbone_stays_frozen():
    torch.manual_seed(0)
    net = TinyMomentNet()
    frozen = {k: v.clone() for k, v in net.backbone.state_dict().items()}
    res = train_heads(net, _data(), steps=150, batch_size=64, lr=3e-3, progress=False, ema_decay=0.0)
    first = sum(r["mse_e2"] for r in res.history[:20]) / 20
    last = sum(r["mse_e2"] for r in res.history[-20:]) / 20
    assert last < 0.7 * first and {"mse_e2", "mse_e3"} <= set(res.history[-1])
    for k, v in net.backbone.state_dict().items():
        assert torch.equal(v, frozen[k])


def test_resume_after_interruption_loses_nothing(tmp_path):
    torch.manual_seed(0)
    init = TinyMomentNet()
    straight = TinyMomentNet()
    straight.load_state_dict(init.state_dict())
    train_heads(straight, _data(), steps=20, batch_size=16, progress=False, checkpoint=tmp_path / "a.pt")

    resumed = TinyMomentNet()
    resumed.load_state_dict(init.state_dict())

    def interrupt(record):
        if record["step"] == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_heads(resumed, _data(), steps=20, batch_size=16, progress=False, checkpoint=tmp_path / "b.pt",
                    checkpoint_every=5, log=interrupt)
    again = TinyMomentNet()
    again.load_state_dict(init.state_dict())
    res = train_heads(again, _data(), steps=20, batch_size=16, progress=False, checkpoint=tmp_path / "b.pt")
    assert res.steps == 20 and len(res.history) == 20
    for k, v in _params(straight).items():
        torch.testing.assert_close(_params(again)[k], v, rtol=0, atol=0)


def test_corrupted_or_foreign_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "c.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read training checkpoint"):
        train_heads(TinyMomentNet(), _data(), steps=2, progress=False, checkpoint=bad)
    torch.save({"format": "other"}, bad)
    with pytest.raises(ValueError, match="not a gms_kernels heads training checkpoint"):
        train_heads(TinyMomentNet(), _data(), steps=2, progress=False, checkpoint=bad)


def test_backbone_training_lowers_the_eps_loss():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 64), nn.SiLU(), nn.Linear(64, 1))
    model = lambda x, t: net(torch.cat([x, t.float()[:, None] / 1000], 1))
    wrapper = nn.Module()
    wrapper.net = net
    wrapper.forward = model
    res = train_backbone(wrapper, _data(), steps=200, batch_size=64, lr=3e-3, progress=False, ema_decay=0.0)
    assert sum(r["mse_e1"] for r in res.history[-20:]) < 0.8 * sum(r["mse_e1"] for r in res.history[:20])


def test_bad_training_arguments():
    with pytest.raises(ValueError, match="valid: adan, adam"):
        train_heads(TinyMomentNet(), _data(), steps=1, optimizer="sgd", progress=False)
    with pytest.raises(ValueError, match="non-finite"):
        train_heads(TinyMomentNet(), torch.full((4, 1), float("nan")), steps=1, progress=False)
    with pytest.raises(ValueError, match="batch_size must be positive"):
        train_heads(TinyMomentNet(), _data(), steps=1, batch_size=0, progress=False)


def test_ema_is_torch_averaged_model_with_the_warmup_decay():
    """The EMA is torch's AveragedModel over the trainable parameters only (a frozen
    backbone is not copied), starts at the initial weights, follows min(decay, (1+n)/(10+n)) exactly,
    and resumes from its state_dict (format {"decay", "updates", "shadow": {name: tensor}}) exactly."""
    torch.manual_seed(0)
    net = TinyMomentNet()
    params = {k: p for k, p in net.named_parameters() if p.requires_grad}
    ema = EMA(params, decay=0.95)
    assert isinstance(ema._average, AveragedModel)
    assert sum(p.numel() for p in ema._average.parameters()) == sum(p.numel() for p in params.values())
    want = {k: p.detach().clone() for k, p in params.items()}
    g = torch.Generator().manual_seed(1)

    def train_step(n):
        with torch.no_grad():
            for p in params.values():
                p.add_(torch.randn(p.shape, generator=g))
        d = min(0.95, (1 + n) / (10 + n))
        for k, p in params.items():
            want[k].lerp_(p.detach(), 1 - d)

    for n in range(1, 41):
        train_step(n)
        ema.update(params)
    assert ema.updates == 40
    for k in params:
        assert torch.equal(ema.shadow[k], want[k]), k
    state = ema.state_dict()
    assert set(state) == {"decay", "updates", "shadow"} and set(state["shadow"]) == set(params)
    resumed = EMA(params, decay=0.5)
    resumed.load_state_dict({"decay": state["decay"], "updates": state["updates"],
                             "shadow": {k: v.clone() for k, v in state["shadow"].items()}})
    for n in range(41, 46):
        train_step(n)
        ema.update(params)
        resumed.update(params)
    for k in params:
        assert torch.equal(resumed.shadow[k], want[k]) and torch.equal(ema.shadow[k], want[k]), k
    with pytest.raises(ValueError, match="ema_decay"):
        EMA(params, decay=1.5)


_PROGRESS_SCRIPT = """
import sys
import torch
from torch import nn
from gms_kernels.core.progress import progress_bar
from gms_kernels.train.training import train_backbone

net = nn.Linear(2, 1)
model = nn.Module()
model.net = net
model.forward = lambda x, t: net(torch.cat([x, t.float()[:, None] / 1000], 1))
train_backbone(model, torch.randn(8, 1), steps=2, batch_size=4, progress=True)
print("helper", progress_bar(range(2), enabled=True).disable, progress_bar(range(2), enabled=False).disable)
"""


@pytest.mark.parametrize("env, shown", [({"TQDM_DISABLE": "1"}, False), ({}, True)])
def test_progress_bar_obeys_tqdm_disable(env, shown):
    """With progress=True the training bar still obeys TQDM_DISABLE=1 (tqdm reads it as the
    default of `disable`, which an explicit disable=False overrode); without it, the bar is shown."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    res = subprocess.run([sys.executable, "-c", _PROGRESS_SCRIPT], env={**base, **env}, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert ("train backbone" in res.stderr) == shown, res.stderr[-2000:]
    assert f"helper {not shown} True" in res.stdout
