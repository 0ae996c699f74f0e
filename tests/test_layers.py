"""Layers import downward only (issue 21): every module of the reinforge package is parsed with
`ast` (imports inside functions and `if TYPE_CHECKING:` blocks count too: a lazy import is still
a dependency) and each import of another reinforge package must point to a lower layer, or to a
peer where the layer allows peers. Imports by string (importlib.import_module) are not seen.

The layers, lowest first, as docs/architecture.md draws them (shared/ARCHITECTURE.md's table,
plus where this build put what that table does not name):

    leaves        algos (pure torch math), report (reads run-directory files only), safe_eval,
                  sandbox, seeding: import nothing of reinforge outside themselves
    base          protocol (the Batch), config (dataclasses, load, validation), usercode (the
                  user-code loader, which raises config's ConfigError)
    models        loading, forward passes, padding, packing, LoRA, Hub paths
    domain        data, rewards, tasks: datasets, reward functions, built-in tasks (peers)
    workers       actor, critic, reference, reward, rollout backends
    agents        the agent rollout wraps a rollout backend (agents -> workers, never back)
    distributed   Ray groups and ranks, FSDP2
    trainers      the step loops, checkpoints, validation
    cli           the commands
    api           reinforge/__init__.py (lazy names of the public API)
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "reinforge"

# (layer, top-level packages or modules of reinforge, whether they may import each other)
LAYERS: list[tuple[str, frozenset[str], bool]] = [
    ("leaves", frozenset({"algos", "report", "safe_eval", "sandbox", "seeding"}), False),
    ("base", frozenset({"protocol", "config", "usercode"}), True),
    ("models", frozenset({"models"}), False),
    ("domain", frozenset({"data", "rewards", "tasks"}), True),
    ("workers", frozenset({"workers"}), False),
    ("agents", frozenset({"agents"}), False),
    ("gateway", frozenset({"gateway"}), False),
    ("distributed", frozenset({"distributed"}), False),
    ("trainers", frozenset({"trainers"}), False),
    ("cli", frozenset({"cli"}), False),
    ("api", frozenset({""}), False),  # "" is the package root, reinforge/__init__.py
]

# Upward imports known when this test was written, each removed by another part of issue 21's
# redesign: (importing module, imported module). Removed by the integrator once H1/H3/H5 land;
# an entry that no longer occurs fails the test too, so this list only shrinks.
ALLOWED: set[tuple[str, str]] = set()  # no known upward import is left (issue 21 removed the last ones)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level(module: str) -> str:
    """'reinforge.agents.loop' -> 'agents'; 'reinforge.seeding' -> 'seeding'; 'reinforge' -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imported_modules(path: Path) -> set[str]:
    """Every reinforge module `path` imports, anywhere in the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .x import y inside reinforge.a.b
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target == "reinforge":  # from reinforge import x: x may be a subpackage
                out |= {f"reinforge.{a.name}" if (PACKAGE / a.name).exists() or (PACKAGE / f"{a.name}.py").exists()
                        else "reinforge" for a in node.names}
            else:
                out.add(target)
    return {m for m in out if m == "reinforge" or m.startswith("reinforge.")}


def layer_of(top: str) -> tuple[int, bool]:
    for rank, (_, members, peers) in enumerate(LAYERS):
        if top in members:
            return rank, peers
    raise KeyError(top)


def all_imports() -> list[tuple[str, str]]:
    """(importer, imported) for every import of another top-level part of reinforge."""
    pairs = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = module_name(path)
        pairs += [(me, m) for m in sorted(imported_modules(path)) if top_level(m) != top_level(me)]
    return pairs


def test_every_part_of_the_package_has_a_layer():
    tops = {top_level(module_name(p)) for p in PACKAGE.rglob("*.py")}
    listed = [t for _, members, _ in LAYERS for t in members]
    assert len(listed) == len(set(listed)), "a package sits in two layers"
    missing = sorted(tops - set(listed))
    assert not missing, f"reinforge.{missing} have no layer: add them to LAYERS here and to docs/architecture.md"


def upward(pairs: list[tuple[str, str]]) -> list[str]:
    """The (importer, imported) pairs that point up or sideways where peers are not allowed."""
    out = []
    for me, other in pairs:
        (mine, _), (theirs, peers) = layer_of(top_level(me)), layer_of(top_level(other))
        if theirs > mine or (theirs == mine and not peers):
            out.append(f"{me} imports {other} ({LAYERS[mine][0]} -> {LAYERS[theirs][0]})")
    return out


def test_imports_point_downward():
    pairs = all_imports()
    found = upward([p for p in pairs if p not in ALLOWED])
    assert not found, "upward imports:\n  " + "\n  ".join(found)
    stale = sorted(ALLOWED - set(pairs))
    assert not stale, f"ALLOWED entries that no longer occur (delete them): {stale}"


def test_the_rule_itself():
    assert upward([("reinforge.workers.actor", "reinforge.config.schema"),  # down
                   ("reinforge.agents.loop", "reinforge.workers.rollout.hf"),  # agents sit above workers
                   ("reinforge.rewards.registry", "reinforge.tasks"), ("reinforge.tasks", "reinforge.data.io"),  # peers
                   ("reinforge.usercode", "reinforge.config.load")]) == []
    assert upward([("reinforge.config.validate", "reinforge.workers.rollout"),
                   ("reinforge.workers.reward", "reinforge.agents.rewards"),
                   ("reinforge.report.render", "reinforge.algos.masked"),  # leaves import no other leaf
                   ("reinforge.models.forward", "reinforge.rewards.judge")]) == [
        "reinforge.config.validate imports reinforge.workers.rollout (base -> workers)",
        "reinforge.workers.reward imports reinforge.agents.rewards (workers -> agents)",
        "reinforge.report.render imports reinforge.algos.masked (leaves -> leaves)",
        "reinforge.models.forward imports reinforge.rewards.judge (models -> domain)"]


@pytest.mark.parametrize("source, expected", [
    ("from reinforge.workers.actor import ActorWorker\n", {"reinforge.workers.actor"}),
    ("def f():\n    import reinforge.trainers.rl as rl\n", {"reinforge.trainers.rl"}),
    ("from reinforge import seeding, RLConfig\n", {"reinforge.seeding", "reinforge"}),
    ("from . import base\nfrom ..models import forward\n", {"reinforge.agents", "reinforge.models"}),
    ("import torch\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from reinforge.cli import main\n",
     {"reinforge.cli"}),
])
def test_the_walk_sees_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    """The walk itself: plain, lazy (in a function), root, relative and TYPE_CHECKING imports."""
    fake = tmp_path / "reinforge"
    (fake / "agents").mkdir(parents=True)
    (fake / "seeding.py").write_text("")
    (fake / "agents" / "probe.py").write_text(source)
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert imported_modules(fake / "agents" / "probe.py") == expected
