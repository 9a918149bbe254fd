"""Source layer: a provider's JSON decoded as it arrives, within a memory budget and in slices.

`json.loads` of a body of many small values (``[{},{},...]``) builds objects
worth about 25 times the body, and holds the event loop (and the GIL, so a
thread does not help) for its whole run: a 63 MB body cost 1.6 GB and seconds
of a frozen loop. Here a body is fed to a C push parser (ijson's yajl2
backend) a slice of at most `SLICE` bytes at a time, the loop gets a turn
after every slice, and every object built is charged, at no less than its size
in memory, against a budget of 3.5 times the body limit: a body that would
cost more is refused (``would take more than N MiB to decode``) once its
objects pass the budget, and what it had built is dismantled a slice at a
time too (freeing a few million objects at once stalls a loop as long as
building them). Peak memory for one body is then the budget plus the token
the parser holds while it builds it (a few MiB, see below): within 4 times
the limit. The largest embeddings answer OpenAI sends (2,048 vectors of 3,072
float32s in base64, 34 MB, 201 MB as Python floats) fits at the default limit.

One token (a string, a number) is parsed in one step, the longest there is:
a token longer than `MAX_TOKEN_BYTES` (4 MiB, a million tokens of text, more
than any model writes in one answer) is refused, which keeps every step of
the loop to a few tens of milliseconds.

Only UTF-8 (and its kin: ASCII, UTF-8 with a BOM) is read, which is what JSON
between systems must be (RFC 8259) and what every OpenAI-style provider sends:
a body declared in another charset is refused unread (some of Python's codecs,
such as punycode, take quadratic time), and bytes that are not UTF-8 are never
replaced: both make an `Undecodable`, which the adapters classify as a
malformed answer.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import sys
from collections.abc import Mapping
from typing import Any

import ijson  # type: ignore[import-untyped]  # no type hints of its own

from polygate_celery.sources.body import Answer, BodyTooLarge, announced_too_large

UTF8_CHARSETS = frozenset({"utf-8", "utf8", "utf-8-sig", "us-ascii", "ascii"})
SLICE = 16 * 1024  # bytes fed to the parser between two turns of the loop
STEP = 64 * 1024  # values let go of between two turns of the loop
BUDGET_TENTHS = 35  # the budget: 3.5 times the body limit
MAX_DEPTH = 512
MAX_TOKEN_BYTES = 4 * 1024 * 1024
EXCERPT_BYTES = 4096
# What a decoded value is charged: its own size (sys.getsizeof for a string, 36
# bytes for a number, what a float takes or an int of up to 64 bits), and its
# place in its container: 8 bytes in a list, grown by an eighth, or a dict's
# entry and index in a table at most two-thirds full. null, true, false and ""
# are shared objects, but are charged _LEAST all the same, so that the parser's
# work, not only its memory, is bounded by the budget. A dict or a list is
# charged 384 bytes (a dict of up to five keys takes 184): besides its memory,
# every container is walked by each full pass of the cycle collector, which
# pauses the whole process, so one answer may build about half a million at most.
_IN_LIST = 9
_IN_DICT = 48
_CONTAINER = 384
_NUMBER = 36
_LEAST = 16
_STARTS = frozenset({"start_map", "start_array"})
_ENDS = frozenset({"end_map", "end_array"})
_BOM = codecs.BOM_UTF8
_ONLY_HERE = 2  # sys.getrefcount of an object held by one local name alone


class Undecodable(Exception):
    """A body that cannot be read as JSON text within its budget; `why` says why."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why
        self.excerpt = ""


class Budget:
    """Bytes of decoded objects one answer may still cost."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def charge(self, cost: int) -> None:
        self.left -= cost
        if self.left < 0:
            raise Undecodable(f"would take more than {self.limit // 2**20} MiB to decode")

    def refund(self, cost: int) -> None:
        self.left = min(self.limit, self.left + cost)


def budget_for(max_body_bytes: int) -> Budget:
    return Budget(BUDGET_TENTHS * max_body_bytes // 10)


def charset(headers: Mapping[str, str]) -> str | None:
    """The charset a Content-Type header declares, lower-cased; None if it declares none."""
    for parameter in headers.get("content-type", "").split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip("\"'").lower()
    return None


def check_charset(headers: Mapping[str, str]) -> None:
    """Refuse a body declared in a charset other than UTF-8's kin."""
    declared = charset(headers)
    if declared is not None and declared.replace("_", "-") not in UTF8_CHARSETS:
        raise Undecodable(f"charset {declared[:40]!r} (only UTF-8 is read)")


class JsonBuilder:
    """Builds one JSON value from the slices it is fed, charging what it builds to `budget`.

    Containers are attached to their parent as they open, so whatever was built
    so far hangs from `root` (for `discard`) whenever decoding stops.
    """

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.root: list[Any] = []
        self._events = ijson.sendable_list()
        self._parser = ijson.basic_parse_coro(self._events, use_float=True)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._stack: list[Any] = [self.root]
        self._keys: list[str] = []
        self._started = False
        self._head = bytearray()
        self._held = bytearray()
        self._in_token = 0  # bytes sent since the parser last made an event
        self.excerpt = ""

    def feed(self, data: bytes) -> None:
        """Take at most `SLICE` bytes more of the body."""
        if not self._started:  # a BOM may come split across the first reads
            self._head += data
            if len(self._head) < len(_BOM):
                return
            self._started = True
            data = bytes(self._head).removeprefix(_BOM)
            self._head.clear()
        try:
            text = self._utf8.decode(data)
        except UnicodeDecodeError:
            raise Undecodable("not valid UTF-8") from None
        if len(self.excerpt) < EXCERPT_BYTES:
            self.excerpt += text[: EXCERPT_BYTES - len(self.excerpt)]
        if not data:
            return  # the parser reads an empty send as the end of the body
        self._held += data
        if self._in_token + len(self._held) > MAX_TOKEN_BYTES:
            raise Undecodable(f"a single value longer than {MAX_TOKEN_BYTES // 2**20} MiB")
        if len(self._held) >= self._in_token:
            self._send()

    def _send(self) -> None:
        """Parse what is held. The parser scans a token split across sends again
        from its start at every send, so while a long token (a long string)
        goes on, bytes are held until they double it: its scans cost twice
        its length in all, not its length squared."""
        data = bytes(self._held)
        self._held.clear()
        try:
            self._parser.send(data)
        except ijson.JSONError:
            raise Undecodable("not JSON") from None
        self._in_token = 0 if self._events else self._in_token + len(data)
        self._build()

    def finish(self) -> Any:
        """The value, once the body has ended."""
        if not self._started:
            self._started = True
            self.feed(bytes(self._head).removeprefix(_BOM))
        try:
            self._utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            raise Undecodable("not valid UTF-8") from None
        if self._held:
            self._send()
        try:
            self._parser.close()
        except ijson.JSONError:
            raise Undecodable("not JSON") from None
        self._build()
        if not self.root:
            raise Undecodable("empty")
        return self.root[0]

    def _build(self) -> None:
        stack, keys, size = self._stack, self._keys, sys.getsizeof
        cost = 0
        for event, value in self._events:
            if event == "map_key":
                keys.append(value)
                cost += size(value) + _IN_DICT
                continue
            if event in _ENDS:
                stack.pop()
                continue
            if event in _STARTS:
                made: Any = {} if event == "start_map" else []
                cost += _CONTAINER
            else:
                made = value
                cost += _NUMBER if event == "number" else size(value) if value else _LEAST
            top = stack[-1]
            if type(top) is list:
                top.append(made)
                cost += _IN_LIST
            else:
                top[keys.pop()] = made
            if made is not value:
                stack.append(made)
                if len(stack) > MAX_DEPTH + 1:
                    raise Undecodable(f"nested deeper than {MAX_DEPTH}")
        del self._events[:]
        self.budget.charge(cost)


async def read_json(answer: Answer, limit: int, budget: Budget) -> tuple[Any, str]:
    """The 2xx body's JSON value and the start of its text, read within `limit` bytes.

    Raises `BodyTooLarge` past the limit and `Undecodable` for a body that is
    not UTF-8 JSON or would cost more than `budget`.
    """
    if announced_too_large(answer.headers, limit):
        raise BodyTooLarge(limit, answer.headers)
    check_charset(answer.headers)
    builder = JsonBuilder(budget)
    size = 0
    try:
        async for chunk in answer.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(limit, answer.headers)
            await feed(builder, chunk)
        return builder.finish(), builder.excerpt
    except Undecodable as exc:
        exc.excerpt = builder.excerpt
        await discard(builder.root)
        raise
    except BaseException:
        await discard(builder.root)
        raise


async def loads(text: str, budget: Budget) -> Any:
    """One JSON value from `text` (an event-stream chunk), decoded as `read_json` does."""
    data = text.encode()
    if len(data) <= SLICE:  # small: at most ~25 x SLICE in objects, a millisecond or two
        try:
            return json.loads(data, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            raise Undecodable("not JSON") from None
    builder = JsonBuilder(budget)
    try:
        await feed(builder, data)
        return builder.finish()
    except BaseException:
        await discard(builder.root)
        raise


async def feed(builder: JsonBuilder, data: bytes) -> None:
    """Feed `data` a slice at a time, giving the loop a turn after each slice."""
    view = memoryview(data)
    for start in range(0, len(view), SLICE):
        builder.feed(bytes(view[start : start + SLICE]))
        await asyncio.sleep(0)


async def discard(box: list[Any], *, keep_shared: bool = False) -> None:
    """Empty `box` of decoded values a slice at a time, giving the loop a turn between slices.

    With `keep_shared`, a container that something else still holds (a result
    made of parts of the value) is left as it is: only what nothing else
    refers to is taken apart.
    """
    freed = 0
    while box:
        item = box.pop()
        freed += 1
        if keep_shared and sys.getrefcount(item) > _ONLY_HERE:
            continue
        if type(item) is dict:
            box.append(list(item.values()))
            box.append(list(item))
            item.clear()
            continue
        while type(item) is list and item:
            piece = item[-STEP:]
            del item[-STEP:]
            box.extend([x for x in piece if type(x) is list or type(x) is dict])
            freed += len(piece)
            del piece  # what it alone held goes now: at most STEP values
            if freed >= STEP:
                freed = 0
                await asyncio.sleep(0)
        if freed >= STEP:
            freed = 0
            await asyncio.sleep(0)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
