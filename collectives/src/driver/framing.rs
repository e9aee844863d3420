//! Length-prefixed frames on a QUIC stream: `u32` little-endian length,
//! then that many bytes (one engine message, or the hello).
//!
//! `FrameQueue` keeps what the stream has not accepted yet (QUIC flow
//! control pushes back), bounded by the caller; `FrameReader` reassembles
//! frames from stream reads and lends each one out in place, so the engine
//! decodes straight from the receive buffer.

use std::collections::VecDeque;

/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;

/// Outgoing frames of one stream, in order, with the progress of the first.
#[derive(Debug, Default)]
pub struct FrameQueue {
    frames: VecDeque<Vec<u8>>,
    /// Bytes of the first frame (prefix included) already accepted.
    head_sent: usize,
    /// Bytes queued and not yet accepted, prefixes included.
    pending: usize,
}

impl FrameQueue {
    pub fn push(&mut self, body: Vec<u8>) {
        self.pending += LEN_BYTES + body.len();
        self.frames.push_back(body);
    }

    pub fn pending_bytes(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Offers queued bytes to `send` (which returns how many it took, 0
    /// when blocked) until it blocks or the queue is empty. Finished frame
    /// bodies go to `done` for reuse. Returns the bytes accepted.
    pub fn flush<E>(
        &mut self,
        mut send: impl FnMut(&[u8]) -> Result<usize, E>,
        mut done: impl FnMut(Vec<u8>),
    ) -> Result<usize, E> {
        let mut total = 0;
        while let Some(body) = self.frames.front() {
            let prefix = (body.len() as u32).to_le_bytes();
            let took = if self.head_sent < LEN_BYTES {
                send(&prefix[self.head_sent..])?
            } else {
                send(&body[self.head_sent - LEN_BYTES..])?
            };
            if took == 0 {
                break;
            }
            self.head_sent += took;
            self.pending -= took;
            total += took;
            if self.head_sent == LEN_BYTES + body.len() {
                self.head_sent = 0;
                let body = self.frames.pop_front().expect("front exists");
                done(body);
            }
        }
        Ok(total)
    }

    /// Drops everything queued, handing the bodies to `done`.
    pub fn clear(&mut self, mut done: impl FnMut(Vec<u8>)) {
        for b in self.frames.drain(..) {
            done(b);
        }
        self.head_sent = 0;
        self.pending = 0;
    }
}

/// Why a stream's bytes are not a frame sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLong {
    pub len: usize,
    pub max: usize,
}

/// Reassembly buffer of one stream.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_frame: usize,
}

impl FrameReader {
    pub fn new(max_frame: usize) -> FrameReader {
        FrameReader {
            buf: vec![0; 64 * 1024],
            start: 0,
            end: 0,
            max_frame,
        }
    }

    /// Space to read into (at least `min` bytes); call `filled` after.
    pub fn spare(&mut self, min: usize) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.buf.len() - self.end < min {
            // Move the partial frame to the front before growing.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() - self.end < min {
                self.buf.resize(self.end + min, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    pub fn filled(&mut self, n: usize) {
        self.end += n;
    }

    /// The next complete frame, if any. The slice stays valid until the
    /// next call on the reader.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, TooLong> {
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
        if avail < LEN_BYTES + len {
            return Ok(None);
        }
        let at = self.start + LEN_BYTES;
        self.start = at + len;
        Ok(Some(&self.buf[at..at + len]))
    }

    /// How many bytes the frame being assembled still needs (at least one
    /// read's worth), so `spare` can make room for it in one piece.
    pub fn wanted(&self) -> usize {
        let avail = self.end - self.start;
        if avail < LEN_BYTES {
            return 64 * 1024;
        }
        let mut prefix = [0u8; LEN_BYTES];
        prefix.copy_from_slice(&self.buf[self.start..self.start + LEN_BYTES]);
        let len = (u32::from_le_bytes(prefix) as usize).min(self.max_frame);
        (LEN_BYTES + len).saturating_sub(avail).max(64 * 1024)
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
        let mut wire = Vec::new();
        let mut budget = 0usize;
        let mut recycled = 0;
        while !q.is_empty() {
            budget = (budget * 31 + 7) % 5000;
            let mut room = budget;
            q.flush::<()>(
                |d| {
                    let n = d.len().min(room);
                    room -= n;
                    wire.extend_from_slice(&d[..n]);
                    Ok(n)
                },
                |_| recycled += 1,
            )
            .unwrap();
        }
        assert_eq!(recycled, bodies.len());
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
    fn oversized_frame_is_refused() {
        let mut r = FrameReader::new(100);
        r.spare(8)[..4].copy_from_slice(&101u32.to_le_bytes());
        r.filled(4);
        assert_eq!(r.next_frame(), Err(TooLong { len: 101, max: 100 }));
    }
}
