"""The API reference builds with pdoc from the module list docs/api.md gives, and every
public function, class and method of those modules has a docstring."""

import importlib
import inspect
import pathlib
import re

import pdoc

ROOT = pathlib.Path(__file__).parents[1]


def _reference_modules() -> list[str]:
  command = re.search(r"^pdoc -o site/api (.+)$", (ROOT / "docs/api.md").read_text(), re.M)
  return command.group(1).split()


def _undocumented(module_name: str) -> list[str]:
  module = importlib.import_module(module_name)
  missing = [] if inspect.getdoc(module) else [module_name]
  public = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
  for name in public:
    obj = getattr(module, name)
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
      continue
    if not obj.__module__.startswith("mpx"):
      continue
    if not inspect.getdoc(obj):
      missing.append(f"{module_name}.{name}")
    if inspect.isclass(obj):
      missing += [f"{module_name}.{name}.{attr}" for attr, member in vars(obj).items()
                  if not attr.startswith("_") and inspect.isfunction(member)
                  and not inspect.getdoc(member)]
  return missing


def test_the_reference_builds_and_documents_every_public_name(tmp_path):
  modules = _reference_modules()
  pdoc.pdoc(*modules, output_directory=tmp_path)
  for name in modules:
    page = tmp_path / (name.replace(".", "/") + ".html")
    assert page.exists(), f"pdoc wrote no page for {name}"
  assert [m for name in modules for m in _undocumented(name)] == []
