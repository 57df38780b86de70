//! The 0.4.0 scheduler world (written next).
