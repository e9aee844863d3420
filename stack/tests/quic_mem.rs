//! QUIC endpoints over the in-memory network: handshakes with mutual TLS,
//! the perf protocol's streams and datagrams, close codes, refusal of
//! outsiders, Retry, floods, and the quic-interop-runner cases that the
//! impaired link can express (loss, reordering, duplication, corruption,
//! blackhole).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use stack::io::impair::ImpairConfig;
use stack::io::memory::{MemDatagram, MemEndpoint, MemNet};
use stack::io::PacketIo;
use stack::quic::perf::{
    request, ClientStream, PerfServer, MODE_DISCARD, MODE_ECHO, MODE_SOURCE, PERF_ALPN,
};
use stack::quic::{CloseReason, ConnHandle, Endpoint, Event, QuicConfig, Trust, HANDSHAKE_GRACE};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const PORT: u16 = 4433;

mod common;
use common::{cluster, perf_node_config as node_config};

struct Side {
    ep: Endpoint<MemDatagram>,
    io: MemEndpoint,
    tx: Vec<MemDatagram>,
    /// While set, everything received is thrown away (a cut link).
    blackhole: bool,
}

impl Side {
    fn drive(&mut self) -> usize {
        if self.blackhole {
            let mut junk = Vec::new();
            self.io.recv_burst(&mut junk, usize::MAX);
        }
        self.ep.drive(&mut self.io, &mut self.tx)
    }
}

struct Pair {
    server: Side,
    client: Side,
    app: PerfServer,
    conn: ConnHandle,
    buf: Vec<u8>,
}

impl Pair {
    fn new(server_cfg: QuicConfig, client_cfg: QuicConfig, link: ImpairConfig) -> Pair {
        let net = MemNet::with_mtu(1500);
        let sio = net.endpoint(SERVER_IP, link).unwrap();
        let cio = net
            .endpoint(
                CLIENT_IP,
                ImpairConfig {
                    seed: link.seed + 1,
                    ..link
                },
            )
            .unwrap();
        let server = Endpoint::server(server_cfg, 0, sio.max_payload()).unwrap();
        let mut client = Endpoint::client(client_cfg, 0, cio.max_payload()).unwrap();
        let conn = client
            .connect(
                SocketAddrV4::new(CLIENT_IP, 50000),
                SocketAddrV4::new(SERVER_IP, PORT),
                Some("server"),
            )
            .unwrap();
        Pair {
            server: Side {
                ep: server,
                io: sio,
                tx: Vec::new(),
                blackhole: false,
            },
            client: Side {
                ep: client,
                io: cio,
                tx: Vec::new(),
                blackhole: false,
            },
            app: PerfServer::new(),
            conn,
            buf: vec![0; 64 * 1024],
        }
    }

    fn step(&mut self) {
        self.client.drive();
        self.server.drive();
        self.app.poll(&mut self.server.ep);
        if self.server.tx.is_empty() && self.client.tx.is_empty() {
            // Nothing in flight here: let virtual time pass for timers.
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Step until `done` or `limit` passes; returns whether `done` held.
    fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Pair) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            self.step();
            if done(self) {
                return true;
            }
        }
        false
    }

    fn established(&mut self, limit: Duration) -> bool {
        let conn = self.conn;
        self.run_until(limit, |p| p.client.ep.is_established(conn))
    }

    /// Run perf-protocol requests on concurrent streams to completion.
    fn exchange(&mut self, requests: &[(u8, u64)], limit: Duration) -> Vec<ClientStream> {
        assert!(self.established(Duration::from_secs(10)), "handshake");
        let conn = self.conn;
        let mut streams: Vec<ClientStream> = requests
            .iter()
            .map(|&(mode, len)| {
                ClientStream::new(self.client.ep.open_bidi(conn).unwrap(), mode, len)
            })
            .collect();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline && !streams.iter().all(ClientStream::is_done) {
            for s in streams.iter_mut() {
                s.poll(&mut self.client.ep, conn, &mut self.buf);
            }
            self.step();
        }
        streams
    }

    fn client_events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.client.ep.poll_event()).collect()
    }
}

fn all_correct(streams: &[ClientStream]) {
    for s in streams {
        assert!(s.is_correct(), "stream {} not byte-exact: {s:?}", s.id);
    }
}

fn cluster_pair(tag: &str, link: ImpairConfig) -> Pair {
    let dir = cluster(tag);
    Pair::new(
        node_config(&dir, "server"),
        node_config(&dir, "client"),
        link,
    )
}

#[test]
fn handshake_with_mutual_tls_and_retry() {
    let mut p = cluster_pair("hs", ImpairConfig::default());
    assert!(p.established(Duration::from_secs(5)));
    let events = p.client_events();
    assert!(
        matches!(&events[..], [Event::Established { alpn, .. }] if alpn == PERF_ALPN),
        "{events:?}"
    );
    let s = p.server.ep.stats();
    // One Retry per datagram of the first flight (a post-quantum key
    // share makes the ClientHello span two).
    assert!(
        (1..=2).contains(&s.retries_sent),
        "the server validated the address with a Retry: {s:?}"
    );
    assert_eq!(s.bad_tokens, 0);
    assert_eq!(s.accepted, 1);
    assert_eq!(p.server.ep.connections(), 1);
    assert_eq!(s.refused, 0);
}

#[test]
fn echo_is_byte_exact_from_1_byte_to_16_mib() {
    let mut p = cluster_pair("echo", ImpairConfig::default());
    let sizes = [1u64, 2, 1200, 1201, 65_536, 1 << 20, 16 << 20];
    let requests: Vec<_> = sizes.iter().map(|&n| (MODE_ECHO, n)).collect();
    let streams = p.exchange(&requests, Duration::from_secs(60));
    all_correct(&streams);
}

#[test]
fn many_concurrent_streams_discard_source_and_echo() {
    let mut p = cluster_pair("multi", ImpairConfig::default());
    let requests: Vec<_> = (0..200u64)
        .map(|i| {
            (
                [MODE_ECHO, MODE_DISCARD, MODE_SOURCE][(i % 3) as usize],
                1000 + i * 37,
            )
        })
        .collect();
    let streams = p.exchange(&requests, Duration::from_secs(30));
    all_correct(&streams);
}

#[test]
fn datagrams_are_echoed_both_ways() {
    let mut p = cluster_pair("dgram", ImpairConfig::default());
    assert!(p.established(Duration::from_secs(5)));
    let conn = p.conn;
    let max = p
        .client
        .ep
        .dgram_max_len(conn)
        .unwrap()
        .expect("datagrams negotiated");
    assert!(max > 1000, "{max}");
    for i in 0..20u8 {
        assert!(p
            .client
            .ep
            .dgram_send(conn, &vec![i; 100 + i as usize])
            .unwrap());
    }
    let mut got = Vec::new();
    let mut buf = vec![0; 2000];
    p.run_until(Duration::from_secs(5), |p| {
        while let Some(n) = p.client.ep.dgram_recv(conn, &mut buf).unwrap() {
            got.push(buf[..n].to_vec());
        }
        got.len() == 20
    });
    got.sort_by_key(|d| d.len());
    assert_eq!(got.len(), 20, "all echoes arrive on a perfect link");
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d, &vec![i as u8; 100 + i]);
    }
}

/// With pacing on, quiche spreads a window over the round trip: the
/// endpoint holds packets until their `SendInfo.at` (counted by
/// `paced()`), and the transfer still completes byte-exact.
#[test]
fn pacing_holds_packets_until_their_send_time() {
    let dir = cluster("pacing");
    let paced = |name| QuicConfig {
        pacing: true,
        ..node_config(&dir, name)
    };
    let link = ImpairConfig {
        delay: Duration::from_millis(10),
        ..ImpairConfig::default()
    };
    let mut p = Pair::new(paced("server"), paced("client"), link);
    assert!(p.established(Duration::from_secs(10)), "handshake");
    let conn = p.conn;
    let mut s = ClientStream::new(p.client.ep.open_bidi(conn).unwrap(), MODE_SOURCE, 2 << 20);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut most_held = 0;
    while Instant::now() < deadline && !s.is_done() {
        s.poll(&mut p.client.ep, conn, &mut p.buf);
        p.step();
        most_held = most_held.max(p.server.ep.paced());
    }
    assert!(s.is_correct(), "not byte-exact: {s:?}");
    assert!(most_held > 0, "no packet was ever held for pacing");
}

#[test]
fn close_with_an_application_code_reaches_the_peer() {
    let mut p = cluster_pair("close", ImpairConfig::default());
    assert!(p.established(Duration::from_secs(5)));
    p.client.ep.close(p.conn, 0x42, b"bye").unwrap();
    let closed = p.run_until(Duration::from_secs(5), |p| !p.app.closed.is_empty());
    assert!(closed);
    match &p.app.closed[0] {
        Event::Closed {
            reason:
                CloseReason::Peer {
                    app: true,
                    code: 0x42,
                    reason,
                },
            established: true,
            ..
        } => {
            assert_eq!(reason, b"bye")
        }
        other => panic!("{other:?}"),
    }
    p.run_until(Duration::from_secs(5), |p| p.client.ep.connections() == 0);
    assert_eq!(p.client.ep.connections(), 0);
    assert_eq!(p.server.ep.connections(), 0);
}

#[test]
fn a_peer_from_another_ca_is_refused() {
    let ours = cluster("ours");
    let theirs = cluster("theirs");
    let mut p = Pair::new(
        node_config(&ours, "server"),
        node_config(&theirs, "client"),
        ImpairConfig::default(),
    );
    assert!(!p.established(Duration::from_secs(3)));
    let events = p.client_events();
    // The client's verification fails the handshake with TLS alert 48,
    // unknown_ca: the server's certificate is not from the client's CA.
    assert!(
        matches!(
            &events[..],
            [Event::Closed {
                established: false,
                reason,
                ..
            }] if matches!(reason, CloseReason::Local { .. }) && reason.tls_alert() == Some(48)
        ),
        "the client's handshake fails with unknown_ca: {events:?}"
    );
    // The server's half drains (3 PTOs) after the client's close, then goes.
    p.run_until(Duration::from_secs(10), |p| p.server.ep.connections() == 0);
    assert_eq!(p.server.ep.connections(), 0);
}

/// The other direction: a client that does not check the server but
/// presents a certificate from a foreign CA is refused by the server's
/// verification with a TLS alert, and the server keeps no connection.
#[test]
fn a_client_certificate_from_another_ca_is_refused_by_the_server() {
    let ours = cluster("ours-srv");
    let theirs = cluster("theirs-cli");
    let client = QuicConfig {
        trust: Trust::InsecureNoVerify,
        ..node_config(&theirs, "client")
    };
    let mut p = Pair::new(
        node_config(&ours, "server"),
        client,
        ImpairConfig::default(),
    );
    let alert = p.run_until(Duration::from_secs(5), |p| {
        p.client_events().iter().any(|e| {
            matches!(
                e,
                Event::Closed {
                    reason: CloseReason::Peer {
                        app: false,
                        code: 0x130,
                        ..
                    },
                    ..
                }
            )
        })
    });
    assert!(
        alert,
        "the server answers with TLS alert 48, unknown_ca: {:?}",
        p.client_events()
    );
    p.run_until(Duration::from_secs(10), |p| p.server.ep.connections() == 0);
    assert_eq!(p.server.ep.connections(), 0);
    assert!(!p.client.ep.is_established(p.conn));
}

#[test]
fn a_client_without_a_certificate_is_refused() {
    let dir = cluster("nocert");
    let client = QuicConfig {
        alpn: vec![PERF_ALPN.to_vec()],
        trust: Trust::ClusterCa(dir.join("ca.pem")),
        cert_chain: None,
        private_key: None,
        ..QuicConfig::default()
    };
    // A cluster client must have an identity: refused at configuration.
    assert!(Endpoint::<MemDatagram>::client(client.clone(), 0, 1472).is_err());
    // A client that does not verify and has no certificate gets through
    // TLS but is refused by the server once the handshake completes.
    let anonymous = QuicConfig {
        trust: Trust::InsecureNoVerify,
        ..client
    };
    let mut p = Pair::new(
        node_config(&dir, "server"),
        anonymous,
        ImpairConfig::default(),
    );
    p.run_until(Duration::from_secs(3), |p| {
        !p.app.closed.is_empty() || p.server.ep.stats().refused > 0
    });
    assert_eq!(p.server.ep.stats().refused, 1);
    let closed = p.run_until(Duration::from_secs(3), |p| {
        p.client_events().iter().any(|e| {
            matches!(
                e,
                Event::Closed {
                    reason: CloseReason::Peer {
                        app: false,
                        code: 0x174,
                        ..
                    },
                    ..
                }
            )
        })
    });
    assert!(closed, "the client sees certificate_required");
}

fn lossy(loss: f64, seed: u64) -> ImpairConfig {
    ImpairConfig {
        loss,
        seed,
        ..ImpairConfig::default()
    }
}

#[test]
fn transfer_survives_1_5_and_10_percent_loss() {
    for (i, loss) in [0.01, 0.05, 0.10].into_iter().enumerate() {
        let mut p = cluster_pair(&format!("loss{i}"), lossy(loss, 7 + i as u64));
        let streams = p.exchange(
            &[(MODE_ECHO, 1 << 20), (MODE_SOURCE, 1 << 20)],
            Duration::from_secs(60),
        );
        all_correct(&streams);
        let lost = p.client.ep.conn_stats(p.conn).unwrap().packets_lost;
        assert!(
            lost > 0,
            "loss {loss}: the link lost packets and QUIC recovered them"
        );
    }
}

/// Backpressure: while the receiving application reads nothing, a stream
/// takes exactly the receiver's window and then refuses more (0 bytes
/// taken); once the application reads, the rest goes through. No side
/// buffers without bound.
#[test]
fn a_stream_takes_only_the_peer_s_window_until_the_peer_reads() {
    const WINDOW: u64 = 64 * 1024;
    let dir = cluster("backpressure");
    let server = QuicConfig {
        stream_window: WINDOW,
        ..node_config(&dir, "server")
    };
    let mut p = Pair::new(server, node_config(&dir, "client"), ImpairConfig::default());
    assert!(p.established(Duration::from_secs(5)));
    let conn = p.conn;
    let body = 1 << 20;
    let mut data = request(MODE_DISCARD, body as u64).to_vec();
    let head = data.len();
    data.resize(head + body, 0x5a);
    let sid = p.client.ep.open_bidi(conn).unwrap();
    let mut sent = 0;
    // Only the endpoints run: the server's application is not polled.
    for _ in 0..500 {
        sent += p
            .client
            .ep
            .stream_send(conn, sid, &data[sent..], false)
            .unwrap();
        p.client.drive();
        p.server.drive();
    }
    assert_eq!(sent as u64, WINDOW, "taken while the peer reads nothing");
    assert_eq!(
        p.client
            .ep
            .stream_send(conn, sid, &data[sent..], false)
            .unwrap(),
        0
    );
    // The application reads (and discards): the window opens.
    let all = p.run_until(Duration::from_secs(10), |p| {
        // fin goes with the last byte (quiche drops it from a partial write).
        sent += p
            .client
            .ep
            .stream_send(conn, sid, &data[sent..], true)
            .unwrap();
        sent == data.len()
    });
    assert!(
        all,
        "{sent} of {} bytes taken after the peer read",
        data.len()
    );
}

#[test]
fn handshake_survives_loss_and_corruption() {
    let (mut dropped, mut corrupted) = (0, 0);
    for seed in 0..5 {
        let link = ImpairConfig {
            loss: 0.3,
            corrupt: 0.1,
            seed,
            ..ImpairConfig::default()
        };
        let mut p = cluster_pair(&format!("hsloss{seed}"), link);
        assert!(p.established(Duration::from_secs(30)), "seed {seed}");
        // Up to here only handshake packets have crossed the link.
        for side in [&p.client, &p.server] {
            let hit = side.io.stats().impair;
            dropped += hit.dropped;
            corrupted += hit.corrupted;
        }
    }
    // The link really lost and corrupted handshake packets on the way
    // (the interop runner's handshakeloss and handshakecorruption).
    assert!(dropped >= 5, "{dropped} handshake packets dropped");
    assert!(corrupted >= 2, "{corrupted} handshake packets corrupted");
}

#[test]
fn transfer_survives_reordering_duplication_and_corruption() {
    let link = ImpairConfig {
        reorder: 0.1,
        duplicate: 0.05,
        corrupt: 0.02,
        delay: Duration::from_millis(1),
        jitter: Duration::from_millis(2),
        seed: 3,
        ..ImpairConfig::default()
    };
    let mut p = cluster_pair("reorder", link);
    let streams = p.exchange(
        &[
            (MODE_ECHO, 512 << 10),
            (MODE_DISCARD, 1 << 20),
            (MODE_SOURCE, 1 << 20),
        ],
        Duration::from_secs(60),
    );
    all_correct(&streams);
}

#[test]
fn blackhole_then_restore_resumes_the_transfer() {
    let mut p = cluster_pair("blackhole", ImpairConfig::default());
    assert!(p.established(Duration::from_secs(5)));
    let conn = p.conn;
    let mut s = ClientStream::new(p.client.ep.open_bidi(conn).unwrap(), MODE_ECHO, 4 << 20);
    let mut buf = vec![0; 64 * 1024];
    // Let the transfer start, then cut the link both ways for 2 s.
    for _ in 0..50 {
        s.poll(&mut p.client.ep, conn, &mut buf);
        p.step();
    }
    p.client.blackhole = true;
    p.server.blackhole = true;
    let cut = Instant::now();
    while cut.elapsed() < Duration::from_secs(2) {
        s.poll(&mut p.client.ep, conn, &mut buf);
        p.step();
    }
    assert!(!s.is_done());
    p.client.blackhole = false;
    p.server.blackhole = false;
    p.run_until(Duration::from_secs(30), |p| {
        s.poll(&mut p.client.ep, conn, &mut buf);
        s.is_done()
    });
    assert!(s.is_correct(), "{s:?}");
}

#[test]
fn a_cut_link_ends_in_an_idle_timeout_not_a_hang() {
    let dir = cluster("idle");
    let short = |name| QuicConfig {
        idle_timeout: Duration::from_secs(1),
        ..node_config(&dir, name)
    };
    let mut p = Pair::new(short("server"), short("client"), ImpairConfig::default());
    assert!(p.established(Duration::from_secs(5)));
    p.client.blackhole = true;
    p.server.blackhole = true;
    let started = Instant::now();
    let ended = p.run_until(Duration::from_secs(10), |p| p.client.ep.connections() == 0);
    assert!(ended && started.elapsed() < Duration::from_secs(5));
    let events = p.client_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Closed {
                reason: CloseReason::IdleTimeout,
                ..
            }
        )),
        "{events:?}"
    );
}

/// The first datagram of a fresh client handshake: an Initial.
fn initial_packet(seed: u8) -> Vec<u8> {
    let mut cfg = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    cfg.set_application_protos(&[PERF_ALPN]).unwrap();
    cfg.verify_peer(false);
    let scid = quiche::ConnectionId::from_vec(vec![seed; 16]);
    let local = "10.9.9.9:1".parse().unwrap();
    let peer = std::net::SocketAddr::V4(SocketAddrV4::new(SERVER_IP, PORT));
    let mut c = quiche::connect(None, &scid, local, peer, &mut cfg).unwrap();
    let mut out = vec![0; 1500];
    let (n, _) = c.send(&mut out).unwrap();
    out.truncate(n);
    out
}

fn spoofed(payload: &[u8], i: u32) -> MemDatagram {
    use stack::io::Datagram;
    let mut d = MemDatagram::new(1500);
    d.set_len(payload.len());
    d.payload_mut().copy_from_slice(payload);
    let ip = Ipv4Addr::from(0x0a63_0000 | (i & 0xffff));
    d.set_peer(SocketAddrV4::new(ip, 1024 + (i % 50000) as u16));
    d.set_local_port(PORT);
    d
}

#[test]
fn a_flood_of_junk_and_spoofed_initials_keeps_no_state_and_valid_peers_are_served() {
    let mut p = cluster_pair("flood", ImpairConfig::default());
    let initials: Vec<Vec<u8>> = (0..16).map(initial_packet).collect();
    let mut rng_state = 0x1234_5678u32;
    let conn = p.conn;
    let mut s = ClientStream::new(0, MODE_ECHO, 256 << 10);
    let mut buf = vec![0; 64 * 1024];
    for round in 0..200u32 {
        for k in 0..50u32 {
            let i = round * 50 + k;
            rng_state = rng_state
                .wrapping_mul(1_664_525)
                .wrapping_add(1_013_904_223);
            let junk: Vec<u8> = (0..(rng_state % 1400) as usize)
                .map(|j| (rng_state >> (j % 24)) as u8)
                .collect();
            let mut tx = Vec::new();
            p.server
                .ep
                .recv(spoofed(&junk, i), &mut p.server.io, &mut tx);
            p.server.ep.recv(
                spoofed(&initials[(i % 16) as usize], i),
                &mut p.server.io,
                &mut tx,
            );
            // Replies to spoofed addresses go nowhere.
            p.server.io.send_burst(&mut tx);
        }
        if p.client.ep.is_established(conn) {
            s.poll(&mut p.client.ep, conn, &mut buf);
        }
        p.step();
    }
    p.run_until(Duration::from_secs(20), |p| {
        if p.client.ep.is_established(conn) {
            s.poll(&mut p.client.ep, conn, &mut buf);
        }
        s.is_done()
    });
    assert!(
        s.is_correct(),
        "the valid client is served during the flood: {s:?}"
    );
    let st = p.server.ep.stats();
    assert_eq!(st.accepted, 1, "no state for spoofed Initials: {st:?}");
    assert_eq!(p.server.ep.connections(), 1);
    assert!(st.retries_sent >= 10_000, "{st:?}");
    assert!(
        st.junk + st.unknown_connection + st.version_negotiations + st.short_initials >= 10_000,
        "{st:?}"
    );
}

#[test]
fn without_retry_the_handshake_limit_bounds_state() {
    let dir = cluster("limit");
    let server = QuicConfig {
        retry: false,
        max_handshakes: 64,
        ..node_config(&dir, "server")
    };
    let mut p = Pair::new(server, node_config(&dir, "client"), ImpairConfig::default());
    let initials: Vec<Vec<u8>> = (0..251).map(initial_packet).collect();
    for i in 0..2000u32 {
        let mut tx = Vec::new();
        let initial = &initials[(i % 251) as usize];
        p.server
            .ep
            .recv(spoofed(initial, i), &mut p.server.io, &mut tx);
        p.server.io.send_burst(&mut tx);
    }
    assert!(
        p.server.ep.connections() <= 64,
        "{}",
        p.server.ep.connections()
    );
    // Past the first 64, an Initial got in only by evicting a handshake
    // that had had its grace (an Initial resent to an ID already taken
    // reaches that connection); the first 64 take well under that grace,
    // so the ones right after them are turned away.
    let st = p.server.ep.stats();
    assert!(st.accepted <= 64 + st.handshakes_evicted, "{st:?}");
    assert!(st.handshake_limited > 0, "{st:?}");
}

/// A server endpoint on its own over the in-memory network, for feeding
/// it hand-made datagrams.
fn lone_server(tag: &str, tune: impl FnOnce(QuicConfig) -> QuicConfig) -> Side {
    let dir = cluster(tag);
    let net = MemNet::with_mtu(1500);
    let io = net.endpoint(SERVER_IP, ImpairConfig::default()).unwrap();
    let cfg = tune(node_config(&dir, "server"));
    Side {
        ep: Endpoint::server(cfg, 0, io.max_payload()).unwrap(),
        io,
        tx: Vec::new(),
        blackhole: false,
    }
}

/// RFC 9000 14.1: an Initial in a datagram under 1200 bytes is dropped,
/// so a spoofed small one cannot draw a bigger Retry at a victim.
#[test]
fn an_initial_in_a_datagram_under_1200_bytes_draws_no_reply() {
    let mut server = lone_server("short", |c| c);
    let initial = initial_packet(7);
    assert_eq!(initial.len(), 1200, "quiche pads a client's first Initial");
    for len in [1199, 100] {
        let mut tx = Vec::new();
        server
            .ep
            .recv(spoofed(&initial[..len], 1), &mut server.io, &mut tx);
        assert!(tx.is_empty(), "{len} bytes: answered");
    }
    let mut tx = Vec::new();
    server
        .ep
        .recv(spoofed(&initial, 1), &mut server.io, &mut tx);
    assert_eq!(tx.len(), 1, "a full-size Initial gets its Retry");
    let st = server.ep.stats();
    assert_eq!((st.short_initials, st.retries_sent), (2, 1), "{st:?}");
}

/// Without an idle timeout (the collectives run without one) nothing
/// ended a handshake whose client never came back: each such Initial
/// (from a spoofed address, say) held one of `max_handshakes` for good.
#[test]
fn a_handshake_whose_client_went_away_is_dropped_after_the_handshake_timeout() {
    let mut server = lone_server("hsdeadline", |c| QuicConfig {
        retry: false,
        idle_timeout: Duration::ZERO,
        handshake_timeout: Duration::from_millis(300),
        ..c
    });
    let t = Instant::now();
    let mut tx = Vec::new();
    server
        .ep
        .recv(spoofed(&initial_packet(9), 1), &mut server.io, &mut tx);
    assert_eq!(server.ep.handshakes_in_progress(), 1);
    while server.ep.connections() > 0 && t.elapsed() < Duration::from_secs(5) {
        server.drive();
        server.tx.clear();
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = t.elapsed();
    assert_eq!(server.ep.connections(), 0, "still held after {took:?}");
    assert_eq!(server.ep.handshakes_in_progress(), 0);
    assert!(
        took >= Duration::from_millis(300),
        "dropped early: {took:?}"
    );
    assert!(took < Duration::from_secs(2), "dropped late: {took:?}");
    match server.ep.poll_event() {
        Some(Event::Closed {
            established: false,
            reason: CloseReason::HandshakeTimeout,
            ..
        }) => {}
        other => panic!("expected a handshake timeout, got {other:?}"),
    }
    assert_eq!(server.ep.stats().handshakes_failed, 1);
}

/// Zero means never, and so does a deadline past what an `Instant` can
/// hold (`Duration::MAX` panicked at the first Initial, from anyone).
#[test]
fn a_handshake_timeout_of_zero_or_max_never_expires_and_never_panics() {
    for t in [Duration::ZERO, Duration::MAX] {
        let mut server = lone_server("hsnever", |c| QuicConfig {
            retry: false,
            idle_timeout: Duration::ZERO,
            handshake_timeout: t,
            ..c
        });
        let mut tx = Vec::new();
        server
            .ep
            .recv(spoofed(&initial_packet(4), 1), &mut server.io, &mut tx);
        for _ in 0..20 {
            server.drive();
            server.tx.clear();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(server.ep.handshakes_in_progress(), 1, "{t:?}");
    }
}

/// A datagram from `peer`.
fn from_addr(payload: &[u8], peer: SocketAddrV4) -> MemDatagram {
    use stack::io::Datagram;
    let mut d = spoofed(payload, 0);
    d.set_peer(peer);
    d
}

/// A long-header datagram of `len` bytes: first byte `first`, `version`,
/// the IDs, then filler (what a version we do not know may put there).
fn long_header(first: u8, version: u32, dcid: &[u8], scid: &[u8], len: usize) -> Vec<u8> {
    let mut p = vec![first];
    p.extend_from_slice(&version.to_be_bytes());
    p.push(dcid.len() as u8);
    p.extend_from_slice(dcid);
    p.push(scid.len() as u8);
    p.extend_from_slice(scid);
    p.resize(len, 0xee);
    p
}

/// Any long-header packet of a version we do not speak gets a Version
/// Negotiation packet echoing its IDs whole (RFC 9000 6.1, RFC 8999):
/// a QUIC v2 Initial (whose type bits read as 0-RTT in v1) got nothing,
/// and an ID longer than 20 bytes was echoed cut short, which the client
/// discards. Datagrams under 1200 bytes still get nothing.
#[test]
fn every_long_header_of_an_unknown_version_gets_version_negotiation() {
    let mut server = lone_server("vneg", |c| c);
    let quic_v2_initial = 0xd0;
    let long_dcid = [7u8; 30];
    let cases: [(u8, u32, &[u8]); 3] = [
        (quic_v2_initial, 0x6b33_43cf, b"v2-dcid!"),
        (0xc0, 0x1a2a_3a4a, &long_dcid),
        (0xe0, 0xff00_001d, b"draft-29"),
    ];
    for (first, version, dcid) in cases {
        let scid = b"client-scid";
        let mut tx = Vec::new();
        let d = long_header(first, version, dcid, scid, 1200);
        server.ep.recv(spoofed(&d, 1), &mut server.io, &mut tx);
        assert_eq!(tx.len(), 1, "version {version:#x}: no reply");
        let mut reply = {
            use stack::io::Datagram;
            tx[0].payload().to_vec()
        };
        let hdr = quiche::Header::from_slice(&mut reply, 16).unwrap();
        assert_eq!(hdr.ty, quiche::Type::VersionNegotiation);
        assert_eq!(&hdr.dcid[..], scid);
        assert_eq!(
            &hdr.scid[..],
            dcid,
            "version {version:#x}: its ID echoed whole"
        );
        assert!(hdr.versions.unwrap().contains(&quiche::PROTOCOL_VERSION));
        // One byte short of an Initial's size: dropped.
        let mut tx = Vec::new();
        let short = long_header(first, version, dcid, scid, 1199);
        server.ep.recv(spoofed(&short, 2), &mut server.io, &mut tx);
        assert!(tx.is_empty(), "version {version:#x}: a short one answered");
    }
    let st = server.ep.stats();
    assert_eq!(
        (st.version_negotiations, st.short_initials),
        (3, 3),
        "{st:?}"
    );
}

/// An lcore that stops (ainftp-dp on Ctrl-C) closes its connections, so
/// their peers hear it at once: it only flushed what was queued, and a
/// peer waited out its idle timeout (for ever, with none).
#[test]
fn a_stopping_lcore_closes_its_connections() {
    use stack::quic::lcore::{EndpointApp, STOPPING_REASON};
    use stack::runtime::LcoreApp;
    let dir = cluster("stopping");
    let mut p = Pair::new(
        node_config(&dir, "server"),
        node_config(&dir, "client"),
        ImpairConfig::default(),
    );
    assert!(p.established(Duration::from_secs(10)), "handshake");
    // Done at the server too, so that its close is an application one (a
    // close while handshaking goes as a transport APPLICATION_ERROR).
    assert!(p.run_until(Duration::from_secs(10), |p| p
        .server
        .ep
        .handshakes_in_progress()
        == 0));
    let Pair {
        server, mut client, ..
    } = p;
    let mut app = EndpointApp::new(server.ep, PerfServer::new());
    let mut server_io = server.io;
    app.drain(&mut server_io);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut end = None;
    while end.is_none() && Instant::now() < deadline {
        client.drive();
        while let Some(e) = client.ep.poll_event() {
            if let Event::Closed { reason, .. } = e {
                end = Some(reason);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        end,
        Some(CloseReason::Peer {
            app: true,
            code: 0,
            reason: STOPPING_REASON.to_vec()
        })
    );
}

/// `initial` (a client's first Initial, no token) with `token` in its
/// header and, given `dcid`, that destination ID. Only the header is
/// rewritten: what the endpoint reads before it decrypts anything.
fn with_token(initial: &[u8], token: &[u8], dcid: Option<&[u8]>) -> Vec<u8> {
    let dcid_len = initial[5] as usize;
    let scid_at = 6 + dcid_len;
    let token_at = scid_at + 1 + initial[scid_at] as usize;
    assert_eq!(initial[token_at], 0, "no token yet");
    assert!(token.len() < 64, "a one-byte length");
    let mut out = initial[..5].to_vec();
    let dcid = dcid.unwrap_or(&initial[6..scid_at]);
    out.push(dcid.len() as u8);
    out.extend_from_slice(dcid);
    out.extend_from_slice(&initial[scid_at..token_at]);
    out.push(token.len() as u8);
    out.extend_from_slice(token);
    out.extend_from_slice(&initial[token_at + 1..]);
    out
}

/// A token we cannot have issued, to a connection ID we did not give
/// (another server's, or one from before a restart), is no answer to a
/// Retry of ours: it gets a fresh Retry (RFC 9000 8.1.3), where it was
/// dropped and its client waited out its handshake timeout. One to an ID
/// of ours that fails its check is still dropped without a reply.
#[test]
fn a_token_from_elsewhere_gets_a_fresh_retry_and_a_failed_answer_to_ours_gets_nothing() {
    let mut server = lone_server("foreigntoken", |c| c);
    let foreign = with_token(&initial_packet(5), b"token-from-another-server", None);
    let mut tx = Vec::new();
    server
        .ep
        .recv(spoofed(&foreign, 1), &mut server.io, &mut tx);
    assert_eq!(tx.len(), 1, "a Retry");
    let st = server.ep.stats();
    assert_eq!(
        (st.bad_tokens, st.retries_sent, st.accepted),
        (1, 1, 0),
        "{st:?}"
    );
    let mut rng = rand::thread_rng();
    let ours = stack::quic::cid::new_cid(0, &mut rng);
    let answer = with_token(&initial_packet(6), b"not-the-token-we-sent", Some(&ours));
    let mut tx = Vec::new();
    server.ep.recv(spoofed(&answer, 2), &mut server.io, &mut tx);
    assert!(tx.is_empty(), "answered");
    let st = server.ep.stats();
    assert_eq!(
        (st.bad_tokens, st.retries_sent, st.accepted),
        (2, 1, 0),
        "{st:?}"
    );
}

/// One host (whose address a Retry would prove) cannot take every
/// handshake slot: past `max_handshakes_per_ip` its Initials are dropped,
/// and other hosts still get in.
#[test]
fn one_address_holds_at_most_max_handshakes_per_ip() {
    let mut server = lone_server("perip", |c| QuicConfig {
        retry: false,
        max_handshakes: 64,
        max_handshakes_per_ip: 16,
        ..c
    });
    let one_host = Ipv4Addr::new(10, 99, 1, 1);
    let mut tx = Vec::new();
    for port in 0..40u16 {
        let d = from_addr(
            &initial_packet(port as u8),
            SocketAddrV4::new(one_host, 2000 + port),
        );
        server.ep.recv(d, &mut server.io, &mut tx);
    }
    let st = server.ep.stats();
    assert_eq!(
        (st.accepted, st.handshake_limited_per_ip),
        (16, 24),
        "{st:?}"
    );
    assert_eq!(server.ep.handshakes_in_progress(), 16);
    for k in 0..5u8 {
        let other = SocketAddrV4::new(Ipv4Addr::new(10, 99, 2, k), 2000);
        server.ep.recv(
            from_addr(&initial_packet(100 + k), other),
            &mut server.io,
            &mut tx,
        );
    }
    let st = server.ep.stats();
    assert_eq!((st.accepted, st.handshake_limited), (21, 0), "{st:?}");
    // Once its oldest has had its grace, a newcomer from that address
    // takes its place: its share stays 16.
    std::thread::sleep(HANDSHAKE_GRACE);
    let d = from_addr(&initial_packet(200), SocketAddrV4::new(one_host, 3000));
    server.ep.recv(d, &mut server.io, &mut tx);
    let st = server.ep.stats();
    assert_eq!((st.accepted, st.handshakes_evicted), (22, 1), "{st:?}");
    assert_eq!(server.ep.handshakes_in_progress(), 21);
}

/// With every slot held by a handshake past its grace, an Initial that
/// only draws a Retry (no token: its address is not validated, and it
/// takes no slot) evicts nothing: spoofed ones, which need no return
/// path, could otherwise drop honest handshakes on slow paths for ever.
#[test]
fn an_initial_that_only_draws_a_retry_evicts_no_handshake() {
    let dir = cluster("noevict");
    let server = QuicConfig {
        max_handshakes: 1,
        ..node_config(&dir, "server")
    };
    let mut p = Pair::new(server, node_config(&dir, "client"), ImpairConfig::default());
    // The client gets through the Retry; then it hears nothing more, so
    // its handshake stays in progress at the server.
    assert!(p.run_until(Duration::from_secs(10), |p| {
        p.server.ep.handshakes_in_progress() == 1
    }));
    p.client.blackhole = true;
    std::thread::sleep(HANDSHAKE_GRACE);
    let mut tx = Vec::new();
    for i in 0..5u32 {
        let d = spoofed(&initial_packet(i as u8), i);
        p.server.ep.recv(d, &mut p.server.io, &mut tx);
    }
    let st = p.server.ep.stats();
    assert_eq!(tx.len(), 5, "each gets its Retry");
    assert_eq!((st.handshakes_evicted, st.accepted), (0, 1), "{st:?}");
    assert_eq!(p.server.ep.handshakes_in_progress(), 1);
}

/// Handshakes that never go on (spoofed, or an attacker's that hold their
/// slots) once filled `max_handshakes` until each timed out (a minute
/// without an idle timeout), and every other client was turned away
/// meanwhile. Now the oldest makes room once it has been in progress for
/// `HANDSHAKE_GRACE`, and is reported closed as evicted.
#[test]
fn when_every_handshake_slot_is_held_the_oldest_makes_room_after_the_grace() {
    let dir = cluster("evict");
    let server = QuicConfig {
        retry: false,
        max_handshakes: 4,
        ..node_config(&dir, "server")
    };
    let mut p = Pair::new(server, node_config(&dir, "client"), ImpairConfig::default());
    let start = Instant::now();
    let mut tx = Vec::new();
    for i in 0..4u32 {
        let d = spoofed(&initial_packet(i as u8), i);
        p.server.ep.recv(d, &mut p.server.io, &mut tx);
    }
    assert_eq!(p.server.ep.handshakes_in_progress(), 4);
    // A newcomer now is turned away: none has had its grace.
    let early = spoofed(&initial_packet(9), 9);
    p.server.ep.recv(early, &mut p.server.io, &mut tx);
    assert_eq!(p.server.ep.stats().handshake_limited, 1);
    // The real client's Initials are dropped until then; a later one gets in.
    assert!(
        p.established(Duration::from_secs(10)),
        "the client never got in"
    );
    assert!(start.elapsed() >= HANDSHAKE_GRACE, "{:?}", start.elapsed());
    let st = p.server.ep.stats();
    assert_eq!(st.handshakes_evicted, 1, "{st:?}");
    assert!(st.handshake_limited >= 2, "{st:?}");
    // The evicted one is reported (the first spoofed one: the oldest).
    let mut lone = lone_server("evict-event", |c| QuicConfig {
        retry: false,
        max_handshakes: 1,
        ..c
    });
    let first = spoofed(&initial_packet(1), 1);
    lone.ep.recv(first, &mut lone.io, &mut tx);
    std::thread::sleep(HANDSHAKE_GRACE);
    lone.ep
        .recv(spoofed(&initial_packet(2), 2), &mut lone.io, &mut tx);
    let closed: Vec<_> = std::iter::from_fn(|| lone.ep.poll_event())
        .filter_map(|e| match e {
            Event::Closed { peer, reason, .. } => Some((peer, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert_eq!(closed[0].0.ip(), &Ipv4Addr::from(0x0a63_0001u32));
    assert_eq!(closed[0].1, CloseReason::HandshakeEvicted);
    assert_eq!(lone.ep.handshakes_in_progress(), 1);
}

/// `max_handshakes` bounds the handshakes others start with us; our own
/// dials in progress (a rank dialling its peers) do not take its slots.
#[test]
fn our_own_dials_do_not_use_up_the_handshakes_we_accept() {
    let mut server = lone_server("owndials", |c| QuicConfig {
        retry: false,
        max_handshakes: 1,
        ..c
    });
    server
        .ep
        .connect(
            SocketAddrV4::new(SERVER_IP, PORT),
            SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 77), PORT),
            Some("server"),
        )
        .unwrap();
    let mut tx = Vec::new();
    server
        .ep
        .recv(spoofed(&initial_packet(3), 1), &mut server.io, &mut tx);
    let st = server.ep.stats();
    assert_eq!((st.accepted, st.handshake_limited), (1, 0), "{st:?}");
    assert_eq!(server.ep.connections(), 2);
    assert_eq!(server.ep.handshakes_in_progress(), 1);
}

#[test]
fn a_thousand_connections_open_and_close_without_leaking_state() {
    let dir = cluster("many");
    // A short idle timeout bounds a stalled handshake, should one happen.
    let short = |name| QuicConfig {
        idle_timeout: Duration::from_secs(3),
        ..node_config(&dir, name)
    };
    let mut p = Pair::new(short("server"), short("client"), ImpairConfig::default());
    let server_addr = SocketAddrV4::new(SERVER_IP, PORT);
    let total = 1000u32;
    let mut open = vec![p.conn];
    let mut next = 1u32;
    let mut closed = 0u32;
    let mut stalled = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while closed < total && Instant::now() < deadline {
        // Keep 8 handshakes going; close each once established.
        while open.len() < 8 && next < total {
            let local = SocketAddrV4::new(CLIENT_IP, 10_000 + next as u16);
            open.push(
                p.client
                    .ep
                    .connect(local, server_addr, Some("server"))
                    .unwrap(),
            );
            next += 1;
        }
        for &c in &open {
            if p.client.ep.is_established(c) {
                p.client.ep.close(c, 0, b"done").unwrap();
            }
        }
        p.step();
        for e in p.client_events() {
            if let Event::Closed {
                conn, established, ..
            } = e
            {
                if !established {
                    stalled.push(e.clone());
                }
                open.retain(|&c| c != conn);
                closed += 1;
            }
        }
    }
    assert_eq!(closed, total);
    // No handshake may stall. Under load one in a few hundred did, until
    // the idle timeout: a client closing before the handshake was
    // confirmed flooded the link with ACK-only packets (see
    // a_close_stuck_behind_an_unconfirmed_handshake_...).
    assert!(
        stalled.is_empty(),
        "{} handshakes stalled: {stalled:?}",
        stalled.len()
    );
    p.run_until(Duration::from_secs(10), |p| p.server.ep.connections() == 0);
    assert_eq!(p.client.ep.connections(), 0);
    assert_eq!(p.server.ep.connections(), 0);
    assert_eq!(p.server.ep.handshakes_in_progress(), 0);
    assert_eq!(p.server.ep.stats().accepted, total as u64);
}

/// A client that closes right after its handshake completes while it owes
/// the server an ACK for a Handshake packet (the server, not having the
/// client's Finished, retransmitted its flight): quiche sends the
/// application close only in 1-RTT packets, but the owed ACK makes it pick
/// a Handshake packet on every send, and a closing connection never clears
/// that debt. Each send then produced an ACK-only packet, thousands a
/// second until the idle timeout; under load this flooded the link and
/// stalled other handshakes. The endpoint ends such a close after a few
/// datagrams.
#[test]
fn a_close_stuck_behind_an_unconfirmed_handshake_ends_without_a_packet_storm() {
    let mut p = cluster_pair("stuckclose", ImpairConfig::default());
    let conn = p.conn;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.client.ep.is_established(conn) {
        assert!(Instant::now() < deadline, "handshake");
        p.server.drive();
        p.client.drive();
    }
    // The server never gets the client's Finished, so its probe timer
    // resends its Handshake flight.
    p.server.blackhole = true;
    let sent = p.server.ep.stats().datagrams_out;
    while p.server.ep.stats().datagrams_out == sent {
        assert!(Instant::now() < deadline, "server probe");
        p.server.drive();
        std::thread::sleep(Duration::from_millis(1));
    }
    // The client takes it in (now owing an ACK) and closes before sending.
    // (Counted as sent, the probe may not be on the link yet: held in the
    // server's pacer when a preempted thread sees quiche date it past the
    // 50 us slack, or kept back by a full queue. The next drive sends it.
    // Seen once in CI: nothing had arrived when the client first looked.)
    let mut rx = Vec::new();
    while rx.is_empty() {
        assert!(Instant::now() < deadline, "the probe never arrived");
        p.client.io.recv_burst(&mut rx, 64);
        if rx.is_empty() {
            p.server.drive();
        }
    }
    for d in rx {
        p.client.ep.recv(d, &mut p.client.io, &mut p.client.tx);
    }
    let before = p.client.ep.stats().datagrams_out;
    p.client.ep.close(conn, 7, b"bye").unwrap();
    let closed = p.run_until(Duration::from_secs(2), |p| p.client.ep.connections() == 0);
    let sent = p.client.ep.stats().datagrams_out - before;
    assert!(sent <= 20, "{sent} datagrams after close");
    assert!(closed, "the closing connection is gone");
    let reason = p
        .client_events()
        .into_iter()
        .find_map(|e| match e {
            Event::Closed {
                conn: c, reason, ..
            } if c == conn => Some(reason),
            _ => None,
        })
        .expect("a Closed event");
    assert_eq!(
        reason,
        CloseReason::Local {
            app: true,
            code: 7,
            reason: b"bye".to_vec()
        }
    );
}

/// Each send round drains at most `send_quantum()` from each connection
/// into the burst, in turn: two bulk connections of one endpoint both get
/// packets into the same burst, neither more than its quantum (plus the
/// packet that crossed it), and over a second they send alike.
#[test]
fn one_send_round_takes_up_to_a_quantum_from_each_connection() {
    let mut p = cluster_pair("quantum", ImpairConfig::default());
    assert!(p.established(Duration::from_secs(10)));
    let (a, server) = (p.conn, SocketAddrV4::new(SERVER_IP, PORT));
    let b = p
        .client
        .ep
        .connect(SocketAddrV4::new(CLIENT_IP, 50001), server, Some("server"))
        .unwrap();
    assert!(p.run_until(Duration::from_secs(10), |p| p.client.ep.is_established(b)));
    let mut streams: Vec<(ConnHandle, ClientStream)> = [a, b]
        .into_iter()
        .map(|c| {
            let id = p.client.ep.open_bidi(c).unwrap();
            (c, ClientStream::new(id, MODE_DISCARD, 1 << 30))
        })
        .collect();
    let mut rounds_with_both = 0;
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        for (c, s) in streams.iter_mut() {
            s.poll(&mut p.client.ep, *c, &mut p.buf);
        }
        // One send round of the client alone: what it drained from each
        // connection (quiche counts a packet as sent when it is written,
        // whether it leaves now or waits for its pacing time).
        let quantum =
            |p: &mut Pair, c: ConnHandle| p.client.ep.connection_mut(c).unwrap().send_quantum();
        let sent = |p: &mut Pair, c| p.client.ep.conn_stats(c).unwrap().bytes_sent as usize;
        let (qa, qb) = (quantum(&mut p, a), quantum(&mut p, b));
        let before = [sent(&mut p, a), sent(&mut p, b)];
        let Side { ep, io, tx, .. } = &mut p.client;
        ep.send(io, tx, Instant::now());
        let bytes = [sent(&mut p, a) - before[0], sent(&mut p, b) - before[1]];
        // The packet that crossed the quantum is at most one datagram.
        let largest = p.client.io.max_payload();
        assert!(bytes[0] <= qa + largest, "{bytes:?} quantum {qa}");
        assert!(bytes[1] <= qb + largest, "{bytes:?} quantum {qb}");
        if bytes[0] > 0 && bytes[1] > 0 {
            rounds_with_both += 1;
        }
        p.step();
    }
    assert!(rounds_with_both > 10, "{rounds_with_both} rounds");
    let sent = |p: &mut Pair, c| p.client.ep.conn_stats(c).unwrap().bytes_sent as f64;
    let (x, y) = (sent(&mut p, a), sent(&mut p, b));
    assert!(x > 1e6 && y > 1e6, "{x} {y}");
    // Neither starves. How far apart they end is cubic's doing, not the
    // round robin's: with a core busy elsewhere the windows drift to
    // 1.5-1.55x in about one run in eight (seen in CI); starving one
    // connection gives far more.
    assert!(x.max(y) / x.min(y) < 2.0, "unfair: {x} against {y} bytes");
}

#[test]
fn a_second_connection_resumes_the_tls_session() {
    let mut p = cluster_pair("resume", ImpairConfig::default());
    let conn = p.conn;
    let got_ticket = p.run_until(Duration::from_secs(5), |p| {
        p.client.ep.session(conn).is_some()
    });
    assert!(got_ticket, "the server sent a session ticket");
    assert!(!p.client.ep.is_resumed(conn));
    let session = p.client.ep.session(conn).unwrap();
    let again = p
        .client
        .ep
        .connect_resuming(
            SocketAddrV4::new(CLIENT_IP, 50001),
            SocketAddrV4::new(SERVER_IP, PORT),
            Some("server"),
            Some(&session),
        )
        .unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p
        .client
        .ep
        .is_established(again)));
    assert!(p.client.ep.is_resumed(again));
}
