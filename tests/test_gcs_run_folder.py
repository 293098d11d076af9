"""gs:// run folders: what `run_folder` uploads and downloads, and the URLs it refuses.
The whole run (preempted, resumed on a machine without the staging folder, equal to a
local run) is in test_sweep_run.py."""

import pathlib

import pytest
from etils import epath

from mpx import cli
from mpx.sweep import run_folder

TOY = str(pathlib.Path(__file__).parent / "toy_experiment.py")


def test_push_uploads_what_changed_and_pull_copies_all_but_checkpoints(bucket, tmp_path):
  out = f"{bucket}/push"
  local = tmp_path / "staged"
  (local / "plots").mkdir(parents=True)
  (local / "a.txt").write_text("a")
  (local / "plots" / "b.png").write_bytes(b"b")
  assert run_folder.push(local, out) == ["a.txt", "plots/b.png"]
  assert run_folder.push(local, out) == []
  (local / "a.txt").write_text("a2")
  assert run_folder.push(local, out) == ["a.txt"]
  assert (epath.Path(out) / "a.txt").read_text() == "a2"
  (epath.Path(out) / "checkpoints" / "g").mkdir(parents=True)
  (epath.Path(out) / "checkpoints" / "g" / "x").write_text("state")
  again = tmp_path / "again"
  run_folder.pull(out, again)
  assert sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file()
                and not p.name.startswith(".")) == ["a.txt", "plots/b.png"]
  assert (again / "a.txt").read_text() == "a2"
  assert run_folder.push(again, out) == []            # Pulled files need no upload.
  assert run_folder.push(local, str(tmp_path / "a-path")) == []  # A path is its own folder.


def test_push_removes_from_the_url_what_the_staging_folder_removed(bucket, tmp_path):
  """A resume replaces the run's TensorBoard event file (`report.MetricsWriter` removes
  the earlier one, which mirrors a log it has just cut): the next push removes it from
  the bucket too, as a local run folder has it removed. What the staging folder never
  held (another writer's file) stays."""
  out = f"{bucket}/removed"
  local = tmp_path / "staged"
  (local / "tensorboard").mkdir(parents=True)
  (local / "tensorboard" / "events.out.tfevents.1").write_bytes(b"the first run's")
  run_folder.push(local, out)
  (epath.Path(out) / "notes.txt").write_text("someone else's")
  again = tmp_path / "again"  # The resume, on a machine without the staging folder.
  run_folder.pull(out, again)
  (again / "notes.txt").unlink()  # Pulled, then removed: removed from the bucket too.
  (again / "tensorboard" / "events.out.tfevents.1").unlink()
  (again / "tensorboard" / "events.out.tfevents.2").write_bytes(b"the resumed run's")
  assert run_folder.push(again, out) == ["tensorboard/events.out.tfevents.2"]
  assert sorted(p.name for p in (epath.Path(out) / "tensorboard").iterdir()) == [
      "events.out.tfevents.2"]
  assert not (epath.Path(out) / "notes.txt").exists()
  (epath.Path(out) / "late.txt").write_text("written after the pull")
  assert run_folder.push(again, out) == []
  assert (epath.Path(out) / "late.txt").exists()


def test_staging_folders_of_two_urls_differ(monkeypatch, tmp_path):
  monkeypatch.setenv(run_folder.STAGING_ENV, str(tmp_path))
  a, b = run_folder.staging_dir("gs://b/x_y"), run_folder.staging_dir("gs://b/x/y")
  assert a != b and a.parent == b.parent == tmp_path


@pytest.mark.parametrize("out, message", [
    ("s3://bucket/x", "s3:// run folders are not supported"),
    ("gs://bucket", "gs://BUCKET/PATH"),
    ("gs://bucket/", "gs://BUCKET/PATH"),
    ("gs:///x", "gs://BUCKET/PATH")])
def test_unsupported_urls_are_refused_naming_the_fix(out, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", TOY, "--out", out])
  assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_plot_of_a_url_says_to_copy_it_first(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["plot", "gs://bucket/runs/x"])
  assert exit_info.value.code == 2 and "gcloud storage cp" in capsys.readouterr().err
