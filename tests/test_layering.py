"""The layers import downwards only: the IR (``cortado/exprgraph/``) knows nothing of the rules,
and terms know nothing of the constructors.

The test reads the source with ``ast``, so an import hidden inside a function counts as much as
one at the top of a module.
"""

import ast
from pathlib import Path

import cortado as ct

PACKAGE = Path(ct.__file__).parent
EXPRGRAPH = PACKAGE / "exprgraph"


def module_name(path):
    """The dotted name of the module at ``path`` (a file under the ``cortado`` package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path):
    """Every module that ``path`` imports, anywhere in it, as absolute dotted names. For
    ``from m import a`` both ``m`` and ``m.a`` are listed, since ``a`` may be a submodule."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def imports_of(module, names):
    return [n for n in names if n == module or n.startswith(module + ".")]


def test_the_import_reader_resolves_relative_imports():
    names = imported(EXPRGRAPH / "constructors.py")
    assert "cortado.exprgraph.term" in names and "cortado.exprgraph.term.Term" in names
    assert "numpy" in names


def test_no_module_of_the_ir_imports_the_rules():
    files = sorted(EXPRGRAPH.rglob("*.py"))
    assert files
    offenders = {str(f.relative_to(PACKAGE)): imports_of("cortado.rules", imported(f)) for f in files}
    assert {f: names for f, names in offenders.items() if names} == {}


def test_terms_know_nothing_of_the_constructors_that_give_them_operators():
    assert imports_of("cortado.exprgraph.constructors", imported(EXPRGRAPH / "term.py")) == []
    x, W = ct.var("x", (3, 4)), ct.var("W", (4, 2))
    assert (x @ W).head == "matmul" and (2 - x).args[1] is x and x.T.shape == (4, 3)


def test_neither_the_ir_nor_the_compiler_imports_a_backend():
    """A new lowering target is a backend's business: the IR and the compiler reach backends only through the
    registry (``backends.backend_named``) and the interface."""
    allowed = {"cortado.backends", "cortado.backends.backend_named", "cortado.backends.interface"}
    for path in sorted(EXPRGRAPH.rglob("*.py")) + [PACKAGE / "compiler.py", PACKAGE / "program.py"]:
        reached = set(imports_of("cortado.backends", imported(path))) - allowed
        assert not reached, f"{path.relative_to(PACKAGE)} imports {sorted(reached)}"


def test_the_gpus_own_op_is_not_in_the_general_table():
    from cortado.backends.cupy.lowering.gemm_op import GEMM
    from cortado.exprgraph.ops import OPS

    assert "gemm" not in OPS and GEMM.evaluate is not None
