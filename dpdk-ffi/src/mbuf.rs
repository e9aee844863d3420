//! An owned packet buffer. Drop returns it to its pool.

use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::sys;

/// One mbuf (first segment views only: our pools make single-segment
/// packets). `repr(transparent)` so a slice of batch pointers can be viewed
/// as a slice of `Mbuf` without copying.
#[repr(transparent)]
pub struct Mbuf {
    raw: NonNull<sys::rte_mbuf>,
}

// SAFETY: an Mbuf is the only owner of its rte_mbuf; moving it between
// threads is how DPDK passes packets between lcores. The pool it returns to
// is thread-safe.
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Take ownership of a raw mbuf.
    ///
    /// # Safety
    /// `raw` must be a valid mbuf that nobody else owns or frees.
    pub unsafe fn from_raw(raw: NonNull<sys::rte_mbuf>) -> Mbuf {
        Mbuf { raw }
    }

    /// Give up ownership; the caller must free or send the mbuf.
    pub fn into_raw(self) -> NonNull<sys::rte_mbuf> {
        let raw = self.raw;
        std::mem::forget(self);
        raw
    }

    pub fn as_ptr(&self) -> *mut sys::rte_mbuf {
        self.raw.as_ptr()
    }

    fn hdr(&self) -> &sys::rte_mbuf {
        // SAFETY: we own a valid mbuf; shared access to its header.
        unsafe { self.raw.as_ref() }
    }

    fn hdr_mut(&mut self) -> &mut sys::rte_mbuf {
        // SAFETY: we own a valid mbuf; &mut self makes access exclusive.
        unsafe { self.raw.as_mut() }
    }

    /// Bytes of data in this (first) segment.
    pub fn len(&self) -> usize {
        self.hdr().data_len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the whole packet, all segments.
    pub fn pkt_len(&self) -> usize {
        self.hdr().pkt_len as usize
    }

    pub fn data(&self) -> &[u8] {
        let h = self.hdr();
        // SAFETY: buf_addr + data_off .. + data_len lies inside the mbuf's
        // buffer and is initialised packet data; we own the mbuf.
        unsafe {
            std::slice::from_raw_parts(
                (h.buf_addr as *const u8).add(h.data_off as usize),
                h.data_len as usize,
            )
        }
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        let h = self.hdr_mut();
        // SAFETY: as in data(), and &mut self gives exclusive access.
        unsafe {
            std::slice::from_raw_parts_mut(
                (h.buf_addr as *mut u8).add(h.data_off as usize),
                h.data_len as usize,
            )
        }
    }

    /// Whether the packet continues in further mbufs (a PMD's scattered
    /// receive). `len`, `data` and the edits below see the first only.
    pub fn is_segmented(&self) -> bool {
        self.hdr().nb_segs != 1
    }

    /// The tail edits (`append`, `trim`) work on the first segment's
    /// fields, which is only the packet's end when there is one segment.
    fn single_segment(&self) -> Result<()> {
        if self.is_segmented() {
            return Err(Error::InvalidArgument(
                "a segmented mbuf: only single-segment packets are edited".into(),
            ));
        }
        Ok(())
    }

    pub fn headroom(&self) -> usize {
        self.hdr().data_off as usize
    }

    pub fn tailroom(&self) -> usize {
        let h = self.hdr();
        h.buf_len as usize - h.data_off as usize - h.data_len as usize
    }

    /// Grow the data at the end by `len` bytes and return them (uninitialised
    /// contents are whatever the buffer held; callers overwrite them).
    pub fn append(&mut self, len: usize) -> Result<&mut [u8]> {
        self.single_segment()?;
        let l = fits(len, self.tailroom(), "tailroom")?;
        // What rte_pktmbuf_append does, inline. These edits run per packet,
        // and a call into the C shim costs more than the work.
        let h = self.hdr_mut();
        let end = h.data_off as usize + h.data_len as usize;
        h.data_len += l;
        h.pkt_len += u32::from(l);
        // SAFETY: end + len <= buf_len (tailroom checked): inside the buffer.
        unsafe {
            Ok(std::slice::from_raw_parts_mut(
                (h.buf_addr as *mut u8).add(end),
                len,
            ))
        }
    }

    /// Grow the data at the front by `len` bytes (into the headroom).
    pub fn prepend(&mut self, len: usize) -> Result<&mut [u8]> {
        let l = fits(len, self.headroom(), "headroom")?;
        // What rte_pktmbuf_prepend does (first segment only), inline.
        let h = self.hdr_mut();
        h.data_off -= l;
        h.data_len += l;
        h.pkt_len += u32::from(l);
        // SAFETY: the headroom check keeps the new front inside the buffer,
        // and the `len` bytes after it were data or headroom.
        unsafe {
            Ok(std::slice::from_raw_parts_mut(
                (h.buf_addr as *mut u8).add(h.data_off as usize),
                len,
            ))
        }
    }

    /// Remove `len` bytes from the front (e.g. a parsed header).
    #[inline]
    pub fn adj(&mut self, len: usize) -> Result<()> {
        let l = fits(len, self.len(), "data")?;
        // What rte_pktmbuf_adj does (first segment only), inline.
        let h = self.hdr_mut();
        h.data_off += l;
        h.data_len -= l;
        h.pkt_len -= u32::from(l);
        Ok(())
    }

    /// Remove `len` bytes from the end.
    #[inline]
    pub fn trim(&mut self, len: usize) -> Result<()> {
        self.single_segment()?;
        let l = fits(len, self.len(), "data")?;
        let h = self.hdr_mut();
        h.data_len -= l;
        h.pkt_len -= u32::from(l);
        Ok(())
    }

    pub fn ol_flags(&self) -> u64 {
        self.hdr().ol_flags
    }

    /// The RSS hash the NIC computed, if it set one.
    pub fn rss_hash(&self) -> Option<u32> {
        // SAFETY: reading immutable constants exported by the shim.
        let flag = unsafe { sys::AINFTP_MBUF_F_RX_RSS_HASH };
        // SAFETY: we own a valid mbuf.
        (self.ol_flags() & flag != 0).then(|| unsafe { sys::ainftp_mbuf_rss_hash(self.as_ptr()) })
    }

    /// The RTE_PTYPE_* classification the PMD set (0: unknown).
    pub fn packet_type(&self) -> u32 {
        // SAFETY: we own a valid mbuf.
        unsafe { sys::ainftp_mbuf_packet_type(self.as_ptr()) }
    }

    /// What the NIC verified of the IPv4 header and L4 checksums on receive.
    pub fn rx_checksum(&self) -> RxChecksum {
        let f = self.ol_flags();
        // SAFETY: reading immutable constants exported by the shim.
        unsafe {
            RxChecksum {
                ip: CsumStatus::from_flags(
                    f & sys::AINFTP_MBUF_F_RX_IP_CKSUM_MASK,
                    sys::AINFTP_MBUF_F_RX_IP_CKSUM_GOOD,
                    sys::AINFTP_MBUF_F_RX_IP_CKSUM_BAD,
                ),
                l4: CsumStatus::from_flags(
                    f & sys::AINFTP_MBUF_F_RX_L4_CKSUM_MASK,
                    sys::AINFTP_MBUF_F_RX_L4_CKSUM_GOOD,
                    sys::AINFTP_MBUF_F_RX_L4_CKSUM_BAD,
                ),
            }
        }
    }

    /// Ask the NIC to fill the IPv4 header checksum and (with `udp`) the UDP
    /// checksum on transmit. The UDP checksum field must hold the
    /// pseudo-header sum. Only valid when the port enabled these offloads.
    pub fn request_tx_checksum(&mut self, l2_len: u16, l3_len: u16, udp: bool) {
        // SAFETY: reading immutable constants exported by the shim.
        let mut flags = unsafe { sys::AINFTP_MBUF_F_TX_IPV4 | sys::AINFTP_MBUF_F_TX_IP_CKSUM };
        if udp {
            // SAFETY: as above.
            flags |= unsafe { sys::AINFTP_MBUF_F_TX_UDP_CKSUM };
        }
        // SAFETY: we own a valid mbuf; the shim only writes header fields.
        unsafe { sys::ainftp_mbuf_set_tx_offload(self.as_ptr(), l2_len, l3_len, flags) };
    }

    /// The port the mbuf was received on.
    pub fn port(&self) -> u16 {
        self.hdr().port
    }
}

/// One checksum as the NIC reported it on receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsumStatus {
    /// Not checked by the NIC: verify in software.
    Unknown,
    Good,
    Bad,
    /// The checksum field in the packet is not valid, but the NIC (or the
    /// host, for virtio) verified the data: accept it, and never reuse the
    /// field (DPDK's `*_CKSUM_NONE`; partial checksums from a local VM).
    None,
}

impl CsumStatus {
    fn from_flags(masked: u64, good: u64, bad: u64) -> CsumStatus {
        match masked {
            0 => CsumStatus::Unknown,
            m if m == good => CsumStatus::Good,
            m if m == bad => CsumStatus::Bad,
            _ => CsumStatus::None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxChecksum {
    pub ip: CsumStatus,
    pub l4: CsumStatus,
}

/// `len` as the u16 DPDK takes, if it fits in the `available` bytes of `room`.
fn fits(len: usize, available: usize, room: &'static str) -> Result<u16> {
    u16::try_from(len)
        .ok()
        .filter(|_| len <= available)
        .ok_or(Error::NoRoom {
            room,
            wanted: len,
            available,
        })
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the mbuf and nobody uses it after this.
        unsafe { sys::ainftp_pktmbuf_free(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mbuf")
            .field("len", &self.len())
            .field("headroom", &self.headroom())
            .field("tailroom", &self.tailroom())
            .finish()
    }
}
