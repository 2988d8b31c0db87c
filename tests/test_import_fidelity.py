"""import-profile and calibrate refuse what they read unchecked: a Vidur profile's `use_gated_mlp` (neither
checked nor compared with the model), a bundle folder its meta.yaml's `tp_degrees` does not list, and
`calibrate --dry-run -o` of a file a real run refuses. Each is one line, exit 2, nothing written."""

from pathlib import Path

import pytest

from kvsim.latency.profiles.loader import load_profile
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig
from tests.conftest import one_line_exit_2

VIDUR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act", "input_layernorm",
             "post_attention_layernorm", "attn_rope", "add", "emb")
TIMES = ",".join(["0.1"] * len(VIDUR_OPS))


def vidur(tmp_path: Path, model: str, shapes: str, gated: list[str]) -> Path:
    """A Vidur mlp.csv on Vidur's `a100` (an A100 80GB) of `model` (org/name) with the given shapes
    (n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size), one row of 0.1 ms per op for each `use_gated_mlp`
    cell in `gated`, at 1, 2, ... tokens, TP 1."""
    folder = tmp_path / "compute" / "a100" / model
    folder.mkdir(parents=True)
    header = ("n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,"
              "num_tensor_parallel_workers," + ",".join(f"time_stats.{op}.median" for op in VIDUR_OPS))
    rows = [f"{shapes},{cell},{tokens},1,{TIMES}" for tokens, cell in enumerate(gated, start=1)]
    (folder / "mlp.csv").write_text("\n".join([header, *rows]) + "\n")
    return folder / "mlp.csv"


LLAMA_2_7B = ("meta-llama/Llama-2-7b-hf", "32,32,4096,11008,32000", "llama-2-7b")  # gated (SiLU-and-mul)
OPT_13B = ("facebook/opt-13b", "40,40,5120,20480,50272", "opt-13b")  # fc1 → ReLU → fc2: not gated


def import_args(path: Path, tmp_path: Path, model: str) -> list[str]:
    return ["import-profile", str(path), "-o", str(tmp_path / "out.csv"), "--model", model, "--gpu", "a100-80gb"]


@pytest.mark.parametrize(("world", "cell", "message"), [
    (LLAMA_2_7B, "False", "measured with use_gated_mlp=false, but the scenario's model llama-2-7b has a gated MLP"),
    (OPT_13B, "True", "measured with use_gated_mlp=true, but the scenario's model opt-13b has no gated MLP"),
], ids=["plain-profile-gated-model", "gated-profile-plain-model"])
def test_a_vidur_profile_of_the_other_mlp_kind_is_refused(tmp_path, world, cell, message):
    """A gated MLP's up projection is two matrices (gate and up, 2·I columns), a plain one's one: Llama-2-7B's
    `mlp_up_proj` times say nothing of an OPT's. The shapes and name matched, so the profile was imported."""
    org_name, shapes, model = world
    path = vidur(tmp_path, org_name, shapes, [cell, cell])
    assert one_line_exit_2(import_args(path, tmp_path, model)) == f"profile vidur:{org_name}: {message}"
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize(("cells", "message"), [
    (["True", "maybe"], "line 3: use_gated_mlp='maybe' is not True or False"),
    (["", "True"], "line 2: use_gated_mlp='' is not True or False"),
    (["True", "False"], "the rows disagree on use_gated_mlp (True, False): one model's profile per file"),
], ids=["maybe", "blank", "both"])
def test_a_vidur_use_gated_mlp_that_is_not_one_bool_is_refused(tmp_path, cells, message):
    org_name, shapes, model = LLAMA_2_7B
    path = vidur(tmp_path, org_name, shapes, cells)
    assert one_line_exit_2(import_args(path, tmp_path, model)) == f"profile {path}: {message}"
    assert not (tmp_path / "out.csv").exists()


def test_a_vidur_profile_of_the_models_mlp_kind_imports_and_keeps_it(tmp_path):
    org_name, shapes, model = LLAMA_2_7B
    profile = load_profile(vidur(tmp_path, org_name, shapes, ["True", "true"]), load_model(model),
                           load_gpu("a100-80gb"), EngineConfig(max_model_len=4096))
    assert profile.meta["gated_mlp"] == "true"


@pytest.mark.parametrize(("value", "message"), [
    ("false", "measured with gated_mlp=false, but the scenario's model llama-2-7b has a gated MLP"),
    ("maybe", "metadata gated_mlp='maybe' is not true or false"),
])
def test_a_kvsim_profile_csvs_gated_mlp_is_compared_with_the_model(tmp_path, value, message):
    """The metadata survives a write-back (`write_native`), and is checked when the CSV is read again."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    org_name, shapes, model = LLAMA_2_7B
    first = tmp_path / "first"
    first.mkdir()
    assert CliRunner().invoke(app, import_args(vidur(first, org_name, shapes, ["True"]), first, model)).exit_code == 0
    written = first / "out.csv"
    text = written.read_text()
    assert "# gated_mlp: true\n" in text
    written.write_text(text.replace("# gated_mlp: true\n", f"# gated_mlp: {value}\n"))
    assert one_line_exit_2(import_args(written, tmp_path, model)) == f"profile out: {message}"
    assert not (tmp_path / "out.csv").exists()


def bundle(root: Path, degrees: str, folder: str) -> Path:
    """A one-row-per-op bundle of Llama-3.1-8B whose meta.yaml lists `degrees` and whose only folder is `folder`."""
    root.mkdir()
    (root / "meta.yaml").write_text(f"gpu: NVIDIA H100 80GB HBM3\nmodel: meta-llama/Llama-3.1-8B\nvariant: bf16\n"
                                    f"tp_degrees: {degrees}\n")
    (root / folder).mkdir()
    (root / folder / "dense.csv").write_text("layer,tokens,time_us\nqkv_proj,1,30\nqkv_proj,256,60\n")
    return root


def test_a_bundle_folder_its_meta_yaml_does_not_list_is_refused(tmp_path):
    """meta.yaml's `tp_degrees: [2]` with only a tp1 folder: the bundle's metadata (its hf_overrides are the
    per-rank shapes at the largest listed degree) describes other measurements; tp1 was imported silently."""
    root = bundle(tmp_path / "b", "[2]", "tp1")
    argv = ["import-profile", str(root), "-o", str(tmp_path / "out.csv"), "--gpu", "h100-80gb"]
    assert one_line_exit_2(argv) == (f"profile {root / 'meta.yaml'}: tp_degrees=[2] does not list "
                                     "tensor_parallel_size=1: meta.yaml does not describe the folder tp1")
    assert not (tmp_path / "out.csv").exists()


def test_a_bundle_tp_degrees_given_as_text_is_refused(tmp_path):
    """`tp_degrees: "12"` was iterated as the degrees 1 and 2."""
    root = bundle(tmp_path / "b", '"12"', "tp1")
    argv = ["import-profile", str(root), "-o", str(tmp_path / "out.csv"), "--gpu", "h100-80gb"]
    assert one_line_exit_2(argv) == (f"profile {root / 'meta.yaml'}: tp_degrees must list integers and "
                                     "engine_effective.hf_overrides map shape names to integers")


def test_calibrate_dry_run_checks_the_output_file_a_real_run_would_refuse(tmp_path):
    """A real run refuses `-o` of a file kvsim did not write (before measuring); the dry run that plans it said
    nothing, so the user learned it only when the real run was started."""
    notes = tmp_path / "notes.csv"
    notes.write_text("my notes\n")
    message = one_line_exit_2(["calibrate", "--gpu", "h200", "--dry-run", "--quick", "-o", str(notes)])
    assert message == (f"--output='{notes}': exists and does not start with '# generator: kvsim'; kvsim only "
                       "replaces output it wrote itself (choose a new path)")
    assert notes.read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.csv"]
