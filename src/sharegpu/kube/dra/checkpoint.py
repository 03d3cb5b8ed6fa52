"""The DRA plugin's prepared claims, keyed by claim UID, in one JSON file the plugin rewrites
whole (a temporary file, fsync, rename: a crash leaves the old file or the new, never half).

Each entry is `preparing` from before its tenant is made until the kubelet's answer is ready,
then `prepared`. A plugin that starts and finds a `preparing` entry died in the middle of that
prepare: it removes the entry's tenant, if one was made, and the entry (`Preparer.recover`); the
kubelet, which got no answer, asks again, and the claim is prepared once. A `prepared` entry is
answered from as it is.

A file that cannot be read is an error at start-up, never taken for "no claims": that would
make the plugin forget tenants it prepared.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sharegpu.errors import ConfigError

FILE = "dra-checkpoint.json"
VERSION = 1
PREPARING = "preparing"
PREPARED = "prepared"


@dataclass
class Entry:
    namespace: str
    name: str
    tenant: str
    state: str
    devices: list[dict[str, Any]] = field(default_factory=list)  # the kubelet's answer, as sent


class Checkpoint:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = self._load()

    def _load(self) -> dict[str, Entry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as err:
            raise ConfigError(f"cannot read the DRA checkpoint {self.path}: {err.strerror}") from err
        try:
            data = json.loads(raw)  # (bytes that are not UTF-8: a ValueError too)
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}, this plugin writes {VERSION}")
            return {uid: Entry(**entry) for uid, entry in data["claims"].items()}
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise ConfigError(
                f"the DRA checkpoint {self.path} is not one this plugin wrote ({err}); move it aside "
                "only after checking which claims' tenants it lists (sharegpu tenants)"
            ) from err

    def get(self, uid: str) -> Entry | None:
        with self._lock:
            return self.entries.get(uid)

    def put(self, uid: str, entry: Entry) -> None:
        with self._lock:
            self.entries[uid] = entry
            self._save()

    def drop(self, uid: str) -> None:
        with self._lock:
            if self.entries.pop(uid, None) is not None:
                self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"version": VERSION, "claims": {uid: asdict(e) for uid, e in self.entries.items()}}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:  # the rename itself survives a power loss
            os.fsync(directory)
        finally:
            os.close(directory)
