//! A datagram in a heap buffer: what the kernel-socket and in-memory
//! backends hand out (the DPDK backend uses mbufs instead).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use super::Datagram;

/// A heap buffer of fixed capacity with a payload length, peer and port.
#[derive(Clone, PartialEq, Eq)]
pub struct HeapDatagram {
    /// Always `capacity()` bytes long; `len` says how many are payload.
    pub(crate) buf: Vec<u8>,
    pub(crate) len: usize,
    pub(crate) peer: SocketAddrV4,
    pub(crate) local_port: u16,
}

impl HeapDatagram {
    /// An empty datagram with room for `capacity` payload bytes, peer
    /// `0.0.0.0:0` and local port 0.
    pub fn new(capacity: usize) -> Self {
        Self::from_vec(vec![0; capacity])
    }

    /// Reuse `buf` (its length is the capacity) for an empty datagram.
    pub(crate) fn from_vec(buf: Vec<u8>) -> Self {
        HeapDatagram {
            buf,
            len: 0,
            peer: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            local_port: 0,
        }
    }

    /// The buffer back, for a free list.
    pub(crate) fn into_vec(self) -> Vec<u8> {
        self.buf
    }

    pub(crate) fn reset(&mut self) {
        self.len = 0;
        self.peer = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
        self.local_port = 0;
    }
}

impl fmt::Debug for HeapDatagram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeapDatagram")
            .field("len", &self.len)
            .field("capacity", &self.buf.len())
            .field("peer", &self.peer)
            .field("local_port", &self.local_port)
            .finish()
    }
}

impl Datagram for HeapDatagram {
    fn payload(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// # Panics
    /// If `len > capacity()`.
    fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.buf.len(),
            "set_len({len}) beyond capacity {}",
            self.buf.len()
        );
        self.len = len;
    }

    fn capacity(&self) -> usize {
        self.buf.len()
    }

    fn peer(&self) -> SocketAddrV4 {
        self.peer
    }

    fn set_peer(&mut self, peer: SocketAddrV4) {
        self.peer = peer;
    }

    fn local_port(&self) -> u16 {
        self.local_port
    }

    fn set_local_port(&mut self, port: u16) {
        self.local_port = port;
    }
}
