"""The kubelet's DRA service (dra.proto, `v1.DRAPlugin`): each claim of a request prepared or
unprepared on its own, so one bad claim fails only itself; its error is a line the kubelet shows
on the pod."""

from __future__ import annotations

import logging
from typing import Any

from sharegpu.errors import SharegpuError
from sharegpu.kube.dra import dra_pb2 as dra
from sharegpu.kube.dra.claims import ClaimRef
from sharegpu.kube.dra.prepare import Preparer

log = logging.getLogger(__name__)


def _ref(claim: dra.Claim) -> ClaimRef:
    return ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)


def _error(what: str, ref: ClaimRef, err: Exception) -> str:
    if isinstance(err, SharegpuError):
        log.warning("%s claim %s failed: %s", what, ref.key, err)
        return str(err)
    log.exception("%s claim %s failed", what, ref.key)  # a bug: the traceback is in the log
    return f"claim {ref.key}: {what} failed: {type(err).__name__}: {err}"


class DraService:
    def __init__(self, preparer: Preparer):
        self.preparer = preparer

    def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: Any
    ) -> dra.NodePrepareResourcesResponse:
        response = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = _ref(claim)
            try:
                devices = self.preparer.prepare(ref)
                response.claims[ref.uid].devices.extend(dra.Device(**d) for d in devices)
            except Exception as err:
                response.claims[ref.uid].error = _error("prepare", ref, err)
        return response

    def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: Any
    ) -> dra.NodeUnprepareResourcesResponse:
        response = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = _ref(claim)
            try:
                self.preparer.unprepare(ref)
                response.claims[ref.uid].CopyFrom(dra.NodeUnprepareResourceResponse())
            except Exception as err:
                response.claims[ref.uid].error = _error("unprepare", ref, err)
        return response
