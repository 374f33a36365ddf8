"""What a new user trips over: every bad input is refused with a clear error before
anything runs or is written, by every backend alike, and the CLI reports it in one line."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import gms_kernels as gk
from gms_kernels.cli import main
from gms_kernels.integrations.distributed import load_shards, sample_shards
from gms_kernels.models.embedded import default_model
from gms_kernels.core.images import to_uint8
from gms_kernels.models import PytorchDDPMUNet

SCHEDULE = gk.Schedule.linear()


def _step(backend: str, **options):
    x = torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(0))
    out = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(1))
    return gk.step(x, out, t=500, s=400, schedule=SCHEDULE, generator=0, backend=backend, **options)


# -- options: one validation for every backend, before dispatch -----------------------------------
@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("option, value", [
    ("var_floor", 5.0), ("var_floor", -1.0), ("var_floor", float("nan")), ("var_floor", "0.1"),
    ("fit_iters", -3), ("fit_iters", 2.5), ("fit_iters", True),
    ("lr", float("nan")), ("lr", -0.1), ("clip_pixel", 0.0), ("clip_pixel", float("inf")),
    ("gaussian_last_step", "no"), ("adan_mean", "pixel"),
])
def test_bad_gms_options_are_refused_by_every_backend(backend, option, value):
    fit = {"fit": "adan"} if option in ("fit_iters", "lr", "adan_mean") else {}
    with pytest.raises(ValueError, match=option):
        _step(backend, **fit, **{option: value})


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_valid_edge_options_still_run(backend):
    assert torch.isfinite(_step(backend, var_floor=1.0)).all()
    assert torch.isfinite(_step(backend, var_floor=np.float64(0.0))).all()
    assert torch.isfinite(_step(backend, fit="adan", fit_iters=np.int64(0))).all()


def test_eta_must_be_a_finite_number():
    x, out = torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2)
    for eta in (float("nan"), 1.5, "0.5"):
        with pytest.raises(ValueError, match="eta"):
            gk.step(x, out, t=500, s=400, schedule=SCHEDULE, solver="ddim", eta=eta)


# -- inputs that used to give raw IndexError / AttributeError / RuntimeError ------------------------
def test_step_refuses_malformed_tensors():
    x, out = torch.randn(2, 1, 4, 4), torch.randn(2, 3, 4, 4)
    with pytest.raises(ValueError, match=r"x_t must be \[N, C, ...\]"):
        gk.step(torch.randn(16), torch.randn(48), t=500, s=400, schedule=SCHEDULE, generator=0)
    with pytest.raises(ValueError, match="noise must be a tensor shaped like x_t"):
        gk.step(x, out, t=500, s=400, schedule=SCHEDULE, noise=torch.randn(3, 1, 4, 4), uniform=torch.rand(2))
    with pytest.raises(ValueError, match="uniform must be a tensor"):
        gk.step(x, out, t=500, s=400, schedule=SCHEDULE, noise=torch.randn(2, 1, 4, 4), uniform=torch.rand(3))
    with pytest.raises(ValueError, match="4 channels for 1-channel data"):
        gk.step(x, torch.randn(2, 4, 4, 4), t=500, s=400, schedule=SCHEDULE, generator=0)


@pytest.mark.parametrize("t", [999.7, 500.5, "500", True])
def test_fractional_or_non_integer_time_is_refused(t):
    with pytest.raises(ValueError, match="integer time index"):
        gk.step(torch.zeros(1, 1, 2, 2), torch.zeros(1, 3, 2, 2), t=t, s=400, schedule=SCHEDULE, generator=0)


def test_integral_time_values_are_accepted():
    x, out = torch.zeros(1, 1, 2, 2), torch.zeros(1, 3, 2, 2)
    ref = gk.step(x, out, t=500, s=400, schedule=SCHEDULE, generator=0)
    for t in (500.0, np.int64(500), torch.tensor(500)):
        assert torch.equal(gk.step(x, out, t=t, s=400, schedule=SCHEDULE, generator=0), ref)


@pytest.mark.parametrize("returns, kind", [(lambda x: (x, x, x), "tuple"),
                                           (lambda x: np.zeros((x.shape[0], 3, 8, 8)), "ndarray")])
def test_model_returning_a_non_tensor(returns, kind):
    with pytest.raises(TypeError, match=f"the model returned a {kind}"):
        gk.sample(lambda x, t: returns(x), shape=(2, 1, 8, 8), steps=2, progress=False)


@pytest.mark.parametrize("shape", [(-2, 1, 8, 8), (2, 0, 8, 8), (2.5, 1, 8, 8)])
def test_sample_refuses_bad_shapes(shape):
    with pytest.raises(ValueError, match="positive integers"):
        gk.sample(shape=shape, steps=2, progress=False)


def test_sample_dtype_that_the_model_cannot_take_is_explained():
    model = gk.models.MomentNet(PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1,
                                                in_channels=1))
    with pytest.raises(ValueError, match="the samples are torch.float16 but the model's parameters are torch.float32"):
        gk.sample(model, shape=(1, 1, 8, 8), steps=2, dtype=torch.float16, progress=False)


def test_a_model_that_casts_its_input_may_sample_in_another_dtype():
    net = torch.nn.Conv2d(1, 3, 1)

    def casting(x, t):
        return net(x.float()).to(x.dtype)
    casting.parameters = net.parameters
    x = gk.sample(casting, shape=(2, 1, 4, 4), steps=2, dtype=torch.float64, progress=False, generator=0)
    assert x.dtype == torch.float64 and torch.isfinite(x).all()


# -- checkpoints --------------------------------------------------------------------------------
class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def test_checkpoint_with_code_is_reported_as_refused(tmp_path):
    torch.save({"state": _RunsCode()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError) as err:
        gk.models.load(tmp_path / "evil.pt")
    assert "refuses" in str(err.value) and "system" in str(err.value)
    assert "truncated" not in str(err.value) and "corrupted" not in str(err.value)


def test_bytes_that_are_no_checkpoint_are_never_called_a_refused_object(tmp_path):
    """torch's weights-only unpickler reports garbage as "Weights only load failed ... Unsupported operand":
    that is a file torch cannot read, not an object it refused, so the advice to retry with
    weights_only=False (right for a refused class) must not be given for it."""
    import pickle

    (tmp_path / "garbage.pt").write_bytes(b"xgarbage, not a checkpoint")
    with open(tmp_path / "plain.pkl", "wb") as f:
        pickle.dump({"w": [1.0, 2.0]}, f, protocol=4)
    size = {name: (tmp_path / name).stat().st_size for name in ("garbage.pt", "plain.pkl")}
    cases = {"garbage.pt": f"({size['garbage.pt']} bytes; UnpicklingError: Unsupported operand 120): it is truncated, "
                           "corrupted or not a torch checkpoint",
             "plain.pkl": f"({size['plain.pkl']} bytes; UnpicklingError: Unsupported operand 149): it looks like a plain "
                          "pickle (pickle.dump)"}
    for name, expected in cases.items():
        with pytest.raises(ValueError) as err:
            gk.models.load(tmp_path / name)
        text = str(err.value)
        assert f"{name}: cannot read this file as a torch checkpoint (" in text and expected in text
        assert "weights_only=False" not in text and "refuses" not in text


def test_cuda_map_location_without_cuda_says_so(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "w.pt")
    if torch.cuda.is_available():
        pytest.fail("this check needs a machine without CUDA")  # (the GPU suite does not run this file)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'w.pt'}: map_location='cuda' asks for a CUDA device, "
                                                   "but this machine has none")):
        gk.models.load(tmp_path / "w.pt", map_location="cuda")


def test_a_safetensors_file_read_onto_a_missing_cuda_device_says_so(tmp_path):
    """The same message for a .safetensors file (it said "truncated, corrupted or not a torch checkpoint")."""
    from safetensors.torch import save_file

    from gms_kernels.models._common import read_weights_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    if torch.cuda.is_available():
        pytest.fail("this check needs a machine without CUDA")
    for device in ("cuda", "cuda:0", torch.device("cuda:1")):
        with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'w.safetensors'}: map_location={device!r} asks "
                                                       "for a CUDA device, but this machine has none")):
            read_weights_file(tmp_path / "w.safetensors", map_location=device)
    assert torch.equal(read_weights_file(tmp_path / "w.safetensors")["w"], torch.zeros(2))


def test_a_safetensors_file_read_onto_meta_gives_meta_tensors(tmp_path):
    """As torch files do (it said "truncated, corrupted or not a torch checkpoint": safetensors has no meta device)."""
    from safetensors.torch import save_file

    from gms_kernels.models._common import read_weights_file

    save_file({"w": torch.zeros(2, 3, dtype=torch.float16)}, str(tmp_path / "w.safetensors"))
    for device in ("meta", torch.device("meta")):
        w = read_weights_file(tmp_path / "w.safetensors", map_location=device)["w"]
        assert (w.device.type, w.shape, w.dtype) == ("meta", (2, 3), torch.float16)


def test_a_scheduler_config_that_is_not_a_json_object_is_ignored(tmp_path):
    """A diffusers UNet folder whose scheduler_config.json holds valid JSON of another kind (a list) loads
    without a schedule from it, as a missing or unreadable file does (it raised AttributeError)."""
    from gms_kernels.models.loading import _diffusers_schedule

    (tmp_path / "scheduler_config.json").write_text("[1, 2]")
    assert _diffusers_schedule(str(tmp_path), "unet") is None
    (tmp_path / "scheduler_config.json").write_text('{"num_train_timesteps": 20}')
    assert _diffusers_schedule(str(tmp_path), "unet").T == 20


def test_pytorch_ddpm_state_dict_with_keys_removed_is_compared_with_its_own_architecture(tmp_path):
    net = PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1, 2, 2), attn=(1,), num_res_blocks=2)
    state = net.state_dict()
    removed = ["time_embedding.timembedding.3.bias", "head.weight", "head.bias"]
    for key in removed:
        del state[key]
    torch.save(state, tmp_path / "partial.pt")
    with pytest.raises(ValueError) as err:
        gk.models.load(tmp_path / "partial.pt")
    text = str(err.value)
    assert "missing keys (3)" in text and all(k in text for k in removed)
    assert "unexpected" not in text and "wrong shapes" not in text
    assert "ch=32" in text and "ch_mult=[1, 2, 2]" in text


# -- the command line ---------------------------------------------------------------------------
def test_mistyped_sample_command_writes_nothing_and_the_corrected_one_runs(tmp_path, capsys):
    out = tmp_path / "o3"
    with pytest.raises(SystemExit) as exit_:
        main(["sample", "--num-samples", "4", "--steps", "0", "--out", str(out), "--quiet"])
    assert exit_.value.code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "steps must be an integer" in err and "Traceback" not in err
    assert main(["sample", "--num-samples", "4", "--steps", "2", "--out", str(out), "--quiet",
                 "--npz", str(tmp_path / "s.npz")]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["steps"] == 2 and manifest["solver_options"]["fit_iters"] == 25  # values, not repr
    arr = np.load(tmp_path / "s.npz")["arr_0"]
    assert arr.dtype == np.uint8 and arr.shape == (4, 8, 8, 1)  # NHWC, as the FID tools read
    assert np.array_equal(arr, to_uint8(load_shards(out)))


@pytest.mark.parametrize("argv", [
    ["sample", "--solver", "gms", "--fit-iters", "-3"],
    ["sample", "--model", "no/such/file.pt", "--shape", "1", "8", "8"],
    ["sample", "--npz", "x.txt"],
    ["sdedit", "--model", "no/such/file.pt", "--input", "x.png"],
    ["sample", "--solver", "ddpm", "--eta", "0.3"],  # (a flag of another solver is not ignored)
    ["sample", "--solver", "ddpm", "--fit", "adan"],
    ["sample", "--option", "eta"],
    ["sample", "--solver", "ddim", "--eta", "0.3", "--option", "eta=0.1"],
    ["sample", "--solver", "gms", "--option", "no_such_option=1"],
    ["sample", "--solver", "gms", "--option", "fit_iters=5", "--option", "fit_iters=70"],  # (not the last one)
    ["sample", "--solver", "analytic-dpm", "--gamma", "no/such/table.pt"],
    ["sample", "--solver", "ddpm", "--gamma", "table.pt"],
])
def test_user_errors_print_one_line_and_exit_2(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv + ["--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("gms-kernels ")
    assert not (tmp_path / "o").exists()


def test_sample_passes_solver_options_and_estimates_analytic_dpms_gamma(tmp_path):
    """--eta, --option KEY=VALUE (JSON values) and the GMS flags reach gk.sample (the manifest records what ran);
    analytic-dpm on the embedded model gets Gamma estimated on 256 training digits at the trajectory's steps."""
    from gms_kernels import cli
    from gms_kernels.models.embedded import default_model

    def options(*argv):
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        assert main(["sample", "--num-samples", "2", "--steps", "2", "--out", str(out), "--quiet", *argv]) == 0
        return json.loads((out / "manifest.json").read_text())["solver_options"]

    assert options("--solver", "ddim", "--eta", "0.5")["eta"] == 0.5
    got = options("--solver", "gms", "--fit", "adan", "--option", "var_floor=0.25", "--option", "adan_mean=\"batch\"")
    assert got["fit"] == "adan" and got["var_floor"] == 0.25 and got["adan_mean"] == "batch"
    assert options("--solver", "ggf", "--option", "eps_rel=0.5")["eps_rel"] == 0.5
    model = default_model()
    expected = gk.estimate_gamma(model, gk.data.digits("train")[0][:cli.GAMMA_DIGITS], model.schedule,
                                 timesteps=gk.trajectory(model.schedule, 2, "even"),
                                 generator=torch.Generator().manual_seed(0))
    gamma = torch.tensor(options("--solver", "analytic-dpm")["gamma"], dtype=torch.float64)
    torch.testing.assert_close(gamma, expected, rtol=1e-12, atol=0, equal_nan=True)
    assert int((~gamma.isnan()).sum()) == len(gk.trajectory(model.schedule, 2, "even"))
    table = tmp_path / "gamma.pt"
    torch.save(torch.full((1000,), 0.3, dtype=torch.float64), table)
    assert options("--solver", "analytic-dpm", "--gamma", str(table))["gamma"][500] == 0.3


def test_analytic_dpm_with_a_checkpoint_asks_for_a_gamma_table():
    import argparse

    from gms_kernels.cli import UsageError, _analytic_gamma

    with pytest.raises(UsageError, match=r"needs --gamma TABLE.pt with --model: save one with torch.save"):
        _analytic_gamma(argparse.Namespace(gamma=None, model="net.pt", steps=10, trajectory="even", seed=0), None)


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="fit_iters"):
        main(["--debug", "sample", "--fit-iters", "-3", "--out", str(tmp_path / "o"), "--quiet"])
    with pytest.raises(ValueError, match="fit_iters"):
        main(["sample", "--fit-iters", "-3", "--out", str(tmp_path / "o"), "--quiet", "--debug"])


def test_version_choices_and_defaults_in_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"gms-kernels {gk.__version__}"
    for bad in (["sample", "--solver", "gmss"], ["sample", "--backend", "gpu"], ["sample", "--trajectory", "log"]):
        with pytest.raises(SystemExit) as exit_:
            main(bad)
        assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err
    from gms_kernels.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, sub in commands.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help text"
        text = sub.format_help()
        assert "(default:" in text, name


def test_tqdm_disable_is_obeyed(tmp_path, capsys):
    """TQDM_DISABLE=1 switches off the bars of a run that asks for them (tqdm reads it at import, so
    the check runs in a fresh interpreter; the same calls here, without it, do show their bars)."""
    calls = ("gk.sample(shape=(2, 1, 8, 8), steps=3, progress=True); "
             f"distributed.sample_shards(embedded.default_model(), {str(tmp_path / 'a')!r}, 2, (1, 8, 8), steps=2)")
    run = subprocess.run([sys.executable, "-c", "import gms_kernels as gk; from gms_kernels.integrations import "
                          "distributed; from gms_kernels.models import embedded; " + calls], env={**os.environ, "TQDM_DISABLE": "1"},
                         capture_output=True, text=True, timeout=300, check=True)
    assert "gms K=3" not in run.stderr and "shards" not in run.stderr, run.stderr
    if os.environ.get("TQDM_DISABLE"):
        return  # (this interpreter was started with it too)
    gk.sample(shape=(2, 1, 8, 8), steps=3, progress=True)
    sample_shards(default_model(), tmp_path / "b", 2, (1, 8, 8), steps=2)
    err = capsys.readouterr().err
    assert "gms K=3" in err and "shards (rank 0)" in err


def test_manifest_records_values_and_skips_callbacks(tmp_path):
    seen = []
    sample_shards(default_model(), tmp_path, 2, (1, 8, 8), steps=2, progress=False, callback=seen.append,
                  schedule=gk.Schedule.linear(), fit="adan", weights=(0.25, 0.75))
    options = json.loads((tmp_path / "manifest.json").read_text())["options"]
    assert options["weights"] == [0.25, 0.75] and options["fit"] == "adan" and "callback" not in options
    assert len(options["schedule"]["betas"]) == 1000 and seen


def test_lazy_names_show_in_dir():
    names = dir(gk)
    for name in ("GMSScheduler", "GMSSchedulerOutput", "models", "train_heads", "train_backbone", "sample"):
        assert name in names


@pytest.mark.parametrize("solver, options", [("ddpm", {}), ("ddim", {"eta": 0.5}), ("sn-ddpm", {}), ("gms", {}),
                                             ("gms", {"fit": "adan", "fit_iters": 3}), ("exact", {})])
def test_callbacks_get_the_same_keys_from_every_solver(paper_oracle, solver, options):
    """k-diffusion's convention: x, the step, sigma and the denoised prediction, whatever the solver."""
    seen = []
    x_T = torch.randn(64, 1, generator=torch.Generator().manual_seed(3))
    x = gk.sample(paper_oracle, x_T=x_T, steps=4, solver=solver, generator=0, progress=False, callback=seen.append,
                  **options)
    schedule = paper_oracle.schedule
    ts = gk.trajectory(schedule, 4)
    assert [info["t"] for info in seen] == ts and [info["i"] for info in seen] == list(range(len(ts)))
    assert [info["s"] for info in seen] == ts[1:] + [gk.DATA]
    for info in seen:
        assert {"step", "i", "t", "s", "sigma", "x", "denoised"} <= set(info)
        k = schedule.coefficients(info["t"], info["s"])
        assert info["sigma"] == pytest.approx(k.sigma_t / k.a_t, rel=1e-12)
        assert info["denoised"].shape == info["x"].shape == x_T.shape
    assert torch.equal(seen[-1]["x"], x)
    # the first step's denoised: E[x0 | x_T] = (x_T - sigma_t e1) / a_t, clamped to the data range
    k = schedule.coefficients(ts[0], ts[1])
    e1 = paper_oracle(x_T, torch.full((64,), ts[0]))[:, :1].double()
    expected = ((x_T.double() - k.sigma_t * e1) / k.a_t).clamp(-1, 1)
    torch.testing.assert_close(seen[0]["denoised"].double(), expected, rtol=1e-5, atol=1e-6)


def test_an_unreadable_gamma_table_is_one_line(tmp_path, capsys):
    """--gamma with a file that is no torch checkpoint: the loader's one-line error, not torch.load's traceback."""
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint at all, just bytes")
    with pytest.raises(SystemExit) as exit_:
        main(["sample", "--solver", "analytic-dpm", "--gamma", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "o"),
              "--quiet"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "bad.pt: cannot read this file" in err


class _UnknownScheduleModel(torch.nn.Module):
    """A model that says its training schedule was looked for and not found (as a bare diffusers UNet does)."""
    schedule_note = "no scheduler config"

    def forward(self, x, t):
        return torch.zeros_like(x).repeat(1, 3, 1, 1)


@pytest.mark.parametrize("entry", ["sample", "sdedit", "k-diffusion denoiser", "calibrate_heads"])
def test_the_unknown_schedule_warning_points_at_the_users_call(entry):
    """However deep each public entry reads the schedule, the warning names the user's line, not the library's."""
    from gms_kernels.integrations.k_diffusion import GMSDenoiser

    model, x = _UnknownScheduleModel(), torch.zeros(2, 1, 4, 4)
    calls = {"sample": lambda: gk.sample(model, (2, 1, 4, 4), steps=2, solver="ddpm", generator=0, progress=False),
             "sdedit": lambda: gk.sdedit(model, x, t0=500, steps=2, solver="ddpm", generator=0, progress=False),
             "k-diffusion denoiser": lambda: GMSDenoiser(model),
             "calibrate_heads": lambda: gk.calibrate_heads(model, x, timesteps=[500], draws=1, n_boot=100)}
    with pytest.warns(UserWarning, match="training schedule is unknown") as caught:
        calls[entry]()
    user_line = (__file__, calls[entry].__code__.co_firstlineno)
    assert [(w.filename, w.lineno) for w in caught if "training schedule" in str(w.message)] == [user_line]
