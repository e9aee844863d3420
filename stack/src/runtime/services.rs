//! UDP services: handlers keyed by local port, the demux that routes
//! received datagrams to them, and the echo service.

use crate::io::Datagram;

/// Something that answers datagrams arriving on one local port. Replies
/// (or any datagrams to send) go into `out`.
pub trait UdpHandler<B: Datagram>: Send {
    fn on_datagram(&mut self, d: B, out: &mut Vec<B>);

    /// A whole burst for this port at once: take every datagram off `rx`.
    /// A handler that can treat a burst as a whole overrides this: moving
    /// datagrams one by one through a dyn call costs more than echoing a
    /// small one.
    fn on_burst(&mut self, rx: &mut Vec<B>, out: &mut Vec<B>) {
        for d in rx.drain(..) {
            self.on_datagram(d, out);
        }
    }
}

/// Sends every datagram back to where it came from, in the same buffer:
/// a received datagram's peer and local port are already the reply's
/// destination and source. Datagrams from ports below 1024 are dropped
/// unanswered (as inetd's echo does): one datagram with a forged source,
/// another host's echo or discard port, would otherwise bounce between
/// the two services for ever.
#[derive(Debug, Default)]
pub struct Echo;

/// Source ports Echo answers: services listen below, clients send from
/// above.
const FIRST_CLIENT_PORT: u16 = 1024;

impl<B: Datagram> UdpHandler<B> for Echo {
    fn on_datagram(&mut self, d: B, out: &mut Vec<B>) {
        if d.peer().port() >= FIRST_CLIENT_PORT {
            out.push(d);
        }
    }

    fn on_burst(&mut self, rx: &mut Vec<B>, out: &mut Vec<B>) {
        rx.retain(|d| d.peer().port() >= FIRST_CLIENT_PORT);
        out.append(rx);
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

    /// Route every datagram of `rx` to its port's handler, in order, and
    /// empty `rx`. Returns how many had no listener (dropped). A burst all
    /// for one port, the usual case, goes to its handler in one call.
    pub fn dispatch_all(&mut self, rx: &mut Vec<B>, out: &mut Vec<B>) -> usize {
        let Some(first) = rx.first() else {
            return 0;
        };
        let port = first.local_port();
        if rx.iter().all(|d| d.local_port() == port) {
            return match self.find(port) {
                Some(h) => {
                    h.on_burst(rx, out);
                    0
                }
                None => std::mem::take(rx).len(),
            };
        }
        let mut unclaimed = 0;
        for d in rx.drain(..) {
            match self.find(d.local_port()) {
                Some(h) => h.on_datagram(d, out),
                None => unclaimed += 1,
            }
        }
        unclaimed
    }

    fn find(&mut self, port: u16) -> Option<&mut Box<dyn UdpHandler<B>>> {
        self.handlers
            .iter_mut()
            .find(|(p, _)| *p == port)
            .map(|(_, h)| h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::heap::HeapDatagram;
    use std::net::{Ipv4Addr, SocketAddrV4};

    /// Remembers what it saw, in order, and answers nothing.
    struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl UdpHandler<HeapDatagram> for Log {
        fn on_datagram(&mut self, d: HeapDatagram, _out: &mut Vec<HeapDatagram>) {
            self.0.lock().unwrap().push(d.payload()[0]);
        }
    }

    fn datagram(port: u16, tag: u8) -> HeapDatagram {
        let mut d = HeapDatagram::new(8);
        d.set_len(1);
        d.payload_mut()[0] = tag;
        d.set_local_port(port);
        d.set_peer(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40009));
        d
    }

    /// A datagram "from" another echo service is not answered, alone or in
    /// a burst: the two would bounce it for ever.
    #[test]
    fn echo_answers_client_ports_only() {
        let mut out = Vec::new();
        let from = |port, tag| {
            let mut d = datagram(7, tag);
            d.set_peer(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
            d
        };
        let mut rx = vec![from(7, 0), from(1024, 1), from(19, 2), from(65535, 3)];
        Echo.on_burst(&mut rx, &mut out);
        for (port, tag) in [(9, 4), (40000, 5)] {
            Echo.on_datagram(from(port, tag), &mut out);
        }
        let echoed: Vec<u8> = out.iter().map(|d| d.payload()[0]).collect();
        assert_eq!(echoed, [1, 3, 5]);
        assert!(rx.is_empty(), "refused datagrams are dropped");
    }

    #[test]
    fn dispatch_all_routes_each_datagram_to_its_port_in_order_and_counts_the_unclaimed() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut services = Services::new();
        services.listen(7, Box::new(Echo));
        services.listen(9, Box::new(Log(seen.clone())));
        // Ports interleaved, and two datagrams for nobody.
        let ports = [7, 7, 9, 9, 9, 5, 7, 9, 5, 7];
        let mut rx: Vec<_> = ports
            .iter()
            .enumerate()
            .map(|(i, &p)| datagram(p, i as u8))
            .collect();
        let mut out = Vec::new();
        let unclaimed = services.dispatch_all(&mut rx, &mut out);
        assert_eq!(unclaimed, 2);
        assert!(rx.is_empty());
        // Each handler saw its own datagrams, in arrival order.
        let echoed: Vec<u8> = out.iter().map(|d| d.payload()[0]).collect();
        assert_eq!(echoed, [0, 1, 6, 9]);
        assert!(out.iter().all(|d| d.local_port() == 7));
        assert_eq!(*seen.lock().unwrap(), [2, 3, 4, 7]);
    }

    #[test]
    fn a_burst_for_one_port_goes_whole_to_its_handler_or_is_counted_unclaimed() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut services = Services::new();
        services.listen(9, Box::new(Log(seen.clone())));
        let mut out = Vec::new();
        let mut rx: Vec<_> = (0..5).map(|i| datagram(9, i)).collect();
        assert_eq!(services.dispatch_all(&mut rx, &mut out), 0);
        assert_eq!(*seen.lock().unwrap(), [0, 1, 2, 3, 4]);
        let mut rx: Vec<_> = (0..3).map(|i| datagram(4, i)).collect();
        assert_eq!(services.dispatch_all(&mut rx, &mut out), 3);
        assert!(rx.is_empty() && out.is_empty());
        assert_eq!(services.dispatch_all(&mut rx, &mut out), 0);
    }
}
