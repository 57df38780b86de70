//! The 0.4.0 extension world (written next).
