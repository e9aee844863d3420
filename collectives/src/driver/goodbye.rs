//! What a departing rank tells the others: how many collectives it
//! completed, whether it left after a failure, and which rank that
//! failure named. It travels three ways, so that one lost datagram
//! cannot hide it: as a frame on every QUIC stream, as the reason of the
//! QUIC close, and as a line on the liveness link to rank 0 (module
//! `watch`), which rank 0 relays to every other rank.

use crate::error::Error;

const BYE_MAGIC: &[u8; 8] = b"AINFTPB1";
const BYE_LEN: usize = 16;

/// Ranks up to this can be named as a goodbye's cause (24 bits).
const MAX_CAUSE: usize = (1 << 24) - 2;

/// What a departing rank said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Goodbye {
    /// Collectives it completed: it sent all it ever will for them.
    pub completed: u32,
    /// It left after a failure of its own.
    pub failed: bool,
    /// The rank that failure named (the root cause when failures spread
    /// from rank to rank).
    pub cause: Option<usize>,
}

impl Goodbye {
    /// The goodbye of a rank that completed `completed` collectives and
    /// leaves after `failure`, if any.
    pub fn new(completed: u32, failure: Option<&Error>) -> Goodbye {
        Goodbye {
            completed,
            failed: failure.is_some(),
            cause: failure.and_then(Error::peer_at_fault),
        }
    }

    /// The stream frame: magic, `completed` (u32 LE), then a u32 LE word
    /// whose byte 0 is `failed` and bytes 1-3 the cause + 1 (0: none).
    pub(crate) fn to_frame(self) -> Vec<u8> {
        let mut frame = Vec::with_capacity(BYE_LEN);
        frame.extend_from_slice(BYE_MAGIC);
        frame.extend_from_slice(&self.completed.to_le_bytes());
        let cause = self.cause.filter(|&c| c <= MAX_CAUSE).map_or(0, |c| c + 1) as u32;
        frame.extend_from_slice(&(u32::from(self.failed) | cause << 8).to_le_bytes());
        frame
    }

    /// Whether a stream frame (or a close reason) is a goodbye. Engine
    /// messages start with their own magic byte (0xA7), so a goodbye
    /// cannot be mistaken for one.
    pub(crate) fn is_frame(frame: &[u8]) -> bool {
        frame.len() == BYE_LEN && &frame[..8] == BYE_MAGIC
    }

    /// Reads a frame `is_frame` accepted; a cause outside `world` is none.
    pub(crate) fn from_frame(frame: &[u8], world: usize) -> Goodbye {
        let word = |at: usize| u32::from_le_bytes(frame[at..at + 4].try_into().expect("4 bytes"));
        let cause = (word(12) >> 8) as usize;
        Goodbye {
            completed: word(8),
            failed: frame[12] != 0,
            cause: cause.checked_sub(1).filter(|&c| c < world),
        }
    }

    /// The liveness link's words: `completed failed cause`, with `failed`
    /// 0 or 1 and `-` for no cause (`7 1 3`, `12 0 -`).
    pub(crate) fn to_words(self) -> String {
        let cause = self.cause.map_or("-".to_string(), |c| c.to_string());
        format!("{} {} {cause}", self.completed, u8::from(self.failed))
    }

    /// Reads `to_words`' words; `None` if they are not exactly that. A
    /// cause outside `world` is none.
    pub(crate) fn from_words(words: &str, world: usize) -> Option<Goodbye> {
        let mut it = words.split(' ');
        let (Some(completed), Some(failed), Some(cause), None) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return None;
        };
        let failed = match failed {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        let cause = match cause {
            "-" => None,
            c => Some(c.parse::<usize>().ok()?).filter(|&c| c < world),
        };
        Some(Goodbye {
            completed: completed.parse().ok()?,
            failed,
            cause,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> [Goodbye; 3] {
        [
            Goodbye {
                completed: 7,
                failed: false,
                cause: None,
            },
            Goodbye {
                completed: u32::MAX,
                failed: true,
                cause: Some(2),
            },
            Goodbye {
                completed: 0,
                failed: true,
                cause: Some(MAX_CAUSE),
            },
        ]
    }

    #[test]
    fn a_goodbye_frame_reads_back_as_written() {
        for bye in examples() {
            let frame = bye.to_frame();
            assert!(Goodbye::is_frame(&frame));
            assert_eq!(Goodbye::from_frame(&frame, MAX_CAUSE + 1), bye);
        }
        // A cause outside the job is none.
        let far = Goodbye {
            completed: 1,
            failed: true,
            cause: Some(9),
        };
        assert_eq!(Goodbye::from_frame(&far.to_frame(), 4).cause, None);
    }

    #[test]
    fn goodbye_words_read_back_as_written_and_nothing_else_is_taken() {
        for bye in examples() {
            assert_eq!(
                Goodbye::from_words(&bye.to_words(), MAX_CAUSE + 1),
                Some(bye)
            );
        }
        assert_eq!(examples()[0].to_words(), "7 0 -");
        let far = Goodbye::from_words("1 1 9", 4).expect("a goodbye");
        assert_eq!((far.completed, far.failed, far.cause), (1, true, None));
        for junk in [
            "",
            "7",
            "7 0",
            "7 0 - x",
            "7 2 -",
            "-1 0 -",
            "x 0 -",
            "7 0 x",
            "7  0 -",
            "4294967296 0 -",
        ] {
            assert_eq!(Goodbye::from_words(junk, 8), None, "{junk:?}");
        }
    }
}
