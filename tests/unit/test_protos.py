"""The committed gRPC modules are what `make proto` makes of the .proto files beside them (the
kubelet's device plugin, DRA and plugin registration APIs): a .proto changed without
regenerating, or a generated file edited by hand, fails here."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


def test_the_generated_modules_are_what_the_protos_give(tmp_path: Path) -> None:
    protos = sorted(SRC.glob("sharegpu/**/*.proto"))
    assert len(protos) >= 3
    subprocess.run(
        ["make", "-s", "--no-print-directory", "proto", f"PROTO_OUT={tmp_path}"], cwd=REPO, check=True
    )
    for proto in protos:
        stem = proto.relative_to(SRC).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            name = f"{stem}{suffix}"
            fresh = (tmp_path / name).read_text()
            assert fresh == (SRC / name).read_text(), f"{name} is stale: run `make proto` and commit it"
