"""Central-moment heads (MomentNet targets="central"): the raw moments they return, their round trip through a
file, their training on the residual; and the digits splits they are trained and chosen on."""
import pytest
import torch

import gms_kernels as gk
from conftest import small_central_moment_net
from gms_kernels.models.moment_net import raw_from_central

def test_raw_from_central_is_the_binomial_expansion():
    g = torch.Generator().manual_seed(0)
    r = torch.distributions.Gamma(2.0, 2.0).sample((400000,)).double()
    r = r - r.mean()  # a zero-mean, skewed residual
    e1 = torch.tensor([-0.7, 0.0, 1.3], dtype=torch.float64)
    c2, c3 = (r**2).mean().expand(3), (r**3).mean().expand(3)
    e2, e3 = raw_from_central(e1, [c2, c3])
    x = e1[:, None] + r[None, :]
    torch.testing.assert_close(e2, (x**2).mean(1), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(e3, (x**3).mean(1), rtol=1e-9, atol=1e-9)
    del g


def _tiny_backbone():
    return gk.models.PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0,
                                     in_channels=1)


def test_central_momentnet_returns_raw_moments_and_round_trips(tmp_path):
    net = small_central_moment_net()
    x, t = torch.randn(3, 1, 8, 8), torch.tensor([10, 500, 990])
    with torch.no_grad():
        out, heads = net(x, t), net(x, t, head_outputs=True)
    e1, c2, c3 = heads.chunk(3, dim=1)
    torch.testing.assert_close(out, torch.cat([e1, e1**2 + c2, e1**3 + 3 * e1 * c2 + c3], dim=1))
    net.save(tmp_path / "net.pt")
    again = gk.models.MomentNet.load(tmp_path / "net.pt")
    assert again.targets == "central"
    with torch.no_grad():
        torch.testing.assert_close(again(x, t), out)
    net.save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match="targets"):
        gk.models.MomentNet(_tiny_backbone()).load_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match="targets"):
        gk.models.MomentNet(_tiny_backbone(), targets="centred")


def test_train_heads_fits_central_heads_to_the_residual():
    """With zero-initialised heads the first logged loss is the mean of the target squared: E[r^4] for the
    central e2 head (r = eps - e1 of the backbone) against E[eps^4] = 3 for the raw one; on a backbone whose e1
    is eps itself (an identity stand-in) r = 0 and the central loss must vanish."""
    torch.manual_seed(0)
    data = torch.rand(64, 1, 8, 8) * 2 - 1

    class Oracle(torch.nn.Module):  # e1 = the exact noise of x_t for this fixed data point
        eps_channels, feature_channels, temb_channels = 1, 4, 4

        def forward_features(self, x, t):
            sched = gk.Schedule.linear()
            ab = sched.alphas_cumprod[t].float().reshape(-1, 1, 1, 1)
            eps = (x - ab.sqrt() * data[:1]) / (1 - ab).sqrt()
            return torch.zeros(x.shape[0], 4, 8, 8), torch.zeros(x.shape[0], 4), eps

    losses = {}
    for targets in ("raw", "central"):
        net = gk.models.MomentNet(Oracle(), targets=targets)
        seen = []
        gk.train_heads(net, data[:1].expand(64, -1, -1, -1).clone(), steps=1, batch_size=16,
                                progress=False, log=seen.append)
        losses[targets] = seen[0]["mse_e2"]
    assert losses["raw"] == pytest.approx(3.0, rel=0.4)  # E[eps^4] = 3 (4096 draws: sd of the mean ~0.15)
    assert losses["central"] < 1e-8


def test_digits_splits_are_disjoint_and_keep_the_old_test_split():
    x, _ = gk.data.digits("all")
    parts = {s: gk.data.digits(s)[0] for s in ("train", "validation", "test")}
    assert [p.shape[0] for p in parts.values()] == [1079, 359, 359]
    flat = {s: {tuple(r.tolist()) for r in p.flatten(1)} for s, p in parts.items()}
    assert not (flat["train"] & flat["test"]) or len(flat["train"] & flat["test"]) < 5  # (digits has duplicates)
    perm = torch.randperm(1797, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(parts["test"], x[perm[:359]])  # the split the FD classifier never saw
    torch.testing.assert_close(torch.cat([parts["validation"], parts["train"]]), x[perm[359:]])
    with pytest.raises(ValueError, match="split"):
        gk.data.digits("val")
