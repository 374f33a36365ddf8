"""Training from data read batch by batch: image folders, Datasets and DataLoaders train exactly as the same
examples in one tensor; a run killed with SIGKILL resumes to the uninterrupted run's weights bit for bit (one
process, and two under torchrun); memory does not grow with the number of images."""
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import gms_kernels as gk
from gms_kernels.cli import main
from gms_kernels.core.data import ImageFolder
from gms_kernels.models import MomentNet, PytorchDDPMUNet
from gms_kernels.train.training import train_backbone, train_heads

N = 40  # images in the digits folder: 5 global batches of 8 per epoch


def _write_images(root: Path, u8: torch.Tensor, first: int = 0) -> Path:
    """uint8 [n, C, H, W] as PNG files {first:05d}.png, ... (sorted names: the tensor's order)."""
    root.mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(u8):
        Image.fromarray(img[0].numpy() if img.shape[0] == 1 else img.permute(1, 2, 0).numpy()).save(
            root / f"{first + i:05d}.png")
    return root


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    """(a folder of N 8x8 grey digit PNGs, the same images as one tensor in [-1, 1], read as v / 127.5 - 1)."""
    u8 = ((gk.data.digits("all")[0][:N] + 1) * 127.5).round().to(torch.uint8)
    return _write_images(tmp_path_factory.mktemp("digits") / "images", u8), u8.float() / 127.5 - 1


def _backbone(dropout=0.0):
    torch.manual_seed(0)
    return PytorchDDPMUNet(T=100, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=dropout, in_channels=1)


def _train(kind, data, steps=4, **kw):
    """(state_dict, loss history) after a few steps; the backbone with dropout, whose masks come from torch's global
    RNG: reading the data must not draw from it."""
    net = MomentNet(_backbone(), head="conv") if kind == "heads" else _backbone(dropout=0.1)
    torch.manual_seed(5)
    fit = train_heads if kind == "heads" else train_backbone
    res = fit(net, data, steps=steps, batch_size=8, lr=1e-3, ema_decay=0.5, seed=2, progress=False, **kw)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}, res.history


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


class _Labelled(Dataset):
    """(image, label) pairs: the labels are left aside."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i % 10


class _Recording(Dataset):
    """Records every index it is asked for."""

    def __init__(self, x):
        self.x, self.read = x, []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.read.append(i)
        return self.x[i]


INPUTS = {
    "folder": lambda root, x: str(root),
    "path": lambda root, x: root,
    "image-folder": lambda root, x: ImageFolder(root),
    "dataset-with-labels": lambda root, x: _Labelled(x),
    "loader": lambda root, x: DataLoader(TensorDataset(x), batch_size=3, shuffle=True),  # (its sampling unused)
    "loader-workers": lambda root, x: DataLoader(ImageFolder(root), num_workers=2),
}
_REFERENCE = {}


@pytest.mark.parametrize("form", INPUTS)
@pytest.mark.parametrize("kind", ["heads", "backbone"])
def test_every_input_form_trains_as_the_tensor_bit_for_bit(kind, form, digits_folder):
    root, x = digits_folder
    if kind not in _REFERENCE:
        _REFERENCE[kind] = _train(kind, x)
    state, history = _train(kind, INPUTS[form](root, x))
    _assert_equal(state, _REFERENCE[kind][0])
    assert history == _REFERENCE[kind][1] and len(history) == 4


@pytest.mark.parametrize("kind", ["heads", "backbone"])
def test_epoch_sampling_reads_a_folder_as_the_tensor(kind, digits_folder):
    root, x = digits_folder
    state, history = _train(kind, root, sampling="epochs")
    tensor_state, tensor_history = _train(kind, x, sampling="epochs")
    _assert_equal(state, tensor_state)
    assert history == tensor_history
    assert history != _train(kind, x)[1]  # (other batches than sampling with replacement)


def test_epoch_sampling_reads_every_example_once_per_epoch(digits_folder):
    data = _Recording(digits_folder[1])
    _train("backbone", data, steps=10, sampling="epochs")  # 80 examples: two epochs
    read = data.read[-80:]
    first, second = read[:N], read[N:]
    assert sorted(first) == sorted(second) == list(range(N)) and first != second
    with_replacement = _Recording(digits_folder[1])
    _train("backbone", with_replacement, steps=10)
    assert len(set(with_replacement.read[-80:])) < N  # (drawn with replacement: some repeat, some are missed)


def test_the_output_scale_estimate_reads_a_folder_as_the_tensor(digits_folder, small_scale_estimate):
    """loss_weighting / output_scale estimate the targets' size from a bounded number of examples, read here
    through the Dataset: the same table and weights as from the tensor."""
    root, x = digits_folder
    runs = [_train("heads", data, loss_weighting="normalized", output_scale=True) for data in (x, root)]
    _assert_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1] and "output_scale" in runs[0][0]


def test_image_folders_convert_channels_sizes_and_depths(tmp_path):
    rgb = torch.randint(0, 256, (3, 3, 4, 5), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    folder = _write_images(tmp_path / "rgb", rgb)
    (folder / "sub").mkdir()
    Image.fromarray(rgb[0].permute(1, 2, 0).numpy()).save(folder / "sub" / "z.jpg")
    (folder / ".hidden.png").write_bytes(b"")  # (hidden files and other suffixes are not images)
    (folder / "notes.txt").write_text("x")
    ds = ImageFolder(folder)
    assert ds.files == ["00000.png", "00001.png", "00002.png", "sub/z.jpg"] and ds.channels == 3
    assert ds[1].dtype == torch.float32 and torch.equal(ds[1], rgb[1].float() / 127.5 - 1)
    grey = ImageFolder(folder, channels=1)[2]
    luma = np.asarray(Image.fromarray(rgb[2].permute(1, 2, 0).numpy()).convert("L"))
    assert grey.shape == (1, 4, 5) and torch.equal(grey[0], torch.from_numpy(luma.copy()).float() / 127.5 - 1)
    deep = np.array([[0, 65535], [32768, 1000]], dtype=np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    v = ImageFolder(tmp_path, channels=3)  # (one 16-bit grey PNG at the top, the rgb folder below it)
    assert v.files[0] == "deep.png" and v[0].shape == (3, 2, 2)
    torch.testing.assert_close(v[0][2], torch.from_numpy(deep.astype(np.float32)) / 32767.5 - 1)
    Image.fromarray(rgb[0, 0, :2, :2].numpy()).save(folder / "small.png")
    mixed = ImageFolder(folder)
    assert mixed.files[3] == "small.png"
    with pytest.raises(ValueError, match="must share one size"):
        mixed[3]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no"):
        ImageFolder(tmp_path / "empty")
    with pytest.raises(NotADirectoryError):
        ImageFolder(tmp_path / "missing")
    with pytest.raises(ValueError, match="1 \\(grey\\) or 3"):
        ImageFolder(folder, channels=2)


class _Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(1, 8, 8)


def test_unusable_data_is_a_clear_error(digits_folder, tmp_path):
    root, x = digits_folder
    net = _backbone()
    for data, error, match in [
        (_Stream(), TypeError, "map-style Dataset"),
        ([torch.zeros(1, 8, 8, dtype=torch.uint8)], ValueError, "floating-point"),
        ([torch.zeros(3, 8, 8)], ValueError, "have 3 channels .* the model takes 1"),
        ([x[0], x[1, :, :4]], ValueError, "the first one's shape"),
        ([x[0], torch.full_like(x[0], float("nan"))], ValueError, "non-finite"),
        ([], ValueError, "empty"),
        (tmp_path / "missing", NotADirectoryError, "not a folder"),
    ]:
        with pytest.raises(error, match=match):  # (an epoch of batches of 1: every example is read)
            train_backbone(net, data, steps=2, batch_size=1, progress=False, sampling="epochs")
    with pytest.raises(ValueError, match="valid: replacement, epochs"):
        train_backbone(net, root, steps=1, progress=False, sampling="shuffle")
    train_backbone(net, root, steps=2, batch_size=8, progress=False, checkpoint=tmp_path / "c.pt")
    with pytest.raises(ValueError, match="written for 40 examples with sampling 'replacement', this run has 39"):
        train_backbone(net, x[:39], steps=4, batch_size=8, progress=False, checkpoint=tmp_path / "c.pt")
    with pytest.raises(ValueError, match="this run has 40 with 'epochs'"):
        train_backbone(net, root, steps=4, batch_size=8, progress=False, checkpoint=tmp_path / "c.pt",
                       sampling="epochs")


def test_train_commands_read_a_folder(digits_folder, tmp_path, capsys):
    root, x = digits_folder
    small = ["--steps", "2", "--batch-size", "8", "--quiet"]
    assert main(["train-backbone", "--data", str(root), *small, "--ch", "32", "--ch-mult", "1", "--attn",
                 "--num-res-blocks", "1", "--dropout", "0", "--out", str(tmp_path / "bb.pt")]) == 0
    torch.save(x, tmp_path / "x.pt")
    heads = ["train-heads", *small, "--model", str(tmp_path / "bb.pt"), "--sampling", "epochs"]
    assert main([*heads, "--data", str(root), "--workers", "1", "--out", str(tmp_path / "a.pt")]) == 0
    assert main([*heads, "--data", str(tmp_path / "x.pt"), "--out", str(tmp_path / "b.pt")]) == 0
    _assert_equal(gk.models.load(tmp_path / "a.pt").state_dict(), gk.models.load(tmp_path / "b.pt").state_dict())
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([*heads, "--data", str(root), "--workers", "-1"])
    assert exc.value.code == 2 and "--workers must be >= 0" in capsys.readouterr().err
    from gms_kernels.cli import _training_data

    assert torch.equal(_training_data(str(root)), x)  # (choose-options' --reference: a folder read whole)


# -- kill -9, then resume ---------------------------------------------------------------------------------------------

# Trains on an image folder with a checkpoint every 3 steps, once per NAME:PAUSE argument (checkpoint NAME.ckpt,
# pausing PAUSE seconds per step so that the test can kill it between checkpoints); as a plain script (one
# process) or under torchrun. Writes this process's id (to kill it) and, after each run, its final weights.
KILL_SCRIPT = '''
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from gms_kernels.integrations import distributed
from gms_kernels.core.data import ImageFolder
from gms_kernels.models import MomentNet, PytorchDDPMUNet
from gms_kernels.train.training import train_backbone, train_heads

kind, folder, out, sampling, workers = sys.argv[1:6]
out = Path(out)
started = distributed.init_from_env()
rank, world = distributed.world()
(out / f"pid{rank}").write_text(str(os.getpid()))


class Recording(ImageFolder):
    def __getitem__(self, i):
        self.read.append(i)
        return super().__getitem__(i)


for name, pause in (arg.split(":") for arg in sys.argv[6:]):
    torch.manual_seed(0)
    net = PytorchDDPMUNet(T=100, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0, in_channels=1)
    if kind == "heads":
        net = MomentNet(net, head="conv")
    data = Recording(folder)
    data.read = []
    train = train_heads if kind == "heads" else train_backbone
    train(net, DataLoader(data, num_workers=int(workers)) if int(workers) else data, steps=16, batch_size=8,
          lr=1e-3, ema_decay=0.5, seed=2, progress=False, checkpoint=out / f"{name}.ckpt", checkpoint_every=3,
          sampling=sampling, log=lambda record: time.sleep(float(pause)))
    torch.save({"state": net.state_dict(), "read": data.read}, out / f"{name}_rank{rank}.pt")
if started:
    torch.distributed.destroy_process_group()
'''
STEPS = 16
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _kill_after_checkpoint(proc, out, nproc, after=0.25, timeout=180):
    """SIGKILL the job (and under torchrun its workers) ``after`` seconds after the first checkpoint of its run
    "killed" exists."""
    deadline = time.monotonic() + timeout
    while not (out / "killed.ckpt").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.02)
    time.sleep(after)
    assert proc.poll() is None, "the run ended before it was killed"
    for rank in range(nproc):
        os.kill(int((out / f"pid{rank}").read_text()), signal.SIGKILL)
    if nproc > 1:  # (torchrun itself; its workers run in process groups of their own)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    state = _load(out / "killed.ckpt")
    assert 3 <= state["step"] < STEPS and state["step"] % 3 == 0
    return state


def _command(script, nproc, *args):
    if nproc == 1:
        return [sys.executable, str(script), *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(script),
            *args]


def _kill_and_resume(tmp_path, root, kind, sampling, workers, nproc):
    """One job runs the script straight, then again until it is killed; a second job resumes that run. Returns
    the output folder."""
    script = tmp_path / "kill_script.py"
    script.write_text(KILL_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    args = [kind, str(root), str(out), sampling, workers]
    job = subprocess.Popen(_command(script, nproc, *args, "straight:0", "killed:0.1"), env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ckpt = _kill_after_checkpoint(job, out, nproc)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
    assert all((out / f"straight_rank{rank}.pt").exists() for rank in range(nproc))
    assert not (out / "killed_rank0.pt").exists()
    if sampling == "epochs":  # the data position: (epoch, index in its order) after step * 8 examples
        assert ckpt["data"] == {"sampling": "epochs", "size": N, "seed": 2, "epoch": ckpt["step"] * 8 // N,
                                "index": ckpt["step"] * 8 % N}
    else:
        assert ckpt["data"] == {"sampling": "replacement", "size": N}
    res = subprocess.run(_command(script, nproc, *args, "killed:0"), env=ENV, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    left = (STEPS - ckpt["step"]) * 8 // nproc  # the examples of this rank's rows in the steps left
    for rank in range(nproc):
        a, b = _load(out / f"straight_rank{rank}.pt"), _load(out / f"killed_rank{rank}.pt")
        _assert_equal(a["state"], b["state"])
        if workers == "0":  # (workers read in their own processes) the first image, then each step's rows
            assert len(a["read"]) == 1 + STEPS * 8 // nproc and b["read"] == [0] + a["read"][-left:]
    return out


@pytest.mark.parametrize("kind, sampling, workers", [("heads", "epochs", "0"), ("backbone", "replacement", "2")])
def test_a_run_killed_with_sigkill_resumes_to_the_same_weights(kind, sampling, workers, digits_folder, tmp_path):
    """Killed between checkpoints (with DataLoader workers that had read ahead), then resumed from its last
    checkpoint: the final weights equal the uninterrupted run's bit for bit."""
    _kill_and_resume(tmp_path, digits_folder[0], kind, sampling, workers, 1)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_processes_read_their_own_rows_and_resume_after_sigkill(digits_folder, tmp_path):
    """Under torchrun (gloo, 2 CPU processes), from a folder: each rank reads only its half of every global batch
    (together the one-process run's batches), killed and resumed the run ends with the straight run's weights on
    every rank, and those match the one-process run's up to the order of float reductions."""
    root = digits_folder[0]
    out = _kill_and_resume(tmp_path, root, "heads", "epochs", "0", 2)
    one = tmp_path / "one"
    one.mkdir()
    saved = sys.argv
    sys.argv = [str(tmp_path / "kill_script.py"), "heads", str(root), str(one), "epochs", "0", "straight:0"]
    try:
        runpy.run_path(str(tmp_path / "kill_script.py"), run_name="__main__")
    finally:
        sys.argv = saved
    ref, r0, r1 = (_load(p) for p in (one / "straight_rank0.pt", out / "straight_rank0.pt", out / "straight_rank1.pt"))
    _assert_equal(r0["state"], r1["state"])
    for k, v in ref["state"].items():
        torch.testing.assert_close(r0["state"][k], v, rtol=1e-5, atol=1e-6)
    batches = torch.tensor(ref["read"][-STEPS * 8:]).reshape(STEPS, 8)  # (after the probe of the first image)
    halves = [torch.tensor(r["read"][-STEPS * 4:]).reshape(STEPS, 4) for r in (r0, r1)]
    assert torch.equal(torch.cat(halves, 1), batches)


# -- memory -----------------------------------------------------------------------------------------------------------

# Trains a small conv net for 20 steps on a folder of images (read batch by batch) and prints this process's peak
# resident memory (VmHWM, kB).
MEMORY_SCRIPT = '''
import sys
import torch
from torch import nn
from gms_kernels.core.data import ImageFolder
from gms_kernels.train.training import train_backbone


class Net(nn.Module):
    in_channels = 3

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x, t):
        return self.conv(x) * (1 + t.float()[:, None, None, None] / 1000)


torch.manual_seed(0)
train_backbone(Net(), ImageFolder(sys.argv[1]), steps=20, batch_size=32, progress=False, sampling="epochs")
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")][0])
'''


def _peak_kb(script, folder):
    res = subprocess.run([sys.executable, str(script), str(folder)], env=ENV, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return int(res.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_peak_memory_does_not_grow_with_the_number_of_images(tmp_path):
    """10,000 RGB 32x32 PNGs: as one float32 tensor they would take 123 MB, so 1,000 against 10,000 of them would
    differ by 110 MB; read batch by batch the peak resident memory differs by a file name and an index each."""
    u8 = torch.randint(0, 256, (10_000, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    _write_images(tmp_path / "images" / "a", u8[:1000])  # images/a: 1,000 of them; images: all 10,000
    _write_images(tmp_path / "images" / "b", u8[1000:], first=1000)
    del u8
    script = tmp_path / "memory.py"
    script.write_text(MEMORY_SCRIPT)
    small, large = _peak_kb(script, tmp_path / "images" / "a"), _peak_kb(script, tmp_path / "images")
    print(f"peak RSS: {small / 1024:.1f} MB for 1,000 images, {large / 1024:.1f} MB for 10,000")
    assert large - small < 20 * 1024, (small, large)


def test_a_resumed_run_with_dropout_draws_the_same_masks(digits_folder, tmp_path):
    """Dropout draws from torch's global RNG, which the checkpoint keeps: training 3 steps, then resuming to 6
    from the checkpoint (after other draws from the global RNG meanwhile) equals 6 steps in one go."""
    folder, _ = digits_folder

    def run(steps, checkpoint=None):
        net = _backbone(dropout=0.3)
        torch.manual_seed(5)
        train_backbone(net, folder, steps=steps, batch_size=8, lr=1e-3, ema_decay=0.5, seed=2, progress=False,
                       checkpoint=checkpoint, checkpoint_every=3)
        return {k: v.detach().clone() for k, v in net.state_dict().items()}

    whole = run(6)
    run(3, tmp_path / "ckpt.pt")
    torch.rand(100)  # (what else the process draws between the two runs)
    _assert_equal(run(6, tmp_path / "ckpt.pt"), whole)


def test_the_readme_training_example_runs(digits_folder, tmp_path):
    """The training example of docs/training.md, run on a folder of digits with a tiny eps network."""
    from readme_examples import example_file, readme_example

    block = readme_example("training")
    folder, _ = digits_folder
    work = tmp_path / "work"
    work.mkdir()
    for image in folder.iterdir():
        (work / image.name).write_bytes(image.read_bytes())
    scope = {"folder": work, "eps_net": _backbone(), "steps": 3}
    exec(compile(block, example_file("training"), "exec"), scope)
    loaded = gk.models.load(work / "gms_net.pt")
    x = gk.sample(loaded, shape=(2, 1, 8, 8), steps=2, generator=0, progress=False)
    assert x.shape == (2, 1, 8, 8) and bool(torch.isfinite(x).all())
