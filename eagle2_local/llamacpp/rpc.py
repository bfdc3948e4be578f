"""llama.cpp's RPC backend: offload a model's layers to ``rpc-server`` processes, or be one.

An RPC server is, to llama.cpp, one more non-host device (like a GPU): weights, KV cache and compute buffers of
the offloaded layers live in its memory, and every decode ships the graph there. That gives users a way to split a
model across machines, and lets us exercise llama.cpp's offload path on a CPU-only machine (servers on loopback).

The pinned llama-cpp-python binds none of ggml's backend-registry functions, so they are bound here through
ctypes (the symbols live in the libggml libraries that libllama loads). Three llama.cpp behaviours shape this
module:

* Default device selection does not put layers on a registered RPC device here, so a model is loaded with an
  explicit, NULL-terminated ``llama_model_params.devices`` list holding the servers' devices.
* The RPC client aborts the process (``GGML_ABORT``) when it cannot connect or a server stops answering. We
  check an endpoint with the protocol's HELLO message from Python first, so an unreachable server is a normal
  error; for a server that disappears later, an abort hook turns the abort into one ``error:`` line and exit
  code 1 (nothing can be recovered: llama.cpp's client state is gone).
* A server serves one client connection at a time; a second client waits until the first disconnects.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import socket
import struct
import sys
import threading
from typing import Iterable, Sequence

import llama_cpp

from ..errors import Eagle2Error
from .ggml_backend import DEVICE_TYPE_CPU, ggml_fn

log = logging.getLogger(__name__)

DEFAULT_PORT = 50052
INSTALL_HINT = ('reinstall llama-cpp-python with RPC: CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall '
                f'--no-cache-dir --no-binary llama-cpp-python llama-cpp-python=={llama_cpp.__version__}')
HELLO_TIMEOUT_S = 10.0
# The RPC protocol of the pinned llama.cpp (ggml-rpc.h / ggml-rpc.cpp): HELLO is command 14 in every version;
# its request is the client's transport capabilities (24 bytes, all zero = plain TCP), its reply the server's
# protocol version (major, minor, patch, pad) and capabilities.
_PROTO_MAJOR = 7
_CMD_HELLO = 14
_CAPS_SIZE = 24


class RPCError(Eagle2Error):
    """An RPC server cannot be used (unreachable, wrong protocol, this build has no RPC)."""


# ---------------------------------------------------------------- endpoints
def parse_servers(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"HOST:PORT,HOST:PORT"`` (or a list of such strings) as checked ``HOST:PORT`` endpoints."""
    if spec is None:
        return ()
    parts = spec.split(",") if isinstance(spec, str) else [p for s in spec for p in str(s).split(",")]
    out = []
    for part in (p.strip() for p in parts):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RPCError(f"bad RPC server {part!r}: expected HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT})")
        out.append(f"{host}:{int(port)}")
    if not out:
        raise RPCError("no RPC server given")
    if len(set(out)) != len(out):
        raise RPCError(f"an RPC server is listed twice: {','.join(out)}")
    return tuple(out)


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def supports_rpc() -> bool:
    """Whether the loaded llama.cpp was built with its RPC backend (``-DGGML_RPC=on``)."""
    return bool(llama_cpp.llama_supports_rpc())


def require_rpc() -> None:
    if not supports_rpc():
        raise RPCError(f"this llama-cpp-python build has no RPC support; {INSTALL_HINT}")


def hello(endpoint: str, timeout: float = HELLO_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect, exchange the protocol's HELLO and disconnect; returns the server's protocol version.

    Done before llama.cpp connects, because llama.cpp aborts the process on any failure here.
    """
    host, port = _split(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS_SIZE) + bytes(_CAPS_SIZE))
            size = struct.unpack("<Q", _recv_exactly(sock, 8))[0]
            reply = _recv_exactly(sock, size)
    except socket.timeout:
        raise RPCError(f"RPC server {endpoint} accepted the connection but did not answer within {timeout:.0f} s "
                       "(a server serves one client at a time: is another process using it?)") from None
    except OSError as exc:
        raise RPCError(f"cannot reach RPC server {endpoint}: {exc.strerror or exc}") from None
    if size < 3:
        raise RPCError(f"{endpoint} did not answer like an RPC server")
    version = (reply[0], reply[1], reply[2])
    if version[0] != _PROTO_MAJOR:
        raise RPCError(f"RPC server {endpoint} speaks protocol {'.'.join(map(str, version))}, this build "
                       f"{_PROTO_MAJOR}.x: run servers built from the same llama.cpp version")
    return version


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError(104, "the server closed the connection")
        buf += chunk
    return buf


# ---------------------------------------------------------------- ggml bindings
_vp = ctypes.c_void_p
_ADD_SERVER = ctypes.CFUNCTYPE(_vp, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                 ctypes.POINTER(_vp))
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def _rpc_proc(name: str, prototype):
    """A function the RPC backend exports through its registry (how llama.cpp's own tools find them)."""
    require_rpc()
    reg = ggml_fn("ggml_backend_reg_by_name")(b"RPC")
    addr = ggml_fn("ggml_backend_reg_get_proc_address")(reg, name.encode()) if reg else None
    if not addr:
        raise RPCError(f"this llama.cpp's RPC backend does not export {name}")
    return prototype(addr)


def device_name(dev: int) -> str:
    name = ggml_fn("ggml_backend_dev_name")(dev) or b"?"
    desc = ggml_fn("ggml_backend_dev_description")(dev) or b""
    return f"{name.decode()}[{desc.decode()}]"


# ---------------------------------------------------------------- client side
_lock = threading.Lock()
_registered: dict[str, tuple[int, ...]] = {}  # endpoint -> its devices (registering twice duplicates devices)


def devices(servers: Iterable[str]) -> list[int]:
    """The ggml devices of ``servers`` (registered with ggml once per process), in the order given."""
    servers = parse_servers(list(servers))
    require_rpc()
    out: list[int] = []
    with _lock:
        for endpoint in servers:
            if endpoint not in _registered:
                hello(endpoint)
                install_abort_hook()
                reg = _rpc_proc("ggml_backend_rpc_add_server", _ADD_SERVER)(endpoint.encode())
                if not reg:
                    raise RPCError(f"RPC server {endpoint} offers no device")
                ggml_fn("ggml_backend_register")(reg)
                n = int(ggml_fn("ggml_backend_reg_dev_count")(reg))
                _registered[endpoint] = tuple(int(ggml_fn("ggml_backend_reg_dev_get")(reg, i)) for i in range(n))
                log.info("RPC server %s: %s", endpoint, ", ".join(device_name(d) for d in _registered[endpoint]))
            out.extend(_registered[endpoint])
    return out


def device_list(devs: Sequence[int]) -> ctypes.Array:
    """A NULL-terminated ``ggml_backend_dev_t`` array for ``llama_model_params.devices`` (keep it alive while
    the model loads)."""
    return (_vp * (len(devs) + 1))(*devs, None)


@_ABORT_CALLBACK
def _on_abort(message: bytes) -> None:  # pragma: no cover - runs inside a dying process, checked by rpc tests
    """ggml calls abort() right after this: say what happened in one line and leave with status 1 instead."""
    text = (message or b"").decode("utf-8", errors="replace").strip().splitlines()
    why = re.sub(r"^\S+:\d+: ", "", text[0]) if text else "unknown error"  # drop ggml's source file:line
    hint = " (an RPC server stopped answering; restart it and run again)" if "RPC" in why or "connect" in why else ""
    try:
        sys.stdout.flush()
    except Exception:
        pass
    os.write(2, f"\nerror: llama.cpp aborted: {why}{hint}\n".encode())
    os._exit(1)


_abort_hook_installed = False


def install_abort_hook() -> None:
    """Route ggml's fatal errors through :func:`_on_abort` (one ``error:`` line, exit 1, no core dump)."""
    global _abort_hook_installed
    if not _abort_hook_installed:
        ggml_fn("ggml_set_abort_callback")(ctypes.cast(_on_abort, _vp))
        _abort_hook_installed = True


# ---------------------------------------------------------------- server side
def is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    import ipaddress
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


UNTRUSTED_WARNING = ("warning: the RPC protocol has no authentication or encryption, and a client can make this "
                     "server allocate memory and run code paths with unchecked inputs. Serve only on a trusted, "
                     "private network; never expose it to the internet.")


def check_bindable(host: str, port: int) -> None:
    """Fail with a clear message now rather than from inside llama.cpp's accept loop."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        raise RPCError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, threads: int | None = None) -> None:
    """Serve this machine's CPU backend to RPC clients until the process is stopped (Ctrl-C / SIGTERM).

    llama.cpp's server loop never returns while it works, so it runs in a daemon thread and the main thread
    waits, keeping Ctrl-C responsive. A return from the loop means it failed (it printed why).
    """
    require_rpc()
    if not 0 < port < 65536:
        raise RPCError(f"port must be in 1..65535, got {port}")
    threads = threads or max(1, (os.cpu_count() or 2) // 2)
    if threads < 1:
        raise RPCError(f"--threads must be >= 1, got {threads}")
    check_bindable(host, port)
    cpu = ggml_fn("ggml_backend_dev_by_type")(DEVICE_TYPE_CPU)
    if not cpu:
        raise RPCError("llama.cpp has no CPU device to serve")
    start = _rpc_proc("ggml_backend_rpc_start_server", _START_SERVER)
    devs = (_vp * 1)(cpu)
    endpoint = f"{host}:{port}"
    worker = threading.Thread(target=start, args=(endpoint.encode(), None, threads, 1, devs), daemon=True,
                              name="rpc-server")
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    raise RPCError(f"the RPC server on {endpoint} stopped (see llama.cpp's message above)")
