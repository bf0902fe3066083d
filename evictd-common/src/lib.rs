//! What the eBPF programs (`evictd-ebpf`) and the daemon (`evictd`) must agree on, defined
//! once: the wire types (`wake_event`, `kconfig`), the map and global names (`names`), and
//! the tracepoints with their record layouts (`tracepoints`).
//!
//! Everything here is `#[repr(C)]`, `Copy`, built from fixed-width integers with explicit
//! padding, and size-checked at compile time: the kernel side writes these bytes and the user
//! side reads them, so any layout drift must fail the build rather than corrupt events.
#![cfg_attr(not(test), no_std)]

pub mod kconfig;
pub mod names;
pub mod tracepoints;
pub mod wake_event;

pub use kconfig::*;
pub use wake_event::*;
