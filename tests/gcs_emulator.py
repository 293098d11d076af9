"""A GCS emulator in this process (gcp-storage-emulator) for the gs:// run-folder tests.

Orbax writes checkpoints through tensorstore's gcs driver (pointed at the emulator by
TENSORSTORE_GCS_HTTP_URL, with a fixed test token) and epath the other files through
gcsfs (STORAGE_EMULATOR_HOST): the two routes a real bucket takes. Use as a fixture:
`bucket` (registered in conftest.py) gives the URL gs://mpx-test (module scope).
"""

import functools
import os
import socket
import socketserver
import sys
import threading
from http import HTTPStatus, server as http_server

import pytest

from mpx.sweep import run_folder

BUCKET = "mpx-test"


def _object_reads_say_their_generation():
  """The emulator's object reads omit the x-goog-generation header GCS sends; tensorstore
  reads it when OCDBT re-reads a manifest it wrote ("Malformed StorageGeneration" without
  it). Every object GET of the emulator's routes gets the header."""
  from gcp_storage_emulator import server as emulator

  def with_generation(handler):
    def read(request, response, storage, *args, **kwargs):
      handler(request, response, storage, *args, **kwargs)
      if response.status == HTTPStatus.OK and "object_id" in request.params:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])
    read.adds_generation = True
    return read

  for _, handlers in emulator.HANDLERS:
    get = handlers.get(emulator.GET)
    if get is not None and not getattr(get, "adds_generation", False):
      handlers[emulator.GET] = with_generation(get)


def _writes_keep_their_preconditions():
  """GCS refuses a write or delete whose `ifGenerationMatch` is not the object's generation
  (0: absent) with 412 Precondition Failed; the emulator ignores the parameter. The run
  folder's lock relies on it: uploads and deletes of the emulator's routes check it (one
  request at a time, `_requests_one_at_a_time`, so the check is atomic)."""
  from gcp_storage_emulator import server as emulator
  from gcp_storage_emulator.exceptions import NotFound
  from gcp_storage_emulator.handlers import objects

  def with_precondition(handler, key_of):
    @functools.wraps(handler)  # `__wrapped__`: tests that replace an upload route find it.
    def write(request, response, storage, *args, **kwargs):
      wanted, object_id = request.query.get("ifGenerationMatch"), key_of(request)
      if wanted is not None and object_id is not None:
        bucket_name = request.params["bucket_name"]
        try:
          generation = str(storage.get_file_obj(bucket_name, object_id)["generation"])
        except NotFound:
          generation = "0"
        if wanted[0] != generation:
          response.status = HTTPStatus.PRECONDITION_FAILED
          response.json({"error": {"code": 412, "message": "Precondition Failed"}})
          return
      handler(request, response, storage, *args, **kwargs)
    return write

  upload = lambda request: request.query.get("name", [None])[0]
  for _, handlers in emulator.HANDLERS:  # Uploads (objects.insert) and deletes.
    for method, handler, key_of in ((emulator.POST, objects.insert, upload),
                                     (emulator.DELETE, objects.delete,
                                      lambda request: request.params["object_id"])):
      if handlers.get(method) is handler:
        handlers[method] = with_precondition(handler, key_of)


class _Server(socketserver.ThreadingMixIn, http_server.HTTPServer):
  """The emulator's server, accepting every connection at once (a thread each) and
  answering one request at a time. Its own server accepts one connection at a time with a
  backlog of 5 and no read timeout: a client connection that stalls (or one of a burst of
  concurrent ones dropped from the full backlog) held every other request, and a test
  hung in a storage call with both sides idle."""
  daemon_threads = True
  request_queue_size = 256
  timeout_s = 60  # A connection that sends nothing for this long is closed, not waited on.

  def finish_request(self, request, client_address):
    request.settimeout(self.timeout_s)
    super().finish_request(request, client_address)

  def handle_error(self, request, client_address):
    if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
      super().handle_error(request, client_address)  # Early hang-ups are no error.


def _requests_one_at_a_time():
  """Routes each request under one lock: the preconditions above check, then write."""
  from gcp_storage_emulator import server as emulator
  if getattr(emulator.Router.handle, "serial", False):
    return
  handle, lock = emulator.Router.handle, threading.Lock()

  def serial(self, method):
    with lock:
      handle(self, method)
  serial.serial = True
  emulator.Router.handle = serial


def _serve(api):
  """`APIThread.run` with `_Server`."""
  from gcp_storage_emulator import server as emulator
  api._httpd = _Server((api._host, api._port),
                       functools.partial(emulator.RequestHandler, api._storage))
  api.is_running.set()
  api._httpd.serve_forever()


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
  from gcp_storage_emulator.server import create_server
  _object_reads_say_their_generation()
  _writes_keep_their_preconditions()
  _requests_one_at_a_time()
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  server = create_server("localhost", port, in_memory=True, default_bucket=BUCKET)
  server._api.run = functools.partial(_serve, server._api)
  server.start()
  url = f"http://localhost:{port}"
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
         run_folder.STAGING_ENV: str(tmp_path_factory.mktemp("staging"))}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    yield f"gs://{BUCKET}"
  finally:
    for k, v in saved.items():
      os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    server.stop()
