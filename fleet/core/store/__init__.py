"""One small interface over an object store with generations.

Everything the fleet coordinates goes through these few calls, so the lease
protocol can be proven on a local folder and run unchanged on Cloud Storage.
Generations are positive integers that change on every write of an object;
``if_generation_match=0`` means "only if the object does not exist".

The interface itself (Store, Blob, the errors) is ``fleet.core.store.base``, which the stores
opened here import; this package opens a store by URL and re-exports the interface.
"""

from __future__ import annotations

import re

from fleet.core.store.base import (  # noqa: F401  (the store's names, imported from here)
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
from fleet.core.store.file import StoreFile  # noqa: F401  (a reader over a Store)


def split_url(url: str) -> tuple[str, str]:
    """'gs://b/p/q' -> ('gs://b', 'p/q'); a local path -> (its folder root, '')."""
    if url.startswith("gs://"):
        rest = url[len("gs://") :]
        bucket, _, prefix = rest.partition("/")
        return f"gs://{bucket}", prefix.strip("/")
    return url, ""


_BUCKET_NAME = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")  # Cloud Storage's bucket naming rules


def open_store(url: str) -> Store:
    """A store for ``gs://bucket`` or a local folder (``file://`` or a plain path)."""
    if url.startswith("gs://"):
        from fleet.core.store.gcs import GCSStore

        bucket, prefix = split_url(url)
        if not _BUCKET_NAME.match(bucket[len("gs://") :]):  # the client would fail on it with an IndexError or a 400
            raise StoreError(
                f"{url}: not a bucket URL (gs://BUCKET[/PATH], a bucket name of 3-222 lowercase "
                "letters, digits, '-', '_' and '.')"
            )
        return GCSStore(bucket[len("gs://") :], prefix=prefix)
    from fleet.core.store.local import LocalStore

    if url.startswith("file://"):
        url = url[len("file://") :]
    _check_scheme(url)
    return LocalStore(url)


def _check_scheme(url: str) -> None:
    scheme, sep, _ = url.partition("://")
    if sep and scheme.isalnum():  # s3://, http://...: never a local folder named "s3:"
        raise StoreError(f"{url}: unsupported URL scheme {scheme}:// (use gs://BUCKET[/PATH] or a local path)")


def locate(url: str) -> tuple[Store, str]:
    """The store holding one object and its name there: 'gs://b/x/v.txt' or '/d/v.txt'."""
    if url.startswith("gs://"):
        bucket, name = split_url(url)
        return open_store(bucket), name
    import os

    if not url.startswith("file://"):
        _check_scheme(url)
    path = os.path.abspath(url[len("file://") :] if url.startswith("file://") else url)
    return open_store(os.path.dirname(path)), os.path.basename(path)


def read_url(url: str) -> bytes:
    """A small object (a vocab, a config) named by URL or local path."""
    store, name = locate(url)
    return store.read(name)
