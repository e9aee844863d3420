//! UDP services: handlers keyed by local port, the demux that routes
//! received datagrams to them, and the echo service.

use crate::io::Datagram;

/// Something that answers datagrams arriving on one local port. Replies
/// (or any datagrams to send) go into `out`.
pub trait UdpHandler<B: Datagram>: Send {
    fn on_datagram(&mut self, d: B, out: &mut Vec<B>);
}

/// Sends every datagram back to where it came from, in the same buffer:
/// a received datagram's peer and local port are already the reply's
/// destination and source.
#[derive(Debug, Default)]
pub struct Echo;

impl<B: Datagram> UdpHandler<B> for Echo {
    fn on_datagram(&mut self, d: B, out: &mut Vec<B>) {
        out.push(d);
    }
}

/// The handlers of one lcore by port. A handful of services per host, so
/// a linear scan beats hashing.
pub struct Services<B: Datagram> {
    handlers: Vec<(u16, Box<dyn UdpHandler<B>>)>,
}

impl<B: Datagram> Default for Services<B> {
    fn default() -> Self {
        Services {
            handlers: Vec::new(),
        }
    }
}

impl<B: Datagram> Services<B> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Listen on `port`; a second handler for a port replaces the first.
    pub fn listen(&mut self, port: u16, handler: Box<dyn UdpHandler<B>>) {
        self.handlers.retain(|(p, _)| *p != port);
        self.handlers.push((port, handler));
    }

    pub fn ports(&self) -> Vec<u16> {
        self.handlers.iter().map(|(p, _)| *p).collect()
    }

    /// Route `d` to its port's handler; gives it back if nobody listens.
    pub fn dispatch(&mut self, d: B, out: &mut Vec<B>) -> Result<(), B> {
        let port = d.local_port();
        match self.handlers.iter_mut().find(|(p, _)| *p == port) {
            Some((_, h)) => {
                h.on_datagram(d, out);
                Ok(())
            }
            None => Err(d),
        }
    }
}
