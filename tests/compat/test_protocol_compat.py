"""Our protos/ against the messages tritonclient carries: same names, field numbers, types and RPCs.

Our descriptors come from protoc (a FileDescriptorSet), not from importing services.protos, so the two
definitions of package `inference` never meet in one descriptor pool.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc
from tritonclient.grpc import model_config_pb2, service_pb2

ROOT = Path(__file__).resolve().parents[2]


def ours() -> descriptor_pb2.FileDescriptorSet:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        rc = protoc.main(
            ["protoc", f"-I{ROOT / 'protos'}", f"--descriptor_set_out={out}", "inference.proto", "model_config.proto"]
        )
        assert rc == 0
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _messages(prefix: str, messages) -> dict[str, descriptor_pb2.DescriptorProto]:
    found = {}
    for m in messages:
        name = f"{prefix}.{m.name}"
        found[name] = m
        found.update(_messages(name, m.nested_type))
    return found


def _enums(prefix: str, file_or_message) -> dict[str, dict[str, int]]:
    found = {f"{prefix}.{e.name}": {v.name: v.number for v in e.value} for e in file_or_message.enum_type}
    for m in getattr(file_or_message, "message_type", None) or getattr(file_or_message, "nested_type", []):
        found.update(_enums(f"{prefix}.{m.name}", m))
    return found


def theirs() -> list[descriptor_pb2.FileDescriptorProto]:
    files = []
    for module in (service_pb2, model_config_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        files.append(proto)
    return files


def test_every_message_and_field_matches_tritonclient() -> None:
    our_files, their_files = ours().file, theirs()
    our_msgs = {k: v for f in our_files for k, v in _messages(f.package, f.message_type).items()}
    their_msgs = {k: v for f in their_files for k, v in _messages(f.package, f.message_type).items()}
    assert len(our_msgs) > 40
    for name, message in our_msgs.items():
        assert name in their_msgs, f"{name} is not a tritonclient message"
        their_fields = {f.number: f for f in their_msgs[name].field}
        for field in message.field:
            other = their_fields.get(field.number)
            assert other is not None, f"{name}.{field.name} = {field.number} does not exist in tritonclient"
            assert (field.name, field.type, field.label, field.type_name) == (
                other.name,
                other.type,
                other.label,
                other.type_name,
            ), f"{name}.{field.name} differs from tritonclient"
    our_enums = {k: v for f in our_files for k, v in _enums(f.package, f).items()}
    their_enums = {k: v for f in their_files for k, v in _enums(f.package, f).items()}
    for name, values in our_enums.items():
        for value, number in values.items():
            assert their_enums[name].get(value) == number, f"enum {name}.{value}"


def test_every_rpc_matches_tritonclient() -> None:
    (our_service,) = [s for f in ours().file for s in f.service]
    (their_service,) = [s for f in theirs() for s in f.service]
    assert our_service.name == their_service.name == "GRPCInferenceService"
    theirs_by_name = {m.name: m for m in their_service.method}
    required = {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    }
    assert required <= {m.name for m in our_service.method}
    for method in our_service.method:
        other = theirs_by_name[method.name]
        assert (method.input_type, method.output_type, method.server_streaming) == (
            other.input_type,
            other.output_type,
            other.server_streaming,
        )


@pytest.mark.parametrize("stale", [False, True])
def test_generated_stubs_are_fresh(stale: bool, tmp_path: Path) -> None:
    """`tools/gen_protos.py --check` passes on the committed stubs and fails on a stale copy."""
    if not stale:
        result = subprocess.run([sys.executable, "tools/gen_protos.py", "--check"], cwd=ROOT, capture_output=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return
    copy = tmp_path / "proj"
    for part in ("protos", "services/protos", "tools"):
        (copy / part).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(ROOT / part), str(copy / part)], check=True)
    proto = copy / "protos" / "inference.proto"
    proto.write_text(proto.read_text().replace("string id = 3;", "string id = 3;\n  string extra = 99;", 1))
    result = subprocess.run(
        [sys.executable, "tools/gen_protos.py", "--check"], cwd=copy, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "stale" in result.stdout
