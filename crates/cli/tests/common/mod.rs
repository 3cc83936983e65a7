//! Helpers shared by the binary's integration tests.
#![allow(dead_code)]

pub mod faults;
pub mod nginx;
