//! The wire format: a fixed 32-byte little-endian header followed by the
//! payload (`count` elements in the header's codec).
//!
//! ```text
//! off size field
//!   0  1   magic    0xA7
//!   1  1   version  1
//!   2  1   kind     collective kind (AllReduce=0, ReduceScatter=1, AllGather=2, Broadcast=3, Barrier=4)
//!   3  1   algo     Ring=0, Direct=1, RecursiveDoubling=2
//!   4  1   codec    F32=0, I16=1
//!   5  1   reserved must be 0
//!   6  2   step     algorithm step (meaning is per algorithm)
//!   8  4   seq      collective sequence number (wrapping)
//!  12  4   chunk    chunk index within the block the step moves
//!  16  8   offset   first element of the chunk in the caller's buffer
//!  24  4   count    number of elements in the payload
//!  28  4   scale    f32 chunk scale (i16), 0.0 for f32 payloads
//!  32  ..  payload  count * 4 bytes (f32 LE) or count * 2 bytes (i16 LE)
//! ```
//!
//! [`decode`] checks every field once and never panics; the algorithm then
//! checks that the message is the one it expects (sender, step, geometry).

use crate::error::{Error, Result};

pub const HEADER_LEN: usize = 32;
pub const MAGIC: u8 = 0xA7;
pub const VERSION: u8 = 1;
/// A scale whose products `q * scale` (|q| <= 32767) stay finite, with a
/// margin: `f32::MAX / 32767` itself rounds up, and `32767` times it is
/// infinite. Division by a power of two is exact.
pub const MAX_SCALE: f32 = f32::MAX / 32768.0;
/// Longest i16 chunk (the spec's n <= 65535).
pub const MAX_I16_CHUNK: usize = 65535;

/// Which collective a message belongs to; a mismatch means ranks issued
/// collectives in different orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce = 0,
    ReduceScatter = 1,
    AllGather = 2,
    Broadcast = 3,
    Barrier = 4,
}

/// Concrete algorithm that produced a message (never `Auto` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgoId {
    Ring = 0,
    Direct = 1,
    RecursiveDoubling = 2,
}

/// Payload encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecId {
    F32 = 0,
    I16 = 1,
}

impl CodecId {
    pub fn element_bytes(self) -> usize {
        match self {
            CodecId::F32 => 4,
            CodecId::I16 => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Header {
    pub kind: Kind,
    pub algo: AlgoId,
    pub codec: CodecId,
    pub step: u16,
    pub seq: u32,
    pub chunk: u32,
    pub offset: u64,
    pub count: u32,
    pub scale: f32,
}

/// A decoded view: the header plus a borrowed payload (no copy).
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub header: Header,
    pub payload: &'a [u8],
}

impl Header {
    pub fn payload_len(&self) -> usize {
        self.count as usize * self.codec.element_bytes()
    }

    /// Writes the 32 header bytes into `out[..HEADER_LEN]`.
    pub fn write(&self, out: &mut [u8; HEADER_LEN]) {
        out[0] = MAGIC;
        out[1] = VERSION;
        out[2] = self.kind as u8;
        out[3] = self.algo as u8;
        out[4] = self.codec as u8;
        out[5] = 0;
        out[6..8].copy_from_slice(&self.step.to_le_bytes());
        out[8..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..16].copy_from_slice(&self.chunk.to_le_bytes());
        out[16..24].copy_from_slice(&self.offset.to_le_bytes());
        out[24..28].copy_from_slice(&self.count.to_le_bytes());
        out[28..32].copy_from_slice(&self.scale.to_le_bytes());
    }
}

/// Appends a full message (header + payload) to `out` (cleared first).
pub fn encode(header: &Header, payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut head = [0u8; HEADER_LEN];
    header.write(&mut head);
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}
fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Parses and validates one message. Never panics on any input.
pub fn decode(bytes: &[u8]) -> Result<Message<'_>> {
    if bytes.len() < HEADER_LEN {
        return Err(Error::Truncated {
            len: bytes.len(),
            header: HEADER_LEN,
        });
    }
    let (h, payload) = bytes.split_at(HEADER_LEN);
    if h[0] != MAGIC {
        return Err(Error::BadMagic(h[0]));
    }
    if h[1] != VERSION {
        return Err(Error::BadVersion(h[1]));
    }
    let kind = match h[2] {
        0 => Kind::AllReduce,
        1 => Kind::ReduceScatter,
        2 => Kind::AllGather,
        3 => Kind::Broadcast,
        4 => Kind::Barrier,
        v => {
            return Err(Error::UnknownField {
                field: "kind",
                value: v,
            })
        }
    };
    let algo = match h[3] {
        0 => AlgoId::Ring,
        1 => AlgoId::Direct,
        2 => AlgoId::RecursiveDoubling,
        v => {
            return Err(Error::UnknownField {
                field: "algo",
                value: v,
            })
        }
    };
    let codec = match h[4] {
        0 => CodecId::F32,
        1 => CodecId::I16,
        v => {
            return Err(Error::UnknownField {
                field: "codec",
                value: v,
            })
        }
    };
    if h[5] != 0 {
        return Err(Error::UnknownField {
            field: "reserved",
            value: h[5],
        });
    }
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&h[16..24]);
    let header = Header {
        kind,
        algo,
        codec,
        step: le_u16(&h[6..8]),
        seq: le_u32(&h[8..12]),
        chunk: le_u32(&h[12..16]),
        offset: u64::from_le_bytes(offset),
        count: le_u32(&h[24..28]),
        scale: f32::from_le_bytes([h[28], h[29], h[30], h[31]]),
    };
    let count = header.count as usize;
    if codec == CodecId::I16 && count > MAX_I16_CHUNK {
        return Err(Error::ChunkTooLong(count));
    }
    let want = count.saturating_mul(codec.element_bytes());
    if payload.len() != want {
        return Err(Error::PayloadLength {
            got: payload.len(),
            want,
            count,
        });
    }
    let scale_ok = match codec {
        CodecId::F32 => header.scale.to_bits() == 0,
        // Not -0.0 either: receivers rely on decoded values never being -0.
        CodecId::I16 => header.scale.is_sign_positive() && header.scale <= MAX_SCALE,
    };
    if !scale_ok {
        return Err(Error::BadScale(header.scale));
    }
    Ok(Message { header, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            kind: Kind::ReduceScatter,
            algo: AlgoId::Direct,
            codec: CodecId::I16,
            step: 7,
            seq: 0xDEAD_BEEF,
            chunk: 3,
            offset: 1 << 40,
            count: 2,
            scale: 0.25,
        }
    }

    #[test]
    fn round_trip() {
        let mut out = Vec::new();
        encode(&sample(), &[1, 2, 3, 4], &mut out);
        let m = decode(&out).unwrap();
        assert_eq!(m.header, sample());
        assert_eq!(m.payload, &[1, 2, 3, 4]);
    }

    #[test]
    fn rejects_bad_fields() {
        let mut out = Vec::new();
        encode(&sample(), &[1, 2, 3, 4], &mut out);
        assert!(matches!(decode(&out[..31]), Err(Error::Truncated { .. })));
        assert!(matches!(
            decode(&out[..35]),
            Err(Error::PayloadLength { .. })
        ));
        let mut bad = out.clone();
        bad[0] = 0;
        assert_eq!(decode(&bad).unwrap_err(), Error::BadMagic(0));
        let mut bad = out.clone();
        bad[4] = 9;
        assert!(matches!(
            decode(&bad),
            Err(Error::UnknownField { field: "codec", .. })
        ));
        let mut h = sample();
        h.scale = f32::NAN;
        encode(&h, &[1, 2, 3, 4], &mut out);
        assert!(matches!(decode(&out), Err(Error::BadScale(_))));
        h.scale = -1.0;
        encode(&h, &[1, 2, 3, 4], &mut out);
        assert!(matches!(decode(&out), Err(Error::BadScale(_))));
        h.codec = CodecId::F32;
        h.scale = 1.0;
        h.count = 1;
        encode(&h, &[1, 2, 3, 4], &mut out);
        assert!(matches!(decode(&out), Err(Error::BadScale(_))));
    }
}
