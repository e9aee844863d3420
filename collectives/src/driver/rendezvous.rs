//! Rendezvous in the torchrun convention: `RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`. Rank 0 listens on TCP `MASTER_PORT`,
//! collects every rank's QUIC address and sends everyone the full table.
//! `AINFTP_RDV_PORT` picks another port (the same on every rank). Under
//! torchrun's agent store (`TORCHELASTIC_USE_AGENT_STORE=True`: its static
//! rendezvous, and its c10d one since PyTorch 2.4) the agent holds
//! `MASTER_PORT` for the whole job, so the rendezvous takes `MASTER_PORT
//! + 1` unless `AINFTP_RDV_PORT` is set.
//!
//! Protocol (one line each, ASCII):
//! ```text
//! rank -> 0:  ainftp-rdv/5 RANK WORLD IP:PORT LANE/LANES JOB
//! 0 -> rank:  ok WORLD            then WORLD lines IP:PORT (rank order)
//!         or  err MESSAGE
//! ```
//! JOB is the job's id (`AINFTP_JOB_ID`, else torchrun's
//! `TORCHELASTIC_RUN_ID` unless it is torchrun's default "none"), or `-`
//! for a job without one. Rank 0 refuses a rank of another job alone, as
//! it refuses a rank of another lane: two jobs given one MASTER_PORT by
//! mistake meet there (one of their rank 0s cannot listen), and with ids
//! the other job's ranks are told so instead of joining this one.
//! A rank with several lanes runs one rendezvous per lane, lane k on
//! `MASTER_PORT + k`. The lane in the line keeps two jobs whose port
//! ranges overlap apart: rank 0 refuses a rank of another lane (it tells
//! that rank why and goes on waiting for its own), and a rank of its own
//! lane with another lane count fails the rendezvous.
//! After the table the connections stay open as the job's liveness links
//! (module `watch`): a rank whose process dies is reported at once.
//!
//! Rank 0 serves all clients at once and gives each `CHECK_IN_LIMIT` to
//! send its line; a client that is not an ainftp rank is dropped with a
//! warning. A rank that disagrees on the job (WORLD_SIZE, rank range,
//! lane count, protocol version) fails the rendezvous, and every client
//! rank 0 holds then is told why; a rank that checks in twice, or a rank
//! of another lane, is refused alone. A rank's waits end by its one
//! deadline; rank 0 writes its answers (the table, or the error) to every
//! rank at once, within `answer_budget`.

use std::io::{BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use tracing::warn;

use super::watch::Watch;
use crate::error::{Error, Result};

const PROTO: &str = "ainftp-rdv/5";
/// What every version of the protocol starts with: a line without it is
/// not from an ainftp rank.
const PROTO_FAMILY: &str = "ainftp-rdv/";
/// Longest line accepted (a table line is at most ~22 bytes).
const MAX_LINE: u64 = 256;
/// Longest job id, so that a check-in line stays well within `MAX_LINE`.
const MAX_JOB_ID: usize = 64;
/// What a job without an id sends in its check-in.
const NO_JOB: &str = "-";
/// The most ranks a job may have (a job is one table of addresses, and
/// rank 0 holds a connection to every rank).
pub const MAX_WORLD: usize = 1 << 16;
/// The variable that sets the rendezvous's port on every rank.
pub const RDV_PORT_VAR: &str = "AINFTP_RDV_PORT";
/// Where the rendezvous listens, for messages.
const RDV_PORT_SOURCE: &str =
    "AINFTP_RDV_PORT if set, else MASTER_PORT, or MASTER_PORT + 1 under torchrun's agent store";

/// A rank's place in the job, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world: usize,
    /// `MASTER_ADDR` as given (a host name or an IPv4 address).
    pub master_addr: String,
    /// The rendezvous's TCP port on `MASTER_ADDR`: `AINFTP_RDV_PORT` if
    /// set, else `MASTER_PORT`, or `MASTER_PORT + 1` under torchrun's agent
    /// store, which holds `MASTER_PORT` (lane k's is this plus k).
    pub master_port: u16,
    /// Which of the rank's lanes this rendezvous is for.
    pub lane: Lane,
    /// The job's id, if it has one (`AINFTP_JOB_ID` or torchrun's
    /// `TORCHELASTIC_RUN_ID`): ranks of another job are refused.
    pub job: Option<String>,
}

/// Lane `index` of a rank's `count` lanes, whose rendezvous is on
/// `MASTER_PORT + index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    pub index: usize,
    pub count: usize,
}

impl Lane {
    /// A rank with one lane.
    pub const ONLY: Lane = Lane { index: 0, count: 1 };
}

impl std::fmt::Display for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Lane {
    type Err = ();

    fn from_str(s: &str) -> std::result::Result<Lane, ()> {
        let (i, n) = s.split_once('/').ok_or(())?;
        let lane = Lane {
            index: i.parse().map_err(|_| ())?,
            count: n.parse().map_err(|_| ())?,
        };
        (lane.index < lane.count).then_some(lane).ok_or(())
    }
}

impl RankEnv {
    /// Reads `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, and the
    /// job id from `AINFTP_JOB_ID` or `TORCHELASTIC_RUN_ID` (optional).
    pub fn from_env() -> Result<RankEnv> {
        RankEnv::from_lookup(|k| std::env::var(k).ok())
    }

    /// As `from_env`, with variables from `get` (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<RankEnv> {
        let var = |name: &'static str| {
            get(name).filter(|v| !v.is_empty()).ok_or(Error::Env {
                var: name,
                problem: "is not set".into(),
            })
        };
        let num = |name: &'static str| -> Result<usize> {
            let v = var(name)?;
            v.trim().parse().map_err(|_| Error::Env {
                var: name,
                problem: format!("{v:?} is not a non-negative integer"),
            })
        };
        let world = num("WORLD_SIZE")?;
        if world == 0 {
            return Err(Error::Env {
                var: "WORLD_SIZE",
                problem: "must be at least 1".into(),
            });
        }
        if world > MAX_WORLD {
            return Err(Error::Env {
                var: "WORLD_SIZE",
                problem: format!("{world} is more ranks than the {MAX_WORLD} a job may have"),
            });
        }
        let rank = num("RANK")?;
        if rank >= world {
            return Err(Error::Env {
                var: "RANK",
                problem: format!("{rank} is not below WORLD_SIZE {world}"),
            });
        }
        let port = |name: &'static str| -> Result<u16> {
            let p = num(name)?;
            u16::try_from(p).ok().filter(|&p| p != 0).ok_or(Error::Env {
                var: name,
                problem: format!("{p} is not a TCP port (1..=65535)"),
            })
        };
        let master_port = match get(RDV_PORT_VAR).filter(|v| !v.is_empty()) {
            Some(_) => port(RDV_PORT_VAR)?,
            None if torchrun_agent_store(&get) => {
                let p = port("MASTER_PORT")?;
                p.checked_add(1).ok_or(Error::Env {
                    var: "MASTER_PORT",
                    problem: format!(
                        "{p} + 1 is beyond 65535 (torchrun's agent store holds MASTER_PORT): set {RDV_PORT_VAR}"
                    ),
                })?
            }
            None => port("MASTER_PORT")?,
        };
        Ok(RankEnv {
            rank,
            world,
            master_addr: var("MASTER_ADDR")?,
            master_port,
            lane: Lane::ONLY,
            job: job_id(&get)?,
        })
    }

    /// The environment of lane `k` of a rank with `lanes` lanes: the same
    /// job, with its rendezvous on `MASTER_PORT + k`.
    pub fn lane(&self, k: usize, lanes: usize) -> Result<RankEnv> {
        if k >= lanes {
            return Err(Error::Config("a lane index must be below the lane count"));
        }
        let port = u16::try_from(k)
            .ok()
            .and_then(|k| self.master_port.checked_add(k))
            .ok_or(Error::Env {
                var: "MASTER_PORT",
                problem: format!("{} + lane {k} is beyond 65535", self.master_port),
            })?;
        Ok(RankEnv {
            master_port: port,
            lane: Lane {
                index: k,
                count: lanes,
            },
            ..self.clone()
        })
    }

    /// `master`, asked again until `deadline` while it fails: a master's
    /// name may resolve only once its host is up (a Kubernetes headless
    /// Service names a pod that is still starting).
    pub fn master_by(&self, deadline: Instant) -> Result<SocketAddrV4> {
        loop {
            match self.master() {
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                done => return done,
            }
        }
    }

    /// `MASTER_ADDR` and the rendezvous port, resolved to an IPv4 address.
    pub fn master(&self) -> Result<SocketAddrV4> {
        let addrs = (self.master_addr.as_str(), self.master_port)
            .to_socket_addrs()
            .map_err(|e| Error::Env {
                var: "MASTER_ADDR",
                problem: format!("cannot resolve {:?}: {e}", self.master_addr),
            })?;
        addrs
            .filter_map(|a| match a {
                SocketAddr::V4(v4) => Some(v4),
                SocketAddr::V6(_) => None,
            })
            .next()
            .ok_or(Error::Env {
                var: "MASTER_ADDR",
                problem: format!("{:?} has no IPv4 address", self.master_addr),
            })
    }
}

/// Whether torchrun's agent runs the job's store on `MASTER_PORT` for the
/// whole job (`TORCHELASTIC_USE_AGENT_STORE=True`, torchrun's static
/// rendezvous and, since PyTorch 2.4, its c10d one): the workers'
/// `init_process_group` connects to it there, and rank 0 cannot listen
/// on that port.
fn torchrun_agent_store(get: &impl Fn(&str) -> Option<String>) -> bool {
    get("TORCHELASTIC_USE_AGENT_STORE")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true") || v.trim() == "1")
}

/// The job id: `AINFTP_JOB_ID` if set, else `TORCHELASTIC_RUN_ID` unless
/// it is torchrun's default "none" (every job run without `--rdzv-id` has
/// that one, so it tells no two jobs apart). `AINFTP_JOB_ID` must be a
/// valid id (`check_job_id`); torchrun's, which ainftp does not own, is
/// used as it is when valid and by a digest of it otherwise.
fn job_id(get: &impl Fn(&str) -> Option<String>) -> Result<Option<String>> {
    if let Some(id) = get("AINFTP_JOB_ID").filter(|v| !v.is_empty()) {
        check_job_id(&id).map_err(|problem| Error::Env {
            var: "AINFTP_JOB_ID",
            problem,
        })?;
        return Ok(Some(id));
    }
    Ok(get("TORCHELASTIC_RUN_ID")
        .filter(|v| !v.is_empty() && v != "none")
        .map(|id| match check_job_id(&id) {
            Ok(()) => id,
            Err(_) => format!("torchrun-{:016x}", fnv1a(id.as_bytes())),
        }))
}

/// A job id is 1 to `MAX_JOB_ID` printable ASCII characters without
/// spaces, and not `-` (which stands for none).
pub fn check_job_id(id: &str) -> std::result::Result<(), String> {
    let printable = id.bytes().all(|b| b.is_ascii_graphic());
    if id.is_empty() || !printable || id.len() > MAX_JOB_ID || id == NO_JOB {
        return Err(format!(
            "{id:?} is not a job id: 1 to {MAX_JOB_ID} printable ASCII characters, no spaces, not \"-\""
        ));
    }
    Ok(())
}

/// FNV-1a, 64 bits: the same digest of a torchrun run id on every host
/// and build (std's hasher promises neither).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Swaps the table in: rank 0 serves, the others ask. `mine` is this
/// rank's QUIC address; an unspecified IP (a wildcard bind) is replaced by
/// the address this host uses to reach the master. Gives up after
/// `timeout` with an error that names the ranks still missing. The
/// connections stay open as the job's liveness links (the `Watch`).
pub fn exchange(
    env: &RankEnv,
    mine: SocketAddrV4,
    timeout: Duration,
) -> Result<(Vec<SocketAddrV4>, Watch)> {
    let deadline = Instant::now() + timeout;
    let master = env.master_by(deadline)?;
    if env.rank == 0 {
        let ip = if mine.ip().is_unspecified() {
            if master.ip().is_unspecified() {
                Ipv4Addr::LOCALHOST
            } else {
                *master.ip()
            }
        } else {
            *mine.ip()
        };
        serve(
            env,
            SocketAddrV4::new(ip, mine.port()),
            mine.ip().is_unspecified(),
            master.port(),
            deadline,
        )
    } else {
        ask(env, mine, master, deadline)
    }
}

/// How long a client that connected to rank 0 may take to send its
/// check-in line. One that says nothing (a port scanner, a health check)
/// is dropped after this, and never holds up the ranks behind it.
const CHECK_IN_LIMIT: Duration = Duration::from_secs(5);

/// A client of rank 0 that has not sent its whole check-in line yet.
struct Pending {
    stream: TcpStream,
    line: Vec<u8>,
    since: Instant,
}

/// What one read of a pending client gave.
enum Reading {
    Line(String),
    Waiting,
    Gone(&'static str),
}

impl Pending {
    /// Reads what the client has sent so far (its socket is non-blocking).
    fn read(&mut self) -> Reading {
        let mut chunk = [0u8; 256];
        loop {
            let n = match self.stream.read(&mut chunk) {
                Ok(0) => return Reading::Gone("closed before checking in"),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if self.since.elapsed() > CHECK_IN_LIMIT {
                        return Reading::Gone("sent no check-in in time");
                    }
                    return Reading::Waiting;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Reading::Gone("connection failed"),
            };
            let end = chunk[..n].iter().position(|&b| b == b'\n');
            self.line.extend_from_slice(&chunk[..end.unwrap_or(n)]);
            if self.line.len() as u64 > MAX_LINE {
                return Reading::Gone("line too long");
            }
            if end.is_some() {
                return Reading::Line(String::from_utf8_lossy(&self.line).into_owned());
            }
        }
    }
}

/// Clients rank 0 keeps waiting for a line at once; beyond this the
/// oldest is dropped (a flood of idle connections cannot exhaust memory or
/// file descriptors, and real ranks check in within milliseconds).
const MAX_PENDING: usize = 1024;
/// Frees the places of ranks that checked in and left before the table:
/// a rank sends nothing between its check-in and the table, so input, an
/// end of stream or an error on its connection means it gave up (its own
/// deadline passed first) or died, and a restarted one may take its
/// place. Its address would otherwise go to every rank, and the mesh
/// would wait its whole timeout for it (as it still does for one whose
/// host went down without a word: nothing tells rank 0). True if one was
/// freed.
fn release_the_gone(
    checked_in: &mut Vec<(usize, TcpStream)>,
    table: &mut [Option<SocketAddrV4>],
) -> bool {
    use std::os::fd::AsFd;
    let stirred = super::ready::ready(
        (0..checked_in.len()).collect(),
        |i| checked_in[i].1.as_fd(),
        nix::poll::PollFlags::POLLIN,
        nix::poll::PollTimeout::ZERO,
    );
    let mut freed = false;
    for i in stirred.into_iter().rev() {
        let mut byte = [0u8; 1];
        let gone = match checked_in[i].1.read(&mut byte) {
            Ok(0) => "its connection closed",
            Ok(_) => "it sent more than its check-in",
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => "its connection failed",
        };
        let (rank, _) = checked_in.remove(i);
        table[rank] = None;
        freed = true;
        warn!(
            rank,
            why = gone,
            "rendezvous: a rank that checked in left before the table; its place is free again"
        );
    }
    freed
}

/// Connections accepted per pass, so a flood of them cannot starve the
/// reads of those already accepted.
const ACCEPTS_PER_PASS: usize = 64;

/// Rank 0's side: serves every client at once (non-blocking), so a slow
/// or silent one holds up nobody. A client that does not speak the
/// rendezvous protocol at all is dropped with a warning; a rank that does
/// but disagrees with this one (another WORLD_SIZE, a rank out of range,
/// another lane count, a protocol version) fails the rendezvous at once,
/// and every client rank 0 holds is told why. A rank that checks in twice
/// or belongs to another lane is refused alone.
fn serve(
    env: &RankEnv,
    mine: SocketAddrV4,
    rank0_wildcard: bool,
    port: u16,
    deadline: Instant,
) -> Result<(Vec<SocketAddrV4>, Watch)> {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).map_err(|e| {
        Error::Rendezvous(format!(
            "rank 0 cannot listen on TCP port {port} ({RDV_PORT_SOURCE}): {e}; set {RDV_PORT_VAR} to a port that is free on rank 0's host, the same on every rank"
        ))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Rendezvous(e.to_string()))?;
    let mut table: Vec<Option<SocketAddrV4>> = vec![None; env.world];
    table[0] = Some(mine);
    // Ranks that checked in, with their connections.
    let mut checked_in: Vec<(usize, TcpStream)> = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    // Why ranks were refused alone: a rendezvous that then times out says
    // so, since a refused rank of a misconfigured job is one it waits for.
    let mut refused = Refusals::default();
    // Tells everyone it holds (the ranks, the clients still pending, the
    // one that caused it, and whoever waits in the listen queue) why the
    // rendezvous failed, then returns that failure.
    let give_up = |checked_in: Vec<(usize, TcpStream)>,
                   pending: Vec<Pending>,
                   culprit: Option<TcpStream>,
                   why: String| {
        let mut all: Vec<TcpStream> = checked_in.into_iter().map(|(_, s)| s).collect();
        all.extend(pending.into_iter().map(|p| p.stream));
        all.extend(culprit);
        while let Ok((s, _)) = listener.accept() {
            all.push(s);
            if all.len() > MAX_PENDING * 2 {
                break;
            }
        }
        let _ = answer_all(&mut all, &format!("err {why}\n"));
        Err(Error::Rendezvous(why))
    };
    while table.iter().any(Option::is_none) {
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (0..env.world).filter(|&r| table[r].is_none()).collect();
            return give_up(checked_in, pending, None, format!(
                "ranks {missing:?} did not check in at port {port} in time: are they started with the same MASTER_ADDR/MASTER_PORT?{}",
                refused.summary()
            ));
        }
        let mut moved = false;
        for _ in 0..ACCEPTS_PER_PASS {
            match listener.accept() {
                Ok((stream, _)) => {
                    moved = true;
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if pending.len() == MAX_PENDING {
                        let oldest = pending.remove(0);
                        warn!(peer = ?oldest.stream.peer_addr().ok(), "rendezvous: too many clients waiting, dropped the oldest");
                    }
                    pending.push(Pending {
                        stream,
                        line: Vec::new(),
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Out of file descriptors, or a client that reset before
                // we took it: try again next pass.
                Err(e) => {
                    warn!(error = %e, "rendezvous: accept failed");
                    break;
                }
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let line = match pending[i].read() {
                Reading::Waiting => {
                    i += 1;
                    continue;
                }
                Reading::Gone(why) => {
                    let p = pending.remove(i);
                    warn!(peer = ?p.stream.peer_addr().ok(), why, "rendezvous: dropped a client");
                    moved = true;
                    continue;
                }
                Reading::Line(line) => line,
            };
            moved = true;
            let mut s = pending.remove(i).stream;
            if !line.starts_with(PROTO_FAMILY) {
                warn!(peer = ?s.peer_addr().ok(), line = %line.escape_debug(), "rendezvous: dropped a client that is not an ainftp rank");
                continue;
            }
            match check_in(&line, env) {
                Ok(CheckIn::Rank(rank, addr)) if table[rank].is_none() => {
                    table[rank] = Some(addr);
                    checked_in.push((rank, s));
                }
                Ok(CheckIn::Rank(rank, _)) => {
                    warn!(rank, peer = ?s.peer_addr().ok(), "rendezvous: a rank checked in twice; refused the second");
                    let why = format!(
                        "rank {rank} checked in twice: another process with RANK={rank} is connected to rank 0 (two ranks given one RANK, or a leftover run)"
                    );
                    refuse(&mut s, &why);
                    refused.note(why);
                }
                Ok(CheckIn::OtherLane(lane)) => {
                    let why = format!(
                        "port {port} serves lane {} of a job, this rank is lane {lane}: another job's MASTER_PORT range overlaps (a job with N lanes takes MASTER_PORT to MASTER_PORT+N-1)",
                        env.lane
                    );
                    warn!(peer = ?s.peer_addr().ok(), %why, "rendezvous: refused a rank of another job");
                    refuse(&mut s, &why);
                    refused.note(why);
                }
                Ok(CheckIn::OtherJob(job)) => {
                    let why = format!(
                        "port {port} serves job {}, this rank is of job {job}: two jobs were given one MASTER_ADDR:MASTER_PORT (or the job id is not set alike on every rank: AINFTP_JOB_ID, TORCHELASTIC_RUN_ID)",
                        env.job.as_deref().unwrap_or(NO_JOB)
                    );
                    warn!(peer = ?s.peer_addr().ok(), %why, "rendezvous: refused a rank of another job");
                    refuse(&mut s, &why);
                    refused.note(why);
                }
                Err(why) => return give_up(checked_in, pending, Some(s), why),
            }
        }
        moved |= release_the_gone(&mut checked_in, &mut table);
        if !moved {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut table: Vec<SocketAddrV4> = table.into_iter().map(|a| a.expect("all set")).collect();
    name_local_ranks_as_remote_ranks_see_them(&mut table, &checked_in, rank0_wildcard);
    let mut reply = format!("ok {}\n", env.world);
    for a in &table {
        reply.push_str(&format!("{a}\n"));
    }
    let (ranks, mut streams): (Vec<usize>, Vec<TcpStream>) = checked_in.into_iter().unzip();
    answer_all(&mut streams, &reply)
        .map_err(|e| Error::Rendezvous(format!("sending the table: {e}")))?;
    Ok((
        table,
        Watch::rank0(env.world, ranks.into_iter().zip(streams).collect()),
    ))
}

/// On a job across hosts whose MASTER_ADDR resolves to a loopback address
/// on rank 0's own host (Debian maps the host name to 127.0.1.1 in
/// /etc/hosts), rank 0 and the ranks beside it reached the rendezvous over
/// loopback and named loopback addresses, which the other hosts would dial
/// on themselves. If any rank reached rank 0 from another address, the
/// loopback entries that were made from a wildcard bind (rank 0's own when
/// `rank0_wildcard`; another rank's when it is the address its connection
/// came from) are renamed to the address that rank reached rank 0 on. A
/// rank bound to a loopback address on purpose keeps it. So is rank 0's
/// own entry from a wildcard bind when MASTER_ADDR is no address of its
/// host (a Kubernetes ClusterIP, a load balancer's or a port forward's):
/// the address the other ranks' connections arrived at is.
fn name_local_ranks_as_remote_ranks_see_them(
    table: &mut [SocketAddrV4],
    checked_in: &[(usize, TcpStream)],
    rank0_wildcard: bool,
) {
    let v4 = |a: std::io::Result<SocketAddr>| match a {
        Ok(SocketAddr::V4(a)) => Some(*a.ip()),
        _ => None,
    };
    let seen_from_afar = checked_in.iter().find_map(|(_, s)| {
        let peer = v4(s.peer_addr())?;
        (!peer.is_loopback()).then(|| v4(s.local_addr())).flatten()
    });
    let Some(ip) = seen_from_afar else {
        return;
    };
    let mut renamed: Vec<usize> = checked_in
        .iter()
        .filter(|(rank, s)| {
            let own = *table[*rank].ip();
            own.is_loopback() && v4(s.peer_addr()) == Some(own)
        })
        .map(|(rank, _)| *rank)
        .collect();
    if rank0_wildcard && (table[0].ip().is_loopback() || !is_own_address(*table[0].ip())) {
        renamed.push(0);
    }
    for rank in renamed {
        table[rank] = SocketAddrV4::new(ip, table[rank].port());
    }
}

/// Whether `ip` is an address of this host (in this network namespace):
/// only those can be bound to.
fn is_own_address(ip: Ipv4Addr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// How long rank 0 gives all its answers together, beyond the time they
/// take at `ANSWER_MIN_RATE` (a rank that does not read its answer in this
/// time has gone).
const ANSWER_LIMIT: Duration = Duration::from_secs(2);
/// The slowest rate (bytes a second) rank 0 counts on to write its
/// answers: 10,000 ranks' tables, 22 bytes a line, are 2.2 GB in all.
const ANSWER_MIN_RATE: f64 = 100e6;

/// The time rank 0 gives `streams` answers of `bytes` each.
fn answer_budget(bytes: usize, streams: usize) -> Duration {
    ANSWER_LIMIT + Duration::from_secs_f64(bytes as f64 * streams as f64 / ANSWER_MIN_RATE)
}

/// Writes `text` to every stream at once (non-blocking), so that a rank
/// that does not read holds up nobody, within one shared `answer_budget`;
/// the first error, after trying them all. Each pass waits in one
/// `poll(2)` and writes only to the streams that can take more, so a
/// large table to many ranks costs no spinning over the full ones.
fn answer_all(streams: &mut [TcpStream], text: &str) -> std::io::Result<()> {
    let by = Instant::now() + answer_budget(text.len(), streams.len());
    let bytes = text.as_bytes();
    let mut first_error = None;
    // How far each stream got; None once done or failed.
    let mut at: Vec<Option<usize>> = streams
        .iter()
        .map(|s| match s.set_nonblocking(true) {
            Ok(()) => Some(0),
            Err(e) => {
                first_error.get_or_insert(e);
                None
            }
        })
        .collect();
    while at.iter().any(Option::is_some) {
        if Instant::now() >= by {
            first_error.get_or_insert(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "a rank did not read its answer in time",
            ));
            break;
        }
        for i in writable(streams, &at, by) {
            let Some(done) = at[i] else { continue };
            match streams[i].write(&bytes[done..]) {
                Ok(n) => at[i] = Some(done + n).filter(|&d| d < bytes.len()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                    at[i] = None;
                }
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The streams still being written (`at` is Some) that can take more (or
/// have failed), after waiting up to 100 ms, never past `by`, for one.
fn writable(streams: &[TcpStream], at: &[Option<usize>], by: Instant) -> Vec<usize> {
    use std::os::fd::AsFd;
    let open: Vec<usize> = (0..streams.len()).filter(|&i| at[i].is_some()).collect();
    let left = by.saturating_duration_since(Instant::now());
    let ms = left.as_millis().clamp(1, 100) as u16;
    super::ready::ready(
        open,
        |i| streams[i].as_fd(),
        nix::poll::PollFlags::POLLOUT,
        nix::poll::PollTimeout::from(ms),
    )
}

/// Tells one client why it is refused (rank 0 goes on without it).
fn refuse(s: &mut TcpStream, why: &str) {
    let _ = answer_all(std::slice::from_mut(s), &format!("err {why}\n"));
}

/// Why rank 0 refused ranks alone: the first few reasons and a count.
#[derive(Default)]
struct Refusals {
    first: Vec<String>,
    count: usize,
}

impl Refusals {
    const KEPT: usize = 3;

    fn note(&mut self, why: String) {
        self.count += 1;
        if self.first.len() < Self::KEPT {
            self.first.push(why);
        }
    }

    /// What to add to a timeout's message; empty when none was refused.
    fn summary(&self) -> String {
        if self.count == 0 {
            return String::new();
        }
        format!(
            " ({} refused meanwhile: {})",
            self.count,
            self.first.join("; ")
        )
    }
}

/// A check-in rank 0 can take.
#[derive(Debug, PartialEq)]
enum CheckIn {
    Rank(usize, SocketAddrV4),
    /// From a rank of another job: it carries another job id.
    OtherJob(String),
    /// From a rank of another lane: another job, whose ports overlap.
    OtherLane(Lane),
}

/// Reads a check-in line; an error fails the whole rendezvous (the rank
/// belongs to this job but disagrees with it).
fn check_in(line: &str, env: &RankEnv) -> std::result::Result<CheckIn, String> {
    let world = env.world;
    let parts: Vec<&str> = line.split_whitespace().collect();
    if parts.first() != Some(&PROTO) {
        return Err(format!(
            "a peer speaks {:?}, not {PROTO}: run the same ainftp version everywhere",
            parts.first().unwrap_or(&"")
        ));
    }
    let [_, rank, w, addr, lane, job] = parts[..] else {
        return Err(format!("malformed check-in {line:?}"));
    };
    if job != env.job.as_deref().unwrap_or(NO_JOB) {
        return Ok(CheckIn::OtherJob(job.to_string()));
    }
    let lane: Lane = lane.parse().map_err(|_| format!("bad lane {lane:?}"))?;
    if lane.index != env.lane.index {
        return Ok(CheckIn::OtherLane(lane));
    }
    let rank: usize = rank.parse().map_err(|_| format!("bad rank {rank:?}"))?;
    let w: usize = w.parse().map_err(|_| format!("bad world size {w:?}"))?;
    if w != world {
        return Err(format!(
            "rank {rank} has WORLD_SIZE {w}, rank 0 has {world}: start every rank with the same WORLD_SIZE"
        ));
    }
    if rank == 0 || rank >= world {
        return Err(format!(
            "rank {rank} is out of range 1..{world} (two rank 0s?)"
        ));
    }
    if lane.count != env.lane.count {
        return Err(format!(
            "rank {rank} runs {} lanes, rank 0 runs {}: start every rank with the same number of lanes",
            lane.count, env.lane.count
        ));
    }
    let addr = addr.parse().map_err(|_| format!("bad address {addr:?}"))?;
    Ok(CheckIn::Rank(rank, addr))
}

fn ask(
    env: &RankEnv,
    mine: SocketAddrV4,
    master: SocketAddrV4,
    deadline: Instant,
) -> Result<(Vec<SocketAddrV4>, Watch)> {
    // Rank 0 may not be listening yet: retry until the deadline.
    let mut last_error = None;
    let mut s = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let why = last_error.map_or("no attempt finished".to_string(), |e: std::io::Error| {
                e.to_string()
            });
            return Err(Error::Rendezvous(format!(
                "rank 0 is not listening at {master} (MASTER_ADDR, and {RDV_PORT_SOURCE}): is it running, and is it reachable? (last attempt: {why})"
            )));
        }
        match TcpStream::connect_timeout(&SocketAddr::V4(master), left.min(Duration::from_secs(2)))
        {
            Ok(s) => break s,
            Err(e) => {
                last_error = Some(e);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let ip = match (mine.ip().is_unspecified(), s.local_addr()) {
        (true, Ok(SocketAddr::V4(l))) => *l.ip(),
        (true, Ok(SocketAddr::V6(_)) | Err(_)) => Ipv4Addr::LOCALHOST,
        (false, _) => *mine.ip(),
    };
    let mine = SocketAddrV4::new(ip, mine.port());
    let job = env.job.as_deref().unwrap_or(NO_JOB);
    writeln!(
        s,
        "{PROTO} {} {} {mine} {} {job}",
        env.rank, env.world, env.lane
    )
    .map_err(|e| Error::Rendezvous(format!("sending to rank 0 at {master}: {e}")))?;
    let mut r = BufReader::new(ByDeadline {
        stream: s,
        deadline,
    });
    let head = read_line(&mut r).map_err(|e| {
        Error::Rendezvous(format!(
            "waiting for the table from rank 0 at {master}: {e} (are all WORLD_SIZE={} ranks started?)",
            env.world
        ))
    })?;
    if let Some(msg) = head.strip_prefix("err ") {
        return Err(Error::Rendezvous(format!("rank 0 says: {msg}")));
    }
    if head != format!("ok {}", env.world) {
        return Err(Error::Rendezvous(format!("unexpected reply {head:?}")));
    }
    let mut table = Vec::with_capacity(env.world);
    for _ in 0..env.world {
        let l =
            read_line(&mut r).map_err(|e| Error::Rendezvous(format!("reading the table: {e}")))?;
        let a: SocketAddrV4 = l
            .parse()
            .map_err(|_| Error::Rendezvous(format!("bad table line {l:?}")))?;
        table.push(a);
    }
    let read_ahead = r.buffer().to_vec();
    let link = r.into_inner().stream;
    Ok((table, Watch::to_rank0(env.world, link, read_ahead)))
}

/// A stream whose reads all end by one deadline: a rank 0 that trickles
/// bytes cannot keep a rank waiting past its timeout.
struct ByDeadline {
    stream: TcpStream,
    deadline: Instant,
}

impl Read for ByDeadline {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "timed out",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        match self.stream.read(buf) {
            // What an expired SO_RCVTIMEO reports on Linux.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "timed out",
            )),
            r => r,
        }
    }
}

/// One `\n`-terminated line of at most `MAX_LINE` bytes.
fn read_line(r: &mut impl std::io::Read) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while (line.len() as u64) < MAX_LINE {
        if r.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        if byte[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte[0]);
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "line too long",
    ))
}

/// `AINFTP_BIND`, the address a rank binds its socket to, if set.
pub fn bind_from_env() -> Result<Option<SocketAddrV4>> {
    match std::env::var("AINFTP_BIND") {
        Ok(v) => v.parse().map(Some).map_err(|_| Error::Env {
            var: "AINFTP_BIND",
            problem: format!("{v:?} is not an IPv4 address:port"),
        }),
        Err(_) => Ok(None),
    }
}

/// The wildcard address on `port`: bind there before the rendezvous and
/// the table gets the address peers reach this host by.
pub fn wildcard(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<RankEnv> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RankEnv::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn env_errors_name_the_variable() {
        let ok = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        assert_eq!(env(&ok).unwrap().rank, 1);
        let e = env(&ok[1..]).unwrap_err().to_string();
        assert!(e.contains("RANK") && e.contains("not set"), "{e}");
        let e = env(&[ok[0], ("WORLD_SIZE", "x"), ok[2], ok[3]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("WORLD_SIZE") && e.contains("\"x\""), "{e}");
        let e = env(&[("RANK", "2"), ok[1], ok[2], ok[3]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not below WORLD_SIZE"), "{e}");
        let e = env(&[ok[0], ok[1], ok[2], ("MASTER_PORT", "70000")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_PORT"), "{e}");
        let e = env(&[ok[0], ("WORLD_SIZE", "18446744073709551615"), ok[2], ok[3]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("WORLD_SIZE") && e.contains("65536"), "{e}");
    }

    /// `AINFTP_RDV_PORT` wins; under torchrun's agent store, which holds
    /// `MASTER_PORT`, the rendezvous takes the port after it.
    #[test]
    fn the_rendezvous_port_is_ainftp_rdv_port_or_beside_torchruns_store() {
        let base = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let port = |extra: &[(&str, &str)]| {
            let mut vars = base.to_vec();
            vars.extend_from_slice(extra);
            env(&vars).map(|e| e.master_port)
        };
        assert_eq!(port(&[]), Ok(29500));
        assert_eq!(port(&[("TORCHELASTIC_USE_AGENT_STORE", "True")]), Ok(29501));
        assert_eq!(
            port(&[("TORCHELASTIC_USE_AGENT_STORE", "False")]),
            Ok(29500)
        );
        assert_eq!(port(&[(RDV_PORT_VAR, "31000")]), Ok(31000));
        let both = [
            (RDV_PORT_VAR, "31000"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ];
        assert_eq!(port(&both), Ok(31000));
        let e = port(&[(RDV_PORT_VAR, "0")]).unwrap_err().to_string();
        assert!(
            e.contains(RDV_PORT_VAR) && e.contains("not a TCP port"),
            "{e}"
        );
        let mut at_top = base.to_vec();
        at_top[3] = ("MASTER_PORT", "65535");
        at_top.push(("TORCHELASTIC_USE_AGENT_STORE", "1"));
        let e = env(&at_top).unwrap_err().to_string();
        assert!(e.contains(RDV_PORT_VAR), "{e}");
    }

    /// With torchrun's store listening on MASTER_PORT (as its agent's
    /// does for the whole job), the ranks meet beside it.
    #[test]
    fn ranks_meet_beside_torchruns_store_on_master_port() {
        // A free pair of ports: the store's, and the rendezvous's after it.
        let (store, port) = loop {
            let store = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
            let port = store.local_addr().unwrap().port();
            if port < u16::MAX && std::net::TcpListener::bind(("0.0.0.0", port + 1)).is_ok() {
                break (store, port);
            }
        };
        let handles: Vec<_> = (0..2usize)
            .map(|r| {
                std::thread::spawn(move || {
                    let e = env(&[
                        ("RANK", &r.to_string()),
                        ("WORLD_SIZE", "2"),
                        ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", &port.to_string()),
                        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                    ])
                    .unwrap();
                    let mine = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40000 + r as u16);
                    exchange(&e, mine, Duration::from_secs(5)).map(|(table, _)| table)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().unwrap().len(), 2);
        }
        drop(store);
    }

    #[test]
    fn three_ranks_get_the_same_table() {
        let port = free_port();
        let handles: Vec<_> = (0..3usize)
            .map(|r| {
                std::thread::spawn(move || {
                    let e = rank_env(r, 3, port);
                    exchange(&e, wildcard(40000 + r as u16), Duration::from_secs(10))
                })
            })
            .collect();
        let (tables, mut watches): (Vec<_>, Vec<_>) = handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .unzip();
        assert!(tables.iter().all(|t| t == &tables[0]));
        assert_eq!(tables[0][2], "127.0.0.1:40002".parse().unwrap());
        // The connections stay up as liveness links: rank 2 vanishing is
        // seen by rank 0 and, through it, by rank 1.
        watches[2].sever();
        let start = Instant::now();
        while watches[1].lost().is_empty() && start.elapsed() < Duration::from_secs(2) {
            watches[0].poll();
            watches[1].poll();
        }
        assert_eq!(watches[0].lost(), vec![2]);
        assert_eq!(watches[1].lost(), vec![2]);
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn rank_env(rank: usize, world: usize, port: u16) -> RankEnv {
        RankEnv {
            rank,
            world,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            lane: Lane::ONLY,
            job: None,
        }
    }

    /// Connects to rank 0 once it listens.
    fn dial(port: u16) -> TcpStream {
        let start = Instant::now();
        loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => return s,
                Err(e) if start.elapsed() > Duration::from_secs(5) => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    #[test]
    fn stray_and_silent_clients_do_not_hold_up_the_rendezvous() {
        let port = free_port();
        let rank0 = std::thread::spawn(move || {
            exchange(
                &rank_env(0, 2, port),
                wildcard(41000),
                Duration::from_secs(20),
            )
        });
        // 300 clients that say nothing and stay, one that speaks another
        // protocol, and one that leaves mid-line: all before rank 1.
        let _silent: Vec<TcpStream> = (0..300).map(|_| dial(port)).collect();
        let mut http = dial(port);
        http.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut half = dial(port);
        half.write_all(b"ainftp-rdv/5 1").unwrap();
        drop(half);
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        let table1 = exchange(
            &rank_env(1, 2, port),
            wildcard(41001),
            Duration::from_secs(20),
        )
        .expect("rank 1 gets the table")
        .0;
        let waited = start.elapsed();
        let table0 = rank0.join().unwrap().expect("rank 0 gets the table").0;
        assert_eq!(table0, table1);
        assert_eq!(table1[1], "127.0.0.1:41001".parse().unwrap());
        // The silent client may hold the line for CHECK_IN_LIMIT; nobody
        // may wait on it.
        assert!(waited < Duration::from_secs(2), "rank 1 waited {waited:?}");
        // The stray client was told nothing and let go.
        let mut reply = String::new();
        let _ = http.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = http.read_to_string(&mut reply);
        assert_eq!(reply, "");
    }

    /// A veth pair whose first end has `ip`, removed on drop (needs root;
    /// CI is). This kernel has no dummy links.
    struct LocalLink(&'static str);

    impl LocalLink {
        fn up(name: &'static str, ip: &str) -> LocalLink {
            let sh = |cmd: &str| {
                std::process::Command::new("sh")
                    .args(["-c", cmd])
                    .status()
                    .unwrap()
            };
            sh(&format!("ip link del {name} 2>/dev/null"));
            let ok = sh(&format!(
                "ip link add {name} type veth peer name {name}p && ip addr add {ip}/32 dev {name} \
                 && ip link set {name}p up && ip link set {name} up"
            ));
            assert!(ok.success(), "a veth link for {ip} (needs root)");
            LocalLink(name)
        }
    }

    impl Drop for LocalLink {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", self.0])
                .status();
        }
    }

    #[test]
    fn ranks_on_rank_0s_host_are_named_by_the_address_other_hosts_reach_it_on() {
        // Rank 0's host resolves its own name to 127.0.1.1; a rank on
        // another host reaches it at 10.231.5.1 (a local link stands in
        // for the other host's route).
        let _link = LocalLink::up("ainfrdv0", "10.231.5.1");
        let port = free_port();
        let env = |rank: usize, master: &str| RankEnv {
            rank,
            world: 3,
            master_addr: master.into(),
            master_port: port,
            lane: Lane::ONLY,
            job: None,
        };
        let e0 = env(0, "127.0.1.1");
        let rank0 =
            std::thread::spawn(move || exchange(&e0, wildcard(41200), Duration::from_secs(20)));
        let e1 = env(1, "127.0.1.1");
        let rank1 =
            std::thread::spawn(move || exchange(&e1, wildcard(41201), Duration::from_secs(20)));
        let table2 = exchange(
            &env(2, "10.231.5.1"),
            wildcard(41202),
            Duration::from_secs(20),
        )
        .expect("rank 2 gets the table")
        .0;
        let table0 = rank0.join().unwrap().expect("rank 0").0;
        let table1 = rank1.join().unwrap().expect("rank 1").0;
        assert_eq!(table0, table2);
        assert_eq!(table1, table2);
        let want: Vec<SocketAddrV4> = [41200, 41201, 41202]
            .iter()
            .map(|&p| SocketAddrV4::new(Ipv4Addr::new(10, 231, 5, 1), p))
            .collect();
        assert_eq!(table2, want, "no loopback address reaches another host");
    }

    #[test]
    fn ranks_bound_to_loopback_on_purpose_keep_their_address() {
        // One host whose MASTER_ADDR is a non-loopback address of its own,
        // every rank bound to 127.0.0.1 (AINFTP_BIND): nothing is renamed.
        let _link = LocalLink::up("ainfrdv1", "10.231.6.1");
        let port = free_port();
        let env = |rank: usize| RankEnv {
            rank,
            world: 2,
            master_addr: "10.231.6.1".into(),
            master_port: port,
            lane: Lane::ONLY,
            job: None,
        };
        let bound = |p: u16| SocketAddrV4::new(Ipv4Addr::LOCALHOST, p);
        let e0 = env(0);
        let rank0 =
            std::thread::spawn(move || exchange(&e0, bound(41300), Duration::from_secs(20)));
        let table1 = exchange(&env(1), bound(41301), Duration::from_secs(20))
            .expect("rank 1 gets the table")
            .0;
        assert_eq!(rank0.join().unwrap().expect("rank 0").0, table1);
        assert_eq!(table1, vec![bound(41300), bound(41301)]);
    }

    #[test]
    fn a_rank_with_another_world_size_fails_the_rendezvous_at_once() {
        let port = free_port();
        let start = Instant::now();
        let rank0 = std::thread::spawn(move || {
            exchange(
                &rank_env(0, 3, port),
                wildcard(41100),
                Duration::from_secs(20),
            )
        });
        // Rank 1 has checked in (or sits in the listen queue) when the
        // rank with the wrong WORLD_SIZE comes: it must be told why too.
        let mut waiting = dial(port);
        waiting
            .write_all(b"ainftp-rdv/5 1 3 127.0.0.1:41101 0/1 -\n")
            .unwrap();
        let wrong = exchange(
            &rank_env(2, 4, port),
            wildcard(41102),
            Duration::from_secs(20),
        )
        .unwrap_err()
        .to_string();
        let e0 = rank0.join().unwrap().unwrap_err().to_string();
        let mut told = String::new();
        waiting
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let _ = waiting.read_to_string(&mut told);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert!(told.starts_with("err "), "{told:?}");
        for e in [&wrong, &e0, &told] {
            assert!(
                e.contains("WORLD_SIZE 4") && e.contains("rank 0 has 3"),
                "{e}"
            );
        }
    }

    /// A master whose name does not resolve yet is asked for again until
    /// the timeout, then named.
    #[test]
    fn a_master_name_that_does_not_resolve_is_retried_until_the_timeout() {
        let mut e = rank_env(1, 2, 29500);
        e.master_addr = "no-such-host.invalid".into();
        let start = Instant::now();
        let err = exchange(&e, wildcard(41300), Duration::from_millis(800)).unwrap_err();
        assert!(
            start.elapsed() >= Duration::from_millis(800),
            "{:?}",
            start.elapsed()
        );
        let err = err.to_string();
        assert!(
            err.contains("MASTER_ADDR") && err.contains("no-such-host.invalid"),
            "{err}"
        );
    }

    /// A rank that checked in and then went away (its own deadline came
    /// first, or it died) gives up its place: its restart takes it, and
    /// the table carries the restart's address, not the dead one's.
    #[test]
    fn a_rank_that_left_after_checking_in_gives_up_its_place() {
        let port = free_port();
        let rank = |r: usize, quic_port: u16| {
            std::thread::spawn(move || {
                let mine = SocketAddrV4::new(Ipv4Addr::LOCALHOST, quic_port);
                exchange(&rank_env(r, 3, port), mine, Duration::from_secs(20)).map(|(t, _)| t)
            })
        };
        let rank0 = rank(0, 41200);
        let mut first = dial(port);
        first
            .write_all(b"ainftp-rdv/5 1 3 127.0.0.1:41201 0/1 -\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(first);
        // Rank 0 looks every few milliseconds; a loaded host may be late.
        std::thread::sleep(Duration::from_millis(500));
        let (restarted, rank2) = (rank(1, 41211), rank(2, 41202));
        let tables = [rank0, restarted, rank2].map(|h| h.join().unwrap().unwrap());
        assert_eq!(tables[1][1], SocketAddrV4::new(Ipv4Addr::LOCALHOST, 41211));
        assert!(tables.iter().all(|t| *t == tables[0]), "{tables:?}");
    }

    #[test]
    fn a_rank_of_another_job_whose_ports_overlap_is_refused_and_the_job_goes_on() {
        // This job's lane 1 of 2 has its rendezvous on `port`; a one-lane
        // job started with MASTER_PORT = port reaches the same rank 0.
        let port = free_port();
        let lane1 = |rank| RankEnv {
            lane: Lane { index: 1, count: 2 },
            ..rank_env(rank, 2, port)
        };
        let e0 = lane1(0);
        let rank0 =
            std::thread::spawn(move || exchange(&e0, wildcard(41400), Duration::from_secs(20)));
        let stranger = exchange(
            &rank_env(1, 2, port),
            wildcard(41500),
            Duration::from_secs(20),
        )
        .unwrap_err()
        .to_string();
        assert!(
            stranger.contains("lane 0/1") && stranger.contains("overlaps"),
            "{stranger}"
        );
        let table1 = exchange(&lane1(1), wildcard(41401), Duration::from_secs(20))
            .expect("this job's rank 1 gets the table")
            .0;
        assert_eq!(rank0.join().unwrap().expect("rank 0").0, table1);
        assert_eq!(table1[1], "127.0.0.1:41401".parse().unwrap());
    }

    #[test]
    fn the_job_id_comes_from_ainftp_job_id_or_torchrun_and_is_checked() {
        let base = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let job = |extra: &[(&'static str, &'static str)]| {
            let vars: Vec<_> = base.iter().chain(extra).copied().collect();
            env(&vars).map(|e| e.job)
        };
        assert_eq!(job(&[]).unwrap(), None);
        // torchrun's default run id is the same for every job.
        assert_eq!(job(&[("TORCHELASTIC_RUN_ID", "none")]).unwrap(), None);
        assert_eq!(
            job(&[("TORCHELASTIC_RUN_ID", "r7")]).unwrap().as_deref(),
            Some("r7")
        );
        assert_eq!(
            job(&[("TORCHELASTIC_RUN_ID", "r7"), ("AINFTP_JOB_ID", "mine")])
                .unwrap()
                .as_deref(),
            Some("mine")
        );
        let long: &'static str = "x".repeat(MAX_JOB_ID + 1).leak();
        for bad in ["a b", "-", "caf\u{e9}", long] {
            let e = job(&[("AINFTP_JOB_ID", bad)]).unwrap_err().to_string();
            assert!(
                e.contains("AINFTP_JOB_ID") && e.contains("not a job id"),
                "{e}"
            );
        }
        // torchrun's id is not ours to refuse: one that is no valid job id
        // is used by its digest, the same on every rank.
        let spaced = job(&[("TORCHELASTIC_RUN_ID", "exp 3")]).unwrap().unwrap();
        assert!(spaced.starts_with("torchrun-"), "{spaced}");
        assert_eq!(spaced.len(), "torchrun-".len() + 16);
        assert_eq!(check_job_id(&spaced), Ok(()));
        assert_eq!(
            job(&[("TORCHELASTIC_RUN_ID", "exp 3")]).unwrap(),
            Some(spaced.clone())
        );
        let other = job(&[("TORCHELASTIC_RUN_ID", "exp 4")]).unwrap().unwrap();
        assert_ne!(spaced, other);
    }

    fn of_job(job: Option<&str>, rank: usize, port: u16) -> RankEnv {
        RankEnv {
            job: job.map(str::to_string),
            ..rank_env(rank, 2, port)
        }
    }

    #[test]
    fn a_rank_of_another_job_on_the_same_port_is_refused_and_the_job_goes_on() {
        // Two jobs given one MASTER_PORT: job "b"'s ranks reach job "a"'s
        // rank 0 (b's own rank 0 could not listen), and so does a rank
        // started without an id.
        let port = free_port();
        let e0 = of_job(Some("a"), 0, port);
        let rank0 =
            std::thread::spawn(move || exchange(&e0, wildcard(41700), Duration::from_secs(20)));
        for (stranger, named) in [(Some("b"), "job b"), (None, "job -")] {
            let e = exchange(
                &of_job(stranger, 1, port),
                wildcard(41710),
                Duration::from_secs(20),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("serves job a") && e.contains(named) && e.contains("MASTER_PORT"),
                "{e}"
            );
        }
        let table1 = exchange(
            &of_job(Some("a"), 1, port),
            wildcard(41701),
            Duration::from_secs(20),
        )
        .expect("job a's rank 1 gets the table")
        .0;
        assert_eq!(rank0.join().unwrap().expect("rank 0").0, table1);
        assert_eq!(table1[1], "127.0.0.1:41701".parse().unwrap());
    }

    #[test]
    fn a_rendezvous_that_times_out_names_the_ranks_it_refused() {
        let port = free_port();
        let e0 = of_job(Some("a"), 0, port);
        let rank0 =
            std::thread::spawn(move || exchange(&e0, wildcard(41720), Duration::from_secs(3)));
        let refused = exchange(
            &of_job(Some("b"), 1, port),
            wildcard(41721),
            Duration::from_secs(3),
        );
        assert!(refused.is_err());
        let e = rank0.join().unwrap().unwrap_err().to_string();
        assert!(
            e.contains("ranks [1] did not check in")
                && e.contains("1 refused meanwhile")
                && e.contains("this rank is of job b"),
            "{e}"
        );
    }

    #[test]
    fn ranks_with_different_lane_counts_fail_the_rendezvous_at_once() {
        let port = free_port();
        let lane0_of = |rank, count| RankEnv {
            lane: Lane { index: 0, count },
            ..rank_env(rank, 2, port)
        };
        let start = Instant::now();
        let e0 = lane0_of(0, 2);
        let rank0 =
            std::thread::spawn(move || exchange(&e0, wildcard(41600), Duration::from_secs(20)));
        let e1 = exchange(&lane0_of(1, 3), wildcard(41601), Duration::from_secs(20))
            .unwrap_err()
            .to_string();
        let e0 = rank0.join().unwrap().unwrap_err().to_string();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        for e in [&e0, &e1] {
            assert!(e.contains("rank 1 runs 3 lanes, rank 0 runs 2"), "{e}");
        }
    }

    #[test]
    fn a_rank_that_does_not_read_its_answer_holds_up_nobody() {
        // Three ranks' connections to rank 0; the first never reads, so
        // its socket fills and rank 0's writes to it block.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let clients: Vec<TcpStream> = (0..3).map(|_| dial(port)).collect();
        let mut served: Vec<TcpStream> = (0..3).map(|_| listener.accept().unwrap().0).collect();
        // A small send buffer (which also turns off the kernel's tuning of
        // it), so that the first stream fills whatever the host's tcp_wmem.
        socket2::SockRef::from(&served[0])
            .set_send_buffer_size(64 << 10)
            .unwrap();
        let readers: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(k, mut c)| {
                std::thread::spawn(move || {
                    if k == 0 {
                        // Holds the connection open, reading nothing.
                        std::thread::sleep(Duration::from_secs(4));
                        return 0;
                    }
                    let mut got = Vec::new();
                    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let _ = c.read_to_end(&mut got);
                    got.len()
                })
            })
            .collect();
        // 16 MB each: far past what the kernel buffers for one that does
        // not read.
        let text = "x".repeat(16 << 20);
        let start = Instant::now();
        let result = answer_all(&mut served, &text);
        let took = start.elapsed();
        drop(served);
        let got: Vec<usize> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        assert!(result.is_err(), "client 0 read nothing: an error");
        assert_eq!(&got[1..], &[16 << 20, 16 << 20], "the others got it all");
        assert!(
            took < answer_budget(text.len(), 3) + Duration::from_millis(500),
            "{took:?}"
        );
    }

    #[test]
    fn the_answer_budget_grows_with_the_tables_sent() {
        // A short answer, or the table of a small job: the fixed limit.
        assert!(answer_budget(20, 1) < ANSWER_LIMIT + Duration::from_millis(1));
        assert!(answer_budget(22 * 8, 8) < ANSWER_LIMIT + Duration::from_millis(1));
        // 10,000 ranks: 2.2 GB of tables, 22 s at the slowest rate counted.
        let big = answer_budget(22 * 10_000, 10_000);
        assert!(big >= Duration::from_secs(22) + ANSWER_LIMIT, "{big:?}");
    }

    #[test]
    fn lanes_take_consecutive_ports_and_name_themselves() {
        let base = rank_env(1, 2, 29500);
        let l2 = base.lane(2, 3).unwrap();
        assert_eq!(
            (l2.master_port, l2.lane),
            (29502, Lane { index: 2, count: 3 })
        );
        assert!(base.lane(3, 3).is_err(), "lane 3 of 3");
        assert!(rank_env(1, 2, 65535).lane(1, 2).is_err(), "past port 65535");
        assert_eq!("2/3".parse(), Ok(Lane { index: 2, count: 3 }));
        assert_eq!(Lane { index: 2, count: 3 }.to_string(), "2/3");
        for bad in ["3/3", "1", "x/2", "1/", "-1/2"] {
            assert_eq!(bad.parse::<Lane>(), Err(()), "{bad:?}");
        }
    }

    #[test]
    fn a_relay_sent_with_the_table_is_not_lost() {
        // Rank 0 writes the table and, in the same segment, that rank 2 is
        // lost: the reader of the table must hand those bytes to the watch.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let rank0 = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(&mut BufReader::new(&s), &mut line).unwrap();
            s.write_all(b"ok 3\n127.0.0.1:1\n127.0.0.1:2\n127.0.0.1:3\nlost 2\n")
                .unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        let (table, watch) =
            exchange(&rank_env(1, 3, port), wildcard(2), Duration::from_secs(5)).unwrap();
        assert_eq!(table.len(), 3);
        assert_eq!(watch.lost(), vec![2]);
        rank0.join().unwrap();
    }

    #[test]
    fn a_rank_0_that_trickles_bytes_cannot_hold_a_rank_past_its_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let trickler = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // One byte of a reply every 100 ms for 5 s, never a newline.
            for _ in 0..50 {
                if s.write_all(b"o").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let start = Instant::now();
        let err = exchange(
            &rank_env(1, 2, port),
            wildcard(41201),
            Duration::from_millis(800),
        )
        .unwrap_err()
        .to_string();
        let waited = start.elapsed();
        assert!(
            waited < Duration::from_millis(1500),
            "waited {waited:?}: {err}"
        );
        assert!(err.contains("timed out"), "{err}");
        trickler.join().unwrap();
    }

    #[test]
    fn missing_rank_times_out_with_its_number() {
        let e = rank_env(0, 2, free_port());
        let err = exchange(&e, wildcard(1), Duration::from_millis(300)).unwrap_err();
        assert!(err.to_string().contains("[1]"), "{err}");
    }
}
