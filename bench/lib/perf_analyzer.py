"""Make Triton's perf_analyzer runnable here, run it at a fixed concurrency and parse its CSV report."""

from __future__ import annotations

import csv
import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# perf_analyzer's own virtualenv (`make setup`, from tools/perf-requirements.txt): tritonclient 2.49 carries the
# binary, and its pins (protobuf<5, numpy<2) must stay out of the services' `.venv`.
PERF_VENV = ROOT / ".venv-perf"
PERF_REQUIREMENTS = ROOT / "tools" / "perf-requirements.txt"


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer could not be set up, failed, or left no usable report; the message has its output."""


def perf_analyzer_path() -> str:
    """Where the perf_analyzer binary lives: the tool virtualenv `make setup` makes, else the PATH."""
    candidate = PERF_VENV / "bin" / "perf_analyzer"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("perf_analyzer")
    if found is None:
        raise PerfAnalyzerError(f"perf_analyzer not found: `make setup` installs it into {PERF_VENV}")
    return found


def _run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False, **kwargs)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def has_libb64() -> bool:
    """Whether the system has libb64.so, which the perf_analyzer binary links against."""
    return "libb64.so" in _run(["ldconfig", "-p"]).stdout


def _ensure_libb64() -> None:
    if has_libb64():
        return
    apt = ["apt-get", "install", "-y", "libb64-0d"]
    if os.geteuid() != 0 and shutil.which("sudo"):
        apt = ["sudo", *apt]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = _run(apt, env=env)
    if result.returncode != 0:
        update = ["apt-get", "update"] if apt[0] != "sudo" else ["sudo", "apt-get", "update"]
        _run(update, env=env)
        result = _run(apt, env=env)
    if result.returncode != 0 or not has_libb64():
        raise PerfAnalyzerError(
            f"perf_analyzer needs libb64.so.0d; `{' '.join(apt)}` failed:\n{result.stdout}\n{result.stderr}"
        )


def installed_cudart_lib() -> Path | None:
    """The folder holding libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel in the tool virtualenv)."""
    for lib in sorted(PERF_VENV.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib")):
        if (lib / "libcudart.so.12").exists():
            return lib
    return None


def _ensure_cudart() -> Path:
    found = installed_cudart_lib()
    if found is None:
        raise PerfAnalyzerError(
            f"perf_analyzer needs libcudart.so.12 from {PERF_REQUIREMENTS.name}: run `make setup` ({PERF_VENV})"
        )
    return found


@functools.cache
def _prepared_env() -> tuple[tuple[str, str], ...]:
    _ensure_libb64()
    cuda_lib = _ensure_cudart()
    env = dict(os.environ)
    parts = [str(cuda_lib), *[p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]]
    env["LD_LIBRARY_PATH"] = ":".join(dict.fromkeys(parts))
    ldd = _run(["ldd", perf_analyzer_path()], env=env)
    missing = [line.strip() for line in ldd.stdout.splitlines() if "not found" in line]
    if missing:
        raise PerfAnalyzerError("perf_analyzer still misses shared libraries: " + "; ".join(missing))
    return tuple(env.items())


def ensure_perf_analyzer() -> dict[str, str]:
    """Install what perf_analyzer needs (libb64, libcudart.so.12) if missing; the env to run it with."""
    return dict(_prepared_env())


@dataclass
class PerfResult:
    """One perf_analyzer measurement; latencies in microseconds, as perf_analyzer reports them."""

    model: str
    url: str
    concurrency: int
    batch: int
    throughput: float  # inferences per second
    p50_us: float
    p90_us: float
    p95_us: float | None
    p99_us: float
    avg_us: float | None = None
    client_send_us: float | None = None
    client_recv_us: float | None = None
    # Server-side breakdown (from ModelStatistics), present only when the server reports it.
    network_us: float | None = None
    server_queue_us: float | None = None
    server_compute_input_us: float | None = None
    server_compute_infer_us: float | None = None
    server_compute_output_us: float | None = None
    command: str = ""
    row: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def p50_ms(self) -> float:
        return self.p50_us / 1000

    @property
    def p90_ms(self) -> float:
        return self.p90_us / 1000

    @property
    def p99_ms(self) -> float:
        return self.p99_us / 1000

    @property
    def has_server_stats(self) -> bool:
        return self.server_queue_us is not None


def _num(row: dict[str, str], key: str) -> float | None:
    value = row.get(key)
    if value is None or value.strip() == "":
        return None
    return float(value)


def parse_csv(text: str) -> dict[str, str]:
    """The single data row of a perf_analyzer -f CSV (one concurrency level), keyed by column name."""
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise PerfAnalyzerError(f"perf_analyzer CSV has no data row:\n{text}")
    return {k.strip(): v.strip() for k, v in rows[-1].items() if k is not None and v is not None}


def result_from_row(
    row: dict[str, str], model: str, url: str, concurrency: int, batch: int, command: str = ""
) -> PerfResult:
    """Map perf_analyzer 2.49 CSV columns onto a PerfResult."""
    required = ("Inferences/Second", "p50 latency", "p90 latency", "p99 latency")
    missing = [k for k in required if k not in row]
    if missing:
        raise PerfAnalyzerError(f"perf_analyzer CSV lacks columns {missing}; got {sorted(row)}")
    return PerfResult(
        model=model,
        url=url,
        concurrency=concurrency,
        batch=batch,
        throughput=float(row["Inferences/Second"]),
        p50_us=float(row["p50 latency"]),
        p90_us=float(row["p90 latency"]),
        p95_us=_num(row, "p95 latency"),
        p99_us=float(row["p99 latency"]),
        avg_us=_num(row, "Avg latency"),
        client_send_us=_num(row, "Client Send"),
        client_recv_us=_num(row, "Client Recv"),
        network_us=_num(row, "Network+Server Send/Recv"),
        server_queue_us=_num(row, "Server Queue"),
        server_compute_input_us=_num(row, "Server Compute Input"),
        server_compute_infer_us=_num(row, "Server Compute Infer"),
        server_compute_output_us=_num(row, "Server Compute Output"),
        command=command,
        row=row,
    )


def perf_analyzer_command(
    model: str,
    url: str,
    concurrency: int,
    batch: int = 1,
    shape: str | None = None,
    measurement_ms: int = 3000,
    extra: Sequence[str] = (),
    csv_file: str = "perf.csv",
) -> list[str]:
    """The perf_analyzer command line (without the binary's directory when shown to people).

    Without an `--input-data` in `extra`, the inputs are zeros: perf_analyzer's default random data fills FP32
    tensors with random bit patterns (NaN, Inf and values past 1e19 among them), which the model service refuses
    as input no model can compute on."""
    cmd = [
        perf_analyzer_path(),
        "-m",
        model,
        "-u",
        url,
        "-i",
        "grpc",
        "-b",
        str(batch),
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
        "--measurement-interval",
        str(measurement_ms),
        "--stability-percentage",
        "15",
        "--max-trials",
        "10",
    ]
    if shape:
        cmd += ["--shape", shape]
    cmd += list(extra)
    if "--input-data" not in extra:
        cmd += ["--input-data", "zero"]
    cmd += ["--verbose-csv", "-f", csv_file]
    return cmd


def display_command(cmd: Sequence[str]) -> str:
    """The command as a person would type it (binary by name, CSV path elided)."""
    shown = list(cmd)
    shown[0] = "perf_analyzer"
    if "-f" in shown:
        i = shown.index("-f")
        del shown[i : i + 2]
    return shlex.join(shown)


def run_perf_analyzer(
    model: str,
    url: str,
    concurrency: int,
    batch: int = 1,
    shape: str | None = None,
    measurement_ms: int = 3000,
    extra: Sequence[str] = (),
    retries: int = 1,
    timeout_s: float = 300,
) -> PerfResult:
    """Run perf_analyzer at one concurrency level and parse its CSV.

    When perf_analyzer cannot stabilise (it then exits non-zero and writes no CSV), it is run again up
    to `retries` times with a doubled measurement window, as its own message advises; the command in
    the result shows the window that succeeded. Any other failure raises PerfAnalyzerError carrying
    perf_analyzer's output.
    """
    env = ensure_perf_analyzer()
    windows = [measurement_ms] + [2 * measurement_ms] * retries
    for window in windows:
        with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as tmp:
            csv_path = Path(tmp) / "perf.csv"
            cmd = perf_analyzer_command(model, url, concurrency, batch, shape, window, extra, str(csv_path))
            try:
                proc = _run(cmd, env=env, cwd=tmp, timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                partial = "".join(_text(x) for x in (exc.stdout, exc.stderr))
                raise PerfAnalyzerError(f"{display_command(cmd)} ran past {timeout_s}s:\n{partial}") from exc
            output = (proc.stdout or "") + (proc.stderr or "")
            if proc.returncode == 0 and csv_path.exists():
                row = parse_csv(csv_path.read_text())
                return result_from_row(row, model, url, concurrency, batch, display_command(cmd))
            if "Failed to obtain stable measurement" not in output:
                break
    raise PerfAnalyzerError(f"{display_command(cmd)} failed (exit {proc.returncode}):\n{output.strip()}")
