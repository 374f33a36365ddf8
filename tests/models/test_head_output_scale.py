"""MomentNet's per-t output scale of the heads: head n returns
output_scale[n - 2, t] * h_n(x_t, t), the table a fixed buffer saved with the model; without a table (every model
trained before it) nothing changes. train_heads(output_scale=True) sets it to the targets' RMS at each t."""
import pytest
import torch

from gms_kernels.models.embedded import EMBEDDED_FORMAT, _load_embedded, default_model, save_embedded
from gms_kernels.models import MomentNet, PytorchDDPMUNet
from gms_kernels.models.moment_net import raw_from_central
from gms_kernels.train.training import train_heads

CONFIG = dict(T=50, ch=32, ch_mult=(1, 2), attn=(), num_res_blocks=1, dropout=0.0, in_channels=1)


def _backbone():
    torch.manual_seed(0)
    return PytorchDDPMUNet(**CONFIG).eval()


def _net(targets="central", table=None):
    """A MomentNet whose heads are not at their zero init (so a scale shows in the output)."""
    net = MomentNet(_backbone(), targets=targets)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    if table is not None:
        net.set_output_scale(table)
    return net.eval()


def _table(T=50, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return torch.exp(torch.randn(2, T, generator=gen) * 3)  # spread over several orders of magnitude


def _inputs(seed=3, n=6):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=gen), torch.tensor([0, 1, 7, 25, 48, 49])[:n]


@torch.no_grad()
def _manual(net, x, t):
    """What forward computed before the table existed: cat([e1, e2, e3]) from the heads' own outputs."""
    h, temb, eps = net.features(x, t)
    outs = [net.heads[str(n)](h, temb) for n in net.orders]
    return eps, outs


@pytest.mark.parametrize("targets", ["central", "raw"])
def test_forward_scales_each_head_by_its_column_of_the_table(targets):
    table = _table()
    net = _net(targets, table)
    x, t = _inputs()
    eps, outs = _manual(net, x, t)
    scaled = [o * table[i, t].reshape(-1, 1, 1, 1) for i, o in enumerate(outs)]
    with torch.no_grad():
        heads = net(x, t, head_outputs=True)
        full = net(x, t)
    torch.testing.assert_close(heads, torch.cat([eps] + scaled, 1), rtol=0, atol=0)
    expected = raw_from_central(eps, scaled) if targets == "central" else scaled
    torch.testing.assert_close(full, torch.cat([eps] + expected, 1), rtol=0, atol=0)
    # one integer time for the whole batch, as the samplers pass it
    with torch.no_grad():
        one = net(x, 25, head_outputs=True)
    torch.testing.assert_close(one[:, 1:2], _manual(net, x, 25)[1][0] * table[0, 25], rtol=0, atol=0)


def test_no_table_is_the_old_forward_bit_for_bit():
    net = _net()
    assert net.output_scale is None
    assert "output_scale" not in net.state_dict() and "output_scale" not in net.head_config
    x, t = _inputs()
    eps, outs = _manual(net, x, t)
    with torch.no_grad():
        assert torch.equal(net(x, t), torch.cat([eps] + raw_from_central(eps, outs), 1))
        before = net(x, t)
        net.set_output_scale(_table())
        assert not torch.equal(net(x, t), before)
        net.set_output_scale(None)  # removing the table gives the old network back
        assert torch.equal(net(x, t), before)
    assert "output_scale" not in net.state_dict()


def test_embedded_save_without_a_table_stores_what_it_stored_before(tmp_path):
    net = _net()
    assert net.output_scale is None
    save_embedded(net, tmp_path / "m.pt", CONFIG)
    data = torch.load(tmp_path / "m.pt", map_location="cpu", weights_only=True)
    assert data["format"] == EMBEDDED_FORMAT and set(data["state"]) == set(net.state_dict())
    assert "output_scale" not in data["state"]
    assert all(v.dtype == torch.float16 for v in data["state"].values() if v.is_floating_point())
    assert _load_embedded(tmp_path / "m.pt", _backbone, "test", "-").output_scale is None


def test_the_shipped_model_has_no_table_and_forward_unchanged():
    net = default_model()
    assert net.output_scale is None and "output_scale" not in net.state_dict()
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    t = torch.tensor([5, 400, 990])
    eps, outs = _manual(net, x, t)
    with torch.no_grad():
        assert torch.equal(net(x, t), torch.cat([eps] + raw_from_central(eps, outs), 1))


def test_round_trips_keep_the_table(tmp_path):
    table = _table()
    net = _net(table=table)
    x, t = _inputs()
    with torch.no_grad():
        ref = net(x, t)

    save_embedded(net, tmp_path / "emb.pt", CONFIG)  # the shipped format: fp16 weights, the table in float32
    raw = torch.load(tmp_path / "emb.pt", map_location="cpu", weights_only=True)
    assert raw["state"]["output_scale"].dtype == torch.float32
    assert torch.equal(raw["state"]["output_scale"], table.float())
    emb = _load_embedded(tmp_path / "emb.pt", _backbone, "test", "-")
    assert torch.equal(emb.output_scale, table.float())
    half = _net(table=table)  # the same weights rounded as the file stores them
    with torch.no_grad():
        for p in half.parameters():
            p.copy_(p.half().float())
        assert torch.equal(emb(x, t), half(x, t))

    net.save(tmp_path / "full.pt")  # MomentNet.save / load (weights_only, built on the meta device)
    full = MomentNet.load(tmp_path / "full.pt")
    assert torch.equal(full.output_scale, table.float()) and full.head_config["output_scale"] == [2, 50]
    with torch.no_grad():
        assert torch.equal(full(x, t), ref)

    net.save_heads(tmp_path / "heads.pt")  # the heads alone carry it too
    heads = MomentNet.from_heads(_backbone(), tmp_path / "heads.pt")
    assert torch.equal(heads.output_scale, table.float())
    with torch.no_grad():
        assert torch.equal(heads(x, t), ref)
    from gms_kernels.models import GMSDiffusersModel, export_diffusers

    for export in (lambda: export_diffusers(net, tmp_path / "pipe"), lambda: GMSDiffusersModel.from_network(net, 8)):
        with pytest.raises(ValueError, match="does not carry heads with a per-t output scale"):
            export()
    plain = _net()
    plain.save_heads(tmp_path / "plain.pt")
    heads.load_heads(tmp_path / "plain.pt")  # heads saved without a table load without one
    assert heads.output_scale is None


@pytest.mark.parametrize("bad, match", [
    (torch.ones(3, 50), "shape"), (torch.ones(2, 49), "shape"), (torch.ones(2, 50, 1), "shape"),
    (torch.ones(50), "shape"), (torch.ones(2, 0), "shape"),
    (torch.ones(2, 50).index_fill(1, torch.tensor([7]), float("nan")), "non-finite"),
    (torch.ones(2, 50).index_fill(1, torch.tensor([7]), float("inf")), "non-finite"),
    (torch.ones(2, 50).index_fill(1, torch.tensor([7]), 0.0), "positive"),
    (-torch.ones(2, 50), "positive"), ([1.0] * 50, "tensor"), (torch.ones(2, 50, dtype=torch.bool), "real"),
])
def test_bad_tables_are_refused(bad, match):
    net = _net()
    with pytest.raises(ValueError, match=match):
        net.set_output_scale(bad)
    assert net.output_scale is None
    if torch.is_tensor(bad) and bad.shape == (2, 50) and bad.is_floating_point():
        with pytest.raises(ValueError, match=match):
            MomentNet(_backbone(), targets="central", output_scale=bad)


def test_a_bad_table_in_a_file_is_refused(tmp_path):
    net = _net(table=_table())
    save_embedded(net, tmp_path / "m.pt", CONFIG)
    data = torch.load(tmp_path / "m.pt", map_location="cpu", weights_only=True)
    data["state"]["output_scale"][1, 3] = -1.0
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="bad.pt: output_scale must be positive"):
        _load_embedded(tmp_path / "bad.pt", _backbone, "test", "-")
    net.save(tmp_path / "full.pt")
    full = torch.load(tmp_path / "full.pt", map_location="cpu", weights_only=True)
    full["state_dict"]["output_scale"] = torch.ones(2, 7)
    torch.save(full, tmp_path / "bad_full.pt")
    with pytest.raises(ValueError, match="bad_full.pt: output_scale must have shape"):
        MomentNet.load(tmp_path / "bad_full.pt")


def _data():
    return torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(6)).clamp(-1, 1)


def test_training_sets_the_table_to_the_targets_rms_and_trains(small_scale_estimate):
    net = MomentNet(_backbone(), targets="central")
    before = {k: v.clone() for k, v in net.heads.state_dict().items()}
    res = train_heads(net, _data(), steps=3, batch_size=16, lr=1e-2, progress=False, loss_weighting="normalized",
                      output_scale=True)
    expected = torch.stack([res.loss_scales[n].sqrt() for n in (2, 3)]).float()
    assert torch.equal(net.output_scale, expected) and net.output_scale.shape == (2, 50)
    assert (net.output_scale > 0).all() and net.output_scale.std(1).min() > 0  # (a random backbone: any shape)
    assert set(res.history[0]) == {"step", "wmse_e2", "wmse_e3"} and len(res.history) == 3
    assert any(not torch.equal(v, before[k]) for k, v in net.heads.state_dict().items())
    assert "output_scale" in net.state_dict() and "output_scale" not in dict(net.named_parameters())

    # the normalized loss of a scaled head is its relative error: at the zero init every wmse is mean(y^2 / s)
    fresh = MomentNet(_backbone(), targets="central")
    first = train_heads(fresh, _data(), steps=1, batch_size=16, lr=1e-2, progress=False,
                        loss_weighting="normalized", output_scale=True).history[0]
    assert 0.2 < first["wmse_e2"] < 5 and 0.05 < first["wmse_e3"] < 20

    # with the plain loss the table is set too (from the same estimate), the loss left unweighted
    plain = MomentNet(_backbone(), targets="central")
    res = train_heads(plain, _data(), steps=1, batch_size=16, progress=False, output_scale=True)
    assert res.loss_scales is None and plain.output_scale is not None and "mse_e2" in res.history[0]


def test_training_without_the_option_leaves_no_table(small_scale_estimate):
    net = MomentNet(_backbone(), targets="central")
    train_heads(net, _data(), steps=1, batch_size=16, progress=False, loss_weighting="normalized")
    assert net.output_scale is None


def test_scaled_checkpoints_resume_only_scaled_runs(tmp_path, small_scale_estimate):
    ckpt = tmp_path / "h.pt"
    train_heads(MomentNet(_backbone(), targets="central"), _data(), steps=1, batch_size=16, progress=False,
                checkpoint=ckpt, loss_weighting="normalized")
    with pytest.raises(ValueError, match="heads-normalized-scaled training checkpoint"):
        train_heads(MomentNet(_backbone(), targets="central"), _data(), steps=2, batch_size=16, progress=False,
                    checkpoint=ckpt, loss_weighting="normalized", output_scale=True)
    scaled = tmp_path / "s.pt"
    train_heads(MomentNet(_backbone(), targets="central"), _data(), steps=1, batch_size=16, progress=False,
                checkpoint=scaled, loss_weighting="normalized", output_scale=True)
    res = train_heads(MomentNet(_backbone(), targets="central"), _data(), steps=2, batch_size=16, progress=False,
                      checkpoint=scaled, loss_weighting="normalized", output_scale=True)
    assert res.steps == 2


def test_output_scale_needs_a_moment_net(small_scale_estimate):
    class Plain(torch.nn.Module):
        targets = "central"

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, t, head_outputs=False):
            return torch.cat([x * 0, x * self.w, x * self.w], 1)

    with pytest.raises(ValueError, match="output_scale=True needs a gk.models.MomentNet"):
        train_heads(Plain(), _data(), steps=1, batch_size=16, progress=False, output_scale=True)


@pytest.mark.parametrize("time_input", ["index", "index+1", "scaled"])
def test_the_scale_is_read_at_the_time_index_whatever_the_time_input(time_input):
    """model_io.time_indices inverts time_values, so the table's column t is the one read for every encoding."""
    from gms_kernels.model_io import time_indices, time_values

    t = torch.tensor([0, 1, 499, 999])
    assert torch.equal(time_indices(time_values(t, 1000, time_input), 1000, time_input), t.double())
