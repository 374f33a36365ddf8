"""Conditional networks through the diffusers side of the package: export / load / MomentNet pass the
condition to the network, a hand-written GMSScheduler loop (guided or not) equals gk.sample, head training on
labelled data, and the documented example."""
import warnings

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers import UNet2DConditionModel, UNet2DModel  # noqa: E402

import gms_kernels as gk  # noqa: E402
from readme_examples import example_file, readme_example  # noqa: E402
import gms_kernels.models as gm  # noqa: E402
from gms_kernels.model_io import guided_heads  # noqa: E402
from gms_kernels.models.diffusers_conditional import DiffusersConditionalUNet  # noqa: E402
from gms_kernels.models.diffusers_export import GMSDiffusersModel, export_diffusers  # noqa: E402
from conftest import quiet_pipe, randomize  # noqa: E402

NULL = 2  # the null label of the tiny class-conditional UNets (num_class_embeds = 2 classes + the null label)



def class_unet(out_channels=3, seed=0):
    torch.manual_seed(seed)
    return UNet2DModel(sample_size=8, in_channels=1, out_channels=out_channels, layers_per_block=1,
                       block_out_channels=(8, 16), norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"), num_class_embeds=3).eval()


def cross_attention_unet(out_channels=3, seed=0):
    torch.manual_seed(seed)
    return UNet2DConditionModel(sample_size=8, in_channels=1, out_channels=out_channels, layers_per_block=1,
                                block_out_channels=(8, 16), norm_num_groups=4,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=8,
                                attention_head_dim=2).eval()


def moment_net(seed=1):
    """A MomentNet (heads e2, e3 made nonzero) on a class-conditional eps UNet2DModel."""
    net = gm.MomentNet(class_unet(out_channels=1), orders=(2, 3))
    randomize(net.heads, seed=seed, scale=0.02)
    net.schedule = gk.Schedule.linear()
    return net.eval()


def labels():
    return torch.tensor([0, 1, 1, 0])



X = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(5))
T = torch.tensor([3, 400, 700, 999])


# -- 1. the condition reaches the network ---------------------------------------------------------------------------
def test_an_exported_class_conditional_unet_passes_its_labels(tmp_path):
    unet = randomize(class_unet(), seed=3)
    export_diffusers(unet, tmp_path / "bare")
    model = GMSDiffusersModel.from_pretrained(str(tmp_path / "bare"), subfolder="unet", local_files_only=True)
    loaded = gm.load(tmp_path / "bare")
    y = labels()
    with torch.no_grad():
        want = unet(X, T, class_labels=y).sample
        assert torch.equal(model(X, T, class_labels=y).sample, want)
        assert torch.equal(model(X, T, y).sample, want)  # (diffusers' positional order: sample, timestep, labels)
        assert torch.equal(loaded(X, T, class_labels=y), want)
        assert not torch.equal(model(X, T, class_labels=1 - y).sample, want)
    with pytest.raises(TypeError, match=r"needs class_labels: pass gk.sample\(\.\.\., model_kwargs="):
        model(X, T)


def test_an_unconditional_export_refuses_a_condition_and_names_it(tmp_path):
    plain = randomize(UNet2DModel(sample_size=8, in_channels=1, out_channels=3, layers_per_block=1,
                                  block_out_channels=(8, 16), norm_num_groups=4,
                                  down_block_types=("DownBlock2D", "DownBlock2D"),
                                  up_block_types=("UpBlock2D", "UpBlock2D")).eval())
    export_diffusers(plain, tmp_path / "plain")
    model = GMSDiffusersModel.from_pretrained(str(tmp_path / "plain"), subfolder="unet", local_files_only=True)
    with pytest.raises(ValueError, match="unconditional, so it takes no class_labels, encoder_hidden_states"):
        model(X, T, class_labels=labels(), encoder_hidden_states=torch.zeros(4, 3, 8))


def test_the_loader_gives_wrappers_that_take_the_condition(tmp_path):
    cls, cross = randomize(class_unet(), seed=4), randomize(cross_attention_unet(), seed=5)
    cls.save_pretrained(tmp_path / "cls")
    cross.save_pretrained(tmp_path / "cross")
    states = torch.randn(4, 3, 8, generator=torch.Generator().manual_seed(2))
    a, b = gm.load(tmp_path / "cls"), gm.load(tmp_path / "cross")
    assert isinstance(a, gm.DiffusersUNet) and a.conditional and isinstance(b, DiffusersConditionalUNet)
    with torch.no_grad():
        assert torch.equal(a(X, T, class_labels=labels()), cls(X, T, class_labels=labels()).sample)
        assert torch.equal(b(X, T, encoder_hidden_states=states), cross(X, T, encoder_hidden_states=states).sample)
    with pytest.raises(TypeError, match="is class-conditional .* needs class_labels"):
        a(X, T)


def test_a_moment_net_passes_the_condition_to_its_backbone(tmp_path):
    net = moment_net()
    y = labels()
    with torch.no_grad():
        out = net(X, T, class_labels=y)
        assert out.shape == (4, 3, 8, 8)
        assert torch.equal(out[:, :1], net.backbone.unet(X, T, class_labels=y).sample)
        assert not torch.equal(net(X, T, class_labels=1 - y)[:, 1:], out[:, 1:])  # (the heads see the class too)
        export_diffusers(net, tmp_path / "mn")
        reloaded = GMSDiffusersModel.from_pretrained(str(tmp_path / "mn"), subfolder="unet", local_files_only=True)
        assert torch.equal(reloaded(X, T, class_labels=y).sample, out)
        assert torch.equal(gm.load(tmp_path / "mn")(X, T, class_labels=y), out)
    with pytest.raises(TypeError, match="needs class_labels"):
        net(X, T)


def test_a_bare_unet2dconditionmodel_exports_and_reloads_with_its_outputs(tmp_path):
    unet = randomize(cross_attention_unet(), seed=6)
    export_diffusers(unet, tmp_path / "cross")
    model = GMSDiffusersModel.from_pretrained(str(tmp_path / "cross"), subfolder="unet", local_files_only=True)
    states = torch.randn(4, 3, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(model(X, T, encoder_hidden_states=states).sample,
                           unet(X, T, encoder_hidden_states=states).sample)


# -- 2. a hand-written GMSScheduler loop is gk.sample ---------------------------------------------------------------
def _loop(net, sch, x, steps, seed, **kwargs):
    sch.set_timesteps(timesteps=gk.trajectory(sch.schedule, steps, "even"))
    with torch.no_grad():
        for t in sch.timesteps:
            out = net(x, t, **kwargs).sample
            x = sch.step(out, t, x, generator=seed).prev_sample
    return x


@pytest.mark.parametrize("kind", ["bare", "moment-net"])
def test_the_scheduler_loop_on_an_exported_class_conditional_network_is_gk_sample(tmp_path, kind):
    net = randomize(class_unet(), seed=7) if kind == "bare" else moment_net()
    export_diffusers(net, tmp_path / kind)
    pipe = quiet_pipe(tmp_path / kind)
    y = labels()
    got = _loop(pipe.unet, pipe.scheduler, X, 4, 11, class_labels=y)
    with torch.no_grad():
        want = gk.sample(pipe.unet, x_T=X, trajectory=gk.trajectory(pipe.scheduler.schedule, 4, "even"),
                         model_kwargs={"class_labels": y}, generator=11, progress=False)
        assert torch.equal(got, want)
        assert torch.isfinite(got).all() and not torch.equal(got, gk.sample(
            pipe.unet, x_T=X, steps=4, model_kwargs={"class_labels": 1 - y}, generator=11, progress=False))


def test_the_scheduler_loop_on_a_unet2dconditionmodel_is_gk_sample():
    unet = randomize(cross_attention_unet(), seed=8)
    sch = gk.GMSScheduler()
    states = torch.randn(4, 3, 8, generator=torch.Generator().manual_seed(4))
    got = _loop(unet, sch, X, 3, 12, encoder_hidden_states=states)
    with torch.no_grad():
        want = gk.sample(unet, x_T=X, trajectory=gk.trajectory(sch.schedule, 3, "even"), schedule=sch.schedule,
                         model_kwargs={"encoder_hidden_states": states}, generator=12, progress=False)
    assert torch.equal(got, want) and torch.isfinite(got).all()


def test_the_guided_scheduler_loop_is_gk_sample_with_guidance_scale(tmp_path):
    """As the scheduler's docstring says: both branches in one batched call, then guided_heads, then step."""
    export_diffusers(moment_net(), tmp_path / "mn")
    pipe = quiet_pipe(tmp_path / "mn")
    net, sch, y, w, n = pipe.unet, pipe.scheduler, labels(), 3.0, 4
    sch.set_timesteps(timesteps=gk.trajectory(sch.schedule, 4, "even"))
    x = X
    with torch.no_grad():
        for t in sch.timesteps:
            both = net(torch.cat([x, x]), t, class_labels=torch.cat([y, torch.full_like(y, NULL)])).sample
            heads = guided_heads(both[:n], both[n:], w, 3)
            x = sch.step(heads, t, x, generator=13).prev_sample
        want = gk.sample(net, x_T=X, trajectory=gk.trajectory(sch.schedule, 4, "even"),
                         model_kwargs={"class_labels": y}, guidance_scale=w,
                         null_kwargs={"class_labels": torch.tensor(NULL)}, generator=13, progress=False)
        plain = gk.sample(net, x_T=X, steps=4, model_kwargs={"class_labels": y}, generator=13, progress=False)
    assert torch.equal(x, want) and torch.isfinite(x).all() and not torch.equal(x, plain)


# -- 3. head training on labelled data ------------------------------------------------------------------------------
def labelled_data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 1, 8, 8, generator=g) * 2 - 1
    return torch.utils.data.TensorDataset(images, torch.arange(n) % 2)  # (labels 0, 1; never the null label)


def spy_labels(net):
    """The class_labels of every call of the backbone's UNet."""
    seen = []
    net.backbone.unet.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["class_labels"].clone()),
                                                with_kwargs=True)
    return seen


TRAIN = dict(batch_size=8, lr=1e-3, progress=False, seed=3, ema_decay=0.5)


def test_conditional_head_training_passes_the_labels_and_drops_the_drawn_share():
    data, p, steps = labelled_data(), 0.3, 12
    net = moment_net()
    seen = spy_labels(net)
    result = gk.train_heads(net, data, steps=steps, condition_dropout=p, null_label=NULL, **TRAIN)
    assert result.steps == steps and all(torch.isfinite(torch.tensor(r["mse_e2"])) for r in result.history)
    # the training generator's draws, in their order: indices, times, noise, then the dropout mask
    g = torch.Generator().manual_seed(TRAIN["seed"])
    want = []
    for _ in range(steps):
        idx = torch.randint(0, len(data), (8,), generator=g)
        torch.randint(0, 1000, (8,), generator=g)
        torch.randn((8, 1, 8, 8), generator=g)
        drop = torch.rand(8, generator=g) < p
        want.append(torch.where(drop, NULL, data.tensors[1][idx]))
    assert len(seen) == steps and all(torch.equal(a, b) for a, b in zip(seen, want))
    share = float((torch.cat(seen) == NULL).double().mean())
    assert 0.15 < share < 0.45  # (96 labels at p = 0.3)
    with torch.no_grad():  # the trained heads read the class
        assert not torch.equal(net(X, T, class_labels=labels())[:, 1:], net(X, T, class_labels=1 - labels())[:, 1:])


def test_a_conditional_network_gets_its_labels_without_dropout_and_a_custom_key():
    net = moment_net()
    seen = spy_labels(net)
    gk.train_heads(net, labelled_data(), steps=2, **TRAIN)  # (a conditional net: labels as class_labels by itself)
    assert len(seen) == 2 and all(set(s.tolist()) <= {0, 1} for s in seen)

    calls = []

    class Keyed(torch.nn.Module):  # a network whose condition has another name
        def __init__(self):
            super().__init__()
            self.net = moment_net()
            self.schedule, self.channels = self.net.schedule, 1

        def forward(self, x, t, label=None):
            calls.append(label)
            return self.net(x, t, class_labels=label)

    gk.train_heads(Keyed(), labelled_data(), steps=1, label_key="label", **TRAIN)
    assert len(calls) == 1 and calls[0].shape == (8,)


def test_resuming_a_conditional_run_equals_the_straight_run(tmp_path):
    data, kw = labelled_data(), dict(condition_dropout=0.5, null_label=NULL, **TRAIN)
    straight = moment_net()
    gk.train_heads(straight, data, steps=6, **kw)
    first, ck = moment_net(), tmp_path / "ck.pt"
    gk.train_heads(first, data, steps=3, checkpoint=ck, checkpoint_every=3, **kw)
    resumed = moment_net()
    result = gk.train_heads(resumed, data, steps=6, checkpoint=ck, checkpoint_every=3, **kw)
    assert result.steps == 6
    for (name, a), b in zip(straight.heads.state_dict().items(), resumed.heads.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="written with condition_dropout=0.5, this run has 0.25"):
        gk.train_heads(moment_net(), data, steps=8, checkpoint=ck, **(kw | dict(condition_dropout=0.25)))


@pytest.mark.parametrize("change, error, match", [
    (dict(condition_dropout=0.2), ValueError, "give it \\(e.g. null_label=num_classes"),
    (dict(condition_dropout=1.5, null_label=NULL), ValueError, "condition_dropout must be a probability in \\[0, 1\\]"),
    (dict(null_label="none"), TypeError, "null_label must be an int label or a tensor, got str"),
    (dict(label_key="class labels"), ValueError, "label_key must be the name of the network's keyword argument"),
])
def test_bad_label_arguments_are_named(change, error, match):
    with pytest.raises(error, match=match):
        gk.train_heads(moment_net(), labelled_data(), steps=1, **(TRAIN | change))


def test_a_conditional_network_on_data_without_labels_is_told_what_to_pass():
    images = labelled_data().tensors[0]
    with pytest.raises(ValueError, match=r"tensor without them: pass torch.utils.data.TensorDataset\(images, labels\)"):
        gk.train_heads(moment_net(), images, steps=1, **TRAIN)
    with pytest.raises(ValueError, match=r"reads \(image, label\) items, but the data gives a 1-tuple"):
        gk.train_heads(moment_net(), torch.utils.data.TensorDataset(images), steps=1, **TRAIN)


# -- 4. the documented example ------------------------------------------------------------------------------------
def test_the_readme_example_runs():
    code = readme_example("conditional")
    assert "steps=2000" in code
    code = code.replace("steps=2000", "steps=2")  # (a tiny run of the same calls)
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16),
                       norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"), num_class_embeds=11).eval()
    data = labelled_data(16)
    scope = {"unet": unet, "images": data.tensors[0], "labels": torch.arange(16) % 10}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the tiny UNet comes with no training schedule)
        exec(compile(code, example_file("conditional"), "exec"), scope)
    assert scope["samples"].shape == (4, 1, 8, 8) and bool(torch.isfinite(scope["samples"]).all())
    assert any(p.abs().sum() > 0 for p in scope["net"].heads.parameters())  # (the heads were trained)
