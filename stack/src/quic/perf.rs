//! The perf protocol (ALPN `ainftp-perf/1`), simple enough for any QUIC
//! client to drive. On every bidirectional stream the client opens, it
//! first sends a 9-byte request: a mode byte and a big-endian u64.
//!
//! - `E` echo: every byte after the request comes back on the stream; the
//!   server sends FIN after the client's FIN. (The u64 is ignored.)
//! - `D` discard: the server reads until FIN, then answers with the count
//!   of bytes it read (u64, big endian) and FIN. This is bulk upload.
//! - `S` source: the server sends the u64's number of bytes (a repeating
//!   0..=250 pattern) and FIN. This is bulk download.
//!
//! DATAGRAM frames are echoed back as they are.
//! The server buffers at most `MAX_BUFFERED` bytes per echo stream: it
//! stops reading while the client is not reading, so QUIC flow control
//! holds the client back rather than server memory growing.

use std::collections::HashMap;
use std::sync::Arc;

use super::endpoint::{ConnHandle, Endpoint, Event};
use super::shared_buf::SharedBuf;
use super::QuicError;
use crate::io::Datagram;

pub const PERF_ALPN: &[u8] = b"ainftp-perf/1";
pub const REQUEST_LEN: usize = 9;
pub const MODE_ECHO: u8 = b'E';
pub const MODE_DISCARD: u8 = b'D';
pub const MODE_SOURCE: u8 = b'S';
const MAX_BUFFERED: usize = 256 * 1024;

/// The byte at offset `i` of a source stream.
pub fn pattern_byte(i: u64) -> u8 {
    (i % PERIOD) as u8
}

const PERIOD: u64 = 251;
/// Longest pattern slice handed out at once.
pub const PATTERN_CHUNK: usize = 64 * 1024;

/// The pattern bytes at offsets `at..at + n` (n <= PATTERN_CHUNK), from a
/// table, so generating and checking cost a memcpy / memcmp.
pub fn pattern(at: u64, n: usize) -> &'static [u8] {
    let (t, start) = (pattern_table(), (at % PERIOD) as usize);
    &t[start..start + n.min(PATTERN_CHUNK)]
}

/// `pattern(at, n)` as a buffer quiche sends without copying it in.
pub fn pattern_shared(at: u64, n: usize) -> SharedBuf {
    let start = (at % PERIOD) as usize;
    SharedBuf::slice(pattern_table(), start..start + n.min(PATTERN_CHUNK))
}

fn pattern_table() -> &'static Arc<Vec<u8>> {
    static TABLE: std::sync::OnceLock<Arc<Vec<u8>>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        Arc::new(
            (0..PATTERN_CHUNK as u64 + PERIOD)
                .map(pattern_byte)
                .collect(),
        )
    })
}

/// Offer `n` pattern bytes from offset `at` without a copy; returns how
/// many quiche took.
fn send_pattern<B: Datagram>(
    ep: &mut Endpoint<B>,
    conn: ConnHandle,
    id: u64,
    at: u64,
    n: usize,
    fin: bool,
) -> Result<usize, QuicError> {
    let rest = ep.stream_send_shared(conn, id, pattern_shared(at, n), fin)?;
    Ok(n - rest.map_or(0, |r| r.len()))
}

/// A request header.
pub fn request(mode: u8, n: u64) -> [u8; REQUEST_LEN] {
    let mut r = [0u8; REQUEST_LEN];
    r[0] = mode;
    r[1..].copy_from_slice(&n.to_be_bytes());
    r
}

#[derive(Default)]
struct StreamState {
    header: Vec<u8>,
    mode: Option<u8>,
    /// Echo: bytes read and not yet sent back. Source: unused.
    pending: Vec<u8>,
    /// Discard: bytes read. Source: bytes still to send.
    count: u64,
    sent: u64,
    fin_in: bool,
    done: bool,
}

/// One connection's streams being served.
type Streams = HashMap<u64, StreamState, ahash::RandomState>;

/// The server side of the perf protocol over one endpoint.
#[derive(Default)]
pub struct PerfServer {
    /// Per connection, its streams: a poll walks each connection's own
    /// (keyed by (connection, stream), every connection's poll walked
    /// every stream of all of them).
    streams: HashMap<ConnHandle, Streams, ahash::RandomState>,
    conns: Vec<ConnHandle>,
    buf: Vec<u8>,
    /// The first `CLOSED_KEPT` connections that closed, with their
    /// events, for the caller to log (bounded: a server runs for long).
    pub closed: Vec<Event>,
    /// Every connection that closed.
    pub closed_count: u64,
}

/// How many close events a `PerfServer` keeps.
pub const CLOSED_KEPT: usize = 1024;

impl PerfServer {
    pub fn new() -> Self {
        PerfServer {
            buf: vec![0; 64 * 1024],
            ..Default::default()
        }
    }

    /// The connections being served, in the order they were established.
    pub fn connections(&self) -> &[ConnHandle] {
        &self.conns
    }

    /// Serve what is readable and writable; call after each `drive`.
    pub fn poll<B: Datagram>(&mut self, ep: &mut Endpoint<B>) {
        while let Some(ev) = ep.poll_event() {
            match ev {
                Event::Established { conn, .. } => self.conns.push(conn),
                Event::Closed { conn, .. } => {
                    self.conns.retain(|&c| c != conn);
                    self.streams.remove(&conn);
                    self.closed_count += 1;
                    if self.closed.len() < CLOSED_KEPT {
                        self.closed.push(ev);
                    }
                }
            }
        }
        for i in 0..self.conns.len() {
            let conn = self.conns[i];
            self.echo_datagrams(ep, conn);
            let Ok(readable) = ep.readable(conn) else {
                continue;
            };
            for id in readable {
                self.read_stream(ep, conn, id);
            }
            self.write_streams(ep, conn);
        }
        for streams in self.streams.values_mut() {
            streams.retain(|_, s| !s.done);
        }
    }

    fn echo_datagrams<B: Datagram>(&mut self, ep: &mut Endpoint<B>, conn: ConnHandle) {
        while let Ok(Some(n)) = ep.dgram_recv(conn, &mut self.buf) {
            // A full send queue drops the echo: datagrams are unreliable.
            let _ = ep.dgram_send(conn, &self.buf[..n]);
        }
    }

    fn read_stream<B: Datagram>(&mut self, ep: &mut Endpoint<B>, conn: ConnHandle, id: u64) {
        let s = self.streams.entry(conn).or_default().entry(id).or_default();
        loop {
            if s.mode == Some(MODE_ECHO) && s.pending.len() >= MAX_BUFFERED {
                return;
            }
            let want = if s.mode.is_none() {
                REQUEST_LEN - s.header.len()
            } else if s.mode == Some(MODE_ECHO) {
                self.buf.len().min(MAX_BUFFERED - s.pending.len())
            } else {
                self.buf.len()
            };
            let (n, fin) = match ep.stream_recv(conn, id, &mut self.buf[..want]) {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(_) => {
                    s.done = true;
                    return;
                }
            };
            let data = &self.buf[..n];
            match s.mode {
                None => {
                    s.header.extend_from_slice(data);
                    if s.header.len() == REQUEST_LEN {
                        s.mode = Some(s.header[0]);
                        let arg = u64::from_be_bytes(s.header[1..].try_into().unwrap());
                        if s.header[0] == MODE_SOURCE {
                            s.count = arg;
                        }
                    }
                }
                Some(MODE_ECHO) => s.pending.extend_from_slice(data),
                Some(MODE_DISCARD) => s.count += n as u64,
                Some(_) => {}
            }
            if fin {
                s.fin_in = true;
                if !matches!(s.mode, Some(MODE_ECHO | MODE_DISCARD | MODE_SOURCE)) {
                    // A short or unknown request: end the stream.
                    let _ = ep.stream_send(conn, id, &[], true);
                    s.done = true;
                } else if s.mode == Some(MODE_DISCARD) {
                    s.pending.extend_from_slice(&s.count.to_be_bytes());
                }
                return;
            }
        }
    }

    fn write_streams<B: Datagram>(&mut self, ep: &mut Endpoint<B>, conn: ConnHandle) {
        let Some(streams) = self.streams.get_mut(&conn) else {
            return;
        };
        for (id, s) in streams.iter_mut() {
            if s.done {
                continue;
            }
            match s.mode {
                Some(MODE_ECHO) | Some(MODE_DISCARD) => {
                    let fin = s.fin_in;
                    // Discard answers only once the upload is complete.
                    if (s.pending.is_empty() || s.mode == Some(MODE_DISCARD)) && !fin {
                        continue;
                    }
                    match ep.stream_send(conn, *id, &s.pending, fin) {
                        Ok(n) => {
                            // quiche queues the FIN only with the last byte.
                            let all = n == s.pending.len();
                            s.pending.drain(..n);
                            s.done = fin && all;
                        }
                        Err(_) => s.done = true,
                    }
                }
                Some(MODE_SOURCE) => {
                    while s.sent < s.count {
                        let n = (s.count - s.sent).min(PATTERN_CHUNK as u64) as usize;
                        let fin = s.sent + n as u64 == s.count;
                        match send_pattern(ep, conn, *id, s.sent, n, fin) {
                            Ok(0) => break,
                            Ok(w) => s.sent += w as u64,
                            Err(_) => {
                                s.done = true;
                                break;
                            }
                        }
                    }
                    if s.sent == s.count {
                        if s.count == 0 {
                            let _ = ep.stream_send(conn, *id, &[], true);
                        }
                        s.done = true;
                    }
                }
                _ => {}
            }
        }
    }
}

/// One request of the perf protocol, client side: sends the request and
/// `len` pattern bytes (echo, discard) or asks for `len` bytes (source),
/// and checks every byte that comes back against the pattern.
#[derive(Debug)]
pub struct ClientStream {
    pub id: u64,
    mode: u8,
    len: u64,
    /// Bytes of the request header and payload written so far.
    written: u64,
    /// Payload bytes received (echo, source) or the answer (discard).
    received: u64,
    answer: Vec<u8>,
    mismatches: u64,
    fin_in: bool,
    error: bool,
}

impl ClientStream {
    pub fn new(id: u64, mode: u8, len: u64) -> Self {
        ClientStream {
            id,
            mode,
            len,
            written: 0,
            received: 0,
            answer: Vec::new(),
            mismatches: 0,
            fin_in: false,
            error: false,
        }
    }

    /// The exchange is over (the server's FIN arrived, or the stream failed).
    pub fn is_done(&self) -> bool {
        self.fin_in || self.error
    }

    /// Everything came back as sent (echo), counted (discard) or as the
    /// pattern (source).
    pub fn is_correct(&self) -> bool {
        if !self.fin_in || self.error || self.mismatches > 0 {
            return false;
        }
        match self.mode {
            MODE_DISCARD => self.answer == self.len.to_be_bytes(),
            _ => self.received == self.len,
        }
    }

    /// Payload bytes moved so far in the direction that is measured.
    pub fn bytes(&self) -> u64 {
        match self.mode {
            MODE_SOURCE => self.received,
            _ => self.written.saturating_sub(REQUEST_LEN as u64),
        }
    }

    /// Write what flow control allows, read what arrived. `buf` is scratch.
    pub fn poll<B: Datagram>(&mut self, ep: &mut Endpoint<B>, conn: ConnHandle, buf: &mut [u8]) {
        self.write(ep, conn);
        self.read(ep, conn, buf);
    }

    fn write<B: Datagram>(&mut self, ep: &mut Endpoint<B>, conn: ConnHandle) {
        let upload = if self.mode == MODE_SOURCE {
            0
        } else {
            self.len
        };
        let total = REQUEST_LEN as u64 + upload;
        while self.written < total && !self.error {
            let header = request(self.mode, self.len);
            let fin_at = |n: usize| self.written + n as u64 == total;
            let result = if self.written < REQUEST_LEN as u64 {
                let h = &header[self.written as usize..];
                ep.stream_send(conn, self.id, h, fin_at(h.len()))
            } else {
                let at = self.written - REQUEST_LEN as u64;
                let n = (total - self.written).min(PATTERN_CHUNK as u64) as usize;
                send_pattern(ep, conn, self.id, at, n, fin_at(n))
            };
            match result {
                Ok(0) => return,
                Ok(w) => self.written += w as u64,
                Err(_) => self.error = true,
            }
        }
    }

    fn read<B: Datagram>(&mut self, ep: &mut Endpoint<B>, conn: ConnHandle, buf: &mut [u8]) {
        while !self.fin_in && !self.error {
            match ep.stream_recv(conn, self.id, buf) {
                Ok(Some((n, fin))) => {
                    if self.mode == MODE_DISCARD {
                        self.answer.extend_from_slice(&buf[..n]);
                    } else {
                        let mut at = 0;
                        while at < n {
                            let k = (n - at).min(PATTERN_CHUNK);
                            if buf[at..at + k] != *pattern(self.received + at as u64, k) {
                                self.mismatches += 1;
                            }
                            at += k;
                        }
                        self.received += n as u64;
                    }
                    self.fin_in = fin;
                }
                Ok(None) => return,
                Err(_) => self.error = true,
            }
        }
    }
}
