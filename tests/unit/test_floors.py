"""The floors hold: no import runs up, no circle between modules, no package imports dags/.

The floors and the root packages are read from ``[tool.importlinter]`` in pyproject.toml (the
``floors`` layers contract ``make lint`` checks with ``lint-imports``). import-linter finds circles
between the children of a package (``acyclic_siblings``), not between single modules: this test
finds every circle, a package's ``__init__`` and its own modules included, and names each import
of it. The DAG files (dags/, no package) are the top of Airflow's side: nothing imports them. The
import graph is grimp's, as import-linter builds it: imports inside functions count too.

Count them: ``.venv/bin/python -m tests.unit.test_floors``.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _floors() -> dict[str, int]:
    """Root package -> its floor (0 is the top), from the ``floors`` layers contract."""
    (contract,) = (c for c in _config()["contracts"] if c["id"] == "floors")
    return {p.strip(): i for i, layer in enumerate(contract["layers"]) for p in layer.split("|")}


@cache
def _graph() -> grimp.ImportGraph:
    # external packages too: an import of dags/ (or of a DAG file by its bare name) is one
    return grimp.build_graph(*_config()["root_packages"], include_external_packages=True, cache_dir=None)


def _internal_imports(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    roots = set(_config()["root_packages"])
    return sorted(
        (importer, imported)
        for importer in graph.modules
        if importer.split(".")[0] in roots
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported.split(".")[0] in roots and imported != importer
    )


def _where(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    """``file:line[,line...]`` of the importer's imports of ``imported``."""
    lines = [d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)]
    path = Path(*importer.split("."))
    file = path / "__init__.py" if (ROOT / path).is_dir() else path.with_suffix(".py")
    return f"{file}:{','.join(map(str, lines))}"


def upward_arrows(graph: grimp.ImportGraph) -> list[str]:
    """Each import from a floor up to a higher one, or between two packages of one floor."""
    floor = _floors()
    out = []
    for importer, imported in _internal_imports(graph):
        a, b = importer.split(".")[0], imported.split(".")[0]
        if a != b and floor[a] >= floor[b]:
            out.append(f"{importer} -> {imported} ({_where(graph, importer, imported)})")
    return out


def circles(graph: grimp.ImportGraph) -> list[str]:
    """One shortest circle through each import that has a way back, each circle once."""
    seen: set[frozenset[str]] = set()
    out = []
    for importer, imported in _internal_imports(graph):
        back = graph.find_shortest_chain(importer=imported, imported=importer, as_packages=False)
        if back is None:
            continue
        chain = (importer, *back)  # importer -> imported -> ... -> importer
        if frozenset(chain) in seen:
            continue
        seen.add(frozenset(chain))
        links = [f"{a} ({_where(graph, a, b)})" for a, b in zip(chain, chain[1:], strict=False)]
        out.append(" -> ".join([*links, chain[-1]]))
    return out


def dag_imports(graph: grimp.ImportGraph) -> list[str]:
    """Each import of dags/ (``dags``, ``dags.<file>`` or a DAG file's bare name) by the packages."""
    names = {"dags"} | {p.stem for p in (ROOT / "dags").glob("*.py")}
    return [
        f"{importer} -> {name} ({_where(graph, importer, name)})"
        for name in sorted(names & graph.modules)
        for importer in sorted(graph.find_modules_that_directly_import(name))
    ]


def test_no_import_runs_up_a_floor():
    found = upward_arrows(_graph())
    assert not found, "imports that run up a floor (or across app_sim | pipelines):\n" + "\n".join(found)


def test_no_circle_between_modules():
    found = circles(_graph())
    assert not found, "import circles (module (file:line of its import of the next)):\n" + "\n".join(found)


def test_no_package_imports_a_dag_file():
    found = dag_imports(_graph())
    assert not found, "the packages import dags/:\n" + "\n".join(found)


if __name__ == "__main__":
    graph = _graph()
    for what, found in (
        ("upward arrows", upward_arrows(graph)),
        ("circles", circles(graph)),
        ("imports of dags/", dag_imports(graph)),
    ):
        print(f"{what}: {len(found)}", *(f"  {line}" for line in found), sep="\n")
