"""House rules that CI enforces: notebooks stored without outputs, one repository URL, and every
lab in the table of contents."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _config_repository_url() -> str:
    text = (ROOT / "_config.yml").read_text()
    m = re.search(r"^repository:\s*\n\s+url:\s*(\S+)", text, re.M)
    assert m, "_config.yml has no repository.url"
    return m.group(1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_setup_cell_installs_from_the_configured_repository(path):
    nb = json.loads(path.read_text())
    first = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    assert "git+" + _config_repository_url() in first
    assert "setup(seed=" in first


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lab_is_in_the_table_of_contents(path):
    assert f"notebooks/{path.stem}" in (ROOT / "_toc.yml").read_text()


def test_readme_points_at_the_configured_repository():
    assert _config_repository_url() in (ROOT / "README.md").read_text()
