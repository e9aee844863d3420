//! The contribution-filter hook and the i16 clip policy against a peer that
//! announces a huge scale.

mod common;

use collectives::message::{decode, Header, MAX_SCALE};
use collectives::sim::{Job, Sim, SimConfig};
use collectives::{
    Algo, ChunkInfo, Codec, Collective, Config, ContributionFilter, Contributions, Engine, Error,
    Op, ReduceOp, Rounding,
};
use common::*;

struct DropRank(usize);
impl ContributionFilter for DropRank {
    fn inspect(&mut self, chunk: &ChunkInfo, c: &mut Contributions<'_>) {
        assert_eq!(c.len(), chunk.len);
        c.get_mut(self.0).fill(0.0);
    }
}

#[test]
fn filter_sees_and_rewrites_contributions() {
    let world = 5;
    let n = 4001;
    for codec in [Codec::F32, Codec::I16(Rounding::Nearest)] {
        let cfg = Config {
            codec,
            chunk_elems: 300,
            ..Config::default()
        };
        let mut sim = Sim::new(world, cfg, SimConfig::lossy(9)).unwrap();
        for r in 0..world {
            sim.engine_mut(r).set_filter(Box::new(DropRank(2))).unwrap();
            assert_eq!(
                sim.engine(r)
                    .algo_for(Op::AllReduce(ReduceOp::Sum), n)
                    .unwrap(),
                collectives::AlgoId::Direct
            );
        }
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n, 5)).collect();
        let mut jobs = vec![Job::new(
            Collective::all_reduce(ReduceOp::Sum),
            inputs.clone(),
        )];
        sim.run(&mut jobs).unwrap();
        // Rank 2's contribution is gone: compare with the other four.
        let mut without: Vec<Vec<f32>> = inputs.clone();
        without[2].fill(0.0);
        check(
            Op::AllReduce(ReduceOp::Sum),
            Algo::Direct,
            codec,
            &without,
            &jobs[0].bufs,
            "filtered",
        );
    }
}

#[test]
fn filter_requires_direct() {
    let cfg = Config {
        algo: Algo::Ring,
        ..Config::default()
    };
    let mut e = Engine::new(0, 2, cfg).unwrap();
    e.set_filter(Box::new(DropRank(1))).unwrap();
    let err = e
        .start(Collective::all_reduce(ReduceOp::Sum), &mut [1.0; 4])
        .unwrap_err();
    assert_eq!(err, Error::FilterNeedsDirect(Algo::Ring));
}

/// Rewrites every contribution rank `bad` sends to a full-scale payload
/// with the largest legal scale.
fn huge_scale_attacker(bad: usize) -> collectives::sim::Tamper {
    Box::new(move |from, _to, bytes: &mut Vec<u8>| {
        if from != bad {
            return;
        }
        let m = decode(bytes).unwrap();
        if m.header.step != 0 {
            return;
        }
        let h = Header {
            scale: MAX_SCALE,
            ..m.header
        };
        let count = h.count as usize;
        let mut out = Vec::new();
        collectives::message::encode(&h, &[0xff, 0x7f].repeat(count), &mut out);
        *bytes = out;
    })
}

/// Per-rank inputs and outputs.
type Run = (Vec<Vec<f32>>, Vec<Vec<f32>>);

fn attacked(algo: Algo, clip: Option<f32>) -> Result<Run, Error> {
    let world = 6;
    let n = 5000;
    let cfg = Config {
        algo,
        codec: Codec::I16(Rounding::Nearest),
        chunk_elems: 500,
        clip,
        ..Config::default()
    };
    let mut sim = Sim::new(world, cfg, SimConfig::default()).unwrap();
    sim.set_tamper(huge_scale_attacker(3));
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n, 21)).collect();
    let mut jobs = vec![Job::new(
        Collective::all_reduce(ReduceOp::Sum),
        inputs.clone(),
    )];
    sim.run(&mut jobs)?;
    Ok((inputs, jobs.remove(0).bufs))
}

#[test]
fn clip_policy_bounds_a_huge_scale_attack() {
    let c = 1.0f32;
    // Direct: the attacker's contribution becomes exactly +C per element;
    // the honest values keep full i16 precision.
    let (inputs, out) = attacked(Algo::Direct, Some(c)).unwrap();
    // (Its own shard it reduces itself: an owner is trusted with its shard.)
    let mut expected = inputs.clone();
    let own = collectives::shard_range(inputs[0].len(), inputs.len(), 3);
    for (i, v) in expected[3].iter_mut().enumerate() {
        if !own.contains(&i) {
            *v = c;
        }
    }
    let worst = check(
        Op::AllReduce(ReduceOp::Sum),
        Algo::Direct,
        Codec::I16(Rounding::Nearest),
        &expected,
        &out,
        "clipped",
    );
    println!("direct with clip: worst error vs honest sum + C: {worst:e}");
    // Without the policy the result is destroyed: the sums overflow and
    // the owner cannot even quantize them.
    match attacked(Algo::Direct, None) {
        Err(Error::SimRank { source, .. }) => {
            assert!(matches!(*source, Error::NonFinite { .. }), "{source}")
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok((inputs, out)) => {
            let err: f64 = (0..inputs[0].len())
                .map(|i| (out[0][i] as f64 - inputs.iter().map(|x| x[i] as f64).sum::<f64>()).abs())
                .fold(0.0, f64::max);
            assert!(
                err > 1e30,
                "without clipping the attack should dominate (error {err:e})"
            );
        }
    }
    // Ring and recursive doubling: every value stays within N*C and ranks agree.
    for algo in [Algo::Ring, Algo::RecursiveDoubling] {
        let (_, out) = attacked(algo, Some(c)).unwrap();
        for r in 1..out.len() {
            assert_eq!(out[r], out[0], "{algo:?}: ranks disagree");
        }
        assert!(
            out[0].iter().all(|v| v.abs() <= 6.0 * c * 1.001),
            "{algo:?}: a value escaped the clip bound"
        );
    }
}

#[test]
fn engine_settings_out_of_range_are_refused_up_front() {
    let with = |f: fn(&mut Config)| {
        let mut cfg = Config::default();
        f(&mut cfg);
        Engine::new(0, 2, cfg).err()
    };
    for (what, err) in [
        ("chunk_elems 0", with(|c| c.chunk_elems = 0)),
        ("chunk_elems 65536", with(|c| c.chunk_elems = 65536)),
        ("clip NaN", with(|c| c.clip = Some(f32::NAN))),
        ("clip 0", with(|c| c.clip = Some(0.0))),
        // Half the sequence space or more: a stale message would pass for
        // an early one and be kept until the numbers wrapped.
        ("max_ahead 2^31", with(|c| c.max_ahead = 1 << 31)),
        ("max_ahead u32::MAX", with(|c| c.max_ahead = u32::MAX)),
    ] {
        assert!(matches!(err, Some(Error::Config(_))), "{what}: {err:?}");
    }
    assert!(with(|c| c.max_ahead = (1 << 31) - 1).is_none());
}
