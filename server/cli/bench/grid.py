"""The settings a benchmark sweeps: named sets of per-request speculation options.

The default grid (each part switchable from the command line):

* ``plain``: no speculation (``drafter: none``), the reference every ratio is taken against;
* ``strict-nK``: lossless rejection sampling with a fixed draft length K (``--n-max``);
* ``relaxedN-nK``: the lossy relaxed rule (a drafted token in the target's top N is accepted) at
  draft length K (``--relaxed`` x ``--relaxed-n-max``);
* ``adaptive``: the adaptive depth controller with cap ``--adaptive-n-max``;
* ``ngram-nK`` and ``ngram-adaptive``: n-gram prompt lookup (``--ngram-n-max``; off with ``--no-ngram``).

Draft-model settings ask for ``drafter: auto``, which is the model's DRAFT layer, or its MTP head when
it has no DRAFT; a model with neither runs only plain and n-gram settings.

A ``--grid FILE`` (JSON) is either the same knobs (``{"n_max": [1, 2], "relaxed": [2, 5],
"relaxed_n_max": [2], "adaptive": true, "adaptive_n_max": 8, "ngram": false, "ngram_n_max": 4}``) or
an explicit list of settings (``{"settings": [{"name": "mine", "options": {"draft_num_predict": 3,
"draft_p_min": 0.5}}]}`` or just the list); ``plain`` is added when missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .files import read_json


class GridError(ValueError):
    pass


@dataclass(frozen=True)
class Setting:
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    kind: str = "custom"  # plain | strict | relaxed | adaptive | ngram | custom
    n_max: int | None = None
    relaxed_top_n: int = 0

    @property
    def lossless(self) -> bool:
        """Strict rejection sampling keeps the target's distribution; the relaxed rule does not."""
        return self.relaxed_top_n == 0

    @property
    def drafter(self) -> str:
        return str(self.options.get("drafter", "auto"))

    @property
    def needs_draft_model(self) -> bool:
        """Uses the DRAFT layer (or MTP head) rather than n-gram lookup or nothing."""
        return self.drafter in ("auto", "model", "mtp")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "n_max": self.n_max, "relaxed_top_n": self.relaxed_top_n,
                "lossless": self.lossless, "options": dict(self.options)}


PLAIN = Setting("plain", {"drafter": "none"}, kind="plain", n_max=0)


def _fixed(n: int, **extra: Any) -> dict[str, Any]:
    return {"drafter": "auto", "draft_num_predict": n, "draft_schedule": "fixed", "relaxed_top_n": 0, **extra}


def strict(n: int) -> Setting:
    return Setting(f"strict-n{n}", _fixed(n), kind="strict", n_max=n)


def relaxed(top_n: int, n: int) -> Setting:
    return Setting(f"relaxed{top_n}-n{n}", _fixed(n, relaxed_top_n=top_n), kind="relaxed", n_max=n,
                   relaxed_top_n=top_n)


def build_grid(n_max: Iterable[int] = (1, 2, 4), relaxed_top: Iterable[int] = (1, 2, 5, 20),
               relaxed_n_max: Iterable[int] = (2, 4), adaptive: bool = True, adaptive_n_max: int = 8,
               ngram: bool = True, ngram_n_max: int = 4) -> list[Setting]:
    out = [PLAIN]
    out += [strict(n) for n in n_max]
    out += [relaxed(top, n) for n in relaxed_n_max for top in relaxed_top]
    if adaptive:
        out.append(Setting("adaptive", {"drafter": "auto", "draft_num_predict": adaptive_n_max,
                                        "draft_schedule": "adaptive", "relaxed_top_n": 0},
                           kind="adaptive", n_max=adaptive_n_max))
    if ngram:
        out.append(Setting(f"ngram-n{ngram_n_max}", {"drafter": "ngram", "draft_num_predict": ngram_n_max,
                                                     "draft_schedule": "fixed", "relaxed_top_n": 0},
                           kind="ngram", n_max=ngram_n_max))
        out.append(Setting("ngram-adaptive", {"drafter": "ngram", "draft_num_predict": max(ngram_n_max, 8),
                                              "draft_schedule": "adaptive", "relaxed_top_n": 0},
                           kind="ngram", n_max=max(ngram_n_max, 8)))
    return dedupe(out)


def dedupe(settings: Iterable[Setting]) -> list[Setting]:
    seen: set[str] = set()
    out = []
    for s in settings:
        if s.name not in seen:
            seen.add(s.name)
            out.append(s)
    return out


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise GridError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise GridError(f"{flag} values must be at least 1, got {text!r}")
    return values


def infer_setting(name: str, options: dict[str, Any]) -> Setting:
    """A Setting from explicit options, its kind read from them."""
    opts = dict(options)
    if "n_max" in opts:  # the alias, as the server accepts it
        opts["draft_num_predict"] = opts.pop("n_max")
    drafter = str(opts.get("drafter", "auto"))
    n = opts.get("draft_num_predict")
    top = int(opts.get("relaxed_top_n", 0) or 0)
    if drafter == "none" or n == 0:
        kind = "plain"
    elif drafter == "ngram":
        kind = "ngram"
    elif top > 0:
        kind = "relaxed"
    elif opts.get("draft_schedule", "adaptive") == "adaptive":
        kind = "adaptive"
    else:
        kind = "strict"
    if kind != "plain" and "drafter" not in opts:
        opts["drafter"] = "auto"
    return Setting(name, opts, kind=kind, n_max=int(n) if n is not None else None, relaxed_top_n=top)


def load_grid(path: str | Path) -> list[Setting]:
    data = read_json(path, "grid", GridError)
    if isinstance(data, dict) and "settings" in data:
        data = data["settings"]
    if isinstance(data, list):
        settings = []
        for i, item in enumerate(data):
            if not isinstance(item, dict) or not isinstance(item.get("options", {}), dict):
                raise GridError(f"grid setting {i} must be an object with a name and options")
            name = str(item.get("name") or f"setting{i + 1}")
            settings.append(PLAIN if name == "plain" else infer_setting(name, item.get("options", {})))
        if not any(s.kind == "plain" for s in settings):
            settings.insert(0, PLAIN)
        return dedupe(settings)
    if isinstance(data, dict):
        known = {"n_max", "relaxed", "relaxed_n_max", "adaptive", "adaptive_n_max", "ngram", "ngram_n_max"}
        unknown = set(data) - known
        if unknown:
            raise GridError(f"unknown grid keys: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        try:
            return build_grid(n_max=[int(x) for x in data.get("n_max", (1, 2, 4))],
                              relaxed_top=[int(x) for x in data.get("relaxed", (1, 2, 5, 20))],
                              relaxed_n_max=[int(x) for x in data.get("relaxed_n_max", (2, 4))],
                              adaptive=bool(data.get("adaptive", True)),
                              adaptive_n_max=int(data.get("adaptive_n_max", 8)),
                              ngram=bool(data.get("ngram", True)), ngram_n_max=int(data.get("ngram_n_max", 4)))
        except (TypeError, ValueError) as e:
            raise GridError(f"bad grid value: {e}") from None
    raise GridError("the grid file must hold an object or a list of settings")
