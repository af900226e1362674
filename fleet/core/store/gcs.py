"""Cloud Storage behind the `Store` interface.

Generations and preconditions are GCS's own, so the lease protocol needs no
extra machinery here. Retries are the library's: a conditional write is
retried only because its precondition makes a replay harmless (a replay of a
write that did land comes back as 412, which the lease protocol checks). Its
policy retries 408, 429, 5xx and broken connections for 120 s
(``FLEET_STORE_RETRY_SECONDS`` scales that, as tests of a long outage do); what
outlasts it is ``Unavailable``, which a worker rides out (fleet.core.processes).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
from typing import Iterator

import requests
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.auth.exceptions import DefaultCredentialsError, TransportError
from google.cloud.storage.exceptions import DataCorruption
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY, ConditionalRetryPolicy, is_generation_specified

from fleet.core.store.base import (
    Blob,
    BucketNotFound,
    Changed,
    Forbidden,
    NotFound,
    PreconditionFailed,
    Store,
    StoreError,
    Unavailable,
)

RETRY_SECONDS_ENV = "FLEET_STORE_RETRY_SECONDS"
# The transport failing under the client: requests' ConnectionError and Timeout are OSErrors but
# not Python's ConnectionError; google.auth's TransportError is a token refresh that got no answer.
_UNREACHABLE = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    http.client.HTTPException,
    TransportError,
    ConnectionError,
    TimeoutError,
)


@functools.lru_cache(maxsize=None)
def retry_policies(seconds: float | None) -> tuple[Retry, ConditionalRetryPolicy]:
    """The library's default policy (and the one for writes that are safe to replay only with a
    generation precondition), with its deadline set to ``seconds`` when given."""
    retry = DEFAULT_RETRY if seconds is None else DEFAULT_RETRY.with_timeout(seconds)
    return retry, ConditionalRetryPolicy(retry, is_generation_specified, ["query_params"])


def _retry_seconds() -> float | None:
    value = os.environ.get(RETRY_SECONDS_ENV, "").strip()
    try:
        return float(value) if value else None
    except ValueError:
        raise StoreError(
            f"{RETRY_SECONDS_ENV}={value!r}: give the storage client's retry deadline in seconds"
        ) from None


def make_client() -> storage.Client:
    """A Storage client: anonymous against an emulator (but a stand-in VM's own account, when
    GCE_METADATA_HOST names its metadata server), default credentials otherwise.

    With ``STORAGE_EMULATOR_HOST`` set the library talks to the emulator; anonymous
    credentials keep it from looking for (or finding) real ones. One client per
    process and setting is shared, since each holds a connection pool.
    """
    # google-cloud-storage 3.x reads each bucket's metadata in the background to label trace spans
    # (storage.buckets.get, which the workers' role does not hold, and which fleet never traces): off.
    os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    return _client(emulator, os.environ.get("GOOGLE_CLOUD_PROJECT"), os.getpid())


@functools.lru_cache(maxsize=None)
def _client(emulator: str | None, project: str | None, pid: int) -> storage.Client:
    # pid is part of the key: a forked child must not reuse its parent's connections.
    if emulator:
        from google.auth.credentials import AnonymousCredentials

        if os.environ.get("GCE_METADATA_HOST"):
            # A stand-in VM (tests): its service account's token from its metadata server, as on GCE,
            # so that the stand-ins can hold the workers to their IAM role.
            from google.auth import compute_engine

            return storage.Client(project=project or "local", credentials=compute_engine.Credentials())
        return storage.Client(project=project or "local", credentials=AnonymousCredentials())
    return storage.Client(project=project)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def _one_line(e: gexc.GoogleAPICallError) -> str:
    # The service's own words ("x does not have storage.objects.get access ..."), not the request line.
    with contextlib.suppress(Exception):
        message = e.response.json()["error"]["message"]
        if isinstance(message, str) and message.strip():
            return message.strip().splitlines()[0][:300]
    text = (getattr(e, "message", None) or str(e)).strip()
    return text.splitlines()[0][:300] if text else ""


def _version(generation: int, size: int) -> str:
    return f"size={size},generation={generation}"


def _generation_of(version: str) -> int:
    fields = dict(part.partition("=")[::2] for part in version.split(","))
    try:
        return int(fields["generation"])
    except (KeyError, ValueError):
        raise StoreError(f"not a Cloud Storage object version: {version!r}") from None


class GCSStore(Store):
    """Objects ``gs://<bucket>/<prefix>/<name>``; names given and returned are relative to prefix."""

    page_size = 1000  # GCS's maximum; the emulator returns everything in one page unless told

    def __init__(self, bucket_name: str, prefix: str = "", client: storage.Client | None = None):
        self.bucket_name = bucket_name
        self.prefix = prefix.strip("/")
        self.url = f"gs://{bucket_name}" + (f"/{self.prefix}" if self.prefix else "")
        self._given_client = client
        self.retry, self.retry_if_generation = retry_policies(_retry_seconds())

    @functools.cached_property
    def client(self) -> storage.Client:
        # Built on first use so that opening a store never touches the network or credentials.
        if self._given_client is not None:
            return self._given_client
        try:
            return make_client()
        except DefaultCredentialsError:
            raise StoreError(
                f"gs://{self.bucket_name}: no Google credentials on this machine; log in with "
                "`gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
                "to a key file)"
            ) from None

    @functools.cached_property
    def bucket(self) -> storage.Bucket:
        return self.client.bucket(self.bucket_name)

    # -- names and errors ------------------------------------------------------
    def _full(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _blob(self, name: str) -> storage.Blob:
        # A fresh Blob per call (no chunk_size): small uploads stay multipart, and
        # threads sharing the store share no mutable state.
        return self.bucket.blob(self._full(name))

    @contextlib.contextmanager
    def _errors(self, name: str):
        """Turn the library's HTTP errors into the store's, with one-line messages."""
        where = f"gs://{self.bucket_name}/{self._full(name)}"
        try:
            yield
        except gexc.NotFound as e:
            missing = self._bucket_missing()
            if missing:
                raise BucketNotFound(f"gs://{self.bucket_name}: no such bucket") from e
            if missing is None:
                raise NotFound(f"{where}: not found (no such object, or no bucket {self.bucket_name!r})") from e
            raise NotFound(f"{where}: no such object") from e
        except gexc.PreconditionFailed as e:
            raise PreconditionFailed(f"{where}: generation precondition failed") from e
        except (gexc.Forbidden, gexc.Unauthorized) as e:
            raise Forbidden(f"{where}: access denied ({e.code}): {_one_line(e)}") from e
        except gexc.GoogleAPICallError as e:
            if e.code in (408, 429) or (e.code or 0) >= 500:  # after the retries (or a write not retried)
                raise Unavailable(f"{where}: {e.code} {_one_line(e)}") from e
            raise StoreError(f"{where}: {e.code} {_one_line(e)}") from e
        except gexc.RetryError as e:  # the retry deadline passed
            raise Unavailable(f"{where}: gave up retrying: {_first_line(e.cause or e)}") from e
        except _UNREACHABLE as e:
            raise Unavailable(f"{where}: {_first_line(e)}") from e
        except (OSError, DataCorruption) as e:
            # The machine's side (a local file that cannot be written) or bytes that fail their
            # checksum: a store error, in one line.
            raise StoreError(f"{where}: {_first_line(e)}") from e

    _bucket_seen = False

    def _bucket_missing(self) -> bool | None:
        """After a 404: is it the bucket that is missing? None when we may not ask
        (a worker may lack storage.buckets.get) or cannot tell right now."""
        if self._bucket_seen:
            return False
        try:
            exists = self.bucket.exists(retry=self.retry)
        except Exception:
            return None
        self._bucket_seen = exists
        return not exists

    @staticmethod
    def _range(start: int, end: int | None) -> dict:
        # The library's `end` is inclusive; start=0 without end must send no Range
        # header at all (an empty object answers "bytes=0-" with 416).
        return {"start": start or None, "end": None if end is None else end - 1}

    # -- reads -------------------------------------------------------------------
    def read(self, name: str, start: int = 0, end: int | None = None, version: str | None = None) -> bytes:
        generation = _generation_of(version) if version is not None else None
        blob = self.bucket.blob(self._full(name), generation=generation)
        try:
            with self._errors(name):
                if end is not None and end <= start:  # an HTTP Range cannot ask for nothing
                    blob.reload(retry=self.retry)  # still NotFound when absent
                    return b""
                try:
                    return blob.download_as_bytes(**self._range(start, end), retry=self.retry)
                except gexc.RequestRangeNotSatisfiable:  # start at or past the end, as a slice would
                    return b""
        except NotFound:
            self._changed_or_gone(name, generation)
            raise

    def read_generation(self, name: str) -> tuple[bytes, int]:
        """One download: the library fills ``generation`` from its ``x-goog-generation``
        header, i.e. the generation of exactly the bytes served (GCS and fake-gcs-server
        both send it)."""
        blob = self._blob(name)
        with self._errors(name):
            data = blob.download_as_bytes(retry=self.retry)
        if blob.generation is None:
            raise StoreError(f"gs://{self.bucket_name}/{self._full(name)}: download carried no x-goog-generation")
        return data, blob.generation

    def download_file(
        self, name: str, path: str, start: int = 0, end: int | None = None, version: str | None = None
    ) -> None:
        generation = _generation_of(version) if version is not None else None
        # Pinned to the generation planned: GCS serves exactly it (or 404 once it was replaced),
        # and the generation the response carries is checked too.
        blob = self.bucket.blob(self._full(name), generation=generation)
        where = f"gs://{self.bucket_name}/{self._full(name)}"
        try:
            with self._errors(name):
                if end is not None and end <= start:
                    blob.reload(retry=self.retry)
                else:
                    try:
                        blob.download_to_filename(path, **self._range(start, end), retry=self.retry)
                    except gexc.RequestRangeNotSatisfiable:
                        open(path, "wb").close()  # an empty range
                        blob.reload(retry=self.retry)
                    else:
                        if generation is not None and blob.generation not in (None, generation):
                            raise Changed(
                                f"{where}: changed since it was planned (generation {generation} then, "
                                f"{blob.generation} now)"
                            )
                        return
        except NotFound:
            self._changed_or_gone(name, generation)
            raise
        open(path, "wb").close()

    def _changed_or_gone(self, name: str, generation: int | None) -> None:
        """After a 404 on a pinned generation: Changed if the object is there as another one."""
        if generation is None:
            return
        now = self.stat(name)
        if now is not None:
            raise Changed(
                f"gs://{self.bucket_name}/{self._full(name)}: changed since it was planned (generation "
                f"{generation} then, {now.generation} now)"
            ) from None

    def stat(self, name: str) -> Blob | None:
        with self._errors(name):
            blob = self.bucket.get_blob(self._full(name), retry=self.retry)
        return None if blob is None else Blob(name, blob.generation, blob.size, _version(blob.generation, blob.size))

    def list(self, prefix: str = "", start: str | None = None, end: str | None = None) -> Iterator[Blob]:
        cut = len(self.prefix) + 1 if self.prefix else 0
        with self._errors(prefix):
            # Explicit page_size: GCS pages anyway, fake-gcs-server only when asked.
            for b in self.client.list_blobs(
                self.bucket,
                prefix=self._full(prefix),
                start_offset=None if start is None else self._full(start),
                end_offset=None if end is None else self._full(end),
                page_size=self.page_size,
                fields="items(name,generation,size),nextPageToken",
                retry=self.retry,
            ):
                yield Blob(b.name[cut:], b.generation, b.size, _version(b.generation, b.size))

    # -- writes --------------------------------------------------------------------
    def write(self, name: str, data: bytes, if_generation_match: int | None = None, *, idempotent: bool = False) -> int:
        """A multipart upload (up to 8 MiB; no chunk_size), where preconditions are atomic
        (fake-gcs-server enforces them nowhere else). Retried when conditional, or when
        the caller says a replay is harmless (``idempotent``): otherwise an unconditional
        replay could overwrite a newer write by someone else."""
        blob = self._blob(name)
        with self._errors(name):
            blob.upload_from_string(
                data,
                content_type="application/octet-stream",
                if_generation_match=if_generation_match,
                retry=self.retry if idempotent else self.retry_if_generation,
            )
        return blob.generation

    def upload_file(self, name: str, path: str) -> int:
        """Unconditional, but outputs are deterministic, so a replay writes the same bytes:
        always retried."""
        blob = self._blob(name)
        with self._errors(name):
            blob.upload_from_filename(path, content_type="application/octet-stream", retry=self.retry)
        return blob.generation

    def delete(self, name: str) -> None:
        with contextlib.suppress(NotFound), self._errors(name):
            self._blob(name).delete(retry=self.retry)
