//! The driver over kernel UDP on 127.0.0.1, one rank per thread: results
//! against a reference, the non-blocking API, striping over several
//! connections, the rendezvous, and a dead peer.

mod common;

use common::faulty::Faulty;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use collectives::driver::mesh::COLL_ALPN;
use collectives::driver::{Background, Communicator, DriverConfig};
use collectives::{bf16, shard_range, Codec, Collective, Error, ReduceOp, Rounding};
use stack::io::kernel::{KernelUdp, KernelUdpConfig};
use stack::io::PacketIo;
use stack::quic::{CloseReason, Endpoint, Event, QuicConfig};

fn value(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13) % 64) as f32 * 0.25 - 8.0
}

/// Runs `f` on `world` ranks, each in a thread with its communicator.
fn on_ranks<T: Send + 'static>(
    world: usize,
    cfg: DriverConfig,
    f: impl Fn(Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    on_ranks_at(common::loopback_addrs(world), cfg, f)
}

/// `on_ranks` with rank r bound to `peers[r]`.
fn on_ranks_at<T: Send + 'static>(
    peers: Vec<std::net::SocketAddrV4>,
    cfg: DriverConfig,
    f: impl Fn(Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let world = peers.len();
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let (peers, cfg, f) = (peers.clone(), cfg.clone(), f.clone());
            std::thread::spawn(move || f(Communicator::new(r, world, peers, cfg).unwrap()))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn all_reduce_sizes_match_reference_and_ranks_agree() {
    let world = 4;
    let sizes = [1usize, 2, 1000, 16 * 1024 + 3, 300_000];
    let out = on_ranks(world, DriverConfig::default(), move |mut c| {
        let mut results = Vec::new();
        for &n in &sizes {
            let mut buf: Vec<f32> = (0..n).map(|i| value(c.rank(), i)).collect();
            c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            results.push(buf);
        }
        let counters = c.counters();
        c.barrier().unwrap();
        (results, counters)
    });
    for (k, &n) in sizes.iter().enumerate() {
        for i in 0..n {
            let want: f32 = (0..world).map(|r| value(r, i)).sum();
            assert!((out[0].0[k][i] - want).abs() <= 1e-6 * want.abs().max(1.0));
        }
        for r in 1..world {
            assert_eq!(out[r].0[k], out[0].0[k], "rank {r} differs at size {n}");
        }
    }
    let c = out[0].1;
    assert_eq!(c.wakeups, sizes.len() as u64);
    assert!(c.wire.packets_received > 0 && c.wire.bytes_sent > 0);
}

#[test]
fn other_collectives_and_nonblocking() {
    let world = 3;
    let n = 50_000;
    let out = on_ranks(world, DriverConfig::default(), move |mut c| {
        let r = c.rank();
        let mut rs: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
        c.reduce_scatter(&mut rs, ReduceOp::Max).unwrap();
        let mine = shard_range(n, c.world(), r);
        let rs = rs[mine.clone()].to_vec();

        let mut ag = vec![0f32; n];
        for i in mine {
            ag[i] = i as f32;
        }
        c.all_gather(&mut ag).unwrap();

        let mut bc = vec![r as f32; n];
        c.broadcast(&mut bc, 2).unwrap();

        // Two non-blocking collectives in flight, polled with test.
        let h1 = c
            .start(Collective::all_reduce(ReduceOp::Sum), vec![1.0; n])
            .unwrap();
        let h2 = c
            .start(Collective::all_reduce(ReduceOp::Avg), vec![r as f32; 7])
            .unwrap();
        while !c.test(&h2).unwrap() {}
        let a2 = c.wait(h2).unwrap();
        let a1 = c.wait(h1).unwrap();
        (rs, ag, bc, a1, a2)
    });
    for (r, (rs, ag, bc, a1, a2)) in out.iter().enumerate() {
        let mine = shard_range(n, world, r);
        for (k, i) in mine.enumerate() {
            let want = (0..world).map(|q| value(q, i)).fold(f32::MIN, f32::max);
            assert_eq!(rs[k], want);
        }
        assert!(ag.iter().enumerate().all(|(i, &x)| x == i as f32));
        assert!(bc.iter().all(|&x| x == 2.0));
        assert!(a1.iter().all(|&x| x == world as f32));
        assert!(a2.iter().all(|&x| x == 1.0), "{a2:?}");
    }
}

#[test]
fn bf16_buckets_are_reduced_in_f32_and_rounded_once() {
    // Inputs in [1, 2) with 7 fraction bits: exact in bf16, but sums of
    // three need 9 significant bits, so the result must be the exact sum
    // rounded once to bf16 (nearest, ties to even), on every rank.
    let world = 3;
    let n = 100_003;
    let input = |r: usize, i: usize| 1.0 + ((i * 7 + r * 13) % 128) as f32 / 128.0;
    let out = on_ranks(world, DriverConfig::default(), move |mut c| {
        let r = c.rank();
        let mut sum: Vec<bf16> = (0..n).map(|i| bf16::from_f32(input(r, i))).collect();
        c.all_reduce_bf16(&mut sum, ReduceOp::Sum).unwrap();
        let mut bc = vec![bf16::from_f32(r as f32 + 0.5); 11];
        c.run_bf16(Collective::broadcast(1), &mut bc).unwrap();
        (sum, bc)
    });
    let rounded = (0..n).filter(|&i| {
        let exact: f32 = (0..world).map(|r| input(r, i)).sum();
        bf16::from_f32(exact).to_f32() != exact
    });
    assert!(rounded.count() > n / 2, "the inputs must exercise rounding");
    for (r, (sum, bc)) in out.iter().enumerate() {
        for (i, got) in sum.iter().enumerate() {
            let exact: f64 = (0..world).map(|q| f64::from(input(q, i))).sum();
            assert_eq!(*got, bf16::from_f64(exact), "rank {r} element {i}");
        }
        assert_eq!(*bc, vec![bf16::from_f32(1.5); 11], "rank {r}");
    }
}

/// Ranks on one host share its address, and every rank dials at once: a
/// rank accepts more handshakes from that one address than QUIC's
/// per-address limit (16) would let in, and none of them may be turned
/// away (each one dropped costs its dialler a probe timeout, a second or
/// more).
#[test]
fn many_connections_from_one_address_are_all_let_in_at_once() {
    let cfg = DriverConfig {
        conns_per_peer: 40,
        ..DriverConfig::default()
    };
    let out = on_ranks(2, cfg, move |mut c| {
        let mut buf = vec![1.0f32; 4096];
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf, vec![2.0; 4096]);
        c.counters().handshakes_dropped
    });
    // Rank 1 took 40 handshakes from 127.0.0.1, most of them at once.
    assert_eq!(out, vec![0, 0]);
}

#[test]
fn striped_over_four_connections_per_peer() {
    let cfg = DriverConfig {
        conns_per_peer: 4,
        ..DriverConfig::default()
    };
    let n = 1 << 20;
    let out = on_ranks(2, cfg, move |mut c| {
        let mut buf: Vec<f32> = (0..n).map(|i| value(c.rank(), i)).collect();
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        let peer = 1 - c.rank();
        (buf, c.bytes_per_connection(peer))
    });
    assert_eq!(out[0].0, out[1].0);
    assert!(out[0]
        .0
        .iter()
        .enumerate()
        .all(|(i, &x)| x == value(0, i) + value(1, i)));
    // Each rank sent its 2 MiB over all four connections, evenly (messages
    // go round robin; the hello adds a few bytes to one of them).
    for (r, (_, per_conn)) in out.iter().enumerate() {
        assert_eq!(per_conn.len(), 4, "rank {r}: {per_conn:?}");
        let total: u64 = per_conn.iter().sum();
        assert!(total >= 2 << 20, "rank {r}: {per_conn:?}");
        for &b in per_conn {
            // An even share is a quarter; ask for at least a fifth.
            assert!(b * 5 >= total, "rank {r}: uneven stripes {per_conn:?}");
        }
    }
}

#[test]
fn dead_peer_fails_with_a_clear_error() {
    let world = 3;
    let cfg = DriverConfig {
        timeout: Duration::from_secs(1),
        ..DriverConfig::default()
    };
    let out = on_ranks(world, cfg, move |mut c| {
        if c.rank() == 2 {
            // Dies silently: the socket stays open, nothing answers.
            std::mem::forget(c);
            return None;
        }
        let start = Instant::now();
        let mut buf = vec![1.0f32; 100_000];
        let err = c.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
        let again = c.barrier().unwrap_err();
        // Kept open until every rank has failed on its own.
        Some((err, again, start.elapsed(), c))
    });
    for (r, o) in out.into_iter().enumerate().take(2) {
        let (err, again, took, _comm) = o.unwrap();
        assert!(took < Duration::from_secs(10), "rank {r} took {took:?}");
        match &err {
            Error::PeerTimeout { rank, .. } => assert_eq!(*rank, 2, "{err}"),
            other => panic!("rank {r}: expected a peer timeout, got {other}"),
        }
        assert!(err.to_string().contains("rank 2"), "{err}");
        assert!(matches!(again, Error::Failed(_)), "{again}");
    }
}

#[test]
fn shutdown_with_a_collective_not_waited_for_leaves_at_once_and_says_so() {
    // Rank 0 starts an all-reduce and shuts down without waiting for it;
    // the peer runs the same all-reduce. Rank 0 must not linger for the
    // timeout with its collective half done, and must say what it left.
    let cfg = DriverConfig {
        timeout: Duration::from_secs(4),
        ..DriverConfig::default()
    };
    let out = on_ranks(2, cfg, |mut c| {
        let t = Instant::now();
        let r = if c.rank() == 0 {
            let _h = c
                .start(Collective::all_reduce(ReduceOp::Sum), vec![1.0; 1 << 20])
                .unwrap();
            c.shutdown()
        } else {
            let mut buf = vec![1.0f32; 1 << 20];
            c.all_reduce(&mut buf, ReduceOp::Sum)
        };
        (r, t.elapsed())
    });
    let (r0, t0) = &out[0];
    let err = r0
        .as_ref()
        .expect_err("an abandoned collective is an error");
    assert!(err.to_string().contains("not waited for"), "{err}");
    assert!(*t0 < Duration::from_secs(2), "rank 0 lingered {t0:?}");
    // The peer cannot finish it either: told that rank 0 left (its
    // goodbye, or its close when the goodbye is stuck behind unsent
    // data), it fails at once rather than at its timeout. When neither
    // reaches it before rank 0's socket is gone (a loaded host: one CI
    // run in many), it learns from the closed port (ICMP), which says
    // the same about rank 0.
    let (r1, t1) = &out[1];
    let err = r1.as_ref().expect_err("rank 0 abandoned the collective");
    assert!(
        matches!(
            err,
            Error::PeerLeft {
                rank: 0,
                failed: true,
                ..
            } | Error::PeerClosed { rank: 0, .. }
                | Error::PeerGone { rank: 0, .. }
        ),
        "{err}"
    );
    assert!(*t1 < Duration::from_secs(3), "rank 1 took {t1:?}");
}

#[test]
fn ranks_that_issue_different_collectives_fail_and_stay_failed() {
    // Rank 1 broadcasts while rank 0, a little later, all-reduces the
    // same collective number: rank 0 finds rank 1's early messages do not
    // fit when it starts. It is out of step with its peer from then on,
    // so later calls must say it failed (not that it is busy).
    let cfg = DriverConfig {
        timeout: Duration::from_secs(2),
        ..DriverConfig::default()
    };
    let out = on_ranks(2, cfg, |mut c| {
        let mut buf = vec![1.0f32; 64];
        if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(300));
            let first = c
                .all_reduce(&mut buf, ReduceOp::Sum)
                .map_err(|e| e.to_string());
            let next = c.barrier().map_err(|e| e.to_string());
            Some((first, next))
        } else {
            let _ = c.broadcast(&mut buf, 1);
            None
        }
    });
    let (first, next) = out[0].clone().unwrap();
    let first = first.expect_err("different collectives cannot both complete");
    assert!(first.contains("different collectives"), "{first}");
    let next = next.expect_err("a rank out of step refuses more work");
    assert!(next.contains("failed"), "{next}");
}

/// Settings the driver cannot honour are refused with the field named,
/// before anything binds: a zero `max_pending_bytes` hung every collective
/// (nothing ever left the engine), `Duration::MAX` as "no timeout"
/// panicked at the first deadline, and a zero timeout failed every
/// collective at once.
#[test]
fn settings_the_driver_cannot_honour_are_refused_up_front() {
    type Spoil = fn(&mut DriverConfig);
    let bad: [(&str, Spoil); 6] = [
        ("conns_per_peer", |c| c.conns_per_peer = 0),
        ("timeout", |c| c.timeout = Duration::ZERO),
        ("timeout", |c| c.timeout = Duration::MAX),
        ("connect_timeout", |c| c.connect_timeout = Duration::ZERO),
        ("connect_timeout", |c| c.connect_timeout = Duration::MAX),
        ("max_pending_bytes", |c| c.max_pending_bytes = 0),
    ];
    for (field, spoil) in bad {
        let mut cfg = DriverConfig::default();
        spoil(&mut cfg);
        match Communicator::new(0, 2, common::loopback_addrs(2), cfg) {
            Err(Error::Config(why)) => assert!(why.starts_with(field), "{field}: {why}"),
            Err(e) => panic!("{field}: expected a config error, got {e}"),
            Ok(_) => panic!("{field}: accepted"),
        }
    }
    let fine = DriverConfig {
        timeout: collectives::driver::MAX_TIMEOUT,
        max_pending_bytes: 1,
        ..DriverConfig::default()
    };
    let mut c = Communicator::new(0, 1, common::loopback_addrs(1), fine).unwrap();
    let mut buf = vec![1.0f32; 10];
    c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
    assert_eq!(buf, vec![1.0; 10]);
}

#[test]
fn a_rank_whose_i16_input_is_not_finite_fails_and_its_peer_is_told() {
    // A NaN cannot be quantized: rank 0's all-reduce fails as it begins,
    // after the collective took its number. Rank 0 is then out of step
    // with rank 1 for good, so it must refuse more work, and rank 1 must
    // hear that rank 0's collective failed instead of waiting for it.
    let mut cfg = DriverConfig {
        timeout: Duration::from_secs(20),
        ..DriverConfig::default()
    };
    cfg.engine.codec = Codec::I16(Rounding::Nearest);
    let out = on_ranks(2, cfg, |mut c| {
        let t = Instant::now();
        let mut buf: Vec<f32> = (0..1000).map(|i| value(c.rank(), i)).collect();
        if c.rank() == 0 {
            buf[5] = f32::NAN;
            let first = c.all_reduce(&mut buf, ReduceOp::Sum);
            let next = c.all_reduce(&mut buf, ReduceOp::Sum);
            (first, Some(next), t.elapsed())
        } else {
            (c.all_reduce(&mut buf, ReduceOp::Sum), None, t.elapsed())
        }
    });
    let (first, next, _) = &out[0];
    assert!(
        matches!(first, Err(Error::NonFinite { index: 5, .. })),
        "{first:?}"
    );
    let next = next.as_ref().unwrap();
    assert!(
        matches!(next, Err(Error::Failed(e)) if matches!(**e, Error::NonFinite { .. })),
        "rank 0 must refuse more work: {next:?}"
    );
    let (r1, _, t1) = &out[1];
    assert!(
        matches!(
            r1,
            Err(Error::PeerLeft {
                rank: 0,
                failed: true,
                ..
            })
        ),
        "{r1:?}"
    );
    assert!(*t1 < Duration::from_secs(5), "rank 1 took {t1:?}");
}

/// Rank `r` of a world of two at `peers`, on its own thread: one exact
/// all-reduce of 1000 elements, then shutdown.
fn one_all_reduce_of_two(
    r: usize,
    peers: &[std::net::SocketAddrV4],
) -> std::thread::JoinHandle<Result<(), Error>> {
    let peers = peers.to_vec();
    std::thread::spawn(move || {
        let mut c = Communicator::new(r, 2, peers, DriverConfig::default())?;
        let mut buf = vec![1.0f32; 1000];
        c.all_reduce(&mut buf, ReduceOp::Sum)?;
        assert_eq!(buf, vec![2.0; 1000]);
        c.shutdown()
    })
}

/// `body` with the mesh's length prefix.
fn framed(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// The frame a dialler says first: "I am rank 0".
fn hello_of_rank_0() -> Vec<u8> {
    let mut body = b"AINFTPH1".to_vec();
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    framed(&body)
}

/// What a stranger does once its handshake is done.
enum Stranger<'a> {
    /// Sends these bytes on stream 0 (nothing, for none).
    Sends(&'a [u8]),
    /// Sends a byte on stream 0, then resets it.
    Resets,
}

/// A QUIC client that is not a rank (no certificates: anyone can finish
/// the handshake) connects to `target` with the mesh's ALPN and does
/// what `does` says; returns how its
/// connection ended within 20 s.
fn stranger(target: std::net::SocketAddrV4, does: Stranger<'_>) -> Option<CloseReason> {
    let local = "127.0.0.1:0".parse().unwrap();
    let mut io = KernelUdp::bind(local, KernelUdpConfig::default()).unwrap();
    let cfg = QuicConfig {
        alpn: vec![COLL_ALPN.to_vec()],
        ..QuicConfig::default()
    };
    let mut ep = Endpoint::client(cfg, 0, io.max_payload()).unwrap();
    let conn = ep.connect(io.local_addr(), target, None).unwrap();
    let (mut tx, mut sent) = (Vec::new(), false);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        ep.drive(&mut io, &mut tx);
        if ep.is_established(conn) && !sent {
            sent = match does {
                Stranger::Sends([]) => true,
                Stranger::Sends(bytes) => ep.stream_send(conn, 0, bytes, false).is_ok(),
                Stranger::Resets => {
                    ep.stream_send(conn, 0, b"x", false).is_ok()
                        && ep
                            .connection_mut(conn)
                            .unwrap()
                            .stream_shutdown(0, quiche::Shutdown::Write, 7)
                            .is_ok()
                }
            };
        }
        while let Some(e) = ep.poll_event() {
            if let Event::Closed { reason, .. } = e {
                return Some(reason);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// A connection that breaks the mesh's protocol before saying which rank
/// it is (a bad hello, a length prefix past the limit, no hello in 10 s, a
/// reset stream, a hello for a rank that has its connections) is closed
/// with code 1, and the job goes on: it used to fail every collective of
/// the rank it reached (Error::Framing, Error::Transport for a reset), a
/// silent one stayed until newer ones pushed it out, and a false hello
/// took a place among the rank's connections.
#[test]
fn a_stranger_that_connects_and_sends_junk_is_refused_and_the_job_goes_on() {
    let peers = common::loopback_addrs(2);
    let target = peers[1];
    let strangers_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = strangers_done.clone();
    let strangers = std::thread::spawn(move || {
        let mut bad_hello = 16u32.to_le_bytes().to_vec();
        bad_hello.extend_from_slice(b"NOT A HELLO FRAM");
        let too_long = u32::MAX.to_le_bytes().to_vec();
        // Within the limit of a rank's frames (16 MiB), far beyond a hello.
        let big = (16u32 << 20).to_le_bytes().to_vec();
        // Rank 0's hello: rank 0 is connected already (one connection).
        let rank_0 = hello_of_rank_0();
        let ends = [
            stranger(target, Stranger::Sends(&bad_hello)),
            stranger(target, Stranger::Sends(&too_long)),
            stranger(target, Stranger::Sends(&[])),
            stranger(target, Stranger::Resets),
            stranger(target, Stranger::Sends(&big)),
            stranger(target, Stranger::Sends(&rank_0)),
        ];
        done.store(true, std::sync::atomic::Ordering::Release);
        ends
    });
    let out = on_ranks_at(peers, DriverConfig::default(), move |mut c| {
        let (mut rounds, mut after) = (0, 0);
        // Collectives while the strangers come and go, and a few after;
        // the last element carries each rank's "they are done", so that
        // both ranks stop after the same collective.
        while after < 3 {
            let mut buf: Vec<f32> = (0..5000).map(|i| value(c.rank(), i)).collect();
            buf.push(f32::from(u8::from(
                strangers_done.load(std::sync::atomic::Ordering::Acquire),
            )));
            c.all_reduce(&mut buf, ReduceOp::Sum)?;
            assert_eq!(buf[7], value(0, 7) + value(1, 7));
            rounds += 1;
            if buf[5000] > 0.0 {
                after += 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let refused = c.counters().connections_refused;
        c.shutdown()?;
        Ok::<_, Error>((rounds, refused))
    });
    for (rank, r) in out.iter().enumerate() {
        assert!(r.is_ok(), "rank {rank}: {r:?}");
    }
    // Rank 1 counted every stranger it turned away.
    assert_eq!(out[1].as_ref().unwrap().1, 6);
    for (k, end) in strangers.join().unwrap().into_iter().enumerate() {
        match end {
            Some(CloseReason::Peer {
                app: true,
                code: 1,
                reason,
            }) => {
                let why = String::from_utf8_lossy(&reason);
                let want = [
                    "hello",
                    "exceeds the limit",
                    "said no hello within 10 s",
                    "its stream failed",
                    "16777216 bytes exceeds the limit of 16",
                    "rank 0 has its 1 connection(s) already",
                ][k];
                assert!(why.contains(want), "stranger {k}: {why}");
            }
            other => panic!("stranger {k}: expected a refusal, got {other:?}"),
        }
    }
}

/// What a peer may open on a rank's connection: the one stream of a
/// link, no other stream and no DATAGRAM frames (nothing would read them;
/// a stranger could park up to the connection window in each).
#[test]
fn a_peer_may_open_one_stream_and_no_datagrams_on_a_ranks_connection() {
    let peers = common::loopback_addrs(2);
    let rank = |r: usize| one_all_reduce_of_two(r, &peers);
    // Rank 1 accepts; a stranger connects before rank 0.
    let rank1 = rank(1);
    let mut s = HeldStranger::connect(peers[1]);
    drive_for(&mut [&mut s], Duration::from_secs(10), |s| {
        s[0].ep.is_established(s[0].conn)
    });
    let q = s.ep.connection_mut(s.conn).unwrap();
    assert_eq!(q.peer_streams_left_bidi(), 1);
    assert_eq!(q.peer_streams_left_uni(), 0);
    assert_eq!(q.dgram_max_writable_len(), None);
    let rank0 = rank(0);
    let (r0, r1) = (rank0.join().unwrap(), rank1.join().unwrap());
    assert!(r0.is_ok() && r1.is_ok(), "{r0:?} {r1:?}");
}

/// Strangers that finish the handshake and then say nothing cannot keep a
/// rank out: past `world x conns_per_peer` unidentified connections the
/// oldest is closed, not the newest (which may be the rank); and the
/// ranks' shutdown does not wait for them.
#[test]
fn silent_strangers_that_connect_first_do_not_keep_a_rank_out() {
    let peers = common::loopback_addrs(2);
    let rank = |r: usize| one_all_reduce_of_two(r, &peers);
    // Rank 1 accepts; three strangers get in before rank 0 dials (the
    // cap is 2 x 1), one after another.
    let rank1 = rank(1);
    let mut strangers: Vec<HeldStranger> = Vec::new();
    for _ in 0..3 {
        strangers.push(HeldStranger::connect(peers[1]));
        let mut held: Vec<&mut HeldStranger> = strangers.iter_mut().collect();
        drive_for(&mut held, Duration::from_secs(10), |s| {
            s.last().is_some_and(|s| s.ep.is_established(s.conn))
        });
        let last = strangers.last().unwrap();
        assert!(last.ep.is_established(last.conn), "a stranger's handshake");
    }
    let mut held: Vec<&mut HeldStranger> = strangers.iter_mut().collect();
    drive_for(&mut held, Duration::from_millis(100), |_| false);
    let t = Instant::now();
    let rank0 = rank(0);
    // The strangers stay up, answering, while the ranks run.
    drive_for(&mut held, Duration::from_secs(10), |_| {
        rank0.is_finished() && rank1.is_finished()
    });
    let (r0, r1) = (rank0.join().unwrap(), rank1.join().unwrap());
    // Shutting down waits for ranks only, not for the strangers.
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(r0.is_ok(), "rank 0: {r0:?}");
    assert!(r1.is_ok(), "rank 1: {r1:?}");
    // The third stranger pushed the first out, rank 0 the second; the
    // third was closed when rank 1 left.
    drive_for(&mut held, Duration::from_secs(10), |s| {
        s.iter().all(|s| s.end.is_some())
    });
    let refused: Vec<bool> = held.iter().map(|s| s.refused_as_one_too_many()).collect();
    assert_eq!(
        refused,
        [true, true, false],
        "{:?}",
        held.iter().map(|s| &s.end).collect::<Vec<_>>()
    );
}

/// A stranger held open from the test's thread: its own socket and
/// client endpoint, driven by `drive`.
struct HeldStranger {
    io: KernelUdp,
    ep: Endpoint<<KernelUdp as PacketIo>::Buf>,
    conn: stack::quic::ConnHandle,
    tx: Vec<<KernelUdp as PacketIo>::Buf>,
    end: Option<CloseReason>,
}

impl HeldStranger {
    fn connect(target: std::net::SocketAddrV4) -> HeldStranger {
        let local = "127.0.0.1:0".parse().unwrap();
        let io = KernelUdp::bind(local, KernelUdpConfig::default()).unwrap();
        let cfg = QuicConfig {
            alpn: vec![COLL_ALPN.to_vec()],
            ..QuicConfig::default()
        };
        let mut ep = Endpoint::client(cfg, 0, io.max_payload()).unwrap();
        let conn = ep.connect(io.local_addr(), target, None).unwrap();
        HeldStranger {
            io,
            ep,
            conn,
            tx: Vec::new(),
            end: None,
        }
    }

    fn drive(&mut self) {
        self.ep.drive(&mut self.io, &mut self.tx);
        while let Some(e) = self.ep.poll_event() {
            if let Event::Closed { reason, .. } = e {
                self.end.get_or_insert(reason);
            }
        }
    }

    fn refused_as_one_too_many(&self) -> bool {
        matches!(&self.end, Some(CloseReason::Peer { app: true, code: 1, reason })
            if String::from_utf8_lossy(reason).contains("too many connections"))
    }
}

/// Drives `strangers` for `d`, or until `until` holds.
fn drive_for(
    strangers: &mut [&mut HeldStranger],
    d: Duration,
    until: impl Fn(&[&mut HeldStranger]) -> bool,
) {
    let t = Instant::now();
    while t.elapsed() < d && !until(strangers) {
        for s in strangers.iter_mut() {
            s.drive();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Past the cap on connections that said no hello, the one that came
/// first goes, by arrival: also when a newer one took the place of a
/// stranger that closed (the link table reuses it, so the newer one sits
/// before the older in it).
#[test]
fn past_the_cap_the_oldest_stranger_goes_even_behind_a_newer_one_in_a_reused_place() {
    let peers = common::loopback_addrs(2);
    let rank = |r: usize| one_all_reduce_of_two(r, &peers);
    // Rank 1 accepts; the cap is 2 ranks x 1 connection.
    let rank1 = rank(1);
    let established = |s: &[&mut HeldStranger]| s.iter().all(|s| s.ep.is_established(s.conn));
    let mut first = HeldStranger::connect(peers[1]);
    let mut older = HeldStranger::connect(peers[1]);
    drive_for(
        &mut [&mut first, &mut older],
        Duration::from_secs(10),
        established,
    );
    // The first leaves; its place at rank 1 is free once rank 1 has seen
    // the close (after its draining period).
    first.ep.close(first.conn, 0, b"bye").unwrap();
    drive_for(
        &mut [&mut first, &mut older],
        Duration::from_secs(2),
        |_| false,
    );
    let mut newer = HeldStranger::connect(peers[1]);
    drive_for(
        &mut [&mut newer, &mut older],
        Duration::from_secs(10),
        established,
    );
    drive_for(
        &mut [&mut newer, &mut older],
        Duration::from_millis(100),
        |_| false,
    );
    // Rank 0 comes in past the cap: the older stranger must go.
    let rank0 = rank(0);
    // Each learns how it ended once its draining period is over (3 PTOs,
    // its own): the older one's refusal may surface after the newer one's
    // close at the ranks' shutdown.
    drive_for(
        &mut [&mut newer, &mut older],
        Duration::from_secs(10),
        |s| s.iter().all(|s| s.end.is_some()),
    );
    let (r0, r1) = (rank0.join().unwrap(), rank1.join().unwrap());
    assert!(r0.is_ok(), "rank 0: {r0:?}");
    assert!(r1.is_ok(), "rank 1: {r1:?}");
    assert!(
        older.refused_as_one_too_many(),
        "older: {:?}, newer: {:?}",
        older.end,
        newer.end
    );
    assert!(!newer.refused_as_one_too_many(), "newer: {:?}", newer.end);
}

#[test]
fn a_peer_that_leaves_mid_collective_is_named_with_its_goodbye() {
    // Rank 1 drops its communicator in the middle of a large all-reduce:
    // it closes its connections with frames still queued (no FIN), so its
    // goodbye frame is discarded, but the close carries it. Rank 0 must
    // report that rank 1 left mid-collective, not a transport error about
    // a connection it can no longer find, nor a timeout.
    let cfg = DriverConfig {
        timeout: Duration::from_secs(10),
        ..DriverConfig::default()
    };
    let out = on_ranks(2, cfg, |mut c| {
        let t = Instant::now();
        if c.rank() == 1 {
            let h = c
                .start(Collective::all_reduce(ReduceOp::Sum), vec![1.0; 4 << 20])
                .unwrap();
            while c.counters().wire.bytes_sent < 1 << 20 {
                let _ = c.test(&h);
            }
            drop(c);
            None
        } else {
            let mut buf = vec![1.0f32; 4 << 20];
            Some((
                c.all_reduce(&mut buf, ReduceOp::Sum)
                    .map_err(|e| e.to_string()),
                t.elapsed(),
            ))
        }
    });
    let (r0, took) = out[0].clone().unwrap();
    let err = r0.expect_err("the peer left");
    assert!(
        err.starts_with("rank 1 (") && err.contains("left after completing 0 collective(s)"),
        "{err}"
    );
    assert!(err.contains("its own collective failed"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_rank_that_runs_fewer_collectives_is_named_at_once() {
    // Uneven inputs: rank 1 runs one all-reduce and shuts down, rank 0
    // runs two. Rank 0's second cannot complete; it must say that rank 1
    // left (and after how many), not wait out its 20 s timeout. Rank 1's
    // shutdown, which waits for its peers to finish, returns then too.
    let cfg = DriverConfig {
        timeout: Duration::from_secs(20),
        ..DriverConfig::default()
    };
    let out = on_ranks(2, cfg, |mut c| {
        let mut buf = vec![1.0f32; 1000];
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        let t = Instant::now();
        let r = if c.rank() == 0 {
            c.all_reduce(&mut buf, ReduceOp::Sum)
        } else {
            c.shutdown()
        };
        (r, t.elapsed())
    });
    let (r0, t0) = &out[0];
    match r0 {
        Err(Error::PeerLeft {
            rank: 1,
            completed: 1,
            seq: 1,
            failed: false,
            ..
        }) => {}
        other => panic!("rank 0: expected rank 1 to have left, got {other:?}"),
    }
    let msg = r0.as_ref().unwrap_err().to_string();
    assert!(
        msg.contains("rank 1") && msg.contains("every rank must run the same collectives"),
        "{msg}"
    );
    assert!(*t0 < Duration::from_secs(3), "rank 0 took {t0:?}");
    let (r1, t1) = &out[1];
    assert!(r1.is_ok(), "{r1:?}");
    assert!(
        *t1 < Duration::from_secs(3),
        "rank 1's shutdown took {t1:?}"
    );
}

#[test]
fn a_shutdown_that_waits_out_a_busy_peer_says_it_has_not_finished() {
    // Rank 0 computes (does not call in) while rank 1 shuts down: rank 1
    // waits its timeout for rank 0 to finish and says so, not that rank 0
    // "sent nothing during collective 1" (it ran none).
    let cfg = DriverConfig {
        timeout: Duration::from_millis(500),
        ..DriverConfig::default()
    };
    let out = on_ranks(2, cfg, |mut c| {
        let mut buf = vec![1.0f32; 1000];
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(1500));
            drop(c);
            return None;
        }
        Some(c.shutdown())
    });
    match &out[1] {
        Some(Err(Error::PeerUnfinished {
            rank: 0,
            completed: 1,
            waited_ms: 500,
            ..
        })) => {}
        other => panic!("rank 1: expected rank 0 unfinished, got {other:?}"),
    }
}

/// A TCP port free on 127.0.0.1 (for a rendezvous).
fn a_free_tcp_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Rank 0 of a world of two, through the rendezvous on `master_port`
/// (rank 1 is the caller's to play), with `connect_timeout`: how it
/// failed, and when.
fn rank_0_of_two_fails(master_port: u16, connect_timeout: Duration) -> (Error, Duration) {
    let env = collectives::driver::RankEnv {
        rank: 0,
        world: 2,
        master_addr: "127.0.0.1".into(),
        master_port,
        lane: collectives::driver::Lane::ONLY,
        job: None,
    };
    let cfg = DriverConfig {
        connect_timeout,
        ..DriverConfig::default()
    };
    let io = stack::io::kernel::KernelUdp::bind("127.0.0.1:0".parse().unwrap(), cfg.udp.clone())
        .unwrap();
    let advertise = io.local_addr();
    let t = Instant::now();
    let err = Communicator::from_env_with_at(&env, io, advertise, cfg)
        .err()
        .expect("rank 0 cannot connect to rank 1");
    (err, t.elapsed())
}

#[test]
fn the_rendezvous_and_the_connections_share_one_connect_timeout() {
    // Rank 1 checks in late (1.5 s) with an address where a socket sits
    // that never answers: rank 0 must give up when its 3 s budget is
    // spent, not 3 s after the rendezvous, and say how long it tried.
    use std::io::{Read, Write};
    let master_port = a_free_tcp_port();
    let mute = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mute_addr = mute.local_addr().unwrap();
    let late_rank = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let mut s = std::net::TcpStream::connect(("127.0.0.1", master_port)).unwrap();
        writeln!(s, "ainftp-rdv/5 1 2 {mute_addr} 0/1 -").unwrap();
        let mut table = String::new();
        let _ = s.read_to_string(&mut table);
        table
    });
    let (err, took) = rank_0_of_two_fails(master_port, Duration::from_secs(3));
    match &err {
        Error::ConnectTimeout { missing, waited_ms } => {
            assert_eq!(missing, &[1]);
            assert!((2900..4000).contains(waited_ms), "{err}");
        }
        other => panic!("expected a connect timeout, got {other}"),
    }
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert!(late_rank.join().unwrap().starts_with("ok 2"));
    drop(mute);
}

#[test]
fn a_peer_that_binds_late_is_not_taken_for_dead() {
    // Rank 0 dials before rank 1 has bound its socket: the kernel answers
    // its first handshake packets with ICMP port unreachable. Once rank 1
    // is up and answers, that must not count as a dead rank 1.
    let peers = common::loopback_addrs(2);
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let peers = peers.clone();
            std::thread::spawn(move || {
                if r == 1 {
                    std::thread::sleep(Duration::from_millis(500));
                }
                let mut c = Communicator::new(r, 2, peers, DriverConfig::default()).unwrap();
                let mut buf = vec![1.0f32; 1000];
                c.all_reduce(&mut buf, ReduceOp::Sum).map(|()| buf[0])
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), Ok(2.0), "rank {r}");
    }
}

/// A 3 s timeout, and 1 MiB of flow-control credit per stream and
/// connection: a peer that does not read holds its sender back soon.
fn one_mib_of_credit() -> DriverConfig {
    let mut cfg = DriverConfig {
        timeout: Duration::from_secs(3),
        ..DriverConfig::default()
    };
    cfg.quic.stream_window = 1 << 20;
    cfg.quic.connection_window = 1 << 20;
    cfg
}

#[test]
fn a_root_waiting_on_a_slow_peer_to_drain_naps_instead_of_spinning() {
    // The root of a broadcast is done once its data is queued; what QUIC
    // has not taken yet waits on the peer's flow control while the peer
    // is away (here 1.5 s). That wait must sleep, also past the time a
    // liveness ping would have been due (a quarter of the 3 s timeout):
    // pings are not sent outside a collective, and a past ping time once
    // made every wait return at once.
    // 1 MiB of credit from the sleeping peer, for 4 MiB of data.
    let n = 1 << 20;
    let out = on_ranks(2, one_mib_of_credit(), move |mut c| {
        let mut buf = vec![c.rank() as f32; n];
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        let before = c.counters().idle_waits;
        let start = Instant::now();
        c.broadcast(&mut buf, 0).unwrap();
        let (waits, took) = (c.counters().idle_waits - before, start.elapsed());
        // The root keeps the traffic moving until the peer has it all.
        c.barrier().unwrap();
        (waits, took, buf[n - 1], c)
    });
    let (root_waits, root_took, _, _) = &out[0];
    assert!(
        *root_took > Duration::from_millis(1000),
        "the root waited for the peer to drain: {root_took:?}"
    );
    // A nap each LONGEST_NAP or QUIC timer: dozens; a spin: many thousands.
    assert!(
        *root_waits < 2000,
        "{root_waits} idle waits in {root_took:?}"
    );
    assert_eq!(out[1].2, 0.0, "rank 1 got the root's data");
}

#[test]
fn a_broadcast_root_may_run_any_number_of_collectives_ahead() {
    // A broadcast's root waits for nobody: it runs ahead as far as the
    // driver and QUIC take its data (here 200 broadcasts of 4 KiB). Rank
    // 1's progress thread reads it while the caller is busy elsewhere; the
    // engine keeps at most 64 collectives' messages early, and the rest
    // wait in the stream until rank 1 catches up. They once failed it
    // with TooFarAhead.
    const ROUNDS: usize = 200;
    let n = 1024;
    let out = on_ranks(2, DriverConfig::default(), move |c| {
        if c.rank() == 0 {
            let mut c = c;
            for k in 0..ROUNDS {
                c.broadcast(&mut vec![k as f32; n], 0).unwrap();
            }
            c.barrier().unwrap();
            return (0, 0);
        }
        let mut bg = Background::spawn(c, None).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let mut wrong = 0;
        for k in 0..ROUNDS {
            let got = bg.run(Collective::broadcast(0), vec![-1.0; n]).unwrap();
            wrong += got.iter().filter(|&&x| x != k as f32).count();
        }
        bg.barrier().unwrap();
        (wrong, bg.counters().unwrap().frames_held_back)
    });
    assert_eq!(out[1].0, 0, "rank 1 got every broadcast's data");
    assert!(
        out[1].1 > 0,
        "the root ran more than 64 ahead: frames were held back"
    );
}

#[test]
fn a_broadcast_root_whose_receiver_left_fails_instead_of_waiting_on_it() {
    // The root of a broadcast completes once its data is queued, then
    // waits (up to the timeout) for it to leave. A receiver that left,
    // here after a failure (it closes at once, taking nothing more), will
    // never take it: the root must say so, blocking or not, and not
    // report success for data nobody takes (or wait out the timeout on
    // every call for it). Non-blocking, the failure comes with the next
    // call: a waited result stays whole.
    // 1 MiB of credit for 4 MiB broadcasts: most of each waits in the
    // driver until the receiver reads.
    let n = 1 << 20;
    for blocking in [true, false] {
        let out = on_ranks(2, one_mib_of_credit(), move |mut c| {
            for k in 0..3 {
                c.broadcast(&mut vec![k as f32; n], 0).unwrap();
            }
            if c.rank() == 1 {
                // Leaves at once with a collective not waited for.
                let _h = c.start(Collective::broadcast(0), vec![0.0; n]).unwrap();
                assert!(c.shutdown().is_err());
                return None;
            }
            std::thread::sleep(Duration::from_millis(300));
            let start = Instant::now();
            let err = (3..23).find_map(|k| match blocking {
                true => c.broadcast(&mut vec![k as f32; n], 0).err(),
                false => match c.start(Collective::broadcast(0), vec![k as f32; n]) {
                    Ok(h) => c.wait(h).err(),
                    Err(e) => Some(e),
                },
            });
            Some((err, start.elapsed()))
        });
        let (err, took) = out[0].clone().unwrap();
        let left = match &err {
            Some(Error::Failed(e)) => Some(&**e),
            other => other.as_ref(),
        };
        match left {
            Some(Error::PeerLeft {
                rank: 1,
                completed: 3,
                failed: true,
                ..
            }) => {}
            other => panic!(
                "blocking {blocking}: expected rank 1's departure, got {other:?} after {took:?}"
            ),
        }
        assert!(
            took < Duration::from_secs(2),
            "blocking {blocking}: noticed after {took:?}"
        );
    }
}

#[test]
fn a_rank_that_sends_a_message_that_does_not_decode_is_named_for_it() {
    // "Rank 0" here is a QUIC client without certificates (none are
    // checked without --certs): it says rank 0's hello, then sends a
    // frame whose body is no engine message. Rank 1 fails, and its error
    // (and goodbye) blame rank 0, not nobody: the other ranks would
    // otherwise see rank 1 leave first and blame it.
    let peers = common::loopback_addrs(2);
    let rank1 = {
        let peers = peers.clone();
        std::thread::spawn(move || {
            let mut c = Communicator::new(1, 2, peers, DriverConfig::default())?;
            c.all_reduce(&mut vec![1.0f32; 1000], ReduceOp::Sum)
        })
    };
    let mut bytes = hello_of_rank_0();
    bytes.extend(framed(&[0x55; 40]));
    let mut s = HeldStranger::connect(peers[1]);
    let (start, mut sent) = (Instant::now(), false);
    while !rank1.is_finished() && start.elapsed() < Duration::from_secs(10) {
        s.drive();
        if s.ep.is_established(s.conn) && !sent {
            sent = s.ep.stream_send(s.conn, 0, &bytes, false).is_ok();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let err = rank1
        .join()
        .unwrap()
        .expect_err("rank 1 cannot use the message");
    match &err {
        Error::FromPeer {
            rank: 0, source, ..
        } => {
            assert!(matches!(**source, Error::BadMagic(0x55)), "{err}")
        }
        other => panic!("expected rank 0 named, got {other}"),
    }
    assert_eq!(err.peer_at_fault(), Some(0));
    assert!(err.to_string().starts_with("rank 0 (127.0.0.1:"), "{err}");
}

#[test]
fn a_rank_that_left_before_its_last_messages_arrived_is_named_at_once() {
    // "Rank 0" (a QUIC client without certificates) says its hello and a
    // goodbye that claims collective 0 completed, and closes: as a rank
    // does that completed it, failed in the next one and closed at once,
    // dropping what QUIC had not sent yet. Rank 1 still awaits rank 0's
    // messages of collective 0, and nothing more can come: it must say so
    // now, not after the timeout.
    let peers = common::loopback_addrs(2);
    let cfg = DriverConfig {
        timeout: Duration::from_secs(5),
        ..DriverConfig::default()
    };
    let rank1 = {
        let peers = peers.clone();
        std::thread::spawn(move || {
            let mut c = Communicator::new(1, 2, peers, cfg)?;
            let start = Instant::now();
            let r = c.all_reduce(&mut vec![1.0f32; 1000], ReduceOp::Sum);
            Ok::<_, Error>((r, start.elapsed()))
        })
    };
    // Goodbye: completed 1, failed; on the stream and on the close, as a
    // rank says it.
    let mut bye = b"AINFTPB1".to_vec();
    bye.extend_from_slice(&1u32.to_le_bytes());
    bye.extend_from_slice(&1u32.to_le_bytes());
    let mut bytes = hello_of_rank_0();
    bytes.extend(framed(&bye));
    let mut s = HeldStranger::connect(peers[1]);
    let start = Instant::now();
    let (mut sent_at, mut closed) = (None, false);
    while !rank1.is_finished() && start.elapsed() < Duration::from_secs(10) {
        s.drive();
        if s.ep.is_established(s.conn)
            && sent_at.is_none()
            && s.ep.stream_send(s.conn, 0, &bytes, false).is_ok()
        {
            sent_at = Some(Instant::now());
        }
        // Once the frames are surely in, the connection goes.
        if !closed && sent_at.is_some_and(|t| t.elapsed() > Duration::from_millis(200)) {
            closed = s.ep.close(s.conn, 0, &bye).is_ok();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (r, took) = rank1.join().unwrap().expect("rank 1 connects");
    match r {
        Err(Error::PeerLeft {
            rank: 0,
            completed: 1,
            seq: 0,
            failed: true,
            ..
        }) => {}
        other => panic!("expected rank 0's departure, got {other:?} after {took:?}"),
    }
    assert!(took < Duration::from_secs(2), "named after {took:?}");
}

#[test]
fn a_rank_that_dies_after_the_rendezvous_is_named_while_the_mesh_connects() {
    // Rank 1 checks in, reads the table and is gone (its liveness link
    // closes without a bye) before it ever connects. Rank 0 learns it
    // from the link at once, not from the connect timeout.
    use std::io::{Read, Write};
    let master_port = a_free_tcp_port();
    let mute = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mute_addr = mute.local_addr().unwrap();
    let dying_rank = std::thread::spawn(move || {
        let start = Instant::now();
        let mut s = loop {
            match std::net::TcpStream::connect(("127.0.0.1", master_port)) {
                Ok(s) => break s,
                Err(_) if start.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("rank 0 does not listen: {e}"),
            }
        };
        writeln!(s, "ainftp-rdv/5 1 2 {mute_addr} 0/1 -").unwrap();
        let mut table = [0u8; 64];
        let n = s.read(&mut table).unwrap();
        String::from_utf8_lossy(&table[..n]).into_owned()
    });
    let (err, took) = rank_0_of_two_fails(master_port, Duration::from_secs(10));
    assert!(dying_rank.join().unwrap().starts_with("ok 2"));
    match &err {
        Error::PeerLost { rank: 1, .. } => {}
        other => panic!("expected rank 1 lost, got {other} after {took:?}"),
    }
    assert!(took < Duration::from_secs(3), "took {took:?}");
    drop(mute);
}

#[test]
fn frames_held_back_are_taken_after_their_sender_closed() {
    // The root runs 70 broadcasts ahead and leaves (its close waits its
    // timeout, 0.5 s, for rank 1, which sleeps 2 s). Rank 1's progress thread reads
    // meanwhile: 64 collectives' messages early, the rest held back with
    // the root's goodbye, in rank 1's reader (small messages, many to a
    // read) or in QUIC's buffer (64 KiB ones, one to a read, which go
    // when QUIC drops the closed connection). Then the connection closes.
    // What rank 1 holds is still taken as it catches up.
    const ROUNDS: usize = 70;
    let cfg = DriverConfig {
        timeout: Duration::from_millis(500),
        ..DriverConfig::default()
    };
    for n in [16, 16 * 1024] {
        let out = on_ranks(2, cfg.clone(), move |c| {
            if c.rank() == 0 {
                let mut c = c;
                for k in 0..ROUNDS {
                    c.broadcast(&mut vec![k as f32; n], 0).unwrap();
                }
                return Ok((0, 0));
            }
            let mut bg = Background::spawn(c, None).unwrap();
            std::thread::sleep(Duration::from_millis(2000));
            let mut wrong = 0;
            for k in 0..ROUNDS {
                let got = bg.run(Collective::broadcast(0), vec![-1.0; n])?;
                wrong += got.iter().filter(|&&x| x != k as f32).count();
            }
            Ok::<_, Error>((wrong, bg.counters()?.frames_held_back))
        });
        let (wrong, held) = out[1]
            .clone()
            .unwrap_or_else(|e| panic!("{n} elements: {e}"));
        assert!(held > 0, "{n} elements: frames were held back");
        assert_eq!(wrong, 0, "{n} elements: rank 1 got every broadcast's data");
    }
}

/// Runs `f` on three ranks that meet through the rendezvous (each in a
/// thread, over a `Faulty` backend whose `cut` switch, given to `f`, loses
/// everything from then on), with `cfg`; their results in rank order.
fn three_through_the_rendezvous<T: Send + 'static>(
    cfg: DriverConfig,
    f: impl Fn(usize, Communicator<Faulty>, &AtomicBool) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let master_port = a_free_tcp_port();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            let (cfg, f) = (cfg.clone(), f.clone());
            std::thread::spawn(move || {
                let env = collectives::driver::RankEnv {
                    rank,
                    world: 3,
                    master_addr: "127.0.0.1".into(),
                    master_port,
                    lane: collectives::driver::Lane::ONLY,
                    job: None,
                };
                let inner =
                    KernelUdp::bind("127.0.0.1:0".parse().unwrap(), cfg.udp.clone()).unwrap();
                let advertise = inner.local_addr();
                let io = Faulty::new(inner);
                let cut = io.cut.clone();
                let c = Communicator::from_env_with_at(&env, io, advertise, cfg).unwrap();
                f(rank, c, &cut)
            })
        })
        .collect();
    ranks.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Starts a collective and drops the communicator: it leaves failed
/// ("dropped mid-collective"), as long as the others have not sent it
/// their part yet (their data alone would complete it, its own sends
/// being lost, and it would leave cleanly, after its linger).
fn leave_failed(mut c: Communicator<Faulty>) {
    let _h = c
        .start(Collective::all_reduce(ReduceOp::Sum), vec![1.0; 1000])
        .unwrap();
}

/// How long the other ranks wait before their next collective, so that
/// the one leaving is gone first (`leave_failed`).
const PEERS_LATER: Duration = Duration::from_millis(300);

fn eight_second_timeout() -> DriverConfig {
    DriverConfig {
        timeout: Duration::from_secs(8),
        ..DriverConfig::default()
    }
}

#[test]
fn a_failed_ranks_goodbye_reaches_its_peers_when_its_quic_close_is_lost() {
    // Three ranks complete one all-reduce. Then rank 2's path starts
    // losing everything it sends, and it leaves failed: its QUIC goodbyes
    // and close are all lost. Its liveness link still says goodbye to
    // rank 0, which tells rank 1: both must fail the next all-reduce at
    // once, naming rank 2, not after their 8 s timeout.
    let out = three_through_the_rendezvous(eight_second_timeout(), |rank, mut c, cut| {
        let mut buf = vec![1.0f32; 1000];
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf[0], 3.0);
        if rank == 2 {
            cut.store(true, Ordering::Relaxed);
            leave_failed(c);
            return None;
        }
        // Not before rank 2 is gone: with their data it could complete.
        std::thread::sleep(PEERS_LATER);
        let start = Instant::now();
        let r = c.all_reduce(&mut buf, ReduceOp::Sum);
        Some((r, start.elapsed()))
    });
    for (rank, got) in out.into_iter().enumerate().take(2) {
        let (r, took) = got.unwrap();
        let err = r.expect_err("rank 2 left");
        // Rank 1 may hear first that rank 0 left, blaming rank 2.
        assert_eq!(err.peer_at_fault(), Some(2), "rank {rank}: {err}");
        assert!(
            matches!(err, Error::PeerLeft { failed: true, .. }),
            "rank {rank}: {err}"
        );
        assert!(
            took < Duration::from_secs(3),
            "rank {rank} took {took:?}: {err}"
        );
    }
}

#[test]
fn rank_0_relays_a_goodbye_to_a_rank_that_hears_nothing_else() {
    // Ranks 0 and 2 both lose everything they send from the second
    // all-reduce on, and rank 2 leaves failed. Rank 1 hears nothing over
    // QUIC from either: only rank 0's relay (`left 2 ...`) on its
    // liveness link names rank 2, ahead of rank 0's own goodbye.
    let out = three_through_the_rendezvous(eight_second_timeout(), |rank, mut c, cut| {
        let mut buf = vec![1.0f32; 1000];
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        // Rank 0's last sends have reached rank 1 (loopback, one flight).
        std::thread::sleep(Duration::from_millis(100));
        match rank {
            2 => {
                cut.store(true, Ordering::Relaxed);
                leave_failed(c);
                None
            }
            _ => {
                if rank == 0 {
                    cut.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(PEERS_LATER);
                let start = Instant::now();
                let r = c.all_reduce(&mut buf, ReduceOp::Sum);
                Some((r, start.elapsed()))
            }
        }
    });
    let (r, took) = out[1]
        .clone()
        .map(|(r, t)| (r.map_err(|e| e.to_string()), t))
        .unwrap();
    let err = r.expect_err("rank 2 left");
    assert!(
        err.starts_with("rank 2 ("),
        "named rank 2 itself: {err} after {took:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn a_shutdown_does_not_wait_for_a_rank_whose_goodbye_came_on_its_link() {
    // Rank 2 leaves failed with its QUIC close lost. Ranks 0 and 1 then
    // shut down cleanly: they waited their whole 8 s timeout for rank 2's
    // stream to finish, which it never will.
    let out = three_through_the_rendezvous(eight_second_timeout(), |rank, mut c, cut| {
        let mut buf = vec![1.0f32; 1000];
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        if rank == 2 {
            cut.store(true, Ordering::Relaxed);
            leave_failed(c);
            return None;
        }
        // Rank 0 hears the goodbye first and relays it as its shutdown
        // starts; rank 1 has it by its own.
        std::thread::sleep(Duration::from_millis(300 + 500 * rank as u64));
        let start = Instant::now();
        let r = c.shutdown();
        Some((r, start.elapsed()))
    });
    for (rank, got) in out.into_iter().enumerate().take(2) {
        let (r, took) = got.unwrap();
        match r {
            Ok(()) | Err(Error::PeerUnfinished { rank: 2, .. }) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
        assert!(took < Duration::from_secs(3), "rank {rank} took {took:?}");
    }
}

#[test]
fn a_rank_whose_last_data_was_cut_off_is_named_once_its_goodbye_is_heard() {
    // Rank 2 roots a broadcast: its call completes once the data is
    // queued. Its path then loses everything, before QUIC sent most of
    // it, and it leaves failed with the close lost too. Its goodbye (on
    // the liveness link) says it completed the broadcast, so the others,
    // still waiting for the rest of it, must see that nothing more can
    // come from it and fail at once, not wait out their 8 s timeout.
    let n = 1 << 18;
    let out = three_through_the_rendezvous(eight_second_timeout(), move |rank, mut c, cut| {
        let mut buf = vec![rank as f32; n];
        if rank == 2 {
            c.broadcast(&mut buf, 2).unwrap();
            cut.store(true, Ordering::Relaxed);
            leave_failed(c);
            return None;
        }
        let start = Instant::now();
        let r = c.broadcast(&mut buf, 2);
        Some((r, start.elapsed()))
    });
    for (rank, got) in out.into_iter().enumerate().take(2) {
        let (r, took) = got.unwrap();
        match r {
            Err(Error::PeerLeft {
                rank: 2,
                completed: 1,
                failed: true,
                ..
            }) => {}
            // Rank 1 may hear first that rank 0 left for it.
            Err(e) if rank == 1 && e.peer_at_fault() == Some(2) => {}
            other => {
                panic!("rank {rank}: expected rank 2's departure, got {other:?} after {took:?}")
            }
        }
        assert!(took < Duration::from_secs(3), "rank {rank} took {took:?}");
    }
}
