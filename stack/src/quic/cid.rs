//! Connection IDs that name their owner: the first byte of every ID an
//! endpoint issues is its lcore index, so a packet can be routed to the
//! lcore that owns its connection from the ID alone (software steering,
//! migration) and no connection state is shared between lcores. The next
//! two bytes are a tag drawn once per process: an ID a peer chose (a
//! client's first Initials carry a random one of our length) then names
//! an lcore only by a 1 in 65536 chance, instead of pinning 1 connection
//! in 256 per lcore to an lcore its packets do not hash to.

use std::sync::OnceLock;

use quiche::ConnectionId;
use rand::RngCore;

/// Length of the connection IDs we issue.
pub const CID_LEN: usize = 16;

/// This process's tag, bytes 1 and 2 of every ID it issues.
fn tag() -> [u8; 2] {
    static TAG: OnceLock<[u8; 2]> = OnceLock::new();
    *TAG.get_or_init(rand::random)
}

/// A fresh random connection ID owned by `lcore`.
pub fn new_cid(lcore: u8, rng: &mut impl RngCore) -> ConnectionId<'static> {
    let mut id = vec![0u8; CID_LEN];
    rng.fill_bytes(&mut id[3..]);
    id[0] = lcore;
    id[1..3].copy_from_slice(&tag());
    ConnectionId::from_vec(id)
}

/// The lcore that issued `dcid`, if it is one of ours.
pub fn owner_lcore(dcid: &[u8]) -> Option<u8> {
    (dcid.len() == CID_LEN && dcid[1..3] == tag()).then(|| dcid[0])
}

/// The lcore named by the destination connection ID of the QUIC packet
/// that starts `payload` (a UDP payload), read without decrypting: where a
/// packet must go when its 4-tuple hashed elsewhere (a peer its NAT
/// rebound, a queue the kernel picked). A short header does not say how
/// long its ID is: ours are `CID_LEN`. A long header must carry an ID of
/// that length and carry this process's tag (see the module doc): a
/// client's first Initials carry an ID it chose, and stay where they land.
/// (`stack::runtime::RuntimeConfig::payload_owner` takes this function.)
pub fn owner_of_datagram(payload: &[u8]) -> Option<usize> {
    let first = *payload.first()?;
    let dcid = if first & LONG_HEADER == 0 {
        payload.get(1..1 + CID_LEN)?
    } else {
        // Long header: flags, 4-byte version, ID length, ID.
        if usize::from(*payload.get(5)?) != CID_LEN {
            return None;
        }
        payload.get(6..6 + CID_LEN)?
    };
    owner_lcore(dcid).map(usize::from)
}

/// The header-form bit of a QUIC packet's first byte (RFC 9000 17.2).
const LONG_HEADER: u8 = 0x80;

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ids_carry_their_lcore_and_differ() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let a = new_cid(3, &mut rng);
        let b = new_cid(3, &mut rng);
        assert_eq!(owner_lcore(&a), Some(3));
        assert_ne!(a, b);
        assert_eq!(owner_lcore(&[1, 2, 3]), None);
        // An ID of our length that we did not issue (a client's random
        // Initial ID) names no lcore.
        let mut theirs = a.to_vec();
        theirs[1] ^= 1;
        assert_eq!(owner_lcore(&theirs), None);
    }

    /// quiche writes the packets; the peek must find the lcore in each
    /// header form, and nothing in what is too short or not ours.
    #[test]
    fn datagrams_name_the_lcore_of_their_destination_id() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let ours = new_cid(5, &mut rng);
        let theirs = ConnectionId::from_ref(&[9u8; 8]);
        let mut out = [0u8; 1500];

        // Long headers a server sends to a client whose ID is ours: a
        // version negotiation and a Retry (the first argument is the
        // client's ID, which the reply is addressed to).
        let n = quiche::negotiate_version(&ours, &theirs, &mut out).unwrap();
        assert_eq!(owner_of_datagram(&out[..n]), Some(5));
        let n = quiche::retry(&ours, &theirs, &theirs, b"token", 1, &mut out).unwrap();
        assert_eq!(owner_of_datagram(&out[..n]), Some(5));
        // A long header to an ID of another length is not ours to route.
        let n = quiche::negotiate_version(&theirs, &ours, &mut out).unwrap();
        assert_eq!(owner_of_datagram(&out[..n]), None);

        // A short header: first byte, then the ID (quiche parses it so).
        let mut short = vec![0x40];
        short.extend_from_slice(&ours);
        short.extend_from_slice(&[0xaa; 40]);
        let hdr = quiche::Header::from_slice(&mut short.clone(), CID_LEN).unwrap();
        assert_eq!(hdr.ty, quiche::Type::Short);
        assert_eq!(hdr.dcid, ours);
        assert_eq!(owner_of_datagram(&short), Some(5));

        assert_eq!(owner_of_datagram(&short[..CID_LEN]), None, "truncated ID");
        assert_eq!(owner_of_datagram(&[0xc0, 0, 0, 0, 1]), None, "no ID length");
        assert_eq!(owner_of_datagram(&[]), None);
    }
}
