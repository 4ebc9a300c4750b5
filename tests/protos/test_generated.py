"""The committed generated modules must match what `make protos` produces from the .proto files."""

from __future__ import annotations

from pathlib import Path

from protos.generate import PROTO_DIR, generate


def test_generated_modules_are_current(tmp_path: Path) -> None:
    written = generate(tmp_path)
    assert written, "protoc produced nothing"
    stale = [p.name for p in written if (PROTO_DIR / p.name).read_bytes() != p.read_bytes()]
    committed = {
        p.name
        for p in PROTO_DIR.iterdir()
        if p.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"))
    }
    missing = sorted({p.name for p in written} - committed)
    extra = sorted(committed - {p.name for p in written})
    assert not stale and not missing and not extra, (
        f"generated modules are stale (run `make protos`): stale={stale} missing={missing} extra={extra}"
    )


def test_enums_keep_unspecified_zero() -> None:
    from protos.gpufleet.v1 import findings_pb2, operator_pb2, telemetry_pb2

    for module in (findings_pb2, operator_pb2, telemetry_pb2):
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            assert enum.values[0].number == 0
            assert enum.values[0].name.endswith("_UNSPECIFIED"), enum.name
