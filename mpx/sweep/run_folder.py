"""Run folders that are URLs (`gs://bucket/path`): checkpoints there, the other files staged.

Orbax writes checkpoints to a URL itself (tensorstore's gcs driver; every process takes
part), so `checkpoints/` lives at the URL. The run's other files (config.json,
metrics.jsonl, summaries, plots, TensorBoard events, an experiment's own files) are
appended to and rewritten in place, which object stores cannot do; process 0 writes them
into a local staging folder and `push` uploads what changed. The run loop pushes before
every checkpoint save, so the bucket's metrics always reach the latest checkpoint (a
resume drops the records past it), and once more at the end; a file removed from the
staging folder (a resume's replaced TensorBoard events) is removed from the URL as well.
`pull` makes the staging folder a fresh copy of the URL's files, so `--resume` works from
any machine.

A local run folder is its own staging folder: `push` and `pull` do nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil

from etils import epath

STAGING_ENV = "MPX_STAGING_DIR"  # Where URL runs stage their files (default below).
# gcsfs waits for a bucket's answer without a limit: one that never comes would hold the
# run for ever. Past this many seconds a request fails as a timeout, which mpx retries
# (`checkpoint.retrying`). Set before any gs:// filesystem is made; a value the user gave
# fsspec's config ("gs": {"requests_timeout": ...}) wins.
REQUEST_TIMEOUT_S = 120.0
_CHECKPOINTS = "checkpoints"
_MANIFEST = ".mpx-pushed.json"  # In the staging folder: what the last push uploaded.
_OWN = ".mpx-"  # mpx's own top-level files (the manifest, the run's lock): never copied.


def _bounded_requests() -> None:
  import fsspec.config
  fsspec.config.conf.setdefault("gs", {}).setdefault("requests_timeout", REQUEST_TIMEOUT_S)


_bounded_requests()


def is_url(out: str | os.PathLike) -> bool:
  """Whether `out` is a URL (gs://...) rather than a local path."""
  return "://" in os.fspath(out)


def check_url(out: str) -> None:
  """Only gs:// is tested (against a GCS emulator); other schemes are refused by name."""
  scheme, _, rest = out.partition("://")
  if scheme != "gs":
    raise ValueError(f"--out {out}: {scheme}:// run folders are not supported; use a gs:// "
                     "URL or a local (or mounted) path.")
  bucket, _, path = rest.partition("/")
  if not bucket or not path.strip("/"):
    raise ValueError(f"--out {out}: give a folder inside the bucket, gs://BUCKET/PATH.")
  if not importlib.util.find_spec("gcsfs"):
    raise ValueError(f"--out {out}: gs:// needs gcsfs (epath's filesystem for buckets, and "
                     "the run folder's lock): pip install 'mpx[gcs]'.")


def staging_dir(out: str) -> pathlib.Path:
  """The local folder a URL run's files are written to before they are uploaded:
  $MPX_STAGING_DIR (default ~/.cache/mpx/staging) / the URL's bucket and path, plus a
  hash of the URL so that two URLs never share one."""
  base = pathlib.Path(os.environ.get(STAGING_ENV) or
                      pathlib.Path.home() / ".cache" / "mpx" / "staging")
  digest = hashlib.sha256(out.encode()).hexdigest()[:8]
  return base / f"{out.partition('://')[2].strip('/').replace('/', '_')}-{digest}"


def checkpoint_root(out: str | os.PathLike) -> epath.Path:
  """The folder of a run's checkpoints (one sub-folder per group)."""
  return epath.Path(out) / _CHECKPOINTS


def _files(root: epath.Path, skip_top: str) -> list[str]:
  """Relative paths of the files under `root`, leaving out the top-level `skip_top`."""
  found, todo = [], [(root, "")]
  while todo:
    folder, rel = todo.pop()
    for child in folder.iterdir() if folder.is_dir() else []:
      name = f"{rel}{child.name}"
      if name == skip_top or name.startswith(_OWN):
        continue
      if child.is_dir():
        todo.append((child, name + "/"))
      else:
        found.append(name)
  return sorted(found)


def pull(out: str | os.PathLike, local: pathlib.Path) -> None:
  """Makes `local` a copy of the URL's files (all but checkpoints/); nothing for a path."""
  if not is_url(out):
    return
  shutil.rmtree(local, ignore_errors=True)
  local.mkdir(parents=True)
  root = epath.Path(out)
  for rel in _files(root, _CHECKPOINTS):
    (local / rel).parent.mkdir(parents=True, exist_ok=True)
    (local / rel).write_bytes((root / rel).read_bytes())
  _write_manifest(local, _stats(local))


def _stats(local: pathlib.Path) -> dict[str, list[int]]:
  stats = {rel: (local / rel).stat() for rel in _files(epath.Path(local), _CHECKPOINTS)}
  return {rel: [st.st_size, st.st_mtime_ns] for rel, st in stats.items()}


def _write_manifest(local: pathlib.Path, stats: dict) -> None:
  (local / _MANIFEST).write_text(json.dumps(stats))


def push(local: str | os.PathLike, out: str | os.PathLike) -> list[str]:
  """Uploads the files of `local` that changed since the last push (size or mtime) to
  the URL `out`, then removes from it the files the last push or pull held that `local`
  no longer does (e.g. the TensorBoard event file a resume replaces), so that the bucket
  holds what a local run folder would; returns the uploaded relative paths. What the
  staging folder never held stays. Nothing for a path."""
  if not is_url(out):
    return []
  local = pathlib.Path(local)
  manifest = local / _MANIFEST
  pushed = json.loads(manifest.read_text()) if manifest.is_file() else {}
  stats = _stats(local)
  changed = [rel for rel, stat in stats.items() if pushed.get(rel) != stat]
  root = epath.Path(out)
  for rel in changed:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes((local / rel).read_bytes())
  for rel in sorted(set(pushed) - set(stats)):  # After the uploads: a kill keeps both.
    if (root / rel).exists():
      (root / rel).unlink()
  _write_manifest(local, stats)
  return changed
