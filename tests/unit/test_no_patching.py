"""Only the CPU shim changes torch or TorchTitan objects: everything else extends TorchTitan through its own
extension points (nested Config subclasses, build()), so a TorchTitan release that keeps those keeps us working.

The check reads every module of the package as source: an assignment, `setattr` or `del` whose target is an
attribute of a name imported from torch or torchtitan (a module, a class, a function) is a patch. So is an
attribute assignment of a function onto another object than `self` (an instance's method replaced).
"""

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "zephon_titan")
# The one shim: device defaults for CPU runs (zephon_titan/cpu.py, imported only by train_cpu and tests).
SHIMS = {"cpu.py"}
FOREIGN = ("torch", "torchtitan")


def _imported_foreign_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in FOREIGN}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in FOREIGN:
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def patches(source: str) -> list[str]:
    """The lines of `source` that patch a torch/TorchTitan object or replace an instance's method."""
    tree = ast.parse(source)
    foreign = _imported_foreign_names(tree)
    functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    found = []

    def is_foreign(target: ast.AST) -> bool:
        root = _root(target)
        return isinstance(root, ast.Name) and root.id in foreign

    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        value = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and node.target is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and is_foreign(ast.Attribute(value=node.args[0], attr="x")):
                found.append(f"line {node.lineno}: {node.func.id} on a torch/torchtitan object")
            continue
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            if is_foreign(target):
                found.append(f"line {node.lineno}: assigns {ast.unparse(target)}")
            elif not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")):
                method = isinstance(value, ast.Lambda) or (isinstance(value, ast.Name) and value.id in functions)
                if method:
                    found.append(f"line {node.lineno}: replaces the method {ast.unparse(target)}")
    return found


def test_only_the_cpu_shim_patches_torch_or_torchtitan():
    offenders = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            path = os.path.join(folder, file)
            if file.endswith(".py") and os.path.relpath(path, PACKAGE) not in SHIMS:
                with open(path, encoding="utf-8") as f:
                    found = patches(f.read())
                if found:
                    offenders[os.path.relpath(path, PACKAGE)] = found
    assert not offenders, offenders


def test_the_patch_check_can_fail():
    # Negative controls: each kind of patch is found, in the shim itself and in small samples.
    with open(os.path.join(PACKAGE, "cpu.py"), encoding="utf-8") as f:
        assert patches(f.read()), "cpu.py patches torch's device defaults"
    assert patches("from torchtitan.trainer import Trainer\nTrainer.train_step = lambda self, it: None\n")
    assert patches("import torchtitan.components.validate as v\nv.Validator.__init__ = None\n")
    assert patches("import torch\nsetattr(torch.cpu, 'device_count', lambda: 1)\n")
    assert patches("def step(it):\n    pass\ndef wire(trainer):\n    trainer.train_step = step\n")
    # ... and what is not a patch is not reported: a subclass, our own attributes, a dataclass field.
    assert not patches(
        "from torchtitan.trainer import Trainer\nclass T(Trainer):\n    def __init__(self):\n"
        "        self.extra = lambda: 1\n        self.ledger = None\n"
    )
