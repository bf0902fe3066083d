//! The kubelet's eviction signals, what each one starves (as eviction messages name it), and
//! the node condition it raises.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Signal {
    #[serde(rename = "memory.available")]
    MemoryAvailable,
    #[serde(rename = "allocatableMemory.available")]
    AllocatableMemoryAvailable,
    #[serde(rename = "nodefs.available")]
    NodeFsAvailable,
    #[serde(rename = "nodefs.inodesFree")]
    NodeFsInodesFree,
    #[serde(rename = "imagefs.available")]
    ImageFsAvailable,
    #[serde(rename = "imagefs.inodesFree")]
    ImageFsInodesFree,
    #[serde(rename = "containerfs.available")]
    ContainerFsAvailable,
    #[serde(rename = "containerfs.inodesFree")]
    ContainerFsInodesFree,
    #[serde(rename = "pid.available")]
    PidAvailable,
}

/// What a signal starves, as named in eviction messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

impl Resource {
    /// Bytes or inodes on a filesystem.
    pub fn is_disk(self) -> bool {
        matches!(self, Resource::EphemeralStorage | Resource::Inodes)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum NodeCondition {
    MemoryPressure,
    DiskPressure,
    #[serde(rename = "PIDPressure")]
    PidPressure,
}

impl NodeCondition {
    pub const ALL: [NodeCondition; 3] =
        [NodeCondition::MemoryPressure, NodeCondition::DiskPressure, NodeCondition::PidPressure];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
        }
    }
}

impl Signal {
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(s: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|sig| sig.as_str() == s)
    }

    pub fn is_memory(self) -> bool {
        matches!(self, Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable)
    }

    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree | Signal::ContainerFsInodesFree => {
                Resource::Inodes
            }
            Signal::PidAvailable => Resource::Pids,
        }
    }

    pub fn condition(self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
