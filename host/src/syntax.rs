//! What the kernel's syntax allows and how a typed rule reads as text,
//! shared by `validate` (what it refuses) and `kernel` (what it writes),
//! below both: the wall and the writers agree on one definition of each.

pub mod iptables;
pub mod nftables;
