"""The agent's state in SQLite: the tenants it manages and the events it recorded.

``<state-dir>/agent.db`` in WAL mode (readers never block the writer; a crash loses at most the
last transaction), schema versioned with ``PRAGMA user_version``. The tenant directories under
the runtime directory stay the truth for limits and usage; the database keeps what they do not
say (who asked for a tenant, its labels, when) and the event history, so that a restarted agent
recovers every tenant and can still explain what happened before.

One connection, shared by the event loop's worker threads under a lock: the agent writes little
(tenant changes, a few events a second), so one writer is plenty.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharegpu.agent.events import Event
from sharegpu.errors import ConfigError

SCHEMA_VERSION = 1
DB_FILE = "agent.db"
KEEP_EVENTS = 10_000

_SCHEMA = """
CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,          -- JSON: the request, resolved (GPUs, bytes), and meta
    created REAL NOT NULL,
    updated REAL NOT NULL,
    state TEXT NOT NULL          -- "created" (through the API) or "adopted" (found on disk)
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    severity TEXT NOT NULL,
    tenant TEXT,
    gpu TEXT,
    pid INTEGER,
    message TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX events_kind ON events (kind, id);
CREATE INDEX events_tenant ON events (tenant, id);
"""


@dataclass(frozen=True)
class TenantRow:
    id: str
    spec: dict[str, Any]
    created: float
    updated: float
    state: str


def kind_filter(kind: str) -> tuple[str, str]:
    """SQL and argument for an event kind filter: "audit" or "audit." is every audit.* kind,
    "audit.bypass" that kind alone."""
    prefix = kind.rstrip(".")
    if "." in prefix and not kind.endswith("."):
        return "kind = ?", prefix
    return "kind LIKE ? ESCAPE '\\'", prefix.replace("\\", "\\\\").replace("%", "\\%").replace(
        "_", "\\_"
    ) + ".%"


class Store:
    """Tenants and events in ``<state_dir>/agent.db``."""

    def __init__(self, state_dir: Path, *, keep_events: int = KEEP_EVENTS) -> None:
        self.path = state_dir / DB_FILE
        self.keep_events = keep_events
        self._lock = threading.Lock()
        try:
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._db = self._connect()
            self._migrate()
            self._ino = self.path.stat().st_ino
        except sqlite3.DatabaseError as err:
            raise ConfigError(f"{self.path}: {err} (move it away to start with an empty state)") from err
        except OSError as err:
            raise ConfigError(f"cannot use the state directory {state_dir}: {err.strerror}") from err

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def restore_if_lost(self) -> str | None:
        """If the database file was removed or replaced while the agent runs (its connection keeps
        the old file, so nothing failed, and a restart started empty, adopting the agent's own
        tenants as strangers), write it again from the open copy and use that; a replacement is
        moved aside first.  What happened, or None."""
        try:
            ino: int | None = self.path.stat().st_ino
        except FileNotFoundError:
            ino = None
        if ino == self._ino:
            return None
        with self._lock:
            what = "removed" if ino is None else "replaced by another file"
            if ino is not None:
                aside = self.path.with_name(f"{self.path.name}.replaced.{time.time_ns()}")
                os.replace(self.path, aside)
                what += f" (moved to {aside.name})"
            # The old file's log into the old file, so that the new one finds none of it.
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            tmp = self.path.with_name(f".{self.path.name}.restore")
            copy = sqlite3.connect(tmp)
            try:
                self._db.backup(copy)
            finally:
                copy.close()
            self._db.close()
            for stale in (
                self.path.with_name(self.path.name + "-wal"),
                self.path.with_name(self.path.name + "-shm"),
            ):
                stale.unlink(missing_ok=True)
            os.replace(tmp, self.path)
            self._db = self._connect()
            self._ino = self.path.stat().st_ino
        return what

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path}: schema version {version} is newer than this agent's ({SCHEMA_VERSION}); "
                "run the newer agent, or move the file away"
            )
        if version == 0:
            self._db.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")

    def _tx(self) -> sqlite3.Connection:
        # In autocommit mode a transaction needs an explicit BEGIN; `with connection:` then
        # commits it, or rolls it back on an exception.
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- tenants ---------------------------------------------------------------------------------

    def tenants(self) -> dict[str, TenantRow]:
        with self._lock:
            rows = self._db.execute("SELECT id, spec, created, updated, state FROM tenants").fetchall()
        return {r[0]: TenantRow(r[0], json.loads(r[1]), r[2], r[3], r[4]) for r in rows}

    def tenant(self, tenant_id: str) -> TenantRow | None:
        with self._lock:
            r = self._db.execute(
                "SELECT id, spec, created, updated, state FROM tenants WHERE id = ?", (tenant_id,)
            ).fetchone()
        return TenantRow(r[0], json.loads(r[1]), r[2], r[3], r[4]) if r else None

    def put_tenant(self, tenant_id: str, spec: dict[str, Any], *, created: float, state: str) -> None:
        now = time.time()
        with self._lock, self._tx():
            self._db.execute(
                "INSERT INTO tenants (id, spec, created, updated, state) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET spec = excluded.spec, updated = excluded.updated, "
                "state = excluded.state",
                (tenant_id, json.dumps(spec), created, now, state),
            )

    def delete_tenant(self, tenant_id: str) -> bool:
        with self._lock, self._tx():
            cur = self._db.execute("DELETE FROM tenants WHERE id = ?", (tenant_id,))
        return cur.rowcount > 0

    # -- events ----------------------------------------------------------------------------------

    def add_events(self, events: Iterable[Event]) -> list[Event]:
        """Store `events`; returns them with their ids. Keeps the last `keep_events` only."""
        stored = []
        with self._lock, self._tx():
            for event in events:
                cur = self._db.execute(
                    "INSERT INTO events (time, kind, severity, tenant, gpu, pid, message, data) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        event.time,
                        event.kind,
                        event.severity,
                        event.tenant,
                        event.gpu,
                        event.pid,
                        event.message,
                        json.dumps(event.data, default=str),
                    ),
                )
                stored.append(event.model_copy(update={"id": cur.lastrowid}))
            if stored:
                self._db.execute(
                    "DELETE FROM events WHERE id <= ?", (int(stored[-1].id or 0) - self.keep_events,)
                )
        return stored

    def events(
        self,
        *,
        since: int | None = None,
        kind: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
    ) -> list[Event]:
        """Events after id `since`, oldest first; without `since`, the last `limit` events."""
        where: list[str] = []
        args: list[object] = []
        if since is not None:
            where.append("id > ?")
            args.append(since)
        if kind:
            clause, arg = kind_filter(kind)
            where.append(clause)
            args.append(arg)
        if tenant:
            where.append("tenant = ?")
            args.append(tenant)
        sql = "SELECT id, time, kind, severity, tenant, gpu, pid, message, data FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        order = "ASC" if since is not None else "DESC"
        sql += f" ORDER BY id {order} LIMIT ?"
        with self._lock:
            rows = self._db.execute(sql, (*args, limit)).fetchall()
        if since is None:
            rows.reverse()
        return [
            Event(
                id=r[0],
                time=r[1],
                kind=r[2],
                severity=r[3],
                tenant=r[4],
                gpu=r[5],
                pid=r[6],
                message=r[7],
                data=json.loads(r[8]),
            )
            for r in rows
        ]

    def last_event_id(self) -> int:
        with self._lock:
            (last,) = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()
        return int(last)
