"""Check gms_kernels.eval.inception against pytorch-fid and torch-fidelity and write the test fixtures.

Not run by the tests: it needs the reference packages, which the default install cannot import
(their torchvision wheels do not load against the CPU torch). Put their source in one folder:

    pip install --no-deps --target /tmp/ref_pkgs pytorch-fid==0.3.0 torch-fidelity==0.4.0
    pip download --no-deps -d /tmp/tvwheel torchvision==0.29.1 && unzip -q -o /tmp/tvwheel/*.whl -d /tmp/ref_pkgs
    python python/make_inception_fixture.py --ref /tmp/ref_pkgs

Only torchvision's pure-Python ``models/inception.py`` is used (pytorch-fid subclasses its blocks);
its compiled ops are never loaded: the package is replaced by stubs below. The fixtures were made
with pytorch-fid 0.3.0, torch-fidelity 0.4.0, torchvision 0.29.1 (inception.py), torch 2.13.0+cpu.

On ``gk.inception.random_state_dict(seed)`` weights it runs both references and FIDInceptionV3
(both ``preprocess`` modes) on seeded images, in float64 and float32, prints the agreement, and
writes

- tests/data/inception_features.json: the seed recipe, the reference versions, the agreement and
  every 16th feature (plus each full vector's sum and norm) of the float64 reference outputs;
- tests/data/inception_weights_layout.txt: the weights file's keys and shapes, as the references'
  modules (into which the real file loads) have them.
"""
from __future__ import annotations

import argparse
import enum
import importlib.util
import json
import re
import sys
import tempfile
import types
from pathlib import Path

import torch

from gms_kernels import inception as gki

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
WEIGHTS_SEED, IMAGE_SEED, STRIDE = 0, 1, 16
VERSIONS = {"pytorch-fid": "0.3.0", "torch-fidelity": "0.4.0", "torchvision (models/inception.py only)": "0.29.1"}


def make_images(seed: int = IMAGE_SEED) -> torch.Tensor:
    """Two uint8 noise images [2, 3, 32, 32] (the fixture's inputs)."""
    return torch.randint(0, 256, (2, 3, 32, 32), generator=torch.Generator().manual_seed(seed)).to(torch.uint8)


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


class _WeightsEnum(enum.Enum):
    @classmethod
    def verify(cls, obj):
        return obj


def import_references(ref: Path):
    """pytorch_fid.inception and torch_fidelity.feature_extractor_inceptionv3 without compiled torchvision."""
    sys.path.insert(0, str(ref))
    # torchvision: just enough package around the real models/inception.py
    tv = _module("torchvision", __version__="0.29.1", __path__=[])
    _module("torchvision.transforms", __path__=[])
    _module("torchvision.transforms._presets", ImageClassification=object)
    _module("torchvision.utils", _log_api_usage_once=lambda obj: None)
    models = _module("torchvision.models", __path__=[])
    _module("torchvision.models._api", register_model=lambda *a, **k: (lambda f: f),
            Weights=lambda **k: types.SimpleNamespace(**k), WeightsEnum=_WeightsEnum)
    _module("torchvision.models._meta", _IMAGENET_CATEGORIES=[])
    _module("torchvision.models._utils", handle_legacy_interface=lambda **k: (lambda f: f),
            _ovewrite_named_param=lambda kw, name, value: kw.__setitem__(name, value))
    spec = importlib.util.spec_from_file_location("torchvision.models.inception",
                                                  ref / "torchvision" / "models" / "inception.py")
    inc = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = inc
    spec.loader.exec_module(inc)
    models.inception, models.inception_v3, tv.models = inc, inc.inception_v3, models
    import pytorch_fid.inception as pfid

    # torch_fidelity's __init__ imports torchvision datasets: use the submodules only
    _module("torch_fidelity", __path__=[str(ref / "torch_fidelity")])
    import torch_fidelity.feature_extractor_inceptionv3 as tfid

    return pfid, tfid


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", type=Path, required=True, help="folder with pytorch_fid, torch_fidelity, torchvision")
    ap.add_argument("--no-write", action="store_true", help="only check and print")
    args = ap.parse_args()
    pfid, tfid = import_references(args.ref)

    state = gki.random_state_dict(WEIGHTS_SEED)
    images = make_images()

    # pytorch-fid: its InceptionV3 fetches the weights by URL; hand it ours instead
    pfid.load_state_dict_from_url = lambda *a, **k: state
    ref_pf = pfid.InceptionV3([3]).eval()
    inner = pfid.fid_inception_v3()  # the module the real weights file is loaded into (strict)
    layout_pf = {k: tuple(v.shape) for k, v in inner.state_dict().items() if not k.endswith("num_batches_tracked")}

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.pth"
        torch.save(state, path)
        refs_tf = {dt: tfid.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"],
                                                         feature_extractor_weights_path=str(path),
                                                         feature_extractor_internal_dtype=dt)
                   for dt in ("float64", "float32")}
        ours = {mode: gki.load_fid_inception(path, mode) for mode in gki.PREPROCESSING}
    layout_tf = {k: tuple(v.shape) for k, v in refs_tf["float32"].state_dict().items()
                 if not k.endswith("num_batches_tracked")}
    assert layout_pf == layout_tf == gki.weights_layout(), "weights layouts differ"

    results, agreement = {}, {}
    with torch.no_grad():
        for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
            ref = {"pytorch-fid": ref_pf.to(dtype)(images.to(dtype) / 255)[0].flatten(1),
                   "torch-fidelity": refs_tf[name](images)[0]}  # (it returns float32 features)
            for mode in gki.PREPROCESSING:
                mine = ours[mode].to(dtype)(images)
                agreement.setdefault(mode, {})[name] = rel_err(mine, ref[mode])
                # another size, downscaling: not in the fixture, but checked here
                big = torch.randint(0, 256, (1, 3, 320, 304),
                                    generator=torch.Generator().manual_seed(2)).to(torch.uint8)
                ref_big = (ref_pf.to(dtype)(big.to(dtype) / 255)[0].flatten(1) if mode == "pytorch-fid"
                           else refs_tf[name](big)[0])
                agreement[mode][name + " (320x304 input)"] = rel_err(ours[mode].to(dtype)(big), ref_big)
                if name == "float64":
                    results[mode] = ref[mode].double()
            # the two references differ from each other by their preprocessing only
            agreement.setdefault("pytorch-fid vs torch-fidelity", {})[name] = rel_err(ref["pytorch-fid"],
                                                                                      ref["torch-fidelity"])
    print(json.dumps(agreement, indent=1))
    # torch-fidelity returns float32 features, and in float64 computes its resize coordinates in
    # float64 where TF (and FIDInceptionV3) use float32: its float64 agreement is ~3e-7, not ~1e-15
    for mode, tol64 in (("pytorch-fid", 1e-12), ("torch-fidelity", 1e-6)):
        assert agreement[mode]["float64"] < tol64 and agreement[mode]["float32"] < 1e-4, (mode, agreement[mode])
    if args.no_write:
        return

    fixture = {
        "about": "FID InceptionV3 pool features of make_images() on random_state_dict(weights_seed) weights, "
                 "computed in float64 by the reference packages (python/make_inception_fixture.py)",
        "reference_versions": {**VERSIONS, "torch": torch.__version__},
        "weights": f"gms_kernels.eval.inception.random_state_dict(seed={WEIGHTS_SEED})",
        "images": f"torch.randint(0, 256, (2, 3, 32, 32), generator=torch.Generator().manual_seed({IMAGE_SEED}))"
                  ".to(torch.uint8); pytorch-fid is given images / 255, torch-fidelity the uint8 images",
        "weights_seed": WEIGHTS_SEED, "image_seed": IMAGE_SEED,
        "feature_stride": STRIDE,
        "agreement_max_rel_err": agreement,
        "features": {mode: {"every_16th": [[float(f"{v:.12g}") for v in row[::STRIDE].tolist()] for row in f],
                            "sum": [float(f"{v:.12g}") for v in f.sum(1).tolist()],
                            "norm": [float(f"{v:.12g}") for v in f.norm(dim=1).tolist()]}
                     for mode, f in results.items()},
    }
    DATA.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fixture, indent=1)  # then one line per list of numbers
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    (DATA / "inception_features.json").write_text(text + "\n")
    (DATA / "inception_weights_layout.txt").write_text(
        f"# keys and shapes of {gki.WEIGHTS_FILE} (and {gki.TORCH_FIDELITY_WEIGHTS_FILE}), batch-norm step counters "
        f"(num_batches_tracked, optional) left out; from pytorch-fid {VERSIONS['pytorch-fid']} and "
        f"torch-fidelity {VERSIONS['torch-fidelity']}\n"
        + "".join(f"{k} {'x'.join(map(str, s))}\n" for k, s in layout_pf.items()))
    print("wrote", DATA / "inception_features.json", DATA / "inception_weights_layout.txt")


if __name__ == "__main__":
    main()
