"""Leader election between extender replicas with a `coordination.k8s.io` Lease, as Kubernetes'
own controllers do: the leader renews the Lease every `renew_s`; another replica takes it over
once it has seen the same record unchanged for `lease_s` (its own clock, never the writer's, so
clocks that disagree cannot make two leaders); every write carries the resourceVersion it read,
so of two replicas taking over at once one wins.

A leader that cannot renew for two thirds of `lease_s` steps down by itself (`is_leader` turns
false), before another can take over. Only the leader is ready (its readiness probe), so the scheduler's calls
reach it; a bind reaching a replica that is not the leader is refused. Even two leaders at once
(a network partition, a paused process) cannot oversubscribe a GPU: bindings.py's fence orders
their binds on each node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)

LEASE_S = 15.0
RENEW_S = 2.0


class LeaderElector:
    def __init__(
        self,
        api_client: Any,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_s: float = LEASE_S,
        renew_s: float = RENEW_S,
        on_lead: Callable[[], None] = lambda: None,
        on_lose: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes import client

        self._client = client
        self._leases = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_s, self.renew_s = lease_s, renew_s
        self.on_lead, self.on_lose = on_lead, on_lose
        self.clock = clock
        self._renewed_at: float | None = None  # when this replica last wrote the Lease as leader
        self._seen: tuple[str, float] | None = None  # (the other holder's record, when first seen)
        self._leading = False
        self._stop = threading.Event()

    @property
    def is_leader(self) -> bool:
        # Stepping down a third of the Lease early leaves the others' clocks and the API
        # server's delays that margin before anyone may take over.
        return self._renewed_at is not None and self.clock() - self._renewed_at < self.lease_s * 2 / 3

    def try_once(self) -> bool:
        """One round: renew or take the Lease if it is ours to have; whether this replica leads."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._try()
        except ApiException as err:
            # A conflict: another replica wrote first. Anything else: the API server is out of
            # reach; either way the Lease stays as it is and `is_leader` expires by itself.
            if err.status != 409:
                log.warning("leader election: the API server refused (%s %s)", err.status, err.reason)
        except OSError as err:
            log.warning("leader election: the API server is out of reach: %s", err)
        leading = self.is_leader
        if leading != self._leading:
            self._leading = leading
            log.info(
                "%s %s the lead (Lease %s/%s)",
                self.identity,
                "took" if leading else "lost",
                self.namespace,
                self.name,
            )
            (self.on_lead if leading else self.on_lose)()
        return leading

    def _try(self) -> None:
        from kubernetes.client.exceptions import ApiException

        now = self.clock()
        try:
            lease: Any = self._leases.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            self._leases.create_namespaced_lease(self.namespace, self._new_lease())
            self._renewed_at = now
            return
        spec = lease.spec
        holder = spec.holder_identity or ""
        if holder and holder != self.identity:
            record = f"{holder}@{lease.metadata.resource_version}"
            if self._seen is None or self._seen[0] != record:
                self._seen = (record, now)  # a record not seen before: the holder is alive
                return
            if now - self._seen[1] < (spec.lease_duration_seconds or self.lease_s):
                return
            log.info("leader election: %s stopped renewing; taking over", holder)
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.acquire_time = _now()
        elif holder != self.identity:
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.acquire_time = _now()
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = round(self.lease_s)
        spec.renew_time = _now()
        self._leases.replace_namespaced_lease(self.name, self.namespace, lease)  # carries its resourceVersion
        self._renewed_at = now
        self._seen = None

    def _new_lease(self) -> Any:
        c = self._client
        return c.V1Lease(
            metadata=c.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=c.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=round(self.lease_s),
                acquire_time=_now(),
                renew_time=_now(),
                lease_transitions=0,
            ),
        )

    def run(self) -> None:
        """Rounds every `renew_s` until stop(); gives the Lease up on the way out."""
        while not self._stop.is_set():
            self.try_once()
            self._stop.wait(self.renew_s)
        self.release()

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Hand the Lease back (holder cleared) so another replica takes over at once."""
        from kubernetes.client.exceptions import ApiException

        if not self.is_leader:
            return
        try:
            lease: Any = self._leases.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                self._leases.replace_namespaced_lease(self.name, self.namespace, lease)
        except (ApiException, OSError) as err:
            log.warning("leader election: could not hand the Lease back: %s", err)
        self._renewed_at = None
        if self._leading:
            self._leading = False
            self.on_lose()


def _now() -> datetime:
    return datetime.now(UTC)
