"""Models that carry their own solver options (``solver_defaults``): the shipped models' choice on their
validation split, how it ranks against the caller's options and presets, and that it travels with the model
(gk.sample, the sharded sampler's manifest, the diffusers export)."""
import json

import pytest
import torch

import gms_kernels as gk
from gms_kernels.integrations import distributed
from gms_kernels.models.embedded import DIGITS_MODEL, PATCHES_MODEL, SOLVER_DEFAULTS, default_model, file_tag, patches_model
from gms_kernels.models.diffusers_export import export_diffusers
from gms_kernels.solvers import get_solver, resolve_options, with_model_defaults

from conftest import small_central_moment_net

GMS = get_solver("gms")


class Recommends(torch.nn.Module):
    """A model that only carries a table (with_model_defaults reads nothing else)."""

    def __init__(self, table):
        super().__init__()
        self.solver_defaults = table


def test_the_shipped_models_carry_the_options_chosen_for_their_files():
    # (a retrained asset changes its hash and loses them: this fails until they are chosen again for it)
    assert default_model().solver_defaults == SOLVER_DEFAULTS[file_tag(DIGITS_MODEL)] == \
        {"gms": {"fit": "closed", "select": "pixel"}}
    assert patches_model().solver_defaults == SOLVER_DEFAULTS[file_tag(PATCHES_MODEL)] == \
        {"gms": {"fit": "closed", "select": "pixel", "variance_scale": 1.25}}


def test_model_options_replace_the_library_defaults_and_yield_to_the_caller():
    model = Recommends({"gms": {"select": "sample", "var_floor": 0.2}, "ddim": {"eta": 0.5}})
    assert resolve_options(GMS, with_model_defaults(GMS, {}, model)).as_dict()["select"] == "sample"
    assert resolve_options(GMS, {}).as_dict()["select"] == "pixel"  # (the library's own default differs)
    o = resolve_options(GMS, with_model_defaults(GMS, {"select": "pixel"}, model))
    assert (o.select, o.var_floor) == ("pixel", 0.2)
    assert with_model_defaults(get_solver("ddim"), {}, model) == {"eta": 0.5}
    assert with_model_defaults(get_solver("sn-ddpm"), {"variance_scale": 2.0}, model) == {"variance_scale": 2.0}
    assert with_model_defaults(GMS, {"fit": "adan"}, torch.nn.Identity()) == {"fit": "adan"}


def test_a_named_preset_sets_its_options_over_the_models():
    model = Recommends({"gms": {"select": "pixel", "fit": "closed", "var_floor": 0.2}})
    o = resolve_options(GMS, with_model_defaults(GMS, {"preset": "official"}, model))
    official = GMS.presets["official"]
    assert all(getattr(o, k) == v for k, v in official.items())
    assert o.select == "sample" and o.fit == "adan" and o.var_floor == 0.2  # (not in the preset: kept)
    o = resolve_options(GMS, with_model_defaults(GMS, {"preset": "official", "select": "pixel"}, model))
    assert o.select == "pixel"  # (the caller's own option over the preset)


def test_a_preset_the_caller_names_is_checked_as_usual_whatever_the_model_carries():
    model = Recommends({"gms": {"preset": "official", "select": "pixel"}, "sn-ddpm": {"variance_scale": 2.0}})
    o = resolve_options(GMS, with_model_defaults(GMS, {}, model))
    assert (o.fit, o.select) == ("adan", "pixel")  # (the model's preset under the model's own select)
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        gk.sample(model, shape=(2, 1, 8, 8), steps=2, progress=False, preset="nope")
    with pytest.raises(ValueError, match="unknown option.* preset for solver 'sn-ddpm'"):
        gk.sample(model, shape=(2, 1, 8, 8), steps=2, progress=False, solver="sn-ddpm", preset="official")


@pytest.mark.parametrize("table, message", [
    ({"gms": "pixel"}, "must map solver names to option dicts"),
    (["gms"], "must map solver names to option dicts"),
    ({"gms": {"selct": "pixel"}}, "the model's solver_defaults for 'gms': unknown option(s) selct"),
    ({"gms": {"select": "row"}}, "the model's solver_defaults for 'gms'"),
])
def test_a_bad_table_is_refused_before_sampling(table, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gk.sample(Recommends(table), shape=(2, 1, 8, 8), steps=2, progress=False)


def test_gk_sample_draws_with_the_models_options():
    net = small_central_moment_net(3)
    kw = dict(shape=(6, 1, 8, 8), steps=3, generator=4, progress=False, backend="torch")
    pixel, per_image = gk.sample(net, **kw), gk.sample(net, select="sample", **kw)
    assert not torch.equal(pixel, per_image)
    net.solver_defaults = {"gms": {"select": "sample"}}
    assert torch.equal(gk.sample(net, **kw), per_image)
    assert torch.equal(gk.sample(net, select="pixel", **kw), pixel)
    # the embedded model: gk.sample() without a model is the shipped digits model with its options
    kw.pop("backend")
    assert torch.equal(gk.sample(**kw), gk.sample(default_model(), fit="closed", select="pixel", **kw))


def test_the_shard_manifest_records_the_models_options(tmp_path):
    net = small_central_moment_net(3)
    net.solver_defaults = {"gms": {"select": "sample"}}
    distributed.sample_shards(net, tmp_path, 2, (1, 8, 8), shard_size=2, progress=False, steps=2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["solver_options"]["select"] == "sample"
    assert distributed.solver_settings({}, None)["select"] == "pixel"  # (None: the embedded digits model)
    net.solver_defaults = {}  # the same directory with other effective options is another run
    with pytest.raises(ValueError, match="holds shards of another run"):
        distributed.sample_shards(net, tmp_path, 2, (1, 8, 8), shard_size=2, progress=False, steps=2)


def test_a_saved_moment_net_keeps_its_options(tmp_path):
    net = small_central_moment_net(3)
    net.save(tmp_path / "plain.pt")
    assert getattr(gk.models.load(tmp_path / "plain.pt"), "solver_defaults", None) is None
    net.solver_defaults = {"gms": {"select": "pixel", "weights": (0.25, 0.75)}}
    net.save(tmp_path / "own.pt")
    loaded = gk.models.load(tmp_path / "own.pt")
    assert loaded.solver_defaults == {"gms": {"select": "pixel", "weights": [0.25, 0.75]}}
    kw = dict(shape=(3, 1, 8, 8), steps=2, generator=1, progress=False, backend="torch")
    assert torch.equal(gk.sample(loaded, **kw), gk.sample(net, **kw))


def test_the_diffusers_export_keeps_the_models_options(tmp_path):
    net = small_central_moment_net(3)
    net.solver_defaults = {"gms": {"select": "pixel", "var_floor": 0.2}}
    export_diffusers(net, tmp_path / "a", sample_size=8)
    config = json.loads((tmp_path / "a" / "scheduler" / "scheduler_config.json").read_text())
    assert config["select"] == "pixel" and config["solver_options"] == {"var_floor": 0.2} and config["fit"] is None
    reloaded = gk.models.load(tmp_path / "a")
    assert reloaded.solver_defaults == net.solver_defaults
    export_diffusers(net, tmp_path / "b", sample_size=8, select="sample", solver_options={"var_floor": 0.3})
    config = json.loads((tmp_path / "b" / "scheduler" / "scheduler_config.json").read_text())
    assert config["select"] == "sample" and config["solver_options"] == {"var_floor": 0.3}
    export_diffusers(net, tmp_path / "c", sample_size=8, preset="official")
    config = json.loads((tmp_path / "c" / "scheduler" / "scheduler_config.json").read_text())
    assert config["preset"] == "official" and config["select"] is None and config["solver_options"] == {"var_floor": 0.2}
    net.solver_defaults = {"ddim": {"eta": 0.5}}  # (eta is one of GMSScheduler's own arguments)
    export_diffusers(net, tmp_path / "d", sample_size=8, solver="ddim")
    config = json.loads((tmp_path / "d" / "scheduler" / "scheduler_config.json").read_text())
    assert config["eta"] == 0.5 and config["solver_options"] is None and config["select"] is None
