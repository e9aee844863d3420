//! Arbitrary bytes never panic the decoder or the engine.

use collectives::message::{decode, encode, AlgoId, CodecId, Header, Kind};
use collectives::{Algo, Codec, Collective, Config, Engine, ReduceOp, Rounding};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn decode_accepts_only_consistent_lengths(count in 0u32..100, extra in 0usize..3, scale in any::<f32>()) {
        let h = Header { kind: Kind::AllReduce, algo: AlgoId::Ring, codec: CodecId::I16, step: 0, seq: 0, chunk: 0, offset: 0, count, scale };
        let mut out = Vec::new();
        encode(&h, &vec![0u8; 2 * count as usize + extra], &mut out);
        let ok = decode(&out).is_ok();
        // A scale of -0.0 is refused too: decoded values are never -0.
        prop_assert_eq!(ok, extra == 0 && scale.is_sign_positive() && scale <= collectives::message::MAX_SCALE);
    }

    /// Mutated valid headers and random payloads fed to a running engine:
    /// errors are fine, panics are not.
    #[test]
    fn engine_never_panics(
        algo in prop_oneof![Just(Algo::Ring), Just(Algo::Direct), Just(Algo::RecursiveDoubling)],
        i16 in any::<bool>(),
        from in 0usize..6,
        head in proptest::collection::vec(any::<u8>(), 32),
        tail in proptest::collection::vec(any::<u8>(), 0..64),
        mutate in any::<bool>(),
    ) {
        let cfg = Config { algo, codec: if i16 { Codec::I16(Rounding::Nearest) } else { Codec::F32 }, chunk_elems: 4, ..Config::default() };
        let mut e = Engine::new(1, 5, cfg).unwrap();
        let mut buf = vec![1.0f32; 23];
        e.start(Collective::all_reduce(ReduceOp::Sum), &mut buf).unwrap();
        let mut bytes = head.clone();
        if mutate {
            // Keep the header plausible so that validation runs deeper.
            bytes[0] = 0xA7;
            bytes[1] = 1;
            bytes[2] %= 5;
            bytes[3] %= 3;
            bytes[4] %= 2;
            bytes[5] = 0;
            bytes[8..12].copy_from_slice(&0u32.to_le_bytes());
            let offset = u64::from(bytes[16] % 24);
            bytes[16..24].copy_from_slice(&offset.to_le_bytes());
            let count = u32::from(bytes[24] % 8);
            bytes[24..28].copy_from_slice(&count.to_le_bytes());
            bytes[28..32].copy_from_slice(&0.01f32.to_le_bytes());
            let is_i16 = bytes[4] == 1;
            let len = count as usize * if is_i16 { 2 } else { 4 };
            bytes.extend((0..len).map(|i| tail.get(i).copied().unwrap_or(7)));
            if !is_i16 {
                bytes[28..32].copy_from_slice(&0f32.to_le_bytes());
            }
        } else {
            bytes.extend(&tail);
        }
        let _ = e.handle(from, &bytes, &mut buf);
        let _ = e.handle(from, &bytes, &mut buf);
        let _ = e.handle(from, &bytes, &mut []);
    }
}
