"""The shortcuts that keep startup near a few microseconds of CPU per file (issue 47: 100,000 files behind an index)
give the answers of what they replace: a path's folder resolved once (guards._realpath) is os.path.realpath, and a
format picked from a path's name once per ending (formats._formats_named) is the one every format's extensions
pick, for any path; a symlink that reaches a file twice is still refused."""

import os
import posixpath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_titan.engine.sources import formats, guards
from zephon_titan.errors import ConfigError


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Folders, a symlinked folder, a symlinked file, a dangling link and a loop."""
    root = tmp_path_factory.mktemp("tree")
    (root / "a" / "b").mkdir(parents=True)
    for name in ("x.jsonl", "y.jsonl", ".hidden"):
        (root / "a" / name).write_text("{}\n")
        (root / "a" / "b" / name).write_text("{}\n")
    os.symlink(root / "a", root / "via")
    os.symlink(root / "a" / "x.jsonl", root / "a" / "b" / "link.jsonl")
    os.symlink(root / "nowhere", root / "a" / "dangling.jsonl")
    os.symlink(root / "a" / "b", root / "a" / "b" / "loop")
    return str(root)


_PARTS = st.sampled_from(["a", "b", "via", "loop", "..", ".", "", "x.jsonl", "y.jsonl", "link.jsonl", "dangling.jsonl",
                          ".hidden", "missing.jsonl"])  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_PARTS, min_size=1, max_size=6), relative=st.booleans())
def test_a_folder_resolved_once_is_realpath(tree, parts, relative):
    path = os.path.join(tree, *parts)
    if relative:
        path = os.path.relpath(path)
    folders: dict[str, str] = {}
    assert guards._realpath(path, folders) == os.path.realpath(path)
    assert guards._realpath(path, folders) == os.path.realpath(path)  # with the folder cached


def test_a_symlink_reaching_a_file_twice_is_refused(tree):
    a = os.path.join(tree, "a")
    files = [os.path.join(a, "x.jsonl"), os.path.join(a, "b", "x.jsonl"), os.path.join(a, "b", "y.jsonl")]
    guards.refuse_duplicate_targets("s", files)  # three files: fine
    for twice in (os.path.join(tree, "via", "x.jsonl"), os.path.join(a, "b", "link.jsonl")):
        with pytest.raises(ConfigError, match="are one file"):
            guards.refuse_duplicate_targets("s", [*files, twice])


def _reference(path: str):
    """What format_of_name chose before the shortcut: every format's extensions against the whole path."""
    registered = list(formats._FORMATS.values())
    sniffing = [f for f in registered if f.sniff is not None and path.endswith(f.extensions)]
    return sniffing, next((f for f in registered if f.sniff is None and path.endswith(f.extensions)), None)


_ENDINGS = sorted({e for f in formats._FORMATS.values() for e in f.extensions} | {".txt", ".gz", "json", "x", "."})


@settings(max_examples=500, deadline=None)
@given(
    folder=st.sampled_from(["", "/data/", "s3://bucket/a.b/", "gs://b/index.json/", "./"]),
    stem=st.text(alphabet="ab.x0-_", max_size=6),
    endings=st.lists(st.sampled_from(_ENDINGS), max_size=3),
)
def test_the_format_of_a_name_is_every_formats_choice(folder, stem, endings):
    path = folder + stem + "".join(endings)
    assert formats._formats_named(path) == _reference(path)
    assert posixpath.basename(path) == path.rpartition("/")[2]
