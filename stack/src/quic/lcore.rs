//! A QUIC endpoint as an lcore app: the runtime's loop drives the endpoint
//! over the lcore's I/O and lets a service (the perf server, a client job,
//! a collective's shard) act on its connections after every round.

use std::time::{Duration, Instant};

use super::endpoint::Endpoint;
use super::perf::PerfServer;
use crate::io::{Datagram, PacketIo};
use crate::runtime::LcoreApp;

/// Application logic over one endpoint's connections.
pub trait QuicService<B: Datagram> {
    /// React to events, read and write streams. Called after each round.
    fn poll(&mut self, ep: &mut Endpoint<B>);
}

impl<B: Datagram> QuicService<B> for PerfServer {
    fn poll(&mut self, ep: &mut Endpoint<B>) {
        PerfServer::poll(self, ep)
    }
}

pub struct EndpointApp<B: Datagram, S> {
    pub endpoint: Endpoint<B>,
    pub service: S,
    tx: Vec<B>,
}

impl<B: Datagram, S: QuicService<B>> EndpointApp<B, S> {
    pub fn new(endpoint: Endpoint<B>, service: S) -> Self {
        EndpointApp {
            endpoint,
            service,
            tx: Vec::new(),
        }
    }
}

/// How long a stopping lcore keeps sending what its connections queued
/// (closes, final ACKs).
const DRAIN: Duration = Duration::from_millis(200);

/// The application close code and reason a stopping lcore's connections
/// get (NO_ERROR: nothing went wrong).
pub const STOPPING_CODE: u64 = 0;
pub const STOPPING_REASON: &[u8] = b"endpoint stopping";

impl<P, B, S> LcoreApp<P> for EndpointApp<B, S>
where
    P: PacketIo<Buf = B>,
    B: Datagram,
    S: QuicService<B>,
{
    fn poll(&mut self, io: &mut P) -> usize {
        let moved = self.endpoint.drive(io, &mut self.tx);
        self.service.poll(&mut self.endpoint);
        moved
    }

    fn drain(&mut self, io: &mut P) {
        // Peers hear that we stop: without a close they would wait out
        // their idle timeout (for ever, with none).
        self.endpoint.close_all(STOPPING_CODE, STOPPING_REASON);
        let deadline = Instant::now() + DRAIN;
        loop {
            self.endpoint.drive(io, &mut self.tx);
            let queued = !self.tx.is_empty() || self.endpoint.paced() > 0;
            if !queued || Instant::now() >= deadline {
                break;
            }
        }
        // What the device never took is freed here, not leaked.
        self.tx.clear();
    }
}
