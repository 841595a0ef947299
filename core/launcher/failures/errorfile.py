"""The error-file format (``TORCHELASTIC_ERROR_FILE``): its one reader and its one writer.

A worker's :func:`~launcher.failures.record` decorator writes its exception here, the failure
report reads it back, and the launcher writes its own root cause in the same format for whatever
launched it. The format is torch's ``@record`` one::

    {"message": {"message": "ValueError: bad batch",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last): ...",
                               "timestamp": "1700000000"}}}

The timestamp is whole seconds since the epoch, as a string (torch parses it with ``int()``).
Standard library only: workers import this through ``record``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ErrorFileContent", "ErrorFileError", "write_atomically"]


class ErrorFileError(ValueError):
    """An error file exists but is not in a format the report understands."""


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so readers never see half of it
    (even when the writer is killed meanwhile). Raises :class:`OSError` when it cannot."""
    target = os.fspath(path)
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fp:
        fp.write(text)
    os.replace(tmp, target)


@dataclass(frozen=True)
class ErrorFileContent:
    """What an error file says.

    Two shapes are read, both written by torch: the ``@record`` one (``message`` is an object with
    ``message``, ``extraInfo.py_callstack`` and ``extraInfo.timestamp``) and the plain one
    (``message`` a string, ``timestamp`` beside it). :meth:`write` writes the ``@record`` one.
    """

    message: str
    traceback: str | None = None
    timestamp: float | None = None
    error_code: int | None = None

    @classmethod
    def read(cls, path: str) -> ErrorFileContent:
        """Read and parse ``path``; :class:`ErrorFileError` (or ``OSError``) when it cannot be."""
        with open(path, encoding="utf-8", errors="replace") as fp:
            text = fp.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            what = "empty" if not text.strip() else f"not JSON ({exc})"
            raise ErrorFileError(f"error file {path} is {what}") from None
        return cls.parse(data)

    @classmethod
    def parse(cls, data: Any) -> ErrorFileContent:
        """Parse the decoded JSON of an error file."""
        if not isinstance(data, dict) or "message" not in data:
            raise ErrorFileError("error file has no 'message'")
        message = data["message"]
        if isinstance(message, str):
            return cls(message=message, timestamp=_number(data.get("timestamp")))
        if not isinstance(message, dict):
            raise ErrorFileError("error file 'message' is neither a string nor an object")
        extra = message.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        callstack = extra.get("py_callstack")
        code = message.get("errorCode")
        return cls(
            message=str(message.get("message", "")),
            traceback=callstack if isinstance(callstack, str) and callstack.strip() else None,
            timestamp=_number(extra.get("timestamp")),
            error_code=code if isinstance(code, int) else None,
        )

    def to_error_file(self) -> dict[str, Any]:
        """The content in the ``@record`` layout (what :meth:`write` writes, :meth:`parse` reads).

        ``timestamp`` is required here: the format has no way to say "unknown".
        """
        if self.timestamp is None:
            raise ValueError("an error file needs a timestamp")
        message: dict[str, Any] = {
            "message": self.message,
            "extraInfo": {"py_callstack": self.traceback or "", "timestamp": str(int(self.timestamp))},
        }
        if self.error_code is not None:
            message["errorCode"] = self.error_code
        return {"message": message}

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the content to ``path`` in the ``@record`` layout, atomically; :class:`OSError`
        when it cannot be written."""
        write_atomically(path, json.dumps(self.to_error_file()))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict (the failure report's layout, not the error file's)."""
        return {
            "message": self.message,
            "traceback": self.traceback,
            "timestamp": self.timestamp,
            "error_code": self.error_code,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErrorFileContent:
        """Inverse of :meth:`to_dict`."""
        return cls(
            message=data.get("message", ""),
            traceback=data.get("traceback"),
            timestamp=data.get("timestamp"),
            error_code=data.get("error_code"),
        )


def _number(value: Any) -> float | None:
    # torch writes the timestamp as a string of whole seconds; accept numbers too.
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
