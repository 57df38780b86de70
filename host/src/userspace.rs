//! userspace mode's proxying (issue 11, in progress): the host opens a
//! port per service port and relays each connection to an endpoint it
//! chooses. This module is the relay itself, independent of how the
//! endpoint is chosen; the mode around it (listeners per service port,
//! the REDIRECT rules, the scheduler's per-connection pick) is not built
//! yet.

pub mod tcp;
pub mod udp;

/// A chooser for the relays' tests: round robin, skipping the endpoints
/// that failed the connection (upstream's default).
#[cfg(test)]
pub(crate) struct RoundRobin {
    pub endpoints: Vec<std::net::SocketAddr>,
    pub next: std::sync::Mutex<usize>,
}

#[cfg(test)]
impl RoundRobin {
    pub fn new(endpoints: Vec<std::net::SocketAddr>) -> RoundRobin {
        RoundRobin { endpoints, next: std::sync::Mutex::new(0) }
    }
}

#[cfg(test)]
impl tcp::Chooser for RoundRobin {
    fn choose(
        &self,
        _: std::net::SocketAddr,
        _: usize,
        failed: &[std::net::SocketAddr],
    ) -> Option<std::net::SocketAddr> {
        let mut next = self.next.lock().unwrap();
        for _ in 0..self.endpoints.len() {
            let e = self.endpoints[*next % self.endpoints.len()];
            *next += 1;
            if !failed.contains(&e) {
                return Some(e);
            }
        }
        None
    }
}
