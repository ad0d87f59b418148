"""gRPC plumbing shared by every process: server/channel options, TLS, error mapping.

SluiceErrors become status codes here and only here (`handle_errors`); the client side turns
statuses back into SluiceErrors with `errors.from_status`.
"""
from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable

import grpc

from . import errors
from .tls import SecurityConfig

log = logging.getLogger(__name__)

MAX_MESSAGE = 256 * 1024 * 1024

# so_reuseport=0: a stale server on the same port would otherwise silently take traffic.
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


def aio_server(security: SecurityConfig | None = None) -> grpc.aio.Server:
    return grpc.aio.server(options=SERVER_OPTIONS)


def add_port(server: grpc.aio.Server | grpc.Server, addr: str,
             security: SecurityConfig | None = None) -> int:
    """Bind addr; with [security] only a mutual-TLS port is opened (plaintext refused)."""
    if security is not None and security.enabled:
        port = server.add_secure_port(addr, security.server_credentials())
    else:
        port = server.add_insecure_port(addr)
    if port == 0:
        raise errors.Unavailable(f"cannot listen on {addr}: address in use or invalid")
    return port


def aio_channel(addr: str, security: SecurityConfig | None = None) -> grpc.aio.Channel:
    if security is not None and security.enabled:
        return grpc.aio.secure_channel(addr, security.channel_credentials(), options=CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)


def sync_channel(addr: str, security: SecurityConfig | None = None) -> grpc.Channel:
    if security is not None and security.enabled:
        return grpc.secure_channel(addr, security.channel_credentials(), options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)


def check_cluster(request: Any, cluster_id: int) -> None:
    got = getattr(request, "cluster_id", None)
    if got != cluster_id:
        raise errors.ClusterIdMismatch(got or 0, cluster_id)


def handle_errors(fn: Callable) -> Callable:
    """Decorate a grpc.aio servicer method: SluiceError -> its status code and message.

    Unexpected exceptions become INTERNAL with the exception text and are logged with a stack.
    Works for unary handlers and for async-generator (server-streaming) handlers.
    """
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
            try:
                async for item in fn(self, request, context):
                    yield item
            except errors.SluiceError as e:
                await context.abort(e.code, str(e))
            except Exception as e:  # noqa: BLE001 - the peer gets INTERNAL, we keep the stack
                if isinstance(e, grpc.aio.AbortError):
                    raise
                log.exception("%s failed", fn.__name__)
                await context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__}: {e}")
        return stream

    @functools.wraps(fn)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except errors.SluiceError as e:
            await context.abort(e.code, str(e))
        except Exception as e:  # noqa: BLE001
            if isinstance(e, grpc.aio.AbortError):
                raise
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__}: {e}")
    return unary


def to_sluice_error(e: grpc.RpcError) -> errors.SluiceError:
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    return errors.from_status(code, details or "")


def _passthrough(message: Any) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def add_service_with_raw_stream(service: Any, server: grpc.aio.Server, name: str,
                                raw_method: str = "PullBinlogs") -> None:
    """Register `sluice.v1.<name>` like the generated `add_<name>Servicer_to_server`, except that
    `raw_method`'s streamed responses may be yielded already serialized (bytes): the read paths
    frame stored payloads straight into response bytes, and re-encoding them as messages cost
    most of their time."""
    from sluice.proto import sluice_pb2 as pb
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name[name].methods:
        req = getattr(pb, method.input_type.name)
        resp = getattr(pb, method.output_type.name)
        fn = getattr(service, method.name)
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                fn, request_deserializer=req.FromString,
                response_serializer=_passthrough if method.name == raw_method
                else resp.SerializeToString)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString)
    full = f"sluice.v1.{name}"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(full, handlers),))
    server.add_registered_method_handlers(full, handlers)
