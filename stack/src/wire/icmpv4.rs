//! ICMPv4 (RFC 792), as far as answering ping.
//!
//! The view covers every message type (all share the 8-byte header and the
//! checksum over the whole message); `Icmpv4Repr` only knows echo, since that
//! is all the stack answers. Other types parse as `Malformed` and are dropped.

use super::{checksum, read_u16, write_u16, Error, Result};

/// Length of the ICMP header, including the type-specific 4 bytes.
pub const HEADER_LEN: usize = 8;

/// ICMPv4 message types the stack names.
pub mod icmpv4_type {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable.
    pub const DST_UNREACHABLE: u8 = 3;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
}

const TYPE: usize = 0;
const CODE: usize = 1;
const CHECKSUM: usize = 2;
const ECHO_IDENT: usize = 4;
const ECHO_SEQ: usize = 6;

/// A view of an ICMPv4 message; the buffer is exactly the IP payload.
#[derive(Debug, Clone)]
pub struct Icmpv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    /// Wraps a buffer without checks; getters may then panic on short buffers.
    pub fn new_unchecked(buffer: T) -> Self {
        Icmpv4Packet { buffer }
    }

    /// Wraps a buffer of at least `HEADER_LEN` bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Self::new_unchecked(buffer))
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Message type (see `icmpv4_type`).
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[TYPE]
    }

    /// Message code.
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[CODE]
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), CHECKSUM)
    }

    /// Whether the checksum over the whole message is correct.
    pub fn verify_checksum(&self) -> bool {
        checksum::data(self.buffer.as_ref()) == 0xffff
    }

    /// Echo identifier (meaningful for echo messages only).
    pub fn echo_ident(&self) -> u16 {
        read_u16(self.buffer.as_ref(), ECHO_IDENT)
    }

    /// Echo sequence number (meaningful for echo messages only).
    pub fn echo_seq_no(&self) -> u16 {
        read_u16(self.buffer.as_ref(), ECHO_SEQ)
    }

    /// Everything after the 8-byte header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    /// Sets the message type.
    pub fn set_msg_type(&mut self, value: u8) {
        self.buffer.as_mut()[TYPE] = value;
    }

    /// Sets the message code.
    pub fn set_code(&mut self, value: u8) {
        self.buffer.as_mut()[CODE] = value;
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), CHECKSUM, value);
    }

    /// Sets the echo identifier.
    pub fn set_echo_ident(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), ECHO_IDENT, value);
    }

    /// Sets the echo sequence number.
    pub fn set_echo_seq_no(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), ECHO_SEQ, value);
    }

    /// Computes the checksum over the whole buffer and stores it.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let sum = checksum::data(self.buffer.as_ref());
        self.set_checksum(checksum::finish(sum));
    }

    /// Mutable access to everything after the 8-byte header.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// Turns an echo request into the matching reply without reading the data.
///
/// Only the type byte changes (8 -> 0), so the checksum is updated per
/// RFC 1624 instead of summing a possibly large payload; the result is the
/// same as `fill_checksum` would give, and a request that arrived with a bad
/// checksum keeps a bad one. The IP addresses are the caller's to swap.
/// `Malformed` (and nothing changed) if the message is not an echo request.
pub fn echo_request_to_reply_in_place<T>(packet: &mut Icmpv4Packet<T>) -> Result<()>
where
    T: AsRef<[u8]> + AsMut<[u8]>,
{
    if packet.msg_type() != icmpv4_type::ECHO_REQUEST {
        return Err(Error::Malformed);
    }
    let code = u16::from(packet.code());
    let old_word = u16::from(icmpv4_type::ECHO_REQUEST) << 8 | code;
    let new_word = u16::from(icmpv4_type::ECHO_REPLY) << 8 | code;
    let mut sum = checksum::update(packet.checksum(), old_word, new_word);
    // A full computation over an all-zero reply gives 0xffff, never 0; the
    // incremental form cannot tell that case apart, so look (rarely).
    if sum == 0 && code == 0 && packet.buffer.as_ref()[ECHO_IDENT..].iter().all(|&b| b == 0) {
        sum = 0xffff;
    }
    packet.set_msg_type(icmpv4_type::ECHO_REPLY);
    packet.set_checksum(sum);
    Ok(())
}

/// An echo message; `data` borrows from the packet it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv4Repr<'a> {
    EchoRequest {
        ident: u16,
        seq_no: u16,
        data: &'a [u8],
    },
    EchoReply {
        ident: u16,
        seq_no: u16,
        data: &'a [u8],
    },
}

impl<'a> Icmpv4Repr<'a> {
    /// Reads an echo message, always verifying the checksum (NICs do not
    /// offload ICMP). `Checksum` if wrong; `Malformed` for other types or a
    /// non-zero code.
    pub fn parse<T: AsRef<[u8]>>(packet: &'a Icmpv4Packet<T>) -> Result<Self> {
        if packet.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if !packet.verify_checksum() {
            return Err(Error::Checksum);
        }
        let (ident, seq_no, data) = (packet.echo_ident(), packet.echo_seq_no(), packet.data());
        match (packet.msg_type(), packet.code()) {
            (icmpv4_type::ECHO_REQUEST, 0) => Ok(Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data,
            }),
            (icmpv4_type::ECHO_REPLY, 0) => Ok(Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            }),
            _ => Err(Error::Malformed),
        }
    }

    /// Header plus data.
    pub fn buffer_len(&self) -> usize {
        match self {
            Icmpv4Repr::EchoRequest { data, .. } | Icmpv4Repr::EchoReply { data, .. } => {
                HEADER_LEN + data.len()
            }
        }
    }

    /// Writes the message, data included, into the first `buffer_len()`
    /// bytes of `buf` and fills the checksum; `Truncated` if `buf` is short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let len = self.buffer_len();
        let buf = buf.get_mut(..len).ok_or(Error::Truncated)?;
        let (msg_type, ident, seq_no, data) = match *self {
            Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } => (icmpv4_type::ECHO_REQUEST, ident, seq_no, data),
            Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => (icmpv4_type::ECHO_REPLY, ident, seq_no, data),
        };
        let mut p = Icmpv4Packet::new_unchecked(buf);
        p.set_msg_type(msg_type);
        p.set_code(0);
        p.set_echo_ident(ident);
        p.set_echo_seq_no(seq_no);
        p.data_mut().copy_from_slice(data);
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::PING_REQUEST;
    use proptest::prelude::*;

    fn request() -> [u8; 64] {
        let mut b = [0u8; 64];
        b.copy_from_slice(&PING_REQUEST[20..]);
        b
    }

    #[test]
    fn parse_real_echo_request() {
        let buf = request();
        let p = Icmpv4Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.msg_type(), icmpv4_type::ECHO_REQUEST);
        assert_eq!(p.code(), 0);
        assert_eq!(p.checksum(), 0x9787);
        assert!(p.verify_checksum());
        assert_eq!(
            Icmpv4Repr::parse(&p).unwrap(),
            Icmpv4Repr::EchoRequest {
                ident: 0x0b6c,
                seq_no: 1,
                data: &PING_REQUEST[28..]
            }
        );
    }

    #[test]
    fn emit_matches_capture() {
        let repr = Icmpv4Repr::EchoRequest {
            ident: 0x0b6c,
            seq_no: 1,
            data: &PING_REQUEST[28..],
        };
        assert_eq!(repr.buffer_len(), 64);
        let mut buf = [0u8; 70];
        repr.emit(&mut buf).unwrap();
        assert_eq!(&buf[..64], &request()[..]);
        assert_eq!(repr.emit(&mut buf[..63]), Err(Error::Truncated));
    }

    #[test]
    fn truncated_at_every_length() {
        let buf = request();
        for n in 0..HEADER_LEN {
            assert_eq!(
                Icmpv4Packet::new_checked(&buf[..n]).err(),
                Some(Error::Truncated)
            );
        }
    }

    #[test]
    fn wrong_checksum_and_unknown_types_rejected() {
        let mut buf = request();
        buf[40] ^= 0x80;
        let p = Icmpv4Packet::new_checked(&buf[..]).unwrap();
        assert!(!p.verify_checksum());
        assert_eq!(Icmpv4Repr::parse(&p), Err(Error::Checksum));

        for (msg_type, code) in [
            (icmpv4_type::DST_UNREACHABLE, 3),
            (icmpv4_type::ECHO_REQUEST, 1),
        ] {
            let mut buf = request();
            let mut p = Icmpv4Packet::new_checked(&mut buf[..]).unwrap();
            p.set_msg_type(msg_type);
            p.set_code(code);
            p.fill_checksum();
            assert_eq!(Icmpv4Repr::parse(&p), Err(Error::Malformed));
        }
    }

    #[test]
    fn request_to_reply_matches_recompute() {
        let mut buf = request();
        let mut p = Icmpv4Packet::new_checked(&mut buf[..]).unwrap();
        echo_request_to_reply_in_place(&mut p).unwrap();
        assert_eq!(p.msg_type(), icmpv4_type::ECHO_REPLY);
        assert!(p.verify_checksum());
        let got = p.checksum();
        p.fill_checksum();
        assert_eq!(got, p.checksum());
        // A reply is not a request: refuse, and leave it alone.
        let before = buf;
        let mut p = Icmpv4Packet::new_checked(&mut buf[..]).unwrap();
        assert_eq!(
            echo_request_to_reply_in_place(&mut p),
            Err(Error::Malformed)
        );
        assert_eq!(buf, before);
    }

    #[test]
    fn request_to_reply_all_zero_reply() {
        // The one case where RFC 1624 eqn. 3 alone gives 0 instead of 0xffff.
        let mut buf = [0u8; 8];
        buf[0] = icmpv4_type::ECHO_REQUEST;
        let mut p = Icmpv4Packet::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum();
        echo_request_to_reply_in_place(&mut p).unwrap();
        assert_eq!(p.checksum(), 0xffff);
        assert!(p.verify_checksum());
    }

    #[test]
    fn request_to_reply_keeps_bad_checksum_bad() {
        let mut buf = request();
        buf[2] ^= 0x10;
        let mut p = Icmpv4Packet::new_checked(&mut buf[..]).unwrap();
        echo_request_to_reply_in_place(&mut p).unwrap();
        assert!(!p.verify_checksum());
    }

    proptest! {
        #[test]
        fn request_to_reply_equals_full_recompute(
            code in prop_oneof![Just(0u8), any::<u8>()],
            ident in prop_oneof![Just(0u16), any::<u16>()],
            seq_no in prop_oneof![Just(0u16), any::<u16>()],
            data in prop_oneof![
                proptest::collection::vec(Just(0u8), 0..4),
                proptest::collection::vec(any::<u8>(), 0..300),
            ],
        ) {
            let mut buf = vec![0u8; HEADER_LEN + data.len()];
            let mut p = Icmpv4Packet::new_checked(&mut buf[..]).unwrap();
            p.set_msg_type(icmpv4_type::ECHO_REQUEST);
            p.set_code(code);
            p.set_echo_ident(ident);
            p.set_echo_seq_no(seq_no);
            p.data_mut().copy_from_slice(&data);
            p.fill_checksum();
            echo_request_to_reply_in_place(&mut p).unwrap();
            let incremental = p.checksum();
            p.fill_checksum();
            prop_assert_eq!(incremental, p.checksum());
            prop_assert!(p.verify_checksum());
        }
    }
}
