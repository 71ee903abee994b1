"""The README's layout list and docs/architecture.md hold to the tree: every path either
names exists, and every package folder (each folder below numbakv/ with an __init__.py,
and reference/ and viz/) is named in both. Every relative link of the README, the
changelog and the guides under docs/ leads to a file that exists, and to a heading of it
when it names one."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A path of this repository as the documents write one: a top-level folder, then parts,
# each part may hold one {a,b} alternation (`numbakv/core/{errors,config}.py`).
TOP = r"(?:numbakv|reference|viz|benchmarks|examples|docs|tests|\.ci)"
PATH = re.compile(rf"(?<![\w./-]){TOP}(?:/(?:[\w.-]|\{{[\w.,-]*\}})*)+")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^()\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def expand(path: str) -> list[str]:
    """`a/{b,c}.py` -> [`a/b.py`, `a/c.py`]; alternations expand left to right."""
    found = re.search(r"\{([^{}]*)\}", path)
    if found is None:
        return [path]
    head, tail = path[: found.start()], path[found.end() :]
    return [p for alt in found.group(1).split(",") for p in expand(head + alt + tail)]


def named_paths(text: str) -> list[str]:
    """Every repository path the text names, expanded, in order, without repeats."""
    paths = []
    for written in PATH.findall(text):
        for path in expand(written.rstrip(".")):
            if path not in paths:
                paths.append(path)
    return paths


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """The named paths that are not in the tree (a name ending in / must be a folder)."""
    return [
        path
        for path in named_paths(text)
        if not (root / path).exists() or (path.endswith("/") and not (root / path).is_dir())
    ]


def package_folders(root: Path = ROOT) -> list[str]:
    """Every package folder below numbakv/, and reference/ and viz/, as `name/`."""
    folders = {"reference/", "viz/"}
    for init in (root / "numbakv").rglob("__init__.py"):
        folder = init.parent.relative_to(root)
        if "__pycache__" not in folder.parts and folder != Path("numbakv"):
            folders.add(folder.as_posix() + "/")
    return sorted(folders)


def unnamed_packages(text: str, root: Path = ROOT) -> list[str]:
    """The package folders the text never names (as `numbakv/serve/` or `numbakv/serve`)."""
    named = set(named_paths(text))
    return [f for f in package_folders(root) if f not in named and f.rstrip("/") not in named]


def check_layout(text: str, where: str) -> None:
    """Fails naming every path the text names that is not in the tree."""
    missing = missing_paths(text)
    assert not missing, f"{where} names paths that are not in the tree: {missing}"


def layout_section(readme: str) -> str:
    """The README's "## Layout" section, up to the next second-level heading."""
    section = re.search(r"^## Layout\n(.*?)(?=^## )", readme + "\n## ", re.M | re.S)
    assert section is not None, "README.md has no '## Layout' section"
    return section.group(1)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor outside code blocks, repeats numbered as GitHub does."""
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(heading)
        result.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return result


def broken_links(text: str, doc: Path, root: Path = ROOT) -> list[str]:
    """The relative links of a Markdown text (outside code) that lead nowhere in the tree:
    a file or folder that does not exist, or a heading its Markdown file does not have."""
    prose = re.sub(r"`[^`\n]*\]\([^`\n]*`", "", FENCE.sub("", text))  # code, not links
    broken = []
    for link in LINK.findall(prose):
        if re.match(r"[a-z][a-z+.-]*:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        inside = root.resolve() in (path, *path.parents) and path.exists()
        heading = not anchor or path.suffix != ".md" or anchor in anchors(path.read_text())
        if not (inside and heading):
            broken.append(link)
    return broken


README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
LAYOUTS = {
    "README.md's layout list": lambda: layout_section(README.read_text()),
    "docs/architecture.md": lambda: ARCHITECTURE.read_text(),
}
LINKED = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_path_the_layout_names_exists(layout):
    text = LAYOUTS[layout]()
    assert named_paths(text), f"{layout} names no path of the repository"
    check_layout(text, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_package_folder_is_named(layout):
    unnamed = unnamed_packages(LAYOUTS[layout]())
    assert not unnamed, f"{layout} does not name these package folders: {unnamed}"


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file(doc):
    broken = broken_links(doc.read_text(), doc)
    assert not broken, f"{doc.relative_to(ROOT)} links to what does not exist: {broken}"


def test_the_readme_links_each_guide():
    linked = set(LINK.findall(README.read_text()))
    guides = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} | {"CHANGELOG.md"}
    assert not guides - linked, f"README.md does not link {sorted(guides - linked)}"


def test_a_planted_wrong_path_is_caught():
    layout = layout_section(README.read_text())
    planted = layout + "\n- `numbakv/serve/engin.py` and `numbakv/serve/{engine,enigne}.py`\n"
    planted_missing = ["numbakv/serve/engin.py", "numbakv/serve/enigne.py"]
    assert missing_paths(planted) == [*missing_paths(layout), *planted_missing]
    assert "numbakv/serve/engine.py" in named_paths(planted)
    with pytest.raises(AssertionError, match=r"not in the tree: .*'numbakv/serve/engin\.py'"):
        check_layout(planted, "the planted layout")


def test_a_file_named_as_a_folder_is_caught():
    assert missing_paths("`numbakv/__init__.py/` and `numbakv/cache`") == ["numbakv/__init__.py/"]


def test_a_package_left_out_is_caught():
    layout = layout_section(README.read_text())
    without = layout.replace("numbakv/trace/", "numbakv/tracing/")
    assert "numbakv/trace/" in unnamed_packages(without)
    assert "numbakv/trace/" not in unnamed_packages(layout)


def test_a_broken_link_is_caught():
    text = (
        "[a](docs/kit.md) [b](docs/nope.md) [c](docs/kit.md#block-sizes) "
        "[d](docs/kit.md#no-such-heading) [e](https://example.org/x.md) "
        "`[f](docs/in-code.md)`\n```\n[g](docs/in-a-block.md)\n```\n[h](../outside.md)"
    )
    assert broken_links(text, README) == [
        "docs/nope.md",
        "docs/kit.md#no-such-heading",
        "../outside.md",
    ]


def test_braces_and_anchors_read_as_github_and_a_shell_do():
    assert expand("numbakv/{a,b}/{c,d}.py") == [
        "numbakv/a/c.py",
        "numbakv/a/d.py",
        "numbakv/b/c.py",
        "numbakv/b/d.py",
    ]
    assert named_paths("the folder `numbakv/cache/`, then tests/contract/.") == [
        "numbakv/cache/",
        "tests/contract/",
    ]
    assert named_paths("numbakv.reference, https://x.org/docs/a.md, ../docs/b.md") == []
    assert anchors("# A `b` c\n## A b c\n```\n# not a heading\n```\n### What's §12?") == {
        "a-b-c",
        "a-b-c-1",
        "whats-12",
    }
