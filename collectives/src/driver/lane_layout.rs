//! How a reduce-scatter or all-gather is cut over lanes. Their results are
//! laid out by rank: rank r's shard is [`shard_range`]`(count, world, r)`
//! of the whole buffer. Cutting the buffer into contiguous parts, as an
//! all-reduce is cut, would give each lane's engine shards that straddle
//! ranks. Instead lane l carries the l-th piece of every rank's shard: it
//! gathers those pieces, in rank order, into a buffer of its own, runs the
//! collective there, and copies the result pieces back.
//!
//! This works with the engine as it is because the pieces line up with
//! the engine's own cut of the lane's buffer: rank r's piece is exactly
//! `shard_range(lane_len, world, r)` of it (shards differ by at most one
//! element, larger first, and so do their l-th pieces; checked for every
//! small shape in the tests below).

use std::ops::Range;

use crate::algo::shard_range;

/// The pieces of a `count`-element buffer that lane `lane` of `lanes`
/// carries, one per rank in rank order: the lane's share of each rank's
/// shard.
pub fn lane_pieces(
    count: usize,
    world: usize,
    lanes: usize,
    lane: usize,
) -> impl Iterator<Item = Range<usize>> {
    (0..world).map(move |r| {
        let shard = shard_range(count, world, r);
        let piece = shard_range(shard.len(), lanes, lane);
        shard.start + piece.start..shard.start + piece.end
    })
}

/// Cuts `buf` into each lane's pieces (`lanes` lists of `world` disjoint
/// slices, see [`lane_pieces`]).
pub fn split_by_lane(buf: &mut [f32], world: usize, lanes: usize) -> Vec<Vec<&mut [f32]>> {
    let count = buf.len();
    let mut by_lane: Vec<Vec<&mut [f32]>> = (0..lanes).map(|_| Vec::with_capacity(world)).collect();
    let mut rest = buf;
    for r in 0..world {
        let shard_len = shard_range(count, world, r).len();
        let (mut shard, tail) = rest.split_at_mut(shard_len);
        rest = tail;
        for (l, pieces) in by_lane.iter_mut().enumerate() {
            let (piece, shard_tail) = shard.split_at_mut(shard_range(shard_len, lanes, l).len());
            pieces.push(piece);
            shard = shard_tail;
        }
    }
    by_lane
}

/// One lane's pieces of a rank-laid-out buffer and the lane's own
/// contiguous copy of them, which its communicator runs on.
pub struct GatheredPart<'a> {
    pieces: Vec<&'a mut [f32]>,
    own: &'a mut Vec<f32>,
}

impl<'a> GatheredPart<'a> {
    /// Copies `pieces` (rank order) into `own`, which grows as needed and
    /// is kept by the caller for the next call.
    pub fn gather(pieces: Vec<&'a mut [f32]>, own: &'a mut Vec<f32>) -> Self {
        own.clear();
        for p in &pieces {
            own.extend_from_slice(p);
        }
        GatheredPart { pieces, own }
    }

    /// The lane's contiguous buffer.
    pub fn buf(&mut self) -> &mut [f32] {
        self.own
    }

    /// Copies the result back: rank `rank`'s piece only (a reduce-scatter
    /// leaves the rest unspecified), or every piece (`all`: all-gather).
    pub fn scatter(self, rank: usize, all: bool) {
        let mut at = 0;
        for (r, piece) in self.pieces.into_iter().enumerate() {
            let len = piece.len();
            if all || r == rank {
                piece.copy_from_slice(&self.own[at..at + len]);
            }
            at += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine cuts a lane's buffer by `shard_range(len, world, r)`;
    /// the gathered pieces must fall exactly on those cuts, or a lane
    /// would reduce one rank's elements into another rank's shard.
    #[test]
    fn each_rank_s_piece_is_the_engine_s_shard_of_the_lane_buffer() {
        for world in 1..=9 {
            for lanes in 1..=9 {
                for count in 0..=300 {
                    let mut covered = vec![0u8; count];
                    for lane in 0..lanes {
                        let pieces: Vec<_> = lane_pieces(count, world, lanes, lane).collect();
                        let lane_len: usize = pieces.iter().map(|p| p.len()).sum();
                        let mut at = 0;
                        for (r, p) in pieces.iter().enumerate() {
                            let shard = shard_range(count, world, r);
                            assert!(shard.start <= p.start && p.end <= shard.end);
                            assert_eq!(
                                at..at + p.len(),
                                shard_range(lane_len, world, r),
                                "count {count}, world {world}, lanes {lanes}, lane {lane}, rank {r}"
                            );
                            at += p.len();
                            for i in p.clone() {
                                covered[i] += 1;
                            }
                        }
                    }
                    assert!(
                        covered.iter().all(|&c| c == 1),
                        "every element in one piece"
                    );
                }
            }
        }
    }

    #[test]
    fn split_by_lane_hands_out_the_pieces_lane_pieces_names() {
        let (count, world, lanes) = (103, 3, 4);
        let mut buf: Vec<f32> = (0..count).map(|i| i as f32).collect();
        let by_lane = split_by_lane(&mut buf, world, lanes);
        for (l, pieces) in by_lane.iter().enumerate() {
            let want: Vec<Vec<f32>> = lane_pieces(count, world, lanes, l)
                .map(|p| p.map(|i| i as f32).collect())
                .collect();
            let got: Vec<Vec<f32>> = pieces.iter().map(|p| p.to_vec()).collect();
            assert_eq!(got, want, "lane {l}");
        }
    }

    #[test]
    fn scatter_writes_back_the_own_piece_or_every_piece() {
        let (count, world, lanes) = (20, 2, 2);
        let mut buf = vec![0f32; count];
        let mut own = Vec::new();
        let pieces = split_by_lane(&mut buf, world, lanes).swap_remove(1);
        let mut part = GatheredPart::gather(pieces, &mut own);
        part.buf().iter_mut().for_each(|x| *x = 1.0);
        part.scatter(1, false);
        // Lane 1 holds elements 5..10 (rank 0) and 15..20 (rank 1).
        let ones: Vec<usize> = (0..count).filter(|&i| buf[i] == 1.0).collect();
        assert_eq!(ones, (15..20).collect::<Vec<_>>());

        let pieces = split_by_lane(&mut buf, world, lanes).swap_remove(1);
        let mut part = GatheredPart::gather(pieces, &mut own);
        part.buf().iter_mut().for_each(|x| *x = 2.0);
        part.scatter(0, true);
        let twos: Vec<usize> = (0..count).filter(|&i| buf[i] == 2.0).collect();
        assert_eq!(twos, (5..10).chain(15..20).collect::<Vec<_>>());
    }
}
