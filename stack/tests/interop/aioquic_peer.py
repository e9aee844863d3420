#!/usr/bin/env python3
"""aioquic, an independent QUIC implementation, speaking ainftp's perf
protocol (ALPN ainftp-perf/1, see stack/src/quic/perf.rs) as a client or a
server, for the interop tests. Prints one JSON line with what it saw and
exits 0 only if every exchange was byte-exact.

  client: optionally a timed download first (--download N: a source
          stream of N bytes, its goodput reported, as the interop runner's
          goodput case), then echo streams of the given sizes (all
          concurrent), datagrams echoed, then close with an application
          error code; optionally ChaCha20 only, a key update mid-transfer,
          and session resumption; all of it over --connections
          connections, one after another.
  server: echo/discard/source streams and echo datagrams, and session
          tickets for resumption; once --connections connections have
          ended, reports the first one's close code and whether each
          resumed a session, then exits.

PEER_DEBUG=1 in the environment prints aioquic's own log to stderr.
"""
import argparse
import asyncio
import json
import logging
import os
import ssl
import sys

from aioquic.asyncio import connect, serve
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import (ConnectionTerminated, DatagramFrameReceived,
                                 StreamDataReceived)
from aioquic.tls import CipherSuite, Epoch

ALPN = "ainftp-perf/1"


CYCLE = bytes(range(251))


def pattern(offset, n):
    """Byte i is (offset + i) % 251, built in C: a per-byte generator took
    1.5 s for 16 MiB, long enough for a 1 s idle timeout to fire between
    the handshake and the first data."""
    start = offset % 251
    return (CYCLE * ((start + n) // 251 + 1))[start:start + n]


def request(mode, n):
    return mode + n.to_bytes(8, "big")


class Perf(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.received = {}
        self.finished = {}
        self.datagrams = []
        self.server_streams = {}
        self.terminated = asyncio.get_event_loop().create_future()
        self.changed = asyncio.Event()

    # --- server side -------------------------------------------------
    def serve_stream(self, sid, data, end):
        st = self.server_streams.setdefault(sid, {"hdr": b"", "mode": None, "count": 0})
        if st["mode"] is None:
            need = 9 - len(st["hdr"])
            st["hdr"] += data[:need]
            data = data[need:]
            if len(st["hdr"]) == 9:
                st["mode"] = st["hdr"][:1]
                st["arg"] = int.from_bytes(st["hdr"][1:], "big")
                if st["mode"] == b"S":
                    self._quic.send_stream_data(sid, pattern(0, st["arg"]), end_stream=True)
        if st["mode"] == b"E":
            self._quic.send_stream_data(sid, data, end_stream=end)
        elif st["mode"] == b"D":
            st["count"] += len(data)
            if end:
                self._quic.send_stream_data(sid, st["count"].to_bytes(8, "big"), end_stream=True)

    def quic_event_received(self, event):
        if isinstance(event, StreamDataReceived):
            if self._quic.configuration.is_client:
                self.received.setdefault(event.stream_id, bytearray()).extend(event.data)
                if event.end_stream:
                    self.finished[event.stream_id] = True
            else:
                self.serve_stream(event.stream_id, event.data, event.end_stream)
        elif isinstance(event, DatagramFrameReceived):
            if self._quic.configuration.is_client:
                self.datagrams.append(event.data)
            else:
                self._quic.send_datagram_frame(event.data)
        elif isinstance(event, ConnectionTerminated):
            if not self.terminated.done():
                self.terminated.set_result(event)
        self.changed.set()


async def wait_until(proto, cond, timeout):
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while not cond():
        left = deadline - loop.time()
        if left <= 0:
            return False
        proto.changed.clear()
        try:
            await asyncio.wait_for(proto.changed.wait(), min(left, 0.5))
        except asyncio.TimeoutError:
            pass
    return True


def client_config(args, ticket_store):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=[ALPN],
                            max_datagram_frame_size=65536,
                            server_name=args.server_name)
    cfg.load_verify_locations(args.ca)
    cfg.verify_mode = ssl.CERT_REQUIRED
    if args.cert:
        cfg.load_cert_chain(args.cert, args.key)
    if args.chacha20:
        cfg.cipher_suites = [CipherSuite.CHACHA20_POLY1305_SHA256]
    if "ticket" in ticket_store:
        cfg.session_ticket = ticket_store["ticket"]
    return cfg


async def download(proto, n, timeout, result):
    """Asks for n bytes on a source stream, alone on the connection, and
    times them from the request to the FIN; true if they arrived whole."""
    quic, loop = proto._quic, asyncio.get_event_loop()
    sid = quic.get_next_available_stream_id()
    start = loop.time()
    quic.send_stream_data(sid, request(b"S", n), end_stream=True)
    proto.transmit()
    done = await wait_until(proto, lambda: sid in proto.finished, timeout)
    took = loop.time() - start
    # Taken out of the books the echo streams that follow are counted in.
    proto.finished.pop(sid, None)
    exact = done and bytes(proto.received.pop(sid, b"")) == pattern(0, n)
    result.update(download_bytes=n, download_s=round(took, 4), download_exact=exact,
                  goodput_mbps=round(n * 8 / took / 1e6, 1))
    return exact


async def one_client(args, ticket_store, result):
    cfg = client_config(args, ticket_store)
    handler = lambda t: ticket_store.__setitem__("ticket", t)
    async with connect(args.host, args.port, configuration=cfg,
                       create_protocol=Perf, session_ticket_handler=handler,
                       wait_connected=True) as proto:
        quic = proto._quic
        result["resumed"] = quic.tls.session_resumed
        result["cipher"] = CipherSuite(quic.tls.key_schedule.cipher_suite).name if quic.tls.key_schedule else None
        if args.download and not await download(proto, args.download, args.timeout, result):
            return False
        expected = {}
        for size in args.sizes:
            for _ in range(args.streams):
                sid = quic.get_next_available_stream_id()
                quic.send_stream_data(sid, request(b"E", 0) + pattern(0, size), end_stream=True)
                expected[sid] = size
        proto.transmit()
        if args.key_update:
            # Update the keys mid-transfer, then open one more stream: its
            # packets go out under the new keys only, and aioquic, whose
            # receive keys moved too, can read the echo only if the peer
            # followed the update.
            await wait_until(proto, lambda: sum(map(len, proto.received.values())) > 0, 5)
            before = quic._cryptos[Epoch.ONE_RTT].recv.key_phase
            quic.request_key_update()
            sid = quic.get_next_available_stream_id()
            quic.send_stream_data(sid, request(b"E", 0) + pattern(0, 65536), end_stream=True)
            expected[sid] = 65536
            proto.transmit()
            result["key_phase_before"] = before
        for i in range(args.datagrams):
            quic.send_datagram_frame(bytes([i % 256]) * (50 + i))
        proto.transmit()
        done = await wait_until(proto, lambda: len(proto.finished) == len(expected), args.timeout)
        bad = [sid for sid, n in expected.items()
               if bytes(proto.received.get(sid, b"")) != pattern(0, n)]
        await wait_until(proto, lambda: len(proto.datagrams) >= args.datagrams, 5)
        got = sorted(proto.datagrams, key=len)
        want = [bytes([i % 256]) * (50 + i) for i in range(args.datagrams)]
        result.update(streams=len(expected), complete=done, mismatched=len(bad),
                      datagrams=len(got), datagrams_ok=got == want,
                      bytes=sum(expected.values()),
                      key_phase=quic._cryptos[Epoch.ONE_RTT].recv.key_phase)
        quic.close(error_code=args.close_code, reason_phrase="interop done")
        proto.transmit()
        await asyncio.sleep(0.2)
        updated = not args.key_update or result["key_phase"] != result["key_phase_before"]
        return done and not bad and got == want and updated


async def run_client(args):
    tickets, result, ok = {}, {}, True
    count = max(args.connections, 2 if args.resume else 1)
    for attempt in range(count):
        if not args.resume:
            tickets.clear()
        r = {}
        ok = await one_client(args, tickets, r) and ok
        result["first" if attempt == 0 else "second" if attempt == 1 else f"conn{attempt}"] = r
    if args.resume:
        ok = ok and result["second"]["resumed"]
    result["connections"] = count
    result["ok"] = ok
    print(json.dumps(result), flush=True)
    return 0 if ok else 1


async def run_server(args):
    cfg = QuicConfiguration(is_client=False, alpn_protocols=[ALPN],
                            max_datagram_frame_size=65536)
    cfg.load_cert_chain(args.cert, args.key)
    protos, tickets = [], {}

    def create(*a, **kw):
        p = Perf(*a, **kw)
        protos.append(p)
        return p

    server = await serve(args.host, args.port, configuration=cfg, create_protocol=create,
                         session_ticket_fetcher=lambda label: tickets.pop(label, None),
                         session_ticket_handler=lambda t: tickets.__setitem__(t.ticket, t))
    print(json.dumps({"listening": args.port}), flush=True)
    loop = asyncio.get_event_loop()
    deadline = loop.time() + args.timeout
    while loop.time() < deadline:
        ended = [p for p in protos if p.terminated.done()]
        if len(ended) >= args.connections:
            e = ended[0].terminated.result()
            print(json.dumps({"closed": e.error_code, "reason": e.reason_phrase,
                              "streams": len(ended[0].server_streams),
                              "resumed": [p._quic.tls.session_resumed for p in ended]}),
                  flush=True)
            server.close()
            return 0
        await asyncio.sleep(0.05)
    print(json.dumps({"error": "timeout"}), flush=True)
    return 1


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["client", "server"])
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ca")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--server-name", default="server")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    ap.add_argument("--streams", type=int, default=1, help="streams per size")
    ap.add_argument("--datagrams", type=int, default=0)
    ap.add_argument("--download", type=int, default=0, metavar="BYTES",
                    help="first download this many bytes from a source stream, timed")
    ap.add_argument("--close-code", type=lambda s: int(s, 0), default=0)
    ap.add_argument("--chacha20", action="store_true")
    ap.add_argument("--key-update", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--connections", type=int, default=1,
                    help="client: connections one after another; server: connections to wait for")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    if os.environ.get("PEER_DEBUG"):  # aioquic's own log, with ms since start
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                            format="%(relativeCreated)d %(message)s")
    run = run_client if args.role == "client" else run_server
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
