//! Kernel TCP bulk transfer, the baseline QUIC goodput is compared with:
//! `tcp-server` reads each connection to EOF and answers with the byte
//! count (u64, big endian); `tcp-client` sends `--bytes` on each of
//! `--conns` connections at once and times it to the answers. A client
//! waits at most `--connect-timeout` for the connection and for each
//! send to move, and that plus the time its sends took for the answer,
//! so a peer that accepts and never answers (a paused server, some other
//! service) ends the run with one line.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;

use super::args::PerfArgs;
use super::udp::{addr, stop_flag};
use crate::error::{Error, Result};

const CHUNK: usize = 256 * 1024;

/// Accept connections until the duration ends (one thread each).
pub fn server(args: &PerfArgs) -> Result<serde_json::Value> {
    let bind = addr("--bind", &args.bind)?;
    let listener = TcpListener::bind(bind).map_err(|e| Error::Io(format!("bind {bind}"), e))?;
    // The bound address: port 0 shows the port the kernel chose.
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Io(format!("bind {bind}"), e))?;
    crate::eline!("ainftp-perf: tcp server on {bound}");
    // A signal handler, not the default action: shells start background
    // jobs with SIGINT ignored.
    let stop = stop_flag(args.server_duration())?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Io("listener".into(), e))?;
    let mut served = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                served += 1;
                std::thread::spawn(move || serve(s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            Err(e) => return Err(Error::Io("accept".into(), e)),
        }
    }
    Ok(json!({"mode": "tcp-server", "connections": served}))
}

fn serve(mut s: TcpStream) {
    let _ = s.set_nonblocking(false);
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(_) => return,
        }
    }
    let _ = s.write_all(&total.to_be_bytes());
}

/// Seconds `tcp-client` waits for anything to move when
/// `--connect-timeout` is not given.
const DEFAULT_STALL_SECS: f64 = 10.0;

/// Upload `--bytes` on each of `--conns` connections in parallel.
pub fn client(args: &PerfArgs) -> Result<serde_json::Value> {
    let target = addr("--target", &args.target)?;
    let (bytes, conns) = (args.bytes, args.conns);
    let secs = args.connect_timeout.unwrap_or(DEFAULT_STALL_SECS);
    // 0: no limit.
    let limit = (secs > 0.0).then(|| Duration::from_secs_f64(secs));
    let t0 = Instant::now();
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            std::thread::spawn(move || -> std::io::Result<u64> {
                let mut s = match limit {
                    Some(d) => TcpStream::connect_timeout(&SocketAddr::V4(target), d)?,
                    None => TcpStream::connect(target)?,
                };
                s.set_write_timeout(limit)?;
                let _ = s.set_nodelay(true);
                let buf = vec![0x5au8; CHUNK];
                let mut left = bytes;
                let writing = Instant::now();
                while left > 0 {
                    let n = left.min(CHUNK as u64) as usize;
                    s.write_all(&buf[..n])?;
                    left -= n as u64;
                }
                s.shutdown(Shutdown::Write)?;
                // The answer comes once the socket buffers have drained to
                // the server, which takes at most about as long as the
                // writes did (on a slow link they waited on that drain):
                // that long on top of the stall limit.
                s.set_read_timeout(limit.map(|d| d + writing.elapsed()))?;
                let mut answer = [0u8; 8];
                s.read_exact(&mut answer)?;
                Ok(u64::from_be_bytes(answer))
            })
        })
        .collect();
    let mut total = 0;
    for w in workers {
        let got = w.join().expect("tcp worker").map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Usage(format!(
                "tcp to {target}: nothing moved for {secs} s (--connect-timeout); is an ainftp-perf tcp-server listening there?"
            )),
            _ => Error::Io(format!("tcp to {target}"), e),
        })?;
        if got != bytes {
            return Err(Error::Usage(format!(
                "server counted {got} bytes of {bytes}"
            )));
        }
        total += got;
    }
    let secs = t0.elapsed().as_secs_f64();
    let gbps = total as f64 * 8.0 / secs / 1e9;
    crate::eline!("tcp bulk: {total} bytes in {secs:.3} s = {gbps:.3} Gbit/s ({conns} conns)");
    Ok(json!({"mode": "tcp-client", "bytes": total, "seconds": secs, "gbps": gbps, "conns": conns}))
}
