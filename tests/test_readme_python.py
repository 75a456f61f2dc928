"""The README's Python blocks run as they stand and say what they claim."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_python_blocks_run_and_name_the_fault(tmp_path, monkeypatch):
    blocks = _python_blocks()
    assert blocks, "the README lost its Python example"
    monkeypatch.chdir(tmp_path)  # the example writes mine.holmes where it runs
    for code in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(README), "exec"), {"__name__": "readme"})  # noqa: S102
        said = out.getvalue()
        # the first line names the NIC the job was given and the truth it printed beside it
        named, truth = re.search(r"^nic (\S+) .*truth: \('([^']+)',\)$", said, re.M).groups()
        assert named == truth, said
        abnormal, others = map(float, re.search(
            r"abnormal ops ([\d.]+), others ([\d.]+)", said).groups())
        assert abnormal > others + 0.5, said
    assert (tmp_path / "mine.holmes").exists()
