"""The diffusers UNet adapter (gms_kernels/models/diffusers_unet.py): where a scheduler config is found."""

import json

from gms_kernels.models.diffusers_unet import scheduler_config_near
from gms_kernels.models.loading import _diffusers_schedule


def write_config(folder, cfg):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scheduler_config.json").write_text(json.dumps(cfg))


def test_scheduler_config_is_also_read_from_the_model_folder_itself(tmp_path):
    """Without a sibling scheduler/ folder, a scheduler_config.json inside the UNet folder is read (both by
    the schedule and by the variance-type lookup); the sibling folder comes first when both exist."""
    unet_dir = tmp_path / "unet"
    write_config(unet_dir, {"num_train_timesteps": 30, "variance_type": "fixed_large"})
    assert scheduler_config_near(str(unet_dir), None)["variance_type"] == "fixed_large"
    assert _diffusers_schedule(str(unet_dir), None).T == 30
    write_config(tmp_path / "scheduler", {"num_train_timesteps": 40, "variance_type": "learned"})
    assert scheduler_config_near(str(unet_dir), None)["variance_type"] == "learned"
    assert _diffusers_schedule(str(unet_dir), None).T == 40


def test_a_scheduler_config_that_is_not_a_json_object_is_not_returned(tmp_path):
    """scheduler_config_near gives a dict or None: a scheduler_config.json holding a list is not a config
    (its caller would call .get on it)."""
    from gms_kernels.models.diffusers_unet import scheduler_config_near

    unet_dir = tmp_path / "unet"
    unet_dir.mkdir()
    (unet_dir / "scheduler_config.json").write_text("[1000, \"linear\"]")
    assert scheduler_config_near(str(unet_dir), None) is None
    (unet_dir / "scheduler_config.json").write_text('{"variance_type": "fixed_small"}')
    assert scheduler_config_near(str(unet_dir), None) == {"variance_type": "fixed_small"}
