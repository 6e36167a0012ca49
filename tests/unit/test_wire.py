"""The benchmarks' stamped HTTP client against a local server that frames its answers as told:
each answer is read whole however it is framed, connections are kept and bounded, and an answer
that arrived while the client's loop was held is stamped when it arrived, not when it was read."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from bench.wire import StampedHttp

Handler = Callable[[bytes], Awaitable[bytes | None]]


class _Server:
    """Answers each request with what ``handler`` returns for its body (``None``: closes the
    connection, as it does after an answer framed by no length); counts the connections
    accepted and the most open at once."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.open = 0
        self.most_open = 0
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def __aexit__(self, *_: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                self.paths.append(lines[0].split(" ")[1])
                headers = dict(line.split(": ", 1) for line in lines[1:] if line)
                self.headers.append(headers)
                body = await reader.readexactly(int(headers["Content-Length"]))
                answer = await self.handler(body)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if b"Content-Length" not in answer and b"chunked" not in answer:
                    break  # framed by the close
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def _sized(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def _echo(body: bytes) -> bytes:
    return _sized(body)


def test_answers_framed_by_length_chunks_or_close_are_read_whole() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    closed = b"HTTP/1.1 503 Service Unavailable\r\n\r\nbusy"
    answers = {b"sized": _sized(b'{"a": 1}'), b"chunked": chunked, b"closed": closed}

    async def framed(body: bytes) -> bytes:
        return answers[body]

    async def run() -> list[tuple[int, bytes]]:
        server = _Server(framed)
        async with server as port:
            http = StampedHttp("127.0.0.1", port, 4)
            got = [await http.post("/p", name) for name in (b"sized", b"chunked", b"closed")]
            got.append(await http.post("/p", b"sized"))  # after the close, on a new connection
            await http.close()
        assert server.accepted == 2  # the first kept for the second; the third's closed
        return [(answer.status, answer.body) for answer in got]

    assert asyncio.run(run()) == [
        (200, b'{"a": 1}'),
        (200, b"abcde"),
        (503, b"busy"),
        (200, b'{"a": 1}'),
    ]


def test_a_request_carries_its_path_body_and_headers() -> None:
    async def run() -> tuple[_Server, bytes]:
        server = _Server(_echo)
        async with server as port:
            http = StampedHttp("127.0.0.1", port, 1)
            answer = await http.post("/v1/m/predict", b'{"x": 2}', {"model-id": "m7"})
            await http.close()
        return server, answer.body

    server, body = asyncio.run(run())
    assert body == b'{"x": 2}'
    assert server.paths == ["/v1/m/predict"]
    assert server.headers[0]["model-id"] == "m7"
    assert server.headers[0]["Content-Type"] == "application/json"


def test_connections_are_bounded_and_requests_beyond_wait_for_one() -> None:
    async def slow(body: bytes) -> bytes:
        await asyncio.sleep(0.02)
        return _sized(body)

    async def run() -> tuple[_Server, list[bytes]]:
        server = _Server(slow)
        async with server as port:
            http = StampedHttp("127.0.0.1", port, 2)
            answers = await asyncio.gather(*(http.post("/p", b"%d" % i) for i in range(6)))
            await http.close()
        return server, [answer.body for answer in answers]

    server, bodies = asyncio.run(run())
    assert bodies == [b"%d" % i for i in range(6)]
    assert server.accepted == 2
    assert server.most_open == 2


def test_a_kept_connection_the_server_closed_is_replaced_once() -> None:
    """The server closes every connection after its first answer without saying so: the next
    request on it goes again on a new one; a server that closes before answering at all is an
    error, not a retry loop."""
    served = 0

    async def once(body: bytes) -> bytes | None:
        nonlocal served
        served += 1
        return _sized(body) if body != b"never" else None

    class _OneAnswer(_Server):
        async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.accepted += 1
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            answer = await self.handler(await reader.readexactly(length))
            if answer is not None:
                writer.write(answer)
                await writer.drain()
            writer.close()

    async def run() -> tuple[_Server, list[bytes]]:
        server = _OneAnswer(once)
        async with server as port:
            http = StampedHttp("127.0.0.1", port, 1)
            first = await http.post("/p", b"1")
            await asyncio.sleep(0.05)  # the server's close has reached the client
            second = await http.post("/p", b"2")
            with pytest.raises(ConnectionError):
                await http.post("/p", b"never")
            await http.close()
        return server, [first.body, second.body]

    server, bodies = asyncio.run(run())
    assert bodies == [b"1", b"2"]
    assert server.accepted == 3


def test_an_answer_read_after_the_loop_was_held_is_stamped_when_it_arrived() -> None:
    """The server, on a thread of its own, answers 20 ms into the 150 ms for which the client's
    loop is held: the stamp falls after the send and well before the read. (A server on the
    client's own loop writes before the hold, and the kernel may take the loopback packet up
    only once the held process runs again.)"""
    received = threading.Event()
    sent: list[float] = []

    async def stamp(body: bytes) -> bytes:
        if body == b"x":
            received.set()
            await asyncio.sleep(0.02)
        sent.append(time.time())
        return _sized(body)

    async def run(port: int) -> tuple[float, float, float]:
        http = StampedHttp("127.0.0.1", port, 1)
        await http.post("/p", b"warm")
        task = asyncio.ensure_future(http.post("/p", b"x"))
        while not received.is_set():
            await asyncio.sleep(0.001)
        held_from = time.time()
        time.sleep(0.15)  # the loop is held, as a busy machine holds it
        answer = await task
        read = time.time()
        await http.close()
        return answer.arrived, held_from, read

    with _server_thread(stamp) as port:
        arrived, held_from, read = asyncio.run(run(port))
    assert held_from < sent[-1] <= arrived < held_from + 0.1
    assert read - arrived >= 0.05


@contextlib.contextmanager
def _server_thread(handler: Handler) -> Iterator[int]:
    """A :class:`_Server` of ``handler`` on its own thread and loop, while the block runs."""
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[int] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with _Server(handler) as port:
            started.set_result(port)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield started.result(timeout=10)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        loop.close()
