"""GMSScheduler refuses bad input at its public entry points with an error that names the argument, what was
given and what is accepted, instead of a silent wrong result or an error from deep inside torch or diffusers."""
import json

import numpy as np
import pytest
import torch
from diffusers.models.unets.unet_2d import UNet2DOutput

import gms_kernels as gk
from gms_kernels.solvers.gms import check_skew_scale
from gms_kernels.integrations.scheduler import GMSScheduler

C, H, W = 3, 4, 5


def heads(n=2, k=3, seed=0):
    """A plausible [e1, e2, e3] output: e2 >= e1^2."""
    g = torch.Generator().manual_seed(seed)
    e1 = torch.randn(n, C, H, W, generator=g) * 0.8
    e2 = e1**2 + torch.rand(n, C, H, W, generator=g) * 0.5
    e3 = e1**3 + torch.randn(n, C, H, W, generator=g) * 0.3
    return torch.cat([e1, e2, e3][:k], dim=1)


def x_at(n=2, seed=1):
    return torch.randn(n, C, H, W, generator=torch.Generator().manual_seed(seed))


def ready(**kwargs) -> GMSScheduler:
    s = GMSScheduler(backend="torch", **kwargs)
    s.set_timesteps(3)
    return s


# -- step: the sample ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_step_refuses_a_non_float_sample(dtype):
    s = ready()
    with pytest.raises(TypeError, match=r"sample must be a floating-point tensor, got torch\.(int64|int32|bool)"):
        s.step(heads(), s.timesteps[0], x_at().to(dtype))


def test_step_refuses_a_sample_that_is_not_a_tensor():
    s = ready()
    with pytest.raises(TypeError, match="sample must be a torch tensor"):
        s.step(heads(), s.timesteps[0], x_at().numpy())


# -- step: the model output ------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [UNet2DOutput(sample=heads()), None, (heads(),)], ids=["UNet2DOutput", "None", "tuple"])
def test_step_refuses_a_model_output_that_is_not_a_tensor(bad):
    s = ready()
    with pytest.raises(TypeError, match=r"model_output must be a tensor.*got (UNet2DOutput|None|tuple).*"
                                        r"unet\(\.\.\.\)\.sample"):
        s.step(bad, s.timesteps[0], x_at())


def test_step_refuses_an_integer_model_output():
    s = ready()
    with pytest.raises(TypeError, match=r"model_output must be a floating-point tensor, got torch\.int64"):
        s.step(heads().long(), s.timesteps[0], x_at())


# -- step: the timestep ----------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["a", None, float("nan"), True, [999], torch.tensor(True)],
                         ids=["str", "None", "nan", "bool", "list", "bool-tensor"])
def test_step_refuses_a_timestep_that_is_not_a_time_index(bad):
    s = ready()
    with pytest.raises((TypeError, ValueError), match=r"timestep must be an integer time index.*got"):
        s.step(heads(), bad, x_at())


def test_step_still_takes_plain_numpy_and_integral_float_timesteps():
    s = ready()
    t = int(s.timesteps[0])
    want = s.step(heads(), t, x_at(), generator=0).prev_sample
    for same in (np.int64(t), float(t), torch.tensor(t), torch.tensor(float(t))):
        assert torch.equal(s.step(heads(), same, x_at(), generator=0).prev_sample, want)


# -- set_timesteps --------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [[999.5, 10.2], [999, 10.2], [999, float("nan")], [999, None], ["999", "10"],
                                 torch.tensor([999.5, 10.0]), np.array([999.5, 10.0]), [999, True]],
                         ids=["fractions", "one-fraction", "nan", "None", "strings", "float-tensor",
                              "numpy-fractions", "bool"])
def test_set_timesteps_refuses_values_that_are_not_integers(bad):
    s = GMSScheduler()
    with pytest.raises(ValueError, match=r"timesteps\[\d\] must be an integer time index.*got"):
        s.set_timesteps(timesteps=bad)
    assert s.timesteps.tolist() == list(range(999, -1, -1))  # unchanged


@pytest.mark.parametrize("bad", ["a", 5, {999: 1}], ids=["str", "int", "dict"])
def test_set_timesteps_refuses_timesteps_that_are_not_a_sequence(bad):
    with pytest.raises(ValueError, match=r"timesteps must be a sequence of integer time indices.*got"):
        GMSScheduler().set_timesteps(timesteps=bad)


@pytest.mark.parametrize("good", [[999, 10], [np.int64(999), np.int32(10)], np.array([999, 10]),
                                  torch.tensor([999, 10]), torch.tensor([999, 10], dtype=torch.int32),
                                  (999.0, 10.0), torch.tensor([999.0, 10.0])],
                         ids=["ints", "numpy-ints", "numpy-array", "tensor", "int32-tensor", "integral-floats",
                              "integral-float-tensor"])
def test_set_timesteps_takes_integers_in_any_form(good):
    s = GMSScheduler()
    s.set_timesteps(timesteps=good)
    assert s.timesteps.tolist() == [999, 10] and s.timesteps.dtype == torch.long


@pytest.mark.parametrize("bad", ["a", 4.5, True, float("nan"), [4]], ids=["str", "fraction", "bool", "nan", "list"])
def test_set_timesteps_refuses_a_count_that_is_not_an_integer(bad):
    with pytest.raises(ValueError, match=r"num_inference_steps must be an integer in \[1, 1000\].*got"):
        GMSScheduler().set_timesteps(bad)


@pytest.mark.parametrize("bad", [0, -3, 1001])
def test_set_timesteps_refuses_a_count_out_of_range(bad):
    with pytest.raises(ValueError, match=rf"num_inference_steps must be an integer in \[1, 1000\].*got {bad}"):
        GMSScheduler().set_timesteps(bad)


# -- set_timesteps: the device ---------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_set_timesteps_on_cuda_without_cuda_says_so(device):
    s = GMSScheduler()
    with pytest.raises(ValueError, match=r"device=.*cuda.*CUDA is not available here; available here: 'cpu'"):
        s.set_timesteps(10, device=device)
    assert len(s.timesteps) == 1000  # unchanged


def test_set_timesteps_refuses_a_cuda_index_the_machine_lacks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (checked before anything is put there)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    s = GMSScheduler()
    with pytest.raises(ValueError, match=r"device='cuda:2': this machine has 2 CUDA device\(s\); available here: "
                                         r"'cpu', 'cuda:0', 'cuda:1'"):
        s.set_timesteps(10, device="cuda:2")
    with pytest.raises(ValueError, match=r"device=2: this machine has 2 CUDA"):
        s.set_timesteps(10, device=2)
    assert len(s.timesteps) == 1000  # unchanged


@pytest.mark.parametrize("device", ["gpu", "cpu0", 3.5, [0], True])
def test_set_timesteps_refuses_a_nonsense_device(device):
    with pytest.raises((TypeError, ValueError), match=r"device(=| must be ).*available here: 'cpu'"):
        GMSScheduler().set_timesteps(10, device=device)


def test_set_timesteps_takes_the_cpu_in_any_form():
    s = GMSScheduler()
    for device in ("cpu", torch.device("cpu"), None):
        s.set_timesteps(4, device=device)
        assert s.timesteps.device.type == "cpu" and len(s.timesteps) == 4


# -- constructor ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [2.5, 0, -1, True, "1000", None], ids=["float", "zero", "negative", "bool", "str",
                                                                       "None"])
def test_num_train_timesteps_must_be_a_positive_integer(bad):
    with pytest.raises((TypeError, ValueError), match=rf"num_train_timesteps must be a positive integer.*got {bad!r}"):
        GMSScheduler(num_train_timesteps=bad)


def test_num_train_timesteps_takes_a_numpy_integer_and_stores_an_int(tmp_path):
    s = GMSScheduler(num_train_timesteps=np.int64(50))
    assert type(s.config.num_train_timesteps) is int and len(s.timesteps) == 50
    s.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "scheduler_config.json").read_text())["num_train_timesteps"] == 50


@pytest.mark.parametrize("bad", [[1, 2], "gamma", 3, (("lr", 0.1),)], ids=["list", "str", "int", "pairs"])
def test_solver_options_must_be_a_dict(bad):
    with pytest.raises(TypeError, match=r"solver_options must be a dict .* or None, got"):
        GMSScheduler(solver_options=bad)


def test_solver_options_keys_must_be_option_names():
    with pytest.raises(TypeError, match=r"solver_options' keys must be option names \(strings\).*got 1"):
        GMSScheduler(solver_options={1: 2})


# -- skew_scale per step through the config ----------------------------------------------------------
TS = [900, 500, 100]
SKEW = {900: 0.25, 500: 0.5, 100: 0.75}


def sample_with(s: GMSScheduler) -> torch.Tensor:
    s.set_timesteps(timesteps=TS)
    x = x_at()
    for i, t in enumerate(s.timesteps):
        x = s.step(heads(seed=i), t, x, generator=7 + i).prev_sample
    return x


def reference_sample() -> torch.Tensor:
    schedule, x = gk.Schedule.linear(1000), x_at()
    for i, t in enumerate(TS):
        nxt = TS[i + 1] if i + 1 < len(TS) else gk.DATA
        x = gk.step(x, heads(seed=i), t, nxt, schedule, "gms", 7 + i, backend="torch", skew_scale=SKEW)
    return x


@pytest.mark.parametrize("keys", ["int", "str", "numpy"])
def test_skew_scale_per_step_round_trips_through_save_pretrained(keys, tmp_path):
    skew = {{"int": int, "str": str, "numpy": np.int64}[keys](t): v for t, v in SKEW.items()}
    a = GMSScheduler(backend="torch", solver_options={"skew_scale": skew})
    assert check_skew_scale(a._options.skew_scale) == SKEW  # the steps read the keys as int t
    a.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "scheduler_config.json").read_text())
    assert saved["solver_options"]["skew_scale"] == {str(t): v for t, v in SKEW.items()}
    b = GMSScheduler.from_pretrained(tmp_path)
    assert check_skew_scale(b._options.skew_scale) == SKEW
    want = reference_sample()
    assert not torch.equal(want, sample_with(GMSScheduler(backend="torch")))  # the factors do change the samples
    assert torch.equal(sample_with(a), want)
    assert torch.equal(sample_with(b), want)


@pytest.mark.parametrize("bad, match", [
    ({"t500": 0.5}, r"skew_scale's keys must be time indices"),
    ({"-5": 0.5}, r"skew_scale's keys must be time indices"),
    ({"500.5": 0.5}, r"skew_scale's keys must be time indices"),
    ({500: 0.5, "500": 0.25}, r"skew_scale has two factors for t=500"),
])
def test_skew_scale_refuses_keys_that_are_not_time_indices(bad, match):
    with pytest.raises(ValueError, match=match):
        GMSScheduler(solver_options={"skew_scale": bad})


# -- add_noise ------------------------------------------------------------------------------------
@pytest.mark.parametrize("noise", [x_at(3), x_at(1), x_at(2)[:, :1], x_at(2).flatten(1)],
                         ids=["batch-3", "batch-1", "channels", "flat"])
def test_add_noise_refuses_noise_of_another_shape(noise):
    with pytest.raises(ValueError, match=r"noise must be a floating-point tensor shaped like original_samples "
                                         r"\(2, 3, 4, 5\), got .*\("):
        GMSScheduler().add_noise(x_at(2), noise, torch.tensor([10, 20]))


@pytest.mark.parametrize("noise", [None, x_at(2).numpy(), x_at(2).long()], ids=["None", "numpy", "int64"])
def test_add_noise_refuses_noise_that_is_not_a_float_tensor(noise):
    with pytest.raises(ValueError, match=r"noise must be a floating-point tensor shaped like original_samples "
                                         r"\(2, 3, 4, 5\), got"):
        GMSScheduler().add_noise(x_at(2), noise, torch.tensor([10, 20]))


@pytest.mark.parametrize("bad", [None, x_at(2).long(), x_at(2).numpy()], ids=["None", "int64", "numpy"])
def test_add_noise_refuses_original_samples_that_are_not_a_float_tensor(bad):
    with pytest.raises(TypeError, match=r"original_samples must be a"):
        GMSScheduler().add_noise(bad, x_at(2), torch.tensor([10, 20]))
