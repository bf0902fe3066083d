//! Observe: what this node looks like, read from cgroups, /proc and statvfs. Every read that
//! fails is an error naming the file; a signal that cannot be read has no observation, and
//! the engine never decides on it.

pub mod cgroup_names;
pub mod cgroups;
pub mod growth;
pub mod memory;
pub mod own_pod;
pub mod signals;
