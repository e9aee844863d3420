//! The job's liveness links: after the rendezvous every rank keeps its TCP
//! connection to rank 0 open. A process that exits or crashes without
//! dropping its communicator has that connection closed by its kernel, so
//! rank 0 sees it within one poll and tells every other rank. This works
//! on every transport, also on our DPDK stack, where no kernel answers for
//! a dead rank's address and only the silence timeout would find it.
//!
//! Lines (ASCII) on a link after the table:
//! ```text
//! either end:  bye C F X      leaving on purpose, with its goodbye
//!                             (module `goodbye`: C collectives completed,
//!                             F 1 after a failure, X the rank it named
//!                             or -)
//! 0 -> rank:   left R C F X   rank R said `bye C F X` on its link
//! 0 -> rank:   lost R         rank R's link closed without a bye
//! ```
//! The goodbye rides here as well as on QUIC because a rank that leaves
//! after a failure closes its connections at once, and a close is one
//! datagram: where it is lost, only this link tells its peers why it went.
//! A link that closes (end of stream or an error) without `bye` is a lost
//! rank: the one at the other end. When rank 0 itself is lost, every rank
//! sees its own link close. The links carry TCP keepalives (first probe
//! after 10 s idle, then every 5 s, 3 unanswered end it) and a 25 s
//! `TCP_USER_TIMEOUT`, which keeps middleboxes from expiring a link that
//! is idle for a whole job and ends one whose peer host went down (about
//! 25 s, inside the default 30 s silence timeout).
//!
//! Limits: relays go out while rank 0 runs collectives (the links are read
//! in the progress loop); rank 0 holds one connection per rank and lane
//! for the whole job (mind `ulimit -n` for very large jobs); a child
//! process that inherits a rank's link (a `fork` without exec) keeps it
//! open after the rank dies, until the child exits too.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};
use tracing::{debug, warn};

use super::goodbye::Goodbye;

/// Longest line a link accepts (`left R C F X` is at most 43 bytes).
const MAX_LINE: usize = 64;
/// Most bytes one `poll` (or `say_bye`'s drain) reads from a link. A rank
/// sends a few short lines in a job's life; an end that keeps writing
/// cannot keep the progress loop (or a drop) reading for ever.
const READ_LIMIT: usize = 64 * 1024;

/// This rank's ends of the liveness links: to rank 0, or (on rank 0) to
/// every other rank. Polled from the progress loop; `say_bye` when the
/// rank leaves through its code (dropped without it, the links close as
/// a crash would close them).
#[derive(Debug)]
pub struct Watch {
    world: usize,
    links: Vec<Link>,
    /// Ranks found gone, first first, and when.
    lost: Vec<(usize, Instant)>,
    /// Goodbyes heard since `take_departed`: said on a link, or relayed.
    departed: Vec<(usize, Goodbye)>,
    /// Rank 0's side: tells every rank what it hears of one.
    relays: bool,
}

#[derive(Debug)]
struct Link {
    /// The rank at the other end.
    rank: usize,
    stream: TcpStream,
    /// A line not ended yet.
    line: Vec<u8>,
    /// Bytes to send that the socket did not take yet.
    outbox: Vec<u8>,
    state: LinkState,
    /// An unknown line was logged already (one warning a link, not a
    /// flood from an end that sends junk).
    warned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkState {
    Open,
    /// The other end said `bye`.
    Left,
    /// Closed without a `bye`.
    Lost,
    /// Kept open but not read (it could not be made non-blocking): that
    /// rank is watched by the silence timeout only.
    Unwatched,
}

/// How long a link's peer may leave probes or data unanswered before the
/// link counts as closed (`TCP_USER_TIMEOUT`: also when a relay is queued,
/// where keepalives do not run).
const DEAD_AFTER: Duration = Duration::from_secs(25);

/// The keepalive every link carries (see the module docs).
fn keepalive() -> TcpKeepalive {
    TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(3)
}

impl Watch {
    /// Rank 0's side: `streams` holds each other rank's connection.
    pub(crate) fn rank0(world: usize, streams: Vec<(usize, TcpStream)>) -> Watch {
        Watch {
            relays: true,
            ..Watch::new(world, streams)
        }
    }

    /// A rank's side: its connection to rank 0, and whatever of it was
    /// already read past the table.
    pub(crate) fn to_rank0(world: usize, stream: TcpStream, read_ahead: Vec<u8>) -> Watch {
        let mut w = Watch::new(world, vec![(0, stream)]);
        w.take_bytes(0, &read_ahead);
        w
    }

    fn new(world: usize, streams: Vec<(usize, TcpStream)>) -> Watch {
        let links = streams
            .into_iter()
            .map(|(rank, stream)| {
                let sock = SockRef::from(&stream);
                let dead_after = sock
                    .set_tcp_keepalive(&keepalive())
                    .and_then(|()| sock.set_tcp_user_timeout(Some(DEAD_AFTER)));
                if let Err(e) = dead_after {
                    warn!(rank, error = %e, "liveness link: no TCP keepalive");
                }
                let state = match stream.set_nonblocking(true) {
                    Ok(()) => LinkState::Open,
                    Err(e) => {
                        warn!(rank, error = %e, "liveness link unusable; that rank is watched by the silence timeout only");
                        LinkState::Unwatched
                    }
                };
                Link {
                    rank,
                    stream,
                    line: Vec::new(),
                    outbox: Vec::new(),
                    state,
                    warned: false,
                }
            })
            .collect();
        Watch {
            world,
            links,
            lost: Vec::new(),
            departed: Vec::new(),
            relays: false,
        }
    }

    /// Ranks found gone so far, in the order found.
    pub fn lost(&self) -> Vec<usize> {
        self.lost.iter().map(|&(r, _)| r).collect()
    }

    /// Ranks found gone at least `grace` before `now`, in the order found.
    pub fn lost_for(&self, grace: Duration, now: Instant) -> impl Iterator<Item = usize> + '_ {
        self.lost
            .iter()
            .filter(move |&&(_, at)| now.saturating_duration_since(at) >= grace)
            .map(|&(r, _)| r)
    }

    /// Goodbyes heard since the last call: ranks that said `bye` on their
    /// link to this one, or that rank 0 said did. (The caller skips its
    /// own rank.)
    pub fn take_departed(&mut self) -> std::vec::Drain<'_, (usize, Goodbye)> {
        self.departed.drain(..)
    }

    /// This rank leaves through its code (after its QUIC goodbyes): says
    /// `bye` with `bye`'s words on every link it has not seen close, then
    /// closes them.
    pub fn say_bye(&mut self, bye: Goodbye) {
        let line = format!("bye {}\n", bye.to_words());
        for l in &mut self.links {
            if !matches!(l.state, LinkState::Open | LinkState::Unwatched) {
                continue;
            }
            // Unread input (a relay) would make the close a reset, which
            // the other end may see before the bye. (An unwatched link
            // blocks: it is not drained.)
            let mut sink = [0u8; 4096];
            let mut drained = 0;
            while l.state == LinkState::Open && drained < READ_LIMIT {
                match l.stream.read(&mut sink) {
                    Ok(n) if n > 0 => drained += n,
                    _ => break,
                }
            }
            l.outbox.extend_from_slice(line.as_bytes());
            flush(l);
            let _ = l.stream.shutdown(Shutdown::Write);
            l.state = LinkState::Left;
        }
    }

    /// Reads every link without blocking; on rank 0, tells the others of
    /// a rank it finds lost. Cheap: one read per open link.
    pub fn poll(&mut self) {
        for l in self.links.iter_mut().filter(|l| l.state == LinkState::Open) {
            if !l.outbox.is_empty() {
                flush(l);
            }
        }
        for i in self.readable() {
            let mut chunk = [0u8; 256];
            let mut taken = 0;
            while taken < READ_LIMIT {
                match self.links[i].stream.read(&mut chunk) {
                    Ok(0) => {
                        self.closed(i);
                        break;
                    }
                    Ok(n) => {
                        taken += n;
                        let rank = self.links[i].rank;
                        self.take_bytes(i, &chunk[..n]);
                        if self.links[i].state != LinkState::Open {
                            debug!(rank, "liveness link: the other end left");
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => {
                        self.closed(i);
                        break;
                    }
                }
            }
        }
    }

    /// Open links with input, an end of stream or an error waiting: one
    /// `poll(2)` over all of them (rank 0 has one per rank).
    fn readable(&self) -> Vec<usize> {
        use std::os::fd::AsFd;
        let open: Vec<usize> = (0..self.links.len())
            .filter(|&i| self.links[i].state == LinkState::Open)
            .collect();
        super::ready::ready(
            open,
            |i| self.links[i].stream.as_fd(),
            nix::poll::PollFlags::POLLIN,
            nix::poll::PollTimeout::ZERO,
        )
    }

    /// Splits what link `i` received into lines and acts on each.
    fn take_bytes(&mut self, i: usize, bytes: &[u8]) {
        for &b in bytes {
            if b != b'\n' {
                if self.links[i].line.len() < MAX_LINE {
                    self.links[i].line.push(b);
                }
                continue;
            }
            let line = String::from_utf8_lossy(&self.links[i].line).into_owned();
            self.links[i].line.clear();
            self.on_line(i, line.trim());
        }
    }

    fn on_line(&mut self, i: usize, line: &str) {
        let from = self.links[i].rank;
        if line == "bye" || line.starts_with("bye ") {
            let words = line.get(4..).unwrap_or("");
            self.links[i].state = LinkState::Left;
            match Goodbye::from_words(words, self.world) {
                Some(bye) => self.said_bye(from, bye),
                None => {
                    warn!(from, line = %line.escape_debug(), "liveness link: a bye without a goodbye; its peers learn why it left from QUIC only")
                }
            }
            return;
        }
        // Only rank 0 reports, and only about other ranks.
        let about = |rest: &str| -> Option<(usize, String)> {
            let (rank, words) = rest.split_once(' ').unwrap_or((rest, ""));
            let rank = rank.parse::<usize>().ok()?;
            (from == 0 && rank != 0 && rank < self.world).then(|| (rank, words.to_string()))
        };
        let lost = line.strip_prefix("lost ").and_then(about);
        let left = line
            .strip_prefix("left ")
            .and_then(about)
            .and_then(|(r, words)| Some((r, Goodbye::from_words(&words, self.world)?)));
        match (lost, left) {
            (Some((r, rest)), _) if rest.is_empty() => self.note_lost(r),
            (_, Some((r, bye))) => self.departed.push((r, bye)),
            _ if !self.links[i].warned => {
                self.links[i].warned = true;
                warn!(from, line = %line.escape_debug(), "liveness link: ignored an unknown line (further ones from this rank are logged at debug level)")
            }
            _ => {
                debug!(from, line = %line.escape_debug(), "liveness link: ignored an unknown line")
            }
        }
    }

    /// Rank `rank` said `bye` with `bye` on its link: noted, and on rank 0
    /// told to every other rank.
    fn said_bye(&mut self, rank: usize, bye: Goodbye) {
        self.departed.push((rank, bye));
        if self.relays {
            self.tell_open_links(&format!("left {rank} {}\n", bye.to_words()));
        }
    }

    /// Queues `line` on every open link and sends what the sockets take.
    fn tell_open_links(&mut self, line: &str) {
        for l in self.links.iter_mut().filter(|l| l.state == LinkState::Open) {
            l.outbox.extend_from_slice(line.as_bytes());
            flush(l);
        }
    }

    /// Link `i` closed: its rank is lost unless it said bye.
    fn closed(&mut self, i: usize) {
        if self.links[i].state != LinkState::Open {
            return;
        }
        self.links[i].state = LinkState::Lost;
        let rank = self.links[i].rank;
        debug!(rank, "liveness link closed without a bye");
        self.note_lost(rank);
        // Rank 0 relays (a rank's only link is to rank 0: nothing to tell).
        self.tell_open_links(&format!("lost {rank}\n"));
    }

    fn note_lost(&mut self, rank: usize) {
        if !self.lost.iter().any(|&(r, _)| r == rank) {
            self.lost.push((rank, Instant::now()));
        }
    }

    /// Closes every link without a bye, as a crash would (tests).
    #[cfg(test)]
    pub(crate) fn sever(&mut self) {
        for l in &mut self.links {
            let _ = l.stream.shutdown(Shutdown::Both);
            l.state = LinkState::Left;
        }
    }
}

/// Sends what the socket takes of the link's outbox.
fn flush(l: &mut Link) {
    while !l.outbox.is_empty() {
        match l.stream.write(&l.outbox) {
            Ok(0) => break,
            Ok(n) => {
                l.outbox.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Rank 0's watch over ranks 1..world and each rank's watch, over real
    /// loopback TCP connections.
    fn job(world: usize) -> (Watch, Vec<Watch>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut ranks = Vec::new();
        let mut at_0 = Vec::new();
        for r in 1..world {
            let s = TcpStream::connect(addr).unwrap();
            ranks.push(Watch::to_rank0(world, s, Vec::new()));
            at_0.push((r, listener.accept().unwrap().0));
        }
        (Watch::rank0(world, at_0), ranks)
    }

    /// Polls `w` until it has found a lost rank or 2 s pass.
    fn poll_until_lost(w: &mut Watch) -> Vec<usize> {
        let start = Instant::now();
        while w.lost().is_empty() && start.elapsed() < Duration::from_secs(2) {
            w.poll();
            std::thread::sleep(Duration::from_millis(1));
        }
        w.lost().to_vec()
    }

    #[test]
    fn a_rank_that_vanishes_is_reported_by_rank_0_to_the_others() {
        let (mut zero, mut ranks) = job(4);
        let mut gone = ranks.remove(1); // rank 2
        gone.sever();
        assert_eq!(poll_until_lost(&mut zero), vec![2]);
        for w in &mut ranks {
            assert_eq!(poll_until_lost(w), vec![2]);
        }
    }

    const FAILED_FOR_1: Goodbye = Goodbye {
        completed: 3,
        failed: true,
        cause: Some(1),
    };

    #[test]
    fn a_rank_that_leaves_through_its_code_is_not_lost_and_its_goodbye_reaches_all() {
        let (mut zero, mut ranks) = job(4);
        ranks.remove(1).say_bye(FAILED_FOR_1); // rank 2
        let (mut at_0, mut at_1, mut at_3) = (Vec::new(), Vec::new(), Vec::new());
        let start = Instant::now();
        // Until all have heard it (2 s at most), and 100 ms more: nothing
        // else may come.
        let mut all_heard: Option<Instant> = None;
        while all_heard.is_none_or(|t| t.elapsed() < Duration::from_millis(100))
            && start.elapsed() < Duration::from_secs(2)
        {
            zero.poll();
            at_0.extend(zero.take_departed());
            ranks[0].poll();
            at_1.extend(ranks[0].take_departed());
            ranks[1].poll();
            at_3.extend(ranks[1].take_departed());
            if all_heard.is_none() && [&at_0, &at_1, &at_3].iter().all(|h| !h.is_empty()) {
                all_heard = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(zero.lost(), Vec::<usize>::new());
        assert_eq!(ranks[0].lost(), Vec::<usize>::new());
        assert_eq!(zero.links[1].state, LinkState::Left);
        // Heard by rank 0 on rank 2's link, relayed to ranks 1 and 3.
        for heard in [at_0, at_1, at_3] {
            assert_eq!(heard, vec![(2, FAILED_FOR_1)]);
        }
    }

    #[test]
    fn rank_0s_own_goodbye_reaches_every_rank() {
        let (mut zero, mut ranks) = job(3);
        zero.say_bye(FAILED_FOR_1);
        for w in &mut ranks {
            let mut heard = Vec::new();
            let start = Instant::now();
            while heard.is_empty() && start.elapsed() < Duration::from_secs(2) {
                w.poll();
                heard.extend(w.take_departed());
            }
            assert_eq!(heard, vec![(0, FAILED_FOR_1)]);
            assert_eq!(w.lost(), Vec::<usize>::new());
        }
    }

    #[test]
    fn a_rank_dropped_without_a_bye_counts_as_lost() {
        // A communicator that never came up drops its watch unsaid.
        let (mut zero, mut ranks) = job(3);
        drop(ranks.remove(0)); // rank 1
        assert_eq!(poll_until_lost(&mut zero), vec![1]);
    }

    #[test]
    fn when_rank_0_vanishes_every_rank_sees_it() {
        let (mut zero, mut ranks) = job(3);
        zero.sever();
        for w in &mut ranks {
            assert_eq!(poll_until_lost(w), vec![0]);
        }
    }

    #[test]
    fn a_poll_reads_a_bounded_amount_from_an_end_that_floods_it() {
        use std::io::Write;
        const SENT: usize = 256 * 1024;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut theirs = listener.accept().unwrap().0;
        SockRef::from(&ours).set_recv_buffer_size(1 << 20).unwrap();
        SockRef::from(&theirs)
            .set_send_buffer_size(1 << 20)
            .unwrap();
        // Junk without line ends: what a writer that never stops has
        // always queued. (A poll that read until the socket ran dry never
        // returned while the other end kept writing.)
        theirs.write_all(&[b'x'; SENT]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut w = Watch::to_rank0(2, ours, Vec::new());
        w.poll();
        // What the poll left is still there to read.
        let mut rest = w.links[0].stream.try_clone().unwrap();
        // What is left to read once the writer's bytes have all come.
        let mut left_to_read = || {
            let (mut left, mut chunk) = (0, [0u8; 65536]);
            let mut last_byte = Instant::now();
            while last_byte.elapsed() < Duration::from_millis(300) {
                match rest.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        left += n;
                        last_byte = Instant::now();
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            left
        };
        let taken = SENT - left_to_read();
        // READ_LIMIT (64 KiB), and one read's worth past it.
        assert!(taken <= 64 * 1024 + 256, "one poll read {taken} bytes");
        assert!(taken > 0, "the poll read nothing");
        // The drain before a bye is bounded too (4 KiB reads).
        theirs.write_all(&[b'x'; SENT]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        w.say_bye(FAILED_FOR_1);
        assert_eq!(w.links[0].state, LinkState::Left);
        let drained = SENT - left_to_read();
        assert!(
            drained <= 64 * 1024 + 4096,
            "the bye drained {drained} bytes"
        );
    }

    #[test]
    fn lines_read_ahead_of_the_table_and_junk_are_handled() {
        let (_zero, mut ranks) = job(3);
        let w = &mut ranks[0];
        w.take_bytes(0, b"lost 2\n");
        w.take_bytes(0, b"lost 99\nnonsense\n");
        w.take_bytes(0, b"lost 0\n"); // rank 0 about itself: meaningless
        let long = vec![b'x'; 10 * MAX_LINE];
        w.take_bytes(0, &long);
        w.take_bytes(0, b"\nlost 1\n");
        // Rank 99 is out of range, rank 0 cannot be lost by its own word,
        // the junk is ignored.
        assert_eq!(w.lost(), vec![2, 1]);
        // Each counts once its grace has passed.
        let now = Instant::now();
        assert_eq!(w.lost_for(Duration::from_secs(60), now).count(), 0);
        assert_eq!(
            w.lost_for(Duration::ZERO, now).collect::<Vec<_>>(),
            vec![2, 1]
        );
        // Goodbyes relayed by rank 0: only well-formed ones about other
        // ranks, and a `lost` line with more words is no loss.
        w.take_bytes(
            0,
            b"left 2 3 1 1\nleft 0 3 1 1\nleft 2 3\nleft 9 3 1 1\nlost 1 3\n",
        );
        assert_eq!(
            w.take_departed().collect::<Vec<_>>(),
            vec![(2, FAILED_FOR_1)]
        );
        assert_eq!(w.lost(), vec![2, 1]);
    }

    #[test]
    fn only_rank_0_relays_and_only_about_other_ranks() {
        // Rank 0 tells ranks about one another; a rank's word about a
        // third rank means nothing on rank 0's side.
        let (mut zero, _ranks) = job(3);
        zero.take_bytes(0, b"left 2 3 1 1\nlost 2\n"); // from rank 1
        assert_eq!(zero.take_departed().count(), 0);
        assert_eq!(zero.lost(), Vec::<usize>::new());
        // A bye whose goodbye is malformed still ends the link cleanly.
        zero.take_bytes(1, b"bye 3 7 -\n"); // from rank 2
        assert_eq!(zero.links[1].state, LinkState::Left);
        assert_eq!(zero.take_departed().count(), 0);
    }
}
