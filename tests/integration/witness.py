"""An independent witness at the source: a TCP server that counts requests in flight.

Workers' sources hold a connection to it and, per request, send the hold time in
milliseconds; the witness counts the request in flight for that long, keeps the
peak, and answers. It knows nothing of the governance store, so its peak is an
outside view of the fleet-wide concurrency cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field


@dataclass
class Witness:
    in_flight: int = 0
    peak: int = 0
    served: int = 0
    # (start, end, hold asked for) of each request, time.monotonic() and seconds; a request
    # ends when its hold is over or when its caller goes away (a cancelled attempt closes
    # its connection)
    spans: list[tuple[float, float, float]] = field(default_factory=list)
    server: asyncio.base_events.Server | None = None
    port: int = 0

    async def start(self) -> Witness:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                start, hold_s = time.monotonic(), float(line) / 1000
                try:
                    gone = await self._caller_leaves(reader, hold_s)
                finally:
                    self.in_flight -= 1
                    self.spans.append((start, time.monotonic(), hold_s))
                if gone:
                    break
                self.served += 1
                writer.write(b"ok\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _caller_leaves(reader: asyncio.StreamReader, hold_s: float) -> bool:
        """Hold for `hold_s`; True if the caller closed its connection before (a caller
        sends nothing more while it waits for its reply)."""
        leaving = asyncio.ensure_future(reader.read(1))
        try:
            done, _ = await asyncio.wait({leaving}, timeout=hold_s)
        finally:
            leaving.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await leaving  # the reader is free again before the next request is read
        return bool(done)


class WitnessClient:
    """One caller's connection to the witness (a source adapter's transport)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None

    async def hold(self, ms: float) -> None:
        if self._conn is None:
            self._conn = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self._conn
        try:
            writer.write(f"{ms}\n".encode())
            await writer.drain()
            await reader.readline()
        except BaseException:
            writer.close()  # a cancelled request leaves the stream mid-reply
            self._conn = None
            raise
