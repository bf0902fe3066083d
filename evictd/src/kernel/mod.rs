//! The kernel side of the eBPF wake source, from userspace: BTF (stat item numbers,
//! tracepoint prototypes, struct offsets), tracefs (record layouts), loading and attaching
//! the programs; and the scheduling class of evictd's own threads (`sched`). `evictd
//! probe` (in `cli`) checks all of it for real.

pub mod btf;
pub mod ebpf;
pub mod sched;
pub mod stat_items;
pub mod tracefs;
