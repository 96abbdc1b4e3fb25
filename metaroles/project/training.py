"""Runs as training data: every model call of a run (or of every trial of an evaluation) as JSON lines.

Three shapes (``metaroles export RUN_DIR --format sft|trajectories|atif``):

- ``sft``: a line per call, ``{"trial", "role", "action", "messages", "reward", "scores"}``, whose
  ``messages`` are the chat messages exactly as the model got them, then its answer as the
  ``assistant`` message (tool calls included) — the conversational format trainers read;
- ``trajectories``: a line per role of a run, its calls in order as ``steps`` (``action``,
  ``messages``, ``answer``), with the run's reward: for reinforcement learning over whole episodes;
- ``atif``: a line per role of a run, an ATIF v1.7 trajectory (the Agent Trajectory Interchange
  Format of Harbor, NeMo and ADP): each call's prompt as ``system``/``user`` steps (earlier answers
  it repeats marked ``is_copied_context``, a tool's result as the observation of the step that
  called it), then the answer as an ``agent`` step with its tool calls, model and metrics; the
  trajectory's totals in ``final_metrics``, the trial's reward and scores in ``extra``.

The calls come from the run's recorded model answers (``metaroles run --record FILE``, ``metaroles
eval --record``; a replayed evaluation reads the cassettes it replayed). An evaluation's scorer gives each
trial its ``scores`` and its ``reward`` (``--reward METRIC``; by default the suite's first metric).
Reading a run directory is reading data: only JSON is parsed, nothing is imported. The same
recordings and scores give the same file, byte for byte.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from metaroles.core.exceptions import ConfigError, RunDirCorrupt
from metaroles.core.files import read_text, write_atomic
from metaroles.core.text import jsonl_lines
from metaroles.llm.cassette import RUN_LINE
from metaroles.llm.human import PERSON
from metaroles.project.rundir import MANIFEST, read_manifest
from metaroles.project.sweep import read_table

FORMATS = ("sft", "trajectories", "atif")
ATIF_VERSION = "ATIF-v1.7"
CASSETTE = "cassette.jsonl"
"""A trial's recorded calls (as evaluations and sweeps record them)."""


def export_training(source: Path, target: Path, form: str, *, reward: str | None = None) -> int:
    """Write the calls of ``source`` (a run directory or an evaluation folder) to ``target``; how many lines.

    Raises:
        ConfigError: For an unknown format, a folder that is neither, or runs that recorded no calls.
    """
    if form not in FORMATS:
        raise ConfigError(f"--format {form!r} is not a training format; choose one of {', '.join(FORMATS)}")
    scores = _scores(source)
    runs = sorted(scores) if scores else [source]
    if not scores and not (source / MANIFEST).is_file():
        raise ConfigError(f"{str(source)!r} is neither a run directory nor an evaluation folder; pass one")
    metric = reward or _first_metric(source)
    lines = []
    for run in runs:
        trial_scores = scores.get(run, {})
        value = trial_scores.get(metric) if metric else None
        calls = list(recorded_calls(run))
        if form == "sft":
            lines += _sft(run.name, calls, value, trial_scores)
        elif form == "atif":
            made = (run.name, str(read_manifest(run).get("metaroles") or "unknown"))  # the version that made it
            lines += [_atif(made, role, got, value, trial_scores) for role, got in _by_role(calls).items()]
        else:
            lines += _episodes(run.name, calls, value)
    if not lines:
        raise ConfigError(
            f"{str(source)!r} recorded no model calls; run it with `metaroles run --record FILE` "
            "or `metaroles eval --record`, then export"
        )
    write_atomic(target, "".join(json.dumps(line, sort_keys=True, ensure_ascii=False) + "\n" for line in lines))
    return len(lines)


def recorded_calls(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The run's recorded calls in the order they were made: its cassettes' entries (``request``, ``response``, ...).

    Raises:
        RunDirCorrupt: For a cassette line that is not a recorded call.
    """
    for cassette in _cassettes(run_dir):
        text = read_text(cassette)
        for number, line in enumerate(jsonl_lines(text), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if number == 1 and isinstance(entry, dict) and entry.get("kind") == RUN_LINE:
                    continue  # the run it recorded, not a call
                entry["request"]["messages"], entry["response"]
            except (ValueError, KeyError, TypeError, RecursionError):
                if number == text.count("\n") + 1:  # the last line, cut short by a kill
                    warnings.warn(
                        f"{str(cassette)!r} line {number} was cut short (the run was killed while writing it): "
                        "that call is left out of the export",
                        UserWarning,
                        stacklevel=2,
                    )
                    break
                raise RunDirCorrupt(
                    f"{str(cassette)!r} line {number} is not a recorded model call; record it again"
                ) from None
            yield entry


def _cassettes(run_dir: Path) -> list[Path]:
    """Where the run's calls were recorded: its own cassettes, the file ``--record`` named, or the one it replayed."""
    own = sorted(run_dir.glob("cassette*.jsonl"))
    if own:
        return [own[0], *own[1:]] if own[0].name == CASSETTE else own
    manifest = read_manifest(run_dir)
    named = [str(manifest.get(key) or "") for key in ("cassette", "replayed_from")]
    return [Path(n) for n in named if n.endswith(".jsonl") and Path(n).is_file()][:1]


def _answer(response: dict[str, Any]) -> dict[str, Any]:
    """The model's answer as the assistant message of a chat."""
    message: dict[str, Any] = {"role": "assistant", "content": str(response.get("text") or "")}
    if response.get("tool_calls"):
        message["tool_calls"] = response["tool_calls"]
    return message


def _answered_by(response: dict[str, Any]) -> str:
    """Who answered: ``person`` (a person at a desk, ``--human``) or ``model``: a dataset keeps them apart."""
    return PERSON if response.get("model") == PERSON else "model"


def _sft(trial: str, calls: list[dict[str, Any]], reward: Any, scores: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "trial": trial,
            "role": call.get("role", ""),
            "action": call.get("action", ""),
            "messages": [*call["request"]["messages"], _answer(call["response"])],
            "answered_by": _answered_by(call["response"]),
            "reward": reward,
            "scores": scores,
        }
        for call in calls
    ]


def _episodes(trial: str, calls: list[dict[str, Any]], reward: Any) -> list[dict[str, Any]]:
    steps: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        step = {"action": call.get("action", ""), "messages": call["request"]["messages"]}
        step["answered_by"] = _answered_by(call["response"])
        steps.setdefault(call.get("role", ""), []).append(step | {"answer": _answer(call["response"])})
    return [{"trial": trial, "role": role, "steps": taken, "reward": reward} for role, taken in steps.items()]


def _by_role(calls: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The calls of each role, in the order they were made (the roles in the order they first asked)."""
    roles: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        roles.setdefault(str(call.get("role", "")), []).append(call)
    return roles


def _atif(
    run: tuple[str, str], role: str, calls: list[dict[str, Any]], reward: Any, scores: dict[str, Any]
) -> dict[str, Any]:
    """One role's calls as an ATIF trajectory (see the module); ``run``: the trial's name and metaroles' version."""
    trial, version = run
    steps: list[dict[str, Any]] = []
    called: dict[str, dict[str, Any]] = {}  # a tool call's id → the agent step that made it
    for call in calls:
        for message in call["request"]["messages"]:
            _prompt_step(steps, called, message)
        steps.append(_agent_step(len(steps) + 1, call))
        called |= {c["tool_call_id"]: steps[-1] for c in steps[-1].get("tool_calls", ())}
    usage = [call["response"].get("usage") or {} for call in calls]
    totals = {
        "total_prompt_tokens": sum(int(u.get("prompt_tokens") or 0) for u in usage),
        "total_completion_tokens": sum(int(u.get("completion_tokens") or 0) for u in usage),
        "total_cached_tokens": sum(int(u.get("cached_tokens") or 0) for u in usage),
        "total_cost_usd": round(sum(float(c["response"].get("cost") or 0.0) for c in calls), 9),
        "total_steps": len(steps),
    }
    return {
        "schema_version": ATIF_VERSION,
        "session_id": trial,
        "trajectory_id": f"{trial}/{role}",
        "agent": {"name": "metaroles", "version": version, "model_name": str(calls[0].get("model") or "")}
        | {"extra": {"role": role}},
        "steps": steps,
        "final_metrics": totals,
        "extra": {"reward": reward, "scores": scores},
    }


def _prompt_step(steps: list[dict[str, Any]], called: dict[str, dict[str, Any]], message: dict[str, Any]) -> None:
    """A message of a call's prompt as a step (or, a tool's result, as the observation of the step that called it).

    A system prompt the role was given before, and an earlier answer the prompt repeats, are marked copied context.
    """
    text, kind = _text(message.get("content")), message.get("role")
    if kind == "tool" and message.get("tool_call_id") in called:
        observation = called[message["tool_call_id"]].setdefault("observation", {"results": []})
        observation["results"].append({"source_call_id": message["tool_call_id"], "content": text})
        return
    source = {"system": "system", "assistant": "agent"}.get(str(kind), "user")
    step: dict[str, Any] = {"step_id": len(steps) + 1, "source": source, "message": text}
    if source == "agent" or (source == "system" and any(s["message"] == text for s in steps if s["source"] == source)):
        step["is_copied_context"] = True  # an earlier answer, or the same system prompt again
    steps.append(step)


def _agent_step(step_id: int, call: dict[str, Any]) -> dict[str, Any]:
    """The answer of a call: its text, its tool calls, the model and what it cost."""
    response, usage = call["response"], call["response"].get("usage") or {}
    step: dict[str, Any] = {
        "step_id": step_id,
        "source": "agent",
        "model_name": str(response.get("model") or call.get("model") or ""),
        "message": str(response.get("text") or ""),
        "metrics": {
            "prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0),
            "cached_tokens": int(usage.get("cached_tokens") or 0),
            "cost_usd": float(response.get("cost") or 0.0),
        },
        "extra": {"action": str(call.get("action", "")), "answered_by": _answered_by(response)},
    }
    if response.get("tool_calls"):
        step["tool_calls"] = [_tool_call(c) for c in response["tool_calls"]]
    return step


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call as ATIF names it: its id, function and arguments (an object; text that is none kept as ``raw``)."""
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        arguments = {"raw": function.get("arguments")}
    return {"tool_call_id": str(call.get("id", "")), "function_name": str(function.get("name", "")),
            "arguments": arguments}  # fmt: skip


def _text(content: Any) -> str:
    """A message's content as text (a list of parts: its text parts, joined)."""
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _scores(source: Path) -> dict[Path, dict[str, Any]]:
    """An evaluation's trials (their folders) and the numbers their scorer gave; empty for a single run."""
    table, trials = source / "eval.jsonl", source / "sweep.jsonl"
    if not (table.is_file() and trials.is_file()):
        return {}
    folders = {}
    for row in read_table(source):
        folders[(row.get("task"), row.get("setting"), row.get("seed"))] = source / str(row.get("trial"))
    found = {}
    for row in _json_lines(table):
        folder = folders.get((row.get("task"), row.get("setting"), row.get("seed")))
        if folder is not None and folder.parent == source and folder.is_dir():
            found[folder] = {k: v for k, v in row.items() if _number(v) and k not in ("seed",)}
    return found


def _first_metric(source: Path) -> str | None:
    """The suite's first metric, as the evaluation's summary lists it."""
    summary = source / "summary.csv"
    if not summary.is_file():
        return None
    rows = list(csv.DictReader(io.StringIO(read_text(summary))))
    return rows[0].get("metric") if rows else None


def _json_lines(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in jsonl_lines(read_text(path)):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
