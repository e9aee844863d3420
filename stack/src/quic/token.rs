//! Address-validation tokens for Retry (RFC 9000 8.1.2): a server answers
//! a client's first Initial with a token that only a client receiving at
//! that address can echo back, before it keeps any state for the client.
//! Spoofed floods of Initials therefore cost one small stateless reply each.
//!
//! Token: issued-at (u64 seconds since the key was made, BE) | odcid length (u8) | odcid | tag
//! (u64, BE), the tag a SipHash keyed per endpoint (random at start) over
//! the peer address, issue time, odcid and the connection ID the Retry
//! gave the client. That ID is the destination of the client's next
//! Initial and becomes the connection's own, so a token opens one
//! connection at a time: replayed with any other ID it is refused, and
//! with its own it reaches the connection it already opened.

use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use quiche::ConnectionId;

/// How long a Retry token is accepted. A client resends its Initial with
/// the token, backing off exponentially, until its handshake gives up
/// (its idle timeout: 30 s for quiche, 60 s for aioquic), and a copy
/// that arrives after the token expired is dropped: the client is
/// stranded until that timeout. At 10 s, 30% loss stranded about one
/// handshake in a hundred (its first four copies lost, the fifth at
/// about 15 s); at 60 s only a client that lost every copy is.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(60);

/// The key tokens are signed with, and the clock their age is read on:
/// the monotonic clock from the key's making (a token dies with its key,
/// so wall-clock time is not needed, and a wall clock stepped back made
/// every token just issued look issued in the future, refused).
pub struct TokenKey {
    key: std::collections::hash_map::RandomState,
    epoch: Instant,
}

impl Default for TokenKey {
    fn default() -> Self {
        TokenKey {
            key: std::collections::hash_map::RandomState::new(),
            epoch: Instant::now(),
        }
    }
}

impl TokenKey {
    fn now_secs(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    fn tag(&self, peer: SocketAddrV4, issued: u64, odcid: &[u8], retry_scid: &[u8]) -> u64 {
        let mut h = self.key.build_hasher();
        h.write(&peer.ip().octets());
        h.write_u16(peer.port());
        h.write_u64(issued);
        // Length-prefixed: the two IDs' boundary is part of what is signed.
        h.write_u8(odcid.len() as u8);
        h.write(odcid);
        h.write(retry_scid);
        h.finish()
    }

    /// A token for `peer`, carrying the client's original destination ID,
    /// for the connection ID `retry_scid` that the Retry gives it.
    pub fn mint(&self, peer: SocketAddrV4, odcid: &[u8], retry_scid: &[u8]) -> Vec<u8> {
        self.mint_at(peer, odcid, retry_scid, self.now_secs())
    }

    fn mint_at(&self, peer: SocketAddrV4, odcid: &[u8], retry_scid: &[u8], issued: u64) -> Vec<u8> {
        let mut t = Vec::with_capacity(8 + 1 + odcid.len() + 8);
        t.extend_from_slice(&issued.to_be_bytes());
        t.push(odcid.len() as u8);
        t.extend_from_slice(odcid);
        let tag = self.tag(peer, issued, odcid, retry_scid);
        t.extend_from_slice(&tag.to_be_bytes());
        t
    }

    /// The original destination ID if `token` was minted by us for `peer`
    /// and the connection ID `dcid` (the Initial's destination), and has
    /// not expired.
    pub fn validate(
        &self,
        peer: SocketAddrV4,
        dcid: &[u8],
        token: &[u8],
    ) -> Option<ConnectionId<'static>> {
        let issued = u64::from_be_bytes(token.get(..8)?.try_into().ok()?);
        let len = *token.get(8)? as usize;
        let odcid = token.get(9..9 + len)?;
        let tag = u64::from_be_bytes(token.get(9 + len..)?.try_into().ok()?);
        let age = self.now_secs().checked_sub(issued)?;
        (tag == self.tag(peer, issued, odcid, dcid) && age <= TOKEN_LIFETIME.as_secs())
            .then(|| ConnectionId::from_vec(odcid.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCID: &[u8] = b"retry-scid-16byt";

    #[test]
    fn a_token_validates_only_for_its_peer_key_and_connection_id() {
        let key = TokenKey::default();
        let peer: SocketAddrV4 = "10.0.0.1:4433".parse().unwrap();
        let other: SocketAddrV4 = "10.0.0.2:4433".parse().unwrap();
        let t = key.mint(peer, b"odcid-bytes", SCID);
        let odcid = key.validate(peer, SCID, &t).unwrap();
        assert_eq!(odcid.as_ref(), b"odcid-bytes");
        assert!(key.validate(other, SCID, &t).is_none());
        assert!(TokenKey::default().validate(peer, SCID, &t).is_none());
        // Replayed for another connection: a fresh ID is refused.
        assert!(key.validate(peer, b"another-id-16byt", &t).is_none());
        let mut forged = t.clone();
        *forged.last_mut().unwrap() ^= 1;
        assert!(key.validate(peer, SCID, &forged).is_none());
        for n in 0..t.len() {
            assert!(key.validate(peer, SCID, &t[..n]).is_none());
        }
    }

    #[test]
    fn a_token_outlives_a_client_s_handshake_retries_then_expires() {
        // A key made 100 s ago, so that tokens can be minted in its past.
        let key = TokenKey {
            epoch: Instant::now()
                .checked_sub(Duration::from_secs(100))
                .expect("the monotonic clock is past 100 s"),
            ..TokenKey::default()
        };
        let peer: SocketAddrV4 = "10.0.0.1:4433".parse().unwrap();
        let now = key.now_secs();
        let aged = |secs: u64| key.mint_at(peer, b"odcid", SCID, now - secs);
        // aioquic's fifth copy of its Initial leaves about 15 s after the
        // first, its sixth about 31 s after.
        for secs in [15, 31, 59] {
            assert!(
                key.validate(peer, SCID, &aged(secs)).is_some(),
                "{secs} s old"
            );
        }
        assert!(key.validate(peer, SCID, &aged(62)).is_none());
        // Issued in the future (a forged time fails the tag anyway).
        let future = key.mint_at(peer, b"odcid", SCID, now + 5);
        assert!(key.validate(peer, SCID, &future).is_none());
    }
}
