//! Stream data that quiche keeps without copying it: a shared, immutable
//! buffer and the range of it still to send. Handing one to
//! `Endpoint::stream_send_shared` queues it as is; quiche's only copy is
//! then the one into the packet it encrypts.

use std::sync::Arc;

use quiche::{BufFactory, BufSplit};

/// A range of a shared byte buffer; clones share the bytes.
#[derive(Clone, Debug)]
pub struct SharedBuf {
    data: Arc<Vec<u8>>,
    start: usize,
    end: usize,
}

impl SharedBuf {
    /// All of `data`, which is moved in, not copied.
    pub fn new(data: Vec<u8>) -> SharedBuf {
        let end = data.len();
        SharedBuf {
            data: Arc::new(data),
            start: 0,
            end,
        }
    }

    /// `range` of `data` (panics if it is out of bounds, like slicing).
    pub fn slice(data: &Arc<Vec<u8>>, range: std::ops::Range<usize>) -> SharedBuf {
        assert!(
            range.start <= range.end && range.end <= data.len(),
            "{range:?} out of {} bytes",
            data.len()
        );
        SharedBuf {
            data: data.clone(),
            start: range.start,
            end: range.end,
        }
    }

    /// Keep the first `at` bytes here; return the rest.
    pub fn split_off(&mut self, at: usize) -> SharedBuf {
        assert!(at <= self.len(), "split at {at} of {}", self.len());
        let tail = SharedBuf {
            data: self.data.clone(),
            start: self.start + at,
            end: self.end,
        };
        self.end = self.start + at;
        tail
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

impl AsRef<[u8]> for SharedBuf {
    fn as_ref(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }
}

impl BufSplit for SharedBuf {
    fn split_at(&mut self, at: usize) -> SharedBuf {
        self.split_off(at)
    }
}

/// quiche's buffer factory for `SharedBuf`: what `stream_send` copies in
/// becomes a `SharedBuf` too, so both kinds of write share one stream type.
#[derive(Clone, Debug, Default)]
pub struct SharedBufFactory;

impl BufFactory for SharedBufFactory {
    type Buf = SharedBuf;
    type DgramBuf = Vec<u8>;

    fn buf_from_slice(buf: &[u8]) -> SharedBuf {
        SharedBuf::new(buf.to_vec())
    }

    fn dgram_buf_from_slice(buf: &[u8]) -> Vec<u8> {
        buf.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_both_halves_and_shares_the_bytes() {
        let data = Arc::new((0..10u8).collect::<Vec<_>>());
        let mut head = SharedBuf::slice(&data, 2..9);
        let tail = head.split_at(3);
        assert_eq!(head.as_ref(), &[2, 3, 4]);
        assert_eq!(tail.as_ref(), &[5, 6, 7, 8]);
        assert_eq!(Arc::strong_count(&data), 3, "no copy made");
        let mut all = tail.clone();
        let empty = all.split_at(4);
        assert!(empty.is_empty() && all.len() == 4);
    }
}
