"""The constraints file for the TPU workers' install, from this machine's environment.

    python launch/tpu_constraints.py --out build/tpu_pod/mpx-constraints.txt

Writes one `name==version` line per distribution installed in the environment of the
Python that runs it (sorted by name), so that the workers resolve mpx's dependencies to the
versions this environment resolved (`uv pip install -c FILE`; a constraint on a package
nothing requires is ignored). Left out, because they are built for one platform or
accelerator and the workers get their own: jaxlib, the CUDA and ROCm plugins of jax,
libtpu, NVIDIA's wheels, versions with a local label (`2.3.0+cpu`), and what was installed
from a path or a VCS URL (mpx itself, an editable checkout); also pip, setuptools, wheel
and uv. `jax` stays: `jax[tpu]` is pinned to this version. The first line, a comment,
names the environment. Exits 2, saying so, when jax is not installed here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys

# Built for one platform or accelerator: the workers resolve their own.
PLATFORM = re.compile(r"^(jaxlib|jax[-_](cuda|rocm).*|libtpu.*|nvidia[-_].*|cuda[-_].*|"
                      r"pip|setuptools|wheel|uv|distribute)$")


def _name(dist) -> str:
  """The normalised project name (PEP 503)."""
  return re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()


def _from_a_path_or_vcs(dist) -> bool:
  """Installed from a local folder, a file or a VCS URL (PEP 610), not from an index."""
  text = dist.read_text("direct_url.json")
  if not text:
    return False
  url = json.loads(text)
  return "dir_info" in url or "vcs_info" in url or url.get("url", "").startswith("file:")


def constraints() -> list[str]:
  lines = {}
  for dist in importlib.metadata.distributions():
    if not dist.metadata["Name"]:
      continue
    name, version = _name(dist), dist.version
    if PLATFORM.match(name) or "+" in version or _from_a_path_or_vcs(dist):
      continue
    lines[name] = f"{name}=={version}"
  if "jax" not in lines:
    raise SystemExit(f"tpu_constraints.py: jax is not installed for {sys.executable}: run "
                     "this with the Python of the environment you run mpx in here (tpu_pod.sh: "
                     "MPX_PYTHON=.venv/bin/python), whose jax version the workers get")
  return [lines[name] for name in sorted(lines)]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="the constraints file to write")
  args = parser.parse_args(argv)
  try:
    pins = constraints()
  except SystemExit as e:
    print(e, file=sys.stderr)
    return 2
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(f"# from {sys.executable} (Python {sys.version.split()[0]}), "
            "by launch/tpu_constraints.py\n")
    f.write("".join(line + "\n" for line in pins))
  jax = next(line for line in pins if line.startswith("jax=="))
  print(f"tpu_constraints.py: {len(pins)} pins from {sys.executable}, {jax}, in {args.out}",
        file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
