"""JSON for the small dataclass records kept in the bucket (run spec, leases, launch record).

Reading keeps only the fields this code knows, so a record written by a newer
version with an extra field still loads.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="JsonRecord")


class JsonRecord:
    json_indent: ClassVar[int | None] = 1  # None: compact, for records rewritten often

    def to_json(self) -> bytes:
        """The record's fields, but those marked ``metadata={"transient": True}`` (default None):
        what a reader loaded beside the record, never written into it."""
        record: Any = self  # a dataclass: every subclass is one
        transient = [f.name for f in dataclasses.fields(record) if f.metadata.get("transient")]
        d = dataclasses.asdict(dataclasses.replace(record, **dict.fromkeys(transient)) if transient else record)
        for name in transient:
            del d[name]
        return json.dumps(d, indent=self.json_indent, sort_keys=True).encode()

    @classmethod
    def from_json(cls: type[R], data: bytes) -> R:
        d = json.loads(data)
        return cls(
            **{
                f.name: d[f.name]
                for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if f.name in d and not f.metadata.get("transient")
            }
        )
