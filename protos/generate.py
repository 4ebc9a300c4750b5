"""Regenerate the Python modules for protos/gpufleet/v1/*.proto (`make protos`).

Imports resolve from the repository root, so generated modules import each other as
`protos.gpufleet.v1.<name>_pb2`. The staleness test calls `generate` into a temporary tree and
compares the bytes with the committed files.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos" / "gpufleet" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Run protoc (grpcio-tools) for every .proto; write under out_root; return the files written."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # test extra; imported here so the package needs it only to generate

    include = Path(protoc.__file__).parent / "_proto"
    # mypy-protobuf's plugins are scripts installed beside this interpreter.
    plugins = Path(sys.executable).parent
    protos = [str(p.relative_to(ROOT)) for p in proto_files()]
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={plugins / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugins / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    out_dir = out_root / PROTO_DIR.relative_to(ROOT)
    return sorted(p for p in out_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        written = generate(Path(tmp))
        for old in PROTO_DIR.iterdir():
            if old.name.endswith(GENERATED_SUFFIXES):
                old.unlink()
        for path in written:
            shutil.copyfile(path, PROTO_DIR / path.name)
            print(f"wrote {(PROTO_DIR / path.name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
