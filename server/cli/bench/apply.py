"""`tandem bench --apply`: write the winning speculation setting into the model, through the server.

The decision, in order:

* one temperature is applied: the only one measured, or, when several were, the model's own
  ``temperature`` (its PARAMETER, else the engine default) if it is among them; otherwise the command
  refuses before the sweep (:func:`apply_temperature`);
* the setting is that temperature's best LOSSLESS one; the overall best (possibly lossy, relaxed_top_n
  above 0) only with ``--allow-lossy`` (:func:`choose`);
* when plain decoding wins, the model is left as it is if it does not speculate by default; if it
  does (a DRAFT layer with the default ``drafter auto``), ``drafter none`` is written, since that is
  what the measurement says runs fastest;
* the setting's speculation knobs only (drafter, draft_num_predict, draft_schedule, relaxed_top_n, ...;
  never the sampling options the sweep ran with) go to ``/api/create`` with ``from`` = the model and
  the tandem-only ``tuning`` field naming the measurement for each (see :mod:`.provenance`). The new
  model is ``--as NEW``, else the model itself (its manifest replaced, as ``ollama create`` over an
  existing name does). The store is never written directly: the server may be another machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .grid import Setting
from .provenance import Measurement

class ApplyError(Exception):
    """--apply cannot go on (the command reports it as a bench error)."""


#: speculation knobs a setting may carry that are worth keeping in a model (draft_trace is debugging)
_NOT_APPLIED = frozenset({"draft_trace"})


def model_parameters(show: dict[str, Any]) -> dict[str, str]:
    """The model's PARAMETERs as /api/show's ``parameters`` text lists them (``name`` padded to 30)."""
    out: dict[str, str] = {}
    for line in (show.get("parameters") or "").splitlines():
        out.setdefault(line[:30].strip(), line[30:].strip())
    return out


def apply_temperature(temperatures: list[float], show: dict[str, Any]) -> float:
    """The temperature whose best setting is applied; raises ApplyError (before any measuring)."""
    from engine.contract.options import DEFAULT_OPTIONS

    if len(temperatures) == 1:
        return temperatures[0]
    own_text = model_parameters(show).get("temperature")
    try:
        own = float(own_text) if own_text is not None else float(DEFAULT_OPTIONS["temperature"])
    except ValueError:
        own = float(DEFAULT_OPTIONS["temperature"])
    for t in temperatures:
        if abs(t - own) < 1e-9:
            return t
    where = "its temperature PARAMETER" if own_text is not None else "the default temperature"
    raise ApplyError(f"--apply writes the best setting of one temperature, and "
                     f"{', '.join(f'{t:g}' for t in temperatures)} were asked for, none of them the model's own "
                     f"({own:g}, {where}); pass a single --temperature (e.g. --temperature {own:g})")


def speculates_by_default(show: dict[str, Any]) -> bool:
    effective = (show.get("speculation") or {}).get("effective") or {}
    return effective.get("drafter", "none") != "none" and int(effective.get("draft_num_predict") or 0) > 0


@dataclass(frozen=True)
class Choice:
    setting: Setting
    ratio: float
    note: str | None  # why this one and not the overall best, when it is not
    overall_best: bool


def choose(best: list[dict[str, Any]], temperature: float, settings: list[Setting], allow_lossy: bool) -> Choice:
    by_name = {s.name: s for s in settings}
    entry = next((b for b in best if abs(b["temperature"] - temperature) < 1e-9), None)
    if entry is None:
        raise ApplyError(f"nothing was measured at temperature {temperature:g}; nothing applied")
    top = by_name[entry["setting"]]
    if top.lossless or allow_lossy:
        return Choice(top, entry["ratio"], None, True)
    safe = entry.get("best_lossless") or {"setting": "plain", "ratio": 1.0}
    note = (f"the fastest setting, {top.name} ({entry['ratio']:.2f}x plain), is lossy (relaxed_top_n "
            f"{top.relaxed_top_n}: output no longer follows the model's own distribution); applying the best "
            f"lossless one, {safe['setting']} ({safe['ratio']:.2f}x); --allow-lossy applies {top.name}")
    return Choice(by_name[safe["setting"]], safe["ratio"], note, False)


def speculation_options(setting: Setting) -> dict[str, Any]:
    from engine.contract.options import OPTION_ALIASES, SPECULATION_OPTIONS

    out = {}
    for key, value in setting.options.items():
        key = OPTION_ALIASES.get(key, key)
        if key in SPECULATION_OPTIONS and key not in _NOT_APPLIED:
            out[key] = value
    return out


@dataclass(frozen=True)
class Applied:
    model: str  # the name written
    options: dict[str, Any]  # empty when nothing was written
    message: str


def apply_best(client: Any, report: dict[str, Any], settings: list[Setting], temperature: float,
               show: dict[str, Any], *, source: str, target: str, allow_lossy: bool,
               say: Callable[[str], None]) -> Applied:
    """Pick the setting, then write it with its provenance through ``/api/create``."""
    choice = choose(report["best"], temperature, settings, allow_lossy)
    if choice.note:
        say(f"note: {choice.note}")
    if choice.setting.kind == "plain":
        if not speculates_by_default(show):
            msg = (f"plain decoding was fastest at temperature {temperature:g} and {source} does not speculate "
                   f"by default: nothing to apply")
            return Applied(target, {}, msg)
        options = {"drafter": "none"}
    else:
        options = speculation_options(choice.setting)
        if not options:
            raise ApplyError(f"setting {choice.setting.name} sets no speculation option; nothing to apply")
    entry = next(b for b in report["best"] if abs(b["temperature"] - temperature) < 1e-9)
    cfg = report["config"]
    runs_measured = len({m["run"] for m in report["measurements"]})
    measured = Measurement(
        setting=choice.setting.name, ratio=choice.ratio, lossless=choice.setting.lossless,
        prompts=[p["name"] for p in cfg["prompts"]], temperature=temperature, num_predict=cfg["num_predict"],
        runs=runs_measured, measured_at=report["created_at"], server_version=str(report.get("server_version", "")),
        within_noise=entry.get("within_noise") if choice.overall_best else None,
        runner_up=entry.get("runner_up") if choice.overall_best else None,
        runner_up_ratio=entry.get("runner_up_ratio") if choice.overall_best else None)
    claim = measured.claim()
    body = {"model": target, "from": source, "parameters": options, "tuning": {k: claim for k in options}}
    for _ in client.create(body):
        pass
    knobs = ", ".join(f"{k} {v}" for k, v in options.items())
    what = "plain decoding" if choice.setting.kind == "plain" else choice.setting.name
    msg = (f"applied {what} to {target}: {knobs} ({choice.ratio:.2f}x plain at temperature {temperature:g}"
           f"{', within noise of the runner-up' if measured.within_noise else ''})")
    return Applied(target, options, msg)
