"""A registry of named algorithm entries that own their parameters. Standard library only.

An entry is a name, a function, and the dataclass of the hyper-parameters the function reads,
each field made with ``param(default, range, doc)``; plus an optional ``validate`` (a rule
across fields, raising ValueError) and traits (what an advantage estimator needs, ...). The
config reads the same fields: their ranges are the range checks, their docs the docs tables
(``markdown_table``), and ``Entry.kwargs(section)`` turns a config section into the keywords
of one call.

``Registry`` is a read-only mapping of name -> function (so ``REG[name](...)`` calls it);
``Registry.entry(name)`` gives the whole entry, and an unknown name raises ValueError with the
sorted valid names and a did-you-mean.
"""
from __future__ import annotations

import difflib
import inspect
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from collections.abc import Set
from typing import Any, Callable, Iterator, Mapping


def param(default: Any, range: str | None, doc: str) -> Any:
    """A hyper-parameter field: its default, its valid interval ("[0, 1)", "(0, inf)"; None for
    a non-numeric field; a None value always passes: "off") and a one-line description."""
    return field(default=default, metadata={"range": range, "doc": doc})


def did_you_mean(word: str, valid) -> str:
    """"did you mean 'x'? " for a mistyped name, or "" (the config's hint, without its import)."""
    close = difflib.get_close_matches(str(word), list(valid), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


@dataclass(frozen=True)
class Entry:
    """One registered algorithm: ``fn`` reads exactly the fields of ``params`` as keywords."""

    name: str
    fn: Callable
    params: type | None = None
    """Dataclass of the hyper-parameters ``fn`` reads (each made by ``param``); None: it has none."""
    validate: Callable[[Any], None] | None = None
    """Rule across the params (an instance), raising ValueError; ranges are checked by the config."""
    runtime: tuple[str, ...] = ()
    """Keywords ``fn`` takes that are not hyper-parameters (clip_cov's ``generator``)."""
    aliases: tuple[str, ...] = ()
    traits: Mapping[str, Any] = field(default_factory=dict)
    """Properties readers branch on (``needs_values`` of an advantage estimator, ...)."""
    doc: str = ""
    """One line for the docs table; the first paragraph of the function's docstring unless given."""

    def param_fields(self) -> tuple[Field, ...]:
        return fields(self.params) if self.params is not None else ()

    def make_params(self, source: Any = None):
        """The params instance, each field read from ``source``'s attribute of that name (a config
        section) when it has one, else its default; then ``validate``. None when there are none."""
        if self.params is None:
            return None
        values = {f.name: getattr(source, f.name) for f in self.param_fields() if hasattr(source, f.name)}
        p = self.params(**values)
        if self.validate is not None:
            self.validate(p)
        return p

    def kwargs(self, source: Any = None, **runtime) -> dict[str, Any]:
        """Keywords of one call of ``fn``: its params from ``source`` (see ``make_params``) plus
        the ``runtime`` values it declares (others are dropped: each entry takes what it reads)."""
        p = self.make_params(source)
        out = asdict(p) if p is not None else {}
        out.update({k: v for k, v in runtime.items() if k in self.runtime})
        return out


def _summary(fn: Callable) -> str:
    """The first paragraph of fn's docstring on one line (Markdown backticks)."""
    first = (inspect.getdoc(fn) or "").split("\n\n")[0]
    return " ".join(first.split()).replace("``", "`")


def _check_signature(e: Entry) -> None:
    """``fn``'s keyword-only parameters are its params' fields (same defaults) and its runtime
    keywords: no hyper-parameter is accepted and ignored, none is read but undeclared."""
    sig = inspect.signature(e.fn).parameters
    kw = {n: p.default for n, p in sig.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    want = {f.name: f.default for f in e.param_fields()}
    extra = set(kw) - set(want) - set(e.runtime)
    missing = set(want) - set(kw)
    if extra or missing:
        raise TypeError(f"{e.name}: keyword-only parameters {sorted(kw)} must be its params' fields "
                        f"{sorted(want)} plus runtime keywords {list(e.runtime)}")
    wrong = {n: (kw[n], d) for n, d in want.items() if kw[n] != d}
    if wrong:
        raise TypeError(f"{e.name}: signature defaults differ from its params' defaults: {wrong}")


def _key(f: Field) -> tuple:
    """What one config key must agree on wherever it is declared."""
    return f.default, f.metadata["range"], str(f.type)


class Registry(Mapping):
    """Entries of one kind ("policy loss") by name; aliases map to the same entry."""

    def __init__(self, kind: str, check_signature: bool = False):
        self.kind = kind
        self._check_signature = check_signature  # policy losses: params are keyword-only arguments
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, fn: Callable, params: type | None = None, *, aliases=(), validate=None,
                 runtime=(), doc: str = "", **traits) -> Entry:
        """Add an entry (and its aliases); a taken name raises ValueError."""
        e = Entry(name, fn, params, validate, tuple(runtime), tuple(aliases), dict(traits), doc or _summary(fn))
        if self._check_signature:
            _check_signature(e)
        for f in e.param_fields():
            if f.default is MISSING or "range" not in f.metadata or not f.metadata.get("doc"):
                raise TypeError(f"{self.kind} {name!r}: param {f.name!r} needs param(default, range, doc)")
        for n in (name, *e.aliases):
            if n in self._entries:
                raise ValueError(f"{self.kind} {n!r} is already registered")
        self._entries.update({n: e for n in (name, *e.aliases)})
        return e

    def unregister(self, name: str) -> None:
        """Remove an entry and its aliases (tests that register a throw-away entry)."""
        e = self.entry(name)
        for n in (e.name, *e.aliases):
            del self._entries[n]

    def unknown(self, name: str) -> str:
        """The message for a name that is not registered."""
        return f"unknown {self.kind} {name!r}; {did_you_mean(name, self._entries)}valid: {sorted(self._entries)}"

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            raise ValueError(self.unknown(name))
        return self._entries[name]

    def __getitem__(self, name: str) -> Callable:
        return self._entries[name].fn

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        """Each entry once (aliases folded), in registration order."""
        return list({id(e): e for e in self._entries.values()}.values())

    def with_trait(self, trait: str) -> frozenset[str]:
        """Names (aliases included) whose entry has a true ``trait``."""
        return frozenset(n for n, e in self._entries.items() if e.traits.get(trait))

    def trait_set(self, trait: str) -> "TraitSet":
        """A live set of the names whose entry has a true ``trait``: an entry registered later
        (a user's estimator) is in it too, where ``with_trait``'s snapshot would miss it."""
        return TraitSet(self, trait)

    def param_fields(self) -> dict[str, Field]:
        """Every hyper-parameter of every entry by name. A name shared by entries must have one
        default, range and type (it is one config key); else TypeError."""
        out: dict[str, Field] = {}
        for e in self.entries():
            for f in e.param_fields():
                seen = out.setdefault(f.name, f)
                if _key(seen) != _key(f):
                    raise TypeError(f"{self.kind} param {f.name!r} is declared twice with different default, range "
                                    f"or type ({e.name!r})")
        return out


class TraitSet(Set):
    """The names (aliases included) of a registry whose entry has a true trait, read at each use."""

    def __init__(self, reg: Registry, trait: str):
        self._reg, self._trait = reg, trait

    def __contains__(self, name: object) -> bool:
        e = self._reg._entries.get(name)  # type: ignore[call-overload]
        return bool(e is not None and e.traits.get(self._trait))

    def __iter__(self) -> Iterator[str]:
        return iter(self._reg.with_trait(self._trait))

    def __len__(self) -> int:
        return len(self._reg.with_trait(self._trait))

    @classmethod
    def _from_iterable(cls, it) -> frozenset:
        return frozenset(it)  # the result of |, &, -: a plain snapshot

    def __repr__(self) -> str:
        return f"TraitSet({self._trait!r}: {sorted(self)})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a literal | inside a Markdown table cell


def markdown_table(reg: Registry, traits: Mapping[str, str] | None = None) -> str:
    """The docs table of a registry: one row per entry (its aliases, the names of its parameters
    when the registry has any, the traits named in ``traits`` {trait: shown text}, its description)."""
    traits, with_params = traits or {}, bool(reg.param_fields())
    cols = ["name"] + ["parameters"] * with_params + ["needs"] * bool(traits) + ["description"]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for e in reg.entries():
        cells = [", ".join(f"`{n}`" for n in (e.name, *e.aliases))]
        if with_params:
            cells.append(", ".join(f"`{f.name}`" for f in e.param_fields()) or "-")
        if traits:
            cells.append(", ".join(text for t, text in traits.items() if e.traits.get(t)) or "-")
        rows.append("| " + " | ".join(cells + [_cell(e.doc)]) + " |")
    return "\n".join(rows)


def params_table(reg: Registry, section: str) -> str:
    """The docs table of a registry's hyper-parameters, one row per config key
    ``<section>.<name>``: default, valid range, the entries that read it, description."""
    rows = ["| key | default | range | read by | description |", "|---|---|---|---|---|"]
    for name, f in reg.param_fields().items():
        users = ", ".join(f"`{e.name}`" for e in reg.entries() if name in {g.name for g in e.param_fields()})
        rng = f.metadata["range"] or "-"
        rows.append(f"| `{section}.{name}` | {f.default} | {rng} | {users} | {_cell(f.metadata['doc'])} |")
    return "\n".join(rows)
