"""A model given as its folder (`--model ./Llama-3.1-8B`, as vLLM takes a downloaded model) reads the
folder's `config.json`, named after the folder; a folder without one is refused in one line."""

import json
import shutil
from pathlib import Path

import kvsim
from kvsim.model.config import PRESETS_DIR, load_model
from tests.conftest import one_line_exit_2

PRESET = PRESETS_DIR / "models" / "llama-3.1-8b.json"


def test_a_model_folder_is_its_config_json(tmp_path):
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    shutil.copy(PRESET, folder / "config.json")
    by_folder, by_file = load_model(str(folder)), load_model(str(folder / "config.json"))
    assert by_folder == by_file
    assert "_name_or_path" not in json.loads(PRESET.read_text())
    assert by_folder.name == "Llama-3.1-8B"  # a config.json without `_name_or_path` is named by its folder
    small = {"workload.num_requests": 20}
    a = kvsim.simulate(kvsim.load_scenario(None, {**small, "model": str(folder)}))
    b = kvsim.simulate(kvsim.load_scenario(None, {**small, "model": str(folder / "config.json")}))
    assert a.summary == b.summary


def test_a_relative_model_folder_is_written_absolute(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    shutil.copy(PRESET, tmp_path / "m" / "config.json")
    monkeypatch.chdir(tmp_path)
    spec = kvsim.load_scenario(None, {"model": "m", "workload.num_requests": 5})
    written = kvsim.simulate(spec).write(tmp_path / "out")
    rerun = kvsim.load_scenario(Path(written) / "scenario.yaml")
    assert rerun.model == str((tmp_path / "m").resolve())


def test_a_folder_without_config_json_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    message = one_line_exit_2(["capacity", "--model", str(tmp_path / "empty")])
    assert message.startswith(f"model={str(tmp_path / 'empty')!r}: not a preset (")
    assert message.endswith(") nor a file (a folder without a config.json)")
