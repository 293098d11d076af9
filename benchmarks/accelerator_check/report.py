"""The budget and the report: what makes a run cut off at any moment keep what it found.

Every stage measures against one wall-clock budget and writes each finding as it comes;
the report is rewritten whole, Markdown and JSON, after every measurement.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

from mpx.sweep import memory

JSON_FILE, MARKDOWN_FILE = "accelerator_check.json", "accelerator_check.md"


def one_line(error: BaseException) -> str:
  """An error as a table cell or note: its type and first line."""
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def size_text(n: float | None) -> str:
  return "–" if n is None else memory.size(int(n))


class Budget:
  """The wall-clock budget, counted from the script's start."""

  def __init__(self, seconds: float, start: float | None = None):
    self.seconds = seconds
    self.start = time.monotonic() if start is None else start

  def left(self) -> float:
    return self.seconds - (time.monotonic() - self.start)

  def used(self) -> float:
    return time.monotonic() - self.start

  def short(self, need: float) -> str | None:
    """None if `need` seconds fit, else the note a skipped measurement gets."""
    left = self.left()
    return None if left >= need else (f"skipped: {max(left, 0):.0f} s of the budget left, "
                                      f"needs ≈ {need:.0f} s")


def _write_atomic(path: pathlib.Path, text: str) -> None:
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(text)
  os.replace(tmp, path)


class Report:
  """The findings so far, rewritten in full (Markdown and JSON) after each measurement."""

  def __init__(self, out: pathlib.Path, header: dict, budget: Budget):
    self.out, self.budget = out, budget
    self.data = {"header": header, "stages": {}}
    out.mkdir(parents=True, exist_ok=True)

  def stage(self, key: str, title: str) -> dict:
    stage = {"title": title, "status": "running", "seconds": None, "facts": {},
             "columns": [], "rows": [], "notes": []}
    self.data["stages"][key] = stage
    self.write()
    return stage

  def write(self) -> None:
    self.data["header"]["used_s"] = round(self.budget.used(), 1)
    _write_atomic(self.out / JSON_FILE, json.dumps(self.data, indent=1, default=str) + "\n")
    _write_atomic(self.out / MARKDOWN_FILE, render(self.data))


def render(data: dict) -> str:
  """The report as Markdown: a header, then per stage its facts, table and notes."""
  h = data["header"]
  lines = ["# Accelerator check", "", f"`{h['command']}`", "",
           f"{h['started']}; budget {h['budget_s']:.0f} s, {h['used_s']:.0f} s used"
           f"{'; toy sizes (--tiny)' if h['tiny'] else ''}.", ""]
  for number, stage in enumerate(data["stages"].values(), 1):
    took = "" if stage["seconds"] is None else f", {stage['seconds']:.0f} s"
    lines += [f"## {number}. {stage['title']} ({stage['status']}{took})", ""]
    lines += [f"- {name}: {value}" for name, value in stage["facts"].items()]
    if stage["facts"]:
      lines.append("")
    if stage["rows"]:
      columns = stage["columns"]
      lines += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
      lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |"
                for row in stage["rows"]]
      lines.append("")
    for table in stage.get("tables", ()):  # Further tables, ready Markdown.
      lines += [f"{table['title']}:", "", *table["markdown"], ""]
    lines += [note for note in stage["notes"] for note in (note, "")]
  return "\n".join(lines)
