"""The examples in README.md and docs/*.md name things that exist: every `kvsim CMD --flag` (in a code block or an
inline code span) is a flag `kvsim CMD --help` lists, every `python benchmarks/X.py --flag` one the script defines,
every repository path a code span names a file or folder of the repository, and every `kvsim.a.b` a name
Python can import. The README was cut to an entry page and its sections moved to docs/ (docs35): an example
copied or reworded there is checked here without running it (running them all takes minutes; docs36 ran each by
hand). test_cli_newcomer checks the command tables' usage cells; test_docs_links the links."""

import importlib
import re
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli import app

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
FLAG = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")
PATH = re.compile(r"(?<![\w./-])((?:scenarios|benchmarks|kvsim|tests|kernels|notebooks|docs)/[\w./-]*[\w/])")
NAME = re.compile(r"(?<![\w.])(kvsim(?:\.[A-Za-z_]\w*)+)")
# Paths a page names that are not the repository's, each with the reason.
NOT_OURS = {
    "benchmarks/multi_turn/benchmark_serving_multi_turn.py": "vLLM's multi-turn benchmark (docs/scenarios.md)",
    "docs/profiling.md": "Vidur's page (docs/accuracy.md)",
    "scenarios/calibration/h200.csv": "the profile `kvsim calibrate -o` writes",
}
# The one example of an option kvsim refuses, with the line the README says it gets.
REFUSED = {"kvsim run --gpu h100": "--set gpu=VALUE"}
runner = CliRunner()


def snippets() -> list[tuple[str, str]]:
    """(page name, text) for each line of a fenced block (a `\\` continuation joined) and each inline code span
    (its line breaks made spaces), comments after `  #` dropped."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in FENCE.findall(text):
            found += [(page.name, line.split("  #")[0].strip()) for line in block.replace("\\\n", " ").splitlines()]
        found += [(page.name, " ".join(span.split())) for span in SPAN.findall(FENCE.sub("", text))]
    return found


def test_every_flag_a_docs_kvsim_example_gives_is_in_that_commands_help():
    helps: dict[str, set[str]] = {}
    examples = 0
    for page, text in snippets():
        match = re.match(r"(?:\./dev run|kvsim) ([a-z][a-z-]*)\b", text)
        if match is None:
            continue
        if text in REFUSED:
            result = runner.invoke(app, text.split()[1:])
            assert result.exit_code == 2 and REFUSED[text] in result.output, (page, text)
            continue
        command = match.group(1)
        if command not in helps:
            result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"})
            assert result.exit_code == 0, (page, text)  # a command kvsim has
            helps[command] = set(FLAG.findall(result.output))
        named = set(FLAG.findall(re.sub(r"'[^']*'", "''", text)))  # not inside a quoted JSON or YAML value
        assert named - helps[command] == set(), (page, text)
        examples += 1
    assert examples > 50 and len(helps) == 7  # every command has examples


def test_every_flag_a_docs_benchmark_example_gives_is_defined_by_that_script():
    examples = 0
    for page, text in snippets():
        match = re.match(r"python (benchmarks/\w+\.py|-m kernels\.\w+)(.*)", text)
        if match is None:
            continue
        target = match.group(1)
        script = REPO / (target.removeprefix("-m ").replace(".", "/") + ".py" if target.startswith("-m ") else target)
        assert script.is_file(), (page, text)
        source = script.read_text(encoding="utf-8")
        for flag in FLAG.findall(match.group(2)):
            assert f'"{flag}"' in source, (page, text, flag)
        examples += 1
    assert examples > 10


def test_every_repository_path_a_docs_code_span_names_exists():
    named = {path for _, text in snippets() for path in PATH.findall(text)}
    assert len(named) > 50
    missing = sorted(path for path in named - NOT_OURS.keys() if not (REPO / path).exists())
    assert missing == []
    assert NOT_OURS.keys() <= named  # an exception no page needs any more goes


def test_every_kvsim_name_a_doc_gives_imports():
    named = {name for _, text in snippets() for name in NAME.findall(text)}
    assert {"kvsim.simulate", "kvsim.load_scenario"} <= named
    for name in sorted(named):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                found = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        for attribute in parts[cut:]:
            assert hasattr(found, attribute), name
            found = getattr(found, attribute)
