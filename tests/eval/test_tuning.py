"""gk.choose_options: a model's own solver options chosen on held-out data by the rule the shipped models' were."""
import pytest
import torch

import gms_kernels as gk
from gms_kernels.cli import main
from gms_kernels.solvers import get_solver, resolve_options
from gms_kernels.eval.metrics import seed_interval
from gms_kernels.eval.tuning import OptionChoice, mean_ranks

GMS_CANDIDATES = get_solver("gms").candidates

from conftest import small_central_moment_net

CANDIDATES = {"per image": {"fit": "closed", "select": "sample"}, "per pixel": {"fit": "closed", "select": "pixel"},
              "adan-3": {"fit": "adan", "fit_iters": 3, "select": "pixel"}}


def spread_score(x, reference):
    """Lower is better: how far the samples' per-pixel mean and spread are from the reference's."""
    return float((x.mean(0) - reference.mean(0)).abs().mean() + (x.std(0) - reference.std(0)).abs().mean())


def test_mean_ranks_average_the_per_cell_ranks():
    scores = {("digits", "a", 5): 1.0, ("digits", "b", 5): 2.0, ("digits", "c", 5): 3.0,
              ("patches", "a", 5): 9.0, ("patches", "b", 5): 2.0, ("patches", "c", 5): 5.0}
    assert mean_ranks(scores, ["a", "b", "c"]) == {"a": 2.0, "b": 1.5, "c": 2.5}


def test_mean_ranks_take_cells_of_any_kind():
    """A cell may be None (gk.choose_options) or a data set's name, both in one table: cells are ordered by their
    repr, never compared with each other."""
    scores = {(None, "a", 5): 1.0, (None, "b", 5): 2.0, ("digits", "a", 5): 3.0, ("digits", "b", 5): 1.0}
    assert mean_ranks(scores, ["a", "b"]) == {"a": 1.5, "b": 1.5}


def test_the_table_is_markdown_best_first_with_intervals_where_there_are_seeds():
    choice = OptionChoice("gms", {"a": {}, "b": {}}, (5, 10))
    choice.values = {("a", 5): [1.0, 3.0], ("a", 10): [2.0, 2.5], ("b", 5): [0.5, 0.7], ("b", 10): [4.0]}
    choice.ranks = {"a": 2.0, "b": 1.0}
    cell = lambda v: f"{seed_interval(v).mean:.4g} ± {seed_interval(v).half_width:.2g}"
    assert choice.table().splitlines() == [
        "| candidate | K=5 | K=10 | mean rank |",
        "|---|---|---|---|",
        f"| b | {cell([0.5, 0.7])} | 4 | 1.00 |",
        f"| a | {cell([1.0, 3.0])} | {cell([2.0, 2.5])} | 2.00 |",
    ]
    assert choice.best == "b" and choice.options == {}


def test_choose_options_defaults_and_what_every_run_is_given(monkeypatch):
    """The defaults (K = 5, 10, 20; seeds 0, 1, 2; 1000 samples; a progress bar) and each sample() call: the
    candidate's options named in full (so a model's own cannot fill any in), the caller's other arguments, and a
    shape from the reference unless one is given."""
    calls, bars = [], []
    monkeypatch.setattr("gms_kernels.eval.tuning.sample", lambda model, **kw: calls.append(kw) or torch.zeros(kw["shape"]))
    monkeypatch.setattr("gms_kernels.eval.tuning.progress_bar",
                        lambda runs, enabled, **kw: bars.append((enabled, kw)) or list(runs))
    reference = torch.zeros(5, 1, 4, 4)
    choice = gk.choose_options(object(), reference, lambda x, ref: 0.0, candidates={"a": {"fit": "closed"}},
                               backend="torch")
    assert choice.solver == "gms" and choice.steps == (5, 10, 20) and bars == [(True, {"desc": "choose_options"})]
    assert [(c["steps"], c["generator"]) for c in calls] == [(k, s) for k in (5, 10, 20) for s in (0, 1, 2)]
    full = resolve_options(get_solver("gms"), {"fit": "closed"}).as_dict()
    for c in calls:
        assert c["shape"] == (1000, 1, 4, 4) and c["solver"] == "gms" and c["progress"] is False
        assert c["backend"] == "torch" and {k: c[k] for k in full} == full
    calls.clear()
    gk.choose_options(object(), reference, lambda x, ref: 0.0, candidates={"a": {}}, shape=(2, 3), n_samples=1,
                      steps=(4,), seeds=1, progress=False)
    assert [(c["shape"], c["steps"], c["generator"]) for c in calls] == [((1, 2, 3), 4, 0)]


def test_every_cell_is_the_candidates_own_sampling_run_and_the_best_has_the_lowest_mean_rank():
    net = small_central_moment_net(5)
    reference = torch.rand(40, 1, 8, 8) * 1.6 - 0.8
    net.solver_defaults = {"gms": {"var_floor": 0.6, "select": "pixel"}}  # (must not reach the candidates)
    choice = gk.choose_options(net, reference, spread_score, candidates=CANDIDATES, steps=(2, 3), seeds=2,
                               n_samples=24, first_seed=3, progress=False, backend="torch")
    net.solver_defaults = None
    for name, options in CANDIDATES.items():
        for k in (2, 3):
            want = [spread_score(gk.sample(net, shape=(24, 1, 8, 8), steps=k, generator=seed, progress=False,
                                           backend="torch", **options), reference) for seed in (3, 4)]
            assert choice.values[(name, k)] == pytest.approx(want, rel=1e-6, abs=1e-7)
    means = {(None, c, k): sum(v) / 2 for (c, k), v in choice.values.items()}
    assert choice.ranks == mean_ranks(means, list(CANDIDATES))
    assert choice.ranks[choice.best] == min(choice.ranks.values())
    assert choice.options == CANDIDATES[choice.best]
    rows = [line for line in choice.table().splitlines()[2:]]
    assert len(rows) == 3 and rows[0].startswith(f"| {choice.best} |") and rows[0].endswith(
        f"| {choice.ranks[choice.best]:.2f} |")
    net.solver_defaults = {"gms": choice.options}  # what the docstring says to do with it
    assert torch.equal(gk.sample(net, shape=(4, 1, 8, 8), steps=2, generator=0, progress=False, backend="torch"),
                       gk.sample(net, shape=(4, 1, 8, 8), steps=2, generator=0, progress=False, backend="torch",
                                 **CANDIDATES[choice.best]))


def test_the_default_candidates_are_valid_gms_options():
    for options in GMS_CANDIDATES.values():
        resolve_options(get_solver("gms"), options)
    assert {"fit": "closed", "select": "pixel"} in GMS_CANDIDATES.values()
    assert {"preset": "official"} in GMS_CANDIDATES.values()


def never_called(x, reference):
    raise AssertionError("sampled before checking the request")


@pytest.mark.parametrize("kwargs, message", [
    ({"candidates": {"bad": {"select": "row"}}}, "select"),
    ({"candidates": {}}, "at least one candidate"),
    ({"select": "pixel"}, "select: gms options go in the candidates"),
    ({"seeds": 0}, "seeds and n_samples must be >= 1"),
    ({"n_samples": 0}, "seeds and n_samples must be >= 1"),
    ({"first_seed": -1}, "first_seed must be >= 0"),
])
def test_a_bad_request_is_refused_before_any_sampling(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gk.choose_options(small_central_moment_net(), torch.zeros(4, 1, 8, 8), never_called, steps=(2,),
                          progress=False, **kwargs)


def test_cli_choose_options_prints_the_choice_and_saves_the_network_with_it(tmp_path, capsys, monkeypatch):
    small_central_moment_net(3).save(tmp_path / "net.pt")
    torch.save(torch.rand(16, 1, 8, 8) * 1.6 - 0.8, tmp_path / "val.pt")
    run = ["choose-options", "--model", str(tmp_path / "net.pt"), "--reference", str(tmp_path / "val.pt"),
           "--metric", "swd", "--steps", "2", "--seeds", "1", "--samples", "8", "--quiet", "--backend", "torch",
           "--first-seed", "7"]
    seen = {}
    from gms_kernels.eval import tuning

    real = tuning.choose_options
    monkeypatch.setattr("gms_kernels.eval.tuning.choose_options", lambda *a, **k: seen.update(k) or real(*a, **k))
    assert main(run + ["--out", str(tmp_path / "chosen.pt")]) == 0
    assert seen["first_seed"] == 7 and seen["seeds"] == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "candidate" not in line]
    assert sorted(r.split(" | ")[0][2:] for r in rows) == sorted(GMS_CANDIDATES)
    best = next(line for line in out.splitlines() if line.startswith("chosen: ")).split(": ")[1]
    assert rows[0].startswith(f"| {best} |")
    assert gk.models.load(tmp_path / "chosen.pt").solver_defaults == {"gms": GMS_CANDIDATES[best]}


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
@pytest.mark.parametrize("model, extra, message", [
    ("net.pt", ["--reference", "val.pt"], "--model needs --reference (held-out data, not the training data) and "
                                          "--metric"),
    ("net.pt", ["--reference", "val.pt", "--metric", "fid"], "--metric fid needs --inception FILE"),
    ("ts.pt", ["--reference", "val.pt", "--metric", "swd", "--out", "x.pt"], "--out saves a gk.models.MomentNet"),
    ("net.pt", ["--reference", "val.pt", "--metric", "swd", "--first-seed", "-1"], "--first-seed must be >= 0"),
])
def test_cli_choose_options_refuses_an_incomplete_request_in_one_line(tmp_path, capsys, monkeypatch, model, extra,
                                                                      message):
    small_central_moment_net(3).save(tmp_path / "net.pt")
    torch.jit.script(torch.nn.Identity()).save(str(tmp_path / "ts.pt"))
    torch.save(torch.zeros(4, 1, 8, 8), tmp_path / "val.pt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gms_kernels.eval.tuning.choose_options", never_called)
    with pytest.raises(SystemExit) as exc:
        main(["choose-options", "--model", model, *extra])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
