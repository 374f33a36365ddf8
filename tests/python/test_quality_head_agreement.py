"""python/quality_benchmark.py's diagnostics of where the heads' moments come from: the
mean of several networks' heads, the shrinkage regression against another network, and the backbone's mean error
in the heads' central moments."""
import sys
from pathlib import Path

import torch

from conftest import small_central_moment_net

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed
from studies import quality_study as q  # noqa: E402
import quality_benchmark as qb  # noqa: E402


def test_heads_mean_averages_the_outputs_and_as_exact_heads_calls_in_float32():
    a, b = small_central_moment_net(0), small_central_moment_net(1)
    x, t = torch.randn(2, 1, 8, 8), torch.full((2,), 300)
    with torch.no_grad():
        assert torch.allclose(qb.HeadsMean([a, b])(x, t), (a(x, t) + b(x, t)) / 2, atol=1e-7)
        out = qb.AsExactHeads(a)(x.double(), 300)
        assert out.dtype == torch.float64 and torch.equal(out, a(x, t).double())


def test_a_network_against_itself_agrees_fully_and_the_mean_of_copies_is_the_network():
    """--against with the model itself: lambda = corr = 1 at every step; --heads-mean of identical copies regresses
    exactly as the model alone."""
    net, x0 = small_central_moment_net(0), torch.rand(6, 1, 8, 8) * 2 - 1
    exact = q.data_oracle(x0)
    for rows in q.skew_shrinkage(net, qb.AsExactHeads(net), x0, [3]).values():
        for r in rows:
            assert abs(r["lam"] - 1) < 1e-9 and abs(r["corr"] - 1) < 1e-9, r
    alone = q.skew_shrinkage(net, exact, x0, [3])
    mean = q.skew_shrinkage(qb.HeadsMean([net, net]), exact, x0, [3])
    assert alone == mean


def test_mean_error_moments_shift_the_exact_moments_by_the_backbones_error():
    """With the exact heads' e1 replaced by e1 - d (a backbone off by d) and the heads trained perfectly on
    (eps - e1)^n, the heads' c2 and k3 are exactly c2 + d^2 and k3 + 3 d c2 + d^3: corr 1 with the shifted ones."""
    x0 = torch.rand(40, 1, 4, 4) * 2 - 1
    exact = q.data_oracle(x0)
    C, d = 1, 0.3 * torch.sin(torch.arange(16.0)).reshape(1, 1, 4, 4).double()

    class OffBackbone(torch.nn.Module):
        def forward(self, x, t):  # raw moments of eps around a mean shifted by -d: ((eps - m) + (m - d))^n
            e = exact(x.double(), int(t[0])).double()
            m, e2, e3 = e[:, :C], e[:, C:2 * C], e[:, 2 * C:]
            c2, k3 = e2 - m * m, e3 - 3 * m * e2 + 2 * m**3
            e1 = m - d
            c2h, k3h = c2 + d * d, k3 + 3 * d * c2 + d**3  # central moments around e1
            return torch.cat([e1, c2h + e1 * e1, k3h + 3 * e1 * (c2h + e1 * e1) - 2 * e1**3], dim=1).float()

    rows = qb.mean_error_moments(OffBackbone(), exact, x0, [200, 600], batch=16)
    for r in rows:
        assert r["corr_c2_d"] > 0.999 and r["corr_k3_d"] > 0.999, r
        assert abs(r["rms_d"] - float(d.pow(2).mean().sqrt())) < 1e-5, r
