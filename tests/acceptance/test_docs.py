"""The documentation's runnable parts run as written: a reader copies them."""

from __future__ import annotations

import itertools
import pathlib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator

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


ROOT = DOCS.parent
# What a word of a shell command that names a file looks like (`@report.json` is --payload's).
FILE_WORD = re.compile(r"^@?(?P<path>[\w.-][\w./-]*\.(?:py|json|jsonl|yml|yaml|toml|txt|csv|sh))$")


def _commands(page: pathlib.Path) -> Iterator[tuple[pathlib.Path, list[str]]]:
    """Each command of the page's shell blocks, as words, with the folder it runs in: a block
    starts in the clone, and follows its own `cd`."""
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(), re.S):
        folder = ROOT
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # an unbalanced quote inside $(...): plain words will do
                words = line.split("#")[0].split()
            for before, word in itertools.pairwise(["", *words]):
                if before == "cd":
                    folder = folder / word
            yield folder, words


def _named_files(page: pathlib.Path) -> Iterator[tuple[pathlib.Path, str]]:
    """(folder, path) of each file a command names: a file argument, or the module of
    `mscheduler worker module:attribute`."""
    shown = set(re.findall(r"```python\n# ([\w/]+\.py)\n", page.read_text()))
    for folder, words in _commands(page):
        for before, word in itertools.pairwise(["", *words]):
            value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
            if match := FILE_WORD.match(value):
                yield folder, match["path"]
            elif before == "worker" and re.fullmatch(r"[\w.]+:\w+", word):
                module = word.split(":")[0].replace(".", "/") + ".py"
                if module not in shown:  # a module the page itself shows, as yours to write
                    yield folder, module


def test_every_file_a_doc_command_names_exists():
    """A reader pastes the README's and the docs' commands after the set-up: the files they
    name are in the clone (the examples' in examples/)."""
    missing = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for folder, path in _named_files(page):
            if not (folder / path).exists():
                where = folder.relative_to(ROOT) if folder != ROOT else "the clone"
                missing.append(f"{page.relative_to(ROOT)}: {path} (in {where})")
    assert not missing, missing


def test_the_files_check_sees_a_missing_file(tmp_path: pathlib.Path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\ncd examples && mscheduler worker tasks:handlers\n"
        "mscheduler publish r:1 --payload @nowhere.json\n```\n"
    )
    named = [(folder.relative_to(ROOT), path) for folder, path in _named_files(page)]
    assert named == [
        (pathlib.Path("examples"), "tasks.py"),
        (pathlib.Path("examples"), "nowhere.json"),
    ]
