//! The DPDK backend: our host logic over one rx source (a port queue, a
//! ring fed by the steering lcore, or a queue plus an inbox ring the other
//! lcores hand frames to; see `io::steering`) and one tx queue. Received
//! UDP payloads are handed up in their mbufs (headers stripped with `adj`,
//! no copy); sent ones get their headers prepended in the mbuf's headroom.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Instant;

use dpdk_ffi::ring::{Consumer, Mpmc, Producer, Spsc};
use dpdk_ffi::{CsumStatus, Mbuf, MbufBatch, Mempool, PortFeatures, RxChecksum, RxQueue, TxQueue};

use crate::counters::{Counters, DropReason};
use crate::host::{EchoReply, Host, Resolve, TxOffload, Verdict};
use crate::io::steering::hand_over;
pub use crate::io::steering::{flow_hash, Outbox, PayloadOwner, Steering};
use crate::io::{CountedIo, Datagram, PacketIo};
use crate::wire::EthernetAddress;

/// Mbufs taken from the device per rx burst.
pub const RX_BURST: usize = 64;
/// Frames the backend holds for the tx queue (replies, released packets,
/// datagrams the NIC had no room for yet).
pub(super) const TX_HOLD: usize = 256;
const IPV4_UDP_OVERHEAD: usize = 28;

/// A UDP datagram in an mbuf whose data is exactly the payload.
pub struct UdpMbuf {
    mbuf: Mbuf,
    peer: SocketAddrV4,
    local_port: u16,
    capacity: u32,
    /// Header bytes stripped in front of the payload on receive, kept while
    /// the payload, its length and its addresses are untouched (0 after):
    /// a reply to the sender can then reuse the received headers turned
    /// around (the checksums stay valid) instead of building new ones.
    /// The struct stays small because it is moved through every burst.
    turnaround: u16,
}

impl UdpMbuf {
    pub fn mbuf(&self) -> &Mbuf {
        &self.mbuf
    }
}

impl Datagram for UdpMbuf {
    fn payload(&self) -> &[u8] {
        self.mbuf.data()
    }

    fn payload_mut(&mut self) -> &mut [u8] {
        self.turnaround = 0;
        self.mbuf.data_mut()
    }

    fn set_len(&mut self, len: usize) {
        self.turnaround = 0;
        let len = len.min(self.capacity as usize);
        let cur = self.mbuf.len();
        // Both fit: capacity is bounded by the payload's tailroom.
        let fits = if len > cur {
            self.mbuf.append(len - cur).is_ok()
        } else {
            self.mbuf.trim(cur - len).is_ok()
        };
        debug_assert!(fits, "a datagram's capacity exceeds its mbuf's room");
    }

    fn capacity(&self) -> usize {
        self.capacity as usize
    }

    fn peer(&self) -> SocketAddrV4 {
        self.peer
    }

    fn set_peer(&mut self, peer: SocketAddrV4) {
        if peer != self.peer {
            self.turnaround = 0;
        }
        self.peer = peer;
    }

    fn local_port(&self) -> u16 {
        self.local_port
    }

    fn set_local_port(&mut self, port: u16) {
        if port != self.local_port {
            self.turnaround = 0;
        }
        self.local_port = port;
    }
}

/// Where an lcore's received frames come from.
pub enum RxSource {
    Queue(RxQueue),
    /// Frames steered here by the lcore that owns the only rx queue.
    Ring(Consumer<Spsc>),
    /// A queue of its own, and the frames other lcores' queues received
    /// for this lcore's connections (see [`PayloadOwner`]).
    QueueAndInbox(RxQueue, Consumer<Mpmc>),
}

/// Where an lcore's outgoing frames go.
pub enum TxPath {
    Queue(TxQueue),
    /// The port has one tx queue, owned by the steering lcore: frames are
    /// handed back to it over a ring (counted as sent here).
    ToSteerer(Producer<Mpmc>),
}

pub struct DpdkIo {
    rx: RxSource,
    tx: TxPath,
    pool: Mempool,
    host: Host<Mbuf>,
    offload: TxOffload,
    rx_checksum_offload: bool,
    rx_batch: MbufBatch<RX_BURST>,
    tx_batch: MbufBatch<TX_HOLD>,
    /// Bytes in `tx_batch`, kept as frames are held, so a flush need not
    /// walk the batch to count what left.
    tx_held_bytes: usize,
    steering: Option<Steering>,
    counters: Counters,
    /// Frames the other lcores handed back that this one sent for them
    /// (they count them as theirs).
    returns_sent: u64,
    max_payload: usize,
}

impl DpdkIo {
    pub fn new(
        rx: RxSource,
        tx: TxPath,
        pool: Mempool,
        host: Host<Mbuf>,
        features: &PortFeatures,
        steering: Option<Steering>,
    ) -> DpdkIo {
        let max_payload = (features.mtu as usize)
            .saturating_sub(IPV4_UDP_OVERHEAD)
            .min(pool.packet_capacity().saturating_sub(host.udp_header_len()));
        DpdkIo {
            rx,
            tx,
            pool,
            offload: TxOffload {
                ip_checksum: features.tx_ip_checksum,
                udp_checksum: features.tx_udp_checksum,
            },
            rx_checksum_offload: features.rx_ip_checksum || features.rx_udp_checksum,
            host,
            rx_batch: MbufBatch::new(),
            tx_batch: MbufBatch::new(),
            tx_held_bytes: 0,
            steering,
            counters: Counters::default(),
            returns_sent: 0,
            max_payload,
        }
    }

    pub fn host(&mut self) -> &mut Host<Mbuf> {
        &mut self.host
    }

    /// Broadcast a gratuitous ARP for our address (when the port comes up).
    pub fn announce(&mut self) {
        let ip = self.host.config().ip;
        self.send_arp_request(ip);
        self.flush();
    }

    fn send_arp_request(&mut self, target: Ipv4Addr) {
        let Ok(mut m) = self.pool.alloc() else {
            self.counters.drop(DropReason::NoMbuf);
            return;
        };
        let Ok(buf) = m.append(64) else {
            self.counters.drop(DropReason::NoMbuf);
            return;
        };
        let len = self.host.write_arp_request(buf, target);
        let _ = m.trim(64 - len);
        self.counters.arp_requests_out += 1;
        self.hold(m);
    }

    /// Send an ICMP echo request to `dst` (through the gateway outside the
    /// subnet; queued while its next hop resolves). False when there is no
    /// route, no mbuf, or the frame would not fit one.
    pub fn send_echo_request(
        &mut self,
        dst: Ipv4Addr,
        ident: u16,
        seq: u16,
        data_len: usize,
        now: Instant,
    ) -> bool {
        let Some(hop) = self.host.config().next_hop(dst) else {
            self.counters.drop(DropReason::NoRoute);
            return false;
        };
        let Ok(mut m) = self.pool.alloc() else {
            self.counters.drop(DropReason::NoMbuf);
            return false;
        };
        let len = self.host.echo_request_len(data_len);
        let Ok(frame) = m.append(len) else {
            // No room for the frame in an mbuf of this pool.
            self.counters.drop(DropReason::NoMbuf);
            return false;
        };
        let mac = self.host.neighbours().lookup(hop, now);
        let zero = EthernetAddress([0; 6]);
        self.host
            .write_echo_request(frame, mac.unwrap_or(zero), dst, ident, seq, data_len);
        let queued = self.hold_or_resolve(mac.is_some(), hop, m, now);
        self.flush();
        queued
    }

    /// Hold a finished frame for the tx queue if its next hop's MAC is in
    /// it (`resolved`), else queue it until `hop` resolves (asking for it
    /// if nobody has yet). False when the tx batch or the ARP queue is
    /// full (dropped, counted).
    fn hold_or_resolve(&mut self, resolved: bool, hop: Ipv4Addr, m: Mbuf, now: Instant) -> bool {
        if resolved {
            return self.hold(m);
        }
        match self.host.neighbours().enqueue(hop, m, now) {
            (Resolve::SendRequest(ip), _) => self.send_arp_request(ip),
            (Resolve::Waiting, _) => {}
            (Resolve::Full, _) => {
                self.counters.drop(DropReason::Unresolved);
                return false;
            }
        }
        true
    }

    /// Echo replies this lcore received since the last call.
    pub fn take_echo_replies(&mut self, out: &mut Vec<EchoReply>) {
        out.extend(self.host.take_echo_replies());
    }

    /// Queue a finished frame for the tx queue; false when it had no room
    /// (dropped, counted).
    fn hold(&mut self, m: Mbuf) -> bool {
        hold(
            &mut self.tx_batch,
            &mut self.tx_held_bytes,
            &mut self.counters,
            m,
        )
    }

    /// Hand held frames to the NIC; what it has no room for stays held.
    pub fn flush(&mut self) {
        self.flush_returns();
        if self.tx_batch.is_empty() {
            return;
        }
        let sent = match &mut self.tx {
            TxPath::Queue(q) => q.tx_burst(&mut self.tx_batch),
            TxPath::ToSteerer(ring) => ring.enqueue_burst(&mut self.tx_batch),
        };
        if sent > 0 {
            // What the device took is usually all of it: walk only the rest.
            let left: usize = self.tx_batch.iter().map(Mbuf::len).sum();
            self.counters.tx_packets += sent as u64;
            self.counters.tx_bytes += (self.tx_held_bytes - left) as u64;
            self.counters.tx_bursts += 1;
            self.tx_held_bytes = left;
        }
    }

    /// Takes up to `room` frames from the inbox (frames other lcores
    /// received for this one's connections); returns how many.
    fn recv_inbox(
        &mut self,
        room: usize,
        out: &mut Vec<UdpMbuf>,
        now: &mut Option<Instant>,
    ) -> usize {
        let RxSource::QueueAndInbox(_, inbox) = &mut self.rx else {
            return 0;
        };
        if room == 0 {
            return 0;
        }
        let got = inbox.dequeue_burst_max(&mut self.rx_batch, room);
        if got > 0 {
            self.counters.rx_bursts += 1;
            // Placed by the lcore that handed them over: no second look.
            self.take_received(false, out, *now.get_or_insert_with(Instant::now));
        }
        got
    }

    /// On the steering lcore of a single-tx-queue port: send what the other
    /// lcores handed back (they counted it).
    fn flush_returns(&mut self) {
        if let (Some(s), TxPath::Queue(q)) = (self.steering.as_mut(), &mut self.tx) {
            self.returns_sent += s.send_returns(q) as u64;
        }
    }

    /// Hold the frames whose next hop resolved (here or on another lcore)
    /// and hand them to the NIC, a batch's worth at a time: the ARP queues
    /// hold up to `queue_total` (1024) frames and the batch 256, so many
    /// resolutions at once overflowed it. What the NIC has no room for
    /// waits in the host for the next call.
    fn release_resolved(&mut self, now: Instant) {
        self.host.collect_resolved(now, &mut self.counters);
        while self.host.has_released() {
            let room = TX_HOLD - self.tx_batch.len();
            if room == 0 {
                let held = self.tx_batch.len();
                self.flush();
                if self.tx_batch.len() == held {
                    return;
                }
                continue;
            }
            for (mac, mut m) in self.host.take_released(room) {
                Host::<Mbuf>::set_dst_mac(m.data_mut(), mac);
                hold(
                    &mut self.tx_batch,
                    &mut self.tx_held_bytes,
                    &mut self.counters,
                    m,
                );
            }
        }
    }

    fn flush_steered(&mut self) {
        if let Some(s) = self.steering.as_mut() {
            s.flush(&mut self.counters);
        }
    }

    /// Run the host logic over the frames in `rx_batch` (first handing
    /// those another lcore owns over to it, when `steer`): UDP payloads go
    /// to `out`, replies (ARP, ICMP) to the tx batch.
    fn take_received(&mut self, steer: bool, out: &mut Vec<UdpMbuf>, now: Instant) {
        // Borrow the fields one by one: the batch is drained while the host,
        // counters and tx batch are used.
        let DpdkIo {
            rx_batch,
            steering,
            counters,
            host,
            tx_batch,
            tx_held_bytes,
            rx_checksum_offload,
            max_payload,
            ..
        } = self;
        for m in rx_batch.drain() {
            let mut m = match steer {
                true => match hand_over(steering, counters, m) {
                    Some(m) => m,
                    None => continue,
                },
                false => m,
            };
            counters.rx_packets += 1;
            counters.rx_bytes += m.len() as u64;
            if m.is_segmented() {
                counters.drop(DropReason::Segmented);
                continue;
            }
            let csum = if *rx_checksum_offload {
                m.rx_checksum()
            } else {
                RxChecksum {
                    ip: CsumStatus::Unknown,
                    l4: CsumStatus::Unknown,
                }
            };
            match host.classify(m.data_mut(), csum, now, counters) {
                Verdict::Udp(meta) => {
                    // Both fit: classify checked the lengths.
                    let _ = m.adj(meta.payload_offset);
                    let extra = m.len() - meta.payload_len;
                    let _ = m.trim(extra);
                    // What the mbuf can grow to behind the payload: a
                    // frame with IP options starts its payload later.
                    let capacity =
                        (*max_payload).clamp(meta.payload_len, meta.payload_len + m.tailroom());
                    out.push(UdpMbuf {
                        mbuf: m,
                        peer: meta.peer,
                        local_port: meta.local_port,
                        capacity: capacity as u32,
                        // Headers fit in the headroom's u16 by construction.
                        // Turned-around headers keep their checksums, which
                        // a CsumStatus::None frame does not have.
                        turnaround: if csum.ip == CsumStatus::None || csum.l4 == CsumStatus::None {
                            0
                        } else {
                            meta.payload_offset as u16
                        },
                    });
                }
                Verdict::Reply { len } => {
                    let extra = m.len().saturating_sub(len);
                    let _ = m.trim(extra);
                    hold(tx_batch, tx_held_bytes, counters, m);
                }
                Verdict::Consumed => {}
                Verdict::Drop(reason) => counters.drop(reason),
            }
        }
    }

    /// A reply to the sender of an untouched payload: turn the received
    /// headers around. False when `d` does not qualify.
    fn turn_around(&mut self, d: &mut UdpMbuf) -> bool {
        let hdr_len = std::mem::take(&mut d.turnaround);
        if hdr_len == 0 || d.mbuf.prepend(usize::from(hdr_len)).is_err() {
            return false;
        }
        self.host.turn_around(d.mbuf.data_mut());
        true
    }

    fn frame_out(&mut self, mut d: UdpMbuf, now: Instant) {
        if self.turn_around(&mut d) {
            if self.hold(d.mbuf) {
                self.counters.udp_out += 1;
            }
            return;
        }
        let peer = d.peer;
        let cfg = self.host.config();
        let broadcast = cfg.is_broadcast(*peer.ip());
        // A broadcast goes out on the link whatever the routes say.
        let Some(hop) = cfg.next_hop(*peer.ip()).or(broadcast.then_some(*peer.ip())) else {
            self.counters.drop(DropReason::NoRoute);
            return;
        };
        let hdr = self.host.udp_header_len();
        if d.mbuf.prepend(hdr).is_err() {
            self.counters.drop(DropReason::NoHeadroom);
            return;
        }
        let mac = if broadcast {
            Some(EthernetAddress::BROADCAST)
        } else {
            self.host.neighbours().lookup(hop, now)
        };
        let l2 = self.host.eth_header_len();
        self.host.write_udp_headers(
            d.mbuf.data_mut(),
            mac.unwrap_or(EthernetAddress([0; 6])),
            peer,
            d.local_port,
            self.offload,
        );
        if self.offload.ip_checksum || self.offload.udp_checksum {
            d.mbuf
                .request_tx_checksum(l2 as u16, 20, self.offload.udp_checksum);
        }
        if self.hold_or_resolve(mac.is_some(), hop, d.mbuf, now) {
            self.counters.udp_out += 1;
        }
    }
}

fn hold(
    tx_batch: &mut MbufBatch<TX_HOLD>,
    held_bytes: &mut usize,
    counters: &mut Counters,
    m: Mbuf,
) -> bool {
    let len = m.len();
    if tx_batch.push(m).is_ok() {
        *held_bytes += len;
        true
    } else {
        counters.drop(DropReason::TxFull);
        false
    }
}

impl PacketIo for DpdkIo {
    type Buf = UdpMbuf;

    fn recv_burst(&mut self, out: &mut Vec<UdpMbuf>, max: usize) -> usize {
        // Every loop receives: the other lcores' frames go out from here,
        // not only when this lcore has its own to send.
        self.flush_returns();
        let budget = max.min(RX_BURST);
        let mut now = None;
        let before = out.len();
        // The frames other lcores handed over first, up to half the
        // budget: a queue its own flows keep full left them in the inbox
        // until it filled and the others dropped them (SteerRingFull).
        let handed = self.recv_inbox(budget.div_ceil(2), out, &mut now);
        let room = budget - handed;
        let got = match &mut self.rx {
            RxSource::Queue(q) | RxSource::QueueAndInbox(q, _) => {
                q.rx_burst_max(&mut self.rx_batch, room)
            }
            RxSource::Ring(c) => c.dequeue_burst_max(&mut self.rx_batch, room),
        };
        if got > 0 {
            self.counters.rx_bursts += 1;
            self.take_received(true, out, *now.get_or_insert_with(Instant::now));
        }
        // What room the queue left: more of the inbox.
        self.recv_inbox(room - got, out, &mut now);
        let Some(now) = now else {
            return 0;
        };
        self.flush_steered();
        self.release_resolved(now);
        out.len() - before
    }

    fn alloc(&mut self) -> Option<UdpMbuf> {
        match self.pool.alloc() {
            Ok(mbuf) => {
                let capacity = self.max_payload.min(mbuf.tailroom()) as u32;
                Some(UdpMbuf {
                    mbuf,
                    peer: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
                    local_port: 0,
                    capacity,
                    turnaround: 0,
                })
            }
            Err(_) => {
                self.counters.drop(DropReason::NoMbuf);
                None
            }
        }
    }

    fn send_burst(&mut self, bufs: &mut Vec<UdpMbuf>) -> usize {
        self.flush();
        let n = bufs.len().min(TX_HOLD - self.tx_batch.len());
        let now = Instant::now();
        for d in bufs.drain(..n) {
            self.frame_out(d, now);
        }
        self.flush();
        n
    }

    fn poll(&mut self, now: Instant) {
        let (ask, given_up) = self.host.neighbours().poll(now);
        for ip in ask {
            self.send_arp_request(ip);
        }
        for _ in given_up {
            self.counters.drop(DropReason::Unresolved);
        }
        self.release_resolved(now);
        self.flush();
    }

    fn local_ip(&self) -> Ipv4Addr {
        self.host.config().ip
    }

    fn max_payload(&self) -> usize {
        self.max_payload
    }
}

impl CountedIo for DpdkIo {
    fn counters(&self) -> Counters {
        self.counters.clone()
    }

    /// Without a copy of the counters: it runs twice per loop. Frames the
    /// steering could not hand over (a full ring) were work too, and so
    /// were the ARP and ping requests answered: their replies leave only
    /// on the loop's next flush, and an lcore that only answers pings
    /// napped between them.
    fn frames_moved(&self) -> u64 {
        let c = &self.counters;
        c.tx_packets
            + c.steered
            + c.drops[DropReason::SteerRingFull as usize]
            + self.returns_sent
            + c.arp_replies_out
            + c.icmp_echo_replies
    }
}
