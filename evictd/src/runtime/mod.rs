//! Act, through the container runtime: the CRI client, the pod inventory kept current off
//! the pressure path (with specs from a PodList or inferred from the node), the pods' usage
//! for ranking, the eviction itself (through the CRI, and the fast kill when there is no
//! time), and node-level reclaim before disk evictions.

pub mod cri;
pub mod disk_usage;
pub mod du;
pub mod evict;
pub mod infer;
pub mod inventory;
pub mod kill;
pub mod reclaim;
pub mod usage;
