"""The documentation's runnable parts run as written: a reader copies them."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

DOCS = pathlib.Path(__file__).parents[2] / "docs"


def test_the_testing_guides_example_test_passes(tmp_path: pathlib.Path):
    """docs/guides/testing.md shows a whole test file: pytest runs it unchanged."""
    guide = (DOCS / "guides" / "testing.md").read_text()
    block = re.search(r"```python\n(.*?)```", guide, re.S)
    assert block is not None
    (tmp_path / "test_guide.py").write_text(block[1])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_guide.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_every_page_of_the_site_is_in_its_navigation():
    """mkdocs builds a page left out of the nav without a word: every page has a place."""
    nav = (DOCS.parent / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    missing = [page for page in pages if f": {page}" not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_every_page_a_message_or_help_names_exists():
    """A refusal or a command's help that sends the reader to a page of the docs names one
    that is there (``docs/guides/schedules.md``), not a page's description or the README
    for what only the docs say."""
    package = DOCS.parent / "mscheduler"
    named = {
        (path.name, page)
        for path in package.rglob("*.py")
        for page in re.findall(r"docs/[\w/.-]+?\.md", path.read_text())
    }
    assert named, "no message names a page: the search is broken"
    missing = sorted((source, page) for source, page in named if not (DOCS.parent / page).exists())
    assert not missing
    vague = [
        path.name
        for path in package.joinpath("cli").glob("*.py")
        if re.search(r"\(docs: |: README\)|the \w+ guide\)", path.read_text())
    ]
    assert not vague, f"pages named by description, not path: {vague}"
