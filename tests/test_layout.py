"""The layout the README's "Developing" section draws: each folder on a floor, imports only
downward or sideways, no import cycles, every public module says what it owns, and no SQL
in ``bot/`` outside the store.

Imports are read from the source (top-level and inside functions alike), so a lazy import
that climbs a floor is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analyzers", "prompts", "connectors", "bot", "benchmarks")

# Longest prefix wins. Keep in step with README.md ("Developing").
FLOORS = {
    "analyzers": 0, "prompts": 0,
    "connectors": 1,
    "bot": 2,
    "bot.slack": 3, "bot.serve": 3, "bot.demo": 3,
    "benchmarks": 4,
    "bot.cli": 5,  # the command line reaches every floor (`runwatch bench` lazily)
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Our modules that ``path`` imports; ``from package import module`` counts as the
    module, not the package."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [s for s in subs if s in MODULES] or [node.module]
            if len(names) < len(subs):
                names.append(node.module)
        else:
            continue
        out |= {n for n in names if n in MODULES}
    return out


GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def floor(module: str) -> int:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in FLOORS:
            return FLOORS[".".join(parts[:end])]
    raise KeyError(f"{module} is on no floor: add its folder to FLOORS and the README")


def test_every_module_is_on_a_floor():
    for module in MODULES:
        floor(module)


def test_no_module_imports_from_a_higher_floor():
    climbs = sorted(f"{a} (floor {floor(a)}) imports {b} (floor {floor(b)})"
                    for a, deps in GRAPH.items() for b in deps
                    if not b.startswith(a + ".") and floor(b) > floor(a))
    assert not climbs, "\n".join(climbs)


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in GRAPH:
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_there_are_no_import_cycles():
    # A package's __init__ importing its own submodules lazily is not a cycle of concerns.
    cycles = [c for c in _cycles()
              if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not cycles, cycles


@pytest.mark.parametrize("module", sorted(m for m in MODULES
                                          if not m.rsplit(".", 1)[-1].startswith("_")))
def test_every_public_module_says_what_it_owns(module):
    path = MODULES[module]
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path} has no module docstring"


def test_the_cycle_finder_finds_a_cycle():
    GRAPH["zz.a"], GRAPH["zz.b"] = {"zz.b"}, {"zz.a"}
    try:
        assert ["zz.a", "zz.b"] in _cycles()
    finally:
        del GRAPH["zz.a"], GRAPH["zz.b"]


def test_help_imports_no_heavy_library(tmp_path):
    """`runwatch --help` starts without pandas, LangChain, torch, matplotlib or Bolt: heavy
    libraries are imported where they are used (`runwatch bench startup` times it)."""
    from benchmarks.startup import _once

    _, heavy = _once(["--help"], tmp_path)
    assert heavy == []


def test_every_import_of_ours_names_a_module_that_exists():
    """A lazy import of a module that moved fails only when its function runs; this finds
    it at once."""
    missing = []
    tests = {str(path.relative_to(ROOT)): path for path in (ROOT / "tests").rglob("*.py")}
    for name, path in {**MODULES, **tests}.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            else:
                continue
            missing += [f"{name} imports {t}" for t in targets
                        if t.split(".")[0] in PACKAGES and t not in MODULES]
    assert not missing, "\n".join(missing)


# -- no SQL outside the store (issue 24) ------------------------------------------------------

SQL_CALLS = {"execute", "executemany", "executescript", "query"}
# what a database, a connection or the store is called where it runs SQL; other receivers
# (`actions.execute(request_id)`, a backend's `execute(spec)`) run SQL only if given SQL text
SQL_HOLDERS = {"db", "conn", "connection", "cursor", "cur", "store", "sqlite", "database"}
STORE_MODULES = ("bot.store", "bot.pgstore")  # and the store package's modules


def _name(node: ast.expr) -> str | None:
    """The last name of ``a.b.c`` (``c``), or of ``c``."""
    return node.attr if isinstance(node, ast.Attribute) else \
        node.id if isinstance(node, ast.Name) else None


def _is_text(node: ast.expr) -> bool:
    """A string literal, an f-string, or a sum with one in it (``sql + " ORDER BY id"``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_text(node.left) or _is_text(node.right)
    return isinstance(node, ast.JoinedStr)


def raw_sql(source: str) -> list[str]:
    """Where ``source`` runs SQL itself, as ``line: code``: ``.execute``, ``.executemany``,
    ``.executescript`` or ``.query`` called on a database, connection, cursor or store, or
    given SQL text; pandas' ``read_sql*``; sqlite-utils table access ``db["table"]`` or
    ``x.db["table"]``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            hit = method.startswith("read_sql") or method in SQL_CALLS and (
                _name(node.func.value) in SQL_HOLDERS
                or bool(node.args) and _is_text(node.args[0]))
        elif isinstance(node, ast.Subscript):
            hit = _name(node.value) == "db" and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str)
        else:
            continue
        if hit:
            found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_no_sql_outside_the_store():
    """Callers say what they want of the store (``store.open_alerts(run)``); how it is kept,
    in SQLite or PostgreSQL, is the store's (README "Developing"). Tests may use SQL."""
    outside = {name: raw_sql(path.read_text()) for name, path in MODULES.items()
               if name.split(".")[0] == "bot"
               and not any(name == s or name.startswith(s + ".") for s in STORE_MODULES)}
    found = [f"{MODULES[name].relative_to(ROOT)}:{hit}"
             for name, hits in sorted(outside.items()) for hit in hits]
    assert not found, "SQL outside bot/store/ and bot/pgstore.py:\n" + "\n".join(found)


def test_the_sql_finder_finds_sql():
    planted = '''
def f(store, db, ctx, actions, backend, frame, run):
    store.query("SELECT * FROM alerts WHERE run = ?", (run,))
    ctx.store.query(sql, params)
    db.execute(f"DELETE FROM alerts WHERE fingerprint = {p}")
    store.db.conn.executemany(sql, rows)
    db["alerts"].update(run, {"muted": None})
    store.db["outbox"].insert({})
    cursor.executescript(schema)
    other.execute("UPDATE runs SET unjudged = 0")
    thing.query(sql + " ORDER BY id")
    pd.read_sql_query(sql, conn)
    actions.execute(request_id)
    backend.execute(spec)
    frame["value"].max()
    store.open_alerts(run)
    db[key]
'''
    hits = [hit.split(": ", 1)[1] for hit in raw_sql(planted)]
    assert len(hits) == 10 and all("execute(request_id)" not in h and "spec" not in h
                                   and "frame" not in h and "open_alerts" not in h
                                   and h != "db[key]" for h in hits), hits
