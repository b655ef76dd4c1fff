"""moto's S3 server on 127.0.0.1 (the real S3 wire protocol) for the model.source s3:// tests, with its access log
(werkzeug's request lines) kept as (method, path, status)."""
from __future__ import annotations

import logging
import re

import pytest

from support.ports import free_port

CREDS = {"WX_KEY": "AKIATESTKEY", "WX_SECRET": "test-secret-value"}


class AccessLog(logging.Handler):
    """werkzeug's request lines from moto's server: (method, path, status)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, str, int]] = []

    def emit(self, record):
        text = re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage())  # werkzeug colours 206 and errors
        m = re.search(r'"(GET|HEAD|PUT|POST) (\S+) HTTP/[\d.]+" (\d+)', text)
        if m:
            self.lines.append((m.group(1), m.group(2).split("?")[0], int(m.group(3))))

    def gets(self, key: str) -> list[int]:
        return [st for meth, path, st in self.lines if meth == "GET" and path.endswith(key)]


@pytest.fixture(scope="module")
def s3():
    """(endpoint URL, a boto3 client with CREDS, AccessLog) with a bucket named models."""
    from moto.server import ThreadedMotoServer
    import boto3

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=True)
    log = AccessLog()
    wlog = logging.getLogger("werkzeug")
    wlog.addHandler(log)
    wlog.setLevel(logging.INFO)
    server.start()
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id=CREDS["WX_KEY"], aws_secret_access_key=CREDS["WX_SECRET"])
    client.create_bucket(Bucket="models")
    yield f"http://127.0.0.1:{port}", client, log
    wlog.removeHandler(log)
    server.stop()
