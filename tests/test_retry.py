"""Storage faults that pass: what counts as one (`checkpoint.transient_cause`), and how
long mpx tries again (`checkpoint.retrying`, MPX_STORAGE_RETRY_S)."""

import errno
import os

import aiohttp
import pytest
from gcsfs.retry import HttpError

from mpx import checkpoint


@pytest.mark.parametrize("error, cause", [
    (HttpError({"code": 503, "message": "Service Unavailable"}), "HTTP 503 Service Unavailable"),
    (HttpError({"code": 429, "message": "Too Many Requests"}), "HTTP 429 Too Many Requests"),
    (TimeoutError(), "timed out"),
    (OSError(errno.EIO, os.strerror(errno.EIO), "/mnt/gcs/run/x"),
     "Input/output error: /mnt/gcs/run/x"),
    (aiohttp.ServerDisconnectedError(), "ServerDisconnectedError: Server disconnected"),
    (ValueError("UNAVAILABLE: Error writing \"x\" [source='gcs']"), "UNAVAILABLE: Error writing"),
])
def test_faults_that_pass_are_named(error, cause):
  assert checkpoint.transient_cause(error).startswith(cause)


@pytest.mark.parametrize("error", [
    HttpError({"code": 403, "message": "Forbidden"}),  # A refusal: fix it.
    OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),  # A full disk: free it.
    ValueError("PERMISSION_DENIED: x"),
    FileNotFoundError(errno.ENOENT, "x"),
    RuntimeError("a bug"),
])
def test_faults_that_need_fixing_are_not(error):
  assert checkpoint.transient_cause(error) is None


def test_a_passing_fault_is_tried_again_and_said_once_each_way(monkeypatch, capsys):
  slept, calls = [], []
  monkeypatch.setattr(checkpoint.time, "sleep", slept.append)

  def flaky():
    calls.append(1)
    if len(calls) < 4:
      raise HttpError({"code": 503, "message": "Service Unavailable"})
    return "done"

  assert checkpoint.retrying("uploading", flaky, "gs://b/run") == "done"
  assert slept == [1.0, 2.0, 4.0]
  assert capsys.readouterr().err.splitlines() == [
      "mpx: uploading gs://b/run failed (HTTP 503 Service Unavailable); trying again for up "
      "to 600 s (MPX_STORAGE_RETRY_S)",
      "mpx: uploading gs://b/run went through after 0 s"]


def test_a_fault_past_the_budget_is_storage_unavailable(monkeypatch):
  monkeypatch.setenv("MPX_STORAGE_RETRY_S", "0")
  def down():
    raise TimeoutError("read timed out")
  with pytest.raises(checkpoint.StorageUnavailable, match=r"^uploading gs://b/run failed for "
                     r"0 s, retried \(timed out \(read timed out\)\)$"):
    checkpoint.retrying("uploading", down, "gs://b/run")


def test_a_fault_to_fix_is_not_tried_again(monkeypatch):
  monkeypatch.setattr(checkpoint.time, "sleep", lambda s: pytest.fail("slept"))
  def full():
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  with pytest.raises(OSError, match="No space left"):
    checkpoint.retrying("writing", full, "/run")


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_retry_budget_names_the_fix(monkeypatch, value):
  monkeypatch.setenv("MPX_STORAGE_RETRY_S", value)
  with pytest.raises(ValueError, match=r"MPX_STORAGE_RETRY_S=.*a number >= 0 \(default 600\)"):
    checkpoint.retrying("x", lambda: None, "y")
