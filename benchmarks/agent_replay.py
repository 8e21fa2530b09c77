"""Agent sessions replayed against the engine: what suffix drafting (issue 50) gains where clients are agents.

    python -m benchmarks.agent_replay --model target.gguf [--draft draft.gguf] [--rounds 2] [--tokens 256]
        [--sessions coding,tools,retry,interleaved] [--configs plain,previous,default] [--temperature 0]
        [--json out.json] [--markdown out.md]

Each session is a list of turns; a turn's prompt is the conversation so far (ChatML), in which the model's
own earlier answers stand as the assistant's messages, so every turn resends the growing conversation as an
agent does:

* ``coding``: an agent writes a module, then edits it over three turns (each answer the whole module again);
* ``tools``: a tool-calling loop: the model answers each request with a tool call, gets a result, and is asked
  again with one argument changed;
* ``retry``: the same question asked again in a new conversation, twice (a client retrying);
* ``interleaved``: two similar sessions (two agents writing sibling modules) whose turns alternate.

Configurations: ``plain`` (``drafter none``), ``previous`` (what a request with no options got before suffix
drafting: ``draft_suffix false``; with no DRAFT that is plain decoding too) and ``default`` (no options: the
suffix drafter, or ``model+suffix`` with a DRAFT). Every configuration replays every session from an empty
store of earlier outputs (the store is what the session itself wrote), one after another in each round, so
a slow patch of the machine hits them alike. The table gives, per session and turn, the median tokens/s,
the ratio to plain and the acceptance; the summary the ratio over the turns after the first of each session
and over the retried questions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

import torch

from benchmarks.output import host_line
from engine.contract.options import Options
from engine.contract.protocol import GenerateRequest, GenerateResult, LoadSpec
from engine.runtime import ModelRuntime

SYSTEM = "You are a careful coding assistant. Answer with code only, no explanations."

TOOLS_SYSTEM = (
    "You are an assistant that uses tools. To call a tool, answer with exactly one JSON object on one line: "
    '{"tool": "<name>", "arguments": {...}} and nothing else. Tools: get_weather(city: string, unit: '
    '"celsius" or "fahrenheit", days: integer) returns a forecast; search_flights(origin: string, destination: '
    "string, date: string YYYY-MM-DD, passengers: integer) returns flights.")


@dataclass(frozen=True)
class Turn:
    user: str
    tool_result: str = ""  # for the tools session: the result sent back after the model's call
    new_conversation: bool = False  # the retry: the conversation starts over with this turn
    conversation: str = ""  # which of the session's conversations the turn continues (interleaved sessions)


@dataclass(frozen=True)
class Session:
    name: str
    system: str
    turns: tuple[Turn, ...]


CODING = Session("coding", SYSTEM, (
    Turn("Write a Python module `inventory.py` with a dataclass `Item` (name, price, quantity) and a class "
         "`Inventory` with methods `add(item)`, `remove(name)`, `total_value()` and `find(name)`. Include docstrings."),
    Turn("Add a method `low_stock(threshold)` that returns the items whose quantity is below the threshold. "
         "Answer with the whole module."),
    Turn("Rename `total_value` to `value` everywhere and make `remove` raise KeyError for an unknown name. "
         "Answer with the whole module."),
    Turn("Add type hints to every method that lacks them. Answer with the whole module."),
))

TOOLS = Session("tools", TOOLS_SYSTEM, (
    Turn("What will the weather be in Lisbon for the next 3 days, in celsius?",
         tool_result='{"city": "Lisbon", "forecast": [21, 23, 22], "unit": "celsius"}'),
    Turn("And in Porto, same settings?",
         tool_result='{"city": "Porto", "forecast": [18, 19, 19], "unit": "celsius"}'),
    Turn("Now Madrid for 5 days, in fahrenheit.",
         tool_result='{"city": "Madrid", "forecast": [82, 84, 85, 83, 81], "unit": "fahrenheit"}'),
    Turn("Find flights from Lisbon to Madrid on 2027-01-15 for 2 passengers.",
         tool_result='{"flights": [{"id": "TP1024", "departs": "08:10"}, {"id": "IB3117", "departs": "12:45"}]}'),
    Turn("Same flights search but for 3 passengers.",
         tool_result='{"flights": [{"id": "TP1024", "departs": "08:10"}]}'),
))

RETRY_QUESTION = ("Write a Python function `parse_duration(text)` that parses strings like '1h30m', '45s' or "
                  "'2h' into a number of seconds, raising ValueError on bad input. Include a docstring and "
                  "three doctest examples.")
RETRY = Session("retry", SYSTEM, (
    Turn(RETRY_QUESTION),
    Turn(RETRY_QUESTION, new_conversation=True),
    Turn(RETRY_QUESTION, new_conversation=True),
))

LIBRARY = (
    Turn("Write a Python module `library.py` with a dataclass `Book` (title, author, year, available) and a "
         "class `Library` with methods `add(book)`, `lend(title)`, `give_back(title)` and `available_books()`. "
         "Include docstrings."),
    Turn("Add a method `by_author(author)` returning the author's books sorted by year. Answer with the whole "
         "module."),
)
BOOKSTORE = (
    Turn("Write a Python module `bookstore.py` with a dataclass `Book` (title, author, year, price) and a "
         "class `Bookstore` with methods `add(book)`, `sell(title)`, `restock(title)` and `in_stock()`. "
         "Include docstrings."),
    Turn("Add a method `by_author(author)` returning the author's books sorted by year. Answer with the whole "
         "module."),
)
# two sessions whose turns alternate: A1 B1 A2 B2 (the turns carry which conversation they belong to)
INTERLEAVED = Session("interleaved", SYSTEM, tuple(
    replace(turn, conversation=key) for pair in zip(LIBRARY, BOOKSTORE) for key, turn in zip("ab", pair)))

SESSIONS = {s.name: s for s in (CODING, TOOLS, RETRY, INTERLEAVED)}

CONFIGS = {
    "plain": {"drafter": "none"},
    "previous": {"draft_suffix": False},  # a request with no options, before suffix drafting
    "default": {},  # a request with no options now
}


def chatml(system: str, messages: list[tuple[str, str]]) -> str:
    text = f"<|im_start|>system\n{system}<|im_end|>\n"
    for role, content in messages:
        text += f"<|im_start|>{role}\n{content}<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


@dataclass
class TurnResult:
    session: str
    turn: int
    config: str
    retry: bool
    tok_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    drafter: str = ""


def generate(engine: ModelRuntime, prompt: str, options: dict) -> tuple[str, GenerateResult]:
    text, result = "", None
    for item in engine.generate(GenerateRequest(prompt=prompt, options=Options.from_map(options))):
        if isinstance(item, GenerateResult):
            result = item
        else:
            text += item.text
    assert result is not None
    return text, result


def replay(engine: ModelRuntime, session: Session, options: dict, record) -> None:
    """One session from an empty store of outputs; ``record(turn_index, retry, result)`` after each turn."""
    engine.outputs.clear()
    conversations: dict[str, list[tuple[str, str]]] = {}
    for i, turn in enumerate(session.turns):
        messages = conversations.setdefault(turn.conversation, [])
        if turn.new_conversation:
            messages.clear()
        messages.append(("user", turn.user))
        answer, result = generate(engine, chatml(session.system, messages), options)
        messages.append(("assistant", answer))
        if turn.tool_result:
            messages.append(("user", f"Tool result: {turn.tool_result}"))
        record(i, turn.new_conversation, result)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="num_predict of every turn")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--sessions", default="coding,tools,retry,interleaved")
    ap.add_argument("--configs", default="plain,previous,default")
    ap.add_argument("--num-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    engine = ModelRuntime.load(LoadSpec(model_path=args.model, draft_path=args.draft, num_ctx=args.num_ctx))
    sessions = [s for s in args.sessions.split(",") if s]
    configs = [c for c in args.configs.split(",") if c]
    unknown = [s for s in sessions if s not in SESSIONS] + \
        [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown session or config: {', '.join(unknown)}")
    base = {"temperature": args.temperature, "num_predict": args.tokens, "seed": 7, "num_ctx": args.num_ctx}
    cells: dict[tuple[str, int, str], TurnResult] = {}
    t0 = time.perf_counter()
    for rnd in range(args.rounds):
        for sname in sessions:
            for cname in configs:
                def record(i, retry, result, sname=sname, cname=cname):
                    cell = cells.setdefault((sname, i, cname), TurnResult(sname, i, cname, retry))
                    secs = result.eval_duration_ns / 1e9
                    cell.tok_s.append(result.eval_count / secs if secs > 0 else 0.0)
                    cell.tokens.append(result.eval_count)
                    cell.drafted.append(result.speculation.draft_n)
                    cell.accepted.append(result.speculation.draft_n_accepted)
                    cell.drafter = result.speculation.drafter
                replay(engine, SESSIONS[sname], dict(base, **CONFIGS[cname]), record)
            print(f"round {rnd + 1}/{args.rounds} {sname} done ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)

    rows = []
    for (sname, i, cname), cell in cells.items():
        plain = cells.get((sname, i, "plain"))
        tok_s = statistics.median(cell.tok_s)
        ratio = tok_s / statistics.median(plain.tok_s) if plain else float("nan")
        drafted = sum(cell.drafted)
        rows.append({"session": sname, "turn": i + 1, "config": cname, "drafter": cell.drafter,
                     "retry": cell.retry, "tokens": statistics.median(cell.tokens), "tok_s": round(tok_s, 2),
                     "ratio": round(ratio, 3),
                     "acceptance": round(sum(cell.accepted) / drafted, 3) if drafted else None})
    summary = summarize(rows, configs)
    table = markdown(rows, summary)
    header = (f"# Agent sessions replayed\n\n{host_line(torch.get_num_threads())}\n\n"
              f"`python -m benchmarks.agent_replay {' '.join(argv if argv is not None else sys.argv[1:])}`, "
              f"started {started}; weight format {engine.facts.weight_format}\n\n")
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(header + table + "\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "draft": args.draft, "rounds": args.rounds, "tokens": args.tokens,
                       "temperature": args.temperature, "rows": rows, "summary": summary}, fh, indent=1)
    return 0


def summarize(rows: list[dict], configs: list[str]) -> dict[str, dict[str, float]]:
    """Per configuration: tokens/s over plain's for the turns after each session's first (total tokens over total
    seconds, so long turns weigh as they take), and for the retried questions alone."""
    def ratio(selected: list[dict], cname: str) -> float:
        mine = [r for r in selected if r["config"] == cname]
        plain = [r for r in selected if r["config"] == "plain"]
        if not mine or not plain:
            return float("nan")
        def rate(rs):
            return sum(r["tokens"] for r in rs) / sum(r["tokens"] / r["tok_s"] for r in rs if r["tok_s"] > 0)
        return round(rate(mine) / rate(plain), 3)

    later = [r for r in rows if r["turn"] > 1]
    retried = [r for r in rows if r["retry"]]
    return {c: {"after_first_turn": ratio(later, c), "retried": ratio(retried, c)} for c in configs if c != "plain"}


def markdown(rows: list[dict], summary: dict) -> str:
    out = ["| session | turn | config | drafter | tokens | tok/s | x plain | acceptance |",
           "|---|---:|---|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["session"], r["turn"], r["config"])):
        acc = "" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        out.append(f"| {r['session']} | {r['turn']}{' (retry)' if r['retry'] else ''} | {r['config']} | "
                   f"{r['drafter']} | {r['tokens']:.0f} | {r['tok_s']:.1f} | {r['ratio']:.2f} | {acc} |")
    out += ["", "| config | x plain, turns after the first | x plain, retried questions |", "|---|---:|---:|"]
    out += [f"| {c} | {s['after_first_turn']} | {s['retried']} |" for c, s in summary.items()]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
