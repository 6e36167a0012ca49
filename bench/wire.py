"""A small HTTP/1.1 client that says when each answer reached this machine.

A load generator that shares the cores with the servers it measures is sometimes held off a core
for tens of milliseconds; an answer that arrives meanwhile is read that much later, and the
latency the client counts grows by the hold, though the server answered in time. The kernel
stamps each segment it receives (``SO_TIMESTAMPNS``, read with ``recvmsg``): the stamp of the
last segment of an answer is when the answer had reached this machine, whether or not the
client's loop was running. :class:`StampedHttp` reports it beside the answer, so that a benchmark
can count an answer's latency both ways: as its loop saw it and as it arrived.

Only what the benchmarks send is spoken: ``POST`` with a body, answers framed by
``Content-Length``, chunked, or the connection's close; connections kept alive and pooled, up
to a bound, as aiohttp's connector does.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass

__all__ = ["Answer", "StampedHttp"]

# Linux's SO_TIMESTAMPNS, which Python's socket module does not name; the control message it
# adds to a receive carries the same number
SO_TIMESTAMPNS = 35
RECV_BYTES = 1 << 16
ANCILLARY_BYTES = 256


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status, body, and the wall time (``time.time``'s clock) at which its
    last bytes reached this machine, by the kernel's stamp (or, where it gave none, when they
    were read)."""

    status: int
    body: bytes
    arrived: float


class _Connection:
    """One kept-alive TCP connection, one request at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._stamp = 0.0
        self.heard = False  # whether any of the current request's answer came

    @classmethod
    async def open(cls, host: str, port: int) -> _Connection:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return cls(sock)

    async def exchange(self, request: bytes) -> tuple[Answer, bool]:
        """Sends ``request`` and reads its answer; whether the connection may be kept."""
        self._buffer = b""
        self.heard = False
        await asyncio.get_running_loop().sock_sendall(self.sock, request)
        head = await self._until(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        version, status = lines[0].split(" ", 2)[:2]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self._exactly(int(headers["content-length"]))
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = await self._chunked()
        else:
            body = await self._to_close()
            headers["connection"] = "close"
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        return Answer(int(status), body, self._stamp), keep

    def close(self) -> None:
        self.sock.close()

    async def _until(self, mark: bytes) -> bytes:
        while (end := self._buffer.find(mark)) < 0:
            await self._receive()
        taken, self._buffer = self._buffer[:end], self._buffer[end + len(mark) :]
        return taken

    async def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            await self._receive()
        taken, self._buffer = self._buffer[:size], self._buffer[size:]
        return taken

    async def _chunked(self) -> bytes:
        parts = []
        while size := int((await self._until(b"\r\n")).split(b";")[0], 16):
            parts.append(await self._exactly(size))
            await self._until(b"\r\n")
        await self._until(b"\r\n")  # no trailers are sent to the benchmarks
        return b"".join(parts)

    async def _to_close(self) -> bytes:
        try:
            while True:
                await self._receive()
        except ConnectionError:
            return self._buffer

    async def _receive(self) -> None:
        """Appends what the socket holds, waiting for it if nothing; the kernel's stamp of the
        last segment read is the answer's arrival so far. Linux turns stamping on a moment after
        the first socket asks for it: a segment that came before has none, and the time of its
        read stands in, which can only make an answer look later than it was."""
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(RECV_BYTES, ANCILLARY_BYTES)
            except BlockingIOError:
                await self._readable()
                continue
            if not data:
                raise ConnectionError("the server closed the connection")
            self._stamp = time.time()  # no later than this where the kernel gives no stamp
            for level, kind, raw in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    seconds, nanoseconds = struct.unpack("qq", raw[:16])
                    self._stamp = seconds + nanoseconds * 1e-9
            self._buffer += data
            self.heard = True
            return

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self.sock.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(fd)


class StampedHttp:
    """``POST``s to one server over at most ``connections`` kept-alive connections; a request
    finding them all busy waits for one. A request on a kept connection the server has closed
    meanwhile goes again on a new one, once: nothing of it was answered."""

    def __init__(self, host: str, port: int, connections: int) -> None:
        self._host, self._port = host, port
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[_Connection] = []

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Answer:
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: {self._host}:{self._port}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in (headers or {}).items()),
        ]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        async with self._slots:
            connection = self._idle.pop() if self._idle else None
            try:
                if connection is not None:
                    try:
                        answer, keep = await connection.exchange(request)
                    except ConnectionError:
                        if connection.heard:
                            raise
                        connection.close()
                        connection = None
                if connection is None:
                    connection = await _Connection.open(self._host, self._port)
                    answer, keep = await connection.exchange(request)
            except BaseException:
                if connection is not None:
                    connection.close()
                raise
            if keep:
                self._idle.append(connection)
            else:
                connection.close()
        return answer

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
