//! The names of the kernel side's maps and load-time globals. The kernel side declares them
//! as statics of these names (the `#[map]` macro takes the identifier); userspace looks them
//! up by these constants, and a test checks the built object against this list.

/// Ring buffer of `WakeEvent`s; userspace sizes it at load time.
pub const MAP_EVENTS: &str = "EVENTS";
/// One-entry array holding the `KernelConfig`.
pub const MAP_CONFIG: &str = "CONFIG";
/// Per-CPU counters, indexed by the `COUNTER_*` constants.
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Memory cgroup ids whose charge counts when `FLAG_SCOPE` is set.
pub const MAP_SCOPE: &str = "SCOPE";
/// Per-CPU running state (charge sums, rate limits, the memcg → id memo).
pub const MAP_CPU_STATE: &str = "CPU_STATE";
/// The node's charge sum, which the CPUs' sums are added to: an array of one slot per
/// generation in turn (`NODE_SUM_SLOTS`).
pub const MAP_NODE_SUM: &str = "NODE_SUM";
/// The `ChargeItems` mask, in read-only data, set by the loader.
pub const GLOBAL_CHARGE_ITEMS: &str = "CHARGE_ITEMS";
/// The stat items every charge to a memory cgroup is followed by (a superset of the charge
/// items), counted into `COUNTER_CHARGED_PAGES`.
pub const GLOBAL_BOUND_ITEMS: &str = "BOUND_ITEMS";

pub const MAPS: [&str; 6] = [MAP_EVENTS, MAP_CONFIG, MAP_COUNTERS, MAP_SCOPE, MAP_CPU_STATE, MAP_NODE_SUM];
