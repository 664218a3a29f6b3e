"""Where generations are published: a local folder or an S3-compatible bucket, behind one API.

obstore (Python bindings of the Rust `object_store` crate, the crate LanceDB itself does its I/O
with) covers both with the same calls and the same guarantees: a put is atomic (readers see the
whole object or none: the local store writes a temporary file and renames it), a put with
`create=True` fails if the object exists (S3 conditional writes), and listings are strongly
consistent on S3 and its compatible servers. pyarrow's S3 filesystem, which Canopy already has,
was the first candidate: its multipart uploads fail against the test suite's S3 server.

Credentials and the endpoint come from the environment as every AWS tool reads them
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, AWS_REGION);
`[publish] endpoint_url` / `region` override the last two.

The store's errors run to pages (a request dump and the server's XML): each call turns them
into one line, a `ConfigError` for a bucket that does not exist and `StoreUnavailable` for the
rest; a missing object stays FileNotFoundError.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from canopy.errors import ConfigError, StoreUnavailable

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config

__all__ = ["Location", "ObjectInfo", "open_location"]


@dataclass(frozen=True)
class ObjectInfo:
    path: str
    size: int
    modified: datetime


class Location:
    """One URI's objects, addressed by relative paths (`manifests/000000000001.json`)."""

    def __init__(self, uri: str, store: Any, *, endpoint: str | None = None) -> None:
        self.uri = uri
        self._store = store
        self._endpoint = endpoint

    def put(self, path: str, data: bytes | Path, *, create: bool = False) -> None:
        """Write `data` (bytes, or a local file streamed in parts) at `path`, atomically.
        `create`: fail with FileExistsError if `path` exists (two writers, one name)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError

        with self._errors():
            try:
                obstore.put(self._store, path, data, mode="create" if create else None)
            except AlreadyExistsError:
                raise FileExistsError(path) from None

    def get(self, path: str) -> bytes:
        """The object's bytes; FileNotFoundError when there is none."""
        import obstore

        with self._errors():
            return bytes(obstore.get(self._store, path).bytes())

    def download(self, path: str, dest: Path) -> None:
        """Stream the object into the local file `dest` (written beside it, then renamed)."""
        import obstore

        part = dest.with_name(dest.name + ".part")
        try:
            with self._errors(), open(part, "wb") as out:
                for chunk in obstore.get(self._store, path):
                    out.write(chunk)
        except BaseException:
            part.unlink(missing_ok=True)  # never a half file left in a cache
            raise
        part.replace(dest)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under `prefix` (a folder: `manifests`), recursively."""
        import obstore

        with self._errors():
            return [ObjectInfo(m["path"], int(m["size"]), m["last_modified"])
                    for batch in obstore.list(self._store, prefix=prefix) for m in batch]

    def delete(self, paths: Iterable[str]) -> None:
        import obstore

        todo = list(paths)
        with self._errors():
            for i in range(0, len(todo), 1000):  # S3's DeleteObjects takes 1000 keys a request
                obstore.delete(self._store, todo[i:i + 1000])

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """The store's errors as one line each (module doc)."""
        from obstore.exceptions import BaseError

        try:
            yield
        except (BaseError, FileNotFoundError) as exc:
            text = str(exc)
            code, message = _s3_error(text)
            if code == "NoSuchBucket":
                bucket = urlparse(self.uri).netloc
                where = f" at {self._endpoint}" if self._endpoint else ""
                raise ConfigError(
                    f"the bucket {bucket!r} of {self.uri} does not exist{where}: create it (for "
                    f"example `aws s3 mb s3://{bucket}`) or correct the URI") from None
            if isinstance(exc, FileNotFoundError):
                raise
            why = f"{code}: {message}" if code else _first_line(text)
            raise StoreUnavailable(f"the object store of {self.uri} failed: {why}") from None


def _s3_error(text: str) -> tuple[str | None, str]:
    """The error code and message of the S3 XML error body an obstore error quotes, if any."""
    code = re.search(r"<Code>([^<]{1,100})</Code>", text)
    message = re.search(r"<Message>([^<]{0,300})</Message>", text)
    return (code.group(1) if code else None), (message.group(1) if message else "")


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or ["no reason given"])[0]
    return line if len(line) <= limit else line[:limit] + "..."


def open_location(uri: str, *, endpoint_url: str | None = None,
                  region: str | None = None) -> Location:
    """The Location of `uri`: `s3://bucket/prefix`, `file:///abs/path` or a local path (a
    folder, created if missing). Other schemes are a ConfigError."""
    from obstore.store import LocalStore, S3Store

    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ConfigError(f"publish URI {uri!r} names no bucket (s3://bucket/prefix)")
        config: S3Config = {}
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") \
            or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            config["endpoint"] = endpoint
        if region:
            config["region"] = region
        elif not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
            config["region"] = "us-east-1"  # S3-compatible servers take any region
        # A plain-HTTP endpoint is a local or private server (MinIO, moto): allow it when it
        # is the one configured, and only then.
        options: ClientConfig = (
            {"allow_http": True} if endpoint and endpoint.startswith("http://") else {})
        # Fail within seconds, not the library's 10 retries over 3 minutes: a replica's check
        # must end well within its revocation bound (it fails closed, and checks again).
        retry: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=10)}
        store = S3Store(parsed.netloc, prefix=parsed.path.strip("/") or None, config=config,
                        client_options=options, retry_config=retry)
        return Location(uri, store, endpoint=endpoint)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        folder = Path(parsed.path if parsed.scheme == "file" else uri).expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        return Location(uri, LocalStore(folder))
    raise ConfigError(f"publish URI {uri!r}: use a local folder or s3://bucket/prefix")
