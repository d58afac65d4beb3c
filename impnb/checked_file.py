"""Cache files written atomically and checked on read: MAGIC, the SHA-256 of the payload, the
payload. The kernel cache (launch/cache.py) and the tokenizer's merge cache use it; for both a
file that is missing, unreadable or corrupt only costs rebuilding what it held, and a cache dir
that cannot be written only costs the rebuild next time."""

import hashlib
import logging
import os
import tempfile
from pathlib import Path


def read(path: Path, magic: bytes, log: logging.Logger, what: str) -> bytes | None:
    """The payload of a file written by `write` with the same magic, or None (logged as `what`'s
    rebuild) where it is missing, unreadable or fails its checksum."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("%s: cannot read %s (%s); rebuilding", what, path, e)
        return None
    n = len(magic)
    payload = data[n + 32:]
    if data[:n] != magic or hashlib.sha256(payload).digest() != data[n:n + 32]:
        log.warning("%s: %s is corrupt; rebuilding", what, path)
        return None
    return payload


def write(path: Path, magic: bytes, payload: bytes, log: logging.Logger, what: str) -> None:
    """Write magic + checksum + payload to a temp file beside path and rename it over path, so a
    reader never sees half a file; an OSError is logged, and the temp file removed."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as f:
            tmp = f.name
            f.write(magic + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("%s: cannot write %s (%s)", what, path, e)
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
