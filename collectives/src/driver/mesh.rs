//! The full mesh of QUIC connections of one rank: one endpoint on one
//! backend, `conns_per_peer` connections to every other rank (the lower
//! rank dials, the higher accepts), one long-lived bidirectional stream per
//! connection carrying length-prefixed engine messages.
//!
//! A dialled connection's first frame is a hello naming the dialler's
//! rank, so the acceptor identifies peers by what they say, not by their
//! source address (which NAT or a wildcard bind may change). Under mutual
//! TLS what they say must match their certificate's name (`node_name`).
//!
//! A rank that leaves says goodbye before its FIN: a frame with the number
//! of collectives it completed and whether it left after a failure. A peer
//! still in a later collective then fails at once instead of waiting out
//! its timeout. The QUIC close carries the same goodbye as its reason: a
//! rank that leaves mid-collective closes with data still queued, and the
//! close discards the goodbye frame behind it. (The liveness links carry
//! it too, module `goodbye`: a close is one datagram, and may be lost.)

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use stack::io::PacketIo;
use stack::quic::{CloseReason, ConnHandle, Endpoint, Event, QuicConfig, QuicError, Trust};
use tracing::{debug, warn};

use super::backend::{Backend, Counting, WireCounters};
use super::framing::{FrameQueue, FrameReader};
pub use super::goodbye::Goodbye;
use super::identity;
use super::watch::Watch;
use super::DriverConfig;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::Progress;

/// ALPN of the collectives protocol between ranks.
/// (2: ranks say goodbye when they leave.)
pub const COLL_ALPN: &[u8] = b"ainftp-coll/2";
/// Rank `r`'s TLS name: the dialler expects it in the acceptor's
/// certificate, so with cluster certificates each rank's node is named so
/// (`ainftp-dp certs --node rank0 --node rank1 ...`).
pub fn node_name(rank: usize) -> String {
    format!("rank{rank}")
}
const HELLO_MAGIC: &[u8; 8] = b"AINFTPH1";
const HELLO_LEN: usize = 16;
/// How long after a rank's goodbye on the liveness link its datagrams may
/// still arrive: those it sent before closing, in flight (its QUIC sends
/// nothing after the close, retransmissions included).
const LINK_BYE_GRACE: Duration = Duration::from_millis(200);

/// Largest frame accepted: far above the engine's largest message (a
/// 65535-element f32 chunk plus header), far below anything that could
/// exhaust memory.
const MAX_FRAME: usize = 16 << 20;

/// Application close code for a connection that is not a rank of the job
/// (its goodbye-carrying closes use 0).
const REFUSED: u64 = 1;

/// Stream bytes read from one link per turn, so one busy peer cannot
/// starve the others.
const READ_BUDGET: usize = 4 << 20;

/// How long a rank whose address was found closed (ICMP port unreachable)
/// may stay silent before it counts as gone. A crashed process never
/// speaks again; a live one whose NAT gave it a new outside port speaks
/// from there as soon as it runs its loop (its QUIC keepalive or its next
/// collective), and the closed port was only its old mapping.
const CLOSED_GRACE: Duration = Duration::from_secs(1);

/// How long an accepted connection may go without its hello. A rank sends
/// it right after the handshake, so this covers retransmissions on a lossy
/// path; a stranger that says nothing is closed after it instead of
/// holding a place until newer ones push it out.
const HELLO_LIMIT: Duration = Duration::from_secs(10);

struct Link {
    conn: ConnHandle,
    stream: Option<u64>,
    /// The peer's rank: known when dialled, from the hello when accepted.
    rank: Option<usize>,
    addr: SocketAddrV4,
    established: bool,
    /// Whether the stream exists in QUIC (a dialled stream exists once
    /// written; reading it before is an error).
    open: bool,
    /// We finished our side of the stream (closing: all our data is out).
    fin_sent: bool,
    /// The peer finished its side: it has nothing more to say and waits
    /// for our FIN to close.
    fin_received: bool,
    /// QUIC closed the connection.
    closed: bool,
    /// The backend's liveness slot for `addr`, once the link has a rank
    /// (an accepted link's hello may never come).
    slot: Option<usize>,
    out: FrameQueue,
    input: FrameReader,
    /// Engine message bytes queued on this connection (striping's share).
    bytes_queued: u64,
}

/// Counters of the mesh itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeshCounters {
    pub frames_sent: u64,
    pub frames_received: u64,
    /// Flushes that left bytes queued because QUIC flow or congestion
    /// control took less (backpressure).
    pub send_blocked: u64,
    /// Accepted connections closed before they said which rank they are
    /// (strangers: a bad hello, junk, a reset, silence).
    pub connections_refused: u64,
    /// Handshakes QUIC turned away or dropped for lack of room: Initials
    /// past its limits (handshakes in progress, in all or from their
    /// address; connections), and handshakes evicted for newer ones. The
    /// dialler retries after its probe timeout, a second or more later.
    pub handshakes_dropped: u64,
    /// Times a rank's next frame was left in its stream because the
    /// engine could not take it yet (a collective too far ahead, or no
    /// room to keep it early): QUIC's flow control holds that rank back.
    pub frames_held_back: u64,
}

/// Bytes a read moves when a closing peer's stream is kept whole.
const HELD_READ: usize = 256 * 1024;

/// What `take_frames` did with the frames a link's reader held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Every complete frame.
    All,
    /// It stopped at a frame the engine cannot take yet.
    HeldBack,
    /// The link was refused (a stranger that broke the protocol).
    Refused,
}

pub struct Mesh<B: Backend> {
    rank: usize,
    world: usize,
    conns_per_peer: usize,
    max_pending: usize,
    io: Counting<B>,
    ep: Endpoint<B::Buf>,
    tx: Vec<B::Buf>,
    links: Vec<Link>,
    /// Accepted links with when they were accepted, oldest first, until
    /// their hello came or `HELLO_LIMIT` passed.
    awaiting_hello: VecDeque<(Instant, usize, ConnHandle)>,
    by_conn: HashMap<ConnHandle, usize>,
    peer_links: Vec<Vec<usize>>,
    rr: Vec<usize>,
    peers: Vec<SocketAddrV4>,
    /// When each rank was last heard from (any packet).
    last_heard: Vec<Instant>,
    /// Frames moved and when that count last changed (`without_progress`).
    progress_mark: (u64, Instant),
    /// When the running collective started (`reset_liveness`): stalls
    /// count from here at the earliest.
    liveness_from: Instant,
    /// Ranks that said goodbye, in the order they did.
    departed: Vec<(usize, Goodbye)>,
    /// Ranks whose goodbye came on the liveness link, and when. A rank
    /// says it there after closing its QUIC connections: past
    /// `LINK_BYE_GRACE` nothing more of it is on the way, even where its
    /// close was lost and its connections here still look open.
    left_by_link: Vec<(usize, Instant)>,
    /// Ranks whose address was found closed, with when, in that order.
    closed: Vec<(usize, Instant)>,
    /// When each rank last sent us a datagram (only datagrams: unlike
    /// `last_heard`, never moved by `reset_liveness`).
    last_datagram: Vec<Option<Instant>>,
    /// Bytes queued in link queues, not yet accepted by QUIC.
    pending: usize,
    /// Rounds run (`turn` calls), for occasional backend upkeep.
    rounds: u64,
    closing: bool,
    counters: MeshCounters,
    /// Peers are verified against a cluster CA: a hello's rank must match
    /// the name in the dialler's certificate.
    names_verified: bool,
}

/// How long `Mesh::connect` waits for every peer, and the job's liveness
/// links, if it has them: a rank they find gone ends the wait at once.
pub struct ConnectWait<'a> {
    pub limit: Duration,
    pub watch: Option<&'a mut Watch>,
}

impl<B: Backend> Mesh<B> {
    /// Dials the higher ranks and waits until every peer is connected and
    /// identified, or `wait.limit` passes.
    pub fn connect(
        rank: usize,
        world: usize,
        io: B,
        peers: Vec<SocketAddrV4>,
        cfg: &DriverConfig,
        wait: ConnectWait<'_>,
        engine: &mut Engine,
    ) -> Result<Mesh<B>> {
        if peers.len() != world {
            return Err(Error::Transport(format!(
                "{} peer addresses for a world of {world}",
                peers.len()
            )));
        }
        cfg.validate()?;
        let payload = io.max_payload();
        let (quic, _identity) = match &cfg.quic.cert_chain {
            Some(_) => (cfg.quic.clone(), None),
            None => {
                let (q, dir) = identity::ephemeral(rank, cfg.quic.clone())?;
                (q, Some(dir))
            }
        };
        let quic = QuicConfig {
            alpn: vec![COLL_ALPN.to_vec()],
            max_udp_payload: payload,
            // Liveness is the driver's (`DriverConfig::timeout`, during
            // collectives only); QUIC's idle timer would close healthy
            // connections while the trainer computes between collectives.
            idle_timeout: Duration::ZERO,
            // A link is one bidirectional stream, opened by the dialler,
            // and no DATAGRAM frames: a peer may open nothing else, which
            // nobody would read (a stranger's streams and datagrams sat in
            // QUIC's buffers, up to the connection window, 64 MiB).
            max_streams_bidi: 1,
            max_streams_uni: 0,
            datagram_queue: None,
            // Every rank may dial at once, all from one address (ranks
            // on one host share it): room for all of their handshakes.
            max_handshakes: quic.max_handshakes.max(world * cfg.conns_per_peer),
            max_handshakes_per_ip: quic.max_handshakes_per_ip.max(world * cfg.conns_per_peer),
            ..quic
        };
        let names_verified = matches!(quic.trust, Trust::ClusterCa(_));
        let ep = Endpoint::server(quic, 0, payload)
            .map_err(|e| Error::Transport(format!("QUIC endpoint: {e}")))?;
        let mut mesh = Mesh {
            rank,
            world,
            conns_per_peer: cfg.conns_per_peer,
            max_pending: cfg.max_pending_bytes,
            io: Counting::new(io),
            ep,
            tx: Vec::new(),
            links: Vec::new(),
            awaiting_hello: VecDeque::new(),
            by_conn: HashMap::new(),
            peer_links: vec![Vec::new(); world],
            rr: vec![0; world],
            peers,
            last_heard: vec![Instant::now(); world],
            liveness_from: Instant::now(),
            progress_mark: (0, Instant::now()),
            departed: Vec::new(),
            left_by_link: Vec::new(),
            closed: Vec::new(),
            last_datagram: vec![None; world],
            pending: 0,
            rounds: 0,
            closing: false,
            counters: MeshCounters::default(),
            names_verified,
        };
        let local = SocketAddrV4::new(mesh.io.local_ip(), mesh.io.inner.local_port());
        for peer in rank + 1..world {
            for c in 0..cfg.conns_per_peer {
                let addr = mesh.peers[peer];
                let conn = mesh
                    .ep
                    .connect_via(&mesh.io, local, addr, Some(&node_name(peer)))
                    .map_err(|e| {
                        Error::Transport(format!("dialling rank {peer} at {addr}: {e}"))
                    })?;
                let stream = mesh
                    .ep
                    .open_bidi(conn)
                    .map_err(|e| Error::Transport(e.to_string()))?;
                let idx = mesh.add_link(conn, addr, Some(peer), Some(stream));
                let mut hello = Vec::with_capacity(HELLO_LEN);
                hello.extend_from_slice(HELLO_MAGIC);
                hello.extend_from_slice(&(rank as u32).to_le_bytes());
                hello.extend_from_slice(&(c as u32).to_le_bytes());
                mesh.links[idx].out.push(hello);
                mesh.pending += mesh.links[idx].out.pending_bytes();
            }
        }
        mesh.wait_connected(wait, engine)?;
        Ok(mesh)
    }

    fn add_link(
        &mut self,
        conn: ConnHandle,
        addr: SocketAddrV4,
        rank: Option<usize>,
        stream: Option<u64>,
    ) -> usize {
        let slot = rank.map(|_| self.io.watch(addr));
        // An accepted link may carry nothing but its hello until it says
        // which rank it is: a stranger's length prefix cannot make it
        // hold more (the limit is raised once the hello is taken).
        let input = match rank {
            Some(_) => FrameReader::new(MAX_FRAME),
            None => FrameReader::empty(HELLO_LEN),
        };
        // A closed stranger's place is taken again, so that strangers
        // coming and going cannot grow the table every turn walks.
        let reused = rank
            .is_none()
            .then(|| {
                (0..self.links.len())
                    .find(|&i| self.links[i].rank.is_none() && self.links[i].closed)
            })
            .flatten();
        if let Some(i) = reused {
            let old = self.links[i].conn;
            if self.by_conn.get(&old) == Some(&i) {
                self.by_conn.remove(&old);
            }
        }
        let link = Link {
            conn,
            stream,
            rank,
            addr,
            established: false,
            open: stream.is_some() && rank.is_none(),
            fin_sent: false,
            fin_received: false,
            closed: false,
            slot,
            out: FrameQueue::default(),
            input,
            bytes_queued: 0,
        };
        let idx = match reused {
            Some(i) => {
                self.links[i] = link;
                i
            }
            None => {
                self.links.push(link);
                self.links.len() - 1
            }
        };
        self.by_conn.insert(conn, idx);
        if let Some(r) = rank {
            self.peer_links[r].push(idx);
        }
        idx
    }

    /// Messages of a fast peer's first collective may arrive meanwhile:
    /// `engine` (idle) keeps them for when that collective starts here.
    /// A rank that `watch` (the job's liveness links) finds gone fails the
    /// wait at once: it will never connect.
    fn wait_connected(&mut self, wait: ConnectWait<'_>, engine: &mut Engine) -> Result<()> {
        let ConnectWait { limit, mut watch } = wait;
        let start = Instant::now();
        loop {
            let moved = self.turn(engine, &mut [], &mut false)?;
            if let Some(w) = watch.as_deref_mut() {
                w.poll();
                if let Some(rank) = w.lost().into_iter().find(|&r| r != self.rank) {
                    return Err(Error::PeerLost {
                        rank,
                        addr: self.peers[rank].to_string(),
                        seq: 0,
                    });
                }
            }
            // A dialled link counts once the peer acknowledged our hello:
            // by then its HANDSHAKE_DONE has reached us too (it leads the
            // peer's 1-RTT packets). Before that confirmation quiche can
            // send our application close only in Handshake packets, which
            // the peer has stopped reading: a rank that left right after
            // connecting was then found only by ICMP or the timeout.
            let missing: Vec<usize> = (0..self.world)
                .filter(|&r| {
                    r != self.rank
                        && self.peer_links[r]
                            .iter()
                            .filter(|&&l| {
                                let l = &self.links[l];
                                l.established && l.out.all_acknowledged()
                            })
                            .count()
                            < self.conns_per_peer
                })
                .collect();
            if missing.is_empty() && self.pending == 0 {
                // Every peer answered: a port found closed while dialling
                // was one not bound yet.
                self.closed.clear();
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::ConnectTimeout {
                    missing,
                    waited_ms: limit.as_millis() as u64,
                });
            }
            if moved == 0 {
                self.idle_wait(Duration::from_millis(5))?;
            }
        }
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// The largest UDP payload of the backend (QUIC's datagram size).
    pub fn max_payload(&self) -> usize {
        self.io.max_payload()
    }

    pub fn peers(&self) -> &[SocketAddrV4] {
        &self.peers
    }

    pub fn wire(&self) -> WireCounters {
        self.io.wire
    }

    /// Engine message bytes sent to `rank` on each of its connections,
    /// in the order they were made (the stripes of `conns_per_peer`).
    pub fn bytes_per_connection(&self, rank: usize) -> Vec<u64> {
        self.peer_links[rank]
            .iter()
            .map(|&i| self.links[i].bytes_queued)
            .collect()
    }

    pub fn counters(&self) -> MeshCounters {
        let q = self.ep.stats();
        MeshCounters {
            handshakes_dropped: q.handshake_limited
                + q.handshake_limited_per_ip
                + q.handshakes_evicted,
            ..self.counters
        }
    }

    pub fn last_heard(&self, rank: usize) -> Instant {
        self.last_heard[rank]
    }

    /// Since when one of the connections to `rank` has made no progress
    /// (the earliest such: what it sends is lost, not acknowledged),
    /// though `rank` may still be heard: a path that drops our packets
    /// (QUIC's stall, see `stack::quic::stall`).
    /// Counted from the start of the running collective at the earliest;
    /// `None` while every connection to it makes progress.
    pub fn stalled_since(&self, rank: usize) -> Option<Instant> {
        self.peer_links[rank]
            .iter()
            .filter_map(|&i| self.ep.stalled_since(self.links[i].conn))
            .min()
            .map(|t| t.max(self.liveness_from))
    }

    /// Ranks whose address was found closed and that have sent nothing
    /// in the `CLOSED_GRACE` since: their process is gone (a crashed peer
    /// never sends again; one that had not bound yet, a firewall's passing
    /// reject, or a NAT that moved the peer to a new port, is cleared by
    /// its next datagram).
    pub fn gone(&self, now: Instant) -> impl Iterator<Item = usize> + '_ {
        self.closed
            .iter()
            .filter(move |&&(r, at)| silent_since_closed(at, self.last_datagram[r], now))
            .map(|&(r, _)| r)
    }

    /// Points each link at the address its connection now sends to. QUIC
    /// follows a peer whose NAT moved it to a new outside port; which
    /// datagrams count as heard from the peer, and which closed port is
    /// its, must follow too.
    fn follow_moved_peers(&mut self) {
        for l in &mut self.links {
            let Some(now) = self.ep.peer(l.conn).filter(|&a| a != l.addr) else {
                continue;
            };
            debug!(rank = ?l.rank, from = %l.addr, to = %now, "peer moved");
            l.addr = now;
            l.slot = l.slot.map(|slot| self.io.rewatch(slot, now));
        }
    }

    fn note_closed_ports(&mut self, now: Instant) {
        for addr in self.io.inner.take_closed_ports() {
            // A linked rank's address is its link's (where its connection
            // sends now: an old one a NAT left behind says nothing); a rank
            // not linked yet may not have bound its listed address.
            let rank = match self
                .links
                .iter()
                .find(|l| l.addr == addr && l.rank.is_some())
            {
                Some(l) => l.rank,
                None => self
                    .peers
                    .iter()
                    .position(|&p| p == addr)
                    .filter(|&r| self.peer_links[r].is_empty()),
            };
            let Some(r) = rank.filter(|&r| r != self.rank) else {
                continue;
            };
            debug!(rank = r, %addr, "peer's port is closed");
            match self.closed.iter_mut().find(|(c, _)| *c == r) {
                Some(entry) => entry.1 = now,
                None => self.closed.push((r, now)),
            }
        }
    }

    /// Ranks that said goodbye, in the order they did (the first is the
    /// likeliest cause when others left because of it).
    pub fn departed(&self) -> &[(usize, Goodbye)] {
        &self.departed
    }

    /// Counts every peer as heard from now (at the start of a collective:
    /// silence between collectives is not a failure).
    pub fn reset_liveness(&mut self) {
        let now = Instant::now();
        self.liveness_from = now;
        self.progress_mark = (self.frames_moved(), now);
        for t in &mut self.last_heard {
            *t = (*t).max(now);
        }
    }

    /// How long no frame has moved, ours (queued) or a peer's (read),
    /// counted from the running collective's start at the earliest.
    pub fn without_progress(&mut self, now: Instant) -> Duration {
        let moved = self.frames_moved();
        if moved != self.progress_mark.0 {
            self.progress_mark = (moved, now);
        }
        now.saturating_duration_since(self.progress_mark.1)
    }

    fn frames_moved(&self) -> u64 {
        self.counters.frames_sent + self.counters.frames_received
    }

    /// Nothing of ours is waiting in the driver or the device queue.
    pub fn is_flushed(&self) -> bool {
        self.pending == 0 && self.tx.is_empty()
    }

    /// One round: receive and run QUIC timers, hand complete frames to the
    /// engine, queue what it produced, send. Returns a measure of the work
    /// done (0: nothing happened). `completed` is set when `engine`
    /// reported completion during the round.
    pub fn turn(
        &mut self,
        engine: &mut Engine,
        buf: &mut [f32],
        completed: &mut bool,
    ) -> Result<usize> {
        let mut work = self.ep.drive(&mut self.io, &mut self.tx);
        // Streams before events: a peer's last data precedes its close.
        work += self.read_all(engine, buf, completed)?;
        self.events()?;
        self.pull(engine)?;
        work += self.flush_all()?;
        for link in &mut self.links {
            link.out.reclaim(|body| engine.recycle(body));
        }
        let now = Instant::now();
        self.ep.send(&mut self.io, &mut self.tx, now);
        if !self.tx.is_empty() {
            work += self.io.send_burst(&mut self.tx);
        }
        // The backend's own timers (ARP on the DPDK stack) need not run
        // every round.
        self.rounds = self.rounds.wrapping_add(1);
        if work == 0 || self.rounds.is_multiple_of(64) {
            self.io.poll(now);
            self.follow_moved_peers();
            self.note_closed_ports(now);
            self.refuse_silent(now);
        }
        for l in &self.links {
            if let (Some(r), Some(slot)) = (l.rank, l.slot) {
                if self.io.take_heard(slot) {
                    self.last_heard[r] = now;
                    self.last_datagram[r] = Some(now);
                }
            }
        }
        Ok(work)
    }

    fn events(&mut self) -> Result<()> {
        while let Some(ev) = self.ep.poll_event() {
            match ev {
                Event::Established { conn, peer, .. } => match self.by_conn.get(&conn) {
                    Some(&i) => self.links[i].established = true,
                    None => {
                        // Accepted: the hello will say who it is. More
                        // unidentified than every rank could open are not
                        // all ranks: the oldest goes (a rank's hello comes
                        // right after its handshake; a stranger that
                        // stays silent cannot keep ranks out).
                        let oldest = self.oldest_unidentified();
                        let full = self.unidentified().count() >= self.world * self.conns_per_peer;
                        if let Some(oldest) = oldest.filter(|_| full) {
                            self.refuse(
                                oldest,
                                "too many connections that have not said which rank they are",
                            );
                        }
                        let i = self.add_link(conn, peer, None, None);
                        self.links[i].established = true;
                        self.awaiting_hello.push_back((Instant::now(), i, conn));
                    }
                },
                Event::Closed {
                    conn, peer, reason, ..
                } => {
                    let Some(&i) = self.by_conn.get(&conn) else {
                        continue;
                    };
                    self.links[i].closed = true;
                    if self.closing || self.links[i].fin_received {
                        continue;
                    }
                    if let (Some(rank), Some(bye)) = (self.links[i].rank, self.goodbye_in(&reason))
                    {
                        // The peer left on purpose: its goodbye rode on the
                        // close. Collectives it did not complete fail with
                        // its cause (`Communicator::check_departed`).
                        debug!(rank, ?bye, "peer closed with a goodbye");
                        self.note_departed(rank, bye);
                        continue;
                    }
                    match self.links[i].rank {
                        // Its goodbye came another way (the stream, or the
                        // liveness link when the close itself was lost and
                        // the connection timed out): the departure says
                        // what fails, with the cause it named.
                        Some(rank) if self.has_departed(rank) => {
                            debug!(rank, %reason, "a departed peer's connection closed");
                        }
                        Some(rank) => {
                            return Err(Error::PeerClosed {
                                rank,
                                addr: peer.to_string(),
                                reason: describe(&reason),
                            });
                        }
                        None => {
                            debug!(%peer, %reason, "unidentified connection closed");
                            self.links[i].input = FrameReader::empty(0);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn read_all(
        &mut self,
        engine: &mut Engine,
        buf: &mut [f32],
        completed: &mut bool,
    ) -> Result<usize> {
        let mut frames = 0;
        for i in 0..self.links.len() {
            if !self.links[i].established {
                continue;
            }
            if self.links[i].closed {
                // Frames a rank's closed link still holds (ones held back
                // until this rank caught up, its goodbye behind them) are
                // taken as the engine can.
                if self.links[i].rank.is_some() && self.links[i].input.has_frame() {
                    let conn = self.links[i].conn;
                    self.take_frames(i, conn, engine, buf, completed, &mut frames)?;
                }
                continue;
            }
            if self.links[i].stream.is_none() {
                let conn = self.links[i].conn;
                let first = match self.ep.readable(conn) {
                    Ok(mut streams) => streams.next(),
                    Err(QuicError::NoConnection) => {
                        self.links[i].closed = true;
                        continue;
                    }
                    Err(e) => return Err(Error::Transport(e.to_string())),
                };
                match first {
                    Some(s) => {
                        self.links[i].stream = Some(s);
                        self.links[i].open = true;
                    }
                    None => continue,
                }
            }
            if !self.links[i].open {
                continue;
            }
            frames += self.read_link(i, engine, buf, completed)?;
        }
        Ok(frames)
    }

    fn read_link(
        &mut self,
        i: usize,
        engine: &mut Engine,
        buf: &mut [f32],
        completed: &mut bool,
    ) -> Result<usize> {
        let mut frames = 0;
        let mut read = 0;
        let (conn, stream) = (self.links[i].conn, self.links[i].stream.expect("known"));
        loop {
            // The frames already here go first: one the engine cannot take
            // yet leaves the link unread (and the peer held back by QUIC's
            // flow control) until it can.
            match self.take_frames(i, conn, engine, buf, completed, &mut frames)? {
                Taken::All => {}
                Taken::Refused => return Ok(frames),
                Taken::HeldBack => {
                    self.keep_a_closing_peers_rest(i, conn, stream);
                    return Ok(frames);
                }
            }
            if self.links[i].fin_received || read >= READ_BUDGET {
                return Ok(frames);
            }
            let link = &mut self.links[i];
            let want = link.input.wanted();
            let got = match self.ep.stream_recv(conn, stream, link.input.spare(want)) {
                Ok(got) => got,
                // QUIC removed it this round: `events` says why (the
                // peer's close, with its rank) after the reads.
                Err(QuicError::NoConnection) => {
                    link.closed = true;
                    return Ok(frames);
                }
                // A stranger that resets its stream (or breaks it another
                // way) is refused; a rank that does fails the collective.
                Err(e) if link.rank.is_none() => {
                    self.refuse(i, &format!("its stream failed: {e}"));
                    return Ok(frames);
                }
                Err(e) => return Err(Error::Transport(format!("stream from {}: {e}", link.addr))),
            };
            let Some((n, fin)) = got else {
                return Ok(frames);
            };
            if n == 0 && !fin {
                return Ok(frames);
            }
            link.input.filled(n);
            read += n;
            if fin {
                // The peer is leaving; if we still needed data from it the
                // liveness check reports it once it is gone. Its last
                // frames are taken above, now or once the engine can.
                link.fin_received = true;
                debug!(addr = %link.addr, "peer finished its stream");
            }
        }
    }

    /// A held-back link whose peer closed its connection (QUIC drains
    /// it): what QUIC holds of its stream goes when QUIC drops the
    /// connection, so all of it moves into the reader now, to be taken as
    /// this rank catches up. (Credit no longer matters: nothing more comes.)
    fn keep_a_closing_peers_rest(&mut self, i: usize, conn: ConnHandle, stream: u64) {
        if !self
            .ep
            .connection_mut(conn)
            .is_some_and(|c| c.is_draining())
        {
            return;
        }
        let link = &mut self.links[i];
        while !link.fin_received {
            match self
                .ep
                .stream_recv(conn, stream, link.input.spare(HELD_READ))
            {
                Ok(Some((n, fin))) if n > 0 || fin => {
                    link.input.filled(n);
                    link.fin_received = fin;
                }
                _ => break,
            }
        }
    }

    /// Takes the complete frames in link `i`'s reader: hands a rank's to
    /// the engine (or notes its goodbye), reads a stranger's hello.
    fn take_frames(
        &mut self,
        i: usize,
        conn: ConnHandle,
        engine: &mut Engine,
        buf: &mut [f32],
        completed: &mut bool,
        frames: &mut usize,
    ) -> Result<Taken> {
        loop {
            let link = &mut self.links[i];
            if link.rank.is_some() {
                if let Ok(Some(frame)) = link.input.peek_frame() {
                    if !Goodbye::is_frame(frame) && !engine.takes_now(frame) {
                        self.counters.frames_held_back += 1;
                        return Ok(Taken::HeldBack);
                    }
                }
            }
            let frame = match link.input.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(Taken::All),
                Err(t) => {
                    let reason = format!("frame of {} bytes exceeds the limit of {}", t.len, t.max);
                    let Some(rank) = link.rank else {
                        self.refuse(i, &reason);
                        return Ok(Taken::Refused);
                    };
                    let framing = Error::Framing {
                        peer: link.addr.to_string(),
                        reason,
                    };
                    return Err(from_peer(rank, link.addr, framing));
                }
            };
            *frames += 1;
            self.counters.frames_received += 1;
            match link.rank {
                Some(from) if Goodbye::is_frame(frame) => {
                    let bye = Goodbye::from_frame(frame, self.world);
                    debug!(rank = from, ?bye, "peer said goodbye");
                    self.note_departed(from, bye);
                }
                Some(from) => match engine.handle(from, frame, buf) {
                    Ok(Progress::Complete) => *completed = true,
                    Ok(Progress::Pending) => {}
                    Err(e) if e.is_senders_doing() => return Err(from_peer(from, link.addr, e)),
                    Err(e) => return Err(e),
                },
                None => {
                    let names = self.names_verified.then(|| self.ep.peer_names(conn));
                    let claim =
                        parse_hello(frame, self.world, self.rank).and_then(|rank| match &names {
                            Some(names) => check_claim(rank, names).map(|()| rank),
                            None => Ok(rank),
                        });
                    let from = match claim {
                        Ok(rank) => rank,
                        Err(reason) => {
                            self.refuse(i, &reason);
                            return Ok(Taken::Refused);
                        }
                    };
                    // A rank opens `conns_per_peer` connections: a
                    // hello beyond them is not that rank's.
                    let held = self.peer_links[from]
                        .iter()
                        .filter(|&&j| !self.links[j].closed)
                        .count();
                    if held >= self.conns_per_peer {
                        let why = format!(
                            "rank {from} has its {} connection(s) already",
                            self.conns_per_peer
                        );
                        self.refuse(i, &why);
                        return Ok(Taken::Refused);
                    }
                    let link = &mut self.links[i];
                    link.input.set_max_frame(MAX_FRAME);
                    link.rank = Some(from);
                    link.slot = Some(self.io.watch(link.addr));
                    debug!(rank = from, addr = %link.addr, "peer identified");
                    self.peer_links[from].push(i);
                }
            }
        }
    }

    /// Closes accepted link `i`, which broke the protocol before saying
    /// which rank it is: whoever it is, it is not a rank of this job, and
    /// the job goes on (a rank that breaks it fails the collective).
    fn refuse(&mut self, i: usize, reason: &str) {
        let link = &mut self.links[i];
        warn!(addr = %link.addr, reason, "refusing a connection that is not a rank of this job");
        let _ = self.ep.close(link.conn, REFUSED, reason.as_bytes());
        link.closed = true;
        self.counters.connections_refused += 1;
        // Its buffer goes now; the link stays (indexes are kept).
        link.input = FrameReader::empty(0);
    }

    /// Closes accepted links that said no hello within `HELLO_LIMIT`.
    fn refuse_silent(&mut self, now: Instant) {
        while let Some(&(since, i, conn)) = self.awaiting_hello.front() {
            if now.saturating_duration_since(since) < HELLO_LIMIT {
                break;
            }
            self.awaiting_hello.pop_front();
            // (A place whose stranger closed may hold a newer one now.)
            let link = &self.links[i];
            if link.conn == conn && link.rank.is_none() && !link.closed {
                let why = format!("said no hello within {} s", HELLO_LIMIT.as_secs());
                self.refuse(i, &why);
            }
        }
    }

    /// Accepted links that are open and have not said which rank they
    /// are.
    fn unidentified(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.links.len()).filter(|&i| self.links[i].rank.is_none() && !self.links[i].closed)
    }

    /// The one of them accepted first. By the order they came in, not by
    /// their place in `links`: a new one may take a closed stranger's
    /// place before older ones, and must not be the first to go.
    fn oldest_unidentified(&self) -> Option<usize> {
        self.awaiting_hello
            .iter()
            .find(|&&(_, i, conn)| {
                let l = &self.links[i];
                l.conn == conn && l.rank.is_none() && !l.closed
            })
            .map(|&(_, i, _)| i)
    }

    /// Moves engine messages into link queues while the driver holds
    /// less than `max_pending` bytes (the rest stays in the engine).
    fn pull(&mut self, engine: &mut Engine) -> Result<()> {
        while self.pending < self.max_pending {
            let Some(out) = engine.poll_send() else {
                break;
            };
            let links = &self.peer_links[out.to];
            if links.is_empty() {
                return Err(Error::Transport(format!(
                    "no connection to rank {} (it never connected?)",
                    out.to
                )));
            }
            // Stripe over the peer's connections.
            let k = self.rr[out.to] % links.len();
            self.rr[out.to] = self.rr[out.to].wrapping_add(1);
            let link = &mut self.links[links[k]];
            self.pending += super::framing::LEN_BYTES + out.bytes.len();
            link.bytes_queued += out.bytes.len() as u64;
            link.out.push(out.bytes);
            self.counters.frames_sent += 1;
        }
        Ok(())
    }

    fn flush_all(&mut self) -> Result<usize> {
        let mut total = 0;
        let Mesh {
            ep,
            links,
            pending,
            counters,
            ..
        } = self;
        for link in links.iter_mut() {
            let Some(stream) = link.stream else { continue };
            if !link.established || link.closed || link.out.is_empty() {
                continue;
            }
            let conn = link.conn;
            let took = match link
                .out
                .flush(|piece| ep.stream_send_shared(conn, stream, piece, false))
            {
                Ok(took) => took,
                Err(QuicError::NoConnection) => {
                    link.closed = true;
                    continue;
                }
                Err(e) => return Err(Error::Transport(format!("stream to {}: {e}", link.addr))),
            };
            *pending -= took;
            total += took;
            link.open |= took > 0;
            if !link.out.is_empty() {
                counters.send_blocked += 1;
            }
        }
        Ok(total)
    }

    /// Makes every connection send something the peer must acknowledge,
    /// so a live peer is heard from even when it has no data for us.
    pub fn ping_all(&mut self) {
        for l in &self.links {
            if let Some(c) = self.ep.connection_mut(l.conn) {
                let _ = c.send_ack_eliciting();
            }
        }
    }

    /// Sleeps until traffic arrives, a QUIC timer is due or `limit` passes.
    pub fn idle_wait(&mut self, limit: Duration) -> Result<()> {
        let now = Instant::now();
        let mut t = limit;
        if let Some(at) = self.ep.next_timeout() {
            t = t.min(at.saturating_duration_since(now));
        }
        if t.is_zero() {
            return Ok(());
        }
        self.io.inner.wait(!self.tx.is_empty(), t)
    }

    /// Leaves cleanly: finishes our streams once everything queued is
    /// out, waits (up to `linger`) until every peer has finished its own
    /// (so no peer still needs data from us, and QUIC delivered ours),
    /// then closes the connections. Returns the ranks that did not finish.
    /// `bye`: what this rank tells its peers as it goes.
    pub fn close(&mut self, engine: &mut Engine, linger: Duration, bye: Goodbye) -> Vec<usize> {
        self.say_goodbye(bye);
        let start = Instant::now();
        loop {
            let moved = self.turn(engine, &mut [], &mut false).unwrap_or(0);
            self.send_fins();
            // Ranks only: a connection that never said which rank it is
            // has nothing of ours to wait for; nor has one whose rank
            // said goodbye on its liveness link (closed at its end).
            let now = Instant::now();
            let waiting = self.links.iter().any(|l| {
                l.rank.is_some_and(|r| !self.closed_by_link(r, now))
                    && l.established
                    && !l.closed
                    && !(l.fin_received && l.fin_sent)
            });
            if !waiting || start.elapsed() >= linger {
                break;
            }
            if moved == 0 {
                let _ = self.idle_wait(Duration::from_millis(5));
            }
        }
        let mut unfinished: Vec<usize> = self
            .links
            .iter()
            .filter(|l| l.established && !l.closed && !l.fin_received)
            .filter_map(|l| l.rank)
            .collect();
        unfinished.dedup();
        for l in &self.links {
            if let Ok(stats) = self.ep.conn_stats(l.conn) {
                debug!(rank = self.rank, peer = ?l.rank, ?stats, "connection statistics at close");
            }
        }
        // Our FINs (and anything else queued) reach the wire before the
        // close, which would discard them.
        for _ in 0..3 {
            let _ = self.turn(engine, &mut [], &mut false);
        }
        self.closing = true;
        // The close carries the goodbye too: it discards whatever is still
        // queued on the stream, the goodbye frame included.
        let reason = bye.to_frame();
        for l in &self.links {
            let _ = self.ep.close(l.conn, 0, &reason);
        }
        let start = Instant::now();
        while self.ep.connections() > 0 && start.elapsed() < Duration::from_millis(100) {
            let moved = self.turn(engine, &mut [], &mut false).unwrap_or(1);
            if moved == 0 {
                let _ = self.idle_wait(Duration::from_millis(1));
            }
        }
        unfinished
    }

    /// The goodbye a peer's application close carries as its reason.
    fn goodbye_in(&self, reason: &CloseReason) -> Option<Goodbye> {
        match reason {
            CloseReason::Peer {
                app: true, reason, ..
            } if Goodbye::is_frame(reason) => Some(Goodbye::from_frame(reason, self.world)),
            _ => None,
        }
    }

    /// Whether some of our frames for `rank` wait on its links.
    pub fn sends_waiting_for(&self, rank: usize) -> bool {
        self.peer_links[rank]
            .iter()
            .any(|&j| !self.links[j].out.is_empty())
    }

    /// Whether nothing more can come from `rank`: each of its links is
    /// closed or has its stream finished (or the rank said goodbye on its
    /// liveness link a grace ago), and holds no frame not taken yet.
    pub fn nothing_more_from(&self, rank: usize) -> bool {
        let links = &self.peer_links[rank];
        let gone = self.closed_by_link(rank, Instant::now());
        !links.is_empty()
            && links.iter().all(|&j| {
                let l = &self.links[j];
                (gone || l.closed || l.fin_received) && !l.input.has_frame()
            })
    }

    /// `rank` said goodbye on its liveness link at least `LINK_BYE_GRACE`
    /// before `now`: its QUIC connections are closed at its end.
    fn closed_by_link(&self, rank: usize, now: Instant) -> bool {
        self.left_by_link
            .iter()
            .any(|&(r, at)| r == rank && now.saturating_duration_since(at) >= LINK_BYE_GRACE)
    }

    /// Records `rank`'s goodbye, once per rank though it comes on every
    /// connection, on the close as well as the stream, and on the liveness
    /// links (`Watch::take_departed`).
    pub fn note_departed(&mut self, rank: usize, bye: Goodbye) {
        if !self.has_departed(rank) {
            self.departed.push((rank, bye));
        }
    }

    /// `note_departed` for a goodbye heard on the liveness link at `now`.
    pub fn note_departed_by_link(&mut self, rank: usize, bye: Goodbye, now: Instant) {
        self.note_departed(rank, bye);
        if !self.left_by_link.iter().any(|&(r, _)| r == rank) {
            self.left_by_link.push((rank, now));
        }
    }

    /// Whether `rank` said goodbye (any way it came).
    pub fn has_departed(&self, rank: usize) -> bool {
        self.departed.iter().any(|&(r, _)| r == rank)
    }

    /// Queues the goodbye on every link that carries a stream, behind
    /// anything still queued there.
    fn say_goodbye(&mut self, bye: Goodbye) {
        let frame = bye.to_frame();
        for l in &mut self.links {
            if l.stream.is_none() || !l.established || l.closed || l.fin_sent {
                continue;
            }
            let before = l.out.pending_bytes();
            l.out.push(frame.clone());
            self.pending += l.out.pending_bytes() - before;
        }
    }

    fn send_fins(&mut self) {
        for l in &mut self.links {
            let Some(stream) = l.stream else { continue };
            if l.established && !l.closed && l.open && !l.fin_sent && l.out.is_empty() {
                l.fin_sent = self.ep.stream_send(l.conn, stream, &[], true).is_ok();
            }
        }
    }

    /// The address of the rank that has been silent longest, for errors.
    pub fn addr_of(&self, rank: usize) -> SocketAddrV4 {
        self.peer_links[rank]
            .first()
            .map(|&l| self.links[l].addr)
            .unwrap_or(self.peers[rank])
    }
}

/// Why a connection closed, in words (TLS alerts by name), with where to
/// look when certificates are the likely cause.
fn describe(reason: &CloseReason) -> String {
    match reason.is_certificate_trouble() {
        true => format!("{reason} (are both ranks' certificates from the same cluster CA?)"),
        false => reason.to_string(),
    }
}

/// `e`, named as rank `rank`'s doing: its goodbye then blames that rank,
/// not this one (every other rank would see this rank leave first).
fn from_peer(rank: usize, addr: SocketAddrV4, e: Error) -> Error {
    Error::FromPeer {
        rank,
        addr: addr.to_string(),
        source: Box::new(e),
    }
}

fn parse_hello(frame: &[u8], world: usize, me: usize) -> std::result::Result<usize, String> {
    if frame.len() != HELLO_LEN || &frame[..8] != HELLO_MAGIC {
        return Err("first frame is not an ainftp collectives hello".into());
    }
    let rank = u32::from_le_bytes(frame[8..12].try_into().expect("4 bytes")) as usize;
    if rank >= world || rank >= me {
        return Err(format!(
            "hello claims rank {rank}: only ranks below {me} dial rank {me} (world {world})"
        ));
    }
    Ok(rank)
}

/// Under mutual TLS a dialler may claim only the rank its certificate
/// names (`node_name`): any member of the cluster could otherwise pose as
/// another rank and have its contributions counted as that rank's.
fn check_claim(rank: usize, names: &[String]) -> std::result::Result<(), String> {
    let want = node_name(rank);
    if names.contains(&want) {
        return Ok(());
    }
    Err(format!(
        "hello claims rank {rank}, but the peer's certificate is issued to {names:?}, \
         not {want}: a rank may only claim the rank its certificate names"
    ))
}

/// Whether a rank whose port was found closed at `closed` has said
/// nothing since (its last datagram came at `heard`) for `CLOSED_GRACE`.
fn silent_since_closed(closed: Instant, heard: Option<Instant>, now: Instant) -> bool {
    now.saturating_duration_since(closed) >= CLOSED_GRACE && heard.is_none_or(|h| h < closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_port_names_a_rank_gone_only_after_a_silent_grace() {
        let t0 = Instant::now();
        let after = |ms| t0 + Duration::from_millis(ms);
        let grace = CLOSED_GRACE.as_millis() as u64;
        // Never heard from, or not since the report: gone once the grace
        // is over, not before.
        assert!(!silent_since_closed(t0, None, after(grace - 1)));
        assert!(silent_since_closed(t0, None, after(grace)));
        assert!(silent_since_closed(after(10), Some(t0), after(10 + grace)));
        // A datagram at or after the report (the rank came back from a new
        // port, or had only bound late): not gone, however long ago.
        assert!(!silent_since_closed(t0, Some(t0), after(10 * grace)));
        assert!(!silent_since_closed(t0, Some(after(5)), after(10 * grace)));
    }

    #[test]
    fn a_hello_may_claim_only_the_rank_its_certificate_names() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(check_claim(2, &names(&["rank2"])), Ok(()));
        assert_eq!(check_claim(2, &names(&["other", "rank2"])), Ok(()));
        let err = check_claim(0, &names(&["rank2"])).unwrap_err();
        assert!(
            err.contains("claims rank 0") && err.contains("rank2"),
            "{err}"
        );
        // No certificate names nobody.
        assert!(check_claim(0, &[]).is_err());
        // Exact names only: "rank1" is not "rank10".
        assert!(check_claim(1, &names(&["rank10"])).is_err());
    }
}
