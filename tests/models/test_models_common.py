"""The loaders' shared helpers (gms_kernels/models/_common.py): reading torch and safetensors files with
their error texts, state-dict mismatch reports, GroupNorm32 and the group count."""

import pickle
import re
import warnings

import pytest
import torch
from torch import nn

import gms_kernels.models as gm
from gms_kernels.models import _common
from gms_kernels.models._common import GroupNorm32


def test_unreadable_message_names_the_error_type_and_the_inner_unpickler_error(tmp_path):
    """The ValueError for an unreadable file names the exception type and, for a weights-only unpickler
    error, only its inner reason (not torch's long preamble)."""
    path = tmp_path / "bad.pt"
    path.write_bytes(b"not a checkpoint at all")
    err = pickle.UnpicklingError("Weights only load failed. A long preamble about torch 2.6. "
                                 "WeightsUnpickler error: Unsupported operand 149\n\nCheck the file.")
    text = str(_common._unreadable(str(path), 23, err))
    assert "(23 bytes; UnpicklingError: Unsupported operand 149)" in text
    assert "preamble" not in text
    assert "Unsupported operand 149): it is truncated, corrupted or not a torch checkpoint. Download or save" in text
    # a real truncated torch zip file: torch's RuntimeError is named, with the truncation hint
    torch.save({"w": torch.ones(64)}, tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"bytes; RuntimeError: PytorchStreamReader.*looks truncated"):
        _common.read_torch_file(tmp_path / "cut.pt")


def test_a_long_shape_list_is_cut_at_eight_with_the_rest_counted():
    shapes = [(f"k{i}", [i], [i + 1]) for i in range(11)]
    text = _common.mismatch_message("head:", [], [], shapes, "fix it")
    assert "wrong shapes (11): k0: expected [0], found [1]; " in text
    assert text.count("expected") == 8 and "k7: expected [7], found [8]; ... (3 more)" in text
    assert "more)" not in _common.mismatch_message("head:", [], [], shapes[:8], "fix it")


def test_group_count_and_the_moment_heads_group_norm():
    """group_count: the largest divisor of the width that is <= 32; the conv head normalises over that
    many groups (checked against a hand-written GroupNorm -> SiLU -> conv)."""
    from gms_kernels.models._common import group_count

    assert [group_count(c) for c in (1, 7, 16, 32, 33, 48, 64, 96, 100)] == [1, 7, 16, 32, 11, 24, 32, 32, 25]
    head = gm.ConvHead(48, 3)
    assert head.norm.num_groups == 24
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    h = torch.randn(2, 48, 4, 4, generator=g, dtype=torch.float64)
    head = head.double()
    grouped = h.reshape(2, 24, -1)
    normed = ((grouped - grouped.mean(-1, keepdim=True)) / (grouped.var(-1, unbiased=False, keepdim=True)
                                                            + head.norm.eps).sqrt()).reshape(h.shape)
    normed = normed * head.norm.weight[:, None, None] + head.norm.bias[:, None, None]
    expected = torch.nn.functional.conv2d(normed * torch.sigmoid(normed), head.conv.weight, head.conv.bias, padding=1)
    with torch.no_grad():
        torch.testing.assert_close(head(h), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_group_norm32_of_a_half_precision_module_normalises_in_float32(dtype):
    """A 16-bit GroupNorm32 (weights and input in 16 bits) computes in float32 and returns 16 bits: the
    result is the float32 normalisation of the 16-bit input, rounded once."""
    norm = _common.GroupNorm32(2, 4)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.5, -0.5, 2.0, 0.25]))
        norm.bias.copy_(torch.tensor([0.1, 0.2, -0.3, 0.0]))
    norm = norm.to(dtype)
    x = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    g = x.float().reshape(2, 2, -1)
    ref = ((g - g.mean(-1, keepdim=True)) / (g.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()).reshape(x.shape)
    ref = ref * norm.weight.float()[:, None, None] + norm.bias.float()[:, None, None]
    out = norm(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.to(dtype).float(), rtol=0, atol=float(torch.finfo(dtype).eps) * 4)


def test_an_unreadable_safetensors_file_reports_its_size(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match=r"bad\.safetensors: cannot read this file as a torch checkpoint \(10 bytes; "
                                         r"SafetensorError: Error while deserializing header"):  # (safetensors' reason)
        _common.read_weights_file(bad)


def test_a_refusal_without_a_named_global_says_so(tmp_path, monkeypatch):
    """torch's weights-only refusals that name no global (e.g. an object it cannot build) are reported as
    "something other than plain data", not by reading a class name that is not there."""
    torch.save({"w": torch.zeros(1)}, tmp_path / "odd.pt")
    refusal = pickle.UnpicklingError("Weights only load failed. WeightsUnpickler error: Can only build Tensor, "
                                     "Parameter, OrderedDict or types allowlisted via add_safe_globals, but got X")

    def refuse(*args, **kwargs):
        raise refusal

    monkeypatch.setattr(_common.torch, "load", refuse)
    with pytest.raises(ValueError, match=r"odd\.pt: the checkpoint holds something other than plain data that "
                                         r"torch\.load\(weights_only=True\) refuses"):
        _common.read_torch_file(tmp_path / "odd.pt")


def test_a_safetensors_file_read_with_no_map_location_lands_on_the_cpu(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.arange(3.0)}, str(tmp_path / "w.safetensors"))
    data = _common.read_weights_file(tmp_path / "w.safetensors", map_location=None)
    assert data["w"].device.type == "cpu" and data["w"].tolist() == [0.0, 1.0, 2.0]


def test_a_mismatch_report_shows_eight_wrong_shapes_and_counts_the_rest():
    shapes = [(f"k{i}", [i], [i + 1]) for i in range(9)]
    text = _common.mismatch_message("head:", [], [], shapes, "do this")
    assert "  wrong shapes (9): k0: expected [0], found [1]; " in text and text.endswith("; ... (1 more)\n  fix: do this")
    assert "more" not in _common.mismatch_message("head:", [], [], shapes[:8], "do this")


def test_read_weights_file_passes_map_location_to_torch_load(tmp_path):
    """A torch file is read with the caller's map_location (here a function, which torch.load calls once
    per storage), not with the default."""
    torch.save({"w": torch.ones(3)}, tmp_path / "w.pt")
    seen = []

    def where(storage, location):
        seen.append(location)
        return storage

    assert torch.equal(_common.read_weights_file(tmp_path / "w.pt", map_location=where)["w"], torch.ones(3))
    assert seen == ["cpu"]


def test_a_state_dict_mismatch_counts_the_keys_it_leaves_out():
    """Past the first 8, the report says how many more keys are missing: 11 - 8 = 3."""
    net = torch.nn.Sequential(*[torch.nn.Linear(1, 1, bias=False) for _ in range(11)])
    text = str(_common.mismatch_message("net:", *_common.mismatch_report(net, {}), "fix it"))
    assert "missing keys (11): 0.weight, 1.weight, 2.weight, 3.weight, 4.weight, 5.weight, 6.weight, 7.weight, " \
           "... (3 more)" in text


def test_read_weights_file_reads_safetensors_with_safetensors(tmp_path, monkeypatch):
    """A .safetensors file goes to safetensors' reader, never to torch.load: torch.load reads that format only
    since torch 2.13 (where it hands the file to safetensors itself), and the package supports torch >= 2.1."""
    from safetensors.torch import save_file

    save_file({"w": torch.arange(3.0)}, str(tmp_path / "w.safetensors"))

    def no_torch_load(*args, **kwargs):
        raise AssertionError("torch.load was called on a .safetensors file")

    monkeypatch.setattr(torch, "load", no_torch_load)
    assert torch.equal(_common.read_weights_file(tmp_path / "w.safetensors")["w"], torch.arange(3.0))


def test_an_unreadable_file_whose_error_has_no_text_is_named_by_the_error_type(tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(b"\x00" * 10)
    assert "(10 bytes; EOFError)" in str(_common._unreadable(str(path), 10, EOFError()))


def test_an_empty_checkpoint_file_is_called_empty(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.pt: .*\(0 bytes; .*\): it is empty"):
        _common.read_torch_file(tmp_path / "empty.pt")


def test_read_torch_file_silences_only_the_pickle_protocol_note(tmp_path, monkeypatch):
    """The one UserWarning read_torch_file hides is torch's 'Detected pickle protocol' note; any other warning
    torch.load gives reaches the caller."""
    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt")
    real_load = torch.load

    def noisy_load(*args, **kwargs):
        warnings.warn("Detected pickle protocol 2 in the checkpoint", UserWarning)
        warnings.warn("another note from torch.load", UserWarning)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", noisy_load)
    with pytest.warns(UserWarning, match="another note from torch.load") as seen:
        assert torch.equal(_common.read_torch_file(tmp_path / "w.pt")["w"], torch.ones(2))
    assert [str(w.message) for w in seen] == ["another note from torch.load"]


def test_an_empty_file_is_reported_with_the_error_torch_load_raised(tmp_path):
    """read_torch_file's last branch (errors other than unpickling and RuntimeError: an empty file's
    EOFError) names the exception torch.load raised, not a placeholder."""
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError) as err:
        _common.read_torch_file(tmp_path / "empty.pt")
    msg = str(err.value)
    assert re.search(r"\(0 bytes; EOFError[:)]", msg) and "NoneType" not in msg, msg


def test_read_weights_file_hands_map_location_to_safetensors(tmp_path, monkeypatch):
    """A .safetensors file is read onto the device map_location names (here 'cuda:1', recorded by a stand-in for
    safetensors' load_file, with CUDA reported available), not always onto the CPU."""
    import safetensors.torch
    from safetensors.torch import save_file

    save_file({"w": torch.arange(3.0)}, str(tmp_path / "w.safetensors"))
    seen = []
    real = safetensors.torch.load_file

    def recording_load_file(path, device="cpu"):
        seen.append(str(device))
        return real(path, device="cpu")

    monkeypatch.setattr(safetensors.torch, "load_file", recording_load_file)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _common.read_weights_file(tmp_path / "w.safetensors", map_location="cuda:1")
    _common.read_weights_file(tmp_path / "w.safetensors", map_location=torch.device("cuda", 1))
    assert seen == ["cuda:1", "cuda:1"]


def test_a_truncated_file_is_reported_with_its_size(tmp_path):
    """The RuntimeError branch of read_torch_file (a truncated torch zip) states the file's size in bytes."""
    torch.save({"w": torch.ones(64)}, tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"cut\.pt: cannot read this file as a torch checkpoint \({len(data) // 2} "
                                         r"bytes; RuntimeError: "):
        _common.read_torch_file(tmp_path / "cut.pt")


def test_an_affine_free_group_norm32_normalises_without_weights():
    """GroupNorm32 without affine parameters: plain group normalisation, computed in float32."""
    norm = GroupNorm32(2, 4, affine=False)
    x = torch.randn(3, 4, 5, 5, dtype=torch.float16)
    y = norm(x)
    expected = nn.functional.group_norm(x.float(), 2, eps=norm.eps).to(torch.float16)
    assert y.dtype == torch.float16 and torch.equal(y, expected)


def test_an_unreadable_files_detail_is_the_first_sentence_of_the_error():
    from gms_kernels.models._common import _unreadable

    err = RuntimeError("PytorchStreamReader failed reading zip archive. failed finding central directory")
    text = str(_unreadable("x.pt", 10, err))
    assert "(10 bytes; RuntimeError: PytorchStreamReader failed reading zip archive):" in text
    assert "central directory" not in text


def test_an_unreadable_files_detail_is_cut_at_200_characters():
    from gms_kernels.models._common import _unreadable

    text = str(_unreadable("x.pt", 10, RuntimeError("y" * 300)))
    assert f"(10 bytes; RuntimeError: {'y' * 200}):" in text


def test_group_norm32_applies_float32_affine_parameters_to_a_16_bit_input_unrounded():
    """A half/bfloat16 input is normalised in float32 with the float32 weight and bias as they are (rounded
    once, at the end): rounding the weight and bias to the input's dtype first gives other values."""
    torch.manual_seed(0)
    norm = GroupNorm32(2, 8)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8) * 1.37 + 0.1234567)
        norm.bias.copy_(torch.randn(8) * 0.77 + 0.0123457)
    for dtype in (torch.float16, torch.bfloat16):
        x = (torch.randn(2, 8, 6, 6) * 3).to(dtype)
        expected = nn.functional.group_norm(x.float(), 2, norm.weight, norm.bias, norm.eps).to(dtype)
        y = norm(x)
        assert y.dtype == dtype and torch.equal(y, expected), dtype


def test_a_state_dict_mismatch_of_exactly_eight_keys_lists_them_all_with_no_more():
    """Up to 8 keys are listed in full; "... (N more)" appears only past the eighth."""
    from gms_kernels.models import _common

    net = nn.Sequential(*[nn.Linear(1, 1, bias=False) for _ in range(8)])
    text = _common.mismatch_message("net:", *_common.mismatch_report(net, {}), "fix it")
    assert "  missing keys (8): " + ", ".join(f"{i}.weight" for i in range(8)) + "\n" in text
    assert "more)" not in text
