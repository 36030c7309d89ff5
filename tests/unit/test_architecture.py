"""One direction of imports: core types (config) <- engine <- titan adapter / job files / command line; no cycles."""

import ast
import json
import os
import re
import subprocess
import sys

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "zephon_titan")


def _modules() -> dict[str, str]:
    out = {}
    root = os.path.dirname(PACKAGE)
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith(".py"):
                name = os.path.relpath(os.path.join(folder, file), root)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = os.path.join(folder, file)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in the file, functions included)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    edges.add(full if full in modules else node.module)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle found by depth-first search, as the path that closes it."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_check_can_fail():
    # Negative control: a graph with a cycle is reported.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def _loaded_after(*modules: str) -> set[str]:
    code = f"import sys, {', '.join(modules)}; print(' '.join(sorted(sys.modules)))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_layers():
    graph = import_graph()
    engine = {m for m in graph if m.startswith("zephon_titan.engine")}
    for module in engine:
        above = {
            e
            for e in graph[module]
            if e.startswith(
                (
                    "zephon_titan.loader",
                    "zephon_titan.titan",
                    "zephon_titan.toml_file",
                    "zephon_titan.cli",
                    "zephon_titan.plan",
                    "zephon_titan.init_job",
                )
            )
        }
        assert not above, f"{module} imports the layers above the engine: {above}"
    # loader/ (torch, never TorchTitan): what any trainer adapter shares; it imports no adapter and no command.
    loader = {m for m in graph if m.startswith("zephon_titan.loader")}
    assert loader >= {"zephon_titan.loader.state", "zephon_titan.loader.rank_lanes", "zephon_titan.loader.checkpoint"}
    for module in loader:
        above = {
            e for e in graph[module] if e.startswith(("zephon_titan.titan", "zephon_titan.cli", "zephon_titan.plan"))
        }
        assert not above, f"{module} imports an adapter or a command: {above}"
    loaded = _loaded_after(*sorted(loader))
    assert "torch" in loaded and not {m for m in loaded if m.startswith(("torchtitan", "zephon_titan.titan"))}, loaded
    config = {m for m in graph if m == "zephon_titan.config" or m.startswith("zephon_titan.config.")}
    assert config >= {"zephon_titan.config", "zephon_titan.config.schema", "zephon_titan.config.tables"}
    for module in config:
        assert not {e for e in graph[module] if e.startswith("zephon_titan.engine")}, module
    # Inside config/: the machinery (schema.py) imports no schema module, and no schema module imports the table
    # reader (tables.py): only the package's __init__ does.
    assert not {e for e in graph["zephon_titan.config.schema"] if e.startswith("zephon_titan.config")}
    assert {m for m in config if "zephon_titan.config.tables" in graph[m]} == {"zephon_titan.config"}
    # The command line is the top layer: no module outside cli/ imports it, and inside it no command module
    # imports the package (the parser and dispatch in cli/__init__.py, which imports them); only __main__ does.
    cli = {m for m in graph if m == "zephon_titan.cli" or m.startswith("zephon_titan.cli.")}
    assert cli >= {"zephon_titan.cli", "zephon_titan.cli.validate", "zephon_titan.cli.validate_report"}
    assert not {m for m in graph if m not in cli and graph[m] & cli}
    assert {m for m in cli if "zephon_titan.cli" in graph[m]} == {"zephon_titan.cli.__main__"}
    # validate's findings and their text need nothing of the package: they could be written as JSON anywhere.
    assert not graph["zephon_titan.cli.validate_report"]
    # engine/resume.py (what a checkpoint's loader state means) is not imported by the package: held to it here.
    loaded = _loaded_after("zephon_titan.engine", "zephon_titan.engine.resume")
    assert not loaded & {"torch", "torchtitan", "zephon_titan.titan", "zephon_titan.toml_file"}, loaded
    assert not {m for m in _loaded_after("zephon_titan.config") if m.startswith("zephon_titan.engine")}


def _format_words(source: str) -> set[str]:
    """The registered formats' names and file endings in `source`'s strings (docstrings aside)."""
    from zephon_titan.engine.sources import formats

    registered = [formats.get_format(n, "") for n in formats.format_names()]
    words = {f.name for f in registered} | {e for f in registered for e in f.extensions}
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
        if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    strings = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]
    return {w for text in strings for w in re.findall(r"[\w.]+", text.lower()) if w in words}


def test_init_names_no_format():
    """`zephon-titan init` asks the format registry (each Format's `init` hook, engine/sources/init_sample.py):
    a new format is its module and one registry line, with no edit to init_job/."""
    init = {m: p for m, p in _modules().items() if m.startswith("zephon_titan.init_job")}
    assert len(init) >= 5, init
    for module, path in init.items():
        with open(path, encoding="utf-8") as f:
            assert not _format_words(f.read()), module
    # Negative control: a branch on a format's name, or a file ending in a message, is seen.
    assert _format_words('if fmt == "lance":\n    raise ValueError(f"{p} is not a .jsonl.gz file")') == {
        "lance",
        ".jsonl.gz",
    }


def test_the_command_line_imports_torch_only_for_the_commands_that_resolve_a_job(tmp_path):
    """`zephon-titan --help`, `verify` (two JSON files) and a job refused by the first pass import neither torch nor
    TorchTitan."""
    line = json.dumps({"step": 1, "sha256": "0" * 64, "rows": 8, "tokens": {"web": 5}, "padding": 0})
    (tmp_path / "a.jsonl").write_text(line + "\n")
    probe = (
        "import sys\nfrom zephon_titan.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', ' '.join(sorted(sys.modules)))"
    )

    def loaded(*argv: str) -> set[str]:
        out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True).stdout
        return set(out.split("LOADED", 1)[1].split())

    heavy = {"torch", "torchtitan", "zephon_titan.titan.job"}
    assert not loaded("--help") & heavy
    assert not loaded("init", "--help") & heavy
    assert not loaded("verify", str(tmp_path / "a.jsonl"), str(tmp_path / "a.jsonl")) & heavy
    # A job that fails the first pass (job_file.py) is refused before torch (tests/unit/test_job_file.py has each
    # command and mistake); control: one that passes it and needs the recipe does import them (the probe can see
    # an import).
    assert not loaded("validate", str(tmp_path / "missing.toml")) & heavy
    job = '[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n[dataloader.sources.a]\npaths = ["a.jsonl"]\n'
    (tmp_path / "job.toml").write_text(job)
    assert {"torch", "torchtitan"} <= loaded("validate", str(tmp_path / "job.toml"))


def test_a_data_only_rank_imports_no_trainer_and_no_model_code():
    """`titan/data_run` (64 of them on one 24 GiB machine in scripts/elastic_scale.py) imports neither
    torchtitan.trainer nor model code (~240 MB more RSS per process); load_job, which does, runs in a child
    process of rank 0."""
    probe = (
        "import json, sys\nimport zephon_titan.titan.data_run\nrank = sorted(sys.modules)\n"
        "import zephon_titan.titan.job\nprint(json.dumps([rank, sorted(sys.modules)]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    rank, with_job = (set(names) for names in json.loads(out))

    def heavy(modules: set[str]) -> set[str]:
        return {m for m in modules if m == "torchtitan.trainer" or m.startswith("torchtitan.models")}

    assert not heavy(rank), sorted(heavy(rank))
    # Control: the job resolver does import them (the probe can see them).
    assert {"torchtitan.trainer", "torchtitan.models"} <= heavy(with_job)
