//! The adversarial-objects test (issue 14, "Bounds"), a binary of its
//! own: cargo runs test binaries one at a time, so no other test's load
//! decides whether another Service's update stays within twice its
//! baseline; and its two modes take a lock, one at a time.

#[allow(dead_code)]
#[path = "../all/support.rs"]
mod support;

mod bounds;
