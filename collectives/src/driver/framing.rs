//! Length-prefixed frames on a QUIC stream: `u32` little-endian length,
//! then that many bytes (one engine message, or the hello).
//!
//! `FrameQueue` keeps what the stream has not accepted yet (QUIC flow
//! control pushes back), bounded by the caller; `FrameReader` reassembles
//! frames from stream reads and lends each one out in place, so the engine
//! decodes straight from the receive buffer.

use std::collections::VecDeque;
use std::sync::Arc;

use stack::quic::SharedBuf;

/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;

/// Outgoing frames of one stream, in order, with the progress of the first.
/// Bodies go to the stream without a copy (`SharedBuf`): QUIC keeps them
/// until the peer has them; `reclaim` then hands them back for reuse.
#[derive(Debug, Default)]
pub struct FrameQueue {
    /// Bodies not yet fully accepted; the first may be what is left of one.
    frames: VecDeque<SharedBuf>,
    /// Bytes of the first frame's prefix already accepted (0..=LEN_BYTES).
    prefix_sent: usize,
    /// Bytes queued and not yet accepted, prefixes included.
    pending: usize,
    /// Every body pushed, oldest first, until QUIC lets go of it.
    sent: VecDeque<Arc<Vec<u8>>>,
}

/// Bodies `FrameQueue` keeps for reuse, at most: beyond this many in
/// flight, the oldest are left to be freed by QUIC instead.
const MAX_TRACKED: usize = 4096;

impl FrameQueue {
    pub fn push(&mut self, body: Vec<u8>) {
        let len = body.len();
        self.pending += LEN_BYTES + len;
        let body = Arc::new(body);
        self.frames.push_back(SharedBuf::slice(&body, 0..len));
        if self.sent.len() == MAX_TRACKED {
            self.sent.pop_front();
        }
        self.sent.push_back(body);
    }

    /// Hands `reuse` the bodies, oldest first, that nobody holds any more
    /// (QUIC drops stream data once the peer acknowledged it), so message
    /// buffers are reused instead of freed and allocated again: a fresh
    /// 64 KiB body per message costs page faults each time the allocator
    /// gives its memory back. Stops at the oldest still held.
    pub fn reclaim(&mut self, mut reuse: impl FnMut(Vec<u8>)) {
        while self.sent.front().is_some_and(|b| Arc::strong_count(b) == 1) {
            let body = self.sent.pop_front().expect("checked");
            if let Ok(body) = Arc::try_unwrap(body) {
                reuse(body);
            }
        }
    }

    pub fn pending_bytes(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Whether QUIC has let go of every body pushed so far (the peer
    /// acknowledged them), as of the last `reclaim`.
    pub fn all_acknowledged(&self) -> bool {
        self.frames.is_empty() && self.sent.is_empty()
    }

    /// Offers queued frames to `send` until the stream blocks or the queue
    /// is empty. `send` is handed each piece (a prefix, a body or what is
    /// left of one) and returns what it did not take. Returns the bytes
    /// accepted.
    pub fn flush<E>(
        &mut self,
        mut send: impl FnMut(SharedBuf) -> Result<Option<SharedBuf>, E>,
    ) -> Result<usize, E> {
        let mut total = 0;
        while let Some(body) = self.frames.pop_front() {
            let took = if self.prefix_sent < LEN_BYTES {
                // A partly sent body has its prefix out already, so the
                // front's length here is the whole body's.
                let prefix = (body.len() as u32).to_le_bytes()[self.prefix_sent..].to_vec();
                let offered = prefix.len();
                self.frames.push_front(body);
                let took = offered - send(SharedBuf::new(prefix))?.map_or(0, |r| r.len());
                self.prefix_sent += took;
                took
            } else if body.is_empty() {
                self.prefix_sent = 0;
                continue;
            } else {
                let len = body.len();
                match send(body)? {
                    None => {
                        self.prefix_sent = 0;
                        len
                    }
                    Some(rest) => {
                        let took = len - rest.len();
                        self.frames.push_front(rest);
                        took
                    }
                }
            };
            if took == 0 {
                break;
            }
            self.pending -= took;
            total += took;
        }
        Ok(total)
    }
}

/// Why a stream's bytes are not a frame sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLong {
    pub len: usize,
    pub max: usize,
}

/// What a read asks for beyond a length prefix it has not seen yet.
const HEAD_READ: usize = 4096;

/// Reassembly buffer of one stream.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_frame: usize,
    /// Bytes moved to the front to make room (none when every read asks
    /// for `wanted`).
    moved: u64,
}

impl FrameReader {
    /// A reader that holds no buffer until a read asks for room (a link
    /// that is closed keeps one of these).
    pub fn empty(max_frame: usize) -> FrameReader {
        FrameReader {
            buf: Vec::new(),
            start: 0,
            end: 0,
            max_frame,
            moved: 0,
        }
    }

    pub fn new(max_frame: usize) -> FrameReader {
        FrameReader {
            buf: vec![0; 64 * 1024],
            start: 0,
            end: 0,
            max_frame,
            moved: 0,
        }
    }

    /// Takes frames up to `max_frame` from now on (bytes already read
    /// are kept).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// Exactly `len` bytes to read into; call `filled` after.
    pub fn spare(&mut self, len: usize) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.buf.len() - self.end < len {
            if self.start > 0 {
                // Move the partial frame to the front before growing.
                self.buf.copy_within(self.start..self.end, 0);
                self.moved += (self.end - self.start) as u64;
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() - self.end < len {
                self.buf.resize(self.end + len, 0);
            }
        }
        &mut self.buf[self.end..self.end + len]
    }

    pub fn filled(&mut self, n: usize) {
        self.end += n;
    }

    /// The next complete frame, if any. The slice stays valid until the
    /// next call on the reader.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, TooLong> {
        let Some(len) = self.complete_frame_len()? else {
            return Ok(None);
        };
        let at = self.start + LEN_BYTES;
        self.start = at + len;
        Ok(Some(&self.buf[at..at + len]))
    }

    /// The next complete frame, if any, left in the reader: what
    /// `next_frame` would return.
    pub fn peek_frame(&self) -> Result<Option<&[u8]>, TooLong> {
        let Some(len) = self.complete_frame_len()? else {
            return Ok(None);
        };
        let at = self.start + LEN_BYTES;
        Ok(Some(&self.buf[at..at + len]))
    }

    /// Whether a complete frame is waiting (a frame too long counts: the
    /// next `next_frame` reports it).
    pub fn has_frame(&self) -> bool {
        !matches!(self.complete_frame_len(), Ok(None))
    }

    /// The body length of the frame at the front, once all of it is here.
    fn complete_frame_len(&self) -> Result<Option<usize>, TooLong> {
        let avail = self.end - self.start;
        if avail < LEN_BYTES {
            return Ok(None);
        }
        let mut prefix = [0u8; LEN_BYTES];
        prefix.copy_from_slice(&self.buf[self.start..self.start + LEN_BYTES]);
        let len = u32::from_le_bytes(prefix) as usize;
        if len > self.max_frame {
            return Err(TooLong {
                len,
                max: self.max_frame,
            });
        }
        Ok((avail >= LEN_BYTES + len).then_some(len))
    }

    /// How many bytes to read next: with the length prefix known, exactly
    /// what completes the frame being assembled, so a read never runs into
    /// the next frame and a finished frame leaves the buffer empty (the
    /// buffer grows to the largest frame once); before it, the prefix and
    /// `HEAD_READ` bytes more, so that small frames come many to a read.
    /// Only what follows a frame shorter than `HEAD_READ` is ever moved to
    /// make room.
    pub fn wanted(&self) -> usize {
        let avail = self.end - self.start;
        if avail < LEN_BYTES {
            return LEN_BYTES + HEAD_READ - avail;
        }
        let mut prefix = [0u8; LEN_BYTES];
        prefix.copy_from_slice(&self.buf[self.start..self.start + LEN_BYTES]);
        let len = (u32::from_le_bytes(prefix) as usize).min(self.max_frame);
        (LEN_BYTES + len).saturating_sub(avail).max(1)
    }

    /// Bytes moved inside the buffer so far.
    pub fn moved(&self) -> u64 {
        self.moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames survive any split of the byte stream and any backpressure.
    #[test]
    fn roundtrip_with_backpressure_and_splits() {
        let bodies: Vec<Vec<u8>> = (0..50usize)
            .map(|i| (0..(i * 977) % 70_000).map(|j| (i + j) as u8).collect())
            .collect();
        let mut q = FrameQueue::default();
        for b in &bodies {
            q.push(b.clone());
        }
        let wire = std::cell::RefCell::new(Vec::new());
        let mut budget = 0usize;
        while !q.is_empty() {
            budget = (budget * 31 + 7) % 5000;
            let room = std::cell::Cell::new(budget);
            q.flush::<()>(|mut b| {
                let n = b.len().min(room.get());
                room.set(room.get() - n);
                let rest = b.split_off(n);
                wire.borrow_mut().extend_from_slice(b.as_ref());
                Ok((!rest.is_empty()).then_some(rest))
            })
            .unwrap();
        }
        let wire = wire.into_inner();
        assert_eq!(q.pending_bytes(), 0);

        let mut r = FrameReader::new(1 << 20);
        let mut got = Vec::new();
        let mut pos = 0;
        let mut step = 1;
        while pos < wire.len() {
            step = (step * 7 + 3) % 9000 + 1;
            let n = step.min(wire.len() - pos);
            let want = r.wanted();
            let spare = r.spare(want.max(n));
            spare[..n].copy_from_slice(&wire[pos..pos + n]);
            r.filled(n);
            pos += n;
            while let Some(f) = r.next_frame().unwrap() {
                got.push(f.to_vec());
            }
        }
        assert_eq!(got, bodies);
    }

    #[test]
    fn bodies_come_back_once_quic_lets_go_of_them_oldest_first() {
        let mut q = FrameQueue::default();
        let bodies: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 1000]).collect();
        let addrs: Vec<*const u8> = bodies.iter().map(|b| b.as_ptr()).collect();
        for b in bodies {
            q.push(b);
        }
        // "QUIC" takes every piece and holds the bodies (not the prefixes).
        let mut held = Vec::new();
        q.flush::<()>(|piece| {
            if piece.len() == 1000 {
                held.push(piece);
            }
            Ok(None)
        })
        .unwrap();
        assert_eq!(held.len(), 3);
        let mut back = Vec::new();
        q.reclaim(|b| back.push(b));
        assert!(back.is_empty(), "all three are still held");
        // The second is acknowledged first: nothing comes back before the
        // oldest does, then both, in order, as the same allocations.
        held.remove(1);
        q.reclaim(|b| back.push(b));
        assert!(back.is_empty());
        held.remove(0);
        q.reclaim(|b| back.push(b));
        let got: Vec<*const u8> = back.iter().map(|b| b.as_ptr()).collect();
        assert_eq!(got, addrs[..2]);
        assert_eq!(back[0], vec![0; 1000]);
        drop(held);
        q.reclaim(|b| back.push(b));
        assert_eq!(back.len(), 3);
    }

    /// Feeds `bodies` as one stream to a reader that asks for `wanted`
    /// each time (as the mesh does), with at most a varying number of
    /// bytes readable at once; returns the frames and the reads made.
    fn read_as_the_mesh_does(r: &mut FrameReader, bodies: &[Vec<u8>]) -> (Vec<Vec<u8>>, usize) {
        let mut wire = Vec::new();
        for b in bodies {
            wire.extend_from_slice(&(b.len() as u32).to_le_bytes());
            wire.extend_from_slice(b);
        }
        let (mut got, mut pos, mut arrived, mut reads) = (Vec::new(), 0, 0, 0);
        while pos < wire.len() {
            arrived = (arrived * 13 + 5) % 20_000 + 1;
            let n = r.wanted().min(arrived).min(wire.len() - pos);
            r.spare(r.wanted())[..n].copy_from_slice(&wire[pos..pos + n]);
            r.filled(n);
            pos += n;
            reads += 1;
            while let Some(f) = r.next_frame().unwrap() {
                got.push(f.to_vec());
            }
        }
        (got, reads)
    }

    /// Frames of `HEAD_READ` bytes or more are never moved in the buffer,
    /// however the stream arrives; small frames come many to a read.
    #[test]
    fn reading_what_is_wanted_moves_only_what_follows_small_frames() {
        let big: Vec<Vec<u8>> = (1..40usize)
            .map(|i| {
                let len = HEAD_READ + (i * 7919) % 100_000;
                (0..len).map(|j| (i ^ j) as u8).collect()
            })
            .collect();
        let mut r = FrameReader::new(1 << 20);
        let (got, _) = read_as_the_mesh_does(&mut r, &big);
        assert_eq!(got, big);
        assert_eq!(r.moved(), 0);

        let small: Vec<Vec<u8>> = (0..1000usize).map(|i| vec![i as u8; i % 20]).collect();
        let mut r = FrameReader::new(1 << 20);
        let (got, reads) = read_as_the_mesh_does(&mut r, &small);
        assert_eq!(got, small);
        // 13.5 KB in 1000 frames: dozens of frames a read.
        assert!(reads * 50 <= small.len(), "{reads} reads");
        assert!(r.moved() <= (reads * (LEN_BYTES + HEAD_READ)) as u64);
    }

    #[test]
    fn oversized_frame_is_refused() {
        let mut r = FrameReader::new(100);
        r.spare(8)[..4].copy_from_slice(&101u32.to_le_bytes());
        r.filled(4);
        assert_eq!(r.next_frame(), Err(TooLong { len: 101, max: 100 }));
    }
}
