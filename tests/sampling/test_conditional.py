"""Conditional sampling: model_kwargs on every network call, classifier-free guidance for every solver, the
class-conditional Gaussian-mixture oracle, conditional diffusers UNets, and conditional sharded runs."""
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gms_kernels as gk
from gms_kernels.integrations import distributed
from gms_kernels.model_io import guided_heads
from gms_kernels.eval.oracle import ClassConditionalOracle

# two classes of 1-D data, each a mixture of two Gaussians; label 2 is the unconditional branch
ORACLE_ARGS = dict(class_prior=[0.4, 0.6], weights=[[0.5, 0.5], [0.3, 0.7]], means=[[[-0.6], [-0.1]], [[0.2], [0.6]]],
                   stds=[[0.08, 0.15], [0.1, 0.05]])
NULL = 2
# solvers that call the network (the exact one draws from the oracle); analytic-dpm needs a Gamma table
CALLING = [s for s in gk.SOLVERS if s not in ("exact", "analytic-dpm")]


def fast(solver):
    """GGF with a looser tolerance: fewer proposals, the same code paths."""
    return {"eps_abs": 0.02, "eps_rel": 0.05} if solver == "ggf" else {}


@pytest.fixture(scope="module")
def oracle():
    return ClassConditionalOracle(**ORACLE_ARGS)


def labels(n):
    return torch.arange(n) % 2


def guided_reference(oracle, y, w):
    """The guidance rule written out in float64: the guided mean, the conditional branch's central moments."""
    def model(x, t):
        c = oracle(x.double(), t, class_labels=y).double()
        u = oracle(x.double(), t, class_labels=NULL).double()
        e1c, e2c, e3c = c.chunk(3, dim=1)
        e1 = u[:, :1] + w * (e1c - u[:, :1])
        c2 = e2c - e1c**2
        c3 = e3c - 3 * e1c * e2c + 2 * e1c**3
        return torch.cat([e1, c2 + e1**2, c3 + 3 * e1 * c2 + e1**3], dim=1).to(x.dtype)
    return model


# --- the class-conditional oracle ---------------------------------------------------------------------------------


def _marginal_log_density(oracle, c, x, t):
    """log q(x_t | class c) of 1-D data, written out: sum_k w_k N(x; a m_k, a^2 s_k^2 + sigma^2)."""
    m = oracle.classes[c]
    a, sig = oracle.schedule.alpha(t), oracle.schedule.sigma(t)
    var = a * a * m.variances.flatten() + sig * sig
    ll = -0.5 * (torch.log(2 * math.pi * var) + (x.double() - a * m.means.flatten()) ** 2 / var)
    return torch.logsumexp(m.log_weights + ll, dim=1)


def test_the_oracle_gives_each_class_its_mixture_and_the_null_label_the_mixture_over_classes(oracle):
    x = torch.linspace(-1.5, 1.5, 9, dtype=torch.float64)[:, None]
    t = 400
    y = torch.tensor([0, 1, 2, 1, 0, 2, 2, 0, 1])
    heads = oracle(x, t, class_labels=y)
    for c in range(2):
        rows = y == c
        torch.testing.assert_close(heads[rows], oracle.classes[c](x[rows], t), rtol=0, atol=0)
    # the unconditional branch: E[eps^n | x_t] = sum_c p(c | x_t) E[eps^n | x_t, c], by Bayes with the class prior
    log_post = torch.stack([oracle.log_prior[c] + _marginal_log_density(oracle, c, x, t) for c in range(2)], dim=1)
    post = torch.softmax(log_post, dim=1)
    mixed = sum(post[:, c:c + 1] * oracle.classes[c](x, t) for c in range(2))
    torch.testing.assert_close(oracle(x, t, class_labels=NULL), mixed, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(oracle(x, t), mixed, rtol=1e-10, atol=1e-12)  # (no labels: unconditional)
    torch.testing.assert_close(heads[y == 2], mixed[y == 2], rtol=1e-10, atol=1e-12)
    per_sample_t = torch.full((9,), t)
    torch.testing.assert_close(oracle(x, per_sample_t, class_labels=y), heads, rtol=0, atol=0)


@pytest.mark.parametrize("bad, error, match", [
    (torch.tensor([0.0, 1.0]), TypeError, "class_labels must be integers"),
    (torch.tensor([0, 3]), ValueError, r"class_labels must lie in 0\.\.2 \(2: the unconditional branch\), got 0\.\.3"),
    (torch.tensor([0, 1, 1]), ValueError, r"one label per sample \(2\)"),
])
def test_the_oracle_refuses_bad_labels(oracle, bad, error, match):
    with pytest.raises(error, match=match):
        oracle(torch.zeros(2, 1), 10, class_labels=bad)


# --- GMS with exact conditional heads against the exact conditional sampler ---------------------------------------

GRID = torch.linspace(-2.0, 2.0, 40001, dtype=torch.float64)


def _class_cdf(oracle, c, x):
    m = oracle.classes[c]
    sd = m.variances.flatten().sqrt()
    return (m.log_weights.exp() * torch.special.ndtr((x[:, None] - m.means.flatten()) / sd)).sum(1)


def _w1(oracle, x, y):
    """W1 between each class's samples and its exact q(x_0 | y) (the integral of |F_n - F|), averaged over classes."""
    out = []
    for c in range(2):
        s = x[y == c].flatten().double().sort().values
        f_n = torch.searchsorted(s, GRID, right=True).double() / s.numel()
        out.append(float(torch.trapezoid((f_n - _class_cdf(oracle, c, GRID)).abs(), GRID)))
    return sum(out) / len(out)


def test_gms_with_exact_conditional_heads_converges_to_the_exact_conditional_sampler(oracle):
    """Per-sample labels (half of each class): W1 to the class's exact q(x_0 | y) falls with K for GMS; the exact
    solver, given the same labels, draws q(x_0 | y) itself at every K (its W1 is the Monte-Carlo floor)."""
    n = 20000
    y = labels(n)
    kw = dict(shape=(n, 1), generator=1, progress=False, data_range=None, model_kwargs={"class_labels": y})
    table = []
    for k in (5, 10, 20, 50):
        row = {"K": k}
        for solver in ("gms", "ddpm", "exact"):
            row[solver] = _w1(oracle, gk.sample(oracle, steps=k, solver=solver, **kw), y)
        table.append(row)
    print("\nW1 to q(x_0 | y), 2 classes of 1-D data, 20000 samples\n   K      gms     ddpm    exact")
    for row in table:
        print(f"{row['K']:4d}  {row['gms']:.5f}  {row['ddpm']:.5f}  {row['exact']:.5f}")
    gms = [row["gms"] for row in table]
    assert all(a > b for a, b in zip(gms, gms[1:])), gms
    assert gms[-1] < 0.01 and gms[-1] < gms[0] / 5
    assert all(row["gms"] < row["ddpm"] for row in table)
    assert all(row["exact"] < 0.005 for row in table)  # (the sampling noise of 10000 draws per class)


# --- the guidance rule ---------------------------------------------------------------------------------------------


def test_guided_heads_guide_the_mean_and_keep_the_conditional_spread(oracle):
    """The rule pinned on exact heads: e1 = e1_u + w (e1_c - e1_u); c2, c3 the conditional branch's for every w, so
    w = 0 is the unconditional mean with the conditional spread (not the unconditional model) and w = 1 the
    conditional model."""
    x = torch.linspace(-1.0, 1.0, 7, dtype=torch.float64)[:, None]
    y = torch.tensor([0, 1, 0, 1, 0, 1, 0])
    cond, uncond = oracle(x, 300, class_labels=y), oracle(x, 300, class_labels=NULL)

    def central(h):
        e1, e2, e3 = h.chunk(3, dim=1)
        return e1, e2 - e1**2, e3 - 3 * e1 * e2 + 2 * e1**3

    c1, c2, c3 = central(cond)
    u1, u2, _ = central(uncond)
    assert (c2 - u2).abs().max() > 1e-3  # (so the test tells the conditional spread from the unconditional one)
    for w in (0.0, 1.0, 3.0, -0.5):
        g1, g2, g3 = central(guided_heads(cond, uncond, w, 3))
        torch.testing.assert_close(g1, u1 + w * (c1 - u1), rtol=0, atol=1e-14)
        torch.testing.assert_close(g2, c2, rtol=0, atol=1e-12)
        torch.testing.assert_close(g3, c3, rtol=0, atol=1e-12)
    torch.testing.assert_close(guided_heads(cond, uncond, 0.0, 3)[:, :1], uncond[:, :1], rtol=0, atol=0)
    torch.testing.assert_close(guided_heads(cond, uncond, 1.0, 3), cond, rtol=0, atol=1e-14)
    torch.testing.assert_close(guided_heads(cond[:, :1], uncond[:, :1], 3.0, 1),
                               guided_heads(cond, uncond, 3.0, 3)[:, :1])
    assert guided_heads(cond.float(), uncond.float(), 3.0, 3).dtype == torch.float32


@pytest.mark.parametrize("solver", CALLING)
def test_guidance_scale_one_is_the_conditional_model_bit_for_bit(oracle, solver):
    y = labels(6)
    kw = dict(shape=(6, 1), steps=4, solver=solver, generator=3, progress=False, **fast(solver))
    conditional = gk.sample(oracle, model_kwargs={"class_labels": y}, **kw)
    guided = gk.sample(oracle, model_kwargs={"class_labels": y}, guidance_scale=1.0,
                       null_kwargs={"class_labels": torch.tensor(NULL)}, **kw)
    assert torch.equal(guided, conditional)
    if solver != "ggf":  # (a closure over the whole batch's labels: GGF calls on subsets of the samples)
        assert torch.equal(gk.sample(lambda x, t: oracle(x, t, class_labels=y), **kw), conditional)


@pytest.mark.parametrize("w", [0.0, 3.0])
@pytest.mark.parametrize("solver", CALLING)
def test_guided_sampling_equals_a_float64_reference_of_the_rule(oracle, solver, w):
    """Every solver, one-call and multi-call, samples the guided heads (the labels per sample; GGF, which calls the
    network on subsets of the samples, with one label for all so that the reference can be a closure)."""
    y = torch.tensor(1) if solver == "ggf" else labels(6)
    kw = dict(shape=(6, 1), steps=10, solver=solver, generator=3, progress=False, dtype=torch.float64, backend="torch",
              **fast(solver))
    got = gk.sample(oracle, model_kwargs={"class_labels": y}, guidance_scale=w,
                    null_kwargs={"class_labels": torch.tensor(NULL)}, **kw)
    ref = gk.sample(guided_reference(oracle, y, w), **kw)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)
    if w:
        assert (got - gk.sample(oracle, model_kwargs={"class_labels": y}, **kw)).abs().max() > 1e-3


def test_ggf_gives_each_sample_its_own_labels_when_it_steps_samples_apart(oracle):
    """GGF calls the network on the samples still running: their labels go with them. A batch equals each sample
    drawn alone (sample i is a function of (seed, i) and its own labels)."""
    y = torch.tensor([0, 1, 0])
    kw = dict(steps=5, solver="ggf", generator=4, progress=False, dtype=torch.float64, guidance_scale=2.0,
              null_kwargs={"class_labels": torch.tensor(NULL)}, **fast("ggf"))
    seen = []
    batch = gk.sample(oracle, shape=(3, 1), model_kwargs={"class_labels": y}, callback=seen.append, **kw)
    calls = seen[-1]["nfe"]
    assert calls.min() < calls.max()  # (so the network was called on some of the samples only)
    alone = torch.cat([gk.sample(oracle, shape=(1, 1), first_index=i, model_kwargs={"class_labels": y[i:i + 1]}, **kw)
                       for i in range(3)])
    torch.testing.assert_close(batch, alone, rtol=0, atol=1e-12)


def test_without_model_kwargs_nothing_changes(oracle):
    kw = dict(shape=(6, 1), steps=4, generator=3, progress=False)
    plain = gk.sample(oracle, **kw)
    assert torch.equal(gk.sample(oracle, model_kwargs={}, **kw), plain)
    assert torch.equal(gk.sample(oracle, model_kwargs=None, guidance_scale=None, null_kwargs=None, **kw), plain)


def test_a_shared_tensor_and_other_values_pass_as_they_are():
    seen = []

    def model(x, t, scale, table, note):
        seen.append((scale.shape, table.shape, note))
        return torch.zeros(x.shape[0], 3, *x.shape[2:])

    gk.sample(model, shape=(4, 1), steps=2, progress=False,
              model_kwargs={"scale": torch.ones(1, 5), "table": torch.tensor(2.0), "note": "x"})
    assert seen[0] == (torch.Size([1, 5]), torch.Size([]), "x")
    seen.clear()  # guided: every tensor brought to one row per sample, the branches concatenated
    gk.sample(model, shape=(4, 1), steps=2, progress=False, guidance_scale=2.0,
              model_kwargs={"scale": torch.ones(1, 5), "table": torch.tensor(2.0), "note": "x"},
              null_kwargs={"scale": torch.zeros(4, 5)})
    assert seen[0] == (torch.Size([8, 5]), torch.Size([8]), "x")


# --- conditional diffusers UNets -----------------------------------------------------------------------------------


def _tiny_class_unet():
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=8, in_channels=1, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"), num_class_embeds=3).eval()


def _tiny_cross_attention_unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(sample_size=8, in_channels=1, out_channels=3, layers_per_block=1,
                                block_out_channels=(8, 16), norm_num_groups=4,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=8,
                                attention_head_dim=2).eval()


@pytest.mark.parametrize("kind", ["class-labels", "cross-attention"])
def test_conditional_diffusers_unets_sample_with_their_condition_and_guidance(kind):
    pytest.importorskip("diffusers")
    if kind == "class-labels":  # (num_class_embeds = 2 classes + the null label)
        unet, cond = _tiny_class_unet(), {"class_labels": torch.tensor([0, 1, 1, 0])}
        null = {"class_labels": torch.tensor(2)}
    else:
        states = torch.randn(4, 3, 8, generator=torch.Generator().manual_seed(1))
        unet, cond = _tiny_cross_attention_unet(), {"encoder_hidden_states": states}
        null = {"encoder_hidden_states": torch.zeros(1, 3, 8)}
    kw = dict(shape=(4, 1, 8, 8), steps=3, generator=0, progress=False, data_range=None, schedule=gk.Schedule.linear())
    assert "not loaded from a directory" in gk.sampling.sampled_model(unet).schedule_note  # (an in-memory UNet)
    with torch.no_grad():
        got = gk.sample(unet, model_kwargs=cond, **kw)
        direct = gk.sample(lambda x, t: unet(x, t, **cond).sample, **kw)
        assert torch.equal(got, direct)  # (the raw diffusers model, wrapped by gk.sample, got its condition)
        other = {k: 1 - v if k == "class_labels" else v.flip(0) for k, v in cond.items()}
        assert not torch.equal(gk.sample(unet, model_kwargs=other, **kw), got)
        guided = gk.sample(unet, model_kwargs=cond, guidance_scale=3.0, null_kwargs=null, **kw)

        def reference(x, t):
            c = unet(x, t, **cond).sample.double()
            u = unet(x, t, **{k: v.expand(4, *v.shape[1:]) if v.dim() else v.expand(4) for k, v in null.items()})
            u = u.sample.double()
            return guided_heads(c, u, 3.0, 3).float()

        torch.testing.assert_close(guided, gk.sample(reference, **kw), rtol=1e-4, atol=1e-4)
        assert torch.isfinite(guided).all() and (guided - got).abs().max() > 1e-3


def test_a_cross_attention_unet_without_its_states_is_told_what_to_pass():
    pytest.importorskip("diffusers")
    with pytest.raises(TypeError, match=r"needs encoder_hidden_states: pass gk.sample\(\.\.\., model_kwargs="):
        gk.sample(_tiny_cross_attention_unet(), shape=(1, 1, 8, 8), steps=2, progress=False,
                  schedule=gk.Schedule.linear())


# --- sharded conditional runs --------------------------------------------------------------------------------------


def _shard_kwargs(n):
    return dict(steps=4, data_range=None, model_kwargs={"class_labels": labels(n)}, guidance_scale=2.0,
                null_kwargs={"class_labels": torch.tensor(NULL)})


def test_shards_give_each_batch_its_rows_of_the_per_sample_kwargs(tmp_path, oracle):
    distributed.sample_shards(oracle, tmp_path, 10, (1,), shard_size=4, batch_size=3, seed=5, progress=False,
                              **_shard_kwargs(10))
    whole = gk.sample(oracle, shape=(10, 1), generator=5, progress=False, **_shard_kwargs(10))
    torch.testing.assert_close(distributed.load_shards(tmp_path), whole, rtol=0, atol=0)
    options = json.loads((tmp_path / "manifest.json").read_text())["options"]
    recorded = options["model_kwargs"]["class_labels"]["tensor"]
    assert recorded["shape"] == [10] and recorded["dtype"] == "torch.int64" and len(recorded["sha256"]) == 64
    assert options["guidance_scale"] == 2.0
    other = _shard_kwargs(10)
    other["model_kwargs"] = {"class_labels": 1 - labels(10)}
    with pytest.raises(ValueError, match="shards of another run"):  # (other labels: another run)
        distributed.sample_shards(oracle, tmp_path, 10, (1,), shard_size=4, batch_size=3, seed=5, progress=False,
                                  **other)


def test_shards_refuse_per_sample_kwargs_of_another_length(tmp_path, oracle):
    with pytest.raises(ValueError, match=r"model_kwargs\['class_labels'\] has 9 rows .* the run \(num_samples\) has "
                                         r"10 samples"):
        distributed.sample_shards(oracle, tmp_path, 10, (1,), progress=False, model_kwargs={"class_labels": labels(9)})
    assert not list(tmp_path.iterdir())  # (refused before anything was written)


SHARD_SCRIPT = """
import sys
from pathlib import Path
import torch
from gms_kernels.integrations import distributed
from gms_kernels.eval.oracle import ClassConditionalOracle
sys.path.insert(0, {tests!r})
from sampling.test_conditional import _tiny_class_unet, _tiny_cross_attention_unet

distributed.init_from_env()
out = Path(sys.argv[1])
oracle = ClassConditionalOracle(**{args!r})
n = 14
distributed.sample_shards(oracle, out / "oracle", n, (1,), shard_size=3, batch_size=2, seed=7, progress=False,
                          steps=4, data_range=None, model_kwargs={{"class_labels": torch.arange(n) % 2}},
                          guidance_scale=2.0, null_kwargs={{"class_labels": torch.tensor(2)}})
m = 6  # the two conditional diffusers UNets (their weights made from one seed in every process)
distributed.sample_shards(_tiny_class_unet(), out / "class", m, (1, 8, 8), shard_size=2, batch_size=2, seed=3,
                          progress=False, steps=2, model_kwargs={{"class_labels": torch.arange(m) % 2}},
                          guidance_scale=2.0, null_kwargs={{"class_labels": torch.tensor(2)}})
states = torch.linspace(-1, 1, m * 3 * 8).reshape(m, 3, 8)
distributed.sample_shards(_tiny_cross_attention_unet(), out / "cross", m, (1, 8, 8), shard_size=2, batch_size=2,
                          seed=3, progress=False, steps=2, model_kwargs={{"encoder_hidden_states": states}})
"""


def test_torchrun_two_processes_match_one_process_for_a_conditional_model(tmp_path, oracle):
    """The sharded sampler under torchrun, 1 and 2 processes: the class-conditional oracle with guidance, a
    class-conditional UNet2DModel with guidance and a UNet2DConditionModel give the same shards bit for bit."""
    pytest.importorskip("diffusers")
    script = tmp_path / "conditional_shards.py"
    script.write_text(textwrap.dedent(SHARD_SCRIPT.format(args=ORACLE_ARGS, tests=str(Path(__file__).resolve().parents[1]))))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results = []
    for nproc in (1, 2):
        out = tmp_path / f"nproc{nproc}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(script), str(out)]
        subprocess.run(cmd, env=env, check=True, timeout=300, capture_output=True, cwd=tmp_path)
        results.append({name: distributed.load_shards(out / name) for name in ("oracle", "class", "cross")})
    assert results[0]["oracle"].shape == (14, 1)
    assert results[0]["class"].shape == results[0]["cross"].shape == (6, 1, 8, 8)
    for name in results[0]:
        assert torch.equal(results[0][name], results[1][name]), name
    whole = gk.sample(oracle, shape=(14, 1), generator=7, progress=False, **_shard_kwargs(14))
    assert torch.equal(results[0]["oracle"], whole)


# --- bad arguments -------------------------------------------------------------------------------------------------


def _refuse_model(x, t):
    return torch.zeros(x.shape[0], 3)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(model_kwargs=[1, 2]), TypeError, "model_kwargs must be a dict of the network's keyword arguments"),
    (dict(model_kwargs={1: torch.zeros(4)}), TypeError, "model_kwargs must have string keys.*got 1"),
    (dict(model_kwargs={"class_labels": torch.zeros(3, dtype=torch.long)}), ValueError,
     r"model_kwargs\['class_labels'\] has 3 rows \(shape \(3,\)\) but the batch has 4 samples"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale="3", null_kwargs={"class_labels": 2}), TypeError,
     "guidance_scale must be a real number w"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale=True, null_kwargs={"class_labels": 2}), TypeError,
     "guidance_scale must be a real number"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale=float("nan"), null_kwargs={"class_labels": 2}),
     ValueError, "guidance_scale must be finite, got nan"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale=3.0), ValueError,
     "guidance_scale=3.0 needs null_kwargs"),
    (dict(model_kwargs={"class_labels": labels(4)}, null_kwargs={"class_labels": torch.tensor(2)}), ValueError,
     "null_kwargs is .* read only with guidance_scale"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale=2.0, null_kwargs="null"), TypeError,
     "null_kwargs must be a dict"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale=2.0, null_kwargs={}), ValueError,
     "null_kwargs is empty"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale=2.0, null_kwargs={"labels": torch.tensor(2)}),
     ValueError, r"null_kwargs\['labels'\] has no counterpart in model_kwargs"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale=2.0, null_kwargs={"class_labels": 2}),
     ValueError, r"null_kwargs\['class_labels'\] and model_kwargs\['class_labels'\] must both be tensors"),
    (dict(model_kwargs={"class_labels": labels(4)}, guidance_scale=2.0,
          null_kwargs={"class_labels": torch.full((5,), 2)}), ValueError,
     r"null_kwargs\['class_labels'\] has 5 rows"),
    (dict(model_kwargs={"states": torch.zeros(4, 3, 8)}, guidance_scale=2.0,
          null_kwargs={"states": torch.zeros(1, 2, 8)}),
     ValueError, r"null_kwargs\['states'\] has shape \(1, 2, 8\) and model_kwargs\['states'\] \(4, 3, 8\)"),
    (dict(model_kwargs={"class_labels": labels(4), "mode": "a"}, guidance_scale=2.0,
          null_kwargs={"class_labels": torch.tensor(2), "mode": "b"}), ValueError,
     r"null_kwargs\['mode'\] = 'b' differs from model_kwargs\['mode'\] = 'a'"),
])
def test_bad_conditioning_arguments_are_named(oracle, kwargs, error, match):
    with pytest.raises(error, match=match):
        gk.sample(oracle, shape=(4, 1), steps=2, progress=False, **kwargs)


def test_a_model_that_takes_no_such_keyword_is_refused_before_sampling():
    with pytest.raises(TypeError, match=r"model_kwargs: the model is called as model\(x_t, t, \*\*model_kwargs\) "
                                        r"with 'class_labels'.*unexpected keyword argument 'class_labels'"):
        gk.sample(_refuse_model, shape=(4, 1), steps=2, progress=False, model_kwargs={"class_labels": labels(4)})


def test_guidance_with_the_exact_solver_is_refused(oracle):
    with pytest.raises(ValueError, match="solver 'exact' .* guidance_scale has nothing to guide"):
        gk.sample(oracle, shape=(4, 1), steps=2, solver="exact", progress=False,
                  model_kwargs={"class_labels": labels(4)}, guidance_scale=2.0,
                  null_kwargs={"class_labels": torch.tensor(NULL)})


def test_a_guided_model_that_returns_one_batch_is_told_about_both_branches():
    def half(x, t, class_labels):
        return torch.zeros(x.shape[0] // 2, 3)

    with pytest.raises(ValueError, match=r"called once on both branches, x_t of 8 rows .* returned shape \(4, 3\)"):
        gk.sample(half, shape=(4, 1), steps=2, progress=False, model_kwargs={"class_labels": labels(4)},
                  guidance_scale=2.0, null_kwargs={"class_labels": torch.tensor(NULL)})
