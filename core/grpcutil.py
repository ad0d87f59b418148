"""gRPC plumbing shared by every process: server/channel options, TLS, error mapping.

SluiceErrors become status codes here and only here (`handle_errors`); the client side turns
statuses back into SluiceErrors with `errors.from_status`. Request bytes that are not a valid
message become INVALID_ARGUMENT here too (`DecodeGuard`, installed on every server by
`aio_server`), on every method of every service, before any handler runs.
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


# grpc's blocking waits (the next message of a sync stream: every etcd watch and lease keepalive
# stream of pyetcd) wake every `grpc._common.MAXIMUM_WAIT_TIMEOUT` (0.1 s) only so that a main
# thread blocked there sees Ctrl-C: ten wakeups a second per waiting thread in every process, a
# good part of an idle process's CPU (docs/benchmarks.md, round 30). Once a second keeps Ctrl-C
# prompt.
BLOCKING_WAIT_WAKEUP_S = 1.0


def calm_blocking_waits(period: float = BLOCKING_WAIT_WAKEUP_S) -> None:
    """Make grpc's blocking waits wake every `period` s (called once by `sluice`'s main)."""
    from grpc import _common   # private: checked below, and by tests/integration/test_grpc_waits.py
    if not isinstance(getattr(_common, "MAXIMUM_WAIT_TIMEOUT", None), (int, float)):
        log.warning("grpc %s has no _common.MAXIMUM_WAIT_TIMEOUT: its blocking waits keep their "
                    "own wakeup period", grpc.__version__)
        return
    _common.MAXIMUM_WAIT_TIMEOUT = period


class _Undecodable:
    """What the guarded deserializer returns for bytes that are not a valid request message;
    the guarded behavior turns it into INVALID_ARGUMENT before the servicer sees anything."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail


def _guard_deserializer(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    # The message name comes from the bound FromString (a generated class's classmethod).
    owner = getattr(deserialize, "__self__", None)
    name = getattr(getattr(owner, "DESCRIPTOR", None), "name", None) or "request message"

    def guarded(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as e:  # noqa: BLE001 - DecodeError and its kin: all are bad input
            return _Undecodable(f"request is not a valid {name}: {e}")
    return guarded


async def _reject(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, _Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.detail)


def _guard_handler(h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The same handler with a deserializer that never raises and a behavior that answers
    INVALID_ARGUMENT for what it could not decode. Handlers of a kind not known here (or
    without a deserializer) are returned unchanged."""
    if h.request_deserializer is None:
        return h
    des = _guard_deserializer(h.request_deserializer)
    if h.unary_unary is not None:
        fn = h.unary_unary
        if not inspect.iscoroutinefunction(fn):
            return h

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await _reject(request, context)
            return await fn(request, context)
        return h._replace(request_deserializer=des, unary_unary=unary_unary)
    if h.unary_stream is not None:
        fn = h.unary_stream
        if inspect.isasyncgenfunction(fn):
            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await _reject(request, context)
                async for item in fn(request, context):
                    yield item
            return h._replace(request_deserializer=des, unary_stream=unary_stream)
        if inspect.iscoroutinefunction(fn):
            async def unary_stream_co(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await _reject(request, context)
                return await fn(request, context)
            return h._replace(request_deserializer=des, unary_stream=unary_stream_co)
        return h
    fn = h.stream_unary if h.stream_unary is not None else h.stream_stream
    if fn is None:
        return h

    async def checked(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for request in requests:
            await _reject(request, context)
            yield request
    if h.stream_unary is not None:
        if not inspect.iscoroutinefunction(fn):
            return h

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return await fn(checked(requests, context), context)
        return h._replace(request_deserializer=des, stream_unary=stream_unary)
    if inspect.isasyncgenfunction(fn):
        async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async for item in fn(checked(requests, context), context):
                yield item
        return h._replace(request_deserializer=des, stream_stream=stream_stream)
    if inspect.iscoroutinefunction(fn):
        async def stream_stream_co(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return await fn(checked(requests, context), context)
        return h._replace(request_deserializer=des, stream_stream=stream_stream_co)
    return h


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Bytes that are not a valid request message get INVALID_ARGUMENT "request is not a valid
    <Message>: ..." on every method (gRPC's own answer is UNKNOWN "Unexpected DecodeError").
    The guarded handler is built once per method and reused."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Callable[..., Any],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        h = await continuation(handler_call_details)
        if h is None:
            return None
        method = handler_call_details.method
        hit = self._cache.get(method)
        if hit is None or hit[0] is not h:
            hit = (h, _guard_handler(h))
            self._cache[method] = hit
        return hit[1]


def aio_server(security: SecurityConfig | None = None) -> grpc.aio.Server:
    return grpc.aio.server(options=SERVER_OPTIONS, interceptors=[DecodeGuard()])


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
