"""Bad input found by an audit of main: each case is one line naming the field or file and the value,
exit code 2, no traceback, and nothing written or destroyed."""

import json
from pathlib import Path

from test_profiles import write_bundle  # tests/ is on sys.path
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.results.output_checks import MARKER_NAME

runner = CliRunner()


def refused(args: list[str], *words: str) -> str:
    """Run the CLI; it must exit 2 with one `kvsim: error:` line holding every word."""
    result = runner.invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert len(lines) == 1 and lines[0].startswith("kvsim: error:"), result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def listing(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def import_args(bundle: Path, output: Path) -> list[str]:
    return ["import-profile", str(bundle), "-o", str(output), "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000"]


def test_import_profile_never_overwrites_a_users_file_nor_leaves_temporaries(tmp_path):
    bundle = write_bundle(tmp_path / "bundle")
    (tmp_path / "precious.txt").write_text("my notes\n")
    (tmp_path / "folder").mkdir()
    before = listing(tmp_path)
    refused(import_args(bundle, tmp_path / "precious.txt"), "precious.txt", "generator: kvsim")
    refused(import_args(bundle, tmp_path / "folder"), "folder", "not a file")
    assert listing(tmp_path) == before
    line = refused(import_args(bundle, Path("/proc/x.csv")), "/proc/x.csv")
    assert ".kvsim-" not in line and ".tmp" not in line  # no temporary names in messages
    # its own output it replaces, and a kvsim CSV it wrote may be imported again
    out = tmp_path / "llama.csv"
    for _ in range(2):
        assert runner.invoke(app, import_args(bundle, out)).exit_code == 0
    assert out.read_text().startswith("# generator: kvsim import-profile\n")
    assert runner.invoke(app, import_args(out, tmp_path / "again.csv")).exit_code == 0
    assert (tmp_path / "again.csv").read_text().count("# generator:") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.csv", "bundle", "folder", "llama.csv", "precious.txt"]


def test_an_output_folder_of_another_kind_is_not_replaced(tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    (report / MARKER_NAME).write_text(json.dumps({"kvsim": "0.1.0", "kind": "report", "files": ["index.md"]}))
    (report / "index.md").write_text("# my report\n")
    before = listing(tmp_path)
    refused(["run", "--set", "workload.num_requests=5", "-o", str(report)], str(report), "'report'", "'run'")
    assert listing(tmp_path) == before


BINARY = b"\x7fELF\x02\x01\x01\x00\x89PNG\r\n\x1a\n\xff\xfe" * 20  # not UTF-8 anywhere past byte 8


def test_binary_input_files_are_one_line_errors_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("bin.json").write_bytes(BINARY)
    refused(["run", "bin.json"], "scenario", "bin.json", "not UTF-8")
    refused(["capacity", "--model", "bin.json"], "model", "bin.json", "not UTF-8")
    refused(["plan", "--spec", "bin.json", "-o", "p"], "spec", "bin.json", "not UTF-8")
    Path("trace.yaml").write_text("workload:\n  trace: {format: azure, path: bin.json}\n  arrival: {process: trace}\n")
    refused(["run", "trace.yaml", "-o", "r"], "workload.trace.path", "bin.json", "not UTF-8")
    Path("table.yaml").write_text("workload:\n  prompt_len: {dist: empirical, table: bin.json, column: prompt}\n"
                                  "  output_len: {dist: fixed, value: 10}\n")
    refused(["run", "table.yaml", "-o", "r"], "length table", "bin.json", "not UTF-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin.json", "table.yaml", "trace.yaml"]


def test_azure_trace_with_a_header_and_no_rows(tmp_path):
    (tmp_path / "az.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    (tmp_path / "s.yaml").write_text("workload:\n  trace: {format: azure, path: az.csv}\n  arrival: {process: trace}\n")
    refused(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "r")], "az.csv", "no rows")
    assert not (tmp_path / "r").exists()


def test_a_directory_as_scenario_is_called_a_directory(tmp_path):
    refused(["run", str(tmp_path), "-o", str(tmp_path / "r")], str(tmp_path), "is a directory")
    assert list(tmp_path.iterdir()) == []


PRESETS = Path(__file__).parent.parent / "kvsim" / "model" / "presets" / "models"


def edited_config(tmp_path: Path, preset: str, **changes) -> str:
    """A copy of a shipped config.json with top-level (or, where it has one, text_config) keys changed."""
    raw = json.loads((PRESETS / preset).read_text())
    target = raw["text_config"] if isinstance(raw.get("text_config"), dict) and "text_config" not in changes else raw
    for key, value in changes.items():
        if value is KeyError:
            target.pop(key, None)
        else:
            target[key] = value
    path = tmp_path / f"{preset.removesuffix('.json')}-{'-'.join(changes)}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_zero_and_mistyped_config_fields_are_refused(tmp_path):
    cases = [
        ("qwen3-30b-a3b.json", {"decoder_sparse_step": 0}, "decoder_sparse_step=0: must be > 0"),
        ("qwen3-30b-a3b.json", {"mlp_only_layers": "all"}, "mlp_only_layers='all'"),
        ("deepseek-v3.json", {"moe_layer_freq": 0}, "moe_layer_freq=0: must be > 0"),
        ("gemma-3-27b.json", {"sliding_window_pattern": 0, "layer_types": KeyError}, "sliding_window_pattern=0"),
        ("gemma-3-27b.json", {"text_config": None}, "gemma-3-27b-text_config"),
        ("gemma-3-27b.json", {"text_config": "x"}, "text_config='x': must be a mapping"),
        ("llama-3.1-8b.json", {"num_attention_heads": 0, "head_dim": KeyError}, "num_attention_heads=0: must be > 0"),
        # 0 is not "missing": it must not fall back to full multi-head attention or hidden // heads
        ("llama-3.1-8b.json", {"num_key_value_heads": 0}, "num_key_value_heads=0: must be > 0"),
        ("llama-3.1-8b.json", {"head_dim": 0}, "head_dim=0: must be > 0"),
    ]
    for preset, changes, words in cases:
        refused(["capacity", "--model", edited_config(tmp_path, preset, **changes)], words)


def test_a_missing_kv_heads_key_still_means_multi_head_attention(tmp_path):
    from kvsim.model.config import load_model

    model = load_model(edited_config(tmp_path, "llama-3.1-8b.json", num_key_value_heads=KeyError, head_dim=None))
    assert (model.num_kv_heads, model.head_dim) == (32, 4096 // 32)  # hidden_size / num_attention_heads


def test_shared_prefix_with_zero_sequences_is_refused():
    refused(["capacity", "--shared-prefix-tokens", "2000", "--num-sequences", "0"], "num_sequences=0", "> 0")


PLAN = ["plan", "--slo", "ttft_s.p90=2", "--set", "workload.num_requests=5"]


def test_plan_checks_every_input_before_dask_or_its_folder(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # Dask not installed
    out = tmp_path / "plan"
    refused([*PLAN, "--gpu", "nope", "-o", str(out)], "gpu='nope'")
    refused([*PLAN, "--gpu", "h100-80gb", "--engine", "bogus=1", "-o", str(out)], "engine.bogus")
    refused([*PLAN, "--gpu", "h100-80gb", "--engine", "max_num_seqs=-1", "-o", str(out)], "max_num_seqs=-1")
    refused([*PLAN, "--gpu", "h100-80gb", "--gpu-hourly-cost", "a100-80gb=2", "-o", str(out)],
            "gpu_hourly_cost", "'a100-80gb'", "not a candidate")
    refused([*PLAN, "--gpu", "h100-80gb", "-o", str(out)], "Dask")  # good inputs: now Dask is needed
    assert list(tmp_path.iterdir()) == []
