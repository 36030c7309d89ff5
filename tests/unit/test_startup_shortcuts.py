"""The shortcuts that keep startup near a few microseconds of CPU per file (issue 47: 100,000 files behind an index)
give the answers of what they replace: a path's folder resolved once (guards._realpath) and a folder's symlinks
read from one listing (guards.real_paths) are os.path.realpath, a format picked from a path's name once per ending
(formats._formats_named, formats.formats_of_files) is the one every format's extensions pick, a folder split once
(base.split_paths) is posixpath.split, for any path; a symlink that reaches a file twice is still refused. Each
property has a negative control: a shortcut broken on purpose fails it (hypothesis finds the counterexample)."""

import gc
import os
import posixpath

import pytest
from hypothesis import HealthCheck, example, find, given, settings
from hypothesis import strategies as st

from zephon_titan.config import SourceConfig
from zephon_titan.engine.sources import base, formats, guards
from zephon_titan.engine.sources.gc_pause import gc_paused
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


def _paths(tree: str, parts_of_each: list[list[str]], relative: bool) -> list[str]:
    paths = [os.path.join(tree, *parts) for parts in parts_of_each]
    return [os.path.relpath(p) for p in paths] if relative else paths


_PATH_LISTS = st.lists(st.lists(_PARTS, min_size=1, max_size=5), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts_of_each=_PATH_LISTS, relative=st.booleans())
def test_folders_listed_once_are_realpath(tree, parts_of_each, relative):
    """Every folder listed (list_folder_at=1), some only in part (a few entries per path): the rest lstat-ed."""
    paths = _paths(tree, parts_of_each, relative)
    assert guards.real_paths(paths, list_folder_at=1) == [os.path.realpath(p) for p in paths]


def test_negative_control_a_listing_that_ignores_symlinks_is_caught(tree, monkeypatch):
    def every_name_plain(folder, wanted, real_folders):
        prefix, plain = real_listed(folder, wanted, real_folders)
        return (prefix, frozenset(os.listdir(folder))) if prefix else (prefix, plain)  # symlinks taken for files

    real_listed = guards._listed_folder
    monkeypatch.setattr(guards, "_listed_folder", every_name_plain)
    found = find(
        st.tuples(_PATH_LISTS, st.booleans()),
        lambda case: guards.real_paths(_paths(tree, *case), 1) != [os.path.realpath(p) for p in _paths(tree, *case)],
        settings=settings(max_examples=2000, database=None),
    )
    assert found  # e.g. a/b/link.jsonl, a symlink taken for a file


def test_a_symlink_among_many_files_of_a_folder_is_refused(tmp_path):
    """A folder of more paths than LIST_FOLDER_AT takes the listing's shortcut: its symlink is still seen."""
    files = [str(tmp_path / f"part-{i:03d}.jsonl") for i in range(guards.LIST_FOLDER_AT + 8)]
    for path in files:
        open(path, "w").close()
    guards.refuse_duplicate_targets("s", files)
    os.symlink(files[3], tmp_path / "part-999.jsonl")
    with pytest.raises(ConfigError, match=r"2 matched paths are one file, .*part-003.jsonl"):
        guards.refuse_duplicate_targets("s", [*files, str(tmp_path / "part-999.jsonl")])


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


_REGISTERED = formats._FORMATS.values()


def _choice(source, path, options=None):
    """format_of_file without reading a file: a sniffing format whose names the path has stands for its sniff."""
    sniffing, plain = _reference(path)
    chosen = sniffing[0] if sniffing else plain
    if chosen is None:
        raise ConfigError(f"cannot tell the format of {path}")
    return chosen


def _general(paths):
    """What _open_files asked before the shortcut: format_of_file of every path."""
    return {fmt.name: fmt for fmt in (_choice(None, p) for p in paths)}


_NAMES = st.builds(  # mostly names some format reads (one that none does stops a list: its refusal is compared)
    lambda folder, stem, endings, last: folder + stem + "".join(endings) + last,
    st.sampled_from(["", "/data/", "s3://bucket/a.b/", "gs://b/index.json/", "./"]),
    st.text(alphabet="ab.x0-_", max_size=4),
    st.lists(st.sampled_from(_ENDINGS), max_size=1),
    st.sampled_from(sorted({e for f in _REGISTERED for e in f.extensions}) + ["x"]),
)
_AUTO = SourceConfig(name="s", paths=["x"])


def _shortcut_or_error(paths):
    try:
        return formats.formats_of_files(_AUTO, paths)
    except ConfigError as e:
        return str(e)


def _general_or_error(paths):
    try:
        return _general(paths)
    except ConfigError as e:
        return str(e)


_ONE_ENDING_TWO_FORMATS = ["/data/a.json", "/data/index.json"]
"""Two names of one dotted ending (".json") and two formats: "index.json" names a dataset's index. Random lists
meet such a pair rarely (2,000 of them once missed it), so the property always tries it too."""


@settings(max_examples=500, deadline=None)
@given(paths=st.lists(_NAMES, max_size=8))
@example(paths=_ONE_ENDING_TWO_FORMATS)
def test_formats_asked_once_per_ending_are_every_files_format(paths, monkeypatch_module):
    assert _shortcut_or_error(paths) == _general_or_error(paths)


def test_negative_control_an_ending_cache_blind_to_other_names_is_caught(monkeypatch_module):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(formats, "_undotted", lambda version: ())  # forgets that "index.json" is a name of its own
        # The property's check fails on the pair it always tries.
        assert _shortcut_or_error(_ONE_ENDING_TWO_FORMATS) != _general_or_error(_ONE_ENDING_TWO_FORMATS)


@pytest.fixture(scope="module")
def monkeypatch_module():
    """formats_of_files asks format_of_file where the shortcut does not answer: here, without reading files."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(formats, "format_of_file", _choice)
        yield


def _naive_split(paths):
    return [p.rpartition("/")[0] for p in paths], [p.rpartition("/")[2] for p in paths]


@settings(max_examples=500, deadline=None)
@given(paths=st.lists(st.text(alphabet="/a.", max_size=8), max_size=8))
def test_folders_split_once_are_posixpath_split(paths):
    directories, names = base.split_paths(paths)
    assert list(zip(directories, names)) == [posixpath.split(p) for p in paths]


def test_negative_control_a_naive_split_is_caught():
    found = find(
        st.lists(st.text(alphabet="/a.", max_size=8), max_size=8),
        lambda paths: list(zip(*_naive_split(paths))) != [posixpath.split(p) for p in paths],
    )
    assert found  # e.g. "/a" (the root is "/") or "a//b"


@pytest.mark.parametrize("enabled", [True, False])
def test_a_gc_pause_restores_the_collector_as_it_was(enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():  # nested: the outer pause resumes it
                pass
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(KeyError), gc_paused():
            raise KeyError("x")
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
