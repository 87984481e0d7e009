"""docs/API.md's examples, run in order in one namespace, in an empty folder holding a small sweep's finished
runs (runs/scaling: 1, 2 and 4 GPUs, written as metrics files), as the page says."""
import re
from pathlib import Path

from test_analysis import write_run as write_metrics

PAGE = Path(__file__).resolve().parents[1] / "docs" / "API.md"


def examples(text: str):
    """The page's ```python blocks with the line each starts on."""
    return [(text[:m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def test_the_example_finder_finds_each_python_block():
    text = "a\n```python\nx = 1\n```\n```toml\ny\n```\n```python\nz = 2\n```\n"
    assert examples(text) == [(3, "x = 1\n"), (9, "z = 2\n")]


def test_the_pages_examples_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for gpus, images_per_s in ((1, 100.0), (2, 180.0), (4, 300.0)):
        write_metrics(tmp_path / "runs", "g%d" % gpus, gpus, [images_per_s, images_per_s], site="local")
    found = examples(PAGE.read_text(encoding="utf-8"))
    assert len(found) >= 10
    namespace: dict = {}
    for line, code in found:
        exec(compile(code, "%s:%d" % (PAGE.name, line), "exec"), namespace)
