"""docs/layout.md's module map is complete and true: it names every module of zephon_titan/, and every module it
names exists. It is the only list of modules (docs/design.md keeps the layers and points to it)."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = "zephon_titan"
NAME = re.compile(r"[\w.]+/|[\w.]+\.py")


def map_text(page: str = os.path.join(REPO, "docs", "layout.md")) -> str:
    """The code block under '## Layout'."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Layout") :]
    return re.search(r"```\n(.*?)```", section, flags=re.S).group(1)


def named_paths(text: str) -> set[str]:
    """The paths the map names, relative to the repository. An entry starts at an even column, two spaces per
    folder level, and is a folder (`name/`) or a module (`name.py`); deeper lines are its description."""
    folders: list[str] = []
    paths = set()
    for line in text.splitlines():
        column = len(line) - len(line.lstrip(" "))
        words = line.split()
        if not words or column % 2 or column // 2 > len(folders) or not NAME.fullmatch(words[0]):
            continue
        depth = column // 2
        del folders[depth:]
        path = "/".join([*folders, words[0].rstrip("/")])
        paths.add(path)
        if words[0].endswith("/"):
            folders.append(words[0].rstrip("/"))
    return paths


def package_paths(root: str = REPO) -> set[str]:
    """Every module and package folder of zephon_titan/, relative to the repository."""
    paths = set()
    for folder, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        relative = os.path.relpath(folder, root).replace(os.sep, "/")
        paths.add(relative)
        paths.update(f"{relative}/{name}" for name in files if name.endswith(".py"))
    return paths


def map_problems(text: str, root: str = REPO) -> list[str]:
    """What the map gets wrong: modules it leaves out (an `__init__.py` may go unnamed when its folder is named),
    and modules or folders it names under zephon_titan/ that do not exist."""
    named = {p for p in named_paths(text) if p == PACKAGE or p.startswith(PACKAGE + "/")}
    present = package_paths(root)
    missing = sorted(p for p in present - named if not (p.endswith("/__init__.py") and p.rsplit("/", 1)[0] in named))
    gone = sorted(named - present)
    return [f"not in the map: {p}" for p in missing] + [f"in the map, not in the tree: {p}" for p in gone]


def test_the_map_names_every_module_and_only_modules_that_exist():
    assert map_problems(map_text()) == []


def test_the_map_names_each_module_with_its_folder():
    named = named_paths(map_text())
    assert {"zephon_titan/engine/sources/index_records.py", "zephon_titan/cli/__main__.py"} <= named
    assert "zephon_titan/sources/index_records.py" not in named  # a module is named under its own folder only


def test_a_map_missing_a_module_or_naming_a_gone_one_is_reported():
    text = map_text()
    line = next(line for line in text.splitlines() if line.strip().startswith("resume.py "))
    without = text.replace(line + "\n", "")
    assert map_problems(without) == ["not in the map: zephon_titan/engine/resume.py"]
    with_gone = text.replace(line, line + "\n    replay.py      a module that was moved away")
    assert map_problems(with_gone) == ["in the map, not in the tree: zephon_titan/engine/replay.py"]
    # A folder renamed in the map only: its modules are missing, and the map's names are not in the tree.
    folder_gone = text.replace("  loader/ ", "  loading/ ")
    problems = map_problems(folder_gone)
    assert "not in the map: zephon_titan/loader/state.py" in problems
    assert "in the map, not in the tree: zephon_titan/loading/state.py" in problems
