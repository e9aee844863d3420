//! Connection IDs that name their owner: the first byte of every ID an
//! endpoint issues is its lcore index, so a packet can be routed to the
//! lcore that owns its connection from the ID alone (software steering,
//! migration) and no connection state is shared between lcores.

use quiche::ConnectionId;
use rand::RngCore;

/// Length of the connection IDs we issue.
pub const CID_LEN: usize = 16;

/// A fresh random connection ID owned by `lcore`.
pub fn new_cid(lcore: u8, rng: &mut impl RngCore) -> ConnectionId<'static> {
    let mut id = vec![0u8; CID_LEN];
    rng.fill_bytes(&mut id[1..]);
    id[0] = lcore;
    ConnectionId::from_vec(id)
}

/// The lcore that issued `dcid`, if it is one of ours.
pub fn owner_lcore(dcid: &[u8]) -> Option<u8> {
    (dcid.len() == CID_LEN).then(|| dcid[0])
}

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
    }
}
