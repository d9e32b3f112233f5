"""Stage prepare_data: telling hub names from local files."""

from pathlib import Path

import pytest

from pipeline.plan.config import ConfigError
from pipeline.stages.prepare_data import squad_sources
from tests.stage_fixtures import tiny_config


def test_owner_slash_name_is_a_hub_dataset_not_a_file():
    cfg = tiny_config(data={"squad": "rajpurkar/squad"})
    assert squad_sources(cfg, Path("unused")) == ("rajpurkar/squad", "rajpurkar/squad")


def test_a_local_training_file_needs_a_dev_file():
    cfg = tiny_config(data={"squad": "my/data/train.json"})
    with pytest.raises(ConfigError, match="data.squad_dev"):
        squad_sources(cfg, Path("unused"))
