"""The README and docs/ match the code: their links lead somewhere, the commands and options
they show exist, and the names they cite (settings, modules, scripts, tests) are there."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import click
import pytest
import typer

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", _text(page), flags=re.M)}


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _text(page)):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (where.suffix != ".md" or anchor not in _anchors(where)):
            broken.append(f"{target}: no heading #{anchor} in {where.name}")
    assert not broken, f"{_name(page)}: " + "; ".join(broken)


def test_the_readme_leads_to_every_page_of_the_docs():
    readme = _text(ROOT / "README.md")
    missing = [p.name for p in PAGES[1:] if f"](docs/{p.name})" not in readme]
    assert not missing, f"README.md links no docs/{missing}"


def _commands() -> click.Group:
    from holmes_ml.cli import app

    return typer.main.get_command(app)


def _shown_commands(text: str) -> list[str]:
    """Command lines shown: at the start of a line of a code block, or in a code span."""
    return (re.findall(r"^holmes [^\n#]*", text, flags=re.M)
            + re.findall(r"`(holmes [^`]+)`", text))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_command_and_option_shown_exists(page):
    root = _commands()
    wrong = []
    for line in _shown_commands(_text(page)):
        words = line.replace("\\", " ").split()
        i = 1
        while i < len(words) and words[i].startswith("-"):  # holmes -v localize ...
            i += 1
        if i == len(words) or words[i] == "...":
            continue
        cmd = root.commands.get(words[i])
        if cmd is None:
            wrong.append(f"{line!r}: no command {words[i]!r}")
            continue
        if isinstance(cmd, click.Group) and i + 1 < len(words) and words[i + 1] in cmd.commands:
            cmd = cmd.commands[words[i + 1]]
        options = {"--help"} | {o for p in cmd.params
                                for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
        wrong += [f"{line!r}: {cmd.name} has no option {flag}"
                  for flag in (w.split("=")[0].rstrip(",.;:)") for w in words[i + 1:]
                               if w.startswith("--"))
                  if flag not in options]
    assert not wrong, f"{_name(page)}: " + "; ".join(wrong)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_setting_module_script_and_test_cited_exists(page):
    from holmes_ml.localize import LocalizeConfig

    text = _text(page)
    settings = {f.name for f in dataclasses.fields(LocalizeConfig)}
    missing = [f"LocalizeConfig.{s}" for s in re.findall(r"LocalizeConfig\.(\w+)", text)
               if s not in settings]
    missing += [d for d in re.findall(r"`(holmes_ml(?:\.\w+)+)", text) if not _resolves(d)]
    missing += [f for f in re.findall(r"((?:scripts|tests|holmes_ml|docs|notebooks)/[\w./-]+"
                                      r"\.(?:py|sh|md|json|ipynb|gz|png))", text)
                if not (ROOT / f).exists()]
    missing += [f"{f}::{t}" for f, t in re.findall(r"(tests/[\w/]+\.py)::(\w+)", text)
                if (ROOT / f).exists() and f"def {t}(" not in (ROOT / f).read_text()]
    assert not missing, f"{_name(page)} cites what is not there: {missing}"


def test_the_api_table_lists_every_route_of_the_service_and_which_need_the_token(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.routing import APIRoute

    from holmes_ml.serve.app import ServeSettings, create_app

    app = create_app(ServeSettings(db=tmp_path / "s.db"), analyzers=None)
    served = {}
    for route in app.routes:
        if isinstance(route, APIRoute) and route.include_in_schema:
            guarded = any(getattr(d.call, "__name__", "") == "require_token"
                          for d in route.dependant.dependencies)
            for method in route.methods - {"HEAD"}:
                served[f"{method} {route.path}"] = "write" if guarded else "–"
    rows = re.findall(r"^\| `([A-Z]+ /[^`]+)` \| [^|]+ \| (write|–) \|$",
                      _text(ROOT / "docs" / "deploy.md"), flags=re.M)
    assert dict(rows) == served
    assert len(rows) == len(served)  # (each once)
