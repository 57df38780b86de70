//! userspace mode's proxying (issue 11, in progress): the host opens a
//! port per service port and relays each connection to an endpoint it
//! chooses. This module is the relay itself, independent of how the
//! endpoint is chosen; the mode around it (listeners per service port,
//! the REDIRECT rules, the scheduler's per-connection pick) is not built
//! yet.

pub mod tcp;
pub mod udp;
