"""Name lookups for egress: c-ares (pycares) on the daemon's event loop, bounded per install.

Each lookup gets a c-ares channel of its own, driven by the loop (its sockets are watched
with ``add_reader``; no thread takes part), so a lookup that has not answered by its
deadline is cancelled: its sockets close and its slot is free at once. A channel reads
/etc/resolv.conf and /etc/hosts when it is made (tens of microseconds), so a change to
either is seen by the next lookup.

Lookups are counted per install (the key the caller gives): at most ``per_install`` in
flight and ``waiting`` more queued behind them; past that a lookup is refused at once
("lookups busy"). One install whose names never answer so waits on its own slots only:
another install's lookups start at once. ``max_lookups`` bounds the sockets all installs'
lookups hold together.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import ipaddress
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runnerd.limits import (
    DNS_LOOKUP_TIMEOUT_S,
    DNS_LOOKUPS_PER_INSTALL,
    DNS_TRIES,
    DNS_TRY_TIMEOUT_S,
    DNS_WAITING_PER_INSTALL,
    MAX_DNS_LOOKUPS,
)

if TYPE_CHECKING:
    import pycares

__all__ = ["BUSY", "NO_SUCH_HOST", "LookupFailed", "Resolver"]

NO_SUCH_HOST, BUSY = "no such host", "lookups busy"


class LookupFailed(Exception):
    """A name did not resolve: ``reason`` is NO_SUCH_HOST or BUSY, ``detail`` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason, self.detail = reason, detail
        super().__init__(detail)


@dataclass
class _Install:
    slots: asyncio.Semaphore
    waiting: int = 0
    users: int = 0  # lookups queued or in flight: the entry goes when none is left


class Resolver:
    """Resolves names for the egress proxy; ``resolve`` is its one operation."""

    def __init__(
        self,
        *,
        per_install: int = DNS_LOOKUPS_PER_INSTALL,
        waiting: int = DNS_WAITING_PER_INSTALL,
        max_lookups: int = MAX_DNS_LOOKUPS,
        timeout_s: float = DNS_LOOKUP_TIMEOUT_S,
    ) -> None:
        self.per_install = per_install
        self.waiting = waiting
        self.max_lookups = max_lookups
        self.timeout_s = timeout_s
        self._installs: dict[str, _Install] = {}
        self._in_flight = 0
        self._loaded = False

    async def resolve(self, key: str, host: str, port: int | None) -> list[str]:
        """The addresses ``host`` has (IPv4 and IPv6, as text, in c-ares's order), for a
        lookup of install ``key``. LookupFailed when it has none, does not answer within
        ``timeout_s``, or ``key`` has too many lookups going. Cancelling the caller
        cancels the lookup."""
        install = self._installs.get(key)
        if install is None:
            install = self._installs[key] = _Install(asyncio.Semaphore(self.per_install))
        if install.slots.locked() and install.waiting >= self.waiting:
            raise LookupFailed(
                BUSY, f"this install has {self.per_install + self.waiting} lookups going"
            )
        install.users += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                install.waiting += 1
                try:
                    await install.slots.acquire()
                finally:
                    install.waiting -= 1
                try:
                    if self._in_flight >= self.max_lookups:
                        raise LookupFailed(BUSY, "the daemon has too many lookups going")
                    self._in_flight += 1
                    try:
                        if not self._loaded:  # c-ares loads in ~70 ms: not on the loop
                            await asyncio.to_thread(importlib.import_module, "pycares")
                            self._loaded = True
                        return await _lookup(host, port)
                    finally:
                        self._in_flight -= 1
                finally:
                    install.slots.release()
        except TimeoutError:
            raise LookupFailed(
                NO_SUCH_HOST, f"the name did not resolve within {self.timeout_s:g} s"
            ) from None
        finally:
            install.users -= 1
            if not install.users:
                self._installs.pop(key, None)


async def _lookup(host: str, port: int | None) -> list[str]:
    """One getaddrinfo on a channel of its own, driven by the running loop; the channel
    is cancelled and closed however this ends (cancellation included)."""
    import pycares  # loaded by Resolver.resolve (most runs never look up a name)

    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[Any, int | None]] = loop.create_future()
    watched: set[tuple[int, bool]] = set()  # (fd, for writing)
    timer: asyncio.TimerHandle | None = None
    channel: pycares.Channel | None = None

    def process(read_fd: int, write_fd: int) -> None:
        if channel is not None:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                channel.process_fd(read_fd, write_fd)
        rearm()

    def rearm() -> None:
        # c-ares retries and gives up on a clock of its own: wake it when it asks.
        nonlocal timer
        if timer is not None:
            timer.cancel()
            timer = None
        if channel is not None and not done.done():
            with contextlib.suppress(RuntimeError):
                wait = float(channel.timeout(1.0))  # type: ignore[no-untyped-call]
                timer = loop.call_later(wait, process, pycares.ARES_SOCKET_BAD,
                                        pycares.ARES_SOCKET_BAD)  # fmt: skip

    def state(fd: int, readable: bool, writable: bool) -> None:
        for writing, wanted, watch, unwatch in (
            (False, readable, loop.add_reader, loop.remove_reader),
            (True, writable, loop.add_writer, loop.remove_writer),
        ):
            if wanted and (fd, writing) not in watched:
                args = (pycares.ARES_SOCKET_BAD, fd) if writing else (fd, pycares.ARES_SOCKET_BAD)
                watch(fd, process, *args)
                watched.add((fd, writing))
            elif not wanted and (fd, writing) in watched:
                unwatch(fd)
                watched.discard((fd, writing))

    def answered(result: Any, error: int | None) -> None:
        if not done.done():
            done.set_result((result, error))

    try:
        try:
            channel = pycares.Channel(
                sock_state_cb=state, timeout=DNS_TRY_TIMEOUT_S, tries=DNS_TRIES
            )
            channel.getaddrinfo(host, port, type=socket.SOCK_STREAM, callback=answered)
        except (pycares.AresError, UnicodeError, ValueError, TypeError, RuntimeError):
            raise LookupFailed(NO_SUCH_HOST, "the name cannot be looked up") from None
        rearm()
        result, error = await done
    finally:
        if timer is not None:
            timer.cancel()
        if channel is not None:
            with contextlib.suppress(RuntimeError):
                channel.cancel()  # on this thread: its callback fires here, now
        for fd, writing in watched:
            (loop.remove_writer if writing else loop.remove_reader)(fd)
        watched.clear()
        if channel is not None:
            channel.close()
    if error:
        raise LookupFailed(NO_SUCH_HOST, f"the name does not resolve ({_why(error)})")
    found: list[str] = []
    for node in result.nodes:
        raw = node.addr[0]
        text = (raw.decode() if isinstance(raw, bytes) else str(raw)).split("%")[0]
        with contextlib.suppress(ValueError):
            text = str(ipaddress.ip_address(text))
            if text not in found:
                found.append(text)
    if not found:
        raise LookupFailed(NO_SUCH_HOST, "the name has no address")
    return found


def _why(error: int) -> str:
    import pycares

    try:
        text = pycares.errno.strerror(error)
    except Exception:
        return f"c-ares error {error}"
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    return text.rstrip(".").lower()
